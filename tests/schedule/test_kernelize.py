"""The scheduler fuses a program into the expected number of kernels, and the fused kernels compute numpy's result.

Oracle: the kernel count each program is known to need (an upper bound where fewer would also be right), and numpy
for the values. GlobalCounters are checked against the bytes and ops a kernel must at least move and do.
"""

from __future__ import annotations

import importlib.util
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from ember import Tensor
from ember.codegen.linearize import linearize
from ember.codegen.lowerer import lower
from ember.codegen.rangeify import rangeify
from ember.engine.realize import GlobalCounters
from ember.uop.ops import GroupOp, Ops, UOp

RNG = np.random.default_rng(0)
ARRAYS = {
    "a": RNG.uniform(-2, 2, (4, 6)).astype(np.float32),
    "b": RNG.uniform(-2, 2, (4, 6)).astype(np.float32),
    "c": RNG.uniform(-2, 2, (4, 6)).astype(np.float32),
    "m": RNG.uniform(-2, 2, (6, 5)).astype(np.float32),
    "v": RNG.uniform(-2, 2, (4,)).astype(np.float32),
    "i": RNG.integers(-50, 50, (4, 6)).astype(np.int32),
}


def tensors() -> dict[str, Tensor]:
    return {k: Tensor(v.copy()) for k, v in ARRAYS.items()}


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def em_softmax(x: Tensor) -> Tensor:
    e = (x - x.max(axis=1, keepdim=True)).exp()
    return e / e.sum(1, keepdim=True)


@dataclass(frozen=True)
class Case:
    """A program in ember and in numpy, and the number of kernels it takes (`exact` False: at most that many)."""

    name: str
    ember: Callable[[dict[str, Tensor]], Tensor]
    numpy: Callable[[dict[str, np.ndarray]], np.ndarray]
    kernels: int
    exact: bool = True


