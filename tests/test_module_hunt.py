"""Bug hunt on Module against torch.nn.Module: registration (__setattr__/__delattr__, register_buffer,
register_parameter, add_module), traversal (named_* with prefix, recurse, remove_duplicate), containers
(ModuleList, Sequential, ModuleDict), train()/eval(), apply(), to(), state_dict/load_state_dict, and tied or
frozen parameters trained on all three routes (eager, fused, streaming) against torch.

Each test compares against torch, or states an exact expectation (names, identities, error type and text).
Training comparisons run in float64 and allow 1e-12.

Before the fixes, 26 of its 45 tests failed on base commit 499de7f (each marked
`# Regression (fixed): ...`). To see it:
    git worktree add /tmp/old-module-hunt 499de7f && cp tests/test_module_hunt.py /tmp/old-module-hunt/tests/ && \
        cd /tmp/old-module-hunt && NUMBA_NUM_THREADS=1 python -m pytest -q -p no:cacheprovider tests/test_module_hunt.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import nn, optim
from tensorarena.nn import functional as F
from tensorarena.stream import Stage
from tensorarena.train.trainer import Trainer

TOL = 1e-12


def _names(named) -> list[str]:
    return [n for n, _ in named]


# -- registration through attributes -----------------------------------------------------------------------------

# Regression (fixed): the same array registered as a buffer of two modules was listed twice by named_buffers()
# (torch lists a shared buffer once), and named_buffers() had no remove_duplicate argument.
def test_a_shared_buffer_is_listed_once_like_torch():
    shared, tshared = np.zeros(3, np.float32), torch.zeros(3)
    ours, theirs = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), torch.nn.Sequential(torch.nn.Linear(2, 2),
                                                                                      torch.nn.Linear(2, 2))
    for i in range(2):
        ours[i].register_buffer("stat", shared)
        theirs[i].register_buffer("stat", tshared)
    assert _names(ours.named_buffers()) == _names(theirs.named_buffers()) == ["0.stat"]
    assert (_names(ours.named_buffers(remove_duplicate=False))
            == _names(theirs.named_buffers(remove_duplicate=False)) == ["0.stat", "1.stat"])
    assert _names(ours.named_buffers(prefix="m")) == _names(theirs.named_buffers(prefix="m")) == ["m.0.stat"]
    assert list(ours.state_dict()) == list(theirs.state_dict())  # one key per path, as torch


# Regression (fixed): register_buffer("weight", ...) on a Linear silently replaced the parameter (gone from
# parameters(), so never trained) by a buffer; torch raises KeyError "attribute 'weight' already exists".
@pytest.mark.parametrize("name", ["weight", "in_features", "forward"])
def test_register_buffer_refuses_a_name_already_taken(name):
    layer = nn.Linear(2, 3)
    with pytest.raises(KeyError, match=f"attribute '{name}' already exists"):
        layer.register_buffer(name, np.zeros(2, np.float32))
    with pytest.raises(KeyError):
        torch.nn.Linear(2, 3).register_buffer(name, torch.zeros(2))
    assert _names(layer.named_parameters()) == ["weight", "bias"] and layer.in_features == 2


# Regression (fixed): a buffer name that is not a string gave "argument of type 'int' is not iterable".
def test_register_buffer_and_parameter_names_must_be_strings():
    m = nn.Module()
    with pytest.raises(TypeError, match="name must be a string"):
        m.register_buffer(3, np.zeros(1))
    with pytest.raises(TypeError, match="name must be a string"):
        m.register_parameter(3, nn.Parameter(np.zeros(1)))


# Regression (fixed): assigning a plain Tensor over a parameter silently unregistered it (no longer in
# parameters() or state_dict, never trained); torch raises TypeError "cannot assign ... as parameter".
def test_a_tensor_assigned_over_a_parameter_is_refused_and_none_is_allowed():
    layer = nn.Linear(2, 3)
    with pytest.raises(TypeError, match="cannot assign a Tensor as parameter 'weight'"):
        layer.weight = ta.Tensor(np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="cannot assign a ndarray as parameter 'bias'"):
        layer.bias = np.zeros(3, np.float32)
    with pytest.raises(TypeError):
        torch.nn.Linear(2, 3).bias = torch.zeros(3)
    assert _names(layer.named_parameters()) == ["weight", "bias"]
    layer.bias = None  # as torch: the layer then has no bias
    tl = torch.nn.Linear(2, 3)
    tl.bias = None
    assert _names(layer.named_parameters()) == _names(tl.named_parameters()) == ["weight"]
    layer.bias = nn.Parameter(np.ones(3, np.float32))
    assert _names(layer.named_parameters()) == ["weight", "bias"]


# Regression (fixed): a Parameter assigned to a buffer's name stayed a buffer as well: state_dict held it
# twice and named_buffers listed a Parameter. torch makes it a parameter and drops the buffer.
def test_a_parameter_assigned_to_a_buffer_name_becomes_a_parameter_only():
    ours, theirs = nn.Linear(2, 2), torch.nn.Linear(2, 2)
    ours.register_buffer("scale", np.ones(2, np.float32))
    theirs.register_buffer("scale", torch.ones(2))
    ours.scale = nn.Parameter(np.ones(2, np.float32))
    theirs.scale = torch.nn.Parameter(torch.ones(2))
    assert _names(ours.named_parameters()) == _names(theirs.named_parameters()) == ["weight", "bias", "scale"]
    assert _names(ours.named_buffers()) == _names(theirs.named_buffers()) == []
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias", "scale"]


# Regression (fixed): anything could be assigned to a buffer's name; an int made state_dict() fail later with
# "'int' object has no attribute 'copy'". torch refuses it at the assignment; a NumPy scalar (what arithmetic on a
# 0-d buffer gives: running = 0.9 * running + ...) is kept as a 0-d array.
def test_a_buffer_takes_only_arrays_tensors_or_none():
    m = nn.Linear(2, 2)
    m.register_buffer("running", np.zeros((), np.float64))
    with pytest.raises(TypeError, match="cannot assign a int as buffer 'running'"):
        m.running = 5
    with pytest.raises(TypeError):
        tm = torch.nn.Linear(2, 2)
        tm.register_buffer("running", torch.zeros(()))
        tm.running = 5
    m.running = 0.9 * m.running + 0.5  # a np.float64 scalar
    assert isinstance(m.running, np.ndarray) and m.running.shape == () and float(m.running) == 0.5
    assert m.state_dict()["running"].dtype == np.float64 and float(m.state_dict()["running"]) == 0.5
    m.running = None
    assert _names(m.named_buffers()) == [] and list(m.state_dict()) == ["weight", "bias"]
    m.running = np.ones(2)  # still the buffer's name, as in torch
    assert _names(m.named_buffers()) == ["running"]


# Regression (fixed): assigning something that is not a Module over a child silently dropped the child (its
# parameters left the model); torch raises TypeError "cannot assign ... as child module". None is allowed.
def test_a_non_module_assigned_over_a_child_is_refused():
    model = nn.Sequential(nn.Linear(2, 2))
    model.head = nn.Linear(2, 1)
    with pytest.raises(TypeError, match="cannot assign a int as child module 'head'"):
        model.head = 3
    with pytest.raises(TypeError):
        tm = torch.nn.Module()
        tm.head = torch.nn.Linear(2, 1)
        tm.head = 3
    assert _names(model.named_parameters()) == ["0.weight", "0.bias", "head.weight", "head.bias"]
    model.head = None
    assert _names(model.named_parameters()) == ["0.weight", "0.bias"]
    model.head = nn.Linear(2, 1)
    model.head = nn.Parameter(np.zeros(1))  # a module's name may take a Parameter, as in torch
    tm = torch.nn.Sequential(torch.nn.Linear(2, 2))
    tm.head = torch.nn.Linear(2, 1)
    tm.head = torch.nn.Parameter(torch.zeros(1))
    assert _names(model.named_parameters()) == _names(tm.named_parameters()) == ["head", "0.weight", "0.bias"]


# Regression (fixed): `del m.buf` left the name registered as a buffer, so a later plain attribute of that name
# went into state_dict (and an int there made state_dict() fail); torch forgets the buffer.
def test_deleting_a_buffer_unregisters_it():
    m, tm = nn.Linear(2, 2), torch.nn.Linear(2, 2)
    m.register_buffer("stat", np.zeros(2))
    tm.register_buffer("stat", torch.zeros(2))
    del m.stat
    del tm.stat
    m.stat = 7
    tm.stat = 7
    assert list(m.state_dict()) == list(tm.state_dict()) == ["weight", "bias"]
    assert _names(m.named_buffers()) == []
    del m.weight  # a parameter or child may be deleted too
    assert _names(m.named_parameters()) == ["bias"]


# Regression (fixed): Module had no register_parameter (AttributeError), nor add_module / register_module.
def test_register_parameter_and_add_module_like_torch():
    ours, theirs = nn.Module(), torch.nn.Module()
    ours.register_parameter("w", nn.Parameter(np.zeros(2)))
    theirs.register_parameter("w", torch.nn.Parameter(torch.zeros(2)))
    ours.add_module("fc", nn.Linear(2, 2))
    theirs.add_module("fc", torch.nn.Linear(2, 2))
    ours.register_module("out", nn.Linear(2, 1))
    theirs.register_module("out", torch.nn.Linear(2, 1))
    ours.register_parameter("none", None)
    theirs.register_parameter("none", None)
    assert _names(ours.named_parameters()) == _names(theirs.named_parameters())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for mod in (ours, theirs):
        with pytest.raises(KeyError, match="already exists"):
            mod.register_parameter("fc", None)
        with pytest.raises(KeyError, match="already exists"):
            mod.add_module("w", None)
        with pytest.raises(KeyError, match=r'"\."|\.'):
            mod.register_parameter("a.b", None)
        with pytest.raises(KeyError, match="empty"):
            mod.add_module("", None)
    with pytest.raises(TypeError, match="Parameter or None"):
        ours.register_parameter("x", np.zeros(2))
    with pytest.raises(TypeError, match="Module or None"):
        ours.add_module("x", np.zeros(2))
    ours.register_parameter("w", nn.Parameter(np.ones(3)))  # re-registering a parameter's name replaces it
    assert ours.w.shape == (3,)


# -- containers --------------------------------------------------------------------------------------------------

# Regression (fixed): a dict of modules in an attribute was not walked: its parameters were silently left out of
# parameters(), state_dict() and every optimizer. There was no ModuleDict.
def test_a_dict_of_modules_is_registered_like_torch_moduledict():
    class Ours(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = {"b": nn.Linear(2, 3), "a": nn.Linear(2, 1)}
            self.late = nn.ModuleDict()
            self.late["x"] = nn.Linear(1, 1)

    class Theirs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = torch.nn.ModuleDict({"b": torch.nn.Linear(2, 3), "a": torch.nn.Linear(2, 1)})
            self.late = torch.nn.ModuleDict()
            self.late["x"] = torch.nn.Linear(1, 1)

    ours, theirs = Ours(), Theirs()
    assert isinstance(ours.heads, nn.ModuleDict)
    assert _names(ours.named_parameters()) == _names(theirs.named_parameters())
    assert _names(ours.named_modules()) == _names(theirs.named_modules())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    h, th = ours.heads, theirs.heads
    assert list(h) == list(th) == ["b", "a"] and len(h) == len(th) == 2 and "a" in h and "z" not in h
    assert list(h.keys()) == list(th.keys()) and [type(v) for v in h.values()] == [nn.Linear, nn.Linear]
    assert [k for k, _ in h.items()] == ["b", "a"]
    del h["b"]
    del th["b"]
    h.update({"c": nn.Linear(1, 1)})
    th.update({"c": torch.nn.Linear(1, 1)})
    assert list(ours.state_dict()) == list(theirs.state_dict())
    copy = nn.ModuleDict(h)  # from another ModuleDict, as torch's ModuleDict(other) / update(other)
    assert list(copy) == list(h) and all(copy[k] is h[k] for k in h)
    popped = h.pop("a")
    assert isinstance(popped, nn.Linear) and list(h) == ["c"]
    with pytest.raises(KeyError, match="'zz'"):
        h["zz"]
    with pytest.raises(TypeError, match="Module"):
        h["bad"] = 3
    with pytest.raises(KeyError, match=r"\."):
        h["a.b"] = nn.Linear(1, 1)


# Regression (fixed): as above, a dict mixing modules with other values silently left its modules untrained; a list
# like it was already refused.
def test_a_dict_mixing_modules_with_other_values_is_refused():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.things = {"fc": nn.Linear(2, 2), "lr": 0.1}

    with pytest.raises(TypeError, match="mixing Modules"):
        Bad()


# Regression (fixed): a dict of Parameters in an attribute was not walked either (no ParameterDict): never trained.
def test_a_dict_of_parameters_is_registered_like_torch_parameterdict():
    class Ours(nn.Module):
        def __init__(self):
            super().__init__()
            self.scales = {"a": nn.Parameter(np.zeros(2)), "b": nn.Parameter(np.zeros(3))}

    class Theirs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scales = torch.nn.ParameterDict({"a": torch.nn.Parameter(torch.zeros(2)),
                                                  "b": torch.nn.Parameter(torch.zeros(3))})

    ours = Ours()
    assert _names(ours.named_parameters()) == _names(Theirs().named_parameters()) == ["scales.a", "scales.b"]
    assert ours.scales["b"].shape == (3,) and len(ours.scales) == 2


# Regression (fixed): ModuleList and Sequential had no insert, no `del`, no `+=` and no `+`.
def test_modulelist_and_sequential_edit_like_torch():
    ours = nn.ModuleList([nn.Linear(1, 1) for _ in range(3)])
    theirs = torch.nn.ModuleList([torch.nn.Linear(1, 1) for _ in range(3)])
    for seq in (ours, theirs):
        lin = type(seq[0])(2, 2)
        seq.insert(1, lin)
        seq.insert(2, type(seq[0])(3, 3))  # (torch's insert does not take a negative index)
        del seq[0]
        seq += [type(seq[0])(4, 4)]
        assert seq[0] is lin
    assert [m.in_features for m in ours] == [m.in_features for m in theirs] == [2, 3, 1, 1, 4]
    del ours[1:3]
    del theirs[1:3]
    assert [m.in_features for m in ours] == [m.in_features for m in theirs] == [2, 1, 4]
    both = ours + nn.ModuleList([nn.Linear(5, 5)])
    assert isinstance(both, nn.ModuleList) and [m.in_features for m in both] == [2, 1, 4, 5] and len(ours) == 3
    assert list(ours.state_dict()) == list(theirs.state_dict())
    with pytest.raises(TypeError, match="Modules"):
        ours.insert(0, 3)

    seq = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    tseq = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    seq.double()
    with torch.no_grad():
        for (_, p), (_, tp) in zip(seq.named_parameters(), tseq.named_parameters()):
            tp.copy_(torch.from_numpy(p.data))
    del seq[1]
    del tseq[1]
    x = np.random.default_rng(0).standard_normal((2, 3))
    np.testing.assert_allclose(seq(ta.Tensor(x)).data, tseq(torch.from_numpy(x)).detach().numpy(), rtol=0, atol=TOL)
    assert list(seq.state_dict()) == list(tseq.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]


# Regression (fixed): an index out of range said only "list index out of range", not which index nor the length.
def test_an_index_out_of_range_names_it_and_the_length():
    with pytest.raises(IndexError, match="index 5 is out of range for a ModuleList of 2"):
        nn.ModuleList([nn.ReLU(), nn.ReLU()])[5]
    with pytest.raises(IndexError, match="index -4 is out of range for a Sequential of 3"):
        nn.Sequential(nn.ReLU(), nn.ReLU(), nn.ReLU())[-4]


# -- traversal, modes, apply ---------------------------------------------------------------------------------------

def _shared_pair():
    """A model using one Linear at two paths and one Parameter in two Linears, in ours and torch's form."""
    def build(lib, param):
        inner = lib.Linear(2, 2)
        outer = lib.Sequential(inner, lib.Tanh(), inner, lib.Linear(2, 2), lib.Linear(2, 2))
        outer[4].weight = outer[3].weight
        outer.extra = lib.Sequential(lib.Linear(2, 2))
        outer.extra.scale = param
        return outer
    return build(nn, nn.Parameter(np.ones(2))), build(torch.nn, torch.nn.Parameter(torch.ones(2)))


