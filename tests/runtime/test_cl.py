"""The CL device (OpenCL through libOpenCL, PoCL here): kernels rendered in OpenCL C, launched over workgroups, with
the CPU's results. The op suite runs on it with DEVICE=CL (tests/conftest.py); these test what is CL's own: the
dialect, the launch grid, half as a storage type, errors that name the problem. Skipped with the reason where no
OpenCL platform is installed."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Context, Tensor
from ember.codegen import get_program
from ember.codegen.opt import KernelOptError, Opt, OptOps
from ember.codegen.rangeify import rangeify
from ember.codegen.search import actions
from ember.device import Buffer, Device
from ember.dtype import dtypes
from ember.errors import CompileError, DeviceError
from tests.helpers import device_or_skip, tensor_on

CL = device_or_skip("CL")
cl = tensor_on("CL")


def test_elementwise_and_reduce_equal_the_cpu() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (37, 53)).astype(np.float32)
    for fn in (lambda t: (t * 2 + 1).exp().sum(1), lambda t: t.max(0).values, lambda t: t.softmax(-1),
               lambda t: t @ t.T):
        np.testing.assert_allclose(fn(cl(x)).numpy(), fn(Tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_integers_are_exact_and_never_trap() -> None:
    a = np.array([7, -7, 2**31 - 1, -2**31, 5, 0], np.int32)
    b = np.array([2, 2, -1, -1, 0, 3], np.int32)
    for fn in (lambda x, y: x // y, lambda x, y: x % y, lambda x, y: x << (y & 31), lambda x, y: x * y + 1):
        np.testing.assert_array_equal(fn(cl(a), cl(b)).numpy(), fn(Tensor(a), Tensor(b)).numpy())


def test_float_to_int_and_bool_memory() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 3.7, -3.7, 3e9], np.float32)
    np.testing.assert_array_equal(cl(x).cast("int32").numpy(), Tensor(x).cast("int32").numpy())
    mask = cl(x) > 0
    assert mask.dtype.name == "bool" and mask.numpy().tolist() == (Tensor(x) > 0).numpy().tolist()


def test_half_is_stored_as_half_and_rounds_after_every_op() -> None:
    """PoCL has no cl_khr_fp16: half computes in float, rounded to half after each op, which gives half's bits."""
    x = np.random.default_rng(1).uniform(-8, 8, 1000).astype(np.float16)
    for fn in (lambda t: t * t + t, lambda t: (t / 3).sqrt() - 1, lambda t: t.sum()):
        got, want = fn(cl(np.abs(x))).numpy(), fn(Tensor(np.abs(x))).numpy()
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, want)


def test_more_than_three_output_axes_share_the_last_grid_dimension() -> None:
    a = np.arange(2 * 3 * 4 * 5 * 6, dtype=np.int32).reshape(2, 3, 4, 5, 6)
    np.testing.assert_array_equal((cl(a).permute(4, 2, 0, 3, 1) * 3).numpy(), a.transpose(4, 2, 0, 3, 1) * 3)


def test_kernels_run_in_workgroups() -> None:
    (item,) = (cl(np.ones((64, 64), np.float32)).exp() + 1).schedule()
    spec = get_program(item.ast, CL.renderer)
    assert "__kernel void" in spec.src and "get_local_id(0)" in spec.src
    assert spec.local_size is not None and 1 < np.prod(spec.local_size) <= CL.renderer.local_threads
    assert np.prod(spec.global_size) * np.prod(spec.local_size) == 64 * 64


def test_local_opts_are_checked_against_the_device() -> None:
    (item,) = (cl(np.ones((64, 64, 64), np.float32)).exp() + 1).schedule()
    with pytest.raises(KernelOptError, match="threads per workgroup"):  # 64 ** 3: more than any device has
        get_program(item.ast, CL.renderer, opts=[Opt(OptOps.LOCAL, 0, 64)] * 3)
    with pytest.raises(KernelOptError, match="runs workgroups, not CPU threads"):
        get_program(item.ast, CL.renderer, opts=[Opt(OptOps.THREAD, 0, 2)])
    (cpu_item,) = (Tensor(np.ones((64, 64), np.float32)).exp() + 1).schedule()
    with pytest.raises(KernelOptError, match="has no workgroups"):
        get_program(cpu_item.ast, Device["CPU"].renderer, opts=[Opt(OptOps.LOCAL, 0, 4)])


def test_a_build_error_shows_the_log_and_the_line() -> None:
    src = "__kernel void broken(__global float* data0) {\n  data0[0] = undefined_name;\n}\n"
    with pytest.raises(CompileError, match=r"(?s)undefined_name.*>>\s+2 \|"):
        CL.compiler.compile(src)


