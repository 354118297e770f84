"""FusedStep(replay="captured") / Trainer(fused_replay="captured"): the recorded step against the Python replay."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tensorarena import kernels, optim, tape
from tensorarena.compile import compile_step
from tensorarena.models import MLP, MLPConfig
from tensorarena.models.vit import ViT, ViTConfig
from tensorarena.nn import Module
from tensorarena.nn.functional import cross_entropy
from tensorarena.ops._base import new
from tensorarena.tensor import Tensor
from tensorarena.train.report import NonFiniteLossError
from tensorarena.train.trainer import Trainer
from test_fused import _batches as _images, _traced_peak  # ViT image batches; a step's traced array peak


def _vit(seed=0, dropout=0.0, attention_dropout=0.0):
    cfg = ViTConfig(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, num_heads=4, dropout=dropout,
                    attention_dropout=attention_dropout)
    return ViT(cfg, rng=np.random.default_rng(seed))


def _mlp(seed=0):
    return MLP(MLPConfig(in_features=12, hidden=(16,), out_features=4), rng=np.random.default_rng(seed))


def _rows(n, batch=16, seed=2, ignore_some=False):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.standard_normal((batch, 12)).astype(np.float32)
        y = (x[:, :4].argmax(axis=1)).astype(np.int64)
        if ignore_some:  # a different number of ignored targets in every batch: the mean's count changes
            y[: i % 5 + 1] = -100
        out.append((x, y))
    return out


def _both(make_model, make_opt, batches, steps, make_sched=None, **kw):
    """The same training on the Python replay and the captured one: (models, trainers, reports)."""
    runs = []
    for replay in ("python", "captured"):
        model = make_model()
        opt = make_opt(model)
        trainer = Trainer(model, opt, cross_entropy, route="fused", fused_replay=replay,
                          scheduler=make_sched(opt) if make_sched else None, **kw)
        reports = [trainer.step(*batches[i % len(batches)]) for i in range(steps)]
        runs.append((model, trainer, reports))
    return runs


def _assert_same(python, captured):
    (pm, _, pr), (cm, _, cr) = python, captured
    assert [r.loss for r in cr] == [r.loss for r in pr]  # bit for bit: the same calls on the same buffers
    assert [r.grad_norm for r in cr] == [r.grad_norm for r in pr]
    for p, q in zip(pm.parameters(), cm.parameters()):
        np.testing.assert_array_equal(p.data, q.data)


def _assert_refused(make_model, reason, caplog, steps=6):
    """SGD training of `make_model` on both replays: the capture is refused for `reason`, logged, and the
    plan trains as the Python replay does, bit for bit."""
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        python, captured = _both(make_model, lambda m: optim.SGD(m.parameters(), lr=0.1), _rows(3), steps)
    capture = captured[1].fused.plan.capture
    assert capture.tape is None and reason in capture.note
    assert "keeps the Python replay" in caplog.text
    _assert_same(python, captured)


def _replays():
    return kernels.calls[("fused_replay", "captured")], kernels.calls[("fused_replay", "python")]


def test_a_captured_vit_trains_bit_for_bit_as_the_python_replay():
    before = _replays()
    python, captured = _both(_vit, lambda m: optim.AdamW(m.parameters(), lr=2e-3), _images(4), 12)
    _assert_same(python, captured)
    capture = captured[1].fused.plan.capture
    assert capture.tape is not None and capture.note == "captured" and len(capture.tape.entries) > 50
    ran_captured, ran_python = (a - b for a, b in zip(_replays(), before))
    assert ran_captured == 12 and ran_python == 12  # the python run's 12; every captured-run step replayed the tape
    assert captured[2][-1].loss < captured[2][0].loss


def test_captured_flat_gradients_with_clipping_and_a_schedule():
    # clip_grad_norm: flat gradients, clipping and one update per group after the recorded backward,
    # the schedule stepping on the host; p.grad is the flat gradient after each step, as on the Python replay.
    python, captured = _both(_mlp, lambda m: optim.Adam(m.parameters(), lr=1e-2), _rows(3), 20, clip_grad_norm=0.5,
                             make_sched=_warmup_cosine)
    _assert_same(python, captured)
    model, trainer, _ = captured
    assert trainer.fused.plan.capture.tape is not None and not trainer.fused.update_in_backward
    for p in model.parameters():
        assert p.grad is not None and p.grad is p._grad_buffer
    assert trainer.optimizer.param_groups[0]["lr"] not in (0.0, 1e-2)  # the schedule moved it


def _warmup_cosine(opt):
    return optim.lr_scheduler.warmup_cosine(opt, warmup_steps=4, total_steps=30)


@pytest.mark.parametrize("make_opt", [lambda m: optim.AdamW(m.parameters(), lr=1e-2, amsgrad=True),
                                      lambda m: optim.SGD(m.parameters(), lr=1e-1, momentum=0.9)],
                         ids=["adamw_amsgrad", "sgd_momentum"])
def test_captured_updates_inside_backward_follow_a_schedule(make_opt):
    # Each parameter's update is bound once (Optimizer.prepare_flat) and reads the scheduled lr on every step.
    python, captured = _both(_vit, make_opt, _images(3), 12, make_sched=_warmup_cosine)
    _assert_same(python, captured)
    trainer = captured[1]
    assert trainer.fused.update_in_backward and len(trainer.fused.plan.capture.prepared) == len(
        list(captured[0].parameters()))


def test_a_count_that_changes_with_the_batch_is_read_on_every_replay():
    # cross_entropy's mean divides by the targets not ignored; a recording that froze the count of the
    # batch it was made on would scale every later batch wrong.
    python, captured = _both(_mlp, lambda m: optim.SGD(m.parameters(), lr=0.1), _rows(5, ignore_some=True), 10)
    assert captured[1].fused.plan.capture.tape is not None
    _assert_same(python, captured)


def test_dropout_is_captured_and_draws_a_new_mask_every_step():
    # random.Seed draws inside a recorded call, so each replay draws a new seed, in the order and from the
    # generator the Python replay would: same losses, parameters and generator states, bit for bit.
    from tensorarena.compile.step_state import rng_generators

    runs, states = [], []
    for replay in ("python", "captured"):
        model = _vit(dropout=0.2, attention_dropout=0.2)
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=2e-3), cross_entropy, route="fused",
                          fused_replay=replay)
        batch = _images(1)[0]
        reports = [trainer.step(*batch) for _ in range(6)]  # one batch: only the masks change the loss
        runs.append((model, trainer, reports))
        states.append([_plain(g.bit_generator.state) for g in rng_generators(model)])
    python, captured = runs
    assert captured[1].fused.plan.capture.tape is not None
    _assert_same(python, captured)
    # the model's generator, the default one, NumPy's global, Python's random
    assert states[0] == states[1] and len(states[0]) == 4
    assert len({r.loss for r in captured[2]}) == 6  # a new mask every step, not the recorded one


def _plain(state):
    """A generator's state with its arrays as lists (NumPy's global generator keeps its key in an array), for ==."""
    if isinstance(state, dict):
        return {k: _plain(v) for k, v in state.items()}
    return state.tolist() if isinstance(state, np.ndarray) else state


class _Drawing(Module):
    """A model whose Python draws from the default generator itself, not through tensorarena.random.Seed."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _mlp()

    def forward(self, x):
        from tensorarena.random import default_generator

        default_generator().random()  # e.g. a coin for some behaviour: a recording would not toss it again
        return self.inner(x)


