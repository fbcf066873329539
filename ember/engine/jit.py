"""ember.jit (alias TinyJit): a function's kernels captured on its first calls, then replayed without the front end.

A jitted call of a small training step spends its time in Python (building graphs, scheduling, one ctypes call per
kernel), not in its kernels. `jit(fn)` runs fn eagerly while recording what ran (`Recorder`): the kernels with their
buffers, the tensors fn gave new values (`assign`: parameters, optimizer state), the buffers it filled from the host
(constants) and the random numbers it drew. A second recording must match the first kernel for kernel and buffer
for buffer (a third may stand in for a first call that did one-time work, such as realizing lazy weights); from the
next call on, `Replay` runs the recorded kernels in one native call (runtime/graph.NativeGraph) on the new inputs'
buffers, with fresh buffers for the outputs and the new values of the assigned tensors (a state's buffer from the
call before when nothing else refers to it any more: two buffers in turn, no allocation), intermediates in one arena
(engine/memory.py), and new random words.

A Tensor input may hold a symbolic size (ember/variables.py: `x.reshape(bs.bind(n), 784)`): the recordings and
their kernels are over the variable, and each call passes the value its inputs' shapes bind it to, so a batch that
changes from call to call runs the same programs; outputs come back in this call's sizes. A variable the function
binds itself (from a Python value) is a constant of each recording, checked as such.

Calls are keyed by the non-Tensor arguments (by type and value: 2 and 2.0 record apart), by which Tensor arguments
share a buffer and by Tensor.training. A float argument that takes a second value in calls otherwise alike is data
from then on (as torch.compile makes a changing number dynamic): fn gets it as a 0-d float64 Tensor, which promotes
no tensor it meets (x * lr keeps x's float dtype), and each replay fills its buffer, so a learning-rate schedule
replays one recording. Where fn reads a value in Python during such a recording (`if lr > 0.1`, math.sqrt(lr),
returning it: Tensor.numpy tells the recorder) or its results' dtypes change, the floats key recordings again.
A function keeps at most `max_recordings` (8) keys; past them a warning names the arguments whose values differ (a
step counter passed as an int) and calls with a new key run eagerly, so memory stays bounded. Recording is one call
at a time per function (threads wait; replays have a lock of their own). A jitted function called inside another's
recording runs as itself (the outer recording takes its kernels). A tensor the function reads from outside (a
weight) that gets a new value outside it (assign, or another jitted function's update) is followed: the replay reads
its buffer of the moment (so does a view of the weight taken before, which eager ember would leave on the old value:
a known difference). An assigned tensor is state only if its value came from outside the call; one made inside is
computed anew each time. An intermediate the function keeps (`self.last = h.realize()`, a debug dict: a tensor-level
node still reads its buffer after the call) stays out of the arena: every replay writes it, so it reads the latest
call's value, as after an eager call (a reference taken before the call sees it change too). Known footguns raise a
JitError instead of replaying wrong values:
- a Tensor input whose shape (a symbolic size by its variable), dtype or device differs from the recorded call's;
- two recordings that differ in their kernels, buffers, host constants or returned Python values: a Python value
  the function reads (a global, an attribute, a tensor's value read with .item()) changed between calls;
- an output that is an input (returned as it is, or a view of it): the replay would have no new buffer for it;
- a function that assigns its own Tensor argument;
- a loop (ember.scan with unroll=False) inside: its steps run from Python and are not recorded;
- backward() or gradient() through a replay's output that carried a gradient when recorded (raised when asked:
  the recording calls give a graph, a replay has none; backward inside the jitted function works).
What the function computes from Python values alone is part of the recording, as it is in tinygrad and torch.compile:
after the recordings, a changed global is not seen (tests/engine/test_jit.py shows it).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.device import Buffer, Device, buffer_of, buffer_uop
from ember.dtype import DType, dtypes
from ember.engine.memory import MemoryPlan, plan_memory
from ember.engine.realize import CompiledRunner, GlobalCounters
from ember.errors import JitError
from ember.helpers import ASSIGN_HOOKS, DEBUG, RECORDERS
from ember.schedule.kernelize import ExecItem, computed
from ember.tensor import Tensor
from ember.uop.ops import BOUND, Ops, UOp, UOpMetaClass
from ember.variables import max_count, rebound, unbound, values_of


@dataclass
class Recorder:
    """What one eager call ran: kernels with their buffers, tensors given new values, host copies, random draws."""

    kernels: list[tuple[CompiledRunner, list[Buffer], int]] = field(default_factory=list)  # (runner, bufs, outs)
    assigned: dict[int, tuple[Tensor, UOp]] = field(default_factory=dict)  # id -> (tensor, its value before)
    copied: dict[int, Buffer] = field(default_factory=dict)  # buffers filled from the host during the call
    draws: list[tuple[Buffer, int]] = field(default_factory=list)  # (the words' buffer, how many numbers)
    loops: int = 0
    reads: int = 0  # values read to the host (numpy, item): a Python value the function computed from a tensor
    values: dict[str, int] = field(default_factory=dict)  # the value each symbolic size had, by variable name

    def kernel(self, runner: CompiledRunner, bufs: list[Buffer], outs: int, vals: tuple[int, ...] = ()) -> None:
        self.kernels.append((runner, list(bufs), outs))
        if vals: self.values.update(zip(runner.spec.variables, vals, strict=True))

    def copy(self, buf: Buffer) -> None: self.copied[id(buf)] = buf
    def draw(self, buf: Buffer, n: int) -> None: self.draws.append((buf, n))
    def loop(self) -> None: self.loops += 1
    def read(self) -> None: self.reads += 1

    def assign(self, t: Tensor) -> None:
        if id(t) not in self.assigned: self.assigned[id(t)] = (t, t.uop)


def flatten(value: Any, tensors: list[Tensor], values: list[Any] | None = None, numbers: list[Any] | None = None
            ) -> Any:
    """`value` with each Tensor in it (in lists, tuples and dicts, their subclasses too) replaced by its number in
    `tensors`, and every other value by its type and key (a float by its bits: 2 and 2.0, 0.0 and -0.0, NaN and
    NaN key as they compute): the hashable shape of the arguments, which keys a recording. With `values` (a call's
    result), the other values are kept there, by number, to be given back. With `numbers`, each float goes there
    instead, and its place in the shape is its number (`specialized` puts its key back)."""
    if isinstance(value, Tensor):
        tensors.append(value)
        return ("tensor", len(tensors) - 1)
    if isinstance(value, (list, tuple)):
        return ("seq", type(value), tuple(flatten(v, tensors, values, numbers) for v in value))
    if isinstance(value, dict):
        return ("map", type(value), tuple((k, flatten(v, tensors, values, numbers)) for k, v in value.items()))
    if numbers is not None and isinstance(value, (float, np.floating)):
        numbers.append(value)
        return ("number", type(value), len(numbers) - 1)
    key = ("float", float(value).hex()) if isinstance(value, (float, np.floating)) else value
    try:
        hash(key)
    except TypeError:
        raise JitError(f"jit: an argument of type {type(value).__name__} cannot key a recording (it is not "
                       f"hashable); pass arrays as Tensors") from None
    if values is None: return ("value", type(value), key)
    values.append(value)
    return ("value", type(value), key, len(values) - 1)


def specialized(shape: Any, numbers: list[Any]) -> Any:
    """A shape `flatten` made with `numbers`, each float keyed by its value again (as flatten keys it without)."""
    if shape[0] == "number": return ("value", shape[1], ("float", float(numbers[shape[2]]).hex()))
    if shape[0] in ("seq", "map"):
        kind, cls, items = shape
        return (kind, cls, tuple((k, specialized(v, numbers)) for k, v in items) if kind == "map" else
                tuple(specialized(v, numbers) for v in items))
    return shape


def with_numbers(value: Any, numbers: Iterator[Any]) -> Any:
    """`value` with each float in it (where `flatten` finds numbers) replaced by the next of `numbers`."""
    if isinstance(value, Tensor): return value
    if isinstance(value, (list, tuple)):
        made = [with_numbers(v, numbers) for v in value]
        return type(value)(*made) if hasattr(type(value), "_fields") else type(value)(made)
    if isinstance(value, dict): return type(value)((k, with_numbers(v, numbers)) for k, v in value.items())
    return next(numbers) if isinstance(value, (float, np.floating)) else value


def with_numbers_back(result: Any, data: list[Tensor], numbers: list[Any]) -> Any:
    """A recording's result with each tensor that is a float argument fed as data (returned as it came) the number
    again: the caller gave a number and gets it back, as from the function called eagerly."""
    outs: list[Tensor] = []
    out_values: list[Any] = []
    shape = flatten(result, outs, out_values)
    number_of = {id(t): v for t, v in zip(data, numbers, strict=True)}
    if not any(id(t) in number_of for t in outs): return result
    return unflatten(shape, [number_of.get(id(t), t) for t in outs], out_values)  # type: ignore[misc]


def number_tensor(value: Any, device: str) -> Tensor:
    """A float argument as data: a 0-d float64 tensor in a buffer of its own. A 0-d tensor does not promote the
    dtype of the tensors it meets (x * lr stays float16 for a float16 x, as with the number) and float64 holds the
    number exactly; each replay reads the buffer of its call."""
    buf = Buffer(device, 1, dtypes.float64).copyin(np.array([value], np.float64))
    return Tensor._from_uop(UOp(Ops.RESHAPE, dtypes.float64, (buffer_uop(buf),), ()), device)


def fill(buf: Buffer, value: Any) -> None:
    """Write a float argument into its one-element float64 buffer: in place where it is host memory (no copy)."""
    if isinstance(raw := buf.raw, np.ndarray): raw.view(np.float64)[0] = value
    else: buf.copyin(np.array([value], np.float64))


def named_values(fn: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    """Each non-Tensor value in a call's arguments by where it is (`lr`, `cfg['lr']`, `args[2][0]`), for messages."""
    try:
        bound: dict[str, Any] = dict(inspect.signature(fn).bind(*args, **kwargs).arguments)
    except (TypeError, ValueError):  # (a callable without a signature, or arguments it does not take)
        bound = {**{f"argument {i}": a for i, a in enumerate(args)}, **kwargs}
    found: dict[str, Any] = {}

    def walk(name: str, value: Any) -> None:
        if isinstance(value, Tensor): return
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value): walk(f"{name}[{i}]", v)
        elif isinstance(value, dict):
            for k, v in value.items(): walk(f"{name}[{k!r}]", v)
        else: found[name] = value
    for name, value in bound.items(): walk(name, value)
    return found


