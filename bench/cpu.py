"""ember on the CPU against numpy, torch (eager and torch.compile) and tinygrad: the benchmark optimizer changes are
measured by.

Run: python bench/cpu.py                 (about 4 minutes on 2 cores)
     python bench/cpu.py --quick         (smaller sizes, fewer repeats, no torch.compile: a smoke run)
     python bench/cpu.py --only gemm,sum --repeat 3

Workloads, all float32 (name for --only in brackets):
  [gemm]        square matmul, n = 512, 1024, 2048: GFLOP/s (2 n^3 flops)
  [conv]        conv2d, C filters 3x3, padding 1, at ResNet's stages: N=16, C=64, H=W=56; N=8, C=256, H=W=14 (rows
                that vectors of 8 do not divide); N=8, C=512, H=W=7: GFLOP/s (2 N C C R S H W flops)
  [elementwise] relu(a*b+c) over 16M floats: GB/s (3 reads + 1 write = 16 bytes per element)
  [sum]         sum of 16M floats: GB/s (4 bytes per element)
  [softmax]     softmax over the last axis of 4096x4096: ms
  [mlp]         one SGD step of an MLP 784-512-512-10, batch 256, cross-entropy: ms per warm step
  [compile]     cold compile and first run of a new kernel of 20 distinct elementwise ops over 4096 floats (a fresh
                constant each run, fresh compile caches): ms
  [machine]     a C microbenchmark (cc -O2 -march=native -fopenmp): peak FMA GFLOP/s on one core and on all cores
                (independent FMA chains on the widest vector registers the compiler targets), and triad bandwidth
                a[i] = b[i] + s*c[i] on 3 x 256 MB arrays, all cores: GB/s (24 bytes per element, as STREAM counts)

Each framework runs in a worker process of its own (ember, numpy, torch, torch.compile, tinygrad with DEV=CPU:CLANG and
DEV=CPU:LLVM; both need clang, LLVM libLLVM too); a missing one is skipped with a line saying why. Per workload every
worker loads the same inputs, runs the computation once (compiling it) and its result is checked against numpy in
float64 (allclose, a tolerance per op; mlp: the loss and the gradients; a failure marks the cell with !). Then the
timed runs go round the workers in turn, a different one first each round, so a drift of the machine's speed hits all
alike; a slow framework gets fewer repeats (at least 2), a fast one repeats within a run to fill 20 ms. Times are
warm, taken inside the worker, and include what a user waits for: graph building, scheduling and the kernels
(tinygrad synchronized; its training step is a TinyJit; torch.compile compiles the forward and loss, autograd and
torch.optim run as usual).

Reading the table: a cell is the best over the repeats, then the worst in brackets. The last column is ember against
the best peer, >1 when ember is faster: for rates (GFLOP/s, GB/s) ember / best peer, for times (ms) best peer / ember.
ember's cores busy (process CPU time / wall time of its timed runs) is printed for GEMM and elementwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PEERS = ["ember", "numpy", "torch", "torch.compile", "tinygrad-clang", "tinygrad-llvm"]
LR = 0.01


@dataclass
class Workload:
    key: str  # the row's name; --only takes it or its part before '-'
    unit: str  # "GFLOP/s" or "GB/s" (rates), "ms" (times)
    work: float  # flops or bytes of one run (rates)
    tol: float  # the check's rtol; its atol is tol * max|reference|
    shapes: list[tuple[int, ...]]  # float32 inputs in [0, 1); mlp: its own


def workloads(quick: bool) -> list[Workload]:
    n, c, hw = (2, 32, 28) if quick else (16, 64, 56)
    elems, rows, batch = (1 << 20, 1024, 64) if quick else (1 << 24, 4096, 256)
    return [Workload(f"gemm-{s}", "GFLOP/s", 2 * s**3, 1e-4, [(s, s)] * 2) for s in
            ((256, 512) if quick else (512, 1024, 2048))] + [
        *(Workload(f"conv-{n}x{c}x{hw}", "GFLOP/s", 2 * n * c * c * 9 * hw * hw, 1e-4, [(n, c, hw, hw), (c, c, 3, 3)])
          for n, c, hw in [(n, c, hw), *([(2, 64, 14), (2, 128, 7)] if quick else [(8, 256, 14), (8, 512, 7)])]),
        Workload(f"elementwise-{elems >> 20}M", "GB/s", 16 * elems, 1e-5, [(elems,)] * 3),
        Workload(f"sum-{elems >> 20}M", "GB/s", 4 * elems, 1e-4, [(elems,)]),
        Workload(f"softmax-{rows}", "ms", 0, 1e-4, [(rows, rows)]),
        Workload(f"mlp-{batch}", "ms", 0, 1e-3, [(batch, 784)]),
        Workload("compile-20ops", "ms", 0, 1e-4, [(4096,)] * 2)]


def make_inputs(w: Workload, rng: np.random.Generator) -> list[np.ndarray]:
    arrays = [rng.random(shape, dtype=np.float32) for shape in w.shapes]
    if w.key.startswith("conv"): arrays[1] = (arrays[1] - 0.5) / 8
    if not w.key.startswith("mlp"): return arrays
    params = []  # torch.nn.Linear's layout and initialization
    for fan_in, fan_out in ((784, 512), (512, 512), (512, 10)):
        bound = 1 / np.sqrt(fan_in)
        params += [rng.uniform(-bound, bound, shape).astype(np.float32) for shape in ((fan_out, fan_in), (fan_out,))]
    return params + [arrays[0], rng.integers(0, 10, len(arrays[0]))]


# ---- numpy: a peer in float32 and, run in float64, the reference ----

def np_conv2d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3 convolution, stride 1, padding 1, as im2col and one matmul."""
    n, c, h, wd = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # n c h w 3 3
    cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * wd, c * 9)
    return (cols @ w.reshape(w.shape[0], -1).T).reshape(n, h, wd, -1).transpose(0, 3, 1, 2)


