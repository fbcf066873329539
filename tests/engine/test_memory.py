"""The memory planner (engine/memory.py): lifetimes, placements that never overlap, and schedules that run the same.

Oracles: lifetimes written out by hand for small schedules; for placements, every pair of buffers live at one step
checked for shared bytes; for real schedules (an MLP's forward and backward, a loop), the bits the schedule computes
with each buffer in its own memory.
"""

from __future__ import annotations

import gc
import itertools
import random

import numpy as np
import pytest

from ember import Tensor
from ember.device import Buffer, buffer_of
from ember.dtype import dtypes
from ember.engine.memory import ALIGN, Lifetime, MemoryPlan, lifetimes, plan_memory
from ember.engine.realize import run_items
from ember.scan import scan
from ember.schedule.kernelize import ExecItem, LoopItem, create_schedule
from ember.uop.ops import Ops, UOp

AST = UOp(Ops.SINK, dtypes.void, ())  # hand-made schedules are planned, never run


def buf(size: int = 16, device: str = "CPU") -> Buffer:
    return Buffer(device, size, dtypes.float32)


def kernel(writes: list[Buffer], reads: list[Buffer]) -> ExecItem:
    return ExecItem(AST, [*writes, *reads], len(writes))


def chain(n: int, size: int = 256) -> tuple[list[ExecItem], list[Buffer]]:
    """b[k+1] = f(b[k]) for k < n: each intermediate is read only by the next kernel."""
    bufs = [buf(size) for _ in range(n + 1)]
    return [kernel([bufs[k + 1]], [bufs[k]]) for k in range(n)], bufs


def assert_no_overlap(plan: MemoryPlan) -> None:
    """No two buffers live at one step on one device share a byte; offsets are aligned; arenas hold every buffer."""
    for p in plan.placements:
        assert p.offset % ALIGN == 0, p.offset
        assert p.end <= plan.arena_bytes[p.buf.device]
    for p, q in itertools.combinations(plan.placements, 2):
        if p.buf.device != q.buf.device or not p.lifetime.overlaps(q.lifetime): continue
        assert p.end <= q.offset or q.end <= p.offset, f"{p} and {q} live at once and share bytes"


# ---- lifetimes ---------------------------------------------------------------------------------------------------

def test_lifetimes_of_a_chain_run_from_the_writer_to_the_last_reader() -> None:
    items, bufs = chain(4)
    spans = lifetimes(items, {bufs[0], bufs[-1]})
    assert spans == {bufs[1]: Lifetime(0, 1), bufs[2]: Lifetime(1, 2), bufs[3]: Lifetime(2, 3)}


def test_a_buffer_read_by_several_kernels_lives_to_the_last() -> None:
    x, a, b, c, out = buf(), buf(), buf(), buf(), buf()
    items = [kernel([a], [x]), kernel([b], [a]), kernel([c], [b]), kernel([out], [a, c])]
    spans = lifetimes(items, {x, out})
    assert spans[a] == Lifetime(0, 3) and spans[b] == Lifetime(1, 2) and spans[c] == Lifetime(2, 3)


def test_a_buffer_first_read_is_an_input_even_if_keep_does_not_name_it() -> None:
    x, a, out = buf(), buf(), buf()
    spans = lifetimes([kernel([a], [x]), kernel([out], [a])], set())
    assert x not in spans and a in spans and out in spans  # out: written, never read (keep it to keep it)


def test_a_kernel_that_reads_and_writes_a_buffer_first_reads_it() -> None:
    """In place at its first access: the kernel reads what was there before the schedule, so it is an input."""
    x, a, out = buf(), buf(), buf()
    items = [ExecItem(AST, [x, x], 1), kernel([a], [x]), ExecItem(AST, [a, a], 1), kernel([out], [a])]
    spans = lifetimes(items, {out})
    assert x not in spans
    assert spans[a] == Lifetime(1, 3)  # written at 1, updated in place at 2, read at 3


def test_a_buffer_written_again_lives_to_its_last_access() -> None:
    x, a, b, out = buf(), buf(), buf(), buf()
    items = [kernel([a], [x]), kernel([b], [a]), kernel([a], [b]), kernel([out], [b])]
    assert lifetimes(items, {x, out})[a] == Lifetime(0, 2)


def test_kept_empty_and_dead_buffers() -> None:
    x, empty, dead, out = buf(), buf(0), buf(), buf()
    items = [kernel([empty, dead], [x]), kernel([out], [x, empty])]
    spans = lifetimes(items, {out})
    assert empty not in spans and out not in spans
    assert spans[dead] == Lifetime(0, 0)  # written and never read: its write still must not clobber anything


def test_a_loop_holds_all_its_buffers_for_its_step() -> None:
    x, xs, carry0, carry, row, t, step_out, result, after = (buf() for _ in range(9))
    body = [kernel([t], [carry, row]), kernel([step_out], [t])]
    loop = LoopItem(4, body, [carry0], [xs], [carry], [row], [carry, step_out], result)
    items = [kernel([carry0], [x]), loop, kernel([after], [result])]
    spans = lifetimes(items, {x, xs, after})
    assert spans[carry0] == Lifetime(0, 1)
    assert all(spans[b] == Lifetime(1, 1) for b in (carry, row, t, step_out))
    assert spans[result] == Lifetime(1, 2)


