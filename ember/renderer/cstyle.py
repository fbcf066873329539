"""Render linearized UOps as C-family source, one function per kernel: a C-style base and its dialects.

`pm_render_c` maps a node to the C expression that computes it (a matcher that returns `str`, its ctx a
`RenderContext`: the names of the values so far and the dialect, `ctx.lang`); `CStyleRenderer.render` walks the
linear list, binds each value to a local and opens/closes loops. Floats print as hex literals so every constant is
exact; NaN-propagating max and guarded integer ops keep results equal to numpy's on every dialect.

A dialect is a subclass that sets what differs between C, OpenCL C, CUDA C and C++: type names (`types`), how a
kernel and its buffers are declared (`kernel_prefix`, `buffer_space`, `restrict`), thread ids (`special`), math
library calls (`libm`), bit casts (`bitcast`), non-finite literals (`nonfinite`) and its prelude. CRenderer is the
CPU's dialect; opencl.py and cuda.py hold the GPU ones; ember/export/cpp.py's C++ is a subclass of CRenderer.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ember.dtype import AddrSpace, DType, PtrDType, dtypes, float_to_int_via
from ember.errors import DTypeError
from ember.renderer import Renderer
from ember.renderer.cvector import c_type as vector_c_type
from ember.renderer.cvector import has_lanes, mask_type, pm_render_vector, renders_vector, vector_prelude
from ember.renderer.sincos import c_helpers, helper_name
from ember.renderer.sincos import computes as computes_sincos
from ember.renderer.sincos import used as sincos_used
from ember.renderer.tensorcore import TensorCore
from ember.uop.ops import TANGENT, GroupOp, Ops, UOp
from ember.uop.upat import PatternMatcher, UPat

FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
INTS = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32,
        dtypes.uint64)

C_TYPES: dict[DType, str] = {
    dtypes.bool: "bool", dtypes.int8: "int8_t", dtypes.int16: "int16_t", dtypes.int32: "int32_t",
    dtypes.int64: "int64_t", dtypes.uint8: "uint8_t", dtypes.uint16: "uint16_t", dtypes.uint32: "uint32_t",
    dtypes.uint64: "uint64_t", dtypes.float16: "_Float16", dtypes.float32: "float", dtypes.float64: "double",
}

UNSIGNED = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}

TANGENT_PRODUCT = {dtypes.float64: ("tangent_product_f64", "double"), dtypes.float32: ("tangent_product_f32", "float"),
                   dtypes.bfloat16: ("tangent_product_f32", "float")}  # (a bfloat16 value is a float in C)


def tangent_product_functions(linkage: str) -> dict[str, str]:
    """The C functions of forward-mode products (render_tangent_product), by name: the product where it is a number,
    the common case and one compare; 0 where it is NaN because a factor is zero (0 * inf, 0 * NaN). The compare is
    marked likely: g++ then lays the NaN case out of line and the products of a long straight-line body stay one
    block it schedules as a whole (measured: a quadrotor MPC hessian's loop body of 2800 products, 2.5x faster)."""
    likely = "\n#if defined(__GNUC__)\n  if (__builtin_expect(p == p, 1)) return p;\n#else\n" \
        "  if (p == p) return p;\n#endif\n"
    return {name: f"{linkage} {ctype} {name}({ctype} a, {ctype} b) {{\n  const {ctype} p = a * b;{likely}"
            "  return (a == 0 || b == 0) ? 0 : p;\n}" for name, ctype in TANGENT_PRODUCT.values()}


PRELUDE = """#include <math.h>
#include <stdbool.h>
#include <stdint.h>
static inline float bf16_load(uint16_t b) { union { uint32_t u; float f; } v = { (uint32_t)b << 16 }; return v.f; }
static inline uint16_t bf16_bits(float f) {
  union { float f; uint32_t u; } v = { f };
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);  /* NaN stays NaN */
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);  /* round to nearest, ties to even */
}
static inline float bf16_round(float f) { return bf16_load(bf16_bits(f)); }
""" + "\n".join(tangent_product_functions("static inline").values()) + "\n"


class RenderContext(dict):
    """What a rendering rule reads: the C expression of each value rendered so far (a dict keyed by UOp) and the
    dialect it is rendered in (`lang`)."""

    def __init__(self, lang: CStyleRenderer) -> None:
        super().__init__()
        self.lang = lang


def c_type(dtype: DType) -> str:
    """The C type of a value in the CPU's dialect (CRenderer.type_of)."""
    return C_DIALECT.type_of(dtype)


def c_const(value: float | int | bool, dtype: DType) -> str:
    """An exact C literal of `value` in `dtype`, in the CPU's dialect."""
    return C_DIALECT.const(value, dtype)


def _hex(value: float) -> str:
    """The shortest hexadecimal form of a double: exact in any dtype (0x1p+0, 0x1.8p-3)."""
    return re.sub(r"\.?0*p", "p", float(value).hex())


def float_literal(value: float, dtype: DType) -> str | None:
    """A finite float64 or float32 literal of its own type (no cast): hexadecimal, or the shortest decimal that
    reads back as the same value where that is shorter (0.05, 1e-05f), which is exact too: C compilers round decimal
    literals of at most DECIMAL_DIG digits correctly (C99 Annex F, IEEE 754). Parenthesized when negative. None for
    a value float32 cannot hold (it overflows to inf)."""
    if dtype.scalar is dtypes.float64: forms = [_hex(value), repr(float(value))]
    else:
        with np.errstate(over="ignore"): single = np.float32(value)
        if not np.isfinite(single): return None
        forms = [_hex(float(single)) + "f", np.format_float_positional(single, unique=True, trim="0") + "f",
                 np.format_float_scientific(single, unique=True, trim="-") + "f"]
    text = min(forms, key=len)
    return f"({text})" if text.startswith("-") else text


def unwrap(code: str) -> str:
    """`code` without the parentheses that enclose all of it, which an assignment does not need."""
    if not code.startswith("(") or not code.endswith(")"): return code
    depth = 0
    for i, ch in enumerate(code):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and i < len(code) - 1: return code  # (a)+(b): the first pair closes before the end
    return code[1:-1]


def render_max(x: UOp, a: str, b: str) -> str:
    """max(a, b) that propagates NaN from either side, as numpy.maximum does."""
    return f"(({a}>{b}||{a}!={a})?{a}:{b})" if x.dtype.is_float else f"(({a}>{b})?{a}:{b})"


def render_load(ctx: RenderContext, x: UOp, idx: UOp) -> str:
    """*ptr, gated by the INDEX's condition when it has one (no memory is touched when the gate is false)."""
    value = ctx.lang.load(ctx[idx], idx)
    return value if len(idx.src) < 3 else f"({ctx[idx.src[2]]}?{value}:{ctx.lang.const(0, x.dtype)})"


def narrow_memory(lang: CStyleRenderer, idx: UOp) -> bool:
    """Whether `idx` points at memory of a 16-bit float held in a float register: bfloat16, and half on a dialect
    that only stores it (storage_only)."""
    scalar = idx.dtype.base.scalar
    return (scalar is dtypes.bfloat16 or scalar in lang.storage_only) and \
        idx.dtype.addrspace is AddrSpace.GLOBAL  # type: ignore[attr-defined]  (registers and shared memory: float)


def render_shift(ctx: RenderContext, x: UOp) -> str:
    """a << b and a >> b with no undefined behaviour: C leaves amounts outside [0, bits) undefined (x86 takes them
    mod 32), and a left shift of a negative value; ember gives torch's answer, every bit shifted out (0, or -1 for
    >> of a negative), and shifts left in the unsigned type. An amount whose range is known inside needs no test."""
    a, b = _src(ctx, x)
    bits, amount, t = 8 * x.dtype.itemsize, x.src[1], ctx.lang.type_of(x.dtype)
    inside = f"(({ctx.lang.type_of(dtypes.uint64)})({b})<{bits}u)"
    known = 0 <= amount.vmin and amount.vmax < bits
    if x.op is Ops.SHL:
        unsigned = ctx.lang.type_of(UNSIGNED[x.dtype.itemsize]) if x.dtype.kind == "i" else t
        shifted = f"(({t})(({unsigned})({a})<<({b})))"
        return shifted if known else f"({inside}?{shifted}:0)"
    if known: return f"({a}>>{b})"
    return f"({a}>>({inside}?({b}):{bits - 1}))" if x.dtype.kind == "i" else f"({inside}?({a}>>{b}):0)"


def render_float_to_int(ctx: RenderContext, x: UOp) -> str:
    """A float converted to an integer type with no undefined behaviour: NaN and values out of range give what
    dtype.float_to_int says (torch's answers on x86); in range, C's conversion truncates toward zero."""
    a, lang = ctx[x.src[0]], ctx.lang
    bits = float_to_int_via(x.dtype)
    wide_type = dtypes.int64 if bits == 64 else dtypes.int32
    low = lang.const(-2**(bits - 1), wide_type)
    f = "" if x.src[0].dtype.scalar is dtypes.float64 else "f"  # (bounds of the source's type: no double needed)
    wide = f"(({a})>=-0x1p{bits - 1}{f}&&({a})<0x1p{bits - 1}{f}?({lang.type_of(wide_type)})({a}):{low})"
    if x.dtype.scalar is dtypes.uint64:
        u64 = lang.type_of(dtypes.uint64)
        wide = f"(({a})>=0x1p63{f}&&({a})<0x1p64{f}?({u64})({a}):({u64}){wide})"
    return wide if x.dtype.itemsize * 8 == bits and x.dtype.kind == "i" else f"(({lang.type_of(x.dtype)}){wide})"


def render_int_division(ctx: RenderContext, x: UOp) -> str:
    """Integer / and % that never trap: C leaves x/0 and INT_MIN/-1 undefined (SIGFPE on x86). A zero divisor gives
    0, as numpy does; -1 gives the wrapped negation. Divisions by other constants need no guard."""
    a, b = _src(ctx, x)
    op = "/" if x.op is Ops.IDIV else "%"
    d = x.src[1]
    wide = not x.dtype.is_unsigned and x.dtype.itemsize >= 4  # narrower types compute in int: no overflow
    if d.op is Ops.CONST and d.arg != 0 and (d.arg != -1 or not wide): return f"({a}{op}{b})"
    by_minus_one = (f"(-{a})" if op == "/" else "0")
    guarded = f"(({b}==-1)?{by_minus_one}:({a}{op}{b}))" if wide else f"({a}{op}{b})"
    return f"(({b}==0)?0:{guarded})"


def render_tangent_product(ctx: RenderContext, x: UOp) -> str:
    """A forward-mode product (arg TANGENT, ad/forward.py): a zero factor is a structural zero that zeroes the other,
    inf and NaN included, where IEEE gives NaN; as the interpreter computes it (export/interpreter.py) and as codegen
    folds a constant zero (pm_structural_zeros). Every other result keeps its bits, a zero's sign too. A finite
    nonzero constant factor needs no test; float and double call a function of the prelude where the dialect has
    one (measured: the test costs 8% of the cart-pole jacobians' time, 28% of the Rosenbrock hessian's)."""
    a, b = _src(ctx, x)
    p = f"({a}*{b})"
    if any(s.op is Ops.CONST and s.arg != 0 and math.isfinite(s.arg) for s in x.src): return p
    if ctx.lang.tangent_functions and x.dtype.scalar in TANGENT_PRODUCT:
        return f"{TANGENT_PRODUCT[x.dtype.scalar][0]}({a},{b})"
    return f"((({p}!={p})&&({a}==0||{b}==0))?{ctx.lang.const(0, x.dtype)}:{p})"


_BINARY = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.IDIV: "/", Ops.MOD: "%", Ops.CMPLT: "<",
           Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}
