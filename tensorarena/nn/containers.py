"""torch.nn's containers: ModuleList, ParameterList, ModuleDict and ParameterDict.

Module (module.py) finds children by walking attributes; a plain list or dict of modules (parameters) assigned
to an attribute is wrapped in one of these (`container_for`), so it has a stable identity and the same dotted
names ('blocks.0.fc.weight') as the torch container, and checkpoints exchange with torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

import numpy as np

from .module import Module, _check_name
from .parameter import Parameter


def _sharing(cls: type, attribute: str, held: list | dict) -> Module:
    """A `cls` container that holds the caller's own list or dict as `attribute` (no copy, no check): the view
    Module wraps an attribute's plain list or dict in when it walks it."""
    view = cls.__new__(cls)
    Module.__init__(view)
    object.__setattr__(view, attribute, held)
    object.__setattr__(view, "_plain", "dict" if isinstance(held, dict) else "list")  # for its errors: _plain_hint
    return view


class _List(Module):
    """Shared body of ModuleList and ParameterList: entries of one kind (`_kind`) named '0', '1', ..."""

    _walk_skip = ("_items",)
    _kind: type = Module

    def __init__(self, entries=()) -> None:
        super().__init__()
        items = list(entries)
        for i, e in enumerate(items):
            if not isinstance(e, self._kind):
                raise TypeError(f"{type(self).__name__} entry {i} is a {type(e).__name__}, not a {self._kind.__name__}")
        object.__setattr__(self, "_items", items)

    @classmethod
    def _view(cls, items: list) -> "_List":
        # Shares the caller's list (not a copy) so later appends stay visible.
        return _sharing(cls, "_items", items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator:
        return iter(self._items)

    def _check_index(self, idx) -> None:
        # The list's own IndexError names neither the index nor the length.
        if isinstance(idx, (int, np.integer)) and not -len(self._items) <= idx < len(self._items):
            raise IndexError(f"index {idx} is out of range for a {type(self).__name__} of {len(self._items)}")

    # An entry by its name ('2'), as torch's containers keep entries as named children: setattr(seq, "2", new)
    # replaces layer 2 (how LoRA and quantization tools swap layers); it added a second child named '2' that
    # forward never ran, while state_dict saved the new one's weights under the old one's name.
    def _entry_index(self, name: str) -> int | None:
        """The index of the entry `name` names (its position), or None for a name that is no entry's."""
        items = vars(self).get("_items")
        if items is None or not name.isdigit():
            return None
        index = int(name)
        if index > len(items):
            raise IndexError(f"{type(self).__name__} has {len(items)} entries, so '{name}' names none and is not the "
                             f"next; append() to add one")
        return index

    def __setattr__(self, name: str, value: Any) -> None:
        index = self._entry_index(name)
        if index is None:
            super().__setattr__(name, value)
        elif index == len(self._items):  # the next name: torch's container gets a new last entry
            self.append(value)
        else:
            self[index] = value

    def __getattr__(self, name: str):
        # Only reached when normal lookup fails. An index past the end is an AttributeError, as torch's (the
        # IndexError of _entry_index is setattr's: hasattr(seq, "5") raised it instead of answering False).
        try:
            index = self._entry_index(name) if name != "_items" else None
        except IndexError:
            index = None
        if index is not None and index < len(self._items):
            return self._items[index]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}{_plain_hint(self, name)}")

    def __delattr__(self, name: str) -> None:
        index = self._entry_index(name)
        if index is None or index == len(self._items):
            super().__delattr__(name)
        else:
            del self[index]

    def extend(self, entries):
        """Add several entries at the end (append's checks on each)."""
        for e in list(entries):  # a snapshot: extend(self) (ml += ml) grew the list it was reading, forever
            self.append(e)
        return self

    def __iadd__(self, entries):
        # torch's ModuleList and ParameterList both extend in place (`pl += [p]`)
        return self.extend(entries)

    def index(self, entry, start: int = 0, stop: int | None = None) -> int:
        """The position of `entry` itself (list.index, for a plain list kept as this container), compared by
        identity: == of two parameters is elementwise."""
        items = self._items
        for i in range(*slice(start, stop).indices(len(items))):
            if items[i] is entry:
                return i
        raise ValueError(f"the {type(entry).__name__} is not in this {type(self).__name__}")


