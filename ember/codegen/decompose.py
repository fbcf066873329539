"""Ops a renderer lacks, rewritten into ops it has (Renderer.supported_ops). Runs after lower, before linearize.

Before: a lowered kernel that may hold any ALU op. After: only ops in `renderer.supported_ops`, each rewrite giving
the same bits as the op it replaces (a - b is a + -b; 1/x is 1 / x; a == b is !(a != b); an integer a * b + c),
or a NotImplementedError naming the renderer and the op where no exact rewrite exists.
"""

from __future__ import annotations

from ember.dtype import dtypes
from ember.renderer import Renderer
from ember.uop.ops import GroupOp, Ops, UOp
from ember.uop.upat import PatternMatcher, UPat, graph_rewrite

# op -> the ops its rewrite uses
NEEDS = {Ops.SUB: {Ops.ADD, Ops.NEG}, Ops.RECIPROCAL: {Ops.FDIV}, Ops.CMPEQ: {Ops.CMPNE, Ops.XOR},
         Ops.NEG: {Ops.MUL}, Ops.MULACC: {Ops.MUL, Ops.ADD}}


def lacking(ctx: Renderer, x: UOp) -> bool:
    return x.op not in ctx.supported_ops


pm_decompose = PatternMatcher([
    (UPat(Ops.SUB, name="x"),
     lambda ctx, x: UOp(Ops.ADD, x.dtype, (x.src[0], UOp(Ops.NEG, x.dtype, (x.src[1],)))) if lacking(ctx, x) else None),
    (UPat(Ops.RECIPROCAL, name="x"),
     lambda ctx, x: UOp(Ops.FDIV, x.dtype, (UOp.const(x.dtype, 1), x.src[0])) if lacking(ctx, x) else None),
    (UPat(Ops.CMPEQ, name="x"), lambda ctx, x: UOp(Ops.XOR, dtypes.bool, (UOp(Ops.CMPNE, dtypes.bool, x.src),
                                                                          UOp.const(dtypes.bool, True)))
     if lacking(ctx, x) and x.dtype.count == 1 else None),
    (UPat(Ops.NEG, name="x"), lambda ctx, x: UOp(Ops.MUL, x.dtype, (x.src[0], UOp.const(x.dtype, -1)))
     if lacking(ctx, x) and x.dtype.count == 1 else None),  # (-1 * x: the bits of -x, a NaN's sign aside)
    (UPat(Ops.MULACC, name="x"), lambda ctx, x: UOp(Ops.ADD, x.dtype, (UOp(Ops.MUL, x.dtype, x.src[:2]), x.src[2]))
     if lacking(ctx, x) and not x.dtype.is_float else None),  # (a float's is fused: one rounding, not two)
])


def decompose(sink: UOp, renderer: Renderer) -> UOp:
    """`sink` with the ALU ops `renderer` lacks rewritten (see the module docstring); unchanged where it has all."""
    missing = {u.op for u in sink.toposort() if u.op in GroupOp.ALU and u.op not in renderer.supported_ops}
    if not missing: return sink
    sink = graph_rewrite(sink, pm_decompose, ctx=renderer, name="decompose")
    if left := sorted(op.name for op in {u.op for u in sink.toposort()} if op in GroupOp.ALU and
                      op not in renderer.supported_ops):
        raise NotImplementedError(f"{type(renderer).__name__} ({renderer.device}): no {', '.join(left)}, and no "
                                  "exact rewrite into ops it has")
    return sink
