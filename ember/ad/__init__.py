"""Derivatives of NumericalFunctions, as NumericalFunctions: vjp, jvp, gradient, jacobian, hessian.

Each transform traces the original function again on fresh placeholders and differentiates the traced graph with
ember's reverse mode (`Tensor.gradient`), so the result is an ordinary NumericalFunction: it can be called from
Python, differentiated again and exported to C++. Forward mode (jvp) is reverse mode applied twice: the vjp
u -> J^T u is linear in u, so its derivative along v is J v, whatever u is.

A jacobian is assembled from one vjp per output element (or one jvp per input element, when there are fewer
inputs), each a separate reverse pass in the kernel sequence.
"""

from __future__ import annotations

from ember.errors import ShapeError
from ember.export.function import Arg, NumericalFunction
from ember.helpers import prod
from ember.tensor import Tensor


def _argnum(f: NumericalFunction, argnum: int, op: str) -> int:
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
    return NumericalFunction(f"{f.name}_vjp", fn, [*f.args, Arg(out_shape, f.output_dtypes[0])])


def jvp(f: NumericalFunction, argnum: int = 0) -> NumericalFunction:
    """(x..., v) -> df/dx_argnum v: the tangent v has x_argnum's shape; the result has the output's shape."""
    a = _argnum(f, argnum, "jvp")
    if len(f.output_shapes) != 1: raise ShapeError(f"jvp: {f.name} must have one output")
    def fn(*xs: Tensor) -> Tensor:
        out = _single(f, xs[:-1], "jvp")
        u = Tensor.zeros(out.shape, dtype=out.dtype).contiguous().realize()  # any u: J^T u is linear in it
        return _grad((_grad(out, xs[a], u) * xs[-1]).sum(), u)
    return NumericalFunction(f"{f.name}_jvp", fn, [*f.args, f.args[a]])


def gradient(f: NumericalFunction, argnum: int = 0) -> NumericalFunction:
    """x... -> df/dx_argnum for a scalar f, in x_argnum's shape."""
    a = _argnum(f, argnum, "gradient")
    if len(f.output_shapes) != 1 or prod(f.output_shapes[0]) != 1:
        raise ShapeError(f"gradient: {f.name} must return one scalar, not outputs of shapes {f.output_shapes}; "
                         f"use jacobian or vjp")
    return NumericalFunction(f"{f.name}_grad", lambda *xs: _grad(_single(f, xs, "gradient").sum(), xs[a]), f.args)


def jacobian(f: NumericalFunction, argnum: int = 0) -> NumericalFunction:
    """x... -> df/dx_argnum of shape output.shape + x_argnum.shape."""
    a = _argnum(f, argnum, "jacobian")
    if len(f.output_shapes) != 1: raise ShapeError(f"jacobian: {f.name} must have one output")
    return NumericalFunction(f"{f.name}_jac", lambda *xs: _jacobian(_single(f, xs, "jacobian"), xs[a]), f.args)


def hessian(f: NumericalFunction, argnum: int = 0) -> NumericalFunction:
    """x... -> d2f/dx_argnum2 for a scalar f, of shape x_argnum.shape * 2."""
    return jacobian(gradient(f, argnum), argnum)


def _grad(out: Tensor, x: Tensor, seed: Tensor | None = None) -> Tensor:
    return out.gradient(x, gradient=seed)[0]


def _jacobian(out: Tensor, x: Tensor) -> Tensor:
    """Rows d out_i / dx by reverse passes, or columns d out / dx_j by forward passes, whichever are fewer."""
    n_out, n_in = prod(out.shape), prod(x.shape)
    if n_out == 0 or n_in == 0: return Tensor.zeros(out.shape + x.shape, dtype=out.dtype)
    flat = out.reshape(n_out)
    if n_out <= n_in:
        rows = [_grad(flat[i], x).reshape(1, n_in) for i in range(n_out)]
        jac = rows[0].cat(*rows[1:], dim=0) if len(rows) > 1 else rows[0]
    else:
        u = Tensor.zeros(n_out, dtype=out.dtype).contiguous().realize()
        pullback = _grad(flat, x, u).reshape(n_in)  # J^T u, linear in u
        cols = [_grad(pullback[j], u).reshape(n_out, 1) for j in range(n_in)]
        jac = cols[0].cat(*cols[1:], dim=1) if len(cols) > 1 else cols[0]
    return jac.reshape(out.shape + x.shape)


__all__ = ["vjp", "jvp", "gradient", "jacobian", "hessian"]
