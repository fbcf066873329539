"""rangeify turns movement ops into index arithmetic over explicit RANGEs; reshape_index maps positions exactly.

Oracle: numpy. A movement op applied to `arange` (padding with -1) says which source element every output position
reads; the rangeified kernel's store and load indices, evaluated at every point of its ranges, must agree.
reshape_index is checked against numpy's ravel/unravel at every position. Each stage test also runs with SPEC=1.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from ember import Tensor
from ember.codegen.rangeify import (
    RangeifyContext,
    at,
    constant_at,
    pm_rangeify_symbolic,
    pm_simplify_gated_index,
    rangeify,
    reshape_index,
)
from ember.dtype import PtrDType, dtypes
from ember.errors import SpecError
from ember.helpers import Context, prod
from ember.uop.interpret import evaluate
from ember.uop.ops import AxisKind, GroupOp, Ops, UOp
from ember.uop.symbolic import simplify
from ember.uop.upat import PatternMatcher, graph_rewrite
from tests.export.test_cpp import cartpole_slope, rk4


@pytest.fixture(params=[0, 1], ids=["spec0", "spec1"], autouse=True)
def spec(request: pytest.FixtureRequest) -> Iterator[int]:
    """Index arithmetic is checked over loops, so small outputs are not unrolled here (see test_unroll_*)."""
    with Context(SPEC=request.param, UNROLL=0): yield request.param


def ast_of(t: Tensor) -> UOp:
    sched = t.schedule()
    assert len(sched) == 1, f"expected one kernel, got {len(sched)}"
    return sched[0].ast


def loads(sink: UOp) -> list[UOp]:
    return [u for u in sink.toposort() if u.op is Ops.LOAD]


def ranges(sink: UOp) -> list[UOp]:
    return sorted((u for u in sink.toposort() if u.op is Ops.RANGE), key=lambda r: r.arg.axis)


def all_range_values(rngs: list[UOp]) -> Iterator[dict[UOp, int]]:
    for values in itertools.product(*(range(int(r.src[0].arg)) for r in rngs)): yield dict(zip(rngs, values))


# ---- movement ops: (name, input shape, ember view, numpy view of the same data) ------------------------------------

View = Callable

MOVEMENT: list[tuple[str, tuple[int, ...], View, View]] = [
    ("transpose", (2, 3), lambda t: t.T, lambda n: n.T),
    ("permute3", (2, 3, 4), lambda t: t.permute(2, 0, 1), lambda n: n.transpose(2, 0, 1)),
    ("permute_then_merge", (2, 3, 4), lambda t: t.permute(2, 0, 1).reshape(8, 3),
     lambda n: n.transpose(2, 0, 1).reshape(8, 3)),
    ("split", (6, 4), lambda t: t.reshape(2, 3, 2, 2), lambda n: n.reshape(2, 3, 2, 2)),
    ("merge_split_transpose", (4,), lambda t: t.reshape(2, 2).T.reshape(4), lambda n: n.reshape(2, 2).T.reshape(4)),
    ("size_one_axes", (1, 4, 1), lambda t: t.permute(2, 1, 0).reshape(2, 1, 2),
     lambda n: n.transpose(2, 1, 0).reshape(2, 1, 2)),
    ("pad", (2, 3), lambda t: t.pad(((1, 1), (0, 2))), lambda n: np.pad(n, ((1, 1), (0, 2)), constant_values=-1)),
    ("pad_then_transpose", (2, 3), lambda t: t.pad(((0, 1), (2, 0))).T,
     lambda n: np.pad(n, ((0, 1), (2, 0)), constant_values=-1).T),
    ("flip", (2, 3), lambda t: t.flip(1), lambda n: n[:, ::-1]),
    ("flip_both", (3, 4), lambda t: t.flip((0, 1)), lambda n: n[::-1, ::-1]),
    ("shrink", (4, 5), lambda t: t[1:3, 2:], lambda n: n[1:3, 2:]),
    ("step", (7,), lambda t: t[::2], lambda n: n[::2]),
    ("step_offset", (7,), lambda t: t[1::3], lambda n: n[1::3]),
    ("negative_step", (6,), lambda t: t[::-2], lambda n: n[::-2]),
    ("expand_rows", (1, 3), lambda t: t.expand(4, 3), lambda n: np.broadcast_to(n, (4, 3))),
    ("expand_cols", (3, 1), lambda t: t.expand(3, 4), lambda n: np.broadcast_to(n, (3, 4))),
    ("pad_flip_slice_transpose", (3, 4), lambda t: t.pad(((1, 0), (0, 2))).flip(0)[::2, 1:].T,
     lambda n: np.pad(n, ((1, 0), (0, 2)), constant_values=-1)[::-1][::2, 1:].T),
]


@pytest.mark.parametrize("name, shape, view, np_view", MOVEMENT, ids=[m[0] for m in MOVEMENT])
def test_no_tensor_level_op_survives(name: str, shape: tuple[int, ...], view: View, np_view: View):
    out = rangeify(ast_of(view(Tensor(np.zeros(shape, np.float32))).clone()))
    for u in out.toposort():
        assert u.op not in GroupOp.Movement and u.op is not Ops.REDUCE_AXIS, f"{u.op} survived"
        if u.op is Ops.INDEX: assert isinstance(u.dtype, PtrDType) and u.src[0].op is Ops.DEFINE_GLOBAL
        if u.op in (Ops.LOAD, Ops.STORE): assert u.src[0].op is Ops.INDEX


@pytest.mark.parametrize("name, shape, view, np_view", MOVEMENT, ids=[m[0] for m in MOVEMENT])
def test_every_position_reads_what_numpy_reads(name: str, shape: tuple[int, ...], view: View, np_view: View):
    want = np_view(np.arange(prod(shape)).reshape(shape)).reshape(-1)  # source offset per output, -1 for padding
    out = rangeify(ast_of(view(Tensor(np.zeros(shape, np.float32))).clone()))
    (store,) = out.src
    (load,) = loads(out)
    index = load.src[0]
    written = []
    for env in all_range_values(ranges(out)):
        pos = evaluate(store.src[0].src[1], env)
        written.append(pos)
        inside = evaluate(index.src[2], env) if len(index.src) == 3 else True
        if want[pos] == -1: assert not inside, f"position {pos} lies in the padding but its load is not gated off"
        else:
            assert inside, f"position {pos} reads element {want[pos]} but its gate is false"
            assert evaluate(index.src[1], env) == want[pos], f"position {pos}"
    assert sorted(written) == list(range(want.size)), "every output element is stored exactly once"


def test_output_has_one_global_range_per_axis_longer_than_one():
    out = rangeify(ast_of(Tensor(np.zeros((3, 1, 4), np.float32)) + 1))
    (store,) = out.src
    assert store.op is Ops.STORE and store.src[0].op is Ops.INDEX
    assert store.src[0].src[0].op is Ops.DEFINE_GLOBAL and store.src[0].src[0].arg == 0
    assert [(int(r.src[0].arg), r.arg.kind) for r in ranges(out)] == [(3, AxisKind.GLOBAL), (4, AxisKind.GLOBAL)]


@pytest.mark.parametrize("view, shape, want", [
    (lambda t: t.T, (2, 3), "r0+(r1*3)"),
    (lambda t: t.reshape(2, 2).T.reshape(4), (4,), "(r0//2)+((r0%2)*2)"),
    (lambda t: t.permute(2, 0, 1), (2, 3, 4), "(r0+(r1*12))+(r2*4)"),
    (lambda t: t.reshape(24).reshape(4, 6), (2, 12), "(r0*6)+r1"),
    (lambda t: t.flip(1), (2, 3), "((r0*3)+(r1*-1))+2"),
])
def test_read_index_is_simplified(view: View, shape: tuple[int, ...], want: str):
    (load,) = loads(rangeify(ast_of(view(Tensor(np.zeros(shape, np.float32))).clone())))
    assert load.src[0].src[1].render() == want


@pytest.mark.parametrize("view, shape", [(lambda t: t.permute(2, 0, 1), (2, 3, 4)), (lambda t: t.T.T, (3, 5)),
                                         (lambda t: t.flip(0)[1:, ::-1], (4, 5)), (lambda t: t[:, None], (3, 4))])
def test_index_without_split_or_merge_has_no_division(view: View, shape: tuple[int, ...]):
    (load,) = loads(rangeify(ast_of(view(Tensor(np.zeros(shape, np.float32))).clone())))
    text = load.src[0].src[1].render()
    assert "//" not in text and "%" not in text, text


def test_pad_gives_a_gated_index_and_zero_outside():
    out = rangeify(ast_of(Tensor(np.zeros((2, 3), np.float32)).pad(((1, 1), (0, 2))).contiguous()))
    (load,) = loads(out)
    index = load.src[0]
    assert len(index.src) == 3 and index.src[2].dtype == dtypes.bool
    (where,) = [u for u in out.toposort() if u.op is Ops.WHERE]
    assert where.src[0] is index.src[2] and where.src[1] is load
    assert where.src[2].op is Ops.CONST and where.src[2].arg == 0


def test_padded_read_index_has_no_modulo():
    (load,) = loads(rangeify(ast_of(Tensor(np.zeros((2, 3), np.float32)).pad(((1, 1), (0, 2))).contiguous())))
    assert "%" not in load.src[0].src[1].render(), load.src[0].src[1].render()


def test_gather_through_a_merged_view_reads_the_position_it_loaded_without_division():
    """A table's positions into a flattened (3, 4) buffer: the gate bounds each loaded position to the axis, so
    splitting it into (row, column) and joining them again simplifies away; the values are numpy's."""
    data, where = np.arange(12.0).reshape(3, 4), np.array([11, 0, 5, 7, 2], np.int32)
    src = Tensor(data).contiguous().realize()
    out = src.reshape(-1)._take(0, Tensor(where))
    (load,) = [u for u in loads(rangeify(ast_of(out))) if u.dtype == dtypes.float64]
    text = load.src[0].src[1].render()
    assert "//" not in text and "%" not in text, text
    np.testing.assert_array_equal(out.numpy(), data.reshape(-1)[where])


