"""Eager dispatch: one graph's schedule reused for every later graph of the same structure.

What kernelize makes of a graph follows from its operations, dtypes, shapes, constants and flags, never from which
buffers it reads: `(a + 1).realize()` in a training loop, on new buffers at each step, schedules alike every time.
Scheduling even the smallest graph costs about 100 µs of Python (kernelize, its rewrites), a hundred times what
running the kernel does. So `schedule` keys a graph by its structure with its buffers numbered in order of first use
(`structure`: one walk, about a microsecond per node) and keeps, per key, a `Template`: the kernels' ASTs with
their buffer lists as numbers (an input of the graph, or a new buffer the schedule creates) and which nodes the new
buffers hold. A later graph with that key gets the template's kernels bound to its own buffers and fresh new ones.

Before: the tensor-level graphs to realize (as for kernelize.create_schedule).
After:  the same ExecItems and buffer views create_schedule would return (new buffers, same ASTs in the same order).

Not kept (scheduled by kernelize every time): graphs with a FOLD (their loop body is scheduled with buffers of its
own; rare per step, and cheap next to their loop), and the schedules `make_template` refuses: one reading a buffer
the walk did not see, or an output read through a view of a stored node.

The key holds no UOps but broadcast constants (buffers by number, args by value; a constant's nodes are small and
read no buffer) and a template's ASTs read DEFINE_GLOBALs, so the cache keeps no tensor graph or buffer alive; the
walk's node list, which the template's views index, is the caller's.

Constants that vary become data. A Python scalar is a constant of the graph, and a constant of the kernel, which
folds it (x * 1, x + 0) and writes it into the source: `x * lr` with a new lr at each step would be a new program
per step (a compile of about 240 ms here, a loaded library kept). So the walk keys each constant by its form (its
broadcast, its dtype) apart from its value (`constant_form`), and `history` remembers, per structure, the constants
of its first graph: a later graph whose constant at some position differs marks that position as varying, and from
then on the constant there is a one-element buffer the kernel reads (`parameters`; as the random seed is, in
mixin/random.py), filled with each graph's value; the template is shared by all values. Constants that never
changed stay in the kernel: `x * 2.0` compiles as before, and a varying position costs one more compile (the first
value's kernel) and a 4-byte buffer per call.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ember.device import Buffer, buffer_of, buffer_uop
from ember.dtype import DType, dtypes, to_numpy
from ember.helpers import ContextVar
from ember.schedule.kernelize import ExecItem, LoopItem, computed, create_schedule, is_constant
from ember.uop.ops import BOUND, Ops, UOp, sizes_of

CACHE_SIZE = 4096  # templates kept; the first made goes first


@dataclass(frozen=True)
class Template:
    """A schedule with its buffers as numbers: below `inputs`, the graph's k-th buffer; from it on, new buffer
    k - inputs, of `new[k - inputs]`'s (device, size, dtype)."""

    inputs: int
    new: tuple[tuple[str, int, DType], ...]
    items: tuple[tuple[UOp, tuple[int, ...], int], ...]  # (ast, buffer numbers, outputs written)
    views: tuple[tuple[int, int, DType, tuple], ...]  # (node's place in the walk, new buffer, dtype, shape)


class StructureKey:
    """A graph's structure as `structure` keys it (constants by their form, not their value), hashed once: it keys
    `history` and, with the constants, `templates`, and is long (a node per entry)."""

    __slots__ = ("parts", "hash")

    def __init__(self, parts: tuple) -> None: self.parts, self.hash = parts, hash(parts)
    def __hash__(self) -> int: return self.hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, StructureKey) and self.hash == other.hash and
                                 self.parts == other.parts)


class Graph(NamedTuple):
    """A graph as `structure` walked it: its key, its nodes in post-order and its buffers in order of first use."""

    key: StructureKey
    nodes: list[UOp]
    buffers: list[Buffer]
    stored: bool  # a node stood for by the view of its stored value (what lies below it was not walked)
    bound: bool  # the graph holds a bound variable (looked for once any was bound: ops.BOUND)
    constants: tuple[UOp, ...] = ()  # its broadcast constants in the order walked (their values are not in key)


