"""GROUP: a reduction split across the threads of a workgroup, its partial results met in shared memory.

Before: `REDUCE(value(r), r)` over a reduce loop r of size S (any other reduce loops beside it), stored by every
        thread of the kernel.
After (Opt(GROUP, axis, n), n dividing S): each of n threads l of a workgroup reduces its share, r = r' * n + l
        (neighbouring threads read neighbouring elements), stores its partial result in a DEFINE_LOCAL array at its
        slot, and after a BARRIER every thread reduces the n partials of its workgroup in slot order; thread l = 0
        stores the result (the others' stores are gated off, so no two threads write one element):

    acc = REDUCE(x[r], r)        ->  part = REDUCE(x[r' * n + l], r');  temp[slot(l)] = part;  BARRIER
                                      acc = REDUCE(temp[slot(l2)], l2);  if (l == 0) out[...] = acc

`slot(l)` also counts the threads of the LOCAL opts applied before (the workgroup's other dimensions), so that each
thread of a workgroup has a slot of its own; a LOCAL or UPCAST after a GROUP is refused (opt.py), and so is a GROUP
after an UPCAST (its lanes would need a slot each). l is a LOCAL range: codegen/gpudims.py makes it a thread index. The
partials are summed in another order than a loop's: a device that must give a loop's bits (Renderer.reassociates
False) gets no GROUP. GROUPTOP splits the loop the other way: thread l reduces the l-th chunk of S / n consecutive
elements, r = l * (S / n) + r' (each thread's reads contiguous, neighbouring threads' S / n apart).
"""

from __future__ import annotations

import math

from ember.dtype import AddrSpace, dtypes
from ember.renderer import Renderer
from ember.uop.ops import AxisKind, Ops, UOp
from ember.uop.symbolic import symbolic
from ember.uop.upat import graph_rewrite, substitute


class GroupError(ValueError):
    """Why a GROUP does not apply (opt.py raises it as a KernelOptError)."""


def check_group(sink: UOp, amount: int, renderer: Renderer | None) -> list[UOp]:
    """The LOCAL ranges the kernel has already (the other dimensions of its workgroups); GroupError where a GROUP by
    `amount` does not fit the device."""
    if any(u.op is Ops.DEFINE_LOCAL for u in sink.toposort()): raise GroupError("grouped twice")
    if any(u.op is Ops.RANGE and u.arg.kind is not AxisKind.REDUCE and u.src[0].op is not Ops.CONST
           for u in sink.toposort()):  # (it stays a loop around the barrier: gpudims maps fixed sizes only)
        raise GroupError("an output loop of symbolic size")
    if any(u.op is Ops.RANGE and u.arg.kind is AxisKind.UPCAST for u in sink.toposort()):
        raise GroupError("a GROUP after an UPCAST (expand.py does not copy a barrier per lane)")
    others = sorted((u for u in sink.toposort() if u.op is Ops.RANGE and u.arg.kind is AxisKind.LOCAL),
                    key=lambda r: r.arg.axis)
    if renderer is None: return others
    if not (renderer.has_local and renderer.has_shared):
        raise GroupError(f"{renderer.device} has no workgroups with shared memory")
    if not renderer.reassociates: raise GroupError(f"{renderer.device} must sum in loop order")
    threads = amount * math.prod(int(r.src[0].arg) for r in others)
    if threads > renderer.local_threads or amount > max(renderer.local_max):
        raise GroupError(f"{threads} threads per workgroup, more than {renderer.device}'s {renderer.local_threads}")
    reduces = sum(1 for u in sink.toposort() if u.op is Ops.REDUCE)
    if threads * 8 * reduces > renderer.shared_max:
        raise GroupError(f"{threads * 8 * reduces} bytes of shared memory, more than {renderer.device}'s "
                         f"{renderer.shared_max}")
    return others


def group_reduce(sink: UOp, rng: UOp, amount: int, fresh: int, renderer: Renderer | None, top: bool = False) -> UOp:
    """`sink` with the reductions over `rng` split across `amount` threads (see the module docstring); `top`
    (GROUPTOP): thread l reduces the l-th of `amount` consecutive chunks, r = l * (S / n) + r'."""
    others = check_group(sink, amount, renderer)
    size, dtype = int(rng.src[0].arg), rng.dtype
    lane = UOp.range(amount, fresh, AxisKind.LOCAL, dtype)
    outer = UOp.range(size // amount, rng.arg.axis, AxisKind.REDUCE, dtype) if size > amount else None
    index = lane if outer is None else lane * (size // amount) + outer if top else outer * amount + lane
    threads = amount * math.prod(int(r.src[0].arg) for r in others)

    def slot(first: UOp) -> UOp:
        stride, at = amount, first
        for r in others:
            at, stride = at + r * stride, stride * int(r.src[0].arg)
        return at

    mapping: dict[UOp, UOp] = {}
    for k, red in enumerate(u for u in sink.toposort() if u.op is Ops.REDUCE and rng in u.src[1:]):
        rest = tuple(s for s in red.src[1:] if s is not rng) + ((outer,) if outer is not None else ())
        value = substitute(red.src[0], {rng: index})
        partial = UOp(Ops.REDUCE, red.dtype, (value, *rest), red.arg) if rest else value
        temp = UOp(Ops.DEFINE_LOCAL, red.dtype.ptr(threads, AddrSpace.LOCAL), arg=k)
        stored = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, temp.dtype, (temp, slot(lane))), partial))
        barrier = UOp(Ops.BARRIER, dtypes.void, (stored,))
        step = UOp.range(amount, fresh + 1 + k, AxisKind.REDUCE, dtype)
        read = UOp(Ops.LOAD, red.dtype, (UOp(Ops.INDEX, temp.dtype, (temp.after(barrier), slot(step))),))
        mapping[red] = UOp(Ops.REDUCE, red.dtype, (read, step), red.arg)
    sink = substitute(sink, mapping)
    first = lane < 1  # the thread that stores

    def gated(st: UOp) -> UOp:  # STORE(INDEX(buf, offset[, gate]), value) written by the first thread only
        idx = st.src[0]
        gate = first if len(idx.src) < 3 else idx.src[2] & first
        return st.replace(src=(idx.replace(src=(*idx.src[:2], gate)), *st.src[1:]))
    sink = substitute(sink, {st: gated(st) for st in sink.toposort()
                             if st.op is Ops.STORE and st.src[0].src[0].op is Ops.DEFINE_GLOBAL})
    return graph_rewrite(sink, symbolic, name="opt GROUP")
