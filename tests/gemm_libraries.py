"""The per-core products' two libraries (kernels.gemm_library), for tests that run a product on each."""

import pytest

from tensorarena.kernels import gemm_library as L

LIBRARIES = [pytest.param("mkl"), pytest.param("openblas", marks=pytest.mark.skipif(
    not L.available(), reason=f"no OpenBLAS for the per-core products: {L.why_not()}"))]


@pytest.fixture(params=LIBRARIES)
def library(request):
    """The per-core products on each library in turn (the process's own choice restored after)."""
    saved = L.NAMES[L.current()]
    L.use_library(request.param)
    yield request.param
    L.use_library(saved)


def route_on(library: str, route: str) -> str:
    """The route a product of SHAPES[route] takes on `library`: OpenBLAS cuts tall ones by rows."""
    return "row_cut" if route == "mkl_threads" and library == "openblas" else route