# (structure, flags' generation, its constants with None where they vary) -> the template; None: the graph is not
# one to keep (see make_template)
templates: dict[tuple[StructureKey, int, tuple], Template | None] = {}
# per structure: the constants of its first graph, and the positions where a later graph's differed (varying)
history: dict[StructureKey, tuple[tuple[UOp, ...], set[int]]] = {}


def structure(outputs: list[UOp], device: str) -> Graph | None:
    """The key of the graph of `outputs` on `device`: each node's op, dtype, arg and sources by their place in the
    walk, a buffer by its number, size and dtype, a node an earlier run stored (kernelize.computed) by the view it
    is read through, a broadcast constant by its form (its node is in `Graph.constants`). None for a graph with a
    FOLD."""
    place: dict[UOp, int] = {}
    nodes: list[UOp] = []
    signature: list[tuple] = []
    constants: list[UOp] = []
    buffers: list[Buffer] = []
    numbers: dict[int, int] = {}  # id(Buffer) -> its number
    # computed.get without its Python frame: a UOp already has a weak reference (the node cache's), which ref()
    # returns again, and the weak dictionary keys by such references
    stored, ref = computed.data.get, weakref.ref
    swapped = False  # a node was walked as the view of its stored value
    look, bound = BOUND[0], False  # (a bound variable: a BIND, or in a RESHAPE's or EXPAND's shape)
    stack: list[UOp] = outputs[::-1]
    BUFFER, FOLD = Ops.BUFFER, Ops.FOLD  # (an enum member read from its class costs more than a local)
    CONST, RESHAPE, EXPAND, BIND, ARANGE, SHRINK = Ops.CONST, Ops.RESHAPE, Ops.EXPAND, Ops.BIND, Ops.ARANGE, Ops.SHRINK
    while stack:  # post-order without recursion: a node stays under its sources until they have places
        u = stack[-1]
        if u in place:
            stack.pop()
            continue
        if ((op := u.op) is CONST or op is EXPAND or op is RESHAPE) and is_constant(u) and not (look and u.bound):
            # a constant, broadcast: its form here, the node itself in the template's key (hash-consed, its identity
            # is its structure; never stored, and kept alive by the key it is in, so the same constant built again
            # is this node)
            entry: tuple = ("const", u.__dict__.get("form") or constant_form(u))
            constants.append(u)
        elif (view := stored(ref(u))) is not None:  # (looked up again when the view is placed: cheaper than a memo)
            if view not in place:
                stack.append(view)
                continue
            entry = ("stored", place[view])
            swapped = True
        else:
            waiting = False
            for s in u.src:
                if s not in place:
                    stack.append(s)
                    waiting = True
            if waiting: continue
            if op is BUFFER:
                buf = u.__dict__["buffer"]  # (buffer_of, inline)
                if (k := numbers.get(id(buf))) is None:
                    k = numbers[id(buf)] = len(buffers)
                    buffers.append(buf)
                entry = ("buffer", k, u.dtype.name, u.dtype.count, buf.device, u.arg.size)  # (the size it is read as)
            elif op is FOLD: return None
            # (a dtype by its name and lanes: strings keep their hash, a DType computes its own at each lookup)
            else:
                arg = u.arg  # (arg_key, inline: a float by its bits)
                if look and (op is BIND or ((op is RESHAPE or op is EXPAND or op is ARANGE or op is SHRINK) and
                                            any(type(s) is UOp for s in sizes_of(u)))):
                    bound = True
                entry = (op, (dtype := u.dtype).name, dtype.count, ("float", arg.hex()) if type(arg) is float else
                         arg, *[place[s] for s in u.src])
        stack.pop()
        place[u] = len(nodes)
        nodes.append(u)
        signature.append(entry)
    return Graph(StructureKey((device, tuple([place[o] for o in outputs]), tuple(signature))),
                 nodes, buffers, swapped, bound, tuple(constants))


