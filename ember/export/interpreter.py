"""A NumericalFunction's plan evaluated with numpy: the calls made while its native code compiles.

A big function's first compile takes seconds (the cart-pole rollout with its jacobians: 10k straight-line
operations, 3-4 s of codegen and g++); numpy evaluates the same kernel ASTs in milliseconds. So a first call with
nothing in the cache evaluates here and starts the native build in a thread (function.py); calls switch to the
native code once it is loaded.

Every operation means here what the rendered C means, so the results are the native code's bit for bit (but for
the sign of a zero in derivative arithmetic, below):
- float64 and float32 + - * / and sqrt are IEEE operations in both, never fused (the native code is compiled with
  -ffp-contract=off); sin and cos are ember's (renderer/sincos.py: the same operations in numpy), the other
  libm functions (float64 only) the same C library's, called through `exec_alu`;
- integer ops wrap at their width; / and % truncate toward zero, and a zero divisor gives 0 (render_int_division);
- MAX is `(a > b || a != a) ? a : b`, which keeps NaN and picks b on ties (render_max);
- a reduction folds its terms from the identity, in row-major order of the reduced axes, one at a time: the
  accumulator loop the lowerer makes (and its unrolled form, which rangeify builds in the same order); a single
  term is the result itself, as rangeify folds a loop of one step (-0.0 stays -0.0);
- a forward-mode product (arg TANGENT) with a zero factor is 0 whatever the other (a structural zero), inf and NaN
  included: codegen folds the zeros it sees as constants, and the native code tests the others at run time
  (renderer/cstyle.render_tangent_product). A zero's sign can differ where codegen folded one and this did not.
What cannot promise that is refused (`refusal` says why) and compiles first as before: float16 and bfloat16 (C
rounds their intermediates in float), float32 libm functions (sinf is not sin rounded to float), ops missing below.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.codegen.rangeify import UNROLL_AXIS_LIMIT, branching_axes
from ember.device import Buffer
from ember.dtype import dtypes, float_to_int_array, to_numpy
from ember.helpers import prod
from ember.renderer.sincos import computes as computes_sincos
from ember.renderer.sincos import numpy_sincos
from ember.schedule.kernelize import ExecItem, LoopItem, kernels
from ember.uop.interpret import exec_alu
from ember.uop.ops import TANGENT, GroupOp, Ops, UOp

Value = np.ndarray
# per-call cost model, in seconds, for `cost`: numpy's overhead per op, its time per element, a Python call per
# element (libm functions through exec_alu), a Python-level step of a reduction
OP_SECONDS, ELEMENT_SECONDS, PYTHON_ELEMENT_SECONDS, STEP_SECONDS = 2e-6, 2e-9, 1e-6, 3e-6
SINCOS_OPS = 70  # numpy ops of one sin or cos (renderer/sincos.numpy_sincos)


def apply_movement(u: UOp, x: np.ndarray, trailing: int = 0) -> np.ndarray:
    """The movement op u on x, which may carry `trailing` extra axes after u's (sparsity.py carries one)."""
    extra = x.shape[x.ndim - trailing:]
    if u.op is Ops.RESHAPE: return x.reshape((*u.arg, *extra))
    if u.op is Ops.PERMUTE: return x.transpose((*u.arg, *range(len(u.arg), len(u.arg) + trailing)))
    if u.op is Ops.EXPAND: return np.broadcast_to(x, (*u.arg, *extra))
    if u.op is Ops.PAD: return np.pad(x, (*u.arg, *((0, 0),) * trailing))
    if u.op is Ops.SHRINK: return x[tuple(slice(b, e) for b, e in u.arg)]
    assert u.op is Ops.FLIP, f"not a movement op: {u.op.name}"
    return np.flip(x, tuple(i for i, f in enumerate(u.arg) if f))


def _per_element(u: UOp, *xs: Value) -> Value:
    """exec_alu on each element: the libm functions as C calls them, with C's answers outside their domains."""
    fn = np.frompyfunc(lambda *v: exec_alu(u.op, u.dtype, v), len(xs), 1)
    return np.asarray(fn(*xs), dtype=to_numpy(u.dtype))


