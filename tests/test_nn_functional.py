"""Tests of ember/mixin/nn.py against torch.nn.functional: convolutions, transposed convolutions, pooling,
interpolation, normalization, attention, dropout and losses, forward and backward, and their errors.

Each case runs twice: in float32, forward only, against torch's float32 with a tolerance for sums taken in another
order; and in float64, the gradient of every float input under a random cotangent, against torch's autograd with
tight tolerances. (No float64 forward: it would compile one more kernel per case to check what the float32 forward
and the gradient check already do.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import Tensor, dtypes
from ember.errors import DTypeError, ShapeError
from tests.helpers import REDUCE_TOL, check, dtype_name, match_torch_gradient, sample

F32 = {"rtol": 1e-5, "atol": 1e-6}  # float32 forward: torch and ember sum in different orders
F64 = {"rtol": 1e-10, "atol": 1e-12}  # float64 gradients
EXACT = {"rtol": 0, "atol": 0}


def randn(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def match_torch(ours: Callable[..., Tensor], theirs: Callable[..., torch.Tensor], arrays: Sequence[np.ndarray], *,
                diff: Sequence[int] | None = None, f32: dict[str, float] = F32, seed: int = 0) -> None:
    """ours(*Tensors) equals theirs(*torch tensors) in float32, and so do the gradients in float64.

    Float arrays are cast to each precision, others (class indices) are passed as they are. `diff` names the
    inputs to differentiate (by position; default: every float input)."""
    arrays = [np.asarray(a) for a in arrays]
    is_float = [a.dtype.kind == "f" for a in arrays]
    diff = [i for i, f in enumerate(is_float) if f] if diff is None else list(diff)
    for dtype in ("float32", "float64"):
        values = [a.astype(dtype) if f else a for a, f in zip(arrays, is_float)]
        ts = [torch.tensor(v, requires_grad=dtype == "float64" and i in diff) for i, v in enumerate(values)]
        es = [Tensor(v) for v in values]
        want, got = theirs(*ts), ours(*es)
        assert got.shape == tuple(want.shape), f"{dtype} shape: ember {got.shape}, torch {tuple(want.shape)}"
        assert got.dtype.name == dtype, f"dtype: ember {got.dtype.name}, expected {dtype}"
        if dtype == "float32":
            np.testing.assert_allclose(got.numpy(), want.detach().numpy(), **f32, err_msg="float32 forward")
            continue
        cotangent = np.random.default_rng(seed + 1).standard_normal(got.shape)
        (want * torch.from_numpy(cotangent)).sum().backward()
        grads = (got * Tensor(cotangent)).sum().gradient(*(es[i] for i in diff))
        for i, g in zip(diff, grads):
            np.testing.assert_allclose(g.numpy(), ts[i].grad.numpy(), **F64, err_msg=f"gradient of input {i}")


# ---- convolution ---------------------------------------------------------------------------------------------------

# (input shape, weight shape, has bias, keyword arguments); torch's conv1d/2d/3d is picked by the weight's rank
CONV = [
    ((2, 4, 11), (6, 2, 3), True, dict(stride=2, padding=1, dilation=2, groups=2)),
    ((1, 3, 9), (5, 3, 4), True, dict(padding="same")),  # even kernel: the odd pad element goes after
    ((2, 3, 8), (2, 3, 3), False, dict(padding="valid", stride=3)),
    ((2, 3, 7, 6), (4, 3, 3, 3), True, dict(padding=(1, 2))),
    ((1, 4, 6, 5), (8, 1, 3, 3), True, dict(groups=4, padding="same", dilation=2)),  # depthwise, two per channel
    ((2, 2, 9, 8), (3, 2, 2, 3), True, dict(stride=(2, 3), padding="valid")),
    ((2, 6, 7, 7), (4, 3, 3, 2), False, dict(stride=2, padding=(0, 1), dilation=(1, 3), groups=2)),
    ((1, 1, 1, 1), (3, 1, 1, 1), True, {}),  # a 1x1 kernel on a 1x1 image
    ((3, 6, 6), (2, 3, 3, 3), True, dict(stride=2)),  # unbatched
    ((1, 2, 5, 4, 6), (3, 2, 2, 3, 2), True, dict(stride=(1, 2, 1), padding=1)),
    ((2, 4, 5, 5, 4), (4, 2, 2, 2, 2), False, dict(groups=2, dilation=(2, 1, 1), padding="same")),
]


def torch_conv(n: int) -> Callable[..., torch.Tensor]:
    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[n]


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch: 'same' with an even kernel copies the input
@pytest.mark.parametrize("x_shape, w_shape, has_bias, kwargs", CONV, ids=[f"{c[0]}*{c[1]}" for c in CONV])
def test_conv_matches_torch(x_shape, w_shape, has_bias, kwargs):
    arrays = [randn(*x_shape), randn(*w_shape, seed=1)] + ([randn(w_shape[0], seed=2)] if has_bias else [])
    conv = torch_conv(len(w_shape) - 2)
    match_torch(lambda x, w, b=None: x.conv2d(w, b, **kwargs), lambda x, w, b=None: conv(x, w, b, **kwargs), arrays)


@pytest.mark.parametrize("name", ["conv1d", "conv3d"])
def test_conv1d_and_conv3d_are_conv2d(name):
    assert getattr(Tensor, name) is Tensor.conv2d


def test_conv_takes_torch_flat_padding_last_axis_first():
    """padding=(left, right, top, bottom) pads as F.pad does, then convolves without padding."""
    pads = (1, 2, 0, 3)
    match_torch(lambda x, w: x.conv2d(w, padding=pads), lambda x, w: F.conv2d(F.pad(x, pads), w),
                [randn(1, 2, 4, 5), randn(3, 2, 2, 3, seed=1)])


# (input shape, weight shape (in, out / groups, *kernel), has bias, keyword arguments)
CONV_TRANSPOSE = [
    ((2, 3, 4, 5), (3, 2, 3, 3), True, dict(stride=2, padding=1, output_padding=1)),
    ((1, 4, 3, 4), (4, 3, 2, 3), True, dict(stride=(2, 3), dilation=(1, 2), output_padding=(1, 0), groups=2)),
    ((2, 2, 3, 3), (2, 2, 4, 2), False, dict(stride=3, dilation=2, padding=(2, 1), output_padding=(2, 0))),
    ((2, 6, 3, 3), (6, 1, 3, 3), False, dict(groups=6, stride=2)),  # depthwise
    ((3, 4, 4), (3, 2, 2, 2), True, dict(stride=2)),  # unbatched
    ((2, 3, 5), (3, 4, 3), True, dict(stride=3, padding=2, output_padding=1)),  # 1-d
    ((1, 2, 3, 3, 2), (2, 2, 2, 2, 2), True, dict(stride=2, padding=(1, 0, 0))),  # 3-d
    ((1, 2, 3, 4), (2, 3, 2, 2), False, dict(dilation=(2, 1), output_padding=(1, 0))),  # below dilation, not stride
]


@pytest.mark.parametrize("x_shape, w_shape, has_bias, kwargs", CONV_TRANSPOSE,
                         ids=[f"{c[0]}*{c[1]}" for c in CONV_TRANSPOSE])
def test_conv_transpose_matches_torch(x_shape, w_shape, has_bias, kwargs):
    groups = kwargs.get("groups", 1)
    arrays = [randn(*x_shape), randn(*w_shape, seed=1)] + ([randn(w_shape[1] * groups, seed=2)] if has_bias else [])
    conv = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[len(w_shape) - 2]
    match_torch(lambda x, w, b=None: x.conv_transpose2d(w, b, **kwargs), lambda x, w, b=None: conv(x, w, b, **kwargs),
                arrays)


def test_conv_transpose_is_the_gradient_of_conv():
    x, w, g = Tensor(randn(1, 2, 7, 6)), Tensor(randn(3, 2, 3, 3, seed=1)), Tensor(randn(1, 3, 4, 3, seed=2))
    (dx,) = x.conv2d(w, stride=2, padding=1).gradient(x, gradient=g)
    np.testing.assert_allclose(g.conv_transpose2d(w, stride=2, padding=1, output_padding=(0, 1)).numpy(), dx.numpy(),
                               **F64)


@pytest.mark.parametrize("x_shape, w_shape, groups, match", [
    ((1, 3, 5, 5), (4, 2, 3, 3), 1, r"input has 3 channels, weight \(4, 2, 3, 3\) with groups=1 expects 2"),
    ((1, 4, 5, 5), (3, 2, 3, 3), 2, r"input has 4 channels, weight \(3, 2, 3, 3\) with groups=2"),
    ((1, 6, 5, 5), (4, 2, 3, 3), 4, r"input has 6 channels, weight \(4, 2, 3, 3\) with groups=4 expects 8"),
    ((5, 5), (4, 2, 3, 3), 1, r"input \(5, 5\) must be \(batch, channels, \*spatial\) with 2 spatial axes"),
    ((2, 1, 5, 5), (4, 3, 3), 1, r"input \(2, 1, 5, 5\) must be \(batch, channels, \*spatial\) with 1 spatial axes"),
])
def test_conv_rejects_mismatched_channels_and_groups(x_shape, w_shape, groups, match):
    with pytest.raises(ShapeError, match="conv: " + match):
        Tensor.ones(*x_shape).conv2d(Tensor.ones(*w_shape), groups=groups)


@pytest.mark.parametrize("x_shape, w_shape, kwargs, match", [
    ((1, 1, 2, 2), (1, 1, 3, 3), {}, r"kernel \(3, 3\) with dilation \(1, 1\) does not fit the padded input \(2, 2\) "
                                     r"of \(1, 1, 2, 2\)"),
    ((1, 1, 5, 4), (1, 1, 3, 2), dict(dilation=3), r"kernel \(3, 2\) with dilation \(3, 3\) does not fit the padded "
                                                   r"input \(5, 4\)"),
    ((1, 4), (1, 1, 7), dict(padding=1), r"kernel \(7,\) with dilation \(1,\) does not fit the padded input \(6,\)"),
])
def test_conv_rejects_a_kernel_larger_than_the_input(x_shape, w_shape, kwargs, match):
    with pytest.raises(ShapeError, match="conv: " + match):
        Tensor.ones(*x_shape).conv2d(Tensor.ones(*w_shape), **kwargs)


def test_conv_rejects_bad_padding_and_stride():
    x, w = Tensor.ones(1, 1, 5, 5), Tensor.ones(1, 1, 3, 3)
    with pytest.raises(ValueError, match="conv: padding='same' is not supported for strided convolutions"):
        x.conv2d(w, padding="same", stride=2)
    with pytest.raises(ValueError, match="conv: padding must be an int, a tuple, 'same' or 'valid'"):
        x.conv2d(w, padding="full")
    with pytest.raises(ShapeError, match=r"conv: padding \(1, 2, 3\) needs 2 or 4 values for 2 spatial axes"):
        x.conv2d(w, padding=(1, 2, 3))
    with pytest.raises(ShapeError, match=r"conv: stride \(1, 2, 3\) needs 2 values, one per spatial axis"):
        x.conv2d(w, stride=(1, 2, 3))


@pytest.mark.parametrize("kwargs, match", [
    (dict(output_padding=1), r"output_padding \(1, 1\) is not below stride \(1, 1\) or dilation \(1, 1\) on "
                             r"spatial axis 0; each must be smaller than its axis's stride or dilation"),
    (dict(stride=(2, 1), dilation=(1, 2), output_padding=(1, 2)), r"output_padding \(1, 2\) is not below stride "
                                                                   r"\(2, 1\) or dilation \(1, 2\) on spatial axis 1"),
])
def test_conv_transpose_rejects_output_padding_not_below_stride_or_dilation(kwargs, match):
    """torch raises too: output rows past the last input's reach would hold only the bias."""
    with pytest.raises(ValueError, match="conv_transpose: " + match):
        Tensor.ones(1, 1, 3, 4).conv_transpose2d(Tensor.ones(1, 1, 2, 2), **kwargs)


