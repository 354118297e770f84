"""Module.get_submodule / set_submodule / get_parameter / get_buffer: a dotted name to the object, as torch's.

A name is looked up among what the module walks (module.py), not only among its attributes: a plain list of modules
filled after it was assigned is a child ('layers.0') that getattr alone does not see. Errors are torch's: an
AttributeError naming the part that is missing ("Linear has no attribute `x`") or the part that is of another kind
("`weight` is not an nn.Module").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .parameter import Parameter

if TYPE_CHECKING:
    from .module import Module

_NONE = object()  # a name that no walked entry has (None is a value: an empty slot)


def _absent(module: "Module", name: str, target: str) -> AttributeError:
    return AttributeError(f"{type(module).__name__} has no attribute `{name}` (looking up {target!r})")


def _has(module: "Module", name: str) -> bool:
    return hasattr(module, name)  # (a container's index past its end is an AttributeError too, as torch's)


def _walked(entries, name: str) -> Any:
    for entry_name, value in entries:
        if entry_name == name:
            return value
    return _NONE


def get_submodule(module: "Module", target: str) -> "Module":
    """The module at dotted path `target` below `module` ('' is `module` itself)."""
    if target == "":
        return module
    for name in target.split("."):
        child = _walked(module._own_children(), name)
        if child is _NONE:
            # Not a child: an attribute of another kind (a parameter, a method, an empty slot) or nothing at all.
            if not _has(module, name):
                raise _absent(module, name, target)
            raise AttributeError(f"`{name}` is not an nn.Module (looking up {target!r})")
        module = child
    return module


def _owner(module: "Module", target: str) -> tuple["Module", str]:
    """The module holding the last part of `target`, and that part."""
    path, _, name = target.rpartition(".")
    return get_submodule(module, path), name


def get_parameter(module: "Module", target: str) -> Parameter:
    """The parameter at dotted path `target` ('blocks.0.fc.weight')."""
    owner, name = _owner(module, target)
    param = _walked(owner._own_parameters(), name)
    if param is _NONE:
        if not _has(owner, name):
            raise _absent(owner, name, target)
        raise AttributeError(f"`{name}` is not an nn.Parameter (looking up {target!r})")
    return param


def get_buffer(module: "Module", target: str) -> Any:
    """The buffer at dotted path `target`: its ndarray or Tensor, or None for a buffer registered as None (torch's
    get_buffer returns that None too); non-persistent buffers included."""
    owner, name = _owner(module, target)
    if name not in vars(owner).get("_buffers", {}):
        if not _has(owner, name):
            raise _absent(owner, name, target)
        raise AttributeError(f"`{name}` is not a buffer (looking up {target!r})")
    return getattr(owner, name)


def set_submodule(module: "Module", target: str, new: "Module", strict: bool = False) -> None:
    """Put `new` at dotted path `target`, replacing the module there (in its place: state_dict's order is kept).

    As torch's: the path's modules must exist; the last part may be a new name unless `strict`, but never an
    attribute of another kind, an empty slot (None) included; a Sequential's or ModuleList's entry is replaced by
    its index ('blocks.2'), and the next index appends.
    """
    from .module import Module

    if target == "":
        raise ValueError("set_submodule needs a target name (a dotted path such as 'blocks.0.fc'); the module "
                         "itself cannot be replaced from inside")
    if not isinstance(new, Module):
        raise ValueError(f"`module` is not an nn.Module, found {type(new).__name__}: set_submodule({target!r}, ...) "
                         f"takes a Module")
    owner, name = _owner(module, target)
    current = _walked(owner._own_children(), name)
    if current is _NONE:
        if _has(owner, name):
            raise AttributeError(f"`{name}` is not an nn.Module (looking up {target!r}); delete that attribute "
                                 f"first to put a module under its name")
        if strict:
            raise _absent(owner, name, target)
    setattr(owner, name, new)
