"""What tests/conftest.py promises the rest of the suite."""

import subprocess
import sys
from pathlib import Path

import tensorarena


def test_a_subprocess_imports_the_tensorarena_these_tests_import(tmp_path):
    # Many tests run `python -m tensorarena ...` from a temporary directory. They must test the same code as the
    # tests in this process. Under .ci/run (a non-editable `pip install .`, then `python -m pytest` in the checkout)
    # a child without the conftest's PYTHONPATH imported site-packages' copy instead, with an empty Numba cache.
    # Shown failing without it: in a venv with `pip install .` of the checkout, with conftest's PYTHONPATH lines
    # removed, `python -m pytest -q -p no:cacheprovider tests/test_suite_settings.py` reports
    # `.../site-packages/tensorarena/__init__.py` against the checkout's `tensorarena/__init__.py`.
    child = subprocess.run([sys.executable, "-c", "import tensorarena; print(tensorarena.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    assert Path(child).resolve() == Path(tensorarena.__file__).resolve(), \
        f"a subprocess imported {child}, the tests import {tensorarena.__file__}"
