"""Learning-rate schedules with torch.optim.lr_scheduler semantics, computed in closed form.

Call `scheduler.step()` after `optimizer.step()`. Each scheduler computes the lr
of step `last_epoch` directly from the base lrs (torch's `_get_closed_form_lr`)
instead of torch's recursive update of the current lr: the two are equal in exact
arithmetic, the closed form does not drift, and a traced/replayed step can
evaluate it from the step count alone. One consequence: a scheduler owns the lr
of its groups. Edits to `group["lr"]` and two schedulers chained on one optimizer
(torch's ChainedScheduler idiom) are overwritten at the next step, not composed.
`SequentialLR` (switching schedulers at milestones) works as in torch.

Resuming with `last_epoch=k` sets the lr of epoch k + 1 from the closed form;
torch instead keeps the group's current lr at construction and continues
recursively from it. Restoring with `load_state_dict` behaves the same in both.
"""

from __future__ import annotations

import math
import numbers
import operator
from bisect import bisect_right
from typing import Any, Sequence

from .optimizer import Optimizer

__all__ = ["LRScheduler", "ConstantLR", "LinearLR", "CosineAnnealingLR", "StepLR", "ExponentialLR",
           "SequentialLR", "warmup_cosine"]


def _check_int(name: str, value: Any, low: int) -> int:
    """`value` as an int if it is an integer >= low (NumPy integers too, as torch takes them; not bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return operator.index(value)  # a plain int: state_dict stays JSON-serialisable


def _check_float(name: str, value: Any, low: float, high: float | None = None, *, low_open: bool = False) -> float:
    """`value` as a float if it is a finite real number in range (NumPy scalars too, as torch takes them; not bool)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = value > low if low_open else value >= low
        ok = ok and (high is None or value <= high)
    if not ok:
        bound = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high is not None else "")
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)  # exact for float32/float64 scalars; a plain float keeps state_dict JSON-serialisable


def _power_lr(base_lr: float, gamma: float, n: int) -> float:
    """base_lr * gamma ** n, inf where it exceeds the float range (gamma > 1 for long enough), as torch's
    recursive lr * gamma becomes; Python's float power raises OverflowError there instead."""
    if base_lr == 0:
        return 0.0  # torch's 0 * gamma stays 0 (the closed form would give 0 * inf = nan)
    try:
        return base_lr * gamma**n
    except OverflowError:  # gamma ** n alone overflows, base_lr * gamma ** n may not: in logs
        try:
            return math.exp(math.log(base_lr) + n * math.log(gamma))
        except OverflowError:
            return math.inf


