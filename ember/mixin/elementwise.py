"""Elementwise Tensor ops: arithmetic, comparisons, math functions, where and casts, with numpy broadcasting.

Binary ops promote dtypes as PyTorch does (Python scalars are weak), broadcast both sides to one shape, then build
one ALU node. Float math on integer tensors first casts to the default float, as torch does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ember.dtype import DType, as_python_number, dtypes, promote_operands, to_dtype
from ember.errors import ArgumentError, DeviceError, DTypeError, ShapeError
from ember.uop.ops import Ops, UOp, arg_key, constant_of

if TYPE_CHECKING:
    from ember.tensor import Tensor


def broadcast_shape(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape numpy broadcasting gives `shapes`, or a ShapeError naming the op and every shape."""
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + s for s in shapes]
    out = []
    for sizes in zip(*padded, strict=True):
        big = {s for s in sizes if s != 1}
        if len(big) > 1:
            raise ShapeError(f"{op}: shapes {' and '.join(str(s) for s in shapes)} cannot be broadcast together; "
                             f"each axis must match or be 1")
        out.append(big.pop() if big else 1)
    return tuple(out)


# Exponents torch computes with products, a reciprocal or a square root rather than libm's pow (bit for bit its
# results in float32 and float64). Besides matching torch, they spare derivatives pow(x, 1.0). x ** 0 stays a POW
# (libm gives 1 for every x, NaN included), so that x is in the graph and gets its zero gradient, as in torch.
_POWERS: dict[float, Callable[[Tensor], Tensor]] = {
    1: lambda a: a._wrap(a.uop), 2: lambda a: a * a, 3: lambda a: a * a * a,
    -1: lambda a: a.reciprocal(), -2: lambda a: (a * a).reciprocal(), 0.5: lambda a: a.sqrt(),
    -0.5: lambda a: a.sqrt().reciprocal()}


def promote_values(tensors: list[Tensor], scalars: list[Any]) -> DType:
    """The dtype torch gives an op on `tensors` and Python `scalars` (see promote_operands), with one exception:
    where a Python int lifts bool tensors (or no tensors at all) to an integer, the result is int64, torch's
    default int, not ember's default_int: `bool_tensor + 3` and `where(c, 1, 0)` are int64 in torch."""
    dtype = promote_operands([t.dtype for t in tensors if t.ndim], [t.dtype for t in tensors if not t.ndim], scalars)
    if dtype is dtypes.default_int and all(t.dtype is dtypes.bool for t in tensors): return dtypes.int64
    return dtype


def _float_floor_div(a: Tensor, b: Tensor) -> Tensor:
    """floor(a / b) from the exact remainder fmod(a, b), as torch and Python compute it: 1.0 // 0.1 is 9.0."""
    mod = a._wrap(UOp(Ops.MOD, a.dtype, (a.uop, b.uop)))  # float MOD is C's fmod, which is exact
    div = (a - mod) / b
    div = (mod.ne(0) & ((b < 0) ^ (mod < 0))).where(div - 1, div)
    floored = div.floor()
    floored = (div - floored > 0.5).where(floored + 1, floored)
    quotient = a / b
    signed_zero = (quotient.reciprocal() < 0).where(-0.0, 0.0).cast(a.dtype)  # 0 with a / b's sign (1/-0.0 = -inf)
    return b.eq(0).where(quotient, div.eq(0).where(signed_zero, floored))


def _int_power(x: Tensor, n: int) -> Tensor:
    """x ** n for a Python int n >= 0 by repeated squaring, unrolled: ints wrap as C's (and torch's) products do."""
    result: Tensor | None = None
    while n:
        if n & 1: result = x if result is None else result * x
        n >>= 1
        if n: x = x * x
    return x.ones_like() if result is None else result


BROADCAST_CONSTANTS: dict[tuple, UOp] = {}  # (dtype, value's key, shape) -> the constant broadcast: kept, so that
# `x + 1` in a loop builds one node, not four (the eager dispatch of a small op is mostly building and freeing nodes)


