"""PTX: NVIDIA's virtual ISA, printed straight from the linearized UOps (no C compiler between), for the CUDA device.

One virtual register per value (PTX has as many as it asks for; ptxas allocates the real ones); a loop is a label
and a branch back; a gated load is a move of 0 and a predicated load. The results are the CUDA C renderer's
(renderer/cuda.py), so the two check each other on a GPU: floats are added and multiplied with `.rn`, which ptxas
never contracts into an fma (CUDA C's --fmad=false); division and square root are IEEE (`div.rn`, `sqrt.rn`); max
propagates NaN as numpy does; integer division by 0 and shifts past the width give numpy's and torch's answers;
float-to-int conversion follows dtype.float_to_int. Half and bfloat16 are stored as 16 bits and computed in float,
rounded back after every op, as on CUDA C. 8-bit integers live in 16-bit registers (PTX computes on no narrower
ones), wrapped after each op that can carry past 8 bits.

PTX has no math library: a libm op (exp, sin, erf, pow, ...) is a call of `ember_<name>[f]`, a function of a
module that CUDA C's libm builds (runtime/ops_cuda.py: math_module, compiled by NVRTC once per set of functions)
and nvJitLink links with the kernel, so its values are CUDA C's bit for bit. Tensor cores are mma.sync, the
fragments packed as renderer/cuda.py packs them.
"""

from __future__ import annotations

import struct

from ember.dtype import AddrSpace, DType, dtypes, float_to_int_via
from ember.renderer import Renderer
from ember.renderer.cstyle import LIBM
from ember.renderer.cuda import CUDARenderer
from ember.renderer.tensorcore import TensorCore
from ember.uop.ops import TANGENT, Ops, UOp
from ember.uop.upat import PatternMatcher, UPat

# the type a value computes in: 8-bit integers in 16-bit registers, half and bfloat16 in float ones
COMPUTE = {dtypes.bool: "pred", dtypes.int8: "s16", dtypes.uint8: "u16", dtypes.int16: "s16", dtypes.uint16: "u16",
           dtypes.int32: "s32", dtypes.uint32: "u32", dtypes.int64: "s64", dtypes.uint64: "u64",
           dtypes.float16: "f32", dtypes.bfloat16: "f32", dtypes.float32: "f32", dtypes.float64: "f64"}
# the type it has in memory (ld/st): bool as a byte, the 16-bit floats as their bits
MEMORY = COMPUTE | {dtypes.bool: "u8", dtypes.int8: "s8", dtypes.uint8: "u8", dtypes.float16: "b16",
                    dtypes.bfloat16: "b16"}
# register declarations, by the type a register holds
REGISTERS = {"pred": ("pred", "%p"), "s16": ("b16", "%rs"), "u16": ("b16", "%rs"), "b16": ("b16", "%rs"),
             "s32": ("b32", "%r"), "u32": ("b32", "%r"), "b32": ("b32", "%r"), "s64": ("b64", "%rd"),
             "u64": ("b64", "%rd"), "b64": ("b64", "%rd"), "f32": ("f32", "%f"), "f64": ("f64", "%fd")}
NARROW = (dtypes.int8, dtypes.uint8)  # wrapped to 8 bits after arithmetic (wrap)


def compute(dtype: DType) -> str: return COMPUTE[dtype.scalar]


def bits(t: str) -> int: return 1 if t == "pred" else int(t[1:])


def untyped(t: str) -> str: return t if t == "pred" else f"b{bits(t)}"


def immediate(value: float | int | bool, dtype: DType) -> str:
    """A PTX literal of `value` in the register type of `dtype`: floats by their bits (0f3F800000, 0d...)."""
    t = compute(dtype)
    if t == "pred": return "1" if value else "0"
    if t == "f32": return f"0f{struct.unpack('<I', struct.pack('<f', float(value)))[0]:08X}"
    if t == "f64": return f"0d{struct.unpack('<Q', struct.pack('<d', float(value)))[0]:016X}"
    return str(int(value))


