"""More learning-rate schedules with torch.optim.lr_scheduler semantics: MultiStepLR, PolynomialLR,
MultiplicativeLR, CosineAnnealingWarmRestarts and OneCycleLR.

They follow the design of lr_scheduler.py (read its module docstring): each subclasses LRScheduler, `_chain` is
torch's step from the lr a group has now and `_lr` the closed form from its base lr, so the lrs are torch's bit
for bit (the same float operations in the same order), an lr edited by hand and a second scheduler on the same
optimizer are handled as torch handles them, and SequentialLR's milestones, resuming with `last_epoch=k` and
state_dict/load_state_dict work as for the schedules there.

Three of them are chainable in torch (MultiStepLR, PolynomialLR, MultiplicativeLR): each step updates the lr the
group has. Two are not (CosineAnnealingWarmRestarts, OneCycleLR): each step sets the lr from the schedule alone,
so an lr edited by hand lasts until the next step, as in torch. Where torch fails or gives a result that depends
on how it was reached, each class says what it does instead.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Sequence

from .lr_scheduler import LRScheduler, _check_float, _check_int, _FunctionsOfEpoch, _power_lr
from .optimizer import Optimizer

__all__ = ["MultiStepLR", "PolynomialLR", "MultiplicativeLR", "CosineAnnealingWarmRestarts", "OneCycleLR"]


def _check_bool(name: str, value: Any) -> bool:
    """`value` if it is a bool: a flag given as a string ("false") would otherwise count as True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


class MultiStepLR(LRScheduler):
    """lr * gamma at each epoch in `milestones`; an epoch listed n times multiplies by gamma ** n (torch's Counter).

    Milestones may come in any order (torch takes them so); they are kept sorted, repeats included, which is what
    `state_dict()` holds (torch's holds a Counter; `load_state_dict` takes that too). A milestone at epoch 0
    applies at construction, as in torch.
    """

    def __init__(self, optimizer: Optimizer, milestones: Iterable[int], gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Iterable):
            raise TypeError(f"MultiStepLR: milestones must be a list of epoch indices, got {milestones!r}")
        # Counter as torch's: a repeated milestone counts each time (a mapping gives milestone -> times).
        self.milestones = sorted(_check_int("each milestone", m, 0) for m in Counter(milestones).elements())
        self.gamma = _check_float("gamma", gamma, 0.0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        return _power_lr(base_lr, self.gamma, bisect_right(self.milestones, epoch))

    def _chain(self, lr: float, base_lr: float, epoch: int, initial: bool = False) -> float:
        times = self.milestones.count(epoch)  # no `initial` case: torch applies a milestone at 0 when built
        return lr * self.gamma**times if times else lr

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, or torch's MultiStepLR state (its milestones a Counter)."""
        if isinstance(state_dict, dict) and isinstance(state_dict.get("milestones"), Mapping):
            state_dict = {**state_dict, "milestones": sorted(int(m) for m in
                                                             Counter(state_dict["milestones"]).elements())}
        super().load_state_dict(state_dict)


class PolynomialLR(LRScheduler):
    """base_lr * (1 - epoch / total_iters) ** power until `total_iters`, where it reaches 0 and stays.

    Chainable as torch's: each step multiplies the lr by the ratio of consecutive factors. With total_iters=0
    torch's steps never change the lr and its closed form divides by zero; here both keep the base lr.
    """

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1) -> None:
        self.total_iters = _check_int("total_iters", total_iters, 0)
        # A negative power would raise ZeroDivisionError at total_iters (0.0 ** -p); torch does not check it.
        self.power = _check_float("power", power, 0.0)
        super().__init__(optimizer, last_epoch)

    def _lr(self, base_lr: float, epoch: int) -> float:
        if self.total_iters == 0:
            return base_lr
        return base_lr * (1.0 - min(self.total_iters, epoch) / self.total_iters) ** self.power

    def _chain(self, lr: float, base_lr: float, epoch: int, initial: bool = False) -> float:
        if initial or epoch > self.total_iters:
            return lr
        # epoch >= 1 here (epoch 0 is the initial step), so the denominator is > 0
        ratio = (1.0 - epoch / self.total_iters) / (1.0 - (epoch - 1) / self.total_iters)
        return lr * ratio**self.power


