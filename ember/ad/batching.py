"""Batching: a traced tensor graph rewritten to carry one more axis in front. vmap and forward mode stand on it.

`lift(roots, subst, size)` walks the graph below `roots` bottom-up, replacing the nodes of `subst`. A node is
*batched* when something it reads is: its lifted version has shape `(size, *shape)` and computes, for each index
of the new axis, what the node computed. Nodes that read nothing batched are left alone (computed once, shared by
every batch element). `pm_lift` holds one rule per op saying how its lifted version reads its lifted sources:
elementwise ops broadcast their unbatched operands, movement ops and reductions shift their axes by one, a GATHER
with batched indices reads its own batch element.

Before: a tensor-level graph (ALU, movement, REDUCE_AXIS, GATHER, CONTIGUOUS over BUFFERs, CONSTs and ARANGEs).
After:  the same ops, one more axis on every batched node; a batched axis is a loop in the kernels it lands in, so
        the code does not grow with `size`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ember.device import Device
from ember.dtype import dtypes
from ember.uop.fold import fold_parts
from ember.uop.ops import GroupOp, Ops, UOp
from ember.uop.upat import PatternMatcher, UPat


@dataclass(frozen=True)
class Lifting:
    """What a lifting rule sees besides the node: the batch size and the node's sources, lifted where batched."""

    size: int
    srcs: tuple[UOp, ...]
    batched: tuple[bool, ...]


def broadcast_front(u: UOp, size: int) -> UOp:
    """An unbatched node read by a batched one: the same value for every batch element."""
    return UOp(Ops.EXPAND, u.dtype, (UOp(Ops.RESHAPE, u.dtype, (u,), (1, *u.shape)),), (size, *u.shape))


def lift_elementwise(ctx: Lifting, u: UOp) -> UOp:
    srcs = tuple(s if b else broadcast_front(s, ctx.size) for s, b in zip(ctx.srcs, ctx.batched, strict=True))
    return UOp(u.op, u.dtype, srcs, u.arg)


def lift_gather(ctx: Lifting, u: UOp) -> UOp:
    """GATHER(x, idx) along axis a. Unbatched indices read the same positions of every batch element. Batched
    indices read their own element: x's batch axis and axis a are merged into one, each index offset by b * n."""
    from ember.tensor import Tensor
    (x, idx), (x_batched, idx_batched), a = ctx.srcs, ctx.batched, u.arg
    if not idx_batched: return UOp(Ops.GATHER, u.dtype, (x, idx), a + 1)
    t = Tensor._from_uop(x if x_batched else broadcast_front(x, ctx.size), Device.DEFAULT)
    n, k = t.shape[a + 1], len(idx.shape) - 1
    merged = t.permute(0, a + 1, *range(1, a + 1), *range(a + 2, t.ndim)).flatten(0, 1)
    i = Tensor._from_uop(idx, Device.DEFAULT)
    batch = Tensor.arange(ctx.size, dtype=i.dtype).reshape((ctx.size,) + (1,) * k)
    flat = ((i > -1) & (i < n)).where(i + batch * n, -1)  # an index outside its axis still reads 0
    out = UOp(Ops.GATHER, u.dtype, (merged.uop, flat.uop), 0)  # (size, *idx axes, *x axes but a)
    order = (0, *range(1 + k, 1 + k + a), *range(1, 1 + k), *range(1 + k + a, len(out.shape)))
    return UOp(Ops.PERMUTE, u.dtype, (out,), order)


