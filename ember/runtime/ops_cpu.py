"""The CPU device: C source compiled by the system compiler into a shared object, called through ctypes.

Flags: -O2 -march=native for speed; -fwrapv because ember's integers wrap (as its constant folder assumes);
-ffp-contract=off so a*b+c is never fused into an FMA that numpy would not do (it changes the last bit). As
-march=native means another CPU on another machine, the compile cache's key names the CPU it resolved to
(`native_target`), so a cache shared between machines never serves code this CPU cannot run.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from typing import Any

from ember.device import (
    Buffer,
    Compiler,
    cache_write,
    describe_compile_error,
    discard_damaged,
    read_cached,
    scratch_dir,
    write_atomically,
)
from ember.errors import CompileError
from ember.helpers import CACHELEVEL, cache_dir, env_value
from ember.renderer import ProgramSpec
from ember.renderer.cstyle import CRenderer

C_FLAGS = ("-shared", "-fPIC", "-O2", "-march=native", "-fwrapv", "-ffp-contract=off", "-fno-math-errno",
           "-std=gnu11", "-Wno-unused")


# gcc's loop vectorizer, off: ember vectorizes its kernels itself (opts UPCAST into vector types), and gcc 12.2's
# (Debian 12, -O2 -march=native, AVX2 or AVX-512) miscompiles an unrolled loop of int32 selects widened to int64 (a
# roll concatenated with its source, cast to long: tests/runtime/test_cpu.py), which clang and gcc -O1 compile
# right, sanitizers clean. Measured off against on (bench/cpu.py --quick): gemm, elementwise, sum and softmax alike
# or faster.
GCC_FLAGS = ("-fno-tree-loop-vectorize",)


def c_flags() -> tuple[str, ...]:
    """C_FLAGS, then the words of $EMBER_CFLAGS (the sanitizer job adds -fsanitize=address,undefined there); they
    are part of the compiler's cache key, so kernels built with them are never served to a build without."""
    return C_FLAGS + tuple(shlex.split(os.getenv("EMBER_CFLAGS", "")))


def find_c_compiler() -> str:
    """clang if present, else gcc, else cc, the first of them that compiles _Float16; $CC overrides."""
    cc = pick_compiler(os.getenv("CC"), ("clang", "gcc", "cc"), "c", float16=True)  # any kernel may hold float16
    if cc is None: raise FileNotFoundError("no C compiler found (looked for $CC, clang, gcc, cc)")
    return cc


def pick_compiler(override: str | None, candidates: tuple[str, ...], language: str, float16: bool) -> str | None:
    """`override` where it is on PATH, else the first candidate there, or for code with `float16` the first that
    compiles _Float16 (clang before 15 and gcc before 12 reject it on x86; where none does, the first, whose
    error then names the type). None if no candidate is on PATH."""
    if override and shutil.which(override): return override
    present = [c for c in candidates if shutil.which(c)]
    if float16: return next((c for c in present if takes_float16(c, language)), present[0] if present else None)
    return present[0] if present else None


@functools.cache
def takes_float16(compiler: str, language: str) -> bool:
    """Compiles a one-line probe once per compiler binary; the answer is kept in the cache directory (by the
    binary's path, size and time), so a warm process runs no compiler at all."""
    binary = os.path.realpath(shutil.which(compiler) or compiler)
    stat = os.stat(binary)
    key = hashlib.sha256(f"{binary}\0{stat.st_size}\0{stat.st_mtime_ns}\0{language}".encode()).hexdigest()[:16]
    record = os.path.join(cache_dir(), "compilers", f"float16-{key}")
    if CACHELEVEL and (known := read_cached(record)) is not None: return known == b"yes"
    probe = subprocess.run([compiler, "-x", language, "-c", "-o", os.devnull, "-"], capture_output=True, text=True,
                           input="_Float16 twice(_Float16 x) { return x + x; }\n")
    if CACHELEVEL: cache_write(record, b"yes" if probe.returncode == 0 else b"no")
    return probe.returncode == 0


# A half-precision select as ember's kernels write it: gcc 12 with AVX512-FP16 (-march=native on Sapphire Rapids)
# emits a masked `vmovsh` for it that binutils 2.40's assembler rejects ("unsupported masking")
HALF_SELECT = "void relu(_Float16* y, const _Float16* x) { for (int i = 0; i < 15; i++) y[i] = x[i] < 0 ? 0 : x[i]; }\n"


