"""ember's float64 sine and cosine for the CPU: the C kernels, the exported C++ and the numpy interpreter.

Why: libm has no vector form. A vmapped step's sin and cos went lane by lane, a call per lane that spills every
live vector register around it: two thirds of a vmapped cart-pole jacobian's time (bench/numerical.py, case v).
Written from + - * and selects, the same function runs on a whole vector and on one double, and gives the same
bits in C, in C++ and in numpy (each operation is one IEEE operation in all three, never fused), so the native
code, the C kernels and the interpreter still agree bit for bit.

The algorithm, for |x| <= 2**20 (other lanes, NaN and inf included, call libm):
    n = round(x * 2/pi)                     (adding 1.5 * 2**52 rounds; n mod 4 is in the sum's low bits)
    r = x - n*P1 - n*P2 - n*P3 = hi + lo    (pi/2 in three parts: P1 and P2 of 33 bits, so n*P1 and n*P2 are
                                             exact for |n| < 2**20 and x - n*P1 is exact by Sterbenz's lemma;
                                             the rest is carried in lo by two-sums)
    sin r = hi + (hi^3 S(r^2) + lo (1 - r^2/2)),   cos r = (1 - r^2/2) + error of that + r^4 C(r^2) - hi lo
    sin x, cos x = +-sin r or +-cos r by n mod 4
A lane whose hi is below 2**-30 with n != 0 (x within 2**-30 of a multiple of pi/2, where the 119 bits of pi/2
leave too few of r) calls libm too, as does one with |x| > 2**20: those lanes get libm's bits.

On a double (lanes 1) branches replace the vector form's selects: |x| < 0.75 (n = 0, r = x) skips the reduction,
and the quadrant's parity picks the one polynomial the result is made of: the same bits, without the reduction's
latency in a chain of scalar steps (a rollout) or a polynomial thrown away.

Accuracy: within 0.77 ulp of the true value (libm's: 0.51), checked against mpmath at 10^5 points of every
scale, multiples of pi/4 and their neighbours (tests/codegen/test_sincos.py); about 2-3% of results differ from
glibc's in the last bit. sin(-0) = -0, sin of a tiny or subnormal x is x, cos(0) = 1, NaN and inf give NaN.
Cost: a sin and cos of one x in 2.3 ns per lane on AVX-512 vectors (libm: 12.5 ns), 11 ns on a double.

The polynomials: (sin(r) - r) / r^3 and (cos(r) - 1 + r^2/2) / r^4 in z = r^2 on [0, 0.786^2], least-squares fits
(weighted as their errors reach the result: by z and z^2) on 300 Chebyshev points against mpmath, each coefficient
rounded to a double in turn and the later ones fitted again: relative errors 2**-57.9 and 2**-64.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ember.dtype import DType, dtypes
from ember.renderer.cvector import select as vector_select
from ember.uop.ops import Ops, UOp

SIN_POLY = (-0.1666666666666663, 0.008333333333321952, -0.0001984126982949369, 2.7557313595130822e-06,
            -2.505074427098093e-08, 1.5896048324871652e-10)
COS_POLY = (0.041666666666666595, -0.001388888888887344, 2.4801587289096124e-05, -2.7557314249496867e-07,
            2.0875710193409654e-09, -1.135900712652284e-11)
PIO2 = (1.5707963267341256, 6.077100506303966e-11, 2.0222662487959506e-21)  # pi/2 = P1 + P2 + P3 (33, 33, 53 bits)
TWO_OVER_PI = 0.6366197723675814
SHIFTER = 1.5 * 2.0**52  # 1.5 * 2**52: x + SHIFTER - SHIFTER rounds x to an integer (|x| < 2**51)
BOUND = 2.0**20  # |x| above it: libm (n*P1 and n*P2 exact needs |n| < 2**20)
NEAR = 2.0**-30  # |r| below it, n != 0: libm (x within NEAR of a multiple of pi/2)
REDUCED = 0.75  # below pi/4: n = 0, r = x exactly
TINY = 2.0**-27  # |x| below it: sin x rounds to x (and keeps -0 and subnormals)
OPERATIONS = 60  # float operations a sine or cosine costs on a vector (the heuristic's weight for it)

FUNCTIONS = {Ops.SIN: "sin", Ops.COS: "cos"}


def computes(u: UOp) -> bool:
    """Whether `u` is a sine or cosine these functions compute (float64, any lanes)."""
    return u.op in FUNCTIONS and u.dtype.scalar is dtypes.float64


# ---- numpy (export/interpreter.py): the operations of the C below, in its order ----

def _horner(z: np.ndarray, coefficients: tuple[float, ...]) -> np.ndarray:
    p = np.full_like(z, coefficients[-1])
    for c in coefficients[-2::-1]: p = p * z + c
    return p


def numpy_sincos(op: Ops, x: np.ndarray) -> np.ndarray:
    """sin or cos of float64 `x` as the C helpers compute it, bit for bit."""
    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        k = x * TWO_OVER_PI + SHIFTER
        n = k - SHIFTER
        q = np.ascontiguousarray(k).view(np.int64) & 3
        a = x - n * PIO2[0]
        t = n * PIO2[1]
        hi0 = a - t
        a2 = hi0 + t
        lo0 = (a - a2) + (-t - (hi0 - a2))  # two-sum: the error of hi0
        lo1 = lo0 - n * PIO2[2]
        hi = hi0 + lo1
        lo = lo1 - (hi - hi0)
        z = hi * hi
        w = z * hi
        half = 1.0 - 0.5 * z
        s = hi + (w * SIN_POLY[0] + (w * z * _horner(z, SIN_POLY[1:]) + lo * half))
        c = half + (((1.0 - half) - 0.5 * z) + (z * z * _horner(z, COS_POLY) - hi * lo))
        if op is Ops.SIN:
            v = np.where(q & 1, c, s)
            v = np.where(q & 2, -v, v)
            v = np.where(np.abs(x) < TINY, x, v)
        else:
            v = np.where(q & 1, s, c)
            v = np.where((q + 1) & 2, -v, v)
        ax = np.abs(x)
        libm = ~((ax <= BOUND) & ((np.abs(hi) >= NEAR) | (ax < REDUCED)))
    if libm.any():
        f = math.sin if op is Ops.SIN else math.cos
        v = np.array(v, copy=True)
        v[libm] = [f(e) if math.isfinite(e) else math.nan for e in x[libm].tolist()]
    return v


# ---- C and C++ ----

def helper_name(op: Ops, dtype: DType) -> str:
    """The helper computing `op` on `dtype` (float64 or a vector of float64): ember_sin_f64, ember_cos_f64x8."""
    return f"ember_{FUNCTIONS[op]}_f64" + (f"x{dtype.count}" if dtype.count > 1 else "")


def horner(name: str, coefficients: tuple[float, ...]) -> list[tuple[str, str]]:
    """Statements evaluating the polynomial with `coefficients` (lowest first) at z into `name`, as _horner does."""
    steps, last = [], coefficients[-1].hex()
    for i in range(len(coefficients) - 2, -1, -1):
        steps += [(f"{name}{i}m", f"z*{last}"), (f"{name}{i}" if i else name, f"{name}{i}m+{coefficients[i].hex()}")]
        last = f"{name}{i}"
    return steps


# ember_sincos_T's statements as (name, expression); `select(m,a,b)` stands for the dialect's select. numpy_sincos
# computes the same operations in the same order. The reduction: x = n*pi/2 + hi + lo, n mod 4 in k's low bits.
_REDUCTION = [("k0", f"x*{TWO_OVER_PI.hex()}"), ("k", f"k0+{SHIFTER.hex()}"), ("n", f"k-{SHIFTER.hex()}"),
              ("m1", f"n*{PIO2[0].hex()}"), ("a", "x-m1"), ("t", f"n*{PIO2[1].hex()}"), ("hi0", "a-t"), ("a2", "hi0+t"),
              ("b2", "hi0-a2"), ("da", "a-a2"), ("nt", "-t"), ("db", "nt-b2"), ("lo0", "da+db"),
              ("m3", f"n*{PIO2[2].hex()}"), ("lo1", "lo0-m3"), ("hr", "hi0+lo1"), ("dh", "hr-hi0"), ("lr", "lo1-dh")]
# sin(hi + lo) into s and cos(hi + lo) into c, from z = hi^2 and half = 1 - z/2
_SQUARE = [("z", "hi*hi"), ("hz", "0.5*z"), ("half", "1.0-hz")]
_SINE = [("w", "z*hi"), *horner("ps", SIN_POLY[1:]), ("wz", "w*z"), ("wzp", "wz*ps"), ("lh", "lo*half"),
         ("tail", "wzp+lh"), ("w1", f"w*{SIN_POLY[0].hex()}"), ("st", "w1+tail"), ("s", "hi+st")]
_COSINE = [*horner("pc", COS_POLY), ("zz", "z*z"), ("zzq", "zz*pc"), ("hl", "hi*lo"), ("ct", "zzq-hl"),
           ("e1", "1.0-half"), ("e2", "e1-hz"), ("e3", "e2+ct"), ("c", "half+e3")]
_NEGATED = [("nx", "-x"), ("nh", "-hi")]
_MASKS = [("xneg", "x<0.0"), ("hneg", "hi<0.0")]
_ABSOLUTE = [("ax", "select(xneg,nx,x)"), ("ah", "select(hneg,nh,hi)")]
_LIBM_LANES = [("inside", f"ax<={BOUND.hex()}"), ("away", f"ah>={NEAR.hex()}"), ("first", f"ax<{REDUCED}"),
               ("kept", "away|first")]


# sin and cos from the core's (s, c, quadrant q): q odd swaps them, and the sign follows q (sin) or q + 1 (cos)
_PICK = {Ops.SIN: [("m", "odd", "(q&1)!=0"), ("v", "v0", "select(odd,c,s)"), ("v", "nv", "-v0"),
                   ("m", "negative", "(q&2)!=0"), ("v", "v1", "select(negative,nv,v0)"), ("v", "nx", "-x"),
                   ("m", "xneg", "x<0.0"), ("v", "ax", "select(xneg,nx,x)"), ("m", "tiny", f"ax<{TINY.hex()}")],
         Ops.COS: [("m", "odd", "(q&1)!=0"), ("v", "v0", "select(odd,s,c)"), ("v", "nv", "-v0"),
                   ("m", "negative", "((q+1)&2)!=0")]}
_RESULT = {Ops.SIN: "select(tiny,x,v1)", Ops.COS: "select(negative,nv,v0)"}
SELECT = re.compile(r"select\((\w+),(\w+),(\w+)\)")


class _Dialect:
    """How ember_sin/ember_cos of one type are written: statements of values and masks, the select."""

    def __init__(self, lanes: int, cpp: bool) -> None:
        self.lanes, self.vector, self.cpp = lanes, lanes > 1, cpp
        self.t, self.bits = (f"f64x{lanes}", f"i64x{lanes}") if lanes > 1 else ("double", "int64_t")
        self.mask, self.name = (self.bits, f"f64x{lanes}") if lanes > 1 else ("int", "f64")
        self.head = "EMBER_KERNEL EMBER_INLINE" if cpp else "static inline __attribute__((always_inline))"
        self.quadrant = f"({self.bits})k" if lanes > 1 else "bit_cast<int64_t>(k)" if cpp else "ember_bits_f64(k)"

    def expr(self, e: str) -> str:
        def select(m: re.Match) -> str:
            c, a, b = m.groups()
            return vector_select(c, a, b, dtypes.float64.vec(self.lanes)) if self.vector else f"({c}?{a}:{b})"
        return SELECT.sub(select, e)

    def values(self, steps: list[tuple[str, str]], pad: str = "  ") -> list[str]:
        return [f"{pad}const {self.t} {n} = {self.expr(e)};" for n, e in steps]

    def masks(self, steps: list[tuple[str, str]], pad: str = "  ") -> list[str]:
        return [f"{pad}const {self.mask} {n} = {self.expr(e)};" for n, e in steps]

    def libm(self, fn: str) -> str: return f"{'::' if self.cpp else ''}{fn}"


def c_helpers(lanes: int, cpp: bool, ops: frozenset[Ops] = frozenset(FUNCTIONS)) -> str:
    """ember_sin_T and ember_cos_T for T = double (lanes 1) or f64x<lanes> (whose type and i64x<lanes> mask the
    vector prelude declares), of the `ops` wanted (an unused function is a clang warning), in C (`cpp` False: the
    CPU device's kernels) or C++ (the exported module). Each statement is one operation: no compiler contracts two
    into an FMA (clang does within a statement)."""
    d = _Dialect(lanes, cpp)
    out = [] if lanes > 1 or cpp else ["static inline int64_t ember_bits_f64(double x) { union { double d; int64_t i; "
                                       "} u = { x }; return u.i; }"]
    out += vector_functions(d, lanes, ops) if lanes > 1 else [line for op in FUNCTIONS if op in ops
                                                               for line in scalar_function(d, op)]
    return "\n".join(out) + "\n"


def vector_functions(d: _Dialect, lanes: int, ops: frozenset[Ops]) -> list[str]:
    """ember_sincos_f64x<lanes> computes both polynomials and selects (inlined into a kernel with a sin and a cos of
    one x, the compiler computes it once); ember_sin/ember_cos pick from it, then libm for the lanes left (one test
    of all lanes first: half the time of a test per lane)."""
    t, bits, mask = d.t, d.bits, d.mask
    out = [f"{d.head} void ember_sincos_{d.name}({t} x, {t}* sin_r, {t}* cos_r, {bits}* quadrant, {mask}* reduced) {{",
           *d.values(_REDUCTION), f"  const {t} hi = hr;", f"  const {t} lo = lr;", f"  const {bits} q = {d.quadrant};",
           *d.values(_SQUARE + _SINE + _COSINE + _NEGATED), *d.masks(_MASKS), *d.values(_ABSOLUTE),
           *d.masks(_LIBM_LANES), "  *sin_r = s;", "  *cos_r = c;", "  *quadrant = q;", "  *reduced = inside&kept;",
           "}"]
    every = "&".join(f"r[{i}]" for i in range(lanes))
    for op, fn in FUNCTIONS.items():
        if op not in ops: continue
        out += [f"{d.head} {t} ember_{fn}_{d.name}({t} x) {{", f"  {t} s, c;", f"  {bits} q;", f"  {mask} reduced;",
                f"  ember_sincos_{d.name}(x, &s, &c, &q, &reduced);",
                *(line for kind, n, e in _PICK[op] for line in (d.values if kind == "v" else d.masks)([(n, e)])),
                f"  {t} v = {d.expr(_RESULT[op])};", f"  int64_t r[{lanes}];",
                "  __builtin_memcpy(r, &reduced, sizeof r);", f"  if (!({every}))",
                f"    for (int i = 0; i < {lanes}; i++) if (!r[i]) v[i] = {d.libm(fn)}(x[i]);", "  return v;", "}"]
    return out


def scalar_function(d: _Dialect, op: Ops) -> list[str]:
    """ember_sin_f64 or ember_cos_f64 on a double, with branches where the vector form selects: |x| < REDUCED (n = 0,
    hi = x, lo = 0) skips the reduction, and the quadrant's parity picks the one polynomial the result is made of.
    The same bits, without the reduction's latency in a chain of scalar steps (a rollout: 14.6 ns a sin and cos,
    libm's 19.5, 23 without the branches) or a polynomial thrown away."""
    fn = FUNCTIONS[op]
    own, other, sign = (_SINE, _COSINE, "(q&2)!=0") if op is Ops.SIN else (_COSINE, _SINE, "((q+1)&2)!=0")
    tiny = [*d.values([("nx", "-x")]), *d.masks([("xneg", "x<0.0")]), *d.values([("ax", "select(xneg,nx,x)")]),
            *d.masks([("tiny", f"ax<{TINY.hex()}")])] if op is Ops.SIN else []
    near = ["  return (tiny?x:s);"] if op is Ops.SIN else ["  return c;"]
    quadrant_of = ("c", "s") if op is Ops.SIN else ("s", "c")  # v0 for an odd and an even quadrant
    absolute = [*d.values([("nx", "-x")]), *d.masks(_MASKS), *d.values(_ABSOLUTE)]
    absolute += d.masks([("tiny", f"ax<{TINY.hex()}")]) if op is Ops.SIN else []
    return [f"{d.head} double ember_{fn}_f64(double x) {{", f"  if (x < {REDUCED} && x > -{REDUCED}) {{",
            "    const double hi = x;", "    const double lo = 0.0;",
            *("  " + line for line in d.values(_SQUARE + own) + tiny + near), "  }",
            *d.values(_REDUCTION), "  const double hi = hr;", "  const double lo = lr;",
            f"  const int64_t q = {d.quadrant};", *d.values(_SQUARE), "  double v0;", "  if ((q&1)!=0) {",
            *d.values(other, "    "), f"    v0 = {quadrant_of[0]};", "  } else {", *d.values(own, "    "),
            f"    v0 = {quadrant_of[1]};", "  }", *d.values([("nv", "-v0")]), *d.masks([("negative", sign)]),
            *d.values([("v1", "select(negative,nv,v0)"), ("nh", "-hi")]), *absolute, *d.masks(_LIBM_LANES),
            f"  double v = {d.expr('select(tiny,x,v1)' if op is Ops.SIN else 'v1')};",
            f"  if (!(inside&kept)) v = {d.libm(fn)}(x);", "  return v;", "}"]


def used(uops: list[UOp]) -> dict[int, frozenset[Ops]]:
    """The float64 sines and cosines among `uops`: by lane count (1: a double), which of the two."""
    found: dict[int, set[Ops]] = {}
    for u in uops:
        if computes(u): found.setdefault(u.dtype.count, set()).add(u.op)
    return {lanes: frozenset(ops) for lanes, ops in sorted(found.items())}
