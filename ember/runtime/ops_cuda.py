"""CUDA: kernels in CUDA C (renderer/cuda.py) compiled by NVRTC, in-process through ctypes, to an sm_90 cubin.

NVRTC comes from PyPI (`pip install nvidia-cuda-nvrtc==13.5.37`: CUDA 13, sm_75 and newer), so a machine with no
GPU still compiles every kernel (the NULL:CUDA device, runtime/ops_null.py). Running them needs the driver's
libcuda: without one, opening CUDA raises a DeviceError saying so. (Executing on a GPU is not built yet.)
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re

from ember.device import Compiler, describe_compile_error
from ember.errors import CompileError, DeviceError

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
    """CUDA C -> a cubin for `arch` (the PTX NVRTC made it from stays inside). --fmad=false: no contraction."""

    def __init__(self, arch: str = "sm_90") -> None:
        self.arch = arch
        self.options = [f"--gpu-architecture={arch}", "--fmad=false", "-std=c++17"]
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


def open_device() -> None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise DeviceError(f"CUDA: no CUDA driver was found ({e}); kernels still compile for it on NULL:CUDA") from e
    raise DeviceError("CUDA: running kernels on an NVIDIA GPU is not built yet; NULL:CUDA compiles them")
