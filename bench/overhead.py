"""Dispatch overhead (issue 16): ember's eager and jitted calls against numpy, torch, torch.compile and tinygrad.

Run: python bench/overhead.py                  (about 1 minute on 2 cores)
     python bench/overhead.py --rounds 3       (fewer rounds: a quicker, noisier run)
     python bench/overhead.py --only tiny      (the two tiny-op cases; `mlp` for the training steps)
     python bench/overhead.py --threads 1      (every framework on one thread; default: all cores)

Cases, all float32:
  eager   (a + 1) on 16 floats, realized: ember Tensor.realize, numpy a + 1, torch eager a + 1, tinygrad
          (a + 1).realize(). Issue 16's target: ember <= 25 µs.
  jit     a jitted f(x) = x + 1 on 16 floats, called with a realized tensor after its warm-up calls (ember records on
          the first two calls and replays from the third): ember.jit, torch.compile(f), tinygrad TinyJit of
          (x + 1).realize(). Target: ember <= 10 µs.
  mlp     one SGD step (lr 0.01) of an MLP 784-512-512-10 with relu and a cross-entropy loss, batch 64: ember.jit of
          `opt.zero_grad(); loss = ...; loss.backward(); opt.step(loss)` with ember.nn.Linear and ember.nn.optim.SGD;
          the same step eager (ember-eager); the same step jitted with the batch a Variable bound to 64 (ember
          symbolic: its kernels serve any batch up to 256); torch eager; torch.compile of the whole step (dynamo
          breaks the graph at backward: the forward, the backward and the optimizer step compile apart); tinygrad
          TinyJit of the step.
          Every framework starts from the same weights and batch (numpy, seed 0): the first step's losses are
          printed and must agree.
  kernels ember's jitted step as its kernels alone: the kernels the replay runs (step.replay.kernels), in their
          order, each program called on its recorded buffers and timed on its own (runner.program(..., wait=True));
          their sum, the median over 9 such passes: what the kernels cost in the step, without what runs between
          them. Target: the jitted step within 5% of this sum (replay / kernels <= 1.05). The ratio is printed twice:
          from the medians of the `ember` and `ember kernels` columns, and paired: in each `kernels` sample a step
          and a pass of its kernels alternate, and their ratio is taken per round (robust to a machine whose speed
          drifts between batches).

Each framework runs in a worker process of its own (ember, numpy, torch, torch.compile, tinygrad with DEV=CPU:CLANG),
which builds and warms every case first; a framework that fails to import or to run a case is skipped with a line
saying why. The timed batches then go round the workers, a different one first in each round, with a pause between
batches (thread pools spin for a while after a call and would slow the next worker). A batch is as many calls as fill
about 40 ms (tiny ops) or 150 ms (training steps), measured at warm-up; its time per call is one sample, and a cell is
the median sample over the rounds, with the range (min-max). tinygrad's CPU device runs kernels on a thread of its
own: every call is followed by a synchronize, as the other frameworks return with the result computed. Ratios are
ember / peer: above 1, ember is slower. `busy` is the worker's process CPU time over the wall time of its batches:
near 1 per thread when it had the cores to itself, about 0.5 for one thread when another job took half a core (every
figure is then about twice too slow, and the short per-kernel timings of `kernels` dodge the wait better than a whole
step does: compare jit / kernels on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

WORKERS = ["ember", "numpy", "torch", "torch.compile", "tinygrad"]
TINY, BATCH, SIZES, LR = 16, 64, (784, 512, 512, 10), 0.01
BATCH_SECONDS = {"eager": 0.04, "jit": 0.04, "mlp": 0.15, "mlp-eager": 0.15, "mlp-symbolic": 0.15, "kernels": 0.0}
PAUSE = 0.1  # s between batches
KERNEL_REPEATS = 9  # passes over the kernels (and steps) in a `kernels` sample, the median taken

# a case's body: one call (the batch loop calls it n times)
Call = Callable[[], Any]


def mlp_data() -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The MLP's weights and biases (torch's layout: weight is out x in, uniform in +-1/sqrt(in)), a batch of inputs
    in [0, 1) and int labels: the same arrays in every worker."""
    rng = np.random.default_rng(0)
    params: list[np.ndarray] = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:], strict=True):
        bound = 1 / np.sqrt(fan_in)
        params += [rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
                   rng.uniform(-bound, bound, fan_out).astype(np.float32)]
    return params, rng.random((BATCH, SIZES[0]), dtype=np.float32), rng.integers(0, SIZES[-1], BATCH)


