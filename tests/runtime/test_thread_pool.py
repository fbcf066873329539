"""The CPU's thread pool runs a THREAD kernel's slices at once; cores and vector widths come from the CPU.

Oracle: the same kernel with the same opts but THREAD, run on one core, bit for bit (THREAD splits output loops only,
so no sum changes order). Each pool test runs in a Python process of its own (`run_python`): the pool is per process
and keeps the workers it started, so a test here cannot disturb the kernels of the tests that share its pytest worker
(see test_fewer_threads_after_more), and a crash fails one test. `vector_bytes` is checked on target texts as gcc,
clang and /proc/cpuinfo spell them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ember import Tensor
from ember.codegen import get_program
from ember.codegen.opt import KernelOptError, Opt, OptOps
from ember.device import Device
from ember.runtime.ops_cpu import cpu_cores, vector_bytes

ROOT = Path(__file__).resolve().parents[2]

# What each script starts with: `threaded(value, opts)` compiles the one kernel of a Tensor expression with `opts`
# and returns a function that runs it on the pool (fresh outputs, NaN-filled) and returns the output.
PRELUDE = """
import numpy as np
from ember import Tensor
from ember.codegen import get_program
from ember.codegen.opt import Opt, OptOps
from ember.device import Device
from ember.dtype import to_numpy

DEVICE = Device["CPU"]
UP, TH = OptOps.UPCAST, OptOps.THREAD

def threaded(value, opts):
    (item,) = value.schedule()
    spec = get_program(item.ast, DEVICE.renderer, opts=opts)
    assert spec.threads == next((o.amount for o in opts if o.op is TH), 1), spec.threads
    program = DEVICE.program(spec, DEVICE.compiler.compile_cached(spec.src))
    inputs = [b.numpy() for b in item.bufs[item.outs:]]
    out = item.bufs[0]
    def run():
        result = np.full(out.size, np.nan, to_numpy(out.dtype))
        program(result, *inputs)
        return result
    return run

def same(got, want, what):
    assert got.tobytes() == want.tobytes(), f"{what}: {int((got != want).sum())} elements differ"

rng = np.random.default_rng(0)
def data(*shape): return Tensor(rng.uniform(-2, 2, shape).astype(np.float32))
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fresh cache for the module's processes: the pool and the kernels compile once."""
    return tmp_path_factory.mktemp("cache")


def run_python(script: str, cache: Path, timeout: float = 60, **env: str) -> str:
    """Run PRELUDE + `script` in a new Python process (ember from this checkout, $EMBER_CACHE at `cache`, `env` added,
    $EMBER_THREADS unset unless given); its stdout. Fails the test on a non-zero exit, a crash or a hang."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("EMBER_THREADS", "NOOPT")}
    full_env.update(EMBER_CACHE=str(cache), PYTHONPATH=str(ROOT), **env)
    code = PRELUDE + textwrap.dedent(script)
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the script hung for {timeout} s; output so far:\n{e.stdout}\n{e.stderr}") from None
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


# ---- the pool ----------------------------------------------------------------------------------------------------

def test_threaded_kernels_equal_one_core(cache: Path) -> None:
    """Row sums, a tiled matmul and a vectorized elementwise kernel on 2, 3 and 8 slices give the bits they give on
    one core, every time of 10. Thread counts go up: see test_fewer_threads_after_more for why."""
    out = run_python("""
        a, b, w = data(48, 64), data(24, 16), data(16, 32)
        values = {"row_sum": (a.sum(1), []), "tiled_matmul": (b @ w, [Opt(UP, 1, 16)]),
                  "elementwise": ((a * 3 + 1).relu(), [Opt(UP, 1, 16)])}
        one_core = {name: threaded(v, opts)() for name, (v, opts) in values.items()}
        for threads in (2, 3, 8):
            for name, (v, opts) in values.items():
                run = threaded(v, [Opt(TH, 0, threads), *opts])
                for _ in range(10): same(run(), one_core[name], f"{name} on {threads} cores")
        print("ok")
    """, cache)
    assert out.strip() == "ok"


def test_pool_called_from_several_python_threads(cache: Path) -> None:
    """Four Python threads run threaded kernels 200 times each at once (ctypes lets go of the GIL, the pool takes
    one kernel at a time); every result is right."""
    out = run_python("""
        import threading
        a, b, w = data(64, 96), data(32, 16), data(16, 64)
        kernels = [(threaded(a.sum(1), [Opt(TH, 0, 2)]), threaded(a.sum(1), [])()),
                   (threaded(b @ w, [Opt(TH, 0, 2), Opt(UP, 1, 16)]), threaded(b @ w, [Opt(UP, 1, 16)])()),
                   (threaded(a.exp() - 1, [Opt(TH, 0, 2)]), threaded(a.exp() - 1, [])())]
        errors = []
        def work(k):
            try:
                for i in range(200):
                    run, want = kernels[(k + i) % len(kernels)]
                    same(run(), want, f"python thread {k}, call {i}")
            except Exception as e:
                errors.append(repr(e))
        workers = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in workers: t.start()
        for t in workers: t.join(30)
        assert not any(t.is_alive() for t in workers), "a Python thread hung in the pool"
        print(errors or "ok")
    """, cache)
    assert out.strip() == "ok"


def test_pool_in_forked_child(cache: Path) -> None:
    """A child forked after the parent ran threaded kernels (its workers spinning, then asleep) starts workers of its
    own and gets right results; the parent's pool still works after."""
    out = run_python("""
        import multiprocessing, time
        a = data(64, 128)
        run, want = threaded(a.sum(1), [Opt(TH, 0, 2)]), threaded(a.sum(1), [])()
        def child(conn):
            for _ in range(50): same(run(), want, "child")
            conn.send("ok")
        ctx = multiprocessing.get_context("fork")
        for pause in (0.0, 0.5):  # workers spin for a while after a kernel, then sleep on a condition variable
            same(run(), want, "parent")
            time.sleep(pause)
            receive, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=child, args=(send,))
            p.start()
            p.join(20)
            if p.is_alive(): p.kill(); raise AssertionError(f"the child hung (pause {pause})")
            assert p.exitcode == 0 and receive.poll() and receive.recv() == "ok", f"child exit {p.exitcode}"
        same(run(), want, "parent after the children")
        print("ok")
    """, cache)
    assert out.strip() == "ok"


