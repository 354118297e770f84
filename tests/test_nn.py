"""nn.Module, layers, init and the MLP model against torch.nn: names, checkpoints both ways, outputs, grads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tensorarena as ta
import tensorarena.nn as nn
import tensorarena.nn.functional as F
from tensorarena.models import MLP, MLPConfig
from tensorarena.nn import init

TORCH_DTYPE = {np.float32: torch.float32, np.float64: torch.float64}
OUT_TOL = {np.float64: 1e-12, np.float32: 1e-5}


def _to_torch(state) -> dict:
    return {k: torch.from_numpy(v) for k, v in state.items()}


def _names(module) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, tuple(p.shape)) for n, p in module.named_parameters()]


# -- equivalent model pairs ----------------------------------------------------------

class Block(nn.Module):
    def __init__(self, dim: int, rng) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim, rng=rng)


class Tower(nn.Module):
    """Own parameter after children (torch lists own parameters first), a list of blocks."""

    def __init__(self, rng) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6, rng=rng)
        self.blocks = [Block(6, rng), Block(6, rng)]
        self.scale = nn.Parameter(np.ones(6, np.float32))
        self.head = nn.Sequential(nn.Linear(6, 4, rng=rng), nn.GELU(), nn.Linear(4, 3, bias=False, rng=rng))


class TorchBlock(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(dim)
        self.fc = torch.nn.Linear(dim, dim)


class TorchTower(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.blocks = torch.nn.ModuleList([TorchBlock(6), TorchBlock(6)])
        self.scale = torch.nn.Parameter(torch.ones(6))
        self.head = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.GELU(), torch.nn.Linear(4, 3, bias=False))


class TextClassifier(nn.Module):
    """Embedding + LayerNorm + Linear."""

    def __init__(self, *, rng=None, dtype=np.float32) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8, rng=rng, dtype=dtype)
        self.norm = nn.LayerNorm(8, dtype=dtype)
        self.proj = nn.Linear(8, 5, rng=rng, dtype=dtype)

    def forward(self, idx):
        return self.proj(self.norm(self.embed(idx)))


class TorchTextClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.proj = torch.nn.Linear(8, 5)

    def forward(self, idx):
        return self.proj(self.norm(self.embed(idx)))


class TorchMLP(torch.nn.Module):
    """What MLP(config) is, written in torch."""

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        act = {"relu": torch.nn.ReLU, "gelu": torch.nn.GELU, "tanh": torch.nn.Tanh}[config.activation]
        sizes = (config.in_features, *config.hidden)
        layers = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [torch.nn.Linear(a, b), act()]
            if config.dropout > 0:
                layers.append(torch.nn.Dropout(config.dropout))
        layers.append(torch.nn.Linear(sizes[-1], config.out_features))
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


# -- names and structure ---------------------------------------------------------------

def test_sequential_names_match_torch():
    ours = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 5, bias=False), nn.Tanh(), nn.LayerNorm(5))
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 5, bias=False),
                                 torch.nn.Tanh(), torch.nn.LayerNorm(5))
    assert _names(ours) == _names(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert len(ours) == 5 and isinstance(ours[1], nn.ReLU) and isinstance(ours[-1], nn.LayerNorm)
    assert [type(m) for m in ours] == [nn.Linear, nn.ReLU, nn.Linear, nn.Tanh, nn.LayerNorm]
    tail = ours[2:]
    assert isinstance(tail, nn.Sequential) and len(tail) == 3 and tail[0] is ours[2]


def test_nested_modules_and_lists_names_match_torch():
    ours, theirs = Tower(np.random.default_rng(0)), TorchTower()
    assert _names(ours) == _names(theirs)
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert isinstance(ours.blocks, nn.ModuleList) and len(ours.blocks) == 2
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())


def test_list_filled_after_assignment_and_shared_parameters():
    class Late(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = []  # empty when assigned: found when walked
            self.layers.append(nn.Linear(2, 2))
            self.layers.append(nn.Linear(2, 2))
            self.tied = self.layers[0]  # same module twice: its parameters count once

    m = Late()
    assert [n for n, _ in m.named_parameters()] == ["layers.0.weight", "layers.0.bias",
                                                    "layers.1.weight", "layers.1.bias"]
    assert m.num_parameters() == 12
    # state_dict keeps one key per path, like torch
    assert list(m.state_dict()) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                                    "tied.weight", "tied.bias"]


def test_list_of_parameters_named_like_parameterlist():
    class Ours(nn.Module):
        def __init__(self):
            super().__init__()
            self.ws = [nn.Parameter(np.zeros(2)), nn.Parameter(np.zeros(3))]
            self.fc = nn.Linear(2, 2)

    class Theirs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ws = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))])
            self.fc = torch.nn.Linear(2, 2)

    assert _names(Ours()) == _names(Theirs())


def test_mixed_list_is_refused():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.things = [nn.Linear(2, 2), "not a module"]

    with pytest.raises(TypeError, match="mixing Modules"):
        Bad()


def test_repr_like_torch():
    m = MLP(MLPConfig(3, (4,), 2, activation="gelu", dropout=0.1))
    text = repr(m)
    assert text.startswith("MLP(\n  (net): Sequential(\n    (0): Linear(in_features=3, out_features=4, bias=True)")
    assert "(1): GELU(approximate='none')" in text and "(2): Dropout(p=0.1, inplace=False)" in text  # torch's
    assert repr(nn.ReLU()) == "ReLU()"
    assert repr(nn.Embedding(5, 3, padding_idx=-1)) == "Embedding(5, 3, padding_idx=4)"


# -- checkpoints both ways with identical outputs ---------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh"])
def test_mlp_state_dict_round_trip_with_torch(dtype, activation):
    config = MLPConfig(7, (16, 12), 3, activation=activation, dropout=0.2, dtype=dtype)
    ours = MLP(config, rng=np.random.default_rng(1)).eval()
    theirs = TorchMLP(config).to(TORCH_DTYPE[dtype]).eval()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert list(ours.state_dict())[:4] == ["net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias"]
    x = np.random.default_rng(2).standard_normal((5, 7)).astype(dtype)

    theirs.load_state_dict(_to_torch(ours.state_dict()))  # ours -> torch
    with torch.no_grad():
        ref = theirs(torch.from_numpy(x)).numpy()
    out = ours(ta.tensor(x, dtype=dtype))
    assert out.dtype == dtype
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=OUT_TOL[dtype])

    torch.manual_seed(3)
    theirs = TorchMLP(config).to(TORCH_DTYPE[dtype]).eval()  # fresh torch weights -> ours
    ours.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        ref = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours(ta.tensor(x, dtype=dtype)).numpy(), ref, rtol=0, atol=OUT_TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_embedding_layernorm_linear_round_trip_with_torch(dtype):
    ours = TextClassifier(rng=np.random.default_rng(4), dtype=dtype)
    # non-trivial LayerNorm affine so that loading it matters
    init.normal_(ours.norm.weight, 1.0, 0.3, rng=np.random.default_rng(5))
    init.normal_(ours.norm.bias, 0.0, 0.3, rng=np.random.default_rng(6))
    theirs = TorchTextClassifier().to(TORCH_DTYPE[dtype])
    idx = np.random.default_rng(7).integers(0, 20, size=(3, 9))

    theirs.load_state_dict(_to_torch(ours.state_dict()))
    with torch.no_grad():
        ref = theirs(torch.from_numpy(idx)).numpy()
    np.testing.assert_allclose(ours(idx).numpy(), ref, rtol=0, atol=OUT_TOL[dtype])

    torch.manual_seed(8)
    theirs = TorchTextClassifier().to(TORCH_DTYPE[dtype])
    ours.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        ref = theirs(torch.from_numpy(idx)).numpy()
    np.testing.assert_allclose(ours(ta.Tensor(idx)).numpy(), ref, rtol=0, atol=OUT_TOL[dtype])


# -- layers against torch: forward and gradients --------------------------------------------

def test_linear_forward_and_grads_match_torch():
    rng = np.random.default_rng(9)
    ours = nn.Linear(6, 4, rng=rng, dtype=np.float64)
    theirs = torch.nn.Linear(6, 4).double()
    theirs.load_state_dict(_to_torch(ours.state_dict()))
    x = rng.standard_normal((2, 3, 6))
    g = rng.standard_normal((2, 3, 4))
    xt = ta.tensor(x, dtype=np.float64, requires_grad=True)
    xr = torch.tensor(x, requires_grad=True)
    out, ref = ours(xt), theirs(xr)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-12, atol=1e-12)
    out.backward(g)
    ref.backward(torch.from_numpy(g))
    np.testing.assert_allclose(ours.weight.grad, theirs.weight.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours.bias.grad, theirs.bias.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(xt.grad, xr.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_layernorm_module_matches_torch():
    rng = np.random.default_rng(10)
    ours = nn.LayerNorm((3, 5), eps=1e-6, dtype=np.float64)
    init.normal_(ours.weight, 1.0, 0.5, rng=rng)
    init.normal_(ours.bias, 0.0, 0.5, rng=rng)
    theirs = torch.nn.LayerNorm((3, 5), eps=1e-6).double()
    theirs.load_state_dict(_to_torch(ours.state_dict()))
    x = rng.standard_normal((4, 3, 5)) * 3 + 1
    g = rng.standard_normal((4, 3, 5))
    xt = ta.tensor(x, dtype=np.float64, requires_grad=True)
    xr = torch.tensor(x, requires_grad=True)
    out, ref = ours(xt), theirs(xr)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    out.backward(g)
    ref.backward(torch.from_numpy(g))
    for name, a, b in [("weight", ours.weight.grad, theirs.weight.grad), ("bias", ours.bias.grad, theirs.bias.grad),
                       ("x", xt.grad, xr.grad)]:
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    plain = nn.LayerNorm(5, elementwise_affine=False)
    assert list(plain.parameters()) == [] and plain.weight is None


def test_embedding_padding_row_gets_no_gradient_like_torch():
    ours = nn.Embedding(6, 3, padding_idx=2, rng=np.random.default_rng(11), dtype=np.float64)
    assert np.all(ours.weight.data[2] == 0)
    ours.weight.data[2] = 5.0  # a loaded, non-zero padding row is still read as is
    theirs = torch.nn.Embedding(6, 3, padding_idx=2).double()
    theirs.load_state_dict(_to_torch(ours.state_dict()))
    idx = np.array([[0, 2, 2], [5, 1, 2]])
    g = np.random.default_rng(12).standard_normal((2, 3, 3))
    out, ref = ours(idx), theirs(torch.from_numpy(idx))
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    out.backward(g)
    ref.backward(torch.from_numpy(g))
    np.testing.assert_allclose(ours.weight.grad, theirs.weight.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert np.all(ours.weight.grad[2] == 0)


# -- initialisation ------------------------------------------------------------------------

def test_linear_init_within_torch_bound():
    m = nn.Linear(256, 512, rng=np.random.default_rng(13))
    bound = 1 / math.sqrt(256)
    w, b = m.weight.data, m.bias.data
    assert w.shape == (512, 256) and w.dtype == np.float32 and b.shape == (512,)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert np.abs(w).max() > 0.99 * bound  # the whole interval is used
    # U(-c, c) has std c/sqrt(3); 131072 draws put the sample std within ~0.5% of it
    assert w.std() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    assert abs(w.mean()) < 0.01 * bound


def test_normal_inits_have_the_right_statistics():
    e = nn.Embedding(1000, 64, padding_idx=0, rng=np.random.default_rng(14))
    rest = e.weight.data[1:]
    assert np.all(e.weight.data[0] == 0)
    assert rest.std() == pytest.approx(1.0, rel=0.02) and abs(rest.mean()) < 0.02
    p = nn.Parameter(np.empty((300, 300), np.float64))
    init.normal_(p, 0.5, 0.02, rng=np.random.default_rng(15))
    assert p.data.std() == pytest.approx(0.02, rel=0.02) and p.data.mean() == pytest.approx(0.5, abs=1e-3)
    init.trunc_normal_(p, 0.0, 1.0, -2.0, 2.0, rng=np.random.default_rng(16))
    assert p.data.min() >= -2.0 and p.data.max() <= 2.0
    # the N(0,1) truncated to [-2, 2] has std 0.8796
    assert p.data.std() == pytest.approx(0.8796, rel=0.02)
    init.xavier_uniform_(p, rng=np.random.default_rng(17))
    assert np.abs(p.data).max() <= math.sqrt(6 / 600)
    init.ones_(p)
    assert np.all(p.data == 1)
    init.zeros_(p)
    assert np.all(p.data == 0)


def test_same_seed_same_weights():
    config = MLPConfig(5, (8,), 2)
    a = MLP(config, rng=np.random.default_rng(18)).state_dict()
    b = MLP(config, rng=np.random.default_rng(18)).state_dict()
    c = MLP(config, rng=np.random.default_rng(19)).state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["net.0.weight"], c["net.0.weight"])
    init.manual_seed(20)
    d = MLP(config).state_dict()
    init.manual_seed(20)
    e = MLP(config).state_dict()
    assert all(np.array_equal(d[k], e[k]) for k in d)
    # float64 and float32 models from one seed hold the same weights up to rounding
    f = MLP(MLPConfig(5, (8,), 2, dtype=np.float64), rng=np.random.default_rng(18)).state_dict()
    assert all(np.array_equal(f[k].astype(np.float32), a[k]) for k in a)


def test_init_rejects_a_non_generator():
    with pytest.raises(TypeError, match="default_rng"):
        nn.Linear(2, 2, rng=np.random.RandomState(0))


# -- modes -------------------------------------------------------------------------------------

def test_train_eval_toggles_dropout():
    m = MLP(MLPConfig(4, (64,), 64, dropout=0.5), rng=np.random.default_rng(21))
    drop = m.net[2]
    assert isinstance(drop, nn.Dropout) and m.training and drop.training
    x = np.ones((8, 64), np.float32)
    layer = nn.Dropout(0.5, rng=np.random.default_rng(22))
    y = layer(ta.tensor(x)).numpy()
    assert set(np.unique(y)) <= {0.0, 2.0} and 0.3 < (y == 0).mean() < 0.7
    assert m.eval() is m and not m.training and not drop.training and not m.net.training
    np.testing.assert_array_equal(layer.eval()(ta.tensor(x)).numpy(), x)  # eval: identity
    x4 = ta.tensor(np.random.default_rng(23).standard_normal((3, 4)).astype(np.float32))
    np.testing.assert_array_equal(m(x4).numpy(), m(x4).numpy())  # deterministic in eval
    m.train()
    assert all(mod.training for mod in m.modules())


def test_dropout_rng_none_follows_manual_seed():
    layer = nn.Dropout(0.5)
    x = ta.tensor(np.ones((4, 32), np.float32))
    init.manual_seed(24)
    a = layer(x).numpy()
    init.manual_seed(24)
    np.testing.assert_array_equal(layer(x).numpy(), a)
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


def test_zero_grad():
    m = nn.Linear(3, 2, rng=np.random.default_rng(25))
    m(ta.tensor(np.ones((2, 3), np.float32))).backward(np.ones((2, 2), np.float32))
    assert m.weight.grad is not None
    m.zero_grad(set_to_none=False)
    assert np.all(m.weight.grad == 0) and np.all(m.bias.grad == 0)
    m.zero_grad()
    assert m.weight.grad is None and m.bias.grad is None


# -- load_state_dict contract ---------------------------------------------------------------------

def _tower_and_state():
    m = Tower(np.random.default_rng(26))
    state = {k: np.full(v.shape, 0.25, v.dtype) for k, v in m.state_dict().items()}
    return m, state


def test_strict_load_reports_every_problem_at_once_and_loads_nothing():
    m, state = _tower_and_state()
    before = m.state_dict()
    del state["blocks.1.fc.bias"], state["scale"]
    state["blocks.2.fc.weight"] = np.zeros((6, 6), np.float32)
    state["head.1.weight"] = np.zeros(4, np.float32)
    state["embed.weight"] = np.zeros((12, 6), np.float32)
    state["head.2.weight"] = np.zeros((3, 5), np.float32)
    with pytest.raises(RuntimeError) as err:
        m.load_state_dict(state)
    msg = str(err.value)
    for key in ("blocks.1.fc.bias", "scale", "blocks.2.fc.weight", "head.1.weight"):
        assert repr(key) in msg, key
    assert "Missing key(s)" in msg and "Unexpected key(s)" in msg
    assert "size mismatch for embed.weight" in msg and "(12, 6)" in msg and "(11, 6)" in msg
    assert "size mismatch for head.2.weight" in msg and "(3, 5)" in msg and "(3, 4)" in msg
    after = m.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)  # nothing copied


def test_non_strict_load_returns_keys_but_still_refuses_shape_mismatch():
    m, state = _tower_and_state()
    del state["scale"]
    state["extra.weight"] = np.zeros(3, np.float32)
    result = m.load_state_dict(state, strict=False)
    assert result.missing_keys == ["scale"] and result.unexpected_keys == ["extra.weight"]
    assert isinstance(result, nn.IncompatibleKeys)
    assert np.all(m.embed.weight.data == 0.25) and np.all(m.scale.data == 1)
    state["head.0.bias"] = np.zeros(5, np.float32)
    with pytest.raises(RuntimeError, match=r"size mismatch for head.0.bias.*\(5,\).*\(4,\)"):
        m.load_state_dict(state, strict=False)


def test_load_keeps_parameter_identity_and_address_and_casts_dtype():
    m = TextClassifier(rng=np.random.default_rng(27))
    params = dict(m.named_parameters())
    addresses = {n: p.data.ctypes.data for n, p in params.items()}
    state64 = {k: np.random.default_rng(28).standard_normal(v.shape) for k, v in m.state_dict().items()}
    m.load_state_dict(state64)  # float64 values into float32 parameters
    for n, p in m.named_parameters():
        assert p is params[n] and p.data.ctypes.data == addresses[n] and p.dtype == np.float32
        np.testing.assert_array_equal(p.data, state64[n].astype(np.float32))
    # Tensors and torch tensors (even ones requiring grad) are accepted too
    m.load_state_dict({k: ta.tensor(v) for k, v in state64.items()})
    torch_state = {k: torch.tensor(v, requires_grad=True) for k, v in state64.items()}
    m.load_state_dict(torch_state)
    assert all(p.data.ctypes.data == addresses[n] for n, p in m.named_parameters())
    # state_dict hands out copies, not views of the parameters
    sd = m.state_dict()
    sd["proj.bias"][:] = 123
    assert not np.any(m.proj.bias.data == 123)


def test_dtype_conversion_keeps_parameters_and_matches():
    m = MLP(MLPConfig(4, (8,), 3, activation="tanh"), rng=np.random.default_rng(29))
    params = list(m.parameters())
    x = np.random.default_rng(30).standard_normal((2, 4))
    y32 = m(ta.tensor(x, dtype=np.float32)).numpy()
    assert m.double() is m
    assert all(p.dtype == np.float64 for p in m.parameters()) and list(m.parameters()) == params
    y64 = m(ta.tensor(x, dtype=np.float64))
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64.numpy(), y32, rtol=1e-5, atol=1e-6)
    m.float()
    assert all(p.dtype == np.float32 for p in m.parameters())
    with pytest.raises(TypeError, match="float32 and float64"):
        m.to(np.int32)


def test_buffers_in_state_dict_and_dtype():
    class WithStats(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.register_buffer("running_mean", np.zeros(2, np.float32))
            self.register_buffer("scratch", np.zeros(3, np.float32), persistent=False)

    m = WithStats()
    assert list(m.state_dict()) == ["running_mean", "fc.weight", "fc.bias"]
    assert [n for n, _ in m.named_buffers()] == ["running_mean", "scratch"]
    addr = m.running_mean.ctypes.data
    state = m.state_dict()
    state["running_mean"] = np.array([1.0, 2.0])
    m.load_state_dict(state)
    assert m.running_mean.ctypes.data == addr and list(m.running_mean) == [1.0, 2.0]
    m.double()
    assert m.running_mean.dtype == np.float64 and m.scratch.dtype == np.float64


def test_functional_namespace_is_reachable():
    assert F is nn.functional and ta.nn.functional is F and callable(F.linear)
    with pytest.raises(ValueError, match="activation"):
        MLPConfig(2, (3,), 1, activation="swish")
