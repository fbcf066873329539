"""Vector values in C: GCC/clang vector types (`vector_size`), which both compilers map onto SSE, AVX2 or AVX-512.

`renders_vector(u)` says which vector nodes the C renderer has (expand.py builds the others lane by lane);
`pm_render_vector` maps them to C; `vector_prelude` declares the types and helpers a kernel uses. Each lane computes
what the scalar code would, bit for bit: a comparison gives a mask of all-ones lanes (its operands' width), `where`
and NaN-propagating `max` select bits through such masks, a vector load or store is a `memcpy` (no alignment is
assumed), a fused multiply-add (MULACC) rounds once, as the scalar `fma` does, and a BITCAST between lane types of
one width is a vector cast (GCC and clang reinterpret the bits of vectors of the same size).
"""

from __future__ import annotations

from ember.dtype import AddrSpace, DType, PtrDType, dtypes
from ember.uop.ops import TANGENT, GroupOp, Ops, UOp
from ember.uop.upat import PatternMatcher, UPat

# lane types: (name prefix, C element type)
VECTOR_NAMES: dict[DType, tuple[str, str]] = {
    dtypes.float32: ("f32", "float"), dtypes.float64: ("f64", "double"), dtypes.int8: ("i8", "int8_t"),
    dtypes.int16: ("i16", "int16_t"), dtypes.int32: ("i32", "int32_t"), dtypes.int64: ("i64", "int64_t"),
    dtypes.uint8: ("u8", "uint8_t"), dtypes.uint16: ("u16", "uint16_t"), dtypes.uint32: ("u32", "uint32_t"),
    dtypes.uint64: ("u64", "uint64_t"),
}


def c_type(dtype: DType) -> str:
    """The C name of a vector type (`f32x8`), or of a pointer to one."""
    if isinstance(dtype, PtrDType): return c_type(dtype.base) + "*"
    return f"{VECTOR_NAMES[dtype.scalar][0]}x{dtype.count}"


_ARITHMETIC = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^",
               Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.CMPEQ: "=="}
_FLOAT_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.RECIPROCAL, Ops.MAX, Ops.NEG, Ops.MULACC,
                        Ops.WHERE}) | \
    GroupOp.Comparison
_INT_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.NEG, Ops.AND, Ops.OR, Ops.XOR, Ops.WHERE}) | \
    GroupOp.Comparison
# x86 fused multiply-add by (scalar, lanes): the feature macro that must be defined, the intrinsic
_FMA = {(dtypes.float32, 4): ("__FMA__", "_mm_fmadd_ps"), (dtypes.float32, 8): ("__FMA__", "_mm256_fmadd_ps"),
        (dtypes.float32, 16): ("__AVX512F__", "_mm512_fmadd_ps"), (dtypes.float64, 2): ("__FMA__", "_mm_fmadd_pd"),
        (dtypes.float64, 4): ("__FMA__", "_mm256_fmadd_pd"), (dtypes.float64, 8): ("__AVX512F__", "_mm512_fmadd_pd")}


HELPER = "static inline __attribute__((unused))"  # (each type's helpers are declared, used or not: clang warns)


def has_lanes(dtype: DType) -> bool:
    return dtype.count > 1 and dtype.scalar in VECTOR_NAMES


def mask_bits(u: UOp) -> int | None:
    """The lane width of the mask a vector bool is held in: a comparison's operands' width, the common width of
    the masks an AND/OR/XOR combines; None for a bool vector of any other making (not rendered as a vector)."""
    if u.op in GroupOp.Comparison and not u.src[0].dtype.is_bool: return 8 * u.src[0].dtype.itemsize
    if u.op in (Ops.AND, Ops.OR, Ops.XOR) and (bits := mask_bits(u.src[0])) == mask_bits(u.src[1]): return bits
    return None


def mask_type(u: UOp) -> str:
    """The C type of a vector bool: signed lanes of its mask's width, all ones where true."""
    return f"i{mask_bits(u)}x{u.dtype.count}"


def renders_vector(u: UOp) -> bool:
    """Whether the C renderer has the vector node `u` (an op over vector sources of u's lane count)."""
    if u.op is Ops.STORE: return has_lanes(u.src[1].dtype)
    if u.op is Ops.LOAD: return has_lanes(u.dtype)
    if u.op in GroupOp.Comparison: return all(has_lanes(s.dtype) for s in u.src)
    if u.dtype.is_bool: return u.op in (Ops.AND, Ops.OR, Ops.XOR) and mask_bits(u) is not None
    if not has_lanes(u.dtype): return False
    if u.op is Ops.VECTORIZE: return True
    if u.op is Ops.CAST: return has_lanes(u.src[0].dtype) and not (u.src[0].dtype.is_float and u.dtype.is_int)
    if u.op is Ops.BITCAST: return has_lanes(u.src[0].dtype) and u.src[0].dtype.itemsize == u.dtype.itemsize
    if u.op is Ops.WHERE:  # selects bits through its condition's mask: the mask must be as wide as the values
        return mask_bits(u.src[0]) == 8 * u.dtype.itemsize and all(has_lanes(s.dtype) for s in u.src[1:])
    ops = _FLOAT_OPS if u.dtype.is_float else _INT_OPS
    return u.op in ops and all(has_lanes(s.dtype) for s in u.src)


