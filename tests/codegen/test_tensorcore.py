"""Tensor cores: the declared fragment layouts, the TC opt, and matmuls executed with exactly a GPU's fragment
shuffling on CL:CUDA (PoCL running OpenCL with CUDA's tensor cores emulated in local memory, one work-item per lane),
against numpy. The layouts are checked against the PTX ISA's formulas; NULL:CUDA compiles the mma.sync kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import Tensor
from ember.codegen import get_program
from ember.codegen.opt import KernelOptError, Opt, OptOps
from ember.device import Device
from ember.dtype import dtypes
from ember.renderer.cuda import CUDARenderer
from ember.renderer.tensorcore import CUDA_TENSOR_CORES, c_index
from tests.helpers import device_or_skip, tensor_on

TILE = {"a": lambda tc: (tc.dims[0], tc.dims[2]), "b": lambda tc: (tc.dims[2], tc.dims[1]),
        "c": lambda tc: (tc.dims[0], tc.dims[1])}


@pytest.mark.parametrize("tc", CUDA_TENSOR_CORES, ids=str)
@pytest.mark.parametrize("operand", "abc")
def test_each_layout_covers_its_tile_once(tc, operand) -> None:
    held = [tc.position(operand, lane, e) for lane in range(tc.threads) for e in range(tc.elements(operand))]
    rows, cols = TILE[operand](tc)
    assert sorted(held) == [(r, c) for r in range(rows) for c in range(cols)]


def test_mma_layouts_are_the_ptx_isa_ones() -> None:
    """PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type": groupID = lane >> 2,
    threadID_in_group = lane % 4."""
    tc = CUDA_TENSOR_CORES[0]
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            assert tc.position("a", lane, i) == (g + 8 * (i in (2, 3, 6, 7)), t * 2 + (i & 1) + 8 * (i >= 4))
        for i in range(4):
            assert tc.position("b", lane, i) == (t * 2 + (i & 1) + 8 * (i >= 2), g)
            assert tc.position("c", lane, i) == (g + 8 * (i >= 2), t * 2 + (i & 1))
            for operand in "bc":  # the C expression OpenCL's reference computes the same position
                row, col = (eval(c_index(bits, "lane", i), {"lane": lane})
                            for bits in tc.layout(operand))
                assert (row, col) == tc.position(operand, lane, i)


def matmul_f32(a: Tensor, b: Tensor) -> Tensor:
    """A @ B summed in float32 from products of the narrow inputs: the pattern of a tensor core with float output."""
    return (a.float().unsqueeze(-1) * b.float().unsqueeze(-3)).sum(-2)


SIZES = [(16, 16, 8), (17, 33, 9), (5, 100, 3), (64, 48, 40), (31, 17, 65)]


@pytest.mark.parametrize("n,k,m", SIZES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_matmul_of_odd_sizes_equals_numpy(n, k, m, dtype) -> None:
    device_or_skip("CL:CUDA")
    on = tensor_on("CL:CUDA")
    rng = np.random.default_rng(n * k * m)
    a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
    ta, tb = on(a).cast(dtype), on(b).cast(dtype)
    exact_a, exact_b = ta.float().numpy().astype(np.float64), tb.float().numpy().astype(np.float64)
    out = matmul_f32(ta, tb)
    (item,) = out.schedule()
    assert any(o.op is OptOps.TC for o in get_program(item.ast, Device["CL:CUDA"].renderer).opts)
    # products of half or bfloat16 are exact in float32; only the float32 sums round
    np.testing.assert_allclose(out.numpy(), exact_a @ exact_b, rtol=0, atol=k * 2e-7 * np.abs(exact_a).max() *
                               np.abs(exact_b).max())


def test_a_half_matmul_with_epilogue_and_a_batch() -> None:
    """torch's half matmul (float32 sums, a half result), a bias and a ReLU after it, over a batch of 3."""
    device_or_skip("CL:CUDA")
    on = tensor_on("CL:CUDA")
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 20, 24)).astype(np.float16), rng.standard_normal((3, 24, 12)).astype(np.float16)
    bias = rng.standard_normal(12).astype(np.float16)
    got = ((on(x) @ on(w)) + on(bias)).relu().numpy()
    product = (x.astype(np.float64) @ w.astype(np.float64)).astype(np.float16)
    want = np.maximum(product + bias, np.float16(0))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=2e-3)


def test_a_half_convolution_goes_on_the_tensor_core() -> None:
    """conv2d of half (sums in float32): its channel axis is the tensor core's K, its output channels N."""
    device_or_skip("CL:CUDA")
    on = tensor_on("CL:CUDA")
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 12, 9, 9)).astype(np.float16), rng.standard_normal((20, 12, 3, 3)).astype(np.float16)
    out = on(x).conv2d(on(w), padding=1)
    (item,) = out.schedule()
    assert any(o.op is OptOps.TC for o in get_program(item.ast, Device["CL:CUDA"].renderer).opts)
    want = torch.nn.functional.conv2d(torch.tensor(x).double(), torch.tensor(w).double(), padding=1).half().numpy()
    np.testing.assert_allclose(out.numpy().astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=2e-3)


def half_matmul_ast():
    a, b = Tensor(np.ones((32, 32), np.float16)), Tensor(np.ones((32, 16), np.float16))
    (item,) = (a @ b).schedule()
    return item.ast


def test_tc_is_refused_where_it_does_not_fit() -> None:
    cuda = CUDARenderer()
    (item,) = (Tensor(np.ones((32, 32), np.float32)) @ Tensor(np.ones((32, 16), np.float32))).schedule()
    with pytest.raises(KernelOptError, match="not float16"):
        get_program(item.ast, cuda, opts=[Opt(OptOps.TC, 2, 0)])
    with pytest.raises(KernelOptError, match="has 0 tensor cores"):
        get_program(half_matmul_ast(), Device["CPU"].renderer, opts=[Opt(OptOps.TC, 2, 0)])
    with pytest.raises(KernelOptError, match="not a reduce axis"):
        get_program(half_matmul_ast(), cuda, opts=[Opt(OptOps.TC, 0, 0)])
    with pytest.raises(KernelOptError, match="UPCAST after TC"):
        get_program(half_matmul_ast(), cuda, opts=[Opt(OptOps.TC, 2, 0), Opt(OptOps.UPCAST, 0, 2)])
    with pytest.raises(KernelOptError, match="TC comes first"):
        get_program(half_matmul_ast(), cuda, opts=[Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.TC, 2, 0)])


def test_cuda_renders_mma_sync_and_nvrtc_compiles_it() -> None:
    null = device_or_skip("NULL:CUDA")
    spec = get_program(half_matmul_ast(), null.renderer)
    assert [o.op for o in spec.opts][0] is OptOps.TC and "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in spec.src
    assert spec.local_size[0] == 32  # the warp's lanes are threadIdx.x
    null.compiler.compile(spec.src)  # sm_90 cubin: ptxas accepted the mma's operands
    bf16 = Tensor(np.ones((32, 32), np.float32)).cast(dtypes.bfloat16)
    (item,) = matmul_f32(bf16, bf16).schedule()
    spec = get_program(item.ast, null.renderer)
    assert ".f32.bf16.bf16.f32" in spec.src
    null.compiler.compile(spec.src)