@pytest.mark.parametrize("prefix", ["", "model"])
def test_named_traversals_match_torch_with_prefix_recurse_and_duplicates(prefix):
    ours, theirs = _shared_pair()
    for kw in ({}, {"remove_duplicate": False}):
        assert _names(ours.named_modules(prefix=prefix, **kw)) == _names(theirs.named_modules(prefix=prefix, **kw))
        assert (_names(ours.named_parameters(prefix=prefix, **kw))
                == _names(theirs.named_parameters(prefix=prefix, **kw)))
    for obj_o, obj_t in ((ours, theirs), (ours.extra, theirs.extra)):
        assert (_names(obj_o.named_parameters(prefix=prefix, recurse=False))
                == _names(obj_t.named_parameters(prefix=prefix, recurse=False)))
    assert _names(ours.named_children()) == _names(theirs.named_children())
    assert len(list(ours.parameters())) == len(list(theirs.parameters())) == 8
    assert list(ours.state_dict()) == list(theirs.state_dict())


# Regression (fixed): train()/eval() set `training` on every module directly instead of calling each child's
# train(), so a submodule that overrides train() (to keep a part frozen in eval mode, as torch code does) was
# bypassed.
def test_train_calls_the_children_train_like_torch():
    def build(lib):
        class KeepsInnerInEval(lib.Module):
            def __init__(self):
                super().__init__()
                self.inner = lib.Dropout(0.5)

            def train(self, mode=True):
                super().train(mode)
                self.inner.training = False
                return self

        return lib.Sequential(KeepsInnerInEval(), lib.Dropout(0.5))

    ours, theirs = build(nn), build(torch.nn)
    for call in ("train", "eval", "train"):
        getattr(ours, call)()
        getattr(theirs, call)()
        assert [m.training for m in ours.modules()] == [m.training for m in theirs.modules()]
    assert ours[0].inner.training is False and ours[1].training is True


