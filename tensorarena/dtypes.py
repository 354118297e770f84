"""The dtypes under torch's names (ta.float32, ta.long, ta.bool): NumPy dtypes, which every dtype= here takes.

They are np.dtype objects, so `t.dtype == ta.float32` and `t.dtype is ta.float32` both hold for a float32 tensor.
Only the dtypes tensors hold are named: no float16 or bfloat16 (a float16 array is kept as float32).
"""

from __future__ import annotations

import numpy as np

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
bool = np.dtype(np.bool_)  # noqa: A001 - torch's name
# torch's aliases
float = float32  # noqa: A001
double = float64
int = int32  # noqa: A001
long = int64
