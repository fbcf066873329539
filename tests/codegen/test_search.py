"""BEAM search (codegen/search.py) picks opts that change how a kernel runs, never what it computes, and keeps its
winners on disk so that no process searches a kernel twice.

Oracles: the NOOPT kernel's values (bit for bit for elementwise and integer kernels, within REDUCE_TOL for float sums,
whose additions lane opts reorder); the module's SearchCounters (searches run, candidates timed), also read from
child processes; the files left in a fresh cache directory. Searches are cut short (QUICK: one step, lanes of 2 and
4, one final round) to stay fast: what is tested is what the search returns and where it keeps it, not how good its
winner is (nothing a test could time on a shared machine would say).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import ember.codegen.search as search
import ember.engine.realize as realize
from ember import Tensor
from ember.codegen.opt import Opt, OptOps, apply_opt
from ember.codegen.periodic import split_periodic
from ember.codegen.rangeify import rangeify
from ember.codegen.search import SearchCounters, actions, winner_to_json
from ember.device import CacheWarning, Device
from ember.helpers import Context
from ember.renderer.cstyle import CRenderer
from tests.helpers import REDUCE_TOL, use_fresh_cache

REPO = Path(__file__).resolve().parents[2]


QUICK = {"MAX_STEPS": 1, "FINAL_ROUNDS": 1, "LANE_AMOUNTS": (2, 4), "MAX_LANES": 8}  # search.py's limits, cut short


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache directory, and searches cut short (QUICK)."""
    for name, value in QUICK.items(): monkeypatch.setattr(search, name, value)
    return use_fresh_cache(tmp_path, monkeypatch)


def floats(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)


def small_matmul() -> Tensor:
    return Tensor(floats((4, 3), 1)) @ Tensor(floats((3, 2), 2))


