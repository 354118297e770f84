"""Module: torch.nn.Module semantics, found by walking attributes instead of registering them.

A `Parameter` attribute is a parameter, a `Module` attribute is a child, and a list or
tuple of Modules (or of Parameters) is a child container named by index, as torch's
ModuleList/ParameterList would be. Attribute definition order gives the order of
`named_parameters()` and `state_dict()`, with each module's own parameters before its
children's, exactly as in torch, so checkpoints exchange with the same torch model.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from ..device import check_cpu
from ..autograd import increment_version
from ..memory.arena import heap_scope
from ..tensor import SUPPORTED_FLOATS, Tensor
from .parameter import Parameter


class IncompatibleKeys(NamedTuple):
    """What `load_state_dict(strict=False)` did not match."""

    missing_keys: list[str]
    unexpected_keys: list[str]


_MISSING = object()
# module -> {attribute: (the plain list or dict it holds, the container view it is walked through)}: Module._held_view.
# Outside the module's __dict__, which the walkers, the fused route's watchers and pickling read; weak, so a module
# that goes away takes its views along.
_HELD_VIEWS: "weakref.WeakKeyDictionary[Module, dict[str, tuple[Any, Module]]]" = weakref.WeakKeyDictionary()


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _check_name(name: Any, what: str) -> None:
    """torch's rules for a registered name: a non-empty string without '.' (a dot would break the dotted paths)."""
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be a string, got {type(name).__name__} {name!r}")
    if not name:
        raise KeyError(f'{what} name can\'t be empty string ""')
    if "." in name:
        raise KeyError(f'{what} name can\'t contain ".", got {name!r}: dots separate the parts of a state_dict key')


def _as_array(value: Any) -> np.ndarray:
    """An ndarray view of a checkpoint value: ndarray, Tensor, or anything with .numpy() (torch)."""
    if isinstance(value, Tensor):
        return value.data
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "numpy"):  # torch tensors: may need detaching / moving to the CPU first
        if hasattr(value, "detach"):
            value = value.detach()
        if hasattr(value, "cpu"):
            value = value.cpu()
        try:
            return np.asarray(value.numpy())
        except TypeError:
            # NumPy has no bfloat16 (torch: "Got unsupported ScalarType BFloat16"); float32 holds every
            # bfloat16 value exactly, and the copy into the model casts from there as torch's copy_ does.
            if hasattr(value, "float"):
                return np.asarray(value.float().numpy())
            raise
    return np.asarray(value)


def _beyond_range(src: np.ndarray, dst_dtype: np.dtype) -> tuple[float, float] | None:
    """(lowest, highest) finite value of `src` when some lie beyond `dst_dtype`'s finite range, else None.

    Only a narrowing float cast (float64 -> float32) can overflow; min/max read the array without a copy.
    """
    if dst_dtype.kind != "f" or src.dtype.kind != "f" or src.dtype.itemsize <= dst_dtype.itemsize or not src.size:
        return None
    lo, hi = src.min(), src.max()
    if not (np.isfinite(lo) and np.isfinite(hi)):
        finite = src[np.isfinite(src)]  # a checkpoint holding inf or NaN: only then the copy of its finite values
        if not finite.size:
            return None
        lo, hi = finite.min(), finite.max()
    big = np.finfo(dst_dtype).max
    return (float(lo), float(hi)) if hi > big or lo < -big else None


def _buffer_value(name: str, value: Any) -> Any:
    """What a buffer's attribute may hold: an ndarray, a (non-Parameter) Tensor or None, as torch's buffers.

    A NumPy scalar is what arithmetic on a 0-d buffer gives (running = 0.9 * running + x): kept as a 0-d array,
    so state_dict and load_state_dict treat it as the array it was.
    """
    if isinstance(value, Tensor) and value._arena is not None:
        # A buffer is state kept across steps, and the step's arena is reset when the step ends: a tensor computed
        # in forward (self.ema = 0.9 * self.ema + 0.1 * out.detach().mean(0), torch's idiom) was read stale at the
        # next step. A copy on the heap, in the graph still (clone), as torch keeps the tensor itself.
        with heap_scope():
            return value.clone()
    if value is None or isinstance(value, (np.ndarray, Tensor)):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    raise TypeError(f"cannot assign a {type(value).__name__} as buffer {name!r} (an ndarray, a Tensor or None "
                    f"expected); to keep a plain value, delete the buffer first (del module.{name})")


