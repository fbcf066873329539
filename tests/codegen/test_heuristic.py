"""The heuristic's and the search's opts stay within what the device runs: no THREAD amount above the thread pool's
limit, whatever core count the renderer claims (opt.MAX_THREADS; the CPU pool refuses more slices). A convolution
whose rows vectors do not divide (ResNet's 14 x 14 and 7 x 7 stages) gets vector lanes and a register tile.

Oracle: numpy, for the values of the kernel the heuristic picked opts for on such a renderer; torch 2.13 for the
convolutions."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import Tensor
from ember.codegen import get_program
from ember.codegen.opt import MAX_THREADS, OptOps, kernel_axes
from ember.codegen.rangeify import rangeify
from ember.codegen.search import actions
from ember.device import Device
from ember.helpers import Context
from ember.renderer.cstyle import CRenderer


@pytest.mark.parametrize("cores", [MAX_THREADS + 1, 2 * MAX_THREADS, 3000])
def test_threads_capped_at_the_pool_limit(cores: int) -> None:
    """A renderer with more cores than the pool runs: the heuristic threads by MAX_THREADS (4096 rows divide by it),
    and the kernel it makes computes x * 2."""
    x = np.random.default_rng(0).uniform(-2, 2, (4096, 32)).astype(np.float32)
    (item,) = (Tensor(x) * 2).schedule()
    renderer = CRenderer(Device["CPU"].renderer.vector_bytes, cores, task_entries=True)
    with Context(NOOPT=0, BEAM=0): spec = get_program(item.ast, renderer)
    assert spec.threads == MAX_THREADS and any(o.op is OptOps.THREAD and o.amount == MAX_THREADS for o in spec.opts)
    # its slices one after another, through the task entry the pool would call (no pool of 1024 threads here)
    program = Device["CPU"].program(spec.name, Device["CPU"].compiler.compile_cached(spec.src))
    task = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32)(program.task.value)
    out = np.full(x.size, np.nan, np.float32)
    args = (ctypes.c_void_p * 2)(out.ctypes.data, x.ctypes.data)
    for core in range(spec.threads): task(args, core)
    np.testing.assert_array_equal(out.reshape(x.shape), x * 2)


def test_search_threads_capped_at_the_pool_limit() -> None:
    """The search tries THREAD by the largest divisor of the axis up to MAX_THREADS, not up to the core count."""
    (item,) = (Tensor(np.zeros((4096, 32), np.float32)) * 2).schedule()
    threads = [o.amount for o in actions(rangeify(item.ast), CRenderer(0, 4096)) if o.op is OptOps.THREAD]
    assert threads and max(threads) == MAX_THREADS


@pytest.mark.parametrize("width", [14, 7])
def test_a_convolution_whose_rows_vectors_do_not_divide_gets_padded_vectors(width: int) -> None:
    """conv2d over 2 x 32 x w x w, 3x3, padding 1: one kernel (no padded copy of the input), one loop per output axis
    (the padding's gates do not unroll the 7 x 7 output into 49 copies of the channel loop), an UPCAST of the row
    by a full vector that does not divide it (its last lanes gated off: opt.upcast_padded) and one of the output
    channels beside it (a register tile). Before, both were scalar loops: 2 x 128 x 14 x 14 ran 27x slower."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 32, width, width)).astype(np.float32)
    w = (rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
    out = Tensor(x).realize().conv2d(Tensor(w).realize(), padding=1)
    (item,) = out.schedule()
    renderer = Device["CPU"].renderer
    if renderer.vector_bytes < 16: pytest.skip("no vector registers")
    lanes = renderer.vector_bytes // 4
    assert [int(a.src[0].arg) for a in kernel_axes(rangeify(item.ast))] == [2, 32, width, width, 32, 3, 3]
    with Context(NOOPT=0, BEAM=0): spec = get_program(item.ast, renderer)
    upcasts = [o for o in spec.opts if o.op is OptOps.UPCAST]
    assert upcasts[0].axis == 3 and upcasts[0].amount % lanes == 0 and width % upcasts[0].amount
    assert any(o.axis == 1 for o in upcasts[1:])
    np.testing.assert_allclose(out.numpy(), F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy(),
                               rtol=1e-5, atol=1e-5)
