"""The CPU device: exact C constants, readable compile errors, an atomic on-disk compile cache, and DEBUG output.

Oracles: numpy's bit patterns for constants, the compiler's own bytes for the cache, and the lines DEBUG promises.
Every test that writes the cache points it at a fresh directory through $EMBER_CACHE.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import ember.device
import ember.engine.realize
from ember import Tensor
from ember.codegen import get_program
from ember.device import Compiler, Device
from ember.dtype import DType, dtypes
from ember.errors import CompileError, EmberError
from ember.helpers import Context, cache_dir
from ember.renderer.cstyle import c_const
from ember.uop.ops import UOp

KERNEL = "void k(float* restrict out) {{ out[0] = {value}f; /* {tag} */ }}\n"


def fresh_source(value: float = 1.5) -> str:
    """A kernel no earlier test compiled, so the cache starts without it."""
    return KERNEL.format(value=value, tag=uuid.uuid4().hex)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    assert cache_dir() == str(tmp_path)
    return tmp_path


def cache_files(root: Path) -> list[Path]:
    """The compiled kernels in the cache (not what it keeps about the compilers)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.parent.name != "compilers")


def source_of(t: Tensor) -> str:
    (item,) = t.schedule()
    return get_program(item.ast, Device["CPU"].renderer).src


# ---- constants --------------------------------------------------------------------------------------------------

FLOAT_CONSTANTS = [
    (dtypes.float32, 0.1), (dtypes.float32, 1 / 3), (dtypes.float32, 1e-45), (dtypes.float32, 3.4028234663852886e38),
    (dtypes.float32, -0.0), (dtypes.float32, 16777217.0), (dtypes.float64, 0.1), (dtypes.float64, 1 / 3),
    (dtypes.float64, 5e-324), (dtypes.float64, 1.7976931348623157e308), (dtypes.float64, -2.5e-310),
    (dtypes.float16, 0.1), (dtypes.float16, 65504.0), (dtypes.float16, 6e-8),
]
NP = {dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64}


@pytest.mark.parametrize("dtype, value", FLOAT_CONSTANTS, ids=[f"{d.name}-{v!r}" for d, v in FLOAT_CONSTANTS])
def test_float_constant_literal_is_exact(dtype: DType, value: float):
    """float64 and float32 constants are bare literals of their type (hexadecimal or the shortest round-trip decimal,
    f-suffixed for float32, parenthesized when negative); other dtypes cast an exact hexadecimal literal."""
    text = c_const(UOp.const(dtype, value).arg, dtype)
    number = r"(-?(?:0x[0-9a-f.]+p[-+]\d+|\d+\.\d*(?:e[-+]\d+)?|\d+e[-+]\d+))"
    bare = {dtypes.float64: rf"\(?{number}\)?", dtypes.float32: rf"\(?{number}f\)?"}
    literal = re.fullmatch(bare.get(dtype, r"\(\(\w+\)(-?0x[0-9a-f.]+p[-+]\d+)\)"), text)
    assert literal, text
    assert text.startswith("(") == (dtype not in bare or math.copysign(1, value) < 0)
    got = float.fromhex(literal.group(1)) if "0x" in literal.group(1) else float(literal.group(1))
    if dtype is dtypes.float32: got = float(np.float32(got))  # the compiler rounds a float32 literal to float
    assert got == float(NP[dtype](value))
    assert math.copysign(1, got) == math.copysign(1, value)


@pytest.mark.parametrize("dtype, value", FLOAT_CONSTANTS, ids=[f"{d.name}-{v!r}" for d, v in FLOAT_CONSTANTS])
def test_float_constant_survives_compilation_bit_for_bit(dtype: DType, value: float):
    got = Tensor.full((3,), value, dtype=dtype).contiguous().numpy()
    want = np.full(3, value, dtype=NP[dtype])
    assert got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.float32, dtypes.float64])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_constants(dtype: DType, value: float):
    assert "__builtin_" in c_const(value, dtype)
    got = Tensor.full((2,), value, dtype=dtype).contiguous().numpy()
    if math.isnan(value): assert np.isnan(got).all()
    else: np.testing.assert_array_equal(got, np.full(2, value, NP[dtype]))


