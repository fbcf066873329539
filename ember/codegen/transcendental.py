"""Transcendentals as polynomials: EXP, EXP2, LOG, LOG2 on vector lanes become range reduction and a polynomial.
Runs after apply_opts, before expand.

Why: libm has no vector form, so expand builds each of these lane by lane (GEP out, a call per lane, VECTORIZE
back); written with ADD, MUL, WHERE, comparisons and bit casts they become vector code like the rest of the kernel.

Before: EXP/EXP2/LOG/LOG2 nodes of any float dtype.
After:  those of float32 that lie under the kernel's vector range (the lane range expand turns into vectors) are
        built from ops the vector C renderer has. Every node of a kernel with no vectors (NOOPT, scalar renderers)
        keeps libm, so unoptimized results stay libm's; so do float64 (a double polynomial within an ulp needs more
        terms and care) and float16/bfloat16: the C renderer has no vectors of them, so their lanes convert to float
        one by one either way, and the polynomial paid nothing (exp of 16M float16: 32 ms with libm, 28 ms). SIN,
        COS and the other libm functions keep their calls (sin and cos of large arguments need a reduction by pi/2
        to more bits than float32 has).

    EXP(x)  ->  n = round(x*log2(e)), r = x - n*ln2 (in two parts),  (1 + r + r*r*Q(r)) * 2**(n-a) * 2**a

Accuracy: every float32 input gives a result within 1 ulp of the correctly rounded value (all 2**32 inputs were
checked once; tests sweep every 1021st), with IEEE results at the edges: denormal results and underflow to 0,
overflow to inf, exp(-inf) = 0, log(0) = -inf, log(x < 0) = NaN, NaN in gives NaN, exp(0) = 1 and log(1) = 0
exactly, log2 of a power of two exact.
No float is converted to an integer (ember's conversion is guarded, and not vectorized): n is rounded by adding
1.5 * 2**23, which leaves it in the low bits of the sum, and a power of two is built by multiplying those bits
by 2**23 as uint32 (wrapping, no undefined behaviour), which moves them into the exponent field.

The coefficients are minimax fits of the reduced function (relative error, weighted as it reaches the result),
solved as a linear program over 2000 Chebyshev points of the reduction interval against mpmath; each coefficient
rounded to float32 in turn, the ones after it fitted again. tests/codegen/test_transcendental.py checks the bounds.
"""

from __future__ import annotations

import math

from ember.codegen.expand import vector_width
from ember.codegen.opt import LANE_KINDS
from ember.dtype import DType, dtypes
from ember.renderer import Renderer
from ember.uop.ops import Ops, UOp
from ember.uop.upat import PatternMatcher, UPat, graph_rewrite

ROUNDER = 1.5 * 2**23  # x + ROUNDER rounds x to an integer n (|x| < 2**22) and leaves n + 0x400000 in the low bits
LN2_HI = 45426 / 2**16  # ln 2 to 16 bits: n * LN2_HI is exact for |n| < 2**8
LN2_LO = math.log(2) - LN2_HI
LOG2E_HI = 0x1714 / 2**12  # log2(e) to 11 bits: times a 12-bit number, exact
LOG2E_LO = math.log2(math.e) - LOG2E_HI
SQRT_HALF_BITS = 0x3F3504F3  # float32 sqrt(0.5): log splits x into 2**e * m with m in [sqrt(0.5), sqrt(2))

# e**r = 1 + r + r*r*EXP_Q(r) on |r| <= ln(2)/2: relative error 3.3e-9 (float32's half ulp is 3e-8)
EXP_Q = (0.4999999403953552, 0.1666651964187622, 0.04166829213500023, 0.008368907496333122, 0.0013819169253110886)
# 2**r = 1 + r*EXP2_P(r) on |r| <= 1/2: relative error 3.0e-9
EXP2_P = (0.6931471824645996, 0.24022647738456726, 0.05550359934568405, 0.009618505835533142, 0.0013390806270763278,
          0.00015326471475418657)
# log(1+f) = f - f*f/2 + s*(f*f/2 + z*LOG_R(z)), s = f/(2+f), z = s*s <= 0.0295: the series of 2*atanh(s), fitted
# (relative error 2.5e-11)
LOG_R = (0.6666666269302368, 0.40000975131988525, 0.28498485684394836, 0.242862269282341)


def const(value: float, dtype: DType = dtypes.float32) -> UOp: return UOp.const(dtype, value)
def bits(x: UOp, dtype: DType = dtypes.uint32) -> UOp: return UOp(Ops.BITCAST, dtype, (x,))


def horner(x: UOp, coefficients: tuple[float, ...]) -> UOp:
    """c0 + x*(c1 + x*(c2 + ...)), a rounded product and a rounded sum per step (no fma: the same bits everywhere)."""
    acc = const(coefficients[-1])
    for c in reversed(coefficients[:-1]): acc = acc * x + c
    return acc


def scale_by_power_of_two(p: UOp, rounded: UOp, n: UOp) -> UOp:
    """p * 2**n for an integer n in [-190, 191] that `rounded` (n + ROUNDER) holds in its low bits, rounded once.

    2**n itself may not be a float32 (n = 128, or below -126), so it is applied as 2**(n-a) * 2**a with a = 64 or
    -64: p * 2**(n-a) is exact, and the one rounding is the last product's, into the denormals where it must."""
    below = n < 0.0
    biased = rounded + below.where(const(127.0 + 64), const(127.0 - 64))  # n - a + 127 in the low bits
    shifted = bits(biased) * const(2**23, dtypes.uint32)  # those bits moved into the exponent field
    return p * bits(shifted, dtypes.float32) * below.where(const(2.0**-64), const(2.0**64))