def test_two_devices_in_one_op_is_an_error_naming_both() -> None:
    with pytest.raises(DeviceError, match="CPU and CL"):
        Tensor([1.0, 2.0], device="CPU") + cl(np.array([1.0, 2.0], np.float32))


def test_to_moves_between_devices() -> None:
    x = np.arange(6, dtype=np.float32)
    t = Tensor(x).to("CL")
    assert t.device == "CL" and (t + 1).to("CPU").device == "CPU"
    np.testing.assert_array_equal((t + 1).to("CPU").numpy(), x + 1)


def test_bitcasts_give_the_cpus_bits() -> None:
    """Bit casts between same-size types, through bfloat16 and half held in float registers; a NaN converted to half
    keeps its sign and top payload bits, quiet, as the CPU's conversion does (not PoCL's 0x7fff)."""
    x = np.array([1.5, -2.25, np.inf, np.nan, -np.nan, 1e-8], np.float32)
    for fn in (lambda t: t.bitcast("int32"), lambda t: t.cast("bfloat16").bitcast("int16"),
               lambda t: t.cast("float16").bitcast("int16"), lambda t: t.bitcast("uint32").bitcast("float32"),
               lambda t: t.cast("float16").bitcast("int16").bitcast("float16").cast("float32").bitcast("int32")):
        np.testing.assert_array_equal(fn(cl(x)).numpy(), fn(Tensor(x)).numpy())


@pytest.mark.parametrize("shape", [(4, 1000), (3, 5, 64), (1, 4096)])
def test_grouped_reductions_meet_in_shared_memory(shape: tuple[int, ...]) -> None:
    """A kernel with few outputs splits its reduction across a workgroup (GROUP): partials in __local memory, a
    barrier, one thread stores. Sums regroup (rounding within a sum's tolerance); max, min and integer sums exact."""
    x = np.random.default_rng(2).uniform(-3, 3, shape).astype(np.float32)
    (item,) = cl(x).sum(-1).schedule()
    spec = get_program(item.ast, CL.renderer)
    assert any(o.op is OptOps.GROUP for o in spec.opts) and "__local" in spec.src and "barrier(" in spec.src
    assert spec.shared_bytes == 4 * int(np.prod(spec.local_size or (1,)))  # a float partial per thread
    for fn in (lambda t: t.sum(-1), lambda t: t.mean(-1), lambda t: t.var(-1), lambda t: t.softmax(-1)):
        np.testing.assert_allclose(fn(cl(x)).numpy(), fn(Tensor(x)).numpy(), rtol=1e-5, atol=1e-5)
    for fn in (lambda t: t.max(-1).values, lambda t: t.min(-1).values, lambda t: t.argmax(-1)):
        np.testing.assert_array_equal(fn(cl(x)).numpy(), fn(Tensor(x)).numpy())
    ints = (x * 100).astype(np.int32)
    np.testing.assert_array_equal(cl(ints).sum(-1).numpy(), Tensor(ints).sum(-1).numpy())


def run_with_opts(x: np.ndarray, fn, opts: list[Opt]) -> tuple[np.ndarray, str]:
    """fn(x)'s one kernel run on CL with `opts`, and its source."""
    (item,) = fn(cl(x)).schedule()
    spec = get_program(item.ast, CL.renderer, opts=opts)
    out, inp = Buffer("CL", item.bufs[0].size, item.bufs[0].dtype), Buffer("CL", x.size, dtypes.float32).copyin(x)
    CL.program(spec, CL.compiler.compile(spec.src))(out, inp, wait=True)
    return out.numpy(), spec.src


@pytest.mark.parametrize("kind", [OptOps.GROUP, OptOps.GROUPTOP])
def test_grouptop_splits_the_reduction_in_chunks(kind: OptOps) -> None:
    """GROUPTOP: thread l of 16 reduces elements l*64 .. l*64+63 of a row of 1024 (GROUP: l, l+16, ...): the same
    sums within rounding, the same max exactly."""
    x = np.random.default_rng(5).uniform(-3, 3, (3, 1024)).astype(np.float32)
    total, src = run_with_opts(x, lambda t: t.sum(-1), [Opt(kind, 1, 16)])
    np.testing.assert_allclose(total, x.sum(-1), rtol=1e-5)
    assert ("*64" in src) == (kind is OptOps.GROUPTOP)
    np.testing.assert_array_equal(run_with_opts(x, lambda t: t.max(-1).values, [Opt(kind, 1, 16)])[0], x.max(-1))


