"""ReduceLROnPlateau and ChainedScheduler, with torch.optim.lr_scheduler semantics: the two schedulers whose lr is
no function of the epoch. ReduceLROnPlateau steps on a metric; ChainedScheduler steps other schedulers together.
(CyclicLR, added with them, is in lr_schedulers_cyclic.py.)

As the schedules of lr_scheduler.py and lr_schedulers_more.py, the lrs they set are torch's bit for bit: the
same float operations in the same order. Their state_dict() holds torch's keys, so a torch scheduler's state
loads here; each load_state_dict is all or nothing (everything checked before anything changes). Where torch
fails late, or accepts an argument that gives no schedule, each class says what it does instead.

ReduceLROnPlateau needs the metric at each step (`sched.step(val_loss)`), which a loop that only counts updates
cannot give: ChainedScheduler and SequentialLR refuse it, as torch's do.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from .lr_scheduler import LRScheduler, _check_float, _check_int, refuse_epoch, with_inner_states
from .optimizer import Optimizer

__all__ = ["ReduceLROnPlateau", "ChainedScheduler"]


def _public_state(sched: Any, state: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """`state` (a state_dict) without torch's private bookkeeping that `sched` lacks; a ValueError for a state
    that is no dict or has a public key `sched` lacks (another scheduler's state). `skip`: keys the caller
    handles itself."""
    name = type(sched).__name__
    if not isinstance(state, dict):
        raise ValueError(f"{name} state must be a dict, got {type(state).__name__}")
    own = sched.state_dict()  # its keys, not its attributes: a state must not replace the optimizer
    state = {k: v for k, v in state.items() if k not in skip and (k in own or not k.startswith("_"))}
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise ValueError(f"scheduler state has keys {unknown} that {name} does not have; was it saved from a "
                         f"different scheduler?")
    # lists as lists: a state read back from JSON or a torch state may hold tuples
    return {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in state.items()}


def _check_group_count(sched: Any, count: int, what: str) -> None:
    """A state with values for more groups than the optimizer has was saved with another optimizer."""
    groups = len(sched.optimizer.param_groups)
    if count > groups:
        raise ValueError(f"{type(sched).__name__}: the scheduler state has {count} {what} but the optimizer has "
                         f"{groups} param groups; load the state saved with this optimizer's state")


# -- ReduceLROnPlateau -----------------------------------------------------------------------------------------

_MODES = ("min", "max")
_THRESHOLD_MODES = ("rel", "abs")


class ReduceLROnPlateau(LRScheduler):
    """Multiply every group's lr by `factor` once the metric passed to `step(metrics)` has not improved for more
    than `patience` steps (torch's ReduceLROnPlateau): call `sched.step(val_loss)` after each evaluation.

    mode "min": lower is better (a loss), "max": higher is (an accuracy). A value improves on the best so far when
    it beats it by more than `threshold`, relative to the best ("rel": best * (1 - threshold) for min) or absolute
    ("abs": best - threshold). After a reduction, `cooldown` steps pass in which bad steps are not counted. An lr
    never goes below its group's `min_lr` (one value, or a list with one per group), and a reduction smaller than
    `eps` is not made. A NaN metric is a step without improvement, as in torch.

    Construction changes no group (no initial_lr; `last_epoch` starts at 0), as torch's. The lr comes from the
    metrics, not from the epoch, so `get_lr()` has no value to give (NotImplementedError, as torch's):
    `get_last_lr()` is what the groups hold. The steps start from the lr each group has, so an lr edited by hand
    or set by another scheduler is reduced from there.

    Differences from torch, where it accepts what gives no schedule or fails late:
    - factor must be in [0, 1) (torch refuses only >= 1), patience and cooldown integers >= 0, threshold, eps and
      min_lr finite numbers >= 0 (torch takes a negative patience, which reduces at every step);
    - a metric that is no number is a TypeError naming it (torch's float() also takes the string "0.5");
    - `step(metrics)` only: torch's deprecated `epoch` argument is left out;
    - a group added with add_param_group when min_lr was a list (no min_lr for it) is a RuntimeError at the next
      step, before anything changes; torch raises it only when a reduction comes, with the step half counted.
      With one min_lr for all, the added group takes it, as in torch.
    """

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: float | Sequence[float] = 0.0, eps: float = 1e-8) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        factor = _check_float("factor", factor, 0.0)
        if factor >= 1.0:
            raise ValueError(f"factor must be < 1.0 (each reduction multiplies the lr by it), got {factor!r}")
        groups = len(optimizer.param_groups)
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != groups:
                raise ValueError(f"ReduceLROnPlateau expected {groups} min_lrs (one per param group), got "
                                 f"{len(min_lr)}: {list(min_lr)!r}")
            min_lrs = [_check_float(f"min_lr[{i}]", v, 0.0) for i, v in enumerate(min_lr)]
            default_min_lr = None  # an added group has none: see step()
        else:
            default_min_lr = _check_float("min_lr", min_lr, 0.0)
            min_lrs = [default_min_lr] * groups
        patience = _check_int("patience", patience, 0)
        cooldown = _check_int("cooldown", cooldown, 0)
        eps = _check_float("eps", eps, 0.0)
        threshold = _check_float("threshold", threshold, 0.0)
        self._check_modes(mode, threshold_mode)
        # torch's attributes, in its order: state_dict() has its keys
        self.optimizer = optimizer
        self.factor = factor
        self.default_min_lr = default_min_lr
        self.min_lrs = min_lrs
        self.patience = patience
        self.cooldown = cooldown
        self.eps = eps
        self.last_epoch = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    @staticmethod
    def _check_modes(mode: Any, threshold_mode: Any) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be 'min' (lower is better) or 'max', got {mode!r}")
        if threshold_mode not in _THRESHOLD_MODES:
            raise ValueError(f"threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")

    def is_better(self, a: float, best: float) -> bool:
        """Whether metric `a` improves on `best` by more than the threshold (torch's comparisons, operand for
        operand: the same floats decide the same way)."""
        if self.threshold_mode == "rel":
            if self.mode == "min":
                return a < best * (1.0 - self.threshold)
            return a > best * (self.threshold + 1.0)
        if self.mode == "min":
            return a < best - self.threshold
        return a > best + self.threshold

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def step(self, metrics: Any) -> None:  # type: ignore[override]  (the metric is required, as in torch)
        """Count this step's metric (the validation loss, say): improvement, a bad step, or a reduction of every
        group's lr once more than `patience` bad steps have passed since the best."""
        if isinstance(metrics, (str, bytes)):
            raise TypeError(f"ReduceLROnPlateau.step(metrics) takes the metric as a number, got {metrics!r}")
        try:
            current = float(metrics)
        except (TypeError, ValueError) as err:
            raise TypeError(f"ReduceLROnPlateau.step(metrics) takes the metric as a number (a float, a NumPy "
                            f"scalar, a one-element tensor), got a {type(metrics).__name__}: {err}") from err
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs) and self.default_min_lr is None:
            raise RuntimeError(f"ReduceLROnPlateau was built with one min_lr per param group ({len(self.min_lrs)}) "
                               f"and the optimizer has {len(groups)} groups now (add_param_group): set "
                               f"sched.min_lrs to one value per group, or build the scheduler after adding them")
        self.last_epoch += 1
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:  # bad steps right after a reduction do not count towards the next one
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [group["lr"] for group in groups]

    def _reduce_lr(self) -> None:
        groups = self.optimizer.param_groups
        if len(self.min_lrs) != len(groups):  # groups were added: they take the one min_lr (checked in step)
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, min_lr in zip(groups, self.min_lrs):
            old_lr = float(group["lr"])
            new_lr = max(old_lr * self.factor, min_lr)
            if old_lr - new_lr > self.eps:
                group["lr"] = new_lr

    def get_lr(self) -> list[float]:
        """No lr follows from the epoch here (NotImplementedError, as torch's): see get_last_lr()."""
        raise NotImplementedError("ReduceLROnPlateau's lrs depend on the metrics passed to step(), not on the "
                                  "epoch: get_last_lr() gives the lrs the groups have")

    def state_dict(self) -> dict[str, Any]:
        """torch's keys: the counters (best, num_bad_epochs, cooldown_counter, last_epoch) and the settings."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (torch's ReduceLROnPlateau's state too), all checked first."""
        state = _public_state(self, state_dict)
        self._check_modes(state.get("mode", self.mode), state.get("threshold_mode", self.threshold_mode))
        min_lrs = state.get("min_lrs", self.min_lrs)
        if not isinstance(min_lrs, list):
            raise ValueError(f"ReduceLROnPlateau state: min_lrs must be a list, got {min_lrs!r}")
        _check_group_count(self, len(min_lrs), "min_lrs")
        self.__dict__.update(state)


# -- ChainedScheduler ------------------------------------------------------------------------------------------

def _within(sched: Any) -> list[Any]:
    """`sched` and every scheduler inside it (a ChainedScheduler's or SequentialLR's, nested ones included)."""
    return [sched, *(inner for s in getattr(sched, "_schedulers", ()) for inner in _within(s))]


class ChainedScheduler(LRScheduler):
    """Step several schedulers of one optimizer together: each `step()` steps every one of them in order, each
    from the lrs the one before it left (torch's ChainedScheduler). `optimizer` defaults to the first scheduler's;
    all must have it. ReduceLROnPlateau (its step needs a metric) is refused, as in torch.

    It has no epoch of its own (no `last_epoch`, as torch's) and no lr formula (`get_lr()` raises, as torch's):
    `get_last_lr()` is what the groups hold after the last step. state_dict() holds each scheduler's state under
    "_schedulers"; load_state_dict restores them all or none. Inside SequentialLR it is refused: torch's
    SequentialLR does not undo the chained schedulers' first steps, so its lrs follow no schedule (or it raises
    NotImplementedError at the milestone); a SequentialLR inside the chain works.
    """

    def __init__(self, schedulers: Iterable[LRScheduler], optimizer: Optimizer | None = None) -> None:
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("ChainedScheduler expects at least one scheduler to chain, but got none")
        for i, s in enumerate(schedulers):
            if not hasattr(s, "optimizer"):
                raise TypeError(f"ChainedScheduler: schedulers[{i}] is a {type(s).__name__}, which has no "
                                f"optimizer: not a learning-rate scheduler")
        # (an `optimizer` that is none is no scheduler's either: the ValueError below, as torch's)
        owner = optimizer if optimizer is not None else schedulers[0].optimizer
        for i, s in enumerate(schedulers):
            if isinstance(s, ReduceLROnPlateau):
                raise ValueError(f"ChainedScheduler cannot step schedulers[{i}], a ReduceLROnPlateau: its step needs "
                                 f"the metric (sched.step(val_loss)); step it yourself after each evaluation")
            if s.optimizer is not owner:
                raise ValueError(f"ChainedScheduler expects all schedulers to belong to the same optimizer, but "
                                 f"schedulers[{i}] ({type(s).__name__}) has a different one")
        self.optimizer = owner
        self._schedulers = schedulers
        self._last_lr = [group["lr"] for group in owner.param_groups]

    def step(self, epoch=None) -> None:
        """Step every scheduler, in order (call after optimizer.step())."""
        refuse_epoch(self, epoch)
        for s in self._schedulers:
            s.step()
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_lr(self) -> list[float]:
        """A chain has no lr formula of its own (NotImplementedError, as torch's): see get_last_lr()."""
        raise NotImplementedError("ChainedScheduler's lrs are what its schedulers set in turn: get_last_lr() gives "
                                  "the lrs the groups have")

    def state_dict(self) -> dict[str, Any]:
        """Own state (the last lrs) plus each scheduler's state_dict under "_schedulers", as torch's."""
        return with_inner_states(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, the inner schedulers included: all or none."""
        state = _public_state(self, state_dict, skip=("_schedulers",))
        inner = state_dict.get("_schedulers")
        if not isinstance(inner, (list, tuple)) or len(inner) != len(self._schedulers):
            raise ValueError(f"ChainedScheduler state has {len(inner) if isinstance(inner, (list, tuple)) else 'no'} "
                             f"inner schedulers, this one has {len(self._schedulers)}")
        # A bad inner state (the last one, say) must not leave the ones before it loaded: the chain would then be
        # half the saved run's and half this one's. Every scheduler within counts, a nested chain's too.
        everyone = _within(self)
        # Shallow: loading replaces values. (Not put back: the attributes a load writes into a CyclicLR's scale_fn
        # object or a lambda scheduler's callable objects, as SequentialLR's load does not either.)
        before = [dict(s.__dict__) for s in everyone]
        try:
            self.__dict__.update(state)
            for s, saved in zip(self._schedulers, inner):
                s.load_state_dict(saved)
        except BaseException:
            for s, saved in zip(everyone, before):
                s.__dict__.clear()
                s.__dict__.update(saved)
            raise

    def __repr__(self) -> str:
        return f"ChainedScheduler([{', '.join(repr(s) for s in self._schedulers)}], last_lr={self._last_lr})"
