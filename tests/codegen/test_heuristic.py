"""The heuristic's and the search's opts stay within what the device runs: no THREAD amount above the thread pool's
limit, whatever core count the renderer claims (CRenderer.max_threads; the CPU pool refuses more slices). A convolution
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
from ember.codegen.opt import OptOps, kernel_axes
from ember.codegen.rangeify import rangeify
from ember.codegen.search import actions
from ember.device import Device
from ember.helpers import Context
from ember.renderer.cstyle import CRenderer
from ember.uop.ops import Ops


@pytest.mark.parametrize("cores", [CRenderer.max_threads + 1, 2 * CRenderer.max_threads, 3000])
def test_threads_capped_at_the_pool_limit(cores: int) -> None:
    """A renderer with more cores than the pool runs: the heuristic threads by the pool's limit (4096 rows
    divide by it), and the kernel it makes computes x * 2."""
    x = np.random.default_rng(0).uniform(-2, 2, (4096, 32)).astype(np.float32)
    (item,) = (Tensor(x) * 2).schedule()
    renderer = CRenderer(Device["CPU"].renderer.vector_bytes, cores, task_entries=True)
    with Context(NOOPT=0, BEAM=0): spec = get_program(item.ast, renderer)
    most = CRenderer.max_threads
    assert spec.threads == most and any(o.op is OptOps.THREAD and o.amount == most for o in spec.opts)
    # its slices one after another, through the task entry the pool would call (no pool of 1024 threads here)
    program = Device["CPU"].program(spec, Device["CPU"].compiler.compile_cached(spec.src))
    task = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32)(program.task.value)
    out = np.full(x.size, np.nan, np.float32)
    args = (ctypes.c_void_p * 2)(out.ctypes.data, x.ctypes.data)
    for core in range(spec.threads): task(args, core)
    np.testing.assert_array_equal(out.reshape(x.shape), x * 2)


def test_search_threads_capped_at_the_pool_limit() -> None:
    """The search tries THREAD by the largest divisor of the axis up to the pool's limit, not up to the core count."""
    (item,) = (Tensor(np.zeros((4096, 32), np.float32)) * 2).schedule()
    threads = [o.amount for o in actions(rangeify(item.ast), CRenderer(0, 4096)) if o.op is OptOps.THREAD]
    assert threads and max(threads) == CRenderer.max_threads


@pytest.mark.parametrize("width", [14])  # (rows under 8 are a matmul of windows: mixin/nn.py IM2COL_BELOW)
def test_a_convolution_whose_rows_vectors_do_not_divide_gets_padded_vectors(width: int) -> None:
    """conv2d over 2 x 32 x w x w, 3x3, padding 1: one kernel (no padded copy of the input), one loop per output axis
    (the padding's gates do not unroll the 7 x 7 output into 49 copies of the channel loop), an UPCAST of the row
    by a full vector that does not divide it (its last lanes gated off: opt.upcast_padded) and one of the output
    channels beside it (a register tile). Before, both were scalar loops: 2 x 128 x 14 x 14 ran 27x slower. The
    vector is the widest that pads the row by at most a third: 7 floats take 8 lanes of AVX-512's 16 (half a vector)."""
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
    widest = lanes if -(-width // lanes) * lanes <= width * 4 / 3 else lanes // 2
    assert upcasts[0].axis == 3 and upcasts[0].amount % widest == 0 and width % upcasts[0].amount
    assert any(o.axis == 1 for o in upcasts[1:])
    np.testing.assert_allclose(out.numpy(), F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy(),
                               rtol=1e-5, atol=1e-5)


def executions(uops: list, ops: set) -> int:
    """How many times the linearized kernel evaluates `ops`, lanes counted, each loop's trip count multiplied in."""
    count, trips = 0, [next((int(u.src[0].arg) for u in uops if u.op is Ops.SPECIAL), 1)]
    for u in uops:
        if u.op is Ops.RANGE: trips.append(trips[-1] * int(u.src[0].vmax))
        elif u.op is Ops.END: trips.pop()
        elif u.op in ops: count += trips[-1] * u.dtype.count
    return count


@pytest.mark.parametrize("vector_bytes", [16, 32, 64])
def test_attention_evaluates_each_softmax_weight_once_in_its_product_with_v(vector_bytes: int) -> None:
    """scaled_dot_product_attention's last kernel sums exp(s - max) / sum * v over the keys: the weight moves with
    the query and the key, not with v's columns, so a register tile of 4 rows x 2 vectors computed each weight once
    per 16 columns (4 exps each at d = 64: 3.6 ms of 4.6 ms at 2 x 8 x 128 x 64). The tile is as wide as the
    heuristic's widest, 8 vectors: one exp and one division per weight where they span the row of v (AVX2, AVX-512),
    two with SSE's 4 lanes; values against torch."""
    rng = np.random.default_rng(11)
    b, h, n, d = 2, 2, 32, 64
    q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32) for _ in range(3))
    out = Tensor(q).realize().scaled_dot_product_attention(Tensor(k).realize(), Tensor(v).realize())
    last = out.schedule()[-1]
    renderer = CRenderer(vector_bytes, 1)
    with Context(NOOPT=0, BEAM=0): spec = get_program(last.ast, renderer)
    assert spec.uops is not None
    per_weight = -(-d // (vector_bytes // 4 * 8))
    assert executions(spec.uops, {Ops.EXP, Ops.EXP2}) == per_weight * b * h * n * n
    assert executions(spec.uops, {Ops.FDIV, Ops.RECIPROCAL}) == per_weight * b * h * n * n
    want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v))).numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vector_bytes", [16, 32, 64])