def test_group_is_checked_against_the_device() -> None:
    (item,) = cl(np.ones((4, 1024), np.float32)).sum(1).schedule()
    with pytest.raises(KernelOptError, match="grouped twice"):
        get_program(item.ast, CL.renderer, opts=[Opt(OptOps.GROUP, 1, 4), Opt(OptOps.GROUP, 1, 4)])
    with pytest.raises(KernelOptError, match="LOCAL after GROUP"):
        get_program(item.ast, CL.renderer, opts=[Opt(OptOps.GROUP, 1, 4), Opt(OptOps.LOCAL, 0, 4)])
    with pytest.raises(KernelOptError, match="applies to reduce axes"):
        get_program(item.ast, CL.renderer, opts=[Opt(OptOps.GROUP, 0, 4)])
    (cpu_item,) = Tensor(np.ones((4, 1024), np.float32)).sum(1).schedule()
    with pytest.raises(KernelOptError, match="no workgroups with shared memory"):
        get_program(cpu_item.ast, Device["CPU"].renderer, opts=[Opt(OptOps.GROUP, 1, 4)])


def test_beam_search_times_candidates_on_the_device() -> None:
    """BEAM on CL: candidates (LOCAL and GROUP among them) compiled by the platform, timed on the device; the winner
    computes what the CPU does."""
    x = np.random.default_rng(3).uniform(-1, 1, (32, 256)).astype(np.float32)
    (item,) = cl(x).exp().sum(1).schedule()
    kinds = {o.op for o in actions(rangeify(item.ast), CL.renderer)}
    assert {OptOps.LOCAL, OptOps.GROUP} <= kinds and OptOps.THREAD not in kinds
    with Context(BEAM=1): got = cl(x).exp().sum(1).numpy()
    np.testing.assert_allclose(got, np.exp(x).sum(1), rtol=1e-5)


def test_padto_pads_an_axis_of_few_divisors_for_its_workgroups() -> None:
    """37 x 1021 (both prime): the heuristic pads the rows to a multiple of 32 for workgroups of 32 threads; the
    threads past the end read nothing and store nothing."""
    x = np.random.default_rng(4).uniform(-1, 1, (37, 1021)).astype(np.float32)
    (item,) = (cl(x) * 3 + 1).schedule()
    spec = get_program(item.ast, CL.renderer)
    assert Opt(OptOps.PADTO, 1, 32) in spec.opts and Opt(OptOps.LOCAL, 1, 32) in spec.opts
    np.testing.assert_array_equal((cl(x) * 3 + 1).numpy(), (Tensor(x) * 3 + 1).numpy())
    (item,) = cl(x).max(1).values.schedule()
    for opts in ([Opt(OptOps.PADTO, 0, 16), Opt(OptOps.LOCAL, 0, 16)], [Opt(OptOps.PADTO, 0, 64)]):
        spec = get_program(item.ast, CL.renderer, opts=opts)
        program = CL.program(spec, CL.compiler.compile(spec.src))
        program(*item.bufs)
        np.testing.assert_array_equal(item.bufs[0].numpy(), x.max(1))
    with pytest.raises(KernelOptError, match="PADTO applies to output axes"):
        get_program(item.ast, CL.renderer, opts=[Opt(OptOps.PADTO, 1, 1024)])


def test_a_symbolic_batch_is_a_grid_dimension_of_its_size() -> None:
    """A loop of symbolic size (a batch bound per call) is split into workgroups of threads (LOCAL) over a grid
    dimension whose size is computed from the variable's value at each launch, not a loop each thread runs; the rows
    past n store nothing; the program cache keeps the size as a form."""
    from ember.variables import Variable
    n = Variable("n", 1, 200)
    x = np.arange(200 * 8, dtype=np.float32)
    from ember.engine import realize
    for rows in (5, 130, 1):
        t = cl(x[:rows * 8]).realize().reshape(n.bind(rows), 8)
        np.testing.assert_array_equal((t * 2 + 1).sum(1).numpy(), (x[:rows * 8].reshape(rows, 8) * 2 + 1).sum(1))
    specs = [r.spec for key, r in realize._runners.items() if key[0] == "CL" and "n" in r.spec.variables]
    assert specs and all(s.local_size == (64,) and s.grid((7,))[0] == 1 and s.grid((130,))[0] == 3 for s in specs)
    assert all("%" not in s.src[s.src.index("__kernel"):] for s in specs)  # (gidx < n: no `% n` left)
    for s in specs:  # the program cache keeps the symbolic size and reads it back
        back = realize.spec_from_json(realize.spec_to_json(s, "key"), s.ast, "key")
        assert back is not None and back.global_size == s.global_size and back.grid((9,)) == s.grid((9,))
