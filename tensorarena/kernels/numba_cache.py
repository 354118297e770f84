"""Numba's on-disk cache of our kernels, made to notice edits to the helpers a kernel inlines.

Numba keys a cached kernel on its own source file alone (a content hash of that file). Our kernels
inline code from sibling modules: kernels.fastmath's exp and erf, gemm_bf16's rounding, softmax's
row helpers, mkl_numba's MKL declarations. After an edit to one of those, Numba went on loading the
machine code compiled from the old helper, without a word: in one session the bf16 attention
kernels kept running an old `round_bits` until their __pycache__ files were deleted by hand.

`install()` puts a cache locator first in Numba's list for the files of this directory. It wraps
the locator Numba would have picked (so the cache lives where it always did, under the same names)
and changes one thing: the source stamp is Numba's own stamp plus a digest of every sibling module
the kernel's file imports, directly or through other siblings, read from its import statements. An
edit to any of them changes the stamp, and Numba compiles afresh instead of loading stale code. The
digest over-approximates (a sibling imported for a Python helper counts too): an edit there costs
a recompilation, never a wrong result.

Numba's list of locator classes is a private attribute (`CacheImpl._locator_classes`), so
`install()` checks it and says when it could not install: it logs a warning, and `installed()` says
False. A NUMBA_CACHE_LOCATOR_CLASSES the user set wins (Numba then ignores that list); this is
logged once. Called from kernels.cpu, which every kernel module imports before it defines a kernel.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import logging
import os

log = logging.getLogger("tensorarena")

# Directories whose modules get the dependency-aware stamp (tests add a scratch package of their own).
KERNEL_DIRS = {os.path.dirname(os.path.abspath(__file__))}
_numba_defaults: list = []  # Numba's own locator classes, in its order, once install() has run


def sibling_imports(path: str) -> set[str]:
    """Names of the modules beside `path` that its `from . import x` / `from .x import y` lines import."""
    st = os.stat(path)
    return set(_sibling_imports(os.path.abspath(path), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=None)
def _sibling_imports(path: str, mtime_ns: int, size: int) -> frozenset[str]:
    # Parsed once per version of the file (mtime and size are the memo key): Numba asks for the
    # stamp of each of a module's kernels, and a module holds up to a dozen.
    folder = os.path.dirname(path)
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), filename=path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            candidates = [a.name for a in node.names] if node.module is None else [node.module.split(".")[0]]
            names.update(n for n in candidates if n != "__init__" and os.path.isfile(os.path.join(folder, n + ".py")))
    return frozenset(names)


def dependencies(path: str) -> tuple[str, ...]:
    """Every sibling module `path` imports, directly or through other siblings, sorted; itself excluded."""
    folder = os.path.dirname(os.path.abspath(path))
    own = os.path.splitext(os.path.basename(path))[0]
    seen: set[str] = set()
    todo = sorted(sibling_imports(path))
    while todo:
        name = todo.pop()
        if name in seen or name == own:
            continue
        seen.add(name)
        todo.extend(sibling_imports(os.path.join(folder, name + ".py")) - seen)
    return tuple(sorted(seen))


def _file_digest(path: str) -> bytes:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


@functools.lru_cache(maxsize=None)
def _dependency_digest(path: str, stamps: tuple) -> str:
    # `stamps` (each dependency's mtime and size) is the memo key: an edit made while the process
    # runs is seen, as in Numba's own _hash_source_file.
    folder = os.path.dirname(os.path.abspath(path))
    digest = hashlib.sha256()
    for name in dependencies(path):
        digest.update(name.encode() + b"\0" + _file_digest(os.path.join(folder, name + ".py")))
    return digest.hexdigest()


def dependency_digest(path: str) -> str:
    """A digest of the sources of every module in `dependencies(path)`; "unreadable" where the sources
    cannot be read as files (a zipped install): Numba's own stamp alone then decides, as without this."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        stamps = []
        for name in dependencies(path):
            st = os.stat(os.path.join(folder, name + ".py"))
            stamps.append((name, st.st_mtime_ns, st.st_size))
        return _dependency_digest(os.path.abspath(path), tuple(stamps))
    except OSError:
        return "unreadable"


class KernelCacheLocator:
    """The cache locator Numba would use for a kernel, with the dependencies' digest in its stamp."""

    def __init__(self, inner, py_file: str) -> None:
        self._inner = inner
        self._py_file = py_file  # Numba reads this attribute of a locator in its error messages

    def __getattr__(self, name):  # where the cache lives, how entries are named: Numba's choice
        return getattr(self._inner, name)

    def get_source_stamp(self):
        return self._inner.get_source_stamp(), dependency_digest(self._py_file)

    @classmethod
    def from_function(cls, py_func, py_file: str):
        if os.path.dirname(os.path.abspath(py_file)) not in KERNEL_DIRS:
            return None  # not one of ours: Numba's next locator class decides
        for numba_class in _numba_defaults:
            inner = numba_class.from_function(py_func, py_file)
            if inner is not None:
                return cls(inner, py_file)
        return None


def _numba_locator_list():
    """Numba's list of cache locator classes, or None where this Numba keeps no such list."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)  # older Numbas: _CacheImpl
    classes = getattr(impl, "_locator_classes", None)
    return classes if isinstance(classes, list) else None


def installed() -> bool:
    """Whether Numba consults KernelCacheLocator for the functions it caches from now on."""
    from numba.core import config

    classes = _numba_locator_list()
    return not config.CACHE_LOCATOR_CLASSES and classes is not None and KernelCacheLocator in classes


def install() -> bool:
    """Put KernelCacheLocator first in Numba's locator list (once); False, with the reason logged, if not."""
    from numba.core import config

    if config.CACHE_LOCATOR_CLASSES:
        log.info("NUMBA_CACHE_LOCATOR_CLASSES is set (%s): Numba's cache of tensorarena's kernels will not see "
                 "edits to the helpers they inline (kernels/numba_cache.py)", config.CACHE_LOCATOR_CLASSES)
        return False
    classes = _numba_locator_list()
    if classes is None:
        log.warning("this Numba (%s) has no CacheImpl._locator_classes list: its cache of tensorarena's kernels "
                    "will not see edits to the helpers they inline; after editing one, delete "
                    "tensorarena/kernels/__pycache__/*.nbi", getattr(__import__("numba"), "__version__", "?"))
        return False
    if KernelCacheLocator not in classes:
        _numba_defaults[:] = list(classes)
        classes.insert(0, KernelCacheLocator)
    return True
