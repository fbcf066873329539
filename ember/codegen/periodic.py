"""Periodic unrolling: a loop whose body tests its index modulo a small constant steps through whole periods, the
positions of one period unrolled, so that each copy's remainder is a constant and what it selects folds away.
Runs after rangeify, before lower.

Before: rangeify's `SINK(STORE, ...)`, STOREs over RANGEs, no REDUCE.
After:  the same, except that a loop `r` of N steps whose stores compare `(r + k) % p` with something (2 <= p <=
        PERIOD_LIMIT; the stores loop over r alone) is split: the first `lo` and the last few steps are peeled off as
        constants (the steps that padding gates or a negative remainder single out), and the steps between run as
        `r = lo + p*q + s`, q a new RANGE over whole periods and s = 0 .. p-1 unrolled. The symbolic rules then fold
        each copy with the bounds of q: the remainders become constants, the gates true. Where the folded copies are
        one group of them repeated but for addresses (a banded derivative's columns), the loop takes one group per
        step instead (`reroll`): the same operations, in a loop that C compilers vectorize. A loop whose copies
        would hold more than SPLIT_WORK nodes in all stays as it is.

Why: the directions of a sparse jacobian are seeded by the color of each column, `(j % colors) == c`. Per step,
testing them costs more than the derivative (the compressed Bratu jacobian: 30 instructions per nonzero); with
the period unrolled, each copy is just the derivative entry it recovers:

    for r in 0..1000: out[r] = ((r - 1) % 3 == 0 ? a[r - 1] : 0) + ((r % 3 == 0) ? b[r] : 0)
 -> out[0] = b[0]; for q in 0..333: { out[1+3q] = a[3q]; out[2+3q] = 0; out[3+3q] = b[3+3q]; }
"""

from __future__ import annotations

import math

from ember.codegen.rangeify import pm_simplify_gated_index
from ember.dtype import dtypes
from ember.uop.ops import AxisKind, GroupOp, Ops, UOp
from ember.uop.symbolic import symbolic
from ember.uop.upat import PatternMatcher, UPat, graph_rewrite, substitute

PERIOD_LIMIT = 12  # the largest period unrolled (its copies multiply the loop body): a banded CSC pattern repeats
# every (band width) x (colors) nonzeros, 9 for a tridiagonal one
PEEL_LIMIT = 8  # the most steps peeled off at each end of a loop
PEEL_PERIODS = 2  # the most whole periods peeled off at each end of the unrolled loop
SPLIT_WORK = 1 << 18  # nodes times copies (peeled steps and one period) past which a loop stays as it is: each copy
# is the loop body rewritten, and a multiple-shooting hessian's body of 48,000 nodes made 35 copies (minutes)


def linear_in(x: UOp, r: UOp) -> tuple[int, int] | None:
    """(a, k) where x is `a*r + k` with constants a > 0 and k, else None."""
    if x is r: return 1, 0
    if x.op is Ops.MUL and r in x.src:
        other = x.src[1] if x.src[0] is r else x.src[0]
        return (int(other.arg), 0) if other.op is Ops.CONST and other.arg > 0 else None
    if x.op is Ops.ADD:
        for y, c in ((x.src[0], x.src[1]), (x.src[1], x.src[0])):
            if c.op is Ops.CONST and (lin := linear_in(y, r)) is not None: return lin[0], lin[1] + int(c.arg)
    return None


def period_of(nodes: list[UOp], r: UOp) -> int | None:
    """The period of the remainders of r that the stores compare: the lcm of the small constant divisors of the
    MODs over r whose value feeds a comparison (a remainder that only forms an address is not worth unrolling)."""
    compared = {s for u in nodes if u.op in GroupOp.Comparison for s in u.src if s.op is Ops.MOD}
    divisors = {int(m.src[1].arg) for m in compared if m.src[1].op is Ops.CONST and 2 <= m.src[1].arg <= PERIOD_LIMIT
                and r in m.src[0].ranges}
    if not divisors: return None
    period = math.lcm(*divisors)
    return period if period <= PERIOD_LIMIT else None


