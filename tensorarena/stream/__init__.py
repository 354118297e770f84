"""The streaming route: parameters and optimizer state on disk, a model trained one stage at a time.

`StreamingRoute` (route.py) runs the steps; `ParamStore` (store.py) owns the files; a model
opts in with `stream_stages()` returning `Stage`s (stages.py).

    route = StreamingRoute.from_memory(model, optimizer, loss_fn, "run/store", scheduler=sched,
                                       step=steps_done)    # moves the in-memory state to disk
    for x, y in batches:
        loss = route.step(x, y)                           # route.last_stats: time, memory, I/O
    route.to_memory()                                     # trained state back in model/optimizer

    route = StreamingRoute.resume(model, optimizer, loss_fn, "run/store", scheduler=sched)
"""

from .route import StreamingRoute, StreamStepStats
from .stages import Stage, StreamingUnsupportedError, model_stages
from .store import ParamStore, StoreError

__all__ = ["StreamingRoute", "StreamStepStats", "Stage", "StreamingUnsupportedError", "model_stages", "ParamStore",
           "StoreError"]
