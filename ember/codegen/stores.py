"""Split a store of a concatenation (or of a sum of padded pieces) into one store per piece, each over the piece's own
shape. Runs at the start of
rangeify, on the kernel AST (tensor level).

Before: `SINK(STORE(DEFINE_GLOBAL(0).reshape(shape), value), ...)` from the scheduler.
After:  the same values stored, but a STORE whose value is a concatenation (`Tensor.cat`, `Tensor.stack`: a chain of
        `WHERE(position < end, PAD(piece), rest)`) along an axis longer than rangeify unrolls is one STORE per piece,
        into a SHRINK of its target; a STORE of a RESHAPE of a concatenation stores the concatenation into a RESHAPE of
        its target; a STORE of a sum of pieces padded along one axis (a gradient with respect to a vector read in
        slices: `ADD(PAD(a), PAD(b))`) is one STORE per stretch between the pieces' ends, each the sum of the pieces
        that cover it (split_sum). Targets are views of the DEFINE_GLOBAL (RESHAPE and SHRINK only); the stores write
        disjoint positions that together cover the target, each element the value it had.

    STORE(out.reshape(12), cat(a, b.reshape(8)))          with b of shape (2, 4)
 -> STORE(out.reshape(12).shrink(0, 4), a), STORE(out.reshape(12).shrink(4, 12).reshape(2, 4), b)

Why: a flat loop over a concatenation tests its position against every piece's end, and a piece that is itself a
reshaped stack (the entries of a stencil's jacobian in CSC order: per column, its up to five entries) needs `//` and
`%` of the flat position to find its element. Stored piece by piece, each loop runs over the piece's own axes, a
short stacked axis is unrolled by rangeify (`branching_axes`) and its positions fold to the piece each one reads: for
a 2-D 5-point stencil's jacobian, per grid point its five entries at affine positions, with no table.
"""

from __future__ import annotations

from ember.dtype import dtypes
from ember.uop.ops import Ops, UOp

SPLIT_LIMIT = 64  # the most stores one store is split into (each a loop nest of its own)
SUM_NODES = 4096  # the most ADD and PAD nodes looked through to find the pieces of a sum
END_CUTS = 8  # a sum whose pieces end only this close to the ends of its axis stays whole (a stencil's edges: the
# middle's vector lanes need a size the opts divide; codegen/periodic.py peels such ends)


def strip(x: UOp, ops: tuple[Ops, ...]) -> UOp:
    while x.op in ops: x = x.src[0]
    return x


