"""What a PyTorch training loop writes in place, written the same way here and compared with torch.

`t[index] = value` (ints, slices, bool masks, integer arrays; numbers, arrays or Tensors broadcast), the in-place
methods used on weights and buffers (zero_ fill_ copy_ add_ mul_ clamp_), their version counting and graph rules,
and a whole torch-style training loop side by side with torch's (losses, accuracies, parameters within 1e-10).

Before these changes (base b49fbac94410cd984c06fba1f75455c58444b0c3) all 37 tests here failed: run in a
worktree of the base with this file copied in,
`NUMBA_NUM_THREADS=1 PYTHONPATH=<worktree> python -m pytest -q <worktree>/tests/test_torch_idioms.py`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
import tensorarena.nn as nn
import tensorarena.nn.functional as F

F64 = dict(rtol=1e-12, atol=1e-12)


def _pair(values, dtype=np.float64, requires_grad=False):
    a = np.array(values, dtype=dtype)
    return (ta.tensor(a, dtype=dtype, requires_grad=requires_grad),
            torch.tensor(a, requires_grad=requires_grad))


def _same(t, tt, **tol):
    assert t.dtype == tt.detach().numpy().dtype
    np.testing.assert_allclose(t.numpy(), tt.detach().numpy(), **(tol or F64))
    assert t._version == tt._version, f"version {t._version}, torch's {tt._version}"


# --- t[index] = value ------------------------------------------------------------------------------------------

# Regression (fixed): Tensor had no __setitem__, so each of these raised TypeError.
SETITEM_CASES = [
    ("int, number", lambda t: (1,), lambda lib, t: 5.0),
    ("int row, broadcast number", lambda t: (0,), lambda lib, t: -2),
    ("slice, tensor broadcast row", lambda t: (slice(1, 3),), lambda lib, t: lib.tensor([7.0, 8.0, 9.0, 10.0])),
    # torch takes no ndarray as the value (so its side gets the same values as a tensor)
    ("2-d slice, array", lambda t: (slice(None), slice(1, 3)),
     lambda lib, t: np.arange(6.0).reshape(3, 2) if lib is ta else torch.arange(6.0).reshape(3, 2).double()),
    ("negative index and column", lambda t: (-1, 2), lambda lib, t: 4.5),
    ("bool mask, number", lambda t: (t > 0,), lambda lib, t: 0.0),
    ("int array rows, tensor", lambda t: ([0, 2],), lambda lib, t: lib.tensor([[1.0], [2.0]])),
    ("int tensor + slice", lambda t: (np.array([2, 0]), slice(0, 2)), lambda lib, t: lib.tensor([3.0, 4.0])),
    ("value with a leading 1", lambda t: (0,), lambda lib, t: lib.tensor([[1.0, 2.0, 3.0, 4.0]])),
    ("ellipsis", lambda t: (Ellipsis, 0), lambda lib, t: lib.tensor([1.0, 2.0, 3.0])),
]


def _index_for(lib, idx):
    """The same index in each library: tensors as the library's tensors, masks included."""
    out = []
    for item in idx:
        if isinstance(item, np.ndarray):
            item = ta.tensor(item) if lib is ta else torch.from_numpy(item)
        out.append(item)
    return tuple(out)


@pytest.mark.parametrize("name,index,value", SETITEM_CASES, ids=[c[0] for c in SETITEM_CASES])
def test_setitem_matches_torch_and_counts_one_write(name, index, value):
    start = np.arange(12.0).reshape(3, 4) - 5.0
    t, tt = _pair(start)
    idx_ta = _index_for(ta, index(t.numpy())) if "mask" not in name else (t > 0,)
    idx_torch = _index_for(torch, index(start)) if "mask" not in name else (tt > 0,)
    v_ta, v_torch = value(ta, t), value(torch, tt)
    if isinstance(v_ta, ta.Tensor):
        v_ta = ta.tensor(v_ta.numpy(), dtype=np.float64)
        v_torch = v_torch.double()
    t[idx_ta] = v_ta
    tt[idx_torch] = v_torch
    _same(t, tt)


