"""Every op of a table on every dtype of ember.dtype.dtypes, against torch (CPU): result dtype and values.

Each case builds the same inputs for torch and ember, runs torch first and skips when torch refuses the dtype (a case
where ember refuses as well passes: both reject it). Otherwise ember must give torch's result dtype (by name) and
torch's values: exactly for bool and integer results and for ops that only move or select values (or are correctly
rounded IEEE operations), else within about one unit in the last place of each float result. Ops whose error grows
with the size of their terms (sums, cancellation) may also differ by that much relative to the largest result, where
"that much" is an ulp of the dtype they accumulate in: float32 for float16 and bfloat16, as torch computes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812  (torch's own spelling)

from ember import Tensor
from ember.errors import EmberError
from tests.helpers import dtype_name

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16",
          "float32", "float64"]
# About one unit in the last place, relative: float16 has 10 fraction bits, bfloat16 7, float32 23, float64 52.
RTOL = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1e-6, "float64": 1e-12}
SHAPE = (3, 5)
# NaN, infinities, signed zeros, ties for round, a float16 subnormal and a value whose exp overflows float16
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 2.5, 3.0, -7.0, 1e-6, 100.0, -1.0])
FULL = {"float16": 400.0, "bfloat16": 1e20, "float32": 1e20, "float64": 1e160}  # squares of the largest overflow

Input = tuple[np.ndarray, str]  # values (float32 for bfloat16) and the dtype both libraries build from them


# ---- inputs ------------------------------------------------------------------------------------------------------


def _round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """Float values exactly representable in `dtype` (bfloat16 ones as float32, since numpy has no bfloat16)."""
    if dtype == "bfloat16": return torch.from_numpy(values.astype(np.float32)).bfloat16().float().numpy()
    return values.astype(dtype)


def values(dtype: str, domain: str, shape: tuple[int, ...] = SHAPE, seed: int = 0) -> np.ndarray:
    """Deterministic inputs of `dtype` that keep every op of the table in range.

    any: signed values (ints in [-4, 4], unsigned in [0, 8]); pos: positive; nonzero: divisors; small: shift
    amounts and exponents ([0, 3] for ints); halves: floats on a 0.5 grid, so round meets ties; full: the whole
    range of an integer dtype (sums and products wrap) and floats whose products overflow to infinity; special:
    (floats only, shape (3, 5)) NaN, infinities, signed zeros and other edge values, in a shuffled order."""
    rng = np.random.default_rng(seed)
    if domain == "full" and dtype.startswith(("int", "uint")):
        return rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)
    if domain == "full" and dtype != "bool": return _round_to(rng.uniform(-1, 1, shape) * FULL[dtype], dtype)
    if dtype == "bool":
        return np.ones(shape, bool) if domain == "nonzero" else np.asarray(rng.random(shape) < 0.5)
    if dtype.startswith(("int", "uint")):
        unsigned = dtype.startswith("u")
        if domain == "pos": out = rng.integers(1, 10, shape)
        elif domain == "small": out = rng.integers(0, 4, shape)
        elif domain == "nonzero":
            out = rng.integers(1, 9 if unsigned else 5, shape)
            if not unsigned: out = out * rng.choice([-1, 1], shape)
        else: out = rng.integers(0, 9, shape) if unsigned else rng.integers(-4, 5, shape)
        return np.asarray(out).astype(dtype)
    if domain == "special": return _round_to(rng.permutation(SPECIAL).reshape(shape), dtype)
    if domain == "pos": out = rng.uniform(0.25, 4, shape)
    elif domain == "small": out = rng.uniform(-2, 2, shape)
    elif domain == "nonzero": out = rng.uniform(0.5, 3, shape) * rng.choice([-1, 1], shape)
    elif domain == "halves": out = rng.integers(-7, 8, shape) / 2
    else: out = rng.uniform(-3, 3, shape)
    return _round_to(np.asarray(out), dtype)


def same(*domains: str, shape: tuple[int, ...] = SHAPE) -> Callable[[str], list[Input]]:
    """Inputs: one tensor of the case's dtype per domain, each from its own seed."""
    return lambda dtype: [(values(dtype, d, shape, seed=i), dtype) for i, d in enumerate(domains)]