def tiny_input() -> np.ndarray:
    return np.linspace(-1.0, 1.0, TINY, dtype=np.float32)


# ---- the frameworks: each builds its cases as {name: (call, first loss or None)} ----

def ember_cases(mlp: bool) -> tuple[str, dict[str, Call], dict[str, float], dict[str, Any]]:
    """ember's calls; also the first step's loss of each training step, and the jitted step (for `kernels`)."""
    from ember import Tensor, Variable, jit
    from ember.nn import Linear
    from ember.nn.optim import SGD

    a = Tensor(tiny_input()).realize()
    calls: dict[str, Call] = {"eager": lambda: (a + 1).realize()}

    @jit
    def add_one(x: Tensor) -> Tensor: return x + 1
    calls["jit"] = lambda: add_one(a)
    if not mlp: return "ember", calls, {}, {}

    arrays, xs, ys = mlp_data()
    x, y = Tensor(xs).realize(), Tensor(ys.astype(np.int32)).realize()

    def make_step() -> Callable[[Tensor, Tensor], Tensor]:
        layers = [Linear(i, o) for i, o in zip(SIZES[:-1], SIZES[1:], strict=True)]
        for k, layer in enumerate(layers):
            layer.weight, layer.bias = Tensor(arrays[2 * k]).realize(), Tensor(arrays[2 * k + 1]).realize()
        opt = SGD([t for layer in layers for t in (layer.weight, layer.bias) if t is not None], lr=LR)

        def step(x: Tensor, y: Tensor) -> Tensor:
            opt.zero_grad()
            h = x
            for layer in layers[:-1]: h = layer(h).relu()
            loss = layers[-1](h).cross_entropy(y)
            loss.backward()
            opt.step(loss)
            return loss
        return step

    jitted, eager, symbolic = jit(make_step()), make_step(), jit(make_step())
    bs = Variable("bs", 1, 4 * BATCH).bind(BATCH)  # the batch as a symbolic size: kernels for any batch up to 256
    xs, ys = x.reshape(bs, SIZES[0]), y.reshape(bs)
    losses: dict[str, float] = {}
    with Tensor.train():
        losses["mlp"] = jitted(x, y).item()
        losses["mlp-eager"] = eager(x, y).item()
        losses["mlp-symbolic"] = symbolic(xs, ys).item()
    calls["mlp"] = lambda: train_call(Tensor, jitted, x, y)
    calls["mlp-eager"] = lambda: train_call(Tensor, eager, x, y)
    calls["mlp-symbolic"] = lambda: train_call(Tensor, symbolic, xs, ys)
    return "ember", calls, losses, {"jitted": jitted}


def train_call(tensor: Any, step: Callable[[Any, Any], Any], x: Any, y: Any) -> Any:
    with tensor.train(): return step(x, y)


