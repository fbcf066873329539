"""Math functions and activations, forward and backward, against torch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import Tensor
from ember.device import Device
from tests.helpers import tolerance

X = np.concatenate([np.linspace(-4, 4, 41), [-0.0, 1e-4, -1e-4, 0.5, 30.0, -30.0]]).astype(np.float32)
INSIDE = np.linspace(-0.95, 0.95, 21).astype(np.float32)  # the domain of asin, acos, atanh
ABOVE_ONE = np.linspace(1.05, 6, 21).astype(np.float32)  # the domain of acosh

# (name, ember, torch, input, forward rtol)
CASES = [
    ("cos", lambda x: x.cos(), torch.cos, X, 1e-6), ("tan", lambda x: x.tan(), torch.tan, INSIDE, 1e-6),
    ("asin", lambda x: x.asin(), torch.asin, INSIDE, 1e-6), ("acos", lambda x: x.acos(), torch.acos, INSIDE, 1e-6),
    ("atan", lambda x: x.atan(), torch.atan, X, 1e-6), ("sinh", lambda x: x.sinh(), torch.sinh, INSIDE * 4, 1e-6),
    ("cosh", lambda x: x.cosh(), torch.cosh, INSIDE * 4, 1e-6), ("tanh", lambda x: x.tanh(), torch.tanh, X, 2e-7),
    ("asinh", lambda x: x.asinh(), torch.asinh, X, 1e-6), ("acosh", lambda x: x.acosh(), torch.acosh, ABOVE_ONE, 1e-6),
    ("atanh", lambda x: x.atanh(), torch.atanh, INSIDE, 1e-6), ("erf", lambda x: x.erf(), torch.erf, X, 1e-6),
    ("expm1", lambda x: x.expm1(), torch.expm1, X[:45], 2e-7), ("log1p", lambda x: x.log1p(), torch.log1p,
                                                               ABOVE_ONE - 1, 2e-7),
    ("sigmoid", lambda x: x.sigmoid(), torch.sigmoid, X, 1e-6),
    ("softplus", lambda x: x.softplus(), F.softplus, X, 1e-6),
    ("softplus_beta", lambda x: x.softplus(beta=2, threshold=5), lambda t: F.softplus(t, beta=2, threshold=5), X, 1e-6),
    ("relu6", lambda x: x.relu6(), F.relu6, X * 2, 0), ("leaky_relu", lambda x: x.leaky_relu(0.2),
                                                       lambda t: F.leaky_relu(t, 0.2), X, 1e-7),
    ("elu", lambda x: x.elu(0.7), lambda t: F.elu(t, 0.7), X, 1e-6),
    ("celu", lambda x: x.celu(1.3), lambda t: F.celu(t, 1.3), X, 1e-6),
    ("selu", lambda x: x.selu(), F.selu, X, 1e-6), ("silu", lambda x: x.silu(), F.silu, X, 1e-6),
    ("gelu", lambda x: x.gelu(), F.gelu, X, 1e-6),
    ("gelu_tanh", lambda x: x.gelu("tanh"), lambda t: F.gelu(t, approximate="tanh"), X, 1e-6),
    ("quick_gelu", lambda x: x.quick_gelu(), lambda t: t * torch.sigmoid(1.702 * t), X, 1e-6),
    ("mish", lambda x: x.mish(), F.mish, X, 1e-6), ("hardsigmoid", lambda x: x.hardsigmoid(), F.hardsigmoid, X, 1e-7),
    ("hardswish", lambda x: x.hardswish(), F.hardswish, X, 1e-6),
    ("hardtanh", lambda x: x.hardtanh(-0.5, 2.0), lambda t: F.hardtanh(t, -0.5, 2.0), X, 0),
    ("logsigmoid", lambda x: x.logsigmoid(), F.logsigmoid, X, 1e-6),
]


@pytest.mark.parametrize("name, ours, theirs, x, rtol", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward_match_torch(name, ours, theirs, x, rtol):
    """torch in float64 is the oracle: its float32 kernels lose digits where ember's libm calls do not (gelu at -4)."""
    if name == "gelu_tanh" and Device.DEFAULT != "CPU":
        pytest.xfail("an OpenCL tanh within its 5 ulps (PoCL: tanh(-10) = -0.99999994, not -1) times gelu's x^3 "
                     "in the gradient's tail: 1.7e-4 where torch has 0")
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    expected = theirs(t)
    expected.sum().backward()
    e = Tensor(x)
    out = ours(e)
    rtol, atol = tolerance("float32", rtol, 1e-7)
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=rtol, atol=atol)
    (grad,) = out.sum().gradient(e)
    np.testing.assert_allclose(grad.numpy(), t.grad.numpy(), *tolerance("float32", 1e-5, 1e-6))


@pytest.mark.parametrize("fn", ["cos", "tanh", "erf", "expm1", "log1p", "atan"])
def test_float64_math_is_libm_exact(fn):
    x = np.linspace(-0.9, 3, 50)
    np.testing.assert_allclose(getattr(Tensor(x), fn)().numpy(), getattr(torch.tensor(x), fn)().numpy(), rtol=1e-15)


def test_math_on_integers_gives_the_default_float_like_torch():
    out = Tensor([0, 1, 2]).tanh()
    assert out.dtype.name == "float32"
    np.testing.assert_allclose(out.numpy(), torch.tensor([0, 1, 2]).tanh().numpy(), rtol=1e-6)


def test_gelu_rejects_an_unknown_approximation():
    with pytest.raises(ValueError, match="gelu: approximate must be 'none' or 'tanh', got 'fast'"):
        Tensor(X).gelu("fast")