def constant_form(u: UOp) -> tuple:
    """What the broadcast constant `u` is but its value: its movement ops with their args down to the CONST, and the
    CONST's dtype; kept on the node (a constant meets the walk once per graph it is in)."""
    form, node = [], u
    while node.op is not Ops.CONST:
        form.append((node.op, node.arg))
        node = node.src[0]
    u.__dict__["form"] = done = (*form, node.dtype.name, node.dtype.count)
    return done


def is_parameter_dtype(dtype: DType) -> bool:
    """A constant of `dtype` can vary as a buffer's value: a scalar number numpy holds exactly (not bool, whose
    constants steer folds such as where(True, a, b); not bfloat16, which numpy has not)."""
    return dtype.count == 1 and (dtype.is_int or (dtype.is_float and dtype is not dtypes.bfloat16))


def varying(graph: Graph) -> list[int]:
    """The positions of graph's constants that have varied among graphs of its structure (this one included), each
    where a constant of a parameter dtype lies; the first graph of a structure is remembered (`history`)."""
    if not graph.constants: return []
    if (seen := history.get(graph.key)) is None:
        if len(history) >= CACHE_SIZE: del history[next(iter(history))]
        history[graph.key] = (graph.constants, set())
        return []
    first, changed = seen
    for k, (a, b) in enumerate(zip(first, graph.constants, strict=True)):
        if a is not b and k not in changed and is_parameter_dtype(base_constant(b).dtype): changed.add(k)
    return sorted(changed)


def base_constant(u: UOp) -> UOp:
    """The CONST under a broadcast constant's movement ops."""
    while u.op is not Ops.CONST: u = u.src[0]
    return u


def parameter_buffer(u: UOp, device: str) -> Buffer:
    """A new one-element buffer on `device` holding the value of the broadcast constant `u` (copied in, so that a jit
    recording sees it as a host constant and compares its value between recordings)."""
    const = base_constant(u)
    return Buffer(device, 1, const.dtype).copyin(np.array([const.arg], dtype=to_numpy(const.dtype)))


def as_parameter(u: UOp, buf: Buffer) -> UOp:
    """The broadcast constant `u` with its CONST replaced by a read of the one-element `buf`: the same movement ops
    over RESHAPE(BUFFER, ())."""
    if u.op is Ops.CONST: return UOp(Ops.RESHAPE, u.dtype, (buffer_uop(buf),), ())
    return u.replace(src=(as_parameter(u.src[0], buf), *u.src[1:]))


def with_parameters(graph: Graph, positions: list[int], device: str) -> Graph:
    """`graph` with a buffer per varying constant (`positions`) after its own buffers: the inputs a template made
    from such a graph reads the constants' values from."""
    return graph._replace(buffers=graph.buffers + [parameter_buffer(graph.constants[k], device) for k in positions])


def schedule_with_parameters(graph: Graph, positions: list[int], outputs: list[UOp], device: str
                             ) -> tuple[list[ExecItem | LoopItem], dict[UOp, UOp]]:
    """create_schedule of the graph with the constants at `positions` read from the parameter buffers at the end of
    `graph.buffers` (with_parameters); the views come back keyed by the graph's own nodes."""
    params = graph.buffers[len(graph.buffers) - len(positions):]
    new: dict[UOp, UOp] = {graph.constants[k]: as_parameter(graph.constants[k], b)
                           for k, b in zip(positions, params, strict=True)}
    for u in graph.nodes:  # post-order: a node's sources are rebuilt before it
        if u in new: continue
        srcs = tuple([new.get(s, s) for s in u.src])
        if any(a is not b for a, b in zip(srcs, u.src, strict=True)): new[u] = u.replace(src=srcs)
    items, views = create_schedule([new.get(o, o) for o in outputs], device)
    old = {v: k for k, v in new.items()}
    return items, {old.get(node, node): view for node, view in views.items()}