class ModuleList(_List):
    """A list of modules; its entries are children named '0', '1', ... (torch.nn.ModuleList)."""

    def __init__(self, modules=()) -> None:
        super().__init__(modules)

    def _own_children(self) -> Iterator[tuple[str, Module]]:
        for i, m in enumerate(self._items):
            yield str(i), m
        yield from super()._own_children()

    def _check_module(self, module: Any) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__} entries must be Modules, got {type(module).__name__}")

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self._from_list(self._items[idx])
        self._check_index(idx)
        return self._items[idx]

    def _from_list(self, items: list) -> "ModuleList":
        # Subclasses whose constructor takes *modules (Sequential) override this.
        return ModuleList(items)

    def __setitem__(self, idx: int, module: Module) -> None:
        self._check_module(module)
        self._check_index(idx)
        self._items[idx] = module

    def __delitem__(self, idx) -> None:
        self._check_index(idx)
        del self._items[idx]  # the later entries move up and are renamed, as in torch

    def insert(self, index: int, module: Module) -> None:
        """Insert one module before `index` (list.insert's rule)."""
        self._check_module(module)
        self._items.insert(index, module)

    def pop(self, idx: int = -1) -> Module:
        """Remove the module at `idx` (the last by default) and return it; the later ones are renamed."""
        self._check_index(idx)
        return self._items.pop(idx)

    def append(self, module: Module) -> "ModuleList":
        """Add one module at the end."""
        self._check_module(module)
        self._items.append(module)
        return self

    def __add__(self, other) -> "ModuleList":
        """A new container of this one's modules followed by `other`'s (the modules themselves, not copies)."""
        return self._from_list(self._items + list(other))


class ParameterList(_List):
    """A list of parameters named '0', '1', ... (torch.nn.ParameterList)."""

    _kind = Parameter

    def __init__(self, params=()) -> None:
        super().__init__(params)

    def _own_parameters(self) -> Iterator[tuple[str, Parameter]]:
        for i, p in enumerate(self._items):
            yield str(i), p
        yield from super()._own_parameters()

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ParameterList(self._items[idx])  # as torch's: a ParameterList, not a plain list
        self._check_index(idx)
        return self._items[idx]

    def __setitem__(self, idx: int, p: Parameter) -> None:
        self._check_parameter(p)
        self._check_index(idx)
        self._items[idx] = p

    def _check_parameter(self, p: Any) -> None:
        if not isinstance(p, Parameter):
            raise TypeError(f"ParameterList entries must be Parameters, got {type(p).__name__}")

    def append(self, p: Parameter) -> "ParameterList":
        """Add one parameter at the end."""
        self._check_parameter(p)
        self._items.append(p)
        return self


    def extra_repr(self) -> str:
        return "\n".join(f"({i}): Parameter of shape {p.shape}, dtype {p.dtype}" for i, p in enumerate(self._items))


