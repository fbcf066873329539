"""EXP, EXP2, LOG, LOG2 as polynomials (codegen/transcendental.py): within 1 ulp of the correctly rounded value.

Oracle: numpy in float64, rounded to the result dtype. Every value runs through a real vectorized kernel (a UPCAST
opt on a renderer with vectors, or the heuristic's opts on the CPU's renderer): a sweep of every 1021st float32 bit
pattern (4.2 million values, all signs, denormals and specials), the special values and the edges of each function's
range. Kernels with no vector lanes (NOOPT, scalar renderers) keep libm's results.
The rewritten graph means the same under the reference interpreter (uop/interpret.py) as in the compiled kernel.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from ember import Tensor
from ember.codegen import get_program
from ember.codegen.opt import Opt, OptOps
from ember.codegen.transcendental import (
    EXP2_P,
    EXP_Q,
    LOG_R,
    POLYNOMIALS,
    exp2_float32,
    exp_float32,
    log2_float32,
    log_float32,
)
from ember.device import Device
from ember.dtype import dtypes, to_numpy
from ember.helpers import Context
from ember.renderer.cstyle import CRenderer
from ember.uop.interpret import evaluate
from ember.uop.ops import Ops, UOp, VarArg
from tests.helpers import fresh_module_cache

NUMPY = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2}
LIBM_CALL = {"exp": "expf(", "exp2": "exp2f(", "log": "logf(", "log2": "log2f("}
FUNCTIONS = list(NUMPY)
SWEEP_STEP = 1021  # every 1021st float32 bit pattern: 4.2 million values
RENDERERS = [CRenderer(16, 1), CRenderer(32, 1), CRenderer(64, 1)]  # SSE, AVX2, AVX-512 widths


@pytest.fixture(scope="module", autouse=True)
def fresh_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield from fresh_module_cache(tmp_path_factory)


# ---- ulps -----------------------------------------------------------------------------------------------------------

def ordered(x: np.ndarray) -> np.ndarray:
    """The bit patterns of floats as integers in the order of their values (-0.0 and 0.0 both 0; inf after max)."""
    signed = x.view(f"i{x.itemsize}").astype(np.int64)
    return np.where(signed < 0, -(signed & (1 << (8 * x.itemsize - 1)) - 1), signed)


def ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """How many floats of got's dtype lie between got and `exact` (float64) rounded to that dtype; a NaN where the
    other has none counts as 2**40."""
    with np.errstate(over="ignore"): want = exact.astype(got.dtype)
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    differ = np.abs(ordered(got) - ordered(want))
    return np.where(nan_got & nan_want, 0, np.where(nan_got | nan_want, 1 << 40, differ))


def reference(name: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"): return NUMPY[name](x.astype(np.float64))


def assert_within_one_ulp(name: str, x: np.ndarray, got: np.ndarray) -> None:
    error = ulp_error(got, reference(name, x))
    if (bad := error > 1).any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"{name}: {int(bad.sum())} of {x.size} values off by more than 1 ulp; first "
                             f"{name}({x[i]!r}) = {got[i]!r}, correctly rounded {reference(name, x[i:i + 1])[0]!r}")


# ---- kernels --------------------------------------------------------------------------------------------------------

def padded(x: np.ndarray, multiple: int = 64) -> np.ndarray:
    """x with copies of its first value appended up to a multiple of `multiple` (so any UPCAST divides it)."""
    return np.concatenate([x, np.full(-x.size % multiple, x[0], x.dtype)])


def compiled(fn: Callable[[Tensor], Tensor], x: np.ndarray, renderer: CRenderer,
             opts: list[Opt]) -> tuple[np.ndarray, str]:
    """fn(Tensor(x)), one kernel, compiled for `renderer` with exactly `opts` (every stage checked: SPEC=1) and run
    once: (its output, its C source)."""
    (item,) = fn(Tensor(x)).schedule()
    with Context(SPEC=1): spec = get_program(item.ast, renderer, opts=opts)
    device = Device["CPU"]
    program = device.program(dataclasses.replace(spec, global_size=(1,)), device.compiler.compile_cached(spec.src))
    inputs = [b.numpy() for b in item.bufs[item.outs:]]
    out = np.empty(item.bufs[0].size, to_numpy(item.bufs[0].dtype))
    if spec.threads == 1: program(out, *inputs)
    else:  # the slices one after another, each given its core number (as tests/codegen/test_opt.py runs them)
        for core in range(spec.threads): program(out, *inputs, vals=(core,))
    return out, spec.src


def vectorized(name: str, x: np.ndarray, renderer: CRenderer) -> np.ndarray:
    """The function over x in a kernel of vectors as wide as the renderer's, which must call no libm function."""
    lanes = renderer.vector_bytes // x.itemsize
    out, src = compiled(lambda t: getattr(t, name)(), padded(x), renderer, [Opt(OptOps.UPCAST, 0, lanes)])
    assert LIBM_CALL[name] not in src, f"{name}: a libm call is left in the vectorized kernel"
    return out[:x.size]


