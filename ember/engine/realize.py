"""Run a schedule: compile each kernel AST once (per device), call it with its buffers, count the work.

`GlobalCounters` adds up kernels run, ALU ops, bytes moved and time; DEBUG=1 prints each kernel as it runs,
DEBUG=2 also the schedule and each kernel's opts (`UP1x32 TH0x2`: UPCAST axis 1 by 32, THREAD axis 0 on 2
cores), DEBUG=4 the source of each newly compiled kernel.

Rendered programs are cached on disk (`cached_program`), keyed by `graph_text` of the kernel AST, the renderer,
the flags codegen reads and ember's own source: a second process runs no codegen for kernels it has seen.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ember.codegen import get_program, kernel_name
from ember.codegen.opt import Opt
from ember.device import Buffer, Device, buffer_of, cache_write, discard_damaged, read_cached
from ember.dtype import to_numpy
from ember.engine.memory import MemoryPlan, plan_memory
from ember.helpers import (
    CACHELEVEL,
    DEBUG,
    RECORDERS,
    SPEC,
    TRACK_REWRITES,
    ContextVar,
    cache_dir,
    colored,
    source_hash,
)
from ember.renderer import SIZE_OPS, ProgramSpec, Renderer, Size
from ember.schedule import cache as schedule_cache
from ember.schedule.kernelize import ExecItem, LoopItem, computed, is_constant, kernels
from ember.schedule.unbind import rebind, unbind
from ember.uop.ops import BOUND, Ops, UOp
from ember.uop.text import graph_text, value_text


class GlobalCounters:
    """Totals since the last reset(): kernels run, ALU ops, bytes loaded/stored, seconds in kernels."""

    kernel_count: int = 0
    global_ops: int = 0
    global_mem: int = 0
    time_sum_s: float = 0.0

    @staticmethod
    def reset() -> None:
        GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem = 0, 0, 0
        GlobalCounters.time_sum_s = 0.0


@dataclass(eq=False)
class CompiledRunner:
    """A program ready to run: its spec and the device's loaded binary."""

    spec: ProgramSpec
    program: object

    def __call__(self, item: ExecItem, wait: bool) -> float | None:
        return self.program(*item.bufs, wait=wait)  # type: ignore[operator]


# (device, ast, codegen_flags()) -> its runner, least recently used first. The flags are in the key as they are in
# the program cache's: a kernel run under NOOPT=1 or BEAM=2 after running without must not get the old program.
_runners: dict[tuple[str, UOp, tuple], CompiledRunner] = {}
# runners kept: past it the least recently used goes, and with it its loaded library once nothing else holds it (a
# jit replay keeps its own); each costs about 49 KB of mappings and a dlopen handle, and comes back from the program
# and compile caches on disk (a few ms) if its kernel runs again
RUNNER_CACHE_SIZE = 4096
_flags_seen: list = [-1, ()]  # [ContextVar.generation, codegen_flags() at it]


def codegen_flags() -> tuple:
    """The values of the flags codegen reads (all but NOT_CODEGEN_FLAGS), as a tuple; recomputed only when some flag
    changed (ContextVar.generation), so that a runner lookup costs a comparison."""
    if _flags_seen[0] != ContextVar.generation:
        _flags_seen[:] = [ContextVar.generation, tuple(v.value for k, v in sorted(ContextVar.registry.items())
                                                       if k not in NOT_CODEGEN_FLAGS)]
    return _flags_seen[1]


def get_runner(device: str, ast: UOp) -> CompiledRunner:
    """The compiled program for `ast` on `device` under the flags set now, built on first use and kept (up to
    RUNNER_CACHE_SIZE runners, least recently used evicted)."""
    key = (device, ast, codegen_flags())
    if key not in _runners: prepare_runners([(device, ast)])
    _runners[key] = runner = _runners.pop(key)  # (now the most recently used: a dict keeps insertion order)
    return runner


def prepare_runners(kernels: list[tuple[str, UOp]]) -> None:
    """Build the runners of the `(device, ast)` kernels not built yet under the flags set now: codegen one after
    another (Python), the compiler runs in parallel, one process per core (a schedule of new kernels: 20 kernels on 2
    cores, 1.7 s -> about half)."""
    flags = codegen_flags()
    new = list(dict.fromkeys(k for k in kernels if (*k, flags) not in _runners))
    if not new: return
    specs = [cached_program(ast, Device[device].renderer) for device, ast in new]
    if DEBUG >= 4:
        for spec in specs: print(spec.src)

    def compile_one(i: int) -> bytes: return Device[new[i][0]].compiler.compile_cached(specs[i].src)
    with ThreadPoolExecutor(min(len(new), os.cpu_count() or 1)) as pool: libs = list(pool.map(compile_one,
                                                                                            range(len(new))))
    for (device, ast), spec, lib in zip(new, specs, libs, strict=True):
        _runners[(device, ast, flags)] = CompiledRunner(spec, Device[device].program(spec, lib))
    while len(_runners) > RUNNER_CACHE_SIZE: del _runners[next(iter(_runners))]


