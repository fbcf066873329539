"""BEAM search (BEAM=n): a kernel's opts chosen by compiling and timing candidates on this machine.

In: a kernel after split_periodic (see get_program), the renderer, the beam width n and the kernel's name. Out: the
opt list (codegen/opt.py) of the fastest kernel found.

The search proper starts from the kernel with no opts. Each step extends every kernel of the beam by one opt
(`actions`: UPCAST or UNROLL of an axis by an amount dividing it, THREAD over the cores, SWAP of two output loops);
those apply_opt accepts are rendered, compiled in parallel (the compiler is a subprocess, so threads suffice) and
timed one after another; the n fastest form the next beam. It stops when a step's best beats the best so far by less
than MIN_GAIN, or after MAX_STEPS. The heuristic's kernel (codegen/heuristic.py) and those one opt beyond it are
timed too, apart from the beam, whose stopping rule they would otherwise end at once. The finalists (the last beam,
the best near the heuristic, the two starting kernels) are timed again in turn, and the fastest wins: it is never
slower than the heuristic's kernel as timed then.

Kernels run on buffers of the kernel's sizes made for the search, never the user's (which hold data, and may alias).
A kernel's time is the minimum of a few runs; one DROP_SLOWER times slower than the kernel it grew from after its
first run (and a retry) is dropped, as is one that does not compile.

Winners are kept on disk in cache_dir()/beam/ as a checked JSON list of opt texts, keyed by the kernel's text, the
renderer and its settings, the device's compiler and n: a second process searches nothing. The key leaves ember's
source out on purpose: a search costs seconds per kernel, and any legal opt list computes the same values, so a
list found by an older ember is still right; one that no longer applies (KernelOptError) is searched again.
CACHELEVEL=0 keeps no winners. A progress line on stderr shows the search where stderr is a terminal; DEBUG>=1 logs
each search's result.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.codegen.heuristic import hand_coded_opts
from ember.codegen.opt import KernelOptError, Opt, OptOps, apply_opt, apply_opts, kernel_axes, range_size
from ember.codegen.pipeline import lower_optimized, program_spec
from ember.device import Buffer, Compiled, Device, cache_write, discard_damaged, read_cached
from ember.errors import CompileError
from ember.helpers import CACHELEVEL, DEBUG, cache_dir
from ember.renderer import ProgramSpec, Renderer
from ember.uop.ops import AxisKind, Ops, UOp
from ember.uop.text import graph_text, value_text

LANE_AMOUNTS = (2, 3, 4, 8, 16, 32)  # UPCAST/UNROLL amounts tried (with an axis's whole size, up to 32)
MAX_LANES = 512  # the most lanes (product of UPCAST/UNROLL amounts) a candidate grows to: a GEMM's 8x32 tile is 256
# the most nodes times lanes: expand copies a kernel's body per lane (a 314-node random-number kernel renders in 2.2 s
# with 256 lanes, a 21-node matmul in 0.3 s), and a large body gains little from unrolling
MAX_UNROLLED_NODES = 16384
MAX_STEPS = 12  # opts the search proper adds at most (the heuristic's lists hold up to 4)
MIN_GAIN = 0.02  # a step must beat the best by 2% to go on: less is within the noise of a timing on a busy machine
DROP_SLOWER = 3.0  # a candidate this many times slower than its parent after one run is not run again
RUN_BUDGET_S = 0.02  # seconds of extra runs per candidate, for a minimum less disturbed by noise
MIN_RUNS, MAX_RUNS = 2, 10  # extra runs per candidate: a kernel of microseconds fits many into the budget
FINAL_ROUNDS = 3  # the finalists are timed again in turn this often: a load that came and went meanwhile favoured some
BEAM_FORMAT = "ember beam 1"  # bump when the entry's fields or the meaning of an opt change


class SearchCounters:
    """Totals for this process: searches run (not served from the cache) and candidates timed."""

    searches: int = 0
    timed: int = 0


@dataclass(frozen=True)
class Candidate:
    """A kernel under test: its opts and the kernel with them applied."""

    opts: tuple[Opt, ...]
    sink: UOp


@dataclass(frozen=True)
class Timed:
    """A candidate, its time in seconds (the minimum of its runs) and its loaded program, to time it again."""

    seconds: float
    candidate: Candidate
    program: Any


def beam_search(sink: UOp, renderer: Renderer, name: str, amount: int) -> list[Opt]:
    """The opts of the fastest kernel found for `sink` with a beam of `amount` (see the module docstring): from the
    disk cache when a process searched this kernel before. A kernel with no loop to split has nothing to search; one
    with symbolic sizes cannot be timed, and gets the heuristic's opts."""
    if not kernel_axes(sink): return []
    if any(u.op is Ops.DEFINE_VAR or (u.op is Ops.RANGE and u.src[0].op is not Ops.CONST) for u in sink.toposort()):
        return hand_coded_opts(sink, renderer)
    device = Device[renderer.device]
    if not CACHELEVEL or (key := winner_key(sink, renderer, device, amount)) is None:
        return search(sink, renderer, device, name, max(1, amount))
    path = os.path.join(cache_dir(), "beam", key[:2], key + ".json")
    if (opts := read_winner(path, key)) is not None and applies(sink, opts, name, renderer): return opts
    opts = search(sink, renderer, device, name, max(1, amount))
    cache_write(path, winner_to_json(key, opts))
    return opts