LIBM = {Ops.EXP: "exp", Ops.LOG: "log", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt",
        Ops.TRUNC: "trunc", Ops.POW: "pow", Ops.ATAN2: "atan2", **{op: op.name.lower() for op in GroupOp.Libm}}


def _src(ctx: RenderContext, x: UOp) -> list[str]:
    return [ctx[s] for s in x.src]


pm_render_c = PatternMatcher([
    (UPat(Ops.CONST, name="x"), lambda ctx, x: ctx.lang.const(x.arg, x.dtype)),
    (UPat(Ops.MOD, dtype=FLOATS, name="x"), lambda ctx, x: ctx.lang.libm("fmod", x.dtype, *_src(ctx, x))),
    (UPat((Ops.IDIV, Ops.MOD), name="x"), render_int_division),
    (UPat((Ops.SHL, Ops.SHR), name="x"), render_shift),
    (UPat(Ops.MUL, arg=TANGENT, dtype=FLOATS, name="x"), lambda ctx, x: ctx.lang.tangent_product(ctx, x)),
    (UPat(tuple(_BINARY), name="x"), lambda ctx, x: f"({_src(ctx, x)[0]}{_BINARY[x.op]}{_src(ctx, x)[1]})"),
    (UPat(tuple(LIBM), name="x"), lambda ctx, x: ctx.lang.libm(LIBM[x.op], x.dtype, *_src(ctx, x))),
    (UPat(Ops.NEG, name="x"), lambda ctx, x: f"(-{ctx[x.src[0]]})"),
    (UPat(Ops.RECIPROCAL, name="x"), lambda ctx, x: f"(1/{ctx[x.src[0]]})"),
    (UPat(Ops.MAX, name="x"), lambda ctx, x: render_max(x, *_src(ctx, x))),
    (UPat(Ops.WHERE, name="x"), lambda ctx, x: "({}?{}:{})".format(*_src(ctx, x))),
    (UPat(Ops.MULACC, name="x", dtype=FLOATS), lambda ctx, x: ctx.lang.libm("fma", x.dtype, *_src(ctx, x))),
    (UPat(Ops.MULACC, name="x"), lambda ctx, x: "(({}*{})+{})".format(*_src(ctx, x))),
    (UPat(Ops.CAST, name="x", dtype=INTS, src=(UPat(dtype=FLOATS),)), render_float_to_int),
    (UPat(Ops.CAST, name="x"), lambda ctx, x: f"(({ctx.lang.type_of(x.dtype)})({ctx[x.src[0]]}))"),
    (UPat(Ops.BITCAST, name="x"), lambda ctx, x: ctx.lang.bitcast(x, ctx[x.src[0]])),
    (UPat(Ops.INDEX, name="x"), lambda ctx, x: f"({ctx[x.src[0]]}+{ctx[x.src[1]]})"),
    (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), name="x"), render_load),
    (UPat(Ops.AFTER, name="x"), lambda ctx, x: ctx[x.src[0]]),
    # the vectors of a GPU dialect: a tensor core's fragments (the CPU's C has vector rules of its own, cvector.py)
    (UPat(Ops.VECTORIZE, name="x"), lambda ctx, x: ctx.lang.vectorize(x.dtype, _src(ctx, x))),
    (UPat(Ops.GEP, name="x"), lambda ctx, x: ctx.lang.gep(ctx[x.src[0]], x.arg)),
    (UPat(Ops.WMMA, name="x"), lambda ctx, x: ctx.lang.wmma(x.arg, *_src(ctx, x))),
])