# ---- the program cache -------------------------------------------------------------------------------------------

PROGRAM_FORMAT = "ember program 7"  # bump when the entry's fields change
# flags that do not change what codegen makes (they print, check, record or steer other caches): left out of the key
NOT_CODEGEN_FLAGS = frozenset({"DEBUG", "SPEC", "TRACK_REWRITES", "CACHELEVEL", "INTERPRET", "EMBER_CACHE_MAX_MB",
                               "EMBER_MAX_CXX_BYTES"})


def cached_program(ast: UOp, renderer: Renderer) -> ProgramSpec:
    """get_program(ast, renderer), from the on-disk program cache when a process rendered this kernel before.

    Codegen of a kernel costs 10 ms to seconds of Python (rangeify most), reading its entry well under one. A spec
    read from the cache has `uops=None`. The cache is bypassed where codegen should be seen running (SPEC, rewrite
    tracking, DEBUG>=5) and for CACHELEVEL=0; an entry that is damaged, or is another kernel's, is deleted with a
    CacheWarning and rebuilt."""
    if not CACHELEVEL: return get_program(ast, renderer)
    try:
        digest = hashlib.sha256(program_key(ast, renderer).encode()).hexdigest()
    except TypeError:  # an arg with no stable text: a key could not tell two such kernels apart
        return get_program(ast, renderer)
    path = os.path.join(cache_dir(), "program", digest[:2], digest + ".json")
    if not (SPEC or TRACK_REWRITES or DEBUG >= 5) and (data := read_cached(path)) is not None:
        if (spec := spec_from_json(data, ast, digest)) is not None: return spec
        discard_damaged(path, "not a program entry for this kernel (unreadable, altered, or another kernel's)")
    spec = get_program(ast, renderer)
    cache_write(path, spec_to_json(spec, digest))
    return spec


def program_key(ast: UOp, renderer: Renderer) -> str:
    """Everything the program rendered from `ast` follows from, as text: ember's source, the renderer and its
    settings, the flags codegen reads, the AST. Raises TypeError where some arg has no stable text."""
    flags = {k: v.value for k, v in sorted(ContextVar.registry.items()) if k not in NOT_CODEGEN_FLAGS}
    return "\n".join([PROGRAM_FORMAT, source_hash(), f"{type(renderer).__module__}.{type(renderer).__qualname__}",
                      renderer.device, value_text(vars(renderer), {}), value_text(flags, {}), graph_text(ast)])


def spec_to_json(spec: ProgramSpec, key: str) -> bytes:
    """What get_runner and run_schedule read of a spec, as the cache entry under `key`. Its checksum covers the key
    and every field, so that a damaged entry, or another kernel's entry copied over this one, is found."""
    fields = {"name": spec.name, "src": spec.src, "device": spec.device, "buffer_count": spec.buffer_count,
              "outputs": list(spec.outputs), "flops": spec.flops, "mem_bytes": spec.mem_bytes,
              "global_size": list(spec.global_size),
              "local_size": None if spec.local_size is None else list(spec.local_size),
              "shared_bytes": spec.shared_bytes,
              "opts": [str(o) for o in spec.opts], "variables": list(spec.variables)}
    return json.dumps({**fields, "sha256": entry_checksum(key, fields)}).encode()


def entry_checksum(key: str, fields: dict[str, object]) -> str:
    return hashlib.sha256(f"{key}\0{json.dumps(fields, sort_keys=True)}".encode()).hexdigest()


