"""Devices: the registry `Device[name]`, device buffers, and the compiler base with its on-disk cache.

A device bundles an allocator, a renderer (UOps -> source), a compiler (source -> bytes) and a program class
(bytes -> something callable with buffers). Backends live in ember/runtime/ops_<name>.py and are imported on
first use, so a machine without CUDA never imports CUDA code.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import os
import tempfile
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.dtype import DType, to_numpy
from ember.errors import DeviceError
from ember.helpers import CACHELEVEL, cache_dir
from ember.uop.ops import BufferArg, Ops, UOp

# ---- buffers -----------------------------------------------------------------------------------------------------


class Allocator:
    """Allocates and copies device memory. The base class is host memory (numpy), which the CPU uses directly."""

    def alloc(self, nbytes: int) -> Any:
        return np.zeros(max(nbytes, 1), dtype=np.uint8)  # zeroed: a bug reads zeros, never stale memory

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

    def ensure_allocated(self) -> Buffer:
        if self._raw is None: self._raw = Device[self.device].allocator.alloc(self.nbytes)
        return self

    @property
    def raw(self) -> Any: return self.ensure_allocated()._raw

    def copyin(self, data: np.ndarray) -> Buffer:
        """Fill from a numpy array of the same number of elements (converted to this buffer's dtype)."""
        arr = np.ascontiguousarray(data, dtype=to_numpy(self.dtype)).reshape(-1)
        assert arr.size == self.size, f"copyin: {arr.size} elements into a buffer of {self.size}"
        Device[self.device].allocator.copyin(self.raw, memoryview(arr).cast("B"))
        return self

    def numpy(self) -> np.ndarray:
        """A host copy of the contents as a flat numpy array."""
        out = np.empty(self.size, dtype=to_numpy(self.dtype))
        if self.size: Device[self.device].allocator.copyout(memoryview(out).cast("B"), self.raw)
        return out


_BUFFERS: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()
_next_uid = itertools.count()


def buffer_uop(buf: Buffer) -> UOp:
    """A new tensor-level BUFFER node standing for `buf`; the buffer lives as long as the node."""
    u = UOp(Ops.BUFFER, buf.dtype, arg=BufferArg(next(_next_uid), buf.device, buf.size))
    _BUFFERS[u] = buf
    return u


def buffer_of(u: UOp) -> Buffer:
    """The Buffer behind a BUFFER node."""
    return _BUFFERS[u]


# ---- compilers ---------------------------------------------------------------------------------------------------


class Compiler:
    """Turns source into loadable bytes. `compile_cached` keeps results on disk keyed by source + compiler + flags."""

    def __init__(self, cache_key: str) -> None:
        self.cache_key = cache_key  # names the compiler, its version and its flags

    def compile(self, src: str) -> bytes: raise NotImplementedError

    def compile_cached(self, src: str) -> bytes:
        """compile(src), from the on-disk cache when this exact source was compiled before by this compiler."""
        if not CACHELEVEL: return self.compile(src)
        digest = hashlib.sha256(f"{self.cache_key}\0{src}".encode()).hexdigest()
        path = os.path.join(cache_dir(), "compile", digest[:2], digest)
        try:
            with open(path, "rb") as f: return f.read()
        except FileNotFoundError:
            pass
        lib = self.compile(src)
        write_atomically(path, lib)
        return lib


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path` so that readers see either nothing or all of it, never a partial file."""
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


# ---- the device registry -----------------------------------------------------------------------------------------


class Compiled:
    """A device: allocator, renderer, compiler and the program class that runs compiled bytes."""

    def __init__(self, name: str, allocator: Allocator, renderer: Any, compiler: Compiler, program: type) -> None:
        self.name, self.allocator, self.renderer = name, allocator, renderer
        self.compiler, self.program = compiler, program

    def synchronize(self) -> None:
        """Wait until all work queued on the device is done (the CPU runs synchronously)."""


class _DeviceRegistry:
    """`Device["CPU"]` returns the (cached) device; `Device.DEFAULT` is the one tensors land on by default."""

    # name -> (module, what to install when it fails to load)
    KNOWN: dict[str, tuple[str, str]] = {
        "CPU": ("ember.runtime.ops_cpu", "a C compiler (apt-get install gcc, or clang)"),
    }

    def __init__(self) -> None:
        self._opened: dict[str, Compiled] = {}
        self.DEFAULT = os.getenv("DEVICE", "CPU").upper()

    def canonicalize(self, name: str) -> str:
        """'cpu', 'CPU:0' -> 'CPU'; raises DeviceError naming the known devices."""
        base = name.split(":")[0].upper()
        if base not in self.KNOWN:
            raise DeviceError(f"Device: unknown device {name!r}; available: {', '.join(self.KNOWN)}")
        return base

    def __getitem__(self, name: str) -> Compiled:
        base = self.canonicalize(name)
        if base not in self._opened:
            module, install = self.KNOWN[base]
            try:
                self._opened[base] = importlib.import_module(module).open_device()
            except (ImportError, OSError, FileNotFoundError) as e:
                raise DeviceError(f"Device: {base} is not available here ({e}); install {install}") from e
        return self._opened[base]


Device = _DeviceRegistry()
