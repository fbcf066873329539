"""Faults in the on-disk cache (device.py, runtime/ops_cpu.py, engine/realize.py, export/native.py): a damaged entry,
a cache from another CPU, a directory that cannot be written or disappears. Each costs time and at most one
CacheWarning, never a wrong value or an error.

Oracles: numpy for values, the files left on disk, the warnings recorded, and a compiler that fails when called
(a rebuilt entry is served from the cache afterwards). Every test points $EMBER_CACHE at a fresh directory and
forgets this process's compiled programs, so each realization reads the cache as the test left it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import ember.device
import ember.engine.realize as realize
import ember.export.native as native
import ember.runtime.ops_cpu as ops_cpu
import ember.schedule.cache as schedule_cache
from ember.codegen import get_program
from ember.device import Device
from ember.export import Arg, NumericalFunction
from ember.export.native import locate_native
from ember.helpers import Context, cache_dir
from ember.renderer import ProgramSpec
from tests.helpers import scaled_sums, unique_constant, use_fresh_cache


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return use_fresh_cache(tmp_path, monkeypatch)


@contextmanager
def cache_warnings() -> Iterator[list[str]]:
    """The messages of the CacheWarnings raised in the block (read after it ends)."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield messages
    messages += [str(w.message) for w in caught if w.category.__name__ == "CacheWarning"]


def realize_fresh(c: float) -> None:
    """Realize scaled_sums(c) as a new process would (nothing compiled in memory) and check its value."""
    realize._runners.clear()
    schedule_cache.forget()  # (no constant has varied yet: c is the kernel's, not a buffer's)
    t, want = scaled_sums(c)
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)


def program_of(c: float) -> ProgramSpec:
    (item,) = scaled_sums(c)[0].schedule()
    return realize.cached_program(item.ast, Device["CPU"].renderer)


def program_entry(root: Path, c: float) -> Path:
    (item,) = scaled_sums(c)[0].schedule()
    digest = hashlib.sha256(realize.program_key(item.ast, Device["CPU"].renderer).encode()).hexdigest()
    return root / "program" / digest[:2] / f"{digest}.json"


def compile_entry(root: Path, c: float) -> Path:
    """The compile cache's file for scaled_sums(c)'s kernel, whatever follows the key in its name."""
    digest = hashlib.sha256(f"{Device['CPU'].compiler.cache_key}\0{program_of(c).src}".encode()).hexdigest()
    (entry,) = (root / "compile" / digest[:2]).glob(f"{digest}*")
    return entry


def lib_entry(root: Path, c: float) -> tuple[Path, bytes]:
    """Where CPUProgram keeps scaled_sums(c)'s shared object for dlopen, and the bytes it must hold."""
    spec = program_of(c)
    lib = Device["CPU"].compiler.compile_cached(spec.src)
    return root / "lib" / f"{spec.name}-{hashlib.sha256(lib).hexdigest()[:20]}.so", lib


def forbid_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Device["CPU"].compiler, "compile", lambda src: pytest.fail("a cached kernel was compiled"))


# each takes the damaged entry and another kernel's entry of the same kind
DAMAGES: dict[str, Callable[[Path, Path], None]] = {
    "truncated": lambda entry, other: entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2]),
    "zeroed": lambda entry, other: entry.write_bytes(bytes(entry.stat().st_size)),
    "swapped": lambda entry, other: entry.write_bytes(other.read_bytes()),
    "foreign": lambda entry, other: entry.write_bytes(os.urandom(entry.stat().st_size)),
}


# ---- damaged entries --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_compile_entry_is_rebuilt_with_one_warning(cache: Path, damage: str, monkeypatch: pytest.MonkeyPatch):
    c, other = unique_constant(), unique_constant()
    realize_fresh(c)
    realize_fresh(other)
    assert program_of(c).name == program_of(other).name, "a swapped object would define the symbol looked up"
    DAMAGES[damage](compile_entry(cache, c), compile_entry(cache, other))
    with cache_warnings() as caught:
        realize_fresh(c)
    assert len(caught) == 1 and "damaged" in caught[0], caught
    forbid_compiling(monkeypatch)
    with cache_warnings() as caught:
        realize_fresh(c)
    assert caught == []
    assert compile_entry(cache, c).read_bytes() == lib_entry(cache, c)[1]


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_shared_object_is_rebuilt_with_one_warning(cache: Path, damage: str):
    """The file dlopen loads (lib/), damaged before this process first loads it."""
    c, other = unique_constant(), unique_constant()
    realize_fresh(other)
    path, lib = lib_entry(cache, c)  # compiled into the cache, not loaded yet
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lib)
    DAMAGES[damage](path, lib_entry(cache, other)[0])
    with cache_warnings() as caught:
        realize_fresh(c)
    assert len(caught) == 1 and "damaged" in caught[0], caught
    assert path.read_bytes() == lib