@pytest.mark.parametrize("channels, size, flip", [(3, 5, False), (2, 7, False), (2, 5, True)])
def test_window_over_padding_simplifies_under_the_gate_on_its_row_sum(channels: int, size: int, flip: bool):
    """A convolution's read of its unpadded input at row `oy + ky - 1`, column `ox + kx - 1`, gated on both inside
    [0, size): flattened through a reshape of all of it, its offset is a `%` over the whole buffer, true only where
    the gate holds. The gate bounds the sums `oy + ky` and `ox + kx`, so the `%` goes: a vectorizable offset (also
    over a flipped kernel, `ky` counted down: a term of coefficient -1). Wherever the gate holds, the simplified
    offset is the original one."""
    c, oy, ky, ox, kx = (UOp.range(n, a) for a, n in enumerate((channels, size, 3, size, 3)))
    row, col = (oy - ky + 2, ox - kx + 2) if flip else (oy + ky, ox + kx)
    gate = (UOp.const(dtypes.int32, 0) < row) & (row < size + 1) & (UOp.const(dtypes.int32, 0) < col) & \
        (col < size + 1)
    offset = ((c * size + row - 1) * size + col - 1) % (channels * size * size)
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(channels * size * size), arg=1)
    index = UOp(Ops.INDEX, buf.dtype, (buf, simplify(offset), gate))
    out = graph_rewrite(index, pm_simplify_gated_index)
    assert out is not index and out.src[2] is gate
    assert not any(u.op is Ops.MOD for u in out.src[1].toposort()), out.src[1].render()
    for env in all_range_values([c, oy, ky, ox, kx]):
        if evaluate(gate, env): assert evaluate(out.src[1], env) == evaluate(offset, env), env


