"""CUDA C: the C-style walk in CUDA's dialect, one `extern "C" __global__` function per kernel.

What differs from the CPU's C: CUDA C++ (no C99 compound literals: bit casts through memcpy), `__restrict__`,
thread indices from blockIdx/threadIdx, NaN and inf from their bits, and no <stdint.h> under NVRTC (the prelude
names the fixed-width types). Half is stored as its 16 bits, converted by PTX's cvt (no cuda_fp16.h, which the
NVRTC wheel does not carry) and computed in float, rounded back to half after every op, as on OpenCL without
cl_khr_fp16: the bits of half arithmetic. Compiled with
--fmad=false (runtime/ops_cuda.py): a * b + c rounds twice, as numpy does.
"""

from __future__ import annotations

from ember.dtype import DType, dtypes
from ember.renderer.cstyle import C_TYPES, CStyleRenderer
from ember.uop.ops import UOp

CUDA_PRELUDE = """typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
template <class T, class F> __device__ inline T ember_bit_cast(F f) { T t; memcpy(&t, &f, sizeof t); return t; }
__device__ inline float bf16_load(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
__device__ inline uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* NaN stays NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  /* round to nearest, ties to even */
}
__device__ inline float bf16_round(float f) { return bf16_load(bf16_bits(f)); }
__device__ inline float half_load(uint16_t h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ inline uint16_t half_bits(float f) {
  uint32_t b = __float_as_uint(f);  /* a NaN keeps its sign and top payload bits, quiet (as x86's and numpy's) */
  if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((b >> 16) & 0x8000u) | 0x7e00u | ((b >> 13) & 0x3ffu));
  uint16_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ inline float half_round(float f) { return half_load(half_bits(f)); }
"""

SPECIALS = {"gidx": "blockIdx", "lidx": "threadIdx"}


class CUDARenderer(CStyleRenderer):
    """CUDA C++ for NVRTC, for a device of compute capability `arch` (sm_90: H100/H200)."""

    device = "CUDA"
    has_local = True
    has_shared = True
    types = C_TYPES
    prelude = CUDA_PRELUDE
    kernel_prefix = 'extern "C" __global__ '
    restrict = "__restrict__"
    shared_space = "__shared__ "
    barrier = "__syncthreads();"
    storage_only = frozenset({dtypes.float16})
    global_max = (2**31 - 1, 65535, 65535)
    local_max = (1024, 1024, 64)
    local_threads = 1024
    shared_max = 48 * 1024

    def __init__(self, arch: str = "sm_90") -> None: self.arch = arch

    def nonfinite(self, value: float, dtype: DType) -> str:
        bits = (0x7FF8000000000000 if value != value else 0x7FF0000000000000) | (1 << 63 if value < 0 else 0)
        if dtype.scalar is dtypes.float64: return f"__longlong_as_double({bits - (1 << 64) if bits >> 63 else bits}ll)"
        single = (0x7FC00000 if value != value else 0x7F800000) | (1 << 31 if value < 0 else 0)
        return f"(({self.type_of(dtype)})__uint_as_float({single}u))"

    def reinterpret(self, src: DType, dst: DType, a: str) -> str: return f"ember_bit_cast<{self.types[dst]}>({a})"

    def load_half(self, ptr: str) -> str: return f"half_load(*{ptr})"

    def store_half(self, ptr: str, value: str) -> str: return f"*{ptr} = half_bits({value});"

    def special(self, u: UOp) -> str: return f"((int){SPECIALS[u.arg[:4]]}.{'xyz'[int(u.arg[4:])]})"
