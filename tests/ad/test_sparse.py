"""ember.ad.spjacobian and sphessian: the nonzeros equal the dense derivative, the pattern holds every nonzero, the
colorings compress banded matrices to their band width, and the result exports to C++.

Oracles: the dense ember.ad.jacobian / hessian (to 1e-12 scaled by the largest entry: the same derivative rules,
other directions), central differences of the function's own calls (to 1e-6), and closed forms where the matrix has
one (the tridiagonal Bratu jacobian at n = 1000). The CSC arrays are checked against a dense matrix built with numpy.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from ember import Tensor, ad
from ember.ad import SparseFunction
from ember.codegen.lowerer import lower
from ember.codegen.periodic import split_periodic
from ember.codegen.rangeify import rangeify
from ember.codegen.segments import split_segments
from ember.dtype import dtypes
from ember.errors import ShapeError
from ember.export import Arg, NumericalFunction, generate_module
from ember.uop.ops import Ops
from tests.helpers import cpp_driver, scaled_error

RNG = np.random.default_rng(17)
BAND = RNG.uniform(0.5, 1.5, 5)  # weights of the offsets -2..2
A33 = RNG.standard_normal((3, 3))
PERM = RNG.permutation(8)
PICK = np.array([3, 3, 0, 7, 1, 5, 6, 2])  # a repeated index
PAIRS = RNG.choice(9, size=(2, 12))  # random couplings x_I[k] x_J[k] (some with I = J, some repeated)

DENSE_TOL = 1e-12
FD_TOL = 1e-6


# ---- the functions -------------------------------------------------------------------------------------------------

def shifted(x: Tensor, k: int) -> Tensor:
    """y[i] = x[i + k], zero past either end: a pad and a shrink."""
    n = x.shape[0]
    return x.pad(((2, 2),))[2 + k:2 + k + n]


def bratu(u: Tensor) -> Tensor:
    """The residual of -u'' = lambda exp(u) on n interior points of (0, 1), u = 0 at both ends (tridiagonal)."""
    n = u.shape[0]
    padded = u.pad(((1, 1),))
    return (padded[:-2] - 2 * u + padded[2:]) * (n + 1) ** 2 + 0.8 * u.exp()


def banded(x: Tensor) -> Tensor:
    """r_i = x_i * sum_k w_k sin(x_{i+k}) for k in -2..2: band width 5."""
    return x * sum((shifted(x, k).sin() * float(w) for k, w in zip(range(-2, 3), BAND)), start=x * 0)


def arrowhead(x: Tensor) -> Tensor:
    """r_0 = sum x^2 (a dense row), r_i = x_i^3 + x_0 x_i (a dense column)."""
    return (x * x).sum().reshape(1).cat(x[1:] ** 3 + x[0] * x[1:])


def block_diagonal(x: Tensor) -> Tensor:
    """Four independent 3-blocks through a reshape: block b of the output reads block b of x only."""
    blocks = x.reshape(4, 3)
    return ((blocks @ Tensor(A33)).tanh() * blocks).reshape(-1)


def gathered(x: Tensor) -> Tensor:
    """Reads at constant positions: r_i depends on x_i, x_PERM[i] and x_PICK[i]."""
    return x[Tensor(PERM)] * x + x[Tensor(PICK)].sin()


def where_max(x: Tensor) -> Tensor:
    """A WHERE between two branches, an elementwise maximum with a neighbour, and a max over pairs: 12 x 8."""
    branches = (x > 0.1).where(x * x, x.flip(0).sin()) + x.maximum(shifted(x, 1))
    return branches.cat(x.reshape(4, 2).max(axis=1) * x[:4])


def two_args(p: Tensor, x: Tensor) -> Tensor:
    """Differences of x scaled by parameters p: 7 x 8 in x, 7 x 2 in p."""
    return p[0] * (x[1:] - x[:-1]) ** 2 + p[1] * x[1:].exp()


def two_totals(x: Tensor) -> Tensor:
    """2 x 8 and both rows dense: two row colors against eight column colors, so the reverse path."""
    return (x * x).sum().reshape(1).cat((x * Tensor(BAND[:1].repeat(8))).sin().sum().reshape(1))


def block_rows(x: Tensor) -> Tensor:
    """3 x 12, row r reads x[4r:4r+4] only: one row color (reverse mode), four column colors."""
    return (x.reshape(3, 4).sin() * x.reshape(3, 4)).sum(axis=1)


def laplacian_2d(u: Tensor) -> Tensor:
    """The 5-point stencil on a 4 x 5 grid with zero boundary, plus u^3: a 2-d argument and a 2-d output."""
    p = u.pad(((1, 1), (1, 1)))
    return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u + u ** 3


def pair_products(x: Tensor) -> Tensor:
    """A random sparse 12 x 9 jacobian: r_k = sin(x_I[k] x_J[k])."""
    return (x[Tensor(PAIRS[0])] * x[Tensor(PAIRS[1])]).sin()


def rosenbrock(x: Tensor) -> Tensor:
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def arrow_energy(x: Tensor) -> Tensor:
    """x_0 couples to every other x_i: an arrowhead hessian, which a star coloring gives 2 colors."""
    return x[0] * (x[1:] ** 2).sum() + (x ** 4).sum()


def arrow_energy_hub_last(x: Tensor) -> Tensor:
    """The arrowhead with its hub variable last: a greedy star coloring in natural order gave it n colors."""
    return x[-1] * (x[:-1] ** 2).sum() + (x ** 4).sum()


def kinked_energy(x: Tensor) -> Tensor:
    """A WHERE and a maximum inside a scalar: max(x_i, x_i+1)^2 x_i-1 couples x_i-1 with x_i+1, so band width 5."""
    return ((x > 0).where(x ** 3, x ** 2) + x.maximum(shifted(x, 1)) ** 2 * shifted(x, -1)).sum()


def pair_energy(x: Tensor) -> Tensor:
    """A random sparse hessian: sum_k sin(x_I[k] x_J[k]) + sum x^4."""
    return pair_products(x).sum() + (x ** 4).sum()


def coupled_energy(p: Tensor, x: Tensor) -> Tensor:
    """Hessian in x (argnum 1): tridiagonal, scaled by p."""
    return p[0] * (x[1:] * x[:-1]).sin().sum() + p[1] * (x ** 4).sum()


@dataclass(frozen=True)
class Case:
    """A function of float64 arguments, its argument shapes and the argnum of the sparse derivative."""

    name: str
    fn: Callable
    shapes: tuple[tuple[int, ...], ...]
    argnum: int = 0

    def inputs(self) -> list[np.ndarray]:
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        return [rng.uniform(-1, 1, s) for s in self.shapes]


JACOBIANS = {c.name: c for c in [
    Case("bratu", bratu, ((10,),)),
    Case("banded", banded, ((12,),)),
    Case("arrowhead", arrowhead, ((7,),)),
    Case("block_diagonal", block_diagonal, ((12,),)),
    Case("gathered", gathered, ((8,),)),
    Case("where_max", where_max, ((8,),)),
    Case("two_args_x", two_args, ((2,), (8,)), argnum=1),
    Case("two_args_p", two_args, ((2,), (8,)), argnum=0),
    Case("two_totals", two_totals, ((8,),)),
    Case("block_rows", block_rows, ((12,),)),
    Case("laplacian_2d", laplacian_2d, ((4, 5),)),
    Case("pair_products", pair_products, ((9,),)),
]}
HESSIANS = {c.name: c for c in [
    Case("rosenbrock", rosenbrock, ((6,),)),
    Case("arrow_energy", arrow_energy, ((6,),)),
    Case("arrow_energy_hub_last", arrow_energy_hub_last, ((9,),)),
    Case("kinked_energy", kinked_energy, ((7,),)),
    Case("pair_energy", pair_energy, ((9,),)),
    Case("coupled_energy", coupled_energy, ((2,), (7,)), argnum=1),
]}
CASES = {**JACOBIANS, **HESSIANS}


@functools.cache
def base(name: str) -> NumericalFunction:
    case = CASES[name]
    return NumericalFunction(case.fn.__name__, case.fn, [Arg(s) for s in case.shapes])


@functools.cache
def sparse(name: str) -> SparseFunction:
    return (ad.spjacobian if name in JACOBIANS else ad.sphessian)(base(name), CASES[name].argnum)


@functools.cache
def dense(name: str) -> NumericalFunction:
    return (ad.jacobian if name in JACOBIANS else ad.hessian)(base(name), CASES[name].argnum)


def fd_jacobian(call: Callable, inputs: list[np.ndarray], argnum: int, step: float = 1e-5) -> np.ndarray:
    """d call / d inputs[argnum] by central differences, as a matrix (output flattened) x (argument flattened)."""
    x = inputs[argnum]
    columns = []
    for j in range(x.size):
        h = step * max(1.0, abs(x.flat[j]))
        plus, minus = x.copy(), x.copy()
        plus.flat[j] += h
        minus.flat[j] -= h
        at = [[p if i == argnum else a for i, a in enumerate(inputs)] for p in (plus, minus)]
        columns.append((np.asarray(call(*at[0])) - np.asarray(call(*at[1]))).reshape(-1) / (2 * h))
    return np.stack(columns, axis=1)


def csc_to_dense(values: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The matrix of a CSC triple, built column by column (what scipy.sparse.csc_matrix would hold)."""
    out = np.zeros(shape)
    for j in range(shape[1]):
        for k in range(indptr[j], indptr[j + 1]): out[indices[k], j] += values[k]
    return out