@pytest.mark.parametrize("damage", ["truncated", "swapped"])
def test_damaged_program_entry_is_rebuilt_with_one_warning(cache: Path, damage: str):
    c, other = unique_constant(), unique_constant()
    realize_fresh(c)
    realize_fresh(other)
    entry = program_entry(cache, c)
    DAMAGES[damage](entry, program_entry(cache, other))
    with cache_warnings() as caught:
        realize_fresh(c)
    assert len(caught) == 1 and "damaged" in caught[0], caught
    with cache_warnings() as caught:
        realize_fresh(c)
    (item,) = scaled_sums(c)[0].schedule()
    assert caught == [] and json.loads(entry.read_bytes())["src"] == get_program(item.ast, Device["CPU"].renderer).src


def test_cache_key_names_the_cpu_that_native_means(cache: Path):
    compiler = Device["CPU"].compiler
    target = ops_cpu.native_target(compiler.cc)
    assert target and target in compiler.cache_key
    assert "-march=native" not in target.split()
    assert ops_cpu.probe_native_target(compiler.cc) == ops_cpu.probe_native_target(compiler.cc), \
        "the same in every process, or nothing hits"


def test_resolved_target_is_kept_for_this_cpu_only(cache: Path, monkeypatch: pytest.MonkeyPatch):
    cc = Device["CPU"].compiler.cc
    target = ops_cpu.native_target.__wrapped__(cc)  # probes, and keeps the answer in the cache
    monkeypatch.setattr(ops_cpu, "probe_native_target", lambda compiler: pytest.fail("probed again on this CPU"))
    assert ops_cpu.native_target.__wrapped__(cc) == target
    monkeypatch.setattr(ops_cpu, "cpuinfo", lambda: "model name : another CPU")
    monkeypatch.setattr(ops_cpu, "probe_native_target", lambda compiler: "-march=another")
    assert ops_cpu.native_target.__wrapped__(cc) == "-march=another"


def test_cache_written_on_another_cpu_is_not_used(cache: Path, monkeypatch: pytest.MonkeyPatch):
    """A cache shared between machines: the same compiler binary, another CPU behind -march=native."""
    src = f"void k(float* restrict out) {{ out[0] = 2.5f; /* {uuid.uuid4().hex} */ }}\n"
    Device["CPU"].compiler.compile_cached(src)
    monkeypatch.setattr(ops_cpu, "native_target", lambda compiler: "-march=some-other-cpu")
    elsewhere = ops_cpu.CCompiler()
    calls: list[str] = []
    monkeypatch.setattr(elsewhere, "compile", lambda src: calls.append(src) or b"another machine's object")
    assert elsewhere.compile_cached(src) == b"another machine's object" and len(calls) == 1


# ---- directories that cannot be written -------------------------------------------------------------------------


def read_only_under(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make creating anything under `root` fail as on a read-only mount (tests run as root, whom chmod stops not)."""
    real_makedirs, real_mkstemp = os.makedirs, tempfile.mkstemp

    def refuse(path: object) -> None:
        if str(path).startswith(str(root)): raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def makedirs(name: str, *args: object, **kwargs: object) -> None:
        if not os.path.isdir(name): refuse(name)
        real_makedirs(name, *args, **kwargs)  # type: ignore[arg-type]

    def mkstemp(*args: object, dir: str | None = None, **kwargs: object) -> tuple[int, str]:
        refuse(dir)
        return real_mkstemp(*args, dir=dir, **kwargs)  # type: ignore[call-overload]
    monkeypatch.setattr(os, "makedirs", makedirs)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def file_in_place(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EMBER_CACHE under a regular file: nothing can be made there, whoever runs."""
    root.parent.mkdir(parents=True, exist_ok=True)
    (root.parent / "file").write_text("")
    monkeypatch.setenv("EMBER_CACHE", str(root.parent / "file" / "cache"))


UNWRITABLE = {"read-only": (read_only_under, "Read-only file system"),
              "file in place": (file_in_place, "Not a directory")}


@pytest.mark.parametrize("fault", UNWRITABLE)
def test_unwritable_cache_compiles_elsewhere_with_one_warning(cache: Path, fault: str, monkeypatch: pytest.MonkeyPatch):
    make_unwritable, cause = UNWRITABLE[fault]
    make_unwritable(cache, monkeypatch)
    ops_cpu.takes_float16.cache_clear()  # the compiler probe, which writes the cache when the device opens
    monkeypatch.setattr(Device, "_opened", {})
    with cache_warnings() as caught:
        assert Device["CPU"].compiler.cc
        for _ in range(3): realize_fresh(unique_constant())
    assert len(caught) == 1 and cause in caught[0] and cache_dir() in caught[0], caught
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))


