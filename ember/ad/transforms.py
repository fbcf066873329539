"""Dense transforms of NumericalFunctions: vjp, jvp, gradient, jacobian, hessian, vmap.

Each transform traces the original function again on fresh placeholders and transforms the traced graph, so the
result is an ordinary NumericalFunction: it can be called from Python, transformed again and exported to C++.
Reverse mode is `Tensor.gradient` (ember/gradient.py), forward mode ad/forward.py, batching ad/batching.py.

A jacobian is one pass with the directions as a batch axis: forward with one unit tangent per input element, or,
when the output is smaller, the vjp lifted over one unit cotangent per output element. A hessian is forward mode
over the reverse-mode gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

from ember.ad.batching import broadcast_front, lift
from ember.ad.forward import as_tensor, tangents
from ember.dtype import dtypes
from ember.errors import ShapeError
from ember.export.function import Arg, NumericalFunction, placeholders_for
from ember.helpers import prod
from ember.scan import offsets
from ember.tensor import Tensor, tracing
from ember.uop.ops import TANGENT, Ops, UOp

CARRIES = {Ops.MUL, Ops.ADD, Ops.SUB, Ops.NEG}  # marked TANGENT: a vjp's cotangent arithmetic, sparse.structural


def _argnum(f: NumericalFunction, argnum: int, op: str) -> int:
    if not isinstance(argnum, int) or isinstance(argnum, bool):
        raise TypeError(f"{op}: argnum must be an int (or, for jacobian, a sequence of ints), got {argnum!r}")
    if not -len(f.args) <= argnum < len(f.args):
        raise IndexError(f"{op}: argnum {argnum} is out of range for {f.name}, which takes {len(f.args)} arguments")
    if not f.args[argnum].dtype.is_float:
        raise TypeError(f"{op}: argument {argnum} of {f.name} is {f.args[argnum].dtype.name}; derivatives need floats")
    return argnum % len(f.args)


def _single(f: NumericalFunction, xs: tuple[Tensor, ...], op: str) -> Tensor:
    """f's one output, traced on xs."""
    out = f.fn(*xs)
    if not isinstance(out, Tensor):
        raise ShapeError(f"{op}: {f.name} returns {len(out)} outputs; differentiate a function with one output")
    return out


def vjp(f: NumericalFunction, argnum: int = 0) -> NumericalFunction:
    """(x..., u) -> u^T df/dx_argnum: the cotangent u has the output's shape; the result has x_argnum's shape."""
    a = _argnum(f, argnum, "vjp")
    out_shape = f.output_shapes[0]
    if len(f.output_shapes) != 1: raise ShapeError(f"vjp: {f.name} must have one output")
    def fn(*xs: Tensor) -> Tensor:
        out = _single(f, xs[:-1], "vjp")
        return _grad(out, xs[a], xs[-1].cast(out.dtype))
    return NumericalFunction(f"{f.name}_vjp", fn, [*f.args, Arg(out_shape, f.output_dtypes[0])],
                             _names(f, "cotangent"), lazy=True)


def jvp(f: NumericalFunction, argnum: int = 0) -> NumericalFunction:
    """(x..., v) -> df/dx_argnum v: the tangent v has x_argnum's shape; the result has the output's shape."""
    a = _argnum(f, argnum, "jvp")
    if len(f.output_shapes) != 1: raise ShapeError(f"jvp: {f.name} must have one output")
    def fn(*xs: Tensor) -> Tensor:
        out = _single(f, xs[:-1], "jvp")
        v = xs[-1].cast(xs[a].dtype).reshape(1, *xs[a].shape)
        return as_tensor(tangents([out.uop], {xs[a].uop: v.uop}, 1)[0]).reshape(out.shape)
    return NumericalFunction(f"{f.name}_jvp", fn, [*f.args, f.args[a]], _names(f, "tangent"), lazy=True)


def gradient(f: NumericalFunction, argnum: int = 0) -> NumericalFunction:
    """x... -> df/dx_argnum for a scalar f, in x_argnum's shape."""
    a = _argnum(f, argnum, "gradient")
    if len(f.output_shapes) != 1 or prod(f.output_shapes[0]) != 1:
        raise ShapeError(f"gradient: {f.name} must return one scalar, not outputs of shapes {f.output_shapes}; "
                         f"use jacobian or vjp")
    return NumericalFunction(f"{f.name}_grad", lambda *xs: _grad(_single(f, xs, "gradient").sum(), xs[a]), f.args,
                             f.arg_names, lazy=True)


