"""The stages after the opts, in order: one function that get_program and the BEAM search (which renders its
candidates exactly as the program that will run) both call.

Before: a rangeified kernel with its opts applied (codegen/opt.py). After: the linear list of UOps a renderer
prints.
"""

from __future__ import annotations

from ember.codegen.expand import expand
from ember.codegen.linearize import linearize
from ember.codegen.lowerer import lower
from ember.codegen.opt import Opt, OptOps
from ember.codegen.transcendental import approximate_transcendentals
from ember.helpers import DEBUG
from ember.renderer import Renderer
from ember.uop.ops import UOp, print_graph


def lower_optimized(sink: UOp, opts: list[Opt] | tuple[Opt, ...], renderer: Renderer) -> list[UOp]:
    sink = approximate_transcendentals(sink, renderer)  # exp/log on vector lanes -> polynomials, not libm
    sink = expand(sink, renderer)  # lanes -> vectors of the renderer's width, or unrolled copies
    # a reordered kernel: sums of products by fma, where the renderer allows other last bits than the loop's order's
    contract = renderer.reassociates and any(o.op in (OptOps.UPCAST, OptOps.UNROLL) for o in opts)
    sink = lower(sink, contract)  # REDUCE -> accumulator loops; every RANGE closed by an END
    if DEBUG >= 5: print(print_graph(sink))
    return linearize(sink)  # DAG -> ordered list