class MultiplicativeLR(_FunctionsOfEpoch):
    """lr * lr_lambda(epoch) at each step: one function for every group, or a list with one per group.

    Chainable as torch's (the lr each group has now times the factor; construction leaves the lr as it is). At a
    SequentialLR milestone the factor of epoch 0 applies, as torch's. Its lambdas are handled as LambdaLR's here:
    a group added with add_param_group follows the one function given for all (with a list that is a ValueError),
    and state_dict() holds None for each plain function and the attributes of each callable object, as torch's.
    `get_lr()` is the lr a run from the base lrs has at `last_epoch`: base_lr * lr_lambda(1) * ... (it calls the
    functions, which should then be pure). Resuming with last_epoch=k replays those factors, as the other schedules
    replay their steps. Its factor depends on the group (one function each), which the base class's
    `_chain(lr, base_lr, epoch)` is not told, so this class overrides the step itself, as LambdaLR does.
    """

    _returns = "the factor to multiply the lr by"

    def _replayed(self, fn: Callable[[int], float], base_lr: float, epoch: int) -> float:
        """base_lr times the factors of epochs 1..epoch, multiplied in the order a run's steps multiply them."""
        lr = base_lr
        for e in range(1, epoch + 1):
            lr = lr * fn(e)
        return lr

    def get_lr(self) -> list[float]:
        """The lr of every group at `last_epoch` in a run from the base lrs (pure: steps and sets nothing)."""
        return [self._replayed(fn, base_lr, self.last_epoch)
                for fn, base_lr in zip(self.lr_lambdas, self.base_lrs, strict=True)]

    def _update_lr(self, epoch: int | None = None, *, initial: bool = False) -> None:
        """Every group's lr times its factor at the next epoch (or at `epoch`: torch applies the chainable step
        there too, having no closed form); the initial step keeps the lrs."""
        self._adopt_added_groups()
        epoch = self.last_epoch + 1 if epoch is None else epoch
        lrs = [group["lr"] if initial else group["lr"] * fn(epoch)
               for fn, group in zip(self.lr_lambdas, self.optimizer.param_groups, strict=True)]
        self.last_epoch = epoch  # only once every function returned: one that raises leaves the epoch as it was
        self._set_lrs(lrs)

    def _resume(self) -> None:
        """Built with last_epoch=k: the lrs a run from the base lrs has at epoch k + 1."""
        self._step_count = 1
        self._adopt_added_groups()
        self.last_epoch += 1
        self._set_lrs(self.get_lr())


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine from the base lr to eta_min over T_i epochs, then a restart at the base lr (SGDR): the first cycle
    has T_0 epochs, each next one T_mult times as many.

    lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2, T_cur the epochs since the last restart.
    Not chainable, as torch's: each step sets the lr from the base lr (an lr edited by hand lasts one step).
    `T_cur` and `T_i` are kept up to date as attributes (and in state_dict(), as torch's), but the lr comes from
    the epoch alone, the same integers torch's steps count, so the lrs are torch's bit for bit.

    Only `step()` (integer epochs): torch's `step(epoch)` with a fractional epoch (step(epoch + i / iters) within
    an epoch) is left out. It makes T_cur a float that later steps carry on from, a state that `last_epoch` does not
    determine, which this base class's closed form (`_lr(base_lr, epoch)`, used at SequentialLR milestones and on
    resume) cannot express. Call step() once per batch with T_0 counted in batches instead.

    Resuming with last_epoch=k gives the lrs of an uninterrupted run at epoch k + 1. torch's resume counts T_cur
    from k against T_0 alone, which differs once a restart has lengthened the cycle (T_mult > 1 and k + 1 >= T_0).
    """

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        self.T_0 = _check_int("T_0", T_0, 1)
        self.T_mult = _check_int("T_mult", T_mult, 1)
        self.eta_min = _check_float("eta_min", eta_min, 0.0)
        self.T_i = self.T_0
        self.T_cur = last_epoch  # torch's value before the initial step; set from the epoch at every step
        super().__init__(optimizer, last_epoch)

    def _cycle(self, epoch: int) -> tuple[int, int]:
        """(T_cur, T_i) at `epoch`: where in its cycle the epoch is, and that cycle's length."""
        if self.T_mult == 1:
            return epoch % self.T_0, self.T_0
        length = self.T_0
        while epoch >= length:  # cycles grow geometrically: a few dozen turns at most
            epoch -= length
            length *= self.T_mult
        return epoch, length

    def _lr(self, base_lr: float, epoch: int) -> float:
        t_cur, t_i = self._cycle(epoch)
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t_cur / t_i)) / 2

    def _chain(self, lr: float, base_lr: float, epoch: int, initial: bool = False) -> float:
        return self._lr(base_lr, epoch)  # torch's steps recompute from the base lrs too

    def _resume(self) -> None:
        """Built with last_epoch=k: the closed form at epoch k + 1 (no replay needed: no step depends on the last)."""
        self._step_count = 1
        self._update_lr()

    def _set_lrs(self, lrs: list[float]) -> None:
        super()._set_lrs(lrs)
        self.T_cur, self.T_i = self._cycle(self.last_epoch)


