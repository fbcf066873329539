"""Neural-network layers with torch's constructor arguments and default initialization.

A layer is a plain class: its parameters are Tensor attributes (found by `ember.nn.state.get_parameters` and named
by `get_state_dict` as torch names them: "weight", "bias", "running_mean", ...), and calling it applies it. There is
no Module base class: any object holding layers in attributes, lists or dicts is a model.

Initialization draws from ember's generator (`Tensor.manual_seed`), so the values differ from torch's, but the
distributions are torch's: Linear and Conv weights and biases uniform in ±1/sqrt(fan_in) (what torch's
kaiming_uniform with a=sqrt(5) reduces to), norms' weights ones and biases zeros, Embedding normal(0, 1).

>>> from ember import Tensor
>>> layer = Linear(3, 2)
>>> layer(Tensor.ones(4, 3)).shape
(4, 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ember.dtype import dtypes
from ember.errors import ShapeError
from ember.tensor import Tensor

IntOrTuple = int | Sequence[int]


def _tuple(value: IntOrTuple, n: int) -> tuple[int, ...]:
    return (value,) * n if isinstance(value, int) else tuple(value)


def _uniform_fan_in(shape: tuple[int, ...], fan_in: int) -> Tensor:
    """Uniform in ±1/sqrt(fan_in): torch's default for Linear and Conv weights (kaiming_uniform, a=sqrt(5)) and
    their biases."""
    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return Tensor.uniform(*shape, low=-bound, high=bound)


class Linear:
    """y = x @ weight.T + bias, with weight of shape (out_features, in_features) as in torch."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        self.weight = _uniform_fan_in((out_features, in_features), in_features)
        self.bias = _uniform_fan_in((out_features,), in_features) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        out = x @ self.weight.T
        return out if self.bias is None else out + self.bias


