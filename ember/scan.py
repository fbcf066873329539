"""scan: a loop of identical steps that stays a loop, through derivatives, vmap, the schedule and C++ export.

`scan(step, init, xs)` runs `carry, y = step(carry, x)` once per row x of xs and returns the final carry and the
stacked ys, as JAX's `lax.scan` and CasADi's `mapaccum`. `step` is traced once, on placeholders; the result is one
FOLD node whose arg (uop/ops.py FoldArg) holds that body graph. A horizon of 1000 steps is then one body in the
graph, one loop in the kernels' schedule (schedule/kernelize.py LoopItem) and one `for` in the generated C++,
where calling `step` in a Python loop would unroll 1000 copies into straight-line code.

A FOLD's derivatives are FOLDs too (their rules sit with their siblings: forward mode in ad/forward.py, batching in
ad/batching.py, reverse mode in gradient.py, sparsity in ad/sparsity.py), built by `make_fold` from a new body:
- forward: the carry carries its k tangents along, each step's y its tangents;
- vmap: the batch is carried side by side, one body evaluation per step for the whole batch;
- reverse: a forward FOLD that also emits the carry entering each step, then a FOLD over the steps in reverse
  order that pulls the cotangents back (the vjp of the body) and accumulates the parameters' gradients.

Small loops are unrolled (the default `unroll=None` decides by size): straight-line code lets the C++ compiler
schedule across steps, which a loop of a few steps gains nothing from giving up.

Layout: a FOLD has flat carries and xs, one or several (derivative FOLDs keep values and tangents apart, so that
vmap batches only what the batch reaches); `scan` flattens and joins its carry leaves into one carry, its x leaves
into one xs and its y leaves into one y, so they share one float dtype. Values the body reads from outside (an
outer function's inputs, captured arrays) become the FOLD's further sources, `params`, read the same at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ember.device import Device
from ember.dtype import DType, dtypes
from ember.errors import DTypeError, ShapeError
from ember.helpers import getenv, prod
from ember.schedule.folds import placeholder_uop
from ember.tensor import Tensor, tracing
from ember.uop.ops import FoldArg, Ops, UOp
from ember.uop.upat import substitute

# length x body nodes up to which scan(unroll=None) unrolls the loop: the cart-pole's 10 RK4 steps (≈ 90 nodes
# each) stay straight-line code, as fast as CasADi's; a 20-step quadrotor with its jacobians is a loop
SCAN_UNROLL_NODES = getenv("SCAN_UNROLL_NODES", 1000)

Leaves = Tensor | Sequence[Tensor]


def placeholder(shape: tuple[int, ...], dtype: DType) -> Tensor:
    """A Tensor standing for a value the body is traced on: a buffer that no kernel fills."""
    return Tensor._from_uop(placeholder_uop(shape, dtype), Device.DEFAULT)


def offsets(sizes: Sequence[int]) -> list[int]:
    """Where each of consecutive pieces of these sizes starts."""
    return [sum(sizes[:i]) for i in range(len(sizes))]


def split(flat: Tensor, sizes: Sequence[int], axis: int = 0) -> list[Tensor]:
    """Consecutive pieces of these sizes along `axis`."""
    lead = (slice(None),) * axis
    return [flat[(*lead, slice(o, o + n))] for o, n in zip(offsets(sizes), sizes, strict=True)]


def join(parts: Sequence[Tensor], axis: int = 0) -> Tensor:
    return parts[0] if len(parts) == 1 else parts[0].cat(*parts[1:], dim=axis)


def _free_values(out: UOp, placeholders: set[UOp]) -> list[UOp]:
    """The values `out` reads from outside the body: the largest parts of its graph that depend on no placeholder
    and read some buffer (not constants alone), below any broadcast, which stays in the body (a param is stored
    once, not once per copy)."""
    inside: dict[UOp, bool] = {}
    reads: dict[UOp, bool] = {}  # some buffer lies below
    for u in out.toposort(descend=lambda n: n not in placeholders):
        held = u in placeholders
        inside[u] = held or any(inside[s] for s in u.src)
        reads[u] = held or u.op is Ops.BUFFER or any(reads[s] for s in u.src)
    free: dict[UOp, None] = {}
    seen: set[UOp] = set()
    stack = [out]
    while stack:
        u = stack.pop()
        if u in seen or u in placeholders: continue
        seen.add(u)
        if inside[u] or u.op in (Ops.EXPAND, Ops.SINK): stack.extend(u.src)
        elif reads[u]: free[u] = None
    return list(free)


Body = Callable[[list[Tensor], list[Tensor]], tuple[Sequence[Tensor], Tensor | None]]


def make_fold(length: int, carry0: Sequence[Tensor], xs: Sequence[Tensor], body: Body) -> Tensor:
    """The FOLD of `body(carries, xs' rows) -> (next carries, y or None)` over `length` steps from the flat carries
    carry0, with xs of shapes (length, X_i); y is flat. Its value is the final carries, then the ys (C + length *
    Y,). The body may read any outer value: those become the FOLD's params. Separate carries and xs stay separate
    under vmap and derivatives: only those that depend on the batch or the seeds get batched."""
    dtype = carry0[0].dtype
    carry = [placeholder(c.shape, c.dtype) for c in carry0]
    x = [placeholder(r.shape[1:], r.dtype) for r in xs]
    with tracing(carry + x): nxt, y = body(carry, x)
    y = Tensor.zeros(0, dtype=dtype) if y is None else y
    for got, want in zip([*nxt, y], [*carry0, y], strict=True):
        if got.shape != want.shape or got.dtype is not dtype:
            raise ShapeError(f"scan: the body gives {got.dtype.name}{list(got.shape)} where {dtype.name}"
                             f"{list(want.shape)} belongs (a flat carry or y of the carry's dtype)")
    outs = UOp(Ops.SINK, dtypes.void, tuple(t.uop for t in [*nxt, y]))
    free = _free_values(outs, {t.uop for t in carry + x})
    params = [placeholder(f.shape, f.dtype).uop for f in free]
    body_out = substitute(outs, dict(zip(free, params, strict=True))) if free else outs
    arg = FoldArg(length, tuple(t.uop for t in carry), tuple(t.uop for t in x), tuple(params), body_out.src)
    return carry0[0]._wrap(UOp(Ops.FOLD, dtype, (*(t.uop for t in carry0), *(t.uop for t in xs), *free), arg))


def fold_result(res: Tensor, carry: int, length: int, y: int) -> tuple[Tensor, Tensor]:
    """A FOLD's value split into the final carries (carry,) and the ys (length, y)."""
    return res[:carry], res[carry:].reshape(length, y)