def check_csc(f: SparseFunction) -> None:
    m, n = f.shape
    assert f.indptr.dtype == np.int64 and f.indices.dtype == np.int64
    assert f.indptr.shape == (n + 1,) and f.indptr[0] == 0 and f.indptr[-1] == f.nnz == len(f.indices)
    assert np.all(np.diff(f.indptr) >= 0)
    assert np.all((f.indices >= 0) & (f.indices < m))
    for j in range(n):
        rows = f.indices[f.indptr[j]:f.indptr[j + 1]]
        assert np.all(np.diff(rows) > 0), f"column {j}: rows {rows} not strictly increasing"


# ---- sparse against dense and finite differences -------------------------------------------------------------------

@pytest.mark.parametrize("name", CASES)
def test_sparse_derivative_is_the_dense_one_and_zero_outside_its_pattern(name):
    case = CASES[name]
    inputs = case.inputs()
    f = sparse(name)
    values = f(*inputs)
    m, n = f.shape
    assert values.shape == (f.nnz,) and values.dtype == np.float64
    check_csc(f)
    got = csc_to_dense(values, f.indices, f.indptr, f.shape)
    np.testing.assert_array_equal(f.to_dense(values), got)
    want = np.asarray(dense(name)(*inputs)).reshape(m, n)
    pattern = csc_to_dense(np.ones(f.nnz), f.indices, f.indptr, f.shape) > 0
    assert np.all(want[~pattern] == 0), f"dense nonzeros outside the pattern at {np.argwhere((want != 0) & ~pattern)}"
    err = scaled_error(got, want)
    assert err < DENSE_TOL, f"vs the dense derivative: scaled error {err:.3g}\n{got}\n{want}"
    of = base(name) if name in JACOBIANS else ad.gradient(base(name), case.argnum)
    err = scaled_error(got, fd_jacobian(of, inputs, case.argnum))
    assert err < FD_TOL, f"vs central differences: scaled error {err:.3g}"


