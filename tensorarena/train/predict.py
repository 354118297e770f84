"""Trainer.predict's loop: the model's outputs for a batch of inputs in eval mode, without a graph, batch by batch,
each batch's forward in the fused slab once a step is traced (Trainer.scratch_arena, as evaluate), on the streaming
route stage by stage from its store. One NumPy array comes back, filled batch by batch: the only memory it takes
beyond the step's is the outputs themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..nn.modes import kept_modes
from ..precision import float32_matmul_precision
from ..tensor import Tensor
from .evaluate import forward_rows, input_rows

if TYPE_CHECKING:
    from .trainer import Trainer


def predict(trainer: Trainer, inputs: Any, batch_size: int) -> np.ndarray:
    """Trainer.predict's work, with batch_size already defaulted (see there)."""
    from ..autograd import no_grad
    from ..compile.lend import beyond_slab

    if isinstance(inputs, Tensor):
        inputs = inputs.data
    rows = input_rows(inputs, batch_size, "predict")
    trainer._make_whole("predict() before step 1 runs the model")
    outputs = None
    with kept_modes(trainer.model):  # every module's mode back as it was, also on an error (nn/modes.py)
        trainer.model.eval()
        with no_grad(), float32_matmul_precision(trainer.matmul_precision):
            warn = True  # once per call, as evaluate
            for begin in range(0, rows, batch_size):
                stop = min(begin + batch_size, rows)
                with trainer.scratch_arena("predict arena", warn=warn) as arena:
                    out = _one_array(forward_rows(trainer, inputs, begin, stop), stop - begin)
                    if outputs is None:
                        outputs = np.empty((rows,) + out.shape[1:], out.dtype)
                    elif out.shape[1:] != outputs.shape[1:]:
                        raise ValueError(f"predict: the model's outputs change shape between batches "
                                         f"({outputs.shape[1:]} per row, then {out.shape[1:]} at row {begin}); "
                                         f"predict them in one batch or pad the inputs alike")
                    outputs[begin:stop] = out  # copied out of the arena before it is handed back
                warn = warn and not beyond_slab(arena)
    return outputs


def _one_array(out: Any, rows: int) -> np.ndarray:
    """A batch's output as one array of `rows` rows, or a clear error for one that is not."""
    value = out.data if isinstance(out, Tensor) else out
    if not isinstance(value, np.ndarray):
        raise TypeError(f"predict returns one array of outputs, and the model returned a {type(out).__name__}; "
                        f"for a model returning several values (a tuple or dict), run it yourself under "
                        f"ta.no_grad() after model.eval()")
    if value.ndim == 0 or len(value) != rows:
        raise ValueError(f"predict: the model's output has shape {value.shape} for a batch of {rows} rows; predict "
                         f"stacks one output row per input row")
    return value
