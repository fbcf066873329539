"""The CPU device, assembled: ops_cpu.py's C compiler, renderer settings and programs, graph.py's jit replay."""

from __future__ import annotations

import functools

from ember.device import Allocator, Compiled
from ember.renderer.cstyle import CRenderer
from ember.runtime.graph import NativeGraph
from ember.runtime.ops_cpu import CCompiler, CPUProgram, cpu_cores, native_target, vector_bytes, vector_registers


def open_device() -> Compiled:
    compiler = CCompiler()
    target = native_target(compiler.cc)
    renderer = CRenderer(vector_bytes(target), cpu_cores(), task_entries=True,
                         vector_registers=vector_registers(target))
    return Compiled("CPU", Allocator(), renderer, compiler, functools.partial(CPUProgram, compiler=compiler),
                    graph=NativeGraph)