def test_conv_transpose_rejects_mismatched_channels():
    with pytest.raises(ShapeError, match=r"conv_transpose: input \(1, 3, 4, 4\) and weight \(2, 2, 3, 3\)"):
        Tensor.ones(1, 3, 4, 4).conv_transpose2d(Tensor.ones(2, 2, 3, 3))


# ---- pooling -------------------------------------------------------------------------------------------------------

# (input shape, keyword arguments); the kernel's length picks torch's max_pool1d/2d/3d
MAX_POOL = [
    ((2, 3, 8, 7), dict(kernel_size=(2, 2))),
    ((1, 2, 9, 9), dict(kernel_size=(3, 3), stride=2, padding=1, dilation=(2, 1))),
    ((1, 1, 7, 5), dict(kernel_size=(2, 2), stride=2, padding=1, ceil_mode=True)),
    ((1, 1, 6, 10), dict(kernel_size=(3, 4), stride=(3, 3), dilation=(1, 2), padding=(1, 2), ceil_mode=True)),
    ((3, 5, 6), dict(kernel_size=(2, 3), stride=(1, 2))),  # unbatched
    ((2, 3, 10), dict(kernel_size=(3,), stride=(2,), padding=(1,), ceil_mode=True)),  # 1-d
    ((1, 2, 4, 5, 6), dict(kernel_size=(2, 2, 2), stride=(2, 1, 2))),  # 3-d
]


