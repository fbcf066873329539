"""Rangeify: turn a kernel's movement ops into index arithmetic over explicit loops. The first codegen stage.

Before: `SINK(STORE(DEFINE_GLOBAL(0).reshape(shape), value))`, `value` a tensor-level graph (ALU, RESHAPE, PERMUTE,
        EXPAND, PAD, SHRINK, FLIP, REDUCE_AXIS, GATHER) over DEFINE_GLOBALs and CONSTs; or a SCATTER_ADD stored by
        loops of its own (`store_scatter`).
After:  `SINK(STORE(INDEX(DEFINE_GLOBAL(0), i), v), ...)`: every output axis is a RANGE, or, for a small axis a PAD
        or ARANGE chooses by (`branching_axes`), unrolled into one STORE per position; a stored concatenation is
        stored piece by piece, each over its own shape (codegen/stores.py), pieces of one size sharing a loop;
        every read a
        `LOAD(INDEX(DEFINE_GLOBAL(n), i[, gate]))`, every REDUCE_AXIS a `REDUCE(v, *RANGE)` (or its identity over
        an empty axis); no movement op remains. Every DEFINE_GLOBAL of the input is still in the graph.

How: the value at output position (r0, r1, ...) is the tensor-level node `INDEX(node, valid, r0, r1, ...)`. Rules
push that INDEX down the graph (bottom-up, so each rule sees the original node): through an ALU op onto its
sources, through a movement op by rewriting the indices (a PAD also narrows `valid`, which gates the load), through a
REDUCE_AXIS by giving its reduced axes new RANGEs, until it reaches a buffer and becomes a LOAD. The symbolic rules
run in the same pass, so index expressions are simplified as they are built:

    STORE(DEFINE_GLOBAL(0).reshape((4,)), (DEFINE_GLOBAL(1).reshape((2,2)).permute((1,0)).reshape((4,))))
    -> STORE(INDEX(data0, r0), LOAD(INDEX(data1, (r0%2)*2 + r0//2)))
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field

from ember.codegen.lowerer import end_ranges, reduce_identity
from ember.codegen.stores import split_stores
from ember.dtype import DType, PtrDType, dtypes, truncate
from ember.helpers import UNROLL, strides_for_shape
from ember.uop.interpret import exec_alu
from ember.uop.ops import AxisKind, ConstType, GroupOp, Ops, UOp
from ember.uop.symbolic import INTS_AND_BOOL, affine_step, build_sum, simplify, split_sum, symbolic
from ember.uop.upat import PatternMatcher, UPat, graph_rewrite, substitute
from ember.variables import Sint, is_symbolic, max_count


@dataclass
class RangeifyContext:
    """Numbers new RANGEs in creation order, so an enclosing loop always has a smaller axis than what it encloses."""

    index_dtype: DType
    unroll: dict[UOp, frozenset[int]] = field(default_factory=dict)  # per store target (a view of its output): the
    # axes stored position by position instead of looped over
    axes: itertools.count = field(default_factory=itertools.count)
    loops: dict[tuple[UOp, int], list[UOp]] = field(default_factory=dict)  # per (output, size): the output loops of
    # that size made so far; the stores of one split output (codegen/stores.py) share them, in order
    simplified: dict[UOp, UOp] = field(default_factory=dict)  # index expression -> its simplified form
    resolved: dict[UOp, UOp] = field(default_factory=dict)  # tensor-level read -> rangeified (see resolve)
    values: dict[tuple[UOp, tuple[int, ...]], ConstType] = field(default_factory=dict)  # (node, constant
    # position) -> its value, for the tables resolve evaluates (constant_at)

    def simplify(self, idx: tuple[UOp, ...]) -> tuple[UOp, ...]:
        """`idx` in the simplifier's form, so that two reads of a node at one position are one INDEX node.

        The rewrite runs bottom-up: a rule pushes an INDEX onto its sources before the index expression under it is
        simplified. Reads of one position spelled apart (`0 + 1`, `1 - 0`, `(1 + 0) // 1 % 4`) would each rebuild
        the whole graph below them, and every movement op on the way multiplies the spellings: the jacobian of an
        N-step RK4 cart-pole (a stack of scalars per stage) rebuilt 6x as many nodes per step. Each expression is
        made from simplified ones by one step, so simplifying it costs a few rules, once (memoized)."""
        out = []
        for i in idx:
            if (simple := self.simplified.get(i)) is None: simple = self.simplified[i] = simplify(i)
            out.append(simple)
        return tuple(out)

    def resolve(self, x: UOp) -> UOp:
        """Tensor-level `x` rangeified now rather than when the pass reaches it: a gathered position (a value) that
        becomes an index must be kernel-level arithmetic for the simplifier to see through it. A table computed from
        an arange then folds to the constant it holds at each unrolled position (a sparse jacobian's recovery), where
        an unresolved one kept every read of a position apart.

        Such a table read at a constant position is evaluated (constant_at), not rewritten: the rewrite folds it to
        the same constant, but each position's rewrite walked the table's graph anew (a 3-D Bratu recovery: 725
        entries, some 70 rules each, 2 of its 5 s to render); evaluated, positions share the values below them."""
        if (done := self.resolved.get(x)) is None:
            table, idx = x.src[0], x.src[2:]
            value = constant_at(table, tuple(i.arg for i in idx), self.values) if all(
                i.op is Ops.CONST and type(s) is int and 0 <= i.arg < s for i, s in zip(idx, table.shape, strict=True)
            ) else None
            done = self.resolved[x] = UOp.const(x.dtype, value) if value is not None else \
                graph_rewrite(x, pm_rangeify_symbolic, ctx=self, bottom_up=True)
        return done

    def new_range(self, size: Sint, kind: AxisKind) -> UOp:
        """A RANGE over [0, size), or the constant 0 for an axis of size 1. A symbolic size is a variable."""
        if size == 1: return UOp.const(self.index_dtype, 0)
        end = size.cast(self.index_dtype) if type(size) is UOp else UOp.const(self.index_dtype, size)
        return UOp.range(end, next(self.axes), kind, self.index_dtype)


def constant_at(x: UOp, pos: tuple[int, ...], values: dict[tuple[UOp, tuple[int, ...]], ConstType]) \
        -> ConstType | None:
    """The value of tensor-level `x` at the constant position `pos` (inside its shape), for x integer or bool
    arithmetic over ARANGEs and CONSTs through movement ops; None for anything else (a load, a reduction, a float,
    a division by zero, which C leaves undefined and the folder never folds). `values` memoizes (node, position).

    It is the constant that rangeifying `at(x, valid, pos)` folds to, computed as that rewrite computes it: each
    movement op moves the position as ints (moved_position; a pad's outside is 0), an ARANGE's value is its index
    cast, an ALU op folds with exec_alu (symbolic.fold_constant_alu). Floats are left to the rewrite, whose rules
    may drop a float op rather than fold it (x * 0.0). Iterative: a table's graph may be deep."""
    todo = [(x, pos)]
    while todo:
        u, p = todo[-1]
        if (u, p) in values:
            todo.pop()
            continue
        if u.dtype not in INTS_AND_BOOL: return None
        if u.op is Ops.CONST: value = u.arg
        elif u.op is Ops.ARANGE and len(p) == 1: value = exec_alu(Ops.CAST, u.dtype, p)
        elif u.op in GroupOp.Movement or u.op in (Ops.DETACH, Ops.CONTIGUOUS_BACKWARD):
            if is_symbolic(u.shape) or is_symbolic(u.src[0].shape): return None
            if (moved := p if u.op in (Ops.DETACH, Ops.CONTIGUOUS_BACKWARD) else moved_position(u, p)) is None:
                value = truncate(0, u.dtype)
            elif (below := (u.src[0], moved)) not in values:
                todo.append(below)
                continue
            else: value = values[below]
        elif u.op in GroupOp.Elementwise:
            if missing := [(s, p) for s in u.src if (s, p) not in values]:
                todo.extend(missing)
                continue
            try:
                value = exec_alu(u.op, u.dtype, tuple(values[(s, p)] for s in u.src), u.src[0].dtype)
            except ZeroDivisionError:
                return None
        else: return None
        values[(u, p)] = value
        todo.pop()
    return values[(x, pos)]


def at(x: UOp, valid: UOp, idx: tuple[UOp, ...]) -> UOp:
    """The value of tensor-level `x` at position `idx`, read only where `valid` (0 elsewhere).

    Its dtype is the element's, never a pointer: that tells it apart from a kernel-level INDEX(buf, i[, gate])."""
    return UOp(Ops.INDEX, x.dtype.base if isinstance(x.dtype, PtrDType) else x.dtype, (x, valid, *idx))


def read(x: UOp, valid: UOp, idx: tuple[UOp, ...]) -> UOp:
    """`at(x, valid, idx)`, ungated at a constant position inside x's shape.

    A gate keeps a read that its select will drop from leaving its buffer, and tells the offsets below it the
    narrower ranges of their loops (simplify_gated_index). A constant position inside the node has neither use: it
    reads inside every buffer below it (a movement op maps it inside its source; a pad or gather below gates its
    own reads) and has no loop to narrow. Kept, the gate would make the reads of one position under two gates two
    copies of everything below: a 3-D sparse jacobian's recovery, whose constant positions each piece of a cat
    along a loop reaches under its own gate, built every entry once per piece."""
    if valid.op is not Ops.CONST and all(i.op is Ops.CONST and type(s) is int and 0 <= i.arg < s
                                         for i, s in zip(idx, x.shape, strict=True)):
        valid = UOp.const(dtypes.bool, True)
    return at(x, valid, idx)


def flat_index(idx: tuple[UOp, ...], shape: tuple[int, ...], dtype: DType) -> UOp:
    """The row-major offset of `idx` in `shape`."""
    out = UOp.const(dtype, 0)
    for i, stride in zip(idx, strides_for_shape(shape), strict=True): out = out + i * stride
    return out


def reshape_index(idx: tuple[UOp, ...], new: tuple[int, ...], old: tuple[int, ...], dtype: DType) -> tuple[UOp, ...]:
    """Indices into `old` for position `idx` of the same data viewed as `new`.

    Both shapes are cut where their running products agree (`reshape_groups`), so an axis that a reshape leaves
    alone keeps its index as it is and only axes that are merged or split get `//` and `%`."""
    if 0 in old: return tuple(UOp.const(dtype, 0) for _ in old)  # no element: the read never happens
    out: list[UOp] = []
    for group_new, group_old in reshape_groups(new, old):
        flat = flat_index(idx[group_new.start:group_new.stop], new[group_new.start:group_new.stop], dtype)
        sizes = old[group_old.start:group_old.stop]
        for size, stride in zip(sizes, strides_for_shape(sizes), strict=True):
            out.append(UOp.const(dtype, 0) if size == 1 else (flat // stride) % size)
    return tuple(out)


def reshape_groups(new: tuple[Sint, ...], old: tuple[Sint, ...]) -> list[tuple[range, range]]:
    """The axes of `new` and of `old` that a reshape maps onto each other, cut where the running products agree.

    A flat source is one group (a buffer: it may hold more elements than a symbolic shape reads). A symbolic axis
    is a group of its own: the front end keeps it whole (variables.same_axes)."""
    if len(old) == 1: return [(range(len(new)), range(1))]
    if is_symbolic(new) or is_symbolic(old):
        cut_new = [i for i, s in enumerate(new) if type(s) is UOp] + [len(new)]
        cut_old = [j for j, s in enumerate(old) if type(s) is UOp] + [len(old)]
        groups, i, j = [], 0, 0
        for i1, j1 in zip(cut_new, cut_old, strict=True):
            groups += [(range(i + a.start, i + a.stop), range(j + b.start, j + b.stop))
                       for a, b in reshape_groups(new[i:i1], old[j:j1]) if a or b]
            if i1 < len(new): groups.append((range(i1, i1 + 1), range(j1, j1 + 1)))
            i, j = i1 + 1, j1 + 1
        return groups
    cum_new, cum_old = [1, *itertools.accumulate(new, operator.mul)], [1, *itertools.accumulate(old, operator.mul)]
    groups, i, j = [], 0, 0
    while i < len(new) or j < len(old):
        i1, j1 = min(i + 1, len(new)), min(j + 1, len(old))
        while cum_new[i1] != cum_old[j1]:
            if (cum_new[i1] < cum_old[j1] or j1 == len(old)) and i1 < len(new): i1 += 1
            else: j1 += 1
        groups.append((range(i, i1), range(j, j1)))
        i, j = i1, j1
    return groups


# ---- rules that push INDEX(node, valid, *idx) down to the buffers ----------------------------------------------


def index_alu(x: UOp, valid: UOp, idx: tuple[UOp, ...]) -> UOp:
    """The value of an elementwise op at idx is the op on its sources' values at idx."""
    return x.replace(src=tuple(at(s, valid, idx) for s in x.src))


def moved_position(x: UOp, pos: tuple[int, ...]) -> tuple[int, ...] | None:
    """Where in its source movement op `x` reads its position `pos` (None: a pad's zero), in plain ints."""
    src = x.src[0]
    if x.op is Ops.RESHAPE:
        flat = sum(i * stride for i, stride in zip(pos, strides_for_shape(x.shape), strict=True))
        return tuple((flat // stride) % size for size, stride in zip(src.shape, strides_for_shape(src.shape),
                                                                        strict=True))
    if x.op is Ops.PERMUTE: return tuple(pos[x.arg.index(axis)] for axis in range(len(pos)))
    if x.op is Ops.EXPAND: return tuple(0 if s == 1 else i for i, s in zip(pos, src.shape, strict=True))
    if x.op is Ops.SHRINK: return tuple(i + b for i, (b, _) in zip(pos, x.arg, strict=True))
    if x.op is Ops.FLIP: return tuple(s - 1 - i if f else i for i, s, f in zip(pos, src.shape, x.arg, strict=True))
    assert x.op is Ops.PAD
    moved = tuple(i - b for i, (b, _) in zip(pos, x.arg, strict=True))
    return moved if all(0 <= i < s for i, s in zip(moved, src.shape, strict=True)) else None


def index_movement(ctx: RangeifyContext, x: UOp, valid: UOp, idx: tuple[UOp, ...]) -> UOp:
    """A movement op only changes where in its source a position reads from."""
    src, d = x.src[0], ctx.index_dtype
    if all(i.op is Ops.CONST for i in idx) and not is_symbolic(x.shape) and not is_symbolic(src.shape) and \
            all(0 <= i.arg < s for i, s in zip(idx, x.shape, strict=True)):
        # a position of an unrolled axis: moved as ints, not built as index arithmetic and simplified (most reads
        # of a scalar model's straight-line code are such positions)
        moved = moved_position(x, tuple(i.arg for i in idx))
        if moved is None: return UOp.const(x.dtype, 0)
        return at(src, UOp.const(dtypes.bool, True), tuple(UOp.const(d, i) for i in moved))
    if x.op is Ops.RESHAPE: return read(src, valid, ctx.simplify(reshape_index(idx, x.shape, src.shape, d)))
    if x.op is Ops.PERMUTE:
        moved = [idx[x.arg.index(axis)] for axis in range(len(idx))]
        return read(src, valid, tuple(moved))
    if x.op is Ops.EXPAND:
        return read(src, valid, tuple(UOp.const(d, 0) if s == 1 else i for i, s in zip(idx, src.shape, strict=True)))
    if x.op is Ops.SHRINK:
        return read(src, valid, ctx.simplify(tuple(i + b if b else i for i, (b, _) in zip(idx, x.arg, strict=True))))
    if x.op is Ops.FLIP:
        flipped = tuple((s - 1) - i if f else i for i, s, f in zip(idx, src.shape, x.arg, strict=True))
        return read(src, valid, ctx.simplify(flipped))
    assert x.op is Ops.PAD
    inside = UOp.const(dtypes.bool, True)
    for i, size, (before, after) in zip(idx, x.shape, x.arg, strict=True):
        if before: inside = inside & (UOp.const(d, before - 1) < i)
        if after: inside = inside & (i < size - after)
    moved = ctx.simplify(tuple(i - b if b else i for i, (b, _) in zip(idx, x.arg, strict=True)))
    # decide now when the bounds of the indices already do: a read that is never inside is never built (a chain
    # of cats would otherwise build every branch of every link before folding them away)
    if not inside.vmax: return UOp.const(x.dtype, 0)
    if inside.vmin: return read(src, valid, moved)
    return inside.where(read(src, *ctx.simplify((valid & inside,)), moved), UOp.const(x.dtype, 0))


def stride_one_window(pad: UOp, consumers: dict[UOp, list[UOp]]) -> bool:
    """Whether the reads of `pad` through the chain of movement ops above it (a convolution's or a pool's windows)
    step by one along its last axis with every loop that moves them: ox + kx, not 2 * ox + kx (a strided window)
    or ox + 2 * kx (a dilated one). Along such an axis the vector lanes of the reader's loads are consecutive (a
    row that vectors do not divide gets its last lanes gated off: opt.upcast_padded), and once the window's axis is
    unrolled the padding's gates settle lane by lane (codegen/heuristic.py), so the reader needs no padded copy.
    False where the chain branches or a read is never inside."""
    top = pad
    while len(consumers.get(top, ())) == 1 and (c := consumers[top][0]).op in GroupOp.Movement: top = c
    chain: list[UOp] = []
    node = top
    while node is not pad: chain.append(node); node = node.src[0]
    if not chain or is_symbolic(top.shape) or is_symbolic(pad.shape): return False
    ctx = RangeifyContext(dtypes.int32)
    idx = loops = tuple(ctx.new_range(s, AxisKind.LOOP) for s in top.shape)
    for x in chain:
        out = index_movement(ctx, x, UOp.const(dtypes.bool, True), idx)
        if out.op is Ops.WHERE: out = out.src[1]
        if out.op is not Ops.INDEX: return False
        idx = out.src[2:]
    last = idx[-1]
    if not last.ranges or any(affine_step(last, r) != 1 for r in last.ranges): return False
    # the vector lanes go on the longest such loop: an output (ox + kx of a convolution), not a reduced one (the
    # gradient of its weight sums over ox: lanes of one accumulator, whose gates only copies of kx would settle)
    reduced = {i for c in consumers.get(top, ()) for r in [c, *consumers.get(c, ())][:2] if r.op is Ops.REDUCE_AXIS
               and r.src[0].shape == top.shape for i in r.arg[1]}
    longest = max(last.ranges, key=lambda r: r.src[0].arg)
    return loops.index(longest) not in reduced


def index_reduce(ctx: RangeifyContext, x: UOp, valid: UOp, idx: tuple[UOp, ...]) -> UOp:
    """A reduced axis of the result loops over a new REDUCE range; the others keep their index.

    Where the reduction has few results, a small reduced axis that the value branches on (a cat or stack being
    summed) is unrolled instead, as small output axes are: each position folds to its branch, and positions share
    their common work (a chain of cats summed at the end would otherwise rebuild every branch of every link per
    position: exponential code). So is a reduction read at a fixed position (an unrolled entry of a jacobian) whose
    every reduced axis branches: the reverse sweep through `c.unsqueeze(0) * c.unsqueeze(1)` sums a row of the
    cotangent matrix, each entry a different scalar expression, which a loop would compute all of, with the primal
    below them, at every step (a 5x5 solve's jacobian: 110 sin/cos for the primal's 10, 1.1 MB of C++; unrolled,
    10 and 218 KB). The terms are combined in the loop's order, from the identity, so a fully unrolled sum is the
    loop's bit for bit."""
    src, (op, axes) = x.src[0], x.arg
    if any(src.shape[a] == 0 for a in axes): return reduce_identity(op, x.dtype)  # no loop that never runs
    unrolled: list[int] = []
    if not any(n.op is Ops.REDUCE_AXIS for n in src.toposort()):  # terms without loops of their own
        if max_count(x.shape) <= UNROLL_AXIS_LIMIT:  # a few results (a loss, a norm: not a conv's or a pool's)
            unrolled = sorted(branching_axes(src, src.shape) & set(axes))
        elif not any(i.ranges for i in idx):  # one result, at a fixed position: all its terms or none
            branching = branching_axes(src, tuple(s if a in axes else 1 for a, s in enumerate(src.shape)))
            unrolled = sorted(axes) if branching == set(axes) else []
    new_idx = tuple(ctx.new_range(s, AxisKind.REDUCE) if a in axes and a not in unrolled else i
                    for a, (i, s) in enumerate(zip(idx, src.shape, strict=True)))
    ranges = tuple(new_idx[a] for a in axes if new_idx[a].op is Ops.RANGE)
    value = reduce_identity(op, x.dtype) if unrolled else None
    for pos in itertools.product(*(range(src.shape[a]) for a in unrolled)):
        fixed = dict(zip(unrolled, pos, strict=True))
        term = at(src, valid, tuple(UOp.const(i.dtype, fixed[a]) if a in fixed else i for a, i in enumerate(new_idx)))
        value = term if value is None else UOp(op, x.dtype, (value, term))
    if value is None: value = at(src, valid, new_idx)
    return UOp(Ops.REDUCE, x.dtype, (value, *ranges), op) if ranges else value


def index_gather(ctx: RangeifyContext, x: UOp, valid: UOp, idx: tuple[UOp, ...]) -> UOp:
    """A gathered position reads its source where the index tensor's value says: a data-dependent address, loaded
    only when it is inside the axis (an index outside reads 0, never memory out of bounds)."""
    src, table, axis = x.src[0], x.src[1], x.arg
    k = len(table.shape)
    d = ctx.index_dtype
    where, = ctx.simplify((ctx.resolve(at(table, valid, idx[axis:axis + k])).cast(d),))
    inside, = ctx.simplify((valid & (UOp.const(d, -1) < where) & (where < src.shape[axis]),))
    value = read(src, inside, idx[:axis] + (where,) + idx[axis + k:])
    return inside.where(value, UOp.const(x.dtype, 0))


def index_buffer(x: UOp, g: UOp, valid: UOp, i: UOp) -> UOp | None:
    """A read of a buffer is a LOAD, gated by `valid` unless it is always true."""
    if isinstance(x.dtype, PtrDType): return None  # already a kernel-level INDEX
    ptr = UOp(Ops.INDEX, g.dtype, (g, i) if valid.op is Ops.CONST and valid.arg else (g, i, valid))
    return UOp(Ops.LOAD, x.dtype, (ptr,))


def drop_true_gate(x: UOp, g: UOp, i: UOp) -> UOp:
    """A gate that simplified to True gates nothing."""
    return UOp(Ops.INDEX, x.dtype, (g, i))


UNROLL_AXIS_LIMIT = 16  # an output axis this small that the value branches on is unrolled, as long as the unrolled
# axes make at most helpers.UNROLL stores
STRAIGHT_AXIS_LIMIT = 32  # the longest such axis of a value with no reduction that a compared ARANGE chooses by (a
# derivative's directions): the 18 row colors of a multiple-shooting jacobian (a quadrotor's, N = 50), looped, ran
# each interval's reverse sweep once per color, its seeds unknown (4.5x CasADi's time; unrolled 1.1x)
STRAIGHT_UNROLL = 4  # times UNROLL for a value with no reduction (branching_axes): the vmapped jacobian of a
# quadrotor's RK4 step, 12 x 16 entries a point, looped over its 16 columns: 14.4 ms for 1000 points, unrolled 1.3


def target_offset(view: UOp, idx: tuple[UOp, ...], dtype: DType) -> tuple[UOp, UOp] | None:
    """(the output's DEFINE_GLOBAL, the offset of position `idx` of `view` in it) for a view made of RESHAPEs and
    SHRINKs of the output (codegen/stores.py splits a store into such views), else None."""
    while view.src[0].op is not Ops.DEFINE_GLOBAL:
        if view.op is Ops.RESHAPE: idx = reshape_index(idx, view.shape, view.src[0].shape, dtype)
        elif view.op is Ops.SHRINK: idx = tuple(i + b if b else i for i, (b, _) in zip(idx, view.arg, strict=True))
        else: return None
        view = view.src[0]
        if view.op not in (Ops.RESHAPE, Ops.SHRINK): return None
    return (view.src[0], flat_index(idx, view.shape, dtype)) if view.op is Ops.RESHAPE else None


def output_loops(ctx: RangeifyContext, g: UOp, shape: tuple[int, ...], unroll: list[int]) -> dict[int, UOp]:
    """A RANGE per looped axis of a store into output g: the n-th axis of a size takes the n-th loop of that size
    made for g, so the pieces of a split store (codegen/stores.py) that have a size in common share its loop, and
    what they compute alike at one step is one node (the loads of a stencil's edge and interior columns)."""
    used: dict[int, int] = {}
    loops = {}
    for a, s in enumerate(shape):
        if a in unroll: continue
        if s == 1:
            loops[a] = UOp.const(ctx.index_dtype, 0)
            continue
        made = ctx.loops.setdefault((g, s), [])
        n = used[s] = used.get(s, -1) + 1
        if n == len(made): made.append(ctx.new_range(s, AxisKind.GLOBAL))
        loops[a] = made[n]
    return loops


def store_over_ranges(ctx: RangeifyContext, view: UOp, value: UOp) -> UOp | None:
    """The output: one RANGE per axis of its shape, and the value at those ranges stored at their offset.

    The axes in `ctx.unroll` get no RANGE: one STORE per position along them instead (grouped in a SINK), so the
    branches of a cat, stack or pad fold to the one each position reads, and the positions share the work they
    have in common (the graph is hash-consed), as a scalar code generator would write it."""
    if (found := target_offset(view, tuple(UOp.const(ctx.index_dtype, 0) for _ in view.shape), ctx.index_dtype)) \
            is None:
        return None
    g = found[0]
    unroll = sorted(ctx.unroll.get(view, ()))
    loops = output_loops(ctx, g, view.shape, unroll)
    stores = []
    for pos in itertools.product(*(range(view.shape[a]) for a in unroll)):
        fixed = dict(zip(unroll, pos, strict=True))
        idx = tuple(UOp.const(ctx.index_dtype, fixed[a]) if a in fixed else loops[a] for a in range(len(view.shape)))
        offset = target_offset(view, idx, ctx.index_dtype)
        assert offset is not None
        target = UOp(Ops.INDEX, g.dtype, offset)
        stores.append(UOp(Ops.STORE, dtypes.void, (target, at(value, UOp.const(dtypes.bool, True), idx))))
    return stores[0] if len(stores) == 1 else UOp(Ops.SINK, dtypes.void, tuple(stores))


Axes = tuple[frozenset[int], ...]  # per axis of a node: the output axes its index is computed from
REDUCED = -1  # beside them: a reduced axis (an axis indexed by oy and ky is a window: oy + ky)
WINDOW = frozenset({REDUCED})


def source_axes(u: UOp, axes: Axes) -> list[tuple[UOp, Axes]]:
    """Which output axes each axis of u's sources is indexed by, given u's."""
    none: frozenset[int] = frozenset()
    if u.op in (Ops.FOLD, Ops.SCATTER_ADD): return []  # stored by loops of their own: nothing below is indexed by u
    if u.op is Ops.RESHAPE:
        if 0 in u.src[0].shape: return []
        out = [none] * len(u.src[0].shape)
        for new, old in reshape_groups(u.shape, u.src[0].shape):
            for j in old: out[j] = frozenset().union(*(axes[i] for i in new))
        return [(u.src[0], tuple(out))]
    if u.op is Ops.PERMUTE: return [(u.src[0], tuple(axes[u.arg.index(j)] for j in range(len(axes))))]
    if u.op is Ops.EXPAND:
        return [(u.src[0], tuple(none if s == 1 else a for a, s in zip(axes, u.src[0].shape, strict=True)))]
    if u.op is Ops.REDUCE_AXIS:
        return [(u.src[0], tuple(WINDOW if i in u.arg[1] else a for i, a in enumerate(axes)))]
    if u.op is Ops.GATHER:
        a, k = u.arg, len(u.src[1].shape)
        return [(u.src[0], (*axes[:a], none, *axes[a + k:])), (u.src[1], axes[a:a + k])]
    return [(s, axes) for s in u.src if s.op is not Ops.DEFINE_GLOBAL]  # elementwise, PAD, SHRINK, FLIP, DETACH, ...


def branching_axes(value: UOp, shape: tuple[Sint, ...]) -> frozenset[int]:
    """The small output axes that a PAD (cat, stack, pad) or a compared ARANGE (eye, one-hot, a gathered
    position) chooses by: worth unrolling, smallest first, within UNROLL stores in all (STRAIGHT_UNROLL times that
    for a value with no reduction: a derivative's entries, a stack of scalar expressions, where a loop over such an
    axis computes every position's expression in each step and selects one; unrolled, each is computed once).
    Found on the tensor-level graph, before any index is built: each node's axes are followed down to the sources
    with the output axes they are computed from.

    An ARANGE only counts below a comparison or as a GATHER's index: one that is arithmetic (the counters random
    numbers are made of) chooses nothing, and unrolled it copied Threefry's rounds once per element (randn of
    2 x 8 x 16 x 16: a million lines of C, which crashed gcc). A PAD along an axis indexed together with a reduced
    one (a convolution's input, read at oy + ky) chooses nothing either: every position's loop crosses the padding,
    so unrolled, a 7 x 7 output copied its 2304-step loop 49 times and got no vector lanes."""
    found: set[int] = set()
    chooses: set[int] = set()  # (the axes a compared ARANGE chooses by: a derivative's directions, one-hots)
    start: Axes = tuple(frozenset({a}) for a in range(len(shape)))
    seen, stack = {(value, start, False)}, [(value, start, False)]
    reduces = False
    while stack:
        u, axes, compared = stack.pop()
        reduces |= u.op is Ops.REDUCE_AXIS
        if u.op is Ops.ARANGE and compared: found.update(*axes); chooses.update(*axes)
        if u.op is Ops.PAD:  # (not a padding read through a window: each position's loop reads both sides of it)
            found.update(*(a for a, pad in zip(axes, u.arg, strict=True) if pad != (0, 0) and REDUCED not in a))
        for s, s_axes in source_axes(u, axes):
            item = (s, s_axes, compared or u.op in GroupOp.Comparison or (u.op is Ops.GATHER and s is u.src[1]))
            if item not in seen and any(a - WINDOW for a in s_axes): seen.add(item); stack.append(item)
    found.discard(REDUCED)
    chosen, stores, limit = [], 1, UNROLL.value * (1 if reduces else STRAIGHT_UNROLL)
    sizes = sorted((shape[a], a) for a in found if type(shape[a]) is not UOp)  # (a symbolic axis loops)
    # one longer axis, where no other could be unrolled instead: a jacobian's directions beside its long positions
    # (not positions of 30 intervals beside 3 directions: periodic.py splits those, unrolled they are code)
    long_one = not reduces and sum(1 < size <= STRAIGHT_AXIS_LIMIT for size, _ in sizes) == 1
    for size, a in sizes:
        longest = STRAIGHT_AXIS_LIMIT if long_one and a in chooses else UNROLL_AXIS_LIMIT
        if 1 < size <= longest and stores * size <= limit: chosen, stores = [*chosen, a], stores * size
    return frozenset(chosen)


def store_scatter(ctx: RangeifyContext, view: UOp, value: UOp) -> UOp | None:
    """A SCATTER_ADD stored: a loop that zeroes the output, then one loop over the source that adds each element at
    the position its index holds (a data-dependent address, written only when the index is inside the axis):

        for j: out[j] = 0
        for r: if 0 <= idx[r] < n: out[idx[r]] = out[idx[r]] + src[r]

    The second loop reads what earlier steps wrote, so its loops are LOOP ranges and the kernel gets no opts
    (codegen/__init__.py): split across cores or into vector lanes, two steps adding at one position would race.
    Its cost is one step per source element: linear, where a comparison of every source element with every
    position of the axis (a one-hot) grows with their product."""
    if (found := target_offset(view, tuple(UOp.const(ctx.index_dtype, 0) for _ in view.shape), ctx.index_dtype)) \
            is None:
        return None
    g, d, always = found[0], ctx.index_dtype, UOp.const(dtypes.bool, True)
    out_loops = tuple(ctx.new_range(s, AxisKind.LOOP) for s in view.shape)
    offset = target_offset(view, out_loops, d)
    assert offset is not None
    zero = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, g.dtype, offset), UOp.const(value.dtype, 0)))
    zeroed = end_ranges(zero, tuple(r for r in out_loops if r.op is Ops.RANGE))  # (an axis of 1 has no loop)
    src, table, a = value.src[0], value.src[1], value.arg.axis
    loops = tuple(ctx.new_range(s, AxisKind.LOOP) for s in src.shape)
    where = at(table, always, loops[a:a + len(table.shape)]).cast(d)
    inside = (UOp.const(d, -1) < where) & (where < value.arg.size)
    target = target_offset(view, loops[:a] + (where,) + loops[a + len(table.shape):], d)
    assert target is not None
    slot = UOp(Ops.INDEX, g.dtype, (g.after(zeroed), target[1], inside))
    total = UOp(Ops.LOAD, value.dtype, (slot,)) + at(src, always, loops)
    return UOp(Ops.SINK, dtypes.void, (zeroed, UOp(Ops.STORE, dtypes.void, (slot, total))))


pm_rangeify = PatternMatcher([
    (UPat(Ops.STORE, src=(UPat((Ops.RESHAPE, Ops.SHRINK), name="view"), UPat(Ops.SCATTER_ADD, name="value"))),
     store_scatter),  # (before store_over_ranges, which would loop over the output)
    (UPat(Ops.STORE, src=(UPat((Ops.RESHAPE, Ops.SHRINK), name="view"), UPat.var("value"))), store_over_ranges),
    (UPat(Ops.INDEX, src=(UPat(GroupOp.Elementwise),), allow_any_len=True, name="x"),
     lambda x: index_alu(x.src[0], x.src[1], x.src[2:])),
    (UPat(Ops.INDEX, src=(UPat(GroupOp.Movement),), allow_any_len=True, name="x"),
     lambda ctx, x: index_movement(ctx, x.src[0], x.src[1], x.src[2:])),
    (UPat(Ops.INDEX, src=(UPat(Ops.REDUCE_AXIS),), allow_any_len=True, name="x"),
     lambda ctx, x: index_reduce(ctx, x.src[0], x.src[1], x.src[2:])),
    (UPat(Ops.INDEX, src=(UPat(Ops.GATHER),), allow_any_len=True, name="x"),
     lambda ctx, x: index_gather(ctx, x.src[0], x.src[1], x.src[2:])),
    (UPat(Ops.INDEX, src=(UPat((Ops.CONST, Ops.DEFINE_VAR), name="c"),), allow_any_len=True), lambda c: c),
    (UPat(Ops.INDEX, src=(UPat(Ops.ARANGE, name="a"), UPat.var("valid"), UPat.var("i"))), lambda a, valid, i:
     i.cast(a.dtype)),  # the value of an ARANGE is its index
    (UPat(Ops.INDEX, src=(UPat((Ops.DETACH, Ops.CONTIGUOUS_BACKWARD), name="d"),), allow_any_len=True, name="x"),
     lambda x, d: at(d.src[0], x.src[1], x.src[2:])),
    (UPat(Ops.INDEX, src=(UPat(Ops.DEFINE_GLOBAL, name="g"), UPat.var("valid"), UPat.var("i")), name="x"),
     index_buffer),
    (UPat(Ops.INDEX, src=(UPat(Ops.DEFINE_GLOBAL, name="g"), UPat.var("i"), UPat.const(dtypes.bool, True)), name="x"),
     drop_true_gate),
])


# ---- what a gate says about the index it guards -----------------------------------------------------------------


def gate_bounds(gate: UOp) -> dict[UOp, tuple[int, int]]:
    """Bounds on integer nodes (RANGEs, loaded indices) that hold wherever `gate` is true, read off its `c < r` and
    `r < c` clauses."""
    bounds: dict[UOp, tuple[int, int]] = {}
    stack = [gate]
    while stack:
        clause = stack.pop()
        if clause.op is Ops.AND: stack.extend(clause.src)
        if clause.op is not Ops.CMPLT or not clause.src[0].dtype.is_int: continue
        a, b = clause.src
        if is_boundable(a) and b.op is Ops.CONST: rng, lo, hi = a, a.vmin, b.arg - 1
        elif is_boundable(b) and a.op is Ops.CONST: rng, lo, hi = b, a.arg + 1, b.vmax
        else: continue
        old_lo, old_hi = bounds.get(rng, (rng.vmin, rng.vmax))
        bounds[rng] = (max(old_lo, lo), min(old_hi, hi))
    return bounds


BOUNDABLE = frozenset({Ops.RANGE, Ops.LOAD})


def is_boundable(x: UOp) -> bool:
    """A RANGE or loaded index, or a sum over a RANGE: a padded window's row `oy + ky` is gated as a whole."""
    return x.op in BOUNDABLE or x.op is Ops.ADD and x.dtype.is_int and any(
        t.op is Ops.RANGE and c in (1, -1) for t, c in split_sum(x)[0].items())


def simplify_gated_index(x: UOp, g: UOp, i: UOp, gate: UOp) -> UOp | None:
    """Simplify a gated read's offset knowing the gate holds: a padded read then needs no `%` to stay in bounds, a
    gather's position read from a table (checked to be inside its axis) no `//` and `%` to split and rejoin it.

    Each bounded node is swapped for a variable with the narrower bounds, the offset simplified, and swapped back;
    a bounded sum (a window's row `oy + ky`, gated as a whole) by writing one of its RANGEs as that variable minus
    the rest of the sum, so the sum's terms in the offset collect into the variable. The variables range over at
    least every point where the gate holds, so what holds for them holds there.
    Every other load in the offset is swapped for a variable too, so that what the gate says never reaches its
    gate: the loads of an offset run whether or not the outer gate holds (the linearizer hoists them), and a
    gather's table read gated by the same condition lost its gate and read past its buffer. An offset computed by
    a reduction (a position that sort or topk found) is left alone: the swap would rebuild that REDUCE as a second
    one over the same RANGEs, which two ENDs would then close."""
    simpler = simplify_under(gate, i)
    return None if simpler is i else UOp(Ops.INDEX, x.dtype, (g, simpler, gate))


def simplify_under(gate: UOp, x: UOp) -> UOp:
    """x simplified where `gate` holds (see simplify_gated_index), else x itself."""
    if any(u.op is Ops.REDUCE for u in x.toposort()): return x
    bounds = {r: b for r, b in gate_bounds(gate).items() if b[0] <= b[1] and b != (r.vmin, r.vmax)}
    if not bounds: return x
    narrow = {r: UOp.variable(f"gate{k}", lo, hi, r.dtype) for k, (r, (lo, hi)) in enumerate(bounds.items())}
    opaque = {u: UOp.variable(f"load{k}", u.vmin, u.vmax, u.dtype) for k, u in
              enumerate(u for u in x.toposort() if u.op is Ops.LOAD and u not in narrow)}
    swapped = {r: v for r, v in narrow.items() if r.op in BOUNDABLE} | opaque
    for s, v in narrow.items():  # a bounded sum s = r + rest: r is written v - rest, so s's terms become v
        if s.op in BOUNDABLE: continue
        terms, const = split_sum(s)
        free = [(t, c) for t, c in terms.items() if t.op is Ops.RANGE and c in (1, -1) and t not in swapped]
        if not free: continue
        (rng, coeff), rest = free[0], build_sum(s.dtype, ((t, c) for t, c in terms.items() if t is not free[0][0]),
                                                const)
        swapped[rng] = v - rest if coeff == 1 else rest - v
    back = {v: r for r, v in narrow.items()} | {v: r for r, v in opaque.items()}
    return substitute(graph_rewrite(substitute(x, swapped), symbolic), back)


def divides(x: UOp) -> bool:
    """x computes a `//` or `%` outside the loads it reads (cached per node: every select of a kernel asks)."""
    return x._bottom_up("_divides", lambda u: u.op is not Ops.LOAD and (u.op in (Ops.MOD, Ops.IDIV) or
                                                                       any(s._divides for s in u.src)))


def simplify_gated_value(x: UOp, gate: UOp, a: UOp, b: UOp) -> UOp | None:
    """`gate ? a : b` with the integer arithmetic of `a` simplified knowing the gate holds: a padded arange read one
    step outside its axis keeps no `%` (a sparse jacobian's seeds, `((i - 1) % n * 2 + j) % 5`, compare colors
    that then differ by a constant, decide_equal_remainders). Loads stay as they are (see simplify_gated_index);
    nothing is done unless `a` divides a gated node."""
    if not divides(a) or not any(r in a.ranges for r in gate_bounds(gate)): return None
    if a.dtype.is_int: simpler = simplify_under(gate, a)
    else:  # only the integer parts that divide: the float value around them (a jacobian's primal) is left unwalked
        walked = a.toposort(descend=divides)
        readers = {s: u for u in walked for s in u.src}
        parts = [u for u in walked if u.dtype.is_int and divides(u) and not readers[u].dtype.is_int]
        if not (changed := {u: v for u in parts if (v := simplify_under(gate, u)) is not u}): return None
        simpler = substitute(a, changed)
    return None if simpler is a else b if simpler is b else x.replace(src=(gate, simpler, b))


pm_simplify_gated_index = PatternMatcher([
    (UPat(Ops.INDEX, src=(UPat(Ops.DEFINE_GLOBAL, name="g"), UPat.var("i"), UPat.var("gate")), name="x"),
     simplify_gated_index),
])
pm_simplify_gated_value = PatternMatcher([
    (UPat(Ops.WHERE, src=(UPat.var("gate"), UPat.var("a"), UPat.var("b")), name="x"), simplify_gated_value),
])


def largest_index(ast: UOp) -> int:
    """A bound on every value an index expression of the kernel can take: the most elements of any buffer or view.

    Every index rangeify builds is a position inside some node's shape (a loop's trip count, a flat offset into a
    reshape, a shifted pad or flip position) or a buffer offset, so it stays below the largest of them. A loop over
    a broadcast constant or an ARANGE has no buffer that large: buffer sizes alone chose int32 for
    `Tensor.ones(2**31 + 5).sum()`, whose loop then never ran."""
    return max((u.dtype.size if u.op is Ops.DEFINE_GLOBAL else max_count(u.shape) for u in ast.toposort()
                if u.op not in (Ops.SINK, Ops.STORE)), default=0)


pm_rangeify_symbolic = pm_rangeify + symbolic  # combined once: building a matcher costs 2 ms


def rangeify(ast: UOp) -> UOp:
    """The kernel AST with explicit loops and loads in place of tensor-level views (see the module docstring)."""
    ast = split_stores(ast, UNROLL_AXIS_LIMIT)  # a store of a concatenation: a store per piece, over its own shape
    index_dtype = dtypes.int64 if largest_index(ast) > 2**31 - 1 else dtypes.int32
    unroll = {st.src[0]: branching_axes(st.src[1], st.src[0].shape) for st in ast.src if st.op is Ops.STORE}
    sink = graph_rewrite(ast, pm_rangeify_symbolic, ctx=RangeifyContext(index_dtype, unroll), bottom_up=True,
                         name="rangeify")
    sink = graph_rewrite(sink, pm_simplify_gated_index)
    # a gated value that simplified may leave a select of equal branches or a sum with a zero tangent: fold those (a
    # pass of its own: the gated rules and symbolic in one pass rewrote some offsets back and forth forever)
    if (valued := graph_rewrite(sink, pm_simplify_gated_value)) is not sink: sink = graph_rewrite(valued, symbolic)
    sink = sink.replace(src=tuple(x for s in sink.src for x in (s.src if s.op is Ops.SINK else (s,))))  # unrolled
    # a buffer whose reads all simplified away is still a parameter of the kernel: its slot must not shift
    kept = {u for u in sink.toposort() if u.op is Ops.DEFINE_GLOBAL}
    dropped = [u for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL and u not in kept]
    return sink.replace(src=sink.src + tuple(dropped)) if dropped else sink
