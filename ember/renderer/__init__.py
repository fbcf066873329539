"""The Renderer base class (what a device can do, and how to print code for it) and ProgramSpec (what comes out).

Every field of Renderer is read by a codegen stage; a new target is a subclass that sets them and prints code:
- `has_local`, `global_max`, `local_max`, `local_threads`: codegen/gpudims.py maps output loops onto the launch grid
  (a grid of `global_max` at most), the LOCAL opt checks workgroups against `local_max` and `local_threads`;
  without `has_local` the loops stay loops.
- `has_shared`, `shared_max`: whether a GROUP opt may meet partials in workgroup memory, and how much
  (codegen/group.py).
- `cores`, `max_threads`: how many slices a THREAD opt may run at once, and may make at most (the CPU's pool).
- `vector_registers`: how many vectors a register tile may hold (heuristic).
- `vector_bytes`, `renders_vector`: the width expand.py builds vectors of, and which vector nodes it may keep.
- `reassociates`: whether a reduction's terms may be regrouped and products contracted into FMAs (heuristic,
  pipeline).
- `vectorizes_loops`: the compiler vectorizes plain loops itself (heuristic).
- `tensor_cores`: its matrix units (renderer/tensorcore.py), which the TC opt puts matmuls on (heuristic, BEAM).
- `supported_ops`: the ALU ops it prints; codegen/decompose.py rewrites the others into ops it has.
- `storage_only`: dtypes it loads and stores but has no arithmetic for (half on an OpenCL device without
  cl_khr_fp16): the C-style walk computes them in float32, rounded back after every op.
- `unsupported`: dtypes it has no memory for at all; a kernel that touches one raises a DTypeError naming the
  device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.dtype import DType, dtypes
from ember.helpers import prod
from ember.renderer.tensorcore import TensorCore
from ember.uop.ops import Ops, UOp


class Renderer:
    """Base of all renderers. Subclasses set the fields and implement `render`."""

    device: str = ""
    has_local: bool = False  # workgroup-local thread ids exist
    has_shared: bool = False  # memory shared inside a workgroup exists
    global_max: tuple[int, ...] = ()  # the most workgroups per grid dimension (has_local)
    local_max: tuple[int, ...] = ()  # the most threads of a workgroup per dimension (has_local)
    local_threads: int = 0  # the most threads of one workgroup in all (has_local)
    shared_max: int = 0  # bytes of shared memory a workgroup may use
    vector_bytes: int = 0  # the width of the vectors it computes on (0: none; expand.py builds lanes one by one)
    cores: int = 1  # how many slices a THREAD opt may run at once
    max_threads: int = 1  # the most slices a THREAD opt may make (the CPU thread pool's limit)
    vector_registers: int = 16  # how many vectors its register file holds (the heuristic's register tiles)
    # whether a reduction's terms may be regrouped (partial sums in vector lanes or in several accumulators) and a
    # sum of products contracted into fused multiply-adds: what an optimized kernel gains from an UNROLL of a reduce
    # axis and from register tiles. False where the code must give a reference's bits (ember.export: the numpy
    # interpreter's, which adds in loop order and rounds every product): reduce axes are then never vectorized
    reassociates: bool = True
    # whether the compiler of its code vectorizes simple loops by itself (the exported C++: g++ or clang at -O2, with
    # EMBER_KERNEL's cost model): ember's own vectors are then taken only where that compiler's would not come, a
    # loop that calls libm per element around enough arithmetic (heuristic.compute_bound)
    vectorizes_loops: bool = False
    tensor_cores: tuple[TensorCore, ...] = ()  # its matrix units (codegen/tensorcore.py)
    supported_ops: frozenset[Ops] = frozenset(Ops)  # ops it renders; codegen/decompose.py rewrites the others
    storage_only: frozenset[DType] = frozenset()  # dtypes loaded and stored, computed in float32
    unsupported: frozenset[DType] = frozenset()  # dtypes it cannot hold at all

    def render(self, name: str, uops: list[UOp]) -> str:
        """Source code of a kernel called `name` from its linearized uops."""
        raise NotImplementedError

    def renders_vector(self, u: UOp) -> bool:
        """Whether it has the vector node `u` (expand.py builds the lanes of the others one by one)."""
        return False


@dataclass(frozen=True)
class ProgramSpec:
    """A rendered kernel: its source, how it is launched, the arguments it takes, and estimates of its work.

    Launch: the kernel runs over `global_size` workgroups of `local_size` threads each (a GPU's grid; each size a
    tuple of up to three), or, on the CPU, `global_size == (threads,)` calls of the kernel with its `core` argument
    0 .. threads-1 and no local size. Arguments: `buffer_count` buffers by slot, then the integer values of
    `variables` in that order."""

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
    global_size: tuple[Size, ...] = (1,)
    local_size: tuple[int, ...] | None = None  # None: the device has no workgroups (the CPU)
    variables: tuple[str, ...] = ()  # the names of its symbolic sizes, the order their values follow the buffers in
    shared_bytes: int = 0  # the workgroup-shared memory its DEFINE_LOCAL arrays take (a GROUP's partials)

    @staticmethod
    def from_source(name: str, src: str, device: str, buffer_count: int, variables: tuple[str, ...] = ()
                    ) -> ProgramSpec:
        """The spec of a kernel written by hand (no AST, one call, no estimates): tests load such kernels."""
        return ProgramSpec(name, src, device, UOp(Ops.NOOP, dtypes.void), None, buffer_count, (0,), 0, 0,
                           variables=variables)

    @property
    def threads(self) -> int:
        """How many times the CPU runs the kernel, once per core."""
        return int(self.global_size[0]) if self.local_size is None else 1  # type: ignore[call-overload]

    def grid(self, vals: tuple[int, ...] = ()) -> tuple[int, ...]:
        """The global size for these values of `variables` (a symbolic size evaluated)."""
        if all(isinstance(g, int) for g in self.global_size): return self.global_size  # type: ignore[return-value]
        values = dict(zip(self.variables, vals, strict=True))
        return tuple(size_value(g, values) for g in self.global_size)


Size = int | tuple  # a launch size: an int, or a symbolic one as a nested tuple (size_form)

SIZE_OPS = {Ops.ADD: "add", Ops.MUL: "mul", Ops.IDIV: "div", Ops.MOD: "mod", Ops.MAX: "max"}


def size_form(u: UOp) -> Size:
    """A launch size as a value the program cache can keep (JSON) and size_value computes: an int, ("var", name),
    or (op, a, b) over ADD, MUL, IDIV, MOD and MAX of the variables' values."""
    if u.op is Ops.CONST: return int(u.arg)
    if u.op is Ops.DEFINE_VAR: return ("var", u.arg.name)
    if u.op is Ops.BIND: return size_form(u.src[0])
    if u.op in SIZE_OPS: return (SIZE_OPS[u.op], *(size_form(s) for s in u.src))
    raise NotImplementedError(f"launch size: no form for {u.op.name}")


