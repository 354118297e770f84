"""torch.nn.functional-style names for the layer ops (import as F)."""

from ..ops import (cross_entropy, dropout, embedding, gelu, layer_norm, linear, log_softmax, mse_loss,
                   relu, sigmoid, softmax, tanh)

__all__ = ["cross_entropy", "dropout", "embedding", "gelu", "layer_norm", "linear", "log_softmax",
           "mse_loss", "relu", "sigmoid", "softmax", "tanh"]
