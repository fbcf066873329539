"""ember's float64 sin and cos (renderer/sincos.py): within 0.8 ulp of the true value, and the same bits on every
CPU path: the C kernels on vectors and on scalars, the exported C++ at each vector width and compiler, and the numpy
interpreter.

Oracles: mpmath at 120 bits for the values; `numpy_sincos` (the same operations in numpy) for the bits; the C
library's sin and cos for the lanes it is left (|x| > 2**20, x next to a multiple of pi/2, inf and NaN)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from ember import Tensor
from ember.codegen import get_program
from ember.device import Device
from ember.export import Arg, NumericalFunction
from ember.helpers import Context
from ember.renderer.sincos import BOUND, numpy_sincos
from ember.uop.ops import Ops
from tests.export.test_cpp_vectors import CXX, run_module

FUNCTIONS = {"sin": (Ops.SIN, math.sin, mpmath.sin), "cos": (Ops.COS, math.cos, mpmath.cos)}
QUARTERS = np.arange(-400, 401) * (np.pi / 4)
HARD = np.concatenate([
    QUARTERS, np.nextafter(QUARTERS, np.inf), np.nextafter(QUARTERS, -np.inf),  # multiples of pi/4, neighbours
    [0.0, -0.0, 5e-324, -5e-324, 2.0**-27, -(2.0**-27), 2.0**-30, 0.75, np.nextafter(0.75, 0.0), 0.7853981633974483,
     BOUND, -BOUND, np.nextafter(BOUND, np.inf), 1e7, 1e300, np.inf, -np.inf, np.nan, 1.5707963267948966,
     3.141592653589793, 6.283185307179586, 355.0, 103993.0]])


def sample(n: int, seed: int = 0) -> np.ndarray:
    """n arguments of every scale: around the reduction's interval, a few turns, far turns, and log-uniform
    magnitudes from subnormal to huge, then HARD; a multiple of 64 in all."""
    rng = np.random.default_rng(seed)
    k = n // 5
    magnitudes = np.exp(rng.uniform(-745, 709, k)) * rng.choice([-1, 1], k)
    x = np.concatenate([rng.uniform(-1, 1, k), rng.uniform(-10, 10, k), rng.uniform(-2e3, 2e3, k),
                        rng.uniform(-BOUND, BOUND, k), magnitudes, HARD])
    return np.concatenate([x, x[:-len(x) % 64]])  # a multiple of every vector width


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.view(np.int64) == b.view(np.int64)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_within_0_8_ulp_of_the_true_value(name: str) -> None:
    op, _, exact = FUNCTIONS[name]
    x = sample(5000)
    x = x[np.isfinite(x)]
    got = numpy_sincos(op, x)
    mpmath.mp.prec = 120
    worst = 0.0
    for v, g in zip(x.tolist(), got.tolist(), strict=True):
        want = exact(mpmath.mpf(v))
        if want == 0: continue
        worst = max(worst, float(abs(mpmath.mpf(g) - want)) / math.ulp(float(want)))
    assert worst < 0.8, f"{name}: {worst:.3f} ulp"


def test_special_values_and_the_lanes_left_to_libm() -> None:
    sin, cos = (lambda v: numpy_sincos(Ops.SIN, np.array(v))), (lambda v: numpy_sincos(Ops.COS, np.array(v)))
    assert math.copysign(1.0, sin([-0.0])[0]) == -1.0 and sin([5e-324])[0] == 5e-324 and cos([0.0])[0] == 1.0
    assert np.isnan(sin([np.inf, -np.inf, np.nan])).all() and np.isnan(cos([np.inf, -np.inf, np.nan])).all()
    for v in (1e7, 1e300, np.nextafter(BOUND, np.inf), 1.5707963267948966, 3.141592653589793):  # libm's lanes
        assert sin([v])[0] == math.sin(v) and cos([v])[0] == math.cos(v)


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("vectors", [True, False], ids=["vector", "scalar"])
def test_cpu_kernels_give_the_reference_bits(name: str, vectors: bool) -> None:
    """Tensor.sin/cos on float64: the heuristic's kernel computes on vectors (the helper of a vector type in its
    source), a NOOPT kernel on doubles; both give numpy_sincos's bits, libm's lanes included."""
    op = FUNCTIONS[name][0]
    x = sample(20000, seed=1)
    value = getattr(Tensor(x, dtype="float64"), name)()
    with Context(NOOPT=0 if vectors else 1):
        (item,) = value.schedule()
        source = get_program(item.ast, Device["CPU"].renderer).src
        got = value.numpy()
    assert (f"ember_{name}_f64x" in source) == vectors and f"ember_{name}_f64" in source
    same = same_bits(got, numpy_sincos(op, x))
    assert same.all(), f"{x[~same][:4]} -> {got[~same][:4]}"


@pytest.mark.skipif(not CXX, reason="no C++ compiler")
@pytest.mark.parametrize("cxx", CXX)
@pytest.mark.parametrize("vector_bytes", [0, 16, 32, 64])
def test_the_exported_module_gives_the_interpreters_bits(cxx: str, vector_bytes: int, tmp_path) -> None:
    x = sample(400, seed=2)
    x = np.where(np.isnan(x), np.inf, x)  # (the driver's literals: inf, not NaN)
    f = NumericalFunction("trig", lambda v: Tensor.stack(v.sin(), v.cos()), [Arg(x.size)])
    got, source = run_module(f, x, cxx, vector_bytes, tmp_path)
    assert ("ember_sin_f64x" in source) == (vector_bytes > 0)
    want = f.interpret(x)
    assert same_bits(want, np.stack([numpy_sincos(Ops.SIN, x), numpy_sincos(Ops.COS, x)])).all()
    same = same_bits(got, want)
    assert same.all(), f"{np.tile(x, 2)[~same.reshape(-1)][:4]}"
