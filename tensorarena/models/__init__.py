"""Model families, one file each with a config dataclass."""

from .mlp import MLP, MLPConfig

__all__ = ["MLP", "MLPConfig"]
