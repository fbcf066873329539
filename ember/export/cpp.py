"""generate_module: NumericalFunctions as a dependency-free C++17 header and source, from Jinja2 templates.

Each function's plan (see function.py) becomes: typed `Buffer<T, N...>` aliases for its inputs and outputs, a
Workspace holding its constants and intermediates (each at a 16-byte aligned offset), `init_ws` copying the
constants in from `static constexpr` arrays, and `call` running the kernels in order. Kernels are ember's C
kernels rendered as C++ (memcpy bit casts, `__restrict`), private to the translation unit. The output depends only
on the functions, so generating twice gives byte-identical files.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jinja2
import numpy as np

from ember.codegen import get_program, kernel_name
from ember.device import Buffer
from ember.dtype import DType, dtypes
from ember.export.cpp_names import check_cpp_name, cpp_arg_names
from ember.export.function import NumericalFunction
from ember.export.optimistic import kernel_reaches, reached_outputs
from ember.export.pieces import cut_into_pieces
from ember.renderer import cvector
from ember.renderer.cstyle import (
    CRenderer,
    RenderContext,
    c_type,
    render_tangent_product,
    tangent_product_functions,
)
from ember.renderer.sincos import c_helpers
from ember.schedule.kernelize import ExecItem, LoopItem
from ember.uop.ops import TANGENT, Ops, UOp
from ember.uop.upat import PatternMatcher, UPat

# The helpers kernels may call, each with the helpers it calls; a module holds only those its kernels use (an
# unused function in an anonymous namespace is a warning, an error under -Werror).
CPP_HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bf16_load": ("""inline float bf16_load(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}""", ()),
    "bf16_bits": ("""inline std::uint16_t bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest, ties to even
}""", ()),
    "bf16_round": ("inline float bf16_round(float f) { return bf16_load(bf16_bits(f)); }", ("bf16_load", "bf16_bits")),
    "bit_cast": ("""template <typename To, typename From>
inline To bit_cast(From from) {
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}""", ()),
    **{name: (code, ()) for name, code in tangent_product_functions("inline").items()},
    "any_nan": ("""template <typename T>
EMBER_KERNEL bool any_nan(const T* x, long n) {  // (an int accumulator: the loop vectorizes)
  int nan = 0;
  for (long i = 0; i < n; i++) nan |= x[i] != x[i];
  return nan != 0;
}""", ()),
}
CHECKED = "checked_products"  # the template parameter of a kernel with tangent products (see optimistic.py)
NAN_FLAG = "ember_nan"  # set by a plain instance that stored a NaN (flag_stored_nans)
STORED = re.compile(r"^(?P<pad> +)(?P<gate>if \(.*\) )?\*\(?data(?P<buffer>\d+)\b.* = (?P<value>[^;]+);$")
DECLARED = re.compile(r"^  +const (?P<type>\w+) (?P<name>\w+) = ")
ACCUMULATOR = re.compile(r"^ +\*\(?acc\d+")  # a register's store, not memory's
LITERAL = re.compile(r"^\(?-?[\d.]+(?:e[-+]?\d+)?f?\)?$")
SINCOS_CALL = re.compile(r"\bember_(sin|cos)_f64(?:x(\d+))?\(")
SINCOS_OPS = {"sin": Ops.SIN, "cos": Ops.COS}


FLAG_LIMIT = 4096  # elements a kernel stores its products' values into, up to which it flags a NaN as it stores
# them: a 100-variable Rosenbrock hessian's 298 entries 0.63-0.99x the time of a scan after it (4 rounds); the 192,000
# of a vmapped step jacobian 1.06-1.14x (a compare per scalar store, where the scan reads vectors)


def stored_products(item: ExecItem) -> set[int] | None:
    """The buffers (by argument number) a kernel stores its own tangent products' values into, if they hold at most
    FLAG_LIMIT elements; else None (also where such a value meets a consumer that may not pass a NaN on: then the
    function runs its checked products only)."""
    written = kernel_reaches(item, set(), {item.ast})
    if written is None or sum(b.size for b in item.bufs if id(b) in written) > FLAG_LIMIT: return None
    return {i for i, b in enumerate(item.bufs) if id(b) in written}


def flag_stored_nans(source: str, name: str, reached: set[int]) -> str | None:
    """The kernel with a flag it sets where its plain instance stores a NaN (`int& ember_nan`, its last parameter):
    beside each store of a float value into a buffer its tangent products reach (`data<i>` for i in `reached`),
    `ember_nan |= !checked_products && v != v`, under the store's gate. What the kernel stores it has in a register:
    a compare, where a scan of its outputs read them all again (a third of a 100-variable Rosenbrock hessian's
    time). None where a store is not a scalar's (a vector's lanes) or its value's type is unknown."""
    types = {m["name"]: m["type"] for line in source.split("\n") if (m := DECLARED.match(line))}
    head = f" {name}("
    out: list[str] = []
    for line in source.split("\n"):
        out.append(line)
        if head in line and line.endswith(") {"):
            out[-1] = f"{line[:-len(') {')]}, int& {NAN_FLAG}) {{"
            continue
        if DECLARED.match(line) or not line.lstrip().startswith(("*", "if (", "store_")) or ACCUMULATOR.match(line):
            continue
        if (m := STORED.match(line)) is None: return None  # a store this does not read (a vector's)
        value = m["value"]
        if int(m["buffer"]) not in reached or (value in types and types[value] not in ("double", "float")): continue
        if value not in types:
            if LITERAL.match(value): continue
            return None  # (a half's bits: not flagged)
        out.append(f"{m['pad']}{m['gate'] or ''}{NAN_FLAG} |= !{CHECKED} && {value} != {value};")
    return "\n".join(out)