def value_key(value: Any) -> Any:
    """A Python value as recordings key it (a float by its bits), or its id where it is not hashable."""
    if isinstance(value, (float, np.floating)): return (type(value), float(value).hex())
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return (type(value), value)


def unflatten(shape: Any, tensors: list[Tensor], values: list[Any]) -> Any:
    """The value `flatten` made `shape` of, with `tensors` and `values` in its places."""
    kind = shape[0]
    if kind == "tensor": return tensors[shape[1]]
    if kind == "value": return values[shape[3]]
    kind, cls, items = shape
    if kind == "map": return cls((k, unflatten(v, tensors, values)) for k, v in items)
    made = [unflatten(v, tensors, values) for v in items]
    return cls(*made) if hasattr(cls, "_fields") else cls(made)  # (a NamedTuple takes its fields one by one)


def stored_buffer(u: UOp) -> Buffer | None:
    """The buffer a tensor's value is, if it reads one whole buffer in order (after realize), else None."""
    u = computed.get(u, u)
    while u.op is Ops.RESHAPE: u = u.src[0]
    return buffer_of(u) if u.op is Ops.BUFFER else None


@dataclass
class Recording:
    """One recorded call, with each buffer given its role: input k, an assigned tensor's value before ("state-in")
    and after ("state-out"), output k, a host constant, a random draw, an intermediate, or a buffer from outside."""

    recorder: Recorder
    inputs: list[Buffer]
    outputs: list[Buffer]
    out_shape: Any
    out_tensors: list[Tensor]
    states: list[tuple[Tensor, Buffer, Buffer]]  # (tensor, buffer before, buffer after)
    out_values: list[Any]  # the result's values other than tensors, given back by every replay
    carries: list[bool]  # per output, whether a gradient could flow back through it from the call's result
    given: dict[str, int] = field(default_factory=dict)  # the values of the variables the inputs' shapes hold
    roles: dict[int, tuple] = field(default_factory=dict)

    def __post_init__(self) -> None:
        role = self.roles
        for k, b in enumerate(self.inputs): role.setdefault(id(b), ("input", k))
        for j, (_, before, after) in enumerate(self.states):
            role.setdefault(id(before), ("state-in", j))
            role.setdefault(id(after), ("state-out", j))
        for k, b in enumerate(self.outputs):
            if role.get(id(b), ("",))[0] == "input":
                raise JitError(f"jit: output {k} is input {role[id(b)][1]} (returned as it is, or a view of it); a "
                               f"replay would give no new value for it: return a copy (t.clone() or t + 0)")
            role.setdefault(id(b), ("output", k))  # (an output that is another output or a state keeps that role)
        for n, (buf, _) in enumerate(self.recorder.draws): role.setdefault(id(buf), ("draw", n))
        written = {id(b) for _, bufs, outs in self.recorder.kernels for b in bufs[:outs]}
        counts = {"const": 0, "temp": 0}
        for _, bufs, _ in self.recorder.kernels:
            for b in bufs:
                if id(b) in role: continue
                kind = "const" if id(b) in self.recorder.copied else "temp" if id(b) in written else "outside"
                role[id(b)] = (kind, counts[kind]) if kind in counts else (kind, id(b))
                if kind in counts: counts[kind] += 1

    @property
    def out_dtypes(self) -> list[DType]: return [t.dtype for t in self.out_tensors]

    def signature(self) -> tuple:
        """What two recordings must share: the kernels in order, the roles of their buffers and the contents of the
        host constants they read (Tensor([s]) of a Python value s: a global that changes shows here)."""
        def described(b: Buffer) -> tuple:
            role = self.roles[id(b)]
            return (*role, hashlib.sha256(b.numpy().tobytes()).hexdigest()) if role[0] == "const" else role
        # a variable no input's shape holds was bound inside the function: its value is a constant of the call
        fixed = tuple(sorted((k, v) for k, v in self.recorder.values.items() if k not in self.given))
        return (fixed, *((runner.spec.ast, tuple(described(b) for b in bufs)) for runner, bufs, _ in
                         self.recorder.kernels))


