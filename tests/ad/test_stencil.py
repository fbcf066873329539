"""Stencil jacobians: a map of a grid to itself whose pattern is one set of offsets moved over the grid.

ember.ad.spjacobian colors such a pattern's columns with a lattice, `(a . p) % m` (ad/sparsity.py), as few colors
as a row has nonzeros, and computes each offset's entries directly (ad/sparse.py `Lattice.recover`): no color
table, no sum over the seeds; they are stored in CSC order box by box of the grid (codegen/stores.py), with no
table of positions either.

Oracles: a brute-force check of the coloring over every pair of columns sharing a row; the dense ember.ad.jacobian
(the same derivative rules, one direction per column) and central differences for the values; the compiled C++
against the C kernels bit for bit.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from ember import Tensor, ad
from ember.ad.sparse import SparseFunction
from ember.ad.sparsity import lattice_coloring, stencil_offsets
from ember.codegen.lowerer import lower
from ember.codegen.rangeify import rangeify
from ember.export import Arg, NumericalFunction
from ember.uop.ops import Ops
from tests.helpers import scaled_error


def stencil_pattern(shape: tuple[int, ...], offsets: list[tuple[int, ...]]) -> np.ndarray:
    """pattern[r, c]: r - c is one of `offsets` and both lie in the grid, built position by position."""
    n = int(np.prod(shape))
    pattern = np.zeros((n, n), dtype=bool)
    for c in itertools.product(*(range(s) for s in shape)):
        for o in offsets:
            r = tuple(ci + oi for ci, oi in zip(c, o, strict=True))
            if all(0 <= ri < s for ri, s in zip(r, shape, strict=True)):
                pattern[np.ravel_multi_index(r, shape), np.ravel_multi_index(c, shape)] = True
    return pattern


FIVE_POINT = [(0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)]
NINE_POINT = [(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)]
SEVEN_POINT = [(0, 0, 0)] + [tuple(s if d == k else 0 for d in range(3)) for k in range(3) for s in (-1, 1)]
STENCILS = {"three-point 1-D": ((17,), [(-1,), (0,), (1,)]),
            "five-point 2-D": ((7, 9), FIVE_POINT),
            "nine-point 2-D": ((6, 8), NINE_POINT),
            "seven-point 3-D": ((4, 5, 3), SEVEN_POINT),
            "one-sided 2-D": ((6, 6), [(0, 0), (1, 0), (0, 2)])}


@pytest.mark.parametrize("name", STENCILS)
def test_lattice_colors_a_stencil_with_as_few_colors_as_a_row_has_nonzeros(name):
    shape, offsets = STENCILS[name]
    pattern = stencil_pattern(shape, offsets)
    found = stencil_offsets(pattern, shape)
    assert found is not None and sorted(map(tuple, found.tolist())) == sorted(offsets)
    a, m = lattice_coloring(found, 100)
    assert m == len(offsets)  # a row holds every offset: no coloring has fewer
    colors = (np.stack(np.unravel_index(np.arange(pattern.shape[1]), shape), 1) @ a) % m
    for row in pattern:  # the columns of each row all differ in color
        assert len(set(colors[row].tolist())) == int(row.sum())


def test_a_pattern_that_is_not_one_stencil_is_not_taken_for_one():
    shape = (5, 6)
    pattern = stencil_pattern(shape, FIVE_POINT)
    assert stencil_offsets(pattern, (6, 5)) is None  # the same 30 unknowns on another grid: rows wrap elsewhere
    extra = pattern.copy()
    extra[0, 2] = True  # offset (0, -2) once, where the grid has room for it 20 times
    assert stencil_offsets(extra, shape) is None
    missing = pattern.copy()
    missing[7, 8] = False  # one neighbour dropped
    assert stencil_offsets(missing, shape) is None
    assert stencil_offsets(np.ones((30, 20), dtype=bool), shape) is None  # not a map of the grid to itself
    assert stencil_offsets(np.zeros((30, 30), dtype=bool), shape) is None


def test_no_lattice_below_the_limit_is_none():
    assert lattice_coloring(np.array(FIVE_POINT), 5) is None  # 5 colors are needed; fewer than 5 asked


# ---- stencil functions -----------------------------------------------------------------------------------------------

def shift(x: Tensor, offset: tuple[int, ...]) -> Tensor:
    """y[p] = x[p + offset], zero outside the grid."""
    pads = tuple((max(0, -o), max(0, o)) for o in offset)
    padded = x.pad(pads)
    return padded[tuple(slice(max(0, o), max(0, o) + s) for o, s in zip(offset, x.shape, strict=True))]


def bratu_2d(u: Tensor) -> Tensor:
    """The 5-point Laplacian plus a source exp(u): bench case e's residual on a non-square grid."""
    return sum((shift(u, o) for o in FIVE_POINT[1:]), start=-4.0 * u) + 0.3 * u.exp()


def nonlinear_9(u: Tensor) -> Tensor:
    """Each point couples to its 8 neighbours through products and a sine: every entry differs."""
    return sum((shift(u, o).sin() * (1.0 + 0.1 * k) * u for k, o in enumerate(NINE_POINT)), start=u * u)