def broadcast_constant(dtype: DType, value: float | int, shape: tuple[int, ...]) -> UOp:
    """`value` of `dtype` broadcast to `shape`, as _broadcast_to would make it, without its checks."""
    key = (dtype, type(value), arg_key(value), shape)
    if (c := BROADCAST_CONSTANTS.get(key)) is None:
        c = UOp.const(dtype, value)
        if shape: c = UOp(Ops.EXPAND, dtype, (UOp(Ops.RESHAPE, dtype, (c,), (1,) * len(shape)),), shape)
        if len(BROADCAST_CONSTANTS) >= 512: del BROADCAST_CONSTANTS[next(iter(BROADCAST_CONSTANTS))]
        BROADCAST_CONSTANTS[key] = c
    return c


def relu_pull(g: Tensor, x: Tensor, out: Tensor) -> tuple[Tensor, None]:
    """relu's gradient (Tensor.custom_vjp): g where the output is not <= 0; the output itself gets none."""
    return (out <= 0).where(0.0, g), None  # (a NaN passes it, as torch)


class ElementwiseMixin:
    """Operators and math functions of Tensor."""

    __slots__ = ()

    # ---- building blocks -----------------------------------------------------------------------------------------

    def _operands(self: Tensor, op: str, *others: Any, dtype: DType | None = None) -> list[Tensor]:
        """self and `others` as tensors of one dtype (promoted, or `dtype`) broadcast to one shape."""
        from ember.tensor import Tensor
        for o in others:
            if isinstance(o, Tensor) and o.device != self.device:
                raise DeviceError(f"{op}: tensors on two devices, {self.device} and {o.device}; move one with "
                                  f".to({self.device!r})")
        if dtype is None and len(others) == 1:  # the common cases, decided without the promotion tables
            other = others[0]
            if isinstance(other, Tensor) and other.dtype is self.dtype and other.shape == self.shape:
                return [self, other]
            if (type(other) is float or (type(other) is int and -2**63 <= other < 2**64)) and self.dtype.is_float:
                # a float tensor keeps its dtype for a number
                return [self, self._wrap(broadcast_constant(self.dtype, other, self.shape))]
        if dtype is None:  # (a symbolic size, a UOp, promotes as a Python int does)
            dtype = promote_values([self, *(o for o in others if isinstance(o, Tensor))],
                                   [0 if isinstance(o, UOp) else o for o in others if not isinstance(o, Tensor)])
        as_tensors = [o if isinstance(o, Tensor) else self._wrap(o) if isinstance(o, UOp) else
                      self._const(o, dtype, op) for o in (self, *others)]
        shape = broadcast_shape(op, *(t.shape for t in as_tensors))
        return [t.cast(dtype)._broadcast_to(shape) for t in as_tensors]

    def _const(self: Tensor, value: Any, dtype: DType, op: str = "const") -> Tensor:
        """A Python number as a constant tensor of `dtype`. An int beyond 64 bits raises, as in torch, whatever the
        dtype: silently wrapping 2**70 to 0 (or rounding it into a float) would hide the user's mistake."""
        value = as_python_number(value)
        if not isinstance(value, (bool, int, float)):
            raise DTypeError(f"{op}: expected a Tensor or a Python number, got {type(value).__name__}")
        if type(value) is int and not -2**63 <= value < 2**64:
            raise OverflowError(f"{op}: Python int too big to convert: {value}; ints must lie in [-2**63, 2**64) "
                                f"(write a float, such as {float(value):.6g}, for a float result)")
        return self._wrap(UOp.const(dtype, value))

    def _broadcast_to(self: Tensor, shape: tuple[int, ...]) -> Tensor:
        if self.shape == shape: return self
        return self.reshape((1,) * (len(shape) - self.ndim) + self.shape).expand(shape)

    def _binary(self: Tensor, op: Ops, other: Any, name: str, reverse: bool = False) -> Tensor:
        if (type(other) is float or (type(other) is int and -2**63 <= other < 2**64)) and self.dtype.is_float:
            # x + 1 on a float tensor, the common case: straight to its node (as _operands would make it)
            c = broadcast_constant(self.dtype, other, self.shape)
            out = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else self.dtype
            return self._wrap(UOp(op, out, (c, self.uop) if reverse else (self.uop, c)))
        a, b = self._operands(name, other)
        if reverse: a, b = b, a
        out_dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else a.dtype
        return self._wrap(UOp(op, out_dtype, (a.uop, b.uop)))

    def _float_unary(self: Tensor, op: Ops) -> Tensor:
        x = self if self.dtype.is_float else self.cast(dtypes.default_float)
        return self._wrap(UOp(op, x.dtype, (x.uop,)))

    # ---- arithmetic ----------------------------------------------------------------------------------------------

    def add(self: Tensor, other: Any) -> Tensor: return self._binary(Ops.ADD, other, "add")
    def sub(self: Tensor, other: Any) -> Tensor: return self._binary(Ops.SUB, other, "sub")
    def mul(self: Tensor, other: Any) -> Tensor: return self._binary(Ops.MUL, other, "mul")

    def div(self: Tensor, other: Any, rounding_mode: str | None = None) -> Tensor:
        """True division (integers give the default float), or rounding_mode 'trunc' / 'floor' as torch.div."""
        if rounding_mode is not None: return self._rounded_div(other, rounding_mode)
        a, b = self._operands("div", other)
        if not a.dtype.is_float: a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
        return self._wrap(UOp(Ops.FDIV, a.dtype, (a.uop, b.uop)))

    def _rounded_div(self: Tensor, other: Any, mode: str, reverse: bool = False) -> Tensor:
        if mode not in ("trunc", "floor"):
            raise ArgumentError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {mode!r}")
        a, b = self._operands("div", other)
        if reverse: a, b = b, a
        if a.dtype.is_float: return a.div(b).trunc() if mode == "trunc" else _float_floor_div(a, b)
        q = self._wrap(UOp(Ops.IDIV, a.dtype, (a.uop, b.uop)))  # truncates, as C
        if mode == "trunc": return q
        inexact = (q * b).ne(a) & ((a < 0) ^ (b < 0)) & b.ne(0)  # x // 0 is 0, as numpy (torch raises)
        return inexact.where(q - 1, q)

    def neg(self: Tensor) -> Tensor:
        if self.dtype is dtypes.bool:
            raise DTypeError("neg: negation of a bool tensor is not supported; use logical_not")
        return self._wrap(UOp(Ops.NEG, self.dtype, (self.uop,)))

    def __add__(self: Tensor, x: Any) -> Tensor: return self.add(x)
    def __radd__(self: Tensor, x: Any) -> Tensor: return self._binary(Ops.ADD, x, "add", reverse=True)
    def __sub__(self: Tensor, x: Any) -> Tensor: return self.sub(x)
    def __rsub__(self: Tensor, x: Any) -> Tensor: return self._binary(Ops.SUB, x, "sub", reverse=True)
    def __mul__(self: Tensor, x: Any) -> Tensor: return self.mul(x)
    def __rmul__(self: Tensor, x: Any) -> Tensor: return self._binary(Ops.MUL, x, "mul", reverse=True)
    def __truediv__(self: Tensor, x: Any) -> Tensor: return self.div(x)
    def __rtruediv__(self: Tensor, x: Any) -> Tensor: return self._operands("div", x)[1].div(self)
    def __floordiv__(self: Tensor, x: Any) -> Tensor: return self._rounded_div(x, "floor")
    def __rfloordiv__(self: Tensor, x: Any) -> Tensor: return self._rounded_div(x, "floor", reverse=True)
    def __neg__(self: Tensor) -> Tensor: return self.neg()
    def __matmul__(self: Tensor, x: Tensor) -> Tensor: return self.matmul(x)
    def __rmatmul__(self: Tensor, x: Tensor) -> Tensor: return x.matmul(self)

    # ---- comparisons ---------------------------------------------------------------------------------------------

    def __lt__(self: Tensor, x: Any) -> Tensor: return self._binary(Ops.CMPLT, x, "lt")
    def __gt__(self: Tensor, x: Any) -> Tensor: return self._binary(Ops.CMPLT, x, "gt", reverse=True)
    def __le__(self: Tensor, x: Any) -> Tensor: return (self < x) | self.eq(x)  # not !(x<self): NaN <= y is False
    def __ge__(self: Tensor, x: Any) -> Tensor: return (self > x) | self.eq(x)
    def eq(self: Tensor, x: Any) -> Tensor: return self._binary(Ops.CMPEQ, x, "eq")
    def ne(self: Tensor, x: Any) -> Tensor: return self._binary(Ops.CMPNE, x, "ne")
    def __eq__(self: Tensor, x: Any) -> Tensor: return self.eq(x)  # type: ignore[override]
    def __ne__(self: Tensor, x: Any) -> Tensor: return self.ne(x)  # type: ignore[override]
    lt, gt, le, ge = __lt__, __gt__, __le__, __ge__

    def _logical(self: Tensor, op: Ops, x: Any, name: str, reverse: bool = False) -> Tensor:
        a, b = self._operands(name, x)
        if reverse: a, b = b, a
        if a.dtype.is_float: raise DTypeError(f"{name}: bitwise ops need bool or integer tensors, got {a.dtype.name}")
        return self._wrap(UOp(op, a.dtype, (a.uop, b.uop)))

    def __lshift__(self: Tensor, x: Any) -> Tensor: return self._logical(Ops.SHL, x, "lshift")
    def __rshift__(self: Tensor, x: Any) -> Tensor: return self._logical(Ops.SHR, x, "rshift")
    def __and__(self: Tensor, x: Any) -> Tensor: return self._logical(Ops.AND, x, "and")
    def __or__(self: Tensor, x: Any) -> Tensor: return self._logical(Ops.OR, x, "or")
    def __xor__(self: Tensor, x: Any) -> Tensor: return self._logical(Ops.XOR, x, "xor")
    # `1 & t` and friends: Python asks the Tensor on the right once int.__and__ gives up
    def __rlshift__(self: Tensor, x: Any) -> Tensor: return self._logical(Ops.SHL, x, "lshift", reverse=True)
    def __rrshift__(self: Tensor, x: Any) -> Tensor: return self._logical(Ops.SHR, x, "rshift", reverse=True)
    def __rand__(self: Tensor, x: Any) -> Tensor: return self._logical(Ops.AND, x, "and", reverse=True)
    def __ror__(self: Tensor, x: Any) -> Tensor: return self._logical(Ops.OR, x, "or", reverse=True)
    def __rxor__(self: Tensor, x: Any) -> Tensor: return self._logical(Ops.XOR, x, "xor", reverse=True)
    def logical_not(self: Tensor) -> Tensor: return self.cast(dtypes.bool).ne(True)

    def __invert__(self: Tensor) -> Tensor:
        if self.dtype.is_float: raise DTypeError(f"invert: needs a bool or integer tensor, got {self.dtype.name}")
        return self.logical_not() if self.dtype is dtypes.bool else self ^ -1

    # tinygrad's named forms of the operators; reverse=True swaps the operands (x op self)
    def bitwise_and(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        """self & x, for bool or integer tensors."""
        return self._logical(Ops.AND, x, "bitwise_and", reverse)

    def bitwise_or(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        """self | x, for bool or integer tensors."""
        return self._logical(Ops.OR, x, "bitwise_or", reverse)

    def bitwise_xor(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        """self ^ x, for bool or integer tensors."""
        return self._logical(Ops.XOR, x, "bitwise_xor", reverse)

    def bitwise_not(self: Tensor) -> Tensor:
        """~self: logical not for bool, all bits flipped for integers."""
        if self.dtype.is_float: raise DTypeError(f"bitwise_not: needs a bool or integer tensor, got {self.dtype.name}")
        return ~self

    def lshift(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        """self << x for integer tensors (a shift by the bit width or more, or by a negative count, is undefined)."""
        return self._logical(Ops.SHL, x, "lshift", reverse)

    def rshift(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        """self >> x for integer tensors, arithmetic (sign-filling) for signed ones, as torch."""
        return self._logical(Ops.SHR, x, "rshift", reverse)

    # ---- math ----------------------------------------------------------------------------------------------------

    def exp(self: Tensor) -> Tensor: return self._float_unary(Ops.EXP)
    def log(self: Tensor) -> Tensor: return self._float_unary(Ops.LOG)
    def exp2(self: Tensor) -> Tensor: return self._float_unary(Ops.EXP2)
    def log2(self: Tensor) -> Tensor: return self._float_unary(Ops.LOG2)

    def log10(self: Tensor) -> Tensor:
        """The base-10 logarithm, as log2(x) * log10(2): within an ulp or two of torch.log10.

        >>> Tensor([1.0, 100.0, 0.001]).log10().tolist()
        [0.0, 2.0, -3.0]
        """
        return self.log2() * math.log10(2)

    def sqrt(self: Tensor) -> Tensor: return self._float_unary(Ops.SQRT)
    def sin(self: Tensor) -> Tensor: return self._float_unary(Ops.SIN)
    def cos(self: Tensor) -> Tensor: return self._float_unary(Ops.COS)
    def tan(self: Tensor) -> Tensor: return self._float_unary(Ops.TAN)
    def asin(self: Tensor) -> Tensor: return self._float_unary(Ops.ASIN)
    def acos(self: Tensor) -> Tensor: return self._float_unary(Ops.ACOS)
    def atan(self: Tensor) -> Tensor: return self._float_unary(Ops.ATAN)
    def sinh(self: Tensor) -> Tensor: return self._float_unary(Ops.SINH)
    def cosh(self: Tensor) -> Tensor: return self._float_unary(Ops.COSH)
    def tanh(self: Tensor) -> Tensor: return self._float_unary(Ops.TANH)
    def asinh(self: Tensor) -> Tensor: return self._float_unary(Ops.ASINH)
    def acosh(self: Tensor) -> Tensor: return self._float_unary(Ops.ACOSH)
    def atanh(self: Tensor) -> Tensor: return self._float_unary(Ops.ATANH)
    def erf(self: Tensor) -> Tensor: return self._float_unary(Ops.ERF)
    def expm1(self: Tensor) -> Tensor: return self._float_unary(Ops.EXPM1)
    def log1p(self: Tensor) -> Tensor: return self._float_unary(Ops.LOG1P)
    def reciprocal(self: Tensor) -> Tensor: return self._float_unary(Ops.RECIPROCAL)
    def rsqrt(self: Tensor) -> Tensor: return self.sqrt().reciprocal()
    def trunc(self: Tensor) -> Tensor: return self if not self.dtype.is_float else self._float_unary(Ops.TRUNC)

    def floor(self: Tensor) -> Tensor:
        t = self.trunc()
        return (t > self).where(t - 1, t) if self.dtype.is_float else self

    def ceil(self: Tensor) -> Tensor:
        t = self.trunc()
        return (t < self).where(t + 1, t) if self.dtype.is_float else self

    def round(self: Tensor) -> Tensor:
        """The nearest integer, halves to even (torch.round), from exact steps: trunc, then the fraction's size."""
        if not self.dtype.is_float: return self
        t = self.trunc()
        frac = (self - t).abs()  # exact: x and trunc(x) share their high bits
        away = t + (self < 0).where(-1.0, 1.0).cast(self.dtype)
        is_odd = self._wrap(UOp(Ops.MOD, t.dtype, (t.uop, t._const(2, t.dtype).uop))).ne(0)
        return ((frac > 0.5) | (frac.eq(0.5) & is_odd)).where(away, t)

    def float_like(self: Tensor) -> Tensor: return self if self.dtype.is_float else self.cast(dtypes.default_float)

    def square(self: Tensor) -> Tensor:
        """x * x; of bool it is int64 (torch computes pow(x, 2), which lifts bool to its default int)."""
        return self.cast(dtypes.int64) if self.dtype is dtypes.bool else self * self
    def abs(self: Tensor) -> Tensor:
        """|x|: +0.0 for -0.0 and a zero derivative at 0, as torch (x - x is +0.0 for both zeros, NaN for NaN)."""
        if self.dtype.is_unsigned or self.dtype.is_bool: return self
        return (self < 0).where(-self, (self > 0).where(self, self - self))
    def sign(self: Tensor) -> Tensor: return (self < 0).where(-1, (self > 0).where(1, 0)).cast(self.dtype)

    def maximum(self: Tensor, x: Any) -> Tensor: return self._binary(Ops.MAX, x, "maximum")

    def pow(self: Tensor, exponent: Any) -> Tensor:
        """self ** exponent: libm's pow for floats; for integers exact, wrapping products by repeated squaring.

        A negative integer exponent gives 1 for base 1, +-1 for base -1 and 0 otherwise, as torch."""
        a, b = self._operands("pow", exponent)
        if a.dtype.is_bool: raise DTypeError("pow: not defined for two bool operands (as in torch)")
        if not a.dtype.is_float and type(exponent) is int and exponent < 0:  # numpy and torch refuse it too
            raise ArgumentError(f"pow: integers to negative integer powers are not allowed: {self.dtype.name} ** "
                             f"{exponent}; use a float base or exponent (x.float() ** {exponent}, x ** {exponent}.0)")
        if a.dtype in (dtypes.float32, dtypes.float64) and (short := _POWERS.get(constant_of(b.uop))) is not None:
            return short(a)
        if a.dtype.is_float: return self._wrap(UOp(Ops.POW, a.dtype, (a.uop, b.uop)))
        if isinstance(exponent, int) and exponent >= 0: return _int_power(a, exponent)
        result, base, e = a.ones_like(), a, b
        for _ in range(a.dtype.itemsize * 8 - (0 if a.dtype.is_unsigned else 1)):  # every bit of a positive e
            result = (e & 1).ne(0).where(result * base, result)
            base, e = base * base, e >> 1
        if a.dtype.is_unsigned: return result
        negative = a.eq(1).where(1, a.eq(-1).where((b & 1).ne(0).where(-1, 1), 0)).cast(a.dtype)
        return (b < 0).where(negative, result)

    def __pow__(self: Tensor, x: Any) -> Tensor: return self.pow(x)
    def __rpow__(self: Tensor, x: Any) -> Tensor: return self._operands("pow", x)[1].pow(self)

    def atan2(self: Tensor, other: Any) -> Tensor:
        """The angle of (other, self): atan(self / other) in the right quadrant, as libm's atan2(y, x)."""
        a, b = (t.float_like() for t in self._operands("atan2", other))
        return self._wrap(UOp(Ops.ATAN2, a.dtype, (a.uop, b.uop)))

    def remainder(self: Tensor, other: Any) -> Tensor:
        """self - floor(self / other) * other: the result takes the sign of the divisor, as torch and Python."""
        a, b = self._operands("remainder", other)
        r = a.fmod(b)
        return (r.ne(0) & ((r < 0) ^ (b < 0))).where(r + b, r)

    def fmod(self: Tensor, other: Any) -> Tensor:
        """C's remainder, as torch.fmod: self - trunc(self / other) * other, with the sign of the dividend."""
        a, b = self._operands("fmod", other)
        return self._wrap(UOp(Ops.MOD, a.dtype, (a.uop, b.uop)))

    def mod(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        """self % x (x % self with reverse), floored as torch.remainder: the result takes the divisor's sign."""
        return self._operands("mod", x)[1].remainder(self) if reverse else self.remainder(x)

    def __mod__(self: Tensor, x: Any) -> Tensor: return self.remainder(x)
    def __rmod__(self: Tensor, x: Any) -> Tensor: return self._operands("remainder", x)[1].remainder(self)

    def lerp(self: Tensor, end: Any, weight: Any) -> Tensor:
        """self + weight * (end - self), computed from the nearer end as torch does, so weight 1 gives end exactly."""
        start, stop, w = (t.float_like() for t in self._operands("lerp", end, weight))
        diff = stop - start
        near_start = self._wrap(UOp(Ops.MULACC, w.dtype, (w.uop, diff.uop, start.uop)))  # fused, as torch's fma
        near_end = self._wrap(UOp(Ops.MULACC, w.dtype, ((-diff).uop, (1 - w).uop, stop.uop)))
        return (w.abs() < 0.5).where(near_start, near_end)

    def minimum(self: Tensor, x: Any) -> Tensor:
        """The smaller of self and x elementwise; NaN wins. For floats it is -max(-a, -b), exact, so that a tie splits
        the gradient in half as torch does (and as maximum does); integers compare (negating INT_MIN would wrap)."""
        a, b = self._operands("minimum", x)
        return -((-a).maximum(-b)) if a.dtype.is_float else (a < b).where(a, b)

    def logaddexp(self: Tensor, other: Any) -> Tensor:
        """log(exp(self) + exp(other)) without overflow, as torch.logaddexp: max(a, b) + log1p(exp(-|a - b|)), and a
        itself where a and b are the same infinity (-inf, -inf gives -inf; inf, inf gives inf; inf - inf would be NaN).

        The difference is replaced by 0 there before it is used, so its NaN cannot reach the gradient either: the
        gradients are sigmoid(a - b) and sigmoid(b - a), 1/2 each at a tie.

        >>> Tensor([0.0, float("-inf"), 1000.0]).logaddexp(Tensor([0.0, float("-inf"), 1000.0])).tolist()
        [0.6931471824645996, -inf, 1000.6931762695312]
        """
        a, b = (t.float_like() for t in self._operands("logaddexp", other))
        same_inf = a.isinf() & a.eq(b)
        diff = same_inf.where(0.0, a - b)
        return same_inf.where(a, a.maximum(b) + (-diff.abs()).exp().log1p())

    def copysign(self: Tensor, other: Any) -> Tensor:
        """|self| with the sign bit of other (-0.0 and -NaN count as negative), in a float dtype as torch."""
        a, b = (t.float_like() for t in self._operands("copysign", other))
        bits = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[b.dtype.itemsize]
        return (b.bitcast(bits) < 0).where(-a.abs(), a.abs())

    def isclose(self: Tensor, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
        """|self - other| <= atol + rtol * |other| elementwise, as torch.isclose (infinities close only to equals;
        NaN only to NaN with equal_nan). Operands are promoted to one dtype, where torch requires equal dtypes."""
        if rtol < 0 or atol < 0: raise ValueError(f"isclose: rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
        a, b = self._operands("isclose", other)
        close = a.eq(b)
        if a.dtype is dtypes.bool: a, b = a.float_like(), b.float_like()
        error = (a - b).abs().float_like()
        close = close | (error.isfinite() & (error <= (b.float_like() * rtol).abs() + atol))
        return close | (a.isnan() & b.isnan()) if equal_nan and a.dtype.is_float else close

    def isnan(self: Tensor) -> Tensor: return self.ne(self)
    def isinf(self: Tensor, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        """Where self is +inf or -inf; tinygrad's `detect_positive`/`detect_negative` pick one sign (as numpy's
        isposinf/isneginf)."""
        if not self.dtype.is_float: return self.ne(self)  # an integer is never infinite
        if detect_positive and detect_negative: return self.abs().eq(float("inf"))
        if detect_positive: return self.eq(float("inf"))
        return self.eq(-float("inf")) if detect_negative else self.full_like(False, dtypes.bool)
    def isfinite(self: Tensor) -> Tensor: return (self - self).eq(0)  # inf - inf and NaN - NaN are NaN
    def relu(self: Tensor) -> Tensor:
        """max(x, 0) with torch's derivative at 0 (zero); NaN and -0.0 are kept, as torch's relu keeps them.

        The gradient passes where the output is positive: read from the output, which the next layer stores
        anyway, not from a mask of the input's signs that a backward pass would need stored (a bool, read lane by
        lane)."""
        out = (self <= 0).where((self < 0).where(0, self.detach()), self)  # a zero passes, with no gradient
        return out.custom_vjp((self, out), relu_pull)

    def clamp(self: Tensor, min_: Any = None, max_: Any = None) -> Tensor:
        """self limited to [min_, max_]; the gradient flows to self inside and at the bounds (as torch)."""
        if min_ is None and max_ is None:
            raise ArgumentError("clamp: no bound given: min_=None, max_=None; give min_, max_ or both")
        out = self if min_ is None else (self < min_).where(min_, self)
        return out if max_ is None else (out > max_).where(max_, out)

    clip = clamp

    def where(self: Tensor, x: Any, y: Any) -> Tensor:
        """Elements of x where self is true, else of y (self is the condition)."""
        from ember.tensor import Tensor
        dtype = promote_values([v for v in (x, y) if isinstance(v, Tensor)],
                               [v for v in (x, y) if not isinstance(v, Tensor)])
        cond, a, b = self._operands("where", x, y, dtype=dtype)
        return self._wrap(UOp(Ops.WHERE, dtype, (self.cast(dtypes.bool)._broadcast_to(cond.shape).uop, a.uop, b.uop)))

    # ---- casts ---------------------------------------------------------------------------------------------------

    def cast(self: Tensor, dtype: DType | str) -> Tensor:
        """The values converted to `dtype` (floats to ints truncate toward zero)."""
        dt = to_dtype(dtype)
        return self if dt == self.dtype else self._wrap(UOp(Ops.CAST, dt, (self.uop,)))

    def bitcast(self: Tensor, dtype: DType | str) -> Tensor:
        """The same bits read as `dtype`, which must have the same size."""
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise DTypeError(f"bitcast: {self.dtype.name} ({self.dtype.itemsize} bytes) to {dt.name} "
                             f"({dt.itemsize} bytes); sizes must match")
        return self._wrap(UOp(Ops.BITCAST, dt, (self.uop,)))

    def float(self: Tensor) -> Tensor: return self.cast(dtypes.float32)
    def half(self: Tensor) -> Tensor: return self.cast(dtypes.float16)
    def double(self: Tensor) -> Tensor: return self.cast(dtypes.float64)
    def int(self: Tensor) -> Tensor: return self.cast(dtypes.int32)
    def long(self: Tensor) -> Tensor: return self.cast(dtypes.int64)
    def bool(self: Tensor) -> Tensor: return self.cast(dtypes.bool)