def test_apply_visits_like_torch_and_to_keeps_ties():
    ours, theirs = _shared_pair()
    seen_o, seen_t = [], []
    ours.apply(lambda m: seen_o.append(type(m).__name__))
    theirs.apply(lambda m: seen_t.append(type(m).__name__))
    assert seen_o == seen_t
    ids = [id(p) for p in ours.parameters()]
    ours.double()
    assert [id(p) for p in ours.parameters()] == ids and ours[4].weight is ours[3].weight
    assert {p.dtype for p in ours.parameters()} == {np.dtype(np.float64)}
    ours.float()
    assert {p.dtype for p in ours.parameters()} == {np.dtype(np.float32)}


# Regression (fixed): to(torch.float64) said only "Cannot interpret 'torch.float64' as a data type": nothing about
# what Module.to takes. (to("cpu") is taken now, as Tensor.to takes it: tests/test_module_to_device.py.)
@pytest.mark.parametrize("arg", [torch.float64])
def test_to_with_a_device_or_foreign_dtype_says_what_it_takes(arg):
    with pytest.raises(TypeError, match="Module.to takes a NumPy floating dtype"):
        nn.Linear(2, 2).to(arg)


# -- state dicts ---------------------------------------------------------------------------------------------------

V, D = 11, 6


class TiedLM(nn.Module):
    """An embedding tied to the output projection, and one Linear used twice in forward."""

    def __init__(self, seed=1, dtype=np.float64):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.emb = nn.Embedding(V, D, rng=rng, dtype=dtype)
        self.mix = nn.Linear(D, D, rng=rng, dtype=dtype)
        self.norm = nn.LayerNorm(D, dtype=dtype)
        self.out = nn.Linear(D, V, rng=rng, dtype=dtype)
        self.out.weight = self.emb.weight

    def body(self, ids):
        h = self.emb(ids).mean(dim=1)  # (B, D)
        h = F.tanh(self.mix(h))
        h = self.norm(F.tanh(self.mix(h)))  # the same Linear again
        return self.out(h)  # (B, V), the embedding table as the projection

    def forward(self, ids):
        return self.body(ids)

    def stream_stages(self):
        # The tie lives inside one stage (a tie across stages cannot stream): the whole model is one stage.
        return [Stage("all", tuple(self.parameters()), self.body)]


