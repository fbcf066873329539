"""get_program: a kernel AST in, a rendered program out. Reads as the list of codegen stages, in order."""

from __future__ import annotations

from ember.codegen.linearize import linearize
from ember.codegen.lowerer import lower
from ember.codegen.periodic import split_periodic
from ember.codegen.rangeify import rangeify
from ember.helpers import DEBUG
from ember.renderer import ProgramSpec, Renderer
from ember.uop.ops import GroupOp, Ops, UOp, print_graph


def get_program(ast: UOp, renderer: Renderer, name: str | None = None) -> ProgramSpec:
    """Lower a kernel AST from the scheduler to source for `renderer`'s device."""
    sink = rangeify(ast)  # movement ops -> RANGE/INDEX/LOAD; index arithmetic simplified
    sink = split_periodic(sink)  # a loop that tests i % p for a small p: whole periods, one period unrolled
    sink = lower(sink)  # REDUCE -> accumulator loops; every RANGE closed by an END
    uops = linearize(sink)  # DAG -> ordered list
    if DEBUG >= 5: print(print_graph(sink))
    name = name or kernel_name(ast)
    src = renderer.render(name, uops)
    flops, mem = estimate_work(uops)
    outputs = tuple(sorted({u.src[0].src[0].arg for u in uops if u.op is Ops.STORE and
                            u.src[0].src[0].op is Ops.DEFINE_GLOBAL}))
    globals_ = [u for u in uops if u.op is Ops.DEFINE_GLOBAL]
    return ProgramSpec(name, src, renderer.device, ast, uops, len(globals_), outputs, flops, mem)


def kernel_name(ast: UOp) -> str:
    """`E_4_3` for an elementwise kernel with output shape (4, 3), `r_4_3` when it reduces; a kernel with several
    outputs joins their shapes with `__` (`E_4__4_4`)."""
    kind = "r" if any(u.op is Ops.REDUCE_AXIS for u in ast.toposort()) else "E"
    shapes = [store.src[0].shape for store in ast.src if store.op is Ops.STORE]
    if len(shapes) == 1: return "_".join([kind, *(str(s) for s in shapes[0])])
    return kind + "_" + "__".join("_".join(str(s) for s in shape) or "1" for shape in shapes)


def estimate_work(uops: list[UOp]) -> tuple[int, int]:
    """(ALU ops, bytes loaded and stored) the kernel executes, counting each loop's trip count."""
    flops = mem = 0
    trips = [1]
    for u in uops:
        if u.op is Ops.RANGE: trips.append(trips[-1] * int(u.src[0].arg))
        elif u.op is Ops.END: trips.pop()
        elif u.op in GroupOp.ALU and u.op not in GroupOp.Comparison: flops += trips[-1]
        elif u.op in (Ops.LOAD, Ops.STORE):
            ptr = u.src[0]
            if ptr.src[0].op is Ops.DEFINE_GLOBAL: mem += trips[-1] * ptr.dtype.base.itemsize
    return flops, mem