def select(mask: str, a: str, b: str, dtype: DType) -> str:
    bits = f"i{8 * dtype.itemsize}x{dtype.count}"
    return f"(({c_type(dtype)})((({bits}){a}&{mask})|(({bits}){b}&~{mask})))"


def render_max(ctx: dict[UOp, str], x: UOp) -> str:
    a, b = ctx[x.src[0]], ctx[x.src[1]]
    mask = f"(({a}>{b})|({a}!={a}))" if x.dtype.is_float else f"({a}>{b})"  # NaN from either side, as numpy
    return select(mask, a, b, x.dtype)


def render_gep(ctx: dict[UOp, str], x: UOp) -> str:
    src = x.src[0]
    return f"({ctx[src]}[{x.arg}]!=0)" if src.dtype.is_bool else f"({ctx[src]}[{x.arg}])"


def render_load(ctx: dict[UOp, str], x: UOp, idx: UOp) -> str:
    if idx.dtype.addrspace is AddrSpace.REG: return f"*{ctx[idx]}"  # an accumulator
    if len(x.src) > 1:  # a gate per lane (expand.partial_load): the lanes it leaves out read no memory, hold 0
        bits = 8 * x.dtype.itemsize
        lanes = ",".join(("-1" if g.arg else "0") if g.op is Ops.CONST else f"-(int{bits}_t)({ctx[g]})"
                         for g in x.src[1:])
        return f"load_part_{c_type(x.dtype)}({ctx[idx]},(i{bits}x{x.dtype.count}){{{lanes}}})"
    value = f"load_{c_type(x.dtype)}({ctx[idx]})"
    return value if len(idx.src) < 3 else f"({ctx[idx.src[2]]}?{value}:({c_type(x.dtype)}){{0}})"


def render_tangent_product(ctx: dict[UOp, str], x: UOp) -> str | None:
    """A forward-mode product (arg TANGENT) of floats: 0 in the lanes where a zero factor meets inf or NaN (the
    product is NaN there), as the scalar form (cstyle.render_tangent_product)."""
    if not x.dtype.is_float: return None
    a, b = ctx[x.src[0]], ctx[x.src[1]]
    p, zero = f"({a}*{b})", f"(({c_type(x.dtype)}){{0}})"
    return select(f"(({p}!={p})&(({a}=={zero})|({b}=={zero})))", zero, p, x.dtype)


pm_render_vector = PatternMatcher([
    (UPat(Ops.GEP, name="x"), render_gep),
    (UPat(Ops.VECTORIZE, name="x"), lambda ctx, x: f"(({c_type(x.dtype)}){{{','.join(ctx[s] for s in x.src)}}})"),
    (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), name="x", allow_any_len=True), render_load),
    (UPat(Ops.MAX, name="x"), render_max),
    (UPat(Ops.WHERE, name="x"), lambda ctx, x: select(ctx[x.src[0]], ctx[x.src[1]], ctx[x.src[2]], x.dtype)),
    (UPat(Ops.MULACC, name="x"), lambda ctx, x: "fma_{}({},{},{})".format(c_type(x.dtype), *(ctx[s] for s in x.src))),
    (UPat(Ops.MUL, arg=TANGENT, name="x"), render_tangent_product),
    (UPat(tuple(_ARITHMETIC), name="x"), lambda ctx, x: f"({ctx[x.src[0]]}{_ARITHMETIC[x.op]}{ctx[x.src[1]]})"),
    (UPat(Ops.NEG, name="x"), lambda ctx, x: f"(-{ctx[x.src[0]]})"),
    (UPat(Ops.RECIPROCAL, name="x"), lambda ctx, x:  # 1/x, divided as the scalar code divides each lane
     f"({'1.0f' if x.dtype.scalar is dtypes.float32 else '1.0'}/{ctx[x.src[0]]})"),
    (UPat(Ops.CAST, name="x"), lambda ctx, x: f"__builtin_convertvector({ctx[x.src[0]]},{c_type(x.dtype)})"),
    (UPat(Ops.BITCAST, name="x"), lambda ctx, x: f"(({c_type(x.dtype)}){ctx[x.src[0]]})"),  # same size: the bits
])


