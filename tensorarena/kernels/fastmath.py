"""exp, erf, erfc and the normal CDF for fused kernels, in a form LLVM vectorises.

Numba lowers math.exp / math.erf to scalar libm calls (this llvmlite has no SVML), so a loop
that calls them runs one element at a time. The functions here are straight-line arithmetic
(polynomials, one division, comparisons that become selects, and a bit-built power of two) that
Numba inlines into the caller's loop (`inline="always"`) and LLVM turns into packed AVX code.
Each comes in float32 and float64 flavours; the generic names (`exp`, `erf`, `erfc`,
`ndtr_pdf`) pick the flavour from the argument's type, so a kernel compiled for float32 arrays
computes in float32 (8 lanes per ymm register) and one for float64 in float64. `like(x, c)`
gives a constant in x's type (a bare float literal would promote float32 code to float64), and
`fmax` and `radd` a maximum and an addition whose reductions vectorise.

exp(x): k = round(x / ln2), r = x - k ln2 with ln2 split Cody-Waite style into a short high part
(k * LN2HI is exact) and a low part, exp(r) = 1 + r + r^2 q(r) on |r| <= ln2/2 with q a minimax
polynomial (degree 4 in float32, 9 in float64), times 2^(k-1) built from the exponent bits.

erf(x) = x + x Q(x^2) on |x| < 0.75 (1 + Q minimax for relative error, degree 5 / 9); above,
erf = 1 - erfc with erfc(a) = exp(-a^2) g(s) / (a + L), s = (a - L) / (a + L) (a Moebius map of
[0.75, amax] into (-1, 1), as in Weideman's 1994 erfc method), g a minimax polynomial for
relative error (degree 8 / 18; L = 2.5 / 3). exp(-a^2) takes a^2 as an exact hi + lo pair
(a split into a short high part whose square is exact, Cody's trick), because a rounded a^2
would cost up to 2 a^2 ulps of relative error in the tail. Both branches are computed and one
selected: one division per element and no branches in the loop.

`ndtr_pdf(x)` returns (Phi(x), phi(x)), the standard normal CDF and density, sharing one
exp(-x^2 / 2) computed from the exact square of x. The lower tail Phi(x) = erfc(-x/sqrt2) / 2
keeps its relative accuracy (0.5 * (1 + erf) would not: that cancellation is what broke the ViT
parity test with a 3e-7-absolute erf approximation).

No subnormal is ever computed: results below ~1.5x the smallest normal number are flushed to
zero (exp(x) for x < -86.9 / -708; erfc(a) for a > 8.95 / 26.5, i.e. below 1e-36 / 1e-306;
Phi(x) and phi(x) for |x| > amax * sqrt2), because Intel cores take a ~100-cycle microcode
assist for every subnormal result: a masked softmax whose -inf entries went through the
subnormal range ran 6x slower. Above that the float32 functions are within ~1 ulp (exp, erf)
and ~5 ulp (erfc, Phi) of the float64 truth, the float64 ones within a few 1e-16 relative;
tests/test_fastmath.py pins the bars. exp overflows to inf where the true value does.

All coefficients were fitted for this file by a Remez exchange in 50-digit mpmath
(`python -m tensorarena.kernels.fastmath` refits and prints them); nothing is copied.

Callers: compile with error_model="numpy" (Python's ZeroDivisionError check on the division
stops vectorisation) and fastmath=False or {"contract"} (FMA contraction is harmless here).
Never "reassoc" (it could undo the Cody-Waite split) nor "nnan"/"ninf" (the clamps rely on inf).
Numba's own cache does not track this file for the kernels that inline it (gelu.py, softmax.py,
attention_heads.py, layer_norm.py); kernels/numba_cache.py makes their cache notice edits made here.
"""

from __future__ import annotations

from decimal import Decimal

from . import cpu as _cpu  # noqa: F401 - before numba: it picks the vector width (cpu.py)
import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

# ---------------------------------------------------------------- coefficients (lowest degree first)

