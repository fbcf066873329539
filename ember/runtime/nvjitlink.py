"""PTX -> an sm_90 cubin, in process: nvJitLink (`pip install nvidia-nvjitlink==13.5.37`) assembles the kernel's PTX
(renderer/ptx.py) and links it with the math functions it calls.

PTX has no math library; the PTX renderer calls `ember_<name>[f]` for each libm op. Those come from a module of CUDA
C (`return expf(x0);` ...) that NVRTC compiles to relocatable device code, one module per set of functions (cached on
disk like any compile), so a PTX kernel's libm values are CUDA C's. An assembler error comes back with the PTX line
it names, marked in the listing.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re

from ember.device import Compiler, describe_compile_error
from ember.errors import CompileError, DeviceError
from ember.runtime.ops_cuda import NVRTCCompiler, version

NVJITLINK_WHEEL = "pip install nvidia-nvjitlink==13.5.37"
PTX_INPUT, CUBIN_INPUT = 2, 1  # nvJitLinkInputType


@functools.cache
def nvjitlink() -> ctypes.CDLL:
    """libnvJitLink from the nvidia-nvjitlink wheel (or the system's)."""
    spec = importlib.util.find_spec("nvidia")
    folders = [os.path.join(p, "cu13", "lib") for p in (spec.submodule_search_locations or [])] if spec else []
    for path in [os.path.join(f, "libnvJitLink.so.13") for f in folders] + ["libnvJitLink.so.13"]:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise DeviceError(f"CUDA:PTX: nvJitLink is not installed; {NVJITLINK_WHEEL}")


# `.extern .func (.param .b32 ret) ember_powf (.param .b32 x0, .param .b32 x1);` in a kernel's PTX
EXTERN = re.compile(r"\.extern \.func \(\.param \.b(\d+) ret\) ember_(\w+) \(([^)]*)\);")


def math_module(ptx: str) -> str:
    """The CUDA C of the math functions `ptx` calls: each `ember_<name>` returns CUDA's `<name>` of its arguments."""
    functions = []
    for width, name, params in sorted(set(EXTERN.findall(ptx)), key=lambda f: f[1]):
        ctype = "double" if width == "64" else "float"
        args = [f"x{i}" for i in range(params.count(".param"))]
        functions.append(f'extern "C" __device__ {ctype} ember_{name}({", ".join(f"{ctype} {a}" for a in args)}) '
                         f"{{ return {name}({', '.join(args)}); }}")
    return "\n".join(functions) + "\n" if functions else ""


def ptxas_lines(log: str) -> str:
    """nvJitLink's `ptxas ... line 12; error : ...` as the `kernel.ptx:12: error` form describe_compile_error reads."""
    return re.sub(r"line (\d+); error\s*:", r"kernel.ptx:\1: error:", log)


class PTXCompiler(Compiler):
    """PTX -> a cubin for `arch`, linked with the math module of the functions it calls (NVRTC, -rdc)."""

    def __init__(self, arch: str = "sm_90") -> None:
        self.arch = arch
        self.math = NVRTCCompiler(arch, relocatable=True)
        super().__init__(f"nvjitlink {version()} -arch={arch} ({self.math.cache_key})")

    def compile(self, src: str) -> bytes:
        lib, handle = nvjitlink(), ctypes.c_void_p()
        options = (ctypes.c_char_p * 1)(f"-arch={self.arch}".encode())
        if (status := lib.nvJitLinkCreate(ctypes.byref(handle), 1, options)) != 0:
            raise CompileError(f"nvJitLink: nvJitLinkCreate failed ({status})")
        try:
            inputs = [(PTX_INPUT, src.encode() + b"\0", b"kernel.ptx")]
            if math := math_module(src): inputs.append((CUBIN_INPUT, self.math.compile_cached(math), b"math.cubin"))
            for kind, data, name in inputs:
                if lib.nvJitLinkAddData(handle, kind, data, len(data), name) != 0: self.fail(lib, handle, src)
            if lib.nvJitLinkComplete(handle) != 0: self.fail(lib, handle, src)
            size = ctypes.c_size_t()
            lib.nvJitLinkGetLinkedCubinSize(handle, ctypes.byref(size))
            cubin = ctypes.create_string_buffer(size.value)
            lib.nvJitLinkGetLinkedCubin(handle, cubin)
            return cubin.raw
        finally:
            lib.nvJitLinkDestroy(ctypes.byref(handle))

    def fail(self, lib: ctypes.CDLL, handle: ctypes.c_void_p, src: str) -> None:
        size = ctypes.c_size_t()
        lib.nvJitLinkGetErrorLogSize(handle, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value + 1)
        lib.nvJitLinkGetErrorLog(handle, log)
        raise CompileError(describe_compile_error(f"nvJitLink ({self.arch})", src,
                                                  ptxas_lines(log.value.decode(errors="replace"))))
