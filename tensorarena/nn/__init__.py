"""Neural-network building blocks: Module, Parameter, layers, init and functional (torch.nn names)."""

from . import functional, init, utils
from .activations import CosineSimilarity, Hardtanh, LogSigmoid, Mish, ReLU6
from .deferred import DeferredParameterError, deferred_init
from .flattening import Flatten, Unflatten
from .layers import (ELU, GELU, BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, Dropout, Embedding, HuberLoss, Identity,
                     L1Loss, LayerNorm, LeakyReLU, Linear, LogSoftmax, MSELoss, NLLLoss, ReLU, Sequential, Sigmoid,
                     SiLU, SmoothL1Loss, Softmax, Softplus, Tanh)
from .containers import ModuleDict, ModuleList, ParameterDict, ParameterList
from .module import IncompatibleKeys, Module
from .parameter import Parameter
from .batch_norm import BatchNorm1d, BatchNorm2d
from .conv import Conv1d, Conv2d
from .group_norm import GroupNorm
from .pool import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from .rms_norm import RMSNorm
from .transformer_torch import TransformerEncoder, TransformerEncoderLayer
from .transformer import (FeedForward, MultiheadAttention, PatchEmbedding, PositionEmbedding, TransformerBlock,
                          cls_pool, mean_pool)

__all__ = ["Module", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict", "Parameter", "IncompatibleKeys", "Linear", "Embedding",
           "LayerNorm", "Dropout", "GELU", "ReLU", "Tanh", "Identity", "Sequential", "functional", "init", "utils",
           "MultiheadAttention", "FeedForward", "TransformerBlock", "PatchEmbedding", "PositionEmbedding",
           "cls_pool", "mean_pool", "deferred_init", "DeferredParameterError", "SiLU", "Sigmoid", "LeakyReLU", "ELU",
           "Softplus", "Softmax", "LogSoftmax", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "CrossEntropyLoss", "NLLLoss", "BCELoss",
           "BCEWithLogitsLoss", "Flatten", "Unflatten", "Hardtanh", "ReLU6", "LogSigmoid", "Mish",
           "CosineSimilarity", "RMSNorm", "TransformerEncoderLayer", "TransformerEncoder",
           "BatchNorm1d", "BatchNorm2d", "GroupNorm", "Conv1d", "Conv2d",
           "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"]