# exp: q(r) = (exp(r) - 1 - r) / r^2 on |r| <= ln2 / 2 (minimax relative error 1.24e-7 / 2.04e-16)
_EXP32 = ("0.4999999955283155762272175", "0.1666657731990842883879023", "0.04166685335268173625093338",
          "0.008363140385934458076271908", "0.001390128468392706324643674")
_EXP64 = ("0.5000000000000001014308571", "0.1666666666666664395667821", "0.04166666666662434272820535",
          "0.008333333333356178224626329", "0.001388888891712141979030633", "0.0001984126978470888183017665",
          "0.00002480152142269056925603977", "0.00000275573554844652824230396",
          "0.0000002762003411435863220078548", "2.506816824334393147573872e-8")
# erf: P(t) = erf(sqrt t) / sqrt t on t = x^2 in [0, 0.75^2] (1.42e-9 / 6.71e-17)
_ERF32 = ("1.128379165496458646039717", "-0.3761261875681371575090393", "0.1128337657557014732615984",
          "-0.02683462463129060260309424", "0.005114345680207602124837021", "-0.0006749514172116663124695815")
_ERF64 = ("1.128379167095512498129887", "-0.3761263890318109188205811", "0.1128379167080044523673208",
          "-0.02686617061015020819541601", "0.005223977222632581454452436", "-0.0008548300305543889159992521",
          "0.0001205425023319074432885218", "-0.00001489834647472819275755816", "0.00000160419145995150938451013",
          "-0.0000001270127754369138693116065")
# erfc: g(s) = exp(a^2) erfc(a) (a + L), a = L (1 + s) / (1 - s), on a in [0.75, amax] (6.85e-10 / 5.16e-17)
_ERFC32 = ("1.054031819932720525315789", "-0.804651860085242328062755", "0.4539141832508197054213785",
           "-0.171250630500070910584247", "0.02835967379373661007911349", "0.00838634597739539011907258",
           "-0.004800296493655968404022277", "-0.0004064169135789110432018399", "0.0006274790636549078922493716")
_ERFC64 = ("1.074006907088339669460051", "-0.8833944531698848961690269", "0.5902283571041159428755859",
           "-0.3104672619004087412206811", "0.1195277612862657389611149", "-0.02682723463008656408267198",
           "-0.001212416598128206980502132", "0.003034062085914652519123355", "-0.0005483101095428983224059828",
           "-0.0002767784640975203384318652", "0.0001075648786207098222548437", "0.00003040013203458170630898249",
           "-0.0000174867799331690064512847", "-0.000004748849193941471474373695",
           "0.000002810502528931951896115958", "0.0000009782425549438042828751889",
           "-0.0000004752260443402008617786471", "-0.0000001789408104576799815092466",
           "8.689681398549646164361791e-8")

# Fit settings, shared with the refit below: degrees are len(coefficients) - 1.
_ERF_SPLIT = 0.75  # |x| below: the erf polynomial; above: via erfc
_FIT = {
    np.float32: dict(exp=_EXP32, erf=_ERF32, erfc=_ERFC32, L=2.5,
                     amax=8.95,  # erfc(a) is flushed to 0 beyond: exp(-a^2) < 1.6e-35
                     xlo=-86.9,  # exp(x) flushed to 0 below (< 1.5 FLT_MIN): 2^(k-1) stays normal
                     xmax=89.0,  # exp(x) = inf above 88.72; 89 keeps k <= 128, 2^(k-1) finite
                     ln2hi=0.693359375, ln2lo=-2.12194440054690582e-4,  # ln2hi has 9 bits: k * ln2hi exact
                     split=256.0),  # a < 16: trunc(a * 256) / 256 has <= 12 bits, its square is exact
    np.float64: dict(exp=_EXP64, erf=_ERF64, erfc=_ERFC64, L=3.0,
                     amax=26.5,  # exp(-a^2) < 1.6e-305
                     xlo=-708.0, xmax=710.0,
                     ln2hi=6.93147180369123816490e-01, ln2lo=1.90821492927058770002e-10,  # ln2hi: 32 bits
                     split=524288.0),  # a < 64: trunc(a * 2^19) / 2^19 has <= 25 bits
}