CASES = [
    Case("add_mul_relu", lambda t: ((t["a"] + t["b"]) * t["c"]).relu(),
         lambda n: np.maximum((n["a"] + n["b"]) * n["c"], 0), 1),
    Case("mul_sum_all", lambda t: (t["a"] * t["b"]).sum(), lambda n: (n["a"] * n["b"]).sum(), 1),
    Case("sum_axis_plus_vector", lambda t: t["a"].sum(1) + t["v"], lambda n: n["a"].sum(1) + n["v"], 1),
    Case("sub_rowmax", lambda t: t["a"] - t["a"].max(axis=1, keepdim=True),
         lambda n: n["a"] - n["a"].max(1, keepdims=True), 2, exact=False),
    Case("softmax", lambda t: em_softmax(t["a"]), lambda n: np_softmax(n["a"]), 3, exact=False),
    Case("matmul", lambda t: t["a"] @ t["m"], lambda n: n["a"] @ n["m"], 1),
    Case("matmul_relu", lambda t: (t["a"] @ t["m"]).relu(), lambda n: np.maximum(n["a"] @ n["m"], 0), 1),
    Case("matmul_bias_relu", lambda t: (t["a"] @ t["m"] + t["v"].reshape(4, 1)).relu(),
         lambda n: np.maximum(n["a"] @ n["m"] + n["v"].reshape(4, 1), 0), 1),
    Case("sum_of_permuted", lambda t: t["a"].permute(1, 0).sum(1), lambda n: n["a"].T.sum(1), 1),
    Case("sum_of_padded", lambda t: t["a"].pad(((1, 2), (0, 3))).sum(0),
         lambda n: np.pad(n["a"], ((1, 2), (0, 3))).sum(0), 1),
    Case("max_of_padded", lambda t: (t["a"] - 5).pad(((1, 0), (2, 1))).max(axis=1),
         lambda n: np.pad(n["a"] - 5, ((1, 0), (2, 1))).max(1), 1),
    Case("sum_of_flipped", lambda t: (t["a"].flip(1) * t["b"]).sum(1), lambda n: (n["a"][:, ::-1] * n["b"]).sum(1), 1),
    Case("sum_of_sliced", lambda t: t["a"][1:3, ::2].sum(1), lambda n: n["a"][1:3, ::2].sum(1), 1),
    Case("sum_of_shrunk_transposed", lambda t: t["a"].T[1:5, 1:3].sum(0), lambda n: n["a"].T[1:5, 1:3].sum(0), 1),
    Case("sum_of_reshaped", lambda t: t["a"].reshape(2, 12).sum(1), lambda n: n["a"].reshape(2, 12).sum(1), 1),
    Case("nested_sums", lambda t: t["a"].sum(1).sum(0), lambda n: n["a"].sum(1).sum(0), 1),
    Case("two_reduces_one_expr", lambda t: t["a"].sum() + t["b"].max(), lambda n: n["a"].sum() + n["b"].max(), 1),
    Case("two_axis_reduces_one_expr", lambda t: t["a"].sum(1) * t["b"].max(axis=1),
         lambda n: n["a"].sum(1) * n["b"].max(1), 1),
    Case("shared_subexpression", lambda t: (lambda s: s * s + s)(t["a"] + t["b"]),
         lambda n: (lambda s: s * s + s)(n["a"] + n["b"]), 1),
    Case("shared_reduce_two_readers", lambda t: (lambda s: s.exp() + s * 2)(t["a"].sum(0)),
         lambda n: (lambda s: np.exp(s) + s * 2)(n["a"].sum(0)), 1),
    Case("contiguous_forces_a_kernel", lambda t: (t["a"] + 1).contiguous() * 2,
         lambda n: (n["a"] + 1) * 2, 2),
    Case("contiguous_of_transpose", lambda t: t["a"].T.contiguous(), lambda n: n["a"].T, 1),
    Case("expand_then_add", lambda t: t["a"][:1].expand(4, 6) + t["b"], lambda n: n["a"][:1] + n["b"], 1),
    Case("reshape_permute_reshape", lambda t: t["a"].reshape(6, 4).permute(1, 0).reshape(24) + 1,
         lambda n: n["a"].reshape(6, 4).T.reshape(24) + 1, 1),
    Case("divide_by_total", lambda t: t["a"] / t["a"].abs().sum(), lambda n: n["a"] / np.abs(n["a"]).sum(),
         2, exact=False),
    Case("mean_axis", lambda t: t["a"].mean(1), lambda n: n["a"].mean(1), 1),
    Case("centered_square_mean", lambda t: ((t["a"] - t["a"].mean(1, keepdim=True)).square()).mean(1),
         lambda n: np.square(n["a"] - n["a"].mean(1, keepdims=True)).mean(1), 2, exact=False),
    Case("int_sum_where", lambda t: (t["i"] < 0).where(t["i"], t["i"] * 3).sum(0),
         lambda n: np.where(n["i"] < 0, n["i"], n["i"] * 3).sum(0), 1),
    Case("reduce_over_size_one_axis", lambda t: t["a"].reshape(4, 1, 6).sum(1) + 1,
         lambda n: n["a"].reshape(4, 1, 6).sum(1) + 1, 1),
    Case("reduce_chain_then_broadcast", lambda t: (t["a"].sum(1, keepdim=True) + 1).relu() * t["a"],
         lambda n: np.maximum(n["a"].sum(1, keepdims=True) + 1, 0) * n["a"], 2),
    Case("nested_reduce_broadcast", lambda t: t["a"] - t["a"].sum(1, keepdim=True).sum(0, keepdim=True),
         lambda n: n["a"] - n["a"].sum(), 2),
    Case("two_broadcast_reduces", lambda t: t["a"].sum(1, keepdim=True) * t["a"].max(axis=0, keepdim=True),
         lambda n: n["a"].sum(1, keepdims=True) * n["a"].max(0, keepdims=True), 3, exact=False),
    Case("reduce_read_through_views", lambda t: (lambda s: s.reshape(2, 2).T.reshape(4) + s)(t["a"].sum(1)),
         lambda n: (lambda s: s.reshape(2, 2).T.reshape(4) + s)(n["a"].sum(1)), 1),
    Case("pad_of_reduce_of_pad", lambda t: t["a"].pad(((1, 1), (1, 1))).sum(1).pad(((2, 0),)),
         lambda n: np.pad(np.pad(n["a"], 1).sum(1), (2, 0)), 1),
    Case("flip_and_slice_of_reduce", lambda t: t["a"].sum(1)[::-1][1:3], lambda n: n["a"].sum(1)[::-1][1:3], 1),
    Case("broadcast_product_reduce", lambda t: (t["a"][:, None, :] * t["a"][None, :, :]).sum(2),
         lambda n: n["a"] @ n["a"].T, 1),
    Case("outer_product_sum", lambda t: (t["v"].reshape(4, 1) * t["m"][:, 0].reshape(1, 6)).sum(),
         lambda n: (n["v"].reshape(4, 1) * n["m"][:, 0].reshape(1, 6)).sum(), 1),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kernel_count_and_values(case: Case):
    out = case.ember(tensors())
    count = len(out.schedule())
    if case.exact: assert count == case.kernels, f"{case.name}: {count} kernels, expected {case.kernels}"
    else: assert count <= case.kernels, f"{case.name}: {count} kernels, expected at most {case.kernels}"
    want = case.numpy({k: v.copy() for k, v in ARRAYS.items()})
    got = out.numpy()
    assert got.shape == want.shape
    if got.dtype.kind in "iu": np.testing.assert_array_equal(got, want)
    else: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_realized_tensor_needs_no_kernel():
    t = (Tensor(ARRAYS["a"].copy()) + 1).realize()
    assert t.schedule() == []
    np.testing.assert_array_equal(t.numpy(), ARRAYS["a"] + 1)


def test_input_tensor_needs_no_kernel():
    assert Tensor(ARRAYS["a"].copy()).schedule() == []


def test_reshape_of_realized_tensor_needs_no_kernel():
    t = Tensor(ARRAYS["a"].copy())
    assert t.reshape(24).schedule() == []


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0, 2)])
def test_zero_size_output_needs_no_kernel(shape: tuple[int, ...]):
    t = Tensor(np.zeros(shape, np.float32)) * 2 + 1
    assert t.schedule() == []
    assert t.numpy().shape == shape


