"""Learning-rate schedules with torch.optim.lr_scheduler semantics, in torch's chainable form.

Call `scheduler.step()` after `optimizer.step()`. As torch's, each step updates the lr each group has now
(ExponentialLR multiplies it by gamma, StepLR at every step_size-th epoch, ...), so the schedule composes with
what else changes the lr: an lr edited by hand between steps goes on from the edited value, two schedulers on
one optimizer chain (each multiplies what the other left), and a group added with `add_param_group` goes on
from its own lr. The same float operations as torch's give the same lrs, bit for bit.

Where torch uses the closed form from the base lrs (`initial_lr`), so does this module: at a SequentialLR
milestone (torch's `_update_lr(0)`) and at a CosineAnnealingLR restart. A group added after the scheduler was
built has no base lr in torch, which then fails there ("zip() argument 2 is longer than argument 1"); here it
joins with its lr when first seen as its base lr (`initial_lr`, kept by optimizer.state_dict()).

`get_lr()` is the closed form at `last_epoch`: pure (it steps and sets nothing), unlike torch's, which applies
one more chainable step to the current lrs. `get_last_lr()` is what the last step set.

Resuming with `last_epoch=k` sets the lr a fresh schedule sets at epoch k + 1 (its steps replayed from
`initial_lr`, bit for bit what an uninterrupted run has); torch instead keeps the group's current lr at
construction. Restoring with `load_state_dict` behaves the same in both.
"""

from __future__ import annotations

import math
import numbers
import operator
import types
from bisect import bisect_right
from typing import Any, Callable, Sequence

from .optimizer import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "ConstantLR", "LinearLR", "CosineAnnealingLR", "StepLR", "ExponentialLR",
           "SequentialLR", "warmup_cosine", "MultiStepLR", "PolynomialLR", "MultiplicativeLR",
           "CosineAnnealingWarmRestarts", "OneCycleLR", "ReduceLROnPlateau", "CyclicLR", "ChainedScheduler"]


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


def refuse_epoch(scheduler, epoch) -> None:
    """torch's step(epoch), deprecated there, is not taken here: schedules count steps. Python's own "takes 1
    positional argument" told a porting user nothing; this says what to call instead."""
    if epoch is not None:
        raise TypeError(f"{type(scheduler).__name__}.step() takes no epoch or metric (got {epoch!r}): schedules here "
                        f"count calls, so call step() once per step; for per-batch CosineAnnealingWarmRestarts "
                        f"give T_0 (and T_mult's periods) in batches and call step() every batch; a metric goes to "
                        f"ReduceLROnPlateau.step(val_loss)")


