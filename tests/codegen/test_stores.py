"""split_stores stores a concatenation piece by piece, each piece over its own shape; a reshaped one is stored into a
reshaped target. The values do not change.

Oracle: numpy for every value, bit for bit (the split only moves where each element is stored); the kernel's uops
for the structure (no comparison and no `//` or `%` left where the pieces are plain and affine in the loops).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ember import Tensor
from ember.codegen.lowerer import lower
from ember.codegen.rangeify import UNROLL_AXIS_LIMIT, rangeify
from ember.codegen.stores import SPLIT_LIMIT, split_stores
from ember.helpers import Context
from ember.renderer.sincos import numpy_sincos
from ember.uop.ops import Ops, UOp

RNG = np.random.default_rng(11)


def kernel(t: Tensor) -> UOp:
    (item,) = t.schedule()
    return item.ast


def stores(ast: UOp) -> int:
    return len([s for s in split_stores(ast, UNROLL_AXIS_LIMIT).src if s.op is Ops.STORE])


def ops_in(sink: UOp, *ops: Ops) -> list[UOp]:
    return [u for u in lower(rangeify(sink)).toposort() if u.op in ops]


def test_a_long_concatenation_is_one_store_per_piece_without_gates():
    x, y = RNG.standard_normal(40), RNG.standard_normal(25)
    with Context(UNROLL=0):
        out = Tensor(x).sin().cat(Tensor(y) * 2)
        ast = kernel(out)
        np.testing.assert_array_equal(out.numpy(), np.concatenate([numpy_sincos(Ops.SIN, x), y * 2]))  # float64
    assert stores(ast) == 2
    assert not ops_in(ast, Ops.CMPLT, Ops.WHERE)


def test_a_reshaped_stack_inside_a_concatenation_is_stored_over_its_own_axes():
    """CSC order of a stencil's entries in small: per position, a few values side by side, between edge pieces."""
    a, b, c = (RNG.standard_normal(30) for _ in range(3))
    edge = RNG.standard_normal(7)
    with Context(UNROLL=0):
        inner = Tensor.stack(Tensor(a), Tensor(b) - 1, Tensor(c) * 3, dim=-1).reshape(90)
        out = Tensor(edge).cat(inner, Tensor(edge) + 1)
        ast = kernel(out)
        want = np.concatenate([edge, np.stack([a, b - 1, c * 3], -1).reshape(90), edge + 1])
        np.testing.assert_array_equal(out.numpy(), want)
    assert stores(ast) == 3
    assert not ops_in(ast, Ops.IDIV, Ops.MOD, Ops.CMPLT), "the stacked values are found by position arithmetic"
    assert len(ops_in(ast, Ops.STORE)) == 2 + 3  # the edges' loops, and the stack's three values per step


@pytest.mark.parametrize("shape", [(3, 40), (20, 17), (1, 50)])
def test_a_concatenation_along_an_inner_axis_splits_each_row(shape):
    rows, n = shape
    x, y = RNG.standard_normal((rows, n)), RNG.standard_normal((rows, 5, 4))
    with Context(UNROLL=0):
        out = Tensor(x).cat((Tensor(y) * 2).reshape(rows, 20), dim=1).reshape(-1)
        ast = kernel(out)
        np.testing.assert_array_equal(out.numpy(), np.concatenate([x, (y * 2).reshape(rows, 20)], 1).reshape(-1))
    assert stores(ast) == 2
    assert not ops_in(ast, Ops.CMPLT)