def test_a_draw_outside_the_recorded_calls_keeps_the_python_replay(caplog):
    # and the refused capture left the generator where it found it: the runs stay equal
    _assert_refused(_Drawing, "draws random numbers outside its recorded calls", caplog, steps=5)


class _Doubler(Module):
    """A model whose forward writes an array with plain NumPy, outside kernels and tape.host."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _mlp()

    def forward(self, x):
        doubled = new(x.shape, x.dtype)
        np.multiply(x.data, 2.0, out=doubled)  # not recorded: a replay would read last batch's values
        return self.inner(Tensor(doubled))


def test_a_write_the_recording_misses_is_caught_before_it_is_used(caplog):
    _assert_refused(_Doubler, "differ from the Python replay", caplog)


def test_the_same_write_through_tape_host_is_captured():
    # The fix for the model above: the write goes through tape.host, and the recording holds it.
    class Doubler(_Doubler):
        def forward(self, x):
            doubled = new(x.shape, x.dtype)
            tape.host(np.multiply, x.data, 2.0, out=doubled)
            return self.inner(Tensor(doubled))

    python, captured = _both(Doubler, lambda m: optim.SGD(m.parameters(), lr=0.1), _rows(3), 6)
    assert captured[1].fused.plan.capture.tape is not None
    _assert_same(python, captured)


def test_an_array_the_step_computes_outside_the_plan_is_refused(caplog):
    # A mask made with NumPy from the batch lives on the heap, outside every buffer a replay refreshes:
    # the recording would keep the first batch's mask.
    class Masked(_Doubler):
        def forward(self, x):
            mask = (x.data > 0).astype(x.dtype)  # fresh heap memory, computed from the batch
            out = new(x.shape, x.dtype)
            tape.host(np.multiply, x.data, mask, out=out)
            return self.inner(Tensor(out))

    _assert_refused(Masked, "made outside the plan's buffers", caplog)


def test_a_captured_step_allocates_no_array_memory():
    # As test_fused's check: a captured step's traced peak does not grow with the batch (the slab does).
    model = _vit()
    fused = compile_step(model, cross_entropy, optim.SGD(model.parameters(), lr=1e-3), _images(1)[0],
                         replay="captured")

    def peak(x, y):
        top, arena = _traced_peak(fused, x, y)  # its first step captures this signature's plan
        assert fused.plan.capture.tape is not None
        assert arena.cursor == len(fused.plan.capture.tape.allocations)  # only the recorded kernel scratch
        return top

    small = peak(*_images(1, batch=8)[0])
    slab_small = fused.plan.memory.slab_bytes
    big = peak(*_images(1, batch=64)[0])
    assert fused.plan.memory.slab_bytes > 6 * slab_small
    assert abs(big - small) < 32 * 1024, f"array memory outside the plan: {small} B at batch 8, {big} B at 64"


def test_a_non_finite_loss_raises_before_any_update():
    model = _mlp()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused",
                      fused_replay="captured")
    batches = _rows(2)
    trainer.step(*batches[0])
    assert trainer.fused.plan.capture.tape is not None
    before = [p.data.copy() for p in model.parameters()]
    x, y = batches[1]
    with pytest.raises(NonFiniteLossError, match="not updated"):
        trainer.step(np.full_like(x, np.inf), y)
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)


def test_fused_replay_is_checked():
    model = _mlp()
    with pytest.raises(ValueError, match="fused_replay must be one of .'auto', 'python', 'captured'., got 'tape'"):
        Trainer(model, optim.SGD(model.parameters(), lr=0.1), cross_entropy, route="fused", fused_replay="tape")


def test_generator_states_compare_for_every_bit_generator():
    # MT19937's state holds an array, which a plain == between two state dicts cannot compare.
    from tensorarena.compile.captured import _same_state

    for bits in (np.random.PCG64(1), np.random.MT19937(1), np.random.Philox(1)):
        g = np.random.Generator(bits)
        saved = g.bit_generator.state
        assert _same_state(g.bit_generator.state, saved)
        g.random()
        assert not _same_state(g.bit_generator.state, saved)


def test_a_parameter_outside_the_optimizer_keeps_the_python_replay(caplog):
    # Its .grad accumulates from step to step on the Python replay; a recording would not do that.
    model = _mlp()
    params = list(model.parameters())
    trainer = Trainer(model, optim.SGD(params[1:], lr=0.1), cross_entropy, route="fused", fused_replay="captured")
    batches = _rows(2)
    with caplog.at_level(logging.WARNING, logger="tensorarena"):
        trainer.step(*batches[0])
    capture = trainer.fused.plan.capture
    assert capture.tape is None and "optimizer does not own" in capture.note
    first = params[0].grad.copy()  # the trace and the checking passes left no gradient of their own there
    trainer.step(*batches[1])  # the Python replay goes on, accumulating into it
    eager = _mlp()
    e_params = list(eager.parameters())
    reference = Trainer(eager, optim.SGD(e_params[1:], lr=0.1), cross_entropy, route="eager")
    reference.step(*batches[0])
    np.testing.assert_allclose(first, e_params[0].grad, rtol=1e-6, atol=1e-7)
    reference.step(*batches[1])
    np.testing.assert_allclose(params[0].grad, e_params[0].grad, rtol=1e-5, atol=1e-6)


def test_flat_gradients_name_a_parameter_outside_the_optimizer():
    # With flat gradients such a parameter made every replay fail with a PlanMismatchError that named no
    # parameter (its .grad, set by the trace, sent autograd down another path); the trace says it now.
    from tensorarena.compile import UnsupportedOpError

    model = _mlp()
    params = list(model.parameters())
    trainer = Trainer(model, optim.SGD(params[1:], lr=0.1), cross_entropy, route="fused", clip_grad_norm=1.0)
    with pytest.raises(UnsupportedOpError, match=r"get a gradient but are not in the optimizer.*requires_grad=False"):
        trainer.step(*_rows(1)[0])


def test_a_parameter_outside_the_optimizer_without_a_gradient_is_no_error():
    # Only one that gets a gradient in the step is: a .grad it kept from earlier eager steps is not.
    model = _mlp()
    params = list(model.parameters())
    params[0].grad = np.ones_like(params[0].data)
    params[0].requires_grad_(False)
    trainer = Trainer(model, optim.SGD(params[1:], lr=0.1), cross_entropy, route="fused", clip_grad_norm=1.0)
    trainer.step(*_rows(1)[0])
    np.testing.assert_array_equal(params[0].grad, 1.0)  # left as it was
    # and the captured replay takes that step too: the frozen parameter gets no gradient
    model2 = _mlp()
    params2 = list(model2.parameters())
    params2[0].grad = np.ones_like(params2[0].data)
    params2[0].requires_grad_(False)
    captured = Trainer(model2, optim.SGD(params2[1:], lr=0.1), cross_entropy, route="fused", clip_grad_norm=1.0,
                       fused_replay="captured")
    captured.step(*_rows(1)[0])
    assert captured.fused.plan.capture.tape is not None
    np.testing.assert_array_equal(params2[0].grad, 1.0)


# -- which replay "auto" (the default) runs --------------------------------------------------------

def _fused_replay(model, loss_fn, batch, **kw):
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), loss_fn, route="fused", **kw)
    before = _replays()
    trainer.step(*batch)
    trainer.step(*batch)
    ran_captured, ran_python = (a - b for a, b in zip(_replays(), before))
    return trainer.fused, ("captured" if ran_captured == 2 and not ran_python else
                           "python" if ran_python == 2 and not ran_captured else "mixed")


def test_auto_captures_a_step_made_of_tensorarena_modules_and_losses(caplog):
    import functools

    with caplog.at_level(logging.INFO, logger="tensorarena"):
        fused, ran = _fused_replay(_vit(), cross_entropy, _images(1)[0])
        smoothed, ran_smoothed = _fused_replay(_mlp(), functools.partial(cross_entropy, label_smoothing=0.1),
                                               _rows(1)[0])
    assert (fused.replay, ran) == ("captured", "captured") and fused.plan.capture.tape is not None
    assert (smoothed.replay, ran_smoothed) == ("captured", "captured")
    assert "captured replay (auto: the model's modules and the loss are all tensorarena's)" in caplog.text


class _Wrapper(Module):
    """A user's model: tensorarena layers under a forward the user wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _mlp()

    def forward(self, x):
        return self.inner(x)