@pytest.mark.parametrize("dtype, value, literal", [
    (dtypes.int32, -2**31, "(-2147483647-1)"), (dtypes.int64, -2**63, "(-9223372036854775807ll-1)"),
    (dtypes.int8, -128, "(-127-1)"), (dtypes.int32, 2**31 - 1, "2147483647"),
    (dtypes.uint32, 2**32 - 1, "4294967295u"), (dtypes.uint64, 2**64 - 1, "18446744073709551615ull"),
])
def test_integer_extremes_are_valid_literals(dtype: DType, value: int, literal: str):
    assert c_const(value, dtype) == literal
    t = Tensor.full((2,), value, dtype=dtype).contiguous()
    assert literal in source_of(t)
    assert t.numpy().tolist() == [value, value]


def test_int32_min_in_arithmetic():
    t = Tensor(np.array([0, 1, -1], np.int32)) + (-2**31)
    assert "2147483648" not in source_of(t)
    np.testing.assert_array_equal(t.numpy(), np.array([0, 1, -1], np.int32) + np.int32(-2**31))


def test_signature_has_a_parameter_for_every_buffer_of_the_item():
    a, b = Tensor(np.array([1.0, 2.0], np.float32)), Tensor(np.array([10.0, 20.0], np.float32))
    out = (a < a).where(a, b)
    (item,) = out.schedule()
    signature = source_of(out).split("void ", 1)[1].split("{", 1)[0]
    assert [f"data{i}" for i in range(len(item.bufs))] == re.findall(r"data\d+", signature)


# ---- compile errors --------------------------------------------------------------------------------------------


def test_compile_error_shows_the_failing_line_marked():
    with pytest.raises(CompileError) as info:
        Device["CPU"].compiler.compile("void f( {")
    assert isinstance(info.value, EmberError) and isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert "error" in message
    assert re.search(r"^>>\s+1 \| void f\( \{$", message, re.MULTILINE), message


def test_compile_error_shows_context_around_a_later_line():
    lines = [f"int a{i};" for i in range(20)]
    lines[11] = "int broken = ;"
    with pytest.raises(CompileError) as info:
        Device["CPU"].compiler.compile("\n".join(lines))
    message = str(info.value)
    marked = [line for line in message.splitlines() if line.startswith(">>")]
    assert len(marked) == 1 and re.fullmatch(r">>\s+12 \| int broken = ;", marked[0]), message
    assert "int a10;" in message and "int a13;" in message, "neighbouring lines are shown"
    assert "int a1;" not in message and "int a19;" not in message, "far-away lines are not"


def test_compile_cached_of_broken_source_raises_and_caches_nothing(cache: Path):
    with pytest.raises(CompileError):
        Device["CPU"].compiler.compile_cached("void f( { " + uuid.uuid4().hex)
    assert [p for p in cache_files(cache) if not p.name.startswith(".tmp-")] == []


# ---- compile cache ----------------------------------------------------------------------------------------------


class CountingCompiler(Compiler):
    """Returns the source bytes and counts its calls: what the cache does is visible and costs nothing."""

    def __init__(self, key: str = "counting 1.0") -> None:
        super().__init__(key)
        self.calls = 0

    def compile(self, src: str) -> bytes:
        self.calls += 1
        return b"compiled:" + src.encode()


def test_same_source_returns_same_bytes_and_compiles_once(cache: Path, monkeypatch: pytest.MonkeyPatch):
    compiler = Device["CPU"].compiler
    src = fresh_source()
    first = compiler.compile_cached(src)
    assert first[:4] == b"\x7fELF"
    (entry,) = [p for p in cache_files(cache) if "compile" in p.parts]
    assert entry.read_bytes() == first
    monkeypatch.setattr(compiler, "compile", lambda src: pytest.fail("a cached source was compiled again"))
    assert compiler.compile_cached(src) == first


def test_cache_key_covers_source_and_compiler(cache: Path):
    a, b = CountingCompiler("cc 1"), CountingCompiler("cc 2")
    for compiler in (a, b, a, b): compiler.compile_cached("x")
    a.compile_cached("y")
    assert (a.calls, b.calls) == (2, 1)
    assert len(cache_files(cache)) == 3


