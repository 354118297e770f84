"""What stops a StreamingRoute, and what a failed step or commit leaves it.

StreamingRoute (route.py) calls these functions of the route from its methods of the same names: `check_open`,
`check_usable` and `check_stages` are the checks every use starts with (closed, broken, a step's commit still to
take, the model's stages changed); `abort` is what a failed step leaves (`failed_step`: broken; `pending_message`:
whole, its commit to be taken again by `retry_commit`, then `took_pending`), and `refusal` what a broken route says.
Their own file so that route.py keeps the route's state and its step; the step's passes are sweep.py's, the moves
into and out of the store route_moves.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..train.report import NonFiniteLossError
from .generator_states import restore_generators
from .stages import model_stages
from .store import StoreError

if TYPE_CHECKING:
    from .route import StreamingRoute


def check_stages(route: StreamingRoute) -> None:
    """Refuse to go on when the model's stages no longer hold the parameters the store was built with.

    A module or parameter replaced between steps (`model.head = nn.Linear(...)`) is what the eager step trains
    from then on, but the store keeps training the old one: the run would silently leave the eager one. Moving
    the state out and back in (to_memory(), then _reenter) builds the stages again from the model as it is.
    """
    now = model_stages(route.model)
    was = [(s.name, [id(p) for p in s.params]) for s in route.stages]
    if [(s.name, [id(p) for p in s.params]) for s in now] == was:
        return
    if [s.name for s in now] != [name for name, _ in was]:
        what = (f"its stages are now {[s.name for s in now][:6]} ({len(now)}), not {[n for n, _ in was][:6]} "
                f"({len(was)})")
    else:
        names = {id(p): name for name, p in route.model.named_parameters()}
        k = next(k for k, (s, (_, ids)) in enumerate(zip(now, was)) if [id(p) for p in s.params] != ids)
        new = [names.get(id(p), f"parameter {i}") for i, p in enumerate(now[k].params) if id(p) not in was[k][1]]
        what = (f"stage {now[k].name!r} now holds {', '.join(new[:4]) or 'other parameters'}, which its store "
                f"does not" if new else f"stage {now[k].name!r} lost parameters its store holds")
    raise StoreError(
        f"the model changed since this StreamingRoute started: {what} (a module or parameter replaced or added, "
        f"e.g. model.head = nn.Linear(...)). The store trains the parameters it was built with, so training on "
        f"would not train the model as it is. Nothing was changed. Bring the training state into memory: "
        f"trainer.stream.to_memory() (a route of your own: route.to_memory()); the next step then moves the model "
        f"as it is now into the store")


def abort(route: StreamingRoute, index: int, exc: BaseException) -> None:
    """After a failed step: finish I/O, leave parameters on disk and no stage mapped, and mark the route
    broken if it wrote (the error then says so too)."""
    for k in range(len(route.stages)):
        route._detach(k)
    try:
        route.store.release_slots()
        route.store.drop_reservation()
    except BaseException:  # noqa: BLE001 - the original error is the one to report
        pass
    if route._committing:
        # The step ran to its end and every stage holds it (the model's state in memory, RNG and schedule
        # too): only the manifest saying so failed. Nothing is lost; the same commit is taken again.
        exc.add_note(route._pending_message(exc))
    elif route.store.changed and not isinstance(exc, NonFiniteLossError):
        route._broken = route._failed_step(index, exc)
        exc.add_note(route._refusal())


def failed_step(route: StreamingRoute, index: int, exc: BaseException) -> str:
    """Why a step that changed stages leaves the route broken, as far as it got."""
    # Counted in the files the store began to change, not in the stages updated in memory (io="copy" writes
    # them later, and a failed write leaves the rest of the step's files as they were).
    return (f"step {index} failed ({type(exc).__name__}: {exc}) after updating {route.store.changed} of "
            f"{len(route.stages)} stages: the step is partly applied, so the store holds two different steps")


def pending_message(route: StreamingRoute, exc: BaseException) -> str:
    """What a route whose step's commit failed says, and what to do."""
    index = route._pending_commit[0]
    return (f"step {index} was applied to every stage, but its commit (the manifest in {route.store.directory} "
            f"that records step {index}: step count, RNG, schedule) failed: {type(exc).__name__}: {exc}. "
            f"Nothing is lost: this process holds step {index}, and the store on disk is refused until the "
            f"commit is taken. Fix the cause (permissions, a read-only or failing disk, the directory removed), "
            f"then go on: the next step(), or route.retry_commit(), commits step {index} first (its batch was "
            f"used: go on with the next one). Or, while the disk stays so, keep step {index} elsewhere: "
            f"trainer.stream.to_memory(), then trainer.save(path) on another disk")


def retry_commit(route: StreamingRoute) -> None:
    """StreamingRoute.retry_commit's work (its docstring says what it does and raises)."""
    if route._pending_commit is None:
        return
    index, fields = route._pending_commit
    lost = route.store.lost_files()
    if lost:  # a commit now would record files that are gone
        raise StoreError(
            f"step {index} was applied to every stage, but its commit failed and the store then lost "
            f"{', '.join(lost[:4])}: it cannot be committed any more. This process still holds the whole "
            f"training state of step {index}: bring it back with trainer.stream.to_memory() (or "
            f"route.to_memory()), then the next step writes a new store in {route.store.directory}")
    try:
        route.store.commit(**fields)
    except BaseException as exc:
        raise StoreError(route._pending_message(exc)) from exc
    route._took_pending(index, fields)


def took_pending(route: StreamingRoute, index: int, fields: dict[str, Any]) -> None:
    """The step whose commit failed counts now (committed, or its state brought into memory)."""
    route._pending_commit = None
    route.step_count = index
    # The generators as the step left them: a caller may have put them back to before the step when it raised
    # (Trainer does, for a step it takes as not taken), and the run must go on from the state the step left
    # (the one the store records), or it would draw the masks of that step again.
    restore_generators(route.model, fields["rng"], fields["rng_default"])


def refusal(route: StreamingRoute) -> str:
    """What a broken route says, and what to do."""
    return (f"{route._broken}. Do not train on: load the last checkpoint (trainer.load(path), or "
            f"tensorarena.stream.checkpoint.load_into_streaming(route, path)), or delete "
            f"{route.store.directory} and resume from a checkpoint")


def check_open(route: StreamingRoute) -> None:
    """Refuse a closed route; after to_memory(), move the in-memory state back into the store first."""
    if route._in_memory:
        route._reenter()
    if route.store.closed:
        raise StoreError("this StreamingRoute is closed (close() ended it; the parameters stay in its store); "
                         "continue training with StreamingRoute.resume(...)")


def check_usable(route: StreamingRoute) -> None:
    route._check_open()
    if route._broken:
        raise StoreError(route._refusal())
    route.retry_commit()  # a step whose commit failed: every use starts by committing it
    route._check_stages()