def test_auto_keeps_the_python_replay_for_the_users_own_code(caplog):
    with caplog.at_level(logging.INFO, logger="tensorarena"):
        own_model, ran_model = _fused_replay(_Wrapper(), cross_entropy, _rows(1)[0])
        own_loss, ran_loss = _fused_replay(_mlp(), lambda out, y: cross_entropy(out, y), _rows(1)[0])
        patched = _mlp()
        patched.forward = lambda x: MLP.forward(patched, x)  # a forward set on the instance
        own_forward, ran_forward = _fused_replay(patched, cross_entropy, _rows(1)[0])
    assert (own_model.replay, ran_model) == ("python", "python")
    assert "test_captured_replay._Wrapper is not tensorarena's" in own_model.replay_reason
    assert (own_loss.replay, ran_loss) == ("python", "python") and "the loss function" in own_loss.replay_reason
    assert (own_forward.replay, ran_forward) == ("python", "python")
    assert "the forward set on a MLP instance" in own_forward.replay_reason
    assert "fused_replay='captured' opts in" in caplog.text
    # and the opt-in is honoured
    opted, ran_opted = _fused_replay(_Wrapper(), cross_entropy, _rows(1)[0], fused_replay="captured")
    assert (opted.replay, ran_opted) == ("captured", "captured")