class LRScheduler:
    """Base class. Each `step()` advances `last_epoch` and updates every group's current lr (`_chain`, torch's
    `get_lr`); `_lr` is the closed form from the base lrs (torch's `_get_closed_form_lr`) for explicit epochs."""

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
        if last_epoch == -1:
            self._initial_step()
        else:
            self._resume()

    def _initial_step(self) -> None:
        """torch's step at construction, to epoch 0 (SequentialLR calls it for the scheduler it starts with)."""
        self._step_count = 1
        self._update_lr(initial=True)

    def _resume(self) -> None:
        """Construction with last_epoch=k: the lrs a fresh run of this schedule sets at epoch k + 1, its steps
        replayed from initial_lr so that they are bit for bit an uninterrupted run's (torch keeps the current lr)."""
        self._step_count = 1
        if self._own_get_lr():  # a schedule of the user's: torch's step to epoch k + 1, its get_lr()
            self._update_lr()
            return
        lrs = []
        for base_lr in self.base_lrs:
            lr = self._chain(base_lr, base_lr, 0, initial=True)
            for epoch in range(1, self.last_epoch + 2):
                lr = self._chain(lr, base_lr, epoch)
            lrs.append(lr)
        self.last_epoch += 1
        self._set_lrs(lrs)

    def _lr(self, base_lr: float, epoch: int) -> float:
        """Closed form: the lr at `epoch` of a group whose base lr is `base_lr` (subclasses)."""
        raise NotImplementedError

    def _chain(self, lr: float, base_lr: float, epoch: int, initial: bool = False) -> float:
        """torch's chainable step: the lr at `epoch` of a group whose lr is now `lr` (subclasses). `initial` is
        the step at construction (torch's `_is_initial`), where some schedules keep the lr as it is."""
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        """The closed-form lr of every group at `last_epoch` (pure: does not step or set anything)."""
        return [self._lr(base_lr, self.last_epoch) for base_lr in self.base_lrs]

    def _own_get_lr(self) -> bool:
        """Whether a subclass overrides get_lr below the class whose _chain steps it: torch's way to write a
        schedule of one's own (`class MyLR(LRScheduler): def get_lr(self): ...`), whose every step sets
        get_lr(), as torch's step does. Without this, such a class failed at construction with a bare
        NotImplementedError from _chain."""
        mro = type(self).__mro__

        def defined_at(name: str) -> int:
            return next(i for i, cls in enumerate(mro) if name in cls.__dict__)
        return defined_at("get_lr") < defined_at("_chain")

    def get_last_lr(self) -> list[float]:
        """The lrs this scheduler last set, one per parameter group."""
        return list(self._last_lr)

    def step(self, epoch=None) -> None:
        """Advance one step and update the groups' lr (call after optimizer.step()). No explicit epoch (see
        refuse_epoch)."""
        refuse_epoch(self, epoch)
        self._step_count += 1
        self._update_lr()

    def _adopt_added_groups(self) -> None:
        """Param groups added since (optimizer.add_param_group) join with their lr now as base lr (initial_lr): the
        chainable steps go on from their lr, and the closed form (a milestone, a cosine restart) needs a base lr."""
        self._check_base_lrs(self.base_lrs)
        for group in self.optimizer.param_groups[len(self.base_lrs):]:
            self.base_lrs.append(group.setdefault("initial_lr", group["lr"]))

    def _check_base_lrs(self, base_lrs: list[float]) -> None:
        """More base lrs than groups: a state saved with another optimizer (groups are only ever added)."""
        n = len(self.optimizer.param_groups)
        if len(base_lrs) > n:
            raise ValueError(f"{type(self).__name__}: the scheduler state has {len(base_lrs)} base lrs but the "
                             f"optimizer has {n} param groups; load the state saved with this optimizer's state")

    def _update_lr(self, epoch: int | None = None, *, initial: bool = False) -> None:
        """One step: the next epoch from each group's current lr, or (torch's explicit epoch, which SequentialLR
        uses at a milestone) `epoch` in closed form from the base lrs."""
        self._adopt_added_groups()
        if epoch is None:
            self.last_epoch += 1
            if self._own_get_lr():
                lrs = self.get_lr()
            else:
                lrs = [self._chain(group["lr"], base_lr, self.last_epoch, initial)
                       for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True)]
        else:
            self.last_epoch = epoch
            lrs = self.get_lr()
        self._set_lrs(lrs)

    def _set_lrs(self, lrs: list[float]) -> None:
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
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
        # Regression (fixed): this loaded, and every later step failed with zip()'s "argument 2 is shorter".
        self._check_base_lrs(state_dict.get("base_lrs", self.base_lrs))
        self.__dict__.update({k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in state_dict.items()})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(last_epoch={self.last_epoch}, last_lr={getattr(self, '_last_lr', None)})"