class PTXContext:
    """The registers of a kernel being printed: one per value (several for a vector), declared at the end."""

    def __init__(self, renderer: PTXRenderer) -> None:
        self.lang = renderer
        self.counts: dict[str, int] = {}
        self.values: dict[UOp, list[str]] = {}
        self.labels = 0
        self.functions: dict[str, str] = {}  # the libm functions called: name -> declaration

    def new(self, t: str) -> str:
        decl, prefix = REGISTERS[t]
        self.counts[decl] = self.counts.get(decl, 0) + 1
        return f"{prefix}{self.counts[decl] - 1}" if prefix != "%rs" else f"%rs{self.counts[decl] - 1}"

    def __getitem__(self, u: UOp) -> str: return self.values[u][0]

    def lanes(self, u: UOp) -> list[str]: return self.values[u]

    def define(self, u: UOp, t: str | None = None) -> str:
        """A new register for value `u` (of its compute type unless `t`)."""
        reg = self.new(t or compute(u.dtype))
        self.values[u] = [reg]
        return reg

    def declarations(self) -> list[str]:
        prefixes = {decl: prefix for decl, prefix in REGISTERS.values()}
        return [f".reg .{decl} {prefixes[decl]}<{n}>;" for decl, n in sorted(self.counts.items())]


# ---- arithmetic ----------------------------------------------------------------------------------------------------

def wrap(x: UOp, reg: str) -> list[str]:
    """An 8-bit integer's 16-bit register brought back to its 8 bits (sign- or zero-extended)."""
    if x.dtype.scalar not in NARROW: return []
    return [f"cvt.{'s16.s8' if x.dtype.scalar is dtypes.int8 else 'u16.u8'} {reg}, {reg};"]


def round_narrow(ctx: PTXContext, x: UOp, reg: str) -> list[str]:
    """A half or bfloat16 result computed in float, rounded to its type (as CUDA C's half_round/bf16_round)."""
    if x.dtype.scalar is dtypes.float16:  # (through half_bits: a NaN keeps its payload, as CUDA C's half_round)
        h = ctx.new("b16")
        return [*half_bits(ctx, reg, h), f"cvt.f32.f16 {reg}, {h};"]
    if x.dtype.scalar is dtypes.bfloat16:
        h, r = ctx.new("b16"), ctx.new("b32")
        return [*bf16_bits(ctx, reg, h), f"cvt.u32.u16 {r}, {h};", f"shl.b32 {r}, {r}, 16;", f"mov.b32 {reg}, {r};"]
    return []


def bf16_bits(ctx: PTXContext, f: str, h: str) -> list[str]:
    """h = the bfloat16 bits of float f: rounded to nearest even, a NaN kept a NaN (CUDA C's bf16_bits)."""
    u, t, r, p = ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new("pred")
    return [f"mov.b32 {u}, {f};", f"shr.u32 {t}, {u}, 16;", f"and.b32 {r}, {t}, 1;", f"add.u32 {r}, {r}, {u};",
            f"add.u32 {r}, {r}, 32767;", f"shr.u32 {r}, {r}, 16;", f"or.b32 {t}, {t}, 64;",
            f"setp.nan.f32 {p}, {f}, {f};", f"selp.b32 {r}, {t}, {r}, {p};", f"cvt.u16.u32 {h}, {r};"]


def half_bits(ctx: PTXContext, f: str, h: str) -> list[str]:
    """h = the half bits of float f; a NaN keeps its sign and top payload bits, quiet (CUDA C's half_bits)."""
    u, t, n, p, q = ctx.new("b32"), ctx.new("b32"), ctx.new("b32"), ctx.new("pred"), ctx.new("b16")
    return [f"cvt.rn.f16.f32 {h}, {f};", f"mov.b32 {u}, {f};", f"shr.u32 {t}, {u}, 16;", f"and.b32 {t}, {t}, 32768;",
            f"shr.u32 {n}, {u}, 13;", f"and.b32 {n}, {n}, 1023;", f"or.b32 {t}, {t}, {n};",
            f"or.b32 {t}, {t}, 32256;", f"cvt.u16.u32 {q}, {t};", f"setp.nan.f32 {p}, {f}, {f};",
            f"selp.b16 {h}, {q}, {h}, {p};"]


ARITH = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.FDIV: "div", Ops.AND: "and", Ops.OR: "or",
         Ops.XOR: "xor"}
COMPARE = {Ops.CMPLT: "lt", Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}


