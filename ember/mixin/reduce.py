"""Reductions (sum, max, min, mean, prod) and matmul, which is a broadcast multiply followed by a sum.

Result dtypes follow torch: sum and prod of bool or integers give int64 (uint64 too: the same bits, wrapping mod
2**64), of float16/bfloat16 accumulate in float32 and round back once at the end; mean of integers gives the default
float; any and all of uint8 give uint8.
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
        if self.dtype.is_bool or self.dtype.is_int: return dtypes.int64, dtypes.int64
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

    def var_mean(self: Tensor, axis: Axis = None, keepdim: bool = False,
                 correction: float = 1) -> tuple[Tensor, Tensor]:
        """(var, mean) over `axis`, as torch.var_mean."""
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def std_mean(self: Tensor, axis: Axis = None, keepdim: bool = False,
                 correction: float = 1) -> tuple[Tensor, Tensor]:
        """(std, mean) over `axis`, as torch.std_mean."""
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

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
        """Whether any element over `axis` is nonzero: bool, or uint8 for uint8 input (torch keeps that for
        backward compatibility)."""
        out = self.ne(0).max(axis, keepdim) if self.numel() else self.ne(0).sum(axis, keepdim).ne(0)
        return out.cast(dtypes.uint8) if self.dtype is dtypes.uint8 else out

    def all(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """Whether every element over `axis` is nonzero: bool, or uint8 for uint8 input (as torch)."""
        out = self.logical_not().any(axis, keepdim).logical_not()
        return out.cast(dtypes.uint8) if self.dtype is dtypes.uint8 else out

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

    @staticmethod
    def einsum(formula: str, *operands: Tensor | Sequence[Tensor]) -> Tensor:
        """Einstein summation as torch.einsum: "ij,jk->ik", implicit outputs ("ij,jk"), repeated labels in one
        operand (diagonals, "ii->i"), broadcasting with "...". One broadcast product, one sum."""
        from ember.tensor import Tensor
        tensors = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else \
            list(operands)
        lhs, arrow, rhs = formula.replace(" ", "").partition("->")
        specs = lhs.split(",")
        if len(specs) != len(tensors) or not all(isinstance(t, Tensor) for t in tensors):
            raise ShapeError(f"einsum: {formula!r} names {len(specs)} operands, got {len(tensors)} tensors")
        ellipsis = max((t.ndim - len(sp.replace("...", "")) for sp, t in zip(specs, tensors, strict=True)
                        if "..." in sp), default=0)
        labels = [_einsum_labels(sp, t, ellipsis, formula) for sp, t in zip(specs, tensors, strict=True)]
        dots = [f".{i}" for i in range(ellipsis)]
        if arrow: out = _einsum_labels(rhs, None, ellipsis, formula)
        else:
            letters = [c for ls in labels for c in ls if not c.startswith(".")]
            out = dots + sorted(c for c in set(letters) if letters.count(c) == 1)
        seen = {c for ls in labels for c in ls}
        if any(c not in seen for c in out) or len(set(out)) != len(out):
            raise ShapeError(f"einsum: output labels of {formula!r} must appear in the inputs, once each")
        summed = [c for c in dict.fromkeys(c for ls in labels for c in ls) if c not in out]
        order = out + summed
        sizes: dict[str, int] = {}
        aligned = []
        for t, ls in zip(tensors, labels, strict=True):
            t, ls = _einsum_diagonals(t, ls)
            for c, n in zip(ls, t.shape, strict=True):
                if n != 1 and sizes.setdefault(c, n) != n:
                    raise ShapeError(f"einsum: label {c!r} has sizes {sizes[c]} and {n} in {formula!r}")
            t = t.permute([ls.index(c) for c in order if c in ls])
            aligned.append(t.reshape(tuple(t.shape[[c for c in order if c in ls].index(c)] if c in ls else 1
                                           for c in order)))
        dtype = least_upper_dtype(*(t.dtype for t in aligned))
        # half products are taken and summed in float32 and rounded once, as torch (and matmul) do
        acc = dtypes.float32 if dtype.is_float and dtype.itemsize < 4 else dtype
        product = aligned[0].cast(acc)
        for t in aligned[1:]: product = product * t.cast(acc)
        product = product._broadcast_to(tuple(sizes.get(c, 1) for c in order))
        if summed: product = product.sum(tuple(range(len(out), len(order))), dtype=acc)
        return product.cast(dtype)


def _einsum_labels(spec: str, t: Tensor | None, ellipsis: int, formula: str) -> list[str]:
    """The labels of one operand's axes; "..." stands for the trailing `ellipsis` broadcast axes, right-aligned."""
    head, dots, tail = spec.partition("...")
    if any(not c.isalpha() for c in head + tail) or "..." in tail:
        raise ShapeError(f"einsum: bad subscripts {spec!r} in {formula!r}; use letters and at most one '...'")
    n = (t.ndim - len(head) - len(tail)) if (t is not None and dots) else (ellipsis if dots else 0)
    if t is not None and (n < 0 or (not dots and len(head) != t.ndim)):
        raise ShapeError(f"einsum: subscripts {spec!r} do not match an operand of shape {t.shape}")
    return list(head) + [f".{i}" for i in range(ellipsis - n, ellipsis)] + list(tail)


def _einsum_diagonals(t: Tensor, labels: list[str]) -> tuple[Tensor, list[str]]:
    """Axes sharing a label within one operand collapse to their diagonal."""
    while len(set(labels)) != len(labels):
        c = next(c for c in labels if labels.count(c) > 1)
        i, j = [k for k, x in enumerate(labels) if x == c][:2]
        if t.shape[i] != t.shape[j]:
            raise ShapeError(f"einsum: repeated label {c!r} has sizes {t.shape[i]} and {t.shape[j]}")
        rest = [k for k in range(t.ndim) if k not in (i, j)]
        n = t.shape[i]
        t = t.permute(rest + [i, j]).flatten(-2)[..., ::n + 1] if n else t.permute(rest + [i, j])[..., 0]
        labels = [labels[k] for k in rest] + [c]
    return t, labels

