"""NumericalFunction calls that must not give garbage: an output written twice over one buffer, first calls from many
threads at once, arrays in another byte order or layout, and arguments that are not numbers of the Arg's dtype."""

import subprocess
import sys
import threading

import numpy as np
import pytest

import ember.export.native as native
from ember.errors import DTypeError
from ember.export import Arg, NumericalFunction, generate_module
from ember.export.native import find_cxx
from ember.helpers import Context

pytestmark = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")


# ---- every output is written, also when two outputs are one value ----

def repeated_outputs() -> dict[str, tuple[NumericalFunction, list[np.ndarray], list[np.ndarray]]]:
    """name -> (function, arguments, the outputs numpy computes)."""
    x, y = np.array([1.5, -2.0, 3.25]), np.array([4.0, 0.5])
    return {
        "input_twice": (NumericalFunction("input_twice", lambda x: (x, x), [Arg(3)]), [x], [x, x]),
        "sum_twice": (NumericalFunction("sum_twice", lambda x: (x.sum(), x.sum()), [Arg(3)]), [x], [x.sum()] * 2),
        "input_among_others": (NumericalFunction("input_among_others", lambda x, y: (y, x * 2.0, y, x, x * 2.0),
                                                 [Arg(3), Arg(2)]), [x, y], [y, x * 2, y, x, x * 2]),
    }


@pytest.mark.parametrize("name", list(repeated_outputs()))
@pytest.mark.parametrize("path", ["native", "interpreted", "kernels"])
def test_every_output_is_written_when_outputs_repeat(tmp_path, monkeypatch, name, path):
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    f, args, want = repeated_outputs()[name]
    for _ in range(3):  # a fresh output array each call: what was left in memory must not show through
        got = {"native": lambda: f.compile()(*args), "interpreted": lambda: f.interpret(*args),
               "kernels": lambda: f.call_kernels(*args)}[path]()
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True): np.testing.assert_array_equal(g, w)
        assert len({id(g) for g in got}) == len(got)  # distinct arrays: writing one leaves the others alone
        got[0][...] = 7.0
        np.testing.assert_array_equal(got[-1], want[-1])


def cpp_driver(fns: list[NumericalFunction], inputs: list[list[np.ndarray]]) -> str:
    """A main() that fills each function's outputs with NaN, calls it, and prints every output element as hex."""
    lines = ["#include <cstdio>", "#include <limits>", '#include "mod.hpp"', "int main() {"]
    for f, args in zip(fns, inputs, strict=True):
        names = [f"in{i}" for i in range(len(args))]
        lines += ["  {", f"    auto ws = mod::{f.name}::make_ws();"]
        for n, p, a in zip(names, f.arg_names, args, strict=True):
            lines.append(f"    mod::{f.name}::{p}_t {n};")
            lines += [f"    {n}[{i}] = {float(v).hex()};" for i, v in enumerate(a.reshape(-1))]
        outs = [f"out{i}" for i in range(len(f.output_shapes))]
        for o, shape in zip(outs, f.output_shapes, strict=True):
            lines += [f"    mod::{f.name}::{o}_t {o};",
                      f"    for (std::size_t i = 0; i < {int(np.prod(shape))}; i++) "
                      f"{o}[i] = std::numeric_limits<double>::quiet_NaN();"]
        lines.append(f"    mod::{f.name}::call({', '.join(names + outs)}, *ws);")
        for o, shape in zip(outs, f.output_shapes, strict=True):
            lines.append(f"    for (std::size_t i = 0; i < {int(np.prod(shape))}; i++) std::printf(\"%a\\n\", {o}[i]);")
        lines.append("  }")
    return "\n".join([*lines, "  return 0;", "}"]) + "\n"


def test_exported_cpp_writes_every_output_when_outputs_repeat(tmp_path):
    cases = list(repeated_outputs().values())
    fns, inputs = [f for f, _, _ in cases], [args for _, args, _ in cases]
    generate_module("mod", fns, str(tmp_path))
    (tmp_path / "main.cpp").write_text(cpp_driver(fns, inputs))
    exe = tmp_path / "main"
    subprocess.run([find_cxx(), "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(exe),
                    str(tmp_path / "mod.cpp"), str(tmp_path / "main.cpp")], check=True, capture_output=True, text=True)
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    want = [float(v) for _, _, outs in cases for o in outs for v in np.reshape(o, -1)]
    assert [float.fromhex(p) for p in printed] == want