def torch_max_pool(x: torch.Tensor, kernel_size: Sequence[int], **kwargs: Any) -> Any:
    pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[len(kernel_size)]
    return pool(x, kernel_size, **kwargs)


@pytest.mark.parametrize("shape, kwargs", MAX_POOL, ids=[f"{c[0]}-{c[1]['kernel_size']}" for c in MAX_POOL])
def test_max_pool_and_its_indices_match_torch(shape, kwargs):
    """Values exactly, gradients, and return_indices' flat positions exactly."""
    match_torch(lambda x: x.max_pool2d(**kwargs), lambda x: torch_max_pool(x, **kwargs), [randn(*shape)], f32=EXACT)
    x = randn(*shape).astype(np.float32)
    values, indices = Tensor(x).max_pool2d(**kwargs, return_indices=True)
    want_values, want_indices = torch_max_pool(torch.from_numpy(x), **kwargs, return_indices=True)
    np.testing.assert_array_equal(values.numpy(), want_values.numpy())
    assert indices.dtype.name == "int64"
    np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())


def test_max_pool_indices_of_ties_and_nan_are_torchs():
    """Of equal maxima the first wins; a NaN is the maximum of its window."""
    x = np.array([[[1, 3, 3, 0, 2], [3, 1, 2, 2, np.nan], [0, 0, 0, 0, 1], [0, 0, 0, 0, 1]]], dtype=np.float32)
    values, indices = Tensor(x).max_pool2d((2, 2), stride=1, return_indices=True)
    want_values, want_indices = F.max_pool2d(torch.from_numpy(x), (2, 2), stride=1, return_indices=True)
    np.testing.assert_array_equal(values.numpy(), want_values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())


def test_max_pool_of_integers_pads_with_the_dtype_minimum():
    x = np.array([[[-5, -7, -9], [-8, -6, -4]]], dtype=np.int32)
    got = Tensor(x).max_pool2d((2, 2), stride=1, padding=1)
    assert got.dtype.name == "int32"
    np.testing.assert_array_equal(got.numpy(), F.max_pool2d(torch.from_numpy(x).double(), 2, 1, 1).int().numpy())