class TorchTiedLM(torch.nn.Module):
    def __init__(self, ours: TiedLM | None = None):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.mix = torch.nn.Linear(D, D)
        self.norm = torch.nn.LayerNorm(D)
        self.out = torch.nn.Linear(D, V)
        self.out.weight = self.emb.weight
        self.double()
        if ours is not None:
            self.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})

    def forward(self, ids):
        h = self.emb(ids).mean(1)
        h = torch.tanh(self.mix(h))
        h = self.norm(torch.tanh(self.mix(h)))
        return self.out(h)


def test_a_tied_models_state_dict_matches_torch_in_keys_order_dtypes_and_values():
    ours = TiedLM()
    theirs = TorchTiedLM(ours)
    sd, tsd = ours.state_dict(), theirs.state_dict()
    assert list(sd) == list(tsd) == ["emb.weight", "mix.weight", "mix.bias", "norm.weight", "norm.bias",
                                     "out.weight", "out.bias"]
    for k in sd:
        assert sd[k].dtype == np.float64 and str(tsd[k].dtype) == "torch.float64", k
        np.testing.assert_array_equal(sd[k], tsd[k].numpy(), err_msg=k)
    assert _names(ours.named_parameters()) == _names(theirs.named_parameters())  # out.weight left out, as torch
    fresh = TiedLM(seed=9)
    fresh.load_state_dict(tsd)  # both keys of the tie; loading keeps the tie
    assert fresh.out.weight is fresh.emb.weight
    np.testing.assert_array_equal(fresh.emb.weight.data, tsd["emb.weight"].numpy())