# ---- first calls from many threads ----

@pytest.fixture
def often_switching_threads():
    """Threads switch every microsecond, not every 5 ms: a race between calls shows in a few hundred calls."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def threaded_model(x, y):
    h = (x @ y).sin() * x.sum(axis=1)
    return (h.exp() / h.exp().sum()) * 3.0 + (x * x).sum()


def threaded_oracle(x, y):
    h = np.sin(x @ y) * x.sum(axis=1)
    return np.exp(h) / np.exp(h).sum() * 3.0 + (x * x).sum()


def test_interpreted_calls_from_many_threads_share_no_scratch_arrays(tmp_path, monkeypatch, often_switching_threads):
    """Threads shared the interpreter's intermediates: about a third of their answers were another call's."""
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    f = NumericalFunction("threaded_interpreter", threaded_model, [Arg((24, 24)), Arg(24)])
    assert f.plan.intermediates  # the scratch arrays that threads must not share
    wrong: list[int] = []

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        for _ in range(50):
            x, y = rng.standard_normal((24, 24)), rng.standard_normal(24)
            if not np.allclose(f.interpret(x, y), threaded_oracle(x, y), rtol=1e-12, atol=1e-12): wrong.append(k)
    workers = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in workers: t.start()
    for t in workers: t.join(120)
    assert not wrong, f"{len(wrong)} of 400 calls wrong"


def test_first_calls_from_many_threads_are_right_and_start_one_build(tmp_path, monkeypatch, often_switching_threads):
    """A fresh function called from 8 threads at once: traced, planned and built once (each thread started its own
    build), every call answered right by the interpreter meanwhile."""
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    builds, release = [], threading.Event()
    real_build = native.build_native

    def counted_build(f, where=None):
        builds.append(f.name)
        release.wait(60)  # every thread's calls are interpreted meanwhile
        return real_build(f, where)
    monkeypatch.setattr(native, "build_native", counted_build)
    oracle = threaded_oracle
    f = NumericalFunction("threaded_first_calls", threaded_model, [Arg((24, 24)), Arg(24)], lazy=True)
    threads, start, wrong, errors = 8, threading.Barrier(8), [], []

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        try:
            start.wait(10)
            for _ in range(25):
                x, y = rng.standard_normal((24, 24)), rng.standard_normal(24)
                got = f(x, y)
                if not np.allclose(got, oracle(x, y), rtol=1e-12, atol=1e-12): wrong.append((k, got, oracle(x, y)))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)
    with Context(INTERPRET=1):
        workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in workers: t.start()
        for t in workers: t.join(120)
        release.set()
        f.compile()
    assert not errors, errors
    assert not wrong, f"{len(wrong)} of {threads * 25} calls wrong, first: {wrong[0]}"
    assert builds == ["threaded_first_calls"]
    assert callable(f._native)
    x, y = np.linspace(-1.0, 1.0, 24 * 24).reshape(24, 24), np.ones(24)
    np.testing.assert_allclose(f(x, y), oracle(x, y), rtol=1e-12)  # the native code, built once


def test_a_function_is_planned_once_when_threads_first_need_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    f = NumericalFunction("planned_once", lambda x: (x * 2.0).sum(), [Arg(5)], lazy=True)
    start, plans = threading.Barrier(4), []

    def work() -> None:
        start.wait(10)
        plans.append(f.plan)
    workers = [threading.Thread(target=work) for _ in range(4)]
    for t in workers: t.start()
    for t in workers: t.join(60)
    assert len(plans) == 4 and all(p is plans[0] for p in plans)


# ---- byte order, layout and alignment of the arguments ----

def misaligned(a: np.ndarray) -> np.ndarray:
    """a's values in an array whose data starts one byte past an aligned address."""
    raw = np.zeros(a.nbytes + 1, np.uint8)
    out = np.frombuffer(raw.data, dtype=a.dtype, count=a.size, offset=1).reshape(a.shape)
    assert not out.flags.aligned
    out[...] = a
    return out


