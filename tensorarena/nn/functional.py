"""torch.nn.functional-style names for the layer ops (import as F)."""

from ..ops import (bias_gelu, bias_gelu_linear, binary_cross_entropy, binary_cross_entropy_with_logits,
                   cosine_similarity, cross_entropy, dropout, elu, embedding, gelu, hardtanh, huber_loss, l1_loss,
                   layer_norm, leaky_relu, linear, log_softmax, logsigmoid, mish, mse_loss, nll_loss, normalize,
                   one_hot, packed_self_attention, pad, relu, relu6, scaled_dot_product_attention, sigmoid, silu,
                   smooth_l1_loss, softmax, softplus, tanh)
from ..ops.conv import fold, unfold
from ..ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from ..ops.rms_norm import rms_norm
from .batch_norm import batch_norm
from .conv import conv1d, conv2d
from .group_norm import group_norm

__all__ = ["bias_gelu", "bias_gelu_linear", "scaled_dot_product_attention", "packed_self_attention", "cross_entropy", "dropout",
           "embedding", "gelu", "layer_norm", "linear", "log_softmax", "mse_loss", "one_hot", "relu", "sigmoid", "softmax",
           "tanh", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "l1_loss", "smooth_l1_loss",
           "huber_loss", "silu", "leaky_relu", "elu", "softplus", "normalize", "pad", "cosine_similarity", "relu6",
           "hardtanh", "logsigmoid", "mish", "rms_norm", "batch_norm", "group_norm", "conv1d", "conv2d", "unfold", "fold",
           "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"]
