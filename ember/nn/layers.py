"""Layers with weights that are not normalizations: Linear, convolutions and their transposes, Embedding; and Dropout.

Constructor arguments, weight shapes and attribute names are torch's, so torch's state dicts load by name.
Initialization draws from ember's generator with torch's distributions (see ember.nn).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ember.errors import ShapeError
from ember.mixin.indexing import check_index_range
from ember.nn.module import Module
from ember.tensor import Tensor

IntOrTuple = int | Sequence[int]


def _tuple(value: IntOrTuple, n: int) -> tuple[int, ...]:
    return (value,) * n if isinstance(value, int) else tuple(value)


def _uniform_fan_in(shape: tuple[int, ...], fan_in: int) -> Tensor:
    """Uniform in ±1/sqrt(fan_in): torch's default for Linear and Conv weights (kaiming_uniform, a=sqrt(5)) and
    their biases, and for every LSTM weight (with fan_in the hidden size)."""
    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return Tensor.uniform(*shape, low=-bound, high=bound)


class Linear(Module):
    """y = x @ weight.T + bias, with weight of shape (out_features, in_features) as in torch."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        self.weight = _uniform_fan_in((out_features, in_features), in_features)
        self.bias = _uniform_fan_in((out_features,), in_features) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        out = x @ self.weight.T
        return out if self.bias is None else out + self.bias


class _ConvNd(Module):
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
        if padding == "same" and any(s != 1 for s in self.stride):  # torch's message, at construction as torch
            raise ValueError(f"{name}: padding='same' is not supported for strided convolutions (stride "
                             f"{self.stride}); use stride 1 or give the padding explicitly")
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


class _ConvTransposeNd(Module):
    """The transpose (gradient) of a convolution, as torch's ConvTranspose1d/2d: weight (in, out/groups, *kernel).

    torch takes fan_in from the weight's second axis, out_channels/groups times the kernel size; so do we."""

    dims = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
                 padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, groups: int = 1, bias: bool = True,
                 dilation: IntOrTuple = 1) -> None:
        n = self.dims
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"{type(self).__name__}: in_channels ({in_channels}) and out_channels ({out_channels}) "
                             f"must both be divisible by groups ({groups})")
        self.kernel_size = _tuple(kernel_size, n)
        self.stride, self.padding, self.dilation = _tuple(stride, n), _tuple(padding, n), _tuple(dilation, n)
        self.output_padding, self.groups = _tuple(output_padding, n), groups
        fan_in = out_channels // groups * math.prod(self.kernel_size)
        self.weight = _uniform_fan_in((in_channels, out_channels // groups, *self.kernel_size), fan_in)
        self.bias = _uniform_fan_in((out_channels,), fan_in) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(self.weight, self.bias, groups=self.groups, stride=self.stride,
                                  dilation=self.dilation, padding=self.padding, output_padding=self.output_padding)


class ConvTranspose1d(_ConvTransposeNd):
    """Transposed 1-d convolution over (N, C, L) inputs, as torch.nn.ConvTranspose1d."""

    dims = 1


class ConvTranspose2d(_ConvTransposeNd):
    """Transposed 2-d convolution over (N, C, H, W) inputs, as torch.nn.ConvTranspose2d."""

    dims = 2


class Embedding(Module):
    """Row idx of weight for every index: (…) int tensor -> (…, embed_size), as torch.nn.Embedding.

    The lookup reads one row per index (a gather, linear in the indices), and its gradient adds each index's
    gradient row into the row it read (a scatter-add, linear too): a one-hot matrix product would cost indices x
    vocab_size x embed_size both ways."""

    def __init__(self, vocab_size: int, embed_size: int) -> None:
        self.vocab_size, self.embed_size = vocab_size, embed_size
        self.weight = Tensor.normal(vocab_size, embed_size, mean=0.0, std=1.0)

    def __call__(self, idx: Tensor) -> Tensor:
        if not idx.dtype.is_int: raise ShapeError(f"Embedding: indices must be integers, got {idx.dtype.name}")
        check_index_range("Embedding", idx, self.vocab_size)  # torch takes no negative index here
        return self.weight[idx]


class Dropout(Module):
    """Zeroes each element with probability p and scales the rest by 1/(1-p) while training (see Module); identity
    after eval()."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0 <= p <= 1: raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def __call__(self, x: Tensor) -> Tensor:
        if not self.is_training: return x
        with Tensor.train(): return x.dropout(self.p)  # the functional op reads the global flag


__all__ = ["Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "Embedding", "Dropout"]
