"""Render linearized UOps as C source, one function per kernel.

`pm_render_c` maps a node to the C expression that computes it (a matcher that returns `str`); `CRenderer.render`
walks the linear list, binds each value to a local and opens/closes loops. Floats print as hex literals so every
constant is exact; NaN-propagating max and libm calls keep results equal to numpy's.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ember.dtype import AddrSpace, DType, PtrDType, dtypes, float_to_int_via
from ember.renderer import Renderer
from ember.renderer.cvector import c_type as vector_c_type
from ember.renderer.cvector import mask_type, pm_render_vector, renders_vector, vector_prelude
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


def c_type(dtype: DType) -> str:
    """The C type of a value; bfloat16 values compute in float, and memory holds their 16 bits. A vector is a GCC
    vector type named for its lanes (`f32x8`), declared by `vector_prelude`."""
    if dtype.count > 1 or (isinstance(dtype, PtrDType) and dtype.base.count > 1): return vector_c_type(dtype)
    if isinstance(dtype, PtrDType):
        return "uint16_t*" if dtype.base.scalar is dtypes.bfloat16 else c_type(dtype.base) + "*"
    if dtype.scalar is dtypes.bfloat16: return "float"
    if dtype.scalar not in C_TYPES: raise NotImplementedError(f"C renderer: no C type for {dtype}")
    return C_TYPES[dtype.scalar]


def c_const(value: float | int | bool, dtype: DType) -> str:
    """An exact C literal of `value` in `dtype`."""
    if dtype.is_bool: return "1" if value else "0"
    if dtype.is_int:
        if dtype.is_unsigned: return f"{value}u" + ("ll" if dtype.itemsize == 8 else "")
        if value == dtype.min: return f"({value + 1}{'ll' if dtype.itemsize == 8 else ''}-1)"  # -2**31 is not a literal
        return f"{value}ll" if dtype.itemsize == 8 else str(value)
    if dtype.scalar in (dtypes.float64, dtypes.float32) and math.isfinite(value): return _float_literal(value, dtype)
    if math.isnan(value): text = "__builtin_nan(\"\")"
    elif math.isinf(value): text = ("-" if value < 0 else "") + "__builtin_inf()"
    else: text = _hex(value)
    return f"(({c_type(dtype)}){text})"


def _hex(value: float) -> str:
    """The shortest hexadecimal form of a double: exact in any dtype (0x1p+0, 0x1.8p-3)."""
    return re.sub(r"\.?0*p", "p", float(value).hex())


def _float_literal(value: float, dtype: DType) -> str:
    """A float64 or float32 literal of its own type (no cast): hexadecimal, or the shortest decimal that reads back
    as the same value where that is shorter (0.05, 1e-05f), which is exact too: C compilers round decimal literals of
    at most DECIMAL_DIG digits correctly (C99 Annex F, IEEE 754). Parenthesized when negative."""
    if dtype.scalar is dtypes.float64: forms = [_hex(value), repr(float(value))]
    else:
        with np.errstate(over="ignore"): single = np.float32(value)
        if not np.isfinite(single): return c_const(float(single), dtype)
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


def _libm(name: str, dtype: DType, *args: str) -> str:
    """A libm call at the precision of `dtype`; half computes in float and rounds back."""
    if dtype.scalar is dtypes.float64: return f"{name}({', '.join(args)})"
    if dtype.scalar in (dtypes.float32, dtypes.bfloat16): return f"{name}f({', '.join(args)})"
    return f"(({c_type(dtype)}){name}f({', '.join(f'(float)({a})' for a in args)}))"


def render_max(x: UOp, a: str, b: str) -> str:
    """max(a, b) that propagates NaN from either side, as numpy.maximum does."""
    return f"(({a}>{b}||{a}!={a})?{a}:{b})" if x.dtype.is_float else f"(({a}>{b})?{a}:{b})"


def render_load(ctx: dict[UOp, str], x: UOp, idx: UOp) -> str:
    """*ptr, gated by the INDEX's condition when it has one (no memory is touched when the gate is false)."""
    value = f"bf16_load(*{ctx[idx]})" if _is_bf16_memory(idx) else f"*{ctx[idx]}"
    return value if len(idx.src) < 3 else f"({ctx[idx.src[2]]}?{value}:{c_const(0, x.dtype)})"


def _is_bf16_memory(idx: UOp) -> bool:
    return idx.dtype.base.scalar is dtypes.bfloat16 and idx.dtype.addrspace is not AddrSpace.REG  # type: ignore[attr-defined]