# ---- placements --------------------------------------------------------------------------------------------------

def test_a_chain_needs_two_buffers() -> None:
    items, bufs = chain(10, size=1000)
    plan = plan_memory(items, {bufs[0], bufs[-1]})
    assert_no_overlap(plan)
    assert len(plan.placements) == 9
    assert plan.arena_bytes == {"CPU": 2 * 4032}  # 4000 bytes, aligned to 64
    assert plan.peak_bytes == 2 * 4032 + 2 * 4000 < plan.unplanned_bytes == 11 * 4000


@pytest.mark.parametrize("seed", range(20))
def test_random_lifetimes_never_share_bytes_while_both_live(seed: int) -> None:
    rng = random.Random(seed)
    x = buf()
    made: list[Buffer] = [x]
    items = []
    for _ in range(40):
        reads = rng.sample(made, min(len(made), rng.randint(1, 3)))
        writes = [buf(rng.choice([0, 1, 7, 100, 1000, 5000])) for _ in range(rng.randint(1, 2))]
        items.append(kernel(writes, reads))
        made += writes
    plan = plan_memory(items, {x})
    assert_no_overlap(plan)
    assert plan.peak_bytes <= plan.unplanned_bytes + sum(ALIGN for _ in plan.placements)


def test_each_device_has_an_arena_of_its_own() -> None:
    x, a, b, out = buf(), buf(100), buf(100, device="NULL"), buf()
    plan = plan_memory([kernel([a, b], [x]), kernel([out], [a, b])], {x, out})
    assert plan.arena_bytes == {"CPU": 448, "NULL": 448}
    assert {p.buf.device: p.offset for p in plan.placements} == {"CPU": 0, "NULL": 0}


def test_describe_names_the_peak() -> None:
    items, bufs = chain(6, size=1000)
    text = plan_memory(items, {bufs[0], bufs[-1]}).describe()
    assert text == ("memory plan: 5 intermediates (20.00 KB) in arenas of CPU 8.06 KB; 2 kept buffers; "
                    "peak 16.06 KB of 28.00 KB unplanned (43% saved)"), text


# ---- real schedules ----------------------------------------------------------------------------------------------

def outputs_schedule(*tensors: Tensor) -> tuple[list[ExecItem | LoopItem], list[Buffer]]:
    """The schedule realizing `tensors` and the buffers that will hold them."""
    items, views = create_schedule([t.uop for t in tensors], tensors[0].device)
    outs = []
    for t in tensors:
        view = views[t.uop]
        while view.op is not Ops.BUFFER: view = view.src[0]
        outs.append(buffer_of(view))
    return items, outs


def mlp_forward_backward() -> list[Tensor]:
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((32, 64)).astype(np.float32))
    w1, w2, w3 = (Tensor(rng.standard_normal(s).astype(np.float32) * 0.1, requires_grad=True)
                  for s in ((64, 128), (128, 128), (128, 10)))
    loss = ((x @ w1).relu() @ w2).tanh().matmul(w3).log_softmax(-1).mean()
    loss.backward()
    return [loss, w1.grad, w2.grad, w3.grad]


def test_an_mlp_forward_and_backward_gives_the_same_bits_in_its_arena() -> None:
    """All of this schedule's intermediates are live at its peak, so the plan shares no bytes here (the saving is
    test_a_chain_needs_two_buffers'); it must still place them apart in the arena and keep the bits."""
    items, outs = outputs_schedule(*mlp_forward_backward())
    run_items(items)
    want = [b.numpy() for b in outs]
    plan = plan_memory(items, set(outs)).apply()
    assert_no_overlap(plan)
    assert plan.placements and plan.peak_bytes <= plan.unplanned_bytes, plan.describe()
    assert all(p.buf.raw.base is not None for p in plan.placements)  # views of the arena
    for b in outs: b.copyin(np.full(b.size, np.nan, np.float32))
    run_items(items)
    for got, wanted in zip((b.numpy() for b in outs), want, strict=True): assert got.tobytes() == wanted.tobytes()


def test_a_loop_runs_the_same_with_its_buffers_planned() -> None:
    x = Tensor(np.linspace(-1, 1, 48, dtype=np.float32).reshape(6, 8))
    def step(carry: Tensor, row: Tensor) -> tuple[Tensor, Tensor]:
        new = (carry * 0.5 + row).tanh()
        return new, new.sum()
    final, ys = scan(step, Tensor.zeros(8), x, unroll=False)
    items, outs = outputs_schedule(final * 2, ys + 1)
    assert any(isinstance(item, LoopItem) for item in items)
    run_items(items)
    want = [b.numpy() for b in outs]
    plan_memory(items, set(outs)).apply()
    run_items(items)
    for got, wanted in zip((b.numpy() for b in outs), want, strict=True): assert got.tobytes() == wanted.tobytes()


def test_a_released_or_collected_plan_takes_its_views_back() -> None:
    items, bufs = chain(4)
    plan = plan_memory(items, {bufs[0], bufs[-1]}).apply()
    assert all(b._raw is not None for b in bufs[1:-1])
    plan.release()
    assert all(b._raw is None for b in bufs[1:-1]) and not plan.arenas
    plan.apply()
    del plan
    gc.collect()
    assert all(b._raw is None for b in bufs[1:-1])  # no view of a dead plan's arena is left to reach the allocator
