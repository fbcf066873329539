"""The reference semantics of ALU ops on Python scalars, and an interpreter for scalar UOp graphs.

Constant folding calls `exec_alu`, so folded constants mean what the rendered C means: integer division truncates
toward zero, `%` takes the sign of the dividend, fixed-width integers wrap, floats round to their width.
Tests use `evaluate` as the oracle for rewrites: a rewrite is right when the value at every point is unchanged.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping

from ember.dtype import DType, truncate
from ember.uop.ops import ConstType, GroupOp, Ops, UOp, c_idiv


def c_mod(a: int, b: int) -> int:
    """a % b with the sign of a (C). b must not be 0."""
    return a - b * c_idiv(a, b)


def _fdiv(a: float, b: float) -> float:
    if b != 0: return a / b
    if a == 0 or math.isnan(a): return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _log(x: float, log: Callable[[float], float]) -> float:
    if math.isnan(x) or x < 0: return math.nan
    if x == 0: return -math.inf
    return log(x)


def _exp(x: float, base: float) -> float:
    try:  # the C library's exp and exp2 (2.0 ** x is its pow, which differs from exp2 in about 1 case in 1000)
        return math.exp(x) if base == math.e else math.exp2(x)
    except OverflowError:
        return math.inf


def _max(a: ConstType, b: ConstType) -> ConstType:
    if isinstance(a, float) and math.isnan(a): return a
    if isinstance(b, float) and math.isnan(b): return b
    return a if a > b else b  # as the rendered code: max(-0.0, 0.0) is 0.0, like numpy


def _fmod(a: float, b: float) -> float:
    return math.nan if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b) else math.fmod(a, b)


def _libm(fn: Callable[[float], float]) -> Callable[[float], float]:
    """A math-module function with C's answers outside its domain: NaN for invalid input, inf on overflow."""
    def call(x: float) -> float:
        if math.isnan(x): return x
        try:
            return fn(x)
        except ValueError:  # acos(2), atanh(1) and such: C gives NaN, or +-inf at a pole
            if fn is math.atanh and abs(x) == 1: return math.copysign(math.inf, x)
            if fn is math.acosh and x == math.inf: return math.inf
            return math.nan
        except OverflowError:  # sinh, cosh, expm1 of large x
            return math.copysign(math.inf, x) if fn is math.sinh else math.inf
    return call


def _sin(x: float) -> float: return math.nan if math.isinf(x) else math.sin(x)
def _sqrt(x: float) -> float: return math.nan if x < 0 or math.isnan(x) else math.sqrt(x)
def _trunc(x: float) -> float: return x if not math.isfinite(x) else math.copysign(float(math.trunc(x)), x)


def _pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except (OverflowError, ValueError):
        if a < 0 and not float(b).is_integer(): return math.nan
        return math.inf if abs(a) > 1 or a == 0 else 0.0


def _bitcast(x: ConstType, src: DType, dst: DType) -> ConstType:
    assert src.fmt is not None and dst.fmt is not None, f"bitcast {src} -> {dst} has no struct format"
    return struct.unpack(dst.fmt, struct.pack(src.fmt, x))[0]


_PYTHON_ALU: dict[Ops, Callable[..., ConstType]] = {
    Ops.NEG: lambda x: -x, Ops.EXP: lambda x: _exp(x, math.e), Ops.EXP2: lambda x: _exp(x, 2.0),
    Ops.LOG: lambda x: _log(x, math.log), Ops.LOG2: lambda x: _log(x, math.log2), Ops.SIN: _sin, Ops.SQRT: _sqrt,
    **{op: _libm(getattr(math, op.name.lower())) for op in GroupOp.Libm},
    Ops.RECIPROCAL: lambda x: _fdiv(1.0, x), Ops.TRUNC: _trunc,
    Ops.ADD: lambda a, b: a + b, Ops.SUB: lambda a, b: a - b, Ops.MUL: lambda a, b: a * b, Ops.FDIV: _fdiv,
    Ops.IDIV: c_idiv, Ops.MOD: lambda a, b: _fmod(a, b) if isinstance(a, float) else c_mod(a, b),
    Ops.MAX: _max, Ops.POW: _pow,
    Ops.ATAN2: lambda y, x: math.nan if math.isnan(x) or math.isnan(y) else math.atan2(y, x),
    Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b, Ops.CMPEQ: lambda a, b: a == b,
    Ops.AND: lambda a, b: a & b, Ops.OR: lambda a, b: a | b, Ops.XOR: lambda a, b: a ^ b,
    Ops.SHL: lambda a, b: a << b, Ops.SHR: lambda a, b: a >> b,  # amounts outside [0, bits): see exec_alu
    Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: lambda a, b, c: a * b + c,
}


def exec_alu(op: Ops, dtype: DType, operands: tuple[ConstType, ...], src_dtype: DType | None = None) -> ConstType:
    """The value of `op` on Python scalars, as the device computes it in `dtype`.

    Raises ZeroDivisionError for integer division or modulo by zero (undefined in C: never folded).
    """
    if op is Ops.CAST:
        x = operands[0]
        return truncate(x if not dtype.is_bool else x != 0, dtype)
    if op is Ops.BITCAST: return _bitcast(operands[0], src_dtype or dtype, dtype)
    if dtype.is_float and op in GroupOp.Transcendental | {Ops.FDIV, Ops.RECIPROCAL}:
        operands = tuple(float(x) for x in operands)
    if dtype.is_float and op is Ops.MOD: operands = tuple(float(x) for x in operands)
    if op in (Ops.IDIV, Ops.MOD) and operands[1] == 0 and not dtype.is_float:
        raise ZeroDivisionError(f"{op.name} by zero")
    if op in (Ops.SHL, Ops.SHR) and not 0 <= operands[1] < 8 * dtype.itemsize:  # undefined in C; torch's answer:
        return 0 if op is Ops.SHL or operands[0] >= 0 else -1  # all bits shifted out (>> of a negative fills 1s)
    return truncate(_PYTHON_ALU[op](*operands), dtype)


def evaluate(root: UOp, values: Mapping[UOp, ConstType] | None = None) -> ConstType:
    """The value of a scalar expression graph with DEFINE_VARs (or RANGEs) set from `values`."""
    env: dict[UOp, ConstType] = dict(values or {})
    for u in root.toposort():
        if u in env: continue
        if u.op is Ops.CONST: env[u] = u.arg
        elif u.op in (Ops.DEFINE_VAR, Ops.RANGE): raise KeyError(f"evaluate: no value for {u.render()}")
        else: env[u] = exec_alu(u.op, u.dtype, tuple(env[s] for s in u.src), u.src[0].dtype if u.src else None)
    return env[root]
