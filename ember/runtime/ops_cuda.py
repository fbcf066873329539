"""CUDA: kernels in CUDA C (renderer/cuda.py) compiled by NVRTC, in-process through ctypes, to an sm_90 cubin.

NVRTC comes from PyPI (`pip install nvidia-cuda-nvrtc==13.5.37`: CUDA 13, sm_75 and newer), so a machine with no
GPU still compiles every kernel (the NULL:CUDA device, runtime/ops_null.py). Running them needs the driver's
libcuda, through ctypes (the driver API: cuModuleLoadData of the cubin, cuLaunchKernel over the spec's grid): without
one, opening CUDA raises a DeviceError saying so. The driver half has run on no GPU yet (none was lent to the session
that wrote it): a session with one runs the suite with DEVICE=CUDA.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import time
from typing import Any

import numpy as np

from ember.device import Allocator, Buffer, Compiled, Compiler, describe_compile_error
from ember.errors import CompileError, DeviceError
from ember.renderer import ProgramSpec
from ember.renderer.cuda import CUDARenderer

NVRTC_WHEEL = "pip install nvidia-cuda-nvrtc==13.5.37"


@functools.cache
def nvrtc() -> ctypes.CDLL:
    """libnvrtc from the nvidia-cuda-nvrtc wheel (or the system's), with the signatures ember calls."""
    spec = importlib.util.find_spec("nvidia")
    folders = [os.path.join(p, sub, "lib") for p in (spec.submodule_search_locations or []) for sub in ("cu13",)] \
        if spec is not None else []
    for path in [os.path.join(f, "libnvrtc.so.13") for f in folders] + ["libnvrtc.so.13", "libnvrtc.so"]:
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError:
            continue
    else:
        raise DeviceError(f"CUDA: NVRTC is not installed; {NVRTC_WHEEL}")
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def version() -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


class NVRTCCompiler(Compiler):
    """CUDA C -> a cubin for `arch` (the PTX NVRTC made it from stays inside). --fmad=false: no contraction.
    `relocatable`: device code that another module links with (the PTX kernels' math functions: nvjitlink.py)."""

    def __init__(self, arch: str = "sm_90", relocatable: bool = False) -> None:
        self.arch = arch
        self.options = [f"--gpu-architecture={arch}", "--fmad=false", "-std=c++17"] + ["-rdc=true"] * relocatable
        super().__init__(f"nvrtc {version()} {' '.join(self.options)}")

    def compile(self, src: str) -> bytes:
        lib, prog = nvrtc(), ctypes.c_void_p()
        status = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernel.cu", 0, None, None)
        if status != 0: raise CompileError(f"NVRTC: nvrtcCreateProgram: {lib.nvrtcGetErrorString(status).decode()}")
        try:
            options = (ctypes.c_char_p * len(self.options))(*(o.encode() for o in self.options))
            if lib.nvrtcCompileProgram(prog, len(self.options), options) != 0:
                size = ctypes.c_size_t()
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value)
                lib.nvrtcGetProgramLog(prog, log)
                raise CompileError(describe_compile_error(f"NVRTC {version()} ({self.arch})", src,
                                                          nvrtc_log_lines(log.value.decode(errors="replace"))))
            size = ctypes.c_size_t()
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            cubin = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetCUBIN(prog, cubin)
            return cubin.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def nvrtc_log_lines(log: str) -> str:
    """NVRTC's log, its `kernel.cu(12): error: ...` lines in the `file:12: error` form describe_compile_error reads."""
    return re.sub(r"kernel\.cu\((\d+)\): (?:catastrophic )?error", r"kernel.cu:\1: error", log)


# ---- the driver: libcuda through ctypes ----------------------------------------------------------------------------

# CUdevice_attribute values ember reads (cuda.h)
ATTRIBUTES = {"threads": 1, "block_x": 2, "block_y": 3, "block_z": 4, "grid_x": 5, "grid_y": 6, "grid_z": 7,
              "shared": 8, "major": 75, "minor": 76}