def np_softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_chain(x: np.ndarray, y: np.ndarray, c: float) -> np.ndarray:
    z = np.exp(np.sin(x * c + y) - y)
    z = np.maximum(z, y)
    z = np.square(np.tanh(np.sqrt(z)))
    z = np.log(1 / (1 / (1 + np.exp(-z))))
    z = -np.minimum(np.cos(z), y)
    return np.maximum(np.abs(np.log2(np.exp2(z))), 0) / c


def np_mlp_step(arrays: list[np.ndarray]) -> np.ndarray:
    """One SGD step, in place on the parameters; returns the loss."""
    w1, b1, w2, b2, w3, b3, x, y = arrays
    h1 = x @ w1.T + b1
    r1 = np.maximum(h1, 0)
    h2 = r1 @ w2.T + b2
    r2 = np.maximum(h2, 0)
    logits = r2 @ w3.T + b3
    shifted = logits - logits.max(1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(1, keepdims=True))
    rows = np.arange(len(y))
    loss = (lse[:, 0] - shifted[rows, y]).mean()
    g3 = np.exp(shifted - lse)
    g3[rows, y] -= 1
    g3 /= len(y)
    g2 = (g3 @ w3) * (h2 > 0)
    g1 = (g2 @ w2) * (h1 > 0)
    for p, g in ((w3, g3.T @ r2), (b3, g3.sum(0)), (w2, g2.T @ r1), (b2, g2.sum(0)), (w1, g1.T @ x), (b1, g1.sum(0))):
        p -= LR * g
    return np.asarray(loss)


def mlp_result(loss: np.ndarray, params: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.reshape(loss, 1)] + [p.ravel() for p in params]).astype(np.float64)


def numpy_run(key: str, arrays: list[np.ndarray]) -> Callable[[bool], np.ndarray | None] | None:
    """What the numpy peer (and, on float64 arrays, the reference) runs for a workload."""
    if key.startswith("compile"): return None  # nothing to compile
    if key.startswith("mlp"): return lambda fetch: mlp_result(np_mlp_step(arrays), arrays[:6])
    fn: Callable[..., np.ndarray] = {"gemm": np.matmul, "conv": np_conv2d, "sum": np.sum, "softmax": np_softmax,
                                     "elementwise": lambda a, b, c: np.maximum(a * b + c, 0)}[key.split("-")[0]]
    return lambda fetch: np.asarray(fn(*arrays))


