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
from ember.renderer.tensorcore import CUDA_TENSOR_CORES, TensorCore
from ember.uop.ops import Ops, UOp

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
template <class T, int N> struct ember_vec { T v[N]; };
"""

MMA_TYPES = {dtypes.float16: ("f16", "half_bits"), dtypes.bfloat16: ("bf16", "bf16_bits")}


def mma_function(tc: TensorCore) -> str:
    """The device function of an m16n8k16 tensor core: the lanes' fragments packed two 16-bit halves to a register,
    the low half the lower element (PTX's .f16x2), into mma.sync."""
    kind, bits = MMA_TYPES[tc.dtype_in]
    na, nb, nc = (tc.elements(o) for o in "abc")
    ra, rb = na // 2, nb // 2
    slots = iter(f"%{i}" for i in range(2 * nc + ra + rb))
    d, a, b, c = ([next(slots) for _ in range(n)] for n in (nc, ra, rb, nc))
    outputs = ", ".join(f'"=f"(d.v[{i}])' for i in range(nc))
    inputs = ", ".join([f'"r"(ra[{i}])' for i in range(ra)] + [f'"r"(rb[{i}])' for i in range(rb)] +
                       [f'"f"(c.v[{i}])' for i in range(nc)])
    pack = "(uint32_t){0}({1}.v[2 * i]) | ((uint32_t){0}({1}.v[2 * i + 1]) << 16)"
    registers = " ".join("{" + ", ".join(regs) + "}," for regs in (d, a, b, c))[:-1]
    return (f"__device__ inline ember_vec<float, {nc}> {wmma_name(tc)}(ember_vec<float, {na}> a, "
            f"ember_vec<float, {nb}> b, ember_vec<float, {nc}> c) {{\n"
            f"  uint32_t ra[{ra}], rb[{rb}]; ember_vec<float, {nc}> d;\n"
            f"  for (int i = 0; i < {ra}; i++) ra[i] = {pack.format(bits, 'a')};\n"
            f"  for (int i = 0; i < {rb}; i++) rb[i] = {pack.format(bits, 'b')};\n"
            f'  asm volatile("mma.sync.aligned.{tc.name}.row.col.f32.{kind}.{kind}.f32 {registers};"\n'
            f"    : {outputs} : {inputs});\n"
            "  return d;\n}\n")


def wmma_name(tc: TensorCore) -> str: return f"wmma_{tc.name}_{tc.dtype_in.name}"

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
    tensor_cores = CUDA_TENSOR_CORES

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

    def vector_type(self, dtype: DType) -> str: return f"ember_vec<{self.type_of(dtype.scalar)}, {dtype.count}>"

    def vectorize(self, dtype: DType, lanes: list[str]) -> str:
        return self.type_of(dtype) + "{{" + ", ".join(lanes) + "}}"

    def gep(self, vector: str, lane: int) -> str: return f"{vector}.v[{lane}]"

    def wmma(self, tc: TensorCore, a: str, b: str, c: str) -> str: return f"{wmma_name(tc)}({a}, {b}, {c})"

    def render(self, name: str, uops: list[UOp]) -> str:
        cores = dict.fromkeys(u.arg for u in uops if u.op is Ops.WMMA)
        return self.prelude + "".join(mma_function(tc) for tc in cores) + self.render_function(name, uops)