def test_nested_concatenations_split_down_to_their_pieces():
    """A 2-D grid's edges and interior, each row a concatenation of an edge value, a run and an edge value."""
    grid = RNG.standard_normal((6, 30))
    with Context(UNROLL=0):
        g = Tensor(grid)
        rows = [g[i:i + 1, :1].cat(g[i:i + 1, 1:29] * 2, g[i:i + 1, 29:], dim=1) for i in (0,)]
        band = g[1:5, :1].cat(g[1:5, 1:29] * 3 + 1, g[1:5, 29:], dim=1)
        out = Tensor.cat(rows[0].reshape(-1), band.reshape(-1), g[5].reshape(-1))
        ast = kernel(out)
        row0 = np.concatenate([grid[0, :1], grid[0, 1:29] * 2, grid[0, 29:]])
        np.testing.assert_array_equal(out.numpy(), np.concatenate([row0, np.concatenate(
            [grid[1:5, :1], grid[1:5, 1:29] * 3 + 1, grid[1:5, 29:]], 1).reshape(-1), grid[5]]))
    assert stores(ast) == 3 + 3 + 1
    assert not ops_in(ast, Ops.IDIV, Ops.MOD, Ops.CMPLT)


def test_a_short_stack_is_left_to_rangeify_and_more_pieces_than_the_limit_stay_whole():
    a, b = RNG.standard_normal(10), RNG.standard_normal(10)
    with Context(UNROLL=0):
        short = Tensor(a[:3]).cat(Tensor(b[:4]))
        assert stores(kernel(short)) == 1
        np.testing.assert_array_equal(short.numpy(), np.concatenate([a[:3], b[:4]]))
        pieces = [RNG.standard_normal(2) for _ in range(SPLIT_LIMIT + 1)]
        many = Tensor.cat(*[Tensor(p) for p in pieces])
        assert stores(kernel(many)) == 1
        np.testing.assert_array_equal(many.numpy(), np.concatenate(pieces))


def test_signed_zeros_and_nans_are_stored_as_they_are():
    """A concatenation copies its pieces exactly: -0.0 stays -0.0 (a sum of padded pieces would not)."""
    x = np.array([-0.0, np.nan, np.inf, -np.inf] * 5)
    with Context(UNROLL=0):
        out = Tensor(x).cat(Tensor(-x))
        got = out.numpy()
    np.testing.assert_array_equal(got.view(np.int64), np.concatenate([x, -x]).view(np.int64))


def test_a_sum_of_padded_pieces_is_stored_stretch_by_stretch():
    """A gradient with respect to a vector read in slices is such a sum: `a` and `b` overlap on [20, 40), c lies
    apart; between the ends each stretch is a plain sum of the pieces there, with no gate, and bit for bit numpy's
    (an absent piece is still a + 0.0 term: -0.0 in `a` comes out +0.0, as numpy's sum of padded arrays gives)."""
    a, b, c = RNG.standard_normal(40), RNG.standard_normal(30), RNG.standard_normal(12)
    a[3] = a[25] = -0.0
    with Context(UNROLL=0):
        out = Tensor(a).pad((0, 40)) + Tensor(b).exp().pad((20, 30)) + (Tensor(c) * 2).pad((68, 0))
        ast = kernel(out)
        got = out.numpy()
    exp_b = np.array([math.exp(v) for v in b])  # the C library's exp, which the kernel calls (numpy's own AVX-512
    want = np.pad(a, (0, 40)) + np.pad(exp_b, (20, 30)) + np.pad(c * 2, (68, 0))  # exp differs in the last bit)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert stores(ast) == 5  # [0, 20) a, [20, 40) a + b, [40, 50) b, [50, 68) nothing, [68, 80) c
    assert not ops_in(ast, Ops.CMPLT, Ops.WHERE)


def test_a_sum_padded_only_near_its_ends_stays_one_store():
    """A stencil's gradient (x[1:] and x[:-1] read) pads by one at each end: the middle keeps a size the vector
    opts divide, and the store stays whole."""
    x = RNG.standard_normal(64)
    with Context(UNROLL=0):
        t = Tensor(x)
        out = t[1:].pad((1, 0)) + t[:-1].pad((0, 1))
        ast = kernel(out)
        np.testing.assert_array_equal(out.numpy(), np.pad(x[1:], (1, 0)) + np.pad(x[:-1], (0, 1)))
    assert stores(ast) == 1
