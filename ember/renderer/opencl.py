"""OpenCL C: the C-style walk in OpenCL's dialect, one `__kernel` per kernel, launched over workgroups.

What differs from the CPU's C: OpenCL's type names (int, long, uchar), `__global` buffers, thread indices from
get_group_id/get_local_id, overloaded math builtins (exp, not expf), `as_<type>` bit casts, and memory of bool as
uchar (a kernel may not take bool pointers). Contraction is off (FP_CONTRACT OFF) so a*b+c rounds twice, as numpy
does; division and sqrt are correctly rounded (the device's compiler gets -cl-fp32-correctly-rounded-divide-sqrt).
Half without cl_khr_fp16 is storage only: vload_half/vstore_half, computed in float and rounded to half after every
op (half_round), which gives half arithmetic's bits for +, -, *, / and sqrt.
"""

from __future__ import annotations

from ember.dtype import DType, PtrDType, dtypes
from ember.renderer.cstyle import CStyleRenderer
from ember.uop.ops import UOp

CL_TYPES: dict[DType, str] = {
    dtypes.bool: "bool", dtypes.int8: "char", dtypes.int16: "short", dtypes.int32: "int", dtypes.int64: "long",
    dtypes.uint8: "uchar", dtypes.uint16: "ushort", dtypes.uint32: "uint", dtypes.uint64: "ulong",
    dtypes.float16: "half", dtypes.float32: "float", dtypes.float64: "double",
}

CL_PRELUDE = """#pragma OPENCL FP_CONTRACT OFF
float bf16_load(ushort b) { return as_float((uint)b << 16); }
ushort bf16_bits(float f) {
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40);  /* NaN stays NaN */
  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  /* round to nearest, ties to even */
}
float bf16_round(float f) { return bf16_load(bf16_bits(f)); }
"""

HALF_ROUND = """ushort half_bits(float f) {
  uint b = as_uint(f);  /* a NaN keeps its sign and top payload bits, quiet (as x86's conversion and numpy's) */
  if ((b & 0x7fffffffu) > 0x7f800000u) return (ushort)(((b >> 16) & 0x8000u) | 0x7e00u | ((b >> 13) & 0x3ffu));
  ushort u; vstore_half(f, 0, (half*)&u); return u;
}
float half_load(ushort u) { return vload_half(0, (half*)&u); }
float half_round(float f) { return half_load(half_bits(f)); }
"""


class OpenCLRenderer(CStyleRenderer):
    """OpenCL C 1.2 for a device described by its limits (runtime/ops_cl.py reads them from the device)."""

    device = "CL"
    has_local = True
    types = CL_TYPES
    kernel_prefix = "__kernel "
    buffer_space = "__global "
    long_suffix = "l"
    has_shared = True
    shared_space = "__local "
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"

    def __init__(self, local_max: tuple[int, ...] = (1024, 1024, 1024), local_threads: int = 1024,
                 global_max: tuple[int, ...] = (2**31 - 1,) * 3, shared_max: int = 32768, fp64: bool = True,
                 fp16: bool = False) -> None:
        self.local_max, self.local_threads, self.global_max, self.shared_max = local_max, local_threads, \
            global_max, shared_max
        self.fp64 = fp64
        self.unsupported = frozenset() if fp64 else frozenset({dtypes.float64})
        self.storage_only = frozenset() if fp16 else frozenset({dtypes.float16})
        self.prelude = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if fp64 else "") + \
            ("#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n" if fp16 else "") + CL_PRELUDE + \
            ("" if fp16 else HALF_ROUND)

    def type_of(self, dtype: DType) -> str:
        if isinstance(dtype, PtrDType):
            if dtype.base.scalar is dtypes.bool: return "uchar*"  # (the size of bool is the device's choice)
            if dtype.base.scalar in self.storage_only: return "half*"  # vload_half/vstore_half read it
        return super().type_of(dtype)

    def nonfinite(self, value: float, dtype: DType) -> str:
        text = "NAN" if value != value else ("-" if value < 0 else "") + "INFINITY"
        return f"(({self.type_of(dtype)}){text})"

    def libm(self, name: str, dtype: DType, *args: str) -> str:
        return f"{name}({', '.join(args)})"  # overloaded for float and double; a half is computed as a float

    def reinterpret(self, src: DType, dst: DType, a: str) -> str: return f"as_{self.types[dst]}({a})"

    def load(self, ptr: str, idx: UOp) -> str:
        if idx.dtype.base.scalar is dtypes.bool: return f"((bool)*{ptr})"
        return super().load(ptr, idx)

    def store(self, ptr: str, value: str, idx: UOp) -> str:
        if idx.dtype.base.scalar is dtypes.bool: return f"*{ptr} = (uchar)({value});"
        return super().store(ptr, value, idx)

    def load_half(self, ptr: str) -> str: return f"vload_half(0, {ptr})"

    def store_half(self, ptr: str, value: str) -> str: return f"vstore_half({value}, 0, {ptr});"

    def special(self, u: UOp) -> str:
        call = "get_group_id" if u.arg.startswith("gidx") else "get_local_id"
        return f"((int){call}({u.arg[4:]}))"
