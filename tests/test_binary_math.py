"""pow, atan2, remainder (%) and lerp against torch, values and gradients."""

import numpy as np
import pytest
import torch

from ember import Tensor

RNG = np.random.default_rng(9)
POS = RNG.uniform(0.2, 3.0, (4, 5)).astype(np.float32)
ANY = RNG.uniform(-3.0, 3.0, (4, 5)).astype(np.float32)
ANY[0, :3] = [0.0, -0.0, 2.0]

CASES = [  # (name, ember and torch expression, inputs)
    ("pow", lambda a, b: a ** b, (POS, ANY)), ("pow_scalar", lambda a, b: a ** 3 + b ** 2, (ANY, ANY)),
    ("rpow", lambda a, b: 2 ** a * b, (ANY, POS)), ("atan2", lambda a, b: a.atan2(b), (ANY, POS - 1.5)),
    ("remainder", lambda a, b: a % b, (ANY * 3, POS)), ("remainder_neg", lambda a, b: a % -b, (ANY * 3, POS)),
    ("lerp", lambda a, b: a.lerp(b, 0.3), (ANY, POS)),
    ("lerp_tensor_weight", lambda a, b: a.lerp(b, b / 3), (ANY, POS)),
]


@pytest.mark.parametrize("name, fn, inputs", CASES, ids=[c[0] for c in CASES])
def test_value_and_gradient_match_torch(name, fn, inputs):
    theirs = [torch.tensor(x, requires_grad=True) for x in inputs]
    ours = [Tensor(x) for x in inputs]
    expected, out = fn(*theirs), fn(*ours)
    expected.sum().backward()
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-6, atol=1e-6)
    for g, t in zip(out.sum().gradient(*ours), theirs, strict=True):
        np.testing.assert_allclose(g.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("exponent", [0, 1, 2, 3, -1, -2, 0.5, -0.5, 4, 1.5])
def test_float_pow_by_a_constant_is_torchs_bit_for_bit(dtype, exponent):
    """torch computes x**2, x**3, x**-1, x**-2, x**0.5, x**-0.5 by products, a reciprocal or a square root; ember
    does too (and their derivatives' x**1 and x**0 are no pow calls at all). Other exponents go to libm's pow.
    x**0.5 is checked against numpy's sqrt, correctly rounded, which torch's vectorized sqrt is not."""
    x = np.concatenate([RNG.standard_normal(2000) * 10, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, 3e200]])
    x = x.astype(dtype)
    ours, theirs = (Tensor(x) ** exponent).numpy(), (torch.tensor(x) ** exponent).numpy()
    if exponent == 0.5: theirs = np.sqrt(x)
    if exponent in (4, 1.5): np.testing.assert_allclose(ours, theirs, rtol=4 * np.finfo(dtype).eps)
    else:
        np.testing.assert_array_equal(ours, theirs)  # NaN where torch has NaN (of any sign)
        np.testing.assert_array_equal(np.signbit(ours[~np.isnan(ours)]), np.signbit(theirs[~np.isnan(theirs)]))
    t = torch.tensor(x[:2000], requires_grad=True)
    (t ** exponent).sum().backward()
    a = Tensor(x[:2000])
    (grad,) = (a ** exponent).sum().gradient(a)
    np.testing.assert_allclose(grad.numpy(), t.grad.numpy(), rtol=8 * np.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_fmod_takes_the_dividends_sign_like_torch(dtype):
    is_float = np.dtype(dtype).kind == "f"
    a = np.array([-7.5, 7.5, -3, 3, 0, 5.25, -0.0, 1e10] if is_float else [-7, 7, -3, 3, 0, 5, -9, 10])
    for b in (2, -3, a[::-1] + (0.5 if is_float else 0) + (a[::-1] == 0)):  # no zero divisor
        ours = Tensor(a.astype(dtype)).fmod(Tensor(b.astype(dtype)) if isinstance(b, np.ndarray) else b).numpy()
        theirs = torch.tensor(a.astype(dtype)).fmod(torch.tensor(b.astype(dtype)) if isinstance(b, np.ndarray)
                                                    else b).numpy()
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))


@pytest.mark.parametrize("a, b", [(-7, 2), (7, -2), (-6, 3), (5, -5), (0, -3), (-1, 7)])
def test_integer_remainder_takes_the_divisors_sign(a, b):
    assert (Tensor([a]) % Tensor([b])).item() == a % b
    assert (Tensor([a]) % b).item() == a % b


def test_lerp_is_exact_at_the_ends_and_fused_like_torch():
    a, b = Tensor(ANY), Tensor(POS)
    np.testing.assert_array_equal(a.lerp(b, 1.0).numpy(), POS)
    np.testing.assert_array_equal(a.lerp(b, 0.0).numpy(), ANY)
    for w in (0.3, 0.7, -0.2, 1.5):
        np.testing.assert_array_equal(a.lerp(b, w).numpy(), torch.tensor(ANY).lerp(torch.tensor(POS), w).numpy())


def test_integer_pow_is_exact():
    np.testing.assert_array_equal((Tensor([2, 3, -4, 10]) ** 3).numpy(), np.array([8, 27, -64, 1000], np.int32))


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8"])
def test_integer_pow_wraps_like_torch_beyond_float64_precision(dtype):
    base = np.array([-3, -2, -1, 0, 1, 2, 3, 5, 7, 11] if dtype != "uint8" else [0, 1, 2, 3, 5, 7, 200, 255, 9, 13])
    exponent = np.array([0, 1, 2, 3, 5, 7, 11, 13, 39, 63])
    a, b = base.astype(dtype), exponent.astype(dtype)
    np.testing.assert_array_equal((Tensor(a) ** Tensor(b)).numpy(), (torch.tensor(a) ** torch.tensor(b)).numpy())
    np.testing.assert_array_equal((Tensor(a) ** 39).numpy(), (torch.tensor(a) ** 39).numpy())  # 3**39 > 2**53


def test_integer_pow_with_negative_exponents_follows_torch():
    a, b = np.array([-3, -1, -1, 1, 2, -2]), np.array([-1, -3, -2, -2, -2, -4])
    np.testing.assert_array_equal((Tensor(a) ** Tensor(b)).numpy(), (torch.tensor(a) ** torch.tensor(b)).numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_is_half_to_even_like_torch(dtype):
    halves = np.arange(-6, 6) + 0.5
    x = np.concatenate([halves, RNG.uniform(-1e3, 1e3, 200), [np.inf, -np.inf, np.nan, -0.0, -0.4, 2**52 + 1.0]])
    x = x.astype(dtype)
    got, expected = Tensor(x).round().numpy(), torch.tensor(x).round().numpy()
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint32"])
def test_integer_division_by_zero_or_minus_one_never_traps(dtype):
    """C's x / 0 and INT_MIN / -1 kill the process (SIGFPE); ember gives numpy's 0 for a zero divisor and the
    wrapped quotient for -1."""
    info = np.iinfo(dtype)
    a = np.array([info.min, info.max, 7, 0, 5, info.min], dtype)
    b = np.array([0, 0, 0, 0, 2, -1 if info.min else 1], dtype)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal((Tensor(a) // Tensor(b)).numpy(), a // b)
        np.testing.assert_array_equal((Tensor(a) % Tensor(b)).numpy(), a % b)
