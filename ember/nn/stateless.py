"""Layers without tensors: activations, pooling, Flatten and Identity as modules, for Sequential and torch ports.

Each holds only its options and calls the Tensor method of the same meaning. `inplace` is accepted where torch
has it and ignored: ember tensors are values, an op never overwrites its input.

>>> from ember import Tensor
>>> Flatten()(Tensor.ones(2, 3, 4)).shape
(2, 12)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ember.nn.module import Module
from ember.tensor import Tensor

IntOrTuple = int | Sequence[int]


class Identity(Module):
    """Returns its input; takes and ignores any constructor arguments, as torch.nn.Identity."""

    def __init__(self, *args: Any, **kwargs: Any) -> None: pass

    def __call__(self, x: Tensor) -> Tensor: return x


class ReLU(Module):
    """max(x, 0)."""

    def __init__(self, inplace: bool = False) -> None: pass

    def __call__(self, x: Tensor) -> Tensor: return x.relu()


class GELU(Module):
    """x * Phi(x), exact (approximate='none') or with torch's tanh approximation."""

    def __init__(self, approximate: str = "none") -> None:
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def __call__(self, x: Tensor) -> Tensor: return x.gelu(self.approximate)


class Sigmoid(Module):
    """1 / (1 + exp(-x))."""

    def __call__(self, x: Tensor) -> Tensor: return x.sigmoid()


class Tanh(Module):
    """tanh(x)."""

    def __call__(self, x: Tensor) -> Tensor: return x.tanh()


class SiLU(Module):
    """x * sigmoid(x)."""

    def __init__(self, inplace: bool = False) -> None: pass

    def __call__(self, x: Tensor) -> Tensor: return x.silu()


class Softmax(Module):
    """softmax along `dim`. torch guesses the axis when dim is None (and warns); ember asks for it."""

    def __init__(self, dim: int) -> None: self.dim = dim

    def __call__(self, x: Tensor) -> Tensor: return x.softmax(self.dim)


class Flatten(Module):
    """Axes start_dim..end_dim merged into one; the batch axis is kept by default, as torch.nn.Flatten."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None: self.start_dim, self.end_dim = start_dim, end_dim

    def __call__(self, x: Tensor) -> Tensor: return x.flatten(self.start_dim, self.end_dim)


class MaxPool2d(Module):
    """Tensor.max_pool2d as a module, with torch.nn.MaxPool2d's argument order; stride defaults to kernel_size."""

    def __init__(self, kernel_size: IntOrTuple, stride: IntOrTuple | None = None, padding: IntOrTuple = 0,
                 dilation: IntOrTuple = 1, return_indices: bool = False, ceil_mode: bool = False) -> None:
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def __call__(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        return x.max_pool2d(self.kernel_size, self.stride, self.dilation, self.padding, self.ceil_mode,
                            self.return_indices)


class AvgPool2d(Module):
    """Tensor.avg_pool2d as a module, with torch.nn.AvgPool2d's argument order (no divisor_override)."""

    def __init__(self, kernel_size: IntOrTuple, stride: IntOrTuple | None = None, padding: IntOrTuple = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> None:
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def __call__(self, x: Tensor) -> Tensor:
        return x.avg_pool2d(self.kernel_size, self.stride, 1, self.padding, self.ceil_mode,
                            self.count_include_pad)


class MaxUnpool2d(Module):
    """Tensor.max_unpool2d as a module: (pooled values, their indices) back to the pooled input's shape."""

    def __init__(self, kernel_size: IntOrTuple, stride: IntOrTuple | None = None, padding: IntOrTuple = 0) -> None:
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def __call__(self, x: Tensor, indices: Tensor, output_size: Sequence[int] | None = None) -> Tensor:
        return x.max_unpool2d(indices, self.kernel_size, self.stride, 1, self.padding, output_size)


__all__ = ["Identity", "ReLU", "GELU", "Sigmoid", "Tanh", "SiLU", "Softmax", "Flatten", "MaxPool2d", "AvgPool2d",
           "MaxUnpool2d"]