def test_non_strict_load_returns_what_torch_returns():
    ours = TiedLM()
    theirs = TorchTiedLM(ours)
    state = {k: v.copy() for k, v in ours.state_dict().items()}
    del state["mix.bias"], state["norm.weight"]
    state["extra.weight"] = np.zeros(2)
    got = ours.load_state_dict(state, strict=False)
    want = theirs.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    assert got.missing_keys == want.missing_keys and got.unexpected_keys == want.unexpected_keys
    assert tuple(got) == (want.missing_keys, want.unexpected_keys)
    with pytest.raises(RuntimeError, match=r"size mismatch for mix.weight: .*\(6, 5\).*\(6, 6\)"):
        ours.load_state_dict({**state, "mix.weight": np.zeros((6, 5))}, strict=False)


def test_non_persistent_buffers_stay_out_of_state_dict_like_torch():
    ours, theirs = nn.Linear(2, 2), torch.nn.Linear(2, 2)
    ours.register_buffer("kept", np.zeros(2))
    ours.register_buffer("scratch", np.zeros(2), persistent=False)
    theirs.register_buffer("kept", torch.zeros(2))
    theirs.register_buffer("scratch", torch.zeros(2), persistent=False)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias", "kept"]
    assert _names(ours.named_buffers()) == _names(theirs.named_buffers()) == ["kept", "scratch"]
    with pytest.raises(RuntimeError, match="Unexpected key.*'scratch'"):
        ours.load_state_dict({**ours.state_dict(), "scratch": np.ones(2)})


