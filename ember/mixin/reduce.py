"""Reductions (sum, max, min, mean, prod) and matmul, which is a broadcast multiply followed by a sum.

Result dtypes follow torch: sum and prod of bool or integers give int64 (uint64 too: the same bits, wrapping mod
2**64), of float16/bfloat16 accumulate in float32 and round back once at the end; mean of integers gives the default
float; any and all of uint8 give uint8.

Axes are named `axis=` (tinygrad) or `dim=` (torch). max and min with one int dim return torch's (values, indices);
with `axis=`, a tuple of axes or no axis, the values only (tinygrad's form).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from ember.dtype import DType, dtypes, least_upper_dtype, to_dtype
from ember.errors import ShapeError
from ember.helpers import prod as prod_of
from ember.mixin.elementwise import broadcast_shape
from ember.mixin.movement import either_axis, is_int_axis, reduce_axes
from ember.uop.ops import Ops, UOp
from ember.variables import concrete

# Layouts of the right operand b, by multiply-adds, measured on a 2-core AVX-512 CPU. From PACK_MACS, `x @ w.T`
# copies w.T into (k, m) order first: 256x784x512 1.87 -> 1.55 ms, 512x512x512 3.23 -> 1.78 ms (g.T @ x gains
# nothing from a copy of g.T, so only b is copied). From PANEL_MACS, b is copied into panels one vector wide
# (every k of a tile's columns together, not 4-8 KiB apart): GEMM 1024 163-194 -> 192-205 GFLOP/s, 2048
# 128 -> 213 (512: no gain). On a 2-core AVX2 EPYC with the dot-product tiles of codegen/heuristic.py: 512x512x512
# 3.79 -> 3.12 ms, 256x784x512 even, and scaled_dot_product_attention 2x8x128x64 without the copy of k 0.97x (7
# rounds, 0.57-1.26x), 1x8x256x64 1.08x: a batch of matrices is not copied.
PACK_MACS = 1 << 20
PANEL_MACS = 1 << 30


def panel_width(b: Tensor, acc: DType) -> int:
    """The columns of one vector of `acc` on b's device (0: no vectors there, or b's columns do not divide)."""
    from ember.device import Device
    lanes = Device[b.device].renderer.vector_bytes // acc.itemsize
    if lanes < 2 or not all(isinstance(s, int) for s in b.shape) or b.shape[-1] % lanes: return 0
    return lanes

if TYPE_CHECKING:
    from ember.tensor import Tensor

Axis = int | Sequence[int] | None


class ValuesIndices(NamedTuple):
    """(values, indices) as torch's max/min/cummax/cummin/sort/topk return them: unpacks as a tuple, or read
    `.values` and `.indices` (int64)."""

    values: Tensor
    indices: Tensor


def sum_to(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """t summed over the axes a broadcast to t.shape added or stretched from `shape`."""
    if lead := t.ndim - len(shape): t = t.sum(tuple(range(lead)))
    stretched = tuple(i for i, (have, want) in enumerate(zip(t.shape, shape, strict=True)) if want == 1 and have != 1)
    return t.sum(stretched, keepdim=True) if stretched else t


def matmul_pull(g: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """a @ b's gradients as matmuls of the operands as given (Tensor.custom_vjp's pull): g @ b.T and a.T @ g, each
    choosing its own form (x @ w.T's input gradient reads w itself, with stride one along its rows, not the
    packed copy the forward read, which it would read across), summed over broadcast batch axes; torch's rules
    for 1-d operands."""
    a2, b2 = (a.unsqueeze(0) if a.ndim == 1 else a), (b.unsqueeze(-1) if b.ndim == 1 else b)
    g2 = g.unsqueeze(-2) if a.ndim == 1 else g
    g2 = g2.unsqueeze(-1) if b.ndim == 1 else g2
    da = sum_to(g2 @ b2.transpose(-1, -2), a2.shape).reshape(a.shape)
    db = sum_to(a2.transpose(-1, -2) @ g2, b2.shape).reshape(b.shape)
    return da, db


class SoftmaxGradient(NamedTuple):
    """softmax's and log_softmax's gradients from their outputs y (Tensor.custom_vjp's pull): y (g - sum g y) and
    g - exp(y) sum g, one sum and one elementwise pass; composition pulls g back through the division and the
    exponential, with a sum of its own for each. The output gets no gradient of its own."""

    axis: int
    log: bool

    def __call__(self, g: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, None]:
        if self.log: return g - y.exp() * g.sum(self.axis, keepdim=True), None
        return y * (g - (g * y).sum(self.axis, keepdim=True)), None


class ReduceMixin:
    """Reductions over axes, and matrix products.

    Every reduction takes `axis=` (tinygrad's name) or `dim=` (torch's), not both."""

    __slots__ = ()

    def _reduce_axes(self: Tensor, axis: Axis, op: str) -> tuple[int, ...]:
        return reduce_axes(self, axis, op)

    def _reduce(self: Tensor, op: Ops, axis: Axis, keepdim: bool, name: str) -> Tensor:
        axes = self._reduce_axes(axis, name)
        out = self._wrap(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes))) if axes else self
        if keepdim: return out
        return out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def _accumulate_dtype(self: Tensor, dtype: DType | str | None = None) -> tuple[DType, DType]:
        """(the dtype to accumulate in, the dtype of the result); `dtype` is the result dtype a user asked for."""
        if dtype is not None:
            out = to_dtype(dtype)
            return (dtypes.float32 if out.is_float and out.itemsize < 4 else out), out
        if self.dtype.is_bool or self.dtype.is_int: return dtypes.int64, dtypes.int64
        if self.dtype.itemsize < 4: return dtypes.float32, self.dtype
        return self.dtype, self.dtype

    def sum(self: Tensor, axis: Axis = None, keepdim: bool = False, dtype: DType | str | None = None, *,
            dim: Axis = None) -> Tensor:
        """The sum over `axis` (all axes when None); `dtype` casts the input first, as torch."""
        acc, out = self._accumulate_dtype(dtype)
        return self.cast(acc)._reduce(Ops.ADD, either_axis("sum", axis, dim), keepdim, "sum").cast(out)

    def prod(self: Tensor, axis: Axis = None, keepdim: bool = False, dtype: DType | str | None = None, *,
             dim: Axis = None) -> Tensor:
        """The product over `axis`; `dtype` casts the input first, as torch."""
        acc, out = self._accumulate_dtype(dtype)
        return self.cast(acc)._reduce(Ops.MUL, either_axis("prod", axis, dim), keepdim, "prod").cast(out)

    def _max_values(self: Tensor, axis: Axis, keepdim: bool, name: str = "max") -> Tensor:
        self._check_nonempty(axis, name)
        return self._reduce(Ops.MAX, axis, keepdim, name)

    def _min_values(self: Tensor, axis: Axis, keepdim: bool) -> Tensor:
        self._check_nonempty(axis, "min")
        if self.dtype.is_float: return -((-self)._max_values(axis, keepdim, "min"))
        # ~x reverses the order of bools, signed ints (-x-1) and unsigned ints (max-x) and never overflows, where
        # -x does for the most negative int
        return ~((~self)._max_values(axis, keepdim, "min"))

    def max(self: Tensor, dim: Axis = None, keepdim: bool = False, *, axis: Axis = None) -> Tensor | ValuesIndices:
        """The largest element over an axis (NaN if any element is NaN).

        The form of the result follows torch where torch has one: an int `dim` (positional, `x.max(1)`, or
        `dim=1`) gives `(values, indices)` with int64 indices of the first largest element (the first NaN), as
        torch.max. No axis, a tuple of axes, or the `axis=` keyword (tinygrad's form) give the values only.

        >>> Tensor([[1, 5], [7, 2]]).max(1).indices.tolist()
        [1, 0]
        >>> Tensor([[1, 5], [7, 2]]).max(axis=1).tolist()
        [5, 7]
        """
        if dim is not None and axis is not None: either_axis("max", axis, dim)
        if is_int_axis(dim):
            return ValuesIndices(self._max_values(dim, keepdim), self.argmax(dim, keepdim))
        return self._max_values(dim if axis is None else axis, keepdim)

    def min(self: Tensor, dim: Axis = None, keepdim: bool = False, *, axis: Axis = None) -> Tensor | ValuesIndices:
        """The smallest element over an axis: `(values, indices)` for an int `dim`, the values otherwise (the rule
        of `max`).

        >>> Tensor([0, -2**31], dtype="int32").min().item()
        -2147483648
        """
        if dim is not None and axis is not None: either_axis("min", axis, dim)
        if is_int_axis(dim):
            return ValuesIndices(self._min_values(dim, keepdim), self.argmin(dim, keepdim))
        return self._min_values(dim if axis is None else axis, keepdim)

    def mean(self: Tensor, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None) -> Tensor:
        """The average over `axis` (NaN over an empty axis)."""
        axis = either_axis("mean", axis, dim)
        x = self if self.dtype.is_float else self.cast(dtypes.default_float)
        count = 1
        for a in self._reduce_axes(axis, "mean"): count *= self.shape[a]
        total = x.sum(axis, keepdim)
        return total.div(count) if count else total * float("nan")

    def var(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: float = 1, *,
            dim: Axis = None) -> Tensor:
        """The mean squared deviation over `axis`, divided by n - correction instead of n (Bessel's by default)."""
        axis = either_axis("var", axis, dim)
        x = self.float_like()
        n = 1
        for a in self._reduce_axes(axis, "var"): n *= self.shape[a]
        deviation = x - x.mean(axis, keepdim=True)
        return deviation.square().sum(axis, keepdim).div(max(n - correction, 0))

    def std(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: float = 1, *,
            dim: Axis = None) -> Tensor:
        """The square root of `var`. Where the variance is 0 (a constant slice) the gradient is 0, as torch's: sqrt's
        derivative there is infinite, and 0 * inf would poison every gradient upstream with NaN. The where passes no
        gradient to the branch it does not take, so the variance gets 0 there; a NaN variance (a singleton axis
        with correction=1) stays NaN, value and gradient, as torch's."""
        variance = self.var(either_axis("std", axis, dim), keepdim, correction)
        return variance.eq(0).where(0.0, variance).sqrt()

    def var_mean(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: float = 1, *,
                 dim: Axis = None) -> tuple[Tensor, Tensor]:
        """(var, mean) over `axis`, as torch.var_mean."""
        axis = either_axis("var_mean", axis, dim)
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def std_mean(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: float = 1, *,
                 dim: Axis = None) -> tuple[Tensor, Tensor]:
        """(std, mean) over `axis`, as torch.std_mean."""
        axis = either_axis("std_mean", axis, dim)
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    def logsumexp(self: Tensor, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None) -> Tensor:
        """log(sum(exp(x))) without overflow: the max is taken out first (and kept finite for all -inf rows).

        Over an empty axis the sum is 0 and the result -inf, as torch."""
        axis = either_axis("logsumexp", axis, dim)
        x = self.float_like()
        if self._is_empty_along(axis, "logsumexp"): peak = x.zeros_like().sum(axis, keepdim=True)  # log(0) = -inf
        else:
            peak = x._max_values(axis, True, "logsumexp")
            peak = peak.isinf().where(0.0, peak).detach()
        out = (x - peak).exp().sum(axis, keepdim=True).log() + peak
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(x.shape)
                                                     if i not in self._reduce_axes(axis, "logsumexp")))

    def softmax(self: Tensor, axis: int | None = None, dtype: DType | str | None = None, *,
                dim: int | None = None) -> Tensor:
        """exp(x) / sum(exp(x)) along `axis` (the last by default); `dtype` casts the input first, as torch.
        Over an empty axis the result is empty too."""
        axis = either_axis("softmax", axis, dim, default=-1)
        x = self.float_like() if dtype is None else self.cast(dtype)
        if x._is_empty_along(axis, "softmax"): return x
        e = (x - x._max_values(axis, True, "softmax").detach()).exp()
        out = e / e.sum(axis, keepdim=True)
        return out.custom_vjp((x, out), SoftmaxGradient(axis % x.ndim, log=False))

    def log_softmax(self: Tensor, axis: int | None = None, dtype: DType | str | None = None, *,
                    dim: int | None = None) -> Tensor:
        """x - logsumexp(x) along `axis` (the last by default); `dtype` casts the input first, as torch.

        Computed as torch does, (x - max) - log(sum(exp(x - max))), so a row whose max is +inf or -inf is all NaN,
        as in torch (x - logsumexp(x) would give -inf beside the NaN of an inf). Over an empty axis the result is
        empty too."""
        axis = either_axis("log_softmax", axis, dim, default=-1)
        x = self.float_like() if dtype is None else self.cast(dtype)
        if x._is_empty_along(axis, "log_softmax"): return x
        shifted = x - x._max_values(axis, True, "log_softmax").detach()
        out = shifted - shifted.exp().sum(axis, keepdim=True).log()
        return out.custom_vjp((x, out), SoftmaxGradient(axis % x.ndim, log=True))

    def argmax(self: Tensor, axis: int | None = None, keepdim: bool = False, *, dim: int | None = None) -> Tensor:
        """The index (int64) of the first largest element over `axis` (of the flattened tensor when None); NaN wins."""
        from ember.tensor import Tensor
        axis = either_axis("argmax", axis, dim)
        if axis is None: return self.flatten().argmax(0).reshape((1,) * self.ndim if keepdim else ())
        a = self._axis(axis, "argmax")
        if self.ndim == 0: return Tensor.zeros((), dtype=dtypes.int64, device=self.device)
        self._check_nonempty(a, "argmax")
        n = self.shape[a]
        is_peak = self.eq(self._max_values(a, True, "argmax"))
        if self.dtype.is_float: is_peak = is_peak | self.isnan()
        countdown = Tensor.arange(n, 0, -1, dtype="int64", device=self.device).reshape(
            tuple(n if i == a else 1 for i in range(self.ndim)))
        first = is_peak.where(countdown, 0)._max_values(a, keepdim, "argmax")
        return (-first + n).cast("int64")  # (n may be a symbolic size: the tensor's operator takes it)

    def argmin(self: Tensor, axis: int | None = None, keepdim: bool = False, *, dim: int | None = None) -> Tensor:
        """The index of the first smallest element."""
        flipped = -self if self.dtype.is_float else ~self  # ~x = -x-1 reverses the order without overflow
        return flipped.argmax(either_axis("argmin", axis, dim), keepdim)

    def any(self: Tensor, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None) -> Tensor:
        """Whether any element over `axis` is nonzero: bool, or uint8 for uint8 input (torch keeps that for
        backward compatibility)."""
        axis = either_axis("any", axis, dim)
        nonzero = self.ne(0)
        out = nonzero._max_values(axis, keepdim, "any") if self.numel() else nonzero.sum(axis, keepdim).ne(0)
        return out.cast(dtypes.uint8) if self.dtype is dtypes.uint8 else out

    def all(self: Tensor, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None) -> Tensor:
        """Whether every element over `axis` is nonzero: bool, or uint8 for uint8 input (as torch)."""
        out = self.logical_not().any(either_axis("all", axis, dim), keepdim).logical_not()
        return out.cast(dtypes.uint8) if self.dtype is dtypes.uint8 else out

    def _is_empty_along(self: Tensor, axis: Axis, name: str) -> bool:
        """Whether an axis reduced over has size 0: a reduction with no identity (max) cannot run over it."""
        return any(concrete(self.shape)[a] == 0 for a in self._reduce_axes(axis, name))  # (a symbolic size: its value)

    def _check_nonempty(self: Tensor, axis: Axis, name: str) -> None:
        for a in self._reduce_axes(axis, name):
            if concrete(self.shape)[a] == 0:  # (a symbolic size bound to 0 too)
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
        macs = prod_of(a.shape[-2:]) * b.shape[-1] if all(isinstance(s, int) for s in (*a.shape, *b.shape)) else 0
        if (panel := panel_width(b, acc)) and macs >= PANEL_MACS:
            # (k, m) -> (m/panel, k, panel): the columns of one vector, all k of them, lie together in memory
            m = b.shape[-1]
            b = b.reshape(*b.shape[:-1], m // panel, panel).transpose(-3, -2).contiguous().transpose(-3, -2) \
                .reshape(b.shape)
        elif b.uop.op is Ops.PERMUTE and b.uop.arg[-1] != b.ndim - 1 and macs >= PACK_MACS and \
                prod_of(b.shape[:-2]) == 1:
            # x @ w.T reads w along its rows; a copy in (k, m) order streams in vectors. One matrix only: a batch
            # of them (attention's q @ k.T, 16 x 128x64x128) gains nothing the copy's kernel does not cost
            b = b.contiguous()
        # (..., n, k) -> (..., n, 1, k) and (..., k, m) -> (..., 1, m, k): the product sums over the last axis
        prod = a.cast(acc).unsqueeze(-2) * b.cast(acc).transpose(-1, -2).unsqueeze(-3)
        out = prod._reduce(Ops.ADD, -1, False, "matmul").cast(out_dtype)
        if self.ndim == 1: out = out.squeeze(-2)
        if other.ndim == 1: out = out.squeeze(-1)
        return out.custom_vjp((self, other), matmul_pull) if out_dtype.is_float else out

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

