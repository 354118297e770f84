"""torch.utils's counterparts: `data` (Dataset, TensorDataset, DataLoader)."""

from . import data

__all__ = ["data"]
