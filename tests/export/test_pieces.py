"""A long straight-line kernel is cut into functions of a few hundred statements (export/pieces.py): g++ allocates
registers for each alone (a 3-interval MPC hessian of 19,000 statements: 31 s to compile whole, 5.7 s in pieces).

Oracle: the same kernel compiled whole (a random straight-line program, run through ctypes), ember's numpy interpreter
(bit for bit, through the checked rerun too), and torch.func's jacobian."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
import torch

import ember.ad
import ember.export.pieces as pieces
from ember import Tensor
from ember.export import Arg, NumericalFunction, render_module
from ember.export.native import find_cxx
from ember.export.pieces import cut_into_pieces
from ember.helpers import Context
from tests.export.test_derivative_code import STATES, rk4_step

CXX = find_cxx()
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler")


def random_kernel(statements: int, seed: int) -> str:
    """A kernel `void k(out, in)` as the CppRenderer writes one: loads, a long run of arithmetic on random earlier
    values (some defined before the run, some read after it, in a loop), stores inside the run and after it."""
    rng = np.random.default_rng(seed)
    lines = [f"  const double val{i} = *(data1+{i});" for i in range(8)]
    names = [f"val{i}" for i in range(8)]
    lines.append("  const int32_t t0 = 3;")
    for i in range(1, statements):
        a, b = (names[int(j)] for j in rng.integers(0, len(names), 2))
        op = ["+", "-", "*"][int(rng.integers(0, 3))]
        lines.append(f"  const double t{i} = {a}{op}{b}*0.5;")
        names.append(f"t{i}")
        if i % 97 == 0: lines.append(f"  *(data0+{i // 97}) = t{i};")
    tail = [names[int(j)] for j in rng.integers(8, len(names), 4)]
    lines.append("  for (int32_t r0 = 0; r0 < 4; r0++) {")
    lines.append("    const int32_t t99999 = r0+t0;")
    lines += [f"    if (r0 == {k}) *(data0+t99999+90) = {v};" for k, v in enumerate(tail)]
    lines.append("  }")
    return "void k(double* __restrict data0, const double* __restrict data1) {\n" + "\n".join(lines) + "\n}"


def run_kernel(source: str, tmp_path, name: str) -> np.ndarray:
    path = tmp_path / f"{name}.cpp"
    path.write_text("#include <cstdint>\n#define EMBER_KERNEL\n#define EMBER_PIECE __attribute__((noinline))\n"
                    f'extern "C" {{\n{source}\n}}\n')
    lib = tmp_path / f"{name}.so"
    subprocess.run([CXX, "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-o", str(lib), str(path)], check=True)
    out, x = np.full(100, np.nan), np.linspace(0.5, 1.5, 8)
    ctypes.CDLL(str(lib)).k(out.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p))
    return out


@needs_cxx
@pytest.mark.parametrize("seed", [0, 1])
def test_a_kernel_cut_into_pieces_computes_what_it_computed_whole(seed: int, tmp_path, monkeypatch):
    monkeypatch.setattr(pieces, "SPLIT_FROM", 300)
    monkeypatch.setattr(pieces, "PIECE_STATEMENTS", 70)
    whole = random_kernel(1200, seed)
    cut, parts = cut_into_pieces(whole, "k", "")
    assert len(parts) == -(-1212 // 70)  # the run: 1199 values, 12 stores, and t0 (the loads make it longer)
    assert "double carry_double[" in cut and "int32_t carry_int32_t[1];" in cut
    source = "\n".join(p.source for p in parts) + "\n" + cut
    np.testing.assert_array_equal(run_kernel(source, tmp_path, "cut"), run_kernel(whole, tmp_path, "whole"))


def test_a_short_run_or_one_in_a_loop_stays_whole(monkeypatch):
    monkeypatch.setattr(pieces, "SPLIT_FROM", 300)
    short = random_kernel(200, 0)
    assert cut_into_pieces(short, "k", "") == (short, [])
    looped = short.replace("\n  const", "\n    const").replace("void k(", "void k(")  # (indented: a loop's body)
    assert cut_into_pieces(looped, "k", "") == (looped, [])


def ember_step(z: Tensor) -> Tensor:
    return rk4_step(z, Tensor.sin, Tensor.cos, lambda v: Tensor.stack(*v))


def torch_step(z: torch.Tensor) -> torch.Tensor:
    return rk4_step(z, torch.sin, torch.cos, torch.stack)


@needs_cxx
def test_a_jacobian_in_pieces_has_torchs_values_and_the_interpreters_bits(monkeypatch):
    """The reverse jacobian of a 9-state RK4 step (one straight-line kernel, a template on its checked tangent
    products) cut into pieces of 64 statements: its values are torch.func's, bit for bit the interpreter's, also at
    an infinite state, where the plain products leave NaNs and the checked pieces run again."""
    monkeypatch.setattr(pieces, "SPLIT_FROM", 200)
    monkeypatch.setattr(pieces, "PIECE_STATEMENTS", 64)
    step = NumericalFunction("step", ember_step, [Arg(STATES + 1)])
    f = ember.ad.jacobian(step)  # (9 outputs, 10 inputs: reverse)
    source = render_module("m", [f])[1]
    assert source.count("EMBER_PIECE void") >= 5 and "_part0<checked_products>(" in source
    assert "template void step_jac_k0" in source and "_part0<true>(" in source  # the checked pieces, unoptimized
    z = np.linspace(-0.8, 0.9, STATES + 1)
    with Context(CACHELEVEL=0): f.compile()
    want = torch.func.jacrev(torch_step)(torch.tensor(z)).numpy()
    np.testing.assert_allclose(f(z), want, rtol=1e-13, atol=1e-13)
    for x in (z, np.where(np.arange(STATES + 1) == 2, np.inf, z)):
        np.testing.assert_array_equal(f(x), f.interpret(x))