def test_sum_over_zero_size_axis_is_zero():
    t = Tensor(np.zeros((0, 3), np.float32)).sum(0)
    assert len(t.schedule()) <= 1
    np.testing.assert_array_equal(t.numpy(), np.zeros(3, np.float32))


def test_realize_several_outputs_at_once():
    t = tensors()
    shared = t["a"] * t["b"]
    x, y, z = shared + 1, shared.sum(1), (shared * t["c"]).relu()
    assert len(Tensor.schedule(x, y, z)) <= 3
    Tensor.realize(x, y, z)
    for r in (x, y, z): assert r.schedule() == []
    n = ARRAYS["a"] * ARRAYS["b"]
    np.testing.assert_allclose(x.numpy(), n + 1, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), n.sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(z.numpy(), np.maximum(n * ARRAYS["c"], 0), rtol=1e-6)


def dear(x: Tensor | np.ndarray) -> Tensor | np.ndarray:
    """20 ALU ops: more than the scheduler recomputes per reader (RECOMPUTE_LIMIT)."""
    for _ in range(20): x = x * 1.25 + 0.5
    return x


@pytest.mark.parametrize("value, kernels", [(dear, 3), (lambda x: x * 2 + 1, 2)], ids=["dear", "cheap"])
def test_elementwise_value_read_by_two_kernels_is_stored_only_when_dear(value: Callable, kernels: int):
    shared = value(Tensor(ARRAYS["a"].copy()))
    x, y = shared.sum(0), shared.max(axis=1)
    assert len(Tensor.schedule(x, y)) == kernels
    Tensor.realize(x, y)
    n = value(ARRAYS["a"].copy())
    np.testing.assert_allclose(x.numpy(), n.sum(0), rtol=1e-5)
    np.testing.assert_allclose(y.numpy(), n.max(1), rtol=1e-6)