def render_shift(x: UOp, a: str, b: str) -> str:
    """a << b and a >> b with no undefined behaviour: C leaves amounts outside [0, bits) undefined (x86 takes them
    mod 32), and a left shift of a negative value; ember gives torch's answer, every bit shifted out (0, or -1 for
    >> of a negative), and shifts left in the unsigned type. An amount whose range is known inside needs no test."""
    bits, amount = 8 * x.dtype.itemsize, x.src[1]
    inside = f"((uint64_t)({b})<{bits}u)"
    known = 0 <= amount.vmin and amount.vmax < bits
    if x.op is Ops.SHL:
        shifted = f"(({c_type(x.dtype)})((u{c_type(x.dtype)})({a})<<({b})))" if x.dtype.kind == "i" else \
            f"(({c_type(x.dtype)})(({a})<<({b})))"
        return shifted if known else f"({inside}?{shifted}:0)"
    if known: return f"({a}>>{b})"
    return f"({a}>>({inside}?({b}):{bits - 1}))" if x.dtype.kind == "i" else f"({inside}?({a}>>{b}):0)"


def render_float_to_int(x: UOp, a: str) -> str:
    """A float converted to an integer type with no undefined behaviour: NaN and values out of range give what
    dtype.float_to_int says (torch's answers on x86); in range, C's conversion truncates toward zero."""
    bits = float_to_int_via(x.dtype)
    low = c_const(-2**(bits - 1), dtypes.int64 if bits == 64 else dtypes.int32)
    wide = f"(({a})>=-0x1p{bits - 1}&&({a})<0x1p{bits - 1}?(int{bits}_t)({a}):{low})"
    if x.dtype.scalar is dtypes.uint64: wide = f"(({a})>=0x1p63&&({a})<0x1p64?(uint64_t)({a}):(uint64_t){wide})"
    return wide if x.dtype.itemsize * 8 == bits and x.dtype.kind == "i" else f"(({c_type(x.dtype)}){wide})"


def render_bitcast(x: UOp, a: str) -> str:
    """Reinterpret the bits; a bfloat16 value lives in a float register, so its bits go through bf16_bits/load."""
    if x.dtype.scalar is dtypes.bfloat16: return f"bf16_load((uint16_t)({a}))"
    if x.src[0].dtype.scalar is dtypes.bfloat16: return f"(({c_type(x.dtype)})bf16_bits({a}))"
    src = c_type(x.src[0].dtype)
    return f"((union {{{src} in; {c_type(x.dtype)} out;}}){{.in={a}}}).out"


def render_int_division(x: UOp, a: str, b: str) -> str:
    """Integer / and % that never trap: C leaves x/0 and INT_MIN/-1 undefined (SIGFPE on x86). A zero divisor gives
    0, as numpy does; -1 gives the wrapped negation. Divisions by other constants need no guard."""
    op = "/" if x.op is Ops.IDIV else "%"
    d = x.src[1]
    wide = not x.dtype.is_unsigned and x.dtype.itemsize >= 4  # narrower types compute in int: no overflow
    if d.op is Ops.CONST and d.arg != 0 and (d.arg != -1 or not wide): return f"({a}{op}{b})"
    by_minus_one = (f"(-{a})" if op == "/" else "0")
    guarded = f"(({b}==-1)?{by_minus_one}:({a}{op}{b}))" if wide else f"({a}{op}{b})"
    return f"(({b}==0)?0:{guarded})"


def render_tangent_product(x: UOp, a: str, b: str) -> str:
    """A forward-mode product (arg TANGENT, ad/forward.py): a zero factor is a structural zero that zeroes the other,
    inf and NaN included, where IEEE gives NaN; as the interpreter computes it (export/interpreter.py) and as codegen
    folds a constant zero (pm_structural_zeros). Every other result keeps its bits, a zero's sign too. A finite
    nonzero constant factor needs no test; float and double call a function of the prelude (measured: the test
    costs 8% of the cart-pole jacobians' time, 28% of the Rosenbrock hessian's, whose loop is vectorized)."""
    p = f"({a}*{b})"
    if any(s.op is Ops.CONST and s.arg != 0 and math.isfinite(s.arg) for s in x.src): return p
    if x.dtype.scalar in TANGENT_PRODUCT: return f"{TANGENT_PRODUCT[x.dtype.scalar][0]}({a},{b})"
    return f"((({p}!={p})&&({a}==0||{b}==0))?{c_const(0, x.dtype)}:{p})"


_BINARY = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.IDIV: "/", Ops.MOD: "%", Ops.CMPLT: "<",
           Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}
