"""ta.compile_step / FusedStep and the arena API, used directly (no Trainer), against torch and their docs.

Before the fixes (base commit 9f86595), 11 of 11 tests failed:
    mkdir /tmp/base && git archive 9f86595 | tar -x -C /tmp/base && cp tests/test_compile_api_hunt.py /tmp/base/tests/
    cd /tmp/base && PYTHONPATH=/tmp/base python -m pytest -q -p no:cacheprovider tests/test_compile_api_hunt.py
(from /tmp/base: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH).
"""

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import nn, optim

F = nn.functional


def _batch(seed: int, rows: int = 6):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 8)).astype(np.float32), rng.integers(0, 4, rows).astype(np.int64)


def _dropout_model_and_step():
    ta.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 4))
    opt = optim.SGD(model.parameters(), lr=0.1)
    return model, ta.compile_step(model, F.cross_entropy, opt, _batch(0))


def test_a_fused_step_after_model_eval_trains_as_after_model_train():
    """model.eval() between fused steps (to evaluate) then step(): the step trains (model.train() first, as the
    Trainer's step), and gives exactly the step a model left in train mode gives. It raised a PlanMismatchError
    blaming data-dependent control flow: the plan was keyed by the eval modes but traced with dropout on."""
    losses, weights = [], []
    for evaluate_between in (False, True):
        model, fused = _dropout_model_and_step()
        fused.step(*_batch(1))
        if evaluate_between:
            model.eval()
            with ta.no_grad():
                model(ta.tensor(_batch(2)[0]))
        losses.append(fused.step(*_batch(3))[0])
        assert model.training and all(m.training for m in model.modules())
        weights.append([p.data.copy() for p in model.parameters()])
    assert losses[0] == losses[1]
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


def test_set_budget_reads_sizes_as_memory_limit_does_and_checks_the_constructor():
    """set_budget("2G") was a TypeError "'<=' not supported between 'str' and 'int'"; BlockPool(budget=-5) and
    set_budget(True) were taken as they were. Sizes are read as Trainer(memory_limit=...) reads them."""
    pool = ta.BlockPool()
    pool.set_budget("2G")
    assert pool.budget == 2 << 30 and type(pool.budget) is int
    pool.set_budget(3 << 20)
    assert pool.budget == 3 << 20
    pool.set_budget(None)
    assert pool.budget is None
    assert ta.BlockPool(budget="1M").budget == 1 << 20
    with pytest.raises(ValueError, match="positive"):
        ta.BlockPool(budget=-5)
    with pytest.raises(ValueError, match="memory size"):
        pool.set_budget("lots")
    with pytest.raises(TypeError, match="bool"):
        pool.set_budget(True)


def test_compile_step_refuses_a_plateau_schedule_or_another_optimizers_before_any_update():
    """compile_step(..., scheduler=ReduceLROnPlateau(opt)) was taken: step 1 applied its update, then failed in the
    schedule (PartlyAppliedError about a missing 'metrics'). A schedule of another optimizer was stepped silently,
    leaving this one's lr where it was. Both are refused at compile_step (and when set later), as the Trainer does."""
    ta.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    opt = optim.SGD(model.parameters(), lr=0.1)
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        ta.compile_step(model, F.cross_entropy, opt, _batch(0), scheduler=optim.lr_scheduler.ReduceLROnPlateau(opt))
    other = optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="another optimizer"):
        ta.compile_step(model, F.cross_entropy, opt, _batch(0), scheduler=optim.lr_scheduler.StepLR(other, 1))
    for a, b in zip(before, model.parameters()):
        np.testing.assert_array_equal(a, b.data)
    fused = ta.compile_step(model, F.cross_entropy, opt, _batch(0), scheduler=optim.lr_scheduler.StepLR(opt, 1, 0.5))
    fused.step(*_batch(1))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05, rel=0, abs=1e-12)
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        fused.scheduler = optim.lr_scheduler.ReduceLROnPlateau(opt)
    fused.scheduler = None
    fused.step(*_batch(2))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05, rel=0, abs=1e-12)


def test_a_parameter_given_an_arenas_array_keeps_its_values_after_the_arena_closes():
    """`p.data = (p * 2).data` under an arena, as a torch loop writes `p.data = ...`: the parameter took the arena's
    memory, and once the arena closed read whatever the next one wrote there (7s here), silently. A Parameter is heap
    memory (its docstring): it now copies, and holds torch's values. A plain tensor given an arena's array goes stale
    with that arena (StaleTensorError), as a tensor the arena made does."""
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    ours, theirs = nn.Parameter(w.copy()), torch.nn.Parameter(torch.from_numpy(w.copy()))
    for assign in ("array", "tensor"):
        with ta.Arena():
            with ta.no_grad():
                doubled = ours * 2
            ours.data = doubled.data if assign == "array" else doubled
        theirs.data = (theirs * 2).data
        with ta.Arena():
            junk = ta.ones(4, 4) * 7 + 0  # reuses the closed arena's block
            np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=0, atol=0)
            del junk
    plain = ta.zeros(4, 4)
    with ta.Arena():
        plain.data = (ta.ones(4, 4) * 3).data
        assert float(plain.data.sum()) == 48.0
    with pytest.raises(ta.StaleTensorError, match="closed"):
        plain.numpy()


