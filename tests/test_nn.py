"""Layers against torch.nn with the same weights: outputs, input and parameter gradients, BatchNorm's running
statistics, default initializations; and the digits demo trains to its accuracy."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ember import Tensor, dtypes
from ember.errors import ShapeError
from ember.nn import (
    BatchNorm,
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    ConvTranspose2d,
    Dropout,
    Embedding,
    GroupNorm,
    LayerNorm,
    Linear,
    RMSNorm,
)
from ember.nn.state import get_parameters, get_state_dict

TOL = {"rtol": 1e-5, "atol": 1e-5}


def copy_weights(ours: object, theirs: torch.nn.Module) -> None:
    """Load our initial values into the torch module by name: the names must be torch's for this to work."""
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in get_state_dict(ours).items()})


def check_module(ours: object, theirs: torch.nn.Module, x_np: np.ndarray, seed: int = 0) -> Tensor:
    """Same forward output, and same gradients for the input and every parameter of a random linear loss."""
    copy_weights(ours, theirs)
    params = {name: t for name, t in get_state_dict(ours).items() if t.requires_grad is not False}
    for t in params.values():
        if t.requires_grad is None: t.requires_grad_()  # twice would trip ember bug: WeakSet compares with ==
    is_float = x_np.dtype.kind == "f"
    x, tx = Tensor(x_np, requires_grad=is_float or None), torch.tensor(x_np, requires_grad=is_float)
    out, want = ours(x), theirs(tx)
    assert out.shape == tuple(want.shape)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), **TOL)
    seed_np = np.random.default_rng(seed).standard_normal(out.shape).astype(np.float32)
    (out * Tensor(seed_np)).sum().backward()
    (want * torch.from_numpy(seed_np)).sum().backward()
    if is_float: np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **TOL, err_msg="input gradient")
    torch_params = dict(theirs.named_parameters())
    assert sorted(params) == sorted(torch_params)
    for name, p in params.items():
        np.testing.assert_allclose(p.grad.numpy(), torch_params[name].grad.numpy(), **TOL, err_msg=name)
    return out


def data(*shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- layers against torch ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, kwargs, shape", [((3, 5), {}, (4, 3)), ((4, 2), {}, (2, 3, 4)),
                                                 ((6, 3), {"bias": False}, (5, 6)), ((1, 1), {}, (1,))])
def test_linear(args, kwargs, shape):
    check_module(Linear(*args, **kwargs), torch.nn.Linear(*args, **kwargs), data(*shape))


CONV1D = [((4, 6, 3), dict(stride=2, padding=1, dilation=2, groups=2), (2, 4, 11)),
          ((3, 5, 4), dict(padding="same"), (2, 3, 9)), ((3, 2, 1), dict(bias=False), (1, 3, 5))]
CONV2D = [((3, 4, 3), {}, (2, 3, 8, 8)),
          ((4, 6, (3, 2)), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2), (2, 4, 9, 7)),
          ((2, 3, 3), dict(padding="same"), (1, 2, 6, 5)),
          ((3, 3, 3), dict(padding="valid", groups=3, bias=False), (2, 3, 5, 5)),
          ((2, 4, 2), dict(stride=2, padding=2), (1, 2, 7, 6))]
CONV_TRANSPOSE2D = [((3, 4, 3), {}, (2, 3, 5, 5)),
                    ((4, 6, (3, 2)), dict(stride=2, padding=1, output_padding=1, groups=2), (2, 4, 4, 5)),
                    ((2, 3, 4), dict(stride=3, dilation=2, output_padding=(2, 0), bias=False), (1, 2, 3, 3)),
                    ((3, 2, 2), dict(stride=(1, 2), padding=(0, 1)), (2, 3, 4, 4))]


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch: its 'same' with an even kernel copies
@pytest.mark.parametrize("args, kwargs, shape", CONV1D)
def test_conv1d(args, kwargs, shape):
    check_module(Conv1d(*args, **kwargs), torch.nn.Conv1d(*args, **kwargs), data(*shape))


@pytest.mark.parametrize("args, kwargs, shape", CONV2D)
def test_conv2d(args, kwargs, shape):
    check_module(Conv2d(*args, **kwargs), torch.nn.Conv2d(*args, **kwargs), data(*shape))


@pytest.mark.parametrize("args, kwargs, shape", CONV_TRANSPOSE2D)
def test_conv_transpose2d(args, kwargs, shape):
    check_module(ConvTranspose2d(*args, **kwargs), torch.nn.ConvTranspose2d(*args, **kwargs), data(*shape))


@pytest.mark.parametrize("cls", [Conv1d, Conv2d, ConvTranspose2d])
def test_conv_channels_must_divide_into_groups(cls):
    with pytest.raises(ShapeError, match=r"in_channels \(3\) and out_channels \(4\) must both be divisible by groups"):
        cls(3, 4, 3, groups=2)


