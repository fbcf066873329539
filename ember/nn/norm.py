"""Normalization layers: BatchNorm, InstanceNorm, LayerNorm, GroupNorm, RMSNorm, as torch.nn's.

Weights are ones and biases zeros at construction, as torch; running statistics are buffers (requires_grad False,
see ember.nn.module.Module) that the layer updates with `assign` while training.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.dtype import dtypes
from ember.errors import ShapeError
from ember.nn.layers import IntOrTuple, _tuple
from ember.nn.module import Module, defer_realize
from ember.tensor import Tensor


def _buffer(t: Tensor) -> Tensor:
    """A state tensor that is saved and loaded with the parameters but never trained."""
    return t.requires_grad_(False)


def init_norm(module: Module, num_features: int, eps: float, momentum: float | None, affine: bool,
              track_running_stats: bool) -> None:
    """What BatchNorm and InstanceNorm hold, as torch names it: weight and bias when affine, and with
    track_running_stats the running-statistics buffers (left out of parameters())."""
    module.num_features, module.eps, module.momentum = num_features, eps, momentum
    module.weight = Tensor.ones(num_features) if affine else None
    module.bias = Tensor.zeros(num_features) if affine else None
    module.track_running_stats = track_running_stats
    if track_running_stats:
        module.running_mean = _buffer(Tensor.zeros(num_features))
        module.running_var = _buffer(Tensor.ones(num_features))
        module.num_batches_tracked = _buffer(Tensor.zeros((), dtype=dtypes.int64))


@dataclass(frozen=True)
class BatchNormGradient:
    """The gradients of batch normalization with the batch's own statistics (Tensor.custom_vjp's pull), in the
    closed form: with xhat = (x - mean) * invstd and sums over the normalized axes, dx = weight * invstd *
    (g - (sum g + xhat * sum g xhat) / n), dweight = sum g xhat, dbias = sum g. Composition would pull g back
    through the variance and the mean separately, a pass over x for each; here two sums and one elementwise
    kernel. The statistics get no gradient of their own: dx accounts for them."""

    axes: tuple[int, ...]
    has_weight: bool

    def __call__(self, g: Tensor, x: Tensor, mean: Tensor, invstd: Tensor, *affine: Tensor) -> tuple:
        shape = tuple(s if i not in self.axes else 1 for i, s in enumerate(x.shape))
        xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
        g_sum, gx_sum = g.sum(self.axes), (g * xhat).sum(self.axes)
        n = x.numel() // x.shape[1]
        scale = affine[0] * invstd if self.has_weight else invstd
        dx = scale.reshape(shape) * (g - (g_sum.reshape(shape) + xhat * gx_sum.reshape(shape)) * (1 / n))
        params = (gx_sum, g_sum) if self.has_weight else (g_sum,)
        return (dx, None, None, *params[:len(affine)])


class BatchNorm(Module):
    """Batch normalization over axis 1 of (N, C, ...) inputs, as torch's BatchNorm1d/2d/3d.

    In training (the module's `training` flag, or `with Tensor.train()`: see ember.nn.module) it normalizes with the
    batch's mean and biased variance and moves the running statistics toward the batch's mean and unbiased variance
    by `momentum` (or by 1/num_batches_tracked, a cumulative average, when momentum is None). After eval() it
    normalizes with the running statistics. The running statistics are updated with `assign`, lazily; the next
    optimizer step realizes them (whatever tensors that optimizer was given); without one, realize them yourself."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True,
                 momentum: float | None = 0.1) -> None:
        init_norm(self, num_features, eps, momentum, affine, track_running_stats)

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_features:
            raise ShapeError(f"BatchNorm: expected input of shape (N, {self.num_features}, ...), got {x.shape}")
        axes = tuple(a for a in range(x.ndim) if a != 1)
        training = self.is_training
        if training or not self.track_running_stats:
            mean = x.mean(axes)
            var = (x - mean.reshape(1, -1, *(1,) * (x.ndim - 2))).square().mean(axes)
            if training and self.track_running_stats: self._update_running_stats(x, mean, var)
        else:
            mean, var = self.running_mean, self.running_var
        invstd = (var + self.eps).rsqrt()
        out = x.batchnorm(self.weight, self.bias, mean, invstd)
        if not (training or not self.track_running_stats): return out
        affine = tuple(t for t in (self.weight, self.bias) if t is not None)
        return out.custom_vjp((x, mean, invstd, *affine), BatchNormGradient(axes, self.weight is not None))

    def _update_running_stats(self, x: Tensor, mean: Tensor, var: Tensor) -> None:
        n = x.numel() // x.shape[1]
        unbiased = var.detach() * (n / max(n - 1, 1))  # torch divides by n-1 here, by n when normalizing
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        factor = self.momentum if self.momentum is not None else 1 / self.num_batches_tracked.cast(mean.dtype)
        self.running_mean.assign(self.running_mean * (1 - factor) + mean.detach() * factor)
        self.running_var.assign(self.running_var * (1 - factor) + unbiased * factor)
        defer_realize(self.running_mean, self.running_var, self.num_batches_tracked)


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class _InstanceNorm(Module):
    """Normalization of each sample's each channel over its positions, as torch's InstanceNorm1d/2d: defaults
    affine=False and track_running_stats=False, unlike BatchNorm.

    With track_running_stats, training moves the running statistics toward the batch average of the instance means
    and unbiased variances by `momentum` (momentum None leaves them as they are, as torch), and eval() normalizes
    with them. num_batches_tracked is kept for torch's state-dict names; torch never counts it up here either."""

    dims = 1

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                 track_running_stats: bool = False) -> None:
        init_norm(self, num_features, eps, momentum, affine, track_running_stats)

    def __call__(self, x: Tensor) -> Tensor:
        name, n = type(self).__name__, self.dims
        if x.ndim == n + 1: return self(x.unsqueeze(0))[0]  # unbatched (C, *spatial)
        if x.ndim != n + 2:
            raise ShapeError(f"{name}: expected a {n + 1}-d unbatched or {n + 2}-d batched input (N, C, "
                             f"then {n} spatial axes), got {x.shape}")
        if (self.weight is not None or self.track_running_stats) and x.shape[1] != self.num_features:
            raise ShapeError(f"{name}: expected input of shape (N, {self.num_features}, ...), got {x.shape}")
        axes = tuple(range(2, x.ndim))
        channel = (1, -1) + (1,) * n
        if self.is_training or not self.track_running_stats:
            mean = x.mean(axes, keepdim=True)
            var = (x - mean).square().mean(axes, keepdim=True)
            if self.track_running_stats and self.momentum: self._update_running_stats(x, mean, var, self.momentum)
        else:
            mean, var = self.running_mean.reshape(channel), self.running_var.reshape(channel)
        out = (x - mean) * (var + self.eps).rsqrt()
        if self.weight is None or self.bias is None: return out
        return out * self.weight.reshape(channel) + self.bias.reshape(channel)

    def _update_running_stats(self, x: Tensor, mean: Tensor, var: Tensor, factor: float) -> None:
        positions = x.numel() // (x.shape[0] * x.shape[1])
        unbiased = var.detach() * (positions / max(positions - 1, 1))
        batch_mean, batch_var = mean.detach().mean((0, *range(2, x.ndim))), unbiased.mean((0, *range(2, x.ndim)))
        self.running_mean.assign(self.running_mean * (1 - factor) + batch_mean * factor)
        self.running_var.assign(self.running_var * (1 - factor) + batch_var * factor)
        defer_realize(self.running_mean, self.running_var)


class InstanceNorm1d(_InstanceNorm):
    """Instance normalization of (N, C, L) or (C, L) inputs, as torch.nn.InstanceNorm1d."""

    dims = 1


class InstanceNorm2d(_InstanceNorm):
    """Instance normalization of (N, C, H, W) or (C, H, W) inputs, as torch.nn.InstanceNorm2d."""

    dims = 2


class LayerNorm(Module):
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


class GroupNorm(Module):
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


class RMSNorm(Module):
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


__all__ = ["BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "LayerNorm",
           "GroupNorm", "RMSNorm"]