@pytest.mark.parametrize("view", [lambda t: t[::2], lambda t: t.pad(((1, 1),)).shrink(((1, 7),))],
                         ids=["step", "pad_then_shrink_away"])
def test_always_true_gate_is_dropped(view: View):
    (load,) = loads(rangeify(ast_of(view(Tensor(np.zeros(6, np.float32))).clone())))
    assert len(load.src[0].src) == 2, f"gate {load.src[0].src[2].render()} left on the load"


def test_index_never_divides_by_zero():
    out = rangeify(ast_of(Tensor(np.zeros((2, 0), np.float32)).reshape(0, 2).sum(0)))
    for u in out.toposort():
        if u.op in (Ops.IDIV, Ops.MOD): assert not (u.src[1].op is Ops.CONST and u.src[1].arg == 0), u.render()


# ---- reductions -----------------------------------------------------------------------------------------------------


def test_reduce_axis_becomes_reduce_over_new_ranges():
    out = rangeify(ast_of(Tensor(np.zeros((4, 6), np.float32)).sum(1)))
    (red,) = [u for u in out.toposort() if u.op is Ops.REDUCE]
    assert red.arg is Ops.ADD
    assert [(r.op, r.arg.kind, int(r.src[0].arg)) for r in red.src[1:]] == [(Ops.RANGE, AxisKind.REDUCE, 6)]
    (outer,) = [r for r in ranges(out) if r.arg.kind is AxisKind.GLOBAL]
    assert outer.arg.axis < red.src[1].arg.axis, "an enclosing loop has the smaller axis"
    assert red.ranges == (outer,), "the reduction's value depends on the output range only"