def _int_division(u: UOp, a: Value, b: Value) -> Value:
    """C's truncating / and % where the divisor is not 0 or -1; 0 for a zero divisor, -a (wrapped) and 0 for -1."""
    wide = np.uint64 if u.dtype is dtypes.uint64 else np.int64
    a, b = a.astype(wide), b.astype(wide)
    special = (b == 0) | (b == -1) if wide is np.int64 else b == 0
    d = np.where(special, 1, b)
    q = a // d
    r = a - q * d
    fix = (r != 0) & ((a < 0) != (d < 0))  # floor -> toward zero
    q, r = np.where(fix, q + 1, q), np.where(fix, r - d, r)
    out = q if u.op is Ops.IDIV else r
    out = np.where(b == 0, 0, out)
    if wide is np.int64: out = np.where(b == -1, -a if u.op is Ops.IDIV else 0, out)
    return out.astype(to_numpy(u.dtype))


def _max(a: Value, b: Value) -> Value:
    return np.where((a > b) | (a != a), a, b)


def _cast(u: UOp, x: Value) -> Value:
    want = to_numpy(u.dtype)
    if u.dtype.is_int and x.dtype.kind == "f": return float_to_int_array(x, u.dtype)  # as exec_alu folds it
    return x.astype(want)


def _gather(u: UOp, x: Value, table: Value) -> Value:
    """x with axis u.arg indexed by table's values; an index outside the axis reads 0 (rangeify's index_gather)."""
    a = u.arg
    at = table.astype(np.int32).astype(np.int64)
    inside = (at >= 0) & (at < x.shape[a])
    taken = np.take(x, np.where(inside, at, 0), axis=a)
    return np.where(inside.reshape((1,) * a + at.shape + (1,) * (x.ndim - a - 1)), taken, np.zeros((), x.dtype))


def _scatter_add(u: UOp, src: Value, table: Value) -> Value:
    """src's index axes summed into u.arg.size positions by table's values, in the kernel's order (each position
    from 0, its terms in index order: np.add.at's); an index outside the axis adds nowhere (rangeify's
    store_scatter)."""
    a, n, k = u.arg.axis, u.arg.size, table.ndim
    at = table.astype(np.int32).astype(np.int64).reshape(-1)
    rows = np.moveaxis(src.reshape(src.shape[:a] + (-1,) + src.shape[a + k:]), a, 0)  # (index, lead, trail)
    inside = (at >= 0) & (at < n)
    out = np.zeros((n,) + rows.shape[1:], dtype=src.dtype)
    np.add.at(out, at[inside], rows[inside])
    return np.moveaxis(out, 0, a)


@functools.lru_cache(maxsize=4096)
def _unrolled_axes(u: UOp) -> tuple[int, ...]:
    """The reduced axes rangeify unrolls (index_reduce): their terms are summed per loop step, then accumulated.
    (A reduction read at a fixed position that index_reduce unrolls whole adds its terms in the loop's order:
    the same bits as looped, so it needs no case here.)"""
    axes, src = u.arg[1], u.src[0]
    small = prod(u.shape) <= UNROLL_AXIS_LIMIT and not any(n.op is Ops.REDUCE_AXIS for n in src.toposort())
    return tuple(sorted(branching_axes(src, src.shape) & set(axes))) if small else ()


def _fold(op: Ops, terms: Value, identity: Value) -> Value:
    """identity op t0 op t1 ... over the last axis, one rounding per term in order (an accumulator)."""
    if op is Ops.MAX:
        acc = np.broadcast_to(identity, terms.shape[:-1])
        for k in range(terms.shape[-1]): acc = _max(acc, terms[..., k])
        return acc
    ufunc = np.add if op is Ops.ADD else np.multiply  # accumulate runs in order: the loop's roundings
    start = np.broadcast_to(identity, (*terms.shape[:-1], 1))
    return ufunc.accumulate(np.concatenate([start, terms], axis=-1), axis=-1)[..., -1]


def _reduce(u: UOp, x: Value) -> Value:
    """As the kernel computes it: the unrolled axes' terms folded from the identity per loop step, row-major; those
    partial results accumulated over the looped axes from the identity, row-major. A loop of one step is folded
    to its term (rangeify drops it): no identity added there."""
    op, axes = u.arg
    identity = np.array(0 if op is Ops.ADD else 1 if op is Ops.MUL else u.dtype.min, dtype=x.dtype)
    if any(x.shape[a] == 0 for a in axes): return np.broadcast_to(identity, u.shape)
    unrolled = _unrolled_axes(u)
    looped = [a for a in axes if a not in unrolled]
    kept = [i for i in range(x.ndim) if i not in axes]
    terms = x.transpose((*kept, *looped, *unrolled)).reshape((*(x.shape[i] for i in kept), -1, prod(
        x.shape[a] for a in unrolled)))
    partial = _fold(op, terms, identity) if unrolled else terms[..., 0]
    out = partial[..., 0] if partial.shape[-1] == 1 else _fold(op, partial, identity)
    return out.reshape(u.shape)