def differ(a: Recording, b: Recording) -> str:
    """Where recording b first differs from a, in words."""
    ka, kb = a.recorder.kernels, b.recorder.kernels
    if len(ka) != len(kb): return f"{len(kb)} kernels ran where the recorded call ran {len(ka)}"
    for i, ((ra, ba, _), (rb, bb, _)) in enumerate(zip(ka, kb, strict=True)):
        if ra.spec.ast is not rb.spec.ast: return f"kernel {i} is {rb.spec.name}, recorded as {ra.spec.name}"
        roles_a, roles_b = [a.roles[id(x)] for x in ba], [b.roles[id(x)] for x in bb]
        if roles_a != roles_b: return f"kernel {i} ({rb.spec.name}) reads or writes other buffers: {roles_b} " \
                                      f"recorded as {roles_a}"
    return "they differ"


def escaped(temps: dict[int, Buffer]) -> set[Buffer]:
    """The intermediates among `temps` (by id) that a live tensor-level node still stands for after the call: a
    tensor the function kept (an attribute, a debug dict) or a lazy value built on one reads it. Found among the
    live nodes (the hash-consing cache), once per replay made: 45 ms with 35,000 live nodes (an MLP's Adam step),
    270 ms with 210,000 (/tmp script, this 2-core machine)."""
    # (a copy made in one step: a node collected while a walk of the cache itself ran would change its size)
    live = [ref for key, ref in UOpMetaClass.cache.copy().items() if key[0] is Ops.BUFFER]
    found = {id(b): b for ref in live if (u := ref()) is not None and id(b := u.__dict__.get("buffer")) in temps}
    return set(found.values())


