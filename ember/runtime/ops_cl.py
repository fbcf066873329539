"""The CL device: OpenCL C (renderer/opencl.py) built by the platform's compiler, run through libOpenCL by ctypes.

No Python package is needed, only an OpenCL loader and a platform (on Debian: `ocl-icd-libopencl1` and PoCL's
`pocl-opencl-icd`, which runs OpenCL on the CPU). The first device of the first platform that has one is used
($EMBER_CL_PLATFORM picks a platform whose name contains it). Kernels are built from source once and kept as the
platform's binaries in the compile cache, keyed by the device, its driver and the build options. Buffers are
`cl_mem` objects; a queue runs kernels in order, and reading a buffer back waits for the kernels before it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from typing import Any

import numpy as np

from ember.device import Allocator, Buffer, Compiled, Compiler, describe_compile_error
from ember.errors import CompileError, DeviceError
from ember.renderer import ProgramSpec
from ember.renderer.opencl import OpenCLRenderer
from ember.renderer.tensorcore import CUDA_TENSOR_CORES

# the OpenCL constants ember uses (CL/cl.h)
DEVICE_TYPE_ALL = 0xFFFFFFFF
PLATFORM_NAME = 0x0902
DEVICE_MAX_WORK_GROUP_SIZE, DEVICE_MAX_WORK_ITEM_SIZES = 0x1004, 0x1005
DEVICE_LOCAL_MEM_SIZE, DEVICE_NAME, DEVICE_DRIVER_VERSION, DEVICE_EXTENSIONS = 0x1023, 0x102B, 0x102D, 0x1030
PROGRAM_BINARY_SIZES, PROGRAM_BINARIES, PROGRAM_BUILD_LOG = 0x1165, 0x1166, 0x1183
MEM_READ_WRITE = 1
DEVICE_MEM_BASE_ADDR_ALIGN, BUFFER_CREATE_TYPE_REGION = 0x1019, 0x1220
BUILD_OPTIONS = "-cl-fp32-correctly-rounded-divide-sqrt"  # (contraction is off in the source: FP_CONTRACT)
ERRORS = {-1: "device not found", -4: "memory allocation failure", -5: "out of resources", -6: "out of host memory",
          -11: "build program failure", -30: "invalid value", -36: "invalid command queue",
          -38: "invalid memory object",
          -46: "invalid kernel name", -48: "invalid kernel", -51: "invalid argument size", -52: "invalid kernel args",
          -54: "invalid work group size", -55: "invalid work item size", -63: "invalid global work size"}

size_t, void_p = ctypes.c_size_t, ctypes.c_void_p


def load_library() -> ctypes.CDLL:
    """libOpenCL with the signatures ember calls (restype void* for the calls that return a handle)."""
    try:
        cl = ctypes.CDLL("libOpenCL.so.1")
    except OSError as e:
        raise DeviceError(f"CL: no OpenCL loader ({e}); install one and a platform: apt-get install "
                          "ocl-icd-libopencl1 pocl-opencl-icd") from e
    for name in ("clCreateContext", "clCreateCommandQueue", "clCreateBuffer", "clCreateSubBuffer",
                 "clCreateProgramWithSource",
                 "clCreateProgramWithBinary", "clCreateKernel"):
        getattr(cl, name).restype = void_p
    return cl


def check(status: int, what: str) -> None:
    if status != 0: raise DeviceError(f"CL: {what} failed: error {status} ({ERRORS.get(status, 'see CL/cl.h')})")


def info(cl: ctypes.CDLL, fn: str, handle: Any, param: int, kind: Any = None) -> Any:
    """A clGet*Info value: a string, or a value of ctypes type `kind`."""
    size, handle = size_t(), handle if isinstance(handle, void_p) else void_p(handle)
    check(getattr(cl, fn)(handle, ctypes.c_uint(param), size_t(0), None, ctypes.byref(size)), fn)
    out = ctypes.create_string_buffer(size.value) if kind is None else kind()
    check(getattr(cl, fn)(handle, ctypes.c_uint(param), size_t(ctypes.sizeof(out)), ctypes.byref(out), None), fn)
    return out.value.decode() if kind is None else out


class CLContext:
    """The platform, device, context and queue ember runs on."""

    def __init__(self) -> None:
        self.cl = cl = load_library()
        count = ctypes.c_uint()
        if cl.clGetPlatformIDs(0, None, ctypes.byref(count)) != 0 or count.value == 0:
            raise DeviceError("CL: no OpenCL platform is installed; install one, e.g. apt-get install pocl-opencl-icd")
        platforms = (void_p * count.value)()
        check(cl.clGetPlatformIDs(count, platforms, None), "clGetPlatformIDs")
        wanted = os.getenv("EMBER_CL_PLATFORM", "")
        self.device = None
        for platform in platforms:
            if wanted not in info(cl, "clGetPlatformInfo", platform, PLATFORM_NAME): continue
            device, found = void_p(), ctypes.c_uint()
            if cl.clGetDeviceIDs(void_p(platform), ctypes.c_uint64(DEVICE_TYPE_ALL), 1, ctypes.byref(device),
                                 ctypes.byref(found)) == 0 and found.value:
                self.device = device
                break
        if self.device is None: raise DeviceError(f"CL: no OpenCL device found (platform filter {wanted!r})")
        status = ctypes.c_int()
        self.context = cl.clCreateContext(None, 1, ctypes.byref(self.device), None, None, ctypes.byref(status))
        check(status.value, "clCreateContext")
        self.queue = cl.clCreateCommandQueue(void_p(self.context), self.device, ctypes.c_uint64(0),
                                             ctypes.byref(status))
        check(status.value, "clCreateCommandQueue")
        self.name = info(cl, "clGetDeviceInfo", self.device, DEVICE_NAME)
        self.driver = info(cl, "clGetDeviceInfo", self.device, DEVICE_DRIVER_VERSION)
        self.extensions = set(info(cl, "clGetDeviceInfo", self.device, DEVICE_EXTENSIONS).split())
        self.local_threads = info(cl, "clGetDeviceInfo", self.device, DEVICE_MAX_WORK_GROUP_SIZE, size_t).value
        self.local_max = tuple(info(cl, "clGetDeviceInfo", self.device, DEVICE_MAX_WORK_ITEM_SIZES, size_t * 3))
        self.shared_max = info(cl, "clGetDeviceInfo", self.device, DEVICE_LOCAL_MEM_SIZE, ctypes.c_uint64).value
        self.base_align = info(cl, "clGetDeviceInfo", self.device, DEVICE_MEM_BASE_ADDR_ALIGN, ctypes.c_uint).value // 8
        # oclgrind (the race and bounds checker, docs/backends.md) interprets LLVM IR of an older LLVM, without the
        # intrinsics that optimizations make (llvm.fshl from a rotate): its kernels are built unoptimized
        # and its clBuildProgram is not thread-safe (it crashed in two of the compile pool's threads): one at a time
        grind = "Oclgrind" in self.name
        self.options = BUILD_OPTIONS + (" -cl-opt-disable" if grind else "")
        self.build_lock: Any = threading.Lock() if grind else contextlib.nullcontext()

    def finish(self) -> None: check(self.cl.clFinish(void_p(self.queue)), "clFinish")


class CLMemory:
    """A cl_mem of `nbytes`, released when collected; a view of an arena (CLArena[a:b]) has the arena as `base`."""

    base: Any = None

    def __init__(self, ctx: CLContext, nbytes: int) -> None:
        self.ctx, self.nbytes = ctx, nbytes
        status = ctypes.c_int()
        self.handle = void_p(ctx.cl.clCreateBuffer(void_p(ctx.context), ctypes.c_uint64(MEM_READ_WRITE),
                                                   size_t(max(nbytes, 1)), None, ctypes.byref(status)))
        if status.value in (-4, -61):  # CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_INVALID_BUFFER_SIZE
            raise MemoryError(f"CL: clCreateBuffer of {nbytes:,} bytes failed: error {status.value} "
                              f"({'invalid buffer size' if status.value == -61 else 'allocation failure'})")
        check(status.value, f"clCreateBuffer of {nbytes:,} bytes")

    def __del__(self) -> None:
        try:
            if (handle := self.__dict__.get("handle")) is not None: self.ctx.cl.clReleaseMemObject(handle)
        except (TypeError, AttributeError):  # at exit (see CLProgram.__del__)
            pass


class CLArena(CLMemory):
    """A buffer that memory plans slice: `arena[a:b]` is a sub-buffer of bytes a to b (it keeps the arena alive);
    the arena is its own `base` (the allocation engine/memory.py hands back)."""

    @property  # type: ignore[override]
    def base(self) -> CLArena: return self

    def __getitem__(self, part: slice) -> CLMemory:
        view = CLMemory.__new__(CLMemory)
        view.ctx, view.nbytes, view.base = self.ctx, part.stop - part.start, self
        region, status = (size_t * 2)(part.start, view.nbytes), ctypes.c_int()
        view.handle = void_p(self.ctx.cl.clCreateSubBuffer(self.handle, ctypes.c_uint64(MEM_READ_WRITE),
                                                           ctypes.c_uint(BUFFER_CREATE_TYPE_REGION), region,
                                                           ctypes.byref(status)))
        check(status.value, f"clCreateSubBuffer of bytes {part.start}..{part.stop}")
        return view


class CLAllocator(Allocator):
    """Device memory: a fresh buffer is zeroed on the device; copies block until done (and so wait for every kernel
    queued before them: the queue runs in order)."""

    def __init__(self, ctx: CLContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.align = ctx.base_align

    def arena(self, nbytes: int, align: int) -> CLArena:
        arena = CLArena(self.ctx, nbytes)  # (a buffer's start meets every alignment the device asks)
        self.zero(arena)
        return arena

    def alloc(self, nbytes: int) -> CLMemory:
        mem = CLMemory(self.ctx, nbytes)
        self.zero(mem)
        return mem

    def zero(self, mem: CLMemory) -> None:
        zero = ctypes.c_uint8(0)
        check(self.ctx.cl.clEnqueueFillBuffer(void_p(self.ctx.queue), mem.handle, ctypes.byref(zero), size_t(1),
                                              size_t(0), size_t(max(mem.nbytes, 1)), 0, None, None),
              "clEnqueueFillBuffer")

    def free(self, raw: Any, nbytes: int) -> None: pass  # (released when collected)

    def alias(self, raw: CLMemory) -> CLMemory: return raw  # (free keeps nothing)

    def copyin(self, dest: CLMemory, src: memoryview) -> None:
        if not src.nbytes: return
        host = np.frombuffer(src, dtype=np.uint8)
        check(self.ctx.cl.clEnqueueWriteBuffer(void_p(self.ctx.queue), dest.handle, 1, size_t(0), size_t(src.nbytes),
                                               void_p(host.ctypes.data), 0, None, None), "clEnqueueWriteBuffer")

    def copyout(self, dest: memoryview, src: CLMemory) -> None:
        if not dest.nbytes: return
        host = np.frombuffer(dest, dtype=np.uint8)
        check(self.ctx.cl.clEnqueueReadBuffer(void_p(self.ctx.queue), src.handle, 1, size_t(0), size_t(dest.nbytes),
                                              void_p(host.ctypes.data), 0, None, None), "clEnqueueReadBuffer")


def build(ctx: CLContext, program: int, src: str | None) -> None:
    """clBuildProgram, or a CompileError with the build log (and, for source, the failing line)."""
    with ctx.build_lock:
        status = ctx.cl.clBuildProgram(void_p(program), 1, ctypes.byref(ctx.device), ctx.options.encode(), None, None)
    if status == 0: return
    raise CompileError(describe_compile_error(f"OpenCL ({ctx.name})", src or "", build_log(ctx, program)))


def build_log(ctx: CLContext, program: int) -> str:
    size = size_t()
    ctx.cl.clGetProgramBuildInfo(void_p(program), ctx.device, ctypes.c_uint(PROGRAM_BUILD_LOG), size_t(0), None,
                                 ctypes.byref(size))
    out = ctypes.create_string_buffer(size.value)
    ctx.cl.clGetProgramBuildInfo(void_p(program), ctx.device, ctypes.c_uint(PROGRAM_BUILD_LOG), size, out, None)
    return out.value.decode(errors="replace")


class CLCompiler(Compiler):
    """OpenCL C -> the platform's program binary for the device."""

    def __init__(self, ctx: CLContext) -> None:
        super().__init__(f"opencl {ctx.name} {ctx.driver} {ctx.options}")
        self.ctx = ctx

    def compile(self, src: str) -> bytes:
        cl, status = self.ctx.cl, ctypes.c_int()
        text = ctypes.c_char_p(src.encode())
        program = cl.clCreateProgramWithSource(void_p(self.ctx.context), 1, ctypes.byref(text), None,
                                               ctypes.byref(status))
        check(status.value, "clCreateProgramWithSource")
        try:
            build(self.ctx, program, src)
            size = size_t()
            check(cl.clGetProgramInfo(void_p(program), ctypes.c_uint(PROGRAM_BINARY_SIZES), size_t(ctypes.sizeof(size)),
                                      ctypes.byref(size), None), "clGetProgramInfo")
            binary = ctypes.create_string_buffer(size.value)
            pointer = ctypes.c_char_p(ctypes.addressof(binary))
            check(cl.clGetProgramInfo(void_p(program), ctypes.c_uint(PROGRAM_BINARIES), size_t(ctypes.sizeof(pointer)),
                                      ctypes.byref(pointer), None), "clGetProgramInfo")
            return binary.raw
        finally:
            cl.clReleaseProgram(void_p(program))