@pytest.mark.parametrize("cls, torch_cls, shape", [(BatchNorm1d, torch.nn.BatchNorm1d, (6, 4)),
                                                   (BatchNorm1d, torch.nn.BatchNorm1d, (3, 4, 5)),
                                                   (BatchNorm2d, torch.nn.BatchNorm2d, (2, 4, 3, 5))])
@pytest.mark.parametrize("kwargs", [{}, dict(momentum=0.3, eps=1e-3), dict(momentum=None), dict(affine=False)])
def test_batchnorm_trains_and_tracks_running_statistics(cls, torch_cls, shape, kwargs):
    ours, theirs = cls(4, **kwargs), torch_cls(4, **kwargs)
    for step in range(3):
        theirs.zero_grad()
        for p in get_parameters(ours): p.grad = None
        with Tensor.train():
            check_module(ours, theirs.train(), data(*shape, seed=step) * (step + 1) + step, seed=step)
        Tensor.realize(ours.running_mean, ours.running_var, ours.num_batches_tracked)
        np.testing.assert_allclose(ours.running_mean.numpy(), theirs.running_mean.numpy(), **TOL)
        np.testing.assert_allclose(ours.running_var.numpy(), theirs.running_var.numpy(), **TOL)
        assert ours.num_batches_tracked.item() == theirs.num_batches_tracked.item() == step + 1
    theirs.zero_grad()
    for p in get_parameters(ours): p.grad = None
    check_module(ours.eval(), theirs.eval(), data(*shape, seed=9))


def test_batchnorm_training_gradient_differentiates_again():
    """Training batchnorm's closed-form input gradient (nn/norm.py BatchNormGradient) is a function of x like any
    other: the gradient of its square's sum equals torch's double backward."""
    ours, theirs = BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    x_np, g_np = data(4, 3, 5, 6, seed=1) * 2 + 1, data(4, 3, 5, 6, seed=2)
    x, tx = Tensor(x_np, requires_grad=True), torch.tensor(x_np, requires_grad=True)
    with Tensor.train(): gx, = ours(x).gradient(x, gradient=Tensor(g_np))
    tgx, = torch.autograd.grad(theirs.train()(tx), tx, torch.tensor(g_np), create_graph=True)
    np.testing.assert_allclose(gx.numpy(), tgx.detach().numpy(), **TOL)
    ggx, = (gx * gx).sum().gradient(x)
    tggx, = torch.autograd.grad((tgx * tgx).sum(), tx)
    np.testing.assert_allclose(ggx.numpy(), tggx.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_without_running_statistics_uses_the_batch(training):
    ours, theirs = BatchNorm(3, track_running_stats=False), torch.nn.BatchNorm1d(3, track_running_stats=False)
    with Tensor.train(training):
        check_module(ours, theirs.train(training), data(5, 3, 2))
    assert list(get_state_dict(ours)) == list(theirs.state_dict()) == ["weight", "bias"]


def test_batchnorm_names_and_aliases():
    assert BatchNorm1d is BatchNorm2d is BatchNorm
    assert list(get_state_dict(BatchNorm(3))) == list(torch.nn.BatchNorm2d(3).state_dict())
    with pytest.raises(ShapeError, match=r"BatchNorm: expected input of shape \(N, 3, ...\), got \(2, 4\)"):
        BatchNorm(3)(Tensor.ones(2, 4))


@pytest.mark.parametrize("args, kwargs, shape", [((5,), {}, (3, 5)), (((3, 4),), dict(eps=1e-3), (2, 3, 4)),
                                                 ((6,), dict(elementwise_affine=False), (2, 2, 6)),
                                                 ((4,), dict(bias=False), (3, 4))])
def test_layernorm(args, kwargs, shape):
    check_module(LayerNorm(*args, **kwargs), torch.nn.LayerNorm(*args, **kwargs), data(*shape))


@pytest.mark.parametrize("args, kwargs, shape", [((3, 6), {}, (2, 6, 4, 4)), ((2, 4), dict(eps=1e-3), (3, 4, 5)),
                                                 ((1, 3), dict(affine=False), (2, 3)), ((4, 4), {}, (2, 4, 3))])
def test_groupnorm(args, kwargs, shape):
    check_module(GroupNorm(*args, **kwargs), torch.nn.GroupNorm(*args, **kwargs), data(*shape))


@pytest.mark.parametrize("dim, kwargs, shape", [(5, dict(eps=1e-6), (3, 5)), ((3, 4), dict(eps=1e-3), (2, 3, 4)),
                                                (6, dict(eps=1e-5, elementwise_affine=False), (2, 2, 6))])
def test_rmsnorm(dim, kwargs, shape):
    check_module(RMSNorm(dim, **kwargs), torch.nn.RMSNorm(dim, **kwargs), data(*shape))


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # torch: no fused kernel
def test_rmsnorm_half_normalizes_in_float32():
    x = data(4, 8) * 50
    out = RMSNorm(8, eps=1e-5)(Tensor(x, dtype=dtypes.float16))
    want = torch.nn.RMSNorm(8, eps=1e-5)(torch.from_numpy(x).half())
    assert out.dtype is dtypes.float16
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("shape", [(7,), (2, 5), (3, 1, 4)])
def test_embedding(shape):
    idx = np.random.default_rng(0).integers(0, 10, shape)
    check_module(Embedding(10, 6), torch.nn.Embedding(10, 6), idx)


@pytest.mark.parametrize("norm, shape", [(LayerNorm(4), (2, 5)), (GroupNorm(2, 4), (2, 3)), (RMSNorm(4), (4, 3))])
def test_norms_check_the_input_shape(norm, shape):
    with pytest.raises(ShapeError, match="must be|expected input of shape"):
        norm(Tensor.ones(*shape))


def test_dropout_is_identity_in_eval():
    x = Tensor(data(4, 5))
    np.testing.assert_array_equal(Dropout(0.5).eval()(x).numpy(), x.numpy())


@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 1.0])
def test_dropout_zeroes_a_fraction_p_and_scales_the_rest(p):
    x = np.full((100, 100), 2.0, np.float32)
    with Tensor.train():
        out = Dropout(p)(Tensor(x)).numpy()
    kept = out != 0
    assert abs(1 - kept.mean() - p) < 0.02
    np.testing.assert_allclose(out[kept], 2.0 / (1 - p) if p < 1 else [], rtol=1e-6)