def lift_fold(ctx: Lifting, u: UOp) -> UOp:
    """A batched FOLD is one FOLD whose batched carries and xs hold the batch side by side (B*C_i, B*X_i); the body
    is lifted over the batch, so each step is one evaluation for every element, and what does not depend on the
    batch (a carry no batched value reaches) stays unbatched, computed once. A carry is batched when its start is
    or when its next value is: found by lifting the body until no more carries turn batched."""
    from ember.scan import join, make_fold, split
    from ember.tensor import Tensor
    a, b = u.arg, ctx.size
    y, n = a.y_size, a.length
    carry0, xs, params = fold_parts(u)
    lifted = dict(zip(u.src, zip(ctx.srcs, ctx.batched, strict=True), strict=True))
    sizes = [s.shape[0] for s in carry0]
    def tensor(v: UOp) -> Tensor: return Tensor._from_uop(v, Device.DEFAULT)
    batched = [lifted[s][1] for s in carry0]
    rows_batched = [lifted[r][1] for r in xs]
    changed = True
    while changed:
        probe = _lift_body(a, b, batched, rows_batched, [lifted[p] for p in params])
        now = [bt or nb for bt, nb in zip(batched, probe, strict=True)]
        changed, batched = now != batched, now
    starts = [tensor(v if bt0 else broadcast_front(v, b)).flatten() if bt else tensor(v)
              for (v, bt0), bt in zip((lifted[s] for s in carry0), batched, strict=True)]
    rows = [tensor(v).permute(1, 0, 2).flatten(1) if bt else tensor(v) for v, bt in (lifted[r] for r in xs)]

    def body(carry: list[Tensor], row: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        subst = {ph: ((t.reshape(b, m).uop, True) if bt else (t.uop, False))
                 for ph, t, m, bt in zip(a.carry, carry, sizes, batched, strict=True)}
        subst |= {ph: ((t.reshape(b, -1).uop, True) if bt else (t.uop, False))
                  for ph, t, bt in zip(a.x, row, rows_batched, strict=True)}
        subst |= {ph: lifted[p] for ph, p in zip(a.params, params, strict=True)}
        outs = lift(list(a.out), subst, b)
        nxt = [tensor(v if vb else broadcast_front(v, b)).flatten() if bt else tensor(v)
               for (v, vb), bt in zip(outs[:-1], batched, strict=True)]
        ys, ys_batched = outs[-1]
        return nxt, tensor(ys if ys_batched else broadcast_front(ys, b)).flatten()

    res = make_fold(n, starts, rows, body)
    widths = [b * m if bt else m for m, bt in zip(sizes, batched, strict=True)]
    final = [t.reshape(b, m) if bt else broadcast_front(t.uop, b) for t, m, bt in
             zip(split(res[:sum(widths)], widths), sizes, batched, strict=True)]
    ys = res[sum(widths):].reshape(n, b, y).permute(1, 0, 2).reshape(b, n * y)
    return join([t if isinstance(t, Tensor) else tensor(t) for t in final] + [ys], axis=1).uop


def _lift_body(a: Any, b: int, batched: list[bool], rows_batched: list[bool], params: list[tuple[UOp, bool]]
               ) -> list[bool]:
    """Which of the body's next carries depend on the batch, given which carries and xs do."""
    subst = {ph: (broadcast_front(ph, b), True) if bt else (ph, False) for ph, bt in zip(a.carry, batched, strict=True)}
    subst |= {ph: (broadcast_front(ph, b), True) if bt else (ph, False) for ph, bt in zip(a.x, rows_batched,
                                                                                          strict=True)}
    subst |= dict(zip(a.params, params, strict=True))
    return [bt for _, bt in lift(list(a.out[:-1]), subst, b)]


def lift_scatter_add(ctx: Lifting, u: UOp) -> UOp:
    """SCATTER_ADD(src, idx) along axis a into n positions. Unbatched indices add every batch element's src alike.
    Batched indices add into their own element: the batch axis joins the index axes and the n positions become
    size * n, each index offset by b * n (the transpose of lift_gather's merge)."""
    from ember.tensor import Tensor
    (src, idx), (src_batched, idx_batched), a, n = ctx.srcs, ctx.batched, u.arg.axis, u.arg.size
    if not idx_batched: return UOp(Ops.SCATTER_ADD, u.dtype, (src, idx), type(u.arg)(a + 1, n))
    t = Tensor._from_uop(src if src_batched else broadcast_front(src, ctx.size), Device.DEFAULT)
    k = len(idx.shape) - 1
    moved = t.permute(*range(1, a + 1), 0, *range(a + 1, t.ndim))  # (lead, size, *idx axes, trail)
    i = Tensor._from_uop(idx, Device.DEFAULT)
    batch = Tensor.arange(ctx.size, dtype=i.dtype).reshape((ctx.size,) + (1,) * k)
    flat = ((i > -1) & (i < n)).where(i + batch * n, -1)  # an index outside its axis still adds nowhere
    out = Tensor._from_uop(UOp(Ops.SCATTER_ADD, u.dtype, (moved.uop, flat.uop), type(u.arg)(a, ctx.size * n)),
                           Device.DEFAULT)
    split = out.reshape(out.shape[:a] + (ctx.size, n) + out.shape[a + 1:])
    return split.permute(a, *range(a), *range(a + 1, split.ndim)).uop


pm_lift = PatternMatcher([
    (UPat(Ops.VJP), lambda ctx: ctx.srcs[0] if ctx.batched[0] else broadcast_front(ctx.srcs[0], ctx.size)),
    (UPat(Ops.FOLD, name="u"), lift_fold),
    (UPat(GroupOp.Elementwise | {Ops.CONTIGUOUS, Ops.COPY, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD}, name="u"),
     lift_elementwise),
    (UPat(Ops.RESHAPE, name="u"), lambda ctx, u: UOp(Ops.RESHAPE, u.dtype, ctx.srcs, (ctx.size, *u.arg))),
    (UPat(Ops.EXPAND, name="u"), lambda ctx, u: UOp(Ops.EXPAND, u.dtype, ctx.srcs, (ctx.size, *u.arg))),
    (UPat(Ops.PERMUTE, name="u"), lambda ctx, u: UOp(Ops.PERMUTE, u.dtype, ctx.srcs, (0, *(a + 1 for a in u.arg)))),
    (UPat(Ops.PAD, name="u"), lambda ctx, u: UOp(Ops.PAD, u.dtype, ctx.srcs, ((0, 0), *u.arg))),
    (UPat(Ops.SHRINK, name="u"), lambda ctx, u: UOp(Ops.SHRINK, u.dtype, ctx.srcs, ((0, ctx.size), *u.arg))),
    (UPat(Ops.FLIP, name="u"), lambda ctx, u: UOp(Ops.FLIP, u.dtype, ctx.srcs, (False, *u.arg))),
    (UPat(Ops.REDUCE_AXIS, name="u"), lambda ctx, u:
     UOp(Ops.REDUCE_AXIS, u.dtype, ctx.srcs, (u.arg[0], tuple(a + 1 for a in u.arg[1])))),
    (UPat(Ops.GATHER, name="u"), lift_gather),
    (UPat(Ops.SCATTER_ADD, name="u"), lift_scatter_add),
])


def lift_node(u: UOp, srcs: Sequence[tuple[UOp, bool]], size: int) -> UOp:
    """u's lifted version, given its sources as (node, batched); at least one must be batched."""
    ctx = Lifting(size, tuple(s for s, _ in srcs), tuple(b for _, b in srcs))
    out = pm_lift.rewrite(u, ctx=ctx)
    if out is None: raise NotImplementedError(f"vmap: no batching rule for {u.op.name}")
    assert out.shape == (size, *u.shape), f"lifting {u.op.name}: {out.shape} != {(size, *u.shape)}"
    return out


def lift(roots: Sequence[UOp], subst: dict[UOp, tuple[UOp, bool]], size: int) -> list[tuple[UOp, bool]]:
    """Each root rebuilt over subst's replacements (node, batched): (lifted root, whether it is batched)."""
    done: dict[UOp, tuple[UOp, bool]] = dict(subst)
    sink = UOp(Ops.SINK, dtypes.void, tuple(roots))
    for u in sink.toposort(descend=lambda n: n not in subst):
        if u in done or u is sink: continue
        srcs = [done.get(s, (s, False)) for s in u.src]
        if any(b for _, b in srcs): done[u] = (lift_node(u, srcs, size), True)
        elif any(n is not s for (n, _), s in zip(srcs, u.src, strict=True)):
            done[u] = (u.replace(src=tuple(n for n, _ in srcs)), False)
        else: done[u] = (u, False)
    return [done[r] for r in roots]
