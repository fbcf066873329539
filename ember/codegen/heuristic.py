"""Hand-written opts: what a kernel should get without a search, from its loops and its memory accesses.

In: a rangeified kernel and the renderer (its vector width and cores). Out: a list of Opts (codegen/opt.py).

- Vectors: the axis most accesses walk with stride 1, each access counted as often as it runs (a row max: its
  loads walk the row, its one store per row weighs nothing beside them; ties: an output axis, the innermost), is
  cut into lanes of the renderer's width, UPCAST for an output axis (a row of a matmul, an elementwise kernel),
  UNROLL for a reduce axis (a row sum: partial sums in the lanes, and several vectors of them, independent, so
  additions overlap).
- Vectors for stores: where no axis scores, an elementwise kernel (or one reducing windows of at most WINDOW
  elements: a pool) whose stores all walk an axis with stride 1 is UPCAST along it; its gathered loads (at 2x + k,
  at x // 2) are scalar loads at constant offsets from one base, as many as scalar code makes, and the rest goes
  in vectors.
- Vectors for arithmetic: where no axis has such accesses but one carries many float operations per access (a
  vmap over points stored one after another, hundreds of operations a point), that output axis is UPCAST all the
  same: its loads, stores and libm calls go lane by lane, its arithmetic in vectors (compute_bound). Such an axis
  takes full vectors whatever its length if the padding idles at most PAD_SLACK of the lanes (a swing-up's 50
  intervals: 7 vectors of 8, the last one's 6 lanes past the end gated off; opt.upcast_padded).
- A renderer that must not regroup sums (`reassociates`: ember.export, the interpreter's bits) gets no reduce axis
  in vector lanes: each lane is one output, its sum in loop order. One whose compiler vectorizes loops itself
  (`vectorizes_loops`: the exported C++) gets vectors only for arithmetic around libm calls, which it does not.
- Register tiles: a kernel that reduces and vectorizes an output axis (matmul, convolution) also unrolls a second
  output axis by R and its vector axis by V vectors, R*V accumulators that fit the register file, so each load
  of an operand feeds several fused multiply-adds.
  The loop over column panels goes outside the loop over rows (SWAP).
- Settled gates: a short reduce axis that a load's gate tests beside the vector axis (a convolution's kx over a
  padding: ox + kx - 1 >= 0) is unrolled, so the gate of each copy's lanes is a constant or the row's test, and
  its loads are whole vectors or one masked load, not a gated load per lane (in scalar code, beside any output).
- Threads: a kernel with enough work splits an output axis across the cores (the first one that divides evenly).
- Workgroups (a renderer with `has_local`: a GPU): the output axes, innermost first, are split into workgroups of
  up to WORKGROUP_THREADS threads (LOCAL by the largest divisor that fits, after a PADTO where the size has no good
  divisor), so neighbouring threads touch neighbouring memory and a workgroup has enough threads to hide latency; a
  batch axis of symbolic size gets up to SYMBOLIC_THREADS of the rest (the rows past its size gated off); a
  kernel with few outputs splits its innermost reduction across a workgroup too (GROUP) (gpu_opts).
- Tensor cores (a renderer with `tensor_cores`): a matmul whose dtypes one fits goes on it (TC over the innermost
  reduce axis that works, padding odd sizes), with up to TC_WARPS warps a workgroup along its output tiles (LOCAL).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ember.codegen.opt import KernelOptError, Opt, OptOps, apply_opt, kernel_axes, range_size
from ember.codegen.transcendental import POLYNOMIALS
from ember.dtype import dtypes
from ember.helpers import prod
from ember.renderer import Renderer
from ember.renderer.sincos import OPERATIONS as sincos_operations
from ember.renderer.sincos import computes as computes_sincos
from ember.uop.ops import AxisKind, GroupOp, Ops, UOp
from ember.uop.symbolic import lane_symbolic
from ember.uop.upat import graph_rewrite, substitute

WINDOW = 16  # a reduction over at most this many elements per output (a pool's window) is vectorized like an
# elementwise kernel: along the axis its stores walk, however its loads are gathered
THREAD_WORK = 1 << 16  # iterations of the innermost body (lanes counted) below which a kernel stays on one core
PAD_SLACK = 4 / 3  # an output axis no four lanes divide (a 14-wide row) gets full vectors if this few lanes idle
PAD_VECTORS = 4  # and if it is at most this many vectors long: upcast whole, in one step (one taken for its
# arithmetic alone pads at any length, a vector a step: compute_bound)


@functools.lru_cache(maxsize=1 << 12)
def stride_one(offset: UOp, rng: UOp, group: int = 1) -> bool:
    """Whether the access at `offset` moves to the next element when `rng` steps by one inside each aligned group
    of `group` values (what one vector of that many lanes needs: a matmul's right operand packed in panels of 16
    columns is stride one within its panels, not across them)."""
    if rng not in offset.ranges: return False
    size = range_size(rng)
    if group < 2 or size % group: group = 1
    kind = rng.arg.kind  # new ranges: rng itself in rng + 1 would be substituted again
    outer = rng.replace(src=(UOp.const(rng.dtype, size // group),), arg=type(rng.arg)(-1, kind))
    lane = rng.replace(src=(UOp.const(rng.dtype, max(group - 1, 1)),), arg=type(rng.arg)(-2, kind))
    at = outer * group + lane if group > 1 else outer
    step = graph_rewrite(substitute(offset, {rng: at + 1}) - substitute(offset, {rng: at}), lane_symbolic)
    return step.op is Ops.CONST and step.arg == 1


WORKGROUP_THREADS = 256  # the threads the heuristic puts in a workgroup, at most
GROUP_THREADS = 64  # the most threads a GROUP gives one reduction
GROUP_OUTPUTS = 4096  # a kernel with fewer outputs than this has too few threads without a GROUP
PAD_BELOW, PAD_TO = 8, 32  # an output axis whose best divisor is under PAD_BELOW is padded to a multiple of PAD_TO
SYMBOLIC_THREADS = 64  # the threads a symbolic batch axis gets a workgroup, at most
TC_WARPS = 4  # the most warps of a workgroup the heuristic gives a tensor-core matmul


def tensor_core_opts(sink: UOp, renderer: Renderer) -> list[Opt] | None:
    """TC on the first tensor core and innermost reduce axis where it applies, then LOCALs by 2 along the tile axes,
    innermost first, while the workgroup has under TC_WARPS warps; None where no tensor core fits the kernel."""
    axes = kernel_axes(sink)
    for i in sorted((i for i, a in enumerate(axes) if a.arg.kind is AxisKind.REDUCE), reverse=True):
        for which in range(len(renderer.tensor_cores)):
            try:
                tiled = apply_opt(sink, opts := Opt(OptOps.TC, i, which), renderer=renderer)
            except KernelOptError:
                continue
            chosen, warps = [opts], 1
            for j in sorted((j for j, a in enumerate(kernel_axes(tiled)) if a.arg.kind is not AxisKind.REDUCE),
                            reverse=True):
                if warps >= TC_WARPS: break
                try:
                    tiled = apply_opt(tiled, local := Opt(OptOps.LOCAL, j, 2), renderer=renderer)
                except KernelOptError:
                    continue
                chosen.append(local)
                warps *= 2
            return chosen
    return None


def gpu_opts(sink: UOp, renderer: Renderer) -> list[Opt]:
    """Opts for a device with workgroups. A kernel with few outputs (under GROUP_OUTPUTS) and a long reduce loop
    gets its innermost reduce axis split across up to GROUP_THREADS threads (GROUP); then the output axes of known
    size, innermost first, are split by the largest divisor of their size that keeps the workgroup within
    WORKGROUP_THREADS and the device's limits (LOCAL, applied before the GROUP, whose slots count them); an axis
    whose size has no divisor of at least PAD_BELOW that fits is padded to a multiple of PAD_TO first (PADTO); the
    innermost axis of symbolic size gets a power of two of the threads left, up to SYMBOLIC_THREADS (LOCAL, first)."""
    budget = min(WORKGROUP_THREADS, renderer.local_threads)
    group: tuple[int, int] | None = None  # (axis id, threads) of the reduction split across a workgroup
    outputs = prod(range_size(a) for a in kernel_axes(sink) if a.arg.kind is not AxisKind.REDUCE and fixed(a))
    reduce_axes = [a for a in kernel_axes(sink) if a.arg.kind is AxisKind.REDUCE and fixed(a)]
    symbolic_outputs = any(a.arg.kind is not AxisKind.REDUCE and not fixed(a) for a in kernel_axes(sink))
    if renderer.has_shared and renderer.reassociates and reduce_axes and outputs < GROUP_OUTPUTS and \
            not symbolic_outputs:
        last = reduce_axes[-1]
        size = range_size(last)
        amount = max((n for n in range(2, min(size, GROUP_THREADS, budget) + 1) if size % n == 0), default=0)
        if amount >= 8: group, budget = (last.arg.axis, amount), budget // amount
    stores = [u for u in sink.toposort() if u.op is Ops.STORE]
    amounts: dict[int, tuple[int, bool]] = {}  # axis id -> (threads along it, padded first), innermost first
    for a in sorted((a for a in kernel_axes(sink) if a.arg.kind is not AxisKind.REDUCE and fixed(a) and
                     all(a in st.ranges for st in stores)),
                    key=lambda a: -a.arg.axis)[:len(renderer.local_max)]:
        size, most = range_size(a), min(budget, renderer.local_max[len(amounts)])
        amount = max((n for n in range(2, min(size, most) + 1) if size % n == 0), default=0)
        padded = amount < PAD_BELOW and size >= 2 * PAD_TO and most >= PAD_TO  # (a size of few divisors: 37, 1021)
        if padded: amount = PAD_TO
        if amount < 2: continue
        amounts[a.arg.axis] = (amount, padded)
        budget //= amount
        if budget < 2: break
    opts: list[Opt] = []
    batch = [a for a in kernel_axes(sink) if a.arg.kind is not AxisKind.REDUCE and not fixed(a) and
             all(a in st.ranges for st in stores)]
    if batch and budget >= 2 and group is None and len(amounts) < len(renderer.local_max):
        # a batch of symbolic size: threads along its innermost axis too (rows past n store nothing), its LOCAL
        # applied first, so that the axes of known size keep thread index 0 (neighbouring threads, neighbouring
        # elements)
        threads = 1 << (min(budget, SYMBOLIC_THREADS, int(batch[-1].src[0].vmax)).bit_length() - 1)
        if threads >= 2:
            opts.append(Opt(OptOps.LOCAL, kernel_axes(sink).index(batch[-1]), threads))
            sink = apply_opt(sink, opts[-1], renderer=renderer)
    for axis_id, (amount, padded) in sorted(amounts.items()):  # outermost first: the innermost gets the last LOCAL
        index = next(i for i, a in enumerate(kernel_axes(sink)) if a.arg.axis == axis_id)  # (the id gpudims orders by)
        for op in (OptOps.PADTO, OptOps.LOCAL) if padded else (OptOps.LOCAL,):
            opts.append(Opt(op, index, amount))
            sink = apply_opt(sink, opts[-1], renderer=renderer)
    if group is not None:
        opts.append(Opt(OptOps.GROUP, next(i for i, a in enumerate(kernel_axes(sink)) if a.arg.axis == group[0]),
                        group[1]))
    return opts


def hand_coded_opts(sink: UOp, renderer: Renderer) -> list[Opt]:
    """The opts for `sink` (see the module docstring); [] where none apply."""
    if renderer.tensor_cores and (tc := tensor_core_opts(sink, renderer)) is not None: return tc
    if renderer.has_local: return gpu_opts(sink, renderer)
    nodes = list(sink.toposort())
    if renderer.vector_bytes == 0 and renderer.cores <= 1: return []
    axes = kernel_axes(sink)
    if not axes: return []
    offsets = [u.src[1] for u in nodes if u.op is Ops.INDEX and u.src[0].op is Ops.DEFINE_GLOBAL]
    stored = [u.src[0].src[1] for u in nodes if u.op is Ops.STORE]
    # how often each access runs: a load in the reduce loop every iteration, a store once per output
    runs = {o: prod(most(a) for a in axes if o not in stored or a.arg.kind is not AxisKind.REDUCE)
            for o in offsets}
    # the widest element among accesses that move with a loop (a float64 scalar, broadcast, halves no vector)
    widest = max((u.src[1].dtype.itemsize if u.op is Ops.STORE else u.dtype.itemsize for u in nodes
                  if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is Ops.INDEX and u.src[0].src[1].ranges), default=4)
    lanes = renderer.vector_bytes // widest
    if any(u.op is Ops.REDUCE and u.dtype.is_bool for u in nodes): lanes = 1  # (no vectors of bool accumulators:
    # any() over an axis whose outputs vectors would cover)
    # a loop of symbolic size (a batch: ember/variables.py) gets no vector lanes and no threads, only register rows
    outputs = [a for a in axes if a.arg.kind is not AxisKind.REDUCE and fixed(a)]
    batch = [a for a in axes if a.arg.kind is not AxisKind.REDUCE and not fixed(a)]
    reduces = [a for a in axes if a.arg.kind is AxisKind.REDUCE]
    opts: list[Opt] = []

    def position(rng: UOp) -> int | None:
        return next((i for i, a in enumerate(kernel_axes(sink)) if a.arg.axis == rng.arg.axis), None)

    def add(op: OptOps, rng: UOp, amount: int) -> None:
        """Apply op to the axis `rng` names now (its loop keeps its id through splits)."""
        nonlocal sink
        opts.append(Opt(op, position(rng), amount))  # type: ignore[arg-type]
        sink = apply_opt(sink, opts[-1], renderer=renderer)

    def fit(a: UOp) -> int:  # lanes for axis a: a power of two dividing its size, at most a full vector; over an
        size = range_size(a)  # output axis that no four lanes divide, a full vector (or half of one of 16 lanes: a
        whole = min(lanes, size & -size)  # 7-wide row takes 8 floats of AVX-512's 16) that pads it within the
        if whole >= min(4, lanes) or a.arg.kind is AxisKind.REDUCE: return whole  # slack (opt.upcast_padded)
        widths = (lanes, lanes // 2) if lanes >= 16 else (lanes,)
        return next((w for w in widths if padded(size, w) <= PAD_SLACK * size and size <= PAD_VECTORS * w), whole)

    def spread(a: UOp) -> int:  # lanes for an axis taken for its arithmetic alone (compute_bound): a full vector
        # over any length whose padding idles few lanes (a 50-interval loop in 7 vectors of 8, the last one gated)
        size = range_size(a)
        return lanes if lanes >= 2 and padded(size, lanes) <= PAD_SLACK * size else fit(a)

    vector = arithmetic = None  # arithmetic: the axis compute_bound took
    wide = [a for a in outputs if fit(a) >= min(4, lanes)]  # the output axes a vector of 4 lanes or more fits
    spread_wide = [a for a in outputs if spread(a) >= min(4, lanes)]
    if lanes >= 2 and renderer.vectorizes_loops:  # the compiler vectorizes what the scores would pick (and better:
        # a Rosenbrock hessian's column loop, stored with stride 3, 0.111 -> 0.184 us in ember's lanes), not libm calls
        vector = arithmetic = compute_bound(nodes, spread_wide, offsets, spread, calls_only=True)
    elif lanes >= 2:
        # a stride-one access is one vector load per `lanes` elements; another that moves with the axis is a gather,
        # `lanes` scalar loads (one that does not move is a broadcast: free)
        scores = {a: sum(runs[o] if stride_one(o, a, fit(a)) else -runs[o] * (lanes - 1) if a in o.ranges else 0
                         for o in offsets) for a in axes if fixed(a) and fit(a) >= min(4, lanes) and
                  (a.arg.kind is not AxisKind.REDUCE or renderer.reassociates)}
        # an output axis whose stores are not stride one stores lane by lane: taken only in a kernel that reduces
        # (a store per output, against the loads of the whole reduction: a convolution's output channels, where
        # its rows are narrower than a vector, 2 x 2 in ResNet's last stage), its score paying for those stores
        scores = {a: s for a, s in scores.items() if s > 0 and (a.arg.kind is AxisKind.REDUCE or bool(reduces) or
                                                           all(stride_one(o, a, fit(a)) for o in stored))}
        window = prod(range_size(a) for a in reduces) <= WINDOW if all(fixed(a) for a in reduces) else False
        along = [a for a in wide if window and stored and all(stride_one(o, a, fit(a)) for o in stored)]
        if scores: vector = max(scores, key=lambda a: (scores[a], a.arg.kind is not AxisKind.REDUCE, a.arg.axis))
        elif along:  # an elementwise kernel (or one that reduces a small window) whose loads are gathered but
            # whose stores walk an axis (a 2 x 2 max pool, its gradient, which reads at x // 2): each lane's address
            # is a constant from one base, the loads cost what scalar code's do, and the arithmetic and the stores
            # go in vectors (the pool's 32 x 32 x 32 x 32 gradient 2.8 -> 0.2 ms)
            vector = along[-1]
        else: vector = arithmetic = compute_bound(nodes, spread_wide, offsets, spread)
    if vector is not None: lanes = spread(vector) if vector is arithmetic else fit(vector)
    registers = renderer.vector_registers
    streamed = [o for o in offsets if vector is not None and stride_one(o, vector, lanes)]
    if vector is not None and vector.arg.kind is AxisKind.REDUCE and (pair := dot_tile(outputs + batch, streamed)):
        # dot products (x @ w.T: both operands stride one along the sum): an r x c tile of vector accumulators,
        # each step loads r + c vectors for r*c fused multiply-adds (a symbolic axis needs no divisor: opt.py)
        tiles = [(r, c) for r in (4, 3, 2, 1) for c in (4, 3, 2, 1) if r * c + r + c <= registers and
                 (not fixed(pair[0]) or range_size(pair[0]) % r == 0) and
                 (not fixed(pair[1]) or range_size(pair[1]) % c == 0)]
        r, c = max(tiles, key=lambda t: (t[0] * t[1], -abs(t[0] - t[1])))
        add(OptOps.UNROLL, vector, lanes)
        if r > 1: add(OptOps.UPCAST, pair[0], r)
        if c > 1: add(OptOps.UPCAST, pair[1], c)
        # the loop over the larger operand's rows goes outside: a tile of its rows stays in cache while the smaller
        # operand streams past, from a cache it fits in (GPT-2's 128 x 768 activations, 0.4 MB, under 3072 x 768
        # weights, 9.4 MB: 21 -> 60 GFLOP/s), not the larger one from memory once per tile of the smaller
        size = {a: max((footprint(o) for o in streamed if a in o.ranges and pair[0 if a is pair[1] else 1] not in
                        o.ranges), default=0) for a in pair}
        if size[pair[1]] > size[pair[0]] and (p := position(pair[1])) is not None and \
                (q := position(pair[0])) is not None and p > q:
            opts.append(Opt(OptOps.SWAP, q, p))
            sink = apply_opt(sink, opts[-1], renderer=renderer)
    elif vector is not None and vector.arg.kind is AxisKind.REDUCE:
        add(OptOps.UNROLL, vector, lanes * next(n for n in (4, 2, 1) if range_size(vector) % (lanes * n) == 0))
    elif vector is not None and reduces and len(outputs + batch) >= 2:  # a register tile: r rows x v vectors
        # rows: an axis the vector-loaded operand does not depend on, so each vector it loads feeds r rows (a
        # symbolic one too: its last step's lanes past the end read the last row and store nothing, opt.py)
        rows = max((a for a in outputs + batch if a is not vector),
                   key=lambda a: (sum(a not in o.ranges for o in streamed), a.arg.axis))
        # r*v accumulators, a loaded vector and a broadcast in registers; v up to 8 vectors (a conv's 56-wide rows: 7)
        tiles = [(r, v) for r in (8, 6, 4, 3, 2, 1) for v in (4, 3, 2, 1, 8, 7, 6, 5) if r * v + 2 <= registers and
                 (not fixed(rows) or range_size(rows) % r == 0) and whole_steps(range_size(vector), lanes, v)]
        if invariant_transcendental(nodes, vector, reduces):
            # a transcendental in the sum that does not move with the vector axis (attention's softmax weights,
            # exp(s - max) / sum, before the product with v) runs once per tile column: the widest tile runs it
            # fewest times (2x8x128x64: 3.6 ms at 4 rows x 2 vectors, 4 exps per weight)
            r, v = max(tiles, key=lambda t: (t[1], t[0]))
        else:
            r, v = max(tiles, key=lambda t: (t[0] * t[1], -abs(t[0] - 2 * t[1])))
        add(OptOps.UPCAST, vector, lanes * v)
        if r > 1: add(OptOps.UPCAST, rows, r)
        # the column panel outside the rows: one panel of the second operand (reduce x v vectors) stays in cache
        # while the rows stream past it (GEMM 2048: 91 -> 162 GFLOP/s; at 512 and 1024 +3%)
        if (p := position(vector)) is not None and (q := position(rows)) is not None and p > q:
            opts.append(Opt(OptOps.SWAP, q, p))
            sink = apply_opt(sink, opts[-1], renderer=renderer)
    elif vector is not None:
        size = range_size(vector)  # (a short axis lanes do not divide in one step: PAD_VECTORS vectors at most)
        add(OptOps.UPCAST, vector, lanes if size % lanes == 0 or size > PAD_VECTORS * lanes else padded(size, lanes))
    if vector is None or vector.arg.kind is not AxisKind.REDUCE:
        # a short reduce axis that a gate reads beside the vector axis (a convolution's kx over a padding it does
        # not store) is unrolled: each copy's gate then settles lane by lane, true inside the row, false on the
        # pad, so its loads are whole or partial vectors (expand.partial_load) instead of one gated load a lane;
        # in scalar code (a strided convolution), beside any output axis: most copies' gates are always true
        beside = [vector] if vector is not None else outputs
        for a in gated_beside(nodes, beside, reduces): add(OptOps.UNROLL, a, range_size(a))
    work = prod(most(a) for a in axes)
    # no more slices than the device runs ($EMBER_THREADS=2048, or a bigger host, on a renderer made by hand)
    cores = min(renderer.cores, renderer.max_threads)
    if cores > 1 and work >= THREAD_WORK:
        for a in kernel_axes(sink):
            if a.arg.kind is not AxisKind.REDUCE and fixed(a) and range_size(a) % cores == 0:
                add(OptOps.THREAD, a, cores)
                break
    return opts


COMPUTE_PER_LANE = 4  # float operations a vector of lanes must share per access or libm call it takes lane by lane


def compute_bound(nodes: list[UOp], candidates: list[UOp], offsets: list[UOp], fit: Callable[[UOp], int],
                  calls_only: bool = False) -> UOp | None:
    """An output axis worth vectors for its arithmetic alone, where no access walks one with stride one: a vmap
    over points stored point after point (each point's state gathered, its jacobian scattered, hundreds of
    operations between: the cart-pole step's 4 x 4 jacobian, 380 a point). Its lanes then compute every float
    operation that moves with it at once (a float64 sin or cos counted as the operations it is made of); its
    accesses and its libm calls go lane by lane. The axis whose shared operations are most, if they are at least
    COMPUTE_PER_LANE times its lane-by-lane work (each counted as often as it runs per output: inside a reduce loop,
    once per step); None where no axis has that. `calls_only`: only an axis some libm call or float64 sin or cos
    moves with (for a renderer whose compiler vectorizes the others itself)."""
    def runs(u: UOp) -> int: return prod(most(r) for r in u.ranges if r.arg.kind is AxisKind.REDUCE)
    def libm(u: UOp) -> bool:  # (float32 exp and log on vector lanes are polynomials: codegen/transcendental.py;
        # float64 sin and cos are ember's own, on whole vectors: renderer/sincos.py)
        return u.op in GroupOp.Transcendental and not (u.op in POLYNOMIALS and u.dtype.scalar is dtypes.float32) \
            and not computes_sincos(u)
    def weight(u: UOp) -> int: return sincos_operations if computes_sincos(u) else 1
    best, most_shared = None, 0
    for a in candidates:
        moving = [u for u in nodes if a in u.ranges]
        if calls_only and not any(libm(u) or computes_sincos(u) for u in moving): continue
        shared = sum(runs(u) * weight(u) for u in moving if u.op in GroupOp.ALU and u.dtype.is_float and not libm(u))
        alone = sum(runs(u) for u in moving if libm(u)) + \
            sum(runs(o) for o in offsets if a in o.ranges and not stride_one(o, a, fit(a)))
        if shared >= COMPUTE_PER_LANE * alone and shared > most_shared: best, most_shared = a, shared
    return best


def invariant_transcendental(nodes: list[UOp], vector: UOp, reduces: list[UOp]) -> bool:
    """Whether some transcendental (or division) runs in a reduce loop without moving with the vector axis: an
    UPCAST of that axis computes it once per vector of it, so each vector fewer is one less evaluation."""
    return any(u.op in EXPENSIVE and vector not in u.ranges and any(a in u.ranges for a in reduces) for u in nodes)


EXPENSIVE = GroupOp.Transcendental | {Ops.FDIV, Ops.RECIPROCAL}


def padded(size: int, amount: int) -> int:
    """`size` rounded up to a multiple of `amount`: the lanes an UPCAST by `amount` runs."""
    return -(-size // amount) * amount


def whole_steps(size: int, lanes: int, vectors: int) -> bool:
    """Whether `vectors` vectors of `lanes` step through an axis of `size` evenly, or, where lanes do not divide it
    (a padded axis), in one step: its gates are then constants, whole vectors or masks, and its stores lane by lane
    at most once (over several steps each would test its lane's row)."""
    return size % (lanes * vectors) == 0 if size % lanes == 0 else vectors == -(-size // lanes)


SETTLED_UNROLL = 8  # most copies of the loop body unrolled so that a padding's gates settle lane by lane


def gated_beside(nodes: list[UOp], axes: list[UOp], reduces: list[UOp]) -> list[UOp]:
    """The short fixed reduce axes that a test of some load's gate reads together with one of `axes` (with the
    vector axis, a convolution's kx: ox + kx - 1 >= 0; not ky, whose row test every lane shares: unrolled too, its
    copies' loads crowd the registers the accumulators need), while their copies stay within SETTLED_UNROLL."""
    beside = [t for u in nodes if u.op is Ops.INDEX and len(u.src) > 2 for t in conjuncts(u.src[2])
              if any(a in t.ranges for a in axes)]
    loops = [set(u.src[1:]) for u in nodes if u.op is Ops.REDUCE]  # a loop split in segments: a REDUCE per piece
    picked: list[UOp] = []
    for nest in loops:  # innermost first, stopping at the first that is not unrolled: the copies then add in the
        for a in sorted(nest, key=lambda r: r.arg.axis, reverse=True):  # loops' order (expand: a SERIAL chain)
            copies = prod(range_size(b) for b in picked if b in nest)
            if a not in reduces or not fixed(a) or not any(a in t.ranges for t in beside) or \
                    copies * range_size(a) > SETTLED_UNROLL: break
            if a not in picked: picked.append(a)
    return picked


def conjuncts(gate: UOp) -> list[UOp]:
    """The tests a gate ANDs together (from a stack: a cat of many pieces ANDs many)."""
    tests, todo = [], [gate]
    while todo:
        g = todo.pop()
        if g.op is Ops.AND: todo.extend(g.src)
        else: tests.append(g)
    return tests


def fixed(a: UOp) -> bool:
    """The loop has a size known when compiling (not a variable's)."""
    return a.src[0].op is Ops.CONST


def most(a: UOp) -> int:
    """The most iterations the loop runs: its size, or its variable's maximum."""
    return int(a.src[0].vmax)


def footprint(offset: UOp) -> int:
    """The elements an access walks over all its loops (an operand's size)."""
    return prod(most(r) for r in offset.ranges)


def dot_tile(outputs: list[UOp], streamed: list[UOp]) -> tuple[UOp, UOp] | None:
    """Two output axes for a tile of dot products: each has a streamed operand that does not move with it (so one
    load of that operand serves the whole row of the tile); None where there are no such two."""
    free = [a for a in outputs if any(a not in o.ranges for o in streamed)]
    for a in free:
        for b in free:
            if a is not b and any(a not in o.ranges and b in o.ranges for o in streamed) and \
                    any(b not in o.ranges and a in o.ranges for o in streamed):
                return a, b
    return None