# ---- tensor frameworks (ember, torch, tinygrad): the same code through a small adapter ----

@dataclass
class Lib:
    about: str
    tensor: Callable[[np.ndarray, bool], Any]  # (array, requires_grad) -> a realized tensor
    sync: Callable[[Any], None]  # realize and wait
    fetch: Callable[[Any], np.ndarray]
    conv2d: Callable[[Any, Any], Any]
    cross_entropy: Callable[[Any, Any], Any]
    sgd: Callable[[list[Any]], Any]
    update: Callable[[Any, Any], Any]  # (optimizer, loss): apply the step
    compile: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda fn: fn  # torch.compile
    jit: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda fn: fn  # TinyJit, for the training step
    fresh: Callable[[], None] = lambda: None  # forget compiled functions before a cold compile
    has_compile: bool = True


def chain(x: Any, y: Any, c: float) -> Any:
    """20 distinct elementwise ops: mul add sin sub exp max sqrt tanh square sigmoid reciprocal log cos min neg exp2
    log2 abs relu div (np_chain is the same in numpy)."""
    z = (x * c + y).sin().sub(y).exp().maximum(y).sqrt().tanh().square().sigmoid().reciprocal().log().cos()
    return z.minimum(y).neg().exp2().log2().abs().relu() / c


def tensor_run(lib: Lib, key: str, arrays: list[np.ndarray]) -> Callable[[bool], np.ndarray | None] | None:
    kind = key.split("-")[0]
    if kind == "compile":
        if not lib.has_compile: return None
        x, y = (lib.tensor(a, False) for a in arrays)
        count = [0]

        def cold(fetch: bool) -> np.ndarray | None:
            lib.fresh()
            c = 1.25 + count[0] * 2.0**-20  # the checked run uses 1.25; every later run a constant never seen
            count[0] += 1
            out = lib.compile(lambda a, b: chain(a, b, c))(x, y)
            return lib.fetch(out) if fetch else lib.sync(out)
        return cold
    if kind == "mlp":
        params = [lib.tensor(a, True) for a in arrays[:6]]
        x, y, opt = lib.tensor(arrays[6], False), lib.tensor(arrays[7], False), lib.sgd(params)

        @lib.compile
        def loss() -> Any:
            w1, b1, w2, b2, w3, b3 = params
            h = (x @ w1.T + b1).relu()
            h = (h @ w2.T + b2).relu()
            return lib.cross_entropy(h @ w3.T + b3, y)

        @lib.jit
        def step() -> Any:
            opt.zero_grad()
            out = loss()
            out.backward()
            return lib.update(opt, out)
        return lambda fetch: mlp_result(lib.fetch(step()), [lib.fetch(p) for p in params]) if fetch else \
            lib.sync(step())
    fn = lib.compile({"gemm": lambda a, b: a @ b, "conv": lib.conv2d, "sum": lambda a: a.sum(),
                      "softmax": lambda a: a.softmax(-1), "elementwise": lambda a, b, c: (a * b + c).relu()}[kind])
    ts = [lib.tensor(a, False) for a in arrays]
    return lambda fetch: lib.fetch(fn(*ts)) if fetch else lib.sync(fn(*ts))


def ember_lib() -> Lib:
    from ember import Tensor
    from ember.nn.optim import SGD

    def sync(t: Any) -> None: t.realize()
    return Lib("ember", lambda a, grad: Tensor(a, requires_grad=grad).realize(), sync, lambda t: t.numpy(),
               lambda x, w: x.conv2d(w, padding=1), lambda logits, y: logits.cross_entropy(y),
               lambda params: SGD(params, lr=LR), lambda opt, loss: opt.step(loss) and loss)