def heuristic(name: str, x: np.ndarray) -> np.ndarray:
    """The function over x (padded to a size the heuristic vectorizes) through the Tensor API, with the heuristic's
    opts on the CPU's renderer."""
    value = getattr(Tensor(padded(x)), name)()
    renderer = Device["CPU"].renderer
    if renderer.vector_bytes == 0: pytest.skip("the CPU's renderer has no vectors")
    with Context(NOOPT=0):
        (item,) = value.schedule()
        assert LIBM_CALL[name] not in get_program(item.ast, renderer).src, f"{name}: libm in the heuristic's kernel"
        return value.numpy()[:x.size]


# ---- the fits -------------------------------------------------------------------------------------------------------

def horner64(x: np.ndarray, coefficients: tuple[float, ...]) -> np.ndarray:
    acc = np.full_like(x, coefficients[-1])
    for c in reversed(coefficients[:-1]): acc = acc * x + c
    return acc


def log1p_from_fit(f: np.ndarray) -> np.ndarray:
    """f - f*f/2 + s*(f*f/2 + z*LOG_R(z)), s = f/(2+f), z = s*s: log(1+f) as log_parts builds it."""
    s = f / (2 + f)
    return f - f * f / 2 + s * (f * f / 2 + s * s * horner64(s * s, LOG_R))


FITS = [  # name, reduction interval, the reduced function rebuilt from the fit, the exact one, bound on the error
    ("exp", (-0.3466, 0.3466), lambda r: 1 + r + r * r * horner64(r, EXP_Q), np.exp, 3.5e-9),
    ("exp2", (-0.5, 0.5), lambda r: 1 + r * horner64(r, EXP2_P), np.exp2, 3.5e-9),
    ("log", (math.sqrt(0.5) - 1, math.sqrt(2) - 1), log1p_from_fit, np.log1p, 1e-10),
]


@pytest.mark.parametrize("name, interval, fitted, exact, bound", FITS, ids=[f[0] for f in FITS])
def test_fit_error_is_far_below_half_an_ulp(name: str, interval: tuple[float, float], fitted: Callable,
                                           exact: Callable, bound: float) -> None:
    """Each polynomial (coefficients as float32 holds them) is within `bound` of its function in relative error over
    its reduction interval, in float64: the rounding of float32 arithmetic, not the fit, makes the ulp."""
    r = np.linspace(*interval, 200_001)
    r = r[r != 0]
    assert np.max(np.abs(fitted(r) / exact(r) - 1)) <= bound


# ---- float32 through vectorized kernels -----------------------------------------------------------------------------

def sweep() -> np.ndarray:
    """Every SWEEP_STEP-th float32 bit pattern, from a start that makes the last one 0xFFFFFFFF's neighbourhood."""
    return np.arange(7, 1 << 32, SWEEP_STEP, dtype=np.uint64).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_sweep_of_the_float32_range_within_one_ulp(name: str) -> None:
    x = sweep()
    assert_within_one_ulp(name, x, heuristic(name, x))


