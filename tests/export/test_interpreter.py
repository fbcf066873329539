"""The numpy interpreter of NumericalFunction plans: the native code's results, bit for bit, on nasty inputs; the
first call it serves while the native code builds; what it refuses."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import ember.export.native as native
from ember import Tensor
from ember.errors import CompileError, DTypeError, ShapeError
from ember.export import Arg, NumericalFunction
from ember.export.interpreter import refusal
from ember.export.native import find_cxx
from ember.helpers import Context

pytestmark = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")
RNG = np.random.default_rng(11)
SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e300, -1e300, 1e-310, np.inf, -np.inf, np.nan, 3.0, 7.25,
                    -0.75, 2.0 ** 52 + 1])
WEIRD_SUMS = np.array([1e16, 1.0, -1e16, 1.0, 3.0, -0.0, 1e-3, 2.0 ** 53, 1.0, -(2.0 ** 53), 0.1, 0.2, 0.3, -0.0, 5.0,
                       1e16])

FLOAT_FUNCTIONS = {
    "arithmetic": lambda x: (x * 3.0 - x / 7.0) * (x + 1.0) / (x - 0.5),
    "libm": lambda x: x.sin() + x.cos() * x.exp() - x.log() + x.sqrt() + x.tanh() * x.atan() + x.erf(),
    "pow_and_where": lambda x: (x > 0).where(x ** 1.5, x.abs() ** 0.5) + x.maximum(0.25) + x.minimum(-0.25),
    "max_ties_and_nan": lambda x: x.max() + x.reshape(4, 4).max(axis=1).sum() + (-x).relu().sum(),
    "sequential_sum": lambda x: x.sum() + x.reshape(4, 4).sum(axis=0).sum() * 0.5,
    "sum_of_a_cat": lambda x: x[:8].cat(x[8:] * 2.0).reshape(2, 8).sum() + x[:4].stack(x[4:8]).sum(axis=0).sum(),
    "single_term_sum": lambda x: x[1:2].sum() + x[5:6].reshape(1, 1).sum(axis=1).sum(),
    "prod_and_mean": lambda x: x.reshape(4, 4).prod(axis=1).sum() + x.mean() + x.var(),
    "movement": lambda x: x.reshape(4, 4).T.flip(0).pad(((1, 0), (0, 2))).reshape(-1)[3:17] * 2.0,
    "gather": lambda x: x[Tensor([3, 0, 15, 7])] + x.reshape(4, 4)[Tensor([1, 3]), Tensor([0, 2])].sum(),
    "softmax_matmul": lambda x: x.reshape(4, 4).softmax(axis=1) @ x.reshape(4, 4),
    "cumsum": lambda x: x.cumsum(0),
}


@pytest.mark.parametrize("name", FLOAT_FUNCTIONS)
@pytest.mark.parametrize("values", ["special", "sums", "normal"])
def test_interpreter_gives_the_native_code_bits(name, values):
    x = {"special": SPECIAL, "sums": WEIRD_SUMS, "normal": RNG.standard_normal(16)}[values]
    f = NumericalFunction(f"interp_{name}", FLOAT_FUNCTIONS[name], [Arg(16)])
    assert refusal(f.plan.items) is None
    with Context(INTERPRET=0): f.compile()
    got, want = f.interpret(x), f(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.view(np.int64), want.view(np.int64)) or _same_up_to_nan_payload(got, want), \
        f"{got}\n{want}"


def _same_up_to_nan_payload(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit but for which NaN (payload and sign): numpy and C may make a different one."""
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.array_equal(np.where(both_nan, 0, a).view(np.int64), np.where(both_nan, 0, b).view(np.int64)))


def test_libm_calls_are_the_c_librarys():
    """exp2 through exec_alu was 2.0 ** x (C's pow): it differs from C's exp2 in about 1 value in 1000."""
    x = np.random.default_rng(3).uniform(-1000, 1000, 20000)
    f = NumericalFunction("interp_exp2", lambda x: (
        x.exp2(), (x * 0.01).exp(), x.abs().log2(), x.sin(), x.cos(), x.tan(), x.atan(), (x * 0.01).sinh(),
        (x * 0.01).cosh(), (x * 0.01).tanh(), x.asinh(), (x * 0.01).erf(), (x * 0.01).expm1(),
        x.abs() ** (x * 0.001)), [Arg(20000)])
    with Context(INTERPRET=0): f.compile()
    for got, want in zip(f.interpret(x), f(x), strict=True): np.testing.assert_array_equal(got, want)