@pytest.mark.parametrize("name", list(HESSIANS))
def test_sparse_hessian_pattern_is_symmetric(name):
    f = sparse(name)
    pattern = csc_to_dense(np.ones(f.nnz), f.indices, f.indptr, f.shape) > 0
    assert f.shape[0] == f.shape[1] and np.array_equal(pattern, pattern.T)


# Nonzeros where the structure is known: tridiagonal 10 x 10, band 5 on 12, four 3 x 3 blocks, an arrowhead of 7, the
# 5-point stencil on 4 x 5 (20 + 2 * 31 edges), two dense rows of 8, three rows of 4, tridiagonal 6 x 6, arrow of 6.
NNZ = {"bratu": 28, "banded": 54, "block_diagonal": 36, "arrowhead": 19, "laplacian_2d": 82, "two_totals": 16,
       "block_rows": 12, "rosenbrock": 16, "arrow_energy": 16}


@pytest.mark.parametrize("name, nnz", NNZ.items())
def test_pattern_has_no_spurious_nonzeros(name, nnz):
    assert sparse(name).nnz == nnz


# ---- colors --------------------------------------------------------------------------------------------------------

# A band of width w needs w colors (a tridiagonal matrix 3), whatever its size; rows that share no column need one
# row color; a star coloring gives an arrowhead hessian 2 (the hub and the rest).
COLORS = {"bratu": 3, "banded": 5, "block_diagonal": 3, "two_totals": 2, "block_rows": 1, "rosenbrock": 3,
          "arrow_energy": 2, "arrow_energy_hub_last": 2, "kinked_energy": 5, "coupled_energy": 3}


