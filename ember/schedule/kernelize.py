"""Group a tensor graph into kernels: decide what is stored to memory, what is fused, and in which order.

Before: the tensor-level graphs to realize (ALU, movement, REDUCE_AXIS, CONTIGUOUS over BUFFERs and CONSTs).
After:  an ordered list of ExecItems. Each holds a kernel AST `SINK(STORE(DEFINE_GLOBAL(0).reshape(shape), value))`
        where `value` reads only DEFINE_GLOBALs (numbered by the item's buffer list) and CONSTs, and the buffers.

What is realized (stored to a buffer): every output, every CONTIGUOUS, and a REDUCE_AXIS whose result is broadcast
(an EXPAND between it and its kernel would recompute the reduction per broadcast element), read by two kernels, or
read at more positions than it has elements by a kernel that loops over them (a PAD around it: each position would
run the reduction's loop, gated; see `recomputed`).
When only an elementwise chain lies between such a reduction and the broadcast or pad, the end of the chain is stored
instead, so the chain runs once inside the reduce kernel.
An elementwise value read by two kernels is recomputed in each unless it costs more than RECOMPUTE_LIMIT ALU ops;
one of more than BROADCAST_RECOMPUTE_SIZE elements that costs a transcendental or more than RECOMPUTE_LIMIT ALU ops
and is broadcast is stored once, unless its readers recompute it for less than a kernel costs (is_cheap_to_recompute:
eval BatchNorm's scale in a convolution's epilogue, attention's softmax weights read by a few columns, a vmapped
jacobian's primal values shared by the entries of their point within one loop iteration). A padded value read
through a window (a convolution's input) is read through gates when the window steps by one along a row its reader
vectorizes (rangeify.stride_one_window: the gates then settle lane by lane), and is stored padded when it is large
(PAD_GATE_SIZE), read by two kernels, or read through a strided window, whose gathered lanes would each need a gate.
None of these rules stores a value computed from positions alone (ARANGEs and constants, no transcendental, at most
INDEX_ARITHMETIC_LIMIT ops): codegen folds it where loops are cut and unrolled (a vmapped jacobian's constant
entries, a unit seed padded into place, are then constants in each point's code, not a table added to every entry).
Everything else fuses into the kernel that reads it: movement ops become index arithmetic (see codegen/rangeify).
A chain deeper than CUT_EVERY ALU ops is stored at each multiple of that depth (cut_deep_chains): C compilers take
time quadratic in the length of a function.
A reduction of many elements to few results is first split in two (split_reduce), so that its first stage has an
output axis for the cores to share.
A FOLD (ember/scan.py) is realized with its sources and becomes a LoopItem: its body scheduled once, run per step.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ember.codegen.rangeify import STRAIGHT_UNROLL, branching_axes, stride_one_window
from ember.device import Buffer, buffer_of, buffer_uop
from ember.dtype import dtypes
from ember.errors import DeviceError
from ember.helpers import UNROLL, prod
from ember.schedule.folds import share_folds
from ember.uop.fold import body_with, fold_parts
from ember.uop.ops import GroupOp, Ops, UOp
from ember.uop.upat import PatternMatcher, UPat, graph_rewrite, graph_rewrite_map
from ember.variables import is_symbolic, max_count

RECOMPUTE_LIMIT = 16  # ALU ops; a value dearer than this is stored once rather than recomputed by each reader
BROADCAST_RECOMPUTE_SIZE = 64  # elements: a broadcast value this small is recomputed per copy (kernels this small
# are unrolled and share it); a larger dear one (a transcendental, or over RECOMPUTE_LIMIT ops) is stored once
# unless it is cheap to recompute (is_cheap_to_recompute):
EPILOGUE_SHARE = 16  # terms of a reader's reduction per op of the value: recomputed after it, at most 1/16 more work
PAD_GATE_SIZE = 1 << 18  # elements: a padded input up to this size is read through gates by a stride-one window
# (one kernel); above it, a padded copy, whose pass costs less beside the convolution than gates in its loads (16 x
# 64 x 56 x 56, 3x3, interleaved: median 53 ms with the copy, 60 ms gated; 2 x 64 x 28 x 28: within noise)
INDEX_ARITHMETIC_LIMIT = 512  # ALU ops: a value computed from positions alone (ARANGEs and constants, no buffer, no
# transcendental) this cheap is never stored: codegen folds it where loops are cut and unrolled (a sparse derivative's
# seeds, the colors of a multiple-shooting problem in runs: stored, they became a table and every seed a load)
LOOP_RECOMPUTE_WORK = 1 << 17  # ALU ops a value may add recomputed in a loop: about a kernel launch and its buffer
LOOP_SHARE = 16  # copies of a broadcast value that one computation serves in a reader's loop: the heuristic's
# register tile spans 16 to 32 float32 columns of the output axis the value is broadcast along
STREAM_OPS = 64  # ALU ops per element that a value may add recomputed rather than be written and read back:
# attention's softmax weights (7 ops) recomputed in weights @ v for d = 32 to 128 (up to 7 more computations each)
# ran as fast as stored (2 x 8 x 128 x 64: median 3.06 vs 3.26 ms; 1 x 8 x 64 x 128: 2.07 vs 2.04 ms, 5 rounds)


@dataclass(eq=False)
class ExecItem:
    """One kernel to run: its AST and the buffers its DEFINE_GLOBALs refer to; the first `outs` are written."""

    ast: UOp
    bufs: list[Buffer]
    outs: int = 1


@dataclass(eq=False)
class LoopItem:
    """A FOLD: `body` run `length` times. Before the loop each `carry` buffer gets its `carry0`; at step k, each `x`
    is row k of its `xs`, the body writes `out` (each carry's next value, then the step's y), the carries get theirs
    (no copy where the body leaves a carry as it is) and the y goes to row k of `result` after the carries' C
    elements; after the loop `result` starts with the final carries."""

    length: int
    body: list[ExecItem | LoopItem]
    carry0: list[Buffer]
    xs: list[Buffer]
    carry: list[Buffer]
    x: list[Buffer]
    out: list[Buffer]
    result: Buffer

    @property
    def carry_size(self) -> int: return sum(b.size for b in self.carry)

    @property
    def y_size(self) -> int: return self.out[-1].size

    @property
    def bufs(self) -> list[Buffer]:
        """Every buffer the loop touches, the `outs` it writes first (the plan sorts buffers by this)."""
        return unique([*self.written(), *self.read()])

    @property
    def outs(self) -> int: return len(unique(self.written()))

    def written(self) -> list[Buffer]:
        return [self.result, *self.carry, *self.x] + [b for item in self.body for b in item.bufs[:item.outs]]

    def read(self) -> list[Buffer]:
        return [*self.carry0, *self.xs, *self.out] + [b for item in self.body for b in item.bufs[item.outs:]]


def unique(bufs: Sequence[Buffer]) -> list[Buffer]:
    return list({id(b): b for b in bufs}.values())


def kernels(items: Sequence[ExecItem | LoopItem]) -> Iterator[ExecItem]:
    """The kernels of a schedule, those inside loops too, in order."""
    for item in items:
        if isinstance(item, LoopItem): yield from kernels(item.body)
        else: yield item


def is_constant(u: UOp) -> bool:
    """The node is a constant, reshaped or broadcast: cheaper made again by a kernel than read from a buffer."""
    while u.op in GroupOp.Movement or u.op is Ops.DETACH: u = u.src[0]
    return u.op is Ops.CONST


def is_buffer_view(u: UOp) -> bool:
    """The node reads a whole buffer in order (the buffer, reshaped any number of times): no kernel needed."""
    while u.op is Ops.RESHAPE: u = u.src[0]
    return u.op is Ops.BUFFER


def fused_cost(order: dict[UOp, None]) -> tuple[dict[UOp, int], dict[UOp, bool]]:
    """ALU ops a value costs to recompute (transcendentals count 4), and whether a transcendental is among them;
    both stop at buffers and reductions."""
    cost: dict[UOp, int] = {}
    dear: dict[UOp, bool] = {}
    for u in order:
        below = [s for s in u.src if s.op not in (Ops.REDUCE_AXIS, Ops.CONTIGUOUS, Ops.BUFFER)]
        cost[u] = (4 if u.op in GroupOp.Transcendental else 1 if u.op in GroupOp.Elementwise else 0) + \
            sum(cost[s] for s in below)
        dear[u] = u.op in GroupOp.Transcendental or any(dear[s] for s in below)
    return cost, dear


CUT_EVERY = 1000  # ALU ops: a longer chain is stored at every multiple of this depth and runs as several kernels.
# C compilers take time quadratic in a function's length beyond a few thousand statements (gcc 12 -O2 on a
# recurrence's gradient: 2500 lines 0.8 s, 10000 lines 11 s of CPU, most in register allocation). 1000 leaves whole
# the deepest kernels of ordinary programs (random numbers ~80, the cart-pole's 10 RK4 steps with their jacobians 876)


def cut_deep_chains(order: dict[UOp, None], realized: set[UOp]) -> set[UOp]:
    """The elementwise nodes to store so that kernels stay short: those at a depth that is a multiple of CUT_EVERY
    (counted from the buffers, over the whole graph), where their kernel has at least half that depth; and any at
    twice that depth within its kernel. A chain of 10^5 ops becomes 100 kernels (alike ones compile once) instead of
    one function no compiler finishes.

    Depths over the whole graph put the cuts of every chain at the same places: a recurrence's gradient reads each
    step's value, and a kernel of its backward pass recomputes those it reads from the last stored one, at most
    CUT_EVERY ops before. Cuts counted within kernels alone would store a forward value up to 2 * CUT_EVERY ops
    below, leaving the backward chain no depth of its own: a kernel per step, each recomputing the forward pass."""
    level: dict[UOp, int] = {}  # ALU ops on the longest path down to a buffer
    depth: dict[UOp, int] = {}  # the same within the node's kernel
    cuts: set[UOp] = set()
    for u in order:
        alu = 4 if u.op in GroupOp.Transcendental else int(u.op in GroupOp.Elementwise)  # (as fused_cost counts)
        below = max((level[s] for s in u.src if s not in realized), default=0)
        level[u] = below + alu
        depth[u] = d = max((depth[s] for s in u.src if s not in realized and s not in cuts), default=0) + alu
        crossed = level[u] // CUT_EVERY > below // CUT_EVERY  # the first node past a multiple on its path
        if alu and u not in realized and (d >= 2 * CUT_EVERY or crossed and d >= CUT_EVERY // 2):
            cuts.add(u)
    return cuts


SPLIT_REDUCE = 1 << 15  # elements per result above which a reduction to few (< SPLITS[0]) results has two stages
SPLITS = (256, 128, 64, 32, 16, 8)  # partial results of the first stage: enough for every core, few to add up


def split_reduce(x: UOp) -> UOp | None:
    """A reduction of many elements to a few results in two stages: partial results over SPLITS chunks of the
    outermost reduced axis they divide (a kernel with an output axis, so every core takes some, each streaming its
    own part of memory), stored, then reduced. Float sums round differently, as they already do in vector lanes."""
    src, (op, axes) = x.src[0], x.arg
    if not all(isinstance(s, int) for s in src.shape): return None
    count = prod(src.shape[a] for a in axes)
    if count < SPLIT_REDUCE or max_count(x.shape) >= SPLITS[0]: return None  # (so a first stage is never split again)
    found = next(((a, n) for a in sorted(axes) for n in SPLITS if src.shape[a] % n == 0 and src.shape[a] > n), None)
    if found is None: return None
    axis, split = found
    size = src.shape[axis]
    shape = src.shape[:axis] + (split, size // split) + src.shape[axis + 1:]
    inner = tuple(a + (a >= axis) for a in axes)  # the chunk's own elements: the split axis's inner half
    partial = UOp(Ops.REDUCE_AXIS, x.dtype, (UOp(Ops.RESHAPE, src.dtype, (src,), shape),), (op, inner))
    total = UOp(Ops.REDUCE_AXIS, x.dtype, (UOp(Ops.CONTIGUOUS, x.dtype, (partial,)),), (op, (axis,)))
    return UOp(Ops.RESHAPE, x.dtype, (total,), x.shape)


# before fusion: reductions split, and a custom_vjp node is its value (its pull was the gradient's business)
pm_prepare = PatternMatcher([(UPat(Ops.REDUCE_AXIS, name="x"), split_reduce),
                             (UPat(Ops.VJP, name="x"), lambda x: x.src[0])])


CHAIN_LIMIT = 64  # nodes searched below a broadcast value for the reduction it ends on


def is_chain_op(n: UOp) -> bool:
    return n.op in GroupOp.Elementwise or (n.op in GroupOp.Movement and n.op is not Ops.EXPAND)


def ends_on_private_reduce(u: UOp, consumers: dict[UOp, list[UOp]]) -> bool:
    """u is computed elementwise (views allowed) from a reduction, and nothing else reads the reduction or the
    values between it and u.

    Storing u instead of the reduction costs the same and fuses the chain (relu(x @ w + b)) into the reduce kernel,
    instead of recomputing it for every element the broadcast makes. Only chains of up to CHAIN_LIMIT nodes are
    searched, so that the scheduler stays linear in the graph (a long chain gains little from the move)."""
    seen, stack = {u}, [u]
    while stack:
        n = stack.pop()
        if n is not u and (n.op is Ops.REDUCE_AXIS or not is_chain_op(n)): continue
        for s in n.src:
            if s in seen: continue
            if len(seen) >= CHAIN_LIMIT: return False
            seen.add(s)
            stack.append(s)
    chain = [n for n in u.toposort(descend=lambda n: n is u or is_chain_op(n))]
    reaches: dict[UOp, bool] = {}  # the node lies on a path from u down to a reduction
    for n in chain:
        reaches[n] = n.op is Ops.REDUCE_AXIS or (n.op is not Ops.REDUCE_AXIS and any(reaches.get(s, False)
                                                                                       for s in n.src))
    if not any(n.op is Ops.REDUCE_AXIS for n in chain if reaches[n]): return False
    inside = {n for n in chain if reaches[n]}
    return all(c in inside for n in inside if n is not u for c in consumers[n])


def unrolled_stores(u: UOp) -> int | None:
    """How many scalar STOREs rangeify writes u's value with when it unrolls every axis (None: some axis loops)."""
    value = u.src[0] if u.op is Ops.CONTIGUOUS else u
    unrolled = branching_axes(value, u.shape)
    return max_count(u.shape) if all(s == 1 or a in unrolled for a, s in enumerate(u.shape)) else None