def render_arith(ctx: PTXContext, x: UOp) -> list[str]:
    d, (a, b), t = ctx.define(x), (ctx[s] for s in x.src), compute(x.dtype)
    op = ARITH[x.op]
    if x.op in (Ops.AND, Ops.OR, Ops.XOR): return [f"{op}.{untyped(t)} {d}, {a}, {b};"]
    if t == "pred":  # bool + and * are | and &
        return [f"{'or' if x.op is Ops.ADD else 'and'}.pred {d}, {a}, {b};"]
    if t[0] == "f": return [f"{op}.rn.{t} {d}, {a}, {b};", *round_narrow(ctx, x, d)]
    return [f"{op}{'.lo' if x.op is Ops.MUL else ''}.{t} {d}, {a}, {b};", *wrap(x, d)]


def render_tangent_product(ctx: PTXContext, x: UOp) -> list[str]:
    """a * b with a zero factor a structural zero (renderer/cstyle.render_tangent_product): 0, not NaN, for 0 * inf."""
    d, (a, b), t = ctx.define(x), (ctx[s] for s in x.src), compute(x.dtype)
    p, q, zero = ctx.new("pred"), ctx.new("pred"), immediate(0, x.dtype)
    return [f"mul.rn.{t} {d}, {a}, {b};", f"setp.eq.{t} {p}, {a}, {zero};", f"setp.eq.or.{t} {p}, {b}, {zero}, {p};",
            f"setp.nan.and.{t} {q}, {d}, {d}, {p};", f"selp.{t} {d}, {zero}, {d}, {q};", *round_narrow(ctx, x, d)]


def render_compare(ctx: PTXContext, x: UOp) -> list[str]:
    d, (a, b), t = ctx.define(x), (ctx[s] for s in x.src), compute(x.src[0].dtype)
    if t == "pred":
        if x.op is Ops.CMPLT: return [f"not.pred {d}, {a};", f"and.pred {d}, {d}, {b};"]
        return [f"xor.pred {d}, {a}, {b};"] + ([f"not.pred {d}, {d};"] if x.op is Ops.CMPEQ else [])
    # != is unordered (NaN != x holds), < and == ordered, as in C
    cmp = "neu" if x.op is Ops.CMPNE and t[0] == "f" else COMPARE[x.op]
    return [f"setp.{cmp}.{t} {d}, {a}, {b};"]


def render_max(ctx: PTXContext, x: UOp) -> list[str]:
    d, (a, b), t = ctx.define(x), (ctx[s] for s in x.src), compute(x.dtype)
    if t == "pred": return [f"or.pred {d}, {a}, {b};"]
    if t[0] != "f": return [f"max.{t} {d}, {a}, {b};"]
    p = ctx.new("pred")  # (a > b || a != a) ? a : b, as the C renderers: NaN from either side
    return [f"setp.gt.{t} {p}, {a}, {b};", f"setp.nan.or.{t} {p}, {a}, {a}, {p};", f"selp.{t} {d}, {a}, {b}, {p};"]


def render_where(ctx: PTXContext, x: UOp) -> list[str]:
    d, (c, a, b), t = ctx.define(x), (ctx[s] for s in x.src), compute(x.dtype)
    if t != "pred": return [f"selp.{t} {d}, {a}, {b}, {c};"]
    n = ctx.new("pred")
    return [f"and.pred {d}, {c}, {a};", f"not.pred {n}, {c};", f"and.pred {n}, {n}, {b};", f"or.pred {d}, {d}, {n};"]


def render_unary(ctx: PTXContext, x: UOp) -> list[str]:
    d, a, t = ctx.define(x), ctx[x.src[0]], compute(x.dtype)
    if x.op is Ops.NEG:
        if t == "pred": return [f"mov.pred {d}, {a};"]  # (-b of a bool is b: nonzero stays nonzero)
        return [f"neg.{t if t[0] != 'u' else 's' + t[1:]} {d}, {a};", *wrap(x, d), *round_narrow(ctx, x, d)]
    form = {Ops.RECIPROCAL: "rcp.rn", Ops.SQRT: "sqrt.rn", Ops.TRUNC: "cvt.rzi"}[x.op]
    return [f"{form}.{t}{'.' + t if x.op is Ops.TRUNC else ''} {d}, {a};", *round_narrow(ctx, x, d)]


def render_mulacc(ctx: PTXContext, x: UOp) -> list[str]:
    d, (a, b, c), t = ctx.define(x), (ctx[s] for s in x.src), compute(x.dtype)
    if t[0] == "f": return [f"fma.rn.{t} {d}, {a}, {b}, {c};", *round_narrow(ctx, x, d)]
    return [f"mad.lo.{t} {d}, {a}, {b}, {c};", *wrap(x, d)]