@pytest.mark.parametrize("name, colors", COLORS.items())
def test_colors_are_what_the_structure_needs(name, colors):
    assert sparse(name).colors == colors


def test_tridiagonal_jacobian_of_a_thousand_unknowns_needs_three_colors_and_is_exact():
    n = 1000
    f = ad.spjacobian(NumericalFunction("bratu_big", bratu, [Arg(n)]))
    assert f.colors == 3 and f.shape == (n, n) and f.nnz == 3 * n - 2
    u = np.random.default_rng(5).uniform(-1, 1, n)
    got = f(u)
    h2 = (n + 1) ** 2
    columns = np.repeat(np.arange(n), np.diff(f.indptr))
    want = np.where(f.indices == columns, -2.0 * h2 + 0.8 * np.exp(u[columns]), float(h2))
    assert np.all(np.abs(f.indices - columns) <= 1)
    np.testing.assert_allclose(got, want, rtol=1e-13)


def test_rosenbrock_hessian_of_a_hundred_unknowns_needs_three_colors():
    n = 100
    f = ad.sphessian(NumericalFunction("rosenbrock_big", rosenbrock, [Arg(n)]))
    assert f.colors == 3 and f.nnz == 3 * n - 2
    x = np.random.default_rng(6).uniform(-1, 1, n)
    h = f.to_dense(f(x))
    diag = np.zeros(n)
    diag[:-1] += 1200 * x[:-1] ** 2 - 400 * x[1:] + 2
    diag[1:] += 200
    off = -400 * x[:-1]
    want = np.diag(diag) + np.diag(off, 1) + np.diag(off, -1)
    assert scaled_error(h, want) < 1e-13


@pytest.mark.parametrize("make, size", [(lambda n: ad.spjacobian(NumericalFunction("tri", bratu, [Arg(n)])), 1000),
                                        (lambda n: ad.sphessian(NumericalFunction("ros", rosenbrock, [Arg(n)])), 100)],
                         ids=["bratu", "rosenbrock"])
def test_a_banded_derivative_reads_its_products_where_they_are_computed(make, size):
    """A banded pattern's coloring and CSC positions repeat with a small period: the seeds and the positions are
    arithmetic, and the nonzeros are computed in one loop over whole periods (codegen/periodic.py) reading no table:
    no kernel stores the compressed products, none loads an int32 position."""
    f = make(size)
    assert len(f.plan.items) <= 2  # the nonzeros, after a stored transcendental (bratu's exp)
    assert f.plan.items[-1].bufs[0] is f.plan.outputs[0]
    sink = lower(split_periodic(rangeify(f.plan.items[-1].ast)))
    loop_loads = [u for u in sink.toposort() if u.op is Ops.LOAD and u.ranges]
    assert loop_loads and all(u.dtype == dtypes.float64 for u in loop_loads), "a position table is read in the loop"
    x = np.random.default_rng(8).uniform(-1, 1, size)
    np.testing.assert_array_equal(f(x), f.call_kernels(x))  # compiled C++ and the C kernels agree


