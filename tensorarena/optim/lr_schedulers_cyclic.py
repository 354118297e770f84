"""CyclicLR with torch.optim.lr_scheduler semantics: each group's lr cycles between base_lr and max_lr, its
momentum the other way (Smith's cyclical learning rates).

As the schedules of lr_scheduler.py and lr_schedulers_more.py, the lrs and momentums are torch's bit for bit: the
same float operations in the same order. Its state_dict() holds torch's keys, so a torch CyclicLR's state loads
here; load_state_dict is all or nothing. Where torch fails or its result depends on how it was reached, the class
says what it does instead.
"""

from __future__ import annotations

import math
import types
from typing import Any, Callable, Sequence

from .lr_scheduler import LRScheduler, _check_float, _check_int
from .lr_schedulers_metric import _check_group_count, _public_state
from .lr_schedulers_more import _check_bool, per_group, set_momentum
from .optimizer import Optimizer

__all__ = ["CyclicLR"]

_CYCLIC_MODES = ("triangular", "triangular2", "exp_range")
_SCALE_MODES = ("cycle", "iterations")


class CyclicLR(LRScheduler):
    """The lr of each group goes from base_lr up to max_lr over `step_size_up` steps and back down over
    `step_size_down` (default: as many), again and again (torch's CyclicLR; step it after every batch). The
    height of the cycle is scaled by mode "triangular" (1: every cycle the same), "triangular2" (halved each
    cycle) or "exp_range" (gamma ** steps), or by `scale_fn(x)`, x the cycle number (scale_mode "cycle", from 1) or
    the step count ("iterations"). With cycle_momentum the momentum (SGD's, RMSprop's group['momentum']; the Adam
    family's group['betas'][0], kept a tuple) goes the other way, from max_momentum down to base_momentum.

    As torch's, construction (last_epoch=-1) sets each group's lr to its base_lr, and with cycle_momentum its
    momentum to max_momentum and its `max_momentum` and `base_momentum` keys. The lrs come from the cycle alone
    (not chainable): an lr edited by hand lasts one step. Inside SequentialLR the cycle starts at its milestone.
    state_dict() holds torch's keys; a scale_fn that is a plain function is saved as None, a callable object as a
    copy of its attributes (restored into this scheduler's object by load_state_dict), as torch's.

    Differences from torch, where it fails or its result depends on how it was reached:
    - built after another scheduler (a group's initial_lr already set), torch's first lr is that initial_lr and
      its later ones the cycle's; here every lr is the cycle's, from base_lr;
    - step_size_up must be an integer >= 1 (torch divides by zero at 0) and step_size_down one >= 0 (0: a
      sawtooth); base_lr, max_lr finite >= 0; momentums in [0, 1]; gamma in (0, 1] (above 1, torch's gamma ** x
      overflows to an OverflowError within a run); scale_fn must be callable and scale_mode "cycle" or
      "iterations" (torch takes any other word as "iterations");
    - "triangular2" halves the height exactly as torch's 1 / 2 ** (cycle - 1) but goes on past cycle 1024,
      where torch's power overflows;
    - a group added with add_param_group has no base_lr or max_lr: a ValueError at the next step, before anything
      changes (torch fails too, with zip()'s "argument 2 is shorter");
    - `scale_fn` is called once per step (torch calls it for each group's lr and momentum): it should be pure.
    """

    def __init__(self, optimizer: Optimizer, base_lr: float | Sequence[float], max_lr: float | Sequence[float],
                 step_size_up: int = 2000, step_size_down: int | None = None, mode: str = "triangular",
                 gamma: float = 1.0, scale_fn: Callable[[float], float] | None = None, scale_mode: str = "cycle",
                 cycle_momentum: bool = True, base_momentum: float | Sequence[float] = 0.8,
                 max_momentum: float | Sequence[float] = 0.9, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        last_epoch = _check_int("last_epoch", last_epoch, -1)
        base_lrs = per_group("CyclicLR", "base_lr", optimizer, base_lr, 0.0)
        max_lrs = per_group("CyclicLR", "max_lr", optimizer, max_lr, 0.0)
        up = _check_int("step_size_up", step_size_up, 1)
        down = up if step_size_down is None else _check_int("step_size_down", step_size_down, 0)
        if scale_fn is None:
            if mode not in _CYCLIC_MODES:
                raise ValueError(f"CyclicLR: mode must be one of {_CYCLIC_MODES} when no scale_fn is given, "
                                 f"got {mode!r}")
        elif not callable(scale_fn):
            raise TypeError(f"CyclicLR: scale_fn must be a function of the cycle or step count, got a "
                            f"{type(scale_fn).__name__}")
        if scale_mode not in _SCALE_MODES:
            raise ValueError(f"CyclicLR: scale_mode must be 'cycle' or 'iterations', got {scale_mode!r}")
        gamma = _check_float("gamma", gamma, 0.0, 1.0, low_open=True)
        cycle_momentum = _check_bool("cycle_momentum", cycle_momentum)
        use_beta1 = False
        if cycle_momentum:
            if "betas" not in optimizer.defaults and "momentum" not in optimizer.defaults:
                raise ValueError(f"CyclicLR with cycle_momentum=True needs an optimizer with a momentum or betas "
                                 f"setting; {type(optimizer).__name__} has neither: pass cycle_momentum=False")
            use_beta1 = "betas" in optimizer.defaults
            base_momentums = per_group("CyclicLR", "base_momentum", optimizer, base_momentum, 0.0, 1.0)
            max_momentums = per_group("CyclicLR", "max_momentum", optimizer, max_momentum, 0.0, 1.0)

        # Everything checked: now the groups (a resumed scheduler finds them in the optimizer's state, as torch's).
        if last_epoch == -1:
            for group, lr in zip(optimizer.param_groups, base_lrs):
                group["lr"] = lr
            if cycle_momentum:
                for group, high, low in zip(optimizer.param_groups, max_momentums, base_momentums):
                    set_momentum(group, high, use_beta1)
                    group["max_momentum"] = high
                    group["base_momentum"] = low
        # torch's attributes: state_dict() has its keys (the step sizes are kept as total_size and step_ratio,
        # computed as torch computes them, since every lr is interpolated from them)
        self.max_lrs = max_lrs
        self.total_size = float(up) + float(down)
        self.step_ratio = float(up) / self.total_size
        self.mode = mode
        self.gamma = gamma
        self._scale_fn_custom = scale_fn
        # a built-in mode has its own: the halving per cycle, the decay per step
        self.scale_mode = scale_mode if scale_fn is not None else ("iterations" if mode == "exp_range" else "cycle")
        self.cycle_momentum = cycle_momentum
        self.use_beta1 = use_beta1
        if cycle_momentum:
            self.base_momentums = base_momentums
            self.max_momentums = max_momentums
        super().__init__(optimizer, last_epoch)
        # The base class stepped to the first epoch from the groups' initial_lr, which a scheduler built before this
        # one may have set to another lr; the cycle runs from base_lr (torch's base_lrs too, once built).
        self.base_lrs = base_lrs
        self._set_lrs(self.get_lr())

    def _scale(self, x: int) -> float:
        """The cycle's height factor at cycle number or step count `x`."""
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            # Powers of two, exact: torch's 1 / 2.0 ** (x - 1) bit for bit, without its OverflowError past 1024.
            return 0.5 ** (x - 1)
        return self.gamma**x  # exp_range; gamma <= 1, so no overflow

    def _at(self, epoch: int) -> tuple[list[float], list[float] | None]:
        """(lrs, momentums or None) of every group at step `epoch` of the cycle (torch's float operations)."""
        cycle = math.floor(1 + epoch / self.total_size)
        x = 1.0 + epoch / self.total_size - cycle  # where in its cycle, in [0, 1)
        if x <= self.step_ratio:
            factor = x / self.step_ratio  # rising
        else:
            factor = (x - 1) / (self.step_ratio - 1)  # falling; step_ratio < 1 here
        scale = self._scale(cycle if self.scale_mode == "cycle" else epoch)
        lrs = [low + (high - low) * factor * scale for low, high in zip(self.base_lrs, self.max_lrs)]
        if not self.cycle_momentum:
            return lrs, None
        return lrs, [high - (high - low) * factor * scale for low, high in zip(self.base_momentums, self.max_momentums)]

    def _adopt_added_groups(self) -> None:
        """A group added since (add_param_group) has no base_lr or max_lr: refused before anything changes."""
        self._check_base_lrs(self.base_lrs)
        added = len(self.optimizer.param_groups) - len(self.base_lrs)
        if added > 0:
            raise ValueError(f"CyclicLR has base_lr and max_lr for {len(self.base_lrs)} param groups, and {added} "
                             f"group(s) were added since (optimizer.add_param_group), which have none; build the "
                             f"CyclicLR after adding the groups")

    def get_lr(self) -> list[float]:
        """The lr of every group at `last_epoch` of the cycle (pure: steps and sets nothing, momentum included)."""
        return self._at(self.last_epoch)[0]

    def _update_lr(self, epoch: int | None = None, *, initial: bool = False) -> None:
        """The lrs (and momentums) of the next step of the cycle, or of step `epoch` (a SequentialLR milestone
        restarts the cycle at 0); the same whatever the groups' lrs were."""
        self._adopt_added_groups()
        step = self.last_epoch + 1 if epoch is None else epoch
        lrs, momentums = self._at(step)  # before anything changes: a user's scale_fn may raise
        self.last_epoch = step
        if momentums is not None:
            for group, momentum in zip(self.optimizer.param_groups, momentums):
                set_momentum(group, momentum, self.use_beta1)
        self._set_lrs(lrs)

    def _resume(self) -> None:
        """Built with last_epoch=k: step k + 1 of the cycle (no replay: it is not chainable)."""
        self._step_count = 1
        self._update_lr()

    def state_dict(self) -> dict[str, Any]:
        """torch's format: a plain-function scale_fn as None, a callable object's as a copy of its attributes."""
        state = {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()
                 if k not in ("optimizer", "_scale_fn_custom")}
        fn = self._scale_fn_custom
        keep = fn is not None and not isinstance(fn, types.FunctionType) and hasattr(fn, "__dict__")
        state["_scale_fn_custom"] = dict(fn.__dict__) if keep else None
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (torch's CyclicLR's state too), all checked before anything changes;
        the scale_fn object (if any) takes the saved attributes."""
        state = _public_state(self, state_dict, skip=("_scale_fn_custom",))
        attrs = state_dict.get("_scale_fn_custom")
        fn = self._scale_fn_custom
        if attrs is not None and (not isinstance(attrs, dict) or not hasattr(fn, "__dict__")):
            raise ValueError(f"CyclicLR state holds scale_fn attributes {attrs!r}, which this CyclicLR's scale_fn "
                             f"({type(fn).__name__}) cannot take; build it with the saved run's scale_fn object")
        if fn is None and state.get("mode", self.mode) not in _CYCLIC_MODES:
            raise ValueError(f"CyclicLR state has mode {state['mode']!r} (a custom scale_fn's run?) and this "
                             f"CyclicLR has no scale_fn; build it with the saved run's scale_fn")
        if state.get("scale_mode", self.scale_mode) not in _SCALE_MODES:
            raise ValueError(f"CyclicLR state: scale_mode must be 'cycle' or 'iterations', got {state['scale_mode']!r}")
        lengths = {k: len(state.get(k, getattr(self, k, []))) for k in ("base_lrs", "max_lrs", "base_momentums",
                                                                        "max_momentums") if hasattr(self, k)}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"CyclicLR state: its per-group lists differ in length: {lengths}")
        _check_group_count(self, lengths["base_lrs"], "base lrs")
        self.__dict__.update(state)
        if attrs is not None:
            fn.__dict__.update(attrs)