def heat_3d(u: Tensor) -> Tensor:
    return sum((shift(u, o) for o in SEVEN_POINT[1:]), start=-6.0 * u) + (u * u).tanh()


def one_sided(u: Tensor) -> Tensor:
    """Offsets (0, 0), (1, 0), (0, 2): a stencil whose boxes are not symmetric about the grid's middle."""
    return u.exp() * shift(u, (1, 0)) + shift(u, (0, 2)).sin()


FUNCTIONS = {"bratu_2d": (bratu_2d, (7, 9), 5), "nonlinear_9": (nonlinear_9, (6, 8), 9),
             "heat_3d": (heat_3d, (4, 5, 3), 7)}
LARGE = {"bratu_2d": (50, 50), "nonlinear_9": (17, 19), "heat_3d": (17, 18, 3)}  # axes beyond UNROLL_AXIS_LIMIT


@functools.cache
def sparse(name: str, shape: tuple[int, ...] | None = None) -> SparseFunction:
    fn, small, _ = FUNCTIONS[name]
    return ad.spjacobian(NumericalFunction(name, fn, [Arg(shape or small)]))


def central_differences(f: NumericalFunction, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    columns = []
    for j in range(x.size):
        step = np.zeros(x.size)
        step[j] = h
        columns.append((np.asarray(f(x + step.reshape(x.shape))) - np.asarray(f(x - step.reshape(x.shape))))
                       .reshape(-1) / (2 * h))
    return np.stack(columns, 1)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_stencil_jacobian_is_the_dense_one_with_a_color_per_offset(name):
    fn, shape, colors = FUNCTIONS[name]
    f = sparse(name)
    assert f.colors == colors
    x = np.random.default_rng(3).uniform(-1, 1, shape)
    got = f.to_dense(f(x))
    plain = NumericalFunction(f"{name}_plain", fn, [Arg(shape)])
    want = np.asarray(ad.jacobian(plain)(x)).reshape(got.shape)
    assert np.array_equal(got != 0, f.to_dense(np.ones(f.nnz)) != 0)  # no entry of the pattern is zero here
    assert scaled_error(got, want) < 1e-13
    assert scaled_error(got, central_differences(plain, x)) < 1e-6
    np.testing.assert_array_equal(f(x), f.call_kernels(x))  # compiled C++ and the C kernels agree bit for bit


@pytest.mark.parametrize("name", FUNCTIONS)
def test_stencil_entries_are_computed_without_a_color_table_or_seeds(name):
    """The kernel computing the entries tests no color: every seed comparison folded to a constant, and it finds
    no position by `//` or `%`: each box of the grid stores its columns' entries at affine positions. No int32
    constant at all (the generated C++ holds the constants of plan.constants): neither colors nor CSC positions.
    On a grid whose axes are all small, rangeify may unroll those instead of the offsets (still exact, checked
    above): the grids here have long axes, as the problems this is for."""
    f = sparse(name, LARGE[name])
    assert f.colors == FUNCTIONS[name][2]
    for item in f.plan.items:
        sink = lower(rangeify(item.ast))
        assert not [u for u in sink.toposort() if u.op in (Ops.MOD, Ops.IDIV)], "a color or position is computed"
    assert not [b for b in f.plan.constants if b.dtype.name == "int32"], "a table is read"


GRIDS = [(bratu_2d, (50, 50)), (bratu_2d, (3, 40)), (bratu_2d, (40, 3)), (bratu_2d, (1, 30)), (bratu_2d, (2, 2)),
         (nonlinear_9, (17, 19)), (nonlinear_9, (3, 25)), (heat_3d, (17, 18, 3)), (heat_3d, (2, 20, 1)),
         (one_sided, (20, 23)), (one_sided, (4, 2))]


@pytest.mark.parametrize("fn, shape", GRIDS, ids=[f"{f.__name__}-{'x'.join(map(str, s))}" for f, s in GRIDS])
def test_entries_stored_box_by_box_are_the_table_read_ones_bit_for_bit(fn, shape, monkeypatch):
    """Square, long, non-square, one-row and tiny grids, 2-D and 3-D: the entries stored in CSC order box by box are
    those the table of positions reads, bit for bit, and the dense jacobian's (grids too small for a lattice
    coloring take the general path: the same values)."""
    x = np.random.default_rng(5).uniform(-1, 1, shape)
    f = ad.spjacobian(NumericalFunction(fn.__name__, fn, [Arg(shape)]))
    with monkeypatch.context() as patch:
        patch.setattr("ember.ad.sparse.SPLIT_LIMIT", 0)  # more boxes than allowed: the table path
        by_table = ad.spjacobian(NumericalFunction(f"{fn.__name__}_table", fn, [Arg(shape)]))
    got = np.asarray(f(x))
    np.testing.assert_array_equal(got.view(np.int64), np.asarray(by_table(x)).view(np.int64))
    want = np.asarray(ad.jacobian(NumericalFunction(f"{fn.__name__}_dense", fn, [Arg(shape)]))(x))
    assert scaled_error(f.to_dense(got), want.reshape(f.shape)) < 1e-13
    np.testing.assert_array_equal(got, f.call_kernels(x))
