"""The memory planner: intermediates of a schedule whose lifetimes do not overlap share one arena per device.

`plan_memory(items, keep)` walks a schedule (engine/realize.py runs the same list) and finds each buffer's lifetime:
the step of its first access to the step of its last, in item order. A buffer not in `keep` whose first access is a
write is an intermediate; the planner gives each a 64-byte aligned offset in its device's arena such that two
intermediates live at the same step never share a byte (best fit over the interval graph, largest first).
`MemoryPlan.apply()` then allocates each arena once and hands every planned buffer a view of it; the engine's JIT
plans a captured schedule once and replays it in less memory (an MLP's forward and backward: see
tests/engine/test_memory.py).

Before apply: each buffer allocates its own memory on first use. After: a planned buffer's `_raw` is
`arena[offset:offset + nbytes]`; kernels see a pointer into the arena, nothing else changes. A plan owns its
arenas: `release()`, or the plan being collected, takes the views back (the buffers allocate their own again on next
use), so that a view never reaches the allocator's free list, where two overlapping views could be handed to two
live buffers.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ember.device import Buffer, Device
from ember.schedule.kernelize import ExecItem, LoopItem

ALIGN = 64  # bytes: a cache line, and the widest vector load (AVX-512) never straddles two; a device whose views
# need more (an OpenCL sub-buffer's base address alignment: 128 bytes on PoCL) gets its own (Allocator.align)


def alignment(device: str) -> int:
    """The alignment of the offsets in `device`'s arena: ALIGN, or the coarser one its views need."""
    return max(ALIGN, Device[device].allocator.align)


@dataclass(frozen=True, slots=True)
class Lifetime:
    """The steps (item indices) from a buffer's first access to its last, both included."""

    first: int
    last: int

    def overlaps(self, other: Lifetime) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True, slots=True)
class Access:
    """One access to a buffer at a step of the schedule; `is_write` false for a read."""

    buf: Buffer
    step: int
    is_write: bool


@dataclass(eq=False, slots=True)
class Placement:
    """Where a planned buffer lives: `offset` bytes into its device's arena, for the steps of `lifetime`."""

    buf: Buffer
    offset: int
    lifetime: Lifetime

    @property
    def end(self) -> int: return self.offset + self.buf.nbytes


def accesses(items: Sequence[ExecItem | LoopItem]) -> list[Access]:
    """Every buffer access of the schedule in the order it happens; all of a LoopItem's at the LoopItem's step.

    A kernel reads its inputs while it writes its outputs, so its reads come first: a buffer one kernel both reads
    and writes (in place) is read before it is written there. A loop reads its initial carries and its xs, writes
    the carries and the step's x, runs the body, reads the body's outputs and writes the carries and the result."""
    found: list[Access] = []
    for step, item in enumerate(items): found += item_accesses(item, step)
    return found


def item_accesses(item: ExecItem | LoopItem, step: int) -> list[Access]:
    if isinstance(item, ExecItem):
        return [Access(b, step, False) for b in item.bufs[item.outs:]] + \
               [Access(b, step, True) for b in item.bufs[:item.outs]]
    inner = [Access(b, step, False) for b in (*item.carry0, *item.xs)]
    inner += [Access(b, step, True) for b in (*item.carry, *item.x)]
    for body_item in item.body: inner += item_accesses(body_item, step)
    inner += [Access(b, step, False) for b in item.out]
    return inner + [Access(b, step, True) for b in (*item.carry, item.result)]


def lifetimes(items: Sequence[ExecItem | LoopItem], keep: set[Buffer] | frozenset[Buffer] = frozenset()
              ) -> dict[Buffer, Lifetime]:
    """The lifetime of every intermediate of the schedule: a buffer not in `keep`, of at least one byte, whose first
    access is a write. A buffer first read holds what someone put there before the schedule (an input, whether or
    not `keep` names it) and keeps its own memory."""
    first: dict[Buffer, Access] = {}
    last: dict[Buffer, int] = {}
    for access in accesses(items):
        first.setdefault(access.buf, access)
        last[access.buf] = access.step
    return {b: Lifetime(a.step, last[b]) for b, a in first.items() if a.is_write and b not in keep and b.nbytes > 0}


def place(spans: dict[Buffer, Lifetime]) -> list[Placement]:
    """An offset for each buffer such that two on one device whose lifetimes overlap never share a byte: the largest
    first, each at the best-fitting gap (the smallest that holds it) between the buffers already placed that it
    overlaps, else above them all. Offsets are multiples of the device's alignment. O(n^2) in the buffers, a few ms
    for a thousand."""
    placed: list[Placement] = []
    for buf in sorted(spans, key=lambda b: (-b.nbytes, spans[b].first)):
        span = spans[buf]
        conflicts = sorted((p for p in placed if p.buf.device == buf.device and p.lifetime.overlaps(span)),
                           key=lambda p: p.offset)
        best: int | None = None
        best_gap = 0
        cursor = 0
        for p in conflicts:
            gap = p.offset - cursor
            if gap >= buf.nbytes and (best is None or gap < best_gap): best, best_gap = cursor, gap
            cursor = max(cursor, aligned(p.end, alignment(buf.device)))
        placed.append(Placement(buf, cursor if best is None else best, span))
    return placed