AVG_POOL = [
    ((2, 2, 7, 8), dict(kernel_size=(3, 3), stride=2, padding=1)),
    ((2, 2, 7, 8), dict(kernel_size=(3, 3), stride=2, padding=1, count_include_pad=False)),
    ((2, 2, 7, 8), dict(kernel_size=(3, 3), stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((1, 3, 5, 7), dict(kernel_size=(2, 3), stride=(1, 2), ceil_mode=True)),
    ((1, 1, 6, 6), dict(kernel_size=(4, 4), stride=3, padding=2, ceil_mode=True, count_include_pad=False)),
    ((3, 4, 4), dict(kernel_size=(2, 2))),  # unbatched, stride defaults to the kernel
    ((2, 3, 10), dict(kernel_size=(3,), stride=(2,), padding=(1,), ceil_mode=True)),  # 1-d
    ((1, 2, 4, 5, 6), dict(kernel_size=(2, 3, 2), stride=(2, 2, 1), padding=(1, 1, 0))),  # 3-d
]


def torch_avg_pool(x: torch.Tensor, kernel_size: Sequence[int], **kwargs: Any) -> torch.Tensor:
    pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[len(kernel_size)]
    return pool(x, kernel_size, **kwargs)


@pytest.mark.parametrize("shape, kwargs", AVG_POOL, ids=[f"{c[0]}-{sorted(c[1].items())}" for c in AVG_POOL])
def test_avg_pool_matches_torch(shape, kwargs):
    match_torch(lambda x: x.avg_pool2d(**kwargs), lambda x: torch_avg_pool(x, **kwargs), [randn(*shape)])


@pytest.mark.parametrize("pool", ["max_pool2d", "avg_pool2d"])
def test_pool_rejects_padding_over_half_the_kernel_and_a_kernel_over_the_input(pool):
    x = Tensor.ones(1, 1, 4, 4)
    with pytest.raises(ShapeError, match=r"_pool: padding 2 must be at most half of kernel_size \(3, 3\)"):
        getattr(x, pool)((3, 3), padding=2)
    with pytest.raises(ShapeError, match=r"pool: kernel 5 \(dilation 1\) is larger than the padded input 4"):
        getattr(x, pool)((5, 5))


# ---- interpolation -------------------------------------------------------------------------------------------------

# (input shape, output size, mode, align_corners); torch's linear mode is named for the number of spatial axes
INTERPOLATE = [
    ((2, 3, 5), (11,), "nearest", False), ((1, 2, 7, 9), (3, 4), "nearest", False),
    ((1, 1, 3, 4, 5), (5, 2, 7), "nearest", False),
    ((2, 3, 5), (11,), "nearest-exact", False), ((1, 2, 7, 9), (3, 4), "nearest-exact", False),
    ((2, 3, 5), (12,), "linear", False), ((2, 3, 9), (4,), "linear", True),
    ((1, 2, 5, 6), (9, 4), "linear", False), ((1, 2, 5, 6), (9, 4), "linear", True),
    ((1, 2, 5, 6), (5, 11), "linear", True),  # one axis kept the same size
    ((2, 1, 4, 1), (1, 3), "linear", True), ((2, 1, 4, 1), (1, 3), "linear", False),  # to and from size 1
    ((1, 1, 3, 4, 5), (5, 3, 7), "linear", False), ((1, 1, 3, 4, 5), (5, 3, 7), "linear", True),
]
TORCH_LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


def torch_interpolate(x: torch.Tensor, size: Sequence[int], mode: str, align_corners: bool) -> torch.Tensor:
    if mode != "linear": return F.interpolate(x, size=tuple(size), mode=mode)
    return F.interpolate(x, size=tuple(size), mode=TORCH_LINEAR[len(size)], align_corners=align_corners)


@pytest.mark.parametrize("shape, size, mode, align_corners", INTERPOLATE,
                         ids=[f"{c[0]}->{c[1]}-{c[2]}{'-align' * c[3]}" for c in INTERPOLATE])
def test_interpolate_matches_torch(shape, size, mode, align_corners):
    match_torch(lambda x: x.interpolate(size, mode, align_corners),
                lambda x: torch_interpolate(x, size, mode, align_corners), [randn(*shape)])


def test_interpolate_rejects_unknown_modes_and_sizes():
    x = Tensor.ones(1, 1, 4, 4)
    with pytest.raises(ValueError, match="interpolate: mode must be nearest, nearest-exact or linear, got 'bicubic'"):
        x.interpolate((8, 8), mode="bicubic")
    with pytest.raises(ShapeError, match=r"interpolate: size \(2, 2, 2, 2, 2\) has more axes than \(1, 1, 4, 4\)"):
        x.interpolate((2, 2, 2, 2, 2))


# ---- normalization -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, axis, eps", [((3, 7), -1, 1e-5), ((2, 3, 4, 5), (-2, -1), 1e-3)])
def test_layernorm_matches_torch(shape, axis, eps):
    normalized = shape[-len(axis):] if isinstance(axis, tuple) else shape[-1:]
    match_torch(lambda x: x.layernorm(axis, eps), lambda x: F.layer_norm(x, normalized, eps=eps),
                [randn(*shape) * 3 + 1])


@pytest.mark.parametrize("shape, affine", [((4, 3, 5, 2), True), ((4, 3, 5, 2), False), ((6, 3), True),
                                           ((2, 3, 4), False)])
def test_batchnorm_matches_torch_in_eval(shape, affine):
    """ember takes invstd = 1 / sqrt(var + eps) where torch takes var and eps."""
    eps = 1e-3
    mean, var = randn(3, seed=3), np.random.default_rng(4).uniform(0.5, 2, 3)
    invstd = 1 / np.sqrt(var + eps)
    params = [randn(3, seed=5), randn(3, seed=6)] if affine else []

    def ours(x, weight=None, bias=None):
        return x.batchnorm(weight, bias, Tensor(mean.astype(x.dtype.name)), Tensor(invstd.astype(x.dtype.name)))

    def theirs(x, weight=None, bias=None):
        return F.batch_norm(x, torch.tensor(mean, dtype=x.dtype), torch.tensor(var, dtype=x.dtype), weight, bias,
                            training=False, eps=eps)

    match_torch(ours, theirs, [randn(*shape)] + params)


def test_batchnorm_along_the_last_axis():
    x, mean, invstd = randn(4, 5, 3), randn(3, seed=1), np.array([0.5, 1.0, 2.0])
    got = Tensor(x).batchnorm(None, Tensor([1.0, 2.0, 3.0]), Tensor(mean), Tensor(invstd), axis=-1)
    np.testing.assert_allclose(got.numpy(), (x - mean) * invstd + [1.0, 2.0, 3.0], **F64)


# ---- attention -----------------------------------------------------------------------------------------------------

BOOL_MASK = np.random.default_rng(7).random((4, 6)) < 0.7
BOOL_MASK[:, 0] = True
EMPTY_ROW_MASK = BOOL_MASK.copy()
EMPTY_ROW_MASK[2] = False  # query 2 sees no key: torch gives it 0, and no gradient
FLOAT_MASK = randn(2, 1, 4, 6, seed=8)
EMPTY_ROW_FLOAT_MASK = FLOAT_MASK.copy()
EMPTY_ROW_FLOAT_MASK[1, 0, 3] = -np.inf

# (name, query, key and value shapes, keyword arguments; a numpy attn_mask becomes a tensor of the query's dtype)
SDPA = [
    ("plain_broadcast_kv", (2, 3, 4, 8), (1, 1, 6, 8), (1, 1, 6, 5), {}),
    ("bool_mask_scale", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), dict(attn_mask=BOOL_MASK, scale=1.5)),
    ("float_mask", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), dict(attn_mask=FLOAT_MASK)),
    ("bool_mask_empty_row", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), dict(attn_mask=EMPTY_ROW_MASK)),
    ("float_mask_empty_row", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), dict(attn_mask=EMPTY_ROW_FLOAT_MASK)),
    ("causal_lq_lt_lk", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), dict(is_causal=True)),
    ("causal_lq_gt_lk_scale", (1, 6, 4), (1, 4, 4), (1, 4, 3), dict(is_causal=True, scale=0.3)),
]


@pytest.mark.parametrize("name, q, k, v, kwargs", SDPA, ids=[c[0] for c in SDPA])
def test_scaled_dot_product_attention_matches_torch(name, q, k, v, kwargs):
    mask = kwargs.get("attn_mask")
    rest = {key: value for key, value in kwargs.items() if key != "attn_mask"}

    def ours(q, k, v):
        m = None if mask is None else Tensor(mask if mask.dtype == bool else mask.astype(q.dtype.name))
        return q.scaled_dot_product_attention(k, v, attn_mask=m, **rest)

    def theirs(q, k, v):
        m = None if mask is None else torch.tensor(mask, dtype=torch.bool if mask.dtype == bool else q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **rest)

    match_torch(ours, theirs, [randn(*q), randn(*k, seed=1), randn(*v, seed=2)])


@pytest.mark.parametrize("mask", [None, BOOL_MASK, FLOAT_MASK], ids=["none", "bool", "float"])
def test_scaled_dot_product_attention_takes_four_kernels_with_or_without_a_mask(mask):
    """scores, their max, the sum of exps, weights @ v recomputing each weight (tinygrad 0.14: 4 kernels; the
    weights had a kernel of their own): a mask adds no kernel (it added a second max)."""
    q, k, v = (Tensor(randn(*shape, seed=i)).realize() for i, shape in enumerate([(2, 3, 4, 8), (2, 3, 6, 8),
                                                                                     (2, 3, 6, 5)]))
    m = None if mask is None else Tensor(mask if mask.dtype == bool else mask.astype(np.float32)).realize()
    assert len(q.scaled_dot_product_attention(k, v, attn_mask=m).schedule()) == 4