_LIBM = {Ops.EXP: "exp", Ops.LOG: "log", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt",
         Ops.TRUNC: "trunc", **{op: op.name.lower() for op in GroupOp.Libm}}


def _src(ctx: dict[UOp, str], x: UOp) -> list[str]:
    return [ctx[s] for s in x.src]


pm_render_c = PatternMatcher([
    (UPat(Ops.CONST, name="x"), lambda ctx, x: c_const(x.arg, x.dtype)),
    (UPat(Ops.MOD, dtype=FLOATS, name="x"), lambda ctx, x: _libm("fmod", x.dtype, *_src(ctx, x))),
    (UPat((Ops.IDIV, Ops.MOD), name="x"), lambda ctx, x: render_int_division(x, *_src(ctx, x))),
    (UPat((Ops.SHL, Ops.SHR), name="x"), lambda ctx, x: render_shift(x, *_src(ctx, x))),
    (UPat(Ops.MUL, arg=TANGENT, dtype=FLOATS, name="x"), lambda ctx, x: render_tangent_product(x, *_src(ctx, x))),
    (UPat(tuple(_BINARY), name="x"), lambda ctx, x: f"({_src(ctx, x)[0]}{_BINARY[x.op]}{_src(ctx, x)[1]})"),
    (UPat(tuple(_LIBM), name="x"), lambda ctx, x: _libm(_LIBM[x.op], x.dtype, ctx[x.src[0]])),
    (UPat(Ops.POW, name="x"), lambda ctx, x: _libm("pow", x.dtype, *_src(ctx, x))),
    (UPat(Ops.ATAN2, name="x"), lambda ctx, x: _libm("atan2", x.dtype, *_src(ctx, x))),
    (UPat(Ops.NEG, name="x"), lambda ctx, x: f"(-{ctx[x.src[0]]})"),
    (UPat(Ops.RECIPROCAL, name="x"), lambda ctx, x: f"(1/{ctx[x.src[0]]})"),
    (UPat(Ops.MAX, name="x"), lambda ctx, x: render_max(x, *_src(ctx, x))),
    (UPat(Ops.WHERE, name="x"), lambda ctx, x: "({}?{}:{})".format(*_src(ctx, x))),
    (UPat(Ops.MULACC, name="x", dtype=FLOATS), lambda ctx, x: _libm("fma", x.dtype, *_src(ctx, x))),  # one rounding
    (UPat(Ops.MULACC, name="x"), lambda ctx, x: "(({}*{})+{})".format(*_src(ctx, x))),
    (UPat(Ops.CAST, name="x", dtype=INTS, src=(UPat(dtype=FLOATS),)), lambda ctx, x: render_float_to_int(x,
                                                                                                  ctx[x.src[0]])),
    (UPat(Ops.CAST, name="x"), lambda ctx, x: f"(({c_type(x.dtype)})({ctx[x.src[0]]}))"),
    (UPat(Ops.BITCAST, name="x"), lambda ctx, x: render_bitcast(x, ctx[x.src[0]])),
    (UPat(Ops.INDEX, name="x"), lambda ctx, x: f"({ctx[x.src[0]]}+{ctx[x.src[1]]})"),
    (UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), name="x"), lambda ctx, x, idx: render_load(ctx, x, idx)),
    (UPat(Ops.AFTER, name="x"), lambda ctx, x: ctx[x.src[0]]),
])

_INLINE = {Ops.CONST, Ops.INDEX, Ops.AFTER}


def variable_parameter(u: UOp) -> str:
    """The parameter declaring DEFINE_VAR u; variables follow the buffers in the order of their names."""
    return f"const {c_type(u.dtype)} {u.arg.name}"