@pytest.mark.parametrize("build, op", [(lambda t: t.sum(), Ops.ADD), (lambda t: t.max(axis=0), Ops.MAX),
                                       (lambda t: t.prod(1), Ops.MUL)])
def test_reduce_keeps_its_op(build: Callable, op: Ops):
    out = rangeify(ast_of(build(Tensor(np.zeros((4, 6), np.float32)))))
    assert {u.arg for u in out.toposort() if u.op is Ops.REDUCE} == {op}


def test_reduce_over_size_one_axis_needs_no_loop():
    out = rangeify(ast_of(Tensor(np.zeros((4, 1, 6), np.float32)).sum(1)))
    assert not any(u.op is Ops.REDUCE for u in out.toposort())
    assert len(ranges(out)) == 2


def test_nested_reduce_sits_inside_the_outer_one():
    out = rangeify(ast_of(Tensor(np.zeros((4, 6), np.float32)).sum(1).sum(0)))
    reduces = [u for u in out.toposort() if u.op is Ops.REDUCE]
    assert len(reduces) == 2
    outer, inner = sorted(reduces, key=lambda r: len(r.toposort()), reverse=True)
    assert inner in outer.toposort()
    assert outer.src[1].arg.axis < inner.src[1].arg.axis
    assert inner.ranges == (outer.src[1],), "the inner sum restarts for every step of the outer loop"


def test_large_buffer_gets_int64_indices():
    def kernel(size: int) -> UOp:
        out, inp = (UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(size), arg=i) for i in (0, 1))
        value = UOp(Ops.RESHAPE, dtypes.float32, (inp,), (size,)) + UOp.const(dtypes.float32, 1.0)
        return UOp(Ops.STORE, dtypes.void, (UOp(Ops.RESHAPE, dtypes.float32, (out,), (size,)), value)).sink()
    assert {r.dtype for r in ranges(rangeify(kernel(2**31 - 1)))} == {dtypes.int32}
    assert {r.dtype for r in ranges(rangeify(kernel(2**31)))} == {dtypes.int64}


BIG_VIEWS = [  # no buffer is larger than 2**31 - 1 elements, but a loop, a view or an offset is
    ("sum_of_broadcast_ones", lambda: Tensor.ones(2**31 + 5, dtype="float64").sum()),
    ("last_of_a_long_arange", lambda: Tensor.arange(2**31 + 5, dtype="int64")[-1]),
    ("pairwise_differences", lambda: (Tensor.ones(50_000)[:, None] - Tensor.ones(50_000)[None, :]).flatten().max()),
    ("slice_of_an_expanded_view", lambda: Tensor([1.0, 2.0]).reshape(2, 1).expand(2, 2**31).reshape(-1)[-3:]),
]


@pytest.mark.parametrize("name, build", BIG_VIEWS, ids=[c[0] for c in BIG_VIEWS])
def test_an_index_past_int32_in_a_view_or_loop_gets_int64(name: str, build: Callable[[], Tensor]):
    """The index dtype follows the largest index any expression can take (a view's or loop's element count), not
    buffer sizes alone: int32 made `ones(2**31 + 5).sum()` a loop that never ran (issue 13, item 1). The first
    kernel is the big one (a full reduction's second stage adds up 256 partial results in int32 loops)."""
    for item in build().schedule()[:1]:
        sink = rangeify(item.ast)
        assert {r.dtype for r in ranges(sink)} <= {dtypes.int64}
        assert all(u.dtype in (dtypes.int64, dtypes.bool) for u in sink.toposort()
                   if u.op in (Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD) and u.dtype.is_int)