def render_int_division(ctx: PTXContext, x: UOp) -> list[str]:
    """Integer / and % that never trap and give numpy's answers: x / 0 = 0, x / -1 the wrapped negation, (x % -1 = 0);
    division by any other constant needs no guard."""
    d, (a, b), t = ctx.define(x), (ctx[s] for s in x.src), compute(x.dtype)
    op = "div" if x.op is Ops.IDIV else "rem"
    divisor = x.src[1]
    signed = t[0] == "s"
    if divisor.op is Ops.CONST and divisor.arg != 0 and (divisor.arg != -1 or not signed):
        return [f"{op}.{t} {d}, {a}, {b};", *wrap(x, d)]
    zero, minus, safe = ctx.new("pred"), ctx.new("pred"), ctx.new(t)
    lines = [f"setp.eq.{t} {zero}, {b}, 0;", f"setp.eq.{t} {minus}, {b}, {-1 if signed else 0};",
             f"or.pred {minus}, {minus}, {zero};", f"selp.{t} {safe}, 1, {b}, {minus};", f"{op}.{t} {d}, {a}, {safe};"]
    if signed:
        special = ctx.new(t)
        lines += [f"neg.{t} {special}, {a};"] if x.op is Ops.IDIV else [f"mov.{untyped(t)} {special}, 0;"]
        lines += [f"selp.{t} {d}, {special}, {d}, {minus};"]
    return [*lines, f"selp.{t} {d}, 0, {d}, {zero};", *wrap(x, d)]


def render_shift(ctx: PTXContext, x: UOp) -> list[str]:
    """<< and >> by any amount: PTX clamps an amount past the width, which shifts every bit out (0, or the sign for
    >> of a negative), torch's answer; a negative amount is a large unsigned one. The amount is a u32 register."""
    d, (a, b), t = ctx.define(x), (ctx[s] for s in x.src), compute(x.dtype)
    at = compute(x.src[1].dtype)
    amount = b
    if at in ("s64", "u64"):
        wide, amount = ctx.new("u64"), ctx.new("u32")
        lines = [f"min.u64 {wide}, {b}, 64;", f"cvt.u32.u64 {amount}, {wide};"]
    elif at in ("s16", "u16"):
        amount = ctx.new("u32")
        lines = [f"cvt.u32.{'u16' if at == 'u16' or x.src[1].dtype.scalar is dtypes.uint8 else 's16'} {amount}, {b};"]
    else:
        lines = []
    if x.op is Ops.SHL: return [*lines, f"shl.{untyped(t)} {d}, {a}, {amount};", *wrap(x, d)]
    return [*lines, f"shr.{t} {d}, {a}, {amount};"]


def render_libm(ctx: PTXContext, x: UOp) -> list[str]:
    """A call of the libm module's `ember_<name>[f]` (float for float, half and bfloat16; double for double)."""
    t = "f64" if x.dtype.scalar is dtypes.float64 else "f32"
    name = f"ember_{'fmod' if x.op is Ops.MOD else LIBM[x.op]}{'' if t == 'f64' else 'f'}"
    params = ", ".join(f".param .b{bits(t)} x{i}" for i in range(len(x.src)))
    ctx.functions[name] = f".extern .func (.param .b{bits(t)} ret) {name} ({params});"
    d = ctx.define(x)
    stores = " ".join(f"st.param.{t} [x{i}], {ctx[s]};" for i, s in enumerate(x.src))
    args = ", ".join(f"x{i}" for i in range(len(x.src)))
    declared = " ".join(f".param .b{bits(t)} x{i};" for i in range(len(x.src)))
    return [f"{{ {declared} .param .b{bits(t)} ret; {stores} call.uni (ret), {name}, ({args}); "
            f"ld.param.{t} {d}, [ret]; }}", *round_narrow(ctx, x, d)]


# ---- conversions ---------------------------------------------------------------------------------------------------