def test_cache_entry_is_written_atomically_and_leaves_no_temp_file(cache: Path):
    compiler = CountingCompiler()
    out = compiler.compile_cached("atomic")
    files = cache_files(cache)
    assert [p.read_bytes() for p in files] == [out]
    assert not any(p.name.startswith(".tmp-") for p in files)


def test_interrupted_write_never_becomes_the_entry(cache: Path, monkeypatch: pytest.MonkeyPatch):
    compiler = CountingCompiler()

    def crash(fd: int) -> None: raise OSError("disk full")
    monkeypatch.setattr(ember.device.os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        compiler.compile_cached("interrupted")
    assert cache_files(cache) == [], "neither a partial entry nor its temp file is left"
    monkeypatch.undo()
    monkeypatch.setenv("EMBER_CACHE", str(cache))
    assert compiler.compile_cached("interrupted") == b"compiled:interrupted"
    assert [p.read_bytes() for p in cache_files(cache)] == [b"compiled:interrupted"]


def test_leftover_partial_temp_file_is_ignored(cache: Path):
    compiler = CountingCompiler()
    compiler.compile_cached("partial")
    (entry,) = cache_files(cache)
    entry.unlink()
    (entry.parent / ".tmp-crashed").write_bytes(b"compiled:parti")  # what a writer killed half-way leaves behind
    assert compiler.compile_cached("partial") == b"compiled:partial"
    assert compiler.compile_cached("partial") == b"compiled:partial"
    assert compiler.calls == 2 and entry.read_bytes() == b"compiled:partial"


def test_entry_is_renamed_into_place_from_its_own_folder(cache: Path, monkeypatch: pytest.MonkeyPatch):
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        renames.append((src, dst))
        real_replace(src, dst)
    monkeypatch.setattr(ember.device.os, "replace", replace)
    CountingCompiler().compile_cached("renamed")
    ((src, dst),) = renames
    assert os.path.dirname(src) == os.path.dirname(dst) and os.path.basename(src).startswith(".tmp-")
    assert [str(p) for p in cache_files(cache)] == [dst]


def compile_in_child(src: str) -> bytes:
    return Device["CPU"].compiler.compile_cached(src)


def test_concurrent_threads_compile_the_same_source(cache: Path):
    src = fresh_source(2.5)
    results: list[bytes] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work() -> None:
        try:
            barrier.wait()
            results.append(Device["CPU"].compiler.compile_cached(src))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert errors == [] and len(results) == 4 and len(set(results)) == 1
    (entry,) = cache_files(cache)
    assert entry.read_bytes() == results[0]


def test_concurrent_processes_compile_the_same_source(cache: Path):
    src = fresh_source(3.5)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(compile_in_child, [src] * 4)
    assert len(set(results)) == 1 and results[0][:4] == b"\x7fELF"
    (entry,) = cache_files(cache)
    assert entry.read_bytes() == results[0]
    assert Device["CPU"].compiler.compile_cached(src) == results[0]


def test_cachelevel_zero_skips_the_cache(cache: Path):
    compiler = CountingCompiler()
    with Context(CACHELEVEL=0):
        assert compiler.compile_cached("no cache") == compiler.compile_cached("no cache")
    assert compiler.calls == 2
    assert cache_files(cache) == []
    compiler.compile_cached("no cache")
    assert len(cache_files(cache)) == 1


def test_cache_dir_prefers_ember_cache_over_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("EMBER_CACHE", raising=False)
    assert cache_dir() == str(tmp_path / "xdg" / "ember")
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path / "own"))
    assert cache_dir() == str(tmp_path / "own")


# ---- DEBUG output ---------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_runners(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget compiled programs, so DEBUG=4 sees every kernel compiled anew."""
    monkeypatch.setattr(ember.engine.realize, "_runners", {})


def two_kernels() -> Tensor:
    x = Tensor(np.ones((4, 6), np.float32))
    return (x + 1).contiguous().sum(1)


KERNEL_LINE = re.compile(r"^\*\*\* CPU\s+\d+ (\w+)\s+\d+ bufs\s+\d+\.\d+ us", re.MULTILINE)


