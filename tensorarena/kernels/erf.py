"""erf for the exact GELU: a plain-NumPy reference and a fused Numba twin.

NumPy has no erf and scipy is not a dependency, so the reference follows
W. J. Cody, "Rational Chebyshev approximations for the error function",
Math. Comp. 23 (1969) 631-637, with the coefficients of his CALERF routine
(netlib specfun): three rational approximations over |x| <= 0.46875,
0.46875 < |x| <= 4 and |x| > 4, good to ~1e-16 relative in float64.
"""

from __future__ import annotations

import numpy as np

from . import register

# erf(x) = x * P(x^2) / Q(x^2) on |x| <= _THRESH
_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
      3.20937758913846947e03, 1.85777706184603153e-1)
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
      2.84423683343917062e03)
# erfc(y) = exp(-y^2) * P(y) / Q(y) on _THRESH < y <= 4
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
      2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
      2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
      1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
      3.43936767414372164e03, 1.23033935480374942e03)
# erfc(y) = exp(-y^2) / y * (1/sqrt(pi) - P(1/y^2) / (y^2 Q(1/y^2))) on y > 4
_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
      1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1,
      6.05183413124413191e-2, 2.33520497626869185e-3)
_THRESH = 0.46875
_XSMALL = 1.11e-16  # below this erf(x) = 2x/sqrt(pi) to working precision; squaring it would underflow
_ONE_AT = 6.0  # erfc(6) < 2.2e-17, so erf(y) rounds to 1 in float64 for every y >= 6
_SQRPI = 5.6418958354775628695e-1  # 1 / sqrt(pi)


def _exp_neg_sq(y: np.ndarray) -> np.ndarray:
    # exp(-y^2) as exp(-ys^2) * exp(-(y-ys)(y+ys)) with ys = y rounded down to 1/16:
    # forming y*y directly would lose the low bits that exp then amplifies (Cody).
    ys = np.trunc(y * 16.0) / 16.0
    return np.exp(-ys * ys) * np.exp(-(y - ys) * (y + ys))


def _erf_small(x: np.ndarray) -> np.ndarray:
    y = np.abs(x)
    ysq = np.where(y > _XSMALL, y, 0.0)
    ysq *= ysq
    num = _A[4] * ysq
    den = ysq.copy()
    for i in range(3):
        num = (num + _A[i]) * ysq
        den = (den + _B[i]) * ysq
    return x * (num + _A[3]) / (den + _B[3])


def _erfc_mid(y: np.ndarray) -> np.ndarray:
    num = _C[8] * y
    den = y.copy()
    for i in range(7):
        num = (num + _C[i]) * y
        den = (den + _D[i]) * y
    return _exp_neg_sq(y) * (num + _C[7]) / (den + _D[7])


def _erfc_tail(y: np.ndarray) -> np.ndarray:
    ysq = 1.0 / (y * y)
    num = _P[5] * ysq
    den = ysq.copy()
    for i in range(4):
        num = (num + _P[i]) * ysq
        den = (den + _Q[i]) * ysq
    r = ysq * (num + _P[4]) / (den + _Q[4])
    return _exp_neg_sq(y) * (_SQRPI - r) / y


def erf_reference(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf(x) elementwise in plain NumPy (Cody 1969), float32 or float64; writes `out` if given."""
    x = np.asarray(x)
    if out is None:
        out = np.empty(x.shape, x.dtype if x.dtype.kind == "f" else np.float64)
    xf = x.astype(np.float64).reshape(-1)  # a copy, so `out` may alias `x`
    res = np.empty_like(xf)
    y = np.abs(xf)
    small = y <= _THRESH
    mid = (y > _THRESH) & (y <= 4.0)
    tail = (y > 4.0) & (y < _ONE_AT)
    # erf of a subnormal x is subnormal, and exp(-y^2) is tiny near the tail's end:
    # underflow there is the right answer, not an error.
    with np.errstate(under="ignore"):
        res[small] = _erf_small(xf[small])
        res[mid] = 1.0 - _erfc_mid(y[mid])
        res[tail] = 1.0 - _erfc_tail(y[tail])
    res[y >= _ONE_AT] = 1.0  # includes +-inf
    np.copysign(res, xf, out=res, where=~small)  # erf is odd; the small branch already carries x's sign
    res[np.isnan(xf)] = np.nan
    with np.errstate(under="ignore"):  # rounding a tiny float64 result to a float32 subnormal
        np.copyto(out, res.reshape(x.shape), casting="same_kind")
    return out


register("erf", "reference", erf_reference)


def _build_fused():
    import numba  # lazily: only kernels._load() imports this file, on first kernel use

    from . import fastmath as fm

    @numba.njit(cache=True, parallel=True, error_model="numpy", fastmath={"contract"})
    def _erf(x, out):
        for i in numba.prange(x.shape[0]):
            out[i] = fm.erf(x[i])

    def erf_fused(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """erf(x) elementwise, float32 or float64, as one packed parallel loop (kernels.fastmath's
        erf, in x's precision: <= 2 ulp in float32, ~5e-16 relative in float64)."""
        x = np.asarray(x)
        if out is None:  # in x's float dtype (float16 too), as the reference's
            out = np.empty(x.shape, x.dtype if x.dtype.kind == "f" else np.float64)
        if x.dtype.kind != "f" or x.dtype.itemsize not in (4, 8):
            x = x.astype(np.float64)
        flat_in = np.ascontiguousarray(x).reshape(-1)
        direct = out.flags.c_contiguous and out.dtype == x.dtype
        flat_out = out.reshape(-1) if direct else np.empty(x.size, x.dtype)
        _erf(flat_in, flat_out)  # elementwise, so out may alias x
        if not direct:
            np.copyto(out, flat_out.reshape(x.shape), casting="same_kind")
        return out

    return erf_fused


register("erf", "fused", _build_fused())