def test_a_max_pool_and_its_gradient_go_in_vectors_along_the_rows_they_store(vector_bytes: int) -> None:
    """A 2 x 2 max pool reads its window at 2x + k and its gradient reads the pooled values at x // 2: no load walks
    a row with stride one, but the stores do. Both kernels are UPCAST along the stored row (the lanes' addresses
    are constants from one base) and the pool's maxima go in vector accumulators, not one per lane: in scalar code
    the 32 x 32 x 32 x 32 pool took 2.4 ms, its gradient 2.8 ms; in vectors 0.1 and 0.2 ms. Values against torch."""
    rng = np.random.default_rng(5)
    x_np = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    x = Tensor(x_np, requires_grad=True)
    out = x.max_pool2d(2)
    gx, = (out * out).sum().gradient(x)
    renderer = CRenderer(vector_bytes, 1)
    for t in (out, gx):
        for item in t.schedule():
            sink = rangeify(item.ast)
            window = [u for u in sink.toposort() if u.op is Ops.REDUCE]
            with Context(NOOPT=0, BEAM=0): spec = get_program(item.ast, renderer)
            assert spec.opts and spec.opts[0].op is OptOps.UPCAST, (t is out, spec.opts)
            if window: assert all(u.dtype.count > 1 for u in spec.uops if u.op is Ops.DEFINE_REG)
    tx = torch.tensor(x_np, requires_grad=True)
    want = F.max_pool2d(tx, 2)
    want_gx, = torch.autograd.grad((want * want).sum(), tx)
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    np.testing.assert_allclose(gx.numpy(), want_gx.numpy(), rtol=1e-6)


@pytest.mark.parametrize("rows, cols", [(16, 256), (256, 16)])
def test_dot_products_loop_over_the_larger_operand_outside(rows: int, cols: int) -> None:
    """x @ w.T reads both operands along the sum (a tile of dot products). The loop over the larger operand's rows
    goes outside (SWAP when that is w's), so a tile of it stays in cache while the smaller one streams past from a
    cache it fits in (GPT-2's 128 x 768 activations against a 3072 x 768 weight: 21 -> 60 GFLOP/s). Values
    against numpy."""
    rng = np.random.default_rng(2)
    x_np, w_np = rng.standard_normal((rows, 64)).astype(np.float32), rng.standard_normal((cols, 64)).astype(np.float32)
    out = Tensor(x_np).realize() @ Tensor(w_np).realize().T
    (item,) = out.schedule()
    renderer = CRenderer(32, 1)
    with Context(NOOPT=0, BEAM=0): spec = get_program(item.ast, renderer)
    assert any(o.op is OptOps.UNROLL for o in spec.opts)
    assert any(o.op is OptOps.SWAP for o in spec.opts) == (cols > rows), spec.opts
    np.testing.assert_allclose(out.numpy(), x_np @ w_np.T, rtol=1e-4, atol=1e-4)