def test_scaled_dot_product_attention_errors():
    q, k, v = Tensor.ones(2, 4, 8), Tensor.ones(2, 6, 7), Tensor.ones(2, 6, 5)
    with pytest.raises(ShapeError, match=r"scaled_dot_product_attention: query \(2, 4, 8\), key \(2, 6, 7\) and "
                                         r"value \(2, 6, 5\) do not fit"):
        q.scaled_dot_product_attention(k, v)
    with pytest.raises(ValueError, match="scaled_dot_product_attention: give attn_mask or is_causal"):
        q.scaled_dot_product_attention(q, q, attn_mask=Tensor.ones(4, 4), is_causal=True)


# ---- dropout -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_dropout_is_the_identity_outside_training(p):
    x = randn(5, 7).astype(np.float32)
    np.testing.assert_array_equal(Tensor(x).dropout(p).numpy(), x)


@pytest.mark.parametrize("p", [0.2, 0.7])
def test_dropout_in_training_keeps_about_1_minus_p_scaled_by_1_over_1_minus_p(p):
    x = np.random.default_rng(0).uniform(1, 2, (64, 128)).astype(np.float32)
    Tensor.manual_seed(3)
    t = Tensor(x, requires_grad=True)
    with Tensor.train():
        out = t.dropout(p)
    got = out.numpy()
    kept = got != 0
    assert abs(kept.mean() - (1 - p)) < 0.02
    np.testing.assert_allclose(got[kept], x[kept] / (1 - p), rtol=1e-6)
    (grad,) = out.sum().gradient(t)
    np.testing.assert_allclose(grad.numpy(), kept / (1 - p), rtol=1e-6)


def test_dropout_in_training_with_p_1_gives_zeros_and_rejects_p_outside_0_1():
    with Tensor.train():
        np.testing.assert_array_equal(Tensor(randn(3, 4)).dropout(1.0).numpy(), np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"dropout: p must be in \[0, 1\], got -0.1"):
        Tensor.ones(3).dropout(-0.1)


# ---- losses --------------------------------------------------------------------------------------------------------

LOGITS = randn(6, 5) * 2
TARGET = np.array([0, 4, 2, -100, 2, 1])
TARGET_IGNORE_2 = np.array([0, 4, 2, 3, 2, 1])
CLASS_WEIGHT = np.random.default_rng(9).uniform(0.5, 2, 5)
KD_LOGITS, KD_TARGET = randn(2, 4, 3, 5) * 2, np.random.default_rng(10).integers(0, 4, (2, 3, 5))
KD_TARGET[0, 1, 2] = -100
PROBS = np.random.default_rng(11).dirichlet(np.ones(5), 6)
KD_PROBS = np.random.default_rng(16).dirichlet(np.ones(4), (2, 3, 5)).transpose(0, 3, 1, 2)

# (name, logits, target, keyword arguments); each reduction is taken by several cases
CROSS_ENTROPY = [
    ("indices", LOGITS, TARGET, {}),
    ("ignore_index", LOGITS, TARGET_IGNORE_2, dict(ignore_index=2)),
    ("weight_none", LOGITS, TARGET, dict(weight=CLASS_WEIGHT, reduction="none")),
    ("smoothing", LOGITS, TARGET, dict(label_smoothing=0.2, reduction="sum")),
    ("weight_smoothing", LOGITS, TARGET_IGNORE_2, dict(weight=CLASS_WEIGHT, label_smoothing=0.3, ignore_index=2)),
    ("kd_weight_smoothing", KD_LOGITS, KD_TARGET, dict(weight=CLASS_WEIGHT[:4], label_smoothing=0.1)),
    ("unbatched", LOGITS[0], np.array(3), {}),
    ("probs", LOGITS, PROBS, dict(reduction="none")),
    ("probs_weight_smoothing", LOGITS, PROBS, dict(weight=CLASS_WEIGHT, label_smoothing=0.25)),
    ("kd_probs_sum", KD_LOGITS, KD_PROBS, dict(reduction="sum", label_smoothing=0.1)),
]


def with_weight(kwargs: dict[str, Any], make: Callable[[np.ndarray], Any], like: Any) -> dict[str, Any]:
    """kwargs with `weight` (a numpy array) turned by `make` into a tensor of the dtype of `like`."""
    return {k: make(v.astype(dtype_name(like))) if k == "weight" else v for k, v in kwargs.items()}


@pytest.mark.parametrize("name, logits, target, kwargs", CROSS_ENTROPY, ids=[c[0] for c in CROSS_ENTROPY])
def test_cross_entropy_matches_torch(name, logits, target, kwargs):
    match_torch(lambda x, t: x.cross_entropy(t, **with_weight(kwargs, Tensor, x)),
                lambda x, t: F.cross_entropy(x, t, **with_weight(kwargs, torch.tensor, x)),
                [logits, target], diff=[0])


NLL = [("indices", LOGITS, TARGET, {}), ("ignore_index", LOGITS, TARGET_IGNORE_2, dict(ignore_index=2,
                                                                                        reduction="sum")),
       ("weight", LOGITS, TARGET_IGNORE_2, dict(weight=CLASS_WEIGHT, ignore_index=2)),
       ("weight_none", LOGITS, TARGET, dict(weight=CLASS_WEIGHT, reduction="none")),
       ("kd", KD_LOGITS, KD_TARGET, dict(weight=CLASS_WEIGHT[:4])), ("unbatched", LOGITS[0], np.array(3), {})]


@pytest.mark.parametrize("name, logits, target, kwargs", NLL, ids=[c[0] for c in NLL])
def test_nll_loss_matches_torch(name, logits, target, kwargs):
    dim = 1 if logits.ndim > 1 else 0
    match_torch(lambda x, t: x.log_softmax(dim).nll_loss(t, **with_weight(kwargs, Tensor, x)),
                lambda x, t: F.nll_loss(x.log_softmax(dim), t, **with_weight(kwargs, torch.tensor, x)),
                [logits, target], diff=[0])


P = np.random.default_rng(12).uniform(0.02, 0.98, (4, 5))
Y = np.random.default_rng(13).uniform(0, 1, (4, 5))
Y[0] = [0, 1, 0, 1, 1]
ELEMENT_WEIGHT = np.random.default_rng(14).uniform(0.5, 2, 5)  # broadcast along the rows


