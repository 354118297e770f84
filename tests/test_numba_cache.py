"""kernels.numba_cache: a cached kernel is recompiled when a sibling module it inlines is edited."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tensorarena.kernels import numba_cache


def _write(path, text: str) -> None:
    path.write_text(textwrap.dedent(text))


def test_kernel_modules_are_cached_through_the_dependency_locator():
    from tensorarena.kernels import attention_heads, gelu

    assert numba_cache.installed()
    for fn in (gelu._bias_forward_erf, attention_heads._forward):
        locator = fn._cache._impl._locator
        assert isinstance(locator, numba_cache.KernelCacheLocator), type(locator)
        stamp = locator.get_source_stamp()
        assert stamp[1] == numba_cache.dependency_digest(fn.py_func.__code__.co_filename)
    # the helpers each one inlines are among its dependencies
    assert {"fastmath", "softmax"} <= set(numba_cache.dependencies(gelu.__file__))
    assert {"fastmath", "gemm_bf16", "mkl_numba", "softmax"} <= set(numba_cache.dependencies(attention_heads.__file__))


def test_dependencies_follow_sibling_imports_transitively(tmp_path):
    _write(tmp_path / "a.py", "from . import b\nfrom .c import x as y\nimport os\n")
    _write(tmp_path / "b.py", "from .d import thing\n")
    _write(tmp_path / "c.py", "x = 1\n")
    _write(tmp_path / "d.py", "thing = 2\n")
    _write(tmp_path / "e.py", "unrelated = 3\n")
    _write(tmp_path / "__init__.py", "")
    a = str(tmp_path / "a.py")
    assert numba_cache.dependencies(a) == ("b", "c", "d")
    before = numba_cache.dependency_digest(a)
    _write(tmp_path / "e.py", "unrelated = 4\n")
    assert numba_cache.dependency_digest(a) == before, "a module a.py does not import changed its digest"
    _write(tmp_path / "d.py", "thing = 20\n")  # d.py reaches a.py through b.py
    assert numba_cache.dependency_digest(a) != before
    # sources that are not plain files (a zipped install) leave Numba's own stamp to decide, without failing
    assert numba_cache.dependency_digest(str(tmp_path / "inside.zip" / "a.py")) == "unreadable"


_RUN = """
import sys
sys.path.insert(0, {root!r})
from tensorarena.kernels import numba_cache
if {track}:
    numba_cache.KERNEL_DIRS.add({pkg!r})
    assert numba_cache.install()
else:
    numba_cache.KERNEL_DIRS.clear()  # Numba's own locators only
from pkgx.main import value
print(value(), sum(value.stats.cache_hits.values()))
"""


def _run(tmp_path, track: bool) -> tuple[str, int]:
    """(what value() returned, how many of its signatures came from the on-disk cache) in a fresh process."""
    code = _RUN.format(root=str(tmp_path), pkg=str(tmp_path / "pkgx"), track=track)
    env = dict(os.environ, NUMBA_CACHE_DIR="")  # the in-tree __pycache__ beside the scratch package
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert child.returncode == 0, child.stderr[-3000:]
    result, hits = child.stdout.split()[-2:]
    return result, int(hits)


def _scratch_package(root) -> None:
    pkg = root / "pkgx"
    pkg.mkdir()
    _write(pkg / "__init__.py", "")
    _write(pkg / "helper.py", """\
        import numba

        @numba.njit(inline="always")
        def constant():
            return 1.0
        """)
    _write(pkg / "main.py", """\
        import numba
        from .helper import constant

        @numba.njit(cache=True)
        def value():
            return constant()
        """)


@pytest.mark.parametrize("track", [True, False], ids=["dependency locator", "numba alone"])
def test_an_edited_inlined_helper_is_recompiled(tmp_path, track):
    """With the locator the edit is seen; with Numba's own locators the cached value() keeps returning
    the old constant (the trap this module exists for: if that half ever fails, Numba tracks inlined
    dependencies itself and kernels/numba_cache.py can go). Unedited, both load from the cache."""
    _scratch_package(tmp_path)
    assert _run(tmp_path, track) == ("1.0", 0)  # compiled and saved
    assert _run(tmp_path, track) == ("1.0", 1)  # loaded: the stamp is stable from process to process
    helper = tmp_path / "pkgx" / "helper.py"
    helper.write_text(helper.read_text().replace("return 1.0", "return 2.0"))
    assert _run(tmp_path, track) == (("2.0", 0) if track else ("1.0", 1))


def test_real_kernels_load_from_the_cache_in_a_new_process():
    """The stamp of a real kernel is the same from one process to the next (else every start recompiles)."""
    code = ("import numpy as np\nfrom tensorarena.kernels import gelu\nx = np.ones((4, 8), np.float32)\n"
            "gelu._bias_forward_erf(x, np.ones(8, np.float32), np.empty_like(x), np.empty_like(x))\n"
            "print(sum(gelu._bias_forward_erf.stats.cache_hits.values()))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-3000:]
    assert int(runs[1].stdout.split()[-1]) == 1  # the first run may have compiled; the second loads


def test_a_locator_list_the_user_set_wins(tmp_path):
    code = ("import logging\nlogging.basicConfig(level=logging.INFO)\n"
            "from tensorarena.kernels import gelu, numba_cache\n"
            "print(numba_cache.installed(), type(gelu._bias_forward_erf._cache._impl._locator).__name__)")
    # Its own cache directory: an index written under Numba's stamp would make the next run recompile.
    env = dict(os.environ, NUMBA_CACHE_LOCATOR_CLASSES="UserProvidedCacheLocator,InTreeCacheLocator",
               NUMBA_CACHE_DIR=str(tmp_path))
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split()[-2:] == ["False", "UserProvidedCacheLocator"]
    assert "NUMBA_CACHE_LOCATOR_CLASSES is set" in child.stderr
