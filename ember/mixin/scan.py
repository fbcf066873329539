"""Ops where each output depends on its position along an axis: cumulative sum/prod/max/min, sort, topk.

Both are written as comparisons of every position with every other, reduced: a prefix is a reduction under a
triangular mask and a sorted position is a rank (how many elements come before). That is O(n^2) work per row for
an axis of length n, with no data-dependent control flow, so it fuses into ordinary kernels and autograd needs no
new rules. Long scans are split into blocks (a scan inside blocks plus a scan of the block totals), which brings
the work down to O(n^1.5).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.dtype import dtypes

if TYPE_CHECKING:
    from ember.tensor import Tensor

_BLOCK_ABOVE = 512  # scans longer than this are split into blocks


def _identity(op: str, x: Tensor) -> float | int | bool:
    if op == "sum": return 0
    if op == "prod": return 1
    if x.dtype.is_float: return -math.inf if op == "max" else math.inf
    if x.dtype is dtypes.bool: return op == "min"
    return x.dtype.min if op == "max" else x.dtype.max


def _reduce(x: Tensor, op: str, axis: int) -> Tensor:
    return {"sum": x.sum, "prod": x.prod, "max": x.max, "min": x.min}[op](axis)


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


class ScanMixin:
    """Cumulative reductions and sorting."""

    __slots__ = ()

    def _scan(self: Tensor, op: str, axis: int, name: str) -> Tensor:
        if self.ndim == 0: return _scan_last(self.reshape(1), op).reshape(())
        a = self._axis(axis, name)
        x = self.transpose(a, -1)
        if op in ("sum", "prod"):
            acc, out = self._accumulate_dtype()
            x = x.cast(acc)
        return _scan_last(x, op).transpose(a, -1) if op in ("max", "min") else \
            _scan_last(x, op).cast(out).transpose(a, -1)

    def cumsum(self: Tensor, axis: int = 0) -> Tensor:
        """Running sums along `axis` (ints give int64, as torch)."""
        return self._scan("sum", axis, "cumsum")

    def cumprod(self: Tensor, axis: int = 0) -> Tensor:
        """Running products along `axis`."""
        return self._scan("prod", axis, "cumprod")

    def cummax(self: Tensor, axis: int = 0) -> Tensor:
        """Running maxima along `axis` (NaN stays once seen); the values only, as tinygrad's cummax."""
        return self._scan("max", axis, "cummax")

    def cummin(self: Tensor, axis: int = 0) -> Tensor:
        """Running minima along `axis`."""
        return self._scan("min", axis, "cummin")

    def sort(self: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
        """(values, int64 indices) along `dim`, stable (equal values keep their order); NaN sorts as the largest."""
        from ember.tensor import Tensor
        if self.ndim == 0: return self, Tensor.zeros((), dtype=dtypes.int64, device=self.device)
        a = self._axis(dim, "sort")
        x = self.transpose(a, -1)
        n = x.shape[-1]
        mine, other = x.unsqueeze(-1), x.unsqueeze(-2)  # (..., i, 1) and (..., 1, j)
        if descending: ahead = other > mine
        else: ahead = other < mine
        tied = other.eq(mine)
        if x.dtype.is_float:  # NaN is larger than every number and equal to NaN
            ahead = ahead | ((other.isnan() & ~mine.isnan()) if descending else (mine.isnan() & ~other.isnan()))
            tied = tied | (mine.isnan() & other.isnan())
        pos = Tensor.arange(n, device=self.device)
        earlier = pos.unsqueeze(0) < pos.unsqueeze(1)  # (i, j): j comes before i
        rank = (ahead | (tied & earlier)).sum(-1)  # (..., i): where element i goes
        lands = rank.unsqueeze(-2).eq(pos.cast(rank.dtype).unsqueeze(-1))  # (..., r, i): element i lands at r
        values = lands.where(x.unsqueeze(-2), 0).sum(-1).cast(x.dtype)
        indices = lands.where(pos.cast(dtypes.int64), 0).sum(-1)
        return values.transpose(a, -1), indices.transpose(a, -1)

    def argsort(self: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
        return self.sort(dim, descending)[1]

    def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]:
        """The k largest (or smallest) values along `dim` and their indices, in order."""
        from ember.errors import ShapeError
        a = self._axis(dim, "topk")
        n = self.shape[a] if self.ndim else 1
        if not 0 <= k <= n: raise ShapeError(f"topk: k={k} is out of range for an axis of size {n} in {self.shape}")
        values, indices = self.sort(dim, descending=largest)
        box = [(0, k) if i == a else None for i in range(self.ndim)]
        return values.shrink(box), indices.shrink(box)
