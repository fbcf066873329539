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


def random_kernel(statements: int, seed: int, looped: bool = False) -> str:
    """A kernel `void k(out, in)` as the CppRenderer writes one: loads, a long run of arithmetic on random earlier
    values (some defined before the run, some read after it, in a loop), stores inside the run and after it. Looped:
    the run is the body of a loop over 3 steps, whose counter its loads and stores read."""
    rng = np.random.default_rng(seed)
    pad = "    " if looped else "  "
    step = "r9*8+" if looped else ""
    lines = [f"{pad}const double val{i} = *(data1+{step}{i});" for i in range(8)]
    names = [f"val{i}" for i in range(8)]
    lines.append(f"{pad}const int32_t t0 = 3;")
    for i in range(1, statements):
        a, b = (names[int(j)] for j in rng.integers(0, len(names), 2))
        op = ["+", "-", "*"][int(rng.integers(0, 3))]
        lines.append(f"{pad}const double t{i} = {a}{op}{b}*0.5;")
        names.append(f"t{i}")
        if i % 97 == 0: lines.append(f"{pad}*(data0+{'r9*30+' if looped else ''}{i // 97}) = t{i};")
    tail = [names[int(j)] for j in rng.integers(8, len(names), 4)]
    lines.append(f"{pad}for (int32_t r0 = 0; r0 < 4; r0++) {{")
    lines.append(f"{pad}  const int32_t t99999 = r0+t0;")
    out = "r9*30+" if looped else ""
    lines += [f"{pad}  if (r0 == {k}) *(data0+{out}t99999+20) = {v};" for k, v in enumerate(tail)]
    lines.append(f"{pad}}}")
    if looped: lines = ["  for (int32_t r9 = 0; r9 < 3; r9++) {", *lines, "  }"]
    return "void k(double* __restrict data0, const double* __restrict data1) {\n" + "\n".join(lines) + "\n}"


def run_kernel(source: str, tmp_path, name: str) -> np.ndarray:
    path = tmp_path / f"{name}.cpp"
    path.write_text("#include <cstdint>\n#define EMBER_KERNEL\n#define EMBER_PIECE __attribute__((noinline))\n"
                    f'extern "C" {{\n{source}\n}}\n')
    lib = tmp_path / f"{name}.so"
    subprocess.run([CXX, "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-o", str(lib), str(path)], check=True)
    out, x = np.full(100, np.nan), np.linspace(0.5, 1.5, 24)
    ctypes.CDLL(str(lib)).k(out.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p))
    return out


@needs_cxx
@pytest.mark.parametrize("seed, looped", [(0, False), (1, False), (2, True)])
def test_a_kernel_cut_into_pieces_computes_what_it_computed_whole(seed: int, looped: bool, tmp_path, monkeypatch):
    """Cut or whole, the same outputs bit for bit; a run in a loop passes the loop's counter to its pieces."""
    monkeypatch.setattr(pieces, "SPLIT_FROM", 300)
    monkeypatch.setattr(pieces, "PIECE_STATEMENTS", 70)
    whole = random_kernel(1200, seed, looped)
    cut, parts = cut_into_pieces(whole, "k", "")
    assert len(parts) == -(-1212 // 70)  # the run: 1199 values, 12 stores, and t0 (the loads make it longer)
    assert "double carry_double[" in cut and "int32_t carry_int32_t[1];" in cut
    assert all(("const int32_t r9, " in p.params) == looped for p in parts)
    source = "\n".join(p.source for p in parts) + "\n" + cut
    got, want = run_kernel(source, tmp_path, "cut"), run_kernel(whole, tmp_path, "whole")
    assert np.isfinite(want[1:13]).all()  # (the stores in the run)
    np.testing.assert_array_equal(got, want)


def test_a_short_run_stays_whole(monkeypatch):
    monkeypatch.setattr(pieces, "SPLIT_FROM", 300)
    for looped in (False, True):
        short = random_kernel(200, 0, looped)
        assert cut_into_pieces(short, "k", "") == (short, [])


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
