"""All differentiable ops, one family per file; importing this installs Tensor's operator sugar."""

from .arith import add, div, mul, neg, pow, sub
from .clamping import clamp
from .attention import bias_gelu, bias_gelu_linear, packed_self_attention, scaled_dot_product_attention
from .compare import allclose, eq, equal, ge, gt, isfinite, isinf, isnan, le, lt, ne
from .creation import (arange, empty, empty_like, eye, from_numpy, full, full_like, linspace, one_hot, ones, ones_like,
                       zeros, zeros_like)
from .index import embedding, getitem, masked_fill, where
from .linalg import bmm, linear, matmul, mm
from .loss import cross_entropy, mse_loss
from .nn_ops import dropout, layer_norm
from .reduce import all, any, argmax, argmin, log_softmax, max, mean, min, softmax, std, sum, var
from .sorting import argsort, gather, sort, topk
from .shape import (cat, chunk, clone, contiguous, expand, flatten, permute, repeat, reshape, split, squeeze, stack,
                    transpose, unbind, unflatten, unsqueeze)
from .unary import abs, exp, gelu, log, relu, sigmoid, sqrt, tanh
from .activation import elu, hardtanh, leaky_relu, logsigmoid, mish, relu6, silu, softplus
from .arrange import diag, flip, outer, pad, roll, tril, triu
from .bce import binary_cross_entropy, binary_cross_entropy_with_logits
from .einsum_op import einsum
from .nll import nll_loss
from .pairwise import floor_divide, maximum, minimum, remainder
from .regression import huber_loss, l1_loss, smooth_l1_loss
from .select import index_select, masked_select, nonzero
from .summaries import amax, amin, cosine_similarity, cumsum, logsumexp, norm, normalize, prod
from .pointwise import cos, round, rsqrt, sign, sin, square
from .sampling import rand, randint, randn, randperm
from .scattering import scatter, scatter_add
from ._sugar import install as _install_sugar
from ._sugar4 import install as _install_sugar4

_install_sugar()  # attaches the methods and operators to Tensor, once, when ops is first imported
_install_sugar4()

concat = cat
clip = clamp  # torch's alias

__all__ = [
    "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "tanh", "relu", "gelu", "sigmoid",
    "softmax", "log_softmax", "sum", "mean", "max", "var", "matmul", "linear", "reshape", "transpose",
    "permute", "clone", "expand", "unsqueeze", "squeeze", "flatten", "cat", "concat", "stack", "getitem", "where",
    "embedding", "dropout", "layer_norm", "cross_entropy", "mse_loss", "scaled_dot_product_attention", "bias_gelu",
    "packed_self_attention", "bias_gelu_linear", "abs", "argmax", "argmin", "all", "any", "eq", "ne", "lt", "le",
    "gt", "ge", "equal", "allclose", "clamp", "clip", "min", "masked_fill", "split", "chunk", "contiguous",
    "isnan", "isinf", "isfinite", "repeat", "unbind", "std", "gather", "argsort", "sort", "topk", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange", "linspace", "one_hot",
    "silu", "leaky_relu", "elu", "softplus", "flip", "roll", "tril", "triu", "diag", "outer", "pad",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "einsum", "nll_loss", "maximum", "minimum",
    "remainder", "floor_divide", "l1_loss", "smooth_l1_loss", "huber_loss", "index_select", "masked_select",
    "nonzero", "amax", "amin", "cumsum", "logsumexp", "norm", "normalize", "prod",
    "mm", "bmm", "hardtanh", "relu6", "logsigmoid", "mish", "from_numpy", "cosine_similarity", "sin", "cos",
    "square", "rsqrt", "sign", "round", "rand", "randn", "randint", "randperm", "scatter", "scatter_add",
    "unflatten", "empty", "empty_like", "eye",
]
