"""The stages after the opts, in order: one function that get_program and the BEAM search (which renders its
candidates exactly as the program that will run) both call.

Before: a rangeified kernel with its opts applied (codegen/opt.py). After: the linear list of UOps a renderer
prints.
"""

from __future__ import annotations

from ember.codegen.decompose import decompose
from ember.codegen.expand import expand
from ember.codegen.gpudims import map_launch
from ember.codegen.linearize import linearize
from ember.codegen.lowerer import lower
from ember.codegen.opt import Opt, OptOps
from ember.codegen.transcendental import approximate_transcendentals
from ember.helpers import DEBUG
from ember.renderer import ProgramSpec, Renderer, launch_dims, most_threads
from ember.uop.ops import GroupOp, Ops, UOp, print_graph


def lower_optimized(sink: UOp, opts: list[Opt] | tuple[Opt, ...], renderer: Renderer) -> list[UOp]:
    sink = map_launch(sink, renderer)  # a GPU's output loops -> workgroup and thread indices (gpudims.py)
    sink = approximate_transcendentals(sink, renderer)  # exp/log on vector lanes -> polynomials, not libm
    sink = expand(sink, renderer)  # lanes -> vectors of the renderer's width, or unrolled copies
    # a reordered kernel: sums of products by fma, where the renderer allows other last bits than the loop's order's
    contract = renderer.reassociates and any(o.op in (OptOps.UPCAST, OptOps.UNROLL) for o in opts)
    sink = lower(sink, contract)  # REDUCE -> accumulator loops; every RANGE closed by an END
    sink = decompose(sink, renderer)  # ops the renderer lacks -> ops it has (decompose.py)
    if DEBUG >= 5: print(print_graph(sink))
    return linearize(sink)  # DAG -> ordered list


def program_spec(ast: UOp, name: str, uops: list[UOp], renderer: Renderer, opts: list[Opt] | tuple[Opt, ...]
                 ) -> ProgramSpec:
    """The rendered program of a linearized kernel: its source, launch, arguments and work (get_program's last
    stage, and the BEAM search's for each candidate)."""
    src = renderer.render(name, uops)
    flops, mem = estimate_work(uops)
    outputs = tuple(sorted({u.src[0].src[0].arg for u in uops if u.op is Ops.STORE and
                            u.src[0].src[0].op is Ops.DEFINE_GLOBAL}))
    globals_ = [u for u in uops if u.op is Ops.DEFINE_GLOBAL]
    global_size, local_size = launch_dims(uops)
    variables = tuple(sorted(u.arg.name for u in uops if u.op is Ops.DEFINE_VAR))
    shared = sum(u.dtype.size * u.dtype.base.itemsize for u in uops if u.op is Ops.DEFINE_LOCAL)
    return ProgramSpec(name, src, renderer.device, ast, uops, len(globals_), outputs, flops, mem, tuple(opts),
                       global_size, local_size, variables, shared)


def estimate_work(uops: list[UOp]) -> tuple[int, int]:
    """(ALU ops, bytes loaded and stored) the kernel executes, counting each loop's trip count."""
    flops = mem = 0
    trips = [most_threads(uops)]  # every thread runs the kernel
    for u in uops:
        if u.op is Ops.RANGE: trips.append(trips[-1] * int(u.src[0].vmax))  # (a symbolic loop: at its most)
        elif u.op is Ops.END: trips.pop()
        elif u.op in GroupOp.ALU and u.op not in GroupOp.Comparison: flops += trips[-1] * u.dtype.count
        elif u.op in (Ops.LOAD, Ops.STORE):
            ptr, value = u.src[0], (u if u.op is Ops.LOAD else u.src[1])
            lanes = value.dtype.count if u.op is Ops.STORE or len(u.src) == 1 else \
                sum(g.op is not Ops.CONST or bool(g.arg) for g in u.src[1:])  # a partial load reads its lanes
            if ptr.src[0].op is Ops.DEFINE_GLOBAL: mem += trips[-1] * ptr.dtype.base.itemsize * lanes
    return flops, mem

