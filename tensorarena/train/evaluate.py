"""Trainer.evaluate's loop: held-out data batch by batch in eval mode, without a graph, each batch's forward in
the fused slab once a step is traced (Trainer.scratch_arena), so evaluation between steps adds no memory the
route plan did not count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..compile.loss_shares import _class_index_loss, counted as counted_labels, piece_shares
from ..nn.modes import kept_modes
from ..precision import float32_matmul_precision
from ..tensor import Tensor
from .eager_step import _model_input

if TYPE_CHECKING:
    from .trainer import Trainer


def evaluate(trainer: Trainer, inputs: np.ndarray, targets: Any, batch_size: int) -> dict:
    """Trainer.evaluate's work, with batch_size already defaulted: {"loss", "accuracy"} (see there)."""
    from ..autograd import no_grad
    from ..compile import targets as target_layout
    from ..compile.lend import beyond_slab

    rows = input_rows(inputs, batch_size, "evaluate")
    # None: a model that returns its own loss (SimCSE), as step(inputs, None) takes it; flatten would make it a
    # 0-d object array and refuse it with the fused route's message, on every route.
    try:
        spec, leaves = (("constant", None), []) if targets is None else target_layout.flatten(targets)
    except target_layout.UnheldTargetsError as exc:
        # flatten's message is the fused route's ("train with route='eager'"), wrong advice on the eager route,
        # where step() takes any targets (a torch tensor, an object of the user's) as they are (hunt).
        raise TypeError(f"evaluate cuts the targets into batches by rows, so it takes arrays, Tensors, numbers and "
                        f"tuples, lists or dicts of them; {exc.where} is a {exc.kind}. Convert it (np.asarray(t) "
                        f"for a torch tensor), or evaluate by hand: model.eval() and loss_fn(model(x), t) "
                        f"under ta.no_grad()") from None
    short = [leaf.shape for leaf in leaves if leaf.ndim == 0 or len(leaf) != rows]
    if short:
        raise ValueError(f"evaluate: the targets must have one row per input row ({rows}); got arrays of shapes "
                         f"{short}")
    labels = leaves[0] if spec[0] == "array" and np.issubdtype(leaves[0].dtype, np.integer) else None
    starts = range(0, rows, batch_size)
    # Each batch's share of the loss: its rows, or for tensorarena's class-index losses its counted targets
    # (compile/loss_shares.py): a batch of ignored targets only has a NaN mean and weighs nothing; 1 each for
    # its losses that add up (reduction="sum"), whatever the targets.
    shares = piece_shares(trainer.loss_fn, [labels[b:b + batch_size] if labels is not None else None
                                            for b in starts])
    if shares is None:
        shares = [(min(b + batch_size, rows) - b) / rows for b in starts]
    scored = counted_labels(trainer.loss_fn, labels) if labels is not None else None  # ignored: no hit, no miss
    spatial = _class_index_loss(trainer.loss_fn) is not None  # its (N, C, d...) logits hold classes on axis 1
    trainer._make_whole("evaluate() before step 1 runs the model")
    total_loss, correct, counted = 0.0, 0, labels is not None
    # Every module's mode back as it was, also on an error: model.train(flag) for the top-level flag put a part
    # the user keeps in eval mode (a frozen backbone's dropout) back in train mode (nn/modes.py).
    with kept_modes(trainer.model):
        trainer.model.eval()
        with no_grad(), float32_matmul_precision(trainer.matmul_precision):
            warn = True  # once per call: every batch of a too-large batch_size would say the same
            for begin, share in zip(starts, shares):
                stop = min(begin + batch_size, rows)
                with trainer.scratch_arena("eval arena", warn=warn) as arena:
                    yb = target_layout.build(spec, [leaf[begin:stop] for leaf in leaves])
                    out = forward_rows(trainer, inputs, begin, stop)
                    if isinstance(out, np.ndarray):  # the streaming route's predict
                        out = Tensor(out)
                    loss = _loss_value(trainer.loss_fn(out, yb), trainer.loss_fn)
                    total_loss += loss * share if share else 0.0
                    # Classes on the last axis, or (a class-index loss's (N, C, d...) logits, as torch's) on
                    # axis 1: argmax(-1) of (N, C, T) logits picked positions, and C == T hid it (a hunt).
                    # A model may return a tuple or dict its loss unpacks ((logits, aux)): which part holds the
                    # classes is the loss's to know, so no accuracy (out.shape was an AttributeError). One
                    # column (a binary classifier's single logit) has no argmax: it was always 0, so
                    # "accuracy" was the share of label-0 rows, 0.5 for a perfect classifier (hunt).
                    classes, by_axis_1 = 0, False  # classes: the size of the axis argmax picks one of
                    if counted and isinstance(out, Tensor):  # counted: yb is one array of labels
                        by_axis_1 = spatial and out.ndim >= 3 and out.shape[:1] + out.shape[2:] == yb.shape
                        if by_axis_1:
                            classes = out.shape[1]
                        elif out.ndim >= 1 and out.shape[:-1] == yb.shape:
                            classes = out.shape[-1]
                    if classes > 1:
                        hits = out.data.argmax(axis=1 if by_axis_1 else -1) == yb
                        correct += int(hits[scored[begin:stop]].sum() if scored is not None else hits.sum())
                    else:
                        counted = False  # not one class index per output row: no accuracy to give
                warn = warn and not beyond_slab(arena)
    scored_count = int(scored.sum()) if scored is not None else (labels.size if labels is not None else 0)
    accuracy = (correct / scored_count if scored_count else float("nan")) if counted else None
    return {"loss": total_loss, "accuracy": accuracy}