class CRenderer(Renderer):
    """C99 for the host compiler. One function per kernel; buffers are `restrict` pointers, const where only read.

    The C++ flavor (ember/export/cpp.py) changes only what the class attributes name."""

    device = "CPU"
    supported_ops = frozenset(Ops)
    prelude = PRELUDE
    restrict = "restrict"
    linkage = ""  # "static " for kernels private to one translation unit
    kernel_attribute = ""  # what each kernel is declared with, before its `void`
    matcher = pm_render_c
    vector_matcher = pm_render_vector

    vector_bytes = 0  # set by the CPU device from the CPU it runs on

    def __init__(self, vector_bytes: int = 0, cores: int = 1, task_entries: bool = False) -> None:
        self.vector_bytes, self.cores = vector_bytes, cores
        # every kernel gets a `{name}_task` entry (the CPU device: its graph runner calls any kernel through it);
        # otherwise only threaded kernels, which the pool needs (exported C++ stays as small as it was)
        self.task_entries = task_entries

    def renders_vector(self, u: UOp) -> bool:
        return self.vector_bytes > 0 and renders_vector(u)

    def render(self, name: str, uops: list[UOp]) -> str:
        src = self.prelude + vector_prelude(uops) + self.render_function(name, uops)
        threaded = any(u.op is Ops.SPECIAL for u in uops)
        return src + (self.render_task(name, uops) if threaded or self.task_entries else "")

    def render_task(self, name: str, uops: list[UOp]) -> str:
        """`{name}_task(args, core)`: the kernel called with its arguments from an array, the form the CPU's thread
        pool and graph runner call (runtime/ops_cpu.py, runtime/graph.py): buffers by slot, then variables as
        integers in the order of the kernel's parameters. A kernel that is not threaded ignores `core`."""
        globals_ = sorted((u for u in uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
        variables = sorted((u for u in uops if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg.name)
        args = [f"({c_type(g.dtype)})args[{i}]" for i, g in enumerate(globals_)]
        args += [f"({c_type(v.dtype)})(intptr_t)args[{len(globals_) + i}]" for i, v in enumerate(variables)]
        if any(u.op is Ops.SPECIAL for u in uops): args.append("core")
        return f"void {name}_task(void **args, int32_t core) {{ (void)core; {name}({', '.join(args)}); }}\n"

    def render_function(self, name: str, uops: list[UOp]) -> str:
        """The kernel as one C function, without the prelude."""
        stored = {u.src[0].src[0].arg for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL}
        names: dict[UOp, str] = {}
        params: list[tuple[int, str]] = []  # (position, declaration): buffers by slot, then variables
        body: list[str] = []
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
                const = "" if u.arg in stored else "const "
                params.append((u.arg, f"{const}{c_type(u.dtype)} {self.restrict} data{u.arg}"))
            elif u.op is Ops.DEFINE_VAR:
                names[u] = u.arg.name
                params.append((1 << 30, variable_parameter(u)))  # (int32 all: in the order of their names)
            elif u.op is Ops.SPECIAL:  # the slice of a threaded kernel this call runs
                names[u] = "core"
                params.append((1 << 31, "const int32_t core"))
            elif u.op is Ops.DEFINE_REG:
                names[u] = fresh("acc")
                body.append(f"{pad}{c_type(u.dtype.base)} {names[u]}[{u.dtype.size}];")
            elif u.op is Ops.RANGE:
                names[u] = f"r{u.arg.axis}"
                body.append(f"{pad}for ({c_type(u.dtype)} {names[u]} = 0; {names[u]} < {names[u.src[0]]}; "
                            f"{names[u]}++) {{")
                depth += 1
            elif u.op is Ops.END:
                depth -= 1
                body.append("  " * depth + "}")
            elif u.op is Ops.STORE:
                # a gated store (the lanes past a symbolic loop's end: codegen/opt.py) writes only where its gate is
                gate = f"if ({unwrap(names[u.src[0].src[2]])}) " if len(u.src[0].src) > 2 else ""
                if u.src[1].dtype.count > 1 and u.src[0].dtype.addrspace is not AddrSpace.REG:
                    body.append(f"{pad}{gate}store_{c_type(u.src[1].dtype)}({names[u.src[0]]}, {names[u.src[1]]});")
                else:
                    value = f"bf16_bits({names[u.src[1]]})" if _is_bf16_memory(u.src[0]) else names[u.src[1]]
                    body.append(f"{pad}{gate}*{names[u.src[0]]} = {value};")
            elif u.op in (Ops.SINK, Ops.NOOP):
                continue
            else:
                vector = (u.dtype.count > 1 and not isinstance(u.dtype, PtrDType)) or u.op is Ops.GEP
                code = (self.vector_matcher if vector else self.matcher).rewrite(u, ctx=names)
                if code is None: raise NotImplementedError(f"C renderer: cannot render {u.op.name} ({u.dtype})")
                if u.op in _INLINE:
                    names[u] = code
                else:
                    if u.dtype.scalar is dtypes.bfloat16 and u.op is not Ops.LOAD: code = f"bf16_round({code})"
                    names[u] = fresh("val" if u.op is Ops.LOAD else "t")  # a loaded value, a temporary
                    ctype = mask_type(u) if u.dtype.is_bool and u.dtype.count > 1 else c_type(u.dtype)
                    body.append(f"{pad}const {ctype} {names[u]} = {unwrap(code)};")
        signature = f"{self.linkage}{self.kernel_attribute}void {name}({', '.join(p for _, p in sorted(params))})"
        return signature + " {\n" + "\n".join(body) + "\n}\n"
