"""Neural-network functional ops: convolutions, pooling, resampling, normalization, attention, losses, dropout.

All are compositions of movement, elementwise and reduce ops, so they fuse like any other graph and their
gradients come from the primitive rules. The core is `_pool`, which turns the last spatial axes into
(output positions, kernel offsets) with movement ops only: a convolution is then a broadcast multiply and a sum, a
pool a max or a mean over the kernel axes.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ember.dtype import DType, dtypes, least_upper_dtype
from ember.errors import ArgumentError, AxisError, DTypeError, ModeError, ShapeError
from ember.helpers import prod
from ember.mixin.indexing import index_values

if TYPE_CHECKING:
    from ember.tensor import Tensor

IntOrTuple = int | Sequence[int]


def _tuple(v: IntOrTuple, n: int, what: str, op: str) -> tuple[int, ...]:
    out = (v,) * n if isinstance(v, int) else tuple(v)
    if len(out) != n: raise ShapeError(f"{op}: {what} {v} needs {n} values, one per spatial axis")
    return out


def _positive(v: IntOrTuple, n: int, what: str, op: str) -> tuple[int, ...]:
    """_tuple, checked to be at least 1 on every axis: a zero stride or kernel would divide by zero later."""
    out = _tuple(v, n, what, op)
    if any(x < 1 for x in out):  # ArgumentError is a ValueError and the RuntimeError torch raises here
        raise ArgumentError(f"{op}: {what} must be positive on every axis, got {v}; give integers >= 1")
    return out


def _padding_pairs(padding: IntOrTuple | str, kernel: tuple[int, ...], dilation: tuple[int, ...],
                   op: str) -> list[tuple[int, int]]:
    """(before, after) per spatial axis from an int, one int per axis, flat torch pairs, 'valid' or 'same'."""
    n = len(kernel)
    if padding == "valid": return [(0, 0)] * n
    if padding == "same":  # the extra element of an odd total goes after, as torch
        totals = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
        return [(t // 2, t - t // 2) for t in totals]
    if isinstance(padding, str): raise ValueError(f"{op}: padding must be an int, a tuple, 'same' or 'valid'")
    if isinstance(padding, int): return [(padding, padding)] * n
    pads = tuple(padding)
    if len(pads) == n: return [(p, p) for p in pads]
    if len(pads) == 2 * n: return [(pads[2 * i], pads[2 * i + 1]) for i in reversed(range(n))]  # torch: last axis first
    raise ShapeError(f"{op}: padding {padding} needs {n} or {2 * n} values for {n} spatial axes")


def _pool(x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
    """(..., *spatial) -> (..., *out, *kernel): out[o..., k...] = x[o * stride + k * dilation] on each axis.

    One axis at a time, with movement ops only. Windows that do not overlap (d = 1, s >= k) are rows of s cut to k;
    otherwise x tiled e times and cut into k rows of i + d elements puts x[(k * d + c) mod i] at row k, column c,
    so column c = o * s holds x[o * s + k * d]."""
    n = len(kernel)
    lead = x.ndim - n
    for ax, (k, s, d) in enumerate(zip(kernel, stride, dilation, strict=True)):
        # layout: (lead..., o_0..o_{ax-1}, i_ax..i_{n-1}, k_0..k_{ax-1}); pool i_ax as the last axis
        axis = lead + ax
        x = x.permute([a for a in range(x.ndim) if a != axis] + [axis])
        i = x.shape[-1]
        o = (i - d * (k - 1) - 1) // s + 1
        if o * s > i: x = x.pad([(0, 0)] * (x.ndim - 1) + [(0, o * s - i)]); i = o * s  # never read by a window
        if d == 1 and s >= k:  # (a 2 x 2 pool; its gradient is a pad, with no sum over tiled copies)
            x = x[..., :o * s].reshape(x.shape[:-1] + (o, s))[..., :k].transpose(-1, -2)  # (..., k_ax, o_ax)
        else:
            e = -(-k * (i + d) // i)
            x = x.unsqueeze(-2).expand(x.shape[:-1] + (e, i)).reshape(x.shape[:-1] + (e * i,))
            x = x[..., :k * (i + d)].reshape(x.shape[:-1] + (k, i + d))[..., :o * s]
            x = x.reshape(x.shape[:-1] + (o, s))[..., 0]  # (..., k_ax, o_ax)
        m = x.ndim
        x = x.permute(list(range(axis)) + [m - 1] + list(range(axis, m - 1)))
    return x


def _spread(x: Tensor, stride: Sequence[int]) -> Tensor:
    """x's last len(stride) axes with s - 1 zeros between neighbours: where a stride's windows start, laid back out
    at the input's spacing (a transposed convolution's input, a strided gradient)."""
    for ax, s in enumerate(stride):
        if s == 1: continue
        axis = x.ndim - len(stride) + ax
        o = x.shape[axis]
        x = x.unsqueeze(axis + 1).pad([(0, 0)] * (axis + 1) + [(0, s - 1)] + [(0, 0)] * (x.ndim - axis - 1))
        x = x.reshape(x.shape[:axis] + (o * s,) + x.shape[axis + 2:])
        x = x.shrink([(0, (o - 1) * s + 1) if a == axis else None for a in range(x.ndim)])
    return x


@dataclass(frozen=True)
class MaxPoolGradient:
    """The gradient of a max pool whose windows overlap (Tensor.custom_vjp's pull), as composition's (each
    window's gradient to its maxima, split evenly among ties) but laid back out as one sum over the window's
    k^n offsets: offset t's share of every window, spread out by the stride and shifted by t * dilation, lands on
    the input (an elementwise kernel), where composition folds the windows' tiled copies back with two sums over
    them (ResNet-18's 3 x 3 / 2 pool: 12.7 ms of its step)."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    full: tuple[tuple[int, int], ...]  # the padding each axis got before its windows (the fill's and ceil_mode's)
    fill: float

    def __call__(self, g: Tensor, x: Tensor, values: Tensor) -> tuple[Tensor, None]:
        n = len(self.kernel)
        lead = [(0, 0)] * (x.ndim - n)
        win = _pool(x.pad(lead + list(self.full), value=self.fill), self.kernel, self.stride, self.dilation)
        flat = win.flatten(-n, -1)
        is_max = flat == values.unsqueeze(-1)
        share = is_max.where(g.unsqueeze(-1) / is_max.sum(-1, keepdim=True), 0.0)  # (..., *out, k^n)
        padded = [s + b + a for s, (b, a) in zip(x.shape[-n:], self.full, strict=True)]
        total = None
        for j, offset in enumerate(itertools.product(*(range(k) for k in self.kernel))):
            placed = _spread(share[..., j], self.stride)
            placed = placed.pad(lead + [(t * d, p - t * d - s) for t, d, p, s in
                                        zip(offset, self.dilation, padded, placed.shape[-n:], strict=True)])
            total = placed if total is None else total + placed
        assert total is not None
        return total.shrink([None] * (x.ndim - n) + [(b, b + s) for (b, _), s in
                                                      zip(self.full, x.shape[-n:], strict=True)]), None


def _out_size(i: int, k: int, s: int, d: int, before: int, after: int, ceil_mode: bool) -> tuple[int, int]:
    """(output size, extra padding after) for a pooling axis; ceil_mode keeps a last partial window that starts
    inside the input or the padding before it, as torch."""
    span = i + before + after - d * (k - 1) - 1
    if span < 0:
        raise ShapeError(f"pool: kernel {k} (dilation {d}) is larger than the padded input {i + before + after}")
    o = span // s + 1
    if ceil_mode and span % s:
        o += 1
        if (o - 1) * s >= i + before: o -= 1
    return o, max(0, (o - 1) * s + d * (k - 1) + 1 - (i + before + after))


def _share_heads(query: Tensor, kv: Tensor, name: str) -> Tensor:
    """kv with each of its heads (axis -3) repeated for the query heads it serves (grouped-query attention)."""
    if query.ndim < 3 or kv.ndim < 3:
        raise AxisError(f"scaled_dot_product_attention: enable_gqa needs a head axis (-3): query {query.shape}, "
                        f"{name} {kv.shape}")
    heads, shared = query.shape[-3], kv.shape[-3]
    if shared == 0 or heads % shared:
        raise ShapeError(f"scaled_dot_product_attention: {name} has {shared} heads, query {heads}; with enable_gqa "
                         f"the {name} heads must divide the query heads")
    return kv if shared == heads else kv.repeat_interleave(heads // shared, dim=-3)


def _uint8_weights(n_in: int, n_out: int, align_corners: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """torch's bilinear taps for uint8 along one axis: (source index, int16 weight) per output and tap, and the
    weights' fixed-point precision (bits), the largest that keeps the largest weight under 2**15."""
    if align_corners: scale, delta = ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0), 0.5
    else: scale, delta = n_in / n_out, 0.0
    taps = 3  # a triangle filter of support 1: torch's ceil(support) * 2 + 1
    index, weight = np.zeros((n_out, taps), np.int64), np.zeros((n_out, taps))
    for o in range(n_out):
        center = scale * (o + 0.5 - delta)
        first = max(int(center - 0.5 + delta), 0)  # int() truncates toward zero, as the C++ cast
        count = min(max(min(int(center + 1.5 + delta), n_in) - first, 0), taps)
        index[o, :count] = np.arange(first, first + count)
        weight[o, :count] = np.maximum(0.0, 1 - np.abs(np.arange(first, first + count) - center + 0.5 - delta))
        if weight[o].sum(): weight[o] /= weight[o].sum()
    bits = 0
    while bits < 22 and int(0.5 + weight.max() * (1 << (bits + 1))) < 1 << 15: bits += 1
    return index, np.floor(weight * (1 << bits) + 0.5).astype(np.int32), bits  # weights >= 0: round half up


def _resample_uint8(x: Tensor, axis: int, n_out: int, align_corners: bool) -> Tensor:
    """One pass of torch's uint8 bilinear resampling along `axis`: the taps' int16 weights times the bytes, summed in
    int32, rounded and shifted back by the precision, clamped to a byte. torch resizes the last axis first, then the
    one before, rounding to uint8 in between; the bytes match only in that order."""
    from ember.tensor import Tensor
    index, weight, bits = _uint8_weights(x.shape[axis], n_out, align_corners)
    shape = (n_out,) + (1,) * (x.ndim - axis - 1)
    acc = Tensor.full((), 1 << (bits - 1), dtype=dtypes.int32, device=x.device)
    for tap in range(index.shape[1]):
        if not weight[:, tap].any(): continue
        picked = x[(slice(None),) * axis + (Tensor(index[:, tap], device=x.device),)].cast(dtypes.int32)
        acc = acc + picked * Tensor(weight[:, tap].reshape(shape), device=x.device)
    return (acc // (1 << bits)).clip(0, 255).cast(dtypes.uint8)


@dataclass(frozen=True)
class ConvGradient:
    """The gradients of a direct convolution (Tensor.custom_vjp's pull). Composition would give the input's as
    the windows' gradient (summed over the output channels, stored: k^2 times the input's size) folded back onto
    the input, two more kernels; it is a convolution itself, of the output's gradient spread out by the stride
    and padded by the kernel's extent, with the weight flipped and its channel axes swapped: one kernel that reads
    rows as the forward does. The weight's is the correlation of the windows with the output's gradient."""

    groups: int
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]

    def __call__(self, g: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        n, groups, kernel = weight.ndim - 2, self.groups, weight.shape[2:]
        bs, cin, cout, out_sp = x.shape[0], x.shape[1], weight.shape[0], g.shape[2:]
        acc = dtypes.float32 if g.dtype.itemsize < 4 else g.dtype
        g = g.cast(acc)
        spread = _spread(g, self.stride)
        # input row j of the padded input gets g[o] w[t] where j = o s + t d: a full correlation of the spread
        # gradient, cut to the unpadded rows (a side cut off more than it pads is a shrink)
        edges = []
        for i, k, d, (before, _), length in zip(x.shape[2:], kernel, self.dilation, self.pads, spread.shape[2:],
                                                     strict=True):
            extent = d * (k - 1) + 1
            edges.append((extent - 1 - before, i + before - length))
        spread = spread.pad([(0, 0)] * 2 + [(max(b, 0), max(a, 0)) for b, a in edges])
        spread = spread.shrink([None, None] + [(max(-b, 0), s - max(-a, 0)) for (b, a), s in
                                               zip(edges, spread.shape[2:], strict=True)])
        w = weight.cast(acc).reshape((groups, cout // groups, cin // groups) + kernel).transpose(1, 2)
        w = w.reshape((cin, cout // groups) + kernel).flip(list(range(2, 2 + n)))
        dx = spread.conv2d(w, groups=groups, dilation=self.dilation)
        win = _pool(x.cast(acc).pad([(0, 0), (0, 0)] + list(self.pads)), kernel, self.stride, self.dilation)
        win = win.reshape((bs, groups, 1, cin // groups) + out_sp + kernel)
        dw = (win * g.reshape((bs, groups, cout // groups, 1) + out_sp + (1,) * n)).sum([0] + list(range(4, 4 + n)))
        return dx, dw.reshape(weight.shape)


@dataclass(frozen=True)
class LayerNormGradient:
    """layernorm's gradient from its output xhat (Tensor.custom_vjp's pull): invstd (g - mean g - xhat mean g xhat)
    over the normalized axes, two sums and one elementwise pass, where composition pulls g back through the
    variance and the mean separately. The output and the statistics get none of their own."""

    axes: tuple[int, ...]

    def __call__(self, g: Tensor, x: Tensor, xhat: Tensor, invstd: Tensor) -> tuple[Tensor, None, None]:
        mean_g, mean_gx = g.mean(self.axes, keepdim=True), (g * xhat).mean(self.axes, keepdim=True)
        return invstd * (g - mean_g - xhat * mean_gx), None, None


IM2COL_BELOW = 8  # a convolution whose output rows are narrower is a matmul of its windows (conv2d)
IM2COL_ROW = 16  # the windows' rows are padded to a multiple of this: whole vectors of float32 on any SIMD CPU


class NNMixin:
    """torch.nn.functional's ops as Tensor methods, with tinygrad's names where it has them."""

    __slots__ = ()

    # ---- convolution ---------------------------------------------------------------------------------------------

    def conv2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: IntOrTuple = 1,
               dilation: IntOrTuple = 1, padding: IntOrTuple | str = 0) -> Tensor:
        """A convolution (cross-correlation, as torch) over the last weight.ndim - 2 axes: 1-d, 2-d or 3-d.

        self is (batch, in_channels, *spatial) or unbatched (in_channels, *spatial); weight is
        (out_channels, in_channels / groups, *kernel)."""
        n = weight.ndim - 2
        if n < 1: raise ShapeError(f"conv: weight must have at least 3 dims (out, in/groups, *kernel), got "
                                   f"{weight.shape}")
        if self.ndim == n + 1: return self.unsqueeze(0).conv2d(weight, bias, groups, stride, dilation, padding)[0]
        if self.ndim != n + 2:
            raise ShapeError(f"conv: input {self.shape} must be (batch, channels, *spatial) with {n} spatial axes "
                             f"for weight {weight.shape}")
        bs, cin, cout, kernel = self.shape[0], self.shape[1], weight.shape[0], weight.shape[2:]
        if groups < 1 or cin % groups or cout % groups or weight.shape[1] * groups != cin:
            raise ShapeError(f"conv: input has {cin} channels, weight {weight.shape} with groups={groups} expects "
                             f"{weight.shape[1] * groups}; channels in and out must divide by groups")
        st, dl = _positive(stride, n, "stride", "conv"), _positive(dilation, n, "dilation", "conv")
        if padding == "same" and any(s != 1 for s in st):
            raise ValueError(f"conv: padding='same' is not supported for strided convolutions (stride {st}); use "
                             "stride 1 or give the padding explicitly")
        if bias is not None and bias.shape != (cout,):
            raise ShapeError(f"conv: bias has shape {bias.shape}, expected ({cout},): one value per output channel "
                             f"of weight {weight.shape}")
        pads = _padding_pairs(padding, kernel, dl, "conv")
        x = self.pad([(0, 0), (0, 0)] + pads)
        for i, k, d in zip(x.shape[2:], kernel, dl, strict=True):
            if i < d * (k - 1) + 1:
                raise ShapeError(f"conv: kernel {kernel} with dilation {dl} does not fit the padded input "
                                 f"{x.shape[2:]} of {self.shape}")
        win = _pool(x, kernel, st, dl)  # (bs, cin, *out, *kernel)
        out_sp = win.shape[2:2 + n]
        training = not type(self).no_grad and any(t.requires_grad for t in (self, weight))
        if training and groups == 1 and isinstance(out_sp[-1], int) and \
                (out_sp[-1] < IM2COL_BELOW or any(s > 1 for s in st)):
            # rows narrower than a vector (ResNet's 4 x 4 and 2 x 2 stages), or read with a stride: no axis of the
            # direct form's kernels, forward or backward, reads memory with stride one, and they run in scalars.
            # As a matmul of the windows, copied out as rows (im2col), each of its three products has one. Only
            # where a gradient is wanted: the direct forward is as fast and fuses an epilogue (eval batchnorm)
            m = bs * prod(out_sp)
            cols = win.permute(0, *range(2, 2 + n), 1, *range(2 + n, 2 + 2 * n)).reshape(m, -1)
            k = cols.shape[1]
            wide = -(-k // IM2COL_ROW) * IM2COL_ROW  # (a row of 147, the 7 x 7 stem's, padded with zeros to 160)
            cols = cols.pad(((0, 0), (0, wide - k))).contiguous()
            dtype = least_upper_dtype(self.dtype, weight.dtype)
            acc = dtypes.float32 if dtype.is_float and dtype.itemsize < 4 else dtype
            # the dot form (both operands along the sum), not Tensor.matmul's packed copy of the weight: its
            # gradients then read the weight and the windows along their rows too
            # (the weight's gradient stored as (cout, K) rows, one axis along K, not (cout, cin, 3, 3): rows of 3)
            w2 = weight.reshape(cout, -1).pad(((0, 0), (0, wide - k))).contiguous_backward()
            out = (cols.cast(acc).unsqueeze(1) * w2.unsqueeze(0).cast(acc)).sum(-1, dtype=acc).cast(dtype)
            out = out.reshape(bs, *out_sp, cout).permute(0, n + 1, *range(1, n + 1))
            return out if bias is None else out + bias.reshape((1, cout) + (1,) * n)
        win = win.reshape((bs, groups, 1, cin // groups) + out_sp + kernel)
        w = weight.reshape((1, groups, cout // groups, cin // groups) + (1,) * n + kernel)
        dtype = least_upper_dtype(self.dtype, weight.dtype)
        acc = dtypes.float32 if dtype.is_float and dtype.itemsize < 4 else dtype  # half products summed in float
        out = (win.cast(acc) * w.cast(acc)).sum([3] + list(range(4 + n, 4 + 2 * n)), dtype=acc).cast(dtype)
        out = out.reshape((bs, cout) + out_sp)
        if dtype.is_float: out = out.custom_vjp((self, weight), ConvGradient(groups, st, dl, tuple(pads)))
        return out if bias is None else out + bias.reshape((1, cout) + (1,) * n)

    conv1d = conv3d = conv2d

    def conv_transpose2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                         stride: IntOrTuple = 1, dilation: IntOrTuple = 1, padding: IntOrTuple = 0,
                         output_padding: IntOrTuple = 0) -> Tensor:
        """The gradient of conv2d with respect to its input, as torch's conv_transpose; weight is
        (in_channels, out_channels / groups, *kernel). Built as a convolution of the input spread out by
        `stride` with the flipped, transposed weight."""
        n = weight.ndim - 2
        if self.ndim == n + 1:
            return self.unsqueeze(0).conv_transpose2d(weight, bias, groups, stride, dilation, padding,
                                                      output_padding)[0]
        if self.ndim != n + 2 or self.shape[1] != weight.shape[0] or weight.shape[0] % groups:
            raise ShapeError(f"conv_transpose: input {self.shape} and weight {weight.shape} (in, out/groups, "
                             f"*kernel) do not match with groups={groups}")
        kernel = weight.shape[2:]
        st = _positive(stride, n, "stride", "conv_transpose")
        dl = _positive(dilation, n, "dilation", "conv_transpose")
        pd, op = _tuple(padding, n, "padding", "conv_transpose"), _tuple(output_padding, n, "output_padding",
                                                                           "conv_transpose")
        for ax, (o, s, d) in enumerate(zip(op, st, dl, strict=True)):  # a larger one adds rows no input reaches
            if o >= s and o >= d:
                raise ValueError(f"conv_transpose: output_padding {op} is not below stride {st} or dilation {dl} "
                                 f"on spatial axis {ax}; each must be smaller than its axis's stride or dilation")
        x = _spread(self, st)
        pads = [(d * (k - 1) - p, d * (k - 1) - p + o) for k, d, p, o in zip(kernel, dl, pd, op, strict=True)]
        cin, cout_g = weight.shape[0], weight.shape[1]
        w = weight.reshape((groups, cin // groups, cout_g) + kernel).transpose(1, 2)
        w = w.reshape((groups * cout_g, cin // groups) + kernel).flip(list(range(2, 2 + n)))
        return x.conv2d(w, bias, groups, 1, dl, [v for pair in reversed(pads) for v in pair])

    # ---- pooling and resampling ----------------------------------------------------------------------------------

    def _pool_windows(self: Tensor, kernel_size: IntOrTuple, stride: IntOrTuple | None, dilation: IntOrTuple,
                      padding: IntOrTuple, ceil_mode: bool, fill: float, op: str) -> tuple[Tensor, list[tuple]]:
        k = (kernel_size,) * 2 if isinstance(kernel_size, int) else tuple(kernel_size)
        n = len(k)
        if self.ndim < n: raise ShapeError(f"{op}: input {self.shape} has fewer than {n} spatial axes")
        k = _positive(k, n, "kernel_size", op)
        st = k if stride is None or stride == () else _positive(stride, n, "stride", op)
        dl = _positive(dilation, n, "dilation", op)
        pads = _padding_pairs(padding, k, dl, op)
        if any(2 * b > kk for (b, _), kk in zip(pads, k, strict=True)):
            raise ShapeError(f"{op}: padding {padding} must be at most half of kernel_size {k}")
        sizes = [_out_size(i, kk, s, d, b, a, ceil_mode) for i, kk, s, d, (b, a) in
                 zip(self.shape[-n:], k, st, dl, pads, strict=True)]
        full = [(b, a + extra) for (b, a), (_, extra) in zip(pads, sizes, strict=True)]
        x = self.pad([(0, 0)] * (self.ndim - n) + full, value=fill)
        return _pool(x, k, st, dl), [(k, st, dl, pads, full)]

    def max_pool2d(self: Tensor, kernel_size: IntOrTuple = (2, 2), stride: IntOrTuple | None = None,
                   dilation: IntOrTuple = 1, padding: IntOrTuple = 0, ceil_mode: bool = False,
                   return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """The max over each window of the last len(kernel_size) axes; with return_indices, also where each max
        is, as a flat index into those axes (torch's convention; the first of equal maxima)."""
        from ember.tensor import Tensor
        fill = -math.inf if self.dtype.is_float else self.dtype.min
        win, ((k, st, dl, pads, full),) = self._pool_windows(kernel_size, stride, dilation, padding, ceil_mode,
                                                             fill, "max_pool")
        n = len(k)
        flat = win.flatten(-n, -1) if n > 1 else win
        values = flat.max(axis=-1)
        if self.dtype.is_float and any(s < kk * d - (d - 1) for kk, s, d in zip(k, st, dl, strict=True)):
            # (windows that overlap; those that do not are a reshape, whose gradient composition gets right)
            values = values.custom_vjp((self, values), MaxPoolGradient(k, st, dl, tuple(full), fill))
        if not return_indices: return values
        spatial = self.shape[-n:]
        where = Tensor.arange(prod(spatial), dtype=dtypes.int64, device=self.device).reshape(spatial)
        where = _pool(where.pad(full, value=-1), k, st, dl)
        where = where.flatten(-n, -1) if n > 1 else where
        from ember.mixin.indexing import _select_last
        return values, _select_last(where._broadcast_to(flat.shape), flat.argmax(-1))

    def max_unpool2d(self: Tensor, indices: Tensor, kernel_size: IntOrTuple = (2, 2), stride: IntOrTuple | None = None,
                     dilation: IntOrTuple = 1, padding: IntOrTuple = 0,
                     output_size: Sequence[int] | None = None) -> Tensor:
        """The inverse of max_pool2d(return_indices=True): each value put back at its flat index into the last
        len(kernel_size) axes of an output of zeros, as torch's max_unpool.

        The output's spatial size is (i - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1 per axis (what
        the pooled input had, but for rows a floor division dropped), or `output_size` (its last axes count), which
        must lie within stride of that. Where windows picked the same element, the last value (in row-major order)
        is kept, as torch's kernel writes them; the gradient reaches that value only (torch's backward gives it to
        each). Non-overlapping windows (stride == kernel_size, no padding, no dilation) cost one select per output
        element; other windows compare every value with every output position."""
        from ember.tensor import Tensor
        k = (kernel_size,) * 2 if isinstance(kernel_size, int) else tuple(kernel_size)
        n = len(k)
        k = _positive(k, n, "kernel_size", "max_unpool")
        st = k if stride is None or stride == () else _positive(stride, n, "stride", "max_unpool")
        dl, pads = _positive(dilation, n, "dilation", "max_unpool"), _tuple(padding, n, "padding", "max_unpool")
        if not indices.dtype.is_int:
            raise DTypeError(f"max_unpool: indices must be integers, got {indices.dtype.name}")
        if self.ndim < n or indices.shape != self.shape:
            raise ShapeError(f"max_unpool: input {self.shape} and indices {indices.shape} must have one shape with at "
                             f"least {n} spatial axes")
        pooled = self.shape[-n:]
        default = tuple((i - 1) * s - 2 * p + d * (kk - 1) + 1
                        for i, kk, s, d, p in zip(pooled, k, st, dl, pads, strict=True))
        size = default if output_size is None else tuple(output_size)[-n:]
        if len(size) != n or any(not d - s < o < d + s for o, d, s in zip(size, default, st, strict=True)):
            raise ValueError(f"max_unpool: output_size {output_size} is not within stride {st} of the default "
                             f"{default} on each of the last {n} axes")
        positions = prod(size)
        if (values := index_values(indices)) is not None:
            if values.min() < 0 or values.max() >= positions:
                raise IndexError(f"max_unpool: index {values.max() if values.max() >= positions else values.min()} "
                                 f"is outside the output's {positions} positions {size}")
        lead = self.shape[:-n]
        where = Tensor.arange(positions, dtype=indices.dtype, device=self.device)
        if st == k and all(d == 1 for d in dl) and not any(pads) and size == tuple(i * kk for i, kk in
                                                                                  zip(pooled, k, strict=True)):
            # each output position lies in one window: lay the positions out as (*pooled, *kernel) and compare there
            split = [v for pair in zip(pooled, k, strict=True) for v in pair]
            where = where.reshape(split).permute([2 * a for a in range(n)] + [2 * a + 1 for a in range(n)])
            expand = self.shape + k
            hit = indices.reshape(self.shape + (1,) * n)._broadcast_to(expand).eq(where._broadcast_to(expand))
            out = hit.where(self.reshape(self.shape + (1,) * n)._broadcast_to(expand), 0).cast(self.dtype)
            back = [a for ax in range(n) for a in (len(lead) + ax, len(lead) + n + ax)]
            return out.permute(list(range(len(lead))) + back).reshape(lead + size)
        flat_x, flat_idx = self.reshape(lead + (-1, 1)), indices.reshape(lead + (-1, 1))
        hit = flat_idx.eq(where)  # (..., pooled positions, output positions)
        order = Tensor.arange(prod(pooled), dtype=dtypes.int32, device=self.device).reshape(-1, 1)
        last = hit.where(order, -1).max(axis=-2, keepdim=True)  # the last value written to each output position
        return order.eq(last).where(flat_x, 0).cast(self.dtype).sum(-2, dtype=self.dtype).reshape(lead + size)

    def avg_pool2d(self: Tensor, kernel_size: IntOrTuple = (2, 2), stride: IntOrTuple | None = None,
                   dilation: IntOrTuple = 1, padding: IntOrTuple = 0, ceil_mode: bool = False,
                   count_include_pad: bool = True) -> Tensor:
        """The mean over each window; padding counts in the divisor when count_include_pad (not the extra
        elements ceil_mode adds), as torch."""
        from ember.tensor import Tensor
        win, ((k, st, dl, pads, full),) = self._pool_windows(kernel_size, stride, dilation, padding, ceil_mode, 0.0,
                                                             "avg_pool")
        n = len(k)
        axes = list(range(-n, 0))
        acc = dtypes.float64 if self.dtype in (dtypes.float64, dtypes.int64) else dtypes.float32  # one rounding
        total = win.cast(acc).sum(axes)
        spatial = self.shape[-n:]
        ones = Tensor.ones(spatial, dtype=acc, device=self.device)
        counted = ones.pad(pads, value=1.0 if count_include_pad else 0.0)
        counted = counted.pad([(0, a - p) for (_, p), (_, a) in zip(pads, full, strict=True)])
        mean = total / _pool(counted, k, st, dl).sum(axes)
        return mean.cast(self.dtype) if self.dtype.is_float else mean.trunc().cast(self.dtype)  # torch: int / int

    def interpolate(self: Tensor, size: Sequence[int], mode: str = "linear", align_corners: bool = False) -> Tensor:
        """Resample the last len(size) axes to `size`: 'nearest', 'nearest-exact' or 'linear' (bilinear,
        trilinear: linear along each axis), with torch's source-index conventions. A uint8 image resamples
        bilinearly in torch's fixed-point arithmetic (see `_resample_uint8`), so its bytes are torch's."""
        from ember.tensor import Tensor
        if mode not in ("nearest", "nearest-exact", "linear"):
            raise ModeError(f"interpolate: mode must be nearest, nearest-exact or linear, got {mode!r}")
        if len(size) > self.ndim: raise ShapeError(f"interpolate: size {tuple(size)} has more axes than {self.shape}")
        if mode == "linear" and self.dtype is dtypes.uint8 and len(size) == 2:  # torch: uint8 bilinear only
            x = self if size[1] == self.shape[-1] else _resample_uint8(self, self.ndim - 1, size[1], align_corners)
            return x if size[0] == x.shape[-2] else _resample_uint8(x, x.ndim - 2, size[0], align_corners)
        x = self
        for axis, out in zip(range(self.ndim - len(size), self.ndim), size, strict=True):
            i = x.shape[axis]
            if out == i and mode != "linear" or (out == i and not align_corners and mode == "linear"):
                continue
            f = np.float64 if x.dtype is dtypes.float64 else np.float32  # torch computes in the input's precision
            dst = np.arange(out, dtype=f)
            if mode == "linear" and align_corners:
                src = dst * f((i - 1) / (out - 1)) if out > 1 else np.zeros(out, f)
            else:
                src = dst + f(0.5) if mode != "nearest" else dst
                src = src * f(i / out)
                if mode == "linear": src = np.maximum(src - f(0.5), f(0))
            lo = np.minimum(np.floor(src).astype(np.int64), i - 1)
            index = [slice(None)] * axis
            if mode != "linear":
                x = x[tuple(index) + (Tensor(lo, device=self.device),)]
                continue
            if not x.dtype.is_float: raise DTypeError(f"interpolate: linear mode needs a float tensor (or uint8 with "
                                                      f"two axes resized, as torch), not {x.dtype.name}")
            hi = np.minimum(lo + 1, i - 1)
            frac = src - lo
            shape = (out,) + (1,) * (x.ndim - axis - 1)
            w1 = Tensor(frac.reshape(shape), device=self.device).cast(x.float_like().dtype)
            a = x[tuple(index) + (Tensor(lo, device=self.device),)]
            b = x[tuple(index) + (Tensor(hi, device=self.device),)]
            x = a * (1 - w1) + b * w1
        return x

    # ---- normalization -------------------------------------------------------------------------------------------

    def layernorm(self: Tensor, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
        """(x - mean) / sqrt(var + eps) over `axis`, with the biased variance (no affine)."""
        x = self.float_like()
        centered = x - x.mean(axis, keepdim=True)
        invstd = (centered.square().mean(axis, keepdim=True) + eps).rsqrt()
        out = centered * invstd
        axes = tuple(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))
        return out.custom_vjp((x, out, invstd), LayerNormGradient(axes))

    def batchnorm(self: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                  axis: int | Sequence[int] = 1) -> Tensor:
        """(x - mean) * invstd * weight + bias, with the per-channel tensors laid along `axis`."""
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(self._axis(a, "batchnorm") for a in axes)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = (self - mean.reshape(shape)) * (invstd.reshape(shape) if weight is None else
                                            (weight.reshape(shape) * invstd.reshape(shape)))
        return x if bias is None else x + bias.reshape(shape)

    def scaled_dot_product_attention(self: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                     dropout_p: float = 0.0, is_causal: bool = False,
                                     scale: float | None = None, enable_gqa: bool = False) -> Tensor:
        """softmax(q k^T * scale + mask) v with self as the query; a bool mask keeps the True positions,
        is_causal keeps key j <= query i (top-left aligned, as torch). A query whose keys are all masked out
        (every score -inf) gets 0, as torch, not the NaN of a softmax over nothing. enable_gqa: key and value may
        have fewer heads (axis -3) than the query, a divisor of its count; each head serves that many queries."""
        from ember.tensor import Tensor
        if enable_gqa: key, value = _share_heads(self, key, "key"), _share_heads(self, value, "value")
        if self.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
            raise ShapeError(f"scaled_dot_product_attention: query {self.shape}, key {key.shape} and value "
                             f"{value.shape} do not fit (need q[-1] == k[-1] and k[-2] == v[-2])")
        s = 1 / math.sqrt(self.shape[-1]) if scale is None else scale
        scores = (self @ key.transpose(-1, -2)) * s
        if is_causal:
            if attn_mask is not None: raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal")
            lq, lk = self.shape[-2], key.shape[-2]
            attn_mask = Tensor.ones(lq, lk, dtype=dtypes.bool, device=self.device).tril()
        if attn_mask is None: return scores.softmax(-1).dropout(dropout_p) @ value
        scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype is dtypes.bool else scores + attn_mask
        if scores.shape[-1] == 0: return scores.softmax(-1) @ value  # no keys: every output is 0, as torch
        # a softmax whose max is already taken: the mask's -inf scores give exp(-inf) = 0. A row of -inf only (every
        # key masked out) would be 0/0: its peak and sum are replaced by 0 and 1, so its weights are 0, with no NaN
        # in the gradient, and the max is computed once (it was taken twice: 6 kernels, now 5 as without a mask)
        peak = scores.max(axis=-1, keepdim=True).detach()
        empty = peak.eq(-math.inf)
        e = (scores - empty.where(0.0, peak)).exp()
        weights = e / empty.where(1.0, e.sum(axis=-1, keepdim=True))
        return weights.dropout(dropout_p) @ value

    def dropout(self: Tensor, p: float = 0.5) -> Tensor:
        """Zero each element with probability p and scale the rest by 1 / (1 - p), only when Tensor.training."""
        from ember.tensor import Tensor
        if not 0 <= p <= 1: raise ValueError(f"dropout: p must be in [0, 1], got {p}")
        if not Tensor.training or p == 0: return self
        if p == 1: return self.zeros_like()
        keep = Tensor.rand(self.shape, device=self.device) >= p
        return keep.where(self * (1 / (1 - p)), 0).cast(self.dtype)

    # ---- layers --------------------------------------------------------------------------------------------------

    def linear(self: Tensor, weight: Tensor, bias: Tensor | None = None, dtype: DType | str | None = None) -> Tensor:
        """self @ weight + bias with weight laid out (in, out), as tinygrad's linear (torch's F.linear takes
        (out, in) and transposes it); a 1-d weight multiplies elementwise. `dtype` casts all three first."""
        if dtype is not None:
            weight, bias, x = weight.cast(dtype), None if bias is None else bias.cast(dtype), self.cast(dtype)
            return x.linear(weight, bias)
        out = self * weight if weight.ndim == 1 else self @ weight
        return out if bias is None else out + bias

    def sequential(self: Tensor, layers: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
        """self passed through each callable of `layers` in order."""
        return functools.reduce(lambda x, f: f(x), layers, self)

    # ---- losses --------------------------------------------------------------------------------------------------

    def cross_entropy(self: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                      reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
        """torch's cross_entropy on logits (classes on axis 1, or 0 for 1-d input), with class-index targets
        (ignore_index skipped) or class-probability targets, optional class weights and label smoothing."""
        return self.log_softmax(1 if self.ndim > 1 else 0)._nll(target, weight, ignore_index, reduction,
                                                               label_smoothing, "cross_entropy")

    def nll_loss(self: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean") -> Tensor:
        """torch's nll_loss: minus the log-probability (self) of each target class."""
        return self._nll(target, weight, ignore_index, reduction, 0.0, "nll_loss")

    def _nll(self: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str,
             smoothing: float, op: str) -> Tensor:
        _check_reduction(reduction, op)
        c_axis = 1 if self.ndim > 1 else 0
        classes = self.shape[c_axis]
        wshape = tuple(classes if i == c_axis else 1 for i in range(self.ndim))
        w = None if weight is None else weight.reshape(wshape)
        if target.dtype.is_float:  # class probabilities, one per class
            if target.shape != self.shape:
                raise ShapeError(f"{op}: probability target {target.shape} must match the input {self.shape}")
            probs = target * (1 - smoothing) + smoothing / classes
            per = -(self * probs if w is None else self * probs * w).sum(c_axis)
            return _reduce_loss(per, reduction, None)
        if not target.dtype.is_int: raise DTypeError(f"{op}: target must be int class indices or float "
                                                     f"probabilities, not {target.dtype.name}")
        expected = self.shape[:c_axis] + self.shape[c_axis + 1:]
        if target.shape != expected:
            raise ShapeError(f"{op}: target {target.shape} must have the input's shape without the class axis "
                             f"{expected} (input {self.shape})")
        _check_targets(target, classes, ignore_index, op)
        keep = target.ne(ignore_index)
        hit = target.unsqueeze(c_axis).eq(_class_positions(classes, c_axis, self.ndim, self.device))
        picked_w = keep if w is None else keep * (hit.where(w, 0).sum(c_axis))
        nll = -hit.where(self, 0).sum(c_axis) * picked_w
        if smoothing:
            smooth = -(self if w is None else self * w).sum(c_axis) / classes * keep
            nll = nll * (1 - smoothing) + smooth * smoothing
        return _reduce_loss(nll, reduction, picked_w.cast(nll.dtype))

    def binary_cross_entropy(self: Tensor, target: Tensor, weight: Tensor | None = None,
                             reduction: str = "mean") -> Tensor:
        """-(y log p + (1 - y) log(1 - p)) with self as p; logs are clamped at -100, as torch."""
        _check_reduction(reduction, "binary_cross_entropy")
        per = -(target * self.log().maximum(-100) + (1 - target) * (1 - self).log().maximum(-100))
        return _reduce_loss(per if weight is None else per * weight, reduction, None)

    def binary_cross_entropy_with_logits(self: Tensor, target: Tensor, weight: Tensor | None = None,
                                         reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
        """binary_cross_entropy(sigmoid(self), target), computed stably from the logits."""
        _check_reduction(reduction, "binary_cross_entropy_with_logits")
        softplus_neg = (-self.abs()).exp().log1p() + (-self).maximum(0)  # log(1 + exp(-x)), without overflow
        scale = 1 if pos_weight is None else 1 + (pos_weight - 1) * target
        per = (1 - target) * self + scale * softplus_neg
        return _reduce_loss(per if weight is None else per * weight, reduction, None)

    # tinygrad's names and argument order (Y is the target) for the losses above, with torch's semantics where
    # tinygrad 0.14 differs: logs are clamped at -100 (tinygrad gives NaN for p = 0), and labels equal to the default
    # ignore_index -1 are left out of the mean (tinygrad counts them in its denominator)

    def binary_crossentropy(self: Tensor, Y: Tensor, reduction: str = "mean") -> Tensor:
        """binary_cross_entropy with self as probabilities, under tinygrad's name and argument order."""
        return self.binary_cross_entropy(Y, reduction=reduction)

    def binary_crossentropy_logits(self: Tensor, Y: Tensor, reduction: str = "mean",
                                   pos_weight: Tensor | None = None) -> Tensor:
        """binary_cross_entropy_with_logits under tinygrad's name and argument order."""
        return self.binary_cross_entropy_with_logits(Y, reduction=reduction, pos_weight=pos_weight)

    def sparse_categorical_crossentropy(self: Tensor, Y: Tensor, ignore_index: int = -1,
                                        label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
        """cross_entropy of logits with the classes on the LAST axis (tinygrad's layout) against int labels Y;
        labels equal to ignore_index (-1 by default) count neither in the sum nor in the mean, as torch's."""
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"sparse_categorical_crossentropy: label_smoothing must be in [0, 1], "
                             f"got {label_smoothing}")
        if not Y.dtype.is_int:
            raise DTypeError(f"sparse_categorical_crossentropy: labels must be integers, got {Y.dtype.name}")
        x = self.permute([0, self.ndim - 1] + list(range(1, self.ndim - 1))) if self.ndim > 2 else self
        return x.cross_entropy(Y, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)

    def mse_loss(self: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
        _check_reduction(reduction, "mse_loss")
        return _reduce_loss((self - target).square(), reduction, None)

    def l1_loss(self: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
        _check_reduction(reduction, "l1_loss")
        return _reduce_loss((self - target).abs(), reduction, None)


def _class_positions(classes: int, axis: int, ndim: int, device: str) -> Tensor:
    from ember.tensor import Tensor
    return Tensor.arange(classes, device=device).reshape(tuple(classes if i == axis else 1 for i in range(ndim)))


def _check_targets(target: Tensor, classes: int, ignore_index: int, op: str) -> None:
    """Raise IndexError (as torch) for a class index outside [0, classes) other than ignore_index, when the
    target's values are known (a lazy target is realized for the check only under CHECK_INDICES)."""
    if (values := index_values(target)) is None: return
    bad = values[((values < 0) | (values >= classes)) & (values != ignore_index)]
    if bad.size:
        raise IndexError(f"{op}: target {bad.flat[0]} is out of bounds for {classes} classes; targets must be in "
                         f"[0, {classes}) or ignore_index ({ignore_index})")


def _check_reduction(reduction: str, op: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _reduce_loss(per: Tensor, reduction: str, weights: Tensor | None) -> Tensor:
    """'none' keeps per-element losses; 'mean' divides by the number of elements, or by the total weight."""
    if reduction == "none": return per
    if reduction == "sum": return per.sum()
    return per.sum() / weights.sum() if weights is not None else per.mean()