def ember_kernel_sum(jitted: Any, step: Call) -> Callable[[], tuple[float, float]]:
    """One `kernels` sample: KERNEL_REPEATS times, a call of the jitted step, then a pass over the replay's kernels
    in their order, each timed on its own; the medians of the passes' sums and of the steps. (Each kernel run 9
    times in a row, as before, finds its data in cache from its previous run: a sum a step, whose kernels each read
    what the one before wrote, never reaches. The step and its kernels taken in turn see the same machine: their
    ratio holds on a machine whose speed drifts from one second to the next, as this shared one's does.)"""
    replay = jitted.replay
    if replay is None: raise RuntimeError("the jitted step has no replay after its warm-up calls")
    runs = [(runner.program, [b.raw for b in bufs]) for runner, bufs, _ in replay.kernels]

    def kernel_sum() -> tuple[float, float]:
        kernels, steps = [], []
        for _ in range(KERNEL_REPEATS):
            start = time.perf_counter()
            step()
            steps.append(time.perf_counter() - start)
            kernels.append(sum(program(*raws, wait=True) for program, raws in runs))
        return statistics.median(kernels), statistics.median(steps)
    return kernel_sum


def numpy_cases(mlp: bool) -> tuple[str, dict[str, Call], dict[str, float], dict[str, Any]]:
    a = tiny_input()
    return f"numpy {np.__version__}", {"eager": lambda: a + 1}, {}, {}


def torch_cases(compiled: bool, mlp: bool) -> tuple[str, dict[str, Call], dict[str, float], dict[str, Any]]:
    import torch
    import torch.nn.functional as F  # noqa: N812

    about = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    a = torch.from_numpy(tiny_input())
    calls: dict[str, Call] = {}
    if compiled:
        def add_one(x: torch.Tensor) -> torch.Tensor: return x + 1
        fn = torch.compile(add_one)
        calls["jit"] = lambda: fn(a)
    else: calls["eager"] = lambda: a + 1
    about += ", torch.compile (inductor)" if compiled else ""
    if not mlp: return about, calls, {}, {}

    arrays, xs, ys = mlp_data()
    x, y = torch.from_numpy(xs), torch.from_numpy(ys.astype(np.int64))
    layers = [torch.nn.Linear(i, o) for i, o in zip(SIZES[:-1], SIZES[1:], strict=True)]
    with torch.no_grad():
        for k, layer in enumerate(layers):
            layer.weight.copy_(torch.from_numpy(arrays[2 * k]))
            layer.bias.copy_(torch.from_numpy(arrays[2 * k + 1]))
    opt = torch.optim.SGD([p for layer in layers for p in layer.parameters()], lr=LR)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        h = x
        for layer in layers[:-1]: h = F.relu(layer(h))
        loss = F.cross_entropy(layers[-1](h), y)
        loss.backward()
        opt.step()
        return loss
    run = torch.compile(step) if compiled else step
    losses = {"mlp": float(run(x, y).item())}
    calls["mlp"] = lambda: run(x, y)
    return about, calls, losses, {}


def tinygrad_cases(mlp: bool) -> tuple[str, dict[str, Call], dict[str, float], dict[str, Any]]:
    from importlib.metadata import version

    from tinygrad import Context, Device, Tensor, TinyJit
    from tinygrad.nn import Linear
    from tinygrad.nn.optim import SGD

    device = Device[Device.DEFAULT]
    about = f"tinygrad {version('tinygrad')}, {Device.DEFAULT} ({type(device.renderer).__name__})"
    a = Tensor(tiny_input()).realize()

    def eager() -> Any:
        out = (a + 1).realize()
        device.synchronize()
        return out

    add_one = TinyJit(lambda x: (x + 1).realize())

    def jitted() -> Any:
        out = add_one(a)
        device.synchronize()
        return out
    if not mlp: return about, {"eager": eager, "jit": jitted}, {}, {}

    arrays, xs, ys = mlp_data()
    x, y = Tensor(xs).realize(), Tensor(ys.astype(np.int32)).realize()
    layers = [Linear(i, o) for i, o in zip(SIZES[:-1], SIZES[1:], strict=True)]
    for k, layer in enumerate(layers):
        layer.weight, layer.bias = Tensor(arrays[2 * k]).realize(), Tensor(arrays[2 * k + 1]).realize()
    opt = SGD([t for layer in layers for t in (layer.weight, layer.bias) if t is not None], lr=LR)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        h = x
        for layer in layers[:-1]: h = layer(h).relu()
        loss = layers[-1](h).sparse_categorical_crossentropy(y)
        loss.backward()
        return loss.realize(*opt.schedule_step())

    def train() -> Any:
        with Context(TRAINING=1):  # tinygrad's optimizers step only in training mode
            loss = step(x, y)
        device.synchronize()
        return loss
    losses = {"mlp": float(train().item())}
    return about, {"eager": eager, "jit": jitted, "mlp": train}, losses, {}