@pytest.mark.parametrize("example_batch", ["an array", "a triple", "a dict"])
def test_compile_step_refuses_an_example_batch_that_is_not_the_pair_inputs_targets(example_batch):
    """An array for example_batch failed with "split_batch() takes from 3 to 4 positional arguments but 6 were
    given", a dict was unpacked into its keys (an error about a linear layer's input shape ()), and (x, y, extra)
    was taken with `extra` dropped."""
    x, y = _batch(0)
    batch = {"an array": x, "a triple": (x, y, 3), "a dict": {"x": x, "y": y}}[example_batch]
    ta.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    with pytest.raises(TypeError, match=r"example_batch must be the pair \(inputs, targets\)"):
        ta.compile_step(model, F.cross_entropy, optim.SGD(model.parameters(), lr=0.1), batch)


def test_compile_step_checks_what_the_trainer_checks():
    """The Trainer refuses another model's optimizer (training changes nothing), clip_grad_norm <= 0 and an
    on_nonfinite it does not know; compile_step took the first two (the second failed at step 1 for -1, and 0 was
    taken), and step() skipped a non-finite loss silently for any word but 'raise'."""
    ta.manual_seed(0)
    model, other = nn.Sequential(nn.Linear(8, 4)), nn.Sequential(nn.Linear(8, 4))
    w = [p.data.copy() for p in model.parameters()]
    with pytest.raises(ValueError, match="holds none of the Sequential's 2 trainable parameters"):
        ta.compile_step(model, F.cross_entropy, optim.SGD(other.parameters(), lr=0.1), _batch(0))
    opt = optim.SGD(model.parameters(), lr=0.1)
    for clip in (0.0, -1.0):
        with pytest.raises(ValueError, match="clip_grad_norm must be positive"):
            ta.compile_step(model, F.cross_entropy, opt, _batch(0), clip_grad_norm=clip)
    fused = ta.compile_step(model, F.cross_entropy, opt, _batch(0))
    x, y = _batch(1)
    x[0, 0] = np.nan
    with pytest.raises(ValueError, match="on_nonfinite must be 'raise' or 'skip'"):
        fused.step(x, y, on_nonfinite="ignore")
    for a, p in zip(w, model.parameters()):
        np.testing.assert_array_equal(a, p.data)


def test_entering_an_open_arena_again_is_refused_and_leaves_it_open():
    """`with a:` inside `with a:` closed `a` when the inner block ended, under the outer one: the outer block's
    tensors went stale and its next allocation failed with "cannot allocate from step: it is closed", naming no
    cause. The second entry is now refused, saying to nest a new arena; the outer block goes on."""
    arena = ta.Arena(name="step")
    with arena:
        x = ta.ones(10) * 2
        with pytest.raises(RuntimeError, match="already open.*nest a new ta.Arena"):
            with arena:
                pass
        assert ta.current_arena() is arena and not arena.closed
        assert float((x + ta.ones(10)).sum().item()) == 30.0
    assert arena.closed and ta.current_arena() is None


def test_arena_out_of_memory_survives_pickling_and_copying():
    """An ArenaOutOfMemory raised in a worker process could not come back: unpickling (and copy.copy) called
    __init__ with the message alone, a TypeError about missing arguments."""
    import copy
    import pickle

    pool = ta.BlockPool(budget=2 << 20)
    with pytest.raises(ta.ArenaOutOfMemory) as caught:
        with ta.Arena(pool=pool):
            ta.zeros(3 << 18) + 1  # 3 MiB: a 4 MiB block
    err = caught.value
    err.add_note("in worker 3")
    for again in (pickle.loads(pickle.dumps(err)), copy.copy(err), copy.deepcopy(err)):
        assert type(again) is ta.ArenaOutOfMemory and isinstance(again, MemoryError)
        assert str(again) == str(err) and "budget is 2.00 MiB" in str(again)
        assert (again.requested, again.budget, again.in_use, again.asked) == (4 << 20, 2 << 20, 0, 3 << 20)
        assert again.__notes__ == ["in worker 3"]


def test_a_gradient_assigned_an_arenas_array_accumulates_as_torchs_after_the_arena_closes():
    """Micro-batches each in their own arena, the first one's gradient scaled by `p.grad = (...).data`: the gradient
    kept the arena's memory, and the next backward added into what was by then another arena's array (off by 21
    against torch here). A gradient is now copied out of an open arena when assigned."""
    ta.manual_seed(0)
    ours = nn.Linear(4, 3)
    theirs = torch.nn.Linear(4, 3)
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(ours.weight.data.copy()))
        theirs.bias.copy_(torch.from_numpy(ours.bias.data.copy()))
    rng = np.random.default_rng(0)
    for i in range(3):
        x = rng.standard_normal((5, 4)).astype(np.float32)
        with ta.Arena():
            ours(ta.tensor(x)).square().sum().backward()
            if i == 0:
                ours.weight.grad = (ta.tensor(ours.weight.grad) * 0.5).data
            junk = ta.ones(64, 64) * 3 + 0  # what the next arena's memory holds meanwhile
            del junk
        theirs(torch.from_numpy(x)).square().sum().backward()
        if i == 0:
            theirs.weight.grad = theirs.weight.grad * 0.5
    np.testing.assert_allclose(ours.weight.grad, theirs.weight.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.bias.grad, theirs.bias.grad.numpy(), rtol=1e-5, atol=1e-5)