class CLProgram:
    """A kernel of a built program, launched over its spec's grid: global size (workgroups) x local size."""

    def __init__(self, spec: ProgramSpec, lib: bytes, cached: bool = True, ctx: CLContext | None = None) -> None:
        assert ctx is not None
        self.ctx, self.name, cl = ctx, spec.name, ctx.cl
        self.spec, local = spec, spec.local_size or (1,) * len(spec.global_size)
        self.dims = len(spec.global_size)
        self.symbolic = not all(isinstance(g, int) for g in spec.global_size)
        self.global_size = None if self.symbolic else self.threads(spec.grid())
        self.local_size = (size_t * self.dims)(*local)
        status = ctypes.c_int()
        length, binary = size_t(len(lib)), ctypes.c_char_p(lib)
        self.program = cl.clCreateProgramWithBinary(void_p(ctx.context), 1, ctypes.byref(ctx.device),
                                                    ctypes.byref(length), ctypes.byref(binary), None,
                                                    ctypes.byref(status))
        check(status.value, "clCreateProgramWithBinary")
        build(ctx, self.program, None)
        self.kernel = cl.clCreateKernel(void_p(self.program), spec.name.encode(), ctypes.byref(status))
        check(status.value, f"clCreateKernel {spec.name}")

    def threads(self, grid: tuple[int, ...]) -> Any:
        """OpenCL's global work size: workgroups times the threads of each, per dimension."""
        local = self.spec.local_size or (1,) * self.dims
        return (size_t * self.dims)(*(g * w for g, w in zip(grid, local, strict=True)))

    def __del__(self) -> None:
        try:
            if (kernel := self.__dict__.get("kernel")) is not None: self.ctx.cl.clReleaseKernel(ctypes.c_void_p(kernel))
            if (program := self.__dict__.get("program")) is not None:
                self.ctx.cl.clReleaseProgram(ctypes.c_void_p(program))
        except (TypeError, AttributeError):  # at exit, when ctypes may be gone: the process frees it all
            pass

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        cl, kernel = self.ctx.cl, void_p(self.kernel)
        for i, b in enumerate(bufs):
            mem = b.raw if isinstance(b, Buffer) else b
            check(cl.clSetKernelArg(kernel, i, size_t(ctypes.sizeof(void_p)), ctypes.byref(mem.handle)),
                  f"{self.name}: clSetKernelArg {i}")
        for i, v in enumerate(vals):
            check(cl.clSetKernelArg(kernel, len(bufs) + i, size_t(4), ctypes.byref(ctypes.c_int32(v))),
                  f"{self.name}: clSetKernelArg {len(bufs) + i}")
        start = time.perf_counter() if wait else 0.0
        size = self.threads(self.spec.grid(vals)) if self.symbolic else self.global_size
        if self.symbolic and not all(size): return 0.0 if wait else None  # (a batch of 0: nothing to run)
        check(cl.clEnqueueNDRangeKernel(void_p(self.ctx.queue), kernel, self.dims, None, size,
                                        self.local_size, 0, None, None), f"{self.name}: clEnqueueNDRangeKernel")
        if not wait: return None
        self.ctx.finish()
        return time.perf_counter() - start