# ---- a worker: one framework in a process of its own ----

def calibrate(call: Call, seconds: float) -> int:
    """Warm call up (ember's jit records on its first two calls) and return how many calls fill `seconds`."""
    for _ in range(3): call()
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n): call()
        if (took := time.perf_counter() - start) >= seconds or n >= 1 << 20: return n
        n = max(n + 1, min(n * 8, int(n * 1.2 * seconds / max(took, 1e-9))))


def worker(name: str, only: str | None) -> None:
    """Serve one framework: JSON requests on stdin, one JSON reply per line on the original stdout."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the frameworks print goes to stderr

    def reply(**msg: Any) -> None:
        replies.write(json.dumps(msg) + "\n")
        replies.flush()

    def short(e: BaseException) -> str:
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
    builders: dict[str, Callable[[bool], tuple[str, dict[str, Call], dict[str, float], dict[str, Any]]]] = {
        "ember": ember_cases, "numpy": numpy_cases, "tinygrad": tinygrad_cases,
        "torch": lambda mlp: torch_cases(False, mlp), "torch.compile": lambda mlp: torch_cases(True, mlp)}
    try:
        about, calls, losses, extra = builders[name](only != "tiny")
        if only == "mlp": calls = {k: v for k, v in calls.items() if k.startswith("mlp")}
    except Exception as e:
        return reply(error=short(e))
    sizes: dict[str, int] = {}
    errors: dict[str, str] = {}
    for case, call in calls.items():
        try:
            sizes[case] = calibrate(call, BATCH_SECONDS[case])
        except Exception as e:
            errors[case] = short(e)
    if "jitted" in extra and "mlp" in sizes:
        try:
            calls["kernels"] = ember_kernel_sum(extra["jitted"], calls["mlp"])
            calls["kernels"]()
            sizes["kernels"] = 1
        except Exception as e:
            errors["kernels"] = short(e)
    reply(about=about, sizes=sizes, errors=errors, losses=losses)
    for line in sys.stdin:
        msg = json.loads(line)
        case, n = msg["case"], sizes[msg["case"]]
        try:
            call = calls[case]
            cpu = time.process_time()
            if case == "kernels":  # the kernels' sum and the step beside it; busy as over the whole sample
                start = time.perf_counter()
                total, step = call()
                reply(s=total, cpu=total * (time.process_time() - cpu) / (time.perf_counter() - start), step=step)
                continue
            start = time.perf_counter()
            for _ in range(n): call()
            reply(s=(time.perf_counter() - start) / n, cpu=(time.process_time() - cpu) / n)
        except Exception as e:
            reply(error=short(e))


# ---- the orchestrator ----

@dataclass
class Peer:
    """A worker process and what it said at setup."""

    name: str
    proc: subprocess.Popen[str]
    about: str = ""
    sizes: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    losses: dict[str, float] = field(default_factory=dict)
    ready: float = 0.0  # s from the start until its setup was done
    dead: str = ""

    def ask(self, timeout: float, **msg: Any) -> dict[str, Any]:
        if self.dead: return {"error": self.dead}
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if msg:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        if select.select([self.proc.stdout], [], [], timeout)[0] and (line := self.proc.stdout.readline()):
            return json.loads(line)
        self.proc.kill()
        self.dead = f"no answer in {timeout:.0f} s" if self.proc.poll() is None else "died"
        return {"error": self.dead}


def start(names: list[str], timeout: float, only: str | None, threads: int) -> tuple[list[Peer], list[str]]:
    """Start every worker at once (their imports, compiles and warm-ups overlap) and wait for each one's setup."""
    env = dict(os.environ)
    env.setdefault("DEV", "CPU:CLANG")  # tinygrad's CPU device with clang, as bench/cpu.py
    for var in ("EMBER_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUM_CPU_THREADS"): env[var] = str(threads)
    begin = time.perf_counter()
    peers = [Peer(name, subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", name,
                                          *(["--only", only] if only else [])],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True, env=env)) for name in names]
    ready, notes = [], []
    for peer in peers:
        got = peer.ask(timeout)
        if "error" in got:
            notes.append(f"{peer.name}: skipped ({got['error']})")
            continue
        peer.about, peer.sizes, peer.errors = got["about"], got["sizes"], got["errors"]
        peer.losses, peer.ready = got["losses"], time.perf_counter() - begin
        notes += [f"{peer.name}, case {case}: skipped ({why})" for case, why in peer.errors.items()]
        ready.append(peer)
    return ready, notes


