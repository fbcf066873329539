"""Values and gradients at the points where a derivative is undefined or a shortcut loses the graph, against torch:
a constant slice's std, atan2 at the origin, pow(x, 0), a pad with -0.0. torch's convention (0 where the
derivative is undefined, NaN where the value is) is what keeps one constant slice from poisoning every gradient."""

import math

import numpy as np
import pytest
import torch

from ember import Tensor

NAN_OK = {"equal_nan": True, "rtol": 1e-6, "atol": 1e-6}


def both(fn, *values):
    """(ember's value, ember's gradients, torch's value, torch's gradients) of fn(*values).sum()."""
    ours = [Tensor(np.asarray(v, np.float32), requires_grad=True) for v in values]
    theirs = [torch.tensor(np.asarray(v, np.float32), requires_grad=True) for v in values]
    out, ref = fn(*ours), fn(*theirs)
    out.sum().backward()
    ref.sum().backward()
    return out.numpy(), [t.grad.numpy() for t in ours], ref.detach().numpy(), [t.grad.numpy() for t in theirs]


def assert_like_torch(fn, *values, signed_zeros: bool = False):
    out, grads, ref, ref_grads = both(fn, *values)
    np.testing.assert_allclose(out, ref, **NAN_OK)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, **NAN_OK)
        if signed_zeros: np.testing.assert_array_equal(np.signbit(g), np.signbit(r))


STD_CASES = [
    ("constant", lambda x: x.std(), [1.0, 1.0, 1.0]),
    ("constant_correction0", lambda x: x.std(correction=0), [1.0, 1.0, 1.0]),
    ("constant_rows", lambda x: x.std(1), [[2.0, 2.0, 2.0], [1.0, 2.0, 4.0]]),
    ("singleton_axis", lambda x: x.std(1), [[1.0], [2.0]]),  # divisor n - 1 = 0: NaN value and gradient
    ("singleton_axis_correction0", lambda x: x.std(1, correction=0), [[1.0], [2.0]]),
    ("one_element", lambda x: x.std(), [3.0]),
    ("one_element_correction0", lambda x: x.std(correction=0), [3.0]),
    ("std_mean", lambda x: x.std_mean()[0] if isinstance(x, Tensor) else torch.std_mean(x)[0], [5.0, 5.0]),
    ("downstream", lambda x: (x * 2).std(0) * x.sum(0), [[1.0, 3.0], [1.0, 4.0]]),
]


@pytest.mark.parametrize("name,fn,values", STD_CASES, ids=[c[0] for c in STD_CASES])
def test_std_gradient_of_constant_input_matches_torch(name, fn, values):
    with np.errstate(all="ignore"): assert_like_torch(fn, values)


def test_std_of_varied_input_keeps_its_gradient():
    """The zero-variance guard must not change the ordinary gradient."""
    x = np.random.default_rng(3).normal(size=(4, 5)).astype(np.float32)
    assert_like_torch(lambda t: t.std(1) * 3, x)


def test_atan2_gradient_at_origin_is_zero_as_torch():
    assert_like_torch(lambda a, b: a.atan2(b) if isinstance(a, Tensor) else torch.atan2(a, b),
                      [0.0, -0.0, 0.0, 1.0, -2.0], [0.0, -0.0, -0.0, 0.0, 3.0], signed_zeros=True)


def test_atan2_zero_slice_does_not_poison_other_gradients():
    a = Tensor([0.0, 1.0], requires_grad=True)
    (a.atan2(a * 0) * 3 + a * a).sum().backward()
    ta = torch.tensor([0.0, 1.0], requires_grad=True)
    (torch.atan2(ta, ta * 0) * 3 + ta * ta).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy())


@pytest.mark.parametrize("exponent", [0, 0.0])
def test_pow_zero_records_the_base_and_gives_zero_gradient(exponent):
    values = [1.0, 0.0, -2.0, math.inf, -math.inf, math.nan]
    assert_like_torch(lambda x: x ** exponent, values)


def test_pow_zero_inside_a_larger_expression():
    assert_like_torch(lambda x: x ** 0 * x + x ** 1, [0.5, -1.5, 2.0])


def test_pad_with_negative_zero_writes_negative_zero():
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    ours = 1 / Tensor(x).pad(((1, 0), (0, 2)), value=-0.0)
    ref = 1 / torch.nn.functional.pad(torch.tensor(x), (0, 2, 1, 0), value=-0.0)
    np.testing.assert_array_equal(ours.numpy(), ref.numpy())  # -inf in the padding, as torch


def test_pad_with_positive_zero_still_pads_positive_zero():
    ours = 1 / Tensor([1.0, 2.0]).pad(((1, 1),), value=0.0)
    np.testing.assert_array_equal(ours.numpy(), [math.inf, 1.0, 0.5, math.inf])
