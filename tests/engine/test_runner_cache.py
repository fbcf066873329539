"""The process's runner cache (engine/realize.py): which compiled program runs a kernel, and how many are kept.

Oracles: get_program under the flags set at the time (the program the flags ask for, by its opts and source), numpy
for the values, and the runners and loaded libraries still alive after many kernels ran.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import ember.engine.realize as realize
from ember import Tensor
from ember.codegen import get_program
from ember.device import Device
from ember.engine.jit import Recorder
from ember.engine.realize import CompiledRunner
from ember.helpers import RECORDERS, Context
from tests.helpers import use_fresh_cache


def runners_of(value: Tensor) -> list[CompiledRunner]:
    """The runners that realizing `value` ran, in order (told to a recorder, as a jit recording is)."""
    recorder = Recorder()
    RECORDERS.append(recorder)
    try:
        value.realize()
    finally:
        RECORDERS.remove(recorder)
    return [runner for runner, _, _ in recorder.kernels]


def scaled(rng: np.random.Generator) -> tuple[Tensor, np.ndarray]:
    """An elementwise kernel the heuristic vectorizes (opts UPCAST), and its value."""
    x = rng.uniform(-2, 2, (64, 64)).astype(np.float32)
    return Tensor(x) * 3.0, x * np.float32(3.0)


def stacked(rng: np.random.Generator) -> tuple[Tensor, np.ndarray]:
    """A stack of 4 differently computed values: UNROLL=64 stores it position by position, UNROLL=0 in a loop."""
    a = rng.uniform(1, 2, 3).astype(np.float32)
    t = Tensor(a)
    return Tensor.stack(t[0] * 2, t[1].exp(), t[2] - 1, t[0].sqrt()).contiguous(), \
        np.array([a[0] * 2, np.exp(a[1]), a[2] - 1, np.sqrt(a[0])], np.float32)


FLAG_CASES = [(scaled, {"NOOPT": 1}, {"NOOPT": 0}), (scaled, {"NOOPT": 0}, {"NOOPT": 1}),
              (stacked, {"UNROLL": 0}, {"UNROLL": 64}), (stacked, {"UNROLL": 64}, {"UNROLL": 0})]


@pytest.mark.parametrize("build, first, then", FLAG_CASES)
def test_the_program_that_runs_is_the_one_the_flags_ask_for(build: Callable, first: dict[str, int],
                                                              then: dict[str, int]) -> None:
    """The same kernel realized under one setting of a codegen flag, then under another: the second runs the
    program get_program makes under the second setting (it ran the first's: the runner cache ignored flags)."""
    rng = np.random.default_rng(7)
    for flags in (first, then):
        value, want = build(rng)
        with Context(**flags):
            (runner,) = runners_of(value)
            expected = get_program(runner.spec.ast, Device["CPU"].renderer)
        assert (runner.spec.opts, runner.spec.src) == (expected.opts, expected.src), flags
        np.testing.assert_allclose(value.numpy(), want, rtol=1e-6)
    with Context(**first), Context(**then): assert runners_of(build(rng)[0])[0] is runner  # kept, not rebuilt


def loaded_kernels(root: Path) -> set[str]:
    """The kernel libraries under `root` (a cache directory) this process has mapped now, by path."""
    with open("/proc/self/maps") as f: paths = {line.split()[-1] for line in f if line.rstrip().endswith(".so")}
    return {p for p in paths if p.startswith(str(root)) and "ember_" not in p}  # (not the pool's or graph's)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps to see loaded libraries")
def test_runners_are_evicted_and_their_libraries_unloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for 2 runners, 6 different kernels in turn: 2 runners stay, and the evicted ones' libraries are
    unloaded (ctypes keeps a library loaded for the process's life); each value is still right, an evicted kernel
    run again included."""
    root = use_fresh_cache(tmp_path, monkeypatch)
    monkeypatch.setattr(realize, "RUNNER_CACHE_SIZE", 2)
    for n in (2, 3, 4, 5, 6, 7, 2):
        xn = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        np.testing.assert_array_equal((Tensor(xn) * 2).numpy(), xn * 2)
        gc.collect()
        assert len(realize._runners) <= 2
        assert 1 <= len(loaded_kernels(root)) <= 2, sorted(loaded_kernels(root))