def test_setitem_casts_to_the_tensor_dtype_as_torch():
    t, tt = _pair([1, 2, 3], dtype=np.int64)
    t[0] = 2.7  # torch truncates a float written into an integer tensor
    tt[0] = 2.7
    t[1:] = ta.tensor(np.array([-1.5, 9.9], np.float32))
    tt[1:] = torch.tensor([-1.5, 9.9])
    _same(t, tt)
    f, tf = _pair([0.0, 0.0], dtype=np.float32)
    f[:] = ta.tensor(np.array([1 / 3, 2 / 3]), dtype=np.float64)  # float64 into float32 rounds, as torch
    tf[:] = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    _same(f, tf, rtol=0, atol=0)


def test_setitem_through_a_view_writes_the_base_and_shares_its_count():
    t, tt = _pair(np.zeros((2, 3)))
    v, tv = t[1], tt[1]
    v[0:2] = 3.0
    tv[0:2] = 3.0
    _same(t, tt)
    _same(v, tv)


def test_setitem_on_a_leaf_requiring_grad_is_refused_as_torch_and_allowed_under_no_grad():
    w, tw = _pair([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf .*requires grad.* in-place operation"):
        tw[0] = 5.0
    with pytest.raises(RuntimeError, match="leaf .*requires grad.* in-place operation"):
        w[0] = 5.0
    assert w.numpy()[0] == 1.0 and w._version == 0, "a refused write changed the tensor"
    with ta.no_grad():
        w[0] = 5.0
    with torch.no_grad():
        tw[0] = 5.0
    _same(w, tw)
    assert w.requires_grad and w.is_leaf


def test_setitem_in_a_graph_is_refused_naming_where():
    # torch records these (CopySlices); here autograd cannot, so the write is refused with what to write instead.
    w = ta.tensor(np.ones(3), requires_grad=True)
    y = w * 2.0
    with pytest.raises(RuntimeError, match="where"):
        y[0] = 0.0
    buf = ta.tensor(np.zeros(3))
    with pytest.raises(RuntimeError, match="where"):
        buf[0:3] = w
    np.testing.assert_array_equal(buf.numpy(), [0.0, 0.0, 0.0])
    # ... and what the message says to write gives torch's values and gradient.
    tw = torch.ones(3, dtype=torch.float64, requires_grad=True)
    mask = np.array([True, False, True])
    out = ta.where(ta.tensor(mask), 0.0, w * 2.0)
    tout = torch.where(torch.from_numpy(mask), 0.0, tw * 2.0)
    (out * ta.tensor([1.0, 2.0, 3.0], dtype=np.float64)).sum().backward()
    (tout * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), **F64)
    np.testing.assert_allclose(w.grad, tw.grad.numpy(), **F64)


def test_setitem_after_an_op_saved_the_tensor_makes_backward_refuse_as_torch():
    w, tw = _pair([1.0, 2.0], requires_grad=True)
    a, tfa = _pair([3.0, 4.0])
    loss, tloss = (a * w).sum(), (tfa * tw).sum()
    a[0] = 10.0
    tfa[0] = 10.0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        tloss.backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_setitem_errors_name_the_shapes_and_refuse_read_only_views():
    t = ta.tensor(np.zeros((2, 3)), dtype=np.float64)
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        t[0] = np.ones(2)
    with pytest.raises(IndexError):
        t[5] = 1.0
    e = ta.tensor(np.ones(3), dtype=np.float64).expand(2, 3)
    with pytest.raises(RuntimeError, match="read-only"):
        e[0, 0] = 2.0
    with pytest.raises(TypeError, match="complex"):
        t[0] = np.ones(3, np.complex128)
    assert t._version == 0 and not t.numpy().any(), "a refused write changed the tensor"


def test_item_assignment_on_a_grad_leaf_is_refused_like_torch():
    x = ta.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="no_grad"):
        x[0] = 5.0


