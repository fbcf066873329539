"""Tensor constructors: zeros, ones, full, empty, arange, eye, and the *_like forms.

Constants are a CONST node broadcast to the shape, and `arange` an ARANGE node (its value is its index): no memory
until realized, and both fuse into their consumers. Random tensors are in random.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ember.device import Device
from ember.dtype import DType, dtypes, to_dtype
from ember.errors import ShapeError
from ember.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from ember.tensor import Tensor


def shape_of(shape: tuple[Any, ...], op: str) -> tuple[int, ...]:
    out = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
    if any(not isinstance(s, int) or s < 0 for s in out):
        raise ShapeError(f"{op}: shape sizes must be non-negative ints, got {out}")
    return out


class CreationMixin:
    """Class methods that make new tensors."""

    __slots__ = ()

    @classmethod
    def full(cls, shape: tuple[int, ...] | int, fill_value: Any, dtype: DType | str | None = None,
             device: str | None = None) -> Tensor:
        """A tensor of `shape` with every element `fill_value`."""
        from ember.tensor import Tensor
        dims = shape_of(shape if isinstance(shape, tuple) else (shape,), "full")
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
        scalar = Tensor(UOp.const(dt, fill_value), device=device)
        return scalar.reshape((1,) * len(dims)).expand(dims) if dims else scalar

    @classmethod
    def zeros(cls, *shape: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        return cls.full(shape_of(shape, "zeros"), 0, dtype or dtypes.default_float, device)

    @classmethod
    def ones(cls, *shape: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        return cls.full(shape_of(shape, "ones"), 1, dtype or dtypes.default_float, device)

    @classmethod
    def empty(cls, *shape: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """A tensor whose values are unspecified until written (ember gives zeros)."""
        return cls.zeros(*shape, dtype=dtype, device=device).contiguous()

    @classmethod
    def arange(cls, start: float, stop: float | None = None, step: float = 1, dtype: DType | str | None = None,
               device: str | None = None) -> Tensor:
        """Values from start (inclusive) to stop (exclusive) by step; int32 unless an argument is a float."""
        if stop is None: start, stop = 0, start
        if step == 0: raise ValueError("arange: step must be nonzero")
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py([start, stop, step])
        n = max(0, math.ceil((stop - start) / step))
        from ember.tensor import Tensor
        index = Tensor._from_uop(UOp(Ops.ARANGE, dtypes.int64 if n > 2**31 - 1 else dtypes.int32, arg=n),
                                 Device.canonicalize(device or Device.DEFAULT))
        if start == 0 and step == 1: return index.cast(dt)
        wide = dtypes.float64 if dt.is_float else dtypes.int64  # start + i*step exactly, then one rounding
        return (index.cast(wide) * step + start).cast(dt)

    @classmethod
    def eye(cls, n: int, m: int | None = None, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """The identity matrix (n x m)."""
        if n < 0 or (m is not None and m < 0): raise ShapeError(f"eye: sizes must be non-negative, got n={n}, m={m}")
        rows = cls.arange(n, device=device).reshape(n, 1)
        cols = cls.arange(n if m is None else m, device=device).reshape(1, -1)
        return rows.eq(cols).cast(dtype or dtypes.default_float)

    @classmethod
    def linspace(cls, start: float, end: float, steps: int, dtype: DType | str | None = None,
                 device: str | None = None) -> Tensor:
        """`steps` evenly spaced values from start to end inclusive, as torch: the first half counts up from start,
        the second half down from end, so both ends are exact."""
        if steps < 0: raise ShapeError(f"linspace: steps must be non-negative, got {steps}")
        dt = to_dtype(dtype or dtypes.default_float)
        if steps == 1: return cls.full((1,), start, dt, device)
        step = (end - start) / max(steps - 1, 1)
        i = cls.arange(steps, device=device).cast(dtypes.float64)
        values = (i < steps // 2).where(i * step + start, end - (steps - 1 - i) * step)
        return values.cast(dt)

    def tril(self: Tensor, diagonal: int = 0) -> Tensor:
        """The lower triangle of the last two axes (j <= i + diagonal), zeros above."""
        return self._triangle(diagonal, lower=True)

    def triu(self: Tensor, diagonal: int = 0) -> Tensor:
        """The upper triangle of the last two axes (j >= i + diagonal), zeros below."""
        return self._triangle(diagonal, lower=False)

    def _triangle(self: Tensor, diagonal: int, lower: bool) -> Tensor:
        if self.ndim < 2: raise ShapeError(f"{'tril' if lower else 'triu'}: needs at least 2 axes, got {self.shape}")
        n, m = self.shape[-2:]
        rows = type(self).arange(n, device=self.device).reshape(n, 1)
        cols = type(self).arange(m, device=self.device).reshape(1, m)
        keep = (cols <= rows + diagonal) if lower else (cols >= rows + diagonal)
        return keep.where(self, self.zeros_like())  # a literal 0 would promote bool to int

    def one_hot(self: Tensor, num_classes: int = -1) -> Tensor:
        """An int64 tensor with a new last axis of `num_classes`, 1 at each value's index (torch's one_hot)."""
        if not self.dtype.is_int: raise ShapeError(f"one_hot: needs an integer tensor, got {self.dtype.name}")
        if num_classes < 0: num_classes = int(self.max().item()) + 1 if self.numel() else 0
        classes = type(self).arange(num_classes, device=self.device)
        return self.unsqueeze(-1).eq(classes).cast(dtypes.int64)

    def full_like(self: Tensor, fill_value: Any, dtype: DType | str | None = None) -> Tensor:
        return type(self).full(self.shape, fill_value, dtype or self.dtype, self.device)

    def zeros_like(self: Tensor, dtype: DType | str | None = None) -> Tensor: return self.full_like(0, dtype)
    def ones_like(self: Tensor, dtype: DType | str | None = None) -> Tensor: return self.full_like(1, dtype)
