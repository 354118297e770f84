"""Module and container edges found by a hunt on 2026-12-06, each against torch where torch has the call. Run on the
commit before the one that added this file (a worktree of it first on PYTHONPATH), the 7 others failed and
test_module_list_operations_as_torch never ended (ml += ml grew the list forever; the run was killed). The worst: lists of modules filled after assignment were walked through views made on the
fly, and a freed view's id() handed to the next one made it a "duplicate": parameters randomly missing from
parameters() (never trained), modules missing from eval() and apply().
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch

from tensorarena import nn, optim


class _FilledLater(nn.Module):
    def __init__(self, make=lambda: nn.Linear(1, 1)) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = [], [], [], []
        for entries in (self.a, self.b, self.c, self.d):
            entries.append(make())


def test_lists_filled_after_assignment_give_every_parameter_every_time():
    for _ in range(25):  # the lost ones depended on which addresses the allocator reused
        model = _FilledLater()
        assert len(list(model.parameters())) == 8 and len(optim.SGD(model.parameters(), lr=0.1).param_groups[0]["params"]) == 8
        assert [n for n, _ in model.named_modules()] == ["", "a", "a.0", "b", "b.0", "c", "c.0", "d", "d.0"]
    model = _FilledLater(lambda: nn.Dropout(0.5))
    model.eval()
    assert not any(m.training for m in (model.a[0], model.b[0], model.c[0], model.d[0]))


def test_a_list_assigned_is_the_callers_own_list():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers = [nn.Linear(2, 2)]
            self.layers = layers
            layers.append(nn.Linear(2, 3))  # after the assignment, as for a list that started empty

    assert list(Net().state_dict()) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]


def test_a_list_of_lists_of_modules_is_refused_not_left_untrained():
    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.nest = [[nn.Linear(1, 1)]]

    with pytest.raises(TypeError, match="'nest' is a list holding Modules or Parameters inside other lists.*ModuleList"):
        Nested()


def test_module_list_operations_as_torch():
    ours, theirs = nn.ModuleList([nn.ReLU()]), torch.nn.ModuleList([torch.nn.ReLU()])
    ours += ours  # extend by itself: a snapshot (it looped forever)
    assert len(ours) == 2
    assert isinstance(ours.pop(0), nn.ReLU) and len(ours) == 1
    assert isinstance(theirs.pop(0), torch.nn.ReLU)
    with pytest.raises(IndexError, match="index 3 is out of range for a ModuleList of 1"):
        ours.pop(3)


def test_sequential_of_a_dict_is_named_by_its_keys_as_torch():
    ours = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", nn.ReLU()), ("out", nn.Linear(2, 1))]))
    theirs = torch.nn.Sequential(OrderedDict([("fc", torch.nn.Linear(2, 2)), ("act", torch.nn.ReLU()),
                                              ("out", torch.nn.Linear(2, 1))]))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.detach().numpy().astype(np.float32) for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    np.testing.assert_allclose(ours(x).numpy(), theirs(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert list(ours[:2].state_dict()) == list(theirs[:2].state_dict()) == ["fc.weight", "fc.bias"]
    assert ours.insert(1, nn.Tanh()) is ours  # torch's Sequential.insert returns it
    assert isinstance(ours.pop(1), nn.Tanh)


def test_module_dict_entries_are_attributes_as_torch():
    ours = nn.ModuleDict({"fc": nn.Linear(1, 1)})
    assert ours.fc is ours["fc"]
    assert torch.nn.ModuleDict({"fc": torch.nn.Linear(1, 1)}).fc is not None
    with pytest.raises(AttributeError, match="no attribute 'other'"):
        ours.other


def test_parameter_list_operations_as_torch():
    ps = [nn.Parameter(np.ones(2)), nn.Parameter(np.zeros(3)), nn.Parameter(np.ones(1))]
    ours = nn.ParameterList(ps[:2])
    assert isinstance(ours[1:], nn.ParameterList) and isinstance(torch.nn.ParameterList([])[0:], torch.nn.ParameterList)
    ours.extend([ps[2]])
    ours[0] = ps[2]
    assert [p is q for p, q in zip(ours, [ps[2], ps[1], ps[2]])] == [True, True, True]
    with pytest.raises(IndexError, match="index 5 is out of range for a ParameterList of 3"):
        ours[5]


def test_parameters_of_python_numbers_are_float32_and_reprs_as_torch():
    assert nn.Parameter(3.0).dtype == np.float32 and nn.Parameter([1.0, 2.0]).dtype == np.float32
    assert torch.nn.Parameter(torch.tensor(3.0)).dtype == torch.float32
    assert nn.Parameter(np.ones(2)).dtype == np.float64  # control: an array keeps its dtype
    assert repr(nn.ReLU(inplace=True)) == repr(torch.nn.ReLU(inplace=True)) == "ReLU(inplace=True)"
    assert repr(nn.Dropout(0.2)) == repr(torch.nn.Dropout(0.2))
    assert "(x): Parameter of shape (2,)" in repr(nn.ParameterDict({"x": nn.Parameter(np.ones(2))}))
