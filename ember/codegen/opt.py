"""Kernel optimizations as values: `Opt(op, axis, amount)`, checked and applied to a rangeified kernel.

Before: rangeify's `SINK(STORE, ...)` (see rangeify.py), its loops RANGEs of kind GLOBAL/LOOP (output) and REDUCE.
After:  the same kernel with some loops split. `Opt(UPCAST, a, n)` splits output axis `a` (size S) into
        `a_outer*n + a_lane` (where n does not divide S: ceil(S/n) steps, the lanes past S gated off), `a_lane` a
        RANGE of kind UPCAST that expand.py turns into vector lanes or unrolled copies; UNROLL does the same to a
        reduce axis (kind UNROLL, n dividing S); `Opt(THREAD, a, n)` splits it into `core*(S/n) + a_inner`,
        `core` a SPECIAL node: the kernel runs once per core, each doing one slice. On a device with workgroups
        (Renderer.has_local), `Opt(LOCAL, a, n)` splits it into `a_outer*n + a_local`, `a_local` a RANGE of kind
        LOCAL that codegen/gpudims.py makes a thread index of the workgroup (n dividing S). `Opt(TC, k, i)` puts a
        matmul over reduce axis k on the renderer's tensor core i (codegen/tensorcore.py): first, before any other
        opt but SWAP; LOCALs may follow (more warps per workgroup).

An axis number indexes `kernel_axes(sink)`: the output loops in order, then the reduce loops; a lane range is no
longer an axis. The first UPCAST or UNROLL applied is the one expand.py makes vector lanes of (each lane a memory
neighbour where the axis is contiguous); later ones unroll into copies, whose accumulators are independent:

    Opt(UPCAST, 1, 16), Opt(UPCAST, 0, 4) on C[i, j] = sum_k A[i, k] * B[k, j]
    -> i = i'*4 + u0, j = j'*16 + u1: each step of (i', j') computes a 4x16 tile, 4 rows x 2 vectors of 8.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from ember.codegen.group import GroupError, group_reduce
from ember.codegen.tensorcore import TensorCoreError, apply_tensor_core
from ember.renderer import Renderer
from ember.uop.ops import AxisKind, Ops, RangeArg, UOp
from ember.uop.symbolic import symbolic
from ember.uop.upat import PatternMatcher, UPat, graph_rewrite, substitute


class OptOps(enum.Enum):
    """What an Opt does to its axis."""

    UPCAST = "UP"  # output axis -> outer loop x lanes (vector or unrolled)
    UNROLL = "UN"  # reduce axis -> outer loop x lanes (vector partial results or independent accumulators)
    THREAD = "TH"  # output axis -> one slice per CPU core
    LOCAL = "LO"  # output axis -> workgroups x threads of a workgroup
    GROUP = "GR"  # reduce axis -> threads of a workgroup, partials met in shared memory (codegen/group.py)
    GROUPTOP = "GT"  # as GROUP, each thread a chunk of consecutive elements
    PADTO = "PA"  # output axis -> padded to a multiple of amount, the steps past its end gated off
    SWAP = "SW"  # exchange the nesting of two output loops (amount: the other axis)
    TC = "TC"  # reduce axis -> a matmul on tensor core number `amount` of the renderer (codegen/tensorcore.py)


@dataclass(frozen=True, order=True)
class Opt:
    """One optimization: `op` applied to axis `axis` (an index into `kernel_axes`) with amount `amount`."""

    op: OptOps
    axis: int
    amount: int

    def __str__(self) -> str: return f"{self.op.value}{self.axis}x{self.amount}"

    @staticmethod
    def parse(text: str) -> Opt:
        """The Opt that str() printed as `text` (the program cache keeps opts as text)."""
        axis, amount = text[2:].split("x")
        return Opt(next(op for op in OptOps if op.value == text[:2]), int(axis), int(amount))


class KernelOptError(ValueError):
    """An Opt that does not apply to the kernel: the axis does not exist, is of the wrong kind, or the amount does
    not divide its size."""


LANE_KINDS = (AxisKind.UPCAST, AxisKind.UNROLL)
THREAD_KINDS = (AxisKind.LOCAL, AxisKind.WARP)  # the ranges gpudims makes thread indices of a workgroup
SPLIT_KINDS = (*LANE_KINDS, *THREAD_KINDS)  # the parts an opt splits off an axis, which no later opt names


def kernel_axes(sink: UOp) -> list[UOp]:
    """The kernel's loops an Opt can name: output loops by position, then reduce loops (lane ranges excluded)."""
    ranges = [u for u in sink.toposort() if u.op is Ops.RANGE and u.arg.kind not in SPLIT_KINDS]
    return sorted(ranges, key=lambda r: (r.arg.kind is AxisKind.REDUCE, r.arg.axis))