def uniform_steps(nodes: list[UOp], r: UOp, size: int, limit: int) -> tuple[int, int]:
    """[lo, hi): the steps of r in which every comparison of `a*r + k` with a constant has one answer and every
    remainder of `a*r + k` by a constant m has a dividend in [0, m), as far as the steps that break this lie within
    `limit` steps of an end (a remainder that wraps in the middle is the period itself, not an end to peel)."""
    lows, highs = [0], [size]
    for u in nodes:
        if u.op is Ops.CMPLT:
            x, y = u.src
            if y.op is Ops.CONST and (lin := linear_in(x, r)): highs.append(-(-(int(y.arg) - lin[1]) // lin[0]))
            if x.op is Ops.CONST and (lin := linear_in(y, r)): lows.append((int(x.arg) - lin[1]) // lin[0] + 1)
        if u.op is Ops.MOD and u.src[1].op is Ops.CONST and (lin := linear_in(u.src[0], r)):
            (a, k), m = lin, int(u.src[1].arg)
            lows.append(-(k // a))
            if m > PERIOD_LIMIT: highs.append(-(-(m - k) // a))  # a small divisor wraps every period: it folds
    lo = max(v for v in lows if v <= min(limit, size))
    hi = min(v for v in highs if max(size - limit, 0) <= v)
    return lo, max(lo, hi)


pm_fold = symbolic + pm_simplify_gated_index + PatternMatcher([
    (UPat(Ops.INDEX, src=(UPat(Ops.DEFINE_GLOBAL, name="g"), UPat.var("i"), UPat.const(dtypes.bool, True)), name="x"),
     lambda x, g, i: UOp(Ops.INDEX, x.dtype, (g, i))),
])


def at_step(stores: list[UOp], r: UOp, value: UOp) -> list[UOp]:
    """The stores with r replaced by `value`, simplified (in one rewrite: the stores share most of their graph)."""
    return list(graph_rewrite(substitute(UOp(Ops.SINK, dtypes.void, tuple(stores)), {r: value}), pm_fold).src)


def reroll(copies: list[list[UOp]], q: UOp) -> list[UOp] | None:
    """The unrolled period as a loop over groups of its copies, where those groups are alike but for their
    addresses, or None.

    Folded, the copies often differ only by where they read and write: the Bratu jacobian's period is 3 times the
    same column (the remainders picked each copy's entries, and the entries have the same formulas). A loop over
    columns, `u` in place of `groups*q + g`, is the same work in a form C compilers vectorize (unit- and
    small-stride streams; they do not vectorize the period's copies, whose loads overlap). Each group size d
    dividing the period is tried, smallest first: the first group's stores, with every `a*q` written
    `(a/groups)*u`, must give group g's stores exactly at `u = groups*q + g`, folded."""
    period, steps = len(copies), int(q.src[0].arg)
    for d in (d for d in range(1, period) if period % d == 0):
        groups = period // d
        u = UOp.range(UOp.const(q.dtype, steps * groups), q.arg.axis, q.arg.kind, q.dtype)
        groups_stores = [[st for copy in copies[g * d:(g + 1) * d] for st in copy] for g in range(groups)]
        # first what is cheap to compare: the float operations each group computes, which a rerolled loop keeps
        # (a multiple-shooting jacobian's body of 7,000 nodes a copy stores another row's sweep in each color)
        if len({float_work(stores) for stores in groups_stores}) > 1: continue
        first = UOp(Ops.SINK, dtypes.void, tuple(groups_stores[0]))
        scaled: dict[UOp, UOp] = {}
        for n in first.toposort():
            if n.op is Ops.MUL and q in n.src and (c := n.src[1] if n.src[0] is q else n.src[0]).op is Ops.CONST \
                    and c.arg % groups == 0:
                scaled[n] = u if c.arg == groups else u * (c.arg // groups)
        body = substitute(first, scaled)
        if any(q in n.src for n in body.toposort()): continue  # q in another form: not affine in u
        if all(at_step(list(body.src), u, q * groups + g) == stores for g, stores in enumerate(groups_stores)):
            return list(body.src)
    return None


PATH_PRIME = (1 << 61) - 1


def float_work(stores: list[UOp]) -> tuple[int, ...]:
    """How many float operations each stored value is made of, counted once per path to it."""
    sizes: dict[UOp, int] = {}
    for u in UOp(Ops.SINK, dtypes.void, tuple(stores)).toposort():  # (a count over paths, modulo a prime: cheap,
        sizes[u] = (int(u.dtype.is_float) + sum(sizes[s] for s in u.src)) % PATH_PRIME  # and enough to compare)
    return tuple(sizes[st.src[1]] for st in stores)


def split(stores: list[UOp], r: UOp, period: int, lo: int, hi: int) -> tuple[list[UOp], UOp]:
    """The stores over r as the steps before lo and from the last whole period on, peeled, and a new RANGE over
    the whole periods between, `period` copies each; and that RANGE."""
    size, periods = int(r.src[0].arg), (hi - lo) // period
    q = UOp.range(UOp.const(r.dtype, periods), r.arg.axis, r.arg.kind, r.dtype)
    body = [st for s in range(period) for st in at_step(stores, r, q * period + (lo + s) if period > 1 else q + lo)]
    peeled = [st for c in [*range(lo), *range(lo + periods * period, size)] for st in at_step(stores, r,
                                                                                              r.const_like(c))]
    return peeled + body, q


def split_periodic(sink: UOp) -> UOp:
    """The kernel with each eligible loop run period by period (see the module docstring)."""
    if any(u.op is Ops.REDUCE for u in sink.toposort()): return sink
    stores = [s for s in sink.src if s.op is Ops.STORE]
    for r in dict.fromkeys(rng for s in stores for rng in s.ranges):
        mine = [s for s in stores if r in s.ranges]
        if r.arg.kind is not AxisKind.GLOBAL or any(s.ranges != (r,) for s in mine): continue
        nodes = list(UOp(Ops.SINK, dtypes.void, tuple(mine)).toposort())
        if (p := period_of(nodes, r)) is None: continue
        lo, hi = uniform_steps(nodes, r, int(r.src[0].arg), PEEL_LIMIT)
        if (hi - lo) // p < 2 or len(nodes) * (lo + p + int(r.src[0].arg) - hi) > SPLIT_WORK: continue
        new, q = split(mine, r, p, lo, hi)
        # the periods at the ends may still hold a gate or a wrapping remainder: peel those periods off too
        periodic = [st for st in new if q in st.ranges]
        nodes = list(UOp(Ops.SINK, dtypes.void, tuple(periodic)).toposort())
        qlo, qhi = uniform_steps(nodes, q, int(q.src[0].arg), PEEL_PERIODS)
        if (qlo, qhi) != (0, int(q.src[0].arg)) and qhi - qlo >= 1:
            peeled, q = split(periodic, q, 1, qlo, qhi)
            new = [st for st in new if st not in periodic] + peeled
            periodic = [st for st in new if q in st.ranges]
        if (rolled := reroll([periodic[i:i + len(mine)] for i in range(0, len(periodic), len(mine))], q)):
            new = [st for st in new if st not in periodic] + rolled
        sink = sink.replace(src=tuple([s for s in sink.src if s not in mine] + new))
        stores = [s for s in sink.src if s.op is Ops.STORE]
    return sink