@pytest.mark.parametrize("level", [0, 1, 2, 4])
def test_debug_levels_print_what_they_promise(level: int, capsys: pytest.CaptureFixture, fresh_runners: None,
                                              cache: Path):
    with Context(DEBUG=level): two_kernels().realize()
    out = capsys.readouterr().out
    if level == 0:
        assert out == ""
        return
    assert KERNEL_LINE.findall(out) == ["E_4_6", "r_4"], out
    assert ("schedule: 2 kernels" in out) is (level >= 2)
    assert ("void r_4(" in out) is (level >= 4)
    if level >= 4:
        assert out.index("void E_4_6(") < out.index("E_4_6 ", out.index("***")), "source before its run line"


def test_debug_4_prints_source_only_when_compiling(capsys: pytest.CaptureFixture, fresh_runners: None, cache: Path):
    with Context(DEBUG=4):
        two_kernels().realize()
        first = capsys.readouterr().out
        two_kernels().realize()
        second = capsys.readouterr().out
    # a kernel's definition (vector helpers are `static inline`; its `_task` entry is not another kernel)
    kernels = re.compile(r"^void (?!\w+_task\()\w+\(", re.M)
    assert len(kernels.findall(first)) == 2 and not kernels.findall(second)
    assert len(KERNEL_LINE.findall(second)) == 2


@pytest.mark.parametrize("build, want", [(lambda: Tensor(np.ones(3, np.float32)) * 2, [2.0, 2.0, 2.0]),
                                         (lambda: Tensor(np.ones(3, np.int32)) - 5, [-4, -4, -4])])
def test_compiling_a_kernel_fills_the_cache(build: Callable[[], Tensor], want: list, cache: Path,
                                            fresh_runners: None):
    t = build()
    assert t.numpy().tolist() == want
    assert [p for p in cache_files(cache) if "compile" in p.parts], "the compiled kernel is cached"


def test_compiler_choice_passes_over_one_that_rejects_float16(tmp_path, monkeypatch):
    """clang before 15 rejects _Float16 on x86: for code that may hold float16 the next compiler is taken (the
    first one where none takes it, so its error names the type); $CC wins whatever it takes. Fake compilers on
    PATH: `oldcc` fails on any source naming _Float16, `newcc` compiles everything."""
    from ember.runtime.ops_cpu import pick_compiler
    for name, rejects in (("oldcc", True), ("newcc", False)):
        script = tmp_path / name
        script.write_text("#!/bin/sh\n" + ("grep -q _Float16 && exit 1\n" if rejects else "cat > /dev/null\n") +
                          "exit 0\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert pick_compiler(None, ("oldcc", "newcc"), "c", float16=True) == "newcc"
    assert pick_compiler(None, ("oldcc", "newcc"), "c", float16=False) == "oldcc"
    assert pick_compiler(None, ("oldcc", "missingcc"), "c", float16=True) == "oldcc"
    assert pick_compiler("oldcc", ("newcc",), "c", float16=True) == "oldcc"
    assert pick_compiler(None, ("missingcc",), "c", float16=True) is None


def test_float16_kernels_compile_with_the_chosen_compiler():
    x = np.array([0.1, 1.5, -3.25], dtype=np.float16)
    np.testing.assert_array_equal((Tensor(x) * 3).numpy(), x * np.float16(3))


def test_an_unrolled_roll_widened_to_int64_is_right() -> None:
    """gcc 12.2's loop vectorizer miscompiled this kernel (a period loop of int32 selects cast to int64): every
    value of the rolled half is compared (the CPU compiler is built without that vectorizer: ops_cpu.GCC_FLAGS)."""
    a = (np.arange(45, dtype=np.int32).reshape(5, 3, 3) * 7) % 23 - 11
    t = Tensor(a)
    got = Tensor.cat(t.abs().flatten().long(), t.abs().roll(5, 1).flatten().long()).numpy()
    want = np.concatenate([np.abs(a).flatten(), np.roll(np.abs(a), 5, 1).flatten()]).astype(np.int64)
    np.testing.assert_array_equal(got, want)
