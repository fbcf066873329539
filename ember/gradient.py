"""Reverse-mode derivatives over tensor-level UOps: one rule per primitive op, written as patterns.

`pm_gradient` matches a forward node (bound as `ret`) with the gradient flowing into it as `ctx` (a Tensor) and
returns one gradient per source (None where there is none). Composite Tensor methods (softmax, mean, ...) need no
rule: their gradients come by composition. `compute_gradient` walks the graph once in reverse topological order.
Gradients are lazy tensors like any other, so they fuse with each other and can be differentiated again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ember.dtype import dtypes
from ember.errors import ShapeError
from ember.helpers import argsort, prod
from ember.uop.fold import body_with, fold_parts
from ember.uop.ops import TANGENT, GroupOp, Ops, ScatterArg, UOp, constant_of
from ember.uop.upat import PatternMatcher, UPat

if TYPE_CHECKING:
    from ember.tensor import Tensor

Grads = tuple["Tensor | None", ...]


def as_tensor(u: UOp, like: Tensor) -> Tensor:
    """A forward node as a Tensor on the device of `like`, so rules can use Tensor arithmetic."""
    return like._wrap(u)


# f'(x) of each libm function, from x and from the result y = f(x)
LIBM_DERIVATIVES: dict[Ops, Callable[[Tensor, Tensor], Tensor]] = {
    Ops.COS: lambda x, y: -x.sin(), Ops.TAN: lambda x, y: 1 + y * y, Ops.ASIN: lambda x, y: (1 - x * x).rsqrt(),
    Ops.ACOS: lambda x, y: -(1 - x * x).rsqrt(), Ops.ATAN: lambda x, y: (1 + x * x).reciprocal(),
    Ops.SINH: lambda x, y: x.cosh(), Ops.COSH: lambda x, y: x.sinh(), Ops.TANH: lambda x, y: 1 - y * y,
    Ops.ASINH: lambda x, y: (x * x + 1).rsqrt(), Ops.ACOSH: lambda x, y: (x * x - 1).rsqrt(),
    Ops.ATANH: lambda x, y: (1 - x * x).reciprocal(), Ops.ERF: lambda x, y: (-x * x).exp() * (2 / math.sqrt(math.pi)),
    Ops.EXPM1: lambda x, y: x.exp(), Ops.LOG1P: lambda x, y: (1 + x).reciprocal(),
}


def grad_libm(ctx: Tensor, ret: UOp, x: UOp) -> Grads:
    return (ctx * LIBM_DERIVATIVES[ret.op](as_tensor(x, ctx), as_tensor(ret, ctx)),)


def grad_max(ctx: Tensor, ret: UOp, a: UOp, b: UOp) -> Grads:
    """d max(a, b): to the larger side; a tie splits the gradient in half, as torch does."""
    x, y = as_tensor(a, ctx), as_tensor(b, ctx)
    share = (x > y).where(1.0, x.eq(y).where(0.5, 0.0)).cast(ctx.dtype)
    return ctx * share, ctx * (1 - share)


def grad_pow(ctx: Tensor, ret: UOp, a: UOp, b: UOp) -> Grads:
    """d a**b = b * a**(b-1) da + a**b * log(a) db. As torch: the db term is 0 where a == 0 and b >= 0 (a**b is
    constant there, or 0 * -inf), but inf * log(0) = -inf where a == 0 and b < 0, since 0**b falls from +inf."""
    x, y, out = as_tensor(a, ctx), as_tensor(b, ctx), as_tensor(ret, ctx)
    if (c := constant_of(b)) is not None: return ctx * (c * x.pow(c - 1) if c != 0 else x.zeros_like()), None
    return ctx * y.eq(0).where(0.0, y * x.pow(y - 1)), ctx * (x.eq(0) & (y >= 0)).where(0.0, out * x.log())


def grad_atan2(ctx: Tensor, ret: UOp, a: UOp, b: UOp) -> Grads:
    """d atan2(y, x) = (x dy - y dx) / (x^2 + y^2); 0 at the origin, where it is undefined, as torch (0/0 would be
    NaN and spread to every gradient upstream)."""
    y, x = as_tensor(a, ctx), as_tensor(b, ctx)
    norm = x * x + y * y
    scale = norm.eq(0).where(0.0, norm.reciprocal())
    return ctx * (x * scale), ctx * -(y * scale)


def grad_div(ctx: Tensor, ret: UOp, a: UOp, b: UOp) -> Grads:
    """d a/b = da / b - (a/b) db / b. Each incoming gradient is multiplied by a partial derivative that depends on the
    values alone (1/b, -(a/b)/b), as every rule here does: a jacobian's reverse sweeps, one per seed, then share the
    partials' one division (as CasADi's do) instead of dividing once per seed."""
    r = as_tensor(b, ctx).reciprocal()
    return ctx * r, ctx * -(as_tensor(ret, ctx) * r)


def grad_reduce(ctx: Tensor, ret: UOp, x: UOp) -> Grads:
    """A sum spreads its gradient over what it summed; a max gives it to the maxima, split evenly among ties."""
    op, _ = ret.arg
    spread = ctx.expand(x.shape)
    if op is Ops.ADD: return (spread,)
    if op is Ops.MAX:
        is_max = as_tensor(x, ctx).eq(as_tensor(ret, ctx).expand(x.shape)).cast(ctx.dtype)
        count = as_tensor(UOp(Ops.REDUCE_AXIS, is_max.dtype, (is_max.uop,), (Ops.ADD, ret.arg[1])), ctx).expand(x.shape)
        return (spread * is_max / count,)
    assert op is Ops.MUL  # d prod / d x_i is the product of the others: ret / x_i unless some x are zero
    t, axes = as_tensor(x, ctx), ret.arg[1]
    is_zero = t.eq(0)
    zeros = as_tensor(UOp(Ops.REDUCE_AXIS, dtypes.int32, (is_zero.cast(dtypes.int32).uop,), (Ops.ADD, axes)), ctx)
    others = as_tensor(UOp(Ops.REDUCE_AXIS, t.dtype, (is_zero.where(1, t).uop,), (Ops.MUL, axes)), ctx)
    zeros, others = zeros.expand(x.shape), others.expand(x.shape)
    lone_zero = zeros.eq(1) & is_zero
    return (spread * zeros.eq(0).where(as_tensor(ret, ctx).expand(x.shape) / t, lone_zero.where(others, 0.0)),)


def grad_expand(ctx: Tensor, ret: UOp, x: UOp) -> Grads:
    """An expand copies: its gradient sums over the copies."""
    axes = tuple(i for i, (s, r) in enumerate(zip(x.shape, ret.shape, strict=True)) if s != r)
    summed = as_tensor(UOp(Ops.REDUCE_AXIS, ctx.dtype, (ctx.uop,), (Ops.ADD, axes)), ctx)
    return (summed,)


def grad_pad(ctx: Tensor, ret: UOp, x: UOp) -> Grads:
    return (ctx.shrink(tuple((b, s - a) for (b, a), s in zip(ret.arg, ret.shape, strict=True))),)


def grad_shrink(ctx: Tensor, ret: UOp, x: UOp) -> Grads:
    return (ctx.pad(tuple((b, s - e) for (b, e), s in zip(ret.arg, x.shape, strict=True))),)


def grad_flip(ctx: Tensor, ret: UOp, x: UOp) -> Grads:
    return (ctx.flip([i for i, f in enumerate(ret.arg) if f]),)


def grad_gather(ctx: Tensor, ret: UOp, x: UOp, idx: UOp) -> Grads:
    """Each gathered position sends its gradient to the element it read; an element read several times adds them:
    a scatter-add of the gradient by the same indices, one step per read (an embedding's backward pass)."""
    scattered = UOp(Ops.SCATTER_ADD, ctx.dtype, (ctx.uop, idx), ScatterArg(ret.arg, x.shape[ret.arg]))
    return as_tensor(scattered, ctx), None


def grad_scatter_add(ctx: Tensor, ret: UOp, src: UOp, idx: UOp) -> Grads:
    """Each element of src was added at the position its index holds: it gets that position's gradient (a
    gather; 0 for an index outside the axis, which added nowhere)."""
    return as_tensor(UOp(Ops.GATHER, ctx.dtype, (ctx.uop, idx), ret.arg.axis), ctx), None


def is_zero(u: UOp) -> bool:
    """u is zero by construction: a constant 0, or a window of a PAD that lies in its padding (what a SHRINK's
    gradient holds outside the window it took)."""
    while u.op is Ops.RESHAPE: u = u.src[0]
    if constant_of(u) == 0: return True
    if u.op is not Ops.SHRINK or u.src[0].op is not Ops.PAD: return False
    pad, inner = u.src[0], u.src[0].src[0]
    return any(e <= before or b >= before + size for (b, e), (before, _), size in zip(u.arg, pad.arg, inner.shape,
                                                                                        strict=True))


def grad_fold(ctx: Tensor, ret: UOp) -> Grads:
    """A FOLD's vjp is two FOLDs: one that runs the steps again, emitting the carries entering each step, then one
    over the steps in reverse order whose carries are the carries' cotangents and the params' gradients summed so
    far, and whose rows are the entering carries, the xs and the cotangent of the step's y: each step pulls them
    back through the body (its vjp) and emits the xs' gradients."""
    from ember.scan import join, make_fold, split
    a = ret.arg
    c, y, n = a.carry_size, a.y_size, a.length
    carry0, xs, params = fold_parts(ret)
    csizes, xsizes = [s.shape[0] for s in carry0], [r.shape[1] for r in xs]
    wanted = [p for p in params if p.dtype.is_float]
    psizes = [prod(p.shape) for p in wanted]
    t = lambda u: as_tensor(u, ctx)  # noqa: E731

    def replay(carry: list[Tensor], row: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        outs = [t(o) for o in body_with(a, [v.uop for v in carry], [r.uop for r in row], params)]
        return outs[:-1], join([outs[-1], *carry])

    again = make_fold(n, [t(s) for s in carry0], [t(r) for r in xs], replay)
    entering = split(again[c:].reshape(n, y + c)[:, y:], csizes, axis=1)
    y_cotangent = ctx[c:].reshape(n, y)
    y = 0 if is_zero(y_cotangent.uop) else y  # the ys are not used (a jacobian of the final carry): no rows of 0
    rows = [r.flip(0) for r in [*entering, *map(t, xs), *([y_cotangent] if y else [])]]

    def pull(carry: list[Tensor], row: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        values, step_x = row[:len(csizes)], row[len(csizes):len(csizes) + len(xs)]
        outs = body_with(a, [v.uop for v in values], [r.uop for r in step_x], params)
        cts = carry[:len(csizes)] + (row[-1:] if y else [])
        kept = outs[:-1] + (outs[-1:] if y else [])
        grads = compute_gradient(join([t(o) for o in kept]).uop, join(cts), {*(v.uop for v in values),
                                                                               *(r.uop for r in step_x), *wanted})
        def flat(u: UOp, size: int) -> Tensor:
            return grads[u].reshape(size).cast(ctx.dtype) if u in grads else ctx[:1].zeros_like().expand(size)
        summed = [acc + flat(p, m) for acc, p, m in zip(carry[len(csizes):], wanted, psizes, strict=True)]
        pulled_x = [flat(r.uop, m) for r, m in zip(step_x, xsizes, strict=True)]
        return [*(flat(v.uop, m) for v, m in zip(values, csizes, strict=True)), *summed], \
            join(pulled_x) if pulled_x else None

    starts = [*split(ctx[:c], csizes), *(ctx[:1].zeros_like().expand(m) for m in psizes)]
    back = make_fold(n, starts, rows, pull)
    total = c + sum(psizes)
    g_carry = split(back[:c], csizes)
    by_param = {p: g.reshape(p.shape).cast(p.dtype) for p, g in zip(wanted, split(back[c:total], psizes), strict=True)}
    g_xs = split(back[total:].reshape(n, sum(xsizes)).flip(0), xsizes, axis=1) if xs else []
    return (*g_carry, *g_xs, *(by_param.get(p) for p in params))


def grad_vjp(ctx: Tensor, ret: UOp) -> Grads:
    """Tensor.custom_vjp's node: its pull gives the inputs' gradients; none flows into the value's own graph."""
    inputs = [as_tensor(s, ctx) for s in ret.src[1:]]
    if not isinstance(pulled := ret.arg(ctx, *inputs), (tuple, list)):
        raise TypeError(f"custom_vjp: the pull must return a tuple of one gradient (or None) per input, got "
                        f"{type(pulled).__name__}")
    grads = tuple(pulled)
    shapes_differ = any(g is not None and g.shape != t.shape for g, t in zip(grads, inputs, strict=False))
    if len(grads) != len(inputs) or shapes_differ:
        shapes = [None if g is None else g.shape for g in grads]
        raise ShapeError(f"custom_vjp: the pull gave gradients of shapes {shapes} for inputs of shapes "
                         f"{[t.shape for t in inputs]}; it must give one per input, of its shape")
    return (None, *(None if g is None else g.cast(t.dtype) for g, t in zip(grads, inputs, strict=False)))


pm_gradient = PatternMatcher([
    (UPat(Ops.VJP, name="ret"), grad_vjp),
    (UPat(Ops.FOLD, name="ret"), grad_fold),
    (UPat(Ops.CAST, name="ret", src=(UPat.var("x"),)), lambda ctx, ret, x: (ctx.cast(x.dtype),)),
    (UPat((Ops.CONTIGUOUS, Ops.COPY), name="ret"), lambda ctx, ret: (ctx,)),
    (UPat(Ops.CONTIGUOUS_BACKWARD, name="ret"), lambda ctx, ret: (ctx.contiguous(),)),
    (UPat(Ops.NEG, name="ret"), lambda ctx, ret: (-ctx,)),
    (UPat(Ops.RECIPROCAL, name="ret"), lambda ctx, ret: (ctx * -(as_tensor(ret, ctx) * as_tensor(ret, ctx)),)),
    (UPat(Ops.EXP, name="ret"), lambda ctx, ret: (ctx * as_tensor(ret, ctx),)),
    (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ctx * (as_tensor(ret, ctx) * math.log(2)),)),
    (UPat(Ops.LOG, name="ret", src=(UPat.var("x"),)), lambda ctx, ret, x: (ctx * as_tensor(x, ctx).reciprocal(),)),
    (UPat(Ops.LOG2, name="ret", src=(UPat.var("x"),)),
     lambda ctx, ret, x: (ctx * (as_tensor(x, ctx) * math.log(2)).reciprocal(),)),
    (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx * (2 * as_tensor(ret, ctx)).reciprocal(),)),
    (UPat(Ops.SIN, name="ret", src=(UPat.var("x"),)), lambda ctx, ret, x: (ctx * as_tensor(x, ctx).cos(),)),
    (UPat(GroupOp.Libm, name="ret", src=(UPat.var("x"),)), grad_libm),
    (UPat(Ops.ADD, name="ret"), lambda ctx, ret: (ctx, ctx)),
    (UPat(Ops.SUB, name="ret"), lambda ctx, ret: (ctx, -ctx)),
    (UPat(Ops.MUL, name="ret", src=(UPat.var("a"), UPat.var("b"))), lambda ctx, ret, a, b:
     (ctx * as_tensor(b, ctx), ctx * as_tensor(a, ctx))),
    (UPat(Ops.FDIV, name="ret", src=(UPat.var("a"), UPat.var("b"))), grad_div),
    (UPat(Ops.MAX, name="ret", src=(UPat.var("a"), UPat.var("b"))), grad_max),
    (UPat(Ops.POW, name="ret", src=(UPat.var("a"), UPat.var("b"))), grad_pow),
    (UPat(Ops.MULACC, name="ret", src=(UPat.var("a"), UPat.var("b"), UPat())), lambda ctx, ret, a, b:
     (ctx * as_tensor(b, ctx), ctx * as_tensor(a, ctx), ctx)),
    (UPat(Ops.ATAN2, name="ret", src=(UPat.var("a"), UPat.var("b"))), grad_atan2),
    (UPat(Ops.WHERE, name="ret", src=(UPat.var("c"), UPat(), UPat())), lambda ctx, ret, c:
     (None, as_tensor(c, ctx).where(ctx, 0.0), as_tensor(c, ctx).where(0.0, ctx))),
    (UPat(Ops.MOD, name="ret", src=(UPat.var("a"), UPat.var("b"))), lambda ctx, ret, a, b:
     (ctx, -ctx * (as_tensor(a, ctx) / as_tensor(b, ctx)).trunc())),  # fmod(a, b) = a - trunc(a/b) * b
    (UPat(GroupOp.Comparison | {Ops.TRUNC, Ops.IDIV, Ops.AND, Ops.OR, Ops.XOR}, name="ret"),
     lambda ctx, ret: (None,) * len(ret.src)),
    (UPat(Ops.REDUCE_AXIS, name="ret", src=(UPat.var("x"),)), grad_reduce),
    (UPat(Ops.RESHAPE, name="ret", src=(UPat.var("x"),)), lambda ctx, ret, x: (ctx.reshape(x.shape),)),
    (UPat(Ops.PERMUTE, name="ret"), lambda ctx, ret: (ctx.permute(argsort(ret.arg)),)),
    (UPat(Ops.EXPAND, name="ret", src=(UPat.var("x"),)), grad_expand),
    (UPat(Ops.PAD, name="ret", src=(UPat.var("x"),)), grad_pad),
    (UPat(Ops.SHRINK, name="ret", src=(UPat.var("x"),)), grad_shrink),
    (UPat(Ops.FLIP, name="ret", src=(UPat.var("x"),)), grad_flip),
    (UPat(Ops.GATHER, name="ret", src=(UPat.var("x"), UPat.var("idx"))), grad_gather),
    (UPat(Ops.SCATTER_ADD, name="ret", src=(UPat.var("src"), UPat.var("idx"))), grad_scatter_add),
])


def tangent_op(op: Ops, a: Tensor, b: Tensor) -> Tensor:
    """a op b (broadcast as Tensor arithmetic) marked as derivative arithmetic (arg TANGENT): a zero there is
    structural, absent, and folds away (uop/symbolic.py, pm_structural_zeros). Forward mode's tangent arithmetic
    and the sum of a gradient's terms."""
    x, y = a._operands(op.name.lower(), b)
    return x._wrap(UOp(op, x.dtype, (x.uop, y.uop), TANGENT))


def compute_gradient(root: UOp, root_grad: Tensor, targets: set[UOp]) -> dict[UOp, Tensor]:
    """d root / d target for every target that root depends on, as lazy tensors (root_grad seeds the walk)."""
    order = list(root.toposort(descend=lambda u: u.op is not Ops.DETACH))
    on_path: set[UOp] = set()  # nodes with a path to a target: only their gradients are needed
    for u in order:
        if u in targets or any(s in on_path for s in u.src): on_path.add(u)
    grads: dict[UOp, Tensor] = {root: root_grad}
    for u in reversed(order):
        if u not in grads or u.op is Ops.DETACH: continue
        if not any(s in on_path for s in u.src): continue
        src_grads = pm_gradient.rewrite(u, ctx=grads[u])
        if src_grads is None: raise NotImplementedError(f"gradient: no derivative rule for {u.op.name}")
        for s, g in zip(u.src, src_grads, strict=True):
            if g is None or s not in on_path or not (s.dtype.is_float): continue
            grads[s] = tangent_op(Ops.ADD, grads[s], g) if s in grads else g
    return {t: grads[t] for t in targets if t in grads}