@pytest.mark.parametrize("n, offsets", [(40, (-1, 0, 1)), (50, (-1, 0)), (60, (0, 3)), (1000, (-1, 0, 1))])
def test_positions_of_a_banded_pattern_are_arithmetic_and_exact(n, offsets):
    """The CSC positions of a banded pattern's nonzeros in its compressed products, rebuilt as arithmetic in the
    nonzero's number, are the table exactly; a shuffled table is not mistaken for one."""
    from ember.ad.sparse import _positions
    from ember.ad.sparsity import color_columns
    pattern = np.zeros((n, n), dtype=bool)
    for d in offsets: pattern |= np.eye(n, k=d, dtype=bool)
    cols, rows = np.nonzero(pattern.T)
    where = color_columns(pattern)[cols] * n + rows
    positions = _positions(where)
    assert positions is not None
    np.testing.assert_array_equal(positions.numpy(), where)
    assert _positions(np.random.default_rng(1).permutation(where)) is None


SHOOTING = 30  # intervals


def shooting(w: Tensor) -> Tensor:
    """A multiple-shooting Lagrangian's shape: unknowns (a at the nodes, b at the nodes, u per interval), each
    interval's term couples its a_i, b_i, u_i (a 3 x 3 block of the hessian), the defects are linear."""
    n = SHOOTING
    a, b, u = w[:n + 1], w[n + 1:2 * n + 2], w[2 * n + 2:]
    return ((a[:n] + 0.1 * b[:n]).sin() * u).sum() + (u * u).sum() + (a[1:] - a[:n] - 0.1 * b[:n]).sum()


def test_a_hessian_colored_in_runs_seeds_by_arithmetic_and_computes_each_interval_once():
    """The colors come in runs (a's, b's, u's: one each): the seeds are comparisons with the runs' ends, not a table,
    and the store over w split at the pieces' ends (codegen/stores.py) computes each interval's sine and cosine once
    per step of one loop, for all three pieces of the gradient and all three directions (the last node's entries,
    zeros, are stores of their own)."""
    n = SHOOTING
    f = ad.sphessian(NumericalFunction("shooting", shooting, [Arg(3 * n + 2)]))
    assert f.colors == 3 and f.nnz == 9 * n
    assert not any(b.dtype == dtypes.int32 and b.size == 3 * n + 2 for b in f.plan.constants), "a color table"
    kernel = next(item for item in f.plan.items if item.bufs[0].size == 3 * (3 * n + 2))  # the compressed products
    sink = lower(split_segments(rangeify(kernel.ast)))
    transcendentals = [u for u in sink.toposort() if u.op in (Ops.SIN, Ops.COS)]
    assert len(transcendentals) == 2
    assert {int(r.src[0].arg) for u in transcendentals for r in u.ranges} == {n}
    w = np.random.default_rng(9).uniform(-1, 1, 3 * n + 2)
    dense = ad.hessian(NumericalFunction("shooting_dense", shooting, [Arg(3 * n + 2)]))(w)
    assert scaled_error(f.to_dense(f(w)), dense) < DENSE_TOL
    np.testing.assert_array_equal(f(w), f.call_kernels(w))