def jacobian(f: NumericalFunction, argnum: int | Sequence[int] = 0) -> NumericalFunction:
    """x... -> df/dx_argnum of shape output.shape + x_argnum.shape. With a sequence of argnums, a tuple of those
    jacobians from one pass whose directions span them all: forward over all their elements together, or reverse
    over the output's when that is fewer. A rollout's jacobians by its state (12 x 12) and by its controls (12 x 80)
    then share one reverse sweep, where two calls would run forward mode over the state beside it."""
    if isinstance(argnum, int) and not isinstance(argnum, bool):
        a = _argnum(f, argnum, "jacobian")
        if len(f.output_shapes) != 1: raise ShapeError(f"jacobian: {f.name} must have one output")
        return NumericalFunction(f"{f.name}_jac", lambda *xs: _jacobians(_single(f, xs, "jacobian"), [xs[a]])[0],
                                 f.args, f.arg_names, lazy=True)
    if not isinstance(argnum, Sequence) or isinstance(argnum, str):
        raise TypeError(f"jacobian: argnum must be an int or a sequence of ints, got {argnum!r}")
    nums = [_argnum(f, n, "jacobian") for n in argnum]
    if not nums or len(set(nums)) != len(nums):
        raise ValueError(f"jacobian: argnum {tuple(argnum)} must name distinct arguments, at least one")
    if len(f.output_shapes) != 1: raise ShapeError(f"jacobian: {f.name} must have one output")
    return NumericalFunction(f"{f.name}_jac", lambda *xs: tuple(
        _jacobians(_single(f, xs, "jacobian"), [xs[n] for n in nums])), f.args, f.arg_names, lazy=True)


def hessian(f: NumericalFunction, argnum: int = 0) -> NumericalFunction:
    """x... -> d2f/dx_argnum2 for a scalar f, of shape x_argnum.shape * 2."""
    return jacobian(gradient(f, argnum), argnum)


def _names(f: NumericalFunction, extra: str) -> list[str]:
    """f's argument names and one more, made distinct."""
    while extra in f.arg_names: extra += "_"
    return [*f.arg_names, extra]


def _grad(out: Tensor, x: Tensor, seed: Tensor | None = None) -> Tensor:
    return out.gradient(x, gradient=seed)[0]


def forward_directions(out: Tensor, x: Tensor, seeds: Tensor) -> Tensor:
    """d out / dx along each row of seeds (k, *x.shape), in one pass: (k, *out.shape)."""
    return as_tensor(tangents([out.uop], {x.uop: seeds.cast(x.dtype).uop}, seeds.shape[0])[0])


def reverse_directions(out: Tensor, x: Tensor, seeds: Tensor) -> Tensor:
    """u^T d out / dx for each row u of seeds (k, *out.shape), in one pass: the vjp lifted over u, (k, *x.shape)."""
    return _reverse(out, [x], seeds)[0]


def _reverse(out: Tensor, xs: Sequence[Tensor], seeds: Tensor) -> list[Tensor]:
    """reverse_directions for each of xs, from one vjp lifted once. The vjp's arithmetic on the cotangent is marked
    as forward mode's is (cotangent_arithmetic): a unit seed's zeros then drop the terms they start, and a jacobian
    has the same entries whichever mode computed it."""
    (u,) = placeholders_for([Arg(out.shape, out.dtype)])  # stands for the cotangent; the vjp is linear in it
    grads = cotangent_arithmetic([g.uop for g in out.gradient(*xs, gradient=u)], u.uop)
    lifted = lift(grads, {u.uop: (seeds.cast(out.dtype).uop, True)}, seeds.shape[0])
    return [as_tensor(g if batched else broadcast_front(g, seeds.shape[0])) for g, batched in lifted]


def cotangent_arithmetic(roots: Sequence[UOp], cotangent: UOp) -> list[UOp]:
    """roots with every product, sum, difference and negation of floats that the cotangent reaches marked TANGENT
    (ad/forward.py): in a vjp those are the cotangent times a partial derivative and the sums of such terms, so a
    zero cotangent is structural there, as a zero tangent is in forward mode."""
    done: dict[UOp, UOp] = {}
    reached = {cotangent}
    for u in UOp(Ops.SINK, dtypes.void, tuple(roots)).toposort():
        if not any(s in reached for s in u.src): continue
        reached.add(u)
        srcs = tuple(done.get(s, s) for s in u.src)
        if u.op in CARRIES and u.arg is None and u.dtype.is_float: done[u] = u.replace(src=srcs, arg=TANGENT)
        elif srcs != u.src: done[u] = u.replace(src=srcs)
    return [done.get(r, r) for r in roots]


