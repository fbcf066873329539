"""Indexing Tensor ops: `x[...]` and `x[...] = v` with numpy's rules, gather, scatter, masked_fill, index_select.

Basic indices (ints, slices with any step, None, Ellipsis) are movement ops: shrink, flip, a strided reshape, and
nothing is copied. Index tensors (integer or boolean) read by address: `x[idx]` and gather are a GATHER, one load per
element out at the position the index holds, fused into the kernel that reads it; their gradient is a SCATTER_ADD
(gradient.py), one add per element out, so both directions cost time linear in the elements read, as an embedding
table or a label lookup needs. A boolean mask gives a shape that depends on its values, so it is realized first, as
in torch and numpy.

Indices out of range. Each op accepts the indices torch accepts: `x[idx]` (and index_put through `x[idx] = v`)
wraps a negative index once, so [-n, n) is valid; gather, scatter, index_select, one_hot, Embedding and the loss
targets take [0, n) only. An index outside its range raises IndexError naming the op, the index and the size, when
its values are known on the host: a realized tensor (from a list, a numpy array, or realized before) is read back
and checked for its min and max, with no kernel run. An index computed lazily is not known until the graph runs; it
is not realized just to be checked, and on the device an index outside its range reads 0 (a write there is
dropped). Set CHECK_INDICES=1 (the environment, or `with Context(CHECK_INDICES=1):`) to realize lazy index tensors
first and check them as well, at the cost of a kernel launch and a device-to-host copy per index tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.dtype import dtypes
from ember.errors import ArgumentError, DTypeError, ShapeError
from ember.helpers import ContextVar, prod, strides_for_shape
from ember.uop.ops import UOp
from ember.variables import concrete

if TYPE_CHECKING:
    from ember.tensor import Tensor

CHECK_INDICES = ContextVar("CHECK_INDICES", 0)  # realize lazily computed index tensors to check their range


@dataclass
class _BasicIndex:
    """What the basic part of an index does: shrink to `box`, reverse `flips`, keep every `steps`-th, reshape."""

    box: list[tuple[int, int]]
    flips: list[bool]
    steps: list[int]
    shape: tuple[int, ...]  # the result's shape
    tensor_axes: list[int]  # axes of the result indexed by a tensor (their index tensors are in `tensors`)
    tensors: list[Tensor]
    apart: bool  # the index tensors are separated by a slice or None: their axes go first (numpy's rule)
    empty: list[int]  # new axes made by a `False` index: they have size 0


def _as_index_tensor(item: Any, like: Tensor) -> Tensor | None:
    """An index that selects by value (a Tensor, a list or a numpy array) as a Tensor; None for basic indices."""
    from ember.tensor import Tensor
    if isinstance(item, Tensor): return item
    if isinstance(item, (list, np.ndarray)):
        return Tensor(np.asarray(item) if len(item) else np.zeros(0, np.int64), device=like.device)
    return None


def index_values(idx: Tensor) -> np.ndarray | None:
    """The values of an index tensor when they can be checked on the host (see the module docstring), else None.

    Known values are read back as they are; under CHECK_INDICES a lazy index is realized first (in place, so the
    graph that uses it reads the realized buffer and computes it once). A traced input has no values yet."""
    if idx.numel() == 0 or idx._traced(): return None
    if not idx.values_known():
        if not CHECK_INDICES: return None
        idx.realize()
    return idx.numpy()


def check_index_range(op: str, idx: Tensor, size: int, axis: int | None = None, wraps: bool = False) -> None:
    """Raise IndexError for an index outside [0, size) ([-size, size) when the op wraps negative indices), when
    the index's values are known. Only the min and max are compared, so the check costs two passes over the host
    copy."""
    values = index_values(idx)
    if values is None: return
    low, high = values.min(), values.max()
    if low >= (-size if wraps else 0) and high < size: return
    bad = high if high >= size else low
    where = f"for axis {axis} " if axis is not None else ""
    valid = f"{-size}..{size - 1}" if wraps else f"0..{size - 1}"
    raise IndexError(f"{op}: index {bad} is out of bounds {where}with size {size}; valid indices are {valid}"
                     if size else f"{op}: index {bad} is out of bounds {where}with size 0; no index is valid")


def _parse_index(x: Tensor, index: Any) -> _BasicIndex:
    """Split an index into its basic part and its index tensors, checking every piece against x's shape."""
    from ember.tensor import Tensor
    items: list[Any] = []
    for it in (list(index) if isinstance(index, tuple) else [index]):
        t = _as_index_tensor(it, x)
        if t is not None and t.ndim == 0 and t.dtype is dtypes.bool: it = bool(t.item())  # as torch: a scalar
        elif t is not None and t.ndim == 0 and t.dtype.is_int and t.values_known(): it = int(t.item())
        elif t is not None: it = t  # a lazy 0-d int index is a 0-d index tensor: it removes the axis as an int
        items.append(it)
    if sum(i is Ellipsis for i in items) > 1:
        raise IndexError("index: an index can only have a single ellipsis ('...')")
    def width(i: Any) -> int:  # axes of x an index item consumes
        if i is None or i is Ellipsis or isinstance(i, bool): return 0
        return i.ndim if isinstance(i, Tensor) and i.dtype is dtypes.bool else 1
    used = sum(width(i) for i in items)
    if used > x.ndim: raise IndexError(f"index: too many indices for a {x.ndim}-d tensor {x.shape}")
    at = next((i for i, it in enumerate(items) if it is Ellipsis), len(items))  # `in` would compare tensors
    items[at:at + 1] = [slice(None)] * (x.ndim - used)
    expanded: list[Any] = []  # a boolean mask over k axes is k index tensors: the positions of its True values
    axis = 0
    for it in items:
        if isinstance(it, Tensor) and it.dtype is dtypes.bool:
            covered = x.shape[axis:axis + it.ndim]
            if it.shape != covered:
                raise IndexError(f"index: a mask of shape {it.shape} does not match the shape {covered} of the axes "
                                 f"{axis}..{axis + it.ndim - 1} it indexes in {x.shape}")
            expanded += [Tensor(np.asarray(c, dtype=np.int64), device=x.device) for c in np.nonzero(it.numpy())]
        else: expanded.append(it)
        axis += width(it)
    items = expanded
    box: list[tuple[int, int]] = []
    flips: list[bool] = []
    steps: list[int] = []
    shape: list[int] = []
    tensor_axes: list[int] = []
    tensors: list[Tensor] = []
    kinds: list[str] = []
    axis = 0
    empty: list[int] = []
    for it in items:
        if it is None or isinstance(it, bool):  # a new axis; `False` selects nothing from it (numpy, torch)
            if it is False: empty.append(len(shape))
            shape.append(1); kinds.append("basic")
            continue
        size = x.shape[axis]
        if isinstance(size, UOp):  # a symbolic axis (ember/variables.py): kept whole, or not supported
            if not (isinstance(it, slice) and it == slice(None)):
                raise ShapeError(f"index: indexing the symbolic axis {axis} (size {size}) with {it!r} is not "
                                 "supported; only ':' keeps it (reshape to a concrete shape first)")
            box.append((0, size)); flips.append(False); steps.append(1)
            shape.append(size); kinds.append("basic")
        elif isinstance(it, Tensor):
            if not it.dtype.is_int: raise IndexError(f"index: tensors used as indices must be int or bool, not "
                                                     f"{it.dtype.name}")
            check_index_range("index", it, size, axis, wraps=True)
            box.append((0, size)); flips.append(False); steps.append(1)
            tensor_axes.append(len(shape)); tensors.append(it); kinds.append("tensor")
            shape.append(size)
        elif isinstance(it, int) and not isinstance(it, bool):
            if not -size <= it < size:
                raise IndexError(f"index: {it} is out of bounds for axis {axis} with size {size}")
            i = it % size
            box.append((i, i + 1)); flips.append(False); steps.append(1)  # torch: an int never separates tensors
        elif isinstance(it, slice):
            start, stop, step = it.indices(size)
            n = len(range(start, stop, step))
            if step > 0: box.append((start, start + max(n - 1, 0) * step + (1 if n else 0)))
            else: box.append((start - max(n - 1, 0) * -step, start + 1) if n else (0, 0))
            flips.append(step < 0); steps.append(abs(step))
            shape.append(n); kinds.append("basic")
        else:
            raise IndexError(f"index: unsupported index {it!r}; use ints, slices, None, ..., or int/bool tensors")
        axis += 1
    runs = "".join("t" if k == "tensor" else "b" for k in kinds).strip("b")
    return _BasicIndex(box, flips, steps, tuple(shape), tensor_axes, tensors, "b" in runs, empty)


