"""dtypes: promotion against torch (numpy where torch refuses), value conversion against numpy, names, flags."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from ember import Tensor, helpers
from ember.dtype import (
    DTYPES_BY_NAME,
    SCALARS,
    DType,
    dtypes,
    least_upper_dtype,
    result_dtype,
    to_dtype,
    to_numpy,
    truncate,
)
from ember.errors import DTypeError
from ember.helpers import DEBUG, SPEC, Context

ALL = [DTYPES_BY_NAME[n] for n in SCALARS]
INTS = [d for d in ALL if d.is_int]
PAIRS = list(itertools.product(ALL, repeat=2))


def torch_dtype(d: DType) -> torch.dtype:
    return getattr(torch, d.name)


# ---- promotion -------------------------------------------------------------------------------------------------


def _torch_promote(x: DType, y: DType) -> str | None:
    try:
        return str(torch.promote_types(torch_dtype(x), torch_dtype(y))).removeprefix("torch.")
    except RuntimeError:
        return None  # torch 2.13 has no promotion between uint16/32/64 and the other integer types


TORCH_PROMOTES = [(x, y) for x, y in PAIRS if _torch_promote(x, y) is not None]
TORCH_REFUSES = [(x, y) for x, y in PAIRS if _torch_promote(x, y) is None]


@pytest.mark.parametrize("x, y", TORCH_PROMOTES, ids=[f"{x.name}-{y.name}" for x, y in TORCH_PROMOTES])
def test_least_upper_dtype_matches_torch(x, y):
    assert least_upper_dtype(x, y).name == _torch_promote(x, y)


UINT64_WITH_SIGNED = [(x, y) for x, y in TORCH_REFUSES if {x.kind, y.kind} == {"i", "u"} and 8 in
                      {d.itemsize for d in (x, y) if d.kind == "u"}]


def test_torch_refuses_only_the_wide_unsigned_integers():
    wide = {"uint16", "uint32", "uint64"}
    assert len(TORCH_PROMOTES) >= 120 and TORCH_REFUSES and all({x.name, y.name} & wide for x, y in TORCH_REFUSES)


@pytest.mark.parametrize("x, y", [p for p in TORCH_REFUSES if p not in UINT64_WITH_SIGNED],
                         ids=[f"{x.name}-{y.name}" for x, y in TORCH_REFUSES if (x, y) not in UINT64_WITH_SIGNED])
def test_least_upper_dtype_matches_numpy_where_torch_refuses(x, y):
    assert least_upper_dtype(x, y).name == np.promote_types(x.name, y.name).name


@pytest.mark.parametrize("x, y", UINT64_WITH_SIGNED, ids=[f"{x.name}-{y.name}" for x, y in UINT64_WITH_SIGNED])
def test_uint64_with_signed_int_has_no_common_type(x, y):
    with pytest.raises(DTypeError, match="no common integer type"):
        least_upper_dtype(x, y)


def test_least_upper_dtype_is_commutative_and_associative():
    for x, y, z in itertools.product(ALL, repeat=3):
        try:
            left, right = least_upper_dtype(least_upper_dtype(x, y), z), least_upper_dtype(x, least_upper_dtype(y, z))
        except DTypeError:  # uint64 with a signed int somewhere
            continue
        assert least_upper_dtype(y, x) is least_upper_dtype(x, y)
        assert left is right is least_upper_dtype(x, y, z)


def test_least_upper_dtype_of_vectors_and_many():
    assert least_upper_dtype(dtypes.int8.vec(4), dtypes.uint8) is dtypes.int16
    assert least_upper_dtype(dtypes.int8, dtypes.uint8, dtypes.float16) is dtypes.float16
    assert least_upper_dtype(dtypes.bfloat16, dtypes.float16) is dtypes.float32
    assert least_upper_dtype(dtypes.bool) is dtypes.bool


SCALAR_VALUES = [True, 2, -3, 2.5]
WEAK = list(itertools.product(ALL, SCALAR_VALUES))


def _torch_result(d: DType, scalar: object) -> str:
    t = torch.tensor([1], dtype=torch_dtype(d))
    try:
        out = (t * scalar).dtype
    except (RuntimeError, NotImplementedError):  # no multiply kernel for some unsigned types: ask the rule directly
        out = torch.result_type(t, scalar)
    return str(out).removeprefix("torch.")


@pytest.mark.parametrize("d, scalar", WEAK, ids=[f"{d.name}*{s!r}" for d, s in WEAK])
def test_result_dtype_with_python_scalar_matches_torch(d, scalar):
    want = _torch_result(d, scalar)
    if d is dtypes.bool and type(scalar) is int:
        assert want == "int64"  # torch's default int; ember's is dtypes.default_int
        want = dtypes.default_int.name
    assert result_dtype(d, scalar).name == want


def test_result_dtype_weak_scalar_examples():
    assert (torch.tensor([1], dtype=torch.int8) * 2.5).dtype == torch.float32
    assert result_dtype(dtypes.int8, 2.5) is dtypes.float32
    assert result_dtype(dtypes.float16, 2.5) is dtypes.float16  # weak: no widening inside a category
    assert result_dtype(dtypes.uint8, -3) is dtypes.uint8
    assert result_dtype(dtypes.bool, True) is dtypes.bool


# ---- truncate ----------------------------------------------------------------------------------------------------

INT_VALUES = [0, 1, -1, 127, 128, -128, -129, 255, 256, 32767, 32768, -32769, 65535, 65536, 2**31 - 1, 2**31,
              -(2**31) - 1, 2**32 - 1, 2**32 + 7, 2**63 - 1, 2**63, -(2**63), 2**64 - 1, 2**64 + 5, 2**70 + 3,
              -(2**70) - 3, 12345678901234]


@pytest.mark.parametrize("d", INTS, ids=[d.name for d in INTS])
def test_truncate_int_wraps_like_numpy(d):
    for v in INT_VALUES:
        want = np.array([v % 2**64], dtype=np.uint64).astype(d.name)[0].item()  # numpy keeps the low bits
        assert truncate(v, d) == want, v
        assert type(truncate(v, d)) is int


@pytest.mark.parametrize("d", INTS, ids=[d.name for d in INTS])
def test_truncate_float_to_int_truncates_toward_zero_like_numpy(d):
    for v in [0.0, -0.0, 2.7, -2.7, 0.999, -0.999, 100.5, 126.9, -128.0]:
        if not d.min <= math.trunc(v) <= d.max: continue
        assert truncate(v, d) == np.array([v]).astype(d.name)[0].item(), v


def test_truncate_non_finite_to_int_follows_torch():
    assert truncate(math.nan, dtypes.int32) == -2**31 and truncate(math.inf, dtypes.uint8) == 0
    assert truncate(-math.inf, dtypes.int64) == -2**63


FLT_MAX = float(np.finfo(np.float32).max)
FLOAT_VALUES = [0.1, -0.1, 1 / 3, 1e-8, 6e-8, 2.9e-8, 3e-8, 65504.0, 65519.99, 65520.0, 1e6, -1e6, FLT_MAX,
                FLT_MAX * (1 + 2**-25), FLT_MAX * (1 + 2**-24), 3.5e38, 1e-46, 1.5e-45, 2.0**-149, 2.0**-150,
                2.0**-150 * 1.0000001, 1 + 2**-11, 1 + 2**-11 + 2**-40, 1 + 2**-24, 1 + 3 * 2**-24, -0.0, 0.0,
                math.inf, -math.inf, 1e300, 2049.0, 2051.0, 16777217.0, 5e-324, 7]


def same_float(got: float, want: float) -> bool:
    if math.isnan(want): return math.isnan(got)
    return got == want and math.copysign(1.0, got) == math.copysign(1.0, want)


@pytest.mark.parametrize("d", [dtypes.float16, dtypes.float32, dtypes.float64], ids=["float16", "float32", "float64"])
def test_truncate_float_rounds_like_numpy(d):
    with np.errstate(over="ignore"):
        for v in FLOAT_VALUES + [math.nan]:
            got, want = truncate(v, d), float(np.array([v], dtype=np.float64).astype(d.name)[0])
            assert same_float(got, want), f"{v!r}: {got!r} != {want!r}"
            assert type(got) is float


def test_truncate_bfloat16_rounds_like_torch():
    for v in FLOAT_VALUES + [math.nan, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 3.3895313892515355e38, 3.4e38]:
        want = torch.tensor([v], dtype=torch.float64).to(torch.bfloat16).item()
        assert same_float(truncate(v, dtypes.bfloat16), want), v


def test_truncate_to_bool_is_nonzero_like_numpy():
    for v in [0, 1, -1, 2, 0.0, -0.0, 0.5, math.nan, math.inf, True, False]:
        assert truncate(v, dtypes.bool) is bool(np.array([v]).astype(np.bool_)[0]), v


def test_truncate_vector_uses_its_scalar():
    assert truncate(300, dtypes.uint8.vec(4)) == 44


# ---- names and numpy interop -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCALARS)
def test_to_dtype_accepts_every_name(name):
    d = to_dtype(name)
    assert d.name == name and d is DTYPES_BY_NAME[name] and to_dtype(d) is d


@pytest.mark.parametrize("alias, d", [("half", dtypes.float16), ("float", dtypes.float32), ("double", dtypes.float64),
                                      ("char", dtypes.int8), ("short", dtypes.int16), ("int", dtypes.int32),
                                      ("long", dtypes.int64), ("uchar", dtypes.uint8)])
def test_to_dtype_accepts_torch_aliases(alias, d):
    assert to_dtype(alias) is d
    assert getattr(torch, alias, torch_dtype(d)) == torch_dtype(d)  # the alias means what torch means by it


@pytest.mark.parametrize("name", [n for n in SCALARS if n != "bfloat16"])
def test_to_dtype_accepts_numpy_types_and_dtypes(name):
    assert to_dtype(np.dtype(name)) is DTYPES_BY_NAME[name]
    assert to_dtype(np.dtype(name).type) is DTYPES_BY_NAME[name]
    assert to_numpy(DTYPES_BY_NAME[name]) == np.dtype(name)


def test_to_dtype_of_python_types_gives_the_defaults():
    assert to_dtype(float) is dtypes.default_float and to_dtype(int) is dtypes.default_int
    assert to_dtype(bool) is dtypes.bool


def test_bfloat16_is_stored_as_uint16_in_numpy():
    assert to_numpy(dtypes.bfloat16) == np.dtype(np.uint16)


def test_to_dtype_keeps_vectors_and_pointers():
    v, p = dtypes.float32.vec(4), dtypes.int8.ptr(16)
    assert to_dtype(v) is v and to_dtype(p) is p


@pytest.mark.parametrize("bad", ["float128", "complex64", "Float32", "", "vec", "from_py", "default_float2"])
def test_to_dtype_rejects_unknown_names(bad):
    with pytest.raises(DTypeError, match=r"unknown dtype .*; known: bool, int8"):
        to_dtype(bad)


@pytest.mark.parametrize("bad", [np.complex64, np.dtype("complex128"), np.dtype("V8"), object, 3, [1]],
                         ids=["complex64", "complex128", "void", "object", "int", "list"])
def test_to_dtype_rejects_other_objects(bad):
    with pytest.raises(DTypeError, match="float32"):  # the message lists what is valid
        to_dtype(bad)


@pytest.mark.parametrize("value, d", [(True, dtypes.bool), (3, dtypes.int32), (3.0, dtypes.float32),
                                      ([1, 2.0], dtypes.float32), ([True, 1], dtypes.int32), ([[True]], dtypes.bool),
                                      ([], dtypes.float32)])
def test_from_py_gives_the_default_dtypes(value, d):
    assert dtypes.from_py(value) is d


def test_from_py_rejects_other_types():
    with pytest.raises(DTypeError, match="str"):
        dtypes.from_py("3")


def test_dtype_limits_match_numpy():
    for d in INTS:
        info = np.iinfo(d.name)
        assert (d.min, d.max) == (info.min, info.max)
    assert dtypes.float32.min == -math.inf and dtypes.bool.max is True


# ---- helpers.Context ---------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _restore_flags():
    saved = {k: v.value for k, v in helpers.ContextVar.registry.items()}
    yield
    for k, v in saved.items(): helpers.ContextVar.registry[k].value = v


def test_context_sets_flags_inside_and_restores_after():
    before, noopt = DEBUG.value, SPEC.value
    with Context(DEBUG=before + 3, SPEC=noopt + 1) as ctx:
        assert DEBUG.value == before + 3 and SPEC.value == noopt + 1 and isinstance(ctx, Context)
        assert DEBUG >= before + 3 and DEBUG > before and not DEBUG < before + 3
    assert DEBUG.value == before and SPEC.value == noopt


def test_context_nests():
    with Context(DEBUG=2):
        with Context(DEBUG=5):
            assert DEBUG.value == 5
        assert DEBUG.value == 2


def test_context_restores_after_an_exception():
    before = DEBUG.value
    with pytest.raises(ZeroDivisionError), Context(DEBUG=4):
        1 / 0  # noqa: B018
    assert DEBUG.value == before


def test_context_as_decorator():
    before = DEBUG.value

    @Context(DEBUG=6)
    def read() -> int: return DEBUG.value

    assert read() == 6 and DEBUG.value == before
    assert read() == 6 and DEBUG.value == before  # the same decorator works twice


def test_context_decorator_restores_after_recursion():  # the same Context instance is entered again while active
    before = DEBUG.value

    @Context(DEBUG=3)
    def depth(n: int) -> int: return depth(n - 1) if n else DEBUG.value

    assert depth(2) == 3
    assert DEBUG.value == before


def test_context_rejects_unknown_flag():
    before = DEBUG.value
    with pytest.raises(KeyError, match="NOT_A_FLAG"):
        Context(NOT_A_FLAG=1)
    with pytest.raises(KeyError, match="DEBUG"):  # the message lists the known flags
        Context(DEBUG=before + 1, NOT_A_FLAG=1)
    assert DEBUG.value == before  # nothing was set


def test_bitcast_to_and_from_bfloat16_reinterprets_the_16_bits():
    bits = np.array([0x3FC0, 0xC049, 0x7F80, 0x0001], np.uint16)
    x = Tensor(bits).bitcast(dtypes.bfloat16)
    expected = torch.tensor(bits.view(np.int16)).view(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(x.numpy(), expected)
    np.testing.assert_array_equal(x.bitcast(dtypes.uint16).numpy(), bits)
    np.testing.assert_array_equal(x.bitcast(dtypes.int16).numpy(), bits.view(np.int16))
