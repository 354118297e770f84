"""Weight initialisation, in place, with explicit randomness (torch.nn.init names).

Every random function takes `rng: np.random.Generator | None`; None means the
default generator of tensorarena.random, which `manual_seed(seed)` reseeds.

Values are always drawn in float64 and then rounded to the target's dtype, so a
float32 and a float64 model built from the same seed hold the same weights (to
float32 precision).
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd import increment_version
from ..tensor import Tensor
from . import deferred

from ..random import DEFAULT_SEED, default_generator, get_generator, manual_seed  # noqa: F401  (re-exported)


def _target(t: Tensor | np.ndarray) -> np.ndarray:
    """The array to write into: a tensor's storage, or a writable float ndarray."""
    arr = t.data if isinstance(t, Tensor) else t
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"init functions fill a Tensor/Parameter or an ndarray in place, got {type(t).__name__}")
    if arr.dtype.kind != "f":
        raise TypeError(f"init functions fill floating-point arrays, got dtype {arr.dtype}")
    return arr


def _shape(t: Tensor | np.ndarray) -> tuple[int, ...]:
    """The target's shape, read without its values (a deferred parameter has a shape but no values yet)."""
    return t.shape if _is_deferred(t) else _target(t).shape


def _is_deferred(t) -> bool:
    """A parameter built under nn.deferred_init(): its fills are recorded, not run (nn/deferred.py)."""
    return getattr(t, "is_deferred", False)


def _deferred(t, fn: str, kwargs: dict, gen: np.random.Generator | None = None, advance=None):
    """Record the fill on a deferred parameter, moving `gen` on as the fill would have (nn/deferred.py)."""
    return _written(deferred.record_fill(t, fn, kwargs, gen, advance))


def _written(t):
    """Count an in-place fill of a tensor: a graph that saved it must refuse its backward (as torch's init)."""
    if isinstance(t, Tensor):
        increment_version(t)
    return t


def _fill(t, values: np.ndarray):
    np.copyto(_target(t), values, casting="same_kind")
    return _written(t)


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (torch.nn.init.calculate_gain)."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        # As torch: a bool or a string is not a slope (float(True) would silently be a slope of 1)
        if param is not None and (isinstance(param, bool) or not isinstance(param, (int, float, np.integer, np.floating))):
            raise ValueError(f"negative_slope {param!r} is not a valid number")
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}; use one of {linear + ('tanh', 'relu', 'leaky_relu', 'selu')}")