@pytest.mark.parametrize("reduction, has_weight", [("mean", False), ("none", True), ("sum", True)])
def test_binary_cross_entropy_matches_torch(reduction, has_weight):
    arrays = [P, Y] + ([ELEMENT_WEIGHT] if has_weight else [])
    match_torch(lambda p, y, w=None: p.binary_cross_entropy(y, w, reduction=reduction),
                lambda p, y, w=None: F.binary_cross_entropy(p, y, w, reduction=reduction), arrays, diff=[0, 1])


def test_binary_cross_entropy_clamps_the_log_at_minus_100():
    p, y = np.array([0.0, 1.0, 0.0, 1.0, 0.5]), np.array([1.0, 0.0, 0.0, 1.0, 0.5])
    got = Tensor(p).binary_cross_entropy(Tensor(y), reduction="none")
    want = F.binary_cross_entropy(torch.tensor(p), torch.tensor(y), reduction="none")
    np.testing.assert_allclose(got.numpy(), want.numpy(), **F64)


LOGIT = randn(4, 5) * 3
LOGIT[0] = [-60, 60, -30, 30, 0]  # exp overflows in float32 unless computed stably
POS_WEIGHT = np.random.default_rng(15).uniform(0.5, 3, 5)


@pytest.mark.parametrize("weights, reduction", [("", "mean"), ("weight", "sum"), ("pos_weight", "none"),
                                                ("weight+pos_weight", "mean"), ("weight+pos_weight", "none")])
def test_binary_cross_entropy_with_logits_matches_torch(weights, reduction):
    def call(fn: Callable[..., Any], x: Any, y: Any, w: Any, pw: Any) -> Any:
        return fn(x, y, weight=w if "weight" in weights.split("+") else None, reduction=reduction,
                  pos_weight=pw if "pos_weight" in weights else None)

    match_torch(lambda *a: call(Tensor.binary_cross_entropy_with_logits, *a),
                lambda *a: call(F.binary_cross_entropy_with_logits, *a), [LOGIT, Y, ELEMENT_WEIGHT, POS_WEIGHT],
                diff=[0, 1])


@pytest.mark.parametrize("loss, reduction", [("mse_loss", "mean"), ("mse_loss", "none"), ("l1_loss", "sum"),
                                             ("l1_loss", "mean")])
def test_mse_and_l1_loss_match_torch(loss, reduction):
    match_torch(lambda x, y: getattr(x, loss)(y, reduction=reduction),
                lambda x, y: getattr(F, loss)(x, y, reduction=reduction), [randn(3, 4, 2), randn(3, 4, 2, seed=1)])


LOSSES = [
    ("cross_entropy", lambda: Tensor.ones(3, 4).cross_entropy(Tensor([0, 1, 2]), reduction="avg")),
    ("nll_loss", lambda: Tensor.ones(3, 4).nll_loss(Tensor([0, 1, 2]), reduction="avg")),
    ("binary_cross_entropy", lambda: Tensor.ones(3).binary_cross_entropy(Tensor.ones(3), reduction="avg")),
    ("binary_cross_entropy_with_logits",
     lambda: Tensor.ones(3).binary_cross_entropy_with_logits(Tensor.ones(3), reduction="avg")),
    ("mse_loss", lambda: Tensor.ones(3).mse_loss(Tensor.ones(3), reduction="avg")),
    ("l1_loss", lambda: Tensor.ones(3).l1_loss(Tensor.ones(3), reduction="avg")),
]


@pytest.mark.parametrize("name, call", LOSSES, ids=[c[0] for c in LOSSES])
def test_losses_reject_an_unknown_reduction(name, call):
    with pytest.raises(ValueError, match=f"{name}: reduction must be 'mean', 'sum' or 'none', got 'avg'"):
        call()


@pytest.mark.parametrize("logits, target, match", [
    ((3, 4), [0, 1], r"cross_entropy: target \(2,\) must have the input's shape without the class axis \(3,\) "
                     r"\(input \(3, 4\)\)"),
    ((2, 4, 5), [[0, 1, 2, 3, 0]], r"target \(1, 5\) must have the input's shape without the class axis \(2, 5\)"),
    ((3, 4), np.zeros((3, 5), np.float32), r"cross_entropy: probability target \(3, 5\) must match the input "
                                           r"\(3, 4\)"),
])
def test_cross_entropy_rejects_a_target_of_the_wrong_shape(logits, target, match):
    with pytest.raises(ShapeError, match=match):
        Tensor.ones(*logits).cross_entropy(Tensor(np.asarray(target)))