def comparable(dtype: str) -> list[Input]:
    """Two tensors that are equal at every other position, so that eq, le and ge see ties for every dtype."""
    x, y = values(dtype, "any", seed=0), values(dtype, "any", seed=1)
    y.reshape(-1)[::2] = x.reshape(-1)[::2]
    return [(x, dtype), (y, dtype)]


def with_index(index: np.ndarray, domain: str = "any", shape: tuple[int, ...] = SHAPE) -> Callable[[str], list[Input]]:
    """Inputs: a tensor of the case's dtype, then an int64 index tensor."""
    return lambda dtype: [(values(dtype, domain, shape), dtype), (index, "int64")]


def conditioned(dtype: str) -> list[Input]:
    """A bool condition, then the two tensors `where` chooses between."""
    cond = np.random.default_rng(7).random(SHAPE) < 0.5
    return [(cond, "bool"), (values(dtype, "any", seed=0), dtype), (values(dtype, "any", seed=1), dtype)]


def to_torch(x: Input) -> torch.Tensor:
    arr, dtype = x
    return torch.from_numpy(arr.copy()).to(getattr(torch, dtype))


def to_ember(x: Input) -> Tensor:
    arr, dtype = x
    return Tensor(arr.copy(), dtype=dtype)


def torch_values(t: torch.Tensor) -> np.ndarray:
    return (t.float() if t.dtype is torch.bfloat16 else t).detach().numpy()