# Regression (fixed): a list or other non-mapping passed to load_state_dict gave "unhashable type: 'numpy.ndarray'".
def test_load_state_dict_of_a_non_mapping_says_so():
    with pytest.raises(TypeError, match="load_state_dict expects a mapping"):
        nn.Linear(2, 2).load_state_dict([("weight", np.zeros((2, 2)))])


# Regression (fixed): a value that is no array (None, a string, an object) was reported as a "size mismatch ...
# shape ()", which sends the user looking for a shape problem.
@pytest.mark.parametrize("value", [None, "abc", object()])
def test_a_value_that_is_no_array_is_named_as_such(value):
    layer = nn.Linear(3, 2)
    before = layer.weight.data.copy()
    with pytest.raises(RuntimeError, match="value for weight is a .*, not an array of numbers"):
        layer.load_state_dict({"weight": value, "bias": np.zeros(2)})
    np.testing.assert_array_equal(layer.weight.data, before)


# Regression (fixed): a torch bfloat16 tensor (a common checkpoint dtype) failed with "Got unsupported ScalarType
# BFloat16"; torch loads it into a float32 model, casting.
def test_a_torch_bfloat16_checkpoint_loads_as_torch_loads_it():
    theirs = torch.nn.Linear(3, 2)
    state = {k: v.to(torch.bfloat16) for k, v in theirs.state_dict().items()}
    theirs.load_state_dict(state)
    ours = nn.Linear(3, 2)
    ours.load_state_dict(state)
    for k, v in theirs.state_dict().items():
        np.testing.assert_array_equal(ours.state_dict()[k], v.numpy(), err_msg=k)