@pytest.mark.parametrize("op", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("target, kwargs, match", [
    ([0, 5, 1], {}, r"target 5 is out of bounds for 5 classes; targets must be in \[0, 5\) or ignore_index \(-100\)"),
    ([[0, -1], [2, 3]], {}, r"target -1 is out of bounds for 5 classes"),
    ([0, 2, 9], dict(ignore_index=2), r"target 9 is out of bounds for 5 classes; targets must be in \[0, 5\) or "
                                      r"ignore_index \(2\)"),
])
def test_losses_reject_a_class_index_out_of_range(op, target, kwargs, match):
    """torch raises IndexError for a target outside [0, classes) that is not ignore_index; so does ember when the
    target's values are known (a realized tensor) without running a kernel."""
    target = np.asarray(target)
    logits = Tensor(randn(*target.shape[:1], 5, *target.shape[1:]).astype(np.float32))
    with pytest.raises(IndexError, match=f"{op}: {match}"):
        getattr(logits, op)(Tensor(target), **kwargs)


def test_cross_entropy_skips_an_ignore_index_outside_the_classes():
    match_torch(lambda x, t: x.cross_entropy(t, ignore_index=7), lambda x, t: F.cross_entropy(x, t, ignore_index=7),
                [LOGITS[:3], np.array([0, 7, 4])], diff=[0])


# ---- linear, sequential, binary and sparse categorical crossentropy ------------------------------------------------


LINEAR_CASES = [  # (x shape, weight shape, ours, torch's): torch's F.linear takes weight (out, in), so it gets w.T
    ((4, 3), (3, 5), lambda x, w, b: x.linear(w, b), lambda x, w, b: F.linear(x, w.T, b)),
    ((2, 4, 3), (3, 5), lambda x, w, b: x.linear(w), lambda x, w, b: F.linear(x, w.T)),
    ((3,), (3, 2), lambda x, w, b: x.linear(w, b), lambda x, w, b: F.linear(x, w.T, b)),
    ((4, 3), (3,), lambda x, w, b: x.linear(w, b), lambda x, w, b: x * w + b),  # a 1-d weight scales elementwise
]


@pytest.mark.parametrize("x_shape, w_shape, ours, theirs", LINEAR_CASES)
def test_linear_is_x_at_weight_plus_bias_with_weight_in_by_out(x_shape, w_shape, ours, theirs):
    x, w, b = sample(x_shape, "float64", seed=1), sample(w_shape, "float64", seed=2), sample(w_shape[-1:], "float64")
    check(ours, theirs, [x, w, b], **REDUCE_TOL)
    match_torch_gradient(ours, theirs, x, w, b)


def test_linear_casts_to_dtype_and_rejects_mismatched_shapes():
    out = Tensor([[1, 2], [3, 4]]).linear(Tensor([[1, 2], [3, 4]]), Tensor([1, 2]), dtype="float32")
    assert out.dtype is dtypes.float32 and out.tolist() == [[8.0, 12.0], [16.0, 24.0]]
    with pytest.raises(ShapeError, match="matmul: inner dimensions differ"):
        Tensor.zeros(4, 3).linear(Tensor.zeros(4, 3))


def test_sequential_applies_the_callables_in_order():
    assert Tensor([1, 2, 3]).sequential([lambda x: x * 2, lambda x: x + 1]).tolist() == [3, 5, 7]
    assert Tensor([1, 2, 3]).sequential([lambda x: x + 1, lambda x: x * 2]).tolist() == [4, 6, 8]
    assert Tensor([1, 2]).sequential([]).tolist() == [1, 2]


PROBS = np.array([0.1, 0.9, 0.2, 0.0, 1.0, 0.5], dtype=np.float32)
BINARY = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 0.3], dtype=np.float32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy_is_torchs_bce(reduction):
    """p = 0 with y = 1 (and p = 1 with y = 0) give torch's clamped 100, not tinygrad's NaN."""
    check(lambda p, y: p.binary_crossentropy(y, reduction), lambda p, y: F.binary_cross_entropy(p, y,
                                                                                                reduction=reduction),
          [PROBS, BINARY], **REDUCE_TOL)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("has_pos_weight", [False, True])
def test_binary_crossentropy_logits_is_torchs_bce_with_logits(reduction, has_pos_weight):
    logits = np.array([[-1.0, 2.0, -3.0], [50.0, -50.0, 0.0]], np.float32)
    y = np.array([[0.0, 1.0, 0.0], [0.0, 1.0, 0.5]], np.float32)
    pw = np.array([2.0, 0.5, 3.0], np.float32)
    check(lambda x, y, w: x.binary_crossentropy_logits(y, reduction, pos_weight=w if has_pos_weight else None),
          lambda x, y, w: F.binary_cross_entropy_with_logits(x, y, reduction=reduction,
                                                             pos_weight=w if has_pos_weight else None),
          [logits, y, pw], **REDUCE_TOL)


def torch_sparse_ce(ignore_index: int, label_smoothing: float, reduction: str) -> Callable[..., torch.Tensor]:
    """torch's cross_entropy with the classes moved from the last axis to axis 1."""
    def oracle(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.movedim(-1, 1) if x.ndim > 2 else x
        return F.cross_entropy(x, y.long(), ignore_index=ignore_index, label_smoothing=label_smoothing,
                               reduction=reduction)
    return oracle


SPARSE_CASES = [((5, 4), [1, 2, -1, 0, 3], -1, 0.0, "mean"), ((5, 4), [1, 2, -1, 0, 3], -1, 0.1, "mean"),
                ((5, 4), [1, 2, 3, 0, 3], 3, 0.2, "sum"), ((5, 4), [1, 2, -1, 0, 3], -1, 0.0, "none"),
                ((2, 3, 4), [[0, 1, 2], [3, -1, 0]], -1, 0.3, "mean"), ((4,), 2, -1, 0.0, "mean")]


@pytest.mark.parametrize("shape, labels, ignore_index, smoothing, reduction", SPARSE_CASES)
def test_sparse_categorical_crossentropy_is_torchs_cross_entropy_with_classes_last(shape, labels, ignore_index,
                                                                                  smoothing, reduction):
    x, y = sample(shape, "float32"), np.array(labels, np.int32)
    check(lambda x, y: x.sparse_categorical_crossentropy(y, ignore_index, smoothing, reduction),
          torch_sparse_ce(ignore_index, smoothing, reduction), [x, y], **REDUCE_TOL)


def test_sparse_categorical_crossentropy_gradient_matches_torch():
    labels = [1, 2, -1, 0]
    match_torch_gradient(lambda x: x.sparse_categorical_crossentropy(Tensor(labels), label_smoothing=0.1),
                   lambda x: torch_sparse_ce(-1, 0.1, "mean")(x, torch.tensor(labels)), sample((4, 3), "float64"))


@pytest.mark.parametrize("call, error, match", [
    (lambda x: x.sparse_categorical_crossentropy(Tensor([0, 1]), label_smoothing=1.5), ValueError,
     r"sparse_categorical_crossentropy: label_smoothing must be in \[0, 1\], got 1.5"),
    (lambda x: x.sparse_categorical_crossentropy(Tensor([0.0, 1.0])), DTypeError,
     "sparse_categorical_crossentropy: labels must be integers, got float32"),
    (lambda x: x.sparse_categorical_crossentropy(Tensor([0, 7])), IndexError, "target 7 is out of bounds for 3"),
    (lambda x: x.sparse_categorical_crossentropy(Tensor([0, 1]), reduction="avg"), ValueError,
     "reduction must be 'mean', 'sum' or 'none'"),
    (lambda x: x.binary_crossentropy(Tensor.zeros(2, 3), reduction="avg"), ValueError,
     "binary_cross_entropy: reduction must be"),
])
def test_losses_reject_bad_arguments(call, error, match):
    with pytest.raises(error, match=match): call(Tensor.zeros(2, 3))


@pytest.mark.parametrize("size, stride, kernel", [(2, 1, 3), (4, 1, 3), (16, 2, 7), (9, 2, 1)])
def test_a_trained_convolution_of_narrow_or_strided_rows_matches_torch(size, stride, kernel):
    """Rows under 8 wide or a stride: conv2d with a weight that wants a gradient is a matmul of its windows (im2col,
    rows padded to 16); its value and both gradients equal torch's."""
    rng = np.random.default_rng(size * stride)
    x = rng.standard_normal((3, 5, size, size)).astype(np.float32)
    w = (rng.standard_normal((6, 5, kernel, kernel)) / kernel).astype(np.float32)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    want = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=kernel // 2)
    (want * want).sum().backward()
    ex, ew = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    got = ex.conv2d(ew, stride=stride, padding=kernel // 2)
    (got * got).sum().backward()
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ew.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, kwargs", [
    ((2, 4, 12, 11), (6, 4, 3, 3), dict(padding=1)),
    ((2, 4, 13, 12), (6, 2, 3, 3), dict(groups=2, stride=2, padding=1)),  # grouped and strided: the direct form
    ((1, 3, 12, 14), (4, 3, 2, 3), dict(padding="same", dilation=2)),  # uneven padding, dilated
    ((2, 3, 11, 12), (5, 3, 3, 2), dict(padding=(0, 2), stride=(3, 1))),  # rows the stride never reads
    ((2, 3, 20), (4, 3, 5), dict(padding=2)),  # 1-d
    ((1, 2, 9, 8, 10), (3, 2, 3, 2, 3), dict(padding=1)),  # 3-d
])
def test_conv_gradients_match_torch(x_shape, w_shape, kwargs):
    """A direct convolution's gradients (a transposed convolution for the input, a correlation for the weight;
    mixin/nn.py ConvGradient) equal torch's, and differentiate again (the input gradient's own gradient)."""
    rng = np.random.default_rng(sum(x_shape))
    x, w = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32)
    F = torch.nn.functional
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(x_shape) - 2]
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    want = conv(tx, tw, **kwargs)
    g = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    want_gx, want_gw = torch.autograd.grad(want, (tx, tw), torch.tensor(g), create_graph=True)
    want_ggw, = torch.autograd.grad((want_gx * want_gx).sum(), tw)
    ex, ew = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    got = ex.conv2d(ew, **kwargs)
    gx, gw = got.gradient(ex, ew, gradient=Tensor(g))
    ggw, = (gx * gx).sum().gradient(ew)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx.numpy(), want_gx.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gw.numpy(), want_gw.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ggw.numpy(), want_ggw.numpy(), rtol=1e-4, atol=1e-3)