EMULATED_TENSOR_CORES = {"": (), "CUDA": CUDA_TENSOR_CORES}  # CL:<target> -> the tensor cores it emulates


def cl_renderer(ctx: CLContext, emulate: str = "") -> OpenCLRenderer:
    """The OpenCL C renderer for the device's limits and extensions; `emulate` "CUDA" (the device CL:CUDA): with
    CUDA's tensor cores, emulated in local memory (renderer/opencl.py: reference_wmma), which runs a GPU's fragment
    layouts here."""
    renderer = OpenCLRenderer(local_max=ctx.local_max, local_threads=ctx.local_threads, shared_max=ctx.shared_max,
                              fp64="cl_khr_fp64" in ctx.extensions, fp16="cl_khr_fp16" in ctx.extensions,
                              tensor_cores=EMULATED_TENSOR_CORES[emulate])
    if emulate: renderer.device = f"CL:{emulate}"
    return renderer


class CLDevice(Compiled):
    def synchronize(self) -> None: self.ctx.finish()

    def __init__(self, ctx: CLContext, emulate: str = "") -> None:
        self.ctx, self.device_name = ctx, ctx.name
        renderer = cl_renderer(ctx, emulate)
        super().__init__(renderer.device, CLAllocator(ctx), renderer, CLCompiler(ctx),
                         lambda spec, lib, cached=True: CLProgram(spec, lib, cached, ctx))


def open_device(emulate: str = "") -> Compiled:
    """The CL device; CL:CUDA emulates CUDA's tensor cores (cl_renderer)."""
    return CLDevice(CLContext(), emulate)