@pytest.mark.parametrize("build, want", [
    (lambda: Tensor.arange(2**31 + 5, dtype="int64")[-1], 2**31 + 4),
    (lambda: Tensor([1.0, 2.0]).reshape(2, 1).expand(2, 2**31).reshape(-1)[-3:].sum(), 6.0),
    (lambda: Tensor([1.0, 2.0]).reshape(2, 1).expand(2, 2**31).reshape(-1)[2**31 - 1: 2**31 + 1], [1.0, 2.0]),
], ids=["arange", "expanded_tail", "expanded_middle"])
def test_values_past_int32_positions_are_right(build: Callable[[], Tensor], want: object):
    got = build()
    assert (got.item() if got.ndim == 0 else got.tolist()) == want


@pytest.mark.slow
def test_a_loop_past_int32_runs_every_step():
    assert Tensor.ones(2**31 + 5, dtype="float64").sum().item() == 2**31 + 5
    x = Tensor(np.linspace(0, 1, 50_000, dtype=np.float32))
    d = (x[:, None] - x[None, :]).abs().flatten()  # 2.5e9 positions: the issue's -inf max and negative argmax
    assert d.max().item() == 1.0 and d.argmax().item() == 49_999


def test_rangeify_is_deterministic():
    ast = ast_of((Tensor(np.zeros((4, 6), np.float32)).T.pad(((1, 0), (0, 1))) * 2).sum(0))
    assert rangeify(ast) is rangeify(ast)


def test_spec_names_the_stage_when_movement_ops_survive():
    ast = ast_of(Tensor(np.zeros((2, 3), np.float32)).T.contiguous())
    with Context(SPEC=1), pytest.raises(SpecError, match=r"spec after rangeify: \w+ survived rangeify"):
        graph_rewrite(ast, PatternMatcher([]), name="rangeify")


# ---- reshape_index --------------------------------------------------------------------------------------------------

RESHAPES = [
    ((6,), (2, 3)), ((2, 3), (6,)), ((2, 3, 4), (6, 4)), ((6, 4), (2, 3, 4)), ((4, 6), (4, 2, 3)),
    ((4, 6), (6, 4)), ((2, 6), (3, 4)), ((12,), (2, 2, 3)), ((2, 2, 3), (3, 4)), ((3, 4), (2, 3, 2)),
    ((1, 4), (4,)), ((4,), (1, 4, 1)), ((2, 1, 3), (3, 2)), ((1,), (1, 1)), ((1, 1), ()), ((), (1, 1, 1)),
    ((4, 1, 1), (1, 2, 2)), ((0,), (0, 5)), ((0, 3), (3, 0)), ((2, 0), (0,)), ((0, 1), (1, 0, 1)),
]


@pytest.mark.parametrize("new, old", RESHAPES, ids=[f"{n}->{o}" for n, o in RESHAPES])
def test_reshape_index_matches_ravel_and_unravel(new: tuple[int, ...], old: tuple[int, ...]):
    idx = tuple(UOp.range(s, a) for a, s in enumerate(new))
    out = reshape_index(idx, new, old, dtypes.int32)
    assert len(out) == len(old)
    for pos in np.ndindex(*new):
        env = dict(zip(idx, pos))
        want = np.unravel_index(np.ravel_multi_index(pos, new), old) if old else ()
        got = tuple(evaluate(o, env) for o in out)
        assert got == tuple(int(w) for w in want), f"position {pos}"


EMPTY = [(n, o) for n, o in RESHAPES if 0 in n]


@pytest.mark.parametrize("new, old", EMPTY, ids=[f"{n}->{o}" for n, o in EMPTY])
def test_reshape_index_of_empty_shape_never_divides_by_zero(new: tuple[int, ...], old: tuple[int, ...]):
    idx = tuple(UOp.range(s, a) for a, s in enumerate(new))
    for out in reshape_index(idx, new, old, dtypes.int32):
        for u in out.toposort():
            if u.op in (Ops.IDIV, Ops.MOD): assert not (u.src[1].op is Ops.CONST and u.src[1].arg == 0), out.render()


@pytest.mark.parametrize("new, old, kept", [((2, 3, 4), (6, 4), {2: 1}), ((4, 6), (4, 2, 3), {0: 0}),
                                            ((5, 2, 3, 7), (5, 6, 7), {0: 0, 3: 2}), ((3, 4), (3, 4), {0: 0, 1: 1})])
