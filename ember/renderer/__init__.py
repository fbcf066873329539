"""The Renderer base class (what a device can do, and how to print code for it) and ProgramSpec (what comes out).

Lowering reads the capability flags to decide what to emit: an op missing from `supported_ops` is decomposed into
ops the renderer has, so the same kernel AST renders for every device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.uop.ops import Ops, UOp


class Renderer:
    """Base of all renderers. Subclasses set the flags and implement `render`."""

    device: str = ""
    has_local: bool = False  # workgroup-local thread ids exist
    has_shared: bool = False  # memory shared inside a workgroup exists
    has_threads: bool = False  # the outer loops may run in parallel
    global_max: tuple[int, ...] | None = None
    local_max: tuple[int, ...] | None = None
    shared_max: int = 0  # bytes of shared memory a workgroup may use
    vector_bytes: int = 0  # the width of the vectors it computes on (0: none; expand.py builds lanes one by one)
    cores: int = 1  # how many slices a THREAD opt may run at once
    # whether a reduction's terms may be regrouped (partial sums in vector lanes or in several accumulators) and a
    # sum of products contracted into fused multiply-adds: what an optimized kernel gains from an UNROLL of a reduce
    # axis and from register tiles. False where the code must give a reference's bits (ember.export: the numpy
    # interpreter's, which adds in loop order and rounds every product): reduce axes are then never vectorized
    reassociates: bool = True
    # whether the compiler of its code vectorizes simple loops by itself (the exported C++: g++ or clang at -O2, with
    # EMBER_KERNEL's cost model): ember's own vectors are then taken only where that compiler's would not come, a
    # loop that calls libm per element around enough arithmetic (heuristic.compute_bound)
    vectorizes_loops: bool = False
    tensor_cores: tuple = ()  # matrix-multiply units kernels may use (none are used yet)
    supported_ops: frozenset[Ops] = frozenset()  # ALU ops it renders; lowering decomposes the others

    def render(self, name: str, uops: list[UOp]) -> str:
        """Source code of a kernel called `name` from its linearized uops."""
        raise NotImplementedError

    def renders_vector(self, u: UOp) -> bool:
        """Whether it has the vector node `u` (expand.py builds the lanes of the others one by one)."""
        return False


@dataclass(frozen=True)
class ProgramSpec:
    """A rendered kernel: its source, the buffers it takes, and estimates of the work it does."""

    name: str
    src: str
    device: str
    ast: UOp = field(repr=False)
    uops: list[UOp] | None = field(repr=False)  # the linearized kernel; None in a spec read from the program cache
    buffer_count: int
    outputs: tuple[int, ...]  # which buffer slots the kernel writes
    flops: int  # ALU ops executed
    mem_bytes: int  # bytes loaded and stored (upper bound: every access counted)
    opts: tuple = ()  # the Opts applied (codegen/opt.py)
    threads: int = 1  # how many times the kernel runs, once per core (its `core` argument 0 .. threads-1)
    variables: tuple[str, ...] = ()  # the names of its symbolic sizes, the order their values follow the buffers in