def make_template(graph: Graph, items: list[ExecItem | LoopItem], views: dict[UOp, UOp], outputs: list[UOp]
                  ) -> Template | None:
    """The template of a schedule create_schedule made for `graph`; None where it has a loop, or reads what the
    walk did not see (below)."""
    if any(isinstance(item, LoopItem) for item in items): return None
    number = {id(b): k for k, b in enumerate(graph.buffers)}
    new: list[Buffer] = []

    def ref(b: Buffer) -> int:
        if id(b) not in number:
            number[id(b)] = len(graph.buffers) + len(new)
            new.append(b)
        return number[id(b)]

    refs = tuple((item.ast, tuple(ref(b) for b in item.bufs), item.outs) for item in items
                 if isinstance(item, ExecItem))
    written = {id(b) for item in items for b in item.bufs[:item.outs]}
    place = {u: i for i, u in enumerate(graph.nodes)}
    stored = []
    for node, view in views.items():
        if node not in place or view.op is not Ops.RESHAPE or view.src[0].op is not Ops.BUFFER: continue
        k = ref(buffer_of(view.src[0]))
        if k >= len(graph.buffers): stored.append((place[node], k - len(graph.buffers), view.dtype, view.arg))
    # not kept: a schedule reading a buffer its graph does not hold (kernelize found a node stored once a source
    # was swapped for its buffer: the walk does not see it), or an output read through a view of a stored node
    # (RESHAPE(RESHAPE(BUFFER))): a template would hand later graphs a buffer nothing writes, or a lazy output
    if any(id(b) not in written for b in new): return None
    if any(views[o] is not o and not (views[o].op is Ops.RESHAPE and views[o].src[0].op is Ops.BUFFER)
           for o in outputs): return None
    return Template(len(graph.buffers), tuple((b.device, b.size, b.dtype) for b in new), refs, tuple(stored))


def instantiate(t: Template, graph: Graph, outputs: list[UOp]) -> tuple[list[ExecItem | LoopItem], dict[UOp, UOp]]:
    """The schedule of `graph` from its template: fresh new buffers, the template's kernels bound to them and to
    the graph's own buffers; the views of the nodes they store, and of each output (one already stored is read
    through its view)."""
    fresh = [Buffer(*spec) for spec in t.new]
    every = graph.buffers + fresh
    items: list[ExecItem | LoopItem] = [ExecItem(ast, [every[k] for k in refs], outs) for ast, refs, outs in t.items]
    uops = [buffer_uop(b) for b in fresh]
    views = {graph.nodes[p]: UOp(Ops.RESHAPE, dtype, (uops[j],), shape) for p, j, dtype, shape in t.views}
    for o in outputs:
        if o not in views: views[o] = computed.get(o, o)
    return items, views


def forget() -> None:
    """Drop every template and the constants' history: the cache as a new process starts with it (tests that
    realize a kernel "as a new process would" call it)."""
    templates.clear()
    history.clear()


WALK = Graph((), [], [], False, False)  # schedule's default: walk the graph itself


def schedule(outputs: list[UOp], device: str, graph: Graph | None = WALK
             ) -> tuple[list[ExecItem | LoopItem], dict[UOp, UOp]]:
    """create_schedule(outputs, device), from the template of an earlier graph of the same structure if there is
    one, the constants that varied among such graphs read from buffers (see the module docstring). `graph`:
    structure(outputs, device), when the caller walked it already."""
    if graph is WALK: graph = structure(outputs, device)
    if graph is None: return create_schedule(outputs, device)
    positions = varying(graph)
    fixed = tuple(graph.constants) if not positions else \
        tuple(None if k in positions else c for k, c in enumerate(graph.constants))
    # (the flags' generation: kernelize may read flags; not in `history`'s key, as toggling DEBUG does not vary x * c)
    if (t := templates.get(key := (graph.key, ContextVar.generation, fixed), False)) is not False:
        if t is None: return create_schedule(outputs, device)
        return instantiate(t, with_parameters(graph, positions, device) if positions else graph, outputs)
    if positions:
        graph = with_parameters(graph, positions, device)
        items, views = schedule_with_parameters(graph, positions, outputs, device)
    else:
        items, views = create_schedule(outputs, device)
    if len(templates) >= CACHE_SIZE: del templates[next(iter(templates))]
    templates[key] = make_template(graph, items, views, outputs)
    return items, views
