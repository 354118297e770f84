"""NAdam, RMSprop, Adagrad, Lion, LAMB and the uniform `update_flat` API every optimizer shares.

torch.optim is the reference where it has the optimizer; Lion and LAMB are checked against
their papers' formulas written out below with torch tensor ops. Every optimizer is also run
the way the fused route runs it (a group's parameters concatenated into one flat buffer, one
`update_flat` call per group) and must agree with its own eager per-tensor `step()`.
"""

from __future__ import annotations

import contextlib
import copy
import re
import tracemalloc

import numpy as np
import pytest
import torch

from tensorarena import kernels, optim
from tensorarena.nn import Parameter
from tests.test_optim import (GRAD_SCALE, SHAPES, STEPS, TOL, TORCH_DTYPE, _grad_stream, _grouped, _max_diff,
                              _params, _run_against_torch, _set_grads, _train)

DTYPES = [np.float64, np.float32]
DTYPE_IDS = ["f64", "f32"]
FLAT_TOL = {np.float64: 1e-10, np.float32: 1e-5}


@contextlib.contextmanager
def _torch_scalars_in(dtype):
    """torch keeps NAdam's mu_product (and every step count) in the default dtype, float32 unless
    changed; ours are float64, so a float64 comparison at 1e-10 needs torch's in float64 too."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(TORCH_DTYPE[dtype] if dtype == np.float64 else saved)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


# -- eager step against torch.optim ------------------------------------------------------------

TORCH_CASES = [
    (optim.SGD, torch.optim.SGD, dict(lr=0.1)),
    (optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    (optim.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
    (optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.5, dampening=0.2, weight_decay=0.01)),
    (optim.Adam, torch.optim.Adam, dict(lr=0.01)),
    (optim.AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    (optim.Adam, torch.optim.Adam, dict(lr=0.01, amsgrad=True)),
    (optim.NAdam, torch.optim.NAdam, dict(lr=0.01)),
    (optim.NAdam, torch.optim.NAdam, dict(lr=0.01, weight_decay=0.1)),
    (optim.NAdam, torch.optim.NAdam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    # beta1 < 0.5 takes torch's other lerp branch; a larger momentum_decay moves mu faster
    (optim.NAdam, torch.optim.NAdam, dict(lr=0.01, betas=(0.3, 0.6), momentum_decay=0.05, maximize=True)),
    (optim.RMSprop, torch.optim.RMSprop, dict(lr=1e-3)),
    (optim.RMSprop, torch.optim.RMSprop, dict(lr=1e-3, centered=True)),
    (optim.RMSprop, torch.optim.RMSprop, dict(lr=1e-3, momentum=0.9)),
    (optim.RMSprop, torch.optim.RMSprop, dict(lr=1e-3, centered=True, momentum=0.5, weight_decay=0.1,
                                              maximize=True)),
    (optim.RMSprop, torch.optim.RMSprop, dict(lr=1e-3, alpha=0.3, centered=True)),  # the other lerp branch
    (optim.Adagrad, torch.optim.Adagrad, dict(lr=0.05)),
    (optim.Adagrad, torch.optim.Adagrad, dict(lr=0.05, lr_decay=0.01)),
    (optim.Adagrad, torch.optim.Adagrad, dict(lr=0.05, lr_decay=0.05, weight_decay=0.1,
                                              initial_accumulator_value=0.5, maximize=True)),
]
TORCH_CASES = [(ours, theirs, dict(kw, fused=fused)) for ours, theirs, kw in TORCH_CASES for fused in (True, False)]


def _case_id(case):
    cls, _, kw = case
    return cls.__name__ + "-" + "-".join(f"{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", TORCH_CASES, ids=[_case_id(c) for c in TORCH_CASES])
def test_eager_step_matches_torch(case, dtype):
    ours_cls, torch_cls, kwargs = case
    with _torch_scalars_in(dtype):
        _run_against_torch(ours_cls, torch_cls, kwargs, dtype)


@pytest.mark.parametrize("ours_cls, torch_cls, kwargs", [
    (optim.NAdam, torch.optim.NAdam, dict(lr=0.01, weight_decay=0.1)),
    (optim.RMSprop, torch.optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.9)),
    (optim.Adagrad, torch.optim.Adagrad, dict(lr=0.1, initial_accumulator_value=0.1)),
], ids=["NAdam", "RMSprop", "Adagrad"])
def test_state_layout_and_values_match_torch(ours_cls, torch_cls, kwargs):
    with _torch_scalars_in(np.float64):
        opt, topt = _run_against_torch(ours_cls, torch_cls, kwargs, np.float64, group_lrs=(0.02, 0.005), steps=8)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sorted(sd["state"]) == sorted(tsd["state"])  # every parameter stepped by now
    for index, entry in sd["state"].items():
        theirs = tsd["state"][index]
        assert set(entry) == set(theirs)
        for key, value in entry.items():
            scalar = key in ("step", "mu_product")
            assert value.dtype == (np.float64 if scalar else opt.param_groups[0]["params"][0].dtype)
            np.testing.assert_allclose(value, theirs[key].numpy(), rtol=1e-12, atol=1e-14, err_msg=key)
    assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in tsd["param_groups"]]


# -- Lion and LAMB against their papers ----------------------------------------------------------

def _lion_paper(t, g, state, *, lr, betas, weight_decay):
    """Chen et al. 2023, Algorithm 2, one tensor: c = b1 m + (1-b1) g; p -= lr (sign(c) + wd p); m = b2 m + (1-b2) g"""
    m = state.setdefault("m", torch.zeros_like(t))
    b1, b2 = betas
    c = b1 * m + (1 - b1) * g
    t -= lr * (torch.sign(c) + weight_decay * t)
    state["m"] = b2 * m + (1 - b2) * g


def _lamb_paper(t, g, state, *, lr, betas, eps, weight_decay):
    """You et al. 2019, Algorithm 2 with phi = identity (one tensor, bias-corrected moments)."""
    b1, b2 = betas
    step = state["step"] = state.get("step", 0) + 1
    m = state["m"] = b1 * state.get("m", torch.zeros_like(t)) + (1 - b1) * g
    v = state["v"] = b2 * state.get("v", torch.zeros_like(t)) + (1 - b2) * g * g
    r = (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps) + weight_decay * t
    p_norm, r_norm = float(t.norm()), float(r.norm())
    trust = p_norm / r_norm if p_norm > 0 and r_norm > 0 else 1.0
    t -= lr * trust * r


PAPER_CASES = [
    (optim.Lion, _lion_paper, dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)),
    (optim.Lion, _lion_paper, dict(lr=3e-3, betas=(0.95, 0.98), weight_decay=0.1)),
    (optim.LAMB, _lamb_paper, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)),
    (optim.LAMB, _lamb_paper, dict(lr=2e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
]


@pytest.mark.parametrize("maximize", [False, True], ids=["min", "max"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 1e-5)], ids=DTYPE_IDS)
@pytest.mark.parametrize("case", PAPER_CASES, ids=[_case_id(c) for c in PAPER_CASES])
def test_lion_and_lamb_match_the_paper_formulas(case, dtype, tol, fused, maximize):
    cls, paper, kwargs = case
    ours, theirs = _params(dtype)
    theirs = [t.detach() for t in theirs]
    opt = cls(_grouped(ours, (kwargs["lr"], kwargs["lr"] / 3)), fused=fused, maximize=maximize,
              **{k: v for k, v in kwargs.items() if k != "lr"})
    lrs = [kwargs["lr"]] * 2 + [kwargs["lr"] / 3] * (len(ours) - 2)
    states = [{} for _ in ours]
    rng = np.random.default_rng(1)
    for step in range(STEPS):
        _set_grads(rng, step, ours, theirs, dtype)  # some steps give a parameter no gradient: skipped
        opt.step()
        for t, state, lr in zip(theirs, states, lrs):
            if t.grad is not None:
                paper(t, -t.grad if maximize else t.grad, state, **dict(kwargs, lr=lr))
        diff = _max_diff(ours, theirs)
        assert diff <= tol, f"step {step}: max |ours - paper| = {diff:.3g}"


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
def test_lamb_trust_ratio_is_one_for_a_zero_parameter(fused):
    p = Parameter(np.zeros(4), dtype=np.float64)
    p.grad = np.array([1.0, -2.0, 0.5, 0.0])
    optim.LAMB([p], lr=0.1, fused=fused).step()
    # step 1: m_hat = g, v_hat = g^2, r = g / (|g| + eps): the plain sign of g, scaled by lr alone
    np.testing.assert_allclose(p.data, -0.1 * p.grad / (np.abs(p.grad) + 1e-6), rtol=1e-15)


# -- fused kernel twins against their references ------------------------------------------------

def _segments(sizes):
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


KERNEL_CASES = {
    "nadam": (("exp_avg", "exp_avg_sq"), [
        dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, momentum_decay=4e-3),
        dict(lr=0.01, beta1=0.3, beta2=0.6, eps=1e-6, weight_decay=0.1, momentum_decay=0.05,
             decoupled_weight_decay=True, maximize=True),
    ]),
    "rmsprop": (("square_avg", "grad_avg", "momentum_buffer"), [
        dict(lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False),
        dict(lr=0.01, alpha=0.9, eps=1e-8, weight_decay=0.1, momentum=0.9, centered=True, maximize=True),
        dict(lr=0.01, alpha=0.3, eps=1e-8, weight_decay=0.0, momentum=0.5, centered=False),
    ]),
    "adagrad": (("sum",), [
        dict(lr=0.1, lr_decay=0.0, weight_decay=0.0, eps=1e-10),
        dict(lr=0.1, lr_decay=0.05, weight_decay=0.1, eps=1e-10, maximize=True),
    ]),
    "lion": (("exp_avg",), [
        dict(lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.0),
        dict(lr=1e-3, beta1=0.95, beta2=0.98, weight_decay=0.1, maximize=True),
    ]),
    "lamb": (("exp_avg", "exp_avg_sq"), [
        dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0),
        dict(lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05, maximize=True,
             segments=_segments([37, 0, 100, 1, 47])),  # an empty tensor too
    ]),
}
KERNEL_TOL = {np.float64: dict(rtol=1e-12, atol=1e-12), np.float32: dict(rtol=1e-5, atol=1e-5)}


def _call_kernel(name, impl, p, g, state, kw, step, mu_product):
    kw = dict(kw)
    if name == "nadam":  # the optimizer's momentum schedule, as NAdam.update_flat computes it
        md = kw.pop("momentum_decay")
        mu, mu_next = (kw["beta1"] * (1 - 0.5 * 0.96 ** (t * md)) for t in (step, step + 1))
        mu_product[impl] *= mu
        kw.update(mu=mu, mu_next=mu_next, mu_product=mu_product[impl])
    if name in ("nadam", "adagrad", "lamb"):
        kw["step"] = float(step)
    fn = kernels.kernel(name, impl)
    if name == "rmsprop":
        centered = kw.pop("centered")
        fn(p, g, state["square_avg"], state["grad_avg"] if centered else None,
           state["momentum_buffer"] if kw["momentum"] > 0 else None, **kw)
    elif name == "adagrad":
        fn(p, g, state["sum"], **kw)
    elif name == "lion":
        fn(p, g, state["exp_avg"], **kw)
    else:
        fn(p, g, state["exp_avg"], state["exp_avg_sq"], **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name, case", [(n, i) for n, (_, cases) in KERNEL_CASES.items() for i in range(len(cases))])
def test_fused_kernel_matches_its_reference_twin(name, case, dtype):
    keys, cases = KERNEL_CASES[name]
    kw = cases[case]
    rng = np.random.default_rng(case)
    p0 = rng.standard_normal(185).astype(dtype)
    init = {k: (np.abs(rng.standard_normal(p0.shape)) if k in ("sum", "square_avg") else np.zeros(p0.shape))
            for k in keys}
    runs = {impl: (p0.copy(), {k: v.astype(dtype) for k, v in init.items()}) for impl in ("reference", "fused")}
    mu_product = {"reference": 1.0, "fused": 1.0}
    for step in range(1, 21):
        g = rng.standard_normal(p0.shape).astype(dtype)
        for impl, (p, state) in runs.items():
            _call_kernel(name, impl, p, g, state, kw, step, mu_product)
    (p_ref, s_ref), (p_fused, s_fused) = runs["reference"], runs["fused"]
    np.testing.assert_allclose(p_fused, p_ref, **KERNEL_TOL[dtype])
    for k in keys:
        np.testing.assert_allclose(s_fused[k], s_ref[k], **KERNEL_TOL[dtype], err_msg=k)
    assert not np.array_equal(p_ref, p0)


@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_lamb_kernel_rejects_bad_segments(impl):
    p, g, m, v = (np.ones(10) for _ in range(4))
    fn = kernels.kernel("lamb", impl)
    for bad in (np.array([0, 4], np.int64), np.array([1, 10], np.int64), np.array([10], np.int64)):
        with pytest.raises(ValueError, match="segments must be offsets"):
            fn(p, g, m, v, step=1.0, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0, segments=bad)
    with pytest.raises(ValueError, match="must not decrease"):
        fn(p, g, m, v, step=1.0, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0,
           segments=np.array([0, 6, 3, 10], np.int64))


@pytest.mark.parametrize("name", ["nadam", "rmsprop", "adagrad", "lion", "lamb"])
def test_fused_kernels_refuse_mismatched_or_strided_state(name):
    keys, cases = KERNEL_CASES[name]
    p, g = np.ones(8), np.ones(8)
    bad_states = [{k: np.zeros(7 if i == 0 else 8) for i, k in enumerate(keys)},
                  {k: np.zeros(16)[::2] if i == 0 else np.zeros(8) for i, k in enumerate(keys)}]
    kw = dict(cases[-1], segments=None) if name == "lamb" else cases[-1]
    for state in bad_states:
        with pytest.raises(ValueError, match="does not match|C-contiguous"):
            _call_kernel(name, "fused", p, g, state, kw, 1, {"fused": 1.0})


# -- one update_flat per group over flat buffers == the eager per-tensor step --------------------

FLAT_MAKERS = {
    "SGD": lambda ps, **kw: optim.SGD(ps, **kw),
    "SGD-momentum": lambda ps, **kw: optim.SGD(ps, momentum=0.9, dampening=0.1, **kw),
    "SGD-nesterov": lambda ps, **kw: optim.SGD(ps, momentum=0.9, nesterov=True, weight_decay=0.01, maximize=True,
                                               **kw),
    "Adam": lambda ps, **kw: optim.Adam(ps, weight_decay=0.01, **kw),
    "AdamW": lambda ps, **kw: optim.AdamW(ps, weight_decay=0.1, **kw),
    "Adam-amsgrad": lambda ps, **kw: optim.Adam(ps, amsgrad=True, maximize=True, **kw),
    "NAdam": lambda ps, **kw: optim.NAdam(ps, weight_decay=0.01, **kw),
    "NAdam-decoupled": lambda ps, **kw: optim.NAdam(ps, weight_decay=0.1, decoupled_weight_decay=True, **kw),
    "RMSprop": lambda ps, **kw: optim.RMSprop(ps, **kw),
    "RMSprop-centered-momentum": lambda ps, **kw: optim.RMSprop(ps, centered=True, momentum=0.9, weight_decay=0.01,
                                                                **kw),
    "Adagrad": lambda ps, **kw: optim.Adagrad(ps, lr_decay=0.01, initial_accumulator_value=0.1, **kw),
    "Lion": lambda ps, **kw: optim.Lion(ps, weight_decay=0.1, **kw),
    "LAMB": lambda ps, **kw: optim.LAMB(ps, weight_decay=0.01, **kw),
    # (tests/test_optimizers_torch_more.py's optimizers)
    "Adamax": lambda ps, **kw: optim.Adamax(ps, weight_decay=0.01, **kw),
    "RAdam": lambda ps, **kw: optim.RAdam(ps, weight_decay=0.01, **kw),
    "RAdam-decoupled": lambda ps, **kw: optim.RAdam(ps, weight_decay=0.1, decoupled_weight_decay=True,
                                                    maximize=True, **kw),
    "Adadelta": lambda ps, **kw: optim.Adadelta(ps, weight_decay=0.01, **kw),
    "Rprop": lambda ps, **kw: optim.Rprop(ps, etas=(0.4, 1.3), **kw),
    "ASGD": lambda ps, **kw: optim.ASGD(ps, lambd=0.01, t0=5, weight_decay=0.01, **kw),
}
KERNEL_OF = {"SGD": "sgd", "Adam": "adam", "AdamW": "adam", "NAdam": "nadam", "RMSprop": "rmsprop",
             "Adagrad": "adagrad", "Lion": "lion", "LAMB": "lamb", "Adamax": "adamax", "RAdam": "radam",
             "Adadelta": "adadelta", "Rprop": "rprop", "ASGD": "asgd"}


class _FlatGroup:
    """A group's params, grads and state kinds concatenated into flat buffers, as the fused route holds them."""

    def __init__(self, opt, group):
        sizes = [p.data.size for p in group["params"]]
        self.group, self.params = group, group["params"]
        self.segments = _segments(sizes)
        dtype = self.params[0].dtype
        self.param = np.concatenate([p.data.reshape(-1) for p in self.params]).astype(dtype)
        self.grad = np.zeros_like(self.param)
        self.state = {k: np.full(self.param.shape, fill, dtype) for k, fill in opt.state_init(group).items()}
        self.state.update({k: np.array(v, np.float64) for k, v in opt.scalar_state_init(group).items()})
        self.step = np.array(0.0)

    def pieces(self, flat):
        return [flat[a:b].reshape(p.shape) for a, b, p in zip(self.segments[:-1], self.segments[1:], self.params)]

    def update(self, opt, grads):
        for piece, g in zip(self.pieces(self.grad), grads):
            np.copyto(piece, g)
        np.add(self.step, 1.0, out=self.step)
        opt.update_flat(self.group, self.param, self.grad, self.state, float(self.step), self.segments)


