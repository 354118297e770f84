"""erf, for the exact GELU. TODO(ops helper): reference (NumPy) and fused (Numba) twins."""