_INLINE = {Ops.CONST, Ops.INDEX, Ops.AFTER}
_NOT_ROUNDED = {Ops.LOAD, Ops.VECTORIZE, Ops.GEP}  # values that hold their sources' (a narrow type's) bits


class CStyleRenderer(Renderer):
    """The C family: one function per kernel, a `const` local per value, a `for` per loop. Subclasses set the
    dialect; the rendering rules (`matcher`) are shared, and a dialect puts its own rules before them."""

    types: dict[DType, str] = C_TYPES
    prelude = ""
    kernel_prefix = ""  # what a kernel is declared with, before its `void`
    buffer_space = ""  # the address space of a buffer parameter (OpenCL's __global)
    restrict = "restrict"
    tangent_functions = False  # whether the prelude defines the tangent_product_* functions
    long_suffix = "ll"  # of a 64-bit integer literal
    shared_space = ""  # the qualifier of an array in workgroup-shared memory (OpenCL's __local)
    barrier = ""  # the statement that waits for every thread of the workgroup
    matcher = pm_render_c

    # ---- the dialect ---------------------------------------------------------------------------------------------

    def type_of(self, dtype: DType) -> str:
        """The type of a value; a bfloat16 value computes in float, and memory holds its 16 bits."""
        if isinstance(dtype, PtrDType):
            if dtype.base.scalar is dtypes.bfloat16 or dtype.base.scalar in self.storage_only:
                return self.types[dtypes.uint16] + "*"
            return self.type_of(dtype.base) + "*"
        if dtype.count > 1: return self.vector_type(dtype)
        if dtype.scalar is dtypes.bfloat16 or dtype.scalar in self.storage_only: return "float"
        if dtype.scalar not in self.types or dtype.scalar in self.unsupported:
            raise DTypeError(f"{self.device}: no type for {dtype} in {type(self).__name__}")
        return self.types[dtype.scalar]

    def nonfinite(self, value: float, dtype: DType) -> str:
        """A NaN or an infinity of `dtype`."""
        text = "__builtin_nan(\"\")" if math.isnan(value) else ("-" if value < 0 else "") + "__builtin_inf()"
        return f"(({self.type_of(dtype)}){text})"

    def const(self, value: float | int | bool, dtype: DType) -> str:
        """An exact literal of `value` in `dtype`."""
        if dtype.is_bool: return "1" if value else "0"
        if dtype.is_int:
            wide = self.long_suffix if dtype.itemsize == 8 else ""
            if dtype.is_unsigned: return f"{value}u{wide}"
            if value == dtype.min: return f"({value + 1}{wide}-1)"  # -2**31 is not a literal
            return f"{value}{wide}"
        if not math.isfinite(value): return self.nonfinite(value, dtype)
        if dtype.scalar in (dtypes.float64, dtypes.float32):
            if (text := float_literal(value, dtype)) is not None: return text
            return self.nonfinite(math.copysign(math.inf, value), dtype)
        return f"(({self.type_of(dtype)}){_hex(value)})"

    def libm(self, name: str, dtype: DType, *args: str) -> str:
        """A math library call at the precision of `dtype`; half computes in float and rounds back."""
        if dtype.scalar is dtypes.float64: return f"{name}({', '.join(args)})"
        if dtype.scalar in (dtypes.float32, dtypes.bfloat16): return f"{name}f({', '.join(args)})"
        return f"(({self.type_of(dtype)}){name}f({', '.join(f'(float)({a})' for a in args)}))"

    def bitcast(self, x: UOp, a: str) -> str:
        """Reinterpret the bits; a bfloat16 (or storage-only half) value lives in a float register, so its bits go
        through bf16_bits/bf16_load (half_bits/half_load)."""
        src, dst, u16 = x.src[0].dtype.scalar, x.dtype.scalar, dtypes.uint16
        if dst is dtypes.bfloat16: return f"bf16_load({self.reinterpret(src, u16, a)})"
        if src is dtypes.bfloat16: return self.reinterpret(u16, dst, f"bf16_bits({a})")
        if dst in self.storage_only: return f"half_load({self.reinterpret(src, u16, a)})"
        if src in self.storage_only: return self.reinterpret(u16, dst, f"half_bits({a})")
        return self.reinterpret(src, dst, a)

    def reinterpret(self, src: DType, dst: DType, a: str) -> str:
        """The bits of `a` (of type src) as a value of type dst, of the same size: a conversion between integers,
        a union otherwise (C99)."""
        if src.is_int and dst.is_int: return f"(({self.types[dst]})({a}))"
        return f"((union {{{self.type_of(src)} in; {self.type_of(dst)} out;}}){{.in={a}}}).out"

    def load(self, ptr: str, idx: UOp) -> str:
        """The value at `ptr` (a bfloat16 or storage-only half widened to float)."""
        if not narrow_memory(self, idx): return f"*{ptr}"
        return f"bf16_load(*{ptr})" if idx.dtype.base.scalar is dtypes.bfloat16 else self.load_half(ptr)

    def store(self, ptr: str, value: str, idx: UOp) -> str:
        """The statement storing `value` at `ptr`."""
        if not narrow_memory(self, idx): return f"*{ptr} = {value};"
        if idx.dtype.base.scalar is dtypes.bfloat16: return f"*{ptr} = bf16_bits({value});"
        return self.store_half(ptr, value)

    def load_half(self, ptr: str) -> str:
        """A storage-only half at `ptr`, as a float."""
        raise DTypeError(f"{self.device}: {type(self).__name__} has no half loads")

    def store_half(self, ptr: str, value: str) -> str:
        """The statement storing float `value` as a half at `ptr`."""
        raise DTypeError(f"{self.device}: {type(self).__name__} has no half stores")

    def round_narrow(self, u: UOp, code: str) -> str:
        """A value computed in float for a bfloat16 (or storage-only half) result, rounded to that type: every op
        rounds as the narrow type's would (float holds a product or sum of two of them exactly enough)."""
        if u.dtype.scalar is dtypes.bfloat16: return f"bf16_round({code})"
        return f"half_round({code})" if u.dtype.scalar in self.storage_only else code

    def tangent_product(self, ctx: RenderContext, x: UOp) -> str: return render_tangent_product(ctx, x)

    def vector_type(self, dtype: DType) -> str:
        """The type of a vector value (a tensor core's fragment); a dialect with vectors names them."""
        raise NotImplementedError(f"{type(self).__name__}: no vector type for {dtype}")

    def vectorize(self, dtype: DType, lanes: list[str]) -> str:
        """A vector of `dtype` made of the values `lanes`."""
        raise NotImplementedError(f"{type(self).__name__}: no vectors")

    def gep(self, vector: str, lane: int) -> str:
        """Lane `lane` of a vector."""
        raise NotImplementedError(f"{type(self).__name__}: no vectors")

    def wmma(self, tc: TensorCore, a: str, b: str, c: str) -> str:
        """A tensor core's product of a warp's fragments a and b plus c (codegen/tensorcore.py)."""
        raise NotImplementedError(f"{type(self).__name__}: no tensor core {tc}")

    def scratch(self, uops: list[UOp]) -> list[str]:
        """Declarations the kernel's body starts with (OpenCL's tensor-core reference: its local memory)."""
        return []

    def special(self, u: UOp) -> str:
        """The expression of a thread index (SPECIAL): a dialect with a launch grid names its ids."""
        raise NotImplementedError(f"{type(self).__name__}: no thread index {u.arg}")

    def parameter(self, u: UOp, written: bool) -> str:
        """The declaration of buffer parameter `u` (a DEFINE_GLOBAL)."""
        const = "" if written else "const "
        return f"{self.buffer_space}{const}{self.type_of(u.dtype)} {self.restrict} data{u.arg}".replace("  ", " ")

    def variable_parameter(self, u: UOp) -> str:
        """The parameter declaring DEFINE_VAR u; variables follow the buffers in the order of their names."""
        return f"const {self.type_of(u.dtype)} {u.arg.name}"

    # ---- the walk ------------------------------------------------------------------------------------------------

    def render(self, name: str, uops: list[UOp]) -> str:
        return self.prelude + self.render_function(name, uops)

    def render_value(self, u: UOp, ctx: RenderContext) -> str | None:
        """The expression of value `u`; None where no rule renders it."""
        return self.matcher.rewrite(u, ctx=ctx)

    def render_function(self, name: str, uops: list[UOp]) -> str:
        """The kernel as one function, without the prelude."""
        stored = {u.src[0].src[0].arg for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL}
        names = RenderContext(self)
        params: list[tuple[int, str]] = []  # (position, declaration): buffers by slot, then variables
        body: list[str] = ["  " + line for line in self.scratch(uops)]
        depth = 1
        counts: dict[str, int] = {}
        taken = {u.arg.name for u in uops if u.op is Ops.DEFINE_VAR}  # a Variable may be called t0

        def fresh(prefix: str) -> str:
            while True:
                counts[prefix] = counts.get(prefix, -1) + 1
                if (name := f"{prefix}{counts[prefix]}") not in taken: return name

        for u in uops:
            pad = "  " * depth
            if u.op is Ops.DEFINE_GLOBAL:
                names[u] = f"data{u.arg}"
                params.append((u.arg, self.parameter(u, u.arg in stored)))
            elif u.op is Ops.DEFINE_VAR:
                names[u] = u.arg.name
                params.append((1 << 30, self.variable_parameter(u)))  # (int32 all: in the order of their names)
            elif u.op is Ops.SPECIAL:
                names[u] = self.special(u)
                if u.arg == "core": params.append((1 << 31, "const int32_t core"))  # the CPU's slice of the work
            elif u.op is Ops.DEFINE_REG:
                names[u] = fresh("acc")
                body.append(f"{pad}{self.type_of(u.dtype.base)} {names[u]}[{u.dtype.size}];")
            elif u.op is Ops.DEFINE_LOCAL:
                names[u] = f"temp{u.arg}"
                body.append(f"{pad}{self.shared_space}{self.type_of(u.dtype.base)} {names[u]}[{u.dtype.size}];")
            elif u.op is Ops.BARRIER:
                body.append(f"{pad}{self.barrier}")
            elif u.op is Ops.RANGE:
                names[u] = f"r{u.arg.axis}"
                body.append(f"{pad}for ({self.type_of(u.dtype)} {names[u]} = 0; {names[u]} < {names[u.src[0]]}; "
                            f"{names[u]}++) {{")
                depth += 1
            elif u.op is Ops.END:
                depth -= 1
                body.append("  " * depth + "}")
            elif u.op is Ops.STORE:
                # a gated store (the lanes past a symbolic loop's end: codegen/opt.py) writes only where its gate is
                gate = f"if ({unwrap(names[u.src[0].src[2]])}) " if len(u.src[0].src) > 2 else ""
                if u.src[1].dtype.count > 1 and u.src[0].dtype.addrspace is not AddrSpace.REG:
                    body.append(f"{pad}{gate}store_{vector_c_type(u.src[1].dtype)}({names[u.src[0]]}, "
                                f"{names[u.src[1]]});")
                else:
                    body.append(f"{pad}{gate}{self.store(names[u.src[0]], names[u.src[1]], u.src[0])}")
            elif u.op in (Ops.SINK, Ops.NOOP):
                continue
            else:
                code = self.render_value(u, names)
                if code is None: raise NotImplementedError(f"{type(self).__name__}: cannot render {u.op.name} "
                                                           f"({u.dtype})")
                if u.op in _INLINE:
                    names[u] = code
                else:
                    if u.op not in _NOT_ROUNDED: code = self.round_narrow(u, code)
                    names[u] = fresh("val" if u.op is Ops.LOAD else "t")  # a loaded value, a temporary
                    ctype = mask_type(u) if u.dtype.is_bool and u.dtype.count > 1 else self.type_of(u.dtype)
                    body.append(f"{pad}const {ctype} {names[u]} = {unwrap(code)};")
        signature = f"{self.kernel_prefix}void {name}({', '.join(p for _, p in sorted(params))})"
        return signature + " {\n" + "\n".join(body) + "\n}\n"