_WRAP_FORWARD = ("wrap the forward instead: a subclass whose forward calls super().forward(...) with your code around "
                 "it (the Trainer's fused route then keeps its Python replay, which runs that code every step; keep "
                 "copies, .numpy(), of tensors you store), or return what you want to see from forward. The "
                 "streaming route runs a model's stream_stages(), never its forward, so it refuses such a subclass "
                 "(route='auto' then picks eager or fused) unless the subclass overrides stream_stages() too")
_READ_GRADS = ("read the gradients after backward instead (p.grad, or retain_grad() on an output you keep), or "
               "change them between backward and optimizer.step() in a training loop of your own")
_EDIT_DICT = "change the dict that state_dict() returns, or the one you pass to load_state_dict(), yourself"


def _refused_hook(name: str, instead: str) -> Callable:
    """Module's method `name` (a torch register_*_hook), raising NotImplementedError that says what to do instead."""
    def refuse(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}.{name}: tensorarena's modules do not support hooks; "
                                  f"{instead}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = "Refused: tensorarena's modules do not support hooks (the NotImplementedError says why)."
    return refuse


def _addindent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    return lines[0] if len(lines) == 1 else "\n".join([lines[0]] + [" " * spaces + ln for ln in lines[1:]])


# torch's device names, told apart from dtype names in Module.to's positional arguments
_DEVICE_NAMES = ("cpu", "cuda", "mps", "xpu", "meta", "hip", "xla", "privateuseone")