def scalar_program(outputs: list[UOp], consumers: dict[UOp, list[UOp]], realized: set[UOp]) -> list[UOp]:
    """The outputs computed together by one kernel, a straight-line program with one STORE per element: those
    stored without a loop, read by no other kernel, within STRAIGHT_UNROLL * UNROLL stores in all (none, unless
    two qualify).

    A small function's outputs (a rollout, its jacobians) share most of their work: in one kernel the shared
    values are computed once (the graph is hash-consed) instead of stored by kernels of their own. Apart, a value
    two kernels read is stored, its sources are then read by two kernels and stored, and so on down the graph: a
    7x7 solve's jacobian by both arguments (two 7 x 7 outputs) was 301 kernels, together it is one."""
    budget = UNROLL.value * STRAIGHT_UNROLL
    small = [u for u in dict.fromkeys(outputs) if u in realized and 0 < max_count(u.shape) <= budget and
             not is_symbolic(u.shape) and all(c.op is Ops.SINK for c in consumers[u])]
    if len(small) < 2: return []  # the common case: no graph walk at all
    group, stores = [], 0
    for u in small:
        if (n := unrolled_stores(u)) and stores + n <= budget: group, stores = [*group, u], stores + n
    return group if len(group) > 1 else []


def growth(reader: UOp, u: UOp) -> float:
    """How many times `reader` computes each element of its source u per element of its own (a reduction reads
    each of its terms once; a PAD or a broadcast reads u at more positions than u has)."""
    if reader.op is Ops.REDUCE_AXIS or not all(isinstance(s, int) for s in (*reader.shape, *u.shape)): return 1.0
    return max_count(reader.shape) / max(max_count(u.shape), 1)