class LRScheduler:
    """Base class: sets each group's lr to `base_lr * factor(last_epoch)` at construction and every `step()`."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        last_epoch = _check_int("last_epoch", last_epoch, -1)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when resuming a "
                                   f"scheduler with last_epoch={last_epoch}; load the optimizer's state_dict first")
        self.base_lrs: list[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        self._step_count = 0
        self.step()

    def _factor(self, epoch: int) -> float:
        """Multiplier of the base lr at `epoch` (subclasses)."""
        raise NotImplementedError

    def _lr(self, base_lr: float, epoch: int) -> float:
        return base_lr * self._factor(epoch)

    def get_lr(self) -> list[float]:
        """The lr of every group at `last_epoch` (pure: does not step or set anything)."""
        return [self._lr(base_lr, self.last_epoch) for base_lr in self.base_lrs]

    def get_last_lr(self) -> list[float]:
        """The lrs this scheduler last set, one per parameter group."""
        return list(self._last_lr)

    def step(self) -> None:
        """Advance one step and set the groups' lr (call after optimizer.step())."""
        self._step_count += 1
        self._update_lr()

    def _adopt_added_groups(self) -> None:
        """Param groups added since (optimizer.add_param_group) join the schedule with their own lr as their
        base lr: the same closed form from the current epoch. Before, the next step updated every parameter
        and then failed here (zip of more groups than base lrs), half-applied."""
        for group in self.optimizer.param_groups[len(self.base_lrs):]:
            self.base_lrs.append(group.setdefault("initial_lr", group["lr"]))

    def _update_lr(self, epoch: int | None = None) -> None:
        self._adopt_added_groups()
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer (torch's format; plain numbers and lists)."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"scheduler state must be a dict, got {type(state_dict).__name__}")
        # torch's own bookkeeping (2.13: "_get_lr_called_within_step", "_is_initial") means nothing here: a
        # private key this class lacks is dropped, so a torch scheduler's state loads; a public one still fails.
        state_dict = {k: v for k, v in state_dict.items() if k in self.__dict__ or not k.startswith("_")}
        unknown = set(state_dict) - set(self.__dict__)
        if unknown:
            raise ValueError(f"scheduler state has keys {sorted(unknown)} that {type(self).__name__} does not "
                             f"have; was it saved from a different scheduler?")
        self.__dict__.update({k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in state_dict.items()})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(last_epoch={self.last_epoch}, last_lr={getattr(self, '_last_lr', None)})"


class ConstantLR(LRScheduler):
    """lr = base_lr * factor until `total_iters`, then base_lr (torch's defaults: factor 1/3 for 5 steps)."""

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5,
                 last_epoch: int = -1) -> None:
        self.factor = _check_float("factor", factor, 0.0, 1.0)
        self.total_iters = _check_int("total_iters", total_iters, 0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        if self.total_iters == 0:
            return base_lr * self.factor  # torch's recursive form never lifts the factor in this case
        return base_lr * (self.factor + (epoch >= self.total_iters) * (1 - self.factor))


class LinearLR(LRScheduler):
    """lr = base_lr * factor, factor going linearly from start_factor to end_factor over `total_iters` steps."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        self.start_factor = _check_float("start_factor", start_factor, 0.0, 1.0, low_open=True)
        self.end_factor = _check_float("end_factor", end_factor, 0.0, 1.0)
        self.total_iters = _check_int("total_iters", total_iters, 0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        if self.total_iters == 0:
            return base_lr * self.start_factor  # torch's recursive form never leaves the start factor
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor)
                          * min(self.total_iters, epoch) / self.total_iters)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (periodic past T_max, as torch)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        self.T_max = _check_int("T_max", T_max, 1)
        self.eta_min = _check_float("eta_min", eta_min, 0.0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size) (inf once that passes the float range, as torch's)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.step_size = _check_int("step_size", step_size, 1)
        self.gamma = _check_float("gamma", gamma, 0.0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        return _power_lr(base_lr, self.gamma, epoch // self.step_size)


class ExponentialLR(LRScheduler):
    """lr = base_lr * gamma ** epoch (inf once that passes the float range, as torch's)."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = _check_float("gamma", gamma, 0.0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        return _power_lr(base_lr, self.gamma, epoch)


class SequentialLR(LRScheduler):
    """Run `schedulers[i]` between milestones[i-1] and milestones[i]; each restarts at 0 when it takes over."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1) -> None:
        schedulers = list(schedulers)
        milestones = list(milestones)
        if not schedulers:
            raise ValueError("SequentialLR expects at least one scheduler, but got none")
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler):
                raise ValueError(f"SequentialLR: schedulers[{i}] is a {type(s).__name__}, not an LRScheduler")
            if s.optimizer is not optimizer:
                raise ValueError(f"SequentialLR expects all schedulers to belong to the same optimizer, but "
                                 f"schedulers[{i}] ({type(s).__name__}) has a different one")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR expects one milestone fewer than schedulers, got {len(schedulers)} "
                             f"schedulers and {len(milestones)} milestones {milestones}")
        milestones = [_check_int("each milestone", m, 0) for m in milestones]
        if any(b <= a for a, b in zip(milestones, milestones[1:])):
            raise ValueError(f"SequentialLR milestones must be strictly increasing, got {milestones}")
        last_epoch = _check_int("last_epoch", last_epoch, -1)
        self.optimizer = optimizer
        self._schedulers = schedulers
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        # As torch: restore the initial lrs, undo the initial step every scheduler took at
        # construction, then give only the first active scheduler its initial step.
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self._undo(self)
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = self._schedulers[idx].get_last_lr()

    def _undo(self, sched: LRScheduler) -> None:
        if isinstance(sched, SequentialLR):
            for s in sched._schedulers:
                self._undo(s)
        elif sched is not self:
            sched.last_epoch -= 1

    def get_lr(self) -> list[float]:
        """The lrs of the scheduler active at `last_epoch`."""
        return self._schedulers[bisect_right(self._milestones, self.last_epoch)].get_lr()

    def step(self) -> None:
        """Advance one step; at a milestone the next scheduler takes over from its epoch 0."""
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        """Own state plus each scheduler's state_dict under "_schedulers"."""
        state = {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()
                 if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, including the inner schedulers."""
        state = dict(state_dict)
        inner = state.pop("_schedulers", None)
        if inner is None or len(inner) != len(self._schedulers):
            raise ValueError(f"SequentialLR state has {0 if inner is None else len(inner)} inner schedulers, "
                             f"this one has {len(self._schedulers)}")
        super().load_state_dict(state)
        for s, sd in zip(self._schedulers, inner):
            s.load_state_dict(sd)


def warmup_cosine(optimizer: Optimizer, warmup_steps: int, total_steps: int, *, start_factor: float = 1e-3,
                  eta_min: float = 0.0) -> SequentialLR:
    """Linear warmup from base_lr * start_factor to base_lr over `warmup_steps`, then cosine to `eta_min`.

    Exactly torch's SequentialLR([LinearLR(start_factor, 1.0, warmup_steps),
    CosineAnnealingLR(total_steps - warmup_steps, eta_min)], milestones=[warmup_steps]):
    the lr reaches eta_min after `total_steps` scheduler steps.
    """
    warmup_steps = _check_int("warmup_steps", warmup_steps, 0)
    total_steps = _check_int("total_steps", total_steps, 1)
    if total_steps <= warmup_steps:
        raise ValueError(f"total_steps ({total_steps}) must be greater than warmup_steps ({warmup_steps})")
    warmup = LinearLR(optimizer, start_factor=start_factor, end_factor=1.0, total_iters=warmup_steps)
    cosine = CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps, eta_min=eta_min)
    return SequentialLR(optimizer, [warmup, cosine], milestones=[warmup_steps])