# ---- the front end ---------------------------------------------------------------------------------------------

def _leaves(value: Leaves | None, what: str) -> tuple[list[Tensor], bool]:
    """(the Tensors of value, whether it was a tuple or list)."""
    if value is None: return [], False
    if isinstance(value, Tensor): return [value], False
    if isinstance(value, (tuple, list)) and all(isinstance(v, Tensor) for v in value): return list(value), True
    raise TypeError(f"scan: {what} must be a Tensor or a tuple of Tensors, got {type(value).__name__}")


def _pack(leaves: Sequence[Tensor], dtype: DType, what: str, lead: tuple[int, ...] = ()) -> Tensor:
    """Leaves flattened (after `lead` axes) and joined, in dtype."""
    for t in leaves:
        if t.dtype is not dtype:
            raise DTypeError(f"scan: {what} holds {t.dtype.name}, but the carry is {dtype.name}: the carry, xs and ys "
                             f"share one float dtype (cast them)")
    flat = [t.reshape(*lead, -1) for t in leaves]
    return flat[0] if len(flat) == 1 else Tensor.cat(*flat, dim=len(lead))


def _unpack(flat: Tensor, shapes: Sequence[tuple[int, ...]], lead: tuple[int, ...] = ()) -> list[Tensor]:
    out, start = [], 0
    for shape in shapes:
        size = prod(shape)
        out.append(flat[(*(slice(None),) * len(lead), slice(start, start + size))].reshape(*lead, *shape))
        start += size
    return out


def _rebuild(leaves: list[Tensor], as_tuple: bool) -> Any:
    return tuple(leaves) if as_tuple else (leaves[0] if leaves else None)