class CUDADriver:
    """libcuda's first device, its primary context current on this thread, and calls checked by name."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise DeviceError(f"CUDA: no CUDA driver was found ({e}); kernels still compile for it on "
                              "NULL:CUDA") from e
        self.lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.check(self.lib.cuInit(0), "cuInit")
        self.device, self.context = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.lib.cuDeviceGet(ctypes.byref(self.device), 0), "cuDeviceGet")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.device),
                   "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.attributes = {}
        for name, attribute in ATTRIBUTES.items():
            value = ctypes.c_int()
            self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, self.device),
                       "cuDeviceGetAttribute")
            self.attributes[name] = value.value
        self.arch = f"sm_{self.attributes['major']}{self.attributes['minor']}"
        name = ctypes.create_string_buffer(256)
        self.check(self.lib.cuDeviceGetName(name, 256, self.device), "cuDeviceGetName")
        self.name = name.value.decode(errors="replace")

    def check(self, status: int, what: str) -> None:
        if status == 0: return
        text = ctypes.c_char_p()
        self.lib.cuGetErrorString(status, ctypes.byref(text))
        raise DeviceError(f"CUDA: {what} failed: error {status} ({(text.value or b'unknown').decode()})")


class CUDAMemory:
    """`nbytes` of device memory at `ptr`; a view of an arena (CUDAArena[a:b]) has the arena as `base`."""

    base: Any = None

    def __init__(self, driver: CUDADriver, nbytes: int) -> None:
        self.driver, self.nbytes, self.ptr = driver, nbytes, ctypes.c_uint64()
        status = driver.lib.cuMemAlloc_v2(ctypes.byref(self.ptr), ctypes.c_size_t(max(nbytes, 1)))
        if status == 2: raise MemoryError(f"CUDA: cuMemAlloc of {nbytes:,} bytes: out of memory")
        driver.check(status, f"cuMemAlloc of {nbytes:,} bytes")
        driver.check(driver.lib.cuMemsetD8_v2(self.ptr, 0, ctypes.c_size_t(max(nbytes, 1))), "cuMemsetD8")

    def __del__(self) -> None:
        try:
            if self.base is None and "ptr" in self.__dict__: self.driver.lib.cuMemFree_v2(self.ptr)
        except (TypeError, AttributeError):  # at exit, when ctypes may be gone
            pass


class CUDAArena(CUDAMemory):
    """Memory a plan slices: `arena[a:b]` is the bytes a to b (device pointers add), keeping the arena alive."""

    @property  # type: ignore[override]
    def base(self) -> CUDAArena: return self

    def __getitem__(self, part: slice) -> CUDAMemory:
        view = CUDAMemory.__new__(CUDAMemory)
        view.driver, view.nbytes, view.base = self.driver, part.stop - part.start, self
        view.ptr = ctypes.c_uint64(self.ptr.value + part.start)
        return view

    def __del__(self) -> None:
        try:
            self.driver.lib.cuMemFree_v2(self.ptr)
        except (TypeError, AttributeError):
            pass


class CUDAAllocator(Allocator):
    align = 256  # (what cuMemAlloc gives; a plan's views start on such boundaries too)

    def __init__(self, driver: CUDADriver) -> None:
        super().__init__()
        self.driver = driver

    def alloc(self, nbytes: int) -> CUDAMemory: return CUDAMemory(self.driver, nbytes)

    def arena(self, nbytes: int, align: int) -> CUDAArena: return CUDAArena(self.driver, nbytes)

    def free(self, raw: Any, nbytes: int) -> None: pass  # (freed when collected)

    def alias(self, raw: CUDAMemory) -> CUDAMemory: return raw

    def copyin(self, dest: CUDAMemory, src: memoryview) -> None:
        if not src.nbytes: return
        host = np.frombuffer(src, dtype=np.uint8)
        self.driver.check(self.driver.lib.cuMemcpyHtoD_v2(dest.ptr, ctypes.c_void_p(host.ctypes.data),
                                                          ctypes.c_size_t(src.nbytes)), "cuMemcpyHtoD")

    def copyout(self, dest: memoryview, src: CUDAMemory) -> None:
        if not dest.nbytes: return
        host = np.frombuffer(dest, dtype=np.uint8)
        self.driver.check(self.driver.lib.cuMemcpyDtoH_v2(ctypes.c_void_p(host.ctypes.data), src.ptr,
                                                          ctypes.c_size_t(dest.nbytes)), "cuMemcpyDtoH")


class CUDAProgram:
    """A kernel of a loaded cubin, launched over its spec's grid (blocks) of blocks (threads)."""

    def __init__(self, spec: ProgramSpec, lib: bytes, cached: bool = True, driver: CUDADriver | None = None) -> None:
        assert driver is not None
        self.driver, self.name, self.lib, self.spec = driver, spec.name, lib, spec
        self.block = (list(spec.local_size or ()) + [1, 1, 1])[:3]
        self.module, self.function = ctypes.c_void_p(), ctypes.c_void_p()
        driver.check(driver.lib.cuModuleLoadData(ctypes.byref(self.module), lib), f"{spec.name}: cuModuleLoadData")
        driver.check(driver.lib.cuModuleGetFunction(ctypes.byref(self.function), self.module, spec.name.encode()),
                     f"{spec.name}: cuModuleGetFunction")

    def __del__(self) -> None:
        try:
            if self.__dict__.get("module"): self.driver.lib.cuModuleUnload(self.module)
        except (TypeError, AttributeError):
            pass

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        args = [ctypes.c_uint64((b.raw if isinstance(b, Buffer) else b).ptr.value) for b in bufs]
        args += [ctypes.c_int32(v) for v in vals]
        params = (ctypes.c_void_p * len(args))(*(ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args))
        start = time.perf_counter() if wait else 0.0
        grid = (list(self.spec.grid(vals)) + [1, 1])[:3]
        if not all(grid): return 0.0 if wait else None  # (a batch of 0: nothing to run)
        self.driver.check(self.driver.lib.cuLaunchKernel(self.function, *grid, *self.block, 0, None, params, None),
                          f"{self.name}: cuLaunchKernel")
        if not wait: return None
        self.driver.check(self.driver.lib.cuCtxSynchronize(), f"{self.name}: cuCtxSynchronize")
        return time.perf_counter() - start