class _ConvNd:
    """Shared construction of Conv1d and Conv2d: weight (out, in/groups, *kernel_size), bias (out,)."""

    dims = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
                 padding: IntOrTuple | str = 0, dilation: IntOrTuple = 1, groups: int = 1, bias: bool = True) -> None:
        name = type(self).__name__
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                             f"divisible by groups ({groups})")
        if isinstance(padding, str) and padding not in ("same", "valid"):
            raise ValueError(f"{name}: padding '{padding}' is not one of 'same', 'valid', an int or a tuple")
        self.kernel_size = _tuple(kernel_size, self.dims)
        self.stride, self.dilation, self.groups = _tuple(stride, self.dims), _tuple(dilation, self.dims), groups
        self.padding = 0 if padding == "valid" else padding if isinstance(padding, str) else _tuple(padding, self.dims)
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        self.weight = _uniform_fan_in((out_channels, in_channels // groups, *self.kernel_size), fan_in)
        self.bias = _uniform_fan_in((out_channels,), fan_in) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation,
                        padding=self.padding)


class Conv1d(_ConvNd):
    """1-d convolution over (N, C, L) inputs, as torch.nn.Conv1d."""

    dims = 1


class Conv2d(_ConvNd):
    """2-d convolution over (N, C, H, W) inputs, as torch.nn.Conv2d."""

    dims = 2


class ConvTranspose2d:
    """The transpose (gradient) of a 2-d convolution, as torch.nn.ConvTranspose2d: weight (in, out/groups, kh, kw).

    torch takes fan_in from the weight's second axis, out_channels/groups times the kernel size; so do we."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
                 padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1,
                 bias: bool = True) -> None:
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"ConvTranspose2d: in_channels ({in_channels}) and out_channels ({out_channels}) must "
                             f"both be divisible by groups ({groups})")
        self.kernel_size = _tuple(kernel_size, 2)
        self.stride, self.padding, self.dilation = _tuple(stride, 2), _tuple(padding, 2), _tuple(dilation, 2)
        self.output_padding, self.groups = _tuple(output_padding, 2), groups
        fan_in = out_channels // groups * math.prod(self.kernel_size)
        self.weight = _uniform_fan_in((in_channels, out_channels // groups, *self.kernel_size), fan_in)
        self.bias = _uniform_fan_in((out_channels,), fan_in) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(self.weight, self.bias, groups=self.groups, stride=self.stride,
                                  dilation=self.dilation, padding=self.padding, output_padding=self.output_padding)


def _buffer(t: Tensor) -> Tensor:
    """A state tensor that is saved and loaded with the parameters but never trained."""
    return t.requires_grad_(False)


class BatchNorm:
    """Batch normalization over axis 1 of (N, C, ...) inputs, as torch's BatchNorm1d/2d/3d.

    In training (`Tensor.training`) it normalizes with the batch's mean and biased variance and moves the running
    statistics toward the batch's mean and unbiased variance by `momentum` (or by 1/num_batches_tracked, a
    cumulative average, when momentum is None). In eval it normalizes with the running statistics. The running
    statistics are updated with `assign`, lazily: an optimizer given `get_parameters(model)` realizes them with its
    step; otherwise realize them yourself."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True,
                 momentum: float | None = 0.1) -> None:
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = Tensor.ones(num_features) if affine else None
        self.bias = Tensor.zeros(num_features) if affine else None
        self.track_running_stats = track_running_stats
        if track_running_stats:
            self.running_mean = _buffer(Tensor.zeros(num_features))
            self.running_var = _buffer(Tensor.ones(num_features))
            self.num_batches_tracked = _buffer(Tensor.zeros((), dtype=dtypes.int64))

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_features:
            raise ShapeError(f"BatchNorm: expected input of shape (N, {self.num_features}, ...), got {x.shape}")
        axes = tuple(a for a in range(x.ndim) if a != 1)
        if Tensor.training or not self.track_running_stats:
            mean = x.mean(axes)
            var = (x - mean.reshape(1, -1, *(1,) * (x.ndim - 2))).square().mean(axes)
            if Tensor.training and self.track_running_stats: self._update_running_stats(x, mean, var)
        else:
            mean, var = self.running_mean, self.running_var
        return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())

    def _update_running_stats(self, x: Tensor, mean: Tensor, var: Tensor) -> None:
        n = x.numel() // x.shape[1]
        unbiased = var.detach() * (n / max(n - 1, 1))  # torch divides by n-1 here, by n when normalizing
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        factor = self.momentum if self.momentum is not None else 1 / self.num_batches_tracked.cast(mean.dtype)
        self.running_mean.assign(self.running_mean * (1 - factor) + mean.detach() * factor)
        self.running_var.assign(self.running_var * (1 - factor) + unbiased * factor)


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class LayerNorm:
    """Normalization over the last len(normalized_shape) axes, then weight * x + bias, as torch.nn.LayerNorm."""

    def __init__(self, normalized_shape: IntOrTuple, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True) -> None:
        self.normalized_shape, self.eps = _tuple(normalized_shape, 1), eps
        self.weight = Tensor.ones(*self.normalized_shape) if elementwise_affine else None
        self.bias = Tensor.zeros(*self.normalized_shape) if elementwise_affine and bias else None

    def __call__(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        if x.shape[x.ndim - n:] != self.normalized_shape:
            raise ShapeError(f"LayerNorm: the last axes of {x.shape} must be {self.normalized_shape}")
        out = x.layernorm(axis=tuple(range(-n, 0)), eps=self.eps)
        if self.weight is not None: out = out * self.weight
        return out if self.bias is None else out + self.bias


class GroupNorm:
    """Normalization over groups of channels (each sample, each group of num_channels/num_groups channels and all
    positions together), then a per-channel affine, as torch.nn.GroupNorm."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        if num_channels % num_groups:
            raise ShapeError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups "
                             f"({num_groups})")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Tensor.ones(num_channels) if affine else None
        self.bias = Tensor.zeros(num_channels) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ShapeError(f"GroupNorm: expected input of shape (N, {self.num_channels}, ...), got {x.shape}")
        out = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
        if self.weight is None or self.bias is None: return out
        channel = (1, -1, *(1,) * (x.ndim - 2))
        return out * self.weight.reshape(channel) + self.bias.reshape(channel)


class RMSNorm:
    """x / sqrt(mean(x^2) + eps) * weight over the last len(dim) axes, as torch.nn.RMSNorm.

    Half-precision inputs are normalized in float32 and rounded back once, as torch does."""

    def __init__(self, dim: IntOrTuple, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        self.normalized_shape, self.eps = _tuple(dim, 1), eps
        self.weight = Tensor.ones(*self.normalized_shape) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        if x.shape[x.ndim - n:] != self.normalized_shape:
            raise ShapeError(f"RMSNorm: the last axes of {x.shape} must be {self.normalized_shape}")
        wide = x.cast(dtypes.float32) if x.dtype.itemsize < 4 else x
        out = wide * (wide.square().mean(tuple(range(-n, 0)), keepdim=True) + self.eps).rsqrt()
        if self.weight is not None: out = out * self.weight
        return out.cast(x.dtype)


class Embedding:
    """Row idx of weight for every index: (…) int tensor -> (…, embed_size), as torch.nn.Embedding.

    The lookup is a one-hot matrix product, so its gradient is an ordinary matmul too."""

    def __init__(self, vocab_size: int, embed_size: int) -> None:
        self.vocab_size, self.embed_size = vocab_size, embed_size
        self.weight = Tensor.normal(vocab_size, embed_size, mean=0.0, std=1.0)

    def __call__(self, idx: Tensor) -> Tensor:
        if not idx.dtype.is_int: raise ShapeError(f"Embedding: indices must be integers, got {idx.dtype.name}")
        return idx.one_hot(self.vocab_size).cast(self.weight.dtype) @ self.weight


class Dropout:
    """Zeroes each element with probability p and scales the rest by 1/(1-p) in training; identity in eval."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0 <= p <= 1: raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def __call__(self, x: Tensor) -> Tensor: return x.dropout(self.p)


__all__ = ["Linear", "Conv1d", "Conv2d", "ConvTranspose2d", "BatchNorm", "BatchNorm1d", "BatchNorm2d",
           "BatchNorm3d", "LayerNorm", "GroupNorm", "RMSNorm", "Embedding", "Dropout"]