# the rows: (case, label, [(column, worker, worker's case)])
ROWS: list[tuple[str, str, list[tuple[str, str, str]]]] = [
    ("eager", f"(a + 1).realize(), {TINY} floats", [("ember", "ember", "eager"), ("numpy", "numpy", "eager"),
                                                     ("torch", "torch", "eager"), ("tinygrad", "tinygrad", "eager")]),
    ("jit", f"jitted x + 1, {TINY} floats", [("ember", "ember", "jit"), ("torch.compile", "torch.compile", "jit"),
                                              ("tinygrad", "tinygrad", "jit")]),
    ("mlp", f"MLP {'-'.join(map(str, SIZES))} SGD step, batch {BATCH}",
     [("ember", "ember", "mlp"), ("ember-eager", "ember", "mlp-eager"), ("ember kernels", "ember", "kernels"),
      ("ember symbolic", "ember", "mlp-symbolic"),
      ("torch", "torch", "mlp"), ("torch.compile", "torch.compile", "mlp"), ("tinygrad", "tinygrad", "mlp")]),
]


Samples = dict[str, list[tuple[float, float]]]  # column -> (wall s per call, process CPU s per call) per round
PAIRED: list[tuple[float, float]] = []  # per `kernels` sample: (the jitted step, the sum of its kernels), in turn


def measure(peers: dict[str, Peer], cells: list[tuple[str, str, str]], rounds: int) -> Samples:
    """One batch per column per round, a different column first each round."""
    live = [c for c in cells if c[1] in peers and c[2] in peers[c[1]].sizes]
    samples: Samples = {column: [] for column, _, _ in live}
    for r in range(rounds):
        for column, who, case in live[r % len(live):] + live[:r % len(live)] if live else []:
            time.sleep(PAUSE)
            got = peers[who].ask(120, case=case)
            if "s" not in got:
                peers[who].errors[case] = got["error"]
                continue
            samples[column].append((got["s"], got["cpu"]))
            if "step" in got: PAIRED.append((got["step"], got["s"]))
    return samples


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        return names[0] if names else platform.processor() or platform.machine()
    except OSError:
        return platform.processor() or platform.machine()


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}" if seconds < 1e-3 else f"{seconds * 1e6:.0f}"


def median_wall(samples: Samples, column: str) -> float | None:
    return statistics.median(w for w, _ in samples[column]) if samples.get(column) else None