def test_realize_output_and_its_view():
    t = tensors()
    x = t["a"] + 1
    y = x.T
    Tensor.realize(x, y)
    np.testing.assert_array_equal(x.numpy(), ARRAYS["a"] + 1)
    np.testing.assert_array_equal(y.numpy(), (ARRAYS["a"] + 1).T)


def test_realize_two_tensors_of_one_graph():
    a = Tensor(ARRAYS["a"].copy())
    x, y = a * 3, a * 3
    assert x.uop is y.uop
    assert len(Tensor.schedule(x, y)) == 1
    Tensor.realize(x, y)
    np.testing.assert_array_equal(x.numpy(), ARRAYS["a"] * 3)
    np.testing.assert_array_equal(y.numpy(), ARRAYS["a"] * 3)


def test_realize_same_tensor_twice_in_one_call():
    x = Tensor(ARRAYS["a"].copy()) * 3
    Tensor.realize(x, x)
    np.testing.assert_array_equal(x.numpy(), ARRAYS["a"] * 3)


def test_kernels_reading_a_realized_intermediate_run_after_it():
    t = tensors()
    mid = (t["a"] + t["b"]).contiguous()
    out = mid.sum(1) + mid.max(axis=1)
    sched = out.schedule()
    assert len(sched) == 2
    written = [item.bufs[0] for item in sched]
    assert any(b is written[0] for b in sched[1].bufs[1:]), "the second kernel reads what the first one wrote"
    n = ARRAYS["a"] + ARRAYS["b"]
    np.testing.assert_allclose(out.numpy(), n.sum(1) + n.max(1), rtol=1e-5, atol=1e-6)


DEAD_READS = [
    ("read_folded_by_where", lambda a, b: (a < a).where(a, b)),
    ("read_of_padding_only", lambda a, b: a.pad(((2, 0),))[:2] + b),
]


@pytest.mark.parametrize("name, build", DEAD_READS, ids=[d[0] for d in DEAD_READS])
def test_kernel_whose_input_read_folds_away_reads_the_right_buffers(name: str, build: Callable):
    a, b = np.array([1.0, 2.0], np.float32), np.array([10.0, 20.0], np.float32)
    out = build(Tensor(a), Tensor(b))
    assert len(out.schedule()) == 1
    np.testing.assert_array_equal(out.numpy(), b)


def test_value_computed_by_an_earlier_realize_is_read_not_recomputed():
    a = Tensor(ARRAYS["a"].copy())
    total = a.sum()
    out = a * total  # keeps the graph of `total` alive, so its realized buffer is found
    assert len(out.schedule()) == 2
    total.realize()
    assert len(out.schedule()) == 1
    np.testing.assert_allclose(out.numpy(), ARRAYS["a"] * ARRAYS["a"].sum(), rtol=1e-5)


def test_same_program_on_other_buffers_shares_one_ast():
    one = (Tensor(ARRAYS["a"].copy()) * Tensor(ARRAYS["b"].copy())).sum(1).schedule()
    two = (Tensor(ARRAYS["c"].copy()) * Tensor(ARRAYS["a"].copy())).sum(1).schedule()
    assert len(one) == len(two) == 1
    assert one[0].ast is two[0].ast
    assert one[0].bufs[1] is not two[0].bufs[1]


