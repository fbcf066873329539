"""Native graph replay (runtime/graph.py): a captured sequence of kernels run by one C call.

Oracle: the same kernels run one by one through engine/realize.py (run_items), bit for bit; for a swapped buffer,
numpy. The timing test prints the per-kernel cost of a replay against calls one by one and checks only their order.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from ember import Tensor
from ember.device import Buffer, Device
from ember.dtype import dtypes
from ember.engine.realize import get_runner, prepare_runners, run_items
from ember.renderer import ProgramSpec
from ember.renderer.cstyle import CRenderer
from ember.runtime.graph import NativeGraph
from ember.runtime.ops_cpu import CPUProgram
from ember.schedule.kernelize import ExecItem, LoopItem, kernels

DEVICE = Device["CPU"]
rng = np.random.default_rng(0)


def data(*shape: int) -> Tensor:
    return Tensor(rng.uniform(-2, 2, shape).astype(np.float32))


def captured(items: list[ExecItem | LoopItem]) -> NativeGraph:
    """The schedule's kernels as a graph, each with its buffers (compiled first, as the JIT captures them)."""
    assert not any(isinstance(item, LoopItem) for item in items)
    prepare_runners([(item.bufs[0].device, item.ast) for item in kernels(items)])
    return NativeGraph([(get_runner(item.bufs[0].device, item.ast).program, item.bufs, ())  # type: ignore[misc]
                        for item in kernels(items)])


def written(items: list[ExecItem | LoopItem]) -> list[Buffer]:
    return list({id(b): b for item in kernels(items) for b in item.bufs[:item.outs]}.values())


def replay_equals_one_by_one(items: list[ExecItem | LoopItem]) -> NativeGraph:
    """Run the schedule one by one, clobber what it wrote, replay it as a graph: the bits must come back."""
    run_items(items)
    want = [b.numpy() for b in written(items)]
    graph = captured(items)
    for b in written(items): b.copyin(np.full(b.size, 1234.5, np.float32))
    graph()
    for b, w in zip(written(items), want, strict=True): assert b.numpy().tobytes() == w.tobytes()
    return graph


def test_an_mlp_step_replays_bit_for_bit() -> None:
    x, w1, w2 = data(16, 32), Tensor(rng.standard_normal((32, 64)).astype(np.float32), requires_grad=True), \
        Tensor(rng.standard_normal((64, 8)).astype(np.float32), requires_grad=True)
    loss = (x @ w1).relu().matmul(w2).log_softmax(-1).mean()
    loss.backward()
    items = loss.schedule(w1.grad, w2.grad)  # type: ignore[arg-type]
    assert len(replay_equals_one_by_one(items)) == len(items) > 3


def test_threaded_kernels_run_on_the_pool_in_a_graph() -> None:
    x, y = data(1 << 20), data(1 << 20)
    items = ((x * 2 + 1).exp() * y).sqrt().sum().schedule(x.sin() + y)
    threads = [get_runner("CPU", item.ast).spec.threads for item in kernels(items)]
    if DEVICE.renderer.cores < 2: pytest.skip("one core: no kernel is threaded")
    assert max(threads) > 1, threads
    graph = replay_equals_one_by_one(items)
    assert max(graph.threads) > 1


def test_every_cpu_kernel_has_a_task_entry_and_exported_code_none() -> None:
    """The CPU's renderer gives each kernel `{name}_task`; a CRenderer without task_entries (the C++ export's) only
    threaded ones, which the pool needs."""
    (item,) = (data(16) + 1).schedule()
    runner = get_runner("CPU", item.ast)
    assert runner.spec.threads == 1 and runner.program.task is not None  # type: ignore[attr-defined]
    assert f"void {runner.spec.name}_task(" in runner.spec.src
    from ember.codegen import get_program
    assert "_task(" not in get_program(item.ast, CRenderer(DEVICE.renderer.vector_bytes, 1)).src