MAX = float(np.finfo(np.float32).max)
DENORMAL_MIN = 2.0**-149
SPECIAL = np.array([math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 2.0, 0.5, MAX, -MAX, 1e30, -1e30,
                    DENORMAL_MIN, -DENORMAL_MIN, 2.0**-126, 1e-40, -1e-40, 1e-30, -1e-30, 88.72283, 88.7228394, 88.73,
                    89.0, 100.0, 101.0, 127.9, 128.0, 129.0, 140.5, 192.0, -87.33654, -100.0, -103.9, -103.97, -104.0,
                    -110.0, -120.5, -121.0, -149.0, -149.5, -150.0, -151.0, -160.5, -191.0, -1000.0], np.float32)
EXACT = {  # name: [(input, the result bit for bit), ...]
    "exp": [(math.inf, math.inf), (-math.inf, 0.0), (0.0, 1.0), (-0.0, 1.0), (89.0, math.inf), (1e30, math.inf),
            (-104.0, 0.0), (-1e30, 0.0), (1e-40, 1.0), (-103.9, DENORMAL_MIN)],
    "exp2": [(math.inf, math.inf), (-math.inf, 0.0), (0.0, 1.0), (-0.0, 1.0), (128.0, math.inf),
             (-149.0, DENORMAL_MIN), (-150.0, 0.0), (-149.5, DENORMAL_MIN), (1e30, math.inf), (-1e30, 0.0)],
    "log": [(math.inf, math.inf), (-math.inf, math.nan), (0.0, -math.inf), (-0.0, -math.inf), (1.0, 0.0),
            (-1.0, math.nan), (-MAX, math.nan), (-DENORMAL_MIN, math.nan), (2.0, float(np.float32(math.log(2))))],
    "log2": [(math.inf, math.inf), (-math.inf, math.nan), (0.0, -math.inf), (-0.0, -math.inf), (1.0, 0.0),
             (-1.0, math.nan), (DENORMAL_MIN, -149.0), (2.0**-126, -126.0), (2.0, 1.0), (0.5, -1.0)],
}


def assert_exact(name: str, x: np.ndarray, got: np.ndarray) -> None:
    for value, want in EXACT[name]:
        (where,) = np.flatnonzero(x.view(np.uint32) == np.array([value], np.float32).view(np.uint32))[:1]
        if math.isnan(want): assert np.isnan(got[where]), f"{name}({value!r}) = {got[where]!r}, not NaN"
        else: assert got[where].tobytes() == np.float32(want).tobytes(), f"{name}({value!r}) = {got[where]!r}"
    assert np.isnan(got[np.isnan(x)]).all(), f"{name}(NaN) is not NaN"


@pytest.mark.parametrize("renderer", RENDERERS, ids=[f"{r.vector_bytes}B" for r in RENDERERS])
@pytest.mark.parametrize("name", FUNCTIONS)
def test_special_values(name: str, renderer: CRenderer) -> None:
    """NaN, infinities, signed zeros, overflow and underflow bounds: IEEE's answers, within 1 ulp elsewhere."""
    got = vectorized(name, SPECIAL, renderer)
    assert_within_one_ulp(name, SPECIAL, got)
    assert_exact(name, SPECIAL, got)


def edges() -> dict[str, np.ndarray]:
    """Dense inputs where each function's reduction meets its limits: denormal results, overflow, denormal inputs
    (every 7th denormal), the neighbourhood of 1, every power of two."""
    near_one = (np.float32(1).view(np.int32) + np.arange(-50_000, 50_000, dtype=np.int32)).view(np.float32)
    denormals = np.arange(1, 1 << 23, 7, dtype=np.uint32).view(np.float32)
    powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    return {
        "exp": np.concatenate([np.linspace(-104.5, -86, 200_000), np.linspace(87, 89.5, 100_000)]).astype(np.float32),
        "exp2": np.concatenate([np.linspace(-151, -125, 200_000), np.linspace(126, 129, 100_000),
                                np.arange(-152, 130)]).astype(np.float32),
        "log": np.concatenate([denormals, near_one, powers, -denormals]),
        "log2": np.concatenate([denormals, near_one, powers, -powers]),
    }


