"""Run a schedule: compile each kernel AST once (per device), call it with its buffers, count the work.

`GlobalCounters` adds up kernels run, ALU ops, bytes moved and time; DEBUG=1 prints each kernel as it runs,
DEBUG=2 also the schedule, DEBUG=4 the source of each newly compiled kernel.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ember.codegen import get_program, kernel_name
from ember.device import Device
from ember.helpers import DEBUG, colored
from ember.renderer import ProgramSpec
from ember.schedule.kernelize import ExecItem
from ember.uop.ops import UOp


class GlobalCounters:
    """Totals since the last reset(): kernels run, ALU ops, bytes loaded/stored, seconds in kernels."""

    kernel_count: int = 0
    global_ops: int = 0
    global_mem: int = 0
    time_sum_s: float = 0.0

    @staticmethod
    def reset() -> None:
        GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem = 0, 0, 0
        GlobalCounters.time_sum_s = 0.0


@dataclass(eq=False)
class CompiledRunner:
    """A program ready to run: its spec and the device's loaded binary."""

    spec: ProgramSpec
    program: object

    def __call__(self, item: ExecItem, wait: bool) -> float | None:
        return self.program(*(b.raw for b in item.bufs), wait=wait)  # type: ignore[operator]


_runners: dict[tuple[str, UOp], CompiledRunner] = {}


def get_runner(device: str, ast: UOp) -> CompiledRunner:
    """The compiled program for `ast` on `device`, built on first use and kept for the process."""
    key = (device, ast)
    if key not in _runners:
        dev = Device[device]
        spec = get_program(ast, dev.renderer)
        if DEBUG >= 4: print(spec.src)
        _runners[key] = CompiledRunner(spec, dev.program(spec.name, dev.compiler.compile_cached(spec.src)))
    return _runners[key]


def print_schedule(schedule: list[ExecItem]) -> None:
    """One line per kernel: its name, what it writes and what it reads."""
    print(colored(f"schedule: {len(schedule)} kernels", "magenta"))
    for i, item in enumerate(schedule):
        reads = ", ".join(f"{b.dtype.name}[{b.size}]" for b in item.bufs[item.outs:]) or "nothing"
        writes = ", ".join(f"{b.dtype.name}[{b.size}]" for b in item.bufs[:item.outs])
        print(f"  {i:3d} {kernel_name(item.ast):24s} writes {writes} reads {reads}")


def run_schedule(schedule: list[ExecItem]) -> None:
    """Run every item in order, updating GlobalCounters."""
    if DEBUG >= 2: print_schedule(schedule)
    for item in schedule:
        runner = get_runner(item.bufs[0].device, item.ast)
        start = time.perf_counter()
        elapsed = runner(item, wait=DEBUG >= 1)
        elapsed = elapsed if elapsed is not None else time.perf_counter() - start
        GlobalCounters.kernel_count += 1
        GlobalCounters.global_ops += runner.spec.flops
        GlobalCounters.global_mem += runner.spec.mem_bytes
        GlobalCounters.time_sum_s += elapsed
        if DEBUG >= 1:
            print(f"*** {item.bufs[0].device:4s} {GlobalCounters.kernel_count:4d} {runner.spec.name:24s} "
                  f"{len(item.bufs)} bufs  {elapsed * 1e6:9.2f} us  {runner.spec.flops / 1e6:8.2f} MOPs  "
                  f"{runner.spec.mem_bytes / 1e6:8.2f} MB")
