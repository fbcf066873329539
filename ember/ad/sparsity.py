"""Sparsity patterns of derivatives, found from the graph, and the colorings that compress them.

`dependencies(root, leaf)` says which elements of `leaf` each element of `root` depends on through a path of
differentiable ops: the pattern of d root / d leaf, never missing a nonzero (it may hold structural ones whose
value happens to be 0). It is propagated through the tensor-level graph with numpy, one boolean array of shape
(*node.shape, block) per node, `block` leaf elements at a time so the memory stays bounded. Comparisons, integer
ops and a WHERE's condition carry no dependency: their derivative is 0.

Colorings (Gebremedhin, Manne and Pothen, "What color is your Jacobian?", SIAM Review 2005):
- `color_columns`: columns that share no row get one color (distance-2 coloring of the bipartite graph); a
  jacobian is then one forward direction per color. `color_rows` is the same on the transpose, for reverse mode.
- `star_coloring`: a symmetric matrix's columns colored so that every path on four vertices uses at least three
  colors; each nonzero of the hessian can then be read directly from one of the compressed products.
Both are greedy, in natural order and in largest-degree-first order, keeping the one with fewer colors: a
banded matrix of band width w gets w colors, an arrowhead 2 wherever its hub variable is.
- `lattice_coloring`: a stencil (`stencil_offsets`: a map of a grid to itself whose pattern is one set of offsets
  moved over the grid) gets colors `(a . p) % m` of the grid position p. Greedy order gives the 2-D 5-point stencil
  7 colors; a lattice gives it 5, the fewest possible (a row's 5 nonzeros need 5), and a color computed from p,
  which lets the derivative's code fold the seeds away (ad/sparse.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from ember.dtype import dtypes
from ember.export.interpreter import apply_movement
from ember.uop.fold import fold_parts
from ember.uop.ops import GroupOp, Ops, UOp

BLOCK_ELEMENTS = 1 << 24  # booleans held per node while propagating
STENCIL_OFFSETS = 125  # the most offsets a stencil may have (5 x 5 x 5): more, and its lattice search is too long


def dependencies(root: UOp, leaf: UOp, inputs: set[UOp]) -> np.ndarray:
    """(root.numel, leaf.numel) booleans: element i of root depends on element j of leaf. `inputs` are the
    function's other inputs (their values are unknown, so an index read from them could be anything)."""
    n, m = int(np.prod(leaf.shape)), int(np.prod(root.shape))
    order = [u for u in root.toposort() if u.op is not Ops.SINK]
    widest = max(int(np.prod(u.shape)) for u in order)
    block = max(1, min(n, BLOCK_ELEMENTS // max(widest, 1)))
    out = np.zeros((m, n), dtype=bool)
    for start in range(0, n, block):
        cols = min(block, n - start)
        seed = np.zeros((n, cols), dtype=bool)
        seed[start + np.arange(cols), np.arange(cols)] = True
        deps: dict[UOp, np.ndarray | None] = {leaf: seed.reshape(*leaf.shape, cols)}
        for u in order:
            if u not in deps: deps[u] = _propagate(u, [deps[s] for s in u.src], cols, inputs)
        if (d := deps[root]) is not None: out[:, start:start + cols] = d.reshape(m, cols)
    return out


NO_DERIVATIVE = GroupOp.Comparison | {Ops.TRUNC, Ops.IDIV, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.DETACH}


def _propagate(u: UOp, srcs: list[np.ndarray | None], cols: int, inputs: set[UOp]) -> np.ndarray | None:
    """The dependency array of u from its sources' (None: depends on nothing)."""
    if all(s is None for s in srcs) or u.op in NO_DERIVATIVE or not u.dtype.is_float: return None
    x = srcs[0]
    if u.op is Ops.VJP: return x  # depends as its value does
    if u.op is Ops.WHERE: srcs = srcs[1:]
    if u.op in GroupOp.Elementwise or u.op in (Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.COPY):
        present = [s for s in srcs if s is not None]
        return present[0] if len(present) == 1 else np.logical_or.reduce(present)
    if u.op is Ops.FOLD: return _fold(u, srcs, cols, inputs)
    assert x is not None
    if u.op in GroupOp.Movement: return apply_movement(u, x, trailing=1)
    if u.op is Ops.REDUCE_AXIS: return x.any(axis=u.arg[1], keepdims=True)
    if u.op is Ops.GATHER: return _gather(u, x, inputs)
    if u.op is Ops.SCATTER_ADD: return _scatter_add(u, x, inputs)
    raise NotImplementedError(f"sparsity: no rule for {u.op.name}")


def _fold(u: UOp, srcs: list[np.ndarray | None], cols: int, inputs: set[UOp]) -> np.ndarray:
    """A FOLD's dependencies: the body's propagated once per step, the carries' patterns carried along."""
    a = u.arg
    c, y = a.carry_size, a.y_size
    carry0, xs, params = fold_parts(u)
    known = dict(zip(u.src, srcs, strict=True))
    seeds: dict[UOp, np.ndarray | None] = {ph: known[p] for ph, p in zip(a.params, params, strict=True)}
    held = set(a.carry) | set(a.x)
    sink = UOp(Ops.SINK, dtypes.void, a.out)
    order = [n for n in sink.toposort(descend=lambda n: n not in seeds and n not in held) if n is not sink]
    inside = inputs | held | set(a.params)
    empty = np.zeros((0, cols), dtype=bool)
    carries = [known[s] for s in carry0]
    out = np.zeros((c + a.length * y, cols), dtype=bool)
    for k in range(a.length):
        deps = dict(seeds)
        deps.update(zip(a.carry, carries, strict=True))
        deps.update((x, None if known[r] is None else known[r][k]) for x, r in zip(a.x, xs, strict=True))
        for n in order:
            if n not in deps: deps[n] = _propagate(n, [deps[s] for s in n.src], cols, inside)
        carries = [deps[o] for o in a.out[:-1]]
        if (step_y := deps[a.out[-1]]) is not None: out[c + k * y:c + (k + 1) * y] = step_y
    out[:c] = np.concatenate([x if x is not None else np.zeros((ph.shape[0], cols), dtype=bool)
                              for x, ph in zip(carries, a.carry, strict=True)] or [empty])
    return out


def _gather(u: UOp, x: np.ndarray, inputs: set[UOp]) -> np.ndarray:
    """A read at known indices depends on what it reads; at indices computed from inputs, on the whole axis."""
    idx, a = u.src[1], u.arg
    if any(n in inputs for n in idx.toposort()):
        whole = x.any(axis=a, keepdims=True)
        return np.broadcast_to(whole.reshape(x.shape[:a] + (1,) * len(idx.shape) + x.shape[a + 1:]),
                               (*u.shape, x.shape[-1]))
    from ember.device import Device
    from ember.tensor import Tensor
    at = Tensor._from_uop(idx, Device.DEFAULT).cast(dtypes.int64).numpy()
    inside = (at >= 0) & (at < x.shape[a])
    taken = np.take(x, np.where(inside, at, 0), axis=a)
    mask = inside.reshape((1,) * a + at.shape + (1,) * (x.ndim - a - 1))
    return taken & mask


def _scatter_add(u: UOp, x: np.ndarray, inputs: set[UOp]) -> np.ndarray:
    """A position depends on every element added at it: those whose index holds it, when the indices are known;
    all of them, when the indices are computed from inputs."""
    idx, a, n = u.src[1], u.arg.axis, u.arg.size
    k = len(idx.shape)
    rows = np.moveaxis(x.reshape(x.shape[:a] + (-1,) + x.shape[a + k:]), a, 0)  # (index, lead, trail, cols)
    if any(m in inputs for m in idx.toposort()):
        return np.broadcast_to(np.expand_dims(rows.any(axis=0), a), (*u.shape, x.shape[-1]))
    from ember.device import Device
    from ember.tensor import Tensor
    at = Tensor._from_uop(idx, Device.DEFAULT).cast(dtypes.int64).numpy().reshape(-1)
    inside = (at >= 0) & (at < n)
    out = np.zeros((n,) + rows.shape[1:], dtype=bool)
    np.logical_or.at(out, at[inside], rows[inside])
    return np.moveaxis(out, 0, a)


# ---- colorings -------------------------------------------------------------------------------------------------


def color_columns(pattern: np.ndarray) -> np.ndarray:
    """A color per column such that two columns with a nonzero in the same row differ (greedy, in natural order
    and in largest-first order, the one with fewer colors kept)."""
    rows_of = [np.flatnonzero(c) for c in pattern.T]
    cols_of = [np.flatnonzero(r) for r in pattern]

    def greedy(order: list[int]) -> np.ndarray:
        colors = np.full(pattern.shape[1], -1, dtype=np.int64)
        for j in order:
            taken = {int(colors[k]) for i in rows_of[j] for k in cols_of[i]}
            colors[j] = _smallest_free(taken)
        return colors
    conflicts = [sum(len(cols_of[i]) for i in rows) for rows in rows_of]
    return fewest_colors([greedy(order) for order in vertex_orders(conflicts)])


def color_rows(pattern: np.ndarray) -> np.ndarray:
    return color_columns(pattern.T)


def translate_colorings(pattern: np.ndarray, periods: range) -> Iterator[np.ndarray]:
    """For each period p, a column coloring in which column j + p has column j's color wherever it is j's
    translate (its rows are j's moved by one offset): greedy over the classes those pairs join, smallest free
    color first, first member first; none for a p whose class would hold two columns that share a row.

    A multiple-shooting problem's defects are such translates from interval to interval, except where a run of
    intervals ends. Greedy over single columns gives the first and last interval other colors than the middle
    (it meets them before their neighbours in the next run), and those exceptions cost the derivative's loop over
    the intervals peeled steps and a gate per seed; colored by class, every run repeats one table."""
    n = pattern.shape[1]
    rows_of = [np.flatnonzero(c) for c in pattern.T]
    cols_of = [np.flatnonzero(r) for r in pattern]
    for p in periods:
        classes = list(range(n))  # each column's class: its first member
        for j in range(n - p):
            a, b = rows_of[j], rows_of[j + p]
            if len(a) and len(a) == len(b) and np.array_equal(b - b[0], a - a[0]): classes[j + p] = classes[j]
        if any(len({classes[j] for j in cols}) < len(cols) for cols in cols_of): continue  # a class shares a row
        conflicts: dict[int, set[int]] = {c: set() for c in classes}
        for cols in cols_of:
            for j in cols: conflicts[classes[j]].update(classes[k] for k in cols)
        color: dict[int, int] = {}
        for c in sorted(conflicts):
            color[c] = _smallest_free({color[k] for k in conflicts[c] if k in color})
        yield np.array([color[c] for c in classes], dtype=np.int64)


def vertex_orders(degrees: list[int]) -> list[list[int]]:
    """The orders a greedy coloring tries: natural (best for banded patterns) and largest degree first (a hub
    variable colored first: an arrowhead's hub last gave n colors instead of 2)."""
    natural = list(range(len(degrees)))
    return [natural, sorted(natural, key=lambda v: -degrees[v])]


def fewest_colors(colorings: list[np.ndarray]) -> np.ndarray:
    return min(colorings, key=lambda c: int(c.max(initial=-1)))


def star_coloring(pattern: np.ndarray) -> np.ndarray:
    """A star coloring of the symmetric pattern's adjacency graph (the diagonal is not an edge): a proper coloring
    in which every path of four vertices has three colors (greedy, Gebremedhin et al. 2005, algorithm 4.1, in the
    orders of vertex_orders, the one with fewer colors kept)."""
    n = pattern.shape[0]
    adj = [np.flatnonzero(pattern[v] & (np.arange(n) != v)) for v in range(n)]

    def greedy(order: list[int]) -> np.ndarray:
        colors = np.full(n, -1, dtype=np.int64)
        for v in order:
            taken: set[int] = set()
            for w in adj[v]:
                if colors[w] >= 0: taken.add(int(colors[w]))
                for x in adj[w]:
                    if x == v or colors[x] < 0: continue
                    if colors[w] < 0: taken.add(int(colors[x]))  # v-w-x: v must not repeat x's color around w
                    elif any(colors[y] == colors[w] for y in adj[x] if y != w):
                        taken.add(int(colors[x]))  # v-w-x-y, y colored like w: v like x makes a 2-colored path
            colors[v] = _smallest_free(taken)
        return colors
    return fewest_colors([greedy(order) for order in vertex_orders([len(a) for a in adj])])


def _smallest_free(taken: set[int]) -> int:
    c = 0
    while c in taken: c += 1
    return c


def star_recovery(pattern: np.ndarray, colors: np.ndarray) -> np.ndarray:
    """For each nonzero (i, j) of the symmetric pattern in column-major order, where its value lies in the
    compressed products T (colors, n), T[c, i] = sum of H[i, j] over the columns j of color c: a flat index into T.
    H[i, j] is T[color j, i] when j is the only column of its color in row i, else T[color i, j] (star coloring
    guarantees one of the two)."""
    n = pattern.shape[0]
    cols, rows = np.nonzero(pattern.T)  # column-major: sorted by column, then row
    where = np.empty(len(rows), dtype=np.int64)
    for k, (i, j) in enumerate(zip(rows, cols, strict=True)):
        if np.count_nonzero(colors[pattern[i]] == colors[j]) == 1: where[k] = colors[j] * n + i
        elif np.count_nonzero(colors[pattern[j]] == colors[i]) == 1: where[k] = colors[i] * n + j
        else: raise AssertionError(f"star coloring cannot recover H[{i}, {j}]")
    return where


def stencil_offsets(pattern: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """The offsets (row - column as grid positions, one per row of the result, sorted as flat offsets) when
    `pattern` is the jacobian pattern of a map from a grid of `shape` to itself in which entry (r, c) is nonzero
    exactly where r - c is one of them and both lie in the grid (a stencil with zero boundary). Else None."""
    n = int(np.prod(shape))
    if pattern.shape != (n, n) or not pattern.any(): return None
    rows, cols = np.nonzero(pattern)
    offsets = np.unique(np.stack(np.unravel_index(rows, shape), 1) - np.stack(np.unravel_index(cols, shape), 1), axis=0)
    if len(offsets) > STENCIL_OFFSETS: return None
    # every nonzero is at one of the offsets: the pattern is all of them exactly when the counts agree
    room = sum(int(np.prod([s - abs(o) for s, o in zip(shape, off, strict=True)])) for off in offsets)
    if room != len(rows): return None
    strides = np.array([int(np.prod(shape[d + 1:])) for d in range(len(shape))])
    return offsets[np.argsort(offsets @ strides, kind="stable")]


def lattice_coloring(offsets: np.ndarray, limit: int) -> tuple[np.ndarray, int] | None:
    """(a, m) with m < limit as small as possible such that the colors `(a . p) % m` of the grid positions p are a
    column coloring of the stencil: two columns p, q sharing a row (q - p a difference of two offsets) differ, that
    is a . (q - p) is no multiple of m. Else None. m starts at the number of offsets, the fewest any coloring has."""
    differences = np.unique((offsets[:, None] - offsets[None]).reshape(-1, offsets.shape[1]), axis=0)
    differences = differences[np.any(differences != 0, axis=1)]
    for m in range(len(offsets), limit):
        candidates = np.array(list(itertools.product(range(m), repeat=offsets.shape[1])))
        good = np.all((candidates @ differences.T) % m != 0, axis=1)
        if good.any(): return candidates[int(np.argmax(good))], m
    return None