def prelude_for(kernels: str) -> str:
    """The helpers that the kernels' source calls, with the helpers those call, in CPP_HELPERS order; then ember's
    float64 sin and cos on the lane counts the kernels call them on (renderer/sincos.py)."""
    used = {name for name in CPP_HELPERS if re.search(rf"\b{name}\b", kernels)}
    sincos: dict[int, set[Ops]] = {}
    for m in SINCOS_CALL.finditer(kernels): sincos.setdefault(int(m[2] or 1), set()).add(SINCOS_OPS[m[1]])
    if 1 in sincos: used.add("bit_cast")
    for name in reversed(CPP_HELPERS):
        if name in used: used.update(CPP_HELPERS[name][1])
    return "\n".join([*(code for name, (code, _) in CPP_HELPERS.items() if name in used),
                      *(c_helpers(n, True, frozenset(ops)).rstrip() for n, ops in sorted(sincos.items()))])


def render_optimistic_vector_product(ctx: RenderContext, x: UOp) -> str | None:
    """A vector's tangent product tested for its NaN only in the kernel's checked instance (export/optimistic.py)."""
    if (tested := cvector.render_tangent_product(ctx, x)) is None: return None
    return f"({CHECKED}?{tested}:({ctx[x.src[0]]}*{ctx[x.src[1]]}))"


class CppRenderer(CRenderer):
    """ember's C kernels as C++17: the same code, with memcpy bit casts, libm calls qualified, no prelude, and
    tangent products tested only where the kernel's template parameter CHECKED says so. Its sums add in loop order
    and round each product (the interpreter's bits): vector lanes only ever hold separate outputs."""

    prelude = ""
    reassociates = False
    vectorizes_loops = True
    restrict = "__restrict"
    kernel_prefix = "EMBER_KERNEL "  # defined in module.cpp.j2
    vector_matcher = PatternMatcher([(UPat(Ops.MUL, arg=TANGENT, name="x"), render_optimistic_vector_product)]) + \
        CRenderer.vector_matcher

    def libm(self, name: str, dtype: DType, *args: str) -> str:
        """The global function (<math.h>): a function or module named `sin` is a C++ namespace, and inside it an
        unqualified sin(x) would find that namespace instead."""
        return super().libm(f"::{name}", dtype, *args)

    def reinterpret(self, src: DType, dst: DType, a: str) -> str:
        if src.is_int and dst.is_int: return f"static_cast<{c_type(dst)}>({a})"
        return f"bit_cast<{c_type(dst)}>({a})"

    def tangent_product(self, ctx: RenderContext, x: UOp) -> str:
        """Tested for its NaN only in the kernel's checked instance (export/optimistic.py)."""
        plain, tested = f"({ctx[x.src[0]]}*{ctx[x.src[1]]})", render_tangent_product(ctx, x)
        return plain if tested == plain else f"({CHECKED}?{tested}:{plain})"

    def render(self, name: str, uops: list[UOp]) -> str:
        return self.render_function(name, uops)  # (the vector types are declared once for the module)

    def render_task(self, name: str, uops: list[UOp]) -> str:
        return ""  # a threaded kernel's slices are called by ember_parallel (module.cpp.j2), not by a pool's entry


