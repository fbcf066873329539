"""Index-set splitting: a loop whose stores compare its index with constants inside its range runs as one loop per
stretch between those constants, each with its comparisons folded; stretches of one length share one loop.
Runs after rangeify, before split_periodic and the opts.

Before: rangeify's `SINK(STORE, ...)`, STOREs over RANGEs, no REDUCE.
After:  the same, except that a loop `r` of N steps whose stores (over r alone) compare `a*r + k` with constants
        that fall inside [1, N), one of them more than PEEL_LIMIT steps from either end, is cut at those points (at
        most SEGMENT_LIMIT stretches): r = b + j in the stretch [b, b + L), j a RANGE over L; a stretch of at most
        PEEL_STEPS steps is unrolled, its steps constants. The symbolic rules fold each stretch with the bounds of
        j: its comparisons become constants, its gates true, and the branches the other stretches take vanish.
        Stretches of equal length L use one RANGE over L: their stores land in one loop body, where what they
        compute alike (same loads at the same j) is one node. A loop cut only near its ends (a padded stencil)
        is left whole: its vector lanes need a size the opts can divide, and split_periodic peels periodic ones.

Why: a derivative assembled from pieces is a concatenation: the gradient of f(angle, rate, torque) with respect
to w = (angle, rate, torque) pads each piece into w's positions, and one loop over w computes, at every position,
every piece, of which the gates keep one. The pieces of a multiple-shooting problem are alike, per interval: the
hessian of its Lagrangian computed all three pieces (each an RK4 step and its sines) for each of 152 positions,
3344 sines and cosines, where splitting leaves one loop over the 50 intervals with the three pieces' stores
sharing one RK4 step (and with arithmetic seeds, each color's tangents folded to the entries that are not zero):

    for r in 0..152: out[r] = (r < 50 ? g(w[r]) : 0) + (50 < r && r < 101 ? h(w[r - 51]) : 0)
 -> for j in 0..50: { out[j] = g(w[j]); out[51 + j] = h(w[j]); }  out[50] = 0; out[101] = 0

A stored gradient of that form is now split before rangeify, on the tensor graph (codegen/stores.py: a sum of padded
pieces), which costs a walk over the sum instead of a rewrite of the loop body per stretch; this pass cuts what is
left, comparisons the tensor graph does not show as pieces (a seed's runs compared with a position).
"""

from __future__ import annotations

from collections.abc import Iterable

from ember.codegen.periodic import PEEL_LIMIT, at_step, linear_in
from ember.dtype import dtypes
from ember.uop.ops import AxisKind, Ops, UOp

SEGMENT_LIMIT = 8  # the most stretches one loop is cut into (each may copy the loop body)
PEEL_STEPS = 2  # a stretch of at most this many steps is unrolled, not a loop


def cuts(nodes: Iterable[UOp], r: UOp) -> list[int]:
    """The points 1 <= b < size of r where a comparison of `a*r + k` with a constant changes its answer, sorted."""
    size, points = int(r.src[0].arg), set()
    for u in nodes:
        if u.op is Ops.CMPLT:
            x, y = u.src
            if y.op is Ops.CONST and (lin := linear_in(x, r)):  # a*r + k < c  <=>  r < ceil((c - k) / a)
                points.add(-(-(int(y.arg) - lin[1]) // lin[0]))
            if x.op is Ops.CONST and (lin := linear_in(y, r)):  # c < a*r + k  <=>  r >= floor((c - k) / a) + 1
                points.add((int(x.arg) - lin[1]) // lin[0] + 1)
        elif u.op in (Ops.CMPNE, Ops.CMPEQ):
            for x, y in (u.src, u.src[::-1]):
                if y.op is Ops.CONST and (lin := linear_in(x, r)) and (int(y.arg) - lin[1]) % lin[0] == 0:
                    at = (int(y.arg) - lin[1]) // lin[0]  # a*r + k == c at one step: a stretch of its own
                    points.update((at, at + 1))
    return sorted(p for p in points if 0 < p < size)


def split_stretches(stores: list[UOp], r: UOp, points: list[int], next_axis: int) -> list[UOp]:
    """The stores over r as one copy per stretch between `points`: stretches of one length over one new RANGE
    (axis ids from next_axis on), short ones unrolled."""
    bounds = [0, *points, int(r.src[0].arg)]
    loops: dict[int, UOp] = {}
    out: list[UOp] = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if hi - lo <= PEEL_STEPS:
            out += [st for step in range(lo, hi) for st in at_step(stores, r, r.const_like(step))]
            continue
        if (j := loops.get(hi - lo)) is None:
            j = loops[hi - lo] = UOp.range(UOp.const(r.dtype, hi - lo), next_axis + len(loops), r.arg.kind, r.dtype)
        out += at_step(stores, r, j + lo if lo else j)
    return out


def split_segments(sink: UOp) -> UOp:
    """The kernel with each eligible loop cut into stretches (see the module docstring)."""
    if any(u.op is Ops.REDUCE for u in sink.toposort()): return sink
    next_axis = max((u.arg.axis for u in sink.toposort() if u.op is Ops.RANGE), default=-1) + 1
    stores = [s for s in sink.src if s.op is Ops.STORE]
    for r in dict.fromkeys(rng for s in stores for rng in s.ranges):
        mine = [s for s in stores if r in s.ranges]
        if r.arg.kind is not AxisKind.GLOBAL or r.src[0].op is not Ops.CONST or any(s.ranges != (r,) for s in mine):
            continue
        points, size = cuts(UOp(Ops.SINK, dtypes.void, tuple(mine)).toposort(), r), int(r.src[0].arg)
        if len(points) + 1 > SEGMENT_LIMIT or not any(PEEL_LIMIT < p < size - PEEL_LIMIT for p in points): continue
        new = split_stretches(mine, r, points, next_axis)
        next_axis += len(points) + 1
        sink = sink.replace(src=tuple([s for s in sink.src if s not in mine] + new))
        stores = [s for s in sink.src if s.op is Ops.STORE]
    return sink