def aligned(nbytes: int, align: int = ALIGN) -> int:
    return -(-nbytes // align) * align


@dataclass(eq=False)
class MemoryPlan:
    """Where each intermediate of a schedule lives, and the memory the schedule needs with and without the plan.

    `placements` name the planned buffers; `kept` are the schedule's other buffers (inputs, outputs, whatever `keep`
    named), each in memory of its own. `arena_bytes[device]` is the arena a device's intermediates share."""

    placements: list[Placement]
    kept: list[Buffer]
    arena_bytes: dict[str, int]
    arenas: dict[str, Any] = field(default_factory=dict)  # device -> its arena, once applied
    _detach: Any = field(default=None, init=False, repr=False)  # the weakref.finalize taking the views back

    @property
    def planned_bytes(self) -> int:
        """What the planned buffers would take each in memory of its own."""
        return sum(p.buf.nbytes for p in self.placements)

    @property
    def peak_bytes(self) -> int:
        """The bytes the schedule holds at once under the plan: the arenas and every kept buffer."""
        return sum(self.arena_bytes.values()) + sum(b.nbytes for b in self.kept)

    @property
    def unplanned_bytes(self) -> int:
        """The bytes of every buffer of the schedule, each in its own memory (the most it holds without a plan)."""
        return self.planned_bytes + sum(b.nbytes for b in self.kept)

    def apply(self) -> MemoryPlan:
        """Allocate each device's arena (once) and give every planned buffer its view of it; returns self.

        Before: the planned buffers hold memory of their own or none. After: each `_raw` is its slice of the arena,
        aligned to its device's alignment; what it held before is dropped (an intermediate's first access is a write,
        so nothing is lost). Apply before anything takes the buffers' addresses (a NativeGraph, a captured argument
        array)."""
        for device, nbytes in self.arena_bytes.items():
            if device not in self.arenas and nbytes: self.arenas[device] = aligned_arena(device, nbytes)
        views: list[tuple[Buffer, Any]] = []
        for p in self.placements:
            view = self.arenas[p.buf.device][p.offset:p.end]
            p.buf._raw = view
            views.append((p.buf, view))
        if self._detach is not None: self._detach.detach()
        arenas = [(device, arena.base) for device, arena in self.arenas.items()]
        self._detach = weakref.finalize(self, detach_views, views, arenas)
        return self

    def release(self) -> None:
        """Take the views back: each planned buffer still holding its view of the arena holds nothing again and
        allocates memory of its own on next use; the arenas are dropped."""
        if self._detach is not None: self._detach()
        self._detach = None
        self.arenas.clear()

    def describe(self) -> str:
        """One line for DEBUG output: buffers planned, arena and peak bytes against the unplanned total."""
        arenas = ", ".join(f"{d} {format_bytes(n)}" for d, n in sorted(self.arena_bytes.items())) or "none"
        saved = 1 - self.peak_bytes / self.unplanned_bytes if self.unplanned_bytes else 0.0
        return (f"memory plan: {len(self.placements)} intermediates ({format_bytes(self.planned_bytes)}) in arenas "
                f"of {arenas}; {len(self.kept)} kept buffers; peak {format_bytes(self.peak_bytes)} of "
                f"{format_bytes(self.unplanned_bytes)} unplanned ({saved:.0%} saved)")

    def __str__(self) -> str: return self.describe()


def detach_views(views: list[tuple[Buffer, Any]], arenas: list[tuple[str, Any]]) -> None:
    """Each buffer still holding the view it was given holds nothing again (a plan's finalizer: it must not refer to
    the plan). Runs before the buffers can be collected, since it holds them: a view never reaches Allocator.free.
    Then the arenas' allocations go back to their allocators, as a freed buffer does: the next plan of the same
    size (an eager schedule run again) takes one without a page fault per 4 KiB."""
    for buf, view in views:
        if buf._raw is view: buf._raw = None
    for device, allocation in arenas:
        if (dev := Device.cached(device)) is not None: dev.allocator.free(allocation, allocation.nbytes)


def aligned_arena(device: str, nbytes: int) -> Any:
    """`nbytes` of the device's memory starting at a boundary of its alignment, sliced into views by `arena[a:b]`, its
    allocation at `.base` (Allocator.arena)."""
    return Device[device].allocator.arena(nbytes, alignment(device))


def format_bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale: return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def plan_memory(items: Sequence[ExecItem | LoopItem], keep: set[Buffer] | frozenset[Buffer] = frozenset()
                ) -> MemoryPlan:
    """The memory plan of a schedule whose buffers in `keep` (inputs, outputs, anything read outside the schedule)
    keep their own memory. Plans only; `apply()` moves the buffers into the arenas."""
    spans = lifetimes(items, keep)
    placements = place(spans)
    arena_bytes: dict[str, int] = {}
    for p in placements:
        arena_bytes[p.buf.device] = max(arena_bytes.get(p.buf.device, 0), aligned(p.end, alignment(p.buf.device)))
    every = {id(a.buf): a.buf for a in accesses(items)}
    kept = [b for b in every.values() if b not in spans]
    return MemoryPlan(placements, kept, arena_bytes)