def exp_float32(x: UOp) -> UOp:
    """e**x in float32: x = n*ln(2) + r with |r| <= ln(2)/2, e**x = 2**n * e**r."""
    rounded = x * math.log2(math.e) + ROUNDER
    n = rounded - ROUNDER
    r = (x - n * LN2_HI) - n * LN2_LO  # n * LN2_HI is exact, and so is the first difference (Sterbenz)
    p = const(1.0) + (r + r * r * horner(r, EXP_Q))
    value = scale_by_power_of_two(p, rounded, n)
    # past the bounds (e**x below half the least denormal, above the largest float) n leaves the range scaling
    # holds; -inf and +inf land here too. NaN passes through every product.
    return (x < -120.0).where(0.0, (x > 100.0).where(math.inf, value))


def exp2_float32(x: UOp) -> UOp:
    """2**x in float32: x = n + r with |r| <= 1/2 (exact), 2**x = 2**n * 2**r."""
    rounded = x + ROUNDER
    n = rounded - ROUNDER
    r = x - n
    value = scale_by_power_of_two(const(1.0) + r * horner(r, EXP2_P), rounded, n)
    return (x < -160.0).where(0.0, (x > 140.0).where(math.inf, value))


def log_parts(x: UOp) -> tuple[UOp, UOp, UOp]:
    """(e, f, c) with x = 2**e * (1+f), 1+f in [sqrt(0.5), sqrt(2)), and log(1+f) = f + c (c small against f)."""
    denormal = x < 2.0**-126
    normal = denormal.where(x * 2.0**23, x)  # a denormal's exponent field is 0: scale it into the normal range
    moved = bits(normal) + const(0x3F800000 - SQRT_HALF_BITS, dtypes.uint32)  # m >= sqrt(2) carries into e
    biased = (bits(moved, dtypes.int32) & 0x7F800000).cast(dtypes.float32)  # (e + bias) * 2**23, exact
    e = biased * 2.0**-23 - denormal.where(const(127.0 + 23), const(127.0))
    f = bits((moved & 0x007FFFFF) + SQRT_HALF_BITS, dtypes.float32) - 1.0  # exact (Sterbenz)
    s = f / (f + 2.0)
    z = s * s
    half_square = f * f * 0.5
    return e, f, s * (half_square + z * horner(z, LOG_R)) - half_square


def log_special_values(x: UOp, value: UOp) -> UOp:
    """log at the inputs the reduction does not cover: NaN and +inf give themselves, x < 0 NaN, +-0 -inf."""
    value = (x < math.inf).where(value, x)
    return x.eq(0.0).where(-math.inf, (x < 0.0).where(math.nan, value))


def log_float32(x: UOp) -> UOp:
    """log(x) in float32: e*ln(2) + log(1+f), the exact e*LN2_HI added last."""
    e, f, c = log_parts(x)
    return log_special_values(x, e * LN2_HI + (f + (c + e * LN2_LO)))


def log2_float32(x: UOp) -> UOp:
    """log2(x) in float32: e + (f + c)*log2(e), with f*log2(e) in two parts: the top 12 bits of f times LOG2E_HI are
    exact, so a power of two gives e exactly and x near 1 loses no more than the last rounding."""
    e, f, c = log_parts(x)
    f_hi = bits(bits(f) & 0xFFFFF000, dtypes.float32)
    low = (f - f_hi) * LOG2E_HI + (f * LOG2E_LO + c * math.log2(math.e))
    return log_special_values(x, e + (f_hi * LOG2E_HI + low))


POLYNOMIALS = {Ops.EXP: exp_float32, Ops.EXP2: exp2_float32, Ops.LOG: log_float32, Ops.LOG2: log2_float32}


def approximate(ctx: UOp, x: UOp) -> UOp | None:
    """The polynomial form of x when x lies under the vector range `ctx` (elsewhere a libm call per value costs what
    the polynomial would)."""
    return POLYNOMIALS[x.op](x.src[0]) if ctx in x.ranges else None


pm_approximate_transcendentals = PatternMatcher([
    (UPat(tuple(POLYNOMIALS), dtype=dtypes.float32, name="x"), approximate),
])


def vector_range(sink: UOp, renderer: Renderer) -> UOp | None:
    """The range expand makes vector lanes of (the first lane range applied), if the renderer builds a vector of
    more than one lane from it and has the vector ops the polynomials use."""
    lane_ranges = sorted((u for u in sink.toposort() if u.op is Ops.RANGE and u.arg.kind in LANE_KINDS),
                         key=lambda r: r.arg.axis)
    if not lane_ranges or (width := vector_width(sink, lane_ranges[0], renderer)) < 2: return None
    lanes = UOp(Ops.VECTORIZE, dtypes.float32.vec(width), (const(0.0),) * width)
    as_bits = UOp(Ops.BITCAST, dtypes.int32.vec(width), (lanes,))
    needed = [as_bits, as_bits.cast(dtypes.float32.vec(width))]
    return lane_ranges[0] if all(renderer.renders_vector(u) for u in needed) else None


def approximate_transcendentals(sink: UOp, renderer: Renderer) -> UOp:
    """The kernel with EXP/EXP2/LOG/LOG2 under its vector range as polynomials (see the module docstring)."""
    if (vector := vector_range(sink, renderer)) is None: return sink
    return graph_rewrite(sink, pm_approximate_transcendentals, ctx=vector, name="approximate_transcendentals")