def _tangent_product(a: Value, b: Value) -> Value:
    """A forward-mode product (arg TANGENT): a zero tangent is a structural zero that zeroes any partial derivative,
    inf and NaN included (symbolic.pm_structural_zeros folds the zeros codegen can see)."""
    both = np.multiply(a, b)
    if isinstance(both, float) and math.isfinite(both): return both  # a float64 scalar: finite factors
    return np.where(((a == 0) | (b == 0)) & ~(np.isfinite(a) & np.isfinite(b)), np.zeros((), both.dtype), both)


_BINARY: dict[Ops, Callable[[Value, Value], Value]] = {
    Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.FDIV: np.true_divide, Ops.CMPLT: np.less,
    Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal, Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or,
    Ops.XOR: np.bitwise_xor, Ops.SHL: np.left_shift, Ops.SHR: np.right_shift, Ops.MAX: _max}
_UNARY: dict[Ops, Callable[[Value], Value]] = {Ops.NEG: np.negative, Ops.SQRT: np.sqrt, Ops.TRUNC: np.trunc,
                                               Ops.RECIPROCAL: lambda x: np.true_divide(1, x)}


def refusal(items: Sequence[ExecItem | LoopItem]) -> str | None:
    """Why these kernels cannot be evaluated here bit for bit, or None when they can."""
    for item in kernels(items):
        for u in item.ast.toposort():
            d = u.dtype.scalar
            if d in (dtypes.float16, dtypes.bfloat16): return f"{d.name} arithmetic"
            if u.op in GroupOp.Transcendental and u.op is not Ops.SQRT and d is not dtypes.float64:
                return f"{u.op.name} in {d.name}"
            if u.op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG) and d is dtypes.bool: return f"{u.op.name} of bools"
            if u.op not in _KNOWN: return f"no rule for {u.op.name}"
    return None


def cost(items: Sequence[ExecItem | LoopItem]) -> float:
    """Estimated seconds per evaluation (see the constants above)."""
    total = 0.0
    for item in items:
        if isinstance(item, LoopItem):
            total += item.length * (cost(item.body) + 3 * OP_SECONDS)
            continue
        for u in item.ast.toposort():
            n = prod(u.shape) if u.op not in (Ops.SINK, Ops.STORE) else 0
            total += OP_SECONDS + n * ELEMENT_SECONDS
            if computes_sincos(u): total += SINCOS_OPS * (OP_SECONDS + n * ELEMENT_SECONDS)
            elif u.op in GroupOp.Transcendental and u.op is not Ops.SQRT: total += n * PYTHON_ELEMENT_SECONDS
            if u.op is Ops.REDUCE_AXIS and u.arg[0] is Ops.MAX:  # a Python loop over the terms
                total += prod(u.src[0].shape) // max(n, 1) * STEP_SECONDS
    return total


class Program:
    """The kernels prepared once: per kernel, its nodes in order as (slot, function of the source values, source
    slots), the slots its buffers fill and its stores. A call then costs a numpy op per node and little else."""

    def __init__(self, items: Sequence[ExecItem | LoopItem]) -> None:
        self.kernels: list[tuple[int, list[tuple[int, Buffer]], list[Step], list[tuple[int, int]]] | Loop] = []
        for item in items:
            if isinstance(item, LoopItem):
                self.kernels.append(Loop(item, Program(item.body)))
                continue
            order = [u for u in item.ast.toposort() if u.op is not Ops.SINK]
            slot = {u: i for i, u in enumerate(order)}
            buffers = [(slot[u], item.bufs[u.arg]) for u in order if u.op is Ops.DEFINE_GLOBAL]
            steps = [(slot[u], _function(u), tuple(slot[s] for s in u.src)) for u in order
                     if u.op not in (Ops.DEFINE_GLOBAL, Ops.STORE)]
            stores = [(slot[u.src[0]], slot[u.src[1]]) for u in order if u.op is Ops.STORE]
            self.kernels.append((len(order), buffers, steps, stores))

    def __call__(self, arrays: dict[int, np.ndarray]) -> None:
        """Run the kernels on flat numpy arrays, `arrays[id(buffer)]`, written in place (outputs and
        intermediates must be there, allocated)."""
        with np.errstate(all="ignore"):
            for kernel in self.kernels:
                if isinstance(kernel, Loop):
                    kernel(arrays)
                    continue
                size, buffers, steps, stores = kernel
                values: list[Any] = [None] * size
                for i, b in buffers: values[i] = arrays[id(b)]
                for i, fn, srcs in steps: values[i] = fn(*[values[j] for j in srcs])
                for target, value in stores: np.copyto(values[target], values[value], casting="unsafe")