class _MaskedBert(Module):
    """BERT over (B, 2, T) int64 input: ids and attention mask packed together, so both are views of the
    plan's input and a recording reads each batch's mask."""

    def __init__(self) -> None:
        from tensorarena.models.bert import BertConfig, BertModel
        from tensorarena.nn import Linear

        super().__init__()
        config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        self.bert = BertModel(config, rng=np.random.default_rng(0))
        self.head = Linear(16, 3, rng=np.random.default_rng(1))

    def forward(self, x):
        hidden = self.bert(x.data[:, 0], attention_mask=x.data[:, 1])
        return self.head(hidden[:, 0])


def _token_batches(n, batch=4, tokens=7):
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        ids = rng.integers(1, 40, (batch, tokens))
        mask = np.ones((batch, tokens), np.int64)
        if i:  # the first batch has no padding at all, the later ones do
            for row in range(batch):
                mask[row, tokens - 1 - row:] = 0
        ids[mask == 0] = 0
        out.append((np.stack([ids, mask], axis=1), rng.integers(0, 3, batch)))
    return out


def test_a_bert_step_recorded_on_a_batch_without_padding_masks_later_batches():
    # BertModel used to drop the mask for a batch without padding: recorded on such a batch (its second
    # checking batch has none either), a captured step then skipped the mask for every later batch, and the
    # losses parted from the Python replay's at step 2. Now the mask is always passed, computed inside a
    # recorded call.
    python, captured = _both(_MaskedBert, lambda m: optim.AdamW(m.parameters(), lr=1e-2), _token_batches(3), 6)
    assert captured[1].fused.plan.capture.tape is not None
    _assert_same(python, captured)


