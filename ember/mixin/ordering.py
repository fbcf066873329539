"""Ops where each output depends on its position along an axis: cumulative sum/prod/max/min, sort, topk.

Both are written as comparisons of every position with every other, reduced: a prefix is a reduction under a
triangular mask and a sorted position is a rank (how many elements come before). That is O(n^2) work per row for
an axis of length n, with no data-dependent control flow, so it fuses into ordinary kernels and autograd needs no
new rules. Long scans are split into blocks (a scan inside blocks plus a scan of the block totals), which brings
the work down to O(n^1.5). Sort finds each rank's source index that way, then moves the values with one load each
(`_take`), so a value arrives bit for bit (-0.0 and NaN included).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.dtype import DType, dtypes
from ember.mixin.movement import either_axis
from ember.mixin.reduce import ValuesIndices

if TYPE_CHECKING:
    from ember.tensor import Tensor

_BLOCK_ABOVE = 512  # scans longer than this are split into blocks


def _identity(op: str, x: Tensor) -> float | int | bool:
    if op == "sum": return 0
    if op == "prod": return 1
    if x.dtype.is_float: return -math.inf if op == "max" else math.inf
    if x.dtype is dtypes.bool: return op == "min"
    return x.dtype.min if op == "max" else x.dtype.max


def _sorted_indices(x: Tensor, descending: bool) -> Tensor:
    """For each rank r along x's last axis, the int64 index of the element that sorts to r: stable (equal values
    keep their order), NaN the largest."""
    from ember.tensor import Tensor
    n = x.shape[-1]
    mine, other = x.unsqueeze(-1), x.unsqueeze(-2)  # (..., i, 1) and (..., 1, j)
    ahead = other > mine if descending else other < mine
    tied = other.eq(mine)
    if x.dtype.is_float:  # NaN is larger than every number and equal to NaN
        ahead = ahead | ((other.isnan() & ~mine.isnan()) if descending else (mine.isnan() & ~other.isnan()))
        tied = tied | (mine.isnan() & other.isnan())
    pos = Tensor.arange(n, device=x.device)
    earlier = pos.unsqueeze(0) < pos.unsqueeze(1)  # (i, j): j comes before i
    rank = (ahead | (tied & earlier)).sum(-1)  # (..., i): where element i goes
    lands = rank.unsqueeze(-2).eq(pos.cast(rank.dtype).unsqueeze(-1))  # (..., r, i): element i lands at r
    return lands.where(pos.cast(dtypes.int64), 0).sum(-1)  # exactly one i lands at each r


def _take_along_last(x: Tensor, idx: Tensor) -> Tensor:
    """out[..., r] = x[..., idx[..., r]] for idx of x's leading shape: one load per element, the value unchanged."""
    from ember.tensor import Tensor
    lead, n = x.shape[:-1], x.shape[-1]
    if x.numel() == 0 or idx.numel() == 0: return x.shrink([None] * len(lead) + [(0, idx.shape[-1])])
    wide = x.numel() > 2**31 - 1
    rows = Tensor.arange(x.numel() // n, dtype=dtypes.int64 if wide else dtypes.int32, device=x.device)
    flat = rows.reshape(lead + (1,)) * n + idx.cast(rows.dtype)
    return x.flatten()._take(0, flat)


def _reduce(x: Tensor, op: str, axis: int) -> Tensor:
    return {"sum": x.sum, "prod": x.prod, "max": x.max, "min": x.min}[op](axis=axis)


def _scan_last(x: Tensor, op: str) -> Tensor:
    """The inclusive scan of x along its last axis."""
    from ember.tensor import Tensor
    n = x.shape[-1]
    if n > _BLOCK_ABOVE:
        block = math.isqrt(n - 1) + 1
        blocks = -(-n // block)
        padded = x.pad([(0, 0)] * (x.ndim - 1) + [(0, blocks * block - n)], value=_identity(op, x))
        inner = _scan_last(padded.reshape(x.shape[:-1] + (blocks, block)), op)  # scans inside each block
        totals = inner[..., -1]  # (..., blocks)
        before = _scan_last(totals, op).pad([(0, 0)] * (x.ndim - 1) + [(1, 0)], value=_identity(op, inner))
        carried = {"sum": lambda: inner + before[..., :-1].unsqueeze(-1),
                   "prod": lambda: inner * before[..., :-1].unsqueeze(-1),
                   "max": lambda: inner.maximum(before[..., :-1].unsqueeze(-1)),
                   "min": lambda: inner.minimum(before[..., :-1].unsqueeze(-1))}[op]()
        return carried.reshape(x.shape[:-1] + (blocks * block,))[..., :n]
    pos = Tensor.arange(n, device=x.device)
    upto = pos.unsqueeze(0) <= pos.unsqueeze(1)  # (out, in): input j counts for output i when j <= i
    spread = upto.where(x.unsqueeze(-2), _identity(op, x))
    return _reduce(spread, op, -1)


def _logcumsumexp_last(x: Tensor) -> Tensor:
    """The running log-sum-exp of float x along its last axis. Each prefix is a logsumexp of its own, so its own
    maximum is taken out and no prefix underflows (a running sum of exp(x - max of the row) would give -inf for
    early entries far below the row's maximum). Long axes are split into blocks as in _scan_last."""
    from ember.tensor import Tensor
    n = x.shape[-1]
    if n > _BLOCK_ABOVE:
        block = math.isqrt(n - 1) + 1
        blocks = -(-n // block)
        padded = x.pad([(0, 0)] * (x.ndim - 1) + [(0, blocks * block - n)], value=-math.inf)
        inner = _logcumsumexp_last(padded.reshape(x.shape[:-1] + (blocks, block)))
        before = _logcumsumexp_last(inner[..., -1]).pad([(0, 0)] * (x.ndim - 1) + [(1, 0)], value=-math.inf)
        carried = inner.stack(before[..., :-1].unsqueeze(-1)._broadcast_to(inner.shape), dim=-1).logsumexp(-1)
        return carried.reshape(x.shape[:-1] + (blocks * block,))[..., :n]
    pos = Tensor.arange(n, device=x.device)
    upto = pos.unsqueeze(0) <= pos.unsqueeze(1)  # (out, in): input j counts for output i when j <= i
    return upto.where(x.unsqueeze(-2), -math.inf).logsumexp(-1)


class OrderingMixin:
    """Cumulative reductions and sorting."""

    __slots__ = ()

    def _scan(self: Tensor, op: str, axis: int, name: str, dtype: DType | str | None = None) -> Tensor:
        a = self._axis(axis, name)
        x = self.reshape(1) if self.ndim == 0 else self.transpose(a, -1)
        out = self.dtype
        if op in ("sum", "prod"):
            acc, out = self._accumulate_dtype(dtype)
            x = x.cast(acc)
        scanned = (_scan_last(x, op) if x.shape[-1] else x).cast(out)  # an empty axis scans to itself, as torch
        return scanned.reshape(()) if self.ndim == 0 else scanned.transpose(a, -1)

    def _scan_with_indices(self: Tensor, op: str, axis: int, name: str) -> ValuesIndices:
        """Running max or min with, at each position, the index of the element it came from: the last one equal to
        it (torch's rule, ties go to the later element), the last NaN once a NaN is seen."""
        from ember.tensor import Tensor
        values = self._scan(op, axis, name)
        a = self._axis(axis, name)
        n = self.shape[a] if self.ndim else 1
        # element j sets the running value when it equals it; the index is then the latest such j, a running max
        sets = self.eq(values) | self.isnan() if self.dtype.is_float else self.eq(values)
        position = Tensor.arange(n, dtype=dtypes.int64, device=self.device).reshape(
            tuple(n if i == a else 1 for i in range(self.ndim)))
        return ValuesIndices(values, sets.where(position, 0)._scan("max", a, name))

    def cumsum(self: Tensor, axis: int | None = None, dtype: DType | str | None = None, *,
               dim: int | None = None) -> Tensor:
        """Running sums along `axis` (the first by default; ints give int64 and `dtype` casts first, as torch)."""
        return self._scan("sum", either_axis("cumsum", axis, dim, default=0), "cumsum", dtype)

    def cumprod(self: Tensor, axis: int | None = None, dtype: DType | str | None = None, *,
                dim: int | None = None) -> Tensor:
        """Running products along `axis` (the first by default)."""
        return self._scan("prod", either_axis("cumprod", axis, dim, default=0), "cumprod", dtype)

    def cummax(self: Tensor, axis: int | None = None, *, dim: int | None = None) -> ValuesIndices:
        """(running maxima, their int64 indices) along `axis` (the first by default), as torch.cummax: NaN stays
        once seen; on ties the index is the later element's.

        >>> Tensor([1, 3, 2, 3]).cummax(0).indices.tolist()
        [0, 1, 1, 3]
        """
        return self._scan_with_indices("max", either_axis("cummax", axis, dim, default=0), "cummax")

    def cummin(self: Tensor, axis: int | None = None, *, dim: int | None = None) -> ValuesIndices:
        """(running minima, their int64 indices) along `axis`, as torch.cummin (the rules of `cummax`)."""
        return self._scan_with_indices("min", either_axis("cummin", axis, dim, default=0), "cummin")

    def logcumsumexp(self: Tensor, axis: int | None = None, *, dim: int | None = None) -> Tensor:
        """Running log(sum(exp(x))) along `axis`, computed stably (integers give the default float)."""
        axis = either_axis("logcumsumexp", axis, dim, default=0)
        x = self.float_like()
        if x.ndim == 0: return _logcumsumexp_last(x.reshape(1)).reshape(())
        a = x._axis(axis, "logcumsumexp")
        if x.shape[a] == 0: return x
        return _logcumsumexp_last(x.transpose(a, -1)).transpose(a, -1)

    def sort(self: Tensor, dim: int = -1, descending: bool = False) -> ValuesIndices:
        """(values, int64 indices) along `dim`, stable (equal values keep their order); NaN sorts as the largest."""
        from ember.tensor import Tensor
        if self.ndim == 0: return ValuesIndices(self, Tensor.zeros((), dtype=dtypes.int64, device=self.device))
        a = self._axis(dim, "sort")
        x = self.transpose(a, -1)
        indices = _sorted_indices(x, descending)
        return ValuesIndices(_take_along_last(x, indices).transpose(a, -1), indices.transpose(a, -1))

    def argsort(self: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
        return self.sort(dim, descending)[1]

    def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
        """The k largest (or smallest) values along `dim` and their indices, in order."""
        from ember.errors import ShapeError
        from ember.tensor import Tensor
        a = self._axis(dim, "topk")
        n = self.shape[a] if self.ndim else 1
        if not 0 <= k <= n: raise ShapeError(f"topk: k={k} is out of range for an axis of size {n} in {self.shape}")
        if self.ndim == 0: return ValuesIndices(self, Tensor.zeros((), dtype=dtypes.int64, device=self.device))
        x = self.transpose(a, -1)
        indices = _sorted_indices(x, descending=largest)[..., :k]  # only the k picked values are loaded
        return ValuesIndices(_take_along_last(x, indices).transpose(a, -1), indices.transpose(a, -1))
