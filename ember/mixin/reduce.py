"""Reductions (sum, max, min, mean, prod) and matmul, which is a broadcast multiply followed by a sum.

Result dtypes follow torch: sum and prod of bool or integers give int64, of float16/bfloat16 accumulate in float32
and round back once at the end; mean of integers gives the default float.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ember.dtype import DType, dtypes, least_upper_dtype
from ember.errors import ShapeError
from ember.mixin.elementwise import broadcast_shape
from ember.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from ember.tensor import Tensor

Axis = int | Sequence[int] | None


class ReduceMixin:
    """Reductions over axes, and matrix products."""

    __slots__ = ()

    def _reduce_axes(self: Tensor, axis: Axis, op: str) -> tuple[int, ...]:
        if axis is None or axis == (): return tuple(range(self.ndim))  # torch: an empty tuple reduces everything
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        out = tuple(sorted({self._axis(a, op) for a in axes}))
        if self.ndim == 0: return ()
        return out

    def _reduce(self: Tensor, op: Ops, axis: Axis, keepdim: bool, name: str) -> Tensor:
        axes = self._reduce_axes(axis, name)
        out = self._wrap(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes))) if axes else self
        if keepdim: return out
        return out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def _accumulate_dtype(self: Tensor) -> tuple[DType, DType]:
        """(the dtype to accumulate in, the dtype of the result)."""
        if self.dtype.is_bool or self.dtype.is_int:
            wide = dtypes.uint64 if self.dtype is dtypes.uint64 else dtypes.int64
            return wide, wide
        if self.dtype.itemsize < 4: return dtypes.float32, self.dtype
        return self.dtype, self.dtype

    def sum(self: Tensor, axis: Axis = None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
        """The sum over `axis` (all axes when None)."""
        acc, out = (dtype, dtype) if dtype is not None else self._accumulate_dtype()
        return self.cast(acc)._reduce(Ops.ADD, axis, keepdim, "sum").cast(out)

    def prod(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The product over `axis`."""
        acc, out = self._accumulate_dtype()
        return self.cast(acc)._reduce(Ops.MUL, axis, keepdim, "prod").cast(out)

    def max(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The largest element over `axis` (NaN if any element is NaN)."""
        self._check_nonempty(axis, "max")
        return self._reduce(Ops.MAX, axis, keepdim, "max")

    def min(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The smallest element over `axis`."""
        self._check_nonempty(axis, "min")
        if self.dtype.is_bool: return self.logical_not().max(axis, keepdim).logical_not()
        if self.dtype.is_unsigned: return (self.dtype.max - self).max(axis, keepdim).__rsub__(self.dtype.max)
        return -((-self).max(axis, keepdim))

    def mean(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The average over `axis` (NaN over an empty axis)."""
        x = self if self.dtype.is_float else self.cast(dtypes.default_float)
        count = 1
        for a in self._reduce_axes(axis, "mean"): count *= self.shape[a]
        total = x.sum(axis, keepdim)
        return total.div(count) if count else total * float("nan")

    def var(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: float = 1) -> Tensor:
        """The mean squared deviation over `axis`, divided by n - correction instead of n (Bessel's by default)."""
        x = self.float_like()
        n = 1
        for a in self._reduce_axes(axis, "var"): n *= self.shape[a]
        deviation = x - x.mean(axis, keepdim=True)
        return deviation.square().sum(axis, keepdim).div(max(n - correction, 0))

    def std(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: float = 1) -> Tensor:
        return self.var(axis, keepdim, correction).sqrt()

    def logsumexp(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """log(sum(exp(x))) without overflow: the max is taken out first (and kept finite for all -inf rows)."""
        x = self.float_like()
        peak = x.max(axis, keepdim=True)
        peak = peak.isinf().where(0.0, peak).detach()
        out = (x - peak).exp().sum(axis, keepdim=True).log() + peak
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(x.shape)
                                                     if i not in self._reduce_axes(axis, "logsumexp")))

    def softmax(self: Tensor, axis: int = -1) -> Tensor:
        e = (self.float_like() - self.float_like().max(axis, keepdim=True).detach()).exp()
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self: Tensor, axis: int = -1) -> Tensor:
        return self.float_like() - self.logsumexp(axis, keepdim=True)

    def argmax(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """The index (int64) of the first largest element over `axis` (of the flattened tensor when None); NaN wins."""
        from ember.tensor import Tensor
        if axis is None: return self.flatten().argmax(0).reshape((1,) * self.ndim if keepdim else ())
        a = self._axis(axis, "argmax")
        self._check_nonempty(a, "argmax")
        n = self.shape[a]
        is_peak = self.eq(self.max(a, keepdim=True))
        if self.dtype.is_float: is_peak = is_peak | self.isnan()
        countdown = Tensor.arange(n, 0, -1, dtype="int64", device=self.device).reshape(
            tuple(n if i == a else 1 for i in range(self.ndim)))
        first = is_peak.where(countdown, 0).max(a, keepdim)
        return (n - first).cast("int64")

    def argmin(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """The index of the first smallest element."""
        flipped = -self if self.dtype.is_float else ~self  # ~x = -x-1 reverses the order without overflow
        return flipped.argmax(axis, keepdim)

    def any(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
        return self.ne(0).max(axis, keepdim) if self.numel() else self.ne(0).sum(axis, keepdim).ne(0)

    def all(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
        return self.logical_not().any(axis, keepdim).logical_not()

    def _check_nonempty(self: Tensor, axis: Axis, name: str) -> None:
        for a in self._reduce_axes(axis, name):
            if self.shape[a] == 0:
                raise ShapeError(f"{name}: cannot reduce axis {a} of size 0 in {self.shape}; "
                                 "the result has no identity")

    # ---- matrix products -----------------------------------------------------------------------------------------

    def matmul(self: Tensor, other: Tensor) -> Tensor:
        """The matrix product with torch's rules for 1-d operands and broadcast batch axes."""
        from ember.tensor import Tensor
        if not isinstance(other, Tensor): raise ShapeError(f"matmul: expected a Tensor, got {type(other).__name__}")
        if self.ndim == 0 or other.ndim == 0:
            raise ShapeError(f"matmul: both operands need at least 1 axis, got {self.shape} @ {other.shape}")
        a = self.unsqueeze(0) if self.ndim == 1 else self
        b = other.unsqueeze(-1) if other.ndim == 1 else other
        if a.shape[-1] != b.shape[-2]:
            raise ShapeError(f"matmul: inner dimensions differ: {self.shape} @ {other.shape}; "
                             f"a.shape[-1] ({a.shape[-1]}) must equal b.shape[-2] ({b.shape[-2]})")
        try:
            broadcast_shape("matmul", a.shape[:-2], b.shape[:-2])
        except ShapeError:
            raise ShapeError(f"matmul: batch dimensions of {self.shape} @ {other.shape} cannot be broadcast: "
                             f"{a.shape[:-2]} and {b.shape[:-2]}") from None
        out_dtype = least_upper_dtype(a.dtype, b.dtype)
        acc = dtypes.float32 if out_dtype.is_float and out_dtype.itemsize < 4 else out_dtype
        # (..., n, k) -> (..., n, 1, k) and (..., k, m) -> (..., 1, m, k): the product sums over the last axis
        prod = a.cast(acc).unsqueeze(-2) * b.cast(acc).transpose(-1, -2).unsqueeze(-3)
        out = prod._reduce(Ops.ADD, -1, False, "matmul").cast(out_dtype)
        if self.ndim == 1: out = out.squeeze(-2)
        if other.ndim == 1: out = out.squeeze(-1)
        return out

    dot = matmul