def range_size(rng: UOp) -> int:
    return int(rng.src[0].arg)


def apply_opt(sink: UOp, opt: Opt, name: str = "kernel", renderer: Renderer | None = None) -> UOp:
    """`sink` with `opt` applied; KernelOptError (naming the kernel, the opt and why) where it does not apply, on
    any device or on `renderer`'s (None: no device's limits are checked, as a test of the opt alone)."""
    axes = kernel_axes(sink)
    if not 0 <= opt.axis < len(axes): raise KernelOptError(f"{name}: {opt}: no axis {opt.axis} ({len(axes)} axes)")
    rng = axes[opt.axis]
    amount, reduces = opt.amount, rng.arg.kind is AxisKind.REDUCE
    if opt.op in (OptOps.LOCAL, OptOps.UPCAST) and any(u.op is Ops.DEFINE_LOCAL for u in sink.toposort()):
        raise KernelOptError(f"{name}: {opt}: {opt.op.name} after GROUP (a GROUP's slots count the LOCALs and "
                             f"UPCASTs before it)")
    if opt.op is OptOps.SWAP: return swap(sink, rng, axes, opt, name)  # (loop order: any size)
    if opt.op is OptOps.TC: return tensor_core(sink, rng, opt, name, renderer)
    if opt.op in (OptOps.UPCAST, OptOps.UNROLL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.THREAD) and \
            any(u.op is Ops.WMMA for u in sink.toposort()):
        raise KernelOptError(f"{name}: {opt}: {opt.op.name} after TC (a WMMA's fragments are vectors already)")
    if rng.src[0].op is not Ops.CONST:
        if opt.op in (OptOps.UPCAST, OptOps.LOCAL) and rng.arg.kind is not AxisKind.REDUCE and 2 <= amount:
            if opt.op is OptOps.LOCAL: check_local(sink, rng, opt, amount, name, renderer)
            kind = AxisKind.UPCAST if opt.op is OptOps.UPCAST else AxisKind.LOCAL
            return split_symbolic(sink, rng, amount, fresh_axis(sink), opt, kind)
        raise KernelOptError(f"{name}: {opt}: axis {opt.axis} has a symbolic size (only UPCAST and LOCAL split one)")
    size = range_size(rng)
    on_reduce = opt.op in (OptOps.UNROLL, OptOps.GROUP, OptOps.GROUPTOP)
    if reduces != on_reduce:
        raise KernelOptError(f"{name}: {opt}: axis {opt.axis} is {'a reduce' if reduces else 'an output'} axis; "
                             f"{opt.op.name} applies to {'reduce' if on_reduce else 'output'} axes")
    if opt.op is OptOps.UPCAST and 2 <= amount < 2 * size and size % amount:
        return upcast_padded(sink, rng, amount, fresh_axis(sink), opt)
    if opt.op is OptOps.PADTO:
        if not 2 <= amount <= 2 * size:
            raise KernelOptError(f"{name}: {opt}: pads the size {size} to a multiple of 2 .. {2 * size}")
        return pad_to(sink, rng, amount, opt)
    if amount < 2 or size % amount:
        padding = " (an UPCAST that does not divide its axis must be less than twice its size)" \
            if opt.op is OptOps.UPCAST and amount >= 2 else ""
        raise KernelOptError(f"{name}: {opt}: {amount} does not divide the size {size}{padding}")
    fresh = fresh_axis(sink)
    dtype = rng.dtype
    if opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
        try:
            return group_reduce(sink, rng, amount, fresh, renderer, top=opt.op is OptOps.GROUPTOP)
        except GroupError as e:
            raise KernelOptError(f"{name}: {opt}: {e}") from None
    if opt.op is OptOps.LOCAL:
        check_local(sink, rng, opt, amount, name, renderer)
        inner = UOp.range(amount, fresh, AxisKind.LOCAL, dtype)
        new = UOp.range(size // amount, rng.arg.axis, rng.arg.kind, dtype) * amount + inner if size > amount else inner
    elif opt.op is OptOps.THREAD:
        if renderer is not None and renderer.has_local:
            raise KernelOptError(f"{name}: {opt}: {renderer.device} runs workgroups, not CPU threads (use LOCAL)")
        if any(u.op is Ops.SPECIAL for u in sink.toposort()): raise KernelOptError(f"{name}: {opt}: threaded twice")
        if renderer is not None and amount > renderer.max_threads:
            raise KernelOptError(f"{name}: {opt}: more than {renderer.max_threads} threads ({renderer.device})")
        core = UOp(Ops.SPECIAL, dtype, (UOp.const(dtype, amount),), "core")
        inner = UOp.range(size // amount, rng.arg.axis, rng.arg.kind, dtype) if size > amount else None
        new = core * (size // amount) + inner if inner is not None else core
    else:
        lane = UOp.range(amount, fresh, AxisKind.UNROLL if reduces else AxisKind.UPCAST, dtype)
        outer = UOp.range(size // amount, rng.arg.axis, rng.arg.kind, dtype) if size > amount else None
        new = outer * amount + lane if outer is not None else lane
        if reduces:  # the REDUCEs over rng now reduce over its two parts
            parts = (outer, lane) if outer is not None else (lane,)
            sink = substitute(sink, {r: r.replace(src=tuple(p for s in r.src for p in (parts if s is rng else (s,))))
                                     for r in sink.toposort() if r.op is Ops.REDUCE and rng in r.src[1:]})
    sink = substitute(sink, {rng: new})
    return graph_rewrite(sink, symbolic, name=f"opt {opt}")


def check_local(sink: UOp, rng: UOp, opt: Opt, amount: int, name: str, renderer: Renderer | None) -> None:
    """A LOCAL opt fits the device: it has workgroups, and the kernel's threads per workgroup stay within its
    local_threads, at most len(local_max) LOCAL axes, none longer than the longest local_max (gpudims leaves one
    that fits no dimension a loop)."""
    if renderer is None: return
    if not renderer.has_local: raise KernelOptError(f"{name}: {opt}: {renderer.device} has no workgroups")
    if not all(rng in st.ranges for st in sink.toposort() if st.op is Ops.STORE):
        raise KernelOptError(f"{name}: {opt}: axis {opt.axis} is not every output's (gpudims maps only those)")
    locals_ = [range_size(u) for u in sink.toposort() if u.op is Ops.RANGE and u.arg.kind in THREAD_KINDS]
    if len(locals_) >= len(renderer.local_max):
        raise KernelOptError(f"{name}: {opt}: more than {len(renderer.local_max)} LOCAL axes")
    if amount > max(renderer.local_max):
        raise KernelOptError(f"{name}: {opt}: {amount} threads along one axis, more than {renderer.device}'s "
                             f"{max(renderer.local_max)}")
    if amount * math.prod(locals_) > renderer.local_threads:
        raise KernelOptError(f"{name}: {opt}: {amount * math.prod(locals_)} threads per workgroup, more than "
                             f"{renderer.device}'s {renderer.local_threads}")


def tensor_core(sink: UOp, rng: UOp, opt: Opt, name: str, renderer: Renderer | None) -> UOp:
    """TC on reduce axis `rng` with the renderer's tensor core number `opt.amount`."""
    if rng.arg.kind is not AxisKind.REDUCE or rng.src[0].op is not Ops.CONST:
        raise KernelOptError(f"{name}: {opt}: axis {opt.axis} is not a reduce axis of known size")
    cores = renderer.tensor_cores if renderer is not None else ()
    if not 0 <= opt.amount < len(cores):
        device = renderer.device if renderer is not None else "no device"
        raise KernelOptError(f"{name}: {opt}: {device} has {len(cores)} tensor cores")
    try:
        return apply_tensor_core(sink, rng, cores[opt.amount], fresh_axis(sink))
    except TensorCoreError as e:
        raise KernelOptError(f"{name}: {opt}: {cores[opt.amount]}: {e}") from None


def fresh_axis(sink: UOp) -> int:
    return 1 + max(u.arg.axis for u in sink.toposort() if u.op is Ops.RANGE)


def split_symbolic(sink: UOp, rng: UOp, amount: int, fresh: int, opt: Opt, kind: AxisKind) -> UOp:
    """UPCAST (or LOCAL) of an output loop of symbolic size n (a batch): ceil(n / amount) steps of `amount` lanes
    (threads of a workgroup). The lanes past n read the last row (an address clamped to n - 1: in bounds, no test
    per load) and store nothing (the stores are gated by row < n)."""
    end, dtype = rng.src[0], rng.dtype
    lane = UOp.range(amount, fresh, kind, dtype)
    outer = UOp.range((end + (amount - 1)) // amount, rng.arg.axis, rng.arg.kind, dtype)
    row = outer * amount + lane
    inside = row < end

    def gated(st: UOp) -> UOp:  # STORE(INDEX(buf, offset[, gate]), value) written only where row < n
        idx = st.src[0]
        gate = inside if len(idx.src) < 3 else idx.src[2] & inside
        return st.replace(src=(idx.replace(src=(*idx.src[:2], gate)), *st.src[1:]))
    sink = substitute(sink, {st: gated(st) for st in sink.toposort() if st.op is Ops.STORE and
                             rng in st.src[0].src[1].ranges})
    sink = substitute(sink, {rng: inside.where(row, end - 1)})
    return graph_rewrite(sink, symbolic + pm_clamped_row, name=f"opt {opt}")


def clamped(w: UOp, n: UOp) -> bool:
    """Whether w is `(x < n).where(x, n - 1)` for an x >= 0 (split_symbolic's row): a value in [0, n)."""
    if w.op is not Ops.WHERE or w.src[0].op is not Ops.CMPLT or w.src[0].src != (w.src[1], n): return False
    last = w.src[2]
    return w.src[1].vmin >= 0 and last.op is Ops.ADD and last.src[0] is n and last.src[1].op is Ops.CONST and \
        last.src[1].arg == -1


# a row clamped into [0, n) is its own remainder mod n (a reshape's index of the batch axis), its quotient 0
pm_clamped_row = PatternMatcher([
    (UPat.var("w") % UPat.var("n"), lambda w, n: w if clamped(w, n) else None),
    (UPat.var("w") // UPat.var("n"), lambda w, n: UOp.const(w.dtype, 0) if clamped(w, n) else None),
])


def upcast_padded(sink: UOp, rng: UOp, amount: int, fresh: int, opt: Opt) -> UOp:
    """UPCAST of an output loop of fixed size S by an `amount` that does not divide it (a 14-wide row of a
    convolution in vectors of 8): ceil(S / amount) steps of `amount` lanes, the lanes past S gated off in every
    access that moves with the loop: their loads read no memory and give 0, their stores write nothing (expand.py
    makes the loads of consecutive lanes one masked vector load). Unlike a symbolic size's clamp (split_symbolic)
    a gate keeps the addresses of a vector's lanes consecutive."""
    size, dtype = range_size(rng), rng.dtype
    lane = UOp.range(amount, fresh, AxisKind.UPCAST, dtype)
    steps = -(-size // amount)
    row = UOp.range(steps, rng.arg.axis, rng.arg.kind, dtype) * amount + lane if steps > 1 else lane
    inside = row < size

    def gated(idx: UOp) -> UOp:  # INDEX(buf, offset[, gate]) valid only where row < S
        return idx.replace(src=(*idx.src[:2], inside if len(idx.src) < 3 else idx.src[2] & inside))
    sink = substitute(sink, {u: gated(u) for u in sink.toposort() if u.op is Ops.INDEX and
                             u.src[0].op is Ops.DEFINE_GLOBAL and rng in u.src[1].ranges})
    sink = substitute(sink, {rng: row})
    return graph_rewrite(sink, symbolic, name=f"opt {opt}")


def pad_to(sink: UOp, rng: UOp, amount: int, opt: Opt) -> UOp:
    """PADTO of an output loop of fixed size S: ceil(S / amount) * amount steps, those past S gated off in every
    access that moves with the loop (their loads read no memory, their stores write nothing), so that a later LOCAL
    or UPCAST by `amount` divides it (a row of 1000 in workgroups of 64: 1024 threads, 24 idle)."""
    size = range_size(rng)
    padded = rng.replace(src=(UOp.const(rng.dtype, -(-size // amount) * amount),))
    inside = padded < size

    def gated(idx: UOp) -> UOp:  # INDEX(buf, offset[, gate]) valid only where the step is inside S
        return idx.replace(src=(*idx.src[:2], inside if len(idx.src) < 3 else idx.src[2] & inside))
    sink = substitute(sink, {u: gated(u) for u in sink.toposort() if u.op is Ops.INDEX and
                             u.src[0].op is Ops.DEFINE_GLOBAL and rng in u.src[1].ranges})
    return graph_rewrite(substitute(sink, {rng: padded}), symbolic, name=f"opt {opt}")


def swap(sink: UOp, rng: UOp, axes: list[UOp], opt: Opt, name: str) -> UOp:
    """The loops of `rng` and axis `opt.amount` nested the other way round (their ids, which order loops, swapped)."""
    if not (0 <= opt.amount < len(axes) and opt.amount != opt.axis and rng.arg.kind is not AxisKind.REDUCE and
            axes[opt.amount].arg.kind is not AxisKind.REDUCE):
        raise KernelOptError(f"{name}: {opt}: SWAP needs two different output axes")
    other = axes[opt.amount]
    parked = rng.replace(arg=RangeArg(-1, rng.arg.kind))  # rng's new id is other's: park it first
    sink = substitute(sink, {rng: parked})
    sink = substitute(sink, {other: other.replace(arg=rng.arg)})
    return substitute(sink, {parked: rng.replace(arg=other.arg)})


def apply_opts(sink: UOp, opts: tuple[Opt, ...] | list[Opt], name: str = "kernel", renderer: Renderer | None = None
               ) -> UOp:
    for opt in opts: sink = apply_opt(sink, opt, name, renderer)
    return sink