# --- in-place methods ------------------------------------------------------------------------------------------

# Regression (fixed): none of these methods existed (AttributeError).
METHOD_CASES = [
    ("zero_", lambda lib, t: t.zero_()),
    ("fill_ number", lambda lib, t: t.fill_(2.5)),
    ("fill_ 0-d tensor", lambda lib, t: t.fill_(lib.tensor(-1.25))),
    ("copy_ same shape", lambda lib, t: t.copy_(lib.tensor(np.arange(6.0).reshape(2, 3)))),
    ("copy_ broadcast row f32", lambda lib, t: t.copy_(lib.tensor(np.array([0.1, 0.2, 0.3], np.float32)))),
    ("copy_ int source", lambda lib, t: t.copy_(lib.tensor(np.array([[1], [2]])))),
    ("add_ tensor", lambda lib, t: t.add_(lib.tensor(np.array([1.0, 2.0, 3.0])))),
    ("add_ alpha", lambda lib, t: t.add_(lib.tensor(np.array([[1.5], [-2.0]])), alpha=-0.3)),
    ("add_ number", lambda lib, t: t.add_(0.75)),
    ("mul_ number", lambda lib, t: t.mul_(0.999)),
    ("mul_ tensor", lambda lib, t: t.mul_(lib.tensor(np.array([2.0, -1.0, 0.5])))),
    ("clamp_ both", lambda lib, t: t.clamp_(min=-0.5, max=0.7)),
    ("clamp_ min", lambda lib, t: t.clamp_(min=0.0)),
    ("clamp_ max", lambda lib, t: t.clamp_(max=-0.1)),
    ("clamp_ min above max", lambda lib, t: t.clamp_(min=1.0, max=0.0)),
    ("clamp_ positional", lambda lib, t: t.clamp_(-0.2, 0.2)),
]


@pytest.mark.parametrize("name,call", METHOD_CASES, ids=[c[0] for c in METHOD_CASES])
def test_inplace_method_matches_torch_returns_self_and_counts_one_write(name, call):
    start = np.random.default_rng(3).standard_normal((2, 3))
    t, tt = _pair(start)
    out, tout = call(ta, t), call(torch, tt)
    assert out is t and tout is tt
    _same(t, tt)


def test_inplace_methods_on_integer_tensors_follow_torch_casting():
    i, ti = _pair([1, 2, 3], dtype=np.int64)
    i.copy_(ta.tensor(np.array([1.9, -2.9, 3.5]), dtype=np.float64))  # copy_ truncates, as torch's
    ti.copy_(torch.tensor([1.9, -2.9, 3.5], dtype=torch.float64))
    i.mul_(3)
    ti.mul_(3)
    _same(i, ti)
    with pytest.raises(RuntimeError):
        ti.mul_(0.5)
    with pytest.raises(TypeError, match="int64"):
        i.mul_(0.5)  # result type float can't go back into int64, as torch refuses
    with pytest.raises(RuntimeError):
        ti.clamp_(min=0.5)
    with pytest.raises(TypeError, match="int64"):
        i.clamp_(min=0.5)
    _same(i, ti)