def _jacobians(out: Tensor, xs: Sequence[Tensor]) -> list[Tensor]:
    """d out / dx for each of xs, in one pass: columns by forward mode over the elements of all xs, or rows
    d out_i / d(all xs) by reverse mode, whichever are fewer."""
    n_out, sizes = prod(out.shape), [prod(x.shape) for x in xs]
    if n_out == 0 or sum(sizes) == 0: return [Tensor.zeros(out.shape + x.shape, dtype=out.dtype) for x in xs]
    if sum(sizes) <= n_out:
        total = sum(sizes)
        if len(xs) == 1: seeds = {xs[0].uop: Tensor.eye(total, dtype=xs[0].dtype).reshape(total, *xs[0].shape).uop}
        else:  # direction j moves element j of all the xs' elements, in order
            eye = Tensor.eye(total, dtype=out.dtype)
            seeds = {x.uop: eye[:, at:at + n].cast(x.dtype).reshape(total, *x.shape).uop
                     for x, n, at in zip(xs, sizes, offsets(sizes), strict=True)}
        cols = as_tensor(tangents([out.uop], seeds, total)[0]).reshape(total, n_out).permute(1, 0)
        if len(xs) == 1: return [cols.reshape(out.shape + xs[0].shape)]
        return [cols[:, at:at + n].reshape(out.shape + x.shape) for x, n, at in zip(xs, sizes, offsets(sizes),
                                                                                     strict=True)]
    rows = _reverse(out, xs, Tensor.eye(n_out, dtype=out.dtype).reshape(n_out, *out.shape))
    return [r.reshape(out.shape + x.shape) for r, x in zip(rows, xs, strict=True)]


def vmap(f: NumericalFunction, in_axes: int | None | Sequence[int | None] = 0, *, axis_size: int) -> NumericalFunction:
    """f over a batch of `axis_size` inputs, stacked along `in_axes` (None: that argument is shared), outputs
    stacked along a new leading axis. The batch is an axis of every kernel, a loop in the generated code."""
    axes = list(in_axes) if isinstance(in_axes, (list, tuple)) else [in_axes] * len(f.args)
    if len(axes) != len(f.args):
        raise ValueError(f"vmap: in_axes has {len(axes)} entries for the {len(f.args)} arguments of {f.name}")
    if not isinstance(axis_size, int) or axis_size < 0:
        raise ValueError(f"vmap: axis_size {axis_size!r} must be an int >= 0")
    for i, (ax, arg) in enumerate(zip(axes, f.args, strict=True)):
        if ax is not None and not -len(arg.shape) - 1 <= ax <= len(arg.shape):
            raise IndexError(f"vmap: in_axes[{i}] = {ax} is out of range for argument {i} of shape {arg.shape}")
    axes = [None if ax is None else ax % (len(arg.shape) + 1) for ax, arg in zip(axes, f.args, strict=True)]
    if all(ax is None for ax in axes): raise ValueError("vmap: in_axes maps no argument")
    args = [arg if ax is None else Arg(arg.shape[:ax] + (axis_size,) + arg.shape[ax:], arg.dtype)
            for ax, arg in zip(axes, f.args, strict=True)]

    def fn(*xs: Tensor) -> Tensor | tuple[Tensor, ...]:
        holders = placeholders_for(f.args)
        with tracing(holders): traced = f.fn(*holders)
        outs = (traced,) if isinstance(traced, Tensor) else tuple(traced)
        subst = {h.uop: (x.uop, False) if ax is None else (x.permute(ax, *(i for i in range(x.ndim) if i != ax)).uop,
                                                         True) for h, x, ax in zip(holders, xs, axes, strict=True)}
        lifted = [as_tensor(u if batched else broadcast_front(u, axis_size))
                  for u, batched in lift([o.uop for o in outs], subst, axis_size)]
        return lifted[0] if isinstance(traced, Tensor) else tuple(lifted)
    return NumericalFunction(f"{f.name}_vmap", fn, args, f.arg_names, lazy=True)


__all__ = ["vjp", "jvp", "gradient", "jacobian", "hessian", "vmap"]
