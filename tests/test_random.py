"""The counter-based generator: Threefry known answers, a Python oracle, determinism and distributions."""

import numpy as np
import pytest

from ember import Tensor, dtypes
from ember.errors import DTypeError, ShapeError
from ember.mixin.random import PARITY, ROTATIONS, threefry2x32

# Random123's known-answer vectors for threefry2x32, 20 rounds: (counter, key, result)
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
]


def threefry_reference(key: tuple[int, int], c0: int, c1: int) -> tuple[int, int]:
    """Threefry-2x32-20 on Python ints, the oracle for the tensor version."""
    mask = 0xFFFFFFFF
    ks = (key[0], key[1], key[0] ^ key[1] ^ PARITY)
    x0, x1 = (c0 + ks[0]) & mask, (c1 + ks[1]) & mask
    for group in range(5):
        for r in ROTATIONS[4 * (group % 2): 4 * (group % 2) + 4]:
            x0 = (x0 + x1) & mask
            x1 = (((x1 << r) | (x1 >> (32 - r))) & mask) ^ x0
        x0, x1 = (x0 + ks[(group + 1) % 3]) & mask, (x1 + ks[(group + 2) % 3] + group + 1) & mask
    return x0, x1


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_threefry_matches_the_known_answers(counter, key, expected):
    c0, c1 = (Tensor([c], dtype="uint32") for c in counter)
    x0, x1 = threefry2x32(key, c0, c1)
    assert (x0.item(), x1.item()) == expected


def test_threefry_matches_the_python_oracle_on_many_counters():
    rng = np.random.default_rng(3)
    c0, c1 = rng.integers(0, 2**32, 257, dtype=np.uint64), rng.integers(0, 2**32, 257, dtype=np.uint64)
    key = (0x9E3779B9, 0x7F4A7C15)
    x0, x1 = threefry2x32(key, Tensor(c0.astype(np.uint32)), Tensor(c1.astype(np.uint32)))
    expected = [threefry_reference(key, int(a), int(b)) for a, b in zip(c0, c1)]
    assert list(zip(x0.tolist(), x1.tolist())) == expected


def test_same_seed_same_numbers_and_draws_differ():
    Tensor.manual_seed(42)
    first, second = Tensor.rand(1000).numpy(), Tensor.rand(1000).numpy()
    Tensor.manual_seed(42)
    np.testing.assert_array_equal(Tensor.rand(1000).numpy(), first)
    np.testing.assert_array_equal(Tensor.rand(1000).numpy(), second)
    assert not np.array_equal(first, second)
    Tensor.manual_seed(43)
    assert not np.array_equal(Tensor.rand(1000).numpy(), first)


@pytest.mark.parametrize("dtype, bits", [("float32", 24), ("float16", 11), ("bfloat16", 8), ("float64", 53)])
def test_rand_is_in_unit_interval_on_a_grid_of_exact_values(dtype, bits):
    Tensor.manual_seed(0)
    x = Tensor.rand(4, 5000, dtype=dtype)
    assert x.shape == (4, 5000) and x.dtype == getattr(dtypes, dtype)
    values = x.numpy().astype(np.float64)
    assert values.min() >= 0 and values.max() < 1
    np.testing.assert_array_equal(values * 2.0**bits, np.floor(values * 2.0**bits))


def test_rand_is_uniform():
    Tensor.manual_seed(1)
    x = Tensor.rand(200_000).numpy()
    counts = np.histogram(x, bins=20, range=(0, 1))[0]
    chi2 = ((counts - 10_000) ** 2 / 10_000).sum()
    assert chi2 < 50  # 19 degrees of freedom: 50 is beyond the 99.99th percentile
    assert abs(x.mean() - 0.5) < 0.003 and abs(x.var() - 1 / 12) < 0.002


def test_randn_has_mean_zero_and_unit_variance():
    Tensor.manual_seed(2)
    x = Tensor.randn(200_000).numpy()
    assert abs(x.mean()) < 0.01 and abs(x.std() - 1) < 0.01
    assert abs((np.abs(x) < 1).mean() - 0.6827) < 0.005  # the normal's mass within one sigma


def test_randint_covers_its_range_evenly():
    Tensor.manual_seed(3)
    x = Tensor.randint(60_000, low=-3, high=3).numpy()
    assert x.dtype == np.int32
    values, counts = np.unique(x, return_counts=True)
    assert values.tolist() == [-3, -2, -1, 0, 1, 2]
    assert np.all(np.abs(counts - 10_000) < 500)


def test_uniform_and_normal_scale_and_shift():
    Tensor.manual_seed(4)
    u = Tensor.uniform(50_000, low=-2.0, high=6.0).numpy()
    n = Tensor.normal(50_000, mean=3.0, std=0.5).numpy()
    assert u.min() >= -2 and u.max() < 6 and abs(u.mean() - 2) < 0.05
    assert abs(n.mean() - 3) < 0.01 and abs(n.std() - 0.5) < 0.01


def test_random_values_are_computed_in_the_kernel_that_uses_them():
    Tensor.manual_seed(5)
    (item,) = (Tensor.rand(8, 8) * 2).schedule()
    assert [(b.size, b.dtype) for b in item.bufs] == [(64, dtypes.float32), (4, dtypes.uint32)]  # the seed and
    # counter words, no uploaded buffer of random numbers