def per_group(owner: str, name: str, optimizer: Optimizer, value: Any, low: float,
              high: float | None = None) -> list[float]:
    """One value for every param group, or a list/tuple with one per group (torch's base_lr, max_lr, momentums of
    OneCycleLR and CyclicLR, the `owner`), checked."""
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{owner}: {name} has {len(value)} values, but the optimizer has {n} param groups: give "
                             f"one value, or one per group: {list(value)!r}")
        return [_check_float(f"{name}[{i}]", v, low, high) for i, v in enumerate(value)]
    return [_check_float(name, value, low, high)] * n


def set_momentum(group: dict[str, Any], momentum: float, use_beta1: bool) -> None:
    """The momentum a cycling schedule sets: SGD's and RMSprop's group["momentum"], the Adam family's betas[0]."""
    if use_beta1:
        group["betas"] = (momentum, *group["betas"][1:])  # a new tuple: betas stay a tuple, as torch's
    else:
        group["momentum"] = momentum


def _phase(end_step: float, start_lr: str, end_lr: str, start_momentum: str, end_momentum: str) -> dict[str, Any]:
    """One phase of the cycle: it ends at `end_step` and goes between the group values under these keys."""
    return {"end_step": end_step, "start_lr": start_lr, "end_lr": end_lr,
            "start_momentum": start_momentum, "end_momentum": end_momentum}