def report(label: str, samples: Samples) -> list[str]:
    """Table lines for one case: per column the median µs per call with its range, cores busy (process CPU time /
    wall time, median: below 1 for one thread means the process waited for a core), and ember / column."""
    lines = [f"\n{label}: µs per call, median [min-max] over rounds; busy = process CPU time / wall time; "
             f"ratio = ember / this (>1: ember slower)",
             f"| {'framework':15s} | {'median µs':>10s} | {'range µs':>19s} | {'busy':>5s} | {'rounds':>6s} | "
             f"{'ember/this':>10s} |",
             f"|{'-' * 17}|{'-' * 11}:|{'-' * 20}:|{'-' * 6}:|{'-' * 7}:|{'-' * 11}:|"]
    ember = median_wall(samples, "ember")
    for column, got in samples.items():
        if not (median := median_wall(samples, column)): continue
        spread = f"{us(min(w for w, _ in got))}-{us(max(w for w, _ in got))}"
        busy = statistics.median(c / w for w, c in got)
        ratio = f"{ember / median:.2f}x" if ember is not None else "—"
        lines.append(f"| {column:15s} | {us(median):>10s} | {spread:>19s} | {busy:5.2f} | {len(got):6d} | "
                     f"{ratio:>10s} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed batches per cell (default 15)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="threads per framework (EMBER_THREADS, OMP_NUM_THREADS, tinygrad's NUM_CPU_THREADS; "
                             "default: all cores)")
    parser.add_argument("--only", choices=["tiny", "mlp"], help="tiny: the eager and jit cases; mlp: the steps")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: serve one framework
    opts = parser.parse_args()
    if opts.worker:
        worker(opts.worker, opts.only)
        return
    begin = time.perf_counter()
    print(f"{cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start; "
          f"Python {platform.python_version()}", flush=True)
    if (load := os.getloadavg()[0]) > 0.5:
        print(f"note: other work is running (load average {load:.2f}): threads that wait on a busy core slow every "
              f"multi-threaded figure, torch's most (its OpenMP threads spin at barriers); compare with --threads 1")
    peers, notes = start(WORKERS, 600, opts.only, opts.threads)
    print("; ".join(p.about for p in peers) + f"; {opts.threads} threads each")
    print("setup (import, compiles, warm-up; the workers in parallel), answered within: "
          + ", ".join(f"{p.name} {p.ready:.0f} s" for p in peers))
    for note in notes: print(note)
    by_name = {p.name: p for p in peers}
    rows = [row for row in ROWS if opts.only is None or (row[0] == "mlp") == (opts.only == "mlp")]
    results: dict[str, Samples] = {}
    for case, label, cells in rows:
        results[case] = measure(by_name, cells, opts.rounds)
        for line in report(label, results[case]): print(line)
    mlp = results.get("mlp", {})
    step, kernels, eager = (median_wall(mlp, c) for c in ("ember", "ember kernels", "ember-eager"))
    if step and kernels:
        print(f"\nember's jitted step / the sum of its kernels alone: {step / kernels:.3f} (target <= 1.05; "
              f"{us(step - kernels)} µs per step outside the kernels)")
    if PAIRED:
        ratios = sorted(a / b for a, b in PAIRED)
        print(f"the same, paired (the step and a pass of its kernels in turn, {KERNEL_REPEATS} times a round): "
              f"{statistics.median(ratios):.3f} median [{ratios[0]:.3f}-{ratios[-1]:.3f}] over {len(ratios)} rounds")
    if step and eager: print(f"ember jit / eager step: {step / eager:.2f}")
    if step and (symbolic := median_wall(mlp, "ember symbolic")):
        print(f"ember jit, batch a Variable / batch fixed: {symbolic / step:.2f}")
    if losses := [f"{p.name} {case} {v:.6f}" for p in peers for case, v in p.losses.items()]:
        print("first step's loss (same weights and batch): " + ", ".join(losses))
    for p in peers:
        for case, why in p.errors.items():
            if case not in p.sizes: continue
            print(f"{p.name}, case {case}: failed while timed ({why})")
        if p.proc.stdin is not None: p.proc.stdin.close()
        p.proc.wait(10)
    print(f"total {time.perf_counter() - begin:.0f} s")


if __name__ == "__main__":
    main()
