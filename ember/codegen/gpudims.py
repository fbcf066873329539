"""The launch grid: a kernel's output loops become thread indices on a device with workgroups (Renderer.has_local).

Before: an optimized kernel (opts applied) whose output loops are RANGEs: kinds GLOBAL and LOOP, and LOCAL where a
        LOCAL opt split off the threads of a workgroup, WARP where a TC opt spread a matmul over a warp.
After:  the output loops that every store sits in and whose size is known replaced by SPECIAL nodes: `gidx<d>`, the
        index of the thread's workgroup in grid dimension d, and `lidx<d>`, the thread's index in its workgroup. The
        innermost loop is dimension 0 (x: the dimension with the largest limit on CUDA). The rest stay loops that
        each thread runs: reduce loops, a symbolic size's loop, a loop only some outputs have.

    for r0 in 0..4, for r1 in 0..64 (LOCAL 16: r1 = r1o*16 + l2)  ->  gidx1 in 0..4, gidx0 in 0..4, lidx0 in 0..16

More than three loops of one kind share the last dimension: one index over the product of their sizes, each loop
its quotient and remainder. A loop longer than the device's limit for its dimension stays a loop.
"""

from __future__ import annotations

import math

from ember.dtype import dtypes
from ember.renderer import Renderer
from ember.uop.ops import AxisKind, Ops, UOp
from ember.uop.symbolic import symbolic
from ember.uop.upat import PatternMatcher, UPat, graph_rewrite, substitute

GRID_KINDS = (AxisKind.GLOBAL, AxisKind.LOOP)

# a thread index is below its dimension's size, by construction: what range analysis cannot see where the size is
# symbolic (its vmax is the variable's maximum, not the size)
pm_launch_bounds = PatternMatcher([
    (UPat(Ops.SPECIAL, name="i") % UPat.var("s"), lambda i, s: i if i.src[0] is s else None),
    (UPat(Ops.SPECIAL, name="i") // UPat.var("s"), lambda i, s: UOp.const(i.dtype, 0) if i.src[0] is s else None),
    (UPat(Ops.SPECIAL, name="i") < UPat.var("s"), lambda i, s: UOp.const(dtypes.bool, True) if i.src[0] is s else None),
])


def map_launch(sink: UOp, renderer: Renderer) -> UOp:
    """`sink` with its output loops made thread indices (see the module docstring); unchanged off a GPU."""
    if not renderer.has_local: return sink
    stores = [u for u in sink.toposort() if u.op is Ops.STORE]
    if not stores: return sink
    common = sorted(set(stores[0].ranges).intersection(*(st.ranges for st in stores[1:])), key=lambda r: r.arg.axis,
                    reverse=True)
    grid = [r for r in common if r.arg.kind in GRID_KINDS]
    # a tensor core's warp lanes are thread index 0 (the hardware's lane is threadIdx.x % 32), the LOCALs after it
    local = [r for r in common if r.arg.kind is AxisKind.WARP] + \
        [r for r in common if r.arg.kind is AxisKind.LOCAL and r.src[0].op is Ops.CONST]
    mapping = indices(grid, "gidx", renderer.global_max) | indices(local, "lidx", renderer.local_max)
    if not mapping: return sink
    return graph_rewrite(substitute(sink, mapping), symbolic + pm_launch_bounds, name="launch grid")


def indices(loops: list[UOp], prefix: str, limits: tuple[int, ...]) -> dict[UOp, UOp]:
    """Each of `loops` (innermost first) -> its thread index: one dimension each while there are dimensions, the
    outermost sharing the last one; a loop that does not fit its dimension's limit is left out (it stays a loop). A
    loop of symbolic size (a batch) gets a dimension of its own, of its symbolic size (at its maximum within the
    limit), and shares none."""
    def most(r: UOp) -> int: return int(r.src[0].vmax)
    loops = [r for r in loops if most(r) <= max(limits, default=0)]
    mapping: dict[UOp, UOp] = {}
    for d in range(min(len(loops), len(limits))):
        group = loops[d:d + 1] if d < len(limits) - 1 else loops[d:]  # the last dimension takes the outer rest
        if len(group) > 1: group = [r for r in group if r.src[0].op is Ops.CONST]  # (a symbolic one shares none)
        while group and math.prod(most(r) for r in group) > limits[d]: group = group[:-1]
        if not group: continue
        size = math.prod(most(r) for r in group) if len(group) > 1 else group[0].src[0]
        size = size if isinstance(size, UOp) else UOp.const(group[0].dtype, size)
        index = UOp(Ops.SPECIAL, group[0].dtype, (size,), f"{prefix}{d}")
        stride = 1
        for r in group:  # innermost first: the fastest-moving part of the index
            n = most(r)
            mapping[r] = (index // stride) % n if len(group) > 1 else index
            stride *= n
    return mapping