def test_reshape_index_leaves_untouched_axes_alone(new: tuple[int, ...], old: tuple[int, ...], kept: dict[int, int]):
    idx = tuple(UOp.range(s, a) for a, s in enumerate(new))
    out = reshape_index(idx, new, old, dtypes.int32)
    for new_axis, old_axis in kept.items(): assert simplify(out[old_axis]) is idx[new_axis]


def test_unroll_stores_a_small_stack_position_by_position_with_its_branches_folded():
    """A stack of 4 differently computed values: unrolled, each store holds only its own branch (no WHERE)."""
    a, b = Tensor(np.arange(3.0, dtype=np.float32)), Tensor(np.arange(3.0, 6.0, dtype=np.float32))
    value = Tensor.stack(a[0] * 2, a[1].exp(), b[2] - 1, (a[2] + b[0]).sqrt())
    with Context(UNROLL=64): sink = rangeify(ast_of(value.contiguous()))
    assert [u.op for u in sink.src] == [Ops.STORE] * 4 and not ranges(sink)
    assert not any(u.op is Ops.WHERE for u in sink.toposort())
    np.testing.assert_allclose(value.numpy(), [0.0, np.e, 4.0, np.sqrt(5.0)], rtol=1e-6)


def test_unroll_keeps_a_loop_over_an_axis_that_does_not_branch():
    """(100, 2): the axis of 2 is a cat (unrolled), the axis of 100 is the same code for every row (a loop)."""
    x = Tensor((np.arange(200.0) / 100).astype(np.float32).reshape(100, 2))
    value = x[:, :1].exp().cat(x[:, 1:] * 3, dim=1)
    with Context(UNROLL=64): sink = rangeify(ast_of(value.contiguous()))
    assert [int(r.src[0].arg) for r in ranges(sink)] == [100]
    assert sum(u.op is Ops.STORE for u in sink.toposort()) == 2
    n = np.arange(200.0).reshape(100, 2) / 100
    want = np.concatenate([np.exp(n[:, :1]), n[:, 1:] * 3], 1)
    np.testing.assert_allclose(value.numpy(), want.astype(np.float32), rtol=1e-6)


def test_unroll_keeps_a_loop_over_an_arange_used_as_arithmetic_but_unrolls_a_compared_one():
    """rand's counters are an ARANGE in arithmetic: the same code for every element, so a loop (unrolled, its
    Threefry rounds were copied per element: randn(2, 8, 16, 16) rendered a million lines of C). eye compares two
    aranges: each position folds to its constant."""
    Tensor.manual_seed(0)
    with Context(UNROLL=64): sink = rangeify(ast_of(Tensor.rand(16)))
    assert [int(r.src[0].arg) for r in ranges(sink)] == [16]
    with Context(UNROLL=64): sink = rangeify(ast_of(Tensor.eye(4) * 2))
    assert not ranges(sink) and sum(u.op is Ops.STORE for u in sink.toposort()) == 16
    np.testing.assert_array_equal((Tensor.eye(4) * 2).numpy(), np.eye(4, dtype=np.float32) * 2)


@pytest.mark.parametrize("epilogue", [
    lambda y: y.relu(), lambda y: y + 1, lambda y: y.maximum(0), lambda y: y.sigmoid(), lambda y: y.gelu(),
    lambda y: (y > 0).where(y, y * 0.1), lambda y: y.detach() * y, lambda y: y.abs() + y.square(),
], ids=["relu", "add", "maximum", "sigmoid", "gelu", "where", "detach", "abs_square"])
def test_a_reduction_read_twice_is_computed_once(epilogue: Callable[[Tensor], Tensor]):
    """Epilogues that read the matmul's value more than once (relu: a compare and a select; a detached copy) still
    make one REDUCE, one accumulator and one reduce loop: the same value reached by two paths is lowered once."""
    from ember.codegen import get_program
    from ember.device import Device
    x, w = Tensor.rand(8, 5).realize(), Tensor.rand(5, 3).realize()
    sched = epilogue(x @ w).schedule()
    assert len(sched) == 1
    sink = rangeify(sched[0].ast)
    assert sum(u.op is Ops.REDUCE for u in sink.toposort()) == 1
    src = get_program(sched[0].ast, Device["CPU"].renderer).src
    assert src.count("acc1") == 0 and src.count("for (") == 3, src
    np.testing.assert_allclose(epilogue(x @ w).numpy(), epilogue(Tensor(x.numpy() @ w.numpy())).numpy(), rtol=1e-6)