def render_cast(ctx: PTXContext, x: UOp) -> list[str]:
    src, dst = x.src[0].dtype.scalar, x.dtype.scalar
    a, d, st, dt = ctx[x.src[0]], ctx.define(x), compute(src), compute(dst)
    if dt == "pred":  # nonzero (NaN too) is true
        return [f"setp.{'neu' if st[0] == 'f' else 'ne'}.{st} {d}, {a}, {immediate(0, src)};"] if st != "pred" else \
            [f"mov.pred {d}, {a};"]
    if st == "pred": return [f"selp.{dt} {d}, {immediate(1, dst)}, {immediate(0, dst)}, {a};"]
    if dt[0] == "f":
        if st[0] != "f": return [f"cvt.rn.{dt}.{MEMORY[src] if src in NARROW else st} {d}, {a};",
                                 *round_narrow(ctx, x, d)]
        move = f"mov.{dt} {d}, {a};" if st == dt else f"cvt{'.rn' if bits(dt) < bits(st) else ''}.{dt}.{st} {d}, {a};"
        return [move, *round_narrow(ctx, x, d)]
    if st[0] == "f": return float_to_int(ctx, x, a, d)
    return [int_to_int(src, dst, a, d)]


def int_to_int(src: DType, dst: DType, a: str, d: str) -> str:
    """Sign- or zero-extended by the source's type, or cut to the destination's bits (a 16-bit register of an 8-bit
    integer holds it extended from its 8 bits)."""
    st, dt = MEMORY[src] if src in NARROW else compute(src), MEMORY[dst] if dst in NARROW else compute(dst)
    if src in NARROW and dst in NARROW and src is not dst: return f"cvt.{compute(dst)}.{dt} {d}, {a};"  # re-extend
    if bits(st) == bits(dt) and src.itemsize == dst.itemsize: return f"mov.{untyped(compute(dst))} {d}, {a};"
    return f"cvt.{dt}.{st} {d}, {a};"


def float_to_int(ctx: PTXContext, x: UOp, a: str, d: str) -> list[str]:
    """A float to an integer with dtype.float_to_int's answers: through a signed integer of 32 or 64 bits, NaN and
    values outside it giving its minimum (cvt.rzi inside), a uint64 at or above 2**63 converted as unsigned."""
    ft, via = compute(x.src[0].dtype), float_to_int_via(x.dtype)
    wt = f"s{via}"
    wide, inside = ctx.new(wt), ctx.new("pred")
    low, high = (immediate(bound, x.src[0].dtype.scalar) for bound in (-2.0**(via - 1), 2.0**(via - 1)))
    lines = [f"cvt.rzi.{wt}.{ft} {wide}, {a};", f"setp.ge.{ft} {inside}, {a}, {low};",
             f"setp.lt.and.{ft} {inside}, {a}, {high}, {inside};",
             f"selp.{wt} {wide}, {wide}, {-2**(via - 1)}, {inside};"]
    if x.dtype.scalar is dtypes.uint64:
        big, unsigned = ctx.new("pred"), ctx.new("u64")
        top = immediate(2.0**64, x.src[0].dtype.scalar)  # (cvt clamps: 2**64 and above give via's minimum)
        lines += [f"cvt.rzi.u64.{ft} {unsigned}, {a};", f"setp.ge.{ft} {big}, {a}, {high};",
                  f"setp.lt.and.{ft} {big}, {a}, {top}, {big};", f"selp.b64 {wide}, {unsigned}, {wide}, {big};"]
    return [*lines, int_to_int(dtypes.int64 if via == 64 else dtypes.int32, x.dtype.scalar, wide, d)]


def render_bitcast(ctx: PTXContext, x: UOp) -> list[str]:
    """The bits reinterpreted; a half or bfloat16 value lives in a float register as its value, so its bits go
    through half_bits/bf16_bits, and 16 bits become one through cvt or a shift."""
    src, dst = x.src[0].dtype.scalar, x.dtype.scalar
    a, d = ctx[x.src[0]], ctx.define(x)
    if src in (dtypes.float16, dtypes.bfloat16):
        h = ctx.new("b16")
        return [*(half_bits if src is dtypes.float16 else bf16_bits)(ctx, a, h), f"mov.b16 {d}, {h};"]
    if dst is dtypes.float16: return [f"cvt.f32.f16 {d}, {a};"]
    if dst is dtypes.bfloat16:
        r = ctx.new("b32")
        return [f"cvt.u32.u16 {r}, {a};", f"shl.b32 {r}, {r}, 16;", f"mov.b32 {d}, {r};"]
    if src in NARROW and dst in NARROW: return [int_to_int(src, dst, a, d)]  # (int8 <-> uint8: re-extended)
    return [f"mov.b{bits(compute(dst))} {d}, {a};"]


