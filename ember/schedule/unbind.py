"""Unbind: a graph whose shapes hold bound variables (ember/variables.py) as the same graph over the variables
themselves, and their values. The first step of realizing a symbolic graph.

Before: tensor-level graphs with BIND(var, value) in sizes (RESHAPE, EXPAND, SHRINK and ARANGE args) and as scalar
        values.
After:  the graphs with every BIND replaced by its DEFINE_VAR, and {var: value}. A buffer read in a symbolic shape
        (the reshape of a concrete tensor into one) is read through a BUFFER node sized for the variables' maxima.

So the scheduler, the schedule cache and the compiled kernels see only variables: the kernels of a batch of 8 are
those of a batch of 33, and the values go to each kernel as parameters (engine/realize.py). `rebind` puts the values
back into the views of what was stored.
"""

from __future__ import annotations

from ember.device import buffer_of, buffer_uop
from ember.errors import ShapeError
from ember.uop.ops import Ops, UOp
from ember.variables import is_symbolic, max_count, rebound


def bind_values(arg: tuple, values: dict[UOp, int]) -> tuple:
    """A shape with each BIND as its variable, the values noted."""
    out = []
    for s in arg:
        if type(s) is UOp and s.op is Ops.BIND:
            var, value = s.unbind()
            if values.setdefault(var, value) != value:
                raise ShapeError(f"{var.arg.name} is bound to both {values[var]} and {value} in one graph")
            s = var
        out.append(s)
    return tuple(out)


def unbind(outputs: list[UOp]) -> tuple[list[UOp], dict[UOp, int]]:
    """(the graphs of `outputs` over variables, the variables' values); the graphs themselves when none is bound."""
    values: dict[UOp, int] = {}
    new: dict[UOp, UOp] = {}
    for u in UOp(Ops.SINK, src=tuple(outputs)).toposort():
        if u.op is Ops.BIND:
            new[u] = bind_values((u,), values)[0]
            continue
        src = tuple(new[s] for s in u.src)
        arg = bind_values(u.arg, values) if u.op in (Ops.RESHAPE, Ops.EXPAND) else \
            bind_values((u.arg,), values)[0] if u.op is Ops.ARANGE else \
            tuple(bind_values(pair, values) for pair in u.arg) if u.op is Ops.SHRINK else u.arg
        if u.op is Ops.RESHAPE and src[0].op is Ops.BUFFER and arg != u.arg and \
                src[0].arg.size != (size := max_count(arg)):  # a concrete buffer read in a symbolic shape
            symbolic = buffer_uop(buffer_of(src[0]), size)
            src = (symbolic,)
        new[u] = u if src == u.src and arg is u.arg else UOp(u.op, u.dtype, src, arg)
    return ([new[o] for o in outputs] if values else outputs), values


def rebind(view: UOp, values: dict[UOp, int]) -> UOp:
    """A stored node's view (a BUFFER reshaped to a shape over variables) with the variables bound again."""
    if view.op is not Ops.RESHAPE or not is_symbolic(view.arg): return view
    return view.replace(arg=rebound(view.arg, {var.arg.name: value for var, value in values.items()}))
