"""generate_module(threads=n): a kernel with enough work (a large vmap) runs in n slices on std::threads, and the
C++ still gives the Python call's bits.

Oracle: the NumericalFunction's own Python call (ember's CPU kernels), bit for bit."""

import shutil
import subprocess

import numpy as np
import pytest

import ember.ad
from ember.export import Arg, NumericalFunction, generate_module, render_module

CXX = [c for c in ("g++", "clang++") if shutil.which(c)]
FLAGS = ["-std=c++17", "-O2", "-march=native", "-pthread", "-Wall", "-Wextra", "-Werror"]
POINTS = 1 << 17  # above the heuristic's THREAD_WORK: the loop over points is split across the cores


DRIVER = """#include <cstdio>
#include <memory>
#include "mod.hpp"
static const double values[] = {{{values}}};
int main() {{
  auto ws = mod::point_vmap::make_ws();
  auto x = std::make_unique<mod::point_vmap::x_t>();
  auto out = std::make_unique<mod::point_vmap::out0_t>();
  for (long i = 0; i < {n} * 3; i++) (*x)[i] = values[i];
  mod::point_vmap::call(*x, *out, *ws);
  for (long i = 0; i < {n}; i++) std::printf("%a\\n", (*out)[i]);
  return 0;
}}
"""


def point(x):
    """A multiply-add and a sine per point: what g++ would contract into an FMA (other last bits) if it could."""
    return x[0] * x[1] + x[2].sin()


@pytest.mark.parametrize("cxx", CXX)
def test_a_large_vmap_runs_on_threads_with_the_python_calls_bits(cxx, tmp_path):
    f = ember.ad.vmap(NumericalFunction("point", point, [Arg(3)]), axis_size=POINTS)
    x = np.random.default_rng(3).standard_normal((POINTS, 3))
    _, source = generate_module("mod", [f], str(tmp_path), threads=2)
    text = open(source).read()
    assert "#include <thread>" in text and "ember_parallel(2," in text
    (tmp_path / "main.cpp").write_text(DRIVER.format(n=POINTS, values=", ".join(v.hex() for v in x.reshape(-1))))
    exe = tmp_path / "main"
    subprocess.run([cxx, *FLAGS, "-o", str(exe), source, str(tmp_path / "main.cpp")], check=True,
                   capture_output=True, text=True)
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    want = f(x).reshape(-1)
    np.testing.assert_array_equal(np.array([float.fromhex(p) for p in printed]), want)


def test_one_thread_is_the_default_and_needs_no_thread_header():
    f = ember.ad.vmap(NumericalFunction("point", point, [Arg(3)]), axis_size=POINTS)
    _, source = render_module("mod", [f])
    assert "<thread>" not in source and "ember_parallel" not in source


@pytest.mark.parametrize("threads", [0, -1, 2.0, True, 1 << 20])
def test_a_bad_thread_count_is_refused(threads):
    f = NumericalFunction("point", point, [Arg(3)])
    with pytest.raises(ValueError, match="threads must be an int"):
        render_module("mod", [f], threads=threads)