def size_value(size: Size, values: dict[str, int]) -> int:
    """The int a launch size has for these variable values."""
    if isinstance(size, int): return size
    if size[0] == "var": return values[size[1]]
    a, b = (size_value(s, values) for s in size[1:])
    return {"add": a + b, "mul": a * b, "div": a // b if b else 0, "mod": a % b if b else 0, "max": max(a, b)}[size[0]]


def launch_dims(uops: list[UOp]) -> tuple[tuple[Size, ...], tuple[int, ...] | None]:
    """(global size, local size) of a linearized kernel, read from its SPECIAL nodes: `core` (the CPU's slices), or
    `gidx<d>` (workgroup d's index) and `lidx<d>` (a thread's index in its workgroup). A grid dimension over a loop
    of symbolic size has a symbolic size (size_form)."""
    specials = {u.arg: size_form(u.src[0]) for u in uops if u.op is Ops.SPECIAL}
    if "core" in specials: return (specials["core"],), None
    if not specials: return (1,), None
    dims = 1 + max(int(name[4:]) for name in specials)
    local = tuple(specials.get(f"lidx{d}", 1) for d in range(dims))
    assert all(isinstance(n, int) for n in local), f"a symbolic workgroup size {local}"
    return tuple(specials.get(f"gidx{d}", 1) for d in range(dims)), local  # type: ignore[return-value]


def most_threads(uops: list[UOp]) -> int:
    """How many threads (or CPU slices) run the kernel at most: its launch at the variables' maxima."""
    return prod(int(u.src[0].vmax) for u in uops if u.op is Ops.SPECIAL)
