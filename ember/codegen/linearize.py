"""Linearize: order a lowered kernel graph into the flat list a renderer walks. The last stage before render.

Before: a SINK whose loops are RANGE ... END pairs (see lowerer.py); the graph says only what depends on what.
After:  a list of UOps where every node follows its sources, each RANGE comes before everything inside its loop,
        its END right after the last of them, and loops nest properly.

How: a node belongs to the innermost loop among the RANGEs it depends on (so loop-invariant code is hoisted out of
loops by construction), and a RANGE belongs to the innermost loop around its END. That makes a tree of blocks.
Each block is ordered on its own: its nodes and its child loops (each one item: RANGE, body, END) sorted
topologically, ties broken by the graph's own order, which keeps the output deterministic.
"""

from __future__ import annotations

import heapq

from ember.uop.ops import Ops, UOp

Block = UOp | None  # a RANGE, or None for the kernel's top level


def _innermost(ranges: tuple[UOp, ...] | list[UOp]) -> Block:
    return max(ranges, key=lambda r: r.arg.axis, default=None)


def linearize(sink: UOp) -> list[UOp]:
    """The kernel as an ordered list of UOps (see the module docstring)."""
    order = list(sink.toposort())
    position = {u: i for i, u in enumerate(order)}
    end_of = {u.src[1]: u for u in order if u.op is Ops.END}
    block: dict[UOp, Block] = {}
    parent: dict[UOp, Block] = {}  # RANGE -> the block its loop sits in
    for u in order:
        if u.op is Ops.RANGE:
            end = end_of[u]
            parent[u] = _innermost([r for r in end.ranges if r is not u])
            block[u] = parent[u]
        elif u.op is Ops.END: block[u] = u.src[1]  # an END is the last item of its own loop
        else: block[u] = _innermost(u.ranges)

    def item_in(node: UOp, target: Block) -> UOp | None:
        """What stands for `node` among the items of block `target`: itself, or the child loop that holds it."""
        b: Block = node if node.op is Ops.RANGE else block[node]
        if node.op is not Ops.RANGE and b is target: return node
        while b is not None:
            if parent[b] is target: return b
            b = parent[b]
        return None

    items: dict[Block, list[UOp]] = {}
    for u in order:
        if u.op is Ops.END: continue
        items.setdefault(block[u] if u.op is not Ops.RANGE else parent[u], []).append(u)
    deps: dict[UOp, set[UOp]] = {u: set() for u in order}
    for u in order:
        for s in u.src:
            # the edge s -> u lives in the deepest block that holds both, between the items that contain them
            for target in (block[s] if s.op is not Ops.RANGE else parent[s], block[u]):
                a, b = item_in(s, target), item_in(u, target)
                if a is not None and b is not None and a is not b:
                    deps[b].add(a)
                    break

    out: list[UOp] = []

    def emit(target: Block) -> None:
        members = items.get(target, [])
        member_set = set(members)
        pending = {m: len(deps[m] & member_set) for m in members}
        users: dict[UOp, list[UOp]] = {m: [] for m in members}
        for m in members:
            for d in deps[m]:
                if d in users: users[d].append(m)
        ready = [(position[m], m) for m in members if pending[m] == 0]
        heapq.heapify(ready)
        while ready:
            _, m = heapq.heappop(ready)
            out.append(m)
            if m.op is Ops.RANGE:
                emit(m)
                out.append(end_of[m])
            for user in users[m]:
                pending[user] -= 1
                if pending[user] == 0: heapq.heappush(ready, (position[user], user))
        assert all(v == 0 for v in pending.values()), "linearize: a cycle between items of a block"

    emit(None)
    return out