def recomputed(times: float, looped: bool, kernels: set[UOp], together: list[UOp], straight: dict[UOp, bool]) -> bool:
    """A value its readers compute `times` times per element (`looped`: in a reduction's loop, `kernels`: the
    realized nodes whose kernels read it) is computed again for positions that hold no value of their own, each
    time looping over all its terms if it is a reduction: a PAD around it (the gradient of x[n] in
    sum(f(x[:n] * x[n])) pads d/dx[n] into the gradient's last element: a loop of n terms for each of n+1
    elements), or a broadcast. Not where only unrolled positions read it: there a padding folds away per position.

    `straight` caches, per realized node, whether its kernel unrolls every output axis (one STORE per element)."""
    if times <= 1 + 1e-9: return False
    if looped: return True
    for k in kernels:
        if k not in straight: straight[k] = k in together or unrolled_stores(k) is not None
        if not straight[k]: return True
    return False


def reduce_terms(root: UOp, realized: set[UOp], memo: dict[UOp, int]) -> int:
    """How many terms the kernel storing `root` sums per output element: its largest fused reduction (1: none)."""
    if root in memo: return memo[root]
    value = root.src[0] if root.op is Ops.CONTIGUOUS else root
    terms = 1
    for n in value.toposort(descend=lambda n: n is value or n not in realized):
        if n.op is Ops.REDUCE_AXIS and (n is value or n not in realized):
            terms = max(terms, max_count(tuple(n.src[0].shape[a] for a in n.arg[1])))
    memo[root] = terms
    return terms