def _basic_view(x: Tensor, ix: _BasicIndex) -> Tensor:
    y = x.shrink(ix.box).flip([i for i, f in enumerate(ix.flips) if f])._strided(ix.steps).reshape(ix.shape)
    return y.shrink([(0, 0) if a in ix.empty else None for a in range(y.ndim)]) if ix.empty else y


def _basic_unview(v: Tensor, ix: _BasicIndex, full: tuple[int, ...]) -> Tensor:
    """The inverse of _basic_view: v (of the view's shape) placed where the view reads from, zero elsewhere."""
    lengths = [e - b for b, e in ix.box]
    strided = [-(-n // s) for n, s in zip(lengths, ix.steps, strict=True)]
    v = v.reshape(strided)
    for axis, (step, n) in enumerate(zip(ix.steps, lengths, strict=True)):
        if step == 1: continue
        m = v.shape[axis]
        v = v.reshape(v.shape[:axis + 1] + (1,) + v.shape[axis + 1:])
        v = v.pad([(0, 0)] * (axis + 1) + [(0, step - 1)] + [(0, 0)] * (v.ndim - axis - 2))
        v = v.reshape(v.shape[:axis] + (m * step,) + v.shape[axis + 2:])
        v = v.shrink([None] * axis + [(0, n)] + [None] * (v.ndim - axis - 1))
    v = v.flip([i for i, f in enumerate(ix.flips) if f])
    return v.pad([(b, s - e) for (b, e), s in zip(ix.box, full, strict=True)])


def _flat_tensor_index(ix: _BasicIndex, y: Tensor) -> tuple[Tensor, int]:
    """The index tensors of `ix` combined into one index into y's tensor axes flattened, and their total size."""
    sizes = [y.shape[a] for a in ix.tensor_axes]
    idx = [t.cast(dtypes.int64) if t.dtype.itemsize > 4 else t.cast(dtypes.int32) for t in ix.tensors]
    flat, inside = None, None
    for t, size, stride in zip(idx, sizes, [prod(sizes[i + 1:]) for i in range(len(sizes))], strict=True):
        term = (t < 0).where(t + size, t) * stride
        ok = (t >= -size) & (t < size)
        flat, inside = (term, ok) if flat is None or inside is None else (flat + term, inside & ok)
    assert flat is not None and inside is not None
    return inside.where(flat, -1), prod(sizes)  # a lazy index outside its axis reads 0 (-1 is outside every axis)


def _select_last(table: Tensor, idx: Tensor) -> Tensor:
    """table[..., idx[...]] elementwise: idx broadcasts against table's leading axes and picks along its last one.

    Exactly one position matches, so the sum adds the picked value to zeros (a picked -0.0 comes back as 0.0)."""
    hit = idx.unsqueeze(-1).eq(_arange_like(table.shape[-1], idx))
    return hit.where(table, 0).sum(-1).cast(table.dtype)




class IndexingMixin:
    """`x[index]`, `x[index] = value`, and the torch functions that select or write by index tensors."""

    __slots__ = ()

    def __getitem__(self: Tensor, index: Any) -> Tensor:
        """numpy's indexing: ints, slices (any step), None, Ellipsis, and integer or boolean index tensors."""
        ix = _parse_index(self, index)
        y = _basic_view(self, ix)
        if not ix.tensors: return y
        from ember.mixin.elementwise import broadcast_shape
        shape = broadcast_shape("index", *(t.shape for t in ix.tensors))  # names the op when they do not fit
        flat, n = _flat_tensor_index(ix, y)
        flat = flat._broadcast_to(shape)
        others = [a for a in range(y.ndim) if a not in ix.tensor_axes]
        table = y.permute(others + ix.tensor_axes).reshape(tuple(y.shape[a] for a in others) + (n,))
        out = table._take(table.ndim - 1, flat)  # the other axes, then the index's axes
        first = 0 if ix.apart else ix.tensor_axes[0]
        k = len(others)
        order = list(range(first)) + list(range(k, out.ndim)) + list(range(first, k))
        return out.permute(order)

    def __setitem__(self: Tensor, index: Any, value: Any) -> None:
        """Write `value` (broadcast to the indexed shape) where `index` points, then realize self. Of several writes
        to one position the last in index order stays, as in torch's index_put on CPU and in numpy.

        Tensors built from self before the write keep the values they had (ember's tensors are values, not views).

        Gradients flow through the write as in torch: the overwritten elements of self get none, the rest of self
        and `value` (when it requires grad) get theirs. So self is realized at once only when no gradient can pass
        through it; otherwise it stays lazy, since realizing would cut it from the tensors it was computed from. Of
        several writes to one position only the last gets a gradient (torch gives one to each)."""
        from ember.tensor import Tensor
        self._check_writable("setitem")
        ix = _parse_index(self, index)
        v = value if isinstance(value, Tensor) else Tensor(value, device=self.device, dtype=self.dtype)
        if ix.empty or any(t.numel() == 0 for t in ix.tensors):  # selects nothing: only check the value's shape
            _broadcast_value(v.shape, self[index].shape)
            return
        if not ix.tensors:
            target = _basic_view(self, ix).shape
            v = _fit(v.cast(self.dtype), target)
            inside = _basic_unview(Tensor.ones(target, dtype=dtypes.bool, device=self.device), ix, self.shape)
            new = inside.where(_basic_unview(v, ix, self.shape), self)
        else:  # where each written element lands, as flat positions; the last write to a position wins
            positions = Tensor.arange(self.numel(), device=self.device).reshape(self.shape)[index]
            v = _fit(v.cast(self.dtype), positions.shape).flatten()
            positions = positions.flatten()
            hit = positions.unsqueeze(-1).eq(Tensor.arange(self.numel(), device=self.device))  # (writes, numel)
            order = Tensor.arange(1, positions.numel() + 1, device=self.device).unsqueeze(-1)
            last = hit.where(order, 0).max(axis=0)  # 1 + the last write to each position, 0 for none
            picked = _select_last(v.reshape(1, -1), (last - 1).maximum(0))
            new = (last > 0).where(picked, self.flatten()).reshape(self.shape)
        self.assign(new.contiguous())
        if not self._carries_gradient(): self.realize()

    def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """out[i][j][k] = self[i][index[i][j][k]][k] for dim=1, as torch.gather: out has index's shape."""
        from ember.tensor import Tensor
        if self.ndim == 0: return self.reshape(1).gather(0, index.reshape(1)).reshape(())
        d = self._axis(dim, "gather")
        _check_same_rank("gather", self, index, d)
        check_index_range("gather", index, concrete(self.shape)[d], d)  # (a symbolic size: its bound value)
        if any(type(s) is UOp for s in (*self.shape, *index.shape)): return _gather_by_compare(self, d, index)
        n, strides = self.shape[d], strides_for_shape(self.shape)
        along = index.cast(dtypes.int64 if self.numel() > 2**31 - 1 else dtypes.int32)  # torch: no negative index
        flat = along * strides[d]
        for a, size in enumerate(index.shape):
            if a != d and size > 1:
                coord = Tensor.arange(size, dtype=flat.dtype, device=self.device)
                flat = flat + coord.reshape(tuple(size if i == a else 1 for i in range(index.ndim))) * strides[a]
        flat = ((along >= 0) & (along < n)).where(flat, -1)  # a lazy index outside the axis reads 0
        return self.flatten()._take(0, flat)

    def _take(self: Tensor, axis: int, idx: Tensor) -> Tensor:
        """self with `axis` replaced by idx's axes: out[..., j..., ...] = self[..., idx[j...], ...]. One load per
        element (a data-dependent address); an index outside [0, n) reads 0 (callers wrap negative indices)."""
        from ember.uop.ops import Ops, UOp
        if not idx.dtype.is_int: raise DTypeError(f"index: indices must be integers, not {idx.dtype.name}")
        return self._wrap(UOp(Ops.GATHER, self.dtype, (self.uop, idx.uop), axis))

    def scatter(self: Tensor, dim: int, index: Tensor, src: Tensor | float, reduce: str | None = None) -> Tensor:
        """self with src[i][j][k] written at [i][index[i][j][k]][k] (dim=1); reduce 'add' or 'multiply' combines.

        Without reduce, of several writes to one position the last along `dim` stays, as torch does on CPU; only
        that write gets a gradient (torch gives one to every write, the overwritten ones too)."""
        if reduce is None: return _scatter(self, dim, index, src, "replace", True)
        if reduce not in ("add", "multiply"):
            raise ArgumentError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r}")
        return _scatter(self, dim, index, src, "sum" if reduce == "add" else "prod", True)

    def scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
        return _scatter(self, dim, index, src, "sum", True)

    def scatter_reduce(self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str,
                       include_self: bool = True) -> Tensor:
        """torch.scatter_reduce: combine src into self at index with sum, prod, mean, amax or amin."""
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise ArgumentError(f"scatter_reduce: reduce must be sum, prod, mean, amax or amin, got {reduce!r}")
        return _scatter(self, dim, index, src, reduce, include_self)

    def masked_fill(self: Tensor, mask: Tensor, value: Any) -> Tensor:
        """self with `value` where mask (broadcast to self's shape) is True."""
        if mask.dtype is not dtypes.bool: raise DTypeError(f"masked_fill: mask must be bool, not {mask.dtype.name}")
        return mask.where(value, self).cast(self.dtype) if not isinstance(value, (int, float)) or \
            isinstance(value, bool) else mask.where(self._const(value, self.dtype), self)

    def index_select(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """The entries of self along `dim` at the 1-d `index`, as torch.index_select."""
        if self.ndim == 0: return self.reshape(1).index_select(0, index).reshape(())
        d = self._axis(dim, "index_select")
        if index.ndim > 1: raise ShapeError(f"index_select: index must be 1-d, got shape {index.shape}")
        check_index_range("index_select", index, self.shape[d], d)  # torch: no negative index
        index = (index < 0).where(-(self.shape[d] + 1), index) if not index.values_known() else index  # reads 0
        return self[(slice(None),) * d + (index.reshape(-1),)]

    def one_hot(self: Tensor, num_classes: int = -1) -> Tensor:
        """An int64 tensor with a new last axis of `num_classes`, 1 at each value's index (torch's one_hot).

        A class outside [0, num_classes) raises IndexError when the values are known (see the module docstring);
        a lazy one gives a row of zeros. num_classes=-1 means max + 1, which reads the values (realizes self).
        This overrides CreationMixin.one_hot, which has no range check."""
        from ember.tensor import Tensor
        if not self.dtype.is_int: raise ShapeError(f"one_hot: needs an integer tensor, got {self.dtype.name}")
        if num_classes < 0:
            values = self.numpy()
            if values.size and values.min() < 0:
                raise IndexError(f"one_hot: class {values.min()} is negative; classes must be >= 0")
            num_classes = int(values.max()) + 1 if values.size else 0
        else: check_index_range("one_hot", self, num_classes)
        return self.unsqueeze(-1).eq(Tensor.arange(num_classes, device=self.device)).cast(dtypes.int64)

    def nonzero(self: Tensor, size: int | None = None, fill_value: int = 0) -> Tensor:
        """The indices of the nonzero elements, one row each (realizes self: the count depends on the values).

        With `size` (tinygrad's and jax's keyword) the result has exactly `size` rows: the first nonzero elements,
        then rows of `fill_value`. Its shape no longer depends on the values, so nothing is realized."""
        from ember.tensor import Tensor
        if size is None: return Tensor(np.argwhere(self.numpy()).astype(np.int64), device=self.device)
        flat, found = _first_true("nonzero", self.flatten().ne(0), size)
        coords = [flat // stride % n for n, stride in zip(self.shape, strides_for_shape(self.shape), strict=True)]
        no_axes = Tensor.zeros(size, 0, dtype=dtypes.int64, device=self.device)  # a 0-d tensor's rows are empty
        rows = Tensor.stack(*coords, dim=-1) if coords else no_axes
        return found.unsqueeze(-1).where(rows, int(fill_value))

    def masked_select(self: Tensor, mask: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
        """The elements of self where mask is True, as a 1-d tensor (realizes the mask). With `size`, exactly
        `size` elements: the first selected ones, then `fill_value` in self's dtype; nothing is realized."""
        from ember.mixin.elementwise import broadcast_shape
        shape = broadcast_shape("masked_select", self.shape, mask.shape)
        if size is None: return self._broadcast_to(shape)[mask._broadcast_to(shape)]
        flat, found = _first_true("masked_select", mask._broadcast_to(shape).flatten().cast(dtypes.bool), size)
        picked = self._broadcast_to(shape).flatten()._take(0, flat)
        return found.where(picked, self._const(fill_value, self.dtype))


def _broadcast_value(value: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """`target`, if a value of shape `value` can be written there (leading size-1 axes of the value are dropped)."""
    from ember.mixin.elementwise import broadcast_shape
    while len(value) > len(target) and value[0] == 1: value = value[1:]
    if len(value) > len(target) or broadcast_shape("setitem", value, target) != target:
        raise ShapeError(f"setitem: a value of shape {value} cannot be written to a selection of shape {target}")
    return target


def _fit(v: Tensor, target: tuple[int, ...]) -> Tensor:
    """v broadcast to the selection it is written to."""
    _broadcast_value(v.shape, target)
    while v.ndim > len(target): v = v.reshape(v.shape[1:])
    return v._broadcast_to(target)


def _first_true(op: str, mask: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """For slot k < size: the flat position of the k-th True of the 1-d `mask` (int64), and whether there is one.

    Each True's rank is a running count; slot k compares it with every position, as `x[idx]` does (size x n)."""
    from ember.tensor import Tensor
    if not isinstance(size, int) or size < 0: raise ShapeError(f"{op}: size must be a non-negative int, got {size!r}")
    rank = mask.cast(dtypes.int64).cumsum(0) - 1
    hit = mask & rank.eq(Tensor.arange(size, dtype=dtypes.int64, device=mask.device).unsqueeze(-1))  # (size, n)
    position = hit.where(Tensor.arange(mask.shape[0], dtype=dtypes.int64, device=mask.device), 0).sum(-1)
    return position, hit.any(-1)


def _arange_like(n: int, idx: Tensor) -> Tensor:
    from ember.tensor import Tensor
    return Tensor.arange(n, dtype=idx.dtype, device=idx.device)


def _gather_by_compare(x: Tensor, d: int, index: Tensor) -> Tensor:
    """gather where a size is symbolic (a flat index would merge a symbolic axis with others): each index compared
    with every position along `d`, the one it names summed out. An index outside the axis reads 0, as in gather."""
    from ember.tensor import Tensor
    x = x.shrink(tuple(None if a == d or type(i) is UOp else (0, i) for a, i in enumerate(index.shape)))
    n = x.shape[d]
    positions = Tensor.arange(n, device=x.device).reshape(tuple(n if a == d + 1 else 1 for a in range(x.ndim + 1)))
    picked = index.unsqueeze(d + 1).eq(positions).where(x.unsqueeze(d), 0).sum(d + 1)
    return picked.cast(x.dtype)


def _check_same_rank(op: str, x: Tensor, index: Tensor, d: int) -> None:
    if not index.dtype.is_int: raise DTypeError(f"{op}: index must be an int tensor, not {index.dtype.name}")
    if index.ndim != x.ndim:
        raise ShapeError(f"{op}: index has {index.ndim} dims {index.shape}, self has {x.ndim} {x.shape}; they must "
                         f"match")
    for a, (i, s) in enumerate(zip(index.shape, x.shape, strict=True)):
        if a == d or i is s: continue  # (one symbolic size: the same bound variable)
        if type(i) is UOp or type(s) is UOp:
            raise ShapeError(f"{op}: index shape {index.shape} and {x.shape} differ on axis {a}, which is symbolic; "
                             f"off the axis gathered along, a symbolic size must be the same bound variable in both")
        if i > s: raise ShapeError(f"{op}: index shape {index.shape} is larger than {x.shape} on axis {a}")


def _scatter(self: Tensor, dim: int, index: Tensor, src: Tensor | float, reduce: str, include_self: bool) -> Tensor:
    """Every write of a scatter compared with every position of self's axis `dim`, then combined with `reduce`.

    Writes that land on one position differ only in their place along `dim`; as in torch on CPU, a plain scatter
    keeps the last of them and amax/amin count self among the candidates, so that ties share the gradient alike."""
    from ember.tensor import Tensor
    if self.ndim == 0:
        src1 = src.reshape(1) if isinstance(src, Tensor) else src
        return _scatter(self.reshape(1), 0, index.reshape(1), src1, reduce, include_self).reshape(())
    d = self._axis(dim, "scatter")
    _check_same_rank("scatter", self, index, d)
    check_index_range("scatter", index, self.shape[d], d)
    if not isinstance(src, Tensor): src = Tensor.full(index.shape, src, dtype=self.dtype, device=self.device)
    elif src.dtype != self.dtype:  # as torch: a silent cast could lose src's precision or range
        raise DTypeError(f"scatter: src is {src.dtype.name} but self is {self.dtype.name}; they must match (cast one)")
    if src.ndim != index.ndim or any(i > s for i, s in zip(index.shape, src.shape, strict=True)):
        raise ShapeError(f"scatter: src shape {src.shape} must cover index shape {index.shape}")
    src = src.shrink([(0, s) for s in index.shape]).cast(self.dtype)
    n = self.shape[d]
    # index.shape + (n,): write p lands on position m; a negative index (torch takes none) lands nowhere
    hit = index.unsqueeze(-1).eq(_arange_like(n, index))
    count = hit.sum(d)
    if reduce == "replace" and index.numel():  # keep only the last write to each position
        order = Tensor.arange(1, index.shape[d] + 1, device=self.device).reshape(
            tuple(index.shape[d] if a == d else 1 for a in range(hit.ndim)))
        hit = hit & order.eq(hit.where(order, 0).max(axis=d, keepdim=True))
    vals = src.unsqueeze(-1)
    identity = {"replace": 0, "sum": 0, "mean": 0, "prod": 1, "amax": _lowest(self), "amin": _highest(self)}[reduce]
    spread = hit.where(vals, identity)
    if reduce in ("amax", "amin") and include_self:  # self as one more candidate: the layout of spread, 1 write
        mine = self.shrink([None if a == d else (0, s) for a, s in enumerate(index.shape)])
        spread = mine.unsqueeze(-1).transpose(d, -1).cat(spread, dim=d)
    if reduce in ("amax", "amin"): combined = spread.max(axis=d) if reduce == "amax" else spread.min(axis=d)
    else: combined = spread.prod(d) if reduce == "prod" else spread.sum(d)
    # back to self's layout: the position axis returns to `dim`, the other axes grow to self's sizes
    def place(t: Tensor, fill: Any) -> Tensor:
        t = t.unsqueeze(d).transpose(d, -1).squeeze(-1)
        return t.pad([(0, 0) if a == d else (0, s - t.shape[a]) for a, s in enumerate(self.shape)], value=fill)
    written = place(count, 0) > 0
    value = place(combined.cast(self.dtype), 0)
    cnt = place(count, 0)
    if reduce == "replace": return written.where(value, self)
    if reduce == "mean":
        total = value + self if include_self else value
        div = cnt + 1 if include_self else cnt
        mean = total / div if self.dtype.is_float else total // div
        return written.where(mean.cast(self.dtype), self)
    if not include_self or reduce in ("amax", "amin"): return written.where(value, self)  # amax/amin: self is in
    merged = self + value if reduce == "sum" else self * value
    return written.where(merged.cast(self.dtype), self)


def _lowest(x: Tensor) -> float | int:
    return -float("inf") if x.dtype.is_float else (False if x.dtype is dtypes.bool else x.dtype.min)


def _highest(x: Tensor) -> float | int:
    return float("inf") if x.dtype.is_float else (True if x.dtype is dtypes.bool else x.dtype.max)
