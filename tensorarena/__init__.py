"""tensorarena: a deep-learning training engine whose memory is bounded and predictable."""

from .autograd import enable_grad, is_grad_enabled, no_grad
from .memory.arena import Arena, StaleTensorError, current_arena, heap_scope
from .memory.pool import ArenaOutOfMemory, BlockPool, default_pool
from .tensor import Tensor, tensor
from . import ops
from .random import manual_seed
from .precision import float32_matmul_precision, get_float32_matmul_precision, set_float32_matmul_precision
from . import kernels, models, nn, optim
from .ops import (add, cat, clone, concat, div, exp, flatten, log, matmul, max, mean, mul, neg, permute, pow,
                  reshape, sqrt, squeeze, stack, sub, sum, tanh, transpose, unsqueeze, var, where)
from .ops import abs, all, allclose, any, argmax, argmin, clamp, clip, eq, equal, ge, gt, le, lt, ne
from .ops import (arange, argsort, chunk, full, full_like, gather, isfinite, isinf, isnan, linspace, masked_fill, min,
                  ones, ones_like, sort, split, std, topk, unbind, zeros, zeros_like)

from .compile.step import FusedStep, compile_step

__version__ = "0.1.0"
