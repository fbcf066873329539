"""Symbolic sizes: a `Variable` bound to a value per call stands for a dimension that changes (a batch).

`Variable("bs", 1, 64).bind(32)` is a BIND node; a shape may hold it in place of an int
(`x.reshape(bs.bind(32), 784)`).
Kernels are compiled once for the variable (their loop over that axis runs to a parameter), and each call passes
the value it is bound to: a jitted function called with batches of 8, 16 and 33 runs the same programs.

What the front end allows, so that every size stays an exact expression of the variables:
- a symbolic dimension is a bound variable itself (not `2 * bs`), and it is never 1 for broadcasting;
- elementwise ops, broadcasting, reductions and argmax (over any axis: a mean divides by the bound count),
  permute, expand, matmul, and slices, pads and joins of the other axes; not slices, indexing, pads or joins along a
  symbolic axis (a ShapeError says so);
- a reshape keeps each symbolic axis whole; one between a concrete and a symbolic shape reads the buffer (the
  tensor is realized first if it is not one already): `x.reshape(bs, 784)` of an (n, 784) tensor, and back.

Buffers of a symbolic shape are allocated for the variable's maximum, so a call with another value needs no new
memory; a symbolic tensor reads the first elements of its buffer.
"""

from __future__ import annotations

from typing import Any

from ember.errors import ShapeError
from ember.uop.ops import Ops, UOp

Sint = int | UOp  # a size: an int, or a bound variable


def Variable(name: str, min_val: int, max_val: int) -> UOp:  # noqa: N802 (a constructor, as tinygrad's)
    """A symbolic int32 size in [min_val, max_val]; `.bind(n)` gives it its value for a call."""
    if not name.isidentifier(): raise ValueError(f"Variable: the name must be an identifier (it names a C "
                                                 f"parameter), got {name!r}")
    if not all(type(v) is int for v in (min_val, max_val)) or not 0 <= min_val <= max_val <= 2**31 - 1:
        raise ValueError(f"Variable {name}: need ints 0 <= min <= max < 2**31 (an int32 parameter), got "
                         f"[{min_val!r}, {max_val!r}]")
    return UOp.variable(name, min_val, max_val)


def is_symbolic(shape: tuple[Any, ...]) -> bool:
    return any(type(s) is UOp for s in shape)


def concrete(shape: tuple[Sint, ...]) -> tuple[int, ...]:
    """The shape with each bound variable as its value."""
    return tuple(s.unbind()[1] if type(s) is UOp else s for s in shape)


def max_count(shape: tuple[Sint, ...]) -> int:
    """The most elements a shape can have: its element count, each variable at its maximum."""
    count = 1
    for s in shape: count *= s.vmax if type(s) is UOp else s
    return count


def check_dim(op: str, s: Any) -> None:
    if type(s) is UOp and s.op is not Ops.BIND:
        raise ShapeError(f"{op}: a symbolic size must be a bound Variable (Variable(name, lo, hi).bind(n)), got "
                         f"{s.render()}: a symbolic axis is kept whole, never merged with others (flatten) or scaled")


def same_axes(new: tuple[Sint, ...], old: tuple[Sint, ...]) -> bool:
    """Whether a reshape from `old` to `new` keeps every symbolic axis whole: the same bound variables in the same
    order, the concrete sizes between them of equal products."""
    def segments(shape: tuple[Sint, ...]) -> tuple[list[int], list[UOp]]:
        counts, axes, run = [], [], 1
        for s in shape:
            if type(s) is UOp:
                counts.append(run)
                axes.append(s)
                run = 1
            else: run *= s
        return [*counts, run], axes
    (counts_new, axes_new), (counts_old, axes_old) = segments(new), segments(old)
    return axes_new == axes_old and counts_new == counts_old


def unbound(shape: tuple[Sint, ...]) -> tuple[Sint, ...]:
    """The shape with each bound variable as the variable itself (what stays the same from call to call)."""
    return tuple(s.src[0] if type(s) is UOp else s for s in shape)


def values_of(shapes: list[tuple[Sint, ...]]) -> dict[str, int]:
    """The value of each variable the shapes hold, by name; a ShapeError where one is bound to two values."""
    values: dict[str, int] = {}
    for shape in shapes:
        for s in shape:
            if type(s) is UOp and values.setdefault(name := s.src[0].arg.name, value := s.src[1].arg) != value:
                raise ShapeError(f"{name} is bound to both {values[name]} and {value}")
    return values


def rebound(shape: tuple[Sint, ...], values: dict[str, int]) -> tuple[Sint, ...]:
    """A shape with each variable (bound or not) bound to its value in `values`, by name."""
    return tuple(s.src[0].bind(values[s.src[0].arg.name]) if type(s) is UOp and s.op is Ops.BIND else
                 s.bind(values[s.arg.name]) if type(s) is UOp else s for s in shape)
