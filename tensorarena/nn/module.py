"""Module: torch.nn.Module semantics, found by walking attributes instead of registering them.

A `Parameter` attribute is a parameter, a `Module` attribute is a child, and a list or
tuple of Modules (or of Parameters) is a child container named by index, as torch's
ModuleList/ParameterList would be. Attribute definition order gives the order of
`named_parameters()` and `state_dict()`, with each module's own parameters before its
children's, exactly as in torch, so checkpoints exchange with the same torch model.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from ..tensor import SUPPORTED_FLOATS, Tensor
from .parameter import Parameter


class IncompatibleKeys(NamedTuple):
    """What `load_state_dict(strict=False)` did not match."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


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
        return np.asarray(value.numpy())
    return np.asarray(value)


def _addindent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    return lines[0] if len(lines) == 1 else "\n".join([lines[0]] + [" " * spaces + ln for ln in lines[1:]])


class Module:
    """Base class for layers and models; subclasses set attributes in __init__ and define forward."""

    training: bool = True  # class default so a subclass that forgets super().__init__() still works
    _walk_skip: tuple[str, ...] = ()  # attributes the walker must not look into (container storage)

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_buffers", {})  # name -> persistent; values live as plain attributes

    # -- attribute walking -----------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        # Lists of modules become a ModuleList now, so the container has a stable identity
        # (modules(), train(), repr) and the same dotted names as torch's ModuleList.
        if isinstance(value, (list, tuple)) and value and name not in self._walk_skip:
            value = _container_for(name, value, value)
        object.__setattr__(self, name, value)

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
            elif isinstance(value, (list, tuple)) and value:
                # A list that was empty when assigned and filled later: wrap it on the fly.
                wrapped = _container_for(name, value, None)
                if wrapped is not None:
                    yield name, wrapped

    def _own_buffers(self) -> Iterator[tuple[str, np.ndarray | Tensor]]:
        for name in vars(self).get("_buffers", {}):
            value = getattr(self, name, None)
            if value is not None:
                yield name, value

    def register_buffer(self, name: str, value: np.ndarray | Tensor | None, persistent: bool = True) -> None:
        """Attach non-trainable state (e.g. running statistics); persistent buffers go in state_dict."""
        if not name or "." in name:
            raise KeyError(f"buffer name must be a non-empty string without '.', got {name!r}")
        if value is not None and not isinstance(value, (np.ndarray, Tensor)):
            raise TypeError(f"buffer {name!r} must be an ndarray, a Tensor or None, got {type(value).__name__}")
        if isinstance(value, Parameter):
            raise TypeError(f"buffer {name!r} is a Parameter; assign it as an attribute to make it a parameter")
        if "_buffers" not in vars(self):
            object.__setattr__(self, "_buffers", {})
        self._buffers[name] = persistent
        object.__setattr__(self, name, value)

    # -- traversal ---------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """Direct submodules with their attribute names (index for list entries)."""
        seen: set[int] = set()
        for name, child in self._own_children():
            if id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator["Module"]:
        """Direct submodules."""
        for _, child in self.named_children():
            yield child

    def named_modules(self, memo: set[int] | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, "Module"]]:
        """This module and all below it, depth first, with dotted names ('' for self)."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
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

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, np.ndarray | Tensor]]:
        """(dotted name, buffer) pairs."""
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mod_prefix, module in modules:
            for name, b in module._own_buffers():
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
        for m in self.modules():
            m.training = mode
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

    # -- dtype -------------------------------------------------------------------------
    def to(self, dtype) -> "Module":
        """Convert parameters (and floating buffers) to float32 or float64, keeping the Parameter objects."""
        dt = np.dtype(dtype)
        if dt not in SUPPORTED_FLOATS:
            raise TypeError(f"Module.to supports float32 and float64, got {dt}")
        for p in self.parameters():
            if p.dtype != dt:
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

    def state_dict(self, *, prefix: str = "", keep_vars: bool = False) -> "OrderedDict[str, Any]":
        """Name -> copy of each parameter and persistent buffer (the objects themselves if keep_vars)."""
        out: OrderedDict[str, Any] = OrderedDict()
        for key, _, _, value in self._state_entries(prefix):
            if keep_vars:
                out[key] = value
            else:
                out[key] = (value.data if isinstance(value, Tensor) else value).copy()
        return out

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy values into the existing arrays in place (identity and addresses kept), casting dtype.

        All problems are collected first and reported in one RuntimeError, and nothing is
        copied unless everything fits. strict=False tolerates missing and unexpected keys
        (returned) but never a shape mismatch.
        """
        entries = list(self._state_entries())
        expected = {key for key, *_ in entries}
        missing, mismatched, copies = [], [], []
        for key, _, _, target in entries:
            if key not in state_dict:
                missing.append(key)
                continue
            dst = target.data if isinstance(target, Tensor) else target
            src = _as_array(state_dict[key])
            if src.shape != dst.shape:
                mismatched.append(f"size mismatch for {key}: copying a value with shape {tuple(src.shape)} "
                                  f"from the checkpoint, the shape in the current model is {tuple(dst.shape)}")
            elif not np.can_cast(src.dtype, dst.dtype, casting="same_kind"):
                mismatched.append(f"dtype mismatch for {key}: cannot cast the checkpoint's {src.dtype} "
                                  f"to the model's {dst.dtype}")
            else:
                copies.append((dst, src))
        unexpected = [key for key in state_dict if key not in expected]
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
        for dst, src in copies:
            np.copyto(dst, src, casting="same_kind")
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