# name -> (the computation, whether the result must be exact)
KERNELS: dict[str, tuple[Callable[[], Tensor], bool]] = {
    "elementwise_f32_1023": (lambda: (Tensor(floats((1023,))) * 3 - 1).maximum(0.5), True),
    "elementwise_i32_1024": (lambda: Tensor(np.arange(1024, dtype=np.int32)) * 7 // 3 - 100, True),
    "row_sum_3x17": (lambda: Tensor(floats((3, 17))).sum(1), False),
    "matmul_33x17x9": (lambda: Tensor(floats((33, 17), 1)) @ Tensor(floats((17, 9), 2)), False),
    "size_1": (lambda: Tensor(floats((1,))).exp(), True),
}


@pytest.mark.parametrize("name", KERNELS)
def test_beam_winner_computes_what_noopt_computes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    build, exact = KERNELS[name]
    with Context(NOOPT=1): want = build().numpy()
    monkeypatch.setattr(realize, "_runners", {})
    searches = SearchCounters.searches
    with Context(BEAM=1): got = build().numpy()
    assert SearchCounters.searches == searches + (name != "size_1"), "a kernel with loops is searched, size 1 is not"
    if exact: np.testing.assert_array_equal(got, want)
    else: np.testing.assert_allclose(got, want, **REDUCE_TOL)


def test_timing_leaves_the_users_buffers_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-place update runs once on the user's buffer however often its candidates ran."""
    x = Tensor(np.arange(1024, dtype=np.float32)).realize()
    timed = SearchCounters.timed
    with Context(BEAM=1): x.assign(x * 2 + 1).realize()
    assert SearchCounters.timed > timed
    np.testing.assert_array_equal(x.numpy(), np.arange(1024, dtype=np.float32) * 2 + 1)


def test_actions_of_a_matmul() -> None:
    """Lanes of each LANE_AMOUNT dividing an axis, and of the whole axis when no larger; THREAD by the largest divisor
    up to the core count; SWAP of the two output axes. Each applies."""
    (item,) = (Tensor(floats((8, 3))) @ Tensor(floats((3, 4)))).schedule()  # axes 8, 4, then the reduce axis 3
    sink = split_periodic(rangeify(item.ast))
    found = actions(sink, CRenderer(vector_bytes=64, cores=3))
    assert [str(o) for o in found] == ["UP0x2", "UP0x4", "TH0x2", "UP1x2", "UP1x4", "TH1x2", "UN2x3", "SW0x1"]
    for opt in found: apply_opt(sink, opt)


def test_beam_is_part_of_the_program_key() -> None:
    """Programs rendered under BEAM=n are cached apart from the heuristic's (ContextVars are in the key unless
    listed in realize.NOT_CODEGEN_FLAGS)."""
    (item,) = small_matmul().schedule()
    renderer = Device["CPU"].renderer
    assert "BEAM" not in realize.NOT_CODEGEN_FLAGS
    keys = set()
    for beam in (0, 1, 2):
        with Context(BEAM=beam): keys.add(realize.program_key(item.ast, renderer))
    assert len(keys) == 3


# ---- the winner cache ----------------------------------------------------------------------------------------------

def beam_entries(root: Path) -> list[Path]:
    return sorted((root / "beam").rglob("*.json"))


def winner_entry(root: Path, build: Callable[[], Tensor], amount: int) -> Path:
    """Where the winner of `build`'s one kernel is kept for BEAM=amount."""
    (item,) = build().schedule()
    device = Device["CPU"]
    key = search.winner_key(split_periodic(rangeify(item.ast)), device.renderer, device, amount)
    assert key is not None
    return root / "beam" / key[:2] / f"{key}.json"


def forget_programs(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the next realization run codegen again (and so read the winner cache)."""
    shutil.rmtree(root / "program", ignore_errors=True)
    monkeypatch.setattr(realize, "_runners", {})


def test_a_winner_is_read_back_without_a_search_or_a_progress_line(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with Context(BEAM=1, DEBUG=1): want = small_matmul().numpy()
    assert "BEAM r_4_2: " in capsys.readouterr().err
    assert beam_entries(cache) == [entry := winner_entry(cache, small_matmul, 1)]
    forget_programs(cache, monkeypatch)
    searches = SearchCounters.searches
    with Context(BEAM=1, DEBUG=1): got = small_matmul().numpy()
    assert SearchCounters.searches == searches and "BEAM" not in capsys.readouterr().err
    np.testing.assert_array_equal(got, want)
    assert beam_entries(cache) == [entry]


# what a crash, a full disk or a copy between machines leaves, written where the kernel's winner would be
DAMAGES: dict[str, Callable[[Path], bytes]] = {
    "truncated": lambda p: winner_to_json(p.stem, [Opt(OptOps.UPCAST, 0, 2)])[:9],
    "opts altered": lambda p: json.dumps({**json.loads(winner_to_json(p.stem, [])), "opts": ["UP0x2"]}).encode(),
    "another kernel's": lambda p: winner_to_json("0" * 64, []),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_winner_is_discarded_and_searched_again(damage: str, cache: Path) -> None:
    entry = winner_entry(cache, small_matmul, 1)
    entry.parent.mkdir(parents=True)
    entry.write_bytes(DAMAGES[damage](entry))
    searches = SearchCounters.searches
    with Context(BEAM=1), pytest.warns(CacheWarning, match=r"damaged entry .*beam.*not a BEAM winner"):
        got = small_matmul().numpy()
    assert SearchCounters.searches == searches + 1
    np.testing.assert_allclose(got, floats((4, 3), 1) @ floats((3, 2), 2), **REDUCE_TOL)
    assert search.read_winner(str(entry), entry.stem) is not None, "the new winner replaced the damaged entry"


def test_a_winner_that_no_longer_applies_is_searched_again(cache: Path) -> None:
    """A list an older ember found may name an axis this one does not have: a search, and no warning."""
    entry = winner_entry(cache, small_matmul, 1)
    entry.parent.mkdir(parents=True)
    entry.write_bytes(winner_to_json(entry.stem, [Opt(OptOps.UPCAST, 7, 2)]))
    searches = SearchCounters.searches
    with Context(BEAM=1), warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        small_matmul().realize()
    assert SearchCounters.searches == searches + 1
    assert search.read_winner(str(entry), entry.stem) != [Opt(OptOps.UPCAST, 7, 2)]


# ---- across processes ------------------------------------------------------------------------------------------

CHILD = """
    import json
    import numpy as np
    import ember.codegen.search as search
    from ember import Tensor
    for name, value in {quick}.items(): setattr(search, name, value)
    a = Tensor(np.linspace(-1, 1, 4 * 3, dtype=np.float32).reshape(4, 3))
    b = Tensor(np.linspace(-2, 2, 3 * 2, dtype=np.float32).reshape(3, 2))
    value = (a @ b).numpy()
    print(json.dumps({"searches": search.SearchCounters.searches, "timed": search.SearchCounters.timed,
                      "value": value.tolist()}))
"""


def run_child(env: dict[str, str]) -> dict:
    """What CHILD printed, run in a new process with `env` added to this one's."""
    code = textwrap.dedent(CHILD).replace("{quick}", repr(QUICK))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env}, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_searches_nothing(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    env = {"EMBER_CACHE": str(root), "BEAM": "2", "DEBUG": "0"}
    first = run_child(env)
    assert first["searches"] == 1 and first["timed"] > 0
    assert run_child(env) == {**first, "searches": 0, "timed": 0}  # the program cache answers
    shutil.rmtree(root / "program")
    assert run_child(env) == {**first, "searches": 0, "timed": 0}  # codegen runs; the winner cache answers
    assert (root / "program").exists()
    entries = sorted((root / "beam").rglob("*.json"))
    assert run_child({**env, "BEAM": "1"})["searches"] == 1, "another beam width is another search"
    assert run_child({**env, "CACHELEVEL": "0"})["searches"] == 1, "CACHELEVEL=0 reads no winners"
    assert len(sorted((root / "beam").rglob("*.json"))) == len(entries) + 1, "CACHELEVEL=0 writes none either"
