"""The on-disk program cache of engine/realize.py and the size cap of the whole cache directory (device.py).

Oracles: a child process whose codegen raises (a warm cache must not need it), the bytes and files left on disk, and
modification times set by hand for the eviction order. Every test points $EMBER_CACHE at a fresh directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import ember.engine.realize as realize
from ember.device import Compiler, Device, evict_cache, maybe_evict, read_cached
from ember.dtype import dtypes
from ember.helpers import Context
from ember.uop.ops import Ops, UOp
from tests.helpers import scaled_sums, unique_constant, use_fresh_cache

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return use_fresh_cache(tmp_path, monkeypatch)


def program_entries(root: Path) -> list[Path]:
    return sorted((root / "program").rglob("*.json"))


def run_child(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env}, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


# ---- programs -----------------------------------------------------------------------------------------------------

README_SNIPPET = """
    import numpy as np
    from ember import Tensor
    x = Tensor(np.linspace(0, 1, 64 * 128, dtype=np.float32).reshape(64, 128))
    w = Tensor(np.linspace(-1, 1, 128 * 10, dtype=np.float32).reshape(128, 10))
    print((x @ w).relu().numpy().sum())
"""

NO_CODEGEN = """
    import ember.codegen, ember.engine.realize
    def refuse(*args, **kwargs): raise AssertionError("codegen ran with a warm program cache")
    ember.codegen.get_program = ember.engine.realize.get_program = refuse
"""


def test_a_second_process_runs_no_codegen(tmp_path: Path):
    env = {"EMBER_CACHE": str(tmp_path)}
    first = run_child(README_SNIPPET, env)
    assert program_entries(tmp_path), "the first process cached its programs"
    assert run_child(NO_CODEGEN + README_SNIPPET, env) == first


def test_a_cold_cache_still_runs_codegen(tmp_path: Path):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(NO_CODEGEN + README_SNIPPET)], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "EMBER_CACHE": str(tmp_path)})
    assert done.returncode != 0 and "codegen ran" in done.stderr


def test_cached_spec_is_the_rendered_one_without_uops(cache: Path):
    t, want = scaled_sums(unique_constant())
    (item,) = t.schedule()
    renderer = Device["CPU"].renderer
    built = realize.cached_program(item.ast, renderer)
    read = realize.cached_program(item.ast, renderer)
    assert built.uops is not None and read.uops is None and read.ast is item.ast
    for name in ("name", "src", "device", "buffer_count", "outputs", "flops", "mem_bytes", "opts"):
        assert getattr(read, name) == getattr(built, name), name
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)


DAMAGE = {"cut short": b'{"name": "E_3', "empty": b"", "not text": b"\xff\xfe\x00",
          "a field missing": b'{"name": "r_3"}', "a list": b"[1, 2]"}


def count_codegen(monkeypatch: pytest.MonkeyPatch) -> list[UOp]:
    """The ASTs codegen runs on from now, with this process's compiled programs forgotten."""
    calls: list[UOp] = []
    real = realize.get_program
    monkeypatch.setattr(realize, "get_program", lambda ast, renderer: calls.append(ast) or real(ast, renderer))
    monkeypatch.setattr(realize, "_runners", {})
    return calls


@pytest.mark.parametrize("damage", [*DAMAGE, "source edited"])
def test_a_damaged_entry_is_ignored_and_rebuilt(damage: str, cache: Path, monkeypatch: pytest.MonkeyPatch):
    c = unique_constant()
    t, want = scaled_sums(c)
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)
    (entry,) = program_entries(cache)
    good = entry.read_bytes()
    if damage == "source edited":  # still valid JSON: the source no longer matches its recorded hash
        fields = json.loads(good)
        entry.write_text(json.dumps({**fields, "src": fields["src"].replace("*", "+")}))
    else:
        entry.write_bytes(DAMAGE[damage])
    calls = count_codegen(monkeypatch)
    t, want = scaled_sums(c)
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)
    assert len(calls) == 1, "the damaged entry was rebuilt by codegen"
    assert entry.read_bytes() == good, "and written back"
    calls.clear()
    monkeypatch.setattr(realize, "_runners", {})
    np.testing.assert_allclose(scaled_sums(c)[0].numpy(), want, rtol=1e-6)
    assert calls == [], "the rewritten entry is read"


def test_a_codegen_flag_is_part_of_the_key_and_debug_is_not():
    (item,) = scaled_sums(2.5)[0].schedule()
    renderer = Device["CPU"].renderer
    key = realize.program_key(item.ast, renderer)
    with Context(DEBUG=1, SPEC=1): assert realize.program_key(item.ast, renderer) == key
    with Context(UNROLL=0): assert realize.program_key(item.ast, renderer) != key


def test_spec_checks_bypass_the_cache(cache: Path, monkeypatch: pytest.MonkeyPatch):
    c = unique_constant()
    scaled_sums(c)[0].realize()
    calls = count_codegen(monkeypatch)
    with Context(SPEC=1): scaled_sums(c)[0].realize()
    assert len(calls) == 1, "SPEC=1 checks every stage, so codegen runs"