def vector_prelude(uops: list[UOp]) -> str:
    """Typedefs and helpers for the vector types `uops` use, masks included."""
    types: set[DType] = set()
    for u in uops:
        d = u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype
        if d.count > 1 and not d.is_bool: types.add(d)
        if u.dtype.is_bool and u.dtype.count > 1 and (bits := mask_bits(u)):
            types.add(_signed(bits // 8).vec(u.dtype.count))
    for d in list(types): types.add(_signed(d.itemsize).vec(d.count))  # each value type's mask, for select
    fused = {u.dtype for u in uops if u.op is Ops.MULACC and u.dtype.count > 1}
    partial = {u.dtype for u in uops if u.op is Ops.LOAD and len(u.src) > 1}
    lines = ["#if defined(__x86_64__) || defined(__i386__)", "#include <immintrin.h>", "#endif"] if any(
        (d.scalar, d.count) in _FMA for d in fused | partial) else []  # a large header (100 ms to compile)
    for d in sorted(types, key=lambda d: (d.itemsize, d.name, d.count)):
        t, e = c_type(d), VECTOR_NAMES[d.scalar][1]
        lines.append(f"typedef {e} {t} __attribute__((vector_size({d.nbytes})));")
        lines.append(f"{HELPER} {t} load_{t}(const {e}* p) {{ {t} v; __builtin_memcpy(&v, p, sizeof v); "
                     "return v; }")
        lines.append(f"{HELPER} void store_{t}({e}* p, {t} v) {{ __builtin_memcpy(p, &v, sizeof v); }}")
        if d in fused:
            fma = "fma" if d.scalar is dtypes.float64 else "fmaf"
            lanes = f"{t} r; for (int i = 0; i < {d.count}; i++) r[i] = __builtin_{fma}(a[i], b[i], c[i]); return r;"
            if (d.scalar, d.count) in _FMA:
                feature, intrinsic = _FMA[(d.scalar, d.count)]
                lanes = f"\n#if defined({feature})\n  return {intrinsic}(a, b, c);\n#else\n  {lanes}\n#endif\n"
            lines.append(f"{HELPER} {t} fma_{t}({t} a, {t} b, {t} c) {{ {lanes} }}")
    lines += [partial_load(d) for d in sorted(partial, key=lambda d: (d.itemsize, d.name, d.count))]  # after masks
    return "\n".join(lines) + "\n" if lines else ""


# x86 loads of the lanes a mask selects, which touch no memory in the others, by (scalar, lanes): the feature macro,
# the call on (p, m), m's lanes all ones where read (AVX's maskload reads their top bit, AVX-512's a bit mask)
_MASKED_LOAD = {
    (dtypes.float32, 4): ("__AVX__", "_mm_maskload_ps(p, (__m128i)m)"),
    (dtypes.float32, 8): ("__AVX__", "_mm256_maskload_ps(p, (__m256i)m)"),
    (dtypes.float64, 2): ("__AVX__", "_mm_maskload_pd(p, (__m128i)m)"),
    (dtypes.float64, 4): ("__AVX__", "_mm256_maskload_pd(p, (__m256i)m)"),
    (dtypes.float32, 16): ("__AVX512F__",
                           "_mm512_maskz_loadu_ps(_mm512_cmplt_epi32_mask((__m512i)m, _mm512_setzero_si512()), p)"),
    (dtypes.float64, 8): ("__AVX512F__",
                          "_mm512_maskz_loadu_pd(_mm512_cmplt_epi64_mask((__m512i)m, _mm512_setzero_si512()), p)"),
}


def partial_load(d: DType) -> str:
    """`load_part_{t}(p, m)`: p's lanes where m is all ones, 0 elsewhere, reading no memory there (the lanes of a
    window that fall on a padding outside the buffer)."""
    t, e, m = c_type(d), VECTOR_NAMES[d.scalar][1], c_type(_signed(d.itemsize).vec(d.count))
    lanes = f"{t} v = {{0}}; for (int i = 0; i < {d.count}; i++) if (m[i]) v[i] = p[i]; return v;"
    if (d.scalar, d.count) in _MASKED_LOAD:
        feature, call = _MASKED_LOAD[(d.scalar, d.count)]
        lanes = f"\n#if defined({feature})\n  return ({t}){call};\n#else\n  {lanes}\n#endif\n"
    return f"{HELPER} {t} load_part_{t}(const {e}* p, {m} m) {{ {lanes} }}"


def _signed(itemsize: int) -> DType:
    return {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[itemsize]
