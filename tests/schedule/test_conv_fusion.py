"""Kernel counts of convolution and attention programs, and their values against torch.

Oracle: torch 2.13 CPU for the values (eval-mode BatchNorm, a ResNet basic block, scaled-dot-product attention); for
the counts, the kernels of the program's own convolutions (what an epilogue adds: none) and the counts tinygrad
0.14 schedules for the same programs (conv + eval BatchNorm 1, basic block 2, attention 4; a bench peer, measured
by a /tmp script, never imported here). Inputs and parameters are realized first: only the forward's kernels count.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import Tensor, nn
from ember.schedule.kernelize import kernels

RNG = np.random.default_rng(7)


def kernel_count(t: Tensor) -> int:
    return len(list(kernels(t.schedule())))


def eval_batchnorm(channels: int) -> tuple[nn.BatchNorm2d, dict[str, torch.Tensor]]:
    """An eval-mode BatchNorm2d with running statistics far from (0, 1), realized, and the same as torch tensors."""
    values = {"weight": RNG.uniform(0.5, 2, channels), "bias": RNG.uniform(-1, 1, channels),
              "running_mean": RNG.uniform(-1, 1, channels), "running_var": RNG.uniform(0.2, 3, channels)}
    bn = nn.BatchNorm2d(channels).eval()
    for name, v in values.items(): getattr(bn, name).assign(Tensor(v.astype(np.float32))).realize()
    return bn, {name: torch.from_numpy(v.astype(np.float32)) for name, v in values.items()}


def torch_bn(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.batch_norm(x, p["running_mean"], p["running_var"], p["weight"], p["bias"], training=False, eps=1e-5)


def conv_weight(cout: int, cin: int) -> np.ndarray:
    return (RNG.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32)


SIZES = [(8, 8), (128, 8), (128, 14), (64, 7)]  # (channels, height = width): rows of 14 and 7 are not whole vectors


@pytest.mark.parametrize("channels, size", SIZES)
def test_eval_batchnorm_after_a_conv_is_the_conv_kernels_epilogue(channels: int, size: int):
    """(conv(x, w) - mean) * gamma / sqrt(var + eps) + beta adds no kernel to the convolution's: the per-channel
    scale is computed in the conv kernel after its reduction (from 128 channels it was a kernel of its own), and
    the convolution reads its input through the padding's gates: one kernel, as tinygrad (at 14 x 14 it stored a
    padded copy first, its rows too narrow for vectors before opt.upcast_padded)."""
    x = RNG.standard_normal((2, channels, size, size)).astype(np.float32)
    w = conv_weight(channels, channels)
    bn, p = eval_batchnorm(channels)
    tx, tw = Tensor(x).realize(), Tensor(w).realize()
    out = bn(tx.conv2d(tw, padding=1))
    assert kernel_count(out) == kernel_count(tx.conv2d(tw, padding=1)) == 1
    want = torch_bn(F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1), p).numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels, size", SIZES)
def test_resnet_basic_block_is_its_two_convolutions_kernels(channels: int, size: int):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + x): each BatchNorm, relu and the residual add fuse into a conv kernel."""
    x = RNG.standard_normal((2, channels, size, size)).astype(np.float32)
    w1, w2 = conv_weight(channels, channels), conv_weight(channels, channels)
    (bn1, p1), (bn2, p2) = eval_batchnorm(channels), eval_batchnorm(channels)
    tx, tw1, tw2 = Tensor(x).realize(), Tensor(w1).realize(), Tensor(w2).realize()
    out = (bn2(bn1(tx.conv2d(tw1, padding=1)).relu().conv2d(tw2, padding=1)) + tx).relu()
    assert kernel_count(out) == 2 * kernel_count(tx.conv2d(tw1, padding=1)) == 2
    tx, tw1, tw2 = (torch.from_numpy(a) for a in (x, w1, w2))
    want = (torch_bn(F.conv2d(torch_bn(F.conv2d(tx, tw1, padding=1), p1).relu(), tw2, padding=1), p2) + tx).relu()
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, count", [((2, 4, 16, 8), 4), ((1, 2, 64, 64), 4), ((2, 8, 128, 64), 4),
                                          ((1, 2, 64, 192), 5)])
def test_attention_recomputes_its_softmax_weights_in_the_product_when_that_costs_less_than_a_kernel(shape, count):
    """softmax(q k^T / sqrt(d)) @ v: the scores, their max, the exp sum, and the product with v, whose loop
    recomputes each weight exp(s - max) / sum for the d columns that read it, once per register tile of them
    (LOOP_SHARE): 4 kernels, as tinygrad's 4 (5 before at 64 x 64 per head, which counted a computation per
    column; 5 at 128 x 64, where q @ k.T copied k.T first, as matmul does for one large matrix). At d = 192 the
    copies would cost more than storing the weights (STREAM_OPS): 5."""
    q, k, v = (RNG.standard_normal(shape).astype(np.float32) for _ in range(3))
    out = Tensor(q).realize().scaled_dot_product_attention(Tensor(k).realize(), Tensor(v).realize())
    assert kernel_count(out) == count
    want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v))).numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