@functools.cache
def half_flags(compiler: str, language: str) -> tuple[str, ...]:
    """("-mno-avx512fp16",) where `compiler` -O2 -march=native cannot assemble HALF_SELECT but can without those
    instructions: half arithmetic then runs in float, rounded to half after each operation (each C statement of a
    kernel is one), which gives the same bits. () elsewhere. Probed once per compiler binary and CPU, the answer
    kept in the cache directory as takes_float16's is."""
    binary = os.path.realpath(shutil.which(compiler) or compiler)
    stat = os.stat(binary)
    text = f"{binary}\0{stat.st_size}\0{stat.st_mtime_ns}\0{language}\0{native_target(compiler)}\0{HALF_SELECT}"
    record = os.path.join(cache_dir(), "compilers", f"half-{hashlib.sha256(text.encode()).hexdigest()[:16]}")
    if CACHELEVEL and (known := read_cached(record)) is not None: return tuple(known.decode().split())

    def assembles(*flags: str) -> bool:
        return subprocess.run([compiler, "-x", language, "-O2", "-march=native", *flags, "-c", "-o", os.devnull, "-"],
                              capture_output=True, text=True, input=HALF_SELECT).returncode == 0
    flags = ("-mno-avx512fp16",) if not assembles() and assembles("-mno-avx512fp16") else ()
    if CACHELEVEL: cache_write(record, " ".join(flags).encode())
    return flags


# in a compiler driver's -### listing, the words after these name the target (clang); gcc expands -march=native into
# -march=<cpu> and one -m<feature> or -mno-<feature> per extension, with --param cache sizes
TARGET_OPTIONS = ("-target-cpu", "-target-feature", "--param", "-target-abi")


@functools.cache
def native_target(compiler: str) -> str:
    """What -march=native means for `compiler` on this machine, as text: the CPU and feature flags the driver
    passes on (`probe_native_target`), else the CPU's model and flags from /proc/cpuinfo. Once per process and
    compiler; kept in the cache directory by the binary and the CPU's /proc/cpuinfo lines (a record another machine
    can only read if its CPU reports the same), so a warm process runs no compiler at all."""
    machine = cpuinfo()
    binary = os.path.realpath(shutil.which(compiler) or compiler)
    stat = os.stat(binary)
    key = hashlib.sha256(f"{binary}\0{stat.st_size}\0{stat.st_mtime_ns}\0{machine}".encode()).hexdigest()[:16]
    record = os.path.join(cache_dir(), "compilers", f"target-{key}")
    if CACHELEVEL and machine and (known := read_cached(record)) is not None: return known.decode(errors="replace")
    target = probe_native_target(compiler) or f"{platform.machine()} {machine or platform.processor()}"
    if CACHELEVEL and machine: cache_write(record, target.encode())
    return target


def probe_native_target(compiler: str) -> str:
    """The target words `compiler -march=native -###` passes on (it runs nothing, about 5 ms); '' where it does not
    resolve -march=native (an unknown CPU, a compiler without the flag)."""
    probe = subprocess.run([compiler, "-march=native", "-###", "-x", "c", "-c", "-o", os.devnull, os.devnull],
                           capture_output=True, text=True)
    words: list[str] = []
    for line in probe.stderr.splitlines():
        try:
            tokens = shlex.split(line)
        except ValueError:  # an unbalanced quote in some informational line
            continue
        words += [t for i, t in enumerate(tokens) if t.startswith("-m") or (i and tokens[i - 1] in TARGET_OPTIONS)]
    resolved = any(w.startswith("-march=") and w != "-march=native" for w in words) or "-target-cpu" in probe.stderr
    return " ".join(words) if probe.returncode == 0 and resolved else ""


def cpuinfo() -> str:
    """The first CPU's model and feature lines of /proc/cpuinfo (x86 and ARM spell them differently); '' where
    there is no such file."""
    try:
        with open("/proc/cpuinfo") as f: first = f.read().split("\n\n")[0]
    except OSError:
        return ""
    wanted = ("model name", "flags", "features", "cpu implementer", "cpu architecture", "cpu variant", "cpu part")
    return "\n".join(line for line in first.splitlines() if line.split(":")[0].strip().lower() in wanted)