def test_fewer_threads_after_more(cache: Path) -> None:
    """Workers beyond a kernel's slice count (started for an earlier kernel with more) run nothing."""
    out = run_python("""
        import time
        three = threaded(Tensor(np.zeros(3, np.float32)) + 1, [Opt(TH, 0, 3)])
        three()  # the pool starts workers 1 and 2
        (item,) = (Tensor(np.zeros(4, np.float32)) + 1).schedule()
        spec = get_program(item.ast, DEVICE.renderer, opts=[Opt(TH, 0, 2)])
        two = DEVICE.program(spec, DEVICE.compiler.compile_cached(spec.src))
        x, out = np.arange(8, dtype=np.float32), np.full(8, -7, np.float32)
        two(out[:4], x)  # out[:4] = x[:4] + 1 in 2 slices of 2
        time.sleep(0.5)  # the extra slice runs on its own: give it time to
        print(out.tolist())
    """, cache)
    assert out.strip() == str([1.0, 2.0, 3.0, 4.0, -7.0, -7.0, -7.0, -7.0])


def test_more_slices_than_the_pool_has_are_refused() -> None:
    """The pool runs at most MAX_THREADS slices: a THREAD opt above it is an error, not slices that never run."""
    (item,) = (Tensor(np.arange(2048, dtype=np.float32)) + 1).schedule()
    with pytest.raises(KernelOptError, match="more than 1024 threads"):
        get_program(item.ast, Device["CPU"].renderer, opts=[Opt(OptOps.THREAD, 0, 2048)])


# ---- cores -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("setting, cores", [("1", 1), ("3", 3), ("0", 1)])
def test_ember_threads_sets_the_cores(cache: Path, setting: str, cores: int) -> None:
    """$EMBER_THREADS is the renderer's core count, and the heuristic's THREAD amount (none for 1 core)."""
    out = run_python("""
        from ember.helpers import Context
        (item,) = (data(96, 1024) * 2).schedule()  # 98,304 elements: enough work to split, in 3 too
        with Context(NOOPT=0): spec = get_program(item.ast, DEVICE.renderer)
        print(DEVICE.renderer.cores, spec.threads)
    """, cache, EMBER_THREADS=setting)
    assert out.split() == [str(cores), str(cores)]