def test_cachelevel_zero_leaves_the_cache_directory_untouched(tmp_path: Path):
    """Kernels, programs, the compiler probe and a NumericalFunction's extension (where a C++ compiler exists)."""
    root = tmp_path / "cache"
    code = f"""
        import numpy as np
        from ember import Tensor
        from ember.export import Arg, NumericalFunction
        from ember.export.native import find_cxx
        print((Tensor(np.ones(5, np.float32)) * {unique_constant()}).numpy().sum())
        if find_cxx() is not None:
            f = NumericalFunction("scaled", lambda x: x * {unique_constant()}, [Arg(3)])
            print(f(np.ones(3)))
    """
    run_child(code, {"EMBER_CACHE": str(root), "CACHELEVEL": "0", "INTERPRET": "0"})
    assert not root.exists()


# ---- the graph's text ---------------------------------------------------------------------------------------------

def const(dtype: object, value: object) -> UOp:
    return UOp(Ops.CONST, dtype, arg=value)  # type: ignore[arg-type]  (the table holds DTypes)


@pytest.mark.parametrize("a, b", [
    (const(dtypes.float32, 0.0), const(dtypes.float32, -0.0)),
    (const(dtypes.int32, 1), const(dtypes.bool, True)),
    (const(dtypes.float64, 0.1), const(dtypes.float64, float(np.nextafter(0.1, 1)))),
    (const(dtypes.float32, 1.0), const(dtypes.float64, 1.0)),
    (UOp(Ops.RESHAPE, dtypes.float32, (const(dtypes.float32, 1.0),), (1,)),
     UOp(Ops.RESHAPE, dtypes.float32, (const(dtypes.float32, 1.0),), ((1,),))),
])
def test_graph_text_tells_apart_what_codegen_would(a: UOp, b: UOp):
    assert realize.graph_text(a.sink()) != realize.graph_text(b.sink())


def test_graph_text_is_the_same_for_the_same_graph_built_twice():
    (first,), (second,) = scaled_sums(3.0)[0].schedule(), scaled_sums(3.0)[0].schedule()
    assert realize.graph_text(first.ast) == realize.graph_text(second.ast)


def test_an_arg_without_stable_text_is_not_cached(cache: Path):
    with pytest.raises(TypeError, match="no stable text for a object"):
        realize.graph_text(UOp(Ops.NOOP, dtypes.void, (), object()).sink())


# ---- the size cap -------------------------------------------------------------------------------------------------

def fill(root: Path, count: int, size: int) -> list[Path]:
    """`count` files of `size` bytes, the first least recently used (modification times a minute apart)."""
    paths, now = [], time.time()
    for i in range(count):
        path = root / "compile" / f"{i:02d}" / f"entry{i}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        os.utime(path, (now - 60 * (count - i), now - 60 * (count - i)))
        paths.append(path)
    return paths


def test_eviction_removes_least_recently_used_first_down_to_a_margin(tmp_path: Path):
    paths = fill(tmp_path, 10, 100)
    removed = evict_cache(500, str(tmp_path))
    assert sorted(removed) == sorted(str(p) for p in paths[:6]), "oldest first, down to 80% of the cap"
    assert [p.exists() for p in paths] == [False] * 6 + [True] * 4


def test_a_read_marks_an_entry_as_used(tmp_path: Path):
    paths = fill(tmp_path, 10, 100)
    assert read_cached(str(paths[0])) == b"x" * 100
    evict_cache(500, str(tmp_path))
    assert paths[0].exists() and not paths[1].exists()


def test_nothing_is_evicted_under_the_cap_and_a_writers_temp_file_is_left_alone(tmp_path: Path):
    paths = fill(tmp_path, 4, 100)
    young, stale = tmp_path / "compile" / ".tmp-writing", tmp_path / "compile" / ".tmp-crashed"
    young.write_bytes(b"y" * 1000)
    stale.write_bytes(b"z" * 10)
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert evict_cache(400, str(tmp_path)) == []
    assert all(p.exists() for p in paths) and young.exists() and not stale.exists()


class BigCompiler(Compiler):
    """Compiles any source to 200 KB, so that a few entries exceed a 1 MiB cap."""

    def compile(self, src: str) -> bytes: return src.encode().ljust(200_000, b".")


def cache_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_the_cache_stays_under_its_cap_and_keeps_what_is_used(cache: Path):
    compiler = BigCompiler("big 1")
    with Context(EMBER_CACHE_MAX_MB=1):  # 200 KB writes: each is over 1/16 of the cap, so each checks
        compiler.compile_cached("kept")
        for i in range(20):
            compiler.compile_cached(f"source {i}")
            assert compiler.compile_cached("kept")  # a hit marks it used
            assert cache_bytes(cache) <= 2**20
    entries = sorted(p for p in cache.rglob("*") if p.is_file())
    assert len(entries) in (4, 5), "each scan over 1 MiB evicts down to 80% of it: four 200 KB entries"
    assert any(p.read_bytes().startswith(b"kept") for p in entries)
    assert any(p.read_bytes().startswith(b"source 19") for p in entries)


def test_no_cap_means_no_scan(cache: Path):
    fill(cache, 3, 100)
    with Context(EMBER_CACHE_MAX_MB=0): maybe_evict(10**12)
    assert cache_bytes(cache) == 300