class _Dict(Module):
    """Shared body of ModuleDict and ParameterDict: string keys (no '.') in insertion order."""

    _walk_skip = ("_entries",)
    _kind: type = Module

    def __init__(self, entries=None) -> None:
        super().__init__()
        object.__setattr__(self, "_entries", {})
        if entries is not None:
            self.update(entries)

    @classmethod
    def _view(cls, entries: dict) -> "_Dict":
        # Shares the caller's dict (not a copy) so later insertions stay visible; checked when walked.
        return _sharing(cls, "_entries", entries)

    def __getitem__(self, key: str):
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"{key!r} is not in this {type(self).__name__}; its keys: {list(self._entries)}") from None

    # An entry is an attribute too (md.fc is md["fc"]), as torch's: setattr(md, "fc", new) replaces (or adds) the
    # entry, where it added a plain child beside it that state_dict saved under the entry's name.
    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, self._kind) and not name.startswith("_") and "_entries" in vars(self):
            self[name] = value
        else:
            super().__setattr__(name, value)

    def __getattr__(self, name: str):
        # Only reached when normal lookup fails; _entries is read from __dict__ (absent while unpickling).
        entries = self.__dict__.get("_entries")
        if entries is not None and name in entries:
            return entries[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}{_plain_hint(self, name)}")

    def __delattr__(self, name: str) -> None:
        if name in vars(self).get("_entries", {}):
            del self[name]
        else:
            super().__delattr__(name)

    def __setitem__(self, key: str, value) -> None:
        _check_name(key, f"{type(self).__name__} key")
        if not isinstance(value, self._kind):
            raise TypeError(f"{type(self).__name__} entries must be {self._kind.__name__}s, got {type(value).__name__}")
        self._entries[key] = value

    def __delitem__(self, key: str) -> None:
        self[key]  # the KeyError naming the keys
        del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self):
        """The keys, in insertion order."""
        return self._entries.keys()

    def values(self):
        """The entries, in insertion order."""
        return self._entries.values()

    def items(self):
        """(key, entry) pairs, in insertion order."""
        return self._entries.items()

    def update(self, entries) -> None:
        """Add (or replace) entries from a mapping or from (key, entry) pairs."""
        # Another ModuleDict is taken as a mapping too (as torch's update takes one), not as an iterable of keys.
        for key, value in (entries.items() if isinstance(entries, (Mapping, _Dict)) else entries):
            self[key] = value

    def pop(self, key: str):
        """Remove the entry under `key` and return it."""
        value = self[key]
        del self._entries[key]
        return value

    def clear(self) -> None:
        """Remove every entry."""
        self._entries.clear()

    # dict's methods torch's ParameterDict has; on ModuleDict too, for a plain dict of modules assigned to an
    # attribute, which is kept as a ModuleDict (container_for) where torch leaves the dict: `self.heads.get(task)`.
    def get(self, key: str, default: Any = None) -> Any:
        """The entry under `key`, or `default` when there is none."""
        return self._entries.get(key, default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        """The entry under `key`; when there is none, `default` is added under it first (and must be an entry)."""
        if key not in self._entries:
            self[key] = default
        return self._entries[key]

    def popitem(self) -> tuple[str, Any]:
        """Remove the last entry added and return (key, entry)."""
        if not self._entries:
            raise KeyError(f"popitem(): this {type(self).__name__} is empty")
        return self._entries.popitem()

    def copy(self) -> "_Dict":
        """A new container of the same entries (the objects themselves, as torch's ParameterDict.copy)."""
        return type(self)(self._entries)

    def fromkeys(self, keys, default: Any = None) -> "_Dict":
        """A new container with `default` under each of `keys` (torch's ParameterDict.fromkeys)."""
        return type(self)((key, default) for key in keys)

    def __reversed__(self) -> Iterator[str]:
        return reversed(self._entries)

    def __or__(self, other) -> "_Dict":
        merged = self.copy()
        merged.update(other)
        return merged

    def __ror__(self, other) -> "_Dict":
        merged = type(self)(other)
        merged.update(self)
        return merged

    def __ior__(self, other) -> "_Dict":
        self.update(other)
        return self


class ModuleDict(_Dict):
    """Modules under string keys, children named by their keys (torch.nn.ModuleDict); an entry is an attribute too
    (md.fc is md["fc"]), as torch's."""

    def _own_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._entries.items()
        yield from super()._own_children()


class ParameterDict(_Dict):
    """Parameters under string keys, named by their keys (torch.nn.ParameterDict)."""

    _kind = Parameter

    def _own_parameters(self) -> Iterator[tuple[str, Parameter]]:
        yield from self._entries.items()
        yield from super()._own_parameters()

    def extra_repr(self) -> str:
        return "\n".join(f"({k}): Parameter of shape {p.shape}, dtype {p.dtype}" for k, p in self._entries.items())


def _plain_hint(container: Module, name: str) -> str:
    """For an AttributeError of a container made of a plain list or dict (container_for): why the user, who made
    none, meets it, and what to do."""
    plain = vars(container).get("_plain")
    if plain is None or name.startswith("__"):
        return ""
    return (f"; it holds the plain {plain} of {'Parameters' if container._kind is Parameter else 'Modules'} "
            f"assigned to a module attribute, which tensorarena keeps as a {type(container).__name__} so that its "
            f"entries are registered (torch would leave the {plain}); use {plain}(module.<attribute>) for the "
            f"{plain}'s other methods")


def _holds_modules(value, depth: int = 0) -> bool:
    """Whether a list, tuple or dict holds a Module or Parameter at any depth (up to 4 levels down)."""
    if isinstance(value, (Module, Parameter)):
        return True
    if depth >= 4 or not isinstance(value, (list, tuple, dict)):
        return False
    return any(_holds_modules(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))


def container_for(name: str, items, default):
    """ModuleList/ParameterList for a list of Modules/Parameters, ModuleDict/ParameterDict for a dict of them;
    `default` for anything else.

    A list or dict mixing modules or parameters with other values is refused: its modules would
    silently go untrained, which is worse than an error.
    """
    is_dict = isinstance(items, dict)
    values = items.values() if is_dict else items
    n_mod = sum(isinstance(v, Module) for v in values)
    n_par = sum(isinstance(v, Parameter) for v in values)
    if n_mod == 0 and n_par == 0:
        if any(_holds_modules(v) for v in values):
            raise TypeError(f"attribute {name!r} is a {type(items).__name__} holding Modules or Parameters inside "
                            f"other lists, tuples or dicts, which would not be registered (never trained, nor "
                            f"saved): nest ModuleLists / ModuleDicts instead (ModuleList([ModuleList([...])]))")
        return default
    if n_mod != len(items) and n_par != len(items):
        raise TypeError(
            f"attribute {name!r} is a {type(items).__name__} mixing Modules/Parameters with other values; "
            f"its modules would not be registered. Keep modules (or parameters) in a "
            f"{'dict' if is_dict else 'list'} of their own.")
    if is_dict:
        for key in items:
            _check_name(key, f"attribute {name!r}: dict key")
        cls = ModuleDict if n_mod else ParameterDict
        return cls._view(items)  # the caller's own dict, as a list is (see below)
    cls = ModuleList if n_mod else ParameterList
    if isinstance(items, tuple):
        return cls(items) if default is not None else cls._view(list(items))
    # The caller's own list, not a copy: `self.layers = layers; layers.append(m)` registers m, as it does for a list
    # that was empty when assigned (a copy of a non-empty one silently left m out).
    return cls._view(items)