def render_sincos(ctx: RenderContext, x: UOp) -> str:
    """A float64 sine or cosine as ember's own (renderer/sincos.py): a whole vector at once, not a call per lane."""
    return f"{helper_name(x.op, x.dtype)}({ctx[x.src[0]]})"


pm_render_sincos = PatternMatcher([(UPat((Ops.SIN, Ops.COS), name="x"), lambda ctx, x:
                                    render_sincos(ctx, x) if computes_sincos(x) else None)])


class CRenderer(CStyleRenderer):
    """C99 for the host compiler: buffers are `restrict` pointers, const where only read; values of several lanes
    are GCC/clang vector types (cvector.py) and a threaded kernel's slice is its `core` parameter. float64 sin and
    cos are ember's (renderer/sincos.py), on vectors too.

    The C++ flavor (ember/export/cpp.py) is a subclass."""

    device = "CPU"
    prelude = PRELUDE
    tangent_functions = True
    linkage = ""  # "static " for kernels private to one translation unit
    matcher = pm_render_sincos + pm_render_c
    vector_matcher = pm_render_sincos + pm_render_vector

    max_threads = 1024  # the thread pool's limit (runtime/ops_cpu.py), and generate_module's

    def __init__(self, vector_bytes: int = 0, cores: int = 1, task_entries: bool = False,
                 vector_registers: int = 16) -> None:
        self.vector_bytes, self.cores, self.vector_registers = vector_bytes, cores, vector_registers
        # every kernel gets a `{name}_task` entry (the CPU device: its graph runner calls any kernel through it);
        # otherwise only threaded kernels, which the pool needs (exported C++ stays as small as it was)
        self.task_entries = task_entries

    def type_of(self, dtype: DType) -> str:
        """A vector is a GCC vector type named for its lanes (`f32x8`), declared by `vector_prelude`."""
        if dtype.count > 1 or (isinstance(dtype, PtrDType) and dtype.base.count > 1): return vector_c_type(dtype)
        return super().type_of(dtype)

    def renders_vector(self, u: UOp) -> bool:
        if computes_sincos(u): return self.vector_bytes > 0 and all(has_lanes(s.dtype) for s in (u, *u.src))
        return self.vector_bytes > 0 and renders_vector(u)

    def render_value(self, u: UOp, ctx: RenderContext) -> str | None:
        vector = (u.dtype.count > 1 and not isinstance(u.dtype, PtrDType)) or u.op is Ops.GEP
        return (self.vector_matcher if vector else self.matcher).rewrite(u, ctx=ctx)

    def special(self, u: UOp) -> str: return "core"

    def render(self, name: str, uops: list[UOp]) -> str:
        sincos = "".join(c_helpers(lanes, False, ops) for lanes, ops in sincos_used(uops).items())
        src = self.prelude + vector_prelude(uops) + sincos + self.render_function(name, uops)
        threaded = any(u.op is Ops.SPECIAL for u in uops)
        return src + (self.render_task(name, uops) if threaded or self.task_entries else "")

    def render_task(self, name: str, uops: list[UOp]) -> str:
        """`{name}_task(args, core)`: the kernel called with its arguments from an array, the form the CPU's thread
        pool and graph runner call (runtime/ops_cpu.py, runtime/graph.py): buffers by slot, then variables as
        integers in the order of the kernel's parameters. A kernel that is not threaded ignores `core`."""
        globals_ = sorted((u for u in uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
        variables = sorted((u for u in uops if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg.name)
        args = [f"({self.type_of(g.dtype)})args[{i}]" for i, g in enumerate(globals_)]
        args += [f"({self.type_of(v.dtype)})(intptr_t)args[{len(globals_) + i}]" for i, v in enumerate(variables)]
        if any(u.op is Ops.SPECIAL for u in uops): args.append("core")
        return f"void {name}_task(void **args, int32_t core) {{ (void)core; {name}({', '.join(args)}); }}\n"

    def render_function(self, name: str, uops: list[UOp]) -> str:
        return self.linkage + super().render_function(name, uops)


C_DIALECT = CRenderer()  # the CPU's dialect, for c_type and c_const