@pytest.mark.slow  # 30 s or more: rangeify, lower and linearize of one kernel of 10^5 ops
def test_long_elementwise_chain_schedules_and_lowers_without_recursion(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.schedule import kernelize
    monkeypatch.setattr(kernelize, "CUT_EVERY", 1 << 30)  # one kernel of them all (not cut: see below)
    start = time.perf_counter()
    x = Tensor(np.zeros(4, np.float32))
    for _ in range(100_000): x = x + 1.0
    sched = x.schedule()
    assert len(sched) == 1
    uops = linearize(lower(rangeify(sched[0].ast)))
    assert sum(u.op is Ops.ADD and u.dtype.is_float for u in uops) == 100_000
    assert time.perf_counter() - start < 60, "budget ~30 s; twice that is a regression"


# ---- GlobalCounters ------------------------------------------------------------------------------------------------


def run_counted(t: Tensor) -> tuple[int, int, int, float]:
    GlobalCounters.reset()
    t.realize()
    return GlobalCounters.kernel_count, GlobalCounters.global_mem, GlobalCounters.global_ops, GlobalCounters.time_sum_s


def test_counters_for_an_elementwise_kernel():
    a, b = Tensor(ARRAYS["a"].copy()), Tensor(ARRAYS["b"].copy())
    kernels, mem, ops, seconds = run_counted(a * b + 1)
    assert kernels == 1
    assert mem == 3 * 24 * 4, "two float32 inputs read once, one output written once"
    assert ops >= 2 * 24, "a mul and an add per element"
    assert seconds > 0


def test_counters_for_a_matmul():
    a, m = Tensor(ARRAYS["a"].copy()), Tensor(ARRAYS["m"].copy())
    kernels, mem, ops, _ = run_counted(a @ m)
    assert kernels == 1
    inputs_and_output = (4 * 6 + 6 * 5 + 4 * 5) * 4
    assert mem >= inputs_and_output
    assert mem <= 2 * 4 * 5 * 6 * 4 + 4 * 5 * 4, "each product reads two floats; the output is written once"
    assert ops >= 2 * 4 * 5 * 6, "a multiply and an add per term"


def test_counters_add_up_over_kernels():
    a = Tensor(ARRAYS["a"].copy())
    GlobalCounters.reset()
    (a + 1).realize()
    first = GlobalCounters.global_mem
    (a + 2).contiguous().sum(1).realize()
    assert GlobalCounters.kernel_count == 3
    assert GlobalCounters.global_mem > first


def test_counters_reset_to_zero():
    (Tensor(ARRAYS["a"].copy()) + 1).realize()
    GlobalCounters.reset()
    assert (GlobalCounters.kernel_count, GlobalCounters.global_mem, GlobalCounters.global_ops) == (0, 0, 0)
    assert GlobalCounters.time_sum_s == 0.0


def test_realizing_nothing_new_runs_no_kernel():
    t = (Tensor(ARRAYS["a"].copy()) + 1).realize()
    kernels, mem, _, _ = run_counted(t)
    assert (kernels, mem) == (0, 0)


@pytest.mark.parametrize("op", [operator.add, operator.mul, operator.sub])
def test_counter_mem_scales_with_size(op: Callable):
    small = run_counted(op(Tensor(np.ones(8, np.float32)), Tensor(np.ones(8, np.float32))))[1]
    big = run_counted(op(Tensor(np.ones(64, np.float32)), Tensor(np.ones(64, np.float32))))[1]
    assert (small, big) == (3 * 8 * 4, 3 * 64 * 4)


def test_elementwise_chain_after_a_broadcast_reduction_runs_once_in_the_reduce_kernel():
    a, b, c = (Tensor(np.random.default_rng(i).standard_normal((8, 8)).astype(np.float32)) for i in range(3))
    first, second = ((a @ b).relu() @ c).schedule()
    ops = lambda item: [u.op for u in item.ast.toposort()]  # noqa: E731
    assert Ops.WHERE in ops(first) and Ops.WHERE not in ops(second)  # relu is stored, not recomputed per product
    expected = np.maximum(a.numpy() @ b.numpy(), 0) @ c.numpy()
    np.testing.assert_allclose(((a @ b).relu() @ c).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_contiguous_of_a_contiguous_is_a_copy_of_its_buffer():
    """The outer CONTIGUOUS reads the inner one's buffer (it used to leave a CONTIGUOUS in the kernel AST)."""
    x = np.arange(6.0).reshape(2, 3)
    for make in (lambda t: t.contiguous().contiguous(), lambda t: (t + 1).contiguous().contiguous().contiguous(),
                 lambda t: t.T.contiguous().contiguous().sum(0).contiguous()):
        got = make(Tensor(x)).numpy()
        want = make(torch.tensor(x)).numpy()
        np.testing.assert_array_equal(got, want)


def test_a_broadcast_transcendental_is_computed_once_not_per_copy():
    """exp(x) of 1000 elements broadcast to (3, 1000): stored once (1000 exps), not recomputed in each of 3 rows."""
    x = np.linspace(-1.0, 1.0, 1000)
    t = Tensor(x).exp().reshape(1, 1000).expand(3, 1000) * Tensor(np.arange(3.0)).reshape(3, 1)
    assert len(t.schedule()) == 2
    np.testing.assert_allclose(t.numpy(), np.exp(x)[None] * np.arange(3.0)[:, None], rtol=1e-15)
    small = Tensor(x[:8]).exp().reshape(1, 8).expand(3, 8) * Tensor(np.arange(3.0)).reshape(3, 1)
    assert len(small.schedule()) == 1  # small: recomputed (such kernels are unrolled and share it)


def test_a_broadcast_random_value_is_generated_once_not_per_output_element():
    """rand(m, k) @ rand(k, n): each random number (Threefry's 20 rounds) is stored once, not regenerated for every
    output element the matmul's broadcast reads it for (one kernel, 29 ms against 588 ms at 512 before)."""
    Tensor.manual_seed(3)
    a, b = Tensor.rand(16, 24), Tensor.rand(24, 8)
    assert len((a @ b).schedule()) == 3
    Tensor.manual_seed(3)
    want = Tensor.rand(16, 24).numpy() @ Tensor.rand(24, 8).numpy()
    Tensor.manual_seed(3)
    np.testing.assert_allclose((Tensor.rand(16, 24) @ Tensor.rand(24, 8)).numpy(), want, rtol=1e-6)
    cheap = Tensor.ones(16, 24).contiguous().realize()
    assert len(((cheap * 2 + 1) @ Tensor.ones(24, 8).contiguous().realize()).schedule()) == 1  # cheap: fused


def test_small_unrolled_outputs_realized_together_are_one_kernel_sharing_their_work():
    """Outputs stored element by element (stacks, here) and realized together become one straight-line kernel:
    the sin they share is computed once in it, not stored by a kernel of its own and read by two."""
    a, b = np.arange(1.0, 5.0), np.array([0.5, -1.0, 2.0])
    ta, tb = Tensor(a), Tensor(b)
    s = (ta[0] * tb[1]).sin() * (ta[2] * tb[0]).cos() + (ta[3] / tb[2]).exp()  # dear enough to be stored once
    outs = [Tensor.stack(s * tb[0], ta[1] + s), Tensor.stack(s, s * 2, ta[3]), (ta * tb[2]).sum()]
    items = Tensor.schedule(*outs)
    assert len(items) == 1 and items[0].outs == 3
    Tensor.realize(*outs)
    sv = np.sin(a[0] * b[1]) * np.cos(a[2] * b[0]) + np.exp(a[3] / b[2])
    for got, want in zip(outs, [[sv * b[0], a[1] + sv], [sv, sv * 2, a[3]], (a * b[2]).sum()], strict=True):
        np.testing.assert_array_equal(got.numpy(), np.array(want))
    separately = Tensor.stack(s * tb[0], ta[1] + s), Tensor.stack(s, s * 2, ta[3])
    assert len(Tensor.schedule(separately[0])) == 1  # alone, it needs no kernel for s either


def test_a_rollout_and_its_jacobians_over_a_hundred_entries_each_are_one_kernel():
    """The quadrotor's 2-step rollout with its jacobians by state (12 x 12) and by controls (12 x 2 x 4), traced
    as one function: 252 stores, within STRAIGHT_UNROLL * UNROLL. Held to UNROLL (64), the outputs were kernels
    of their own; a value two of them read was stored, its sources then read by two kernels, and so on down the
    reverse sweep: 343 kernels. Oracle: the finite differences of the rollout."""
    spec = importlib.util.spec_from_file_location("quadrotor", Path(__file__).parents[2] / "examples" / "quadrotor.py")
    quad = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quad)
    fns = quad.build_functions(2, with_jacobians=False)
    both = quad.with_jacobians(fns)
    assert len(both.plan.items) == 1
    state, controls = quad.start_and_controls(2)
    rollout, by_state, by_controls = both.interpret(state, controls)
    np.testing.assert_array_equal(rollout, fns[0].interpret(state, controls))
    for got, argnum in ((by_state, 0), (by_controls, 1)):
        want = quad.finite_differences(fns[0].interpret, [state, controls], argnum)
        np.testing.assert_allclose(got, want, atol=1e-7)


def test_an_output_another_output_reads_is_not_merged_into_its_kernel():
    """The second output reads the first through a kernel of its own (a broadcast sum): one kernel for both would
    have to run before and after that one. They stay separate kernels, in order, with the right values."""
    a = np.array([0.3, 0.7])
    first = Tensor.stack(Tensor(a)[0].sin(), Tensor(a)[1].cos())
    second = Tensor.stack(first[1] * 2, first[0] + 1) * first.sum()
    assert len(Tensor.schedule(first, second)) == 3
    Tensor.realize(first, second)
    f = np.array([np.sin(0.3), np.cos(0.7)])
    np.testing.assert_array_equal(first.numpy(), f)
    np.testing.assert_array_equal(second.numpy(), np.array([f[1] * 2, f[0] + 1]) * f.sum())


@pytest.mark.parametrize("padding, stride, kernels", [(1, 1, 1), (0, 1, 1), (1, 2, 2), (3, 1, 1)])
def test_a_padded_input_is_stored_padded_only_for_a_strided_window(padding: int, stride: int, kernels: int):
    """conv2d with padding: a stride-one window reads the input through the padding's gates, in one kernel (the
    heuristic unrolls kx so that the gates settle lane by lane: whole or partial vector loads, codegen/expand.py);
    a strided window (2 * ox + kx: a gather of lanes) reads a padded copy, without gates."""
    rng = np.random.default_rng(3)
    k = 2 * padding + 1 if padding else 3
    x, w = rng.standard_normal((2, 3, 20, 20)).astype(np.float32), rng.standard_normal((4, 3, k, k)).astype(np.float32)
    out = Tensor(x).conv2d(Tensor(w), padding=padding, stride=stride)
    items = out.schedule()
    assert len(items) == kernels
    if kernels == 2:
        gated = [u for u in rangeify(items[-1].ast).toposort() if u.op is Ops.INDEX and len(u.src) > 2]
        assert not gated, "the strided convolution's reads carry no padding gate"
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=padding, stride=stride)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_a_padded_input_read_by_two_kernels_is_stored_once():
    """A convolution and its weight's gradient both read the padded input: one padded copy serves both (and the
    gradient, which sums over ox, gets lanes no gate would settle)."""
    rng = np.random.default_rng(4)
    xn = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    wn = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    out = x.conv2d(w, padding=1)
    out.square().sum().backward()
    items = Tensor.schedule(out, w.grad)
    assert [it.ast.src[0].src[1].op for it in items].count(Ops.PAD) == 1  # the copy: a kernel storing the PAD
    tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    torch.nn.functional.conv2d(tx, tw, padding=1).square().sum().backward()
    Tensor.realize(out, w.grad)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, k, n, copies", [(128, 96, 112, 1), (16, 24, 8, 0)])
