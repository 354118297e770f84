"""MLP: a plain multilayer perceptron — no paper to follow, it is just Linear/activation stacks.

Built as `self.net = Sequential(Linear, act, [Dropout], ..., Linear)`, so its
state_dict keys ("net.0.weight", "net.0.bias", "net.2.weight", ...) are exactly those
of a torch.nn.Sequential of the same layers stored in an attribute `net`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..nn import GELU, Dropout, Linear, Module, ReLU, Sequential, Tanh, init
from ..tensor import Tensor

_ACTIVATIONS = {"relu": ReLU, "gelu": GELU, "tanh": Tanh}


@dataclass(frozen=True)
class MLPConfig:
    """Sizes and options of an MLP: in_features -> hidden[0] -> ... -> hidden[-1] -> out_features."""

    in_features: int
    hidden: tuple[int, ...]
    out_features: int
    activation: Literal["relu", "gelu", "tanh"] = "relu"
    dropout: float = 0.0
    dtype: type = field(default=np.float32)

    def __post_init__(self) -> None:
        if isinstance(self.hidden, (str, bytes)) or not hasattr(self.hidden, "__iter__"):
            raise TypeError(f"MLPConfig: hidden must be a sequence of layer widths, e.g. (64,) or (), "
                            f"got {self.hidden!r}")
        object.__setattr__(self, "hidden", tuple(self.hidden))
        # No int() coercion: 4.5 would become 4 and True a width of 1 without a word.
        named = [("in_features", self.in_features), *((f"hidden[{i}]", h) for i, h in enumerate(self.hidden)),
                 ("out_features", self.out_features)]
        for name, size in named:
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
                raise TypeError(f"MLPConfig: {name} must be an integer, got {size!r}")
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        sizes = (self.in_features, *self.hidden, self.out_features)
        if any(s <= 0 for s in sizes):
            raise ValueError(f"MLP sizes must be positive, got {sizes}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if np.dtype(self.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64, got {np.dtype(self.dtype)}")


class MLP(Module):
    """Fully connected network. Shape: (..., in_features) -> (..., out_features)."""

    def __init__(self, config: MLPConfig, *, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.config = config
        dropout_rng = rng  # None stays None: dropout then follows init.manual_seed at call time
        rng = init.get_generator(rng)  # one generator for all layers: one seed fixes the whole model
        layers = []
        sizes = (config.in_features, *config.hidden)
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            layers.append(Linear(fan_in, fan_out, rng=rng, dtype=config.dtype))
            layers.append(_ACTIVATIONS[config.activation]())
            if config.dropout > 0:
                layers.append(Dropout(config.dropout, rng=dropout_rng))
        layers.append(Linear(sizes[-1], config.out_features, rng=rng, dtype=config.dtype))
        self.net = Sequential(*layers)

    def forward(self, x) -> Tensor:
        return self.net(x)

    def stream_stages(self) -> list:
        """The cut for the streaming route: net's (Sequential.stream_stages), one stage per Linear with the
        activation and dropout after it, named "net.0-1", ..., "net.<last>"."""
        return self.net.stream_stages(prefix="net.")