# ---- the search --------------------------------------------------------------------------------------------------

def search(sink: UOp, renderer: Renderer, device: Compiled, name: str, amount: int) -> list[Opt]:
    """The beam search proper, timing on `device` (see the module docstring)."""
    SearchCounters.searches += 1
    bench, lanes = Bench(sink, renderer, device, name), min(MAX_LANES, MAX_UNROLLED_NODES // len(list(sink.toposort())))
    heuristic = tuple(hand_coded_opts(sink, renderer))
    start = [Candidate((), sink)]
    if heuristic: start.append(Candidate(heuristic, apply_opts(sink, heuristic, name, renderer)))
    starts = bench.measure(start, "start", math.inf)
    tuned = [t for t in starts if t.candidate.opts == heuristic and heuristic]  # the heuristic's kernel, one opt on
    if tuned: tuned = bench.measure(extend(tuned[0].candidate, renderer, name, lanes), "heuristic+1", tuned[0].seconds)
    beam, step = [t for t in starts if not t.candidate.opts], 0  # the search proper starts from no opts
    while beam and step < MAX_STEPS:
        best, step = beam[0], step + 1
        children = [c for parent in beam[:amount] for c in extend(parent.candidate, renderer, name, lanes)]
        if not (timed := bench.measure(children, f"step {step}", best.seconds)): break
        beam = timed if timed[0].seconds < best.seconds * (1 - MIN_GAIN) else [best, *timed]
        if beam[0] is best: break
    finalists = list({t.candidate.sink: t for t in [*beam[:amount], *tuned[:amount], *starts]}.values())
    if not finalists: return list(heuristic)  # nothing compiled: the choice is the heuristic's
    timed = bench.time_again(finalists)
    bench.finish(timed, starts, step)
    return list(timed[0].candidate.opts)


def extend(parent: Candidate, renderer: Renderer, name: str, max_lanes: int) -> list[Candidate]:
    """The candidates one legal opt beyond `parent` that have at most `max_lanes` lanes."""
    lanes = math.prod(o.amount for o in parent.opts if o.op in (OptOps.UPCAST, OptOps.UNROLL))
    out = []
    for opt in actions(parent.sink, renderer):
        if opt.op in (OptOps.UPCAST, OptOps.UNROLL) and lanes * opt.amount > max_lanes: continue
        try:
            out.append(Candidate((*parent.opts, opt), apply_opt(parent.sink, opt, name, renderer)))
        except KernelOptError:  # threaded twice, too many threads: apply_opt knows what is legal
            continue
    return out


WORKGROUP_AMOUNTS = (4, 8, 16, 32, 64, 128, 256)  # threads a LOCAL or GROUP candidate gives an axis


def actions(sink: UOp, renderer: Renderer) -> list[Opt]:
    """The opts worth trying next on `sink`: UPCAST (output axes) or UNROLL (reduce axes) by each of LANE_AMOUNTS
    and the whole size up to 32 that divide the axis; THREAD of an output axis by the core count (at most the
    renderer's max_threads), or where that does not divide it, by its largest divisor below; on a device with
    workgroups LOCAL (output axes) and GROUP and GROUPTOP (reduce axes) by each of WORKGROUP_AMOUNTS that divides;
    TC of each reduce axis on each of the renderer's tensor cores; SWAP of each two output axes. Some may still be
    illegal."""
    axes = kernel_axes(sink)
    outputs = [i for i, a in enumerate(axes) if a.arg.kind is not AxisKind.REDUCE]
    opts: list[Opt] = []
    for i, axis in enumerate(axes):
        size = range_size(axis)
        whole = {size} if 1 < size <= max(LANE_AMOUNTS) else set()
        amounts = sorted({n for n in LANE_AMOUNTS if size % n == 0} | whole)
        opts += [Opt(OptOps.UPCAST if i in outputs else OptOps.UNROLL, i, n) for n in amounts]
        if i in outputs and renderer.cores > 1:
            most = min(renderer.cores, renderer.max_threads)
            threads = max((n for n in range(2, most + 1) if size % n == 0), default=None)
            if threads is not None: opts.append(Opt(OptOps.THREAD, i, threads))
        if renderer.has_local:  # workgroups: threads along an output axis, or a reduction split across them
            kinds = [OptOps.LOCAL] if i in outputs else [OptOps.GROUP, OptOps.GROUPTOP] * renderer.has_shared
            opts += [Opt(kind, i, n) for kind in kinds for n in WORKGROUP_AMOUNTS if size % n == 0 and n <= size]
        if i not in outputs: opts += [Opt(OptOps.TC, i, which) for which in range(len(renderer.tensor_cores))]
    return opts + [Opt(OptOps.SWAP, i, j) for i in outputs for j in outputs if i < j]


def render(sink: UOp, opts: tuple[Opt, ...], renderer: Renderer, name: str) -> ProgramSpec:
    """The program of `sink`, whose `opts` are applied, as get_program renders it."""
    return program_spec(sink, name, lower_optimized(sink, opts, renderer), renderer, opts)


# ---- timing --------------------------------------------------------------------------------------------------------

class Bench:
    """Compiles and times candidates of one kernel on buffers of its sizes made for the search, and shows progress.
    Inputs are zeros (an index of 0 is in range of any table) written to every page, so that no read is served by the
    shared zero page a fresh allocation maps; each buffer slot has its own buffer, so outputs alias no input."""

    def __init__(self, sink: UOp, renderer: Renderer, device: Compiled, name: str) -> None:
        self.renderer, self.device, self.name = renderer, device, name
        globals_ = sorted({u for u in sink.toposort() if u.op is Ops.DEFINE_GLOBAL}, key=lambda u: u.arg)
        self.bufs = [Buffer(device.name, g.dtype.size, g.dtype.base).ensure_allocated() for g in globals_]
        for buf in self.bufs: device.allocator.copyin(buf.raw, memoryview(np.zeros(buf.nbytes, np.uint8)))
        self.best = math.inf  # the fastest time so far, for the progress line
        self.timed: dict[UOp, Timed | None] = {}  # every kernel measured (None: failed or dropped), by its sink
        self.line = Progress(name)

    def measure(self, candidates: list[Candidate], label: str, parent: float) -> list[Timed]:
        """The candidates that compiled and were not dropped (first run over DROP_SLOWER x `parent`, the time of the
        kernel they grew from), fastest first; a kernel measured before keeps its time. Each is rendered here while
        the ones before it compile on a thread pool, then all are timed one by one (a compiler running meanwhile
        would slow some of them down)."""
        unique = list({c.sink: c for c in candidates}.values())  # equal kernels are one UOp (hash-consing)
        fresh = [c for c in unique if c.sink not in self.timed]
        programs = []
        with ThreadPoolExecutor(max_workers=max(1, self.renderer.cores)) as pool:
            jobs: list[tuple[Candidate, int, Future[bytes]]] = []
            for i, c in enumerate(fresh):
                self.progress(f"{label}: rendering {i + 1}/{len(fresh)}")
                self.timed[c.sink] = None
                try:
                    spec = render(c.sink, c.opts, self.renderer, self.name)
                except NotImplementedError:  # a vector op the renderer lacks: not a kernel this device runs
                    continue
                jobs.append((c, spec, pool.submit(self.device.compiler.compile, spec.src)))
            for i, (c, spec, job) in enumerate(jobs):
                self.progress(f"{label}: compiling {i + 1}/{len(jobs)}")
                try:
                    lib = job.result()
                except CompileError:
                    continue
                # not kept in the cache (which keeps only the winner), nor on disk once loaded
                programs.append((c, self.device.program(spec, lib, cached=False)))
        for i, (c, program) in enumerate(programs):
            self.progress(f"{label}: timing {i + 1}/{len(programs)}")
            if (seconds := self.time(program, DROP_SLOWER * parent)) is not None:
                self.timed[c.sink] = Timed(seconds, c, program)
        return sorted((t for c in unique if (t := self.timed[c.sink]) is not None), key=lambda t: t.seconds)

    def time(self, program: Any, limit: float) -> float | None:
        """The minimum time of a few runs of `program`; None where its first run and a retry take over `limit` (the
        retry forgives a first run that paid for starting threads, faulting pages or another process's burst)."""
        SearchCounters.timed += 1
        first = self.run(program)
        if first > limit: first = min(first, self.run(program))
        if first > limit: return None
        seconds = min(first, self.repeat(program, first))
        self.best = min(self.best, seconds)
        return seconds

    def run(self, program: Any) -> float:
        return program(*self.bufs, wait=True)

    def repeat(self, program: Any, estimate: float) -> float:
        """The fastest of as many runs as fit RUN_BUDGET_S for a kernel of about `estimate` seconds, within MIN_RUNS
        and MAX_RUNS."""
        runs = min(MAX_RUNS, max(MIN_RUNS, int(RUN_BUDGET_S / max(estimate, 1e-9))))
        return min(self.run(program) for _ in range(runs))

    def time_again(self, finalists: list[Timed]) -> list[Timed]:
        """The finalists timed again, in turn for FINAL_ROUNDS rounds, fastest first: their times from the search
        were taken apart, some while the machine was busier than others."""
        seconds = [math.inf] * len(finalists)
        for _ in range(FINAL_ROUNDS):
            for i, t in enumerate(finalists): seconds[i] = min(seconds[i], self.repeat(t.program, t.seconds))
        return sorted((Timed(s, t.candidate, t.program) for s, t in zip(seconds, finalists, strict=True)),
                      key=lambda t: t.seconds)

    def finish(self, timed: list[Timed], starts: list[Timed], steps: int) -> None:
        """End the progress line with the winner and its time, and the times of the kernels the search started
        from, all as timed last."""
        again = {t.candidate.sink: t.seconds for t in timed}
        start = ", ".join(f"{'heuristic' if t.candidate.opts else 'no opts'} {again[t.candidate.sink] * 1e6:.1f} us"
                          for t in starts)
        winner = " ".join(map(str, timed[0].candidate.opts)) or "no opts"
        self.line.end(f"{winner} after {steps} steps, {len(self.timed)} kernels ({start})", timed[0].seconds)

    def progress(self, text: str) -> None:
        self.line.show(text, self.best)


class Progress:
    """One line on stderr, rewritten in place (\\r) while a search runs where stderr is a terminal; its final text
    (the winner) stays. With DEBUG>=1 and stderr not a terminal (a log), only the final text is written."""

    def __init__(self, name: str) -> None:
        self.name, self.width = name, 0
        self.is_live = sys.stderr.isatty()

    def line(self, text: str, best: float) -> str:
        return f"BEAM {self.name}: {text}" + (f", best {best * 1e6:.1f} us" if best < math.inf else "")

    def show(self, text: str, best: float) -> None:
        if not self.is_live: return
        line = self.line(text, best)
        sys.stderr.write("\r" + line.ljust(self.width))
        sys.stderr.flush()
        self.width = len(line)

    def end(self, text: str, best: float) -> None:
        if self.is_live: self.show(text, best)
        elif DEBUG >= 1: sys.stderr.write(self.line(text, best))
        else: return
        sys.stderr.write("\n")


# ---- the winner cache ----------------------------------------------------------------------------------------------

def winner_key(sink: UOp, renderer: Renderer, device: Compiled, amount: int) -> str | None:
    """The hash that names the winner of `sink`'s search (see the module docstring); None where some arg of the
    kernel has no stable text, so that two kernels could not be told apart."""
    try:
        text = "\n".join([BEAM_FORMAT, f"{type(renderer).__module__}.{type(renderer).__qualname__}", renderer.device,
                          value_text(vars(renderer), {}), device.compiler.cache_key, f"beam {amount}",
                          graph_text(sink)])
    except TypeError:
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def winner_to_json(key: str, opts: list[Opt]) -> bytes:
    texts = [str(o) for o in opts]
    return json.dumps({"opts": texts, "sha256": winner_checksum(key, texts)}).encode()


def winner_checksum(key: str, texts: list[str]) -> str:
    return hashlib.sha256(f"{BEAM_FORMAT}\0{key}\0{json.dumps(texts)}".encode()).hexdigest()


def read_winner(path: str, key: str) -> list[Opt] | None:
    """The opts cached at `path` for `key`; None where there are none. An entry that is damaged, or is another
    key's, is deleted with a CacheWarning (`discard_damaged`), and the kernel searched again."""
    if (data := read_cached(path)) is None: return None
    try:
        entry = json.loads(data)
        texts = entry["opts"]
        if isinstance(texts, list) and all(isinstance(t, str) for t in texts) and \
                entry["sha256"] == winner_checksum(key, texts):
            return [Opt.parse(t) for t in texts]
    except (ValueError, KeyError, TypeError, StopIteration):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        pass
    discard_damaged(path, "not a BEAM winner of this kernel (unreadable, altered, or another kernel's)")
    return None


def applies(sink: UOp, opts: list[Opt], name: str, renderer: Renderer) -> bool:
    """Whether `opts` still apply to `sink` on `renderer` (a list cached by an older ember may not)."""
    try:
        apply_opts(sink, opts, name, renderer)
    except KernelOptError:
        return False
    return True
