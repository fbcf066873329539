"""Freed host buffers are reused (device.Allocator): a new buffer of a freed one's size gets its memory, already
mapped, and results stay right although its old contents are still there."""

from __future__ import annotations

import gc

import numpy as np

from ember import Tensor
from ember.device import REUSE_MAX_BYTES, REUSE_MIN_BYTES, Allocator, Device, buffer_of
from ember.uop.ops import Ops


def address(t: Tensor) -> int:
    view = t.realize().uop
    while view.op is not Ops.BUFFER: view = view.src[0]
    return buffer_of(view).raw.ctypes.data


def test_a_freed_output_is_reused_and_overwritten():
    x = np.arange(1 << 18, dtype=np.float32)
    xt = Tensor(x).realize()
    first = xt * 2
    old = address(first)
    del first
    gc.collect()
    second = xt + 1  # same size: the freed buffer, holding 2x, is written whole
    assert address(second) == old
    np.testing.assert_array_equal(second.numpy(), x + 1)


def test_small_buffers_are_not_kept_and_the_cache_is_bounded():
    alloc = Allocator()
    small = alloc.alloc(REUSE_MIN_BYTES // 2)
    alloc.free(small, small.nbytes)
    assert alloc.kept_bytes == 0
    big = [alloc.alloc(REUSE_MAX_BYTES // 3) for _ in range(4)]
    for b in big: alloc.free(b, b.nbytes)
    assert alloc.kept_bytes == 3 * (REUSE_MAX_BYTES // 3) <= REUSE_MAX_BYTES
    assert alloc.alloc(REUSE_MAX_BYTES // 3) is big[2]  # the last one kept is handed out first
    assert alloc.kept_bytes == 2 * (REUSE_MAX_BYTES // 3)


def test_new_memory_is_zeroed():
    assert not Device["CPU"].allocator.alloc(REUSE_MIN_BYTES * 3 + 8).any()