def _cycle_phases(total_steps: int, pct_start: float, three_phase: bool) -> list[dict[str, Any]]:
    """The phases of a 1cycle of `total_steps`: up to max_lr over pct_start of it, then down to min_lr (with
    three_phase: back down to initial_lr over as many steps, then to min_lr). The end steps are computed as
    torch computes them (the same floats), since every lr is interpolated from them."""
    rise_end = float(pct_start * total_steps) - 1
    if not three_phase:
        return [_phase(rise_end, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                _phase(total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
    return [_phase(rise_end, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
            _phase(float(2 * pct_start * total_steps) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
            _phase(total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]


def _anneal_cos(start: float, end: float, pct: float) -> float:
    """From start (pct 0) to end (pct 1) along half a cosine (torch's float operations, for the same bits)."""
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def _anneal_linear(start: float, end: float, pct: float) -> float:
    """From start (pct 0) to end (pct 1) along a line (torch's float operations)."""
    return (end - start) * pct + start


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the lr rises from max_lr / div_factor to max_lr over pct_start of `total_steps`, then
    falls to initial_lr / final_div_factor (torch's OneCycleLR; step it after every batch). With cycle_momentum,
    the momentum (SGD's, RMSprop's group['momentum']; the Adam family's group['betas'][0], betas kept a tuple)
    moves the opposite way, between max_momentum and base_momentum.

    As torch's, construction (with last_epoch=-1) writes each group's `initial_lr`, `max_lr`, `min_lr` and, when
    cycling momentum, `max_momentum` and `base_momentum` and the momentum itself; every step computes the lr and
    momentum from those group values (kept by optimizer.state_dict(), so a resumed run needs the optimizer's
    state loaded, as in torch). It is not chainable: each step sets the schedule's lr whatever the group's lr was,
    so an lr edited by hand lasts one step, and a scheduler stepped after this one applies on top of it each step.
    Inside SequentialLR it starts its cycle at its milestone (step 0 of the cycle), as torch's. The base class's
    `_lr`/`_chain` take a base lr, not the group values the cycle reads, so this class overrides the step itself
    (`_update_lr`, `_resume`, `get_lr`), as LambdaLR does.

    Differences from torch, all where torch fails or leaves a broken state:
    - a step past `total_steps` raises a ValueError, as torch's, but before anything changes (torch has already
      counted the step, so the scheduler is then one step ahead of the lrs);
    - a last phase of no length (pct_start=1.0: the fall has 0 steps) is at its end when its step comes (torch
      divides by zero there), so the step after the peak sets min_lr;
    - every argument is checked before any group changes (torch writes the lrs before it checks the momentum).
    """

    def __init__(self, optimizer: Optimizer, max_lr: float | Sequence[float], total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True,
                 base_momentum: float | Sequence[float] = 0.85, max_momentum: float | Sequence[float] = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        last_epoch = _check_int("last_epoch", last_epoch, -1)
        if total_steps is not None:  # it takes precedence over epochs * steps_per_epoch, as in torch
            total_steps = _check_int("total_steps", total_steps, 1)
        elif epochs is not None and steps_per_epoch is not None:
            total_steps = _check_int("epochs", epochs, 1) * _check_int("steps_per_epoch", steps_per_epoch, 1)
        else:
            raise ValueError(f"OneCycleLR needs total_steps, or epochs and steps_per_epoch, got total_steps=None, "
                             f"epochs={epochs!r}, steps_per_epoch={steps_per_epoch!r}")
        pct_start = _check_float("pct_start", pct_start, 0.0, 1.0)
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        cycle_momentum = _check_bool("cycle_momentum", cycle_momentum)
        three_phase = _check_bool("three_phase", three_phase)
        div_factor = _check_float("div_factor", div_factor, 0.0, low_open=True)
        final_div_factor = _check_float("final_div_factor", final_div_factor, 0.0, low_open=True)
        max_lrs = per_group("OneCycleLR", "max_lr", optimizer, max_lr, 0.0)
        use_beta1 = False
        if cycle_momentum:
            if "betas" not in optimizer.defaults and "momentum" not in optimizer.defaults:
                raise ValueError(f"OneCycleLR with cycle_momentum=True needs an optimizer with a momentum or betas "
                                 f"setting; {type(optimizer).__name__} has neither: pass cycle_momentum=False")
            use_beta1 = "betas" in optimizer.defaults
            max_momentums = per_group("OneCycleLR", "max_momentum", optimizer, max_momentum, 0.0, 1.0)
            base_momentums = per_group("OneCycleLR", "base_momentum", optimizer, base_momentum, 0.0, 1.0)

        # Everything checked: now the groups. A resumed scheduler (last_epoch >= 0) finds these values in the
        # groups, from the optimizer's state; torch then leaves them as they are, and so does this.
        if last_epoch == -1:
            for group, top in zip(optimizer.param_groups, max_lrs):
                group["initial_lr"] = top / div_factor  # overwritten, as torch's: the cycle starts here
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
            if cycle_momentum:
                for group, high, low in zip(optimizer.param_groups, max_momentums, base_momentums):
                    set_momentum(group, high, use_beta1)
                    group["max_momentum"] = high
                    group["base_momentum"] = low
        self.total_steps = total_steps
        # torch's names for these two, so that a torch OneCycleLR's state_dict loads here
        self._schedule_phases = _cycle_phases(total_steps, pct_start, three_phase)
        self._anneal_func_type = anneal_strategy
        self.cycle_momentum = cycle_momentum
        self.use_beta1 = use_beta1
        super().__init__(optimizer, last_epoch)

    def _at(self, group: dict[str, Any], step: int) -> tuple[float, float | None]:
        """(lr, momentum or None) of `group` at `step` of the cycle, from its phase's start and end values."""
        anneal = _anneal_cos if self._anneal_func_type == "cos" else _anneal_linear
        start_step = 0.0
        last = len(self._schedule_phases) - 1
        for i, phase in enumerate(self._schedule_phases):
            end_step = phase["end_step"]
            if step <= end_step or i == last:
                # Only the last phase can have no length when its step comes (torch divides by zero there).
                pct = (step - start_step) / (end_step - start_step) if end_step != start_step else 1.0
                lr = anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                if not self.cycle_momentum:
                    return lr, None
                return lr, anneal(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
            start_step = end_step
        raise AssertionError("unreachable: the last phase takes every step")

    def _check_groups(self) -> None:
        """KeyError naming a group that lacks a value the cycle reads: a group added after this scheduler was built
        without them, or a resume (last_epoch=k) before the optimizer's state was loaded."""
        needed = ["initial_lr", "max_lr", "min_lr"]
        if self.cycle_momentum:
            needed += ["max_momentum", "base_momentum", "betas" if self.use_beta1 else "momentum"]
        for i, group in enumerate(self.optimizer.param_groups):
            missing = [k for k in needed if k not in group]
            if missing:
                raise KeyError(f"OneCycleLR: param_groups[{i}] has no {', '.join(missing)}. A group added after the "
                               f"scheduler was built needs them (or build the OneCycleLR after adding it); resuming "
                               f"with last_epoch={self.last_epoch} needs the optimizer's state_dict loaded first")

    def _adopt_added_groups(self) -> None:
        self._check_groups()  # before the base class adopts anything
        super()._adopt_added_groups()

    def get_lr(self) -> list[float]:
        """The lr of every group at `last_epoch` of the cycle (pure: steps and sets nothing, momentum included)."""
        self._check_groups()
        return [self._at(group, self.last_epoch)[0] for group in self.optimizer.param_groups]

    def _update_lr(self, epoch: int | None = None, *, initial: bool = False) -> None:
        """The lrs (and momentums) of the next step of the cycle, or of step `epoch` (a SequentialLR milestone
        restarts the cycle at 0); the same whatever the groups' lrs were."""
        step = self.last_epoch + 1 if epoch is None else epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: tried to step {step} times; the specified number of total steps is "
                             f"{self.total_steps}. Build it with total_steps (or epochs * steps_per_epoch) covering "
                             f"every scheduler.step() of the run")
        self._adopt_added_groups()
        values = [self._at(group, step) for group in self.optimizer.param_groups]
        self.last_epoch = step
        if self.cycle_momentum:
            for group, (_, momentum) in zip(self.optimizer.param_groups, values):
                set_momentum(group, momentum, self.use_beta1)
        self._set_lrs([lr for lr, _ in values])

    def _resume(self) -> None:
        """Built with last_epoch=k: step k + 1 of the cycle from the groups' values (no replay: it is not chainable)."""
        self._step_count = 1
        self._update_lr()
