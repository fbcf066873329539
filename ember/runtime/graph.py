"""Native graph replay on the CPU: a captured sequence of kernels run by one C call.

A replay through Python costs about a microsecond and a half per kernel (ctypes builds the argument list, drops and
takes the GIL); a `NativeGraph` builds each kernel's argument array once and runs them all in `ember_graph_run`,
a C loop over `{name}_task(args, core)` entries (every CPU kernel has one: CRenderer task_entries), threaded
kernels on the CPU's pool. The engine's JIT (engine/jit.py) captures a function's kernels and replays them here;
`set_buffer` points every use of one buffer at new memory, so a replay with new inputs costs no rebuilding.

Measured on the 2-core development machine (tests/runtime/test_graph.py's timing test prints the first two, best
of 20): 100 kernels of x + 1 on 16 floats cost, per kernel, 3.0 us one by one through CPUProgram.__call__ and
0.012 us in a graph (the kernels' own time); a graph call costs 0.8 us on top; `set_buffer` 0.06 us per use of the
buffer. A threaded 1M-float kernel: 55 us one by one, 48 us in a graph.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from collections.abc import Sequence
from typing import Any

from ember.device import Buffer, Device
from ember.runtime.ops_cpu import CCompiler, CPUProgram, loadable_file, thread_pool

# Runs kernel k as its task entry: on the pool (pool_run is ops_cpu's ember_pool_run, passed in, so the graph and
# the kernels share one pool) when threads[k] > 1, else on the caller as slice 0. Stops at a kernel the pool refused.
GRAPH_SOURCE = """#include <stdint.h>
typedef void (*task_fn)(void **args, int32_t core);
typedef int (*pool_fn)(task_fn fn, void **args, int32_t threads);
int ember_graph_run(int32_t n, task_fn *fns, void ***args, const int32_t *threads, pool_fn pool_run) {
  for (int32_t k = 0; k < n; k++) {
    if (threads[k] > 1) { if (pool_run(fns[k], args[k], threads[k]) != 0) return k + 1; }
    else fns[k](args[k], 0);
  }
  return 0;
}
"""


@functools.cache
def graph_runner(compiler: CCompiler) -> Any:
    """`ember_graph_run(n, fns, args, threads, pool_run)`, compiled once per compiler (cached like a kernel)."""
    lib = compiler.compile_cached(GRAPH_SOURCE)
    run = ctypes.CDLL(loadable_file(f"ember_graph-{hashlib.sha256(lib).hexdigest()[:20]}.so", lib)).ember_graph_run
    run.argtypes = [ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    run.restype = ctypes.c_int
    return run


GraphEntry = tuple[CPUProgram, Sequence[Any], Sequence[int]]  # (kernel, its buffers by slot, its variables' values)


def raw_memory(buf: Any) -> Any:
    """The host array behind `buf`: a Buffer's raw memory (allocated now if it has none) or the array itself."""
    return buf.raw if isinstance(buf, Buffer) else buf


class NativeGraph:
    """Kernels with their arguments, run in order by one native call: `graph()`.

    Each entry is (program, buffers, variable values): buffers are Buffers or host arrays (numpy), by the kernel's
    slots; values are ints, in the order of the kernel's variables. The pointers are taken at construction: a Buffer
    that gets other memory later (a memory plan applied) needs `set_buffer` or a new graph. The graph keeps every
    array it points into alive."""

    def __init__(self, entries: Sequence[GraphEntry], compiler: CCompiler | None = None) -> None:
        compiler = compiler or Device["CPU"].compiler
        self.run, self.pool_run = graph_runner(compiler), ctypes.cast(thread_pool(compiler), ctypes.c_void_p)
        self.names = [program.name for program, _, _ in entries]
        self.programs = [program for program, _, _ in entries]  # (their libraries stay loaded while the graph is)
        tasks = [program.task.value if program.task is not None else None for program, _, _ in entries]
        if None in tasks:
            missing = [name for name, task in zip(self.names, tasks, strict=True) if task is None]
            raise ValueError(f"NativeGraph: kernels without a task entry (render with task_entries): {missing}")
        self.count = len(entries)
        self.fns = (ctypes.c_void_p * self.count)(*tasks)
        self.threads = (ctypes.c_int32 * self.count)(*(program.threads for program, _, _ in entries))
        self.args: list[ctypes.Array[ctypes.c_void_p]] = []
        self.positions: dict[int, list[tuple[int, int]]] = {}  # id(buffer as given) -> (kernel, slot) of every use
        self.memory: dict[int, Any] = {}  # id(buffer as given) -> the array its pointer is into (kept alive)
        self.given: dict[int, Any] = {}  # id -> the buffer as given (kept alive, so the id stays its own)
        for k, (_, bufs, values) in enumerate(entries):
            arrays = [raw_memory(b) for b in bufs]
            # a value as the pointer-sized word the task entry casts back ((int32_t)(intptr_t)): its two's complement
            words = [v & 0xFFFFFFFFFFFFFFFF for v in values]
            self.args.append((ctypes.c_void_p * (len(bufs) + len(values)))(*(a.ctypes.data for a in arrays), *words))
            for slot, (b, a) in enumerate(zip(bufs, arrays, strict=True)):
                self.positions.setdefault(id(b), []).append((k, slot))
                self.memory[id(b)], self.given[id(b)] = a, b
        self.table = (ctypes.c_void_p * self.count)(*(ctypes.addressof(a) for a in self.args))

    def set_buffer(self, buf: Any, memory: Any) -> None:
        """Point every use of `buf` (a buffer as given to the constructor) at `memory`, a Buffer or host array of at
        least as many bytes; the graph keeps it alive. Costs about 0.06 us per use."""
        if id(buf) not in self.positions:
            raise KeyError(f"NativeGraph.set_buffer: {buf!r} is not a buffer of this graph")
        array = raw_memory(memory)
        if array.nbytes < self.memory[id(buf)].nbytes:
            raise ValueError(f"NativeGraph.set_buffer: {array.nbytes} bytes in place of {self.memory[id(buf)].nbytes}")
        address = array.ctypes.data
        for k, slot in self.positions[id(buf)]: self.args[k][slot] = address
        self.memory[id(buf)] = array

    def __call__(self) -> None:
        """Run every kernel in order, in one native call (ctypes lets go of the GIL meanwhile)."""
        if (failed := self.run(self.count, self.fns, self.table, self.threads, self.pool_run)) != 0:
            program = self.names[failed - 1]
            raise RuntimeError(f"{program}: the pool could not start {self.threads[failed - 1]} threads (at most 1024)")

    def __len__(self) -> int: return self.count
