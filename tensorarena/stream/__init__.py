"""The streaming route: parameters and optimizer state on disk, a model trained one stage at a time.

`StreamingRoute` (route.py) runs the steps; `ParamStore` (store.py) owns the files; a model
opts in with `stream_stages()` returning `Stage`s (stages.py).
"""

from .route import StreamingRoute, StreamStepStats
from .stages import Stage, StreamingUnsupportedError, model_stages
from .store import ParamStore, StoreError

__all__ = ["StreamingRoute", "StreamStepStats", "Stage", "StreamingUnsupportedError", "model_stages", "ParamStore",
           "StoreError"]
