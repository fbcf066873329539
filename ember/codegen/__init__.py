"""get_program: a kernel AST in, a rendered program out. Reads as the list of codegen stages, in order."""

from __future__ import annotations

from ember.codegen.heuristic import hand_coded_opts
from ember.codegen.opt import Opt, apply_opts
from ember.codegen.periodic import split_periodic
from ember.codegen.pipeline import lower_optimized, program_spec
from ember.codegen.rangeify import rangeify
from ember.codegen.search import beam_search
from ember.codegen.segments import split_segments
from ember.helpers import BEAM, NOOPT
from ember.renderer import ProgramSpec, Renderer
from ember.uop.ops import Ops, UOp


def get_program(ast: UOp, renderer: Renderer, name: str | None = None, opts: list[Opt] | None = None) -> ProgramSpec:
    """Lower a kernel AST from the scheduler to source for `renderer`'s device, with `opts` (None: the
    heuristic's, none under NOOPT=1, under BEAM=n those a search times fastest: codegen/search.py)."""
    sink = rangeify(ast)  # movement ops -> RANGE/INDEX/LOAD; index arithmetic simplified
    sink = split_segments(sink)  # a loop that compares i with constants: one loop per stretch between them
    sink = split_periodic(sink)  # a loop that tests i % p for a small p: whole periods, one period unrolled
    if any(u.op is Ops.SCATTER_ADD for u in ast.toposort()): opts = []  # its steps add in turn (store_scatter)
    if opts is None and BEAM and not NOOPT: opts = beam_search(sink, renderer, name or kernel_name(ast), BEAM.value)
    if opts is None: opts = [] if NOOPT else hand_coded_opts(sink, renderer)
    name = name or kernel_name(ast)
    sink = apply_opts(sink, opts, name, renderer)  # loops split into lanes and slices per core
    uops = lower_optimized(sink, opts, renderer)  # transcendentals -> expand -> lower -> linearize (pipeline.py)
    return program_spec(ast, name, uops, renderer, opts)


def kernel_name(ast: UOp) -> str:
    """`E_4_3` for an elementwise kernel with output shape (4, 3), `r_4_3` when it reduces; a kernel with several
    outputs joins their shapes with `__` (`E_4__4_4`)."""
    kind = "r" if any(u.op is Ops.REDUCE_AXIS for u in ast.toposort()) else "E"
    shapes = [[s.arg.name if isinstance(s, UOp) else str(s) for s in store.src[0].shape] for store in ast.src
              if store.op is Ops.STORE]  # (a symbolic size by its variable's name)
    if len(shapes) == 1: return "_".join([kind, *shapes[0]])
    return kind + "_" + "__".join("_".join(shape) or "1" for shape in shapes)