def test_swapping_an_input_buffer_changes_every_use() -> None:
    a = data(64)
    items = ((a + 1) * a).schedule()
    graph = captured(items)
    (item,) = items
    new = rng.uniform(-2, 2, 64).astype(np.float32)
    graph.set_buffer(item.bufs[1], new)
    out = np.empty(64, np.float32)
    graph.set_buffer(item.bufs[0], out)
    graph()
    assert out.tobytes() == ((new + 1) * new).tobytes()
    graph.set_buffer(item.bufs[1], Buffer("CPU", 64, dtypes.float32).copyin(new * 2))  # a Buffer does too
    graph()
    assert out.tobytes() == ((new * 2 + 1) * (new * 2)).tobytes()


def test_set_buffer_refuses_a_stranger_and_too_little_memory() -> None:
    (item,) = (data(64) + 1).schedule()
    graph = captured([item])
    with pytest.raises(KeyError, match="not a buffer of this graph"):
        graph.set_buffer(np.zeros(64, np.float32), np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="128 bytes in place of 256"):
        graph.set_buffer(item.bufs[1], np.zeros(32, np.float32))


VARIABLE_KERNEL = """#include <stdint.h>
void shift(float *restrict data0, const float *restrict data1, const int32_t n, const int32_t by) {
  for (int32_t i = 0; i < n; i++) data0[i] = data1[i] + (float)by;
}
void shift_task(void **args, int32_t core) {
  (void)core; shift((float*)args[0], (float*)args[1], (int32_t)(intptr_t)args[2], (int32_t)(intptr_t)args[3]);
}
"""


def test_variables_pass_through_as_words() -> None:
    program = CPUProgram(ProgramSpec.from_source("shift", VARIABLE_KERNEL, "CPU", 2, ("by", "n")),
                         DEVICE.compiler.compile_cached(VARIABLE_KERNEL))
    x, y, z = np.arange(8, dtype=np.float32), np.zeros(8, np.float32), np.zeros(8, np.float32)
    NativeGraph([(program, [y, x], [5, -3]), (program, [z, y], [8, 100])])()
    assert y.tolist() == [-3, -2, -1, 0, 1, 0, 0, 0]  # n = 5 elements shifted by -3
    assert z.tolist() == [97, 98, 99, 100, 101, 100, 100, 100]


def test_a_kernel_without_a_task_entry_is_refused() -> None:
    source = "void lone(float *restrict data0) { data0[0] = 1; }\n"
    program = CPUProgram(ProgramSpec.from_source("lone", source, "CPU", 1), DEVICE.compiler.compile_cached(source))
    with pytest.raises(ValueError, match=r"without a task entry.*\['lone'\]"):
        NativeGraph([(program, [np.zeros(1, np.float32)], ())])


def test_a_graph_costs_less_per_kernel_than_calls_one_by_one() -> None:
    """100 kernels of x + 1 on 16 floats, ping-ponging between two arrays: the replay's cost per kernel against
    CPUProgram.__call__'s (printed; run with -s to see). Best of 20 each."""
    (item,) = (data(16) + 1).schedule()
    program = get_runner("CPU", item.ast).program
    a, b = np.zeros(16, np.float32), np.zeros(16, np.float32)
    pairs = [(b, a) if k % 2 == 0 else (a, b) for k in range(100)]
    graph = NativeGraph([(program, list(pair), ()) for pair in pairs])  # type: ignore[misc]

    def one_by_one() -> None:
        for out, x in pairs: program(out, x)  # type: ignore[operator]

    def best(run: object, repeats: int = 20) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()  # type: ignore[operator]
            times.append(time.perf_counter() - start)
        return min(times) / len(pairs)

    a[:] = 0
    graph()
    assert a.tolist() == [100.0] * 16  # 100 increments, the last into a
    loop, replay = best(one_by_one), best(graph)
    print(f"\nper kernel: one by one {loop * 1e6:.3f} us, graph {replay * 1e6:.3f} us ({loop / replay:.0f}x)")
    assert replay < loop

