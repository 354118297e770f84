"""Test-wide settings: NumPy raises on float errors, as DESIGN.md's house rules ask."""

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _numpy_raises():
    old = np.seterr(all="raise")
    yield
    np.seterr(**old)