def scan(step: Callable[[Any, Any], tuple[Any, Any]], init: Leaves, xs: Leaves | None = None,
         length: int | None = None, *, unroll: bool | None = None) -> tuple[Any, Any]:
    """Loop `carry, y = step(carry, x)` over the rows x of xs (each leaf's first axis); returns (final carry, ys)
    with the ys stacked along a new first axis (None where step returns no y).

    `init` and each `y` are a Tensor or a tuple of Tensors of one float dtype; `xs` likewise with a first axis of
    `length` (None: no x, give `length`). `unroll`: True calls step `length` times (straight-line code), False
    keeps one loop, None decides by size (SCAN_UNROLL_NODES)."""
    carry_leaves, carry_tuple = _leaves(init, "init")
    x_leaves, x_tuple = _leaves(xs, "xs")
    if not carry_leaves: raise ValueError("scan: init must hold at least one Tensor")
    dtype = carry_leaves[0].dtype
    if not dtype.is_float: raise DTypeError(f"scan: the carry is {dtype.name}; scan carries floats")
    lengths = {t.shape[0] if t.ndim else None for t in x_leaves} | ({length} if length is not None else set())
    if len(lengths) != 1 or None in lengths:
        raise ShapeError(f"scan: every leaf of xs needs a first axis of the loop's length, and length, if given, must "
                         f"match it: got xs shapes {[t.shape for t in x_leaves]} and length {length}")
    n = lengths.pop()
    assert n is not None
    if not isinstance(n, int) or n < 0: raise ValueError(f"scan: length must be an int >= 0, got {n!r}")
    carry_shapes = [t.shape for t in carry_leaves]
    x_shapes = [t.shape[1:] for t in x_leaves]
    traced: dict[str, Any] = {}

    def call_step(carry: list[Tensor], x: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        got = step(_rebuild(carry, carry_tuple), _rebuild(x, x_tuple) if x_leaves else None)
        if not isinstance(got, tuple) or len(got) != 2:
            raise TypeError("scan: step must return a pair (carry, y), y None when there is none")
        new, y = _leaves(got[0], "the carry step returns")[0], _leaves(got[1], "the y step returns")
        if [t.shape for t in new] != carry_shapes:
            raise ShapeError(f"scan: step returns a carry of shapes {[t.shape for t in new]}, but init has "
                             f"{carry_shapes}: the carry keeps its shapes from step to step")
        traced.setdefault("y", ([t.shape for t in y[0]], y[1]))
        return [t.cast(dtype) if t.dtype is not dtype else t for t in new], y[0]

    def body(c: list[Tensor], x: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        new, y = call_step(_unpack(c[0], carry_shapes), _unpack(x[0], x_shapes) if x else [])
        return [_pack(new, dtype, "the carry")], _pack(y, dtype, "a y") if y else None

    carry0 = _pack(carry_leaves, dtype, "init")
    packed_xs = _pack(x_leaves, dtype, "xs", (n,)) if x_leaves else None
    res = None if unroll else make_fold(n, [carry0], [] if packed_xs is None else [packed_xs], body)
    small = res is not None and n * len(UOp(Ops.SINK, dtypes.void, res.uop.arg.out).toposort()) <= SCAN_UNROLL_NODES
    if res is None or (unroll is None and small):
        carry, ys = carry_leaves, []
        for k in range(n):
            carry, y = call_step(carry, [t[k] for t in x_leaves])
            ys.append(y)
        y_shapes, y_tuple = traced["y"] if "y" in traced else ([], False)
        stacked = [Tensor.stack(*(y[i] for y in ys)) if n else Tensor.zeros(0, *s, dtype=dtype)
                   for i, s in enumerate(y_shapes)]
        return _rebuild(carry, carry_tuple), _rebuild(stacked, y_tuple)
    y_shapes, y_tuple = traced["y"]
    carry_flat, ys_flat = fold_result(res, carry0.shape[0], n, res.uop.arg.y_size)
    return _rebuild(_unpack(carry_flat, carry_shapes), carry_tuple), \
        _rebuild(_unpack(ys_flat, y_shapes, (n,)), y_tuple)


def fold(step: Callable[[Any, Any], Any], init: Leaves, xs: Leaves | None = None, length: int | None = None, *,
         unroll: bool | None = None) -> Any:
    """The final carry of `carry = step(carry, x)` over the rows of xs (CasADi's fold): scan without ys."""
    return scan(lambda c, x: (step(c, x), None), init, xs, length, unroll=unroll)[0]


__all__ = ["scan", "fold", "make_fold", "fold_result", "placeholder", "split", "join", "offsets"]