class Module:
    """Base class for layers and models; subclasses set attributes in __init__ and define forward."""

    training: bool = True  # class default so a subclass that forgets super().__init__() still works
    _walk_skip: tuple[str, ...] = ()  # attributes the walker must not look into (container storage)

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_buffers", {})  # name -> persistent; values live as plain attributes

    # -- attribute walking -----------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        # Lists (dicts) of modules become a ModuleList (ModuleDict) now, so the container has a stable
        # identity (modules(), train(), repr) and the same dotted names as torch's containers.
        if isinstance(value, (list, tuple, dict)) and value and name not in self._walk_skip:
            value = containers.container_for(name, value, value)
        own = vars(self)
        buffers = own.get("_buffers", {})
        current = own.get(name, _MISSING)
        # What the name is a slot for, kept when it holds None (Linear(bias=False), `lin.bias = None`), as torch's
        # _parameters/_modules keep a None entry: a plain tensor assigned to an empty parameter slot was taken as a
        # plain attribute, which forward used but nothing trained or saved.
        slot = own.get("_slots", {}).get(name)
        if isinstance(value, (Parameter, Module)):
            kind = "parameter" if isinstance(value, Parameter) else "module"
            _check_name(name, kind)  # torch's KeyError: a dotted name dropped out of state_dict
            buffers.pop(name, None)  # as in torch, a parameter or module takes the name over from a buffer
            if isinstance(value, Parameter) and value.is_deferred:  # its errors name it (nn/deferred.py)
                value._arena.label = f"parameter {name!r} of a {type(self).__name__}"
            same_kind = isinstance(current, Parameter if kind == "parameter" else Module) or slot == kind
            if current is not _MISSING and not same_kind:
                # Registered now, so last among its kind, as torch's: a name first set to None (a plain attribute)
                # or a buffer kept its early place, and parameters()/state_dict came in another order than the
                # torch twin's (its optimizer state loaded by index went to the wrong parameters).
                object.__delattr__(self, name)
            self._note_slot(name, kind)
        elif name in buffers:
            value = _buffer_value(name, value)
        elif value is not None and (isinstance(current, Parameter) or slot == "parameter"):
            # Silently replacing it would drop the parameter from parameters(), state_dict and the optimizer.
            raise TypeError(f"cannot assign a {type(value).__name__} as parameter {name!r} (a Parameter or None "
                            f"expected); to change its values write into it (module.{name}.data[...] = ...) or "
                            f"assign nn.Parameter(value)")
        elif value is not None and (isinstance(current, Module) or slot == "module"):
            raise TypeError(f"cannot assign a {type(value).__name__} as child module {name!r} (a Module or None "
                            f"expected): its parameters would silently leave the model; delete it first "
                            f"(del module.{name}) to reuse the name for something else")
        object.__setattr__(self, name, value)

    def _note_slot(self, name: str, kind: str) -> None:
        if "_slots" not in vars(self):
            object.__setattr__(self, "_slots", {})
        self._slots[name] = kind

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        vars(self).get("_buffers", {}).pop(name, None)  # a deleted buffer is forgotten, as in torch
        vars(self).get("_slots", {}).pop(name, None)  # and so is a deleted parameter or module slot

    def _own_parameters(self) -> Iterator[tuple[str, Parameter]]:
        for name, value in vars(self).items():
            if isinstance(value, Parameter) and name not in self._walk_skip:
                yield name, value

    def _own_children(self) -> Iterator[tuple[str, "Module"]]:
        for name, value in vars(self).items():
            if name in self._walk_skip:
                continue
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple, dict)) and value:
                # A list (dict) that was empty when assigned and filled later: wrapped on the fly (checked on every
                # walk), the same view each time.
                wrapped = containers.container_for(name, value, None)
                if wrapped is not None:
                    yield name, self._held_view(name, value, wrapped)

    def _held_view(self, name: str, held: Any, fresh: "Module") -> "Module":
        """The view this module walked its attribute `name` holding `held` through before, else `fresh`, kept.

        One view per held list (dict), as torch's ModuleList is one object: a new view on each walk was in training
        mode after eval() (the view eval() set was gone; `any(m.training for m in model.modules())` said True), and
        get_submodule('blocks') gave another object each call, so what apply() set on it was lost.
        """
        views = _HELD_VIEWS.setdefault(self, {})
        then = views.get(name)
        if then is not None and then[0] is held and type(then[1]) is type(fresh):
            return then[1]
        # A view made after train()/eval() ran (the first walk of a list filled later, a deepcopy) starts in the
        # mode they set, the owner's, as the container torch made at assignment would be in.
        fresh.training = self.training
        views[name] = (held, fresh)
        return fresh

    def _own_buffers(self) -> Iterator[tuple[str, np.ndarray | Tensor]]:
        for name in vars(self).get("_buffers", {}):
            value = getattr(self, name, None)
            if value is not None:
                yield name, value

    def _check_free(self, name: str, what: str, allowed) -> None:
        # torch's KeyError "attribute 'x' already exists": registering must never silently replace a
        # parameter, a child module or a plain attribute (a method included) of another kind.
        current = getattr(self, name, _MISSING)
        if current is _MISSING or allowed(current):
            return
        raise KeyError(f"attribute '{name}' already exists ({type(current).__name__}); register the {what} under "
                       f"another name, or delete the attribute first (del module.{name})")

    def register_buffer(self, name: str, value: np.ndarray | Tensor | None, persistent: bool = True) -> None:
        """Attach non-trainable state (e.g. running statistics); persistent buffers go in state_dict."""
        _check_name(name, "buffer")
        self._check_free(name, "buffer", lambda _: name in vars(self).get("_buffers", {}))
        if value is not None and not isinstance(value, (np.ndarray, Tensor)):
            raise TypeError(f"buffer {name!r} must be an ndarray, a Tensor or None, got {type(value).__name__}")
        if isinstance(value, Parameter):
            raise TypeError(f"buffer {name!r} is a Parameter; assign it as an attribute to make it a parameter")
        if "_buffers" not in vars(self):
            object.__setattr__(self, "_buffers", {})
        self._buffers[name] = persistent
        object.__setattr__(self, name, _buffer_value(name, value))

    def _unset_slot(self, name: str, current: Any) -> bool:
        # A None attribute that is not a buffer may be an empty parameter or module slot (Linear(bias=False)).
        return current is None and name in vars(self) and name not in vars(self).get("_buffers", {})

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add a parameter (or an empty slot: None) under `name`, as torch's register_parameter."""
        _check_name(name, "parameter")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign a {type(param).__name__} as parameter {name!r} (a Parameter or None "
                            f"expected); wrap it: nn.Parameter(value)")
        self._check_free(name, "parameter", lambda cur: isinstance(cur, Parameter) or self._unset_slot(name, cur))
        self._note_slot(name, "parameter")
        object.__setattr__(self, name, param)

    def add_module(self, name: str, module: "Module | None") -> None:
        """Add a child module (or an empty slot: None) under `name`, as torch's add_module."""
        _check_name(name, "module")
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"cannot assign a {type(module).__name__} as child module {name!r} (a Module or None "
                            f"expected)")
        self._check_free(name, "module", lambda cur: isinstance(cur, Module) or self._unset_slot(name, cur))
        self._note_slot(name, "module")
        object.__setattr__(self, name, module)

    def register_module(self, name: str, module: "Module | None") -> None:
        """Same as add_module."""
        self.add_module(name, module)

    # -- lookup by dotted name (nn/module_lookup.py) ---------------------------------------
    def get_submodule(self, target: str) -> "Module":
        """The module at dotted path `target` ('' is this one); AttributeError naming the part that is missing."""
        return module_lookup.get_submodule(self, target)

    def set_submodule(self, target: str, module: "Module", strict: bool = False) -> None:
        """Put `module` at dotted path `target`, replacing the one there in place; with `strict`, only replacing."""
        module_lookup.set_submodule(self, target, module, strict)

    def get_parameter(self, target: str) -> Parameter:
        """The parameter at dotted path `target`; AttributeError naming the part that is missing."""
        return module_lookup.get_parameter(self, target)

    def get_buffer(self, target: str) -> Any:
        """The buffer at dotted path `target` (non-persistent ones too); AttributeError naming the missing part."""
        return module_lookup.get_buffer(self, target)

    def __dir__(self) -> list[str]:
        # A container's entries are no attributes in __dict__ (a ModuleDict's keys live in its _entries) but are
        # reached as attributes: listed, as torch's dir() lists every registered name except indices ('0').
        names = set(super().__dir__())
        names.update(name for name, _ in self._own_children())
        names.update(name for name, _ in self._own_parameters())
        return sorted(name for name in names if not name[:1].isdigit())

    # -- traversal ---------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """Direct submodules with their attribute names (index for list entries)."""
        # The modules themselves, not their id()s: a list filled after it was assigned is walked through a view made
        # on the fly, and a freed view's id() was handed to the next one, which was then skipped as a duplicate
        # (its parameters missing from parameters(), so never trained).
        seen: set[Module] = set()
        for name, child in self._own_children():
            if child not in seen:
                seen.add(child)
                yield name, child

    def children(self) -> Iterator["Module"]:
        """Direct submodules."""
        for _, child in self.named_children():
            yield child

    def named_modules(self, memo: set["Module"] | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, "Module"]]:
        """This module and all below it, depth first, with dotted names ('' for self). `memo` holds the modules seen
        (as torch's), not their id()s: see named_children."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if self in memo:
                return
            memo.add(self)
        yield prefix, self
        for name, child in self._own_children():
            yield from child.named_modules(memo, _join(prefix, name), remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        """This module and all below it."""
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs in torch's order; a shared parameter appears once."""
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        seen: set[int] = set()
        for mod_prefix, module in modules:
            for name, p in module._own_parameters():
                if remove_duplicate:
                    if id(p) in seen:
                        continue
                    seen.add(id(p))
                yield _join(mod_prefix, name), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Every parameter once, in named_parameters order."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, np.ndarray | Tensor]]:
        """(dotted name, buffer) pairs; a buffer registered in several modules appears once (as in torch)."""
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        seen: set[int] = set()
        for mod_prefix, module in modules:
            for name, b in module._own_buffers():
                if remove_duplicate:
                    if id(b) in seen:
                        continue
                    seen.add(id(b))
                yield _join(mod_prefix, name), b

    def buffers(self, recurse: bool = True) -> Iterator[np.ndarray | Tensor]:
        """Every buffer."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def num_parameters(self, *, trainable_only: bool = False) -> int:
        """Number of scalar parameters (shared ones counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        """Call fn on every submodule (children first) and then on self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # -- modes and gradients ---------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """Set training mode here and in every submodule (affects Dropout and the like)."""
        if not isinstance(mode, bool):
            raise ValueError(f"train(mode) expects a bool, got {type(mode).__name__}")
        # Each child's own train(), as torch: a submodule that overrides it (to keep a part in eval mode) is obeyed.
        self.training = mode
        for child in self.children():
            child.train(mode)
        return self

    def eval(self) -> "Module":
        """Same as train(False)."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Turn gradient recording on or off for every parameter."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (default) or zero every parameter's gradient. A dropped gradient the caller still holds keeps its
        values, as in torch (Tensor._release_grad)."""
        for p in self.parameters():
            if set_to_none:
                p._release_grad()
            elif p.grad is not None:
                p.grad[...] = 0

    # -- calling ------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # torch's module hooks, refused: the fused route records a step's calls once and replays only those, so a
    # hook's Python would silently stop running after the first steps (state_dict hooks are not offered either).
    # Methods that raise, not missing attributes: the message reaches containers too, whose __getattr__ would
    # replace an AttributeError's with its own.
    register_forward_hook = _refused_hook("register_forward_hook", _WRAP_FORWARD)
    register_forward_pre_hook = _refused_hook("register_forward_pre_hook", _WRAP_FORWARD)
    register_full_backward_hook = _refused_hook("register_full_backward_hook", _READ_GRADS)
    register_full_backward_pre_hook = _refused_hook("register_full_backward_pre_hook", _READ_GRADS)
    register_backward_hook = _refused_hook("register_backward_hook", _READ_GRADS)
    register_state_dict_pre_hook = _refused_hook("register_state_dict_pre_hook", _EDIT_DICT)
    register_state_dict_post_hook = _refused_hook("register_state_dict_post_hook", _EDIT_DICT)
    register_load_state_dict_pre_hook = _refused_hook("register_load_state_dict_pre_hook", _EDIT_DICT)
    register_load_state_dict_post_hook = _refused_hook("register_load_state_dict_post_hook", _EDIT_DICT)

    def materialize(self) -> "Module":
        """Make the values of every parameter built under nn.deferred_init(), in memory: exactly those an eager
        build with the same generator state holds (nn/deferred.py). Parameters with values are left alone."""
        from .deferred import name_deferred

        name_deferred(self)
        for p in self.parameters():
            p.materialize()
        return self

    # -- dtype -------------------------------------------------------------------------
    def to(self, *args, dtype=None, device=None, non_blocking: bool = False) -> "Module":
        """Convert parameters (and floating buffers) to float32 or float64, keeping the Parameter objects. A deferred
        parameter (nn.deferred_init) stays deferred: made later, it holds its eager build's values cast to dtype.
        torch's forms: to(dtype), to(device), to(device, dtype), keywords; the device must be the CPU (a
        ported `model.to(device)` with device "cpu" changes nothing)."""
        for arg in args:
            if isinstance(arg, str) and arg.split(":")[0] in _DEVICE_NAMES or type(arg).__name__ == "device":
                device = arg
            else:
                dtype = arg
        check_cpu(device, "Module.to", then="; nothing was converted")
        if dtype is None:  # torch's module.to(None) changes nothing (np.dtype(None) would be float64)
            return self
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"Module.to takes a NumPy floating dtype (np.float32, np.float64 or their names), got "
                            f"{dtype!r}; tensorarena runs on the CPU, so there is no device to move to") from None
        if dt not in SUPPORTED_FLOATS:
            raise TypeError(f"Module.to supports float32 and float64, got {dt}")
        for p in self.parameters():
            if p.dtype.kind != "f":  # as torch's: an integer parameter (a frozen index table) keeps its dtype
                continue
            if p.dtype != dt and p.is_deferred:  # no values to cast yet: they are made in dt (nn/deferred.py)
                p.defer_as(dt)
            elif p.dtype != dt:
                p.data = p.data.astype(dt)
                if p.grad is not None:
                    p.grad = p.grad.astype(dt)
        for module in self.modules():
            for name, b in module._own_buffers():
                arr = b.data if isinstance(b, Tensor) else b
                if arr.dtype.kind == "f" and arr.dtype != dt:
                    if isinstance(b, Tensor):
                        b.data = arr.astype(dt)
                    else:
                        object.__setattr__(module, name, arr.astype(dt))
        return self

    def double(self) -> "Module":
        """Parameters to float64."""
        return self.to(np.float64)

    def float(self) -> "Module":
        """Parameters to float32."""
        return self.to(np.float32)

    def half(self) -> "Module":
        """Refused: tensorarena's kernels have no float16 parameters."""
        raise TypeError("half(): tensorarena has no float16 parameters; a Module is float32 or float64 "
                        "(.float() or .double()); nothing was converted")

    def bfloat16(self) -> "Module":
        """Refused: tensorarena's kernels have no bfloat16 parameters."""
        raise TypeError("bfloat16(): tensorarena has no bfloat16 parameters; a Module is float32 or float64 "
                        "(.float() or .double()); for bfloat16's speed, float32 matmuls can round their inputs "
                        "to it: ta.set_float32_matmul_precision('bfloat16'); nothing was converted")

    def cpu(self) -> "Module":
        """This module, unchanged: tensorarena keeps everything in the CPU's memory (torch's cpu() is a move)."""
        return self

    # -- checkpoints ------------------------------------------------------------------
    def _state_entries(self, prefix: str = "") -> Iterator[tuple[str, "Module", str, Any]]:
        # torch's order: own parameters, own persistent buffers, then each child; shared
        # tensors keep one key per path, as torch's state_dict does.
        for name, p in self._own_parameters():
            yield _join(prefix, name), self, name, p
        persistent = vars(self).get("_buffers", {})
        for name, b in self._own_buffers():
            if persistent.get(name, True):
                yield _join(prefix, name), self, name, b
        for name, child in self._own_children():
            yield from child._state_entries(_join(prefix, name))

    def state_dict(self, *, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Any:
        """Name -> copy of each parameter and persistent buffer (the objects themselves if keep_vars), in a new
        OrderedDict or put into `destination` (a dict) and returned, as torch's. `prefix` is put before each name
        as it is, as torch's: prefix="enc." gives "enc.weight"."""
        out = OrderedDict() if destination is None else destination
        for key, _, _, value in self._state_entries():
            if keep_vars:
                out[prefix + key] = value
            else:
                out[prefix + key] = (value.data if isinstance(value, Tensor) else value).copy()
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False) -> IncompatibleKeys:
        """Copy values into the existing arrays in place (identity and addresses kept), casting dtype.

        All problems are collected first and reported in one RuntimeError, and nothing is
        copied unless everything fits. strict=False tolerates missing and unexpected keys
        (returned) but never a shape mismatch. assign=True: the model takes the checkpoint's arrays
        themselves, in their dtype, with no copy; the Parameter objects stay (nn/module_assign.py).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict expects a mapping of key -> array (a dict, as state_dict() returns), "
                            f"got a {type(state_dict).__name__}")
        entries = list(self._state_entries())
        expected = {key for key, *_ in entries}
        missing, mismatched, copies = [], [], []
        assigned = []  # (key, owning module, attribute name, target, array) with assign=True
        for key, owner, name, target in entries:
            if key not in state_dict:
                missing.append(key)
                continue
            dst = None if assign else (target.data if isinstance(target, Tensor) else target)
            src = _as_array(state_dict[key])
            if src.dtype.kind not in "biufc":  # None, a string, an object: no shape to compare
                mismatched.append(f"value for {key} is a {type(state_dict[key]).__name__}, not an array of numbers")
            elif assign:  # the array itself becomes the model's, so it is kept (the model will hold it anyway)
                problem = module_assign.check(key, target, state_dict[key], src)
                if problem:
                    mismatched.append(problem)
                else:
                    assigned.append((key, owner, name, target, src))
            elif src.shape != dst.shape:
                mismatched.append(f"size mismatch for {key}: copying a value with shape {tuple(src.shape)} "
                                  f"from the checkpoint, the shape in the current model is {tuple(dst.shape)}")
            elif not np.can_cast(src.dtype, dst.dtype, casting="same_kind"):
                mismatched.append(f"dtype mismatch for {key}: cannot cast the checkpoint's {src.dtype} "
                                  f"to the model's {dst.dtype}")
            elif not dst.flags.writeable:  # checked now: np.copyto would fail after earlier keys were copied
                mismatched.append(f"{key} is read-only in the model (a broadcast view or a constant), so it cannot "
                                  f"be loaded into; give the module a writable array for it")
            elif (span := _beyond_range(src, dst.dtype)) is not None:
                # It would become inf; checked now, since a copy that fails half way would load part of it.
                mismatched.append(f"values for {key} are beyond the range of {dst.dtype} (largest finite "
                                  f"{float(np.finfo(dst.dtype).max):.4g}): the checkpoint holds {span[0]:.4g} .. "
                                  f"{span[1]:.4g}")
            else:
                copies.append((key, target, dst))
            src = None  # one value at a time: a checkpoint's lazily read tensors are freed after their check
        unexpected = [key for key in state_dict if key not in expected]
        mismatched += module_assign.overlaps([(key, target, src) for key, _, _, target, src in assigned])
        errors = []
        if strict and missing:
            errors.append(f"Missing key(s) in state_dict ({len(missing)}): " + ", ".join(map(repr, missing)))
        if strict and unexpected:
            errors.append(f"Unexpected key(s) in state_dict ({len(unexpected)}): " + ", ".join(map(repr, unexpected)))
        errors.extend(mismatched)
        if errors:
            hint = ("\n\t(nothing was loaded; pass strict=False to skip missing/unexpected keys, "
                    "shapes must always match)")
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                               + "\n\t".join(errors) + hint)
        for _, owner, name, target, src in assigned:
            module_assign.bind(owner, name, target, src)
        for key, target, dst in copies:
            # Asked for again, not kept from the check: a value read from a file as it is used (train/tensor_file.py)
            # then holds one tensor at a time, not all of them (a plain dict gives the same array).
            src = _as_array(state_dict[key])
            # A float64 value below float32's range becomes 0 (torch's load too); under np.seterr(under="raise") that
            # raised after earlier keys were copied, a half load.
            with np.errstate(under="ignore"):
                np.copyto(dst, src, casting="same_kind")
            if isinstance(target, Tensor):
                increment_version(target)  # a graph built before the load must not differentiate at the new values
        return IncompatibleKeys(missing, unexpected)

    # -- printing -------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The text inside the parentheses for this module's own settings."""
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): {_addindent(repr(child), 2)}" for name, child in self._own_children()]
        lines = extra_lines + child_lines
        body = ""
        if lines:
            body = extra_lines[0] if len(extra_lines) == 1 and not child_lines else "\n  " + "\n  ".join(lines) + "\n"
        return f"{type(self).__name__}({body})"


# Last, and as a module: containers.py subclasses Module, and either file may be imported first. Module wraps
# lists and dicts of modules in its containers (containers.container_for), looked up when a Module runs.
from . import containers, module_assign, module_lookup  # noqa: E402
