"""Sparse jacobians and hessians: the pattern found from the graph, colored, one direction per color.

`spjacobian(f)` sees the jacobian as a matrix (f's output flattened) x (the argument flattened). It finds which
entries can be nonzero (ad/sparsity.py), colors the columns so that columns of one color share no row (or the
rows, when that needs fewer colors), and evaluates one forward direction per column color (one reverse direction
per row color) in a single batched pass. Each nonzero is then read from the compressed result at a position known
at trace time: a GATHER with a constant index.

`sphessian(f)` does the same for the hessian of a scalar f: forward mode over the reverse-mode gradient, the
columns star-colored, so a banded hessian of band width w needs w products whatever its size.

Both return a SparseFunction: called, it gives the nonzeros in compressed sparse column (CSC) order; its
`indptr`, `indices` and `shape` are the pattern as numpy arrays (scipy.sparse.csc_matrix((values, indices,
indptr), shape) rebuilds the matrix), `colors` is the number of directions it evaluates. generate_module writes the
pattern into the C++ as constants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.ad.sparsity import (
    color_columns,
    color_rows,
    dependencies,
    lattice_coloring,
    star_coloring,
    star_recovery,
    stencil_offsets,
    translate_colorings,
)
from ember.ad.transforms import CARRIES, _argnum, _grad, _single, forward_directions, reverse_directions
from ember.codegen.periodic import PEEL_LIMIT, PERIOD_LIMIT
from ember.codegen.stores import SPLIT_LIMIT
from ember.dtype import dtypes
from ember.errors import ShapeError
from ember.export.function import Arg, NumericalFunction, placeholders_for
from ember.helpers import prod
from ember.tensor import Tensor, tracing
from ember.uop.ops import TANGENT, Ops, UOp, constant_of


class SparseFunction(NumericalFunction):
    """A NumericalFunction returning the nonzeros of a sparse matrix in CSC order, with the pattern attached."""

    def __init__(self, name: str, fn: Callable[..., Any], args: Sequence[Arg], arg_names: Sequence[str],
                 pattern: np.ndarray, colors: int) -> None:
        self.shape: tuple[int, int] = pattern.shape  # type: ignore[assignment]
        self.indptr = np.concatenate([[0], np.cumsum(pattern.sum(axis=0))]).astype(np.int64)
        self.indices = np.nonzero(pattern.T)[1].astype(np.int64)  # row of each nonzero, column by column
        self.colors = colors
        super().__init__(name, fn, args, arg_names)

    @property
    def nnz(self) -> int: return len(self.indices)

    def to_dense(self, values: np.ndarray) -> np.ndarray:
        """The matrix these nonzeros (a call's result) stand for, as a dense array."""
        dense = np.zeros(self.shape, dtype=np.asarray(values).dtype)
        dense[self.indices, np.repeat(np.arange(self.shape[1]), np.diff(self.indptr))] = values
        return dense

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, {self.shape[0]}x{self.shape[1]} with {self.nnz} nonzeros, " \
               f"{self.colors} colors>"


def _seeds(colors: np.ndarray, count: int, shape: tuple[int, ...]) -> Tensor:
    """(count, *shape): direction c is 1 on the elements of color c. The colors of a banded pattern repeat with a
    small period, those of a multiple-shooting problem within a few runs (a color per state component, or two
    alternating from interval to interval): then the seeds are arithmetic in the element's index, and a loop over the
    elements, cut at the runs' ends (codegen/stores.py, codegen/segments.py) and unrolled by the period
    (codegen/periodic.py), folds them to constants; else they are a table."""
    n = len(colors)
    direction = Tensor.arange(count).reshape(count, 1)
    if (runs := _runs(colors)) is not None:
        k = Tensor.arange(n)
        (*_, (start, table)) = runs
        color = _periodic(k - start if start else k, table)
        for (start, table), (end, _) in zip(runs[-2::-1], runs[:0:-1], strict=True):
            color = (k < end).where(_periodic(k - start if start else k, table), color)
    else: color = Tensor(colors.astype(np.int32))
    return color.reshape(1, n).eq(direction).cast(dtypes.float64).reshape(count, *shape)


def _runs(values: np.ndarray) -> list[tuple[int, list[int]]] | None:
    """values as runs (start, table), values[start + j] == table[j % len(table)] up to the next run's start, each
    table at most PERIOD_LIMIT long and repeated at least twice (or one value), taken left to right, each as long as
    some period lets it be (the smallest such period); None if that takes more than SPLIT_LIMIT runs."""
    n, start, runs = len(values), 0, []
    while start < n:
        if len(runs) == SPLIT_LIMIT: return None
        rest, end, period = values[start:], start + 1, 1
        for p in range(1, min(PERIOD_LIMIT, n - start) + 1):
            differs = np.flatnonzero(rest[p:] != rest[:-p])
            reach = start + p + int(differs[0]) if len(differs) else n
            if reach > end and (p == 1 or reach - start >= 2 * p): end, period = reach, p
        runs.append((start, [int(v) for v in values[start:start + period]]))
        start = end
    return runs


def _periodic(k: Tensor, table: Sequence[Any]) -> Tensor:
    """table[k % len(table)] for k >= 0, as comparisons of the remainder (constants once the period is unrolled)."""
    rest = k.fmod(len(table)) if len(table) > 1 else k.zeros_like()
    out = k.full_like(table[-1]) if not isinstance(table[-1], Tensor) else table[-1]
    for t in range(len(table) - 2, -1, -1): out = rest.eq(t).where(table[t], out)
    return out


def _index(where: np.ndarray) -> Tensor:
    return Tensor(where.astype(np.int32 if where.size == 0 or where.max() < 2**31 else np.int64))


def _positions(where: np.ndarray) -> Tensor | None:
    """The positions `where` as arithmetic in the nonzero's number k, if they are periodic-affine: between at most
    PEEL_LIMIT exceptions at each end, k = h + P*q + s reads where = base[s] + step[s] * q for a period P <=
    PERIOD_LIMIT (a banded pattern in CSC order). The read then needs no table: it fuses into the kernel that
    computes the compressed products, whose unrolled period folds each position to an affine one. Else None."""
    n = len(where)
    for period in range(1, PERIOD_LIMIT + 1):
        if n < 2 * PEEL_LIMIT + 3 * period: break  # too few runs of three to tell a pattern
        step = where[period:] - where[:-period]
        bad = np.flatnonzero(step[period:] != step[:-period])  # k, k+P, k+2P not evenly spaced
        if len(bad) > 2 * (PEEL_LIMIT + period): continue
        for head in range(PEEL_LIMIT + 1):
            late = bad[bad >= head]
            tail = max(0, n - 2 * period - int(late.min())) if len(late) else 0  # the tail holds k + 2P
            if tail <= PEEL_LIMIT: return _affine_positions(where, period, head, tail)
    return None


def _affine_positions(where: np.ndarray, period: int, head: int, tail: int) -> Tensor:
    """where[k] as arithmetic in k: the `head` first and `tail` last by comparison with k, the others affine in
    k's period (see _positions)."""
    n, k = len(where), Tensor.arange(len(where))
    q = (k - head).maximum(0).div(period, rounding_mode="trunc")
    runs = [where[head + s:n - tail:period] for s in range(period)]
    out = _periodic((k - head).maximum(0), [int(r[0]) + int(r[1] - r[0]) * q for r in runs])
    for e in [*range(head), *range(n - tail, n)]: out = k.eq(e).where(int(where[e]), out)
    return out.cast(dtypes.int32)  # the exceptions compare k too: peeled steps fold them


def _recover(compressed: Tensor, where: np.ndarray) -> Tensor:
    """The nonzeros, read from the compressed products at the flat positions `where`. Periodic-affine positions
    read the products where they are computed (one kernel, no table); others read them stored, by a table."""
    if (positions := _positions(where)) is not None: return compressed.reshape(-1)._take(0, positions)
    return compressed.contiguous().reshape(-1)._take(0, _index(where))  # stored: a loop without indirection


class Lattice:
    """The colors `(a . p) % m` of the positions p of a grid of `shape` (sparsity.lattice_coloring), as arithmetic."""

    def __init__(self, a: np.ndarray, m: int, shape: tuple[int, ...], offsets: np.ndarray) -> None:
        self.a, self.m, self.shape, self.offsets = [int(v) for v in a], m, shape, offsets
        # a multiple of m that keeps (a . p) + lift >= 0 wherever p lies at most two offsets outside the grid: a
        # remainder of a non-negative number is one the symbolic rules compare (C's % of a negative one is not)
        self.lift = m * (2 * sum(v * int(np.abs(offsets[:, d]).max()) for d, v in enumerate(self.a)) // m + 1)

    def colors(self) -> np.ndarray:
        return (np.stack(np.unravel_index(np.arange(prod(self.shape)), self.shape), 1) @ np.array(self.a)) % self.m

    def color(self, shift: Sequence[int]) -> Tensor:
        """The color of position p - shift at each grid position p: a tensor of the grid's shape."""
        total: Tensor | int = self.lift - sum(v * int(o) for v, o in zip(self.a, shift, strict=True))
        for d, (v, size) in enumerate(zip(self.a, self.shape, strict=True)):
            if v: total = Tensor.arange(size).reshape(*(size if e == d else 1 for e in range(len(self.shape)))) * v \
                + total
        return (total if isinstance(total, Tensor) else Tensor.full(self.shape, total, dtype=dtypes.int32)) \
            .expand(*self.shape).fmod(self.m)

    def seeds(self) -> Tensor:
        """(m, *shape): direction c is 1 on the positions of color c."""
        direction = Tensor.arange(self.m).reshape(self.m, *(1 for _ in self.shape))
        return self.color([0] * len(self.shape)).unsqueeze(0).eq(direction).cast(dtypes.float64)

    def recover(self, compressed: Tensor, pattern: np.ndarray) -> Tensor:
        """The nonzeros of a stencil's jacobian in CSC order from the compressed products (m, *shape).

        The entry of row r at offset o (column r - o) is compressed[color(r - o), r]: read at a computed color,
        the seeds of the other offsets compare colors that differ by a constant (decide_equal_remainders), so one
        kernel computes each offset's entries over the grid directly, with no color table and no sum over the
        seeds. In CSC order they are a concatenation (see `csc`), stored piece by piece over the grid's boxes
        (codegen/stores.py): per grid point, its entries at affine positions, no table. A grid cut into more
        boxes than one kernel should hold (a wide stencil in 3-D) puts them in CSC order by a table instead."""
        size = prod(self.shape)
        rows = Tensor.arange(size).reshape(self.shape)
        flat = compressed.reshape(-1)
        entries = [flat._take(0, self.color(o) * size + rows) for o in self.offsets]
        if prod(len(cuts) - 1 for cuts in self.cuts()) <= SPLIT_LIMIT: return self.csc(entries, [])
        by_offset = Tensor.stack(*entries).contiguous()
        cols, nonzero_rows = np.nonzero(pattern.T)
        offset = (np.stack(np.unravel_index(nonzero_rows, self.shape), 1) -
                  np.stack(np.unravel_index(cols, self.shape), 1))
        slot = {tuple(int(v) for v in o): k for k, o in enumerate(self.offsets)}
        where = np.array([slot[tuple(int(v) for v in o)] for o in offset], dtype=np.int64) * size + nonzero_rows
        return by_offset.reshape(-1)._take(0, _index(where))

    def cuts(self) -> list[list[int]]:
        """Per axis, the positions where the set of offsets whose entries a column there has changes (an offset o
        leaves the grid for columns p with p + o outside it), with the axis's ends: the grid is a product of boxes
        in each of which every column has the same offsets."""
        out = []
        for d, n in enumerate(self.shape):
            ends = {0, n} | {min(max(-int(o), 0), n) for o in self.offsets[:, d]} | \
                {min(max(n - int(o), 0), n) for o in self.offsets[:, d]}
            out.append(sorted(ends))
        return out

    def csc(self, entries: list[Tensor], box: list[tuple[int, int]]) -> Tensor:
        """The CSC entries of the columns in `box` (a range per leading axis, the later axes whole), of shape
        (*box's sizes, entries per position of the box): along axis len(box), the concatenation of each stretch
        between its cuts, flattened with the axes after it; in a box of all axes, each column's entries, its
        offsets in row order (flat offset order), entries[o] read at the rows column + o."""
        d = len(box)
        sizes = [hi - lo for lo, hi in box]
        if d == len(self.shape):
            rows = [tuple((lo + int(v), hi + int(v)) for (lo, hi), v in zip(box, o, strict=True)) for o in self.offsets]
            inside = [k for k, r in enumerate(rows) if all(0 <= lo and hi <= n for (lo, hi), n in zip(r, self.shape,
                                                                                                   strict=True))]
            if not inside: return Tensor.zeros(*sizes, 0, dtype=entries[0].dtype)
            return Tensor.stack(*[entries[k].shrink(rows[k]) for k in inside], dim=-1)
        cuts = self.cuts()[d]
        pieces = [self.csc(entries, [*box, (lo, hi)]) for lo, hi in zip(cuts, cuts[1:], strict=False) if hi > lo]
        pieces = [p.reshape(*sizes, -1) for p in pieces if p.numel()]
        if not pieces: return Tensor.zeros(*sizes, 0, dtype=entries[0].dtype)
        return pieces[0] if len(pieces) == 1 else pieces[0].cat(*pieces[1:], dim=-1)


def structural(t: Tensor) -> Tensor:
    """t with its float arithmetic marked TANGENT (ad/forward.py) and its constant zeros folded as structural: a
    product with a zero is zero whatever the other factor (0 * inf too), a zero added is absent. CasADi's SX reads
    0 * x so; IEEE does not (spjacobian's and sphessian's `structural_zeros`)."""
    done: dict[UOp, UOp] = {}
    zero = lambda u: constant_of(u) == 0  # noqa: E731
    for u in t.uop.toposort():
        src = tuple(done.get(s, s) for s in u.src)
        if u.op not in CARRIES or not u.dtype.is_float:
            if src != u.src: done[u] = u.replace(src=src)
            continue
        if (u.op is Ops.MUL and any(map(zero, src))) or all(map(zero, src)):
            done[u] = Tensor._from_uop(u, t.device).zeros_like().uop
        elif u.op is Ops.ADD and zero(src[0]): done[u] = src[1]
        elif u.op in (Ops.ADD, Ops.SUB) and zero(src[1]): done[u] = src[0]
        elif u.op is Ops.SUB and zero(src[0]): done[u] = UOp(Ops.NEG, u.dtype, (src[1],), TANGENT)
        else: done[u] = u.replace(src=src, arg=TANGENT)
    return Tensor._from_uop(done.get(t.uop, t.uop), t.device)


def _flag(value: object, op: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{op}: structural_zeros must be True or False, got {value!r}")


def spjacobian(f: NumericalFunction, argnum: int = 0, *, structural_zeros: bool = False) -> SparseFunction:
    """x... -> the nonzeros of d f / d x_argnum (f's output and x flattened), CSC order, one pass per color.
    `structural_zeros`: f's arithmetic as CasADi's SX reads it (see `structural`): an entry that is a product with
    a constant zero is no entry (CasADi's pattern), and 0 * inf is 0 in the values, not NaN. Off by default:
    IEEE's 0 * inf is NaN, so such an entry is not zero for every input."""
    a = _argnum(f, argnum, "spjacobian")
    if len(f.output_shapes) != 1: raise ShapeError(f"spjacobian: {f.name} must have one output")
    _flag(structural_zeros, "spjacobian")
    xs = placeholders_for(f.args)
    single = (lambda ts: structural(_single(f, ts, "spjacobian"))) if structural_zeros else \
        (lambda ts: _single(f, ts, "spjacobian"))
    with tracing(xs): out = single(xs)
    pattern = dependencies(out.uop, xs[a].uop, {x.uop for x in xs})
    m, n = pattern.shape
    by_col, by_row = periodic(color_columns(pattern), pattern), periodic(color_rows(pattern), pattern.T)
    n_col, n_row = (int(c.max(initial=-1)) + 1 if pattern.any() else 0 for c in (by_col, by_row))
    x_shape = f.args[a].shape
    lattice = _lattice(pattern, x_shape, min(n_col, n_row) + 1) if tuple(out.shape) == tuple(x_shape) else None
    if lattice is not None: by_col, n_col = lattice.colors(), lattice.m
    cols, rows = np.nonzero(pattern.T)
    forward = n_col <= n_row
    where = by_col[cols] * m + rows if forward else by_row[rows] * n + cols
    positions = _positions(where) is not None  # a banded pattern: recovered without a table

    def fn(*ts: Tensor) -> Tensor:
        out = single(ts)
        if len(where) == 0: return Tensor.zeros(0, dtype=out.dtype)
        if lattice is not None and not positions:
            return lattice.recover(forward_directions(out, ts[a], lattice.seeds()), pattern)
        if forward: compressed = forward_directions(out, ts[a], _seeds(by_col, n_col, x_shape))
        else: compressed = reverse_directions(out, ts[a], _seeds(by_row, n_row, out.shape))
        return _recover(compressed, where)
    return SparseFunction(f"{f.name}_spjac", fn, f.args, f.arg_names, pattern, n_col if forward else n_row)


def periodic(colors: np.ndarray, pattern: np.ndarray) -> np.ndarray:
    """`colors` of `pattern`'s columns, or as many colored by translates (sparsity.translate_colorings) where those
    repeat in fewer runs: the seeds are then arithmetic, and the loop over a multiple-shooting problem's intervals
    has no exceptions at the ends of its runs to peel."""
    runs = _runs(colors)
    if runs is not None and len(runs) == 1: return colors
    for other in translate_colorings(pattern, range(1, PERIOD_LIMIT + 1)):
        if other.max(initial=-1) <= colors.max(initial=-1):
            if (found := _runs(other)) is not None and (runs is None or len(found) < len(runs)): return other
            break
    return colors


def _lattice(pattern: np.ndarray, shape: tuple[int, ...], limit: int) -> Lattice | None:
    """A lattice coloring of a stencil's columns with fewer than `limit` colors, else None."""
    if (offsets := stencil_offsets(pattern, shape)) is None: return None
    if (found := lattice_coloring(offsets, limit)) is None: return None
    return Lattice(found[0], found[1], shape, offsets)


def sphessian(f: NumericalFunction, argnum: int = 0, *, structural_zeros: bool = False) -> SparseFunction:
    """x... -> the nonzeros of the hessian of a scalar f in x_argnum (flattened), CSC order, one pass per color.
    `structural_zeros` as spjacobian's: f and its gradient read as CasADi's SX reads them."""
    a = _argnum(f, argnum, "sphessian")
    _flag(structural_zeros, "sphessian")
    if len(f.output_shapes) != 1 or prod(f.output_shapes[0]) != 1:
        raise ShapeError(f"sphessian: {f.name} must return one scalar, not outputs of shapes {f.output_shapes}")

    def gradient(ts: Sequence[Tensor]) -> Tensor:
        out = _single(f, tuple(ts), "sphessian").sum()
        return structural(_grad(structural(out), ts[a])) if structural_zeros else _grad(out, ts[a])
    xs = placeholders_for(f.args)
    with tracing(xs): grad = gradient(xs)
    pattern = dependencies(grad.uop, xs[a].uop, {x.uop for x in xs})
    pattern = pattern | pattern.T  # d2f/dxi dxj = d2f/dxj dxi
    colors = star_coloring(pattern)
    count = int(colors.max(initial=-1)) + 1 if pattern.any() else 0
    where = star_recovery(pattern, colors)
    x_shape = f.args[a].shape

    def fn(*ts: Tensor) -> Tensor:
        grad = gradient(ts)
        if len(where) == 0: return Tensor.zeros(0, dtype=grad.dtype)
        compressed = forward_directions(grad, ts[a], _seeds(colors, count, x_shape))
        return _recover(compressed, where)
    return SparseFunction(f"{f.name}_sphess", fn, f.args, f.arg_names, pattern, count)


__all__ = ["SparseFunction", "spjacobian", "sphessian"]