@pytest.mark.parametrize("name", FUNCTIONS)
def test_edges_within_one_ulp(name: str) -> None:
    x = edges()[name]
    got = vectorized(name, x, RENDERERS[-1])
    assert_within_one_ulp(name, x, got)
    if name == "log2":  # a power of two gives its exponent, exactly
        powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
        np.testing.assert_array_equal(got[np.isin(x, powers)], np.log2(x[np.isin(x, powers)].astype(np.float64)))
    if name == "exp2":  # an integer gives its power of two, exactly, denormals included
        whole = (x == np.round(x)) & (x >= -149) & (x <= 127)
        np.testing.assert_array_equal(got[whole], np.exp2(x[whole].astype(np.float64)).astype(np.float32))


# ---- where the polynomials are not used ------------------------------------------------------------------------------

def libm() -> ctypes.CDLL:
    if (path := ctypes.util.find_library("m")) is None: pytest.skip("no C math library to compare with")
    return ctypes.CDLL(path)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_noopt_kernel_gives_libm_bits(name: str) -> None:
    """NOOPT kernels call libm as before: the same bits as the C library's own function."""
    call = getattr(libm(), LIBM_CALL[name][:-1])
    call.argtypes, call.restype = [ctypes.c_float], ctypes.c_float
    x = np.concatenate([SPECIAL, np.random.default_rng(0).uniform(-90, 90, 1024).astype(np.float32)])
    x = x if name.startswith("exp") else np.abs(x)
    value = getattr(Tensor(x), name)()
    with Context(NOOPT=1):
        (item,) = value.schedule()
        assert LIBM_CALL[name] in get_program(item.ast, Device["CPU"].renderer).src
        got = value.numpy()
    want = np.array([call(float(v)) for v in x], np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{name}: {x[~same][:4]} -> {got[~same][:4]}, libm {want[~same][:4]}"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_kernels_without_vectors_keep_libm(name: str) -> None:
    """A renderer with no vectors, a kernel with no lane opts, float64, float16 and bfloat16 keep their libm calls."""
    x = np.linspace(0.5, 3, 4096).astype(np.float32)
    fn = lambda t: getattr(t, name)()  # noqa: E731
    _, scalar = compiled(fn, x, CRenderer(0, 1), [Opt(OptOps.UPCAST, 0, 16)])
    _, threads = compiled(fn, x, RENDERERS[-1], [Opt(OptOps.THREAD, 0, 2)])
    assert LIBM_CALL[name] in scalar and LIBM_CALL[name] in threads
    _, double = compiled(fn, x.astype(np.float64), RENDERERS[-1], [Opt(OptOps.UPCAST, 0, 8)])
    assert LIBM_CALL[name][:-2] + "(" in double
    for half in ("float16", "bfloat16"):  # no vectors of them: their lanes convert one by one, libm costs no more
        _, src = compiled(lambda t, half=half: getattr(t.cast(half), name)(), x, RENDERERS[-1],
                          [Opt(OptOps.UPCAST, 0, 16)])
        assert LIBM_CALL[name] in src, half


def test_only_values_under_the_vector_range_change() -> None:
    """exp of a value that is the same in every lane (a row's own number) stays a libm call beside vectorized ones."""
    rows, cols = np.linspace(-3, 3, 64).astype(np.float32), np.linspace(0, 2, 64 * 256).astype(np.float32)
    fn = lambda t: t.reshape(64, 256).exp() + Tensor(rows).reshape(64, 1).exp()  # noqa: E731
    got, src = compiled(fn, cols, RENDERERS[-1], [Opt(OptOps.UPCAST, 1, 16)])
    assert src.count("expf(") == 1
    want = np.exp(cols.reshape(64, 256).astype(np.float64)) + np.exp(rows.astype(np.float64)).reshape(64, 1)
    np.testing.assert_allclose(got.reshape(64, 256), want, rtol=3e-7)


# ---- the reference interpreter --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FUNCTIONS)
def test_interpreter_gives_the_kernel_bits(name: str) -> None:
    """The polynomial graph means the same under uop/interpret.py (the constant folder's semantics) as compiled."""
    x = np.concatenate([SPECIAL, np.random.default_rng(1).integers(0, 1 << 32, 300, dtype=np.uint64).astype(
        np.uint32).view(np.float32)])
    got = vectorized(name, x, RENDERERS[0])
    var = UOp(Ops.DEFINE_VAR, dtypes.float32, arg=VarArg("x", 0, 0))
    graph = {"exp": exp_float32, "exp2": exp2_float32, "log": log_float32, "log2": log2_float32}[name](var)
    assert graph is POLYNOMIALS[Ops[name.upper()]](var)
    interpreted = np.array([evaluate(graph, {var: float(v)}) for v in x], np.float32)
    same = (got.view(np.uint32) == interpreted.view(np.uint32)) | (np.isnan(got) & np.isnan(interpreted))
    assert same.all(), f"{name}: {x[~same][:4]}: kernel {got[~same][:4]}, interpreter {interpreted[~same][:4]}"


# ---- through the Tensor API -----------------------------------------------------------------------------------------

def rows_with_specials(shape: tuple[int, int]) -> np.ndarray:
    x = np.random.default_rng(2).normal(0, 8, shape).astype(np.float32)
    x[0, :5] = [-np.inf, 80, -80, 0, 1]
    x[1] = -np.inf
    x[1, 3] = 0.0
    x[2, 7] = np.inf
    return x


@pytest.mark.parametrize("fn, oracle, atol", [  # atol: float32's denormals; a difference of two rounded terms
    (lambda t: t.softmax(-1), lambda shifted: np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True), 2.0**-120),
    (lambda t: t.log_softmax(-1), lambda shifted: shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)), 1e-6),
], ids=["softmax", "log_softmax"])
def test_softmax_rows(fn: Callable[[Tensor], Tensor], oracle: Callable[[np.ndarray], np.ndarray], atol: float) -> None:
    """softmax and log_softmax over rows with -inf, +inf and large values: numpy's float64 values from the same
    float32 x - max(x), and no libm exp in the heuristic's kernels."""
    x = rows_with_specials((32, 1024))
    value = fn(Tensor(x))
    with Context(NOOPT=0):
        sources = [get_program(item.ast, Device["CPU"].renderer).src for item in value.schedule()]
        got = value.numpy()
    if Device["CPU"].renderer.vector_bytes: assert not any("expf(" in s for s in sources)
    with np.errstate(all="ignore"): want = oracle((x - x.max(-1, keepdims=True)).astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=atol)


# ---- vector BITCAST in the C renderer --------------------------------------------------------------------------------

@pytest.mark.parametrize("renderer", RENDERERS, ids=[f"{r.vector_bytes}B" for r in RENDERERS])
def test_vector_bitcast_reinterprets_lanes(renderer: CRenderer) -> None:
    x = np.concatenate([SPECIAL, np.linspace(-5, 5, 1024 - SPECIAL.size)]).astype(np.float32)
    lanes = renderer.vector_bytes // 4
    got, src = compiled(lambda t: (t.bitcast("int32") + 1).bitcast("float32"), x, renderer,
                        [Opt(OptOps.UPCAST, 0, lanes)])
    assert f"(i32x{lanes})val" in src and f"(f32x{lanes})t" in src  # vector casts of the lanes' bits
    np.testing.assert_array_equal(got.view(np.int32), x.view(np.int32) + 1)
