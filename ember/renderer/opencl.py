"""OpenCL C: the C-style walk in OpenCL's dialect, one `__kernel` per kernel, launched over workgroups.

What differs from the CPU's C: OpenCL's type names (int, long, uchar), `__global` buffers, thread indices from
get_group_id/get_local_id, overloaded math builtins (exp, not expf), `as_<type>` bit casts, and memory of bool as
uchar (a kernel may not take bool pointers). Contraction is off (FP_CONTRACT OFF) so a*b+c rounds twice, as numpy
does; division and sqrt are correctly rounded (the device's compiler gets -cl-fp32-correctly-rounded-divide-sqrt).
Half without cl_khr_fp16 is storage only: vload_half/vstore_half, computed in float and rounded to half after every
op (half_round), which gives half arithmetic's bits for +, -, *, / and sqrt.
"""

from __future__ import annotations

import math

from ember.dtype import DType, PtrDType, dtypes
from ember.renderer.cstyle import CStyleRenderer
from ember.renderer.tensorcore import TensorCore, c_index
from ember.uop.ops import Ops, UOp

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


def wmma_name(tc: TensorCore) -> str: return f"wmma_{tc.name}_{tc.dtype_in.name}"


def reference_wmma(lang: OpenCLRenderer, tc: TensorCore) -> str:
    """A tensor core computed as its warp would: each lane writes the elements of A and B it holds to the warp's tiles
    in local memory, where the layout (renderer/tensorcore.py) puts them; after a barrier each lane computes the
    elements of D it holds, c + the row of A times the column of B, k in order. A lane is work-item dimension 0 (TC
    makes the warp local id 0), its warp the workgroup's other dimensions. Every lane of the workgroup calls it
    (a WMMA is never under a gate), so the barriers are uniform."""
    (m, n, k), t = tc.dims, lang.type_of
    na, nb, nc = (tc.elements(o) for o in "abc")
    lines = [f"{t(tc.dtype_out.vec(nc))} {wmma_name(tc)}({t(tc.dtype_in.vec(na))} a, {t(tc.dtype_in.vec(nb))} b, "
             f"{t(tc.dtype_out.vec(nc))} c, __local float *scratch) {{",
             "  const int lane = get_local_id(0);",
             f"  __local float *A = scratch + (get_local_id(1) + get_local_size(1) * get_local_id(2)) * "
             f"{m * k + k * n}, *B = A + {m * k};"]
    for tile, operand, width, count in (("A", "a", k, na), ("B", "b", n, nb)):
        for e in range(count):
            row, col = (c_index(bits, "lane", e) for bits in tc.layout(operand))
            lines.append(f"  {tile}[({row})*{width}+({col})] = {operand}.s{e:x};")
    lines += ["  barrier(CLK_LOCAL_MEM_FENCE);", f"  {t(tc.dtype_out.vec(nc))} d;"]
    for e in range(nc):
        row, col = (c_index(bits, "lane", e) for bits in tc.c)
        lines.append(f"  {{ float s = 0; for (int i = 0; i < {k}; i++) s += A[({row})*{k}+i] * B[i*{n}+({col})]; "
                     f"d.s{e:x} = c.s{e:x} + s; }}")
    return "\n".join([*lines, "  barrier(CLK_LOCAL_MEM_FENCE);", "  return d;", "}", ""])


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
                 fp16: bool = False, tensor_cores: tuple[TensorCore, ...] = ()) -> None:
        self.tensor_cores = tensor_cores  # another target's, emulated (reference_wmma): OpenCL C has none
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

    def vector_type(self, dtype: DType) -> str: return f"{self.type_of(dtype.scalar)}{dtype.count}"

    def vectorize(self, dtype: DType, lanes: list[str]) -> str: return f"(({self.type_of(dtype)})({', '.join(lanes)}))"

    def gep(self, vector: str, lane: int) -> str: return f"{vector}.s{lane:x}"

    def wmma(self, tc: TensorCore, a: str, b: str, c: str) -> str: return f"{wmma_name(tc)}({a}, {b}, {c}, tc_scratch)"

    def scratch(self, uops: list[UOp]) -> list[str]:
        """The local memory of the tensor-core reference: a tile of A and of B per warp of the workgroup."""
        cores = {u.arg for u in uops if u.op is Ops.WMMA}
        if not cores: return []
        threads = math.prod(int(u.src[0].arg) for u in uops if u.op is Ops.SPECIAL and u.arg.startswith("lidx"))
        per_warp = max(tc.dims[0] * tc.dims[2] + tc.dims[2] * tc.dims[1] for tc in cores)
        return [f"__local float tc_scratch[{threads // 32 * per_warp}];"]

    def render(self, name: str, uops: list[UOp]) -> str:
        cores = dict.fromkeys(u.arg for u in uops if u.op is Ops.WMMA)
        return self.prelude + "".join(reference_wmma(self, tc) for tc in cores) + self.render_function(name, uops)

    def special(self, u: UOp) -> str:
        call = "get_group_id" if u.arg.startswith("gidx") else "get_local_id"
        return f"((int){call}({u.arg[4:]}))"