@dataclass
class _Buf:
    name: str
    type_name: str
    ctype: str
    dims: tuple[int, ...]
    npy: str  # numpy's type number, for the Python extension


NPY_TYPES = {dtypes.bool: "NPY_BOOL", dtypes.int8: "NPY_INT8", dtypes.int16: "NPY_INT16", dtypes.int32: "NPY_INT32",
             dtypes.int64: "NPY_INT64", dtypes.uint8: "NPY_UINT8", dtypes.uint16: "NPY_UINT16",
             dtypes.uint32: "NPY_UINT32", dtypes.uint64: "NPY_UINT64", dtypes.float16: "NPY_HALF",
             dtypes.float32: "NPY_FLOAT", dtypes.float64: "NPY_DOUBLE"}


def _literal(v: Any, dtype: DType) -> str:
    """An exact C++ literal of `dtype`."""
    if dtype is dtypes.bool: return "true" if v else "false"
    if dtype.is_float and dtype is not dtypes.bfloat16:
        ct = c_type(dtype)
        f = float(v)
        if math.isnan(f): return f"std::numeric_limits<{ct}>::quiet_NaN()"
        if math.isinf(f): return f"{'-' if f < 0 else ''}std::numeric_limits<{ct}>::infinity()"
        lit = f.hex()
        return lit + "f" if dtype is dtypes.float32 else (lit if dtype is dtypes.float64 else f"{ct}({lit})")
    i = int(v)
    if dtype is dtypes.int64 and i == -2**63: return "(-9223372036854775807LL - 1)"
    return f"{i}{'ULL' if dtype is dtypes.uint64 else ('LL' if dtype is dtypes.int64 else '')}"


def _constant_values(buf: Buffer) -> str:
    flat = buf.numpy()
    dtype = dtypes.uint16 if buf.dtype is dtypes.bfloat16 else buf.dtype  # bfloat16 memory is its 16 bits
    return ", ".join(_literal(v, dtype) for v in (flat.view(np.uint16) if buf.dtype is dtypes.bfloat16 else flat))