def test_every_draw_of_a_shape_is_one_kernel():
    """The seed and counter are kernel data: draws after each other and after a new seed share one AST (one compiled
    program), and a dropout step is the same schedule each step (it compiled a new kernel per step before)."""
    Tensor.manual_seed(1)
    first = Tensor.rand(16, 3).schedule()[0].ast
    assert Tensor.rand(16, 3).schedule()[0].ast is first
    Tensor.manual_seed(2)
    assert Tensor.randn(16, 3).schedule()[0].ast is Tensor.randn(16, 3).schedule()[0].ast
    x = Tensor.ones(32, 8).contiguous().realize()
    with Tensor.train():
        steps = [[item.ast for item in (x.dropout(0.5) * 3).sum().schedule()] for _ in range(3)]
    assert steps[0] == steps[1] == steps[2]


def test_bad_random_arguments_are_named():
    with pytest.raises(DTypeError, match="rand: needs a float dtype, got int32"):
        Tensor.rand(3, dtype="int32")
    with pytest.raises(ValueError, match=r"randint: high \(1\) must be greater than low \(1\)"):
        Tensor.randint(3, low=1, high=1)


@pytest.mark.parametrize("shape", [(256, 128), (64, 32, 3, 3)])
def test_initializers_have_torchs_bounds_and_spread(shape):
    fan_in, fan_out = shape[1] * int(np.prod(shape[2:])), shape[0] * int(np.prod(shape[2:]))
    bound = 1 / np.sqrt(fan_in)  # a = sqrt(5), torch's default for Linear and Conv weights
    w = Tensor.kaiming_uniform(*shape, a=5 ** 0.5).numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    np.testing.assert_allclose(w.std(), bound / np.sqrt(3), rtol=0.03)
    std = np.sqrt(2 / (1 + 0.01 ** 2)) / np.sqrt(fan_in)
    np.testing.assert_allclose(Tensor.kaiming_normal(*shape).numpy().std(), std, rtol=0.03)
    g = Tensor.glorot_uniform(*shape).numpy()
    glorot = np.sqrt(6 / (fan_in + fan_out))
    assert np.abs(g).max() <= glorot and np.abs(g).max() > 0.99 * glorot


def test_initializers_reject_shapes_without_fans():
    with pytest.raises(ValueError, match="kaiming_uniform"):
        Tensor.kaiming_uniform(5)


# ---- random constructors: rand_like, randn_like, randperm, scaled_uniform ------------------------------------------


@pytest.mark.parametrize("dtype", [None, "float64", "float16"])
def test_rand_like_and_randn_like_take_the_shape_and_dtype_of_self(dtype):
    base = Tensor.zeros(3, 50, dtype="float32")
    u, n = base.rand_like(dtype=dtype), base.randn_like(dtype=dtype)
    want = dtypes.float32 if dtype is None else getattr(dtypes, dtype)
    assert u.shape == n.shape == (3, 50) and u.dtype is want and n.dtype is want
    values = u.numpy().astype(np.float64)
    assert values.min() >= 0 and values.max() < 1
    assert abs(n.numpy().astype(np.float64).mean()) < 0.3 and 0.7 < n.numpy().astype(np.float64).std() < 1.3


@pytest.mark.parametrize("make", [lambda: Tensor.ones(4, 5).rand_like(), lambda: Tensor.ones(4, 5).randn_like(),
                                  lambda: Tensor.randperm(20), lambda: Tensor.scaled_uniform(4, 5)],
                         ids=["rand_like", "randn_like", "randperm", "scaled_uniform"])
def test_random_additions_repeat_under_manual_seed(make):
    Tensor.manual_seed(11)
    first = make().numpy()
    Tensor.manual_seed(11)
    np.testing.assert_array_equal(make().numpy(), first)
    Tensor.manual_seed(12)
    assert not np.array_equal(make().numpy(), first)


@pytest.mark.parametrize("n", [0, 1, 7, 300])
def test_randperm_is_a_permutation_of_0_to_n(n):
    Tensor.manual_seed(5)
    p = Tensor.randperm(n)
    assert p.dtype is dtypes.int32 and p.shape == (n,)
    np.testing.assert_array_equal(np.sort(p.numpy()), np.arange(n))


def test_randperm_takes_a_dtype_and_mixes():
    Tensor.manual_seed(6)
    p = Tensor.randperm(50, dtype="int64")
    assert p.dtype is dtypes.int64 and not np.array_equal(p.numpy(), np.arange(50))


def test_scaled_uniform_is_bounded_by_the_inverse_sqrt_of_numel():
    Tensor.manual_seed(8)
    x = Tensor.scaled_uniform(16, 25).numpy()
    assert x.shape == (16, 25) and x.dtype == np.float32
    assert np.abs(x).max() <= 20 ** -1 and np.abs(x).max() > 0.8 * 20 ** -1 and x.min() < 0 < x.max()
    assert Tensor.scaled_uniform(0, 3).shape == (0, 3)


@pytest.mark.parametrize("make, error, match", [
    (lambda: Tensor.randperm(-1), ValueError, "randperm: n must be a non-negative int"),
    (lambda: Tensor([1, 2]).rand_like(), DTypeError, "rand_like: needs a float dtype, got int32"),
    (lambda: Tensor([1, 2]).randn_like(), DTypeError, "randn_like: needs a float dtype, got int32"),
    (lambda: Tensor.scaled_uniform(2, -1), ShapeError, "scaled_uniform: shape sizes must be non-negative"),
])
def test_random_additions_reject_bad_arguments(make, error, match):
    with pytest.raises(error, match=match): make()
