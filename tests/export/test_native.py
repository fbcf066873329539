"""The compiled fast path of NumericalFunction calls: same results as the kernel-by-kernel path, fast, cached."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ember import Tensor
from ember.errors import DTypeError, ShapeError
from ember.export import Arg, NumericalFunction
from ember.export.native import build_native, find_cxx

pytestmark = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")
RNG = np.random.default_rng(6)
C = RNG.standard_normal((3, 3))


def make() -> NumericalFunction:
    return NumericalFunction("native_model", lambda x, n: ((Tensor(C) @ x).sin() * n.cast("float64"), x[1:], n * 2),
                             [Arg(3), Arg((), "int32")])


def test_native_call_matches_the_kernel_path_bit_for_bit():
    f = make()
    assert build_native(f) is not None
    x = RNG.standard_normal(3)
    for got, want in zip(f(x, np.int32(3)), f.call_kernels(x, np.int32(3))):
        assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("values", [[1.0] * 3 + [0.0] * 5 + [1.0] * 2, [0.0] * 8 + [1.0] * 2, [2.0] * 4 + [0.5] * 6])
def test_constants_whose_first_bytes_repeat_survive_the_native_build(values):
    """g++ 12 with -march=native on AVX-512 folded the workspace copy of such constants into a broadcast of the
    first element; the generated init_ws reads them through a volatile pointer."""
    c = np.array(values)
    f = NumericalFunction("repeating_constant", lambda x: x * Tensor(c), [Arg(10)])
    x = np.arange(1.0, 11.0)
    np.testing.assert_array_equal(f(x), x * c)


def test_functions_alike_but_for_their_constants_get_their_own_extensions():
    """The extension is found by a description of the plan, not its source: the constants' values are in it."""
    for scale in (2.0, 3.0):
        f = NumericalFunction("scaled_by_constant", lambda x, s=scale: x * Tensor(np.full(3, s)), [Arg(3)])
        np.testing.assert_array_equal(f(np.ones(3)), np.full(3, scale))


def test_native_call_converts_or_rejects_other_arguments():
    f = make()
    a, b, c = f([1, 2, 3], 2)  # lists and Python ints go through the Python check
    np.testing.assert_array_equal(c, np.int32(4))
    np.testing.assert_array_equal(f(np.arange(6.0)[::2], np.int32(1))[1], [2.0, 4.0])  # a strided view
    with pytest.raises(ShapeError, match="argument 0 has shape"):
        f(np.ones(4), 1)
    with pytest.raises(DTypeError, match="argument 1 has dtype float64"):
        f(np.ones(3), 1.5)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        f(np.ones(3))


def test_native_call_overhead_is_small():
    f = NumericalFunction("tiny", lambda x: (0.5 * x * x).sum(), [Arg(3)])
    x = np.ones(3)
    f(x)
    best = min(_per_call(f, x) for _ in range(5))
    assert best < 5e-6, f"{best * 1e6:.2f} us per call"  # about 0.3 us here; generous for loaded CI machines


def _per_call(f: NumericalFunction, x: np.ndarray, n: int = 2000) -> float:
    start = time.perf_counter()
    for _ in range(n): f(x)
    return (time.perf_counter() - start) / n


def test_a_second_process_starts_warm_without_compiling_or_rendering(tmp_path):
    script = (
        "import subprocess, numpy as np\n"
        "from ember.export import Arg, NumericalFunction\n"
        "f = NumericalFunction('warm_start', lambda x: (x * x).sum() + 1, [Arg(4)])\n"
        "print(f(np.arange(4.0)))\n")
    env_cache = {"EMBER_CACHE": str(tmp_path)}
    root = Path(__file__).resolve().parents[2]
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root,
                           env={**os.environ, **env_cache})
    assert first.returncode == 0, first.stderr
    forbid = ("import subprocess\nreal = subprocess.run\n"  # compiler version queries are fine, compiling is not
              "def boom(cmd, *a, **k):\n"
              "    if '--version' in cmd: return real(cmd, *a, **k)\n"
              "    raise AssertionError(f'compiled again: {cmd}')\n"
              "subprocess.run = boom\n"
              "import ember.export.native as native\n"  # nor rendering the source: the plan names the extension
              "def render(*a, **k): raise AssertionError('rendered the source again')\n"
              "native.module_context = render\n")
    second = subprocess.run([sys.executable, "-c", forbid + script], capture_output=True, text=True, cwd=root,
                            env={**os.environ, **env_cache})
    assert second.returncode == 0, second.stderr
    assert first.stdout == second.stdout == "15.0\n"
