"""The process's runner cache (engine/realize.py): which compiled program runs a kernel, and how many are kept.

Oracles: get_program under the flags set at the time (the program the flags ask for, by its opts and source), numpy
for the values, and the runners and loaded libraries still alive after many kernels ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import ember.engine.realize as realize
from ember import Tensor
from ember.codegen import get_program
from ember.device import Device
from ember.engine.jit import Recorder
from ember.engine.realize import CompiledRunner
from ember.helpers import RECORDERS, Context


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