def _flat_setup(name, dtype, fused, shapes=SHAPES):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]
    eager = [Parameter(a, dtype=dtype) for a in arrays]
    mirror = [Parameter(a, dtype=dtype) for a in arrays]  # the flat optimizer's groups hold these (never stepped)
    make = FLAT_MAKERS[name]
    eager_opt = make(_grouped(eager, (0.01, 0.003)), fused=fused)
    flat_opt = make(_grouped(mirror, (0.01, 0.003)), fused=fused)
    groups = [_FlatGroup(flat_opt, g) for g in flat_opt.param_groups]
    return eager, eager_opt, flat_opt, groups


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", list(FLAT_MAKERS))
def test_one_flat_update_per_group_matches_the_eager_step(name, dtype, fused):
    eager, eager_opt, flat_opt, groups = _flat_setup(name, dtype, fused)
    kernel_key = (KERNEL_OF[name.split("-")[0]], "fused" if fused else "reference")
    rng = np.random.default_rng(1)
    for step in range(STEPS):
        grads = [np.asarray(GRAD_SCALE[dtype] * rng.standard_normal(p.shape), dtype=dtype) for p in eager]
        for p, g in zip(eager, grads):
            p.grad = g.copy()
        eager_opt.step()
        at = 0
        for fg in groups:
            before = sum(kernels.calls.values()), kernels.calls[kernel_key]
            fg.update(flat_opt, grads[at:at + len(fg.params)])
            assert (sum(kernels.calls.values()), kernels.calls[kernel_key]) == (before[0] + 1, before[1] + 1)
            at += len(fg.params)
        flat_params = [piece for fg in groups for piece in fg.pieces(fg.param)]
        diff = max(float(np.max(np.abs(p.data - f), initial=0.0)) for p, f in zip(eager, flat_params))
        assert diff <= FLAT_TOL[dtype], f"step {step}: max |eager - flat| = {diff:.3g}"
    # the flat state is the eager state laid end to end; a scalar (mu_product, eta, mu) is each parameter's
    at = 0
    for fg in groups:
        owners = eager[at:at + len(fg.params)]
        at += len(fg.params)
        for key, flat in fg.state.items():
            if flat.ndim == 0:
                assert all(float(eager_opt.state[p][key]) == pytest.approx(float(flat), rel=1e-12) for p in owners)
                continue
            for piece, p in zip(fg.pieces(flat), owners):
                np.testing.assert_allclose(piece, eager_opt.state[p][key], rtol=0, atol=10 * FLAT_TOL[dtype],
                                           err_msg=key)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
