"""Small shared helpers and the environment flags (DEBUG, ...), each defined once here.

`Context(DEBUG=2)` sets flags for a block or a function, as a context manager or a decorator.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
    """env_value, read once per process."""
    return env_value(key, default)


def env_value(key: str, default: Any = 0) -> Any:
    """The environment variable `key` converted to the type of `default`; a value that does not convert is a
    ValueError naming the variable (BEAM=x, EMBER_THREADS=two)."""
    value = os.getenv(key, default)
    try:
        return type(default)(value)
    except ValueError:
        raise ValueError(f"${key}={value!r}: expected {type(default).__name__} (e.g. {key}={default})") from None


class ContextVar:
    """A named flag with a value from the environment that `Context` can override for a while."""

    registry: dict[str, ContextVar] = {}
    generation = 0  # counts changes of any flag's value: a cache of what depends on flags keys by it

    def __init__(self, key: str, default: int) -> None:
        assert key not in ContextVar.registry, f"flag {key} defined twice"
        self.key, self.value = key, getenv(key, default)
        ContextVar.registry[key] = self

    @property
    def value(self) -> int: return self._value

    @value.setter
    def value(self, v: int) -> None:
        self._value = v
        ContextVar.generation += 1

    def __bool__(self) -> bool: return bool(self._value)
    def __ge__(self, other: int) -> bool: return self._value >= other
    def __gt__(self, other: int) -> bool: return self._value > other
    def __lt__(self, other: int) -> bool: return self._value < other
    def __le__(self, other: int) -> bool: return self._value <= other
    def __repr__(self) -> str: return f"{self.key}={self.value}"


DEBUG = ContextVar("DEBUG", 0)  # 1: kernels and times, 2: + schedule, 4: + source, 5: + uops, 6: + rewrites
SPEC = ContextVar("SPEC", 0)  # check every stage's output against ember/uop/spec.py
TRACK_REWRITES = ContextVar("TRACK_REWRITES", 0)  # record every rule firing (rule, before, after)
CACHELEVEL = ContextVar("CACHELEVEL", 1)  # 0: the cache directory is neither read nor written
# the cache directory's size cap in MiB (0: no cap): 1 GiB keeps about eight full test-suite runs (126 MB each) or
# some 25,000 kernels, and is small beside a disk; least recently used files go first (device.evict_cache)
CACHE_MAX_MB = ContextVar("EMBER_CACHE_MAX_MB", 1024)
# a NumericalFunction's first call with nothing compiled: 1 evaluates it with numpy while the native code builds in a
# thread (export/interpreter.py), 0 waits for the compiler, 2 waits and checks that both give the same bits (tests)
INTERPRET = ContextVar("INTERPRET", 1)
NOOPT = ContextVar("NOOPT", 0)  # 1: kernels get no opts (no vectors, threads or tiles): the reference codegen
BEAM = ContextVar("BEAM", 0)  # n > 0: opts found by timing candidates, the n fastest kept per step (codegen/search.py)
# C++ source of a NumericalFunction above which its native build is refused rather than compiled: g++ -O2 takes
# about 1 s per 100 KB of ember's straight-line kernels, and minutes and gigabytes from a few MB (a 39 MB unrolled
# rollout with its jacobians still compiled after 25 minutes)
MAX_CXX_BYTES = ContextVar("EMBER_MAX_CXX_BYTES", 8_000_000)
UNROLL = ContextVar("UNROLL", 64)  # most STOREs rangeify unrolls a kernel's small branching output axes into; 0: none


class Recorders(threading.local):
    """The recorders of the jitted calls running now in this thread (engine/jit.py), innermost last: what runs is
    told to the last one. Per thread: another thread's eager kernels are not this call's. Here, below every module
    that reports to it (realize, Tensor.assign, Buffer.copyin, random draws)."""

    def __init__(self) -> None: self.stack: list[Any] = []
    def __bool__(self) -> bool: return bool(self.stack)
    def __getitem__(self, i: int) -> Any: return self.stack[i]
    def append(self, recorder: Any) -> None: self.stack.append(recorder)
    def remove(self, recorder: Any) -> None: self.stack.remove(recorder)


RECORDERS = Recorders()
ASSIGN_HOOKS: list[Any] = []  # called with each tensor Tensor.assign gives a new value outside a recording


class Context(contextlib.ContextDecorator):
    """Set flags temporarily: `with Context(DEBUG=2): ...` or `@Context(DEBUG=2)`."""

    def __init__(self, **flags: int) -> None:
        unknown = [k for k in flags if k not in ContextVar.registry]
        if unknown: raise KeyError(f"Context: unknown flags {unknown}; known: {sorted(ContextVar.registry)}")
        self.flags = flags
        self.saved: list[dict[str, int]] = []  # a stack: the same Context may be entered again while active

    def __enter__(self) -> Context:
        self.saved.append({k: ContextVar.registry[k].value for k in self.flags})
        for k, v in self.flags.items(): ContextVar.registry[k].value = v
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.pop().items(): ContextVar.registry[k].value = v


def prod(xs: Iterable[int]) -> int:
    return math.prod(xs)


def argsort(xs: Sequence[Any]) -> list[int]:
    return sorted(range(len(xs)), key=xs.__getitem__)


def strides_for_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major (C order) element strides of `shape`."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def cache_dir() -> str:
    """Where ember keeps compiled kernels and rendered programs: $EMBER_CACHE, else $XDG_CACHE_HOME/ember, else
    ~/.cache/ember. Read on every call, so that tests (and users) may point it elsewhere while running."""
    base = os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.getenv("EMBER_CACHE") or os.path.join(base, "ember")


@functools.cache
def source_hash() -> str:
    """A hash of ember's own code and templates: cache entries derived by ember's code (rendered programs, native
    extensions) name it in their key, so that a change to ember invalidates them."""
    root = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".py", ".j2")):
                with open(os.path.join(folder, name), "rb") as fh: digest.update(name.encode() + fh.read())
    return digest.hexdigest()


def colored(text: str, color: str) -> str:
    codes = {"red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36, "gray": 90}
    return f"\033[{codes[color]}m{text}\033[0m" if os.isatty(1) else text