def test_dropout_rejects_p_outside_0_1():
    with pytest.raises(ValueError, match=r"Dropout: p must be in \[0, 1\], got 1.5"):
        Dropout(1.5)


# ---- default initialization ----------------------------------------------------------------------------------------

def assert_uniform(t: Tensor, bound: float) -> None:
    """Values in [-bound, bound) with the mean and spread of a uniform distribution (loose: a few thousand draws)."""
    values = t.numpy().ravel()
    assert values.min() >= -bound and values.max() < bound
    assert abs(values.mean()) < 0.05 * bound and abs(values.std() - bound / math.sqrt(3)) < 0.05 * bound


@pytest.mark.parametrize("layer, fan_in", [(Linear(50, 80), 50), (Conv2d(6, 40, 3, groups=2), 27),
                                           (Conv1d(8, 30, 5), 40), (ConvTranspose2d(40, 12, 3, groups=2), 54)])
def test_weights_and_biases_are_uniform_in_one_over_sqrt_fan_in(layer, fan_in):
    """torch's default: kaiming_uniform(a=sqrt(5)) gives ±1/sqrt(fan_in); ConvTranspose takes fan_in from the
    weight's second axis (out_channels/groups times the kernel)."""
    assert_uniform(layer.weight, 1 / math.sqrt(fan_in))
    assert np.abs(layer.bias.numpy()).max() < 1 / math.sqrt(fan_in)


def test_weight_shapes_are_torchs():
    pairs = [(Linear(3, 4), torch.nn.Linear(3, 4)), (Conv2d(4, 6, (3, 2), groups=2), torch.nn.Conv2d(4, 6, (3, 2),
                                                                                                   groups=2)),
             (ConvTranspose2d(4, 6, 3, groups=2), torch.nn.ConvTranspose2d(4, 6, 3, groups=2)),
             (Embedding(7, 3), torch.nn.Embedding(7, 3)), (GroupNorm(2, 4), torch.nn.GroupNorm(2, 4))]
    for ours, theirs in pairs:
        assert {k: v.shape for k, v in get_state_dict(ours).items()} == \
            {k: tuple(v.shape) for k, v in theirs.state_dict().items()}


def test_embedding_and_norm_initialization():
    weight = Embedding(100, 50).weight.numpy()
    assert abs(weight.mean()) < 0.05 and abs(weight.std() - 1) < 0.05
    norm = BatchNorm(3)
    assert norm.weight.tolist() == [1.0] * 3 and norm.bias.tolist() == [0.0] * 3
    assert norm.running_mean.tolist() == [0.0] * 3 and norm.running_var.tolist() == [1.0] * 3
    assert norm.num_batches_tracked.dtype is dtypes.int64 and norm.num_batches_tracked.shape == ()


# ---- the demo ------------------------------------------------------------------------------------------------------

def test_digits_demo_reaches_its_accuracy():
    pytest.importorskip("sklearn", reason="the demo needs scikit-learn: pip install -e '.[demo]'")
    path = Path(__file__).parent.parent / "examples" / "demo.py"
    spec = importlib.util.spec_from_file_location("demo", path)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    accuracy = demo.train_digits(log=lambda *args: None)
    assert accuracy >= 0.97
