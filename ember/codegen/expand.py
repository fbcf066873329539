"""Expand: lane ranges (UPCAST, UNROLL) become vector lanes or unrolled copies. After opt.py, before lower.

Before: a kernel from apply_opts, with RANGEs of kind UPCAST (output lanes) and UNROLL (reduce lanes).
After:  no such RANGE. The vector range (the first one applied: the smallest axis id) becomes lanes of vectors,
        `width` at a time (a chunk); every other lane range becomes one copy of the code per value. Each value is
        a vector where the renderer has the op at that type (`Renderer.renders_vector`), else its lanes one by one
        (devectorized: GEP out of vectors, VECTORIZE back where a vector is needed). An access whose offsets are
        consecutive across the lanes is one vector LOAD/STORE, other accesses go lane by lane. A REDUCE becomes one
        per copy, each its own accumulator (a vector one where its value is), combined after the loop; over the
        vector range, the lanes are combined last:

    sum_r x[r] with Opt(UNROLL, 0, 16), width 8
    -> (acc0 = sum_r' x[16r' : 16r'+8]) + (acc1 = sum_r' x[16r'+8 : 16r'+16]), then the 8 lanes added in order.

The REDUCEs of the copies share one loop (lower.py merges loops over the same ranges).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

from ember.codegen.opt import LANE_KINDS, range_size
from ember.dtype import dtypes
from ember.renderer import Renderer
from ember.uop.ops import SERIAL, GroupOp, Ops, UOp
from ember.uop.symbolic import affine_step, lane_symbolic
from ember.uop.upat import graph_rewrite

Lanes = UOp | tuple[UOp, ...]  # a vector UOp, a scalar (the same in every lane), or one scalar per lane


@functools.lru_cache(maxsize=1 << 14)  # bounded: a long-running process builds kernels without end
def simplify(x: UOp) -> UOp:
    """A lane's address or gate simplified, a lane's place in a row of lanes included (a vector of 16 in a head's 64
    columns: (16*o + 3) // 64 = o // 4), so that consecutive lanes are seen to be."""
    return graph_rewrite(x, lane_symbolic)


def split_constant(x: UOp) -> tuple[UOp | None, int]:
    """A simplified integer as (its variable part, its constant term)."""
    if x.op is Ops.CONST: return None, x.arg
    if x.op is Ops.ADD and x.src[1].op is Ops.CONST: return x.src[0], x.src[1].arg
    return x, 0


@dataclass
class Expander:
    """Builds the expanded value of each node under an environment: a value per unrolled range, the first lane of
    the chunk for the vector range."""

    renderer: Renderer
    vector: UOp | None  # the range whose lanes become vector lanes
    width: int  # lanes per chunk
    touched: set[UOp] = field(default_factory=set)  # the nodes a lane range lies under: the rest stay as they are
    memo: dict = field(default_factory=dict)

    def chunks(self) -> range:
        assert self.vector is not None
        return range(0, range_size(self.vector), self.width)

    # ---- lanes ---------------------------------------------------------------------------------------------------

    def as_vector(self, x: Lanes) -> UOp:
        if isinstance(x, tuple): return UOp(Ops.VECTORIZE, x[0].dtype.vec(self.width), x)
        if x.dtype.count > 1: return x
        return UOp(Ops.VECTORIZE, x.dtype.vec(self.width), (x,) * self.width)

    def lane(self, x: Lanes, i: int) -> UOp:
        if isinstance(x, tuple): return x[i]
        if x.dtype.count == 1: return x
        return x.src[i] if x.op is Ops.VECTORIZE else UOp(Ops.GEP, x.dtype.scalar, (x,), i)

    def lanes(self, x: Lanes) -> tuple[UOp, ...]:
        return tuple(self.lane(x, i) for i in range(self.width))

    def is_scalar(self, x: Lanes) -> bool:
        return not isinstance(x, tuple) and x.dtype.count == 1

    def build(self, x: UOp, srcs: list[Lanes]) -> Lanes:
        """`x`'s op over expanded sources: scalar if they all are, a vector op where some source is a vector and the
        renderer has the op, else lane by lane."""
        if x.op is Ops.WHERE and (picked := self.select(*srcs)) is not None: return picked
        if all(self.is_scalar(s) for s in srcs):
            out = x.replace(src=tuple(srcs))  # type: ignore[arg-type]
            return simplify(out) if x.dtype.is_bool and out is not x else out
        # a vector where a source is one, or holds floats lane by lane (after a libm call: back to vectors); integer
        # lanes (addresses from the range's constants) stay scalars, so loads can see they are consecutive
        if any(not self.is_scalar(s) and (not isinstance(s, tuple) or s[0].dtype.is_float) for s in srcs):
            wide = x.replace(dtype=x.dtype.vec(self.width), src=tuple(self.as_vector(s) for s in srcs))
            if self.renderer.renders_vector(wide): return wide
        out = tuple(x.replace(src=tuple(self.lane(s, i) for s in srcs)) for i in range(self.width))
        # boolean lanes (a padding's gate, which the lane's constant position settles: true inside a convolution's
        # row, false at its border) are simplified, and one value when every lane has the same (not every integer
        # op: simplifying each of a random number's rounds would walk all rounds below it, quadratic in them)
        return self.uniform(tuple(simplify(o) for o in out)) if x.dtype.is_bool else out

    def select(self, cond: Lanes, a: Lanes, b: Lanes) -> Lanes | None:
        """WHERE(cond, a, b) without a select where the lanes settle it: a condition the lane's constant position
        makes constant (a padding's gate inside a convolution's row), or a 0 beside a load gated by the same
        condition (which reads 0 where it is false): None where some lane needs the select."""
        def settle(c: UOp, x: UOp, y: UOp) -> UOp | None:
            if c.op is Ops.CONST: return x if c.arg else y
            if y.op is Ops.CONST and y.arg == 0 and x.op is Ops.LOAD and x.src[0].src[2:] == (c,): return x
            return None
        if self.is_scalar(cond) and not isinstance(a, tuple) and not isinstance(b, tuple):
            return settle(cond, a, b)  # type: ignore[arg-type]
        if isinstance(cond, tuple) and not isinstance(a, tuple) and a.op is Ops.LOAD and a.dtype.count > 1 and \
                not isinstance(b, tuple) and b.op is Ops.CONST and b.arg == 0:
            # a vector load reads 0 in the lanes its gates leave out: a select by the same gates keeps it whole
            if all(c is g for c, g in zip(cond, load_gates(a), strict=True)): return a
        if self.is_scalar(cond) and cond.op is not Ops.CONST: return None  # type: ignore[union-attr]
        lanes = [settle(self.lane(cond, i), self.lane(a, i), self.lane(b, i)) for i in range(self.width)]
        return tuple(lanes) if all(v is not None for v in lanes) else None  # type: ignore[arg-type]

    def uniform(self, lanes: tuple[UOp, ...]) -> Lanes:
        """One scalar where every lane holds the same value, else the lanes."""
        return lanes[0] if all(v is lanes[0] for v in lanes) else lanes

    def index(self, x: UOp, env: dict[UOp, int]) -> Lanes:
        """An address or gate expression: one simplified scalar, or one per lane."""
        out = self.value(x, env)
        if self.is_scalar(out): return simplify(out)  # type: ignore[arg-type]
        if self.vector is not None and (step := affine_step(x, self.vector)) is not None:
            # x = f + vector*step: lane i is lane 0 plus i*step, one simplification instead of one per lane
            var, c = split_constant(simplify(self.lane(out, 0)))
            return tuple(UOp.const(x.dtype, c + i * step) if var is None else
                         var + UOp.const(x.dtype, c + i * step) if c + i * step else var for i in range(self.width))
        return self.uniform(tuple(simplify(v) for v in self.lanes(out)))

    def consecutive(self, offsets: Lanes) -> bool:
        if not isinstance(offsets, tuple): return False
        # simplified sums keep their constant last: x + c, x + c + 1, ... needs no simplification of differences
        parts = [split_constant(o) for o in offsets]
        if all(p[0] is parts[0][0] and p[1] == parts[0][1] + i for i, p in enumerate(parts)): return True
        first = offsets[0]
        return all((d := simplify(o - first)).op is Ops.CONST and d.arg == i for i, o in enumerate(offsets))

    # ---- values --------------------------------------------------------------------------------------------------

    def key(self, x: UOp, env: dict[UOp, int]) -> tuple:
        """A node's value depends only on the values of the ranges it lies under."""
        return (x, tuple((r, env[r]) for r in x.ranges if r in env))

    def inputs(self, x: UOp) -> tuple[UOp, ...]:
        """The nodes whose values expand_node reads under the same environment (a REDUCE reads its value under
        environments of its own: reduce() asks for it)."""
        if x.op is Ops.LOAD: return x.src[0].src[1:]
        return x.src if x.op in GroupOp.Elementwise else ()

    def value(self, x: UOp, env: dict[UOp, int]) -> Lanes:
        if x not in self.touched: return x
        if (key := self.key(x, env)) in self.memo: return self.memo[key]
        # inputs before users from an explicit stack: a chain of 10^5 ops must not recurse once per node
        stack: list[tuple[UOp, bool]] = [(x, False)]
        while stack:
            node, ready = stack.pop()
            if (node_key := self.key(node, env)) in self.memo: continue
            if ready:
                self.memo[node_key] = self.expand_node(node, env)
                continue
            stack.append((node, True))
            stack.extend((s, False) for s in self.inputs(node) if s in self.touched)
        return self.memo[key]

    def expand_node(self, x: UOp, env: dict[UOp, int]) -> Lanes:
        if x.op is Ops.RANGE:
            if x is self.vector: return tuple(UOp.const(x.dtype, env[x] + i) for i in range(self.width))
            return UOp.const(x.dtype, env[x])
        if x.op is Ops.LOAD: return self.load(x, env)
        if x.op is Ops.REDUCE: return self.reduce(x, env)
        if x.op in GroupOp.Elementwise: return self.build(x, [self.value(s, env) for s in x.src])
        raise NotImplementedError(f"expand: no rule for {x.op.name} over a lane range")

    def access(self, idx: UOp, env: dict[UOp, int]) -> tuple[Lanes, Lanes | None, bool]:
        """(offsets, gate, whether one vector access does): consecutive offsets under one gate."""
        offsets = self.index(idx.src[1], env)
        gate = self.index(idx.src[2], env) if len(idx.src) > 2 else None
        return offsets, gate, self.consecutive(offsets) and (gate is None or self.is_scalar(gate))

    def at(self, idx: UOp, offsets: Lanes, gate: Lanes | None, i: int | None = None) -> UOp:
        """The INDEX of lane i (or of the first lane, for a vector access)."""
        g = None if gate is None else self.lane(gate, i or 0)
        src = (idx.src[0], self.lane(offsets, i or 0)) + (() if g is None or (g.op is Ops.CONST and g.arg) else (g,))
        return idx.replace(src=src)

    def load(self, x: UOp, env: dict[UOp, int]) -> Lanes:
        offsets, gate, whole = self.access(x.src[0], env)
        if self.is_scalar(offsets) and (gate is None or self.is_scalar(gate)):
            return x.replace(src=(self.at(x.src[0], offsets, gate),))
        if whole:
            wide = UOp(Ops.LOAD, x.dtype.vec(self.width), (self.at(x.src[0], offsets, gate),))
            if self.renderer.renders_vector(wide): return wide
        if (part := self.partial_load(x, offsets, gate)) is not None: return part
        return tuple(x.replace(src=(self.at(x.src[0], offsets, gate, i),)) for i in range(self.width))

    def partial_load(self, x: UOp, offsets: Lanes, gate: Lanes | None) -> UOp | None:
        """One vector load of consecutive offsets under gates that differ from lane to lane (a convolution's window
        over a padding it does not store: the first lane of a row's first vector reads the pad), as
        LOAD(INDEX(buf, first offset), *one gate per lane): lanes whose gate is false read no memory and hold 0.
        None where the renderer has no such load."""
        if not isinstance(gate, tuple) or not self.consecutive(offsets): return None
        if all(g.op is Ops.CONST and not g.arg for g in gate): return None
        wide = UOp(Ops.LOAD, x.dtype.vec(self.width), (self.at(x.src[0], offsets, None), *gate))
        return wide if self.renderer.renders_vector(wide) else None

    def reduce(self, x: UOp, env: dict[UOp, int]) -> Lanes:
        """One REDUCE per vector chunk (its own accumulator: independent sums that overlap) over the loops that
        stay, combined after them. The copies of an unrolled reduce axis are taken in the loop's order by their
        chunk's accumulator (a SERIAL chain): as many accumulators as without the unroll, and the same sum."""
        value, op = x.src[0], x.arg
        loops = tuple(r for r in x.src[1:] if r.arg.kind not in LANE_KINDS)
        copies = sorted((r for r in x.src[1:] if r.arg.kind in LANE_KINDS and r is not self.vector),
                        key=lambda r: r.arg.axis)
        over_lanes = self.vector in x.src[1:]
        parts: list[Lanes] = []
        for chunk in self.chunks() if over_lanes else (None,):
            terms: list[Lanes] = []
            for values in itertools.product(*(range(range_size(r)) for r in copies)):
                inner = {**env, **dict(zip(copies, values, strict=True))}
                if over_lanes: inner[self.vector] = chunk  # type: ignore[index]
                term = self.value(value, inner)
                if isinstance(term, tuple) and term[0].dtype.is_float and not over_lanes:
                    term = self.as_vector(term)  # (gathered lanes: one vector accumulator, not one per lane)
                terms.append((term,) * self.width if over_lanes and self.is_scalar(term) else term)  # type: ignore
            chain = functools.reduce(lambda a, b: self.build(UOp(op, x.dtype, (value, value), SERIAL), [a, b]), terms)
            parts.append(self.reduce_loops(chain, loops, x))
        total = functools.reduce(lambda a, b: self.build(UOp(op, x.dtype, (value, value)), [a, b]), parts)
        if not over_lanes: return total
        return functools.reduce(lambda a, b: UOp(op, x.dtype, (a, b)), self.lanes(total))

    def reduce_loops(self, part: Lanes, loops: tuple[UOp, ...], x: UOp) -> Lanes:
        if not loops: return part
        if isinstance(part, tuple): return tuple(x.replace(src=(p, *loops)) for p in part)
        return x.replace(dtype=part.dtype, src=(part, *loops))

    def store(self, st: UOp) -> list[UOp]:
        idx, value = st.src[0], st.src[1]
        lane_ranges = [r for r in st.ranges if r.arg.kind in LANE_KINDS]
        copies = [r for r in lane_ranges if r is not self.vector]
        out: list[UOp] = []
        for values in itertools.product(*(range(range_size(r)) for r in copies),
                                        self.chunks() if self.vector in lane_ranges else (None,)):
            env = dict(zip(copies, values[:-1], strict=True))
            if values[-1] is not None: env[self.vector] = values[-1]  # type: ignore[index]
            offsets, gate, whole = self.access(idx, env)
            v = self.value(value, env)
            if self.is_scalar(offsets) and (gate is None or self.is_scalar(gate)) and self.is_scalar(v):
                out.append(st.replace(src=(self.at(idx, offsets, gate), v)))  # type: ignore[arg-type]
                continue
            if whole and not value.dtype.is_bool:
                wide = st.replace(src=(self.at(idx, offsets, gate), self.as_vector(v)))
                if self.renderer.renders_vector(wide):
                    out.append(wide)
                    continue
            out += [st.replace(src=(self.at(idx, offsets, gate, i), self.lane(v, i))) for i in range(self.width)
                    if gate is None or (g := self.lane(gate, i)).op is not Ops.CONST or g.arg]  # (a lane past an
        return out  # axis's end, opt.upcast_padded, writes nothing)


def load_gates(load: UOp) -> tuple[UOp, ...]:
    """The gate of each lane of a vector LOAD: its own per lane (partial_load), else its INDEX's (true: none)."""
    if len(load.src) > 1: return load.src[1:]
    idx = load.src[0]
    return (idx.src[2] if len(idx.src) > 2 else UOp.const(dtypes.bool, True),) * load.dtype.count


def vector_width(sink: UOp, vector: UOp, renderer: Renderer) -> int:
    """Lanes per chunk: as many of the kernel's widest element as fill the renderer's vector, at most the range's
    size, a power of two dividing it (1: no vectors, the range unrolls into copies)."""
    widest = max((u.dtype.itemsize for u in sink.toposort() if u.op in (Ops.LOAD, Ops.STORE, Ops.REDUCE)
                  and u.dtype.itemsize), default=4)
    width = max(1, renderer.vector_bytes // widest)
    size = range_size(vector)
    return math.gcd(width, size & -size)


def expand(sink: UOp, renderer: Renderer) -> UOp:
    """The kernel with no lane ranges (see the module docstring)."""
    lane_ranges = sorted({u for u in sink.toposort() if u.op is Ops.RANGE and u.arg.kind in LANE_KINDS},
                         key=lambda r: r.arg.axis)
    if not lane_ranges: return sink
    vector = lane_ranges[0]
    width = vector_width(sink, vector, renderer)
    touched: set[UOp] = set()
    for u in sink.toposort():
        if u in lane_ranges or any(s in touched for s in u.src): touched.add(u)
    expander = Expander(renderer, vector if width > 1 else None, width, touched)
    out: list[UOp] = []
    for s in sink.src: out += expander.store(s) if s.op is Ops.STORE else [s]
    return sink.replace(src=tuple(out))
