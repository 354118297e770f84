"""Where the `mkl` wheel's libmkl_rt is, and whether this process will run its GEMMs on it.

Kept apart from kernels.gemm (which loads the library) because kernels/__init__ must know the
answer before anything loads an OpenMP runtime: the wait policy it picks depends on it.
"""

from __future__ import annotations

import importlib.metadata
import os

GEMM_CHOICES = ("auto", "mkl", "numpy")


def wanted_backend() -> str:
    """TENSORARENA_GEMM, checked: "auto" (default), "mkl" or "numpy"."""
    wanted = os.environ.get("TENSORARENA_GEMM", "auto").lower()
    if wanted not in GEMM_CHOICES:
        raise ValueError(f"TENSORARENA_GEMM must be 'auto', 'mkl' or 'numpy', got {wanted!r}")
    return wanted


def find_mkl_rt() -> tuple[str | None, str]:
    """Path of libmkl_rt from the installed `mkl` wheel, or None and why not."""
    try:
        files = importlib.metadata.files("mkl") or []
    except importlib.metadata.PackageNotFoundError:
        return None, "the mkl package is not installed (pip install 'tensorarena[mkl]')"
    for file in files:
        if file.name.startswith("libmkl_rt.so"):
            return str(file.locate()), ""
    return None, "the installed mkl package has no libmkl_rt.so (only Linux wheels are used)"


def mkl_expected() -> bool:
    """Whether kernels.gemm will (try to) load MKL: asked for or left to auto, and its wheel is here."""
    try:
        wanted = wanted_backend()
    except ValueError:
        return False  # kernels.gemm raises the error when it loads
    return wanted != "numpy" and find_mkl_rt()[0] is not None