@pytest.mark.parametrize("name", list(FLAT_MAKERS))
def test_update_flat_allocates_nothing(name, fused):
    # Big enough that allocating any one array would blow the 4 KiB bound.
    shapes = [(64, 33), (100,), ()]
    for dtype in DTYPES:
        _, _, flat_opt, groups = _flat_setup(name, dtype, fused, shapes)
        grads = [np.ones(s, dtype) for s in shapes]
        at = 0
        for fg in groups:  # warm-up: compiles the kernel, creates the scratch
            fg.update(flat_opt, grads[at:at + len(fg.params)])
            at += len(fg.params)
        fg = groups[0]
        tracemalloc.start()
        try:
            start, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            flat_opt.update_flat(fg.group, fg.param, fg.grad, fg.state, 2.0, fg.segments)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert fg.param.nbytes > 4096
        assert peak - start < 4096, f"{name} {np.dtype(dtype)}: update_flat allocated {peak - start} bytes"


@pytest.mark.parametrize("name", list(FLAT_MAKERS))
def test_eager_step_is_one_update_flat_per_parameter_with_a_gradient(name, monkeypatch):
    params, _ = _params(np.float64)
    opt = FLAT_MAKERS[name](params, lr=0.01)
    seen = []
    real = opt.update_flat

    def spy(group, param, grad, state, step, segments=None):
        seen.append((param, set(state), step, segments))
        real(group, param, grad, state, step, segments)

    monkeypatch.setattr(opt, "update_flat", spy)
    for p in params:
        p.grad = np.ones(p.shape)
    params[1].grad = None
    opt.step()
    opt.step()
    expected_keys = set(opt.state_init(opt.param_groups[0])) | set(opt.scalar_state_init(opt.param_groups[0]))
    with_grad = [p for p in params if p.grad is not None]
    assert len(seen) == 2 * len(with_grad)
    assert all(param is p.data for (param, *_), p in zip(seen, with_grad * 2))  # the parameter's own array
    assert all(keys == expected_keys and segments is None for _, keys, _, segments in seen)
    assert [s[2] for s in seen] == [1.0] * len(with_grad) + [2.0] * len(with_grad)
    assert all(float(opt.state[p]["step"]) == 2.0 for p in with_grad) and params[1] not in opt.state