# ---- memory --------------------------------------------------------------------------------------------------------

def space(idx: UOp) -> str:
    return {AddrSpace.GLOBAL: "global", AddrSpace.LOCAL: "shared"}[idx.dtype.addrspace]  # type: ignore[attr-defined]


def slot_bytes(dtype: DType, addrspace: AddrSpace) -> int:
    """The bytes an element takes: its size, but a float's in shared memory for half and bfloat16 (workgroup memory
    holds the values they are computed as, CUDA C's `__shared__ float`)."""
    if addrspace is AddrSpace.LOCAL and dtype.scalar in (dtypes.float16, dtypes.bfloat16): return 4
    return dtype.itemsize


def access_type(dtype: DType, addrspace: AddrSpace) -> str:
    """The type of an ld/st of `dtype` (not bool, nor half or bfloat16 in global memory: their own paths)."""
    if addrspace is AddrSpace.LOCAL and dtype.scalar in (dtypes.float16, dtypes.bfloat16): return "f32"
    return MEMORY[dtype.scalar]


def render_index(ctx: PTXContext, x: UOp) -> list[str]:
    """The address of element `offset` of a buffer (64 bits); a register array's element is its register."""
    buf, offset = x.src[0], x.src[1]
    if x.dtype.addrspace is AddrSpace.REG:  # type: ignore[attr-defined]
        ctx.values[x] = [ctx.lanes(buf)[offset.arg * x.dtype.base.count + i] for i in range(x.dtype.base.count)]
        return []
    size = slot_bytes(x.dtype.base, x.dtype.addrspace)  # type: ignore[attr-defined]
    d = ctx.define(x, "u64")
    if compute(offset.dtype) in ("s64", "u64"):
        return [f"mul.lo.s64 {d}, {ctx[offset]}, {size};", f"add.s64 {d}, {d}, {ctx[buf]};"]
    return [f"mad.wide.{compute(offset.dtype)} {d}, {ctx[offset]}, {size}, {ctx[buf]};"]


def render_load(ctx: PTXContext, x: UOp) -> list[str]:
    idx = x.src[0]
    if idx.dtype.addrspace is AddrSpace.REG:
        regs = [ctx.new(compute(x.dtype)) for _ in range(x.dtype.count)]
        ctx.values[x] = regs
        return [f"mov.{untyped(compute(x.dtype))} {r}, {s};" for r, s in zip(regs, ctx.lanes(idx), strict=True)]
    scalar = x.dtype.scalar
    d = ctx.define(x)
    gate = f"@{ctx[idx.src[2]]} " if len(idx.src) > 2 else ""
    zero = [f"mov.{untyped(compute(x.dtype))} {d}, {immediate(0, x.dtype)};"] if gate else []
    mt = access_type(x.dtype, idx.dtype.addrspace)  # type: ignore[attr-defined]
    where = f"[{ctx[idx]}]"
    if scalar is dtypes.bool:
        r = ctx.new("u16")
        return [f"mov.b16 {r}, 0;"] * bool(gate) + [f"{gate}ld.{space(idx)}.u8 {r}, {where};",
                                                    f"setp.ne.u16 {d}, {r}, 0;"]
    if scalar in (dtypes.float16, dtypes.bfloat16) and idx.dtype.addrspace is AddrSpace.GLOBAL:
        h = ctx.new("b16")
        lines = [f"mov.b16 {h}, 0;"] * bool(gate) + [f"{gate}ld.{space(idx)}.b16 {h}, {where};"]
        if scalar is dtypes.float16: return [*lines, f"cvt.f32.f16 {d}, {h};"]
        r = ctx.new("b32")
        return [*lines, f"cvt.u32.u16 {r}, {h};", f"shl.b32 {r}, {r}, 16;", f"mov.b32 {d}, {r};"]
    return [*zero, f"{gate}ld.{space(idx)}.{mt} {d}, {where};"]