SORTED_THEN_MOVED = [
    ("sort_roll_sum", (100,), lambda t: t.sort()[0].roll(1, 0).sum()),
    ("sort_pad", (5, 5, 1), lambda t: t.sort(1)[0].pad((3, 3)) if isinstance(t, Tensor) else
     torch.nn.functional.pad(t.sort(1)[0], (3, 3))),
    ("topk_roll", (4, 9), lambda t: t.topk(3, 1)[0].roll(2, 1)),
    ("sort_flip_roll", (3, 8), lambda t: t.sort(0)[0].flip(1).roll(-1, 0)),
    ("argsort_roll", (12,), lambda t: t.argsort().roll(5, 0)),
]


@pytest.mark.parametrize("name, shape, build", SORTED_THEN_MOVED, ids=[c[0] for c in SORTED_THEN_MOVED])
def test_sort_or_topk_then_a_movement_op_renders_and_matches_torch(name: str, shape: tuple[int, ...],
                                                                    build: Callable):
    """A gated read whose offset is computed by sort's reduction (a roll's or pad's gate over a sorted value) kept
    its offset's REDUCE as is; simplifying it under the gate rebuilt it as a second REDUCE over the same RANGEs,
    closed by two ENDs, and rendering failed with a KeyError (issue 13, item 6)."""
    from ember.codegen.lowerer import lower
    x = np.random.default_rng(len(name)).random(shape, dtype=np.float32)
    with Context(UNROLL=64):
        got = build(Tensor(x))
        for item in got.schedule():
            closed = [u.src[1] for u in lower(rangeify(item.ast)).toposort() if u.op is Ops.END]
            assert len(closed) == len(set(closed)), "a RANGE closed twice"
        np.testing.assert_array_equal(got.numpy(), build(torch.from_numpy(x)).numpy())


# ---- one read per node and position: rangeify's work is linear in the graph it reads ---------------------------


def rk4_cartpole(z: Tensor, steps: int) -> Tensor:
    """The issue's model: RK4 steps of a cart-pole whose state is a stack of scalars read back by s[0]-indexing."""
    return rk4(lambda s: cartpole_slope(s, z[4]), z[0:4], steps)


def bratu3d_residual(x: Tensor) -> Tensor:
    """A 7-point Laplacian (zero beyond the edges) plus exp(x) on an n x n x n grid."""
    n, out = x.shape[0], -6.0 * x + 0.01 * x.exp()
    for axis in range(3):
        for pad, cut in (((1, 0), slice(0, n)), ((0, 1), slice(1, n + 1))):
            pads, cuts = [(0, 0)] * 3, [slice(None)] * 3
            pads[axis], cuts[axis] = pad, cut
            out = out + x.pad(tuple(pads))[tuple(cuts)]
    return out


def tensor_level_reads(fn: Callable[[], list[UOp]]) -> tuple[list[UOp], int]:
    """The tensor-level INDEX nodes (a node read at a position) that rangeify rewrote for the kernels `fn` gives,
    and how many rules fired in all."""
    from ember.uop import upat
    asts = fn()
    with Context(TRACK_REWRITES=1, UNROLL=64):
        upat.rewrite_log.clear()
        for ast in asts: rangeify(ast)
        events, upat.rewrite_log[:] = list(upat.rewrite_log), []
    return [e.before for e in events if e.before.op is Ops.INDEX and not isinstance(e.before.dtype, PtrDType)], \
        len(events)


def jacobian_kernels(fn: Callable[..., Tensor], shape: tuple[int, ...], sparse: bool = False) -> list[UOp]:
    import ember.ad as ad
    from ember.export import Arg, NumericalFunction
    f = (ad.spjacobian if sparse else ad.jacobian)(NumericalFunction("f", fn, [Arg(shape)]))
    return [item.ast for item in f.plan.items]


@pytest.mark.parametrize("build", [lambda: jacobian_kernels(lambda z: rk4_cartpole(z, 1), (5,)),
                                   lambda: jacobian_kernels(bratu3d_residual, (3, 3, 3), sparse=True)],
                         ids=["cartpole_jacobian", "bratu3d_sparse_jacobian"])