Step = tuple[int, Callable[..., Value], tuple[int, ...]]


@dataclass(frozen=True)
class Loop:
    """A LoopItem's steps: x a view of each row of xs, the carry and the row of ys copied as the C++ copies them."""

    item: LoopItem
    body: Program

    def __call__(self, arrays: dict[int, np.ndarray]) -> None:
        item, n, c, y = self.item, self.item.length, self.item.carry_size, self.item.y_size
        result = arrays[id(item.result)]
        carries, outs = [arrays[id(b)] for b in item.carry], [arrays[id(b)] for b in item.out]
        rows = [arrays[id(xs)].reshape(n, x.size) for xs, x in zip(item.xs, item.x, strict=True)]
        for carry, start in zip(carries, item.carry0, strict=True): carry[:] = arrays[id(start)]
        for k in range(n):
            for x, r in zip(item.x, rows, strict=True): arrays[id(x)] = r[k]
            self.body(arrays)
            for carry, nxt in zip(carries, outs[:-1], strict=True):
                if carry is not nxt: carry[:] = nxt
            result[c + k * y:c + (k + 1) * y] = outs[-1]
        result[:c] = np.concatenate(carries)


def _function(u: UOp) -> Callable[..., Value]:
    """What u computes from its sources' values."""
    want = to_numpy(u.dtype)
    if u.op is Ops.CONST: return functools.partial(np.array, u.arg, dtype=want)
    if u.op is Ops.ARANGE: return functools.partial(np.arange, u.arg, dtype=want)
    if u.op in GroupOp.Movement: return functools.partial(apply_movement, u)
    if u.op in (Ops.DETACH, Ops.CONTIGUOUS_BACKWARD): return lambda x: x
    if u.op is Ops.REDUCE_AXIS: return functools.partial(_reduce, u)
    if u.op is Ops.GATHER: return functools.partial(_gather, u)
    if u.op is Ops.SCATTER_ADD: return functools.partial(_scatter_add, u)
    if u.op is Ops.WHERE: return np.where
    if u.op is Ops.CAST: return functools.partial(_cast, u)
    if u.op is Ops.BITCAST: return lambda x: np.ascontiguousarray(x).view(want)
    if u.op in (Ops.IDIV, Ops.MOD) and not u.dtype.is_float: return functools.partial(_int_division, u)
    if u.op is Ops.MUL and u.arg == TANGENT: return _tangent_product
    if computes_sincos(u): return functools.partial(numpy_sincos, u.op)  # ember's sin and cos, as the C computes
    if u.op in _UNARY or u.op in _BINARY:
        fn = _UNARY[u.op] if u.op in _UNARY else _BINARY[u.op]
        if all(s.dtype == u.dtype for s in u.src) or u.op in GroupOp.Comparison: return fn  # numpy keeps the dtype
        return lambda *xs: np.asarray(fn(*xs), dtype=want)
    return functools.partial(_per_element, u)  # libm functions, POW, ATAN2, float MOD (fmod)


_KNOWN = frozenset({Ops.DEFINE_GLOBAL, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.CONST, Ops.ARANGE, Ops.REDUCE_AXIS,
                    Ops.GATHER, Ops.SCATTER_ADD, Ops.WHERE, Ops.CAST, Ops.BITCAST, Ops.IDIV, Ops.MOD, Ops.STORE,
                    Ops.SINK, Ops.POW, Ops.ATAN2}) | \
    GroupOp.Movement | GroupOp.Transcendental | set(_UNARY) | set(_BINARY)