# ---- the table ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One op: ember's call, torch's call (the same when None), its inputs per dtype and how values compare.

    exact: float results must equal torch's bit for bit (value moves, selections, correctly rounded operations).
    summed: the op's error scales with its terms (sums, cancellation), so `tol` ulps of the accumulating dtype
    relative to the largest result are allowed as well. tol: ulps of the result dtype each element may be off."""

    name: str
    ember: Callable[..., Any]
    oracle: Callable[..., Any] | None = None
    inputs: Callable[[str], list[Input]] = same("any")
    exact: bool = False
    summed: bool = False
    tol: float = 1.0


IDX = np.array([2, 0, 2, 1], dtype=np.int64)
GATHER_IDX = np.array([[4, 0], [1, 1], [3, 2]], dtype=np.int64)
ANY2 = same("any", "any")
NCHW = (1, 2, 4, 6)

UNARY = [
    Case("exp", lambda x: x.exp()),
    Case("log", lambda x: x.log(), inputs=same("pos")),
    Case("sqrt", lambda x: x.sqrt(), inputs=same("pos")),  # not exact: torch's float32 sqrt is off by an ulp
    Case("sin", lambda x: x.sin()),
    Case("cos", lambda x: x.cos()),
    Case("tanh", lambda x: x.tanh()),
    Case("sigmoid", lambda x: x.sigmoid()),
    Case("relu", lambda x: x.relu(), exact=True),
    # x * (1 + erf(x / sqrt 2)) / 2 cancels for x << 0 in both libraries: the error scales with |x|
    Case("gelu", lambda x: x.gelu(), lambda x: F.gelu(x), summed=True, tol=2),
    Case("abs", lambda x: x.abs(), exact=True),
    Case("neg", lambda x: -x, exact=True),
    Case("sign", lambda x: x.sign(), exact=True),
    Case("floor", lambda x: x.floor(), inputs=same("halves"), exact=True),
    Case("ceil", lambda x: x.ceil(), inputs=same("halves"), exact=True),
    Case("round", lambda x: x.round(), inputs=same("halves"), exact=True),
    Case("trunc", lambda x: x.trunc(), inputs=same("halves"), exact=True),
    Case("reciprocal", lambda x: x.reciprocal(), inputs=same("nonzero"), exact=True),
    Case("square", lambda x: x.square(), exact=True),
    Case("clamp", lambda x: x.clamp(1, 3), exact=True),
]

BINARY = [
    Case("add", lambda x, y: x + y, inputs=ANY2, exact=True),
    Case("sub", lambda x, y: x - y, inputs=ANY2, exact=True),
    Case("mul", lambda x, y: x * y, inputs=ANY2, exact=True),
    Case("truediv", lambda x, y: x / y, inputs=same("any", "nonzero"), exact=True),
    Case("floordiv", lambda x, y: x // y, inputs=same("any", "nonzero"), exact=True),
    Case("mod", lambda x, y: x % y, inputs=same("any", "nonzero")),
    Case("pow", lambda x, y: x ** y, inputs=same("pos", "small")),
    Case("maximum", lambda x, y: x.maximum(y), inputs=comparable, exact=True),
    Case("minimum", lambda x, y: x.minimum(y), inputs=comparable, exact=True),
    Case("lt", lambda x, y: x < y, inputs=comparable),
    Case("le", lambda x, y: x <= y, inputs=comparable),
    Case("gt", lambda x, y: x > y, inputs=comparable),
    Case("ge", lambda x, y: x >= y, inputs=comparable),
    Case("eq", lambda x, y: x == y, inputs=comparable),
    Case("ne", lambda x, y: x != y, inputs=comparable),
    Case("and", lambda x, y: x & y, inputs=ANY2),
    Case("or", lambda x, y: x | y, inputs=ANY2),
    Case("xor", lambda x, y: x ^ y, inputs=ANY2),
    Case("lshift", lambda x, y: x << y, inputs=same("any", "small")),
    Case("rshift", lambda x, y: x >> y, inputs=same("any", "small")),
    Case("where", lambda c, x, y: c.where(x, y), lambda c, x, y: torch.where(c, x, y), inputs=conditioned, exact=True),
    # a Python scalar is weak: it keeps the tensor's dtype inside its category and lifts bool to int, int to float
    Case("add_int_scalar", lambda x: x + 3, exact=True),
    Case("rsub_int_scalar", lambda x: 1 - x, exact=True),
    Case("mul_float_scalar", lambda x: x * 0.5, exact=True),
    # the whole range: integers wrap around (two's complement, as torch), float products overflow to infinity
    Case("add_full_range", lambda x, y: x + y, inputs=same("full", "full"), exact=True),
    Case("sub_full_range", lambda x, y: x - y, inputs=same("full", "full"), exact=True),
    Case("mul_full_range", lambda x, y: x * y, inputs=same("full", "full"), exact=True),
    Case("neg_full_range", lambda x: -x, inputs=same("full"), exact=True),
]

REDUCE = [
    Case("sum", lambda x: x.sum(1), summed=True),
    Case("sum_all", lambda x: x.sum(), summed=True),
    Case("prod", lambda x: x.prod(1), inputs=same("nonzero"), summed=True),
    Case("mean", lambda x: x.mean(1), summed=True),
    Case("max", lambda x: x.max(axis=1), lambda x: x.amax(1), exact=True),
    Case("min", lambda x: x.min(axis=1), lambda x: x.amin(1), exact=True),
    Case("max_all", lambda x: x.max(), exact=True),
    Case("argmax", lambda x: x.argmax(1)),
    Case("argmin", lambda x: x.argmin(1)),
    Case("argmax_all", lambda x: x.argmax()),
    Case("any", lambda x: x.any(1)),
    Case("all", lambda x: x.all(1)),
    Case("var", lambda x: x.var(1), summed=True, tol=2),
    Case("std", lambda x: x.std(1), summed=True, tol=2),
    Case("logsumexp", lambda x: x.logsumexp(1), summed=True, tol=2),
    Case("softmax", lambda x: x.softmax(1), summed=True, tol=2),
    Case("log_softmax", lambda x: x.log_softmax(1), summed=True, tol=2),
    Case("cumsum", lambda x: x.cumsum(1), summed=True),
    Case("cumprod", lambda x: x.cumprod(1), inputs=same("nonzero"), summed=True),
    Case("cummax", lambda x: x.cummax(1).values, lambda x: x.cummax(1).values, exact=True),
]

MOVEMENT = [
    Case("reshape", lambda x: x.reshape(5, 3), exact=True),
    Case("permute", lambda x: x.permute(1, 0), exact=True),
    Case("flip", lambda x: x.flip(1), exact=True),
    Case("pad", lambda x: x.pad((1, 2)), lambda x: F.pad(x, (1, 2)), exact=True),
    Case("pad_value", lambda x: x.pad((2, 0, 1, 1), value=1), lambda x: F.pad(x, (2, 0, 1, 1), value=1), exact=True),
    Case("getitem_slices", lambda x: x[1:, ::2], exact=True),
    Case("getitem_int_and_slice", lambda x: x[-1, 1:4], exact=True),
    Case("getitem_index_tensor", lambda x, i: x[i], inputs=with_index(np.array([2, 0, 2], np.int64)), exact=True),
    Case("getitem_index_tensor_axis1", lambda x, i: x[:, i], inputs=with_index(IDX), exact=True),
    Case("cat", lambda x, y: x.cat(y, dim=1), lambda x, y: torch.cat([x, y], 1), inputs=ANY2, exact=True),
    Case("stack", lambda x, y: x.stack(y, dim=1), lambda x, y: torch.stack([x, y], 1), inputs=ANY2, exact=True),
    Case("repeat", lambda x: x.repeat(2, 1, 2), exact=True),
    Case("gather", lambda x, i: x.gather(1, i), inputs=with_index(GATHER_IDX), exact=True),
]

PRODUCTS = [
    Case("matmul", lambda a, b: a @ b, inputs=lambda d: [(values(d, "any", (3, 5), 0), d),
                                                         (values(d, "any", (5, 4), 1), d)], summed=True),
    Case("einsum", lambda a, b: Tensor.einsum("ij,kj->ik", a, b), lambda a, b: torch.einsum("ij,kj->ik", a, b),
         inputs=ANY2, summed=True),
    Case("conv2d", lambda x, w: x.conv2d(w), lambda x, w: F.conv2d(x, w),
         inputs=lambda d: [(values(d, "any", (1, 2, 5, 5), 0), d), (values(d, "any", (3, 2, 3, 3), 1), d)],
         summed=True),
    Case("max_pool2d", lambda x: x.max_pool2d(2), lambda x: F.max_pool2d(x, 2), inputs=same("any", shape=NCHW),
         exact=True),
    Case("avg_pool2d", lambda x: x.avg_pool2d(2), lambda x: F.avg_pool2d(x, 2), inputs=same("any", shape=NCHW),
         summed=True),
    Case("sort_values", lambda x: x.sort(1)[0], exact=True),
    Case("sort_descending_values", lambda x: x.sort(1, descending=True)[0], exact=True),
    Case("topk_values", lambda x: x.topk(2, 1)[0], exact=True),
]

# the same ops on NaN, infinities, signed zeros and ties; they run for the float dtypes only
SPECIAL_CASES = [
    Case("exp_special", lambda x: x.exp(), inputs=same("special")),
    Case("log_special", lambda x: x.log(), inputs=same("special")),
    Case("sqrt_special", lambda x: x.sqrt(), inputs=same("special")),
    Case("sigmoid_special", lambda x: x.sigmoid(), inputs=same("special")),
    Case("tanh_special", lambda x: x.tanh(), inputs=same("special")),
    Case("abs_special", lambda x: x.abs(), inputs=same("special"), exact=True),
    Case("neg_special", lambda x: -x, inputs=same("special"), exact=True),
    Case("sign_special", lambda x: x.sign(), inputs=same("special"), exact=True),
    Case("relu_special", lambda x: x.relu(), inputs=same("special"), exact=True),
    Case("floor_special", lambda x: x.floor(), inputs=same("special"), exact=True),
    Case("round_special", lambda x: x.round(), inputs=same("special"), exact=True),
    Case("clamp_special", lambda x: x.clamp(-1, 2), inputs=same("special"), exact=True),
    Case("add_special", lambda x, y: x + y, inputs=same("special", "special"), exact=True),
    Case("mul_special", lambda x, y: x * y, inputs=same("special", "special"), exact=True),
    Case("truediv_special", lambda x, y: x / y, inputs=same("special", "special"), exact=True),
    Case("maximum_special", lambda x, y: x.maximum(y), inputs=same("special", "special"), exact=True),
    Case("minimum_special", lambda x, y: x.minimum(y), inputs=same("special", "special"), exact=True),
    Case("max_special", lambda x: x.max(axis=1), lambda x: x.amax(1), inputs=same("special"), exact=True),
    Case("argmax_special", lambda x: x.argmax(1), inputs=same("special")),
    Case("sum_special", lambda x: x.sum(1), inputs=same("special"), summed=True),
    Case("sort_special", lambda x: x.sort(1)[0], inputs=same("special"), exact=True),
]
FLOATS = ["float16", "bfloat16", "float32", "float64"]

CASES = UNARY + BINARY + REDUCE + MOVEMENT + PRODUCTS
assert len({c.name for c in CASES + SPECIAL_CASES}) == len(CASES + SPECIAL_CASES), "case names name the tests"

# (case, dtype) -> why ember disagrees with torch today; each runs as xfail(strict=True), so a fix shows as XPASS.
KNOWN: dict[tuple[str, str], str] = {}


# ---- running a case ----------------------------------------------------------------------------------------------


def assert_matches(got: Any, want: Any, case: Case) -> None:
    """got (ember) has want's (torch's) dtype, shape and values, compared as `case` says."""
    assert isinstance(got, Tensor), f"ember returned {type(got).__name__}, not a Tensor"
    assert dtype_name(got) == dtype_name(want), f"dtype: ember {dtype_name(got)}, torch {dtype_name(want)}"
    got_np, want_np = got.numpy(), torch_values(want)
    assert got_np.shape == want_np.shape, f"shape: ember {got_np.shape}, torch {want_np.shape}"
    if got.dtype.is_float and not case.exact:
        name = got.dtype.name
        accumulate = "float32" if name in ("float16", "bfloat16") else name
        scale = float(np.max(np.abs(want_np), where=np.isfinite(want_np), initial=0.0)) if case.summed else 0.0
        np.testing.assert_allclose(got_np.astype(np.float64), want_np.astype(np.float64), rtol=RTOL[name] * case.tol,
                                   atol=RTOL[accumulate] * case.tol * scale, equal_nan=True)
    else:
        np.testing.assert_array_equal(got_np, want_np)
        if got.dtype.is_float:  # and zeros carry torch's sign (NaN's sign is not specified)
            number = ~np.isnan(want_np)
            np.testing.assert_array_equal(np.signbit(got_np[number]), np.signbit(want_np[number]), err_msg="sign")


def run_case(case: Case, inputs: list[Input]) -> None:
    """Run torch, then ember, and compare; skip when torch refuses the dtype (pass when ember refuses too)."""
    try:
        want = (case.oracle or case.ember)(*(to_torch(x) for x in inputs))
    except Exception as e:  # torch says "not implemented for 'UInt16'" and the like, as RuntimeError or TypeError
        reason = str(e).strip().split("\n")[0][:160]
        try:
            case.ember(*(to_ember(x) for x in inputs))
        except EmberError:
            return  # both refuse
        except Exception as e:  # not a user error: worth a look, but torch gives nothing to compare with
            pytest.skip(f"torch refuses: {reason}; ember raises {type(e).__name__}: {e}")
        pytest.skip(f"torch refuses: {reason}")
    assert_matches(case.ember(*(to_ember(x) for x in inputs)), want, case)


def _params(cases: list[Case], dtypes: list[str]) -> list[Any]:
    known = {key: [pytest.mark.xfail(strict=True, reason=why)] for key, why in KNOWN.items()}
    return [pytest.param(c, d, id=f"{c.name}-{d}", marks=known.get((c.name, d), [])) for c in cases for d in dtypes]


@pytest.mark.parametrize("case, dtype", _params(CASES, DTYPES) + _params(SPECIAL_CASES, FLOATS))
def test_op_gives_torch_dtype_and_values(case, dtype):
    run_case(case, case.inputs(dtype))


# ---- mixed dtypes ------------------------------------------------------------------------------------------------


def _pair(a: str | float | bool, b: str | float | bool, zero_dim: tuple[bool, bool] = (False, False)) -> \
        Callable[[str], list[Input]]:
    """Inputs for a binary op on dtypes a and b (0-d where zero_dim says), b nonzero as it may divide; a Python
    scalar stays out of the list. The pair names its dtypes, so the builder ignores the dtype it is given."""
    return lambda _: [(values(d, domain, () if z else SHAPE, seed=i), d) for i, (d, z, domain)
                      in enumerate(zip((a, b), zero_dim, ("any", "nonzero"))) if isinstance(d, str)]


def _where_float16_float32(_: str) -> list[Input]:
    return conditioned("float16")[:2] + [(values("float32", "any", seed=1), "float32")]


MIXED = [
    Case("int32+float16", lambda x, y: x + y, inputs=_pair("int32", "float16"), exact=True),
    Case("uint8+int8", lambda x, y: x + y, inputs=_pair("uint8", "int8")),
    Case("int8*uint8", lambda x, y: x * y, inputs=_pair("int8", "uint8")),
    Case("int16-uint8", lambda x, y: x - y, inputs=_pair("int16", "uint8")),
    Case("bool*float32", lambda x, y: x * y, inputs=_pair("bool", "float32"), exact=True),
    Case("bool+int8", lambda x, y: x + y, inputs=_pair("bool", "int8")),
    Case("float16+bfloat16", lambda x, y: x + y, inputs=_pair("float16", "bfloat16"), exact=True),
    Case("bfloat16*float32", lambda x, y: x * y, inputs=_pair("bfloat16", "float32"), exact=True),
    Case("float16/float64", lambda x, y: x / y, inputs=_pair("float16", "float64"), exact=True),
    Case("int32/int64", lambda x, y: x / y, inputs=_pair("int32", "int64"), exact=True),
    Case("int64//int8", lambda x, y: x // y, inputs=_pair("int64", "int8")),
    Case("uint8<int8", lambda x, y: x < y, inputs=_pair("uint8", "int8")),
    Case("float16==int64", lambda x, y: x == y, inputs=_pair("float16", "int64")),
    Case("int64+2.5", lambda x: x + 2.5, inputs=_pair("int64", 2.5), exact=True),
    Case("uint8*2", lambda x: x * 2, inputs=_pair("uint8", 2)),
    Case("float16*3", lambda x: x * 3, inputs=_pair("float16", 3), exact=True),
    Case("int16+True", lambda x: x + True, inputs=_pair("int16", True)),
    Case("bool+1.5", lambda x: x + 1.5, inputs=_pair("bool", 1.5), exact=True),
    Case("float64_0d+float16", lambda x, y: x + y, inputs=_pair("float64", "float16", (True, False)), exact=True),
    Case("int64_0d*int8", lambda x, y: x * y, inputs=_pair("int64", "int8", (True, False))),
    Case("float32_0d*int32", lambda x, y: x * y, inputs=_pair("float32", "int32", (True, False)), exact=True),
    Case("float16_0d+float64_0d", lambda x, y: x + y, inputs=_pair("float16", "float64", (True, True)), exact=True),
    Case("where_float16_float32", lambda c, x, y: c.where(x, y), lambda c, x, y: torch.where(c, x, y),
         inputs=_where_float16_float32, exact=True),
    Case("cat_int32_float16", lambda x, y: x.cat(y, dim=0), lambda x, y: torch.cat([x, y], 0),
         inputs=_pair("int32", "float16"), exact=True),
    Case("maximum_int8_uint8", lambda x, y: x.maximum(y), inputs=_pair("int8", "uint8")),
    Case("matmul_int32_float32", lambda x, y: x @ y.T, inputs=_pair("int32", "float32"), summed=True),
    Case("pow_float16_int32", lambda x, y: x ** y, inputs=_pair("float16", "int32")),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in MIXED])
def test_mixed_dtypes_promote_as_torch(case):
    run_case(case, case.inputs(""))