def render_store(ctx: PTXContext, x: UOp) -> list[str]:
    idx, value = x.src[0], x.src[1]
    if idx.dtype.addrspace is AddrSpace.REG:
        t = untyped(compute(value.dtype))
        return [f"mov.{t} {r}, {s};" for r, s in zip(ctx.lanes(idx), ctx.lanes(value), strict=True)]
    gate = f"@{ctx[idx.src[2]]} " if len(idx.src) > 2 else ""
    scalar, v, where = value.dtype.scalar, ctx[value], f"[{ctx[idx]}]"
    if scalar is dtypes.bool:
        r = ctx.new("u16")
        return [f"selp.u16 {r}, 1, 0, {v};", f"{gate}st.{space(idx)}.u8 {where}, {r};"]
    if scalar in (dtypes.float16, dtypes.bfloat16) and idx.dtype.addrspace is AddrSpace.GLOBAL:
        h = ctx.new("b16")
        return [*(half_bits if scalar is dtypes.float16 else bf16_bits)(ctx, v, h),
                f"{gate}st.{space(idx)}.b16 {where}, {h};"]
    mt = access_type(value.dtype, idx.dtype.addrspace)  # type: ignore[attr-defined]
    return [f"{gate}st.{space(idx)}.{mt} {where}, {v};"]


# ---- tensor cores --------------------------------------------------------------------------------------------------

def render_wmma(ctx: PTXContext, x: UOp) -> list[str]:
    """mma.sync of the warp's fragments: each two elements of A and B (floats holding 16-bit values) packed into a
    32-bit register, the lower element in the low half (PTX's .f16x2), as renderer/cuda.py packs them."""
    tc: TensorCore = x.arg
    kind = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}[tc.dtype_in]
    lines: list[str] = []

    def packed(lanes: list[str]) -> list[str]:
        regs = []
        for lo, hi in zip(lanes[::2], lanes[1::2], strict=True):
            h0, h1, r = ctx.new("b16"), ctx.new("b16"), ctx.new("b32")
            lines.extend([f"cvt.rn.{kind}.f32 {h0}, {lo};", f"cvt.rn.{kind}.f32 {h1}, {hi};",
                          f"mov.b32 {r}, {{{h0}, {h1}}};"])
            regs.append(r)
        return regs
    a, b = packed(ctx.lanes(x.src[0])), packed(ctx.lanes(x.src[1]))
    d = [ctx.new("f32") for _ in range(x.dtype.count)]
    ctx.values[x] = d
    groups = ", ".join("{" + ", ".join(g) + "}" for g in (d, a, b, ctx.lanes(x.src[2])))
    return [*lines, f"mma.sync.aligned.{tc.name}.row.col.f32.{kind}.{kind}.f32 {groups};"]


def render_vectorize(ctx: PTXContext, x: UOp) -> list[str]:
    ctx.values[x] = [ctx[s] for s in x.src]
    return []


def render_gep(ctx: PTXContext, x: UOp) -> list[str]:
    ctx.values[x] = [ctx.lanes(x.src[0])[x.arg]]
    return []


pm_render_ptx = PatternMatcher([
    (UPat(Ops.MUL, arg=TANGENT, dtype=(dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64), name="x"),
     render_tangent_product),
    (UPat(Ops.MOD, dtype=(dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64), name="x"), render_libm),
    (UPat((Ops.IDIV, Ops.MOD), name="x"), render_int_division),
    (UPat(tuple(ARITH), name="x"), render_arith),
    (UPat(tuple(COMPARE), name="x"), render_compare),
    (UPat(Ops.MAX, name="x"), render_max),
    (UPat(Ops.WHERE, name="x"), render_where),
    (UPat(Ops.MULACC, name="x"), render_mulacc),
    (UPat((Ops.SHL, Ops.SHR), name="x"), render_shift),
    (UPat((Ops.NEG, Ops.RECIPROCAL, Ops.SQRT, Ops.TRUNC), name="x"), render_unary),
    (UPat(tuple(op for op in LIBM if op not in (Ops.SQRT, Ops.TRUNC)), name="x"), render_libm),
    (UPat(Ops.CAST, name="x"), render_cast),
    (UPat(Ops.BITCAST, name="x"), render_bitcast),
    (UPat(Ops.INDEX, name="x"), render_index),
    (UPat(Ops.LOAD, name="x"), render_load),
    (UPat(Ops.STORE, name="x"), render_store),
    (UPat(Ops.WMMA, name="x"), render_wmma),
    (UPat(Ops.VECTORIZE, name="x"), render_vectorize),
    (UPat(Ops.GEP, name="x"), render_gep),
])

SPECIAL = {"gidx": "%ctaid", "lidx": "%tid"}