def loop_iterations(k: UOp, memo: dict[UOp, int]) -> int:
    """How many iterations the loops of the kernel storing `k` run: its elements over those of the axes rangeify
    unrolls (a vmapped jacobian's (points, 4, 4): one iteration per point, its 16 entries in straight-line code)."""
    if k not in memo:
        value = k.src[0] if k.op is Ops.CONTIGUOUS else k
        unrolled = branching_axes(value, k.shape)
        memo[k] = max_count(tuple(s for a, s in enumerate(k.shape) if a not in unrolled))
    return memo[k]


def is_cheap_to_recompute(u: UOp, cost: int, times: float, looped: bool, kernels: set[UOp], realized: set[UOp],
                          terms: dict[UOp, int], iterations: dict[UOp, int]) -> bool:
    """A dear broadcast value (see find_realized) costs less computed by each reader than stored by a kernel of its
    own, when the whole schedule is counted:

    - read by kernels whose loops run no more iterations than it has elements, the copies of the broadcast being
      unrolled positions of one iteration (a vmapped jacobian's primal values, each read by the 4 x 4 entries of
      its point): computed once per iteration and shared by them, it is not recomputed at all;
    - read after its readers' reductions (an epilogue: eval BatchNorm's 1/sqrt(var + eps) scaling a convolution),
      each output element computes it once beside a reduction of at least EPILOGUE_SHARE times its ops: a few
      percent of that kernel's work, against a kernel launch and a buffer;
    - read inside a reduction's loop (attention's softmax weights in weights @ v, each weight read by the head's
      d columns), computed once per LOOP_SHARE of its `times` copies (the reader's register tile shares it): the
      copies after the first cost their ops again, per element within STREAM_OPS (what storing the value and
      reading it back cost) or in all within LOOP_RECOMPUTE_WORK (what a kernel of its own costs to launch)."""
    if not looped and kernels and all(loop_iterations(k, iterations) <= max_count(u.shape) for k in kernels):
        return True
    if cost > RECOMPUTE_LIMIT: return False  # a random number's rounds (rand(m, k) @ rand(k, n)) never are
    if not looped: return bool(kernels) and all(reduce_terms(k, realized, terms) >= EPILOGUE_SHARE * cost
                                                for k in kernels)
    again = -(-times // LOOP_SHARE) - 1
    return again * cost <= STREAM_OPS or again * max_count(u.shape) * cost <= LOOP_RECOMPUTE_WORK


def find_realized(outputs: list[UOp]) -> tuple[set[UOp], list[UOp]]:
    """The nodes that get a buffer of their own (outputs, CONTIGUOUS, shared, broadcast or padded reductions, dear
    values), and the outputs that one kernel computes together (see scalar_program)."""
    order = UOp(Ops.SINK, dtypes.void, tuple(outputs)).toposort()
    consumers: dict[UOp, list[UOp]] = {u: [] for u in order}
    for u in order:
        for s in u.src: consumers[s].append(u)
    realized = {u for u in outputs if not is_buffer_view(u)} | {u for u in order if u.op is Ops.CONTIGUOUS}
    for u in order:  # a loop reads its sources from buffers
        if u.op is Ops.FOLD: realized |= {u} | {s for s in u.src if not is_buffer_view(s)}
        if u.op is Ops.SCATTER_ADD:  # stored by loops of its own (codegen/rangeify.store_scatter), which get no opts:
            realized.add(u)  # a reduction in what it adds (a matmul's gradient) is stored first, by a kernel with opts
            if not is_buffer_view(u.src[0]) and any(n.op is Ops.REDUCE_AXIS for n in u.src[0].toposort()):
                realized.add(u.src[0])
    together = scalar_program(outputs, consumers, realized)
    # cuts first, so that the loop below sees their kernels: a dear value read on both sides of a cut is stored once
    # (a jacobian's forward values, read by every later band), not recomputed by each band's kernel
    realized |= cut_deep_chains(order, realized)
    kernel_of = {u: together[0] for u in together}  # a realized node -> the kernel that computes it
    cost, dear = fused_cost(order)
    positional: dict[UOp, bool] = {}  # computed from positions alone, cheaply (INDEX_ARITHMETIC_LIMIT)
    for u in order:
        positional[u] = u.op in (Ops.ARANGE, Ops.CONST, Ops.DEFINE_VAR, Ops.BIND) or \
            ((u.op in GroupOp.Elementwise or u.op in GroupOp.Movement) and not dear[u] and
             cost[u] <= INDEX_ARITHMETIC_LIMIT and all(positional[s] for s in u.src))
    readers: dict[UOp, set[UOp]] = {}  # the realized nodes whose kernels read this value
    broadcast: dict[UOp, bool] = {}  # an EXPAND lies between this value and a kernel that reads it
    spread: dict[UOp, float] = {}  # how many times the kernels reading this value compute each of its elements
    in_loop: dict[UOp, bool] = {}  # a reduction's loop reads this value (computed once per step)
    straight: dict[UOp, bool] = {}  # the kernel of this realized node unrolls every output axis (recomputed)
    terms: dict[UOp, int] = {}  # terms per output element of the reduction a realized node's kernel runs
    iterations: dict[UOp, int] = {}  # iterations of the loops of a realized node's kernel (loop_iterations)
    for u in reversed(order):
        if u.op is Ops.SINK: continue
        kernels: set[UOp] = set()
        expanded = looped = False
        times = 0.0
        for c in consumers[u]:
            if c.op is Ops.SINK: continue
            kernels |= {kernel_of.get(c, c)} if c in realized else readers[c]
            expanded |= c.op is Ops.EXPAND or (c not in realized and broadcast[c])
            looped |= c.op is Ops.REDUCE_AXIS or (c not in realized and in_loop[c])
            times = max(times, (1.0 if c in realized else spread[c]) * growth(c, u))
        if u.op is Ops.REDUCE_AXIS and (expanded or len(kernels) > 1): realized.add(u)
        if u.op in GroupOp.Elementwise and expanded and ends_on_private_reduce(u, consumers): realized.add(u)
        if (u.op is Ops.REDUCE_AXIS or u.op in GroupOp.Elementwise) and not expanded and \
                recomputed(times, looped, kernels, together, straight) and \
                (u.op is Ops.REDUCE_AXIS or ends_on_private_reduce(u, consumers)):
            realized.add(u)  # a reduction (or the chain it ends) stored once, not computed per padded position
        if u.op in GroupOp.Elementwise and expanded and (dear[u] or cost[u] > RECOMPUTE_LIMIT) and \
                max_count(u.shape) > BROADCAST_RECOMPUTE_SIZE and not positional[u] and \
                not is_cheap_to_recompute(u, cost[u], times, looped, kernels, realized, terms, iterations):
            realized.add(u)  # a transcendental or a long chain (a random number's rounds) per copy of a broadcast
            # (forward mode's partials, one per direction; rand(m, k) @ rand(k, n) regenerated per output element)
        if u.op in GroupOp.Elementwise and len(kernels) > 1 and cost[u] > RECOMPUTE_LIMIT and not positional[u]:
            realized.add(u)
        if u.op is Ops.PAD and expanded and max_count(u.shape) > BROADCAST_RECOMPUTE_SIZE and not positional[u] and \
                (len(kernels) > 1 or max_count(u.shape) > PAD_GATE_SIZE or not stride_one_window(u, consumers)):
            realized.add(u)  # stored padded: once for several kernels (a convolution and its weight's gradient),
            # for a strided window (a gather of lanes then needs no gate per lane), or a large input
        readers[u], broadcast[u] = ({u}, False) if u in realized else (kernels, expanded)
        spread[u], in_loop[u] = times, looped
    # cut again over the final set: a node stored above changes the depths within kernels the first cuts counted
    return realized | cut_deep_chains(order, realized), together


def kernel_ast(stores: list[tuple[UOp, UOp]], views: dict[UOp, UOp]) -> tuple[UOp, list[UOp]]:
    """The AST storing each `(node, out)`'s value into buffer `out`, with realized inputs read through their
    buffers, and the BUFFER list (the outputs first). A CONTIGUOUS of a realized value is a copy of its buffer."""
    bufs = [out for _, out in stores]
    nodes = {node for node, _ in stores}
    new: dict[UOp, UOp] = {}

    def global_for(buf: UOp) -> UOp:
        if buf not in bufs: bufs.append(buf)
        return UOp(Ops.DEFINE_GLOBAL, buf.dtype.ptr(buf.arg.size), arg=bufs.index(buf))

    values = [node.src[0] if node.op is Ops.CONTIGUOUS else node for node, _ in stores]
    for u in UOp(Ops.SINK, dtypes.void, tuple(values)).toposort(descend=lambda n: n in nodes or n not in views):
        if u.op is Ops.SINK: continue
        if u not in nodes and u in views:
            view = views[u]
            new[u] = UOp(Ops.RESHAPE, u.dtype, (global_for(view.src[0]),), view.arg)
        elif u.op is Ops.BUFFER: new[u] = global_for(u)
        else: new[u] = u.replace(src=tuple(new[s] for s in u.src))
    return UOp(Ops.SINK, dtypes.void, tuple(
        UOp(Ops.STORE, dtypes.void, (UOp(Ops.RESHAPE, out.dtype, (global_for(out),), node.shape), new[value]))
        for (node, out), value in zip(stores, values, strict=True))), bufs


# What earlier realizations computed: a node -> the view of the buffer holding its value. Weak: an entry lives as
# long as some graph still refers to the node, so a later schedule reads the buffer instead of computing again.
computed: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()


def use_computed(ctx: weakref.WeakKeyDictionary[UOp, UOp], x: UOp) -> UOp | None:
    return ctx.get(x)


pm_use_computed = PatternMatcher([(UPat(name="x"), use_computed)])


def view_buffer(view: UOp) -> Buffer:
    """The buffer a buffer view (a BUFFER reshaped) reads."""
    while view.op is Ops.RESHAPE: view = view.src[0]
    return buffer_of(view)


def loop_item(u: UOp, result: UOp, views: dict[UOp, UOp], device: str) -> LoopItem:
    """The LoopItem of FOLD u storing into `result`: its body scheduled once, reading the params' buffers."""
    a = u.arg
    carry0, xs, params = fold_parts(u)
    outs = body_with(a, a.carry, a.x, [views.get(p, p) for p in params])
    body, body_views = create_schedule(outs, device)
    return LoopItem(a.length, body, [view_buffer(views.get(c, c)) for c in carry0],
                    [view_buffer(views.get(x, x)) for x in xs], [view_buffer(c) for c in a.carry],
                    [view_buffer(x) for x in a.x], [view_buffer(body_views[o]) for o in outs], buffer_of(result))


def create_schedule(outputs: list[UOp], device: str) -> tuple[list[ExecItem | LoopItem], dict[UOp, UOp]]:
    """The kernels that realize `outputs`, in a valid order, and the buffer view of every node they store.

    Nodes an earlier run already stored (see `computed`) are read from their buffers, not recomputed."""
    requested = outputs
    if computed:
        sink = graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(outputs)), pm_use_computed, ctx=computed, bottom_up=True)
        outputs = list(sink.src)
    sink = UOp(Ops.SINK, dtypes.void, tuple(outputs))
    if (shared := share_folds(sink)) is not sink: outputs, sink = list(shared.src), shared  # (read from a replay)
    moved: dict[UOp, UOp] = {}  # (a rewrite of a graph without such a reduction would only cost time)
    if any(u.op is Ops.VJP or (u.op is Ops.REDUCE_AXIS and split_reduce(u) is not None) for u in sink.toposort()):
        moved = graph_rewrite_map(sink, pm_prepare)
        outputs = [moved[u] for u in outputs]
    realized, together = find_realized(outputs)
    order = UOp(Ops.SINK, dtypes.void, tuple(outputs)).toposort()
    views: dict[UOp, UOp] = {}
    items: list[ExecItem | LoopItem] = []
    pending: list[tuple[UOp, UOp]] = []  # members of the scalar program seen so far; it runs after the last one
    for u in order:
        if u not in realized: continue
        buf = buffer_uop(Buffer(device, max_count(u.shape), u.dtype))
        views[u] = UOp(Ops.RESHAPE, u.dtype, (buf,), u.shape)
        if max_count(u.shape) == 0: continue  # nothing to compute
        if u.op is Ops.FOLD:
            items.append(loop_item(u, buf, views, device))
            continue
        stores = [(u, buf)]
        if u in together:
            pending.append((u, buf))
            if len(pending) < len(together): continue
            stores = pending
        ast, bufs = kernel_ast(stores, views)
        item = ExecItem(ast, [buffer_of(b) for b in bufs], len(stores))
        if strangers := sorted({b.device for b in item.bufs} - {device}):
            raise DeviceError(f"schedule: a kernel on {device} reads a buffer on {', '.join(strangers)}; move the "
                              f"tensor with .to({device!r}) first")
        items.append(item)
    views |= {old: views[new] for old, new in moved.items() if new in views}  # the graph as the caller holds it
    return items, views | {req: views.get(out, out) for req, out in zip(requested, outputs, strict=True)}