def test_a_node_is_read_once_per_position(build: Callable[[], list[UOp]]):
    """Reads of one node at one position are one INDEX node, so everything below it is rangeified once. A position
    spelled apart (`0 + 1` beside `1`: index arithmetic pushed down before it was simplified) or read under two gates
    (a constant position that several pieces of a cat along a loop reach) rebuilt the graph below per spelling and
    per gate: the cart-pole jacobian grew 6-9x per RK4 step (15236 reads of 522 nodes at one step), the 3-D Bratu
    recovery read each entry 4x over."""
    reads = set(tensor_level_reads(build)[0])
    positions = {(u.src[0], tuple(simplify(i) for i in u.src[2:])) for u in reads}
    assert len(reads) == len(positions), f"{len(reads)} reads of {len(positions)} (node, position) pairs"


def shuffled_positions(n: int, depth: int) -> Tensor:
    """A table of positions computed in the kernel: `depth` rounds of integer arithmetic and flips over an arange."""
    idx = Tensor.arange(n)
    for k in range(depth): idx = (idx * 5 + k).flip(0) % n
    return idx


def test_gathering_every_entry_of_a_computed_table_costs_the_table_once():
    """A gather whose position table is arithmetic over an arange, at each unrolled output position (a sparse
    jacobian's recovery): each entry folds to a constant. Rewritten per position, every entry walked the table's
    graph anew, so rangeify's work grew with entries x table (16 entries, 8 rounds of arithmetic: 3509 rules
    fired, 1040 for one round); evaluated, the entries share the table and the work is the gather's alone."""
    from ember.uop import upat

    def gathered(depth: int) -> Tensor:
        return Tensor(np.arange(16, dtype=np.float32) * 1.5).gather(0, shuffled_positions(16, depth))

    def rules_fired(depth: int) -> int:
        with Context(TRACK_REWRITES=1, UNROLL=64):
            upat.rewrite_log.clear()
            sink = rangeify(ast_of(gathered(depth)))
            fired, upat.rewrite_log[:] = len(upat.rewrite_log), []
        assert not ranges(sink) and all(u.src[0].src[1].op is Ops.CONST for u in loads(sink))  # unrolled, folded
        return fired

    assert rules_fired(8) - rules_fired(1) < 16, "the table was rewritten once per entry"
    want = np.arange(16)
    for k in range(8): want = (want * 5 + k)[::-1] % 16
    with Context(UNROLL=64): np.testing.assert_array_equal(gathered(8).numpy(), want * np.float32(1.5))


TABLES: list[tuple[str, Callable[[], Tensor]]] = [
    ("moved", lambda: Tensor.arange(12).reshape(3, 4).permute(1, 0).pad(((1, 0), (0, 2))).flip(1) * 3 - 7),
    ("selected", lambda: (Tensor.arange(12).reshape(3, 4)[1:, ::-1] // 2 < 2).where(
        Tensor.arange(12).reshape(3, 4)[1:], -Tensor.arange(12).reshape(3, 4)[:2])),
    ("broadcast", lambda: Tensor.arange(12).reshape(12, 1).expand(12, 3) % (Tensor.arange(3) + 1).reshape(1, 3)),
    ("divides_by_zero", lambda: Tensor.arange(12) // (Tensor.arange(12) - 5)),
    ("float", lambda: (Tensor.arange(12).float() * 0.5).cast(dtypes.int32)),
]


@pytest.mark.parametrize("name, build", TABLES, ids=[c[0] for c in TABLES])
def test_a_table_entry_evaluates_to_the_constant_its_rewrite_folds_to(name: str, build: Callable[[], Tensor]):
    """constant_at gives, at every position, the constant that rangeifying the read folds to, and numpy's value;
    where the rewrite does not fold to a constant (a division by zero, undefined in C) or might fold otherwise (a
    float), it gives None and the rewrite is used."""
    value = ast_of(build()).src[0].src[1]
    ctx, values, want = RangeifyContext(dtypes.int32), {}, build().numpy()
    for pos in itertools.product(*map(range, value.shape)):
        read = at(value, UOp.const(dtypes.bool, True), tuple(UOp.const(dtypes.int32, i) for i in pos))
        folded = graph_rewrite(read, pm_rangeify_symbolic, ctx=ctx, bottom_up=True)
        got = constant_at(value, pos, values)
        if name == "float" or name == "divides_by_zero" and pos == (5,):
            assert got is None
            continue
        assert folded.op is Ops.CONST and got == folded.arg == want[pos] and type(got) is type(folded.arg)
