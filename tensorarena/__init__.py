"""tensorarena: a deep-learning training engine whose memory is bounded and predictable."""

from .autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .memory.arena import Arena, StaleTensorError, current_arena, heap_scope
from .memory.pool import ArenaOutOfMemory, BlockPool, default_pool
from .tensor import Tensor, tensor
from . import ops
from .random import get_rng_state, manual_seed, set_rng_state
from .precision import float32_matmul_precision, get_float32_matmul_precision, set_float32_matmul_precision
from . import kernels, models, nn, optim, utils
from .ops import (add, cat, clone, concat, div, exp, flatten, log, matmul, max, mean, mul, neg, permute, pow,
                  reshape, sqrt, squeeze, stack, sub, sum, tanh, transpose, unsqueeze, var, where)
from .ops import abs, all, allclose, any, argmax, argmin, clamp, clip, eq, equal, ge, gt, le, lt, ne
from .ops import (arange, argsort, chunk, full, full_like, gather, isfinite, isinf, isnan, linspace, masked_fill, min,
                  ones, ones_like, sort, split, std, topk, unbind, zeros, zeros_like)
from .ops import (amax, amin, cumsum, diag, einsum, flip, floor_divide, index_select, logsumexp, masked_select,
                  maximum, minimum, nonzero, norm, outer, prod, remainder, roll, tril, triu)
from .ops import (bmm, cos, from_numpy, mm, rand, randint, randn, randperm, relu, round, rsqrt, scatter, scatter_add,
                  sigmoid, sign, sin, softmax, square)
from .ops import empty, empty_like, eye
from .serialization import load, save
from .dtypes import float32, float64, int8, int16, int32, int64, uint8
from . import dtypes as _dtypes

# torch's names that are Python builtins' too: attributes (ta.bool, ta.long), kept out of __all__ below.
bool, int, float, long, double = _dtypes.bool, _dtypes.int, _dtypes.float, _dtypes.long, _dtypes.double  # noqa: A001

from .compile.step import FusedStep, compile_step

__version__ = "0.1.0"

# The public API, as re-exported above (the import lines are the list; this names them for `import *` and linters).
__all__ = [
    "Arena", "ArenaOutOfMemory", "BlockPool", "FusedStep", "StaleTensorError", "Tensor", "abs", "add", "all",
    "allclose", "any", "arange", "argmax", "argmin", "argsort", "cat", "chunk", "clamp", "clip", "clone",
    "compile_step", "concat", "current_arena", "default_pool", "div", "enable_grad", "eq", "equal", "exp", "flatten",
    "float32_matmul_precision", "full", "full_like", "gather", "ge", "get_float32_matmul_precision", "gt",
    "heap_scope", "is_grad_enabled", "isfinite", "isinf", "isnan", "kernels", "le", "linspace", "log", "lt",
    "manual_seed", "masked_fill", "matmul", "max", "mean", "min", "models", "mul", "ne", "neg", "nn", "no_grad",
    "ones", "ones_like", "ops", "optim", "permute", "pow", "reshape", "set_float32_matmul_precision", "sort", "split",
    "sqrt", "squeeze", "stack", "std", "sub", "sum", "tanh", "tensor", "topk", "transpose", "unbind", "unsqueeze",
    "var", "where", "zeros", "zeros_like",
    "amax", "amin", "cumsum", "diag", "einsum", "flip", "floor_divide", "index_select", "logsumexp", "masked_select",
    "maximum", "minimum", "nonzero", "norm", "outer", "prod", "remainder", "roll", "tril", "triu",
    "bmm", "cos", "from_numpy", "inference_mode", "mm", "rand", "randint", "randn", "randperm", "relu", "round",
    "rsqrt", "scatter", "scatter_add", "set_grad_enabled", "sigmoid", "sign", "sin", "softmax", "square",
    "empty", "empty_like", "eye", "load", "save", "utils",
    "get_rng_state", "set_rng_state",
    # The dtypes; ta.bool, ta.int, ta.float, ta.long and ta.double are left out here (torch lists them): a star
    # import would shadow Python's bool, int and float in the importing module.
    "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
]