def spec_from_json(data: bytes, ast: UOp, key: str) -> ProgramSpec | None:
    """The spec the cache entry under `key` holds, or None for an entry that is damaged or another key's."""
    try:
        d = json.loads(data)
        if entry_checksum(key, {k: v for k, v in d.items() if k != "sha256"}) != d["sha256"]: return None
        src, outputs = d["src"], tuple(d["outputs"])
        global_size, local_size = tuple(as_size(g) for g in d["global_size"]), d["local_size"]
        local_size = None if local_size is None else tuple(local_size)
        counts = (d["buffer_count"], d["flops"], d["mem_bytes"], d["shared_bytes"], *outputs, *(local_size or ()))
        if not (isinstance(src, str) and isinstance(d["name"], str) and isinstance(d["device"], str) and
                all(type(n) is int for n in counts) and all(isinstance(o, str) for o in d["opts"] + d["variables"])):
            return None
        return ProgramSpec(d["name"], src, d["device"], ast, None, d["buffer_count"], outputs, d["flops"],
                           d["mem_bytes"], tuple(Opt.parse(o) for o in d["opts"]), global_size, local_size,
                           tuple(d["variables"]), d["shared_bytes"])
    except (ValueError, KeyError, TypeError, AttributeError, StopIteration):  # JSONDecodeError, UnicodeDecodeError too
        return None


def as_size(x: object) -> Size:
    """A launch size read back from JSON: an int, or a symbolic size (renderer.size_form) whose lists were tuples."""
    if type(x) is int: return x
    if isinstance(x, list) and x and x[0] == "var" and len(x) == 2 and isinstance(x[1], str): return ("var", x[1])
    if isinstance(x, list) and len(x) == 3 and x[0] in SIZE_OPS.values(): return (x[0], as_size(x[1]), as_size(x[2]))
    raise ValueError(f"not a launch size: {x!r}")


def print_schedule(schedule: list[ExecItem | LoopItem], indent: str = "") -> None:
    """One line per kernel: its name, what it writes and what it reads; a loop's body indented under it."""
    if not indent: print(colored(f"schedule: {len(schedule)} kernels", "magenta"))
    for i, item in enumerate(schedule):
        if isinstance(item, LoopItem):
            print(f"  {indent}{i:3d} loop of {item.length} steps: carries {[b.size for b in item.carry]}, xs "
                  f"{[b.size for b in item.x]}, y {item.y_size}")
            print_schedule(item.body, indent + "    ")
            continue
        reads = ", ".join(f"{b.dtype.name}[{b.size}]" for b in item.bufs[item.outs:]) or "nothing"
        writes = ", ".join(f"{b.dtype.name}[{b.size}]" for b in item.bufs[:item.outs])
        print(f"  {indent}{i:3d} {kernel_name(item.ast):24s} writes {writes} reads {reads}")


class Realized(NamedTuple):
    """What `realize_graph` did: each output's view of the buffer that holds it, and the nodes the schedule's walk
    saw under a single output when it saw them all (None: it stopped at a stored node, or there were several
    outputs), so that the caller can tell without a walk of its own what the output was computed from."""

    views: list[UOp]
    walked: list[UOp] | None


def realize_graph(outputs: list[UOp], device: str) -> Realized:
    """Compute `outputs` (tensor-level graphs) into buffers on `device`: the schedule from the schedule cache, run,
    its large intermediates in a memory plan; every node computed is entered in `kernelize.computed`, so that a
    later graph reads its buffer instead of computing it again. This is the engine's one entry for Tensor.realize:
    the policy (which buffers a plan may share, which values are worth keeping) lives here, not in the Tensor."""
    graph = schedule_cache.structure(outputs, device)
    if graph.bound if graph is not None else BOUND[0] and any(u.bound for u in outputs):
        return realize_symbolic(outputs, device)
    items, views = schedule_cache.schedule(outputs, device, graph)
    keep = {buffer_of(v.src[0]) for u in outputs if (v := views[u]).op is Ops.RESHAPE and
            v.src[0].op is Ops.BUFFER} if len(items) > 2 else None  # (fewer share no memory)
    plan = run_schedule(items, keep)
    shared = {id(p.buf) for p in plan.placements} if plan is not None else set()  # buffers holding other values now
    computed.update({node: view for node, view in views.items() if node is not view and not is_constant(node) and
                     not (shared and view.op is Ops.RESHAPE and view.src[0].op is Ops.BUFFER and
                          id(buffer_of(view.src[0])) in shared)})  # (a constant is cheaper made again than read)
    walked = graph.nodes if graph is not None and not graph.stored and len(outputs) == 1 else None
    return Realized([views[u] for u in outputs], walked)