class CUDADevice(Compiled):
    """The GPU, its kernels in CUDA C through NVRTC, or (`ptx`: the device CUDA:PTX) in PTX through nvJitLink."""

    def __init__(self, driver: CUDADriver, ptx: bool = False) -> None:
        self.driver, self.device_name = driver, driver.name  # (the card: "NVIDIA H200")
        a = driver.attributes
        if ptx:
            from ember.renderer.ptx import PTXRenderer
            from ember.runtime.nvjitlink import PTXCompiler
            renderer, compiler = PTXRenderer(driver.arch), PTXCompiler(driver.arch)
            renderer.device = "CUDA:PTX"
        else:
            renderer, compiler = CUDARenderer(driver.arch), NVRTCCompiler(driver.arch)
        renderer.local_max, renderer.local_threads = (a["block_x"], a["block_y"], a["block_z"]), a["threads"]
        renderer.global_max, renderer.shared_max = (a["grid_x"], a["grid_y"], a["grid_z"]), a["shared"]
        super().__init__(renderer.device, CUDAAllocator(driver), renderer, compiler,
                         lambda spec, lib, cached=True: CUDAProgram(spec, lib, cached, driver))

    def synchronize(self) -> None: self.driver.check(self.driver.lib.cuCtxSynchronize(), "cuCtxSynchronize")


def open_device(target: str = "") -> Compiled:
    """The first CUDA GPU (CUDA:PTX: its kernels in PTX): a DeviceError without a driver (or without a GPU the
    driver sees)."""
    if target not in ("", "PTX"): raise DeviceError(f"CUDA:{target}: no such renderer; CUDA and CUDA:PTX are known")
    try:
        driver = CUDADriver()
    except DeviceError as e:
        if target != "PTX": raise
        raise DeviceError(f"CUDA:PTX: {e}; its PTX assembles on NULL:PTX (pip install nvidia-nvjitlink==13.5.37)") \
            from None
    return CUDADevice(driver, ptx=target == "PTX")
