"""Lower REDUCE to an accumulator loop and close every loop with END. Runs after rangeify, before linearize.

Before: `REDUCE(v, *ranges)` values; STOREs inside output RANGEs that nothing closes.
After:  no REDUCE. Each became a register: set to the identity where the reduction starts, updated inside its ranges,
        read after the END that closes them. Every RANGE is closed by exactly one END, innermost first (reductions
        over the same ranges share the loop):

    REDUCE(x[r1], r1, arg=ADD)
    -> acc = DEFINE_REG; init = STORE(acc[0], 0)
       END(STORE(acc.after(init, r1)[0], acc.after(init, r1)[0] + x[r1]), r1) ... LOAD(acc.after(END)[0])
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ember.dtype import AddrSpace, DType, dtypes
from ember.helpers import SPEC
from ember.uop.ops import SERIAL, TANGENT, Ops, UOp
from ember.uop.spec import check_stage
from ember.uop.upat import PatternMatcher, UPat, graph_rewrite, substitute


def reduce_identity(op: Ops, dtype: DType) -> UOp:
    """The value a reduction starts from: 0 for ADD, 1 for MUL, the smallest value for MAX (in every lane)."""
    if dtype.count > 1: return UOp(Ops.VECTORIZE, dtype, (reduce_identity(op, dtype.scalar),) * dtype.count)
    if op is Ops.ADD: return UOp.const(dtype, 0)
    if op is Ops.MUL: return UOp.const(dtype, 1)
    assert op is Ops.MAX, f"no identity for reduction {op}"
    return UOp.const(dtype, dtype.min)


@dataclass
class LowerContext:
    """Numbers the registers of a kernel; `contract`: a float sum of products updates its accumulator with one fused
    multiply-add per term (one rounding, as BLAS does), not a rounded product and a rounded sum."""

    registers: itertools.count = field(default_factory=itertools.count)
    contract: bool = False
    enclosing: dict[UOp, frozenset[UOp]] = field(default_factory=dict)  # reduce range -> loops it runs inside


def loops_enclosing(sink: UOp) -> dict[UOp, frozenset[UOp]]:
    """For each reduce range, the loops it will run inside: those of every reduction that shares it, since their
    loops merge (merge_loops). A copy of an unrolled reduction whose value does not depend on an outer loop (rows
    of a convolution's padding that are all alike) runs in that loop all the same, so its accumulator restarts
    there too."""
    reduces = [u for u in sink.toposort() if u.op is Ops.REDUCE]
    enclosing: dict[UOp, frozenset[UOp]] = {}
    changed = True
    while changed:  # (a reduction's loops take in those of every reduction sharing one of them, to a fixed point)
        changed = False
        for red in reduces:
            own = frozenset(red.src[1:])
            outer = frozenset(red.ranges).union(*(enclosing.get(r, frozenset()) for r in own)) - own
            for r in own:
                if not outer <= enclosing.get(r, frozenset()):
                    enclosing[r], changed = enclosing.get(r, frozenset()) | outer, True
    return enclosing


def end_ranges(value: UOp, ranges: tuple[UOp, ...]) -> UOp:
    """`value` with every range in `ranges` closed after it, the innermost (largest axis) first."""
    for rng in sorted(ranges, key=lambda r: r.arg.axis, reverse=True): value = UOp(Ops.END, dtypes.void, (value, rng))
    return value


def lower_reduce(ctx: LowerContext, red: UOp) -> UOp:
    """REDUCE(value, *ranges) -> an accumulator register set, updated in the loops, and read after them."""
    value, ranges, op = red.src[0], red.src[1:], red.arg
    # the loops the whole reduction sits in: the accumulator restarts in each of their steps
    outer = sorted(frozenset(red.ranges).union(*(ctx.enclosing.get(r, frozenset()) for r in ranges)) - set(ranges),
                   key=lambda r: r.arg.axis)
    acc = UOp(Ops.DEFINE_REG, red.dtype.ptr(1, AddrSpace.REG), arg=next(ctx.registers))
    zero = UOp.const(dtypes.int32, 0)
    init = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, acc.dtype, (acc.after(*outer), zero)), reduce_identity(op,
               red.dtype)))
    slot = UOp(Ops.INDEX, acc.dtype, (acc.after(init, *ranges), zero))
    current = UOp(Ops.LOAD, red.dtype, (slot,))
    for term in serial_terms(value, op): current = accumulate(ctx, op, current, term)
    done = end_ranges(UOp(Ops.STORE, dtypes.void, (slot, current)), ranges)
    return UOp(Ops.LOAD, red.dtype, (UOp(Ops.INDEX, acc.dtype, (acc.after(done), zero)),))


def serial_terms(value: UOp, op: Ops) -> list[UOp]:
    """The terms a SERIAL chain (expand.py: an unrolled reduce axis) hands its accumulator, first to last; [value]
    for any other value."""
    terms: list[UOp] = []
    while value.op is op and value.arg == SERIAL:
        terms.append(value.src[1])
        value = value.src[0]
    return [value, *reversed(terms)]


def accumulate(ctx: LowerContext, op: Ops, current: UOp, term: UOp) -> UOp:
    """The accumulator after one more term: a tensor core's product (WMMA) with the accumulator as its addend; by
    fused multiply-add for a float product when `contract` (a forward-mode product keeps its test for a zero factor:
    renderer/cstyle.render_tangent_product)."""
    if op is Ops.ADD and term.op is Ops.WMMA and is_zero(term.src[2]):  # a tensor core adds its accumulator itself
        return term.replace(src=(*term.src[:2], current))
    if ctx.contract and op is Ops.ADD and term.op is Ops.MUL and term.arg != TANGENT and term.dtype.is_float:
        return UOp(Ops.MULACC, current.dtype, (*term.src, current))
    return UOp(op, current.dtype, (current, term))


def is_zero(x: UOp) -> bool:
    """Whether x is 0 in every lane."""
    if x.op is Ops.VECTORIZE: return all(is_zero(s) for s in x.src)
    return x.op is Ops.CONST and x.arg == 0


def close_store_ranges(sink: UOp) -> UOp | None:
    """Every STORE under the SINK is closed by ENDs of the ranges it sits in; STOREs in the same ranges (an
    unrolled output) share one loop: a NOOP groups them."""
    if not any(s.op is Ops.STORE and s.ranges for s in sink.src): return None
    groups: dict[frozenset[UOp], list[UOp]] = {}
    for s in sink.src: groups.setdefault(frozenset(s.ranges) if s.op is Ops.STORE else frozenset(), []).append(s)
    closed: list[UOp] = []
    for ranges, members in groups.items():
        if not ranges: closed += members
        else: closed.append(end_ranges(members[0] if len(members) == 1 else UOp(Ops.NOOP, dtypes.void,
                                                                                 tuple(members)), tuple(ranges)))
    return sink.replace(src=tuple(closed))


pm_lower_reduce = PatternMatcher([
    (UPat(Ops.REDUCE, name="red"), lower_reduce),
    (UPat(Ops.SINK, name="sink"), close_store_ranges),
])


def merge_loops(sink: UOp) -> UOp:
    """ENDs closing the same RANGE become one END over a NOOP of their bodies, innermost range first: the copies of
    a reduction that expand.py makes (one accumulator each) update their accumulators in one loop."""
    while True:
        ends: dict[UOp, list[UOp]] = {}
        for u in sink.toposort():
            if u.op is Ops.END: ends.setdefault(u.src[1], []).append(u)
        shared = [r for r, closing in ends.items() if len(closing) > 1]
        if not shared: return sink
        rng = max(shared, key=lambda r: r.arg.axis)
        merged = UOp(Ops.END, dtypes.void, (UOp(Ops.NOOP, dtypes.void, tuple(e.src[0] for e in ends[rng])), rng))
        sink = substitute(sink, dict.fromkeys(ends[rng], merged))


def lower(sink: UOp, contract: bool = False) -> UOp:
    """The kernel with reductions as accumulator loops and every loop closed (see the module docstring); with
    `contract`, sums of float products accumulate by fused multiply-add (see LowerContext)."""
    ctx = LowerContext(contract=contract, enclosing=loops_enclosing(sink))
    sink = merge_loops(graph_rewrite(sink, pm_lower_reduce, ctx=ctx, name="lower reductions"))
    if SPEC:
        check_stage(sink, "lower")
    return sink