def realize_symbolic(outputs: list[UOp], device: str) -> Realized:
    """realize_graph, for graphs whose shapes hold bound variables: scheduled over the variables (unbind), run with
    their values, each stored view bound again."""
    unbound, values = unbind(outputs)
    items, views = schedule_cache.schedule(unbound, device)
    run_schedule(items, None, {var.arg.name: value for var, value in values.items()})
    result = [rebind(views[u], values) for u in unbound]
    computed.update({u: view for u, view in zip(outputs, result, strict=True) if view is not u and not is_constant(u)})
    return Realized(result, None)


PLAN_MIN_BYTES = 1 << 20  # intermediates of a schedule that take this much memory or more share it (memory.py)


def run_schedule(schedule: list[ExecItem | LoopItem], keep: set[Buffer] | None = None,
                 values: dict[str, int] | None = None) -> MemoryPlan | None:
    """Run every item in order, updating GlobalCounters. Given `keep` (the buffers read after the schedule: its
    outputs), the others, intermediates, share memory where their lifetimes allow if they take PLAN_MIN_BYTES or
    more; the plan is returned (its buffers hold views of an arena: what they held is not to be read after).
    `values`: the value of each variable the kernels' sizes hold, by name (schedule/unbind.py)."""
    if DEBUG >= 2: print_schedule(schedule)
    flags = codegen_flags()
    if len(schedule) > 1 and any(type(item) is not ExecItem or (item.bufs[0].device, item.ast, flags) not in _runners
                                 for item in schedule):  # (one kernel: run_items builds its runner)
        prepare_runners([(item.bufs[0].device, item.ast) for item in kernels(schedule)])  # (usually all are built)
    plan = None
    if keep is not None and len(schedule) > 2:
        temporary = {id(b): b for item in schedule for b in item.bufs[:item.outs] if b not in keep}
        if sum(b.nbytes for b in temporary.values()) >= PLAN_MIN_BYTES:
            plan = plan_memory(schedule, keep).apply()
            if DEBUG >= 2: print(plan.describe())
    run_items(schedule, values)
    return plan


def run_loop(item: LoopItem, run: Callable[[list[ExecItem | LoopItem]], None]) -> None:
    """A loop's steps from Python, `run` running the body: the carries, xs' rows and y moved through host copies."""
    if RECORDERS: RECORDERS[-1].loop()
    n = item.length
    rows = [xs.numpy().reshape(n, x.size) for xs, x in zip(item.xs, item.x, strict=True)]
    for carry, start in zip(item.carry, item.carry0, strict=True): carry.copyin(start.numpy())
    ys = np.empty((n, item.y_size), dtype=to_numpy(item.result.dtype))
    for k in range(n):
        for x, r in zip(item.x, rows, strict=True): x.copyin(r[k])
        run(item.body)
        for carry, nxt in zip(item.carry, item.out[:-1], strict=True):
            if carry is not nxt: carry.copyin(nxt.numpy())
        ys[k] = item.out[-1].numpy()
    item.result.copyin(np.concatenate([*(carry.numpy() for carry in item.carry), ys.reshape(-1)]))


def run_items(schedule: list[ExecItem | LoopItem], values: dict[str, int] | None = None) -> None:
    debug, flags = DEBUG >= 1, codegen_flags()
    for item in schedule:
        if type(item) is LoopItem:
            run_loop(item, run_items)
            continue
        if (runner := _runners.get(key := (item.bufs[0].device, item.ast, flags))) is None:
            runner = get_runner(item.bufs[0].device, item.ast)
        else:
            _runners[key] = _runners.pop(key)
        vals = tuple(values[name] for name in runner.spec.variables) if runner.spec.variables else ()  # type: ignore
        if RECORDERS.stack: RECORDERS[-1].kernel(runner, item.bufs, item.outs, vals)
        start = time.perf_counter()
        elapsed = runner.program(*item.bufs, vals=vals, wait=debug)  # type: ignore[operator]
        elapsed = elapsed if elapsed is not None else time.perf_counter() - start
        GlobalCounters.kernel_count += 1
        GlobalCounters.global_ops += runner.spec.flops
        GlobalCounters.global_mem += runner.spec.mem_bytes
        GlobalCounters.time_sum_s += elapsed
        if debug:
            print(f"*** {item.bufs[0].device:4s} {GlobalCounters.kernel_count:4d} {runner.spec.name:24s} "
                  f"{len(item.bufs)} bufs  {elapsed * 1e6:9.2f} us  {runner.spec.flops / 1e6:8.2f} MOPs  "
                  f"{runner.spec.mem_bytes / 1e6:8.2f} MB" +
                  (f"  opts {' '.join(map(str, runner.spec.opts))}" if DEBUG >= 2 and runner.spec.opts else ""))
