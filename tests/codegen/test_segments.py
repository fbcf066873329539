"""split_segments cuts a loop whose stores compare its index with constants inside its range into one loop per
stretch between them; stretches of one length share a loop, short ones are unrolled. The values do not change.

Oracle: numpy for every value (bit for bit: the split only moves where each element is computed); the kernel's
uops for what was folded (no comparison left inside a loop) and shared (one SIN per step where the pieces of a
concatenation take the sine of the same element).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ember import Tensor
from ember.codegen.lowerer import lower
from ember.codegen.rangeify import rangeify
from ember.codegen.segments import SEGMENT_LIMIT, cuts, split_segments
from ember.helpers import Context
from ember.renderer.sincos import numpy_sincos
from ember.uop.ops import AxisKind, Ops, UOp

RNG = np.random.default_rng(7)
exp = np.vectorize(math.exp)  # libm, as the kernels call it (numpy's own may differ)


def sin(x: np.ndarray) -> np.ndarray:
    """float64 sin as the CPU kernels compute it (renderer/sincos.py, checked against mpmath in test_sincos.py)."""
    return numpy_sincos(Ops.SIN, x)


def kernel(t: Tensor) -> UOp:
    (item,) = t.schedule()
    return split_segments(rangeify(item.ast))


def in_loops(sink: UOp, op: Ops) -> list[UOp]:
    return [u for u in lower(sink).toposort() if u.op is op and u.ranges]


def loop_sizes(sink: UOp) -> list[int]:
    return sorted(int(u.src[0].arg) for u in sink.toposort() if u.op is Ops.RANGE)


def test_cuts_are_where_a_comparison_of_an_affine_index_changes_its_answer():
    r = UOp.range(40, 0, AxisKind.GLOBAL)
    nodes = [(r * 2 + 3) < 10, UOp.const(r.dtype, 20) < r + 1, r.eq(30), (r + 100) < 7, r < 40]
    # 2r + 3 < 10 until r = 4; 20 < r + 1 from r = 20; r == 30 singles out [30, 31); the others never change
    assert cuts(UOp.sink(*nodes).toposort(), r) == [4, 20, 30, 31]


@pytest.mark.parametrize("n", [12, 65, 100])
def test_equal_pieces_of_a_concatenation_share_one_loop_and_its_sines(n):
    x, y = RNG.standard_normal(n), RNG.standard_normal(n)
    with Context(UNROLL=0):
        s = Tensor(x).sin()
        out = Tensor.cat(s + Tensor(y), s * Tensor(y), Tensor(y[:3]).exp())
        sink = kernel(out)
        np.testing.assert_array_equal(out.numpy(), np.concatenate([sin(x) + y, sin(x) * y, exp(y[:3])]))
    assert not in_loops(sink, Ops.CMPLT), "a gate is left inside a loop"
    assert len(in_loops(sink, Ops.SIN)) == 1, "each piece takes its own sine of x[j]"
    assert loop_sizes(sink) == sorted({n, 3})  # the exp piece's 3 steps: a loop too (of 2 or fewer: unrolled)


def test_short_stretches_are_unrolled_and_the_loop_between_has_no_gates():
    x, y = RNG.standard_normal(40), RNG.standard_normal(40)
    with Context(UNROLL=0):
        out = Tensor.cat(Tensor(x).sin(), Tensor(y).sin() * 2).pad((2, 1)) * 3
        sink = kernel(out)
        np.testing.assert_array_equal(out.numpy(), np.pad(np.concatenate([sin(x), sin(y) * 2]), (2, 1)) * 3)
    assert loop_sizes(sink) == [40]
    assert not in_loops(sink, Ops.CMPLT)
    assert len([u for u in sink.src if u.op is Ops.STORE]) == 2 + 3  # the loop's two and the three peeled zeros


def test_a_loop_cut_only_near_its_ends_stays_whole():
    """A padded stencil's gates single out a step or two at each end: its loop keeps the size the opts divide into
    vector lanes (and a periodic one is split_periodic's to peel)."""
    x = RNG.standard_normal(1021)
    with Context(UNROLL=0):
        out = Tensor(x).sin().pad((1, 1)) * 3
        sink = kernel(out)
        np.testing.assert_array_equal(out.numpy(), np.pad(sin(x), (1, 1)) * 3)
    assert loop_sizes(sink) == [1023]


def test_more_stretches_than_the_limit_or_a_reduction_leave_the_loop_alone():
    """(A sum of padded pieces: a concatenation is stored piece by piece before this stage, codegen/stores.py.)"""
    pieces = [RNG.standard_normal(10) for _ in range(SEGMENT_LIMIT + 1)]
    n = len(pieces)
    with Context(UNROLL=0):
        out = sum((Tensor(p).sin().pad((10 * i, 10 * (n - 1 - i))) * (i + 1) for i, p in enumerate(pieces)),
                  start=Tensor.zeros(10 * n))
        sink = kernel(out)
        np.testing.assert_array_equal(out.numpy(), sum((np.pad(sin(p), (10 * i, 10 * (n - 1 - i))) * (i + 1)
                                                        for i, p in enumerate(pieces)), start=np.zeros(10 * n)))
        assert loop_sizes(sink) == [10 * len(pieces)] and in_loops(sink, Ops.CMPLT)
        x = RNG.standard_normal((80, 6))
        summed = Tensor(x).sum(1) + Tensor.cat(Tensor.zeros(40), Tensor.ones(40))
        sink = kernel(summed)
        np.testing.assert_array_equal(summed.numpy(), x.sum(1) + np.repeat([0.0, 1.0], 40))
        assert loop_sizes(sink) == [6, 80] and in_loops(sink, Ops.CMPLT)