class _Scaled(Module):
    """Numbers in op arguments: constants (2.0, 0.5) or, with from_data, one computed from the batch."""

    def __init__(self, from_data=False) -> None:
        super().__init__()
        self.inner, self.from_data = _mlp(), from_data

    def forward(self, x):
        scale = float(x.data.std()) if self.from_data else 0.5
        return self.inner(x * 2.0) * scale + 1.0


def test_numbers_in_op_arguments_are_captured_as_constants():
    # x * 2.0 turns 2.0 into a 0-d array; the check for heap arrays used to refuse every such step.
    python, captured = _both(_Scaled, lambda m: optim.SGD(m.parameters(), lr=0.1), _rows(3), 6)
    assert captured[1].fused.plan.capture.tape is not None
    _assert_same(python, captured)


def test_a_number_computed_from_the_batch_is_still_refused(caplog):
    # A std ignores order: when the second checking batch was the first rolled by one, both gave the same
    # scale, the recording froze it, and this test failed (batches.second_batch now changes the values too).
    _assert_refused(lambda: _Scaled(from_data=True), "differ from the Python replay's", caplog)


def test_a_change_to_the_model_after_the_recording_records_the_step_again(caplog):
    # A dropout probability changed between steps: the Python replay follows it, and so must the captured
    # one (compile/watched_state.ModelState). Before, the captured replay went on dropping at the old rate.
    from tensorarena.nn import Dropout

    batch = _images(1)[0]
    runs = []
    for replay in ("python", "captured"):
        model = _vit(dropout=0.2, attention_dropout=0.2)
        trainer = Trainer(model, optim.AdamW(model.parameters(), lr=2e-3), cross_entropy, route="fused",
                          fused_replay=replay)
        reports = [trainer.step(*batch) for _ in range(3)]
        for m in model.modules():
            if isinstance(m, Dropout):
                m.p = 0.5
        with caplog.at_level(logging.INFO, logger="tensorarena"):
            reports += [trainer.step(*batch) for _ in range(3)]
        runs.append((model, trainer, reports))
    _assert_same(*runs)
    # The plan is traced again (FusedStep.plan_for), on both replays, and the captured one records it again.
    assert "the model's state changed since" in caplog.text and "Dropout.p" in caplog.text
    assert [trainer.fused.traces for _, trainer, _ in runs] == [2, 2]
    assert runs[1][1].fused.plan.capture.tape is not None