def input_rows(inputs: Any, batch_size: int, what: str) -> int:
    """The rows of evaluate's or predict's inputs (`what` names the caller), checked with batch_size: a
    positive batch_size, at least one row, and a dict batch (step() hands it to the model as it is) whose arrays
    all have the same rows, since each is cut by them."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"{what}: batch_size must be a positive int, got {batch_size!r}")
    rows = _leading(next(iter(inputs.values()))) if isinstance(inputs, dict) and inputs else _leading(inputs)
    if not rows:
        raise ValueError(f"{what}: the inputs have no rows (shape {np.shape(inputs)}): the held-out data is empty; "
                         f"pass at least one row")
    if isinstance(inputs, dict):
        # An array of other rows was paired with the wrong rows, or cut short, with no word (hunt).
        uneven = {key: _leading(value) for key, value in inputs.items() if _leading(value) != rows}
        if uneven:
            raise ValueError(f"{what}: the inputs' arrays must have the same rows (their first one has {rows}); "
                             f"got rows {uneven}")
    return rows


def forward_rows(trainer: Trainer, inputs: Any, begin: int, stop: int) -> Any:
    """The model's output for rows begin:stop of `inputs` (each array of a dict batch cut alike), in the modes and
    grad mode the caller set: the streaming route's predict (an array) while the store holds the parameters (after
    to_memory() the model holds them: the store is not entered again), else the model on the batch as the eager
    step hands it over (a tokenizer's Encoding goes as it is, its attention mask with it)."""
    xb = {key: value[begin:stop] for key, value in inputs.items()} if isinstance(inputs, dict) else inputs[begin:stop]
    if trainer.stream is not None and not trainer.stream.in_memory:
        return trainer.stream.predict(xb)
    return trainer.model(_model_input(xb))


def _loss_value(loss: Any, loss_fn: Any) -> float:
    """The batch's loss as a float: a Tensor (or number) of one value. A loss of many values (reduction="none")
    was an item() error that named neither the loss nor what evaluate needs (hunt)."""
    value = loss.data if isinstance(loss, Tensor) else loss
    if not isinstance(value, (int, float, np.generic, np.ndarray)) or np.size(value) != 1:
        shape = f" of shape {value.shape}" if isinstance(value, np.ndarray) else ""
        raise ValueError(f"evaluate: loss_fn {getattr(loss_fn, '__name__', type(loss_fn).__name__)!r} returned a "
                         f"{type(loss).__name__}{shape}; evaluate weighs one loss value per batch: reduce it "
                         f"(reduction='mean' or 'sum', or .mean()), as step() needs too")
    return float(np.asarray(value).item())


def _leading(value: Any) -> int | None:
    """The rows of one of a dict batch's values (an array's first dimension, a list's length), or None for one with
    no rows. len(), not np.shape: a list of ragged token lists (a model that pads its own batch) has no shape."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return shape[0] if len(shape) else None
    try:
        return len(value)
    except TypeError:
        return None
