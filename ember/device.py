"""Devices: the registry `Device[name]`, device buffers, and the compiler base with its on-disk cache.

A device bundles an allocator, a renderer (UOps -> source), a compiler (source -> bytes) and a program class
(bytes -> something callable with buffers). Backends live in ember/runtime/ops_<name>.py and are imported on
first use, so a machine without CUDA never imports CUDA code.

The cache directory (helpers.cache_dir) holds compiled kernels (compile/, lib/), rendered programs (program/,
engine/realize.py) and NumericalFunction extensions (native/). Every entry is written atomically and read through
`read_cached`, which marks it used; `cache_write` keeps the directory under EMBER_CACHE_MAX_MB by evicting the least
recently used files.

Nothing found in the cache is trusted: a file can be truncated by a full disk, zeroed by a crash, or copied between
machines. Compiled kernels carry a checksum of their key and bytes in their name (`write_checked`), checked before
use; a damaged entry is deleted and rebuilt with a CacheWarning. A cache directory that cannot be written (read-only,
missing, a file in its place) costs speed, never results: ember warns once and compiles into scratch_dir().
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import functools
import hashlib
import importlib
import itertools
import os
import random
import re
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ember.dtype import DType, to_numpy
from ember.errors import DeviceError
from ember.helpers import CACHE_MAX_MB, CACHELEVEL, RECORDERS, cache_dir
from ember.uop.ops import BufferArg, Ops, UOp

# ---- buffers -----------------------------------------------------------------------------------------------------


REUSE_MIN_BYTES = 1 << 16  # freed host buffers at least this big are kept for reuse (smaller ones malloc reuses)
REUSE_MAX_BYTES = 1 << 28  # the most bytes kept: past it, a freed buffer goes back to the system


class Allocator:
    """Allocates and copies device memory. The base class is host memory (numpy), which the CPU uses directly.

    A freed buffer of REUSE_MIN_BYTES or more is kept, up to REUSE_MAX_BYTES in all, and handed to the next
    allocation of its size: a fresh one costs a page fault per 4 KiB on first write (a 16M-float elementwise kernel
    into a fresh output: 28-30 GB/s, into a reused one: 36 GB/s, the machine's triad bandwidth). A reused buffer holds
    its last contents, which nothing reads: every kernel stores every element of its outputs (rangeify), and copyin
    fills a whole buffer. New memory is zeroed, so that a bug reads zeros rather than another run's values."""

    align = 16  # bytes: the alignment an arena's views need (numpy's own)

    def __init__(self) -> None:
        self.kept: dict[int, list[Any]] = {}
        self.kept_bytes = 0
        self.lock = threading.Lock()

    def alloc(self, nbytes: int) -> Any:
        if nbytes >= REUSE_MIN_BYTES:
            with self.lock:
                if self.kept.get(nbytes):
                    self.kept_bytes -= nbytes
                    return self.kept[nbytes].pop()
        return np.zeros(max(nbytes, 1), dtype=np.uint8)

    def free(self, raw: Any, nbytes: int) -> None:
        """Take back a buffer nothing refers to any more (Buffer.__del__)."""
        if nbytes < REUSE_MIN_BYTES or getattr(raw, "base", None) is not None: return  # (an arena view: memory.py)
        with self.lock:
            if self.kept_bytes + nbytes > REUSE_MAX_BYTES: return
            self.kept.setdefault(nbytes, []).append(raw)
            self.kept_bytes += nbytes

    def arena(self, nbytes: int, align: int) -> Any:
        """`nbytes` starting at an `align`-byte boundary, for engine/memory.py: `arena[a:b]` is a view of bytes a to
        b, `arena.base` the allocation to free. Host memory: a numpy slice of an allocation align - 1 bytes bigger."""
        raw = self.alloc(nbytes + align - 1)
        start = -raw.ctypes.data % align
        return raw[start:start + nbytes]

    def alias(self, raw: Any) -> Any:
        """Another handle on the memory of `raw`, which `free` never keeps for reuse (a numpy view)."""
        return raw[:]

    def copyin(self, dest: Any, src: memoryview) -> None:
        np.copyto(dest[:src.nbytes], np.frombuffer(src, dtype=np.uint8))

    def copyout(self, dest: memoryview, src: Any) -> None:
        np.copyto(np.frombuffer(dest, dtype=np.uint8), src[:dest.nbytes])


@dataclass(eq=False)
class Buffer:
    """`size` elements of `dtype` on `device`, allocated on first use."""

    device: str
    size: int
    dtype: DType
    _raw: Any = field(default=None, repr=False)

    @property
    def nbytes(self) -> int: return self.size * self.dtype.itemsize

    def __del__(self) -> None:
        if self._raw is not None and (dev := Device.cached(self.device)) is not None:
            dev.allocator.free(self._raw, self.nbytes)

    def ensure_allocated(self) -> Buffer:
        if self._raw is None:
            try:
                self._raw = Device[self.device].allocator.alloc(self.nbytes)
            except MemoryError as e:  # (say which buffer: a symbolic one is sized for its variables' maxima)
                raise MemoryError(f"Buffer: cannot allocate {self.nbytes:,} bytes ({self.size:,} {self.dtype.name}) "
                                  f"on {self.device}; a tensor of a symbolic size takes memory for its Variable's "
                                  f"maximum (only the pages its bound values fill are touched): give the Variable a "
                                  f"smaller maximum") from e
        return self

    @property
    def raw(self) -> Any: return self.ensure_allocated()._raw

    @property
    def address(self) -> int:
        """Where host memory starts, kept: numpy's ctypes view of an array costs a microsecond (a jit replay sets a
        pointer per input and output)."""
        raw = self.raw
        cached = self.__dict__.get("_addressed")
        if cached is None or cached[0] is not raw:
            try:  # (a ctypes view of the memory tells its address in a third of the time numpy's ctypes does)
                address = ctypes.addressof(ctypes.c_char.from_buffer(raw))
            except (TypeError, ValueError):  # read-only or empty memory
                address = raw.ctypes.data
            self.__dict__["_addressed"] = cached = (raw, address)
        return cached[1]

    def copyin(self, data: np.ndarray) -> Buffer:
        """Fill from a numpy array of the same number of elements (converted to this buffer's dtype)."""
        arr = np.ascontiguousarray(data, dtype=to_numpy(self.dtype)).reshape(-1)
        assert arr.size == self.size, f"copyin: {arr.size} elements into a buffer of {self.size}"
        if RECORDERS.stack: RECORDERS[-1].copy(self)
        Device[self.device].allocator.copyin(self.raw, memoryview(arr).cast("B"))
        return self

    def numpy(self, count: int | None = None) -> np.ndarray:
        """A host copy of the contents as a flat numpy array; of the first `count` elements only, if given (a
        symbolic tensor's values, at the start of a buffer sized for its variables' maxima)."""
        out = np.empty(self.size if count is None else min(count, self.size), dtype=to_numpy(self.dtype))
        if self.size: Device[self.device].allocator.copyout(memoryview(out).cast("B"), self.raw)
        return out


_next_uid = itertools.count()


def buffer_uop(buf: Buffer, size: int | None = None) -> UOp:
    """A new tensor-level BUFFER node standing for `buf`; the buffer lives as long as the node (it is held in the
    node's attribute dict, which dies with it: no weak dictionary to keep in step, per eager op). `size`: the
    elements the node claims, where not the buffer's (a buffer read in a symbolic shape: schedule/unbind.py)."""
    u = UOp(Ops.BUFFER, buf.dtype, arg=BufferArg(next(_next_uid), buf.device, buf.size if size is None else size))
    u.__dict__["buffer"] = buf
    return u


def buffer_of(u: UOp) -> Buffer:
    """The Buffer behind a BUFFER node."""
    return u.__dict__["buffer"]


# ---- compilers ---------------------------------------------------------------------------------------------------


class Compiler:
    """Turns source into loadable bytes. `compile_cached` keeps results on disk keyed by source + compiler + flags."""

    def __init__(self, cache_key: str) -> None:
        self.cache_key = cache_key  # names the compiler, its version and its flags

    def compile(self, src: str) -> bytes: raise NotImplementedError

    def compile_cached(self, src: str) -> bytes:
        """compile(src), from the on-disk cache when this exact source was compiled before by this compiler; an entry
        whose checksum does not match is rebuilt (see `find_checked`)."""
        if not CACHELEVEL: return self.compile(src)
        digest = hashlib.sha256(f"{self.cache_key}\0{src}".encode()).hexdigest()
        folder = os.path.join(cache_dir(), "compile", digest[:2])
        if (found := find_checked(folder, digest)) is not None: return found[1]
        lib = self.compile(src)
        write_checked(folder, digest, lib)
        return lib


def describe_compile_error(compiler: str, src: str, output: str) -> str:
    """The compiler's output, then the source around the first line it complains about, that line marked."""
    lines = src.split("\n")
    # gcc and clang: "file:12:3: error: ..."; PoCL's build log: "error: file:12:3: ..."
    match = re.search(r":(\d+):(?:\d+:)? (?:fatal )?error", output) or re.search(r"error: \S*?:(\d+):\d+:", output)
    bad = int(match.group(1)) if match else None
    shown = range(max(1, bad - 3), min(len(lines), bad + 3) + 1) if bad else range(1, len(lines) + 1)
    listing = "\n".join(f"{'>>' if n == bad else '  '} {n:4d} | {lines[n - 1]}" for n in shown)
    return f"{compiler} failed to compile a kernel:\n{output.strip()}\n--- source ---\n{listing}"



# ---- the cache directory -----------------------------------------------------------------------------------------


class CacheWarning(UserWarning):
    """The cache directory was not usable as found (a damaged entry, a directory ember cannot write) and ember went
    on without it: results are right, only time is lost. Its own category, so that it can be filtered or made an
    error: warnings.simplefilter("error", CacheWarning)."""


WRITE_ATTEMPTS = 3  # a folder deleted while we write into it (rm -rf of the cache, eviction) is made again this often


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path` so that readers see either nothing or all of it, never a partial file. A folder that
    disappears meanwhile (the user deleting the cache, evict_cache removing an empty folder) is made again."""
    for attempt in range(WRITE_ATTEMPTS):
        try:
            _write_once(path, data)
            return
        except FileNotFoundError:
            if attempt == WRITE_ATTEMPTS - 1: raise


def _write_once(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp): os.unlink(tmp)
        raise


def touch(path: str) -> None:
    """Mark a cache entry as just used: eviction goes by modification time (atime is not kept on many mounts)."""
    try:
        os.utime(path)
    except OSError:  # evicted meanwhile, or a read-only cache: the entry is still usable
        pass


def read_cached(path: str) -> bytes | None:
    """The bytes of a cache entry, marked as used; None when there is none (or it cannot be read)."""
    try:
        with open(path, "rb") as f: data = f.read()
    except OSError:
        return None
    touch(path)
    return data


# errors that say the cache directory cannot take files (rather than a bug in ember): cache_write falls back on them
UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ENOENT, errno.EEXIST,
                        errno.ENOSPC, errno.EDQUOT, errno.EISDIR})
_unwritable_warned: set[str] = set()  # cache roots this process has warned about


def cache_write(path: str, data: bytes) -> bool:
    """Write a cache entry atomically, then maybe evict (see `maybe_evict`). False where the cache directory cannot
    be written (see UNWRITABLE): the caller goes on without the entry, and the first such failure per cache
    directory warns, naming the cause, so that a read-only cache is neither an error nor a warning per kernel."""
    try:
        write_atomically(path, data)
    except OSError as e:
        if e.errno not in UNWRITABLE: raise
        if (root := cache_dir()) not in _unwritable_warned:
            _unwritable_warned.add(root)
            warnings.warn(f"cache: cannot write to the cache directory {root}: {e}; compiling into a private "
                          f"temporary directory instead, so this process's kernels are not kept; point EMBER_CACHE "
                          f"at a writable directory, or set CACHELEVEL=0", CacheWarning, stacklevel=2)
        return False
    maybe_evict(len(data))
    return True


def discard_damaged(path: str, why: str) -> None:
    """Delete a cache entry found damaged, with a CacheWarning; its caller builds it again."""
    done = "deleted" if _unlink(path) else "cannot delete it"  # a read-only cache keeps it; each process rebuilds
    warnings.warn(f"cache: damaged entry {path}: {why}; {done}, building it again", CacheWarning, stacklevel=3)


def checked_name(key: str, data: bytes) -> str:
    """The file name write_checked gives `data` stored under `key`: the key, then a checksum of key and bytes, so a
    truncated or overwritten file, or another key's file copied here, no longer matches its name."""
    checksum = hashlib.sha256(key.encode() + b"\0" + data).hexdigest()[:32]
    return f"{key}.{checksum}"


def write_checked(folder: str, key: str, data: bytes) -> str | None:
    """Store `data` under `key` in `folder`; the path written, or None where the cache cannot be written."""
    path = os.path.join(folder, checked_name(key, data))
    return path if cache_write(path, data) else None


def find_checked(folder: str, key: str) -> tuple[str, bytes] | None:
    """The path and bytes stored by write_checked(folder, key, ...), marked as used; None when there are none. Files
    whose bytes do not match their name are deleted (`discard_damaged`). Costs one listing of `folder`: keep a few
    hundred entries per folder at most (compile/ spreads them over 256 by the key's first two digits)."""
    try:
        with os.scandir(folder) as it: names = [e.name for e in it if e.name.startswith(key + ".")]
    except OSError:  # no such folder yet, or not readable: nothing cached
        return None
    for name in names:
        path = os.path.join(folder, name)
        if (data := read_cached(path)) is None: continue  # evicted meanwhile
        if checked_name(key, data) == name: return path, data
        discard_damaged(path, f"its {len(data)} bytes do not match the checksum in its name")
    return None


CHECKS_PER_CAP = 16  # eviction scans per cap's worth of bytes written: the cache overshoots its cap by about 1/16
EVICT_TO = 0.8  # a scan over the cap evicts down to this fraction of it, so the next writes do not evict again
STALE_TEMP_S = 3600.0  # a writer's temp file older than this was left by a crash; a younger one may be in use
_evict_rng = random.Random()  # its own generator: users' seeds are not disturbed


def maybe_evict(nbytes: int) -> None:
    """After writing `nbytes`, scan the cache with probability CHECKS_PER_CAP * nbytes / cap. A scan stats every
    file (about 6 us each), so it is amortized over writes, never paid on reads; being random rather than counted,
    it needs no state shared between processes, yet a scan comes about every cap / 16 bytes written by them all."""
    cap = CACHE_MAX_MB.value * 2**20
    if cap > 0 and _evict_rng.random() * cap < CHECKS_PER_CAP * nbytes: evict_cache(cap)


def evict_cache(cap: int, root: str | None = None) -> list[str]:
    """Delete the least recently used files of the cache (default: cache_dir()) until it holds at most
    EVICT_TO * cap bytes, when it holds more than `cap`; returns the deleted paths. Deleting a shared object that
    some process has loaded is safe on POSIX systems: the mapping stays until that process unloads it."""
    root = root or cache_dir()
    entries: list[tuple[int, int, str]] = []  # (mtime ns, bytes, path)
    stack, total, now = [root], 0, time.time()
    while stack:
        try:
            with os.scandir(stack.pop()) as it: found = list(it)
        except OSError:
            continue
        for e in found:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:  # deleted by another process meanwhile
                continue
            if e.name.startswith(".tmp-"):
                if now - st.st_mtime > STALE_TEMP_S: _unlink(e.path)
                continue
            entries.append((st.st_mtime_ns, st.st_size, e.path))
            total += st.st_size
    removed: list[str] = []
    if total <= cap: return removed
    entries.sort()
    for _, size, path in entries:
        if total <= EVICT_TO * cap: break
        if _unlink(path): removed.append(path)
        total -= size
    return removed


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:  # another process evicted it first
        return False


@functools.cache
def scratch_dir() -> str:
    """A directory of this process's own, removed at exit: where files go that must exist on disk (a shared object to
    load) when CACHELEVEL=0 keeps the cache directory untouched."""
    path = tempfile.mkdtemp(prefix="ember-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# ---- the device registry -----------------------------------------------------------------------------------------


class Program(Protocol):
    """What a device's `program(spec, lib, cached)` returns: the compiled kernel, loaded, called with its buffers
    (Buffers, or host arrays on the CPU) and the integer values of its variables. With `wait` it returns the seconds
    the run took, once the device finished it. `cached=False` (a BEAM candidate) keeps nothing on disk."""

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None: ...


class Compiled:
    """A device: allocator, renderer, compiler and the program factory that loads compiled bytes."""

    def __init__(self, name: str, allocator: Allocator, renderer: Any, compiler: Compiler,
                 program: Callable[..., Program], graph: Callable[..., Any] | None = None) -> None:
        self.name, self.allocator, self.renderer = name, allocator, renderer
        self.compiler, self.program = compiler, program
        # runs a jit's recorded kernels as one call, from [(program, buffers, variable values)] (runtime/graph.py's
        # NativeGraph on the CPU); None where the device runs them one by one
        self.graph = graph

    def synchronize(self) -> None:
        """Wait until all work queued on the device is done (the CPU runs synchronously)."""


class _DeviceRegistry:
    """`Device["CPU"]` returns the (cached) device; `Device.DEFAULT` is the one tensors land on by default."""

    # name -> (module, what to install when it fails to load)
    KNOWN: dict[str, tuple[str, str]] = {
        "CPU": ("ember.runtime.cpu", "a C compiler (apt-get install gcc, or clang)"),
        "CL": ("ember.runtime.ops_cl", "an OpenCL platform (apt-get install ocl-icd-libopencl1 pocl-opencl-icd)"),
        "CUDA": ("ember.runtime.ops_cuda", "an NVIDIA driver, and pip install nvidia-cuda-nvrtc==13.5.37"),
        # NULL:<target> compiles for the target and runs nothing (runtime/ops_null.py)
        "NULL": ("ember.runtime.ops_null", "the target's compiler (NULL:CUDA: pip install nvidia-cuda-nvrtc==13.5.37; "
                 "NULL:PTX: and nvidia-nvjitlink==13.5.37)"),
    }

    # the devices Device.DEFAULT may pick, best first: a GPU that runs kernels, else the CPU (PoCL's CL runs on the
    # CPU too, slower than the CPU device's own code: it is used when asked for, DEVICE=CL)
    PREFERRED = ("CUDA", "CPU")
    LISTED = ("CPU", "CL", "CL:CUDA", "CUDA", "CUDA:PTX", "NULL:CUDA", "NULL:PTX", "NULL:CL")  # what devices() reports

    def __init__(self) -> None:
        self._opened: dict[str, Compiled] = {}
        wanted = os.getenv("DEVICE", "")
        if not wanted: self.DEFAULT = self.best()
        else: self.DEFAULT = self.canonicalize(wanted) if wanted.split(":")[0].upper() in self.KNOWN else wanted.upper()

    def why_not(self, name: str) -> str | None:
        """None where device `name` opens here, else why not (with what to install)."""
        try:
            self[name]
        except DeviceError as e:
            return str(e)
        return None

    def best(self) -> str:
        """The first of PREFERRED that opens here (the CPU, which needs only a C compiler, where none does)."""
        return next((name for name in self.PREFERRED[:-1] if self.why_not(name) is None), self.PREFERRED[-1])

    def canonicalize(self, name: str) -> str:
        """'cpu', 'CPU:0' -> 'CPU'; 'null:cuda' -> 'NULL:CUDA' (a NULL device keeps its target, 'NULL' alone is
        NULL:CUDA); 'cl:cuda' -> 'CL:CUDA' (the CL device emulating CUDA's tensor cores), 'cuda:ptx' -> 'CUDA:PTX'
        (the GPU with kernels in PTX); raises DeviceError naming the known devices."""
        parts = name.upper().split(":")
        if parts[0] not in self.KNOWN:
            raise DeviceError(f"Device: unknown device {name!r}; available: {', '.join(self.KNOWN)}")
        if parts[0] == "NULL": return f"NULL:{parts[1] if len(parts) > 1 else 'CUDA'}"
        return ":".join(parts[:2]) if tuple(parts[:2]) in (("CL", "CUDA"), ("CUDA", "PTX")) else parts[0]

    def cached(self, name: str) -> Compiled | None:
        """The device if it is open (without opening it: a buffer freed at exit must not start a compiler)."""
        try:
            return self._opened.get(self.canonicalize(name))
        except DeviceError:
            return None

    def __getitem__(self, name: str) -> Compiled:
        full = self.canonicalize(name)
        if full not in self._opened:
            base, *target = full.split(":")
            module, install = self.KNOWN[base]
            try:
                self._opened[full] = importlib.import_module(module).open_device(*target)
            except (ImportError, OSError, FileNotFoundError) as e:
                raise DeviceError(f"Device: {full} is not available here ({e}); install {install}") from e
        return self._opened[full]


Device = _DeviceRegistry()


def devices() -> dict[str, str]:
    """Every device ember knows, with "available" or the reason it is not here (and what to install):

    >>> devices()["CPU"]
    'available'
    """
    return {name: Device.why_not(name) or "available" for name in Device.LISTED}