def test_update_flat_checks_shapes_before_touching_anything():
    params, _ = _params(np.float64)
    opt = optim.NAdam(params)
    group = opt.param_groups[0]
    p, g = np.ones(6), np.ones(6)
    state = {"exp_avg": np.zeros(5), "exp_avg_sq": np.zeros(6), "mu_product": np.array(1.0)}
    with pytest.raises(ValueError, match=re.escape("NAdam: state 'exp_avg' is float64[5] but param is float64[6]")):
        opt.update_flat(group, p, g, state, 1.0)
    assert float(state["mu_product"]) == 1.0 and (p == 1).all()
    with pytest.raises(ValueError, match="grad shape"):
        opt.update_flat(group, p, np.ones(5), state, 1.0)


# -- state_dict: loaded NAdam scalars are validated (the round trip is in test_optim.py) ---------------

def test_loaded_nadam_state_is_validated():
    params, _ = _params(np.float64)
    opt = optim.NAdam(params)
    _train(opt, params, _grad_stream(2))
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["mu_product"] = np.ones(3)
    with pytest.raises(ValueError, match=re.escape("state 'mu_product' must be a single number, got shape (3,)")):
        opt.load_state_dict(sd)
    sd["state"][0]["mu_product"] = float("nan")
    with pytest.raises(ValueError, match="'mu_product' must be a finite number"):
        opt.load_state_dict(sd)