def calculate_fan_in_and_fan_out(tensor: Tensor | np.ndarray) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight laid out (out, in, *kernel) as in torch."""
    shape = _shape(tensor)
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need a tensor with at least 2 dimensions, got shape {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _check_normal(what: str, mean: float, std: float) -> None:
    # NumPy would answer "scale < 0", or fill NaN/inf without a word
    if not math.isfinite(mean):
        raise ValueError(f"{what}: mean must be finite, got {mean}")
    if not 0.0 <= std < math.inf:
        raise ValueError(f"{what}: std must be finite and >= 0, got {std}")


def uniform_(tensor, a: float = 0.0, b: float = 1.0, *, rng: np.random.Generator | None = None):
    """Fill with U(a, b)."""
    if not (math.isfinite(a) and math.isfinite(b) and a <= b):
        raise ValueError(f"uniform_: need finite bounds with a <= b, got a={a}, b={b}")
    if _is_deferred(tensor):
        gen = get_generator(rng)
        return _deferred(tensor, "uniform_", {"a": a, "b": b}, gen,
                         lambda g: deferred.skip_draws(lambda n: g.uniform(a, b, size=n), tensor.numel()))
    arr = _target(tensor)
    return _fill(tensor, get_generator(rng).uniform(a, b, size=arr.shape))


def normal_(tensor, mean: float = 0.0, std: float = 1.0, *, rng: np.random.Generator | None = None):
    """Fill with N(mean, std^2)."""
    _check_normal("normal_", mean, std)
    if _is_deferred(tensor):
        gen = get_generator(rng)
        return _deferred(tensor, "normal_", {"mean": mean, "std": std}, gen,
                         lambda g: deferred.skip_draws(lambda n: g.normal(mean, std, size=n), tensor.numel()))
    arr = _target(tensor)
    return _fill(tensor, get_generator(rng).normal(mean, std, size=arr.shape))


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0, *,
                  rng: np.random.Generator | None = None):
    """Fill with N(mean, std^2) truncated to [a, b] (absolute bounds, as torch)."""
    if not a < b:
        raise ValueError(f"trunc_normal_: need a < b, got a={a}, b={b}")
    _check_normal("trunc_normal_", mean, std)
    if std == 0:  # the acceptance below divides by std (torch's raises ZeroDivisionError here)
        raise ValueError("trunc_normal_: std must be > 0; for a constant fill use constant_(t, mean)")
    # Rejection sampling: redraw only the values that fell outside. It needs a fair
    # chance of landing inside, so refuse bounds that make that hopeless.
    cdf = lambda x: 0.5 * (1 + math.erf((x - mean) / (std * math.sqrt(2))))  # noqa: E731
    accept = cdf(b) - cdf(a)
    if accept < 1e-3:
        raise ValueError(f"trunc_normal_: [a, b] = [{a}, {b}] holds only {accept:.2e} of N({mean}, {std}^2); "
                         f"widen the bounds or move the mean inside them")
    gen = get_generator(rng)
    if _is_deferred(tensor):
        return _deferred(tensor, "trunc_normal_", {"mean": mean, "std": std, "a": a, "b": b}, gen,
                         lambda g: deferred.skip_trunc_normal(g, tensor.numel(), mean, std, a, b))
    arr = _target(tensor)
    values = gen.normal(mean, std, size=arr.size)
    bad = np.flatnonzero((values < a) | (values > b))
    while bad.size:
        values[bad] = gen.normal(mean, std, size=bad.size)
        bad = bad[(values[bad] < a) | (values[bad] > b)]
    return _fill(tensor, values.reshape(arr.shape))


def constant_(tensor, val: float):
    """Fill with `value`."""
    if _is_deferred(tensor):
        return _deferred(tensor, "constant_", {"val": val})
    _target(tensor)[...] = val
    return _written(tensor)


def zeros_(tensor):
    """Fill with 0."""
    return constant_(tensor, 0.0)


def ones_(tensor):
    """Fill with 1."""
    return constant_(tensor, 1.0)


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", *,
                     rng: np.random.Generator | None = None):
    """He uniform: U(-bound, bound), bound = gain * sqrt(3 / fan) (torch.nn.init.kaiming_uniform_)."""
    mode = mode.lower() if isinstance(mode, str) else mode  # torch takes "FAN_OUT" too
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    if math.prod(_shape(tensor)) == 0:
        return tensor  # nothing to fill; and fan would be 0
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform_(tensor, -bound, bound, rng=rng)


def xavier_uniform_(tensor, gain: float = 1.0, *, rng: np.random.Generator | None = None):
    """Glorot uniform: U(-bound, bound), bound = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)  # first, as torch: a 1-d tensor is refused even if empty
    if math.prod(_shape(tensor)) == 0:
        return tensor
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, rng=rng)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", *,
                    rng: np.random.Generator | None = None):
    """He normal: N(0, std^2), std = gain / sqrt(fan) (torch.nn.init.kaiming_normal_; fans as kaiming_uniform_)."""
    mode = mode.lower() if isinstance(mode, str) else mode
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    if math.prod(_shape(tensor)) == 0:
        return tensor  # nothing to fill; and fan would be 0
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan_in if mode == "fan_in" else fan_out)
    return normal_(tensor, 0.0, std, rng=rng)


def xavier_normal_(tensor, gain: float = 1.0, *, rng: np.random.Generator | None = None):
    """Glorot normal: N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)) (torch.nn.init.xavier_normal_)."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)  # first, as xavier_uniform_: a 1-d tensor is refused
    if math.prod(_shape(tensor)) == 0:
        return tensor
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), rng=rng)

__all__ = ["DEFAULT_SEED", "manual_seed", "default_generator", "get_generator", "calculate_gain",
           "calculate_fan_in_and_fan_out", "uniform_", "normal_", "trunc_normal_", "constant_", "zeros_",
           "ones_", "kaiming_uniform_", "xavier_uniform_", "kaiming_normal_", "xavier_normal_"]
