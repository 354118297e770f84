"""torch.utils's counterparts: `data` (datasets, samplers, DataLoader; datasets.py and samplers.py hold some)."""

from . import data

__all__ = ["data"]
