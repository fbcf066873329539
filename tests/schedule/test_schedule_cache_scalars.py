"""Python scalars that vary become kernel data (schedule/cache.py: `history`, `parameters`): a loop over new values of
a constant compiles twice (the first value's kernel, then one reading the value from a buffer), not once per value;
constants that never vary stay in the kernel.

Oracles: numpy for every value (float32 products are exact in both), and the count of programs codegen makes (the
program cache is fresh per test: nothing comes from an earlier run).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ember.engine.realize as realize
from ember import Tensor
from ember.helpers import Context
from ember.uop.ops import Ops, UOp
from tests.helpers import use_fresh_cache


@pytest.fixture
def made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[UOp]:
    """The ASTs codegen makes programs of from now (a fresh cache; no runner, template or constant history)."""
    use_fresh_cache(tmp_path, monkeypatch)
    calls: list[UOp] = []
    real = realize.get_program
    monkeypatch.setattr(realize, "get_program", lambda ast, renderer: calls.append(ast) or real(ast, renderer))
    return calls


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)


def test_a_scalar_that_varies_compiles_twice(made: list[UOp]) -> None:
    """x * 0.37, x * 0.38, x * 0.39, ...: two programs for twenty values (it was one per value)."""
    xn = data(16, 16)
    x = Tensor(xn)
    for k, c in enumerate([0.37, 0.38, 0.39] + [0.4 + i / 64 for i in range(17)]):
        np.testing.assert_array_equal((x * c).numpy(), xn * np.float32(c))
        if k == 2: assert len(made) == 2, "x * 0.39 ran a kernel made for 0.38"
    assert len(made) == 2


def test_a_scalar_varies_across_flag_changes(made: list[UOp]) -> None:
    """A flag set around each step (a new ContextVar.generation: schedules are made again) does not hide that the
    scalar varies: still two programs."""
    xn = data(16, 16, seed=8)
    for c in (0.37, 0.38, 0.39, 0.4, 0.41):
        with Context(DEBUG=0): np.testing.assert_array_equal((Tensor(xn) * c).numpy(), xn * np.float32(c))
    assert len(made) == 2


def test_a_training_loop_with_a_new_learning_rate_each_step_compiles_once_per_kernel(made: list[UOp]) -> None:
    """w -= lr * g with a decaying lr (a Python float): the step's kernels are made for the first two steps only."""
    w, g = data(8, 4, seed=1), data(8, 4, seed=2)
    tw, tg = Tensor(w), Tensor(g)
    for step in range(12):
        lr = 0.1 * 0.9 ** step
        tw = (tw - lr * tg).realize()
        w = w - np.float32(lr) * g
        np.testing.assert_allclose(tw.numpy(), w, rtol=1e-6, atol=1e-7)
        if step == 1: settled = len(made)
    assert len(made) == settled


def test_constants_that_never_vary_stay_in_the_kernel(made: list[UOp]) -> None:
    """x * 2.0 again and again: one program, whose AST holds the constant and reads only x (no buffer for 2.0)."""
    xn = data(16, 16, seed=3)
    for _ in range(3): np.testing.assert_array_equal((Tensor(xn) * 2.0).numpy(), xn * 2)
    (ast,) = made
    assert any(u.op is Ops.CONST and u.arg == 2.0 for u in ast.toposort())
    assert sum(u.op is Ops.DEFINE_GLOBAL for u in ast.toposort()) == 2


def test_only_the_position_that_varies_becomes_data(made: list[UOp]) -> None:
    """x * a + b with a varying and b fixed: b stays in the kernel; then b varies too, and both are data."""
    xn = data(6, 5, seed=4)
    for a in (1.5, 2.5, 3.5):
        np.testing.assert_allclose((Tensor(xn) * a + 0.25).numpy(), xn * np.float32(a) + np.float32(0.25), rtol=1e-6)
    assert any(u.op is Ops.CONST and u.arg == 0.25 for u in made[-1].toposort())
    for a, b in ((3.5, -1.0), (4.5, 7.0), (5.5, 0.125)):
        np.testing.assert_allclose((Tensor(xn) * a + b).numpy(), xn * np.float32(a) + np.float32(b), rtol=1e-6)
    assert len(made) == 3


@pytest.mark.parametrize("dtype, values", [("int32", [3, -7, 1 << 20, 0]), ("float64", [0.1, -2.5, 1e300]),
                                           ("float16", [0.5, -3.0, 1024.0])])
def test_varying_scalars_of_other_dtypes(dtype: str, values: list, made: list[UOp]) -> None:
    xn = (np.arange(12) - 6).astype(dtype)
    for c in values:
        np.testing.assert_array_equal((Tensor(xn) * c).numpy(), xn * np.array(c, dtype), err_msg=str(c))
        np.testing.assert_array_equal((Tensor(xn) + c).numpy(), xn + np.array(c, dtype), err_msg=str(c))
    assert len(made) == 4


def test_signed_zero_and_specials_as_data(made: list[UOp]) -> None:
    """-0.0 and 0.0 vary like any values (their bits reach the kernel), and so do inf and nan."""
    xn = np.array([-0.0, 0.0, 1.0, -1.0], np.float32)
    for c in (0.0, -0.0, np.inf, -np.inf, np.nan, -0.0):
        got, want = (Tensor(xn) + c).numpy(), xn + np.float32(c)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_bool_constants_stay_in_the_kernel(made: list[UOp]) -> None:
    """where(x > 0, True, False)-like bool constants are not data (they steer folds): one program per value."""
    xn = data(8, seed=5)
    for flag in (True, False, True):
        np.testing.assert_array_equal((Tensor(xn) > 0).bitwise_and(flag).numpy(), (xn > 0) & flag)
    assert len(made) == 2 and all(sum(u.op is Ops.DEFINE_GLOBAL for u in ast.toposort()) == 2 for ast in made)


def test_a_full_tensor_of_a_varying_value(made: list[UOp]) -> None:
    """A constant that is itself the output (Tensor.full) and one under a reduction."""
    for c in (1.0, 2.0, 3.0):
        np.testing.assert_array_equal(Tensor.full((3, 2), c).numpy(), np.full((3, 2), c, np.float32))
        np.testing.assert_array_equal(Tensor.full((3, 2), c).contiguous().numpy(), np.full((3, 2), c, np.float32))
        np.testing.assert_allclose((Tensor(data(4, 3)) * c).sum(1).numpy(), (data(4, 3) * np.float32(c)).sum(1),
                                   rtol=1e-6)


def test_live_runners_and_libraries_do_not_grow_with_new_values(made: list[UOp]) -> None:
    """300 distinct constants: the process keeps the same few runners (each one a loaded library)."""
    xn = data(4, 4, seed=6)
    x = Tensor(xn)
    for i in range(300):
        c = 1 + i / 512
        out = (x * c).numpy()
        if i % 50 == 0: np.testing.assert_array_equal(out, xn * np.float32(c))
    assert len(realize._runners) <= 2 and len(made) == 2