# ---------------------------------------------------------------- building blocks

@intrinsic
def _pow2m1(typingctx, k):
    """2.0**(k - 1) from the exponent bits, for an integral-valued float k with 2^(k-1) normal
    (or one past the largest exponent, which gives inf)."""
    if k == types.float64:
        ity, fty, bias, shift = ir.IntType(64), ir.DoubleType(), 1023 - 1, 52
    elif k == types.float32:
        ity, fty, bias, shift = ir.IntType(32), ir.FloatType(), 127 - 1, 23
    else:
        return None

    def codegen(context, builder, signature, args):
        bits = builder.shl(builder.add(builder.fptosi(args[0], ity), ir.Constant(ity, bias)), ir.Constant(ity, shift))
        return builder.bitcast(bits, fty)

    return k(k), codegen


def _poly(coeffs, ft):
    """An inlinable Horner evaluator with the coefficients frozen in as constants of type ft."""
    names = [f"c{i}" for i in range(len(coeffs))]
    body = names[-1]
    for name in reversed(names[:-1]):
        body = f"({body}) * t + {name}"
    env = {name: ft(float(c)) for name, c in zip(names, coeffs)}
    exec(f"def poly(t):\n    return {body}\n", env)  # noqa: S102 - generated from the tuples above
    return numba.njit(inline="always")(env["poly"])


def _build(ft):
    """The float32 or float64 flavour of every function, as a namespace of inlinable njit functions."""
    fit = _FIT[ft]
    zero, half, one, two = ft(0.0), ft(0.5), ft(1.0), ft(2.0)
    log2e, ln2hi, ln2lo = ft(1.4426950408889634), ft(fit["ln2hi"]), ft(fit["ln2lo"])
    xlo, xmax = ft(fit["xlo"]), ft(fit["xmax"])
    split, inv_split = ft(fit["split"]), ft(1.0 / fit["split"])
    big_l, amax, erf_split = ft(fit["L"]), ft(fit["amax"]), ft(_ERF_SPLIT)
    sqrt1_2, inv_sqrt_2pi = ft(0.7071067811865476), ft(0.3989422804014327)
    xnmax = ft(fit["amax"] * 1.4142135623730951)  # |x| beyond which Phi(-|x|) and phi(x) are flushed
    erf_q = (str(Decimal(fit["erf"][0]) - 1),) + fit["erf"][1:]  # Q = P - 1: erf(x) = x + x Q(x^2)
    q_exp, p_erf, g_erfc = _poly(fit["exp"], ft), _poly(erf_q, ft), _poly(fit["erfc"], ft)
    jit = numba.njit(inline="always")

    @jit
    def exp_hilo(hi, lo):
        # exp(hi + lo) for |lo| << |hi|, lo carrying the bits hi could not hold. Unclamped: the
        # callers keep hi + lo within [xlo, 0].
        kf = np.floor((hi + lo) * log2e + half)
        r = ((hi - kf * ln2hi) + lo) - kf * ln2lo
        p = one + (r + r * r * q_exp(r))
        return (p + p) * _pow2m1(kf)  # p in [0.7, 1.4]: 2p 2^(k-1) keeps both factors normal

    @jit
    def exp(x):
        xc = xlo if x < xlo else (xmax if x > xmax else x)  # NaN passes through
        kf = np.floor(xc * log2e + half)
        r = (xc - kf * ln2hi) - kf * ln2lo
        p = one + (r + r * r * q_exp(r))
        res = (p + p) * _pow2m1(kf)
        return zero if x < xlo else res  # flush: no subnormal ever computed (see the docstring)

    @jit
    def exp_neg_sq(a, scale):
        # exp(-scale * a^2) for 0 <= a < amax * sqrt2, scale 1 or 1/2 (exact): a^2 = ah^2 (exact) + al (a + ah)
        ah = np.trunc(a * split) * inv_split
        return exp_hilo(-scale * (ah * ah), -scale * ((a - ah) * (a + ah)))

    @jit
    def erfc_scaled(a):
        # exp(a^2) erfc(a) = g(s) / (a + L), s = (a - L) / (a + L): one division
        inv = one / (a + big_l)
        return g_erfc((a - big_l) * inv) * inv

    @jit
    def erfc_pos(a):
        # erfc(a) for a >= ~0.75 (finite, meaningless, below); flushed to 0 beyond amax
        ac = amax if a > amax else a
        res = exp_neg_sq(ac, one) * erfc_scaled(ac)
        return zero if a > amax else res  # NaN passes through

    @jit
    def erf(x):
        a = abs(x)
        small = x + x * p_erf(x * x)  # P - 1 fitted: x (1 + Q) rounds better than x P
        big = np.copysign(one - erfc_pos(a), x)
        return small if a < erf_split else big

    @jit
    def erfc(x):
        a = abs(x)
        small = one - (x + x * p_erf(x * x))
        tail = erfc_pos(a)
        return small if a < erf_split else (tail if x > zero else two - tail)

    @jit
    def ndtr_pdf(x):
        # (Phi(x), phi(x)): one exp(-x^2 / 2) from the exact square of x serves both
        xa = abs(x)
        xc = xnmax if xa > xnmax else xa
        e = exp_neg_sq(xc, half)
        e = zero if xa > xnmax else e  # flush, as erfc_pos; NaN passes through
        tail = half * e * erfc_scaled(xc * sqrt1_2)  # Phi(-|x|) = erfc(|x| / sqrt2) / 2
        u = x * sqrt1_2
        small = half + half * (u + u * p_erf(u * u))
        cdf = small if abs(u) < erf_split else (one - tail if x > zero else tail)
        return cdf, e * inv_sqrt_2pi

    return dict(exp=exp, exp_hilo=exp_hilo, erf=erf, erfc=erfc, ndtr_pdf=ndtr_pdf)


