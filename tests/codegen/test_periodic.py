"""split_periodic runs a loop that tests its index modulo a small constant period by period: the remainders and
the gates fold, the values do not change.

Oracle: numpy for every value (bit for bit: the split only moves where each element is computed); the kernel's
uops for what was folded (no MOD left inside the loop, the peeled steps outside it).
"""

from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor
from ember.codegen.lowerer import lower
from ember.codegen.periodic import PERIOD_LIMIT, split_periodic
from ember.codegen.rangeify import rangeify
from ember.helpers import Context
from ember.uop.ops import Ops, UOp

RNG = np.random.default_rng(5)


def kernel(t: Tensor) -> UOp:
    (item,) = t.schedule()
    return split_periodic(rangeify(item.ast))


def in_loops(sink: UOp, op: Ops) -> list[UOp]:
    return [u for u in lower(sink).toposort() if u.op is op and u.ranges]


def stencil(x: Tensor, period: int) -> Tensor:
    """Each element's left neighbour or itself or its right neighbour, by its index modulo `period`."""
    n = x.shape[0]
    rest = Tensor.arange(n).fmod(period)
    return rest.eq(0).where(x.pad((1, 0))[:n], rest.eq(1).where(x * 2, x.pad((0, 1))[1:]))


def stencil_numpy(x: np.ndarray, period: int) -> np.ndarray:
    left, right = np.concatenate([[0.0], x[:-1]]), np.concatenate([x[1:], [0.0]])
    rest = np.arange(len(x)) % period
    return np.where(rest == 0, left, np.where(rest == 1, x * 2, right))


@pytest.mark.parametrize("n", [7, 10, 30, 31, 100, 1001])
@pytest.mark.parametrize("period", [2, 3, 5, 12])
def test_a_stencil_chosen_by_the_index_modulo_a_period_folds_and_keeps_its_values(n, period):
    x = RNG.standard_normal(n)
    with Context(UNROLL=0):
        out = stencil(Tensor(x), period)
        sink = kernel(out)
        np.testing.assert_array_equal(out.numpy(), stencil_numpy(x, period))
    if n // period >= 2 + 2:  # enough whole periods to run a loop after the peeled ends
        assert not in_loops(sink, Ops.MOD), "a remainder is left inside the loop"
        assert not in_loops(sink, Ops.CMPLT), "a gate is left inside the loop (the ends were not peeled)"
        (loop,) = [u for u in sink.toposort() if u.op is Ops.RANGE]
        assert int(loop.src[0].arg) <= n // period


def test_a_period_beyond_the_limit_or_a_remainder_that_only_addresses_stays_a_plain_loop():
    x = RNG.standard_normal(60)
    with Context(UNROLL=0):
        far = stencil(Tensor(x), PERIOD_LIMIT + 1)
        assert in_loops(kernel(far), Ops.MOD)
        np.testing.assert_array_equal(far.numpy(), stencil_numpy(x, PERIOD_LIMIT + 1))
        view = Tensor(x).reshape(3, 20).T.reshape(60) * 2  # reads x[(i % 3) * 20 + i // 3]: an address only
        sink = kernel(view)
        assert [int(r.src[0].arg) for r in sink.toposort() if r.op is Ops.RANGE] == [60]
        assert in_loops(sink, Ops.MOD)
        np.testing.assert_array_equal(view.numpy(), x.reshape(3, 20).T.reshape(60) * 2)


def test_a_loop_whose_copies_would_exceed_the_split_work_stays_a_plain_loop(monkeypatch):
    """Each copy is the loop body rewritten: past SPLIT_WORK nodes in all (a multiple-shooting hessian's body of
    48,000 nodes made 35 copies, for minutes) the loop is left as it is, with the same values."""
    import ember.codegen.periodic as periodic
    x = RNG.standard_normal(60)
    with Context(UNROLL=0):
        out = stencil(Tensor(x), 3)
        assert not in_loops(kernel(out), Ops.MOD)
        monkeypatch.setattr(periodic, "SPLIT_WORK", 100)
        sink = kernel(out)
        assert [int(r.src[0].arg) for r in sink.toposort() if r.op is Ops.RANGE] == [60]
        assert in_loops(sink, Ops.MOD)
        np.testing.assert_array_equal(out.numpy(), stencil_numpy(x, 3))


def test_a_kernel_with_a_reduction_is_left_alone():
    x = RNG.standard_normal((12, 5))
    with Context(UNROLL=0):
        rest = Tensor.arange(12).fmod(3).reshape(12, 1)
        out = rest.eq(0).where(Tensor(x), -Tensor(x)).sum(1)
        sink = kernel(out)
        assert in_loops(sink, Ops.MOD)
        want = np.where(np.arange(12)[:, None] % 3 == 0, x, -x).sum(1)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-14)


def _sparse_derivatives(n: int) -> dict[str, object]:
    import ember.ad
    from ember.export import Arg, NumericalFunction
    bratu = NumericalFunction("bratu", lambda x: x.pad((1, 0))[:n] - 2 * x + x.pad((0, 1))[1:] + 0.01 * x.exp(),
                              [Arg(n)])  # square, zero boundary values
    rosenbrock = NumericalFunction("rosen", lambda x: (100 * (x[1:] - x[:-1] * x[:-1]) ** 2 + (1 - x[:-1]) ** 2).sum(),
                                   [Arg(n)])
    return {"jacobian": ember.ad.spjacobian(bratu), "hessian": ember.ad.sphessian(rosenbrock)}


@pytest.mark.parametrize("kind", ["jacobian", "hessian"])
def test_a_period_of_alike_columns_rolls_into_a_loop_over_columns(kind, monkeypatch):
    """A banded sparse derivative's period (3 colors of 3 nonzeros, or a star coloring's 4 columns) folds to the
    same column repeated: rolled, the loop takes one column per step (a loop g++ vectorizes), with the same bits
    as the unrolled period."""
    import ember.codegen.periodic as periodic
    n = 64
    f = _sparse_derivatives(n)[kind]
    x = RNG.uniform(0.5, 1.5, n)
    sinks = [split_periodic(rangeify(item.ast)) for item in f.plan.items]
    loops = [u for sink in sinks for u in sink.toposort() if u.op is Ops.RANGE]
    assert loops and all(int(r.src[0].arg) > n // 2 for r in loops), [int(r.src[0].arg) for r in loops]
    assert 3 in [len(in_loops(sink, Ops.STORE)) for sink in sinks], "one column: 3 stores a step"
    rolled = f.call_kernels(x)
    monkeypatch.setattr(periodic, "reroll", lambda copies, q: None)
    g = _sparse_derivatives(n)[kind]
    np.testing.assert_array_equal(rolled, g.call_kernels(x))