def test_conv_input_gradient_is_one_kernel_without_the_windows():
    """The input gradient is a convolution of the output's gradient: no buffer of the windows' gradient (k^2 times
    the input) is stored, and half inputs accumulate in float as the forward does."""
    x = Tensor(np.ones((2, 8, 16, 16), np.float16), requires_grad=True)
    w = Tensor(np.ones((8, 8, 3, 3), np.float16), requires_grad=True)
    gx, = x.conv2d(w, padding=1).sum().gradient(x)
    assert max(b.size for item in gx.schedule() for b in item.bufs) < 9 * x.numel()
    np.testing.assert_array_equal(gx.numpy(), torch.nn.functional.conv_transpose2d(
        torch.ones(2, 8, 16, 16), torch.ones(8, 8, 3, 3), padding=1).numpy().astype(np.float16))


def split_ties_max_pool_gradient(x: np.ndarray, g: np.ndarray, k: int, s: int, p: int) -> np.ndarray:
    """numpy: each window's gradient to its maxima, split evenly among ties (ember's rule for max)."""
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
    out = np.zeros_like(xp)
    for i in range(g.shape[2]):
        for j in range(g.shape[3]):
            window = xp[:, :, i * s:i * s + k, j * s:j * s + k]
            is_max = window == window.max(axis=(2, 3), keepdims=True)
            out[:, :, i * s:i * s + k, j * s:j * s + k] += is_max * (g[:, :, i:i + 1, j:j + 1] /
                                                                     is_max.sum(axis=(2, 3), keepdims=True))
    return out[:, :, p:p + x.shape[2], p:p + x.shape[3]]


@pytest.mark.parametrize("shape, kwargs", [
    ((2, 3, 9, 11), dict(kernel_size=3, stride=2, padding=1)),  # ResNet's stem pool
    ((1, 2, 10, 9), dict(kernel_size=3, stride=1)),
    ((1, 2, 11, 10), dict(kernel_size=(3, 2), stride=(2, 1), dilation=(2, 1))),
    ((2, 2, 9, 9), dict(kernel_size=3, stride=2, ceil_mode=True)),
    ((2, 3, 13), dict(kernel_size=(4,), stride=(3,), padding=2)),  # 1-d: a kernel of one axis
])
def test_overlapping_max_pool_gradient_matches_torch(shape, kwargs):
    """Windows that overlap pull their gradient back as one sum over the window's offsets (mixin/nn.py
    MaxPoolGradient): against torch where no window has ties, and against the split-ties rule in numpy where all
    do (a pool of zeros after a relu); the second derivative of its square's sum against torch's."""
    rng = np.random.default_rng(len(shape))
    x_np = rng.standard_normal(shape).astype(np.float32)
    pool = torch.nn.functional.max_pool1d if len(shape) == 3 else torch.nn.functional.max_pool2d
    ex, tx = Tensor(x_np, requires_grad=True), torch.tensor(x_np, requires_grad=True)
    got, want = ex.max_pool2d(**kwargs), pool(tx, **kwargs)
    g = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    gx, = got.gradient(ex, gradient=Tensor(g))
    tgx, = torch.autograd.grad(want, tx, torch.tensor(g))
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    np.testing.assert_allclose(gx.numpy(), tgx.numpy(), rtol=1e-6, atol=1e-6)
    ggx, = (ex * ex).max_pool2d(**kwargs).square().sum().gradient(ex)
    tggx, = torch.autograd.grad(pool(tx * tx, **kwargs).square().sum(), tx)
    np.testing.assert_allclose(ggx.numpy(), tggx.numpy(), rtol=1e-5, atol=1e-5)


def test_overlapping_max_pool_gradient_splits_ties():
    zeros = np.zeros((1, 2, 7, 7), np.float32)
    g = np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)
    x = Tensor(zeros, requires_grad=True)
    gx, = x.max_pool2d(3, 2, padding=1).gradient(x, gradient=Tensor(g))
    np.testing.assert_allclose(gx.numpy(), split_ties_max_pool_gradient(zeros, g, 3, 2, 1), rtol=1e-6, atol=1e-7)