_F32 = _build(np.float32)
_F64 = _build(np.float64)

exp32, erf32, erfc32, ndtr_pdf32 = _F32["exp"], _F32["erf"], _F32["erfc"], _F32["ndtr_pdf"]
exp64, erf64, erfc64, ndtr_pdf64 = _F64["exp"], _F64["erf"], _F64["erfc"], _F64["ndtr_pdf"]


# ---------------------------------------------------------------- generic names for kernels

def _generic(name: str):
    f32, f64 = _F32[name], _F64[name]

    def stub(x):
        """Callable only from Numba-compiled code (dispatches on float32 / float64)."""
        raise TypeError(f"fastmath.{name} is for Numba-compiled code; use {name}32 / {name}64 in a loop")

    stub.__name__ = stub.__qualname__ = name

    @overload(stub, inline="always")
    def _impl(x):
        if x == types.float32:
            return lambda x: f32(x)
        if x == types.float64:
            return lambda x: f64(x)
        if isinstance(x, (types.Integer, types.Boolean)) or x == types.float16:
            return lambda x: f64(np.float64(x))
        return None

    return stub


def like(x, value):
    """`value` as a constant of x's float type (float64 for anything else), for use in Numba code:
    a bare Python float literal would promote float32 arithmetic to float64."""
    raise TypeError("fastmath.like is for Numba-compiled code")


@overload(like, inline="always")
def _like(x, value):
    if x == types.float32:
        return lambda x, value: np.float32(value)
    return lambda x, value: np.float64(value)


@intrinsic
def fmax(typingctx, a, b):
    """max(a, b) as LLVM's `maximum` (NaN wins, as in np.max): unlike `a if a > b else b`, a loop
    reducing with it vectorises."""
    if a != b or a not in (types.float32, types.float64):
        return None

    def codegen(context, builder, signature, args):
        fty = args[0].type
        fn = builder.module.declare_intrinsic("llvm.maximum", [fty], ir.FunctionType(fty, [fty, fty]))
        return builder.call(fn, args)

    return a(a, b), codegen