class CCompiler(Compiler):
    """C source -> shared object bytes."""

    def __init__(self) -> None:
        self.cc = find_c_compiler()
        version = subprocess.run([self.cc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        self.flags = c_flags() + (GCC_FLAGS if "gcc" in version.lower() and "clang" not in version.lower() else ()) + \
            half_flags(self.cc, "c")
        super().__init__(f"{version} {' '.join(self.flags)} target: {native_target(self.cc)}")

    def compile(self, src: str) -> bytes:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "kernel.so")
            proc = subprocess.run([self.cc, *self.flags, "-x", "c", "-", "-o", out, "-lm"], input=src,
                                  capture_output=True, text=True)
            if proc.returncode != 0: raise CompileError(describe_compile_error(self.cc, src, proc.stderr))
            with open(out, "rb") as f: return f.read()


def vector_bytes(target: str) -> int:
    """The widest vectors the CPU `target` names (native_target's text) computes on: AVX-512 64 bytes, AVX 32,
    SSE2 and NEON 16; 0 for a CPU none of these is known on (kernels stay scalar there)."""
    words = set(target.replace(",", " ").split())
    def has(feature: str) -> bool: return bool({f"-m{feature}", f"+{feature}", feature} & words)
    if has("avx512f"): return 64
    if has("avx2") or has("avx"): return 32
    if has("sse2") or "x86_64" in target or "x86-64" in target or has("neon") or has("asimd"): return 16
    return 0


def vector_registers(target: str) -> int:
    """How many vectors of vector_bytes(target) the register file holds: x86's 32 zmm with AVX-512, else 16 ymm or
    xmm; AArch64's 32 NEON registers."""
    words = set(target.replace(",", " ").split())
    return 32 if {"-mavx512f", "+avx512f", "avx512f", "neon", "asimd", "+neon"} & words else 16


def cpu_cores() -> int:
    """The cores this process may run on (os.sched_getaffinity), or $EMBER_THREADS where set; at most the pool's
    limit (CRenderer.max_threads), which runs no more slices (a kernel split in more would be refused)."""
    if os.getenv("EMBER_THREADS"): cores = max(1, env_value("EMBER_THREADS", 1))
    else: cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, CRenderer.max_threads)


# A persistent pool: worker k runs slice k of a threaded kernel, the caller slice 0. Workers spin a while after a
# kernel (the next one usually follows within microseconds), then sleep on a condition variable. One kernel at a
# time: a second caller (another Python thread) waits for the first; a forked child starts its own workers, with its
# locks and condition variable made anew at the fork (pthread_atfork): the parent's were copied in whatever state its
# threads held them, and glibc's broadcast waits for the sleepers it counted, which the child does not have (a child
# forked while the parent's workers slept hung in its first threaded kernel, now and then, under load).
POOL_SOURCE = """#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
typedef void (*task_fn)(void **args, int32_t core);
static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER, wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static atomic_uint generation;
static atomic_int remaining;
static task_fn task;
static void **task_args;
static int task_threads;
static int started, owner_pid;
static unsigned first_seen[1024];  /* the generation each worker was started in: it runs the ones after */
#define SPIN_NS 1000000  /* a worker spins 1 ms after a kernel: 200000 sched_yields burned 100 ms of a core */
static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static void *worker(void *arg) {
  int core = (int)(intptr_t)arg;
  unsigned seen = first_seen[core];
  for (;;) {
    long long until = now_ns() + SPIN_NS;
    while (atomic_load_explicit(&generation, memory_order_acquire) == seen) {
      if (now_ns() < until) { sched_yield(); continue; }
      pthread_mutex_lock(&wake_lock);
      while (atomic_load(&generation) == seen) pthread_cond_wait(&wake, &wake_lock);
      pthread_mutex_unlock(&wake_lock);
    }
    seen = atomic_load(&generation);
    if (core < task_threads) task(task_args, core);  /* workers beyond this kernel's slices only check in */
    atomic_fetch_sub_explicit(&remaining, 1, memory_order_release);
  }
  return 0;
}
static void in_forked_child(void) {
  pthread_mutex_init(&run_lock, 0);
  pthread_mutex_init(&wake_lock, 0);
  pthread_cond_init(&wake, 0);
  started = 0;  /* it has no workers */
  owner_pid = getpid();
}
__attribute__((constructor)) static void on_load(void) {
  owner_pid = getpid();
  pthread_atfork(0, 0, in_forked_child);
}
int ember_pool_run(task_fn fn, void **args, int32_t threads) {
  pthread_mutex_lock(&run_lock);
  if (threads > 1024) { pthread_mutex_unlock(&run_lock); return -1; }
  for (; started < threads - 1; started++) {
    pthread_t t;
    first_seen[started + 1] = atomic_load(&generation);
    if (pthread_create(&t, 0, worker, (void *)(intptr_t)(started + 1))) break;
    pthread_detach(t);
  }
  if (started < threads - 1) { pthread_mutex_unlock(&run_lock); return -1; }
  task = fn; task_args = args; task_threads = threads;
  atomic_store(&remaining, started);
  pthread_mutex_lock(&wake_lock);
  atomic_fetch_add_explicit(&generation, 1, memory_order_release);
  pthread_cond_broadcast(&wake);
  pthread_mutex_unlock(&wake_lock);
  fn(args, 0);
  while (atomic_load_explicit(&remaining, memory_order_acquire) > 0) sched_yield();
  pthread_mutex_unlock(&run_lock);
  return 0;
}
"""