def test_x_at_w_transposed_copies_w_transposed_when_big(m: int, k: int, n: int, copies: int):
    """x @ w.T (a Linear layer) reads w along its rows: from PACK_MACS multiply-adds up, w.T is first copied into
    (k, n) order so the product streams it in vectors (measured: 256x784x512 1.87 -> 1.55 ms); gradients pass
    through the copy."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
    tw = Tensor(w, requires_grad=True)
    out = Tensor(x) @ tw.T
    assert len(out.schedule()) == 1 + copies
    np.testing.assert_allclose(out.numpy(), x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)
    out.sum().backward()
    np.testing.assert_allclose(tw.grad.numpy(), np.broadcast_to(x.sum(0), (n, k)), rtol=1e-4, atol=1e-4)


PADDED_REDUCTIONS = [  # (name, build, numpy, kernels): a reduction read at more positions than it has elements
    ("sum_padded_into_a_loop", lambda x: (x * x).sum().reshape(1).pad(((99, 0),)) + x,
     lambda x: np.pad([(x * x).sum()], (99, 0)) + x, 2),
    ("sum_padded_into_unrolled_stores", lambda x: (x[:8] * x[:8]).sum().reshape(1).pad(((7, 0),)) + x[:8],
     lambda x: np.pad([(x[:8] * x[:8]).sum()], (7, 0)) + x[:8], 1),
    ("row_sums_padded_then_summed", lambda x: x.reshape(4, 25).exp().sum(1).pad(((0, 60),)).sum(),
     lambda x: np.exp(x.reshape(4, 25)).sum(1).sum(), 2),
]


@pytest.mark.parametrize("name, build, numpy, kernels", PADDED_REDUCTIONS, ids=[c[0] for c in PADDED_REDUCTIONS])
def test_a_reduction_padded_into_a_loop_is_computed_once(name, build, numpy, kernels):
    """A PAD around a reduction (the gradient of x[n] in sum(f(x[:n] * x[n])) pads d/dx[n] into the last element)
    makes every position of a loop over the padded axis run the reduction's loop, gated: it is stored by a kernel
    of its own. Where the reader unrolls the padded axis, each position folds the padding away, and it stays fused."""
    x = np.linspace(-1.0, 1.0, 100)
    out = build(Tensor(x))
    items = out.schedule()
    assert len(items) == kernels
    np.testing.assert_allclose(out.numpy(), numpy(x), rtol=1e-13)


def longest_alu_path(ast: UOp) -> int:
    """ALU ops on the longest path through a kernel's AST."""
    depth: dict = {}
    for u in ast.toposort():
        depth[u] = max((depth[s] for s in u.src), default=0) + (u.op in GroupOp.Elementwise)
    return max(depth.values())