@intrinsic
def radd(typingctx, a, b):
    """a + b with LLVM's `reassoc` flag on this one addition: a loop summing with it vectorises
    (in partial sums), while the rest of the loop body keeps strict IEEE evaluation."""
    if a != b or a not in (types.float32, types.float64):
        return None

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1], flags=("reassoc",))

    return a(a, b), codegen


exp = _generic("exp")
erf = _generic("erf")
erfc = _generic("erfc")
ndtr_pdf = _generic("ndtr_pdf")


# ---------------------------------------------------------------- refitting (needs mpmath; not imported otherwise)

def _remez(f, lo, hi, deg, mp, ngrid=2000, iters=30):
    """Minimax polynomial (monomial coefficients) for relative error of f on [lo, hi]; returns (coeffs, error)."""
    lo, hi = mp.mpf(lo), mp.mpf(hi)
    n = deg + 2
    ref = [(lo + hi) / 2 - (hi - lo) / 2 * mp.cos(mp.pi * i / (n - 1)) for i in range(n)]
    grid = [(lo + hi) / 2 - (hi - lo) / 2 * mp.cos(mp.pi * i / (ngrid - 1)) for i in range(ngrid)]
    fgrid = [f(x) for x in grid]
    best = None
    for _ in range(iters):
        a, b = mp.matrix(n, n), mp.matrix(n, 1)
        for i, x in enumerate(ref):
            fx = f(x)
            for k in range(deg + 1):
                a[i, k] = x ** k
            a[i, deg + 1] = (-1) ** i * abs(fx)  # levelled relative error
            b[i] = fx
        sol = mp.lu_solve(a, b)
        c, level = [sol[k] for k in range(deg + 1)], abs(sol[deg + 1])
        errs = []
        for x, fx in zip(grid, fgrid):
            p = mp.mpf(0)
            for ck in reversed(c):
                p = p * x + ck
            errs.append((p - fx) / abs(fx))
        worst = max(abs(e) for e in errs)
        if best is None or worst < best[1]:
            best = (c, worst)
        ext, start = [], 0  # the extremum of each run of equal sign
        for i in range(1, ngrid + 1):
            if i == ngrid or mp.sign(errs[i]) != mp.sign(errs[start]):
                ext.append(max(range(start, i), key=lambda j: abs(errs[j])))
                start = i
        while len(ext) > n:
            ext.pop(0 if abs(errs[ext[0]]) < abs(errs[ext[-1]]) else -1)
        if len(ext) < n or worst <= level * (1 + mp.mpf("1e-4")):
            break
        ref = [grid[j] for j in ext]
    return best


def _refit() -> None:
    import mpmath as mp

    mp.mp.dps = 50
    ln2 = mp.log(2)

    def q_exp(r):
        return (mp.exp(r) - 1 - r) / r ** 2 if abs(r) > mp.mpf("1e-30") else mp.mpf(1) / 2 + r / 6

    def erf_over_x(t):
        return mp.erf(mp.sqrt(t)) / mp.sqrt(t) if t > 0 else 2 / mp.sqrt(mp.pi)

    for ft, tag in ((np.float32, "32"), (np.float64, "64")):
        fit = _FIT[ft]
        big_l, c = mp.mpf(fit["L"]), mp.mpf(_ERF_SPLIT)

        def g(s, big_l=big_l):
            a = big_l * (1 + s) / (1 - s)
            return mp.exp(a * a) * mp.erfc(a) * (a + big_l)

        s_lo, s_hi = (c - big_l) / (c + big_l), (fit["amax"] - big_l) / (fit["amax"] + big_l)
        for name, f, lo, hi, deg in (("EXP", q_exp, -ln2 / 2, ln2 / 2, len(fit["exp"]) - 1),
                                     ("ERF", erf_over_x, 0, c * c, len(fit["erf"]) - 1),
                                     ("ERFC", g, s_lo, s_hi, len(fit["erfc"]) - 1)):
            coeffs, err = _remez(f, lo, hi, deg, mp)
            print(f"_{name}{tag} = ({', '.join(repr(mp.nstr(x, 25)) for x in coeffs)})  # rel. error {mp.nstr(err, 3)}")


if __name__ == "__main__":
    _refit()
