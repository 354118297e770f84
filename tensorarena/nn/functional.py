"""torch.nn.functional-style names for the layer ops (import as F)."""

from ..ops import (bias_gelu, bias_gelu_linear, cross_entropy, dropout, embedding, gelu, layer_norm, linear, log_softmax, mse_loss,
                   one_hot, packed_self_attention, relu, scaled_dot_product_attention, sigmoid, softmax, tanh)

__all__ = ["bias_gelu", "bias_gelu_linear", "scaled_dot_product_attention", "packed_self_attention", "cross_entropy", "dropout",
           "embedding", "gelu", "layer_norm", "linear", "log_softmax", "mse_loss", "one_hot", "relu", "sigmoid", "softmax",
           "tanh"]