def position_cut(cond: UOp, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(axis, end) when `cond` is `position < end` along one axis of `shape` (what Tensor.cat selects its pieces
    by), else None."""
    cmp = strip(cond, (Ops.EXPAND,))
    if cmp.op is not Ops.CMPLT: return None
    position, end = cmp.src[0], strip(cmp.src[1], (Ops.EXPAND, Ops.RESHAPE))
    if end.op is not Ops.CONST or strip(position, (Ops.RESHAPE,)).op is not Ops.ARANGE: return None
    axes = [a for a, s in enumerate(position.shape) if s != 1]
    if len(position.shape) != len(shape) or len(axes) != 1 or position.shape[axes[0]] != shape[axes[0]]: return None
    return axes[0], int(end.arg)


def concatenated_axis(value: UOp) -> int | None:
    """The axis `value` selects pieces along by position, if it is a concatenation."""
    if value.op is not Ops.WHERE: return None
    return None if (cut := position_cut(value.src[0], value.shape)) is None else cut[0]


def restrict(x: UOp, axis: int, lo: int, hi: int) -> UOp:
    """x on positions [lo, hi) of `axis`: a piece padded exactly into them is the piece itself."""
    if lo == 0 and hi == x.shape[axis]: return x
    if x.op is Ops.PAD and all(p == (0, 0) for a, p in enumerate(x.arg) if a != axis) and \
            x.arg[axis] == (lo, x.shape[axis] - hi):
        return x.src[0]
    return view(x, Ops.SHRINK, tuple((lo, hi) if a == axis else (0, s) for a, s in enumerate(x.shape)))


def view(x: UOp, op: Ops, arg: tuple) -> UOp:
    return UOp(op, x.dtype, (x,), arg)


def pieces(value: UOp, axis: int) -> list[tuple[int, int, UOp]]:
    """(lo, hi, value on [lo, hi)) for the stretches of `axis` between the ends of a concatenation's pieces."""
    out, lo, size = [], 0, value.shape[axis]
    while value.op is Ops.WHERE and (cut := position_cut(value.src[0], value.shape)) is not None and cut[0] == axis:
        end = min(max(cut[1], lo), size)
        if end > lo: out.append((lo, end, restrict(value.src[1], axis, lo, end)))
        lo, value = end, value.src[2]
    if lo < size: out.append((lo, size, restrict(value, axis, lo, size)))
    return out


def padded_axis(x: UOp) -> int | None:
    """The one axis a PAD pads, else None."""
    if x.op is not Ops.PAD: return None
    axes = [a for a, p in enumerate(x.arg) if p != (0, 0)]
    return axes[0] if len(axes) == 1 else None


def sum_cuts(value: UOp) -> tuple[int, list[int]] | None:
    """(axis, the positions where a piece starts or ends) if `value` is a sum of pieces padded along one axis: ADDs
    whose terms are, through more ADDs, PADs of that axis (a gradient with respect to a vector that the function read
    in slices, and its forward-mode tangents). None if it has no such piece or more than SUM_NODES nodes."""
    axis, cuts, seen, stack = None, set(), set(), [(value, 0, True)]
    outer: set[tuple[int, int]] = set()  # the pieces padded into the sum itself (not into another piece)
    while stack:
        x, offset, top = stack.pop()
        if (x, offset) in seen: continue
        seen.add((x, offset))
        if len(seen) > SUM_NODES: return None
        if x.op is Ops.ADD: stack += [(s, offset, top) for s in x.src]
        elif (a := padded_axis(x)) is not None and axis in (None, a):
            axis, lo = a, offset + x.arg[a][0]
            cuts |= {lo, lo + x.src[0].shape[a]}
            if top: outer.add((lo, lo + x.src[0].shape[a]))
            stack.append((x.src[0], lo, False))
    if axis is None: return None
    # each outer piece is cut where any is, relative to its start: a control read whole beside states read as
    # x[:n] and x[1:] is cut after its first step too, so that its middle stretch and theirs share one loop, step
    # for step at the same interval (the stretches of one size share a loop, codegen/rangeify.output_loops)
    inner = {c - lo for lo, hi in outer for c in cuts if lo < c < hi}
    cuts |= {lo + r for lo, hi in outer for r in inner if lo < lo + r < hi}
    return axis, sorted(cuts)


def restrict_sum(x: UOp, axis: int, lo: int, hi: int, memo: dict[tuple[UOp, int, int], UOp]) -> UOp:
    """x on [lo, hi) of `axis`, through its ADDs and PADs: a pad whose piece covers the stretch is the piece, one that
    misses it a zero (kept as a term: only a tangent's sum drops it, since x + 0.0 turns -0.0 into 0.0). The stretch
    lies between two of sum_cuts' positions, so no piece ends inside it."""
    if (lo, hi) == (0, x.shape[axis]): return x
    if (key := (x, lo, hi)) in memo: return memo[key]
    if x.op is Ops.ADD: out = x.replace(src=tuple(restrict_sum(s, axis, lo, hi, memo) for s in x.src))
    elif padded_axis(x) == axis:
        before, size = x.arg[axis][0], x.src[0].shape[axis]
        if lo < before + size and before < hi: out = restrict_sum(x.src[0], axis, lo - before, hi - before, memo)
        else:
            shape = tuple(hi - lo if a == axis else s for a, s in enumerate(x.shape))
            out = view(view(UOp.const(x.dtype, 0), Ops.RESHAPE, (1,) * len(shape)), Ops.EXPAND, shape)
    else: out = view(x, Ops.SHRINK, tuple((lo, hi) if a == axis else (0, s) for a, s in enumerate(x.shape)))
    memo[key] = out
    return out


def split(target: UOp, value: UOp, short: int) -> list[tuple[UOp, UOp]]:
    """(target, value) pairs storing what `STORE(target, value)` stores (see the module docstring). A concatenation
    along an axis of at most `short` positions is left to rangeify, which unrolls it (a stack of a few values per
    position), unless a piece is a reshaped concatenation: its positions would need `//` and `%` to fold."""
    if is_reshaped_concatenation(value):
        return split(view(target, Ops.RESHAPE, value.src[0].shape), value.src[0], short)
    if (axis := concatenated_axis(value)) is None: return split_sum(target, value, short)
    found = pieces(value, axis)
    if value.shape[axis] <= short and not any(is_reshaped_concatenation(p) for _, _, p in found):
        return [(target, value)]
    shape = value.shape
    return [pair for lo, hi, piece in found for pair in split(
        view(target, Ops.SHRINK, tuple((lo, hi) if a == axis else (0, s) for a, s in enumerate(shape))), piece, short)]


def split_sum(target: UOp, value: UOp, short: int) -> list[tuple[UOp, UOp]]:
    """A sum of padded pieces (sum_cuts) stored stretch by stretch between the pieces' ends, if one of them lies more
    than END_CUTS positions inside the axis; else the store as it is."""
    if (found := sum_cuts(value)) is None: return [(target, value)]
    axis, cuts = found
    size = value.shape[axis]
    if size <= short or not any(END_CUTS < c < size - END_CUTS for c in cuts): return [(target, value)]
    bounds, memo = sorted({0, size, *(c for c in cuts if 0 < c < size)}), {}
    return [pair for lo, hi in zip(bounds, bounds[1:], strict=False) for pair in split(
        view(target, Ops.SHRINK, tuple((lo, hi) if a == axis else (0, s) for a, s in enumerate(value.shape))),
        restrict_sum(value, axis, lo, hi, memo), short)]


def is_reshaped_concatenation(value: UOp) -> bool:
    return value.op is Ops.RESHAPE and concatenated_axis(value.src[0]) is not None


def split_stores(ast: UOp, short: int) -> UOp:
    """The kernel AST with each STORE of a concatenation along an axis longer than `short` split (see the module
    docstring); a store that would make more than SPLIT_LIMIT stores is left whole."""
    out: list[UOp] = []
    for st in ast.src:
        parts = split(*st.src, short) if st.op is Ops.STORE else []
        if not 1 < len(parts) <= SPLIT_LIMIT: out.append(st)
        else: out += [UOp(Ops.STORE, dtypes.void, pair) for pair in parts]
    return ast if len(out) == len(ast.src) else ast.replace(src=tuple(out))