@functools.cache
def thread_pool(compiler: CCompiler) -> Any:
    """The pool's `ember_pool_run(task, args, threads)`, compiled once per compiler (cached like a kernel)."""
    lib = compiler.compile_cached(POOL_SOURCE)
    run = ctypes.CDLL(loadable_file(f"ember_pool-{hashlib.sha256(lib).hexdigest()[:20]}.so", lib)).ember_pool_run
    run.argtypes, run.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32], ctypes.c_int
    return run


def find_dlclose() -> Any:
    """libc's dlclose(handle), or None where the process has none to call (ctypes never unloads a library itself)."""
    try:
        close = ctypes.CDLL(None).dlclose
    except (OSError, AttributeError):
        return None
    close.argtypes, close.restype = [ctypes.c_void_p], ctypes.c_int
    return close


DLCLOSE = find_dlclose()


class CPUProgram:
    """A compiled kernel: loads the shared object and calls the function with buffer pointers. A threaded kernel
    (threads > 1) runs on the thread pool, once per core, each call given its slice; ctypes releases the GIL.
    `task` is the address of the kernel's `{name}_task(args, core)` entry, which runtime/graph.py calls; whoever
    calls it holds the program, which unloads its library when it is freed (an evicted runner, a search's candidate:
    about 49 KB of mappings each, which ctypes would keep for the process's life)."""

    def __init__(self, spec: ProgramSpec, lib: bytes, cached: bool = True, compiler: CCompiler | None = None) -> None:
        self.name, self.threads = name, threads = spec.name, spec.threads
        self.path = loadable_file(f"{name}-{hashlib.sha256(lib).hexdigest()[:20]}.so", lib, cached)
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError:  # evicted by another process between the check and the load
            self.path = os.path.join(scratch_dir(), os.path.basename(self.path))
            write_atomically(self.path, lib)
            self.lib = ctypes.CDLL(self.path)
        if not cached and self.path.startswith(scratch_dir() + os.sep):
            os.unlink(self.path)  # loaded, it needs no file (a BEAM search loads dozens; the folder lives until exit)
        self.fn = getattr(self.lib, name)
        self.fn.restype = None
        # `{name}_task(args, core)`, the entry the pool and the graph runner (runtime/graph.py) call; None in a
        # library rendered without it (a renderer without task_entries, for a kernel that is not threaded)
        self.task: ctypes.c_void_p | None = None
        if hasattr(self.lib, f"{name}_task"):
            self.task = ctypes.cast(getattr(self.lib, f"{name}_task"), ctypes.c_void_p)
        if threads > 1:
            if self.task is None: raise ValueError(f"{name}: a threaded kernel needs its {name}_task entry")
            self.pool = thread_pool(compiler or CCompiler())

    def __del__(self) -> None:
        if (lib := self.__dict__.get("lib")) is not None and DLCLOSE is not None: DLCLOSE(lib._handle)

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        """Run on `bufs`: Buffers (their cached addresses) or host arrays."""
        start = time.perf_counter() if wait else 0.0
        addresses = [b.address if type(b) is Buffer else b.ctypes.data for b in bufs]
        if self.threads > 1:
            args = (ctypes.c_void_p * (len(bufs) + len(vals)))(*addresses, *vals)
            if self.pool(self.task, args, self.threads) != 0:
                raise RuntimeError(f"{self.name}: the pool could not start {self.threads} threads (at most 1024)")
        else:
            if self.fn.argtypes is None:  # the argument types, once: ctypes converts plain ints to them in C
                self.fn.argtypes = [ctypes.c_void_p] * len(bufs) + [ctypes.c_int32] * len(vals)
            self.fn(*addresses, *vals)
        return time.perf_counter() - start if wait else None


def loadable_file(name: str, lib: bytes, cached: bool = True) -> str:
    """A path to a file holding exactly `lib`, for dlopen: in the cache's lib/ when it holds these bytes or can take
    them (and `cached`: a BEAM candidate is not kept), else in scratch_dir(). The file there is read and compared
    before use: its name is a hash of the bytes it should hold, but a file truncated or overwritten since would load
    another kernel, or fail on every run."""
    if CACHELEVEL and cached:
        path = os.path.join(cache_dir(), "lib", name)
        if (found := read_cached(path)) == lib: return path
        if found is not None: discard_damaged(path, f"it holds {len(found)} bytes other than the kernel in its name")
        if cache_write(path, lib): return path
    scratch = os.path.join(scratch_dir(), name)  # private to this process: what is there, it wrote
    if not os.path.exists(scratch): write_atomically(scratch, lib)
    return scratch