def test_read_only_cache_still_serves_what_it_holds(cache: Path, monkeypatch: pytest.MonkeyPatch):
    c = unique_constant()
    realize_fresh(c)
    read_only_under(cache, monkeypatch)
    forbid_compiling(monkeypatch)
    with cache_warnings() as caught:
        realize_fresh(c)
    assert caught == []


def test_cache_deleted_between_realizations(cache: Path):
    c = unique_constant()
    realize_fresh(c)
    shutil.rmtree(cache)
    with cache_warnings() as caught:
        realize_fresh(unique_constant())
        realize_fresh(c)
    assert caught == [] and compile_entry(cache, c).is_file()


def test_cache_folder_deleted_while_an_entry_is_written(cache: Path, monkeypatch: pytest.MonkeyPatch):
    real_mkstemp, deleted = tempfile.mkstemp, []

    def mkstemp(*args: object, dir: str | None = None, **kwargs: object) -> tuple[int, str]:
        if not deleted and str(dir).startswith(str(cache)):  # after write_atomically made the folder
            deleted.append(dir)
            shutil.rmtree(cache)
        return real_mkstemp(*args, dir=dir, **kwargs)  # type: ignore[call-overload]
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    c = unique_constant()
    with cache_warnings() as caught:
        realize_fresh(c)
    assert deleted and caught == []
    assert compile_entry(cache, c).is_file()


def test_cachelevel_zero_never_touches_the_cache_directory(cache: Path, monkeypatch: pytest.MonkeyPatch):
    file_in_place(cache, monkeypatch)
    with Context(CACHELEVEL=0), cache_warnings() as caught:
        realize_fresh(unique_constant())
    assert caught == [] and not cache.exists()
    assert (cache.parent / "file").read_text() == ""


def test_cache_warning_is_embers_own_category():
    assert issubclass(ember.device.CacheWarning, UserWarning)
    assert ember.device.CacheWarning.__module__ == "ember.device"


# ---- NumericalFunction's native extensions (export/native.py) ---------------------------------------------------


def scaled_function(c: float) -> NumericalFunction:
    """The same function of a fresh process each call: traced anew, nothing loaded in memory."""
    return NumericalFunction("scaled", lambda x: x * c + 1.0, [Arg(3)])


def native_entry(root: Path, f: NumericalFunction) -> Path:
    where = locate_native(f)
    assert where is not None, "no C++ compiler: this machine cannot build native extensions"
    (entry,) = (root / "native").glob(f"{where.ext}.*")
    return entry


def check_native(f: NumericalFunction, c: float) -> None:
    x = np.arange(3.0)
    np.testing.assert_array_equal(f.compile()(x), x * c + 1.0)
    assert f._native, "the call ran kernel by kernel, not natively"


def forbid_native_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native.subprocess, "run", lambda *a, **k: pytest.fail("a cached extension was built again"))


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_native_extension_is_rebuilt_with_one_warning(cache: Path, damage: str,
                                                              monkeypatch: pytest.MonkeyPatch):
    c, other = unique_constant(), unique_constant()
    check_native(scaled_function(c), c)
    check_native(scaled_function(other), other)
    entry = native_entry(cache, scaled_function(c))
    damaged = entry.with_name("damaged")  # damaged beside it, then moved in: this process has the file mapped
    shutil.copy(entry, damaged)
    DAMAGES[damage](damaged, native_entry(cache, scaled_function(other)))
    os.replace(damaged, entry)
    with cache_warnings() as caught:
        check_native(scaled_function(c), c)
    assert len(caught) == 1 and "damaged" in caught[0], caught
    forbid_native_builds(monkeypatch)
    with cache_warnings() as caught:
        check_native(scaled_function(c), c)
    assert caught == []


@pytest.mark.parametrize("fault", UNWRITABLE)
def test_unwritable_cache_builds_native_extensions_elsewhere(cache: Path, fault: str,
                                                             monkeypatch: pytest.MonkeyPatch):
    UNWRITABLE[fault][0](cache, monkeypatch)
    c = unique_constant()
    with cache_warnings() as caught:
        check_native(scaled_function(c), c)
    assert len(caught) <= 1, caught  # one warning per process: an earlier test may have given it
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))


def test_native_cache_key_names_the_cpu_not_native(cache: Path, monkeypatch: pytest.MonkeyPatch):
    """A cache shared between machines: another CPU behind -march=native has its own extension."""
    c = unique_constant()
    here = locate_native(scaled_function(c))
    monkeypatch.setattr(native, "native_target", lambda compiler: "-march=another")
    assert here is not None and locate_native(scaled_function(c)).ext != here.ext