class ModuleList(Module):
    """A list of modules; its entries are children named '0', '1', ... (torch.nn.ModuleList)."""

    _walk_skip = ("_items",)

    def __init__(self, modules=()) -> None:
        super().__init__()
        items = list(modules)
        for i, m in enumerate(items):
            if not isinstance(m, Module):
                raise TypeError(f"{type(self).__name__} entry {i} is a {type(m).__name__}, not a Module")
        object.__setattr__(self, "_items", items)

    @classmethod
    def _view(cls, items: list) -> "ModuleList":
        # Shares the caller's list (not a copy) so later appends stay visible.
        view = cls.__new__(cls)
        Module.__init__(view)
        object.__setattr__(view, "_items", items)
        return view

    def _own_children(self) -> Iterator[tuple[str, Module]]:
        for i, m in enumerate(self._items):
            yield str(i), m
        yield from super()._own_children()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._items)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self._from_list(self._items[idx])
        return self._items[idx]

    def _from_list(self, items: list) -> "ModuleList":
        # Subclasses whose constructor takes *modules (Sequential) override this.
        return ModuleList(items)

    def __setitem__(self, idx: int, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__} entries must be Modules, got {type(module).__name__}")
        self._items[idx] = module

    def append(self, module: Module) -> "ModuleList":
        """Add one module at the end."""
        if not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__} entries must be Modules, got {type(module).__name__}")
        self._items.append(module)
        return self

    def extend(self, modules) -> "ModuleList":
        """Add several modules at the end."""
        for m in modules:
            self.append(m)
        return self


class ParameterList(Module):
    """A list of parameters named '0', '1', ... (torch.nn.ParameterList)."""

    _walk_skip = ("_items",)

    def __init__(self, params=()) -> None:
        super().__init__()
        items = list(params)
        for i, p in enumerate(items):
            if not isinstance(p, Parameter):
                raise TypeError(f"ParameterList entry {i} is a {type(p).__name__}, not a Parameter")
        object.__setattr__(self, "_items", items)

    @classmethod
    def _view(cls, items: list) -> "ParameterList":
        view = cls.__new__(cls)
        Module.__init__(view)
        object.__setattr__(view, "_items", items)
        return view

    def _own_parameters(self) -> Iterator[tuple[str, Parameter]]:
        for i, p in enumerate(self._items):
            yield str(i), p
        yield from super()._own_parameters()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self._items)

    def __getitem__(self, idx):
        return self._items[idx]

    def append(self, p: Parameter) -> "ParameterList":
        """Add one parameter at the end."""
        if not isinstance(p, Parameter):
            raise TypeError(f"ParameterList entries must be Parameters, got {type(p).__name__}")
        self._items.append(p)
        return self

    def extra_repr(self) -> str:
        return "\n".join(f"({i}): Parameter of shape {p.shape}, dtype {p.dtype}" for i, p in enumerate(self._items))


def _container_for(name: str, items, default):
    """ModuleList/ParameterList for a list of Modules/Parameters; `default` for anything else.

    A list mixing modules or parameters with other values is refused: its modules would
    silently go untrained, which is worse than an error.
    """
    n_mod = sum(isinstance(v, Module) for v in items)
    n_par = sum(isinstance(v, Parameter) for v in items)
    if n_mod == 0 and n_par == 0:
        return default
    if n_mod == len(items):
        return ModuleList(items) if default is not None else ModuleList._view(items)
    if n_par == len(items):
        return ParameterList(items) if default is not None else ParameterList._view(items)
    raise TypeError(
        f"attribute {name!r} is a {type(items).__name__} mixing Modules/Parameters with other values; "
        f"its modules would not be registered. Keep modules (or parameters) in a list of their own."
    )