class Replay:
    """A recording made runnable: intermediates in one arena, the kernels in one graph of the device's (the CPU's
    NativeGraph), or where it has none a list of runners, input, output and state buffers swapped in per call."""

    def __init__(self, rec: Recording, name: str = "the function") -> None:
        self.rec = rec
        self.name = name
        kernels = rec.recorder.kernels
        temps = {id(b): b for _, bufs, _ in kernels for b in bufs if rec.roles[id(b)][0] == "temp"}
        for node in [n for n, view in list(computed.items()) if (b := stored_buffer(view)) is not None and
                     id(b) in temps]:
            del computed[node]  # a later schedule must not read a buffer the replays overwrite
        # an intermediate the function kept (self.last = h.realize()) keeps memory of its own, which every replay
        # writes as the eager call would have: it reads this call's value, not whatever the arena holds there next
        self.escaped = escaped(temps)
        keep = {b for _, bufs, _ in kernels for b in bufs if id(b) not in temps} | self.escaped
        items: list = [ExecItem(runner.spec.ast, bufs, outs) for runner, bufs, outs in kernels]
        self.plan: MemoryPlan | None = plan_memory(items, keep).apply() if len(kernels) > 1 else None
        if DEBUG >= 2 and self.plan is not None: print(f"jit: {len(kernels)} kernels; {self.plan.describe()}")
        devices = {bufs[0].device for _, bufs, _ in kernels}
        graph = Device[devices.pop()].graph if len(devices) == 1 else None
        values = rec.recorder.values
        self.vals = [tuple(values[v] for v in runner.spec.variables) for runner, _, _ in kernels]
        self.graph = graph([(runner.program, bufs, vals) for (runner, bufs, _), vals in
                            zip(kernels, self.vals, strict=True)]) if graph is not None else None
        # where each symbolic size's value goes: (kernel, its variable's slot after the buffers, variable name)
        self.variables = [(k, len(bufs) + i, name) for k, (runner, bufs, _) in enumerate(kernels)
                          for i, name in enumerate(runner.spec.variables)]
        # a buffer from outside (a weight) whose tensor gets another buffer (assign, or another replay's update)
        # is read from that tensor's buffer from then on: recorded buffer -> (it, the tensor)
        self.tracked: dict[int, tuple[Buffer, weakref.ref[Tensor]]] = {}
        if len(WATCHED) > 1024:  # entries whose replays are gone (their buffers' ids may come back for others)
            for k in [k for k, replays in WATCHED.items() if not replays]: del WATCHED[k]
        for _, bufs, _ in kernels:
            for b in bufs:
                if rec.roles[id(b)][0] == "outside": WATCHED.setdefault(id(b), weakref.WeakSet()).add(self)
        # per state, whether a kernel writes it (a fresh buffer per call) or not (the recorded one); per output,
        # where its value comes from: a state's new buffer, an earlier output's, or a buffer of its own
        written = {id(b) for _, bufs, outs in kernels for b in bufs[:outs]}
        self.fresh_states = [id(after) in written for _, _, after in rec.states]
        self.state_shapes = [t.shape for t, _, _ in rec.states]  # (a new view's shape: a replay keeps shapes)
        self.spare: list[Buffer | None] = [None] * len(rec.states)  # per state, its buffer before the last call
        self.source: list[tuple[str, int]] = []
        for k, b in enumerate(rec.outputs):
            kind, n = rec.roles[id(b)]
            self.source.append((kind, n) if kind in ("state-out", "output") and (kind, n) != ("output", k) else
                               ("fresh", k) if id(b) in written else ("recorded", k))
        self.single = rec.out_shape == ("tensor", 0)  # the function returns one tensor
        self.ops = sum(runner.spec.flops for runner, _, _ in kernels)  # counted per replay in GlobalCounters
        self.mem = sum(runner.spec.mem_bytes for runner, _, _ in kernels)
        self.last: list[list[Any] | None] = [None] * len(rec.outputs)  # [view, the counts of it, its buffer, its src]
        swapped = [*rec.inputs, *rec.outputs, *(b for _, before, after in rec.states for b in (before, after))]
        self.where = {id(b): self.slots(b) for b in swapped} if self.graph is not None else {}
        self.bound: dict[int, Buffer] = {}
        self.lock = threading.Lock()

    @property
    def kernels(self) -> list[tuple[CompiledRunner, list[Buffer], int]]:
        """The recorded kernels in order: (runner, its buffers as recorded, how many it writes)."""
        return self.rec.recorder.kernels

    def output_view(self, k: int) -> UOp:
        """A view of a buffer for output k: the last call's, when nothing refers to it any more (no tensor, no
        graph: its nodes are referred to only from here, as counted when it was made), else a new one."""
        if (last := self.last[k]) is not None and sys.getrefcount(last[0]) == last[1] and \
                sys.getrefcount(last[0].src[0]) == last[2] and sys.getrefcount(last[0].src) == last[3]:
            return last[0]
        o = self.rec.out_tensors[k]
        node = buffer_uop(Buffer(o.device, max_count(o.shape), o.dtype))
        if self.rec.carries[k]:  # (Tensor.backward and gradient raise this where their graph reaches the node)
            node.__dict__["gradient_stop"] = (
                f"jit: a gradient would flow back through output {k} of a replay of {self.name}, but a replay runs "
                f"recorded kernels with no graph to differentiate (only its first two calls, which record, have one): "
                f"call backward() inside the jitted function, or call the function unjitted where gradients must "
                f"flow out of it")
        self.last[k] = last = [UOp(Ops.RESHAPE, o.dtype, (node,), o.shape), 0, 0, 0]
        del node  # (the view's source tuple holds it, nothing else, when counted below)
        # counted as the test counts; the source tuple too: a view of this call's sizes (a symbolic output rebound)
        # is another node sharing it, which a caller may hold while the view and its buffer node are counted alone
        last[1], last[2], last[3] = sys.getrefcount(last[0]), sys.getrefcount(last[0].src[0]), \
            sys.getrefcount(last[0].src)
        return last[0]

    def slots(self, buf: Buffer) -> list[tuple[Any, int]]:
        """Where the graph holds buf's address: (a kernel's argument array, slot) for each use."""
        assert self.graph is not None
        return [(self.graph.args[k], slot) for k, slot in self.graph.positions.get(id(buf), [])]

    def bind(self, swap: list[tuple[Buffer, Buffer]]) -> None:
        """Point each recorded buffer's uses at its buffer for this call (every swapped one is set at every call,
        so no pointer from an earlier call is left to a buffer freed since)."""
        if self.graph is not None:
            for old, new in swap:
                address = new.address
                for args, slot in self.where[id(old)]: args[slot] = address
        else: self.bound = {id(old): new for old, new in swap}

    def track(self, recorded: Buffer, t: Tensor) -> None:
        """From now on read `recorded` (a buffer from outside) from t's buffer at each call."""
        if id(recorded) not in self.tracked:
            self.tracked[id(recorded)] = (recorded, weakref.ref(t))
            if self.graph is not None: self.where[id(recorded)] = self.slots(recorded)

    def __call__(self, inputs: list[Buffer], values: dict[str, int]) -> Any:
        with self.lock: return self.run(inputs, values)  # (two threads would swap each other's pointers in)

    def set_values(self, values: dict[str, int]) -> None:
        """The symbolic sizes of this call (by name; the recorded value for one no input holds) in every kernel."""
        recorded = self.rec.recorder.values
        if self.graph is not None:
            for k, slot, name in self.variables: self.graph.args[k][slot] = values.get(name, recorded[name])
        else: self.vals = [tuple(values.get(v, recorded[v]) for v in runner.spec.variables)
                           for runner, _, _ in self.rec.recorder.kernels]

    def run(self, inputs: list[Buffer], values: dict[str, int]) -> Any:
        rec = self.rec
        if self.variables: self.set_values(values)
        swap: list[tuple[Buffer, Buffer]] = list(zip(rec.inputs, inputs, strict=True))
        for recorded, ref in self.tracked.values():
            if (t := ref()) is not None: swap.append((recorded, current(t)))
        new_states: list[Buffer] = []
        olds: list[Buffer] = []  # each state's buffer before the call
        for k, ((t, before, after), fresh) in enumerate(zip(rec.states, self.fresh_states, strict=True)):
            olds.append(old := current(t))
            swap.append((before, old))
            if fresh:  # the buffer the state left at the last call, when nothing else refers to it, else a new one
                if sys.getrefcount(self.spare[k]) == 2 and self.spare[k] is not old: new = self.spare[k]
                else: new = Buffer(after.device, after.size, after.dtype)
                swap.append((after, new))
            else: new = after
            new_states.append(new)
        views: list[UOp | None] = []
        for k, (kind, n) in enumerate(self.source):
            if kind == "fresh":
                views.append(view := self.output_view(k))
                swap.append((rec.outputs[k], buffer_of(view.src[0])))
            elif kind == "state-out": views.append(None)  # filled once the state has its view, below
            elif kind == "output": views.append(views[n])
            else: views.append(rec.out_tensors[k].uop)
        if values: views = [v if v is None or v.op is not Ops.RESHAPE else
                            v.replace(arg=rebound(v.arg, values)) for v in views]  # this call's sizes
        for buf, n in rec.recorder.draws: buf.copyin(Tensor.next_random_words(n))  # new random numbers
        self.bind(swap)
        GlobalCounters.kernel_count += len(rec.recorder.kernels)
        GlobalCounters.global_ops += self.ops
        GlobalCounters.global_mem += self.mem
        if self.graph is not None: self.graph()
        else:
            for (runner, bufs, _), vals in zip(rec.recorder.kernels, self.vals, strict=True):
                runner.program(*[self.bound.get(id(b), b) for b in bufs], vals=vals)  # type: ignore[operator]
        state_views = []
        for k, ((t, _, after), new, old, shape) in enumerate(zip(rec.states, new_states, olds, self.state_shapes,
                                                                 strict=True)):
            if new is not after:
                t.uop = UOp(Ops.RESHAPE, t.dtype, (buffer_uop(new),), rebound(shape, values) if values else shape)
                self.spare[k] = old  # (its memory and cached address serve a later call once nothing reads it)
            state_views.append(t.uop)
            moved(t, old)
        for k, (kind, n) in enumerate(self.source):
            if kind == "state-out": views[k] = state_views[n]
        tensors = [Tensor._from_uop(v, o.device) for o, v in zip(rec.out_tensors, views, strict=True)]
        return tensors[0] if self.single else unflatten(rec.out_shape, tensors, rec.out_values)