def torch_lib(compiled: bool) -> Lib:
    import torch
    if compiled: torch.compile(lambda t: t * 2)(torch.ones(4))  # fails here, not in a workload, when inductor can't run
    return Lib(f"torch {torch.__version__}, {torch.get_num_threads()} threads",
               lambda a, grad: torch.from_numpy(a.copy()).requires_grad_(grad), lambda t: None,
               lambda t: t.detach().numpy(), lambda x, w: torch.nn.functional.conv2d(x, w, padding=1),
               torch.nn.functional.cross_entropy, lambda params: torch.optim.SGD(params, lr=LR),
               lambda opt, loss: opt.step() or loss, torch.compile if compiled else lambda fn: fn,
               fresh=torch._dynamo.reset, has_compile=compiled)


def tinygrad_lib() -> Lib:
    from importlib.metadata import version

    from tinygrad import Device, Tensor, TinyJit
    from tinygrad.helpers import TRAINING
    from tinygrad.nn.optim import SGD
    assert (Tensor([1.0, 2.0]) * 2).tolist() == [2.0, 4.0]  # fails here when the backend's compiler is missing
    TRAINING.value = 1  # its optimizers step only in training mode

    def sync(t: Any) -> None:
        t.realize()
        Device[t.device].synchronize()
    return Lib(f"tinygrad {version('tinygrad')}, {type(Device[Device.DEFAULT].renderer).__name__}",
               lambda a, grad: Tensor(a).realize(), sync, lambda t: t.numpy(), lambda x, w: x.conv2d(w, padding=1),
               lambda logits, y: logits.cross_entropy(y), lambda params: SGD(params, lr=LR),
               lambda opt, loss: loss.realize(*opt.schedule_step()), jit=TinyJit)