def test_inplace_methods_follow_the_graph_rules_of_iadd():
    w = ta.tensor(np.ones(3), requires_grad=True)
    tw = torch.ones(3, dtype=torch.float64, requires_grad=True)
    for name, args in [("zero_", ()), ("fill_", (1.0,)), ("copy_", (np.zeros(3),)), ("add_", (1.0,)),
                       ("mul_", (2.0,)), ("clamp_", (0.0,))]:
        targs = tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args)
        with pytest.raises(RuntimeError, match="leaf .*requires grad.* in-place operation"):
            getattr(tw, name)(*targs)
        with pytest.raises(RuntimeError, match="leaf .*requires grad.* in-place operation"):
            getattr(w, name)(*args)
        with pytest.raises(RuntimeError, match="part of the graph"):
            getattr(w * 1.0, name)(*args)
    buf = ta.tensor(np.zeros(3), dtype=np.float64)
    for name in ("copy_", "add_", "mul_"):
        with pytest.raises(RuntimeError, match="requires grad"):
            getattr(buf, name)(w)
    assert w._version == 0 and buf._version == 0 and (w.numpy() == 1).all() and not buf.numpy().any()
    with ta.no_grad():  # the optimizer-step way: allowed, and w stays a leaf that requires grad
        assert w.mul_(0.5).add_(w, alpha=2.0).clamp_(max=1.2) is w
    with torch.no_grad():
        tw.mul_(0.5).add_(tw, alpha=2.0).clamp_(max=1.2)
    _same(w, tw)
    assert w.is_leaf and w.requires_grad


def test_inplace_method_errors_are_clear():
    t = ta.tensor(np.zeros((2, 3)), dtype=np.float64)
    with pytest.raises(ValueError, match=r"\(2,\).*\(2, 3\)"):
        t.copy_(np.ones(2))
    with pytest.raises(ValueError, match="0-d"):
        t.fill_(ta.tensor(np.ones(2)))
    with pytest.raises(ValueError, match="min or max"):
        t.clamp_()
    with pytest.raises(RuntimeError, match="read-only"):
        ta.tensor(np.ones(3)).expand(2, 3).mul_(2.0)
    assert t._version == 0


# --- a torch-style training loop, both libraries side by side ---------------------------------------------------

def test_torch_style_training_loop_matches_torch_for_ten_steps():
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(6, 16, dtype=np.float64, rng=rng), nn.ReLU(),
                          nn.Linear(16, 3, dtype=np.float64, rng=rng))
    tmodel = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).double()
    with torch.no_grad():
        for p, tp in zip(model.parameters(), tmodel.parameters()):
            tp.copy_(torch.from_numpy(p.numpy()))
    opt = ta.optim.SGD(model.parameters(), lr=0.4, momentum=0.9, weight_decay=1e-3)
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.4, momentum=0.9, weight_decay=1e-3)
    sched = ta.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=3, gamma=0.5)
    model.train()
    tmodel.train()
    for step in range(10):
        xn = rng.standard_normal((32, 6))
        yn = (xn[:, :3].argmax(1)).astype(np.int64)
        x, y = ta.tensor(xn, dtype=np.float64), ta.tensor(yn)
        tx, ty = torch.from_numpy(xn), torch.from_numpy(yn)

        opt.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        ta.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # torch's name (also ta.optim's)
        opt.step()
        sched.step()
        acc = (out.argmax(1) == y).float().mean().item()
        with ta.no_grad():
            for p in model.parameters():
                p.mul_(0.999)

        topt.zero_grad()
        tout = tmodel(tx)
        tloss = torch.nn.functional.cross_entropy(tout, ty)
        tloss.backward()
        torch.nn.utils.clip_grad_norm_(tmodel.parameters(), max_norm=1.0)
        topt.step()
        tsched.step()
        tacc = (tout.argmax(1) == ty).float().mean().item()
        with torch.no_grad():
            for p in tmodel.parameters():
                p.mul_(0.999)

        assert loss.item() == pytest.approx(tloss.item(), rel=1e-10, abs=1e-10), f"step {step}"
        assert acc == tacc, f"step {step}"
        for p, tp in zip(model.parameters(), tmodel.parameters()):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-10, atol=1e-10,
                                       err_msg=f"step {step}")
            assert p.is_leaf and p.requires_grad
    assert opt.param_groups[0]["lr"] == pytest.approx(tsched.get_last_lr()[0], rel=1e-15)