# Regression (fixed): a float64 value beyond float32's range was loaded as inf into a float32 model (with NumPy set
# to raise, the copy failed half way, after earlier keys were already loaded).
def test_a_value_beyond_the_models_dtype_range_is_refused_and_nothing_loads():
    layer = nn.Linear(3, 2)
    before = layer.state_dict()
    with pytest.raises(RuntimeError, match="bias.*beyond the range of float32"):
        layer.load_state_dict({"weight": np.ones((2, 3)), "bias": np.array([1.0, 1e300])})
    for k, v in layer.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


# -- tied and frozen parameters trained on every route, against torch ---------------------------------------------

def _batches(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, V, (4, 3)), rng.integers(0, V, 4)) for _ in range(n)]


def _train_both(route, tmp_path, *, clip=None, freeze=None, opt="adamw"):
    ours = TiedLM()
    theirs = TorchTiedLM(ours)
    if freeze is not None:
        getattr(ours, freeze).requires_grad_(False)
        getattr(theirs, freeze).requires_grad_(False)
    if opt == "adamw":
        o, to = optim.AdamW(ours.parameters(), lr=1e-2, weight_decay=0.1), torch.optim.AdamW(
            theirs.parameters(), lr=1e-2, weight_decay=0.1)
    else:
        o, to = optim.SGD(ours.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2), torch.optim.SGD(
            theirs.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    trainer = Trainer(ours, o, F.cross_entropy, route=route, clip_grad_norm=clip, store_dir=tmp_path / route)
    losses, tlosses = [], []
    for x, y in _batches():
        report = trainer.step(x, y)
        assert report.route == route
        losses.append(report.loss)
        to.zero_grad()
        loss = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(theirs.parameters(), clip)
        to.step()
        tlosses.append(loss.item())
    if trainer.stream is not None:
        trainer.stream.to_memory()
    return ours, theirs, o, to, losses, tlosses


@pytest.mark.parametrize("route", ["eager", "fused", "streaming"])
@pytest.mark.parametrize("clip,opt", [(None, "adamw"), (0.5, "sgd")])
def test_tied_weights_train_like_torch_on_every_route(route, clip, opt, tmp_path):
    ours, theirs, o, to, losses, tlosses = _train_both(route, tmp_path, clip=clip, opt=opt)
    np.testing.assert_allclose(losses, tlosses, rtol=0, atol=TOL)
    assert ours.out.weight is ours.emb.weight and len(list(ours.parameters())) == 6
    for (name, p), tp in zip(ours.named_parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.data, tp.detach().numpy(), rtol=0, atol=TOL, err_msg=name)
        for key, value in to.state[tp].items():  # the tied table has one state, from the summed gradient
            np.testing.assert_allclose(np.asarray(o.state[p][key]), value.numpy(), rtol=0, atol=TOL,
                                       err_msg=f"{name} {key}")
    assert len(o.state) == len(to.state) == 6
    assert np.abs(ours.emb.weight.data - TiedLM().emb.weight.data).max() > 1e-3  # it trained


def test_a_tied_parameter_gets_the_summed_gradient_like_torch():
    ours = TiedLM()
    theirs = TorchTiedLM(ours)
    x, y = _batches(1)[0]
    F.cross_entropy(ours(x), y).backward()
    torch.nn.functional.cross_entropy(theirs(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    for (name, p), tp in zip(ours.named_parameters(), theirs.parameters()):
        np.testing.assert_allclose(np.asarray(p.grad), tp.grad.numpy(), rtol=0, atol=TOL, err_msg=name)
    assert ours.out.weight.grad is ours.emb.weight.grad


@pytest.mark.parametrize("route", ["eager", "fused", "streaming"])
@pytest.mark.parametrize("freeze,clip", [("mix", None), ("emb", 0.5)])
def test_part_of_a_tied_model_frozen_trains_like_torch_on_every_route(route, freeze, clip, tmp_path):
    frozen_before = {n: p.data.copy() for n, p in TiedLM().named_parameters() if n.startswith(freeze)}
    ours, theirs, o, to, losses, tlosses = _train_both(route, tmp_path, clip=clip, freeze=freeze)
    np.testing.assert_allclose(losses, tlosses, rtol=0, atol=TOL)
    for (name, p), tp in zip(ours.named_parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.data, tp.detach().numpy(), rtol=0, atol=TOL, err_msg=name)
        if name in frozen_before:
            np.testing.assert_array_equal(p.data, frozen_before[name], err_msg=name)
    with_state = sorted(n for n, p in ours.named_parameters() if o.state.get(p))
    assert with_state == sorted(n for n, p in theirs.named_parameters() if to.state.get(p))
    assert not any(n.startswith(freeze) for n in with_state)


# Regression (fixed): a BERT whose layers share one block (ALBERT-style: model.layers[1] = model.layers[0]) could not
# be saved or loaded in the Hugging Face layout: to_hf_state_dict / load_hf_state_dict looked keys up in
# named_parameters(), which lists a shared parameter once, and failed with KeyError 'layers.1.attn.qkv.weight'.
# A checkpoint keeps one key per path, as torch's state_dict and Hugging Face's do.
def test_a_bert_with_shared_layers_saves_and_loads_in_the_hugging_face_layout():
    from tensorarena.models.bert import BertConfig, BertModel, load_hf_state_dict, to_hf_state_dict

    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=16, dtype=np.float64)

    def shared(seed):
        model = BertModel(config, rng=np.random.default_rng(seed))
        model.layers[1] = model.layers[0]
        return model

    source = shared(0)
    hf = to_hf_state_dict(source)
    plain = to_hf_state_dict(BertModel(config))
    assert list(hf) == list(plain)  # every layer's keys, in the same order as an unshared model's
    np.testing.assert_array_equal(hf["encoder.layer.1.attention.self.key.weight"],
                                  hf["encoder.layer.0.attention.self.key.weight"])
    target = shared(1)
    load_hf_state_dict(target, hf)
    assert target.layers[1] is target.layers[0]
    for (name, p), q in zip(source.named_parameters(), target.parameters()):
        np.testing.assert_array_equal(q.data, p.data, err_msg=name)
