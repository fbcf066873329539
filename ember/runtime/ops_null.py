"""NULL:<target>: a device that renders and compiles every kernel for `target` with its real compiler, and runs
nothing. How a machine without the GPU proves that every kernel of a program (of the test suite) compiles for it.

Tensors can be made on it (their buffers are host memory, filled by copyin); kernels are rendered, compiled and
"launched" (nothing happens); reading a value raises NullDeviceError. `NullCounters` counts the kernels compiled.
"""

from __future__ import annotations

from typing import Any

from ember.device import Allocator, Compiled
from ember.errors import DeviceError
from ember.renderer import ProgramSpec


class NullDeviceError(DeviceError):
    """A value was read on a NULL device, which computes none."""


class NullCounters:
    compiled = 0  # kernels compiled by NULL devices in this process
    names: list[str] = []  # their names, in order
    tensor_cores: list[str] = []  # the names of those whose opts put a matmul on a tensor core


NO_VALUES = "NULL device: it compiles kernels and runs none, so it has no values to read"


class NullAllocator(Allocator):
    def copyout(self, dest: memoryview, src: Any) -> None: raise NullDeviceError(NO_VALUES)


class NullProgram:
    def __init__(self, spec: ProgramSpec, lib: bytes, cached: bool = True) -> None:
        assert lib, f"{spec.name}: the compiler gave no bytes"
        NullCounters.compiled += 1
        NullCounters.names.append(spec.name)
        if any(o.op.name == "TC" for o in spec.opts): NullCounters.tensor_cores.append(spec.name)

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        return 0.0 if wait else None


def open_device(target: str = "CUDA") -> Compiled:
    if target == "CUDA":
        from ember.renderer.cuda import CUDARenderer
        from ember.runtime.ops_cuda import NVRTCCompiler
        renderer, compiler = CUDARenderer(), NVRTCCompiler()
    elif target == "PTX":
        from ember.renderer.ptx import PTXRenderer
        from ember.runtime.nvjitlink import PTXCompiler
        renderer, compiler = PTXRenderer(), PTXCompiler()
    elif target == "CL":
        from ember.runtime.ops_cl import CLCompiler, CLContext, cl_renderer
        ctx = CLContext()
        renderer, compiler = cl_renderer(ctx), CLCompiler(ctx)
    else:
        raise DeviceError(f"NULL:{target}: no such target; NULL:CUDA, NULL:PTX and NULL:CL are known")
    renderer.device = f"NULL:{target}"
    return Compiled(f"NULL:{target}", NullAllocator(), renderer, compiler, NullProgram)