def layouts(a: np.ndarray) -> dict[str, np.ndarray]:
    """a in other byte orders and memory layouts; the values stay a's."""
    swapped = a.astype(a.dtype.newbyteorder())
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    wide[..., ::2] = a
    return {"big_endian": a.astype(a.dtype.newbyteorder(">")), "swapped": swapped, "strided": wide[..., ::2],
            "fortran": np.asfortranarray(a), "misaligned": misaligned(a), "read_only": _read_only(a),
            "misaligned_swapped": misaligned(swapped)}


def _read_only(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out.flags.writeable = False
    return out


def layout_function(tmp_path, monkeypatch) -> NumericalFunction:
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    return NumericalFunction("layouts", lambda x, n: (x * 2.0 + 1.0, n + 1, x.sum(axis=0)),
                             [Arg((2, 3)), Arg((2, 3), "int32")])


X = np.array([[1.5, -2.0, 3.25], [0.125, 1e300, -7.0]])
N = np.array([[1, -2, 3], [2**30, -(2**31), 7]], np.int32)
WANT = (X * 2.0 + 1.0, N + np.int32(1), X.sum(axis=0))


@pytest.mark.parametrize("layout", list(layouts(X)))
@pytest.mark.parametrize("path", ["native", "interpreted", "kernels"])
def test_arguments_in_any_byte_order_and_layout_keep_their_values(tmp_path, monkeypatch, layout, path):
    f = layout_function(tmp_path, monkeypatch)
    x, n = layouts(X)[layout], layouts(N)[layout]
    call = {"native": f.compile(), "interpreted": f.interpret, "kernels": f.call_kernels}[path]
    with np.errstate(over="ignore"):
        want = (X * 2.0 + 1.0, N + np.int32(1), X.sum(axis=0))  # int32 wraps, as C with -fwrapv
    for got, w in zip(call(x, n), want, strict=True):
        np.testing.assert_array_equal(got, w)
        assert got.dtype == w.dtype and got.dtype.isnative and got.flags.c_contiguous and got.flags.aligned
    np.testing.assert_array_equal(x, X)  # the caller's arrays are left as they were
    np.testing.assert_array_equal(n, N)


def test_native_fast_path_takes_only_native_order_aligned_arrays(tmp_path, monkeypatch):
    """The extension takes an array as it is only when numpy's C API says it is of native byte order, aligned and
    C-contiguous; any other goes through the Python conversion."""
    f = layout_function(tmp_path, monkeypatch).compile()
    converted: list[tuple] = []

    def counting(*values):
        converted.append(values)
        return f._coerce(*values)
    f._native.__self__.set_coerce(counting)  # the extension module's converter
    try:
        f(X.copy(), N.copy())
        assert not converted
        for layout, x in layouts(X).items():
            if layout == "read_only": continue
            f(x, N)
            assert len(converted) == 1, layout
            converted.clear()
    finally:
        f._native.__self__.set_coerce(f._coerce)


# ---- arguments that are not numbers of the Arg's dtype ----

@pytest.mark.parametrize("value, message", [
    (None, r"f_bad: argument 0 \(x\) is None; expected an array of shape \(3,\) and dtype float64"),
    ("abc", r"f_bad: argument 0 \(x\) is a str \('abc'\); expected an array of shape \(3,\) and dtype float64"),
    (b"ab", r"f_bad: argument 0 \(x\) is a bytes"),
    ([1.0, None, 2.0], r"f_bad: argument 0 \(x\) holds objects numpy cannot read as numbers"),
    ({"a": 1}, r"f_bad: argument 0 \(x\) is a dict"),
])
@pytest.mark.parametrize("interpret", [0, 1])
def test_arguments_that_are_not_numbers_are_named(tmp_path, monkeypatch, value, message, interpret):
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    f = NumericalFunction("f_bad", lambda x: x * 2.0, [Arg(3)])
    with Context(INTERPRET=interpret):
        with pytest.raises(DTypeError, match=message): f(value)
        with pytest.raises(DTypeError, match=message): f.call_kernels(value)
        f.compile()
        with pytest.raises(DTypeError, match=message): f(value)


def test_a_bfloat16_argument_is_named_bfloat16_and_takes_its_bits(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    f = NumericalFunction("bf_arg", lambda x: x * 2, [Arg(3, "bfloat16")])
    with pytest.raises(DTypeError, match=r"bf_arg: argument 0 has dtype float32, expected bfloat16 \(passed as its "
                                         r"raw bits, a uint16 array"):
        f(np.ones(3, np.float32))
    bits = (np.array([1.0, 2.0, -3.0], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    got = f(bits)
    np.testing.assert_array_equal((got.astype(np.uint32) << 16).view(np.float32), [2.0, 4.0, -6.0])


def int_function(tmp_path, monkeypatch, dtype: str) -> NumericalFunction:
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    return NumericalFunction(f"ints_{dtype}", lambda n: n + 0, [Arg(2, dtype)])


@pytest.mark.parametrize("dtype, value", [("int32", [1, 2**40]), ("int32", [-(2**31) - 1, 0]), ("uint8", [-1, 3]),
                                          ("uint8", [256, 0]), ("int64", [2**63, 0]), ("int64", [2**70, -(2**70)]),
                                          ("uint64", [2**64, 1]), ("int8", [True, 128])])
@pytest.mark.parametrize("path", ["native", "interpreted", "kernels"])
def test_python_ints_out_of_the_arg_dtype_range_raise_overflow(tmp_path, monkeypatch, dtype, value, path):
    f = int_function(tmp_path, monkeypatch, dtype)
    call = {"native": f.compile(), "interpreted": f.interpret, "kernels": f.call_kernels}[path]
    with pytest.raises(OverflowError, match=rf"ints_{dtype}: argument 0 \(n\) holds .* out of the range of {dtype} "
                                            rf"\[{np.iinfo(dtype).min}, {np.iinfo(dtype).max}\]"):
        call(value)


@pytest.mark.parametrize("dtype, value", [("uint8", [0, 255]), ("uint8", [7, 0]), ("int32", [-(2**31), 2**31 - 1]),
                                          ("uint64", [2**64 - 1, 0]), ("int8", [True, -128])])
def test_python_ints_in_range_convert_to_any_int_dtype(tmp_path, monkeypatch, dtype, value):
    """Python ints have no dtype of their own (numpy calls them int64): any int Arg takes those in its range."""
    f = int_function(tmp_path, monkeypatch, dtype)
    want = np.broadcast_to(np.array(value, dtype=dtype), (2,))
    for call in (f.compile(), f.interpret, f.call_kernels): np.testing.assert_array_equal(call(value), want)


def test_numpy_ints_of_a_wider_dtype_wrap_as_numpy_converts_them(tmp_path, monkeypatch):
    """A numpy array of another int dtype converts as `astype` (and torch's `.to`) does, wrapping, where numpy calls
    the cast same-kind: signed or unsigned into signed; signed into unsigned is refused."""
    signed, unsigned = int_function(tmp_path, monkeypatch, "int32"), int_function(tmp_path, monkeypatch, "uint32")
    wide, wide_unsigned = np.array([2**40 + 5, -(2**33) - 1], np.int64), np.array([2**40 + 5, 2**63 + 3], np.uint64)
    for f in (signed, unsigned): f.compile()
    for path in ("native", "interpreted", "kernels"):
        call = {"native": signed, "interpreted": signed.interpret, "kernels": signed.call_kernels}[path]
        np.testing.assert_array_equal(call(wide), wide.astype(np.int32))
        np.testing.assert_array_equal(call(wide_unsigned), wide_unsigned.astype(np.int32))
        call = {"native": unsigned, "interpreted": unsigned.interpret, "kernels": unsigned.call_kernels}[path]
        with pytest.raises(DTypeError, match=r"ints_uint32: argument 0 has dtype int64, expected uint32"):
            call(np.array([1, 2], np.int64))