class PTXRenderer(Renderer):
    """PTX for a CUDA device of compute capability `arch`, with the CUDA C renderer's launch limits and tensor
    cores (the two are alternatives for one device)."""

    device = "CUDA"
    has_local = has_shared = True
    global_max, local_max, local_threads = CUDARenderer.global_max, CUDARenderer.local_max, CUDARenderer.local_threads
    shared_max, tensor_cores = CUDARenderer.shared_max, CUDARenderer.tensor_cores
    storage_only = frozenset({dtypes.float16})

    def __init__(self, arch: str = "sm_90") -> None: self.arch = arch

    def render(self, name: str, uops: list[UOp]) -> str:
        ctx = PTXContext(self)
        params: list[tuple[int, str]] = []
        head: list[str] = []  # what runs first: parameters loaded, constants in registers
        body: list[str] = []
        loops: dict[UOp, int] = {}
        for u in uops:
            if u.op is Ops.DEFINE_GLOBAL:
                params.append((u.arg, f".param .u64 data{u.arg}"))
                reg = ctx.define(u, "u64")
                head += [f"ld.param.u64 {reg}, [data{u.arg}];", f"cvta.to.global.u64 {reg}, {reg};"]
            elif u.op is Ops.DEFINE_VAR:
                params.append((1 << 30, f".param .{compute(u.dtype)} {u.arg.name}"))
                head.append(f"ld.param.{compute(u.dtype)} {ctx.define(u)}, [{u.arg.name}];")
            elif u.op is Ops.CONST:
                reg = ctx.define(u)
                head.append(f"mov.{untyped(compute(u.dtype))} {reg}, {immediate(u.arg, u.dtype)};" if
                            compute(u.dtype) != "pred" else f"setp.ne.u32 {reg}, {int(bool(u.arg))}, 0;")
            elif u.op is Ops.SPECIAL:
                reg = ctx.define(u, "u32")
                body.append(f"mov.u32 {reg}, {SPECIAL[u.arg[:4]]}.{'xyz'[int(u.arg[4:])]};")
            elif u.op is Ops.DEFINE_REG:
                base = u.dtype.base
                ctx.values[u] = [ctx.new(compute(base)) for _ in range(u.dtype.size * base.count)]
            elif u.op is Ops.DEFINE_LOCAL:
                slot = slot_bytes(u.dtype.base, AddrSpace.LOCAL)
                head.insert(0, f".shared .align 16 .b8 temp{u.arg}[{u.dtype.size * slot}];")
                head.append(f"mov.u64 {ctx.define(u, 'u64')}, temp{u.arg};")
            elif u.op is Ops.BARRIER:
                body.append("bar.sync 0;")
            elif u.op is Ops.RANGE:
                loops[u] = ctx.labels = ctx.labels + 1
                t, reg, p = compute(u.dtype), ctx.define(u), ctx.new("pred")
                body += [f"mov.{untyped(t)} {reg}, 0;", f"setp.ge.{t} {p}, {reg}, {ctx[u.src[0]]};",
                         f"@{p} bra END_{loops[u]};", f"LOOP_{loops[u]}:"]
            elif u.op is Ops.END:
                rng = u.src[1]
                t, p = compute(rng.dtype), ctx.new("pred")
                body += [f"add.{t} {ctx[rng]}, {ctx[rng]}, 1;", f"setp.lt.{t} {p}, {ctx[rng]}, {ctx[rng.src[0]]};",
                         f"@{p} bra LOOP_{loops[rng]};", f"END_{loops[rng]}:"]
            elif u.op is Ops.AFTER:
                ctx.values[u] = ctx.values[u.src[0]]
            elif u.op in (Ops.SINK, Ops.NOOP):
                continue
            else:
                lines = pm_render_ptx.rewrite(u, ctx=ctx)
                if lines is None: raise NotImplementedError(f"PTXRenderer: cannot render {u.op.name} ({u.dtype})")
                body += lines
        signature = f".visible .entry {name}(\n  " + ",\n  ".join(p for _, p in sorted(params)) + "\n)"
        lines = ["  " + line for line in [*ctx.declarations(), *head, *body, "ret;"]]
        return "\n".join([f".version 8.3\n.target {self.arch}\n.address_size 64", *ctx.functions.values(),
                          signature, "{", *lines, "}", ""])