def test_a_multiple_shooting_jacobian_colors_its_rows_in_one_table_per_component():
    """The defects of a 9-state ring model over 20 intervals (each component's defects in a run): greedy coloring
    gives the first and last interval of a run other colors than the middle (49 runs of colors); colored by
    translates (interval k + 2's rows like interval k's) the 9 components are 9 runs, with no more colors. Oracle:
    the pattern itself (no two rows sharing a column alike) and torch.func.jacrev for the values."""
    torch = pytest.importorskip("torch")
    from ember.ad.sparse import _runs, periodic
    from ember.ad.sparsity import color_rows, dependencies
    from ember.export.function import placeholders_for, tracing
    from tests.export.test_derivative_code import STATES, shooting_defects
    n = 20

    def defects(w, sin, cos, join): return shooting_defects(w, n, sin, cos, join)
    f = NumericalFunction("ring_defects", lambda w: defects(w, Tensor.sin, Tensor.cos, lambda xs: Tensor.cat(*xs)),
                          [Arg(STATES * (n + 1) + n)])
    xs = placeholders_for(f.args)
    with tracing(xs): out = f.fn(*xs)
    pattern = dependencies(out.uop, xs[0].uop, {x.uop for x in xs})
    greedy = color_rows(pattern)
    colors = periodic(greedy, pattern.T)
    for column in pattern.T:  # rows sharing a column differ
        rows = np.flatnonzero(column)
        assert len(set(colors[rows].tolist())) == len(rows)
    assert colors.max() <= greedy.max() and len(_runs(greedy) or ()) > STATES
    assert [start for start, _ in _runs(colors)] == [k * n for k in range(STATES)]
    jac = ad.spjacobian(f)
    assert jac.colors == colors.max() + 1
    w = 0.3 * np.random.default_rng(4).standard_normal(STATES * (n + 1) + n)
    want = torch.func.jacrev(lambda t: defects(t, torch.sin, torch.cos, torch.cat))(torch.tensor(w)).numpy()
    assert scaled_error(jac.to_dense(jac(w)), want) < DENSE_TOL


def test_an_irregular_pattern_reads_its_positions_from_a_table():
    """Positions with no period (random couplings) stay a constant table of int32 (the values are checked against
    the dense derivative with the other cases)."""
    assert any(b.dtype == dtypes.int32 and b.size == sparse("pair_products").nnz
               for b in sparse("pair_products").plan.constants)


@functools.cache
def ignores_x() -> SparseFunction:
    return ad.spjacobian(NumericalFunction("ignores_x", lambda x, y: y.sin(), [Arg(3), Arg(2)]), 0)


def test_a_derivative_with_no_nonzeros_is_empty():
    f = ignores_x()
    assert f.shape == (2, 3) and f.nnz == 0 and list(f.indptr) == [0, 0, 0, 0]
    values = f(np.ones(3), np.ones(2))
    assert values.shape == (0,)
    np.testing.assert_array_equal(f.to_dense(values), np.zeros((2, 3)))


def test_a_derivative_with_no_nonzeros_evaluates_no_direction():
    assert ignores_x().colors == 0


def test_indices_read_from_an_argument_make_the_whole_axis_a_dependency():
    """x[i] with i an argument could read any element: every column of that row is in the pattern."""
    f = ad.spjacobian(NumericalFunction("dynamic_pick", lambda x, i: x[i] * x[:2], [Arg(5), Arg(2, "int64")]))
    assert f.shape == (2, 5) and f.nnz == 10
    x, i = np.random.default_rng(8).uniform(-1, 1, 5), np.array([4, 0])
    want = np.zeros((2, 5))
    want[[0, 1], [0, 1]] += x[i]
    want[[0, 1], i] += x[:2]
    np.testing.assert_allclose(f.to_dense(f(x, i)), want, rtol=1e-15)


# ---- export ---------------------------------------------------------------------------------------------------------

CXX = shutil.which("g++")
FLAGS = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror"]


