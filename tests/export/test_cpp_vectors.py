"""generate_module(vector_bytes=n): kernels compute on GCC/Clang vectors of n bytes where the heuristic finds it pays
(a vmap's points in lanes, their states gathered and their jacobians scattered lane by lane), and give the scalar
code's bits: each lane is one output, every sum adds in loop order, nothing is fused into an FMA.

Oracle: ember's numpy interpreter (f.interpret), bit for bit, through the checked rerun too (an infinite state);
torch.func.jacrev for the values; the heuristic's choice read from the rendered source."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

import ember.ad
import ember.export.pieces as pieces
from ember import Tensor
from ember.export import Arg, NumericalFunction, generate_module, render_module
from tests.export.test_derivative_code import STATES, rk4_step

CXX = [c for c in ("g++", "clang++") if shutil.which(c)]
FLAGS = ["-std=c++17", "-O2", "-march=native", "-Wall", "-Wextra", "-Werror"]
POINTS = 96

DRIVER = """#include <cmath>
#include <cstdio>
#include <memory>
#include "mod.hpp"
static const double values[] = {{{values}}};
int main() {{
  auto ws = mod::{f}::make_ws();
  auto x = std::make_unique<mod::{f}::{arg}_t>();
  auto out = std::make_unique<mod::{f}::out0_t>();
  for (long i = 0; i < {n_in}; i++) (*x)[i] = values[i];
  mod::{f}::call(*x, *out, *ws);
  for (long i = 0; i < {n_out}; i++) std::printf("%a\\n", (*out)[i]);
  return 0;
}}
"""


def literal(v: float) -> str:
    return ("-" if v < 0 else "") + "INFINITY" if np.isinf(v) else float(v).hex()


def run_module(f: NumericalFunction, x: np.ndarray, cxx: str, vector_bytes: int, tmp_path) -> tuple[np.ndarray, str]:
    """f's module compiled with `cxx` and called on x from C++: its output, and the module's source."""
    _, source = generate_module("mod", [f], str(tmp_path), vector_bytes=vector_bytes)
    (tmp_path / "main.cpp").write_text(DRIVER.format(f=f.name, arg=f.arg_names[0], n_in=x.size,
                                                     n_out=int(np.prod(f.output_shapes[0])),
                                                     values=", ".join(literal(v) for v in x.reshape(-1))))
    exe = tmp_path / "main"
    subprocess.run([cxx, *FLAGS, "-o", str(exe), source, str(tmp_path / "main.cpp")], check=True,
                   capture_output=True, text=True)
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    return np.array([float.fromhex(p) for p in printed]).reshape(f.output_shapes[0]), open(source).read()


def step(z: Tensor) -> Tensor:
    return rk4_step(z, Tensor.sin, Tensor.cos, Tensor.stack)


def step_torch(z: torch.Tensor) -> torch.Tensor:
    return rk4_step(z, torch.sin, torch.cos, torch.stack)


def points(infinite: bool = False) -> np.ndarray:
    z = np.random.default_rng(5).uniform(-1.5, 1.5, (POINTS, STATES + 1))
    if infinite: z[37, 2] = np.inf  # a product 0 * inf in its tangents: NaN in the plain products, 0 in the checked
    return z


@pytest.mark.skipif(not CXX, reason="no C++ compiler")
@pytest.mark.parametrize("cxx", CXX)
@pytest.mark.parametrize("vector_bytes", [16, 32, 64])
@pytest.mark.parametrize("infinite", [False, True], ids=["finite", "an_infinite_state"])
def test_a_vmapped_step_jacobian_computes_its_points_in_vector_lanes(cxx, vector_bytes, infinite, tmp_path):
    """The 9 x 10 jacobian of a ring's RK4 step, 380 operations and 36 sin/cos a point, over 96 points stored point
    after point: no access walks the points with stride one, yet its arithmetic takes vectors of vector_bytes / 8
    points (the heuristic's compute_bound); the libm calls stay one per lane, so the bits are the interpreter's."""
    f = ember.ad.vmap(ember.ad.jacobian(NumericalFunction("step", step, [Arg(STATES + 1)])), axis_size=POINTS)
    z = points(infinite)
    got, source = run_module(f, z, cxx, vector_bytes, tmp_path)
    lanes = vector_bytes // 8
    assert f"typedef double f64x{lanes} __attribute__((vector_size({vector_bytes})));" in source
    assert f"const f64x{lanes} " in source and "fma" not in source
    np.testing.assert_array_equal(got, f.interpret(z))
    if not infinite:
        want = torch.vmap(torch.func.jacrev(step_torch))(torch.from_numpy(z)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.skipif(not CXX, reason="no C++ compiler")
@pytest.mark.parametrize("vector_bytes", [32, 64])
@pytest.mark.parametrize("infinite", [False, True], ids=["finite", "an_infinite_state"])
def test_points_no_vector_divides_take_full_vectors_the_last_one_gated(vector_bytes, infinite, tmp_path):
    """50 points (a swing-up's intervals), which no 4 or 8 lanes divide: the points still go in full vectors, 13 of
    4 or 7 of 8, the lanes past the 50th gated off (no load, no store, no NaN test): the interpreter's bits."""
    n = 50
    f = ember.ad.vmap(ember.ad.jacobian(NumericalFunction("step", step, [Arg(STATES + 1)])), axis_size=n)
    z = points(infinite)[:n]
    got, source = run_module(f, z, CXX[0], vector_bytes, tmp_path)
    lanes = vector_bytes // 8
    assert f"const f64x{lanes} " in source and f"r0 < {-(-n // lanes)}; r0++" in source
    np.testing.assert_array_equal(got, f.interpret(z))
    if not infinite:
        want = torch.vmap(torch.func.jacrev(step_torch))(torch.from_numpy(z)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_the_python_call_of_a_vmap_gives_the_interpreters_bits():
    """The NumericalFunction's own native build takes this CPU's vectors: the same bits as the interpreter's."""
    f = ember.ad.vmap(ember.ad.jacobian(NumericalFunction("step", step, [Arg(STATES + 1)])), axis_size=POINTS)
    for z in (points(), points(infinite=True)): np.testing.assert_array_equal(f(z), f.interpret(z))


def weights() -> np.ndarray:
    """Entries whose sums cancel: an FMA, or another order of the terms, changes the bits."""
    rng = np.random.default_rng(2)
    return rng.standard_normal((37, 16)) * np.where(rng.random((37, 16)) < 0.2, 1e8, 1.0)


def product(x: Tensor) -> Tensor:
    w = Tensor(weights())
    return ((x * x.sin()) @ w) * 0.5 + (x @ w).cos()


@pytest.mark.skipif(not CXX, reason="no C++ compiler")
@pytest.mark.parametrize("vector_bytes", [32, 64])
def test_an_exported_sum_keeps_its_order_in_vector_lanes(vector_bytes, tmp_path):
    """x @ w for each of 96 points: the vector lanes run along w's 16 columns (stride one), each lane its own
    column's sum of 37 products added in loop order and rounded product by product, as the interpreter does (the
    CPU device's kernels would split the sum and fuse the products: other last bits)."""
    f = ember.ad.vmap(NumericalFunction("product", product, [Arg(37)]), axis_size=POINTS)
    x = np.random.default_rng(4).standard_normal((POINTS, 37)) * 1e3
    got, source = run_module(f, x, CXX[0], vector_bytes, tmp_path)
    assert f"f64x{vector_bytes // 8}" in source and "fma" not in source
    np.testing.assert_array_equal(got, f.interpret(x))
    np.testing.assert_allclose(got, (x * np.sin(x)) @ weights() * 0.5 + np.cos(x @ weights()), rtol=1e-9, atol=1e-6)


def test_a_vmap_of_cheap_points_stays_scalar():
    """Two operations a point do not pay for gathering each point's entries lane by lane."""
    f = ember.ad.vmap(NumericalFunction("cheap", lambda x: x[0] * x[1] + x[2], [Arg(3)]), axis_size=POINTS)
    _, source = render_module("mod", [f], vector_bytes=64)
    assert "f64x" not in source


def test_vectors_are_off_by_default():
    f = ember.ad.vmap(ember.ad.jacobian(NumericalFunction("step", step, [Arg(STATES + 1)])), axis_size=POINTS)
    _, source = render_module("mod", [f])
    assert "vector_size" not in source and "f64x" not in source


@pytest.mark.parametrize("vector_bytes", [8, 24, 128, -16, 32.0, True])
def test_a_bad_vector_width_is_refused(vector_bytes):
    f = NumericalFunction("point", lambda x: x * 2, [Arg(3)])
    with pytest.raises(ValueError, match="vector_bytes must be one of"):
        render_module("mod", [f], vector_bytes=vector_bytes)


def test_a_loop_without_libm_calls_is_left_to_the_compilers_vectorizer():
    """A sparse Rosenbrock hessian's rolled column loop: stride-one loads, entries stored with stride 3, a dozen
    operations a column. g++ vectorizes it itself, interleaving the stores (0.111 us a call, against 0.184 in
    ember's lanes, whose stores go one by one): no ember vectors, where the scores alone would take them."""
    def rosenbrock(x: Tensor) -> Tensor:
        return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()
    f = ember.ad.sphessian(NumericalFunction("rosenbrock", rosenbrock, [Arg(100)]))
    _, source = render_module("mod", [f], vector_bytes=64)
    assert "f64x" not in source and "for (" in source
    x = np.random.default_rng(1).uniform(0.5, 1.5, 100)
    np.testing.assert_array_equal(f(x), f.interpret(x))


@pytest.mark.skipif(not CXX, reason="no C++ compiler")
@pytest.mark.parametrize("infinite", [False, True], ids=["finite", "an_infinite_state"])
def test_a_long_vector_kernel_is_cut_into_pieces_with_the_same_bits(infinite, monkeypatch, tmp_path):
    """A run of vector statements is cut as a scalar one (export/pieces.py): its vectors and masks handed from piece
    to piece through carry arrays of their types; what the module computes is still the interpreter's."""
    monkeypatch.setattr(pieces, "SPLIT_FROM", 200)
    monkeypatch.setattr(pieces, "PIECE_STATEMENTS", 60)
    f = ember.ad.vmap(ember.ad.jacobian(NumericalFunction("step", step, [Arg(STATES + 1)])), axis_size=POINTS)
    z = points(infinite)
    got, source = run_module(f, z, CXX[0], 64, tmp_path)
    assert "f64x8 carry_f64x8[" in source and "step_jac_vmap_k0_" in source and "_part3<" in source
    np.testing.assert_array_equal(got, f.interpret(z))