def test_a_chain_deeper_than_a_kernel_may_be_runs_as_several(monkeypatch: pytest.MonkeyPatch) -> None:
    # C compilers take time quadratic in a function's length (gcc: 10^4 statements ~11 s), so a chain is stored
    # every CUT_EVERY ops: 260 steps of x * 0.999 + 0.01 are 520 ops, cut after 50, 100, ..., 500
    from ember.schedule import kernelize
    monkeypatch.setattr(kernelize, "CUT_EVERY", 50)
    x, expected = Tensor(ARRAYS["a"].copy()), ARRAYS["a"].copy()
    for _ in range(260):
        x = x * 0.999 + 0.01
        expected = expected * np.float32(0.999) + np.float32(0.01)
    items = x.schedule()
    assert len(items) == 11
    assert max(longest_alu_path(item.ast) for item in items) == 50
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6)


def test_a_long_recurrence_gradient_is_cut_without_recomputing_each_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # d/dw of h <- h * w + 0.001 reads every step's h: the backward kernels recompute them from the stored ones.
    # Cuts at depths counted over the whole graph keep that to less than one more pass (cuts counted per kernel
    # stored forward values up to 2 * CUT_EVERY below: 3x the ops of one kernel, and 65 kernels, not 25)
    from ember.schedule import kernelize

    def gradient_of_recurrence() -> tuple[Tensor, Tensor]:
        w = Tensor(np.float32(0.999), requires_grad=True)
        h = Tensor(np.float32(1.0))
        for _ in range(300): h = h * w + 0.001
        h.backward()
        return h, w.grad

    def alu_ops(t: Tensor) -> int:
        return sum(sum(u.op in GroupOp.Elementwise for u in item.ast.toposort()) for item in t.schedule())

    monkeypatch.setattr(kernelize, "CUT_EVERY", 1 << 30)
    whole = alu_ops(gradient_of_recurrence()[1])
    monkeypatch.setattr(kernelize, "CUT_EVERY", 50)
    h, grad = gradient_of_recurrence()
    assert max(longest_alu_path(item.ast) for item in grad.schedule()) <= 100
    assert alu_ops(grad) < 2 * whole
    value, slope = 1.0, 0.0  # float64 forward mode: h and dh/dw
    for _ in range(300): value, slope = value * 0.999 + 0.001, slope * 0.999 + value
    np.testing.assert_allclose(h.numpy(), value, rtol=1e-5)
    np.testing.assert_allclose(grad.numpy(), slope, rtol=1e-4)