def _function_model(f: NumericalFunction, renderer: CppRenderer) -> dict[str, Any]:
    plan = f.plan
    names = cpp_arg_names(f.arg_names, f.name)
    inputs = [_Buf(n, f"{n}_t", c_type(a.dtype), a.shape, NPY_TYPES.get(a.dtype, ""))
              for n, a in zip(names, f.args, strict=True)]
    outputs = [_Buf(f"out{i}", f"out{i}_t", c_type(b.dtype), s, NPY_TYPES.get(b.dtype, ""))
               for i, (b, s) in enumerate(zip(plan.outputs, plan.output_shapes, strict=True))]
    ref: dict[int, str] = {}
    for b, m in zip(plan.inputs, inputs, strict=True): ref[id(b)] = m.name
    for b, m in zip(plan.outputs, outputs, strict=True): ref.setdefault(id(b), m.name)
    offset, constants = 0, []
    for i, b in enumerate(plan.constants):
        ct = c_type(b.dtype)
        constants.append({"name": f"{f.name}_const{i}", "ctype": ct, "count": max(b.size, 1), "offset": offset,
                          "init": _constant_values(b) if b.size else _literal(0, b.dtype)})
        ref[id(b)] = f"reinterpret_cast<{ct}*>(ws + {offset})"
        offset += -(-max(b.nbytes, 1) // 16) * 16
    for b in plan.intermediates:
        ref[id(b)] = f"reinterpret_cast<{c_type(b.dtype)}*>(ws + {offset})"
        offset += -(-max(b.nbytes, 1) // 16) * 16
    kernels: list[dict[str, str]] = []
    vector_uops: list[UOp] = []  # (what the module's vector types are read from)
    by_ast: dict[UOp, tuple[str, int, bool, bool]] = {}  # name, threads, templated, flags the NaNs it stores

    def emit(items: list[Any], depth: int, checked: bool) -> list[str]:
        """The statements running `items`; a loop's body indented in its `for`, x read in place from xs. A kernel
        with tangent products is a template: its `checked` instance tests them (see optimistic.py)."""
        lines: list[str] = []
        for item in items:
            if isinstance(item, LoopItem):
                lines += _loop_lines(item, depth, ref, lambda body, d: emit(body, d, checked))
                continue
            if item.ast not in by_ast:
                kname = f"{f.name}_k{len(by_ast)}_{kernel_name(item.ast)}"
                spec = get_program(item.ast, renderer, kname)
                vector_uops.extend(u for u in spec.uops or () if u.dtype.count > 1)
                source = spec.src.rstrip()
                templated = CHECKED in source
                # its plain instance notes a NaN it stores, where its slices are not threads sharing the flag
                reached = stored_products(item) if templated and spec.threads == 1 else None
                with_flag = flag_stored_nans(source, kname, reached) if reached is not None else None
                flagged, source = with_flag is not None, with_flag or source
                by_ast[item.ast] = (kname, spec.threads, templated, flagged)
                # a kernel with tangent products is a template; its checked instance is built apart (module.cpp.j2)
                params = source[source.index(f" {kname}(") + len(kname) + 2:source.index(") {")] if templated else ""
                source, pieces = cut_into_pieces(source, kname, CHECKED if templated else "")  # (g++'s time)
                kernels.extend({"name": p.name, "source": p.source, "checked": p.params if templated else ""}
                               for p in pieces)
                kernels.append({"name": kname, "source": f"template <bool {CHECKED}>\n{source}" if templated else
                                source, "checked": params})
            kname, threads, templated, flagged = by_ast[item.ast]
            call = f"{kname}<{str(checked).lower()}>" if templated else kname
            args = ", ".join([*(ref[id(b)] for b in item.bufs), *([NAN_FLAG] if flagged else [])])
            # a kernel the heuristic split across cores (renderer.cores > 1): its slices on threads of their own; the
            # slice is EMBER_KERNEL too, or g++ contracts the kernel inlined into it into FMAs (other last bits)
            lines.append(f"{call}({args});" if threads == 1 else
                         f"ember_parallel({threads}, [&](int32_t core) EMBER_KERNEL {{ {call}({args}, core); }});")
        return lines

    rerun = emit(plan.items, 0, checked=True)  # (renders every kernel: which test products is known after)
    checked = {ast for ast, (_, _, templated, _) in by_ast.items() if templated}
    tested = reached_outputs(plan, checked) if checked else []
    body = emit(plan.items, 0, checked=not tested)
    if any(flagged for *_, flagged in by_ast.values()):
        body, rerun = [f"int {NAN_FLAG} = 0;", *body], [f"int {NAN_FLAG} = 0;", *rerun, f"(void){NAN_FLAG};"]
    if tested:  # the plain products left a NaN where the checked ones may not: run those (a cold function)
        # a kernel that flags the NaNs it stores needs no scan of what it reaches: a NaN a plain product makes is
        # stored on its way to an output (every value on a tangent's path passes it on: optimistic.py)
        unflagged = {ast for ast in checked if not by_ast[ast][3]}
        scanned = (reached_outputs(plan, unflagged) or []) if unflagged else []
        nan = " || ".join([*(f"any_nan({ref[id(b)]}, {b.size})" for b in scanned),
                           *([NAN_FLAG] if len(unflagged) < len(checked) else [])])
        body.append(f"if ({nan}) call_checked({', '.join(m.name for m in inputs + outputs)}, ws);")
    elif any(flagged for *_, flagged in by_ast.values()):
        body.append(f"(void){NAN_FLAG};")
    # Two outputs that are one value (`lambda x: (x, x)`) are one buffer of the plan, which the kernels write through
    # the first output's pointer: every later one gets a copy, or the caller would read whatever its memory held.
    for b, m in zip(plan.outputs, outputs, strict=True):
        if (first := ref[id(b)]) != m.name:
            body.append(f"std::memcpy({m.name}, {first}, sizeof({m.ctype}) * {math.prod(m.dims)});")
    used = {id(b) for item in plan.items for b in item.bufs}
    unused = [f"(void){m.name};" for b, m in zip(plan.inputs, inputs, strict=True) if id(b) not in used]
    body, rerun = unused + body, unused + rerun
    if not (plan.constants or plan.intermediates): body, rerun = [*body, "(void)ws;"], [*rerun, "(void)ws;"]
    sizes = [{"name": f"{m.name}_size", "value": math.prod(m.dims)} for m in inputs + outputs]
    sig = ", ".join(f"{a.dtype.name}{list(a.shape)} {n.name}" for a, n in zip(f.args, inputs, strict=True))
    return {"name": f.name, "signature": f"{f.name}({sig}) -> " + ", ".join(
        f"{b.ctype}{list(b.dims)}" for b in outputs), "inputs": inputs, "outputs": outputs, "sizes": sizes,
        "constants": constants, "kernels": kernels, "body": body, "rerun": rerun if tested else [],
        "workspace_bytes": offset, "vector_uops": vector_uops,
        "sparse": _sparsity_model(f)}


def _loop_lines(item: LoopItem, depth: int, ref: dict[int, str], emit: Callable[[list[Any], int], list[str]]
                ) -> list[str]:
    """A loop as C++: the carries set, then per step the body (each x a pointer into its xs), the next carries and
    the step's y copied out of the body's output; then the final carries. Counters are named by depth (nesting)."""
    k, c, y = f"step{depth}", item.carry_size, item.y_size
    ct = c_type(item.result.dtype)
    result = ref[id(item.result)]
    for x, xs in zip(item.x, item.xs, strict=True): ref[id(x)] = f"({ref[id(xs)]} + {k} * {x.size})"
    inner = emit(item.body, depth + 1)
    before, after, at = [], [], 0
    for carry, start, nxt in zip(item.carry, item.carry0, item.out[:-1], strict=True):
        size = f"sizeof({ct}) * {carry.size}"
        before.append(f"std::memcpy({ref[id(carry)]}, {ref[id(start)]}, {size});")
        if carry is not nxt: inner.append(f"std::memcpy({ref[id(carry)]}, {ref[id(nxt)]}, {size});")
        after.append(f"std::memcpy({result} + {at}, {ref[id(carry)]}, {size});")
        at += carry.size
    if y: inner.append(f"std::memcpy({result} + {c} + {k} * {y}, {ref[id(item.out[-1])]}, sizeof({ct}) * {y});")
    return [*before, f"for (long {k} = 0; {k} < {item.length}; ++{k}) {{", *(f"  {line}" for line in inner), "}",
            *after]


def _sparsity_model(f: NumericalFunction) -> dict[str, Any] | None:
    """The pattern of a sparse derivative (ember.ad.SparseFunction), written into the header as constants."""
    from ember.ad.sparse import SparseFunction
    if not isinstance(f, SparseFunction): return None
    (rows, cols), big = f.shape, max(f.nnz, f.shape[0]) > 2**31 - 1
    return {"rows": rows, "cols": cols, "nnz": f.nnz, "colors": f.colors, "ctype": "int64_t" if big else "int32_t",
            "indptr": ", ".join(str(int(v)) for v in f.indptr),
            "indices": ", ".join(str(int(v)) for v in f.indices) or "0"}


_ENV = jinja2.Environment(loader=jinja2.PackageLoader("ember.export", "templates"), trim_blocks=True,
                          lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


VECTOR_BYTES = (0, 16, 32, 64)  # the vector widths generate_module takes: none, SSE2/NEON, AVX2, AVX-512


def module_context(name: str, functions: list[NumericalFunction], make_ws: bool = True,
                   threads: int = 1, vector_bytes: int = 0) -> dict[str, Any]:
    """What the templates are rendered from: the module name, one model per function, the prelude. Without
    `make_ws` (the Python extension, which has its own workspace) the module needs no <memory>, whose parsing
    was half of a small function's compile time. With `threads` > 1, a kernel with enough work (a large vmap:
    codegen/heuristic.THREAD_WORK iterations) runs in that many slices on std::threads. With `vector_bytes`, the
    kernels compute on GCC/Clang vectors of that many bytes where the heuristic finds it pays (each lane one
    output: the same bits as scalar code)."""
    check_cpp_name(name, "generate_module", global_scope=True)
    if len({f.name for f in functions}) != len(functions):
        raise ValueError(f"generate_module: function names must be distinct, got {[f.name for f in functions]}")
    most = CppRenderer.max_threads
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= most:
        raise ValueError(f"generate_module: threads must be an int from 1 to {most}, got {threads!r}")
    if not isinstance(vector_bytes, int) or isinstance(vector_bytes, bool) or vector_bytes not in VECTOR_BYTES:
        raise ValueError(f"generate_module: vector_bytes must be one of {VECTOR_BYTES}, got {vector_bytes!r}")
    renderer = CppRenderer(vector_bytes=vector_bytes, cores=threads)
    models = [_function_model(f, renderer) for f in functions]
    defined = {k["name"] for m in models for k in m["kernels"]} | {c["name"] for m in models for c in m["constants"]}
    if clashes := sorted(defined & {f.name for f in functions}):
        raise ValueError(f"generate_module: functions {clashes} are named as another function's kernel or constant; "
                         f"rename them")
    return {"module": name, "functions": models, "make_ws": make_ws,
            "threaded": any("ember_parallel(" in line for m in models for line in m["body"]),
            "vector_prelude": cvector.vector_prelude([u for m in models for u in m["vector_uops"]]),
            "prelude": prelude_for("\n".join([*(k["source"] for m in models for k in m["kernels"]),
                                               *(line for m in models for line in m["body"] + m["rerun"])]))}


def render_module(name: str, functions: list[NumericalFunction], threads: int = 1, vector_bytes: int = 0
                  ) -> tuple[str, str]:
    """(header, source) of the C++ module `name` holding `functions` (`threads`, `vector_bytes`: see
    module_context)."""
    ctx = module_context(name, functions, threads=threads, vector_bytes=vector_bytes)
    return render_templates(ctx)


def render_templates(ctx: dict[str, Any]) -> tuple[str, str]:
    source = _ENV.get_template("module.cpp.j2").render(ctx)
    if "std::numeric_limits" in source:
        source = source.replace("#include <cstring>", "#include <cstring>\n#include <limits>")
    return _ENV.get_template("module.hpp.j2").render(ctx), source


def generate_module(name: str, functions: list[NumericalFunction], outdir: str, threads: int = 1,
                    vector_bytes: int = 0) -> tuple[str, str]:
    """Write `name.hpp` and `name.cpp` into `outdir`; returns their paths. `threads` > 1 splits the kernels with
    enough work (a large vmap) across that many std::threads, as CasADi's map('thread', n) does: the module then
    needs <thread> (standard C++; link with -pthread where the platform asks for it). 1: no threads, as before.
    `vector_bytes` (16, 32 or 64: the target's SIMD registers, SSE2/NEON, AVX2, AVX-512) lets kernels compute on
    vectors of that width where it pays, a vmap's points in lanes: the module then needs GCC or Clang (their
    vector extensions, on any target they compile for; a narrower target splits each vector). 0: ISO C++ only."""
    header, source = render_module(name, functions, threads, vector_bytes)
    os.makedirs(outdir, exist_ok=True)
    paths = (os.path.join(outdir, f"{name}.hpp"), os.path.join(outdir, f"{name}.cpp"))
    for path, text in zip(paths, (header, source), strict=True):
        with open(path, "w") as fh: fh.write(text)
    return paths
