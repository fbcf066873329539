"""A reduction of many elements to few results runs in two stages (kernelize.split_reduce): partial results over
chunks that the cores share, then their reduction. Results against numpy; the schedule's shape checked."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor
from ember.schedule.kernelize import SPLIT_REDUCE, SPLITS

rng = np.random.default_rng(14)


def assert_sum_close(got: np.ndarray, x: np.ndarray) -> None:
    """A float32 sum against numpy's float64 one, within what float32 additions in any order allow: a bound on
    the sum of magnitudes, not on the result (a sum of random signs nearly cancels, and which values a test gets
    depends on the tests that drew from `rng` before it in its worker)."""
    np.testing.assert_allclose(got, x.astype(np.float64).sum(), rtol=1e-5, atol=1e-7 * np.abs(x).sum())


Axis = int | tuple[int, ...] | None
CASES = [((3 << 16,), None), ((1 << 12, 17), None), ((1 << 15, 3), 0), ((5, 1 << 15), 1), ((2, 1 << 14, 3), (0, 1)),
         ((3, 7, 64, 512), (1, 2, 3)), ((SPLIT_REDUCE + 8,), None)]


def test_a_full_sum_has_a_first_stage_with_an_output_axis():
    x = rng.standard_normal(1 << 20).astype(np.float32)
    t = Tensor(x).sum()
    (first, second) = t.schedule()
    assert first.bufs[0].size == SPLITS[0] and second.bufs[0].size == 1
    assert_sum_close(t.numpy(), x)


@pytest.mark.parametrize("shape, axis", CASES)
def test_split_sums_match_numpy(shape: tuple[int, ...], axis: Axis):
    x = rng.standard_normal(shape).astype(np.float32)
    got = Tensor(x).sum(axis)
    assert len(got.schedule()) == 2, "split in two stages"
    np.testing.assert_allclose(got.numpy(), x.astype(np.float64).sum(axis), rtol=2e-5, atol=1e-3)


@pytest.mark.parametrize("shape, axis", CASES)
def test_split_max_min_and_int_sums_are_exact(shape: tuple[int, ...], axis: Axis):
    x = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(Tensor(x).max(axis=axis).numpy(), x.max(axis))
    np.testing.assert_array_equal(Tensor(x).min(axis=axis).numpy(), x.min(axis))
    ints = rng.integers(-1000, 1000, shape, dtype=np.int32)
    np.testing.assert_array_equal(Tensor(ints).sum(axis).numpy(), ints.astype(np.int64).sum(axis))


def test_nan_and_inf_survive_the_split():
    x = rng.standard_normal(1 << 18).astype(np.float32)
    x[12345] = np.inf
    assert Tensor(x).sum().item() == np.inf and Tensor(x).max().item() == np.inf
    x[200000] = np.nan
    assert np.isnan(Tensor(x).sum().item()) and np.isnan(Tensor(x).max().item())


def test_no_split_without_a_divisor_or_with_many_results():
    prime = 65537  # no chunk count divides it: one kernel, still right
    x = rng.standard_normal(prime).astype(np.float32)
    assert len(Tensor(x).sum().schedule()) == 1
    assert_sum_close(Tensor(x).sum().numpy(), x)
    rows = rng.standard_normal((SPLITS[0], SPLIT_REDUCE)).astype(np.float32)  # enough results to share out already
    assert len(Tensor(rows).sum(1).schedule()) == 1


def test_gradient_of_a_split_sum():
    x = Tensor(rng.standard_normal(1 << 17).astype(np.float32), requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy(), rtol=1e-6)


def test_a_split_reduction_read_again_reads_its_buffer():
    x = Tensor(rng.standard_normal(1 << 17).astype(np.float32))
    total = x.sum()
    centered = x - total
    centered.realize()
    assert len(total.schedule()) <= 2
    assert_sum_close(total.numpy(), x.numpy())
    np.testing.assert_allclose(centered.numpy(), x.numpy() - total.numpy(), rtol=1e-6, atol=1e-5)
