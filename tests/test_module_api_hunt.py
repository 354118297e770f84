"""Module and container API as torch's, from a hunt of 2026-12-07.

Before: setattr(seq, "2", new), torch's way to swap a layer by name (LoRA, quantization tools), added a second
child '2' that forward never ran while state_dict saved the new layer's weights under the old one's name (the same
for ModuleList, ModuleDict, a named Sequential's key); getattr(seq, "0") raised; a dotted parameter name through
setattr dropped a parameter out of state_dict; an empty parameter slot (Linear(bias=False), `lin.bias = None`)
took a plain tensor that forward used and nothing trained or saved; load_state_dict half-loaded under
np.seterr(under="raise") and into a read-only buffer; .double() cast integer parameters. Run on the commit before
the one that added this file (a worktree of it first on PYTHONPATH), all 8 of its cases failed.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import nn


def _pair(build):
    """(ours, torch's) of the same layout, torch's weights copied from ours."""
    ours, theirs = build(nn), build(torch.nn)
    theirs.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in ours.state_dict().items()})
    return ours, theirs


def _same(ours, theirs, x):
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    with torch.no_grad():
        want = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours(ta.tensor(x)).numpy(), want, rtol=1e-6, atol=1e-6)


def test_setattr_by_position_replaces_a_sequential_s_layer_as_torch():
    ours, theirs = _pair(lambda m: m.Sequential(m.Linear(3, 4), m.ReLU(), m.Linear(4, 4)))
    new = nn.Linear(4, 5, rng=np.random.default_rng(3))
    setattr(ours, "2", new)
    setattr(theirs, "2", torch.nn.Linear(4, 5))
    theirs[2].load_state_dict({k: torch.from_numpy(v.copy()) for k, v in new.state_dict().items()})
    _same(ours, theirs, np.ones((2, 3), np.float32))
    assert getattr(ours, "0") is ours[0] and len(list(ours.parameters())) == 4
    setattr(ours, "3", nn.ReLU())  # the next position: a new last entry, as torch's _modules["3"]
    assert len(ours) == 4
    with pytest.raises(IndexError, match="'7' names none"):
        setattr(ours, "7", nn.ReLU())
    delattr(ours, "3")
    assert len(ours) == 3


def test_setattr_by_key_replaces_a_named_sequential_s_layer_as_torch():
    def build(m):
        return m.Sequential(OrderedDict([("fc", m.Linear(2, 3)), ("act", m.ReLU())]))

    ours, theirs = _pair(build)
    ours.fc = nn.Linear(2, 6, rng=np.random.default_rng(1))
    theirs.fc = torch.nn.Linear(2, 6)
    theirs.fc.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in ours.fc.state_dict().items()})
    _same(ours, theirs, np.ones((1, 2), np.float32))


def test_setattr_on_module_list_and_module_dict_entries_as_torch():
    ml = nn.ModuleList([nn.Linear(2, 2)])
    setattr(ml, "0", nn.Linear(2, 7))
    assert [n for n, _ in ml.named_children()] == ["0"] and ml[0].out_features == 7
    md = nn.ModuleDict({"fc": nn.Linear(2, 2)})
    md.fc = nn.Linear(2, 9)
    md.extra = nn.ReLU()  # a module set as an attribute is an entry, as torch's
    assert list(md.keys()) == ["fc", "extra"] and md["fc"].out_features == 9
    assert list(md.state_dict()) == ["fc.weight", "fc.bias"]
    del md.extra
    assert list(md.keys()) == ["fc"]
    pl = nn.ParameterList([nn.Parameter(np.zeros(2, np.float32))])
    setattr(pl, "0", nn.Parameter(np.ones(3, np.float32)))
    assert [tuple(p.shape) for p in pl.parameters()] == [(3,)]


@pytest.mark.parametrize("name", ["a.weight", ""])
def test_a_dotted_or_empty_name_is_refused_through_setattr_as_torch(name):
    theirs = torch.nn.Module()
    with pytest.raises(KeyError):
        setattr(theirs, name, torch.nn.Parameter(torch.zeros(2)))
    ours = nn.Module()
    ours.a = nn.Linear(2, 2)
    with pytest.raises(KeyError, match="parameter name can"):
        setattr(ours, name, nn.Parameter(np.zeros(2, np.float32)))
    with pytest.raises(KeyError, match="module name can"):
        setattr(ours, name, nn.ReLU())
    assert len(ours.state_dict()) == len(list(ours.parameters())) == 2


def test_an_empty_parameter_slot_takes_only_a_parameter_as_torch():
    for make in (lambda: nn.Linear(2, 2, bias=False), lambda: nn.LayerNorm(2, elementwise_affine=False)):
        layer = make()
        with pytest.raises(TypeError, match="cannot assign a Tensor as parameter 'bias'"):
            layer.bias = ta.tensor(np.ones(2, np.float32))
        layer.bias = nn.Parameter(np.ones(2, np.float32))  # a Parameter fills it
        assert "bias" in layer.state_dict()
    lin = nn.Linear(2, 2)
    lin.bias = None  # emptied: still a parameter slot
    with pytest.raises(TypeError, match="as parameter 'bias'"):
        lin.bias = np.ones(2, np.float32)
    with pytest.raises(TypeError):
        torch.nn.Linear(2, 2, bias=False).bias = torch.ones(2)
    holder = nn.Module()
    holder.sub = nn.ReLU()
    holder.sub = None
    with pytest.raises(TypeError, match="as child module 'sub'"):
        holder.sub = np.ones(2)
    del holder.sub
    holder.sub = np.ones(2)  # deleted first: the name is free, as the message says


def test_load_state_dict_is_all_or_nothing_under_strict_float_errors_and_read_only_buffers():
    lin = nn.Linear(2, 2)
    with np.errstate(all="raise"):  # a float64 value below float32's range loads as 0, as torch's
        lin.load_state_dict({"weight": np.full((2, 2), 5.0), "bias": np.array([1e-50, 1.0])})
    np.testing.assert_array_equal(lin.bias.data, [0.0, 1.0])
    m = nn.Linear(2, 2)
    m.register_buffer("pe", np.broadcast_to(np.arange(2, dtype=np.float32), (3, 2)))
    before = m.weight.data.copy()
    with pytest.raises(RuntimeError, match="pe is read-only in the model"):
        m.load_state_dict({"weight": np.full((2, 2), 9, np.float32), "bias": np.zeros(2, np.float32),
                           "pe": np.ones((3, 2), np.float32)})
    np.testing.assert_array_equal(m.weight.data, before)  # nothing loaded


def test_to_dtype_leaves_integer_parameters_as_torch():
    ours, theirs = nn.Module(), torch.nn.Module()
    ours.table = nn.Parameter(np.arange(3), requires_grad=False)
    theirs.table = torch.nn.Parameter(torch.arange(3), requires_grad=False)
    ours.double()
    theirs.double()
    assert ours.table.dtype == np.int64 and theirs.table.dtype == torch.int64


def test_a_parameter_or_module_set_over_a_plain_name_is_registered_last_as_torch():
    # Came a commit later: `self.head = None` first and a module later (or a buffer turned parameter) kept the
    # name's early place, so parameters() and state_dict came in another order than torch's (an optimizer state
    # loaded by index went to the wrong parameters). Before that commit this test failed on both orders.
    def build(m):
        class Net(m.Module):
            def __init__(self):
                super().__init__()
                self.head = None  # declared first, filled after the body
                self.body = m.Linear(2, 2)
                self.head = m.Linear(2, 1)
        return Net()

    ours, theirs = build(nn), build(torch.nn)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["body.weight", "body.bias", "head.weight",
                                                                    "head.bias"]
    for lib, make, zeros in ((nn, lambda v: nn.Parameter(v), np.zeros), (torch.nn, torch.nn.Parameter, torch.zeros)):
        module = lib.Module()
        module.register_buffer("a", zeros(3))
        module.w = make(zeros(2))
        module.a = make(zeros(3))  # takes the name over from the buffer: registered now, after w
        assert [n for n, _ in module.named_parameters()] == ["w", "a"]
    kept = nn.Linear(2, 2)
    kept.bias = None  # a parameter slot: filled again it keeps its place, as torch's _parameters entry does
    kept.bias = nn.Parameter(np.zeros(2, np.float32))
    assert list(kept.state_dict()) == list(torch.nn.Linear(2, 2).state_dict()) == ["weight", "bias"]