def current(t: Tensor) -> Buffer:
    """The buffer holding t's value now, realizing it if it was given a lazy value."""
    if (buf := stored_buffer(t.uop)) is None:
        t.realize()
        buf = stored_buffer(t.uop)
    assert buf is not None
    return buf


# id of a buffer from outside that replays read -> those replays, which follow its tensor once it moves
WATCHED: dict[int, weakref.WeakSet[Replay]] = {}


def moved(t: Tensor, old: Buffer | None) -> None:
    """t's value leaves buffer `old` (an assign, a recording or a replay gives it another): replays reading `old`
    as a buffer from outside read t's buffer from now on."""
    if old is not None and (replays := WATCHED.get(id(old))) is not None:
        for replay in list(replays): replay.track(old, t)


def watch_assign(t: Tensor) -> None:
    """Tensor.assign outside a recording, before t changes."""
    if WATCHED: moved(t, stored_buffer(t.uop))


ASSIGN_HOOKS.append(watch_assign)


# call forms (keys) a function records before the calls of a new one run eagerly: each recording keeps its buffers
# (a step counter passed as a number would add one per call), as torch.compile's recompile limit (8) bounds its own
MAX_RECORDINGS = 8


class jit:  # noqa: N801  (a decorator, named as torch.jit and jax.jit are)
    """Capture `fn`'s kernels on its first calls and replay them on later ones (see this module's docstring).

    >>> @jit
    ... def step(x): return (x * 2 + 1).sum()
    >>> [step(Tensor([1.0, 2.0])).item() for _ in range(4)]
    [8.0, 8.0, 8.0, 8.0]
    """

    def __init__(self, fn: Callable[..., Any], max_recordings: int = MAX_RECORDINGS) -> None:
        if not callable(fn): raise TypeError(f"jit: expected a function to record, got {type(fn).__name__}")
        self.fn = fn
        self.max_recordings = max_recordings
        self.recordings: dict[Any, list[Recording]] = {}
        self.replays: dict[Any, Replay] = {}
        self.shapes: dict[Any, list[tuple]] = {}
        self.arguments: dict[Any, dict[str, Any]] = {}  # per key recorded, its non-Tensor arguments by name
        # per form of the arguments with floats in them: their first values, then True (data) or False (keys)
        self.number_forms: dict[Any, tuple | bool] = {}
        self.out_dtypes: dict[Any, list[DType]] = {}  # per form, its outputs' dtypes when its floats keyed it
        self.specialized: dict[Any, list[Any]] = {}  # per form, the keys its floats' first values recorded under
        self.data: dict[Any, list[list[Any]]] = {}  # per form, its float tensors with their refcounts when made
        self.data_lock = threading.Lock()
        self.warned = False
        self.lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __get__(self, obj: Any, owner: Any = None) -> Any:  # a method: bound to its instance
        return self if obj is None else functools.partial(self.__call__, obj)

    @property
    def replay(self) -> Replay | None:
        """The replay of the call recorded most recently (None before any): its kernels, memory plan and graph."""
        return next(reversed(self.replays.values()), None)

    def reset(self) -> None:
        """Forget every recording: the next calls record anew."""
        self.recordings.clear()
        self.replays.clear()
        self.shapes.clear()
        self.arguments.clear()
        self.number_forms.clear()
        self.out_dtypes.clear()
        self.specialized.clear()
        self.data.clear()
        self.warned = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if RECORDERS: return self.fn(*args, **kwargs)  # inside another jitted call's recording: that one records it
        tensors: list[Tensor] = []
        numbers: list[Any] = []
        called = (args, kwargs)
        if not kwargs and all(type(a) is Tensor for a in args):  # the common case, without the walk
            tensors, shape = list(args), len(args)
        else: shape = flatten((args, kwargs), tensors, numbers=numbers)
        form = shape
        if numbers:
            if self.numbers_are_data(form, numbers):
                device = tensors[0].device if tensors else Device.DEFAULT
                data = self.data_tensors(form, numbers, device)
                tensors += data
                args, kwargs = with_numbers((args, kwargs), iter(data))
            else: shape = specialized(shape, numbers)
        buffers = [current(t) for t in tensors]
        first: dict[int, int] = {}
        # the mode is part of the key: dropout and batchnorm compute otherwise in training, nothing differs in no_grad
        key = (shape, tuple(first.setdefault(id(b), i) for i, b in enumerate(buffers)), Tensor.training)
        described = [(unbound(t.shape), t.dtype, t.device) for t in tensors]  # (a symbolic size by its variable)
        values = values_of([t.shape for t in tensors]) if BOUND[0] else {}
        if (known := self.shapes.setdefault(key, described)) != described:
            i, (was, now) = next((i, p) for i, p in enumerate(zip(known, described, strict=True)) if p[0] != p[1])
            raise JitError(f"jit: Tensor argument {i} is {now[1].name} {now[0]} on {now[2]}, recorded as "
                           f"{was[1].name} {was[0]} on {was[2]}: a jitted function replays the kernels of one shape "
                           f"and dtype (call jit(fn) again for another, or reset(); a size that changes from call to "
                           f"call, a batch, can be a Variable: x.reshape(Variable('bs', 1, 256).bind(n), ...))")
        if (replay := self.replays.get(key)) is not None: return replay(buffers, values)
        # one recording at a time: two threads recording at once would each take the other's for the first call
        with self.lock:
            if (replay := self.replays.get(key)) is not None: return replay(buffers, values)  # made while we waited
            is_over = key not in self.recordings and len(self.recordings) + len(self.replays) >= self.max_recordings
            if not is_over:
                if key not in self.recordings:
                    self.arguments[key] = named_values(self.fn, *called)
                    if shape is not form: self.specialized.setdefault(form, []).append(key)
                return self.record_call(key, form, args, kwargs, tensors, buffers, values, numbers if shape is form
                                        else [])
            if not self.warned: self.warn_limit(*called)
            self.warned = True
        return self.fn(*called[0], **called[1])  # eagerly (outside the lock): no recording, no memory kept

    def record_call(self, key: Any, form: Any, args: tuple, kwargs: dict, tensors: list[Tensor],
                    buffers: list[Buffer], values: dict[str, int], numbers: list[Any]) -> Any:
        """Record one call under `key` (with its float arguments as data where `numbers` are given); the second
        recording that matches the one before becomes the key's replay."""
        result, rec = self.record(args, kwargs, tensors, buffers)
        if not isinstance(rec, JitError): rec.given = values  # (before signature(): sizes the inputs bind vary)
        done = self.recordings.setdefault(key, [])
        if numbers:  # floats as data: where that computes otherwise than the numbers would, they key recordings
            data = tensors[len(tensors) - len(numbers):]
            result = with_numbers_back(result, data, numbers)
            if isinstance(rec, JitError) or rec.recorder.reads or \
                    self.out_dtypes.get(form, rec.out_dtypes) != rec.out_dtypes or \
                    (done and done[-1].signature() != rec.signature()):
                self.number_forms[form] = False
                self.recordings.pop(key, None)
                self.arguments.pop(key, None)
                return result
        if isinstance(rec, JitError): raise rec
        self.out_dtypes.setdefault(form, rec.out_dtypes)
        if done and done[-1].signature() == rec.signature() and done[-1].out_shape == rec.out_shape:
            self.replays[key] = Replay(rec, getattr(self.fn, "__name__", "the function"))
            del self.recordings[key]
        elif len(done) >= 2:
            raise JitError(f"jit: {getattr(self.fn, '__name__', 'the function')}'s calls do not run the same "
                           f"kernels on the same buffers, or return other Python values ({differ(done[-1], rec)}): "
                           f"a Python value it reads (a global, an attribute, a closure variable, a tensor's value "
                           f"read with .item() or .numpy()) changes between calls, and a replay would keep the "
                           f"recorded one; pass it as a Tensor argument (or as a non-Tensor argument, which keys "
                           f"the recordings), and return tensors, not values read from them")
        else: done.append(rec)
        return result

    def data_tensors(self, form: Any, numbers: list[Any], device: str) -> list[Tensor]:
        """0-d float64 tensors holding this call's floats: the last call's, refilled, when nothing but this jit refers
        to them, their nodes or buffers any more (refcounts as counted when made: a caller's lazy value kept from a
        recording would read them), else new ones. A new tensor per float per call costs its buffer, node and shape:
        a replay of x * lr + 1 took 376 us per call with them, 59 us without a float."""
        with self.data_lock:  # (two threads must not refill the same tensors)
            kept = self.data.get(form)
            if kept is not None and all(sys.getrefcount(e[0]) == e[1] and sys.getrefcount(e[0].uop) == e[2] and
                                        sys.getrefcount(buffer_of(e[0].uop.src[0])) == e[3] for e in kept):
                for (t, *_), v in zip(kept, numbers, strict=True): fill(buffer_of(t.uop.src[0]), v)
                return [e[0] for e in kept]
            self.data[form] = kept = [[number_tensor(v, device), 0, 0, 0] for v in numbers]
            for e in kept: e[1], e[2], e[3] = sys.getrefcount(e[0]), sys.getrefcount(e[0].uop), \
                sys.getrefcount(buffer_of(e[0].uop.src[0]))
            return [e[0] for e in kept]

    def numbers_are_data(self, form: Any, numbers: list[Any]) -> bool:
        """Whether this call's float arguments go to fn as data (0-d float64 Tensors its replays feed per call): once
        they took a second value in calls of one form, unless that was tried and computed otherwise. Their first
        values key recordings of their own, as every other Python value does."""
        state = self.number_forms.get(form)
        if isinstance(state, bool): return state
        keyed = tuple((type(v), float(v).hex()) for v in numbers)
        if self.number_forms.setdefault(form, keyed) == keyed: return False
        with self.lock:
            self.number_forms[form] = True
            for key in self.specialized.pop(form, []):  # (the first values' recordings: data stands for them now)
                for kept in (self.recordings, self.replays, self.arguments): kept.pop(key, None)
        return True

    def warn_limit(self, args: tuple, kwargs: dict) -> None:
        """Warn that fn reached its limit of recordings, naming the arguments whose values made them differ."""
        now = named_values(self.fn, args, kwargs)
        seen: dict[str, set] = {}
        for named in [*self.arguments.values(), now]:
            for name, v in named.items(): seen.setdefault(name, set()).add(value_key(v))
        varying = [name for name, vs in seen.items() if len(vs) > 1]
        what = f"argument {', '.join(repr(v) for v in varying)} took {max(len(seen[v]) for v in varying)} values" \
            if varying else "the calls differ in which Tensor arguments share a buffer, or in Tensor.training"
        warnings.warn(f"jit: {getattr(self.fn, '__name__', 'the function')} made {self.max_recordings} recordings, "
                      f"its limit (jit(fn, max_recordings=n)): {what}, each value a recording of its own; calls "
                      f"needing a new one run eagerly from now on. Pass a number that changes from call to call as a "
                      f"Tensor (Tensor(step)); a float one is fed as data already unless fn reads its value in Python",
                      stacklevel=3)

    def record(self, args: tuple, kwargs: dict, tensors: list[Tensor], buffers: list[Buffer]
               ) -> tuple[Any, Recording | JitError]:
        """Call fn eagerly, recording what runs; its outputs (and what it assigned) realized in one schedule. The
        call's result, with the recording or the JitError that says why it cannot be replayed."""
        recorder = Recorder()
        # each input reads its buffer through a buffer of its own for the call (the same memory): a node of the
        # function equal to a node an input was realized from (Tensor.ones(n) and a constant) reads the input's
        # buffer through kernelize.computed, which a replay must not swap for the next call's input
        aliases = [Buffer(b.device, b.size, b.dtype) for b in buffers]
        for alias, b in zip(aliases, buffers, strict=True):
            alias._raw = Device[b.device].allocator.alias(b.raw)  # never put back for reuse by its own freeing
            alias.__dict__["base"] = b  # and the buffer whose memory it is lives as long: a lazy value kept from the
            # call (self.cache = x * 2) reads it
        before = [t.uop for t in tensors]
        for t, alias in zip(tensors, aliases, strict=True):
            t.uop = UOp(Ops.RESHAPE, t.dtype, (buffer_uop(alias),), t.shape)
        RECORDERS.append(recorder)
        try:
            result = self.fn(*args, **kwargs)
            outs: list[Tensor] = []
            out_values: list[Any] = []
            out_shape = flatten(result, outs, out_values)
            carries = [t._carries_gradient() for t in outs]  # (before realize: a graph a gradient could go through)
            assigned = [t for t, _ in recorder.assigned.values()]
            pending = [t for t in [*outs, *assigned] if stored_buffer(t.uop) is None]
            if pending: pending[0].realize(*pending[1:])
            out_bufs = [stored_buffer(t.uop) for t in outs]  # (an input returned reads its alias: caught below)
            after = [stored_buffer(t.uop) for t in assigned]
        finally:
            RECORDERS.remove(recorder)
            for t, u in zip(tensors, before, strict=True): t.uop = u
        if any(id(t) in recorder.assigned for t in tensors):
            return result, JitError("jit: the function assigns one of its Tensor arguments; a replay could not give "
                                    "the new value to the next call's argument: return the new value instead")
        if recorder.loops:
            return result, JitError("jit: the function runs a loop (ember.scan with unroll=False) whose steps run "
                                    "from Python: it cannot be recorded; jit the loop's caller without it, or unroll "
                                    "it")
        # an assigned tensor is state (a parameter, an optimizer's moment) when its value before the call was in a
        # buffer from outside it; one made during the call (a constant, a value computed, a view of an argument)
        # is computed anew by every replay
        made = {id(b) for _, bufs, n in recorder.kernels for b in bufs[:n]} | set(recorder.copied) | \
            {id(a) for a in aliases}
        states = []
        for (t, old), new in zip(recorder.assigned.values(), after, strict=True):
            if (was := stored_buffer(old)) is not None and id(was) not in made and new is not None:
                states.append((t, was, new))
        recorder.assigned.clear()  # (its values before could hold intermediates alive: see `escaped`)
        assert all(b is not None for b in out_bufs)
        try:
            rec = Recording(recorder, aliases, out_bufs, out_shape, outs, states, out_values,  # type: ignore[arg-type]
                            carries)
        except JitError as e:
            return result, e
        for t, was, _ in states: moved(t, was)  # replays of other functions reading t's old buffer follow it
        return result, rec


TinyJit = jit