def test_sgd_buffer_loaded_without_a_step_is_not_treated_as_fresh():
    """torch's SGD state has no step; its buffer is live, so the next update must blend, not copy."""
    ours, theirs = _params(np.float64)
    opt = optim.SGD(ours, lr=0.1, momentum=0.9, dampening=0.5)
    topt = torch.optim.SGD(theirs, lr=0.1, momentum=0.9, dampening=0.5)
    rng = np.random.default_rng(4)
    for _ in range(3):  # torch trains alone; we take over its buffers and weights
        _set_grads(rng, 0, ours, theirs, np.float64)
        topt.step()
    tsd = topt.state_dict()
    sd = {"state": {i: {"momentum_buffer": s["momentum_buffer"].numpy()} for i, s in tsd["state"].items()},
          "param_groups": [{k: v for k, v in g.items() if k not in ("foreach", "differentiable", "fused")}
                           for g in tsd["param_groups"]]}
    for p, t in zip(ours, theirs):
        p.data[...] = t.detach().numpy()
    opt.load_state_dict(sd)
    for step in range(5):
        _set_grads(rng, step, ours, theirs, np.float64)
        opt.step()
        topt.step()
        assert _max_diff(ours, theirs) <= 1e-12


# -- validation and exports --------------------------------------------------------------------------

def test_defaults_and_exports():
    params, _ = _params(np.float64)
    assert optim.Lion(params).defaults == dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, maximize=False,
                                                    fused=None)
    assert optim.LAMB(params).defaults == dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                                               maximize=False, fused=None)
    for name in ("NAdam", "RMSprop", "Adagrad", "Lion", "LAMB"):
        assert name in optim.__all__ and issubclass(getattr(optim, name), optim.Optimizer)
    for name in ("nadam", "rmsprop", "adagrad", "lion", "lamb"):
        assert kernels.implementations(name) == ["fused", "reference"]
    assert TOL[np.float64] == 1e-10  # the float64 bound this file's torch comparisons inherit