def worker(name: str) -> None:
    """Serve one framework: JSON requests on stdin, one JSON reply per line on the original stdout."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the frameworks print goes to stderr

    def reply(**msg: Any) -> None:
        replies.write(json.dumps(msg) + "\n")
        replies.flush()
    try:
        lib = None if name == "numpy" else ember_lib() if name == "ember" else \
            torch_lib(name == "torch.compile") if name.startswith("torch") else tinygrad_lib()
    except Exception as e:
        return reply(error=f"{type(e).__name__}: {e}".splitlines()[0][:200])
    reply(about=lib.about if lib else f"numpy {np.__version__}")
    run: Callable[[bool], np.ndarray | None] | None = None
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if msg["cmd"] == "setup":
                arrays = [np.load(p) for p in msg["inputs"]]
                run = numpy_run(msg["key"], arrays) if lib is None else tensor_run(lib, msg["key"], arrays)
                if run is None:
                    reply(skip="n/a")
                    continue
                start = time.perf_counter()
                np.save(msg["output"], np.asarray(run(True)))
                first = time.perf_counter() - start
                for _ in range(msg["warm"]): run(False)
                reply(first=first)
            elif msg["cmd"] == "run" and run is not None:  # as many runs as fill min_time, for short ones
                wall, cpu, count = time.perf_counter(), time.process_time(), 0
                while not count or time.perf_counter() - wall < msg["min_time"]:
                    run(False)
                    count += 1
                reply(wall=(time.perf_counter() - wall) / count, cpu=(time.process_time() - cpu) / count)
            else:
                run = None
                reply()
        except Exception as e:
            reply(error=f"{type(e).__name__}: {e}".splitlines()[0][:200])


# ---- the orchestrator ----

@dataclass
class Peer:
    name: str
    proc: subprocess.Popen[str]
    log: str
    about: str = ""
    dead: str = ""

    def ask(self, timeout: float, **msg: Any) -> dict[str, Any]:
        if self.dead: return {"error": self.dead}
        assert self.proc.stdin and self.proc.stdout
        if msg:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        if select.select([self.proc.stdout], [], [], timeout)[0] and (line := self.proc.stdout.readline()):
            return json.loads(line)
        hung = self.proc.poll() is None
        self.proc.kill()
        with open(self.log) as fh: told = [x for x in fh.read().splitlines() if x.strip()]
        self.dead = f"no answer in {timeout:.0f} s" if hung or not told else f"died: {told[-1][:200]}"
        return {"error": self.dead}


def start_peers(names: list[str], folder: str) -> tuple[list[Peer], list[str]]:
    """Start a worker per framework (they import at once); return those that answered, and the skip lines."""
    started, notes = [], []
    for name in names:
        env = dict(os.environ, EMBER_CACHE=os.path.join(folder, "ember-cache"), CACHEDB=os.path.join(folder, "tg.db"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(folder, "inductor"))
        if name.startswith("tinygrad"):
            backend = name.split("-")[1]
            if backend == "clang" and not shutil.which("clang"):
                notes.append(f"{name}: skipped, no clang on PATH (apt-get install clang)")
                continue
            env["DEV"] = f"CPU:{backend.upper()}"
        log = os.path.join(folder, f"{name}.log")
        with open(log, "w") as err:
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", name], env=env, text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        started.append(Peer(name, proc, log))
    peers = []
    for peer in started:
        hello = peer.ask(600)
        if "about" in hello:
            peer.about = hello["about"]
            peers.append(peer)
        else:
            missing = "ModuleNotFoundError" in hello["error"]
            notes.append(f"{peer.name}: skipped, " + (f"not installed (pip install {peer.name.split('-')[0]})"
                                                      if missing else hello["error"]))
            peer.proc.kill()
    return peers, notes


@dataclass
class Row:
    workload: Workload
    times: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # process CPU time / wall time over the timed runs
    cells: dict[str, str] = field(default_factory=dict)  # "n/a", "err" for a peer without times
    notes: list[str] = field(default_factory=list)


def as_gradients(result: np.ndarray, before: list[np.ndarray]) -> list[np.ndarray]:
    """The loss, then each parameter's gradient, from an MLP result (the loss, then the parameters after the step)."""
    grads = (mlp_result(np.zeros(1), before) - result) / LR
    bounds = np.cumsum([1] + [p.size for p in before])
    return [result[:1]] + [grads[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def check(got: list[np.ndarray], ref: list[np.ndarray], tol: float) -> str:
    """'' when each of got is close to ref's (rtol tol, atol tol * max|ref|), else what differs."""
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        if a.shape != b.shape: return f"shape {a.shape}, expected {b.shape}"
        scale = max(float(np.abs(b).max()), 1e-30)
        if not np.allclose(a, b, rtol=tol, atol=tol * scale):
            return f"max error {float(np.abs(a - b).max()) / scale:.1e} of max|ref|" + (f" (part {i})" if i else "")
    return ""


def measure(w: Workload, peers: list[Peer], folder: str, repeat: int, budget: float, settle: float) -> Row:
    row = Row(w)
    arrays = make_inputs(w, np.random.default_rng(0))
    paths = [os.path.join(folder, f"in{i}.npy") for i in range(len(arrays))]
    for p, a in zip(paths, arrays, strict=True): np.save(p, a)
    kind = w.key.split("-")[0]
    if kind == "compile": ref = np_chain(*(a.astype(np.float64) for a in arrays), 1.25)
    else:
        run = numpy_run(w.key, [a if a.dtype.kind == "i" else a.astype(np.float64) for a in arrays])
        assert run is not None
        ref = np.asarray(run(True), dtype=np.float64)
    counts = {}
    for peer in peers:
        out = os.path.join(folder, f"out-{peer.name}.npy")
        got = peer.ask(600, cmd="setup", key=w.key, inputs=paths, output=out, warm=2 if kind == "mlp" else 0)
        if "first" not in got:
            row.cells[peer.name] = "n/a" if "skip" in got else "err"
            if "error" in got: row.notes.append(f"{peer.name}: {got['error']}")
            continue
        result, expected = [np.load(out).astype(np.float64)], [ref]
        if kind == "mlp":  # compare the loss and the gradients, (parameters before - after) / lr
            result, expected = as_gradients(result[0], arrays[:6]), as_gradients(ref, arrays[:6])
        if bad := check(result, expected, w.tol):
            row.notes.append(f"{peer.name}: check failed, {bad}")
            row.cells[peer.name] = "!"
        counts[peer.name] = max(2, min(repeat, int(budget / max(got["first"], 1e-3))))
        row.times[peer.name], row.cpu[peer.name] = [], 0.0
    for i in range(max(counts.values(), default=0)):
        order = [p for p in peers if counts.get(p.name, 0) > i]
        for peer in order[i % len(order):] + order[:i % len(order)]:  # a different peer goes first each round
            time.sleep(settle)  # until the previous peer's threads sleep (OpenBLAS's spin ~0.1 s; torch's runs suffer)
            got = peer.ask(600, cmd="run", min_time=0.02)
            if "wall" in got:
                row.times[peer.name].append(got["wall"])
                row.cpu[peer.name] += got["cpu"]
    for peer in peers:
        peer.ask(60, cmd="drop")
        if row.times.get(peer.name) == []: row.cells[peer.name] = "err"; del row.times[peer.name]
    row.cpu = {k: v / sum(row.times[k]) for k, v in row.cpu.items() if k in row.times}
    return row


MACHINE_C = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#elif defined(__SSE2__) || defined(__ARM_NEON)
#define VW 4
#else
#define VW 1
#endif
#define CHAINS (VW == 16 ? 24 : 12) /* independent chains: more than FMA latency x FMA units, fewer than registers */
typedef float vf __attribute__((vector_size(VW * 4)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static float fma_chains(long iters, float seed) { /* acc = acc * m + a, which -O2 contracts to one FMA */
  vf acc[CHAINS], m = {0}, a = {0};
  float s = 0;
  for (int l = 0; l < VW; l++) { m[l] = 0.9999999f; a[l] = 1e-7f * seed; }
  for (int k = 0; k < CHAINS; k++) for (int l = 0; l < VW; l++) acc[k][l] = seed + k + l;
  for (long i = 0; i < iters; i++)
#pragma GCC unroll 32
    for (int k = 0; k < CHAINS; k++) acc[k] = acc[k] * m + a;
  for (int k = 0; k < CHAINS; k++) for (int l = 0; l < VW; l++) s += acc[k][l];
  return s;
}
static double fma_peak(long iters, int threads) { /* best GFLOP/s of 5 */
  double best = 0;
  for (int r = 0; r < 5; r++) {
    float s = 0;
    double t = now(), gflops;
#pragma omp parallel for num_threads(threads) reduction(+ : s)
    for (int th = 0; th < threads; th++) s += fma_chains(iters, 1.0f + th);
    gflops = 2.0 * VW * CHAINS * iters * threads / (now() - t) / 1e9;
    if (s == 0.125f) printf("%f", s); /* keeps the result alive */
    if (gflops > best) best = gflops;
  }
  return best;
}
int main(int argc, char **argv) {
  long iters = atol(argv[1]), n = atol(argv[2]);
  int cores = omp_get_num_procs();
  double one = fma_peak(iters, 1), all = fma_peak(iters, cores), best = 1e30;
  double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double)), *c = malloc(n * sizeof(double));
#pragma omp parallel for
  for (long i = 0; i < n; i++) { a[i] = 0; b[i] = 1; c[i] = 2; }
  for (int r = 0; r < 10; r++) {
    double t = now();
#pragma omp parallel for
    for (long i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
    t = now() - t;
    if (t < best) best = t;
  }
  printf("%d %d %d %.2f %.2f %.2f %.1f\n", VW, CHAINS, cores, one, all, 24.0 * n / best / 1e9, a[n / 2]);
  return 0;
}
"""


def machine(folder: str, quick: bool) -> list[str]:
    """The FMA peak and triad lines, from a C program built by the system C compiler."""
    cc = os.environ.get("CC", "cc")
    source, binary = os.path.join(folder, "machine.c"), os.path.join(folder, "machine")
    with open(source, "w") as fh: fh.write(MACHINE_C)
    flags = ["-O2", "-march=native", "-fopenmp"]
    built = subprocess.run([cc, *flags, source, "-o", binary], capture_output=True, text=True)
    if built.returncode: return [f"machine: skipped, {cc} {' '.join(flags)} failed: {built.stderr.strip()[:200]}"]
    iters, n = (5_000_000, 1 << 23) if quick else (50_000_000, 1 << 25)
    out = subprocess.run([binary, str(iters), str(n)], capture_output=True, text=True, check=True).stdout.split()
    width, chains, cores, one, every, triad = int(out[0]), int(out[1]), int(out[2]), *map(float, out[3:6])
    return [f"FMA peak, fp32 ({width} floats per vector, {chains} chains; {cc} {' '.join(flags)}): "
            f"{one:.1f} GFLOP/s on one core, {every:.1f} GFLOP/s on {cores} cores",
            f"triad a[i] = b[i] + s*c[i], 3 x {n * 8 >> 20} MB of float64, {cores} cores: {triad:.1f} GB/s"]


def figure(w: Workload, seconds: float) -> float:
    return w.work / seconds / 1e9 if w.unit != "ms" else seconds * 1e3


def report(rows: list[Row], peers: list[str]) -> None:
    others = [p for p in peers if p != "ember"]
    headers = ["workload", "unit", *peers, "ember vs best"]
    table = []
    for row in rows:
        w, cells = row.workload, []
        for p in peers:
            if p in row.times:
                best, worst = figure(w, min(row.times[p])), figure(w, max(row.times[p]))
                cells.append(f"{best:.3g} [{worst:.3g}]{'!' if row.cells.get(p) == '!' else ''}")
            else: cells.append(row.cells.get(p, "—"))
        best_peer = [min(row.times[p]) for p in others if p in row.times]
        ratio = f"{min(best_peer) / min(row.times['ember']):.2f}x" if best_peer and "ember" in row.times else "—"
        table.append([w.key, w.unit, *cells, ratio])
    widths = [max(len(str(r[i])) for r in [headers, *table]) for i in range(len(headers))]
    print("\n| " + " | ".join(h.ljust(wd) for h, wd in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (wd + 1) + ":" for wd in widths) + "|")
    for r in table: print("| " + " | ".join(c.rjust(wd) for c, wd in zip(r, widths, strict=True)) + " |")
    print("best [worst] over the repeats; ! a failed check. ember vs best: >1 means ember is faster "
          "(rates: ember / best peer; times: best peer / ember)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats, no torch.compile")
    parser.add_argument("--only", help="workloads: gemm, conv, elementwise, sum, softmax, mlp, compile, machine")
    parser.add_argument("--repeat", type=int, help="most timed runs per peer and workload (default 5, quick 2)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker: return worker(opts.worker)
    only = set(opts.only.split(",")) if opts.only else None
    selected = [w for w in workloads(opts.quick) if not only or w.key.split("-")[0] in only or w.key in only]
    repeat, budget, settle = (opts.repeat or 2, 1.0, 0.15) if opts.quick else (opts.repeat or 5, 20.0, 0.15)
    begin = time.perf_counter()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}; "
          f"load average {os.getloadavg()[0]:.2f} at the start (other work on the machine skews every figure)")
    with tempfile.TemporaryDirectory(prefix="ember-bench-cpu-") as folder:
        names = [p for p in PEERS if not (opts.quick and p == "torch.compile")] if selected else []
        if opts.quick and selected: print("torch.compile: left out under --quick (its compiles take minutes)")
        peers, notes = start_peers(names, folder)
        for p in peers: print(f"{p.name}: {p.about}")
        for note in notes: print(note)
        rows = []
        for w in selected:
            start = time.perf_counter()
            rows.append(measure(w, peers, folder, repeat, budget, settle))
            print(f"{w.key}: {time.perf_counter() - start:.0f} s", flush=True)
        for p in peers:
            if p.proc.stdin: p.proc.stdin.close()
            p.proc.wait(timeout=60)
        lines = machine(folder, opts.quick) if not only or "machine" in only else []
    if rows:
        report(rows, [p.name for p in peers])
        for row in rows:
            for note in row.notes: print(f"{row.workload.key}: {note}")
        busy = [f"{r.workload.key} {r.cpu['ember']:.2f}" for r in rows if "ember" in r.cpu and
                r.workload.key.split("-")[0] in ("gemm", "elementwise")]
        if busy: print(f"ember's cores busy (process CPU time / wall time): {', '.join(busy)}")
    for line in lines: print(line)
    print(f"total {time.perf_counter() - begin:.0f} s")


if __name__ == "__main__":
    main()
