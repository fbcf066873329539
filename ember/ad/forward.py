"""Forward mode: tangents pushed through a traced tensor graph, many directions at once.

`tangents(roots, seeds, size)` gives every float node that depends on a seeded node a tangent of shape
`(size, *shape)`: row k is the node's directional derivative along the k-th seed direction. A jacobian is one
forward pass whose seeds are the unit vectors (or, for a sparse one, one combined direction per color), with
the directions as a batch axis: one loop in the kernels, not one pass per direction.

The rules need no table of their own. A linear op (movement, sum, GATHER, CONTIGUOUS) maps tangents as it maps
values, so its tangent is its lifted version (ad/batching.py) applied to its source's tangent. Any other op's
tangent is the sum over its sources of tangent times partial derivative, and the partials are what the reverse-mode
rules (`pm_gradient`) return for an incoming gradient of ones.

The tangent arithmetic (tangent x partial, sums, negations) is marked TANGENT: a zero there is a structural zero
(uop/symbolic.py, pm_structural_zeros). Once codegen sees a seed's zeros as constants (an unrolled output, a
periodic coloring), the terms they start vanish, as a sparse AD tool writes them: an entry is not NaN because another
partial along the same direction is inf, and the code holds only the terms each entry needs. Values differ from
the IEEE evaluation only there and in the sign of a zero.
"""

from __future__ import annotations

from collections.abc import Sequence

from ember.ad.batching import lift_node
from ember.device import Device
from ember.dtype import dtypes
from ember.gradient import pm_gradient, tangent_op
from ember.scan import join, make_fold, split
from ember.tensor import Tensor
from ember.uop.fold import body_with, fold_parts
from ember.uop.ops import TANGENT, GroupOp, Ops, UOp

LINEAR = GroupOp.Movement | {Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.COPY, Ops.GATHER, Ops.SCATTER_ADD}


def as_tensor(u: UOp) -> Tensor:
    """A tensor-level node as a Tensor, so rules can use Tensor arithmetic."""
    return Tensor._from_uop(u, Device.DEFAULT)


def tangent_of(u: UOp, tans: dict[UOp, UOp], size: int) -> UOp | None:
    """u's tangent from its sources' tangents (None: u does not move along any seed direction)."""
    have = [s in tans for s in u.src]
    if u.op is Ops.DETACH or not any(have): return None
    if u.op is Ops.FOLD: return foldtangent_op(u, tans, size)
    if u.op is Ops.VJP: return tans.get(u.src[0])  # its value's own tangent (the pull is reverse mode's)
    if u.op in LINEAR or (u.op is Ops.REDUCE_AXIS and u.arg[0] is Ops.ADD):
        if not have[0]: return None  # a GATHER's (a SCATTER_ADD's) indices have no derivative
        return lift_node(u, [(tans[u.src[0]], True), *((s, False) for s in u.src[1:])], size)
    t = {s: as_tensor(tans[s]) for s in u.src if s in tans}
    if u.op is Ops.ADD: return _sum([t.get(s) for s in u.src])
    if u.op is Ops.SUB: return _sum([t.get(u.src[0]), _neg(t[u.src[1]]) if u.src[1] in t else None])
    if u.op is Ops.NEG: return _neg(t[u.src[0]]).uop
    if u.op is Ops.WHERE:
        zero = next(iter(t.values())).zeros_like()
        return as_tensor(u.src[0]).where(t.get(u.src[1], zero), t.get(u.src[2], zero)).uop
    partials = pm_gradient.rewrite(u, ctx=Tensor.ones(*u.shape, dtype=u.dtype))
    if partials is None: raise NotImplementedError(f"forward mode: no derivative rule for {u.op.name}")
    if u.op is Ops.REDUCE_AXIS:  # max or prod: a sum of the tangents weighted by d out / d x
        weighted = tangent_op(Ops.MUL, t[u.src[0]], partials[0]).uop
        return lift_node(u.replace(src=(u.src[0],), arg=(Ops.ADD, u.arg[1])), [(weighted, True)], size)
    terms = [tangent_op(Ops.MUL, t[s], p).cast(u.dtype) for s, p in zip(u.src, partials, strict=True)
             if s in t and p is not None]
    return _sum(terms)


def foldtangent_op(u: UOp, tans: dict[UOp, UOp], size: int) -> UOp:
    """A FOLD's tangent is a FOLD carrying the tangents beside the values: one more carry per carry (its `size`
    tangents, flat) and one more xs per xs that has tangents; each step's y is followed by its tangents. Params'
    tangents are read as params. The value is split back into (size, C + length*Y)."""
    a, k = u.arg, size
    c, y, n = a.carry_size, a.y_size, a.length
    carry0, xs, params = fold_parts(u)
    sizes = [s.shape[0] for s in carry0]
    moving = [i for i, r in enumerate(xs) if r in tans]
    starts = [as_tensor(s) for s in carry0] + [as_tensor(tans[s]).flatten() if s in tans else
                                                 Tensor.zeros(k * m, dtype=u.dtype) for s, m in zip(carry0, sizes,
                                                                                                  strict=True)]
    rows = [as_tensor(r) for r in xs] + [as_tensor(tans[xs[i]]).permute(1, 0, 2).flatten(1) for i in moving]

    def body(carry: list[Tensor], row: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        values, step_x = carry[:len(sizes)], row[:len(xs)]
        seeds = {p: tans[p] for p in params if p in tans}
        seeds |= {v.uop: t.reshape(k, m).uop for v, t, m in zip(values, carry[len(sizes):], sizes, strict=True)}
        seeds |= {step_x[i].uop: t.reshape(k, -1).uop for i, t in zip(moving, row[len(xs):], strict=True)}
        outs = body_with(a, [v.uop for v in values], [r.uop for r in step_x], params)
        ts = tangents(outs, seeds, k)
        return [*map(as_tensor, outs[:-1]), *(as_tensor(t).flatten() for t in ts[:-1])], \
            as_tensor(outs[-1]).cat(as_tensor(ts[-1]).flatten())

    res = make_fold(n, starts, rows, body)
    ys = res[c + k * c:].reshape(n, y + k * y)[:, y:].reshape(n, k, y).permute(1, 0, 2).reshape(k, n * y)
    carried = [t.reshape(k, m) for t, m in zip(split(res[c:c + k * c], [k * m for m in sizes]), sizes, strict=True)]
    return join([*carried, ys], axis=1).uop


def _neg(t: Tensor) -> Tensor: return t._wrap(UOp(Ops.NEG, t.dtype, (t.uop,), TANGENT))


def _sum(terms: Sequence[Tensor | None]) -> UOp | None:
    present = [x for x in terms if x is not None]
    if not present: return None
    out = present[0]
    for x in present[1:]: out = tangent_op(Ops.ADD, out, x)
    return out.uop


def tangents(roots: Sequence[UOp], seeds: dict[UOp, UOp], size: int) -> list[UOp]:
    """The tangent of each root, (size, *root.shape): zeros where a root does not depend on the seeds."""
    tans = dict(seeds)
    sink = UOp(Ops.SINK, dtypes.void, tuple(roots))
    for u in sink.toposort(descend=lambda n: n not in seeds and n.op is not Ops.DETACH):
        if u in tans or u is sink or not u.dtype.is_float: continue
        t = tangent_of(u, tans, size)
        if t is not None: tans[u] = t
    return [tans[r] if r in tans else Tensor.zeros(size, *r.shape, dtype=r.dtype).uop for r in roots]