class _FunctionsOfEpoch(LRScheduler):
    """What LambdaLR and MultiplicativeLR share: one function of the epoch for every group, or a list with one per
    group (`lr_lambdas`), checked when built; a group added with add_param_group follows the one function given for
    all (torch fails there: "zip() argument 2 is shorter than argument 1"), and with a list of functions that is a
    ValueError saying so; state_dict() holds None for a plain function and the attributes of a callable object, as
    torch's, so a checkpoint restores the epoch and base lrs, not the functions. `_returns` says what a function
    gives, for the errors."""

    _returns = "the lr factor"

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
                 last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        name, groups = type(self).__name__, len(optimizer.param_groups)
        one = not isinstance(lr_lambda, (list, tuple))
        if not one and len(lr_lambda) != groups:
            raise ValueError(f"{name}: expected {groups} lr_lambdas (one per param group), but got {len(lr_lambda)}")
        lambdas = [lr_lambda] * groups if one else list(lr_lambda)
        for i, fn in enumerate(lambdas):
            if not callable(fn):
                raise TypeError(f"{name}: lr_lambda {'' if one else f'[{i}] '}must be a function of the epoch "
                                f"returning {self._returns}, got a {type(fn).__name__}")
        # Set before the base class steps to epoch 0: that first step calls them.
        self.lr_lambdas = lambdas
        self._one_lambda = one
        super().__init__(optimizer, last_epoch)

    def _adopt_added_groups(self) -> None:
        """A group added since follows the one function given for all (its lr its base lr); with one function per
        group there is none for it, which is refused before anything changes."""
        added = len(self.optimizer.param_groups) - len(self.lr_lambdas)
        if added > 0 and not self._one_lambda:
            name = type(self).__name__
            raise ValueError(f"{name} was built with one lr_lambda per param group ({len(self.lr_lambdas)}), and "
                             f"{added} group(s) were added since (optimizer.add_param_group), which have none. Build "
                             f"the {name} after adding the groups, or give one function for all groups")
        super()._adopt_added_groups()
        self.lr_lambdas.extend(self.lr_lambdas[:1] * added)

    def state_dict(self) -> dict[str, Any]:
        """torch's format: the schedule's position and base lrs; lr_lambdas holds None for each plain function and
        a copy of the attributes of each callable object (a function's code cannot go into a checkpoint)."""
        state = {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()
                 if k not in ("optimizer", "lr_lambdas", "_one_lambda")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else dict(getattr(fn, "__dict__", {}))
                               for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned: the position, base lrs and the callable objects' attributes. All is
        checked before anything changes."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"scheduler state must be a dict, got {type(state_dict).__name__}")
        name = type(self).__name__
        state = dict(state_dict)
        saved = state.pop("lr_lambdas", None)
        saved = [None] * len(self.lr_lambdas) if saved is None else list(saved)
        # The saved run may have added groups since it was built: they follow the one function.
        if len(saved) > len(self.lr_lambdas) and not self._one_lambda:
            raise ValueError(f"{name} state has {len(saved)} lr_lambdas but this {name} has one for each of "
                             f"{len(self.lr_lambdas)} param groups; build it with one per group of the saved run")
        lambdas = self.lr_lambdas + self.lr_lambdas[:1] * (len(saved) - len(self.lr_lambdas))
        for i, attrs in enumerate(saved):
            if attrs is not None and not isinstance(attrs, dict):
                raise ValueError(f"{name} state: lr_lambdas[{i}] must be None or a dict of the function's "
                                 f"attributes, got a {type(attrs).__name__}")
            if attrs is not None and not hasattr(lambdas[i], "__dict__"):
                raise ValueError(f"{name} state holds attributes for lr_lambda {i}, which has none to take them "
                                 f"(a {type(lambdas[i]).__name__}); build it with the saved run's functions")
        super().load_state_dict(state)  # validates the rest (unknown keys, base lrs) before anything below
        self.lr_lambdas = lambdas
        for fn, attrs in zip(lambdas, saved):
            if attrs is not None:
                fn.__dict__.update(attrs)


class LambdaLR(_FunctionsOfEpoch):
    """lr = base_lr * lr_lambda(epoch): one function for every group, or a list with one per group (torch's LambdaLR).

    The recipe of fine-tuning scripts (Hugging Face's warmup + linear or cosine decay is a LambdaLR). As torch's,
    it is not chainable: each step sets the closed form from the base lr, so an lr edited by hand lasts until the
    next step. Its functions (added groups, state_dict) as _FunctionsOfEpoch says.
    """

    def get_lr(self) -> list[float]:
        """base_lr * lr_lambda(last_epoch) for every group (torch's float operations: the same lrs, bit for bit)."""
        return [base_lr * fn(self.last_epoch) for fn, base_lr in zip(self.lr_lambdas, self.base_lrs, strict=True)]

    def _update_lr(self, epoch: int | None = None, *, initial: bool = False) -> None:
        """The closed form at the next epoch (or at `epoch`): torch's LambdaLR has no chainable form."""
        self._adopt_added_groups()
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        self._set_lrs(self.get_lr())

    def _resume(self) -> None:
        """Built with last_epoch=k: the lrs of epoch k + 1, as torch's (the closed form needs no replay)."""
        self._step_count = 1
        self._update_lr()


class ConstantLR(LRScheduler):
    """lr * factor from epoch 0 until `total_iters`, where the factor is undone (torch's defaults: 1/3 for 5 steps)."""

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5,
                 last_epoch: int = -1) -> None:
        self.factor = _check_float("factor", factor, 0.0, 1.0)
        self.total_iters = _check_int("total_iters", total_iters, 0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        # Regression (fixed): with total_iters=0 this gave base_lr * factor; torch's closed form (a SequentialLR
        # milestone) gives base_lr. (Its chainable steps keep the factor: epoch 0 applies it, none undoes it.)
        return base_lr * (self.factor + (epoch >= self.total_iters) * (1 - self.factor))

    def _chain(self, lr: float, base_lr: float, epoch: int, initial: bool = False) -> float:
        if epoch == 0:
            return lr * self.factor
        if epoch != self.total_iters:
            return lr
        if self.factor == 0:
            # torch divides by the factor here (ZeroDivisionError). No lr is left to undo a factor of 0 from, so
            # the group returns to its base lr, as the closed form gives.
            return base_lr
        return lr * (1.0 / self.factor)


class LinearLR(LRScheduler):
    """lr * factor, the factor going linearly from start_factor to end_factor over `total_iters` steps."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        self.start_factor = _check_float("start_factor", start_factor, 0.0, 1.0, low_open=True)
        self.end_factor = _check_float("end_factor", end_factor, 0.0, 1.0)
        self.total_iters = _check_int("total_iters", total_iters, 0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        if self.total_iters == 0:
            # torch divides by total_iters here (ZeroDivisionError); its chainable steps hold the start factor
            return base_lr * self.start_factor
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor)
                          * min(self.total_iters, epoch) / self.total_iters)

    def _chain(self, lr: float, base_lr: float, epoch: int, initial: bool = False) -> float:
        if epoch == 0:
            return lr * self.start_factor
        if initial or epoch > self.total_iters:
            return lr
        # the ratio of consecutive factors; the denominator is > 0 as start_factor > 0 and epoch <= total_iters
        return lr * (1.0 + (self.end_factor - self.start_factor)
                     / (self.total_iters * self.start_factor + (epoch - 1) * (self.end_factor - self.start_factor)))


class CosineAnnealingLR(LRScheduler):
    """eta_min + (lr - eta_min) scaled by the ratio of consecutive (1 + cos(pi * epoch / T_max)); at each restart
    (epoch T_max + 1, 3 T_max + 1, ...) the lr rises from eta_min by a step of the base lr's curve, as torch's."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        self.T_max = _check_int("T_max", T_max, 1)
        self.eta_min = _check_float("eta_min", eta_min, 0.0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2

    def _chain(self, lr: float, base_lr: float, epoch: int, initial: bool = False) -> float:
        # (torch's branch for _step_count == 1 with last_epoch > 0 is the closed form after a resume by
        # last_epoch; here _resume replays the steps instead.)
        if initial:
            return lr
        if (epoch - 1 - self.T_max) % (2 * self.T_max) == 0:  # the previous epoch was a trough: 1 + cos = 0
            return lr + (base_lr - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
        return ((1 + math.cos(math.pi * epoch / self.T_max)) / (1 + math.cos(math.pi * (epoch - 1) / self.T_max))
                * (lr - self.eta_min) + self.eta_min)


class StepLR(LRScheduler):
    """lr * gamma at every `step_size`-th epoch (inf once that passes the float range, as torch's)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.step_size = _check_int("step_size", step_size, 1)
        self.gamma = _check_float("gamma", gamma, 0.0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        return _power_lr(base_lr, self.gamma, epoch // self.step_size)

    def _chain(self, lr: float, base_lr: float, epoch: int, initial: bool = False) -> float:
        if epoch == 0 or epoch % self.step_size != 0:
            return lr
        return lr * self.gamma


class ExponentialLR(LRScheduler):
    """lr * gamma every epoch (inf once that passes the float range, as torch's)."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = _check_float("gamma", gamma, 0.0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        return _power_lr(base_lr, self.gamma, epoch)

    def _chain(self, lr: float, base_lr: float, epoch: int, initial: bool = False) -> float:
        return lr if initial else lr * self.gamma


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
            if isinstance(s, (ReduceLROnPlateau, ChainedScheduler)):  # (lr_schedulers_metric.py says why)
                raise ValueError(f"SequentialLR cannot run schedulers[{i}], a {type(s).__name__}: "
                                 + ("its step needs the metric; step it yourself after each evaluation"
                                    if isinstance(s, ReduceLROnPlateau) else
                                    "put the SequentialLR inside the ChainedScheduler instead"))
            if isinstance(s, SequentialLR):
                # At its milestone a phase restarts from epoch 0, which a SequentialLR cannot do (torch raises
                # NotImplementedError there); ours went on from its inner phase's epoch -1 (lr -0.02 for 0.01).
                raise ValueError(f"SequentialLR cannot run schedulers[{i}], another SequentialLR: put its phases "
                                 f"into this one, one scheduler per phase, with their milestones")
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

    def step(self, epoch=None) -> None:
        """Advance one step; at a milestone the next scheduler takes over from its epoch 0."""
        refuse_epoch(self, epoch)
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
        return with_inner_states(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, including the inner schedulers."""
        state = dict(state_dict)
        inner = state.pop("_schedulers", None)
        if inner is None or len(inner) != len(self._schedulers):
            raise ValueError(f"SequentialLR state has {0 if inner is None else len(inner)} inner schedulers, "
                             f"this one has {len(self._schedulers)}")
        # All or nothing: a bad inner state (the last one, say) must not leave this one and the inner ones
        # before it loaded, the schedule then half the saved run's and half this one's.
        everyone = (self, *self._schedulers)
        before = [dict(s.__dict__) for s in everyone]  # shallow: loading replaces values, never mutates them
        try:
            super().load_state_dict(state)
            for s, sd in zip(self._schedulers, inner):
                s.load_state_dict(sd)
        except BaseException:
            for s, saved in zip(everyone, before):
                s.__dict__.clear()
                s.__dict__.update(saved)
            raise


def with_inner_states(sched: LRScheduler) -> dict[str, Any]:
    """A scheduler of schedulers' state_dict (SequentialLR, ChainedScheduler): its own state (not the optimizer)
    plus each inner scheduler's state_dict under "_schedulers", as torch lays it out."""
    state = {k: (list(v) if isinstance(v, list) else v) for k, v in sched.__dict__.items()
             if k not in ("optimizer", "_schedulers")}
    state["_schedulers"] = [s.state_dict() for s in sched._schedulers]
    return state


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


# Defined in lr_schedulers_more.py, _metric.py and _cyclic.py, which build on the classes above: imported last.
from .lr_schedulers_more import (CosineAnnealingWarmRestarts, MultiplicativeLR, MultiStepLR,  # noqa: E402
                                 OneCycleLR, PolynomialLR)
from .lr_schedulers_metric import ChainedScheduler, ReduceLROnPlateau  # noqa: E402
from .lr_schedulers_cyclic import CyclicLR  # noqa: E402