def test_more_threads_than_the_pool_runs_are_capped(cache: Path) -> None:
    """$EMBER_THREADS above the pool's 1024 (a host with more cores): kernels split in 1024 slices, and run right;
    the heuristic asked for THREAD by 2048, which apply_opt refuses, so every threaded kernel raised."""
    out = run_python("""
        x = np.random.default_rng(1).uniform(-2, 2, (4096, 32)).astype(np.float32)
        (item,) = (Tensor(x) * 2).schedule()
        print(DEVICE.renderer.cores, get_program(item.ast, DEVICE.renderer).threads)
        same((Tensor(x) * 2).numpy(), x * 2, "x * 2")
    """, cache, EMBER_THREADS="2048")
    assert out.split() == ["1024", "1024"]


def test_cpu_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_THREADS", raising=False)
    if hasattr(os, "sched_getaffinity"): assert cpu_cores() == len(os.sched_getaffinity(0))
    else: assert cpu_cores() >= 1
    monkeypatch.setenv("EMBER_THREADS", "5")
    assert cpu_cores() == 5
    monkeypatch.setenv("EMBER_THREADS", "0")
    assert cpu_cores() == 1
    monkeypatch.setenv("EMBER_THREADS", "5000")
    assert cpu_cores() == 1024  # the pool's limit


# ---- vector widths -----------------------------------------------------------------------------------------------

VECTOR_TARGETS = [
    # gcc -march=native -### (the words native_target keeps)
    ("-march=znver4 -mavx512f -mavx2 -mavx -msse2 -mtune=znver4", 64),
    ("-march=haswell -mno-avx512f -mavx2", 32),
    ("-march=sandybridge -mno-avx512f -mno-avx2 -mavx -msse2", 32),
    ("-march=nehalem -mno-avx512f -mno-avx2 -mno-avx -msse2", 16),
    ("-march=x86-64 -mno-avx", 16),
    # clang -march=native -### (-target-feature words, sometimes comma lists)
    ("-target-cpu znver4 -target-feature +avx512f -target-feature +avx2", 64),
    ("-target-cpu haswell -avx512f,+avx2", 32),
    ("-target-cpu haswell -target-feature -avx512f -target-feature +avx", 32),
    ("-target-cpu cortex-a72 -target-feature +neon", 16),
    ("-target-cpu apple-m1 +v8.5a,+neon,-sve", 16),
    # platform.machine() and /proc/cpuinfo's lines, where the compiler does not resolve -march=native
    ("x86_64 model name\t: AMD EPYC 9654\nflags\t\t: fpu sse sse2 avx avx2 avx512f avx512bw", 64),
    ("x86_64 model name\t: Intel(R) Core(TM) i7-4770\nflags\t\t: fpu sse sse2 avx avx2", 32),
    ("x86_64 model name\t: Intel(R) Core(TM)2 Duo\nflags\t\t: fpu sse sse2 ssse3", 16),
    ("aarch64 CPU implementer\t: 0x41\nFeatures\t: fp asimd evtstrm aes", 16),
    ("riscv64 ", 0),
    ("", 0),
]


@pytest.mark.parametrize("target, width", VECTOR_TARGETS, ids=[f"{w}-{i}" for i, (_, w) in enumerate(VECTOR_TARGETS)])
def test_vector_bytes(target: str, width: int) -> None:
    assert vector_bytes(target) == width


def test_idle_workers_sleep_after_a_millisecond(cache: Path) -> None:
    """After a threaded kernel the workers spin about 1 ms (the next kernel usually follows sooner), then sleep:
    idle, the process burns almost no CPU (200000 sched_yields used to burn 100 ms of a core after every kernel)."""
    out = run_python("""
        import resource, time
        run = threaded(data(64, 64).sum(1), [Opt(TH, 0, 2)])
        def cpu(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
        burned = []
        for _ in range(3):
            run()
            before = cpu(); time.sleep(0.3); burned.append(cpu() - before)
        print(min(burned))
    """, cache)
    assert float(out) < 0.03, f"{float(out) * 1e3:.1f} ms of CPU burned while idle"


@pytest.mark.parametrize("key, value", [("EMBER_THREADS", "two"), ("EMBER_THREADS", "1.5"), ("BEAM", "x")])
def test_a_flag_that_is_not_a_number_is_named(key: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting that does not parse says which variable and what it got, not int()'s bare message."""
    from ember.helpers import env_value
    monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=rf"^\${key}='{value}': expected int"): env_value(key, 1)
    if key == "EMBER_THREADS":
        with pytest.raises(ValueError, match=r"\$EMBER_THREADS"): cpu_cores()