@pytest.mark.skipif(CXX is None, reason="needs g++ (apt-get install g++)")
def test_exported_sparse_derivatives_compile_strictly_and_match_python_bit_for_bit(tmp_path):
    names = ["bratu", "two_args_x", "rosenbrock", "coupled_energy"]
    fns: list[NumericalFunction] = [sparse(n) for n in names]
    inputs = [CASES[n].inputs() for n in names]
    generate_module("sparse_derivs", fns, str(tmp_path))
    (tmp_path / "main.cpp").write_text(cpp_driver("sparse_derivs", fns, inputs))
    exe = tmp_path / "main"
    build = subprocess.run([CXX, *FLAGS, "-o", str(exe), str(tmp_path / "sparse_derivs.cpp"),
                            str(tmp_path / "main.cpp")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    expected = [float(v).hex() for f, args in zip(fns, inputs) for v in np.asarray(f(*args)).reshape(-1)]
    assert [float.fromhex(p).hex() for p in printed] == expected
    header = (tmp_path / "sparse_derivs.hpp").read_text()
    for f in fns:  # the pattern in the header is the one Python has
        block = header[header.index(f"namespace {f.name} {{"):]
        for name, values in (("indptr", f.indptr), ("indices", f.indices)):
            line = next(ln for ln in block.splitlines() if ln.startswith("inline constexpr") and f" {name}[" in ln)
            assert [int(v) for v in line.split("{")[1].split("}")[0].split(",")] == values.tolist()
        assert f"constexpr std::size_t colors = {f.colors};" in block and f"nnz = {f.nnz};" in block


# ---- errors --------------------------------------------------------------------------------------------------------

def test_sphessian_of_a_non_scalar_raises_shape_error():
    with pytest.raises(ShapeError, match=r"sphessian: bratu must return one scalar, not outputs of shapes \[\(10,\)\]"):
        ad.sphessian(base("bratu"))


def test_spjacobian_of_several_outputs_raises_shape_error():
    f = NumericalFunction("pair", lambda x: (x * 2, x.sum()), [Arg(3)])
    with pytest.raises(ShapeError, match="spjacobian: pair must have one output"):
        ad.spjacobian(f)


@pytest.mark.parametrize("kind", ["spjacobian", "sphessian"])
@pytest.mark.parametrize("argnum", [2, -3])
def test_argnum_out_of_range_raises_index_error_naming_it(kind, argnum):
    f = base("coupled_energy")
    with pytest.raises(IndexError, match=f"{kind}: argnum {argnum} is out of range for coupled_energy, which takes 2 "
                                         f"arguments"):
        getattr(ad, kind)(f, argnum)


@pytest.mark.parametrize("kind", ["spjacobian", "sphessian"])
def test_integer_argument_raises_type_error(kind):
    f = NumericalFunction("counted", lambda x, k: (x * k).sum(), [Arg(3), Arg(3, "int64")])
    with pytest.raises(TypeError, match=f"{kind}: argument 1 of counted is int64; derivatives need floats"):
        getattr(ad, kind)(f, 1)


def test_hessian_through_a_gather_has_the_pattern_of_its_reads():
    """The gradient of x[PERM] * x + sin(x[PICK]) adds by index (a SCATTER_ADD): entry (i, j) of the hessian is
    nonzero only where i and j meet in one term (j = PERM[i] or i = PERM[j]; i = j in PICK), and the values are
    torch's."""
    import torch
    def energy(x: Tensor) -> Tensor: return (x[Tensor(PERM)] * x).sum() + x[Tensor(PICK)].sin().sum()
    f = ad.sphessian(NumericalFunction("gathered_energy", energy, [Arg(8)]))
    x = np.random.default_rng(8).uniform(-1, 1, 8)
    want = torch.func.hessian(lambda t: (t[torch.tensor(PERM)] * t).sum() + t[torch.tensor(PICK)].sin().sum())(
        torch.tensor(x)).numpy()
    pattern = csc_to_dense(np.ones(f.nnz), f.indices, f.indptr, f.shape) > 0
    expected = np.zeros((8, 8), dtype=bool)
    expected[np.arange(8), PERM] = expected[PERM, np.arange(8)] = expected[PICK, PICK] = True
    assert np.array_equal(pattern, expected)
    assert scaled_error(f.to_dense(f(x)), want) < DENSE_TOL