def test_integer_ops_follow_c():
    """Truncating division and remainder, a zero or -1 divisor (0 and the wrapped negation, as the rendered C),
    wrapping arithmetic, casts that truncate."""
    a = np.array([7, -7, 7, -7, 0, -2**31, -2**31, 2**31 - 1, 5, -5], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3, -1, 1, 2, 0, 0], dtype=np.int32)
    f = NumericalFunction("interp_ints", lambda a, b: (
        a // b, a % b, a * b + a, (a.cast("float64") / 3.0).cast("int32"),
        (a > b).cast("int32") - (a == b).cast("int32"), -a), [Arg(10, "int32"), Arg(10, "int32")])
    assert refusal(f.plan.items) is None
    with Context(INTERPRET=0): f.compile()
    for got, want in zip(f.interpret(a, b), f(a, b), strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint32", "int64", "uint64"])
def test_narrow_and_unsigned_integers_wrap_as_in_c(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, 7, 100 % (int(info.max) + 1), 3, 0], dtype=dtype)
    b = np.array([2, 3, 0, 5, 1, 9], dtype=dtype)
    f = NumericalFunction(f"interp_{dtype}", lambda a, b: (a + b, a * b, a - b, a // b, a % b, a & b, a | b, a ^ b,
                                                           a.maximum(b), (a < b)), [Arg(6, dtype), Arg(6, dtype)])
    assert refusal(f.plan.items) is None
    with Context(INTERPRET=0): f.compile()
    for got, want in zip(f.interpret(a, b), f(a, b), strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


def test_a_first_call_is_interpreted_while_the_native_code_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    f = NumericalFunction("interp_first_call", lambda x, y: ((x @ y).sin().sum(), x * 2.0), [Arg((3, 4)), Arg(4)])
    x, y = RNG.standard_normal((3, 4)), RNG.standard_normal(4)
    with Context(INTERPRET=1):
        first = f(x, y)
        assert f._building is not None and not f._native  # answered by the interpreter, g++ still at work
        f.compile()
    assert f._building is None and callable(f._native)
    for a, b in zip(first, f(x, y), strict=True): np.testing.assert_array_equal(a, b)


def test_interpreted_calls_check_their_arguments_as_native_calls_do(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    f = NumericalFunction("interp_bad_input", lambda x: x * 2.0, [Arg((2, 3))])
    with Context(INTERPRET=1):
        with pytest.raises(ShapeError, match=r"argument 0 has shape \(3,\), expected \(2, 3\)"): f(np.ones(3))
        assert f._building is not None  # the interpreter answered, and refused the shape
        with pytest.raises(DTypeError, match="argument 0 has dtype complex128"): f(np.ones((2, 3), complex))
        np.testing.assert_array_equal(f([[1, 2, 3], [4, 5, 6]]), [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]])
        f.compile()


def test_a_failed_background_build_is_raised_by_the_next_call(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    release = threading.Event()

    def failing_build(f, where=None):
        release.wait(10)
        raise CompileError("the C++ compiler failed: (a test)")
    monkeypatch.setattr(native, "build_native", failing_build)
    f = NumericalFunction("interp_failed_build", lambda x: x * x, [Arg(3)])
    with Context(INTERPRET=1):
        np.testing.assert_array_equal(f(np.arange(3.0)), [0.0, 1.0, 4.0])  # the interpreter's answer
        release.set()
        with pytest.raises(CompileError, match="a test"): f.compile()


def test_what_cannot_be_mirrored_bit_for_bit_is_refused_and_compiled_first(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    half = NumericalFunction("interp_half", lambda x: x * x + 1, [Arg(3, "float16")])
    single_sin = NumericalFunction("interp_sinf", lambda x: x.sin(), [Arg(3, "float32")])
    assert "float16" in refusal(half.plan.items)
    assert "SIN in float32" in refusal(single_sin.plan.items)
    with Context(INTERPRET=1):
        single_sin(np.ones(3, np.float32))
    assert callable(single_sin._native) and single_sin._building is None  # waited for the compiler


def test_big_work_waits_for_the_compiler(tmp_path, monkeypatch):
    """The interpreter serves first calls only where it is fast: a million libm calls are not."""
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    f = NumericalFunction("interp_big", lambda x: x.exp().sum(), [Arg(1_000_000)])
    with Context(INTERPRET=1):
        f(np.zeros(1_000_000))
    assert callable(f._native) and f._building is None


def test_a_build_running_at_exit_finishes_into_the_cache(tmp_path):
    """A script that calls a function once and ends still leaves its native code for the next process."""
    script = ("import numpy as np\n"
              "from ember.export import Arg, NumericalFunction\n"
              "f = NumericalFunction('interp_exit', lambda x: (x * x).sin().sum(), [Arg(5)])\n"
              "f(np.ones(5))\n"
              "print(f._building is not None)\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "EMBER_CACHE": str(tmp_path), "INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True\n"  # it was still building when the script ended
    assert [p.name for p in (tmp_path / "native").iterdir() if p.name.startswith("ember_interp_exit")]
