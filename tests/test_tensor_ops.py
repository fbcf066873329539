"""End-to-end tests of Tensor's elementwise ops, reductions, matmul, casts and constructors against torch (CPU).

Each case runs one expression in ember and in torch on the same inputs and compares values, shape and dtype through
tests.helpers.check. Tables keep the number of distinct kernels small: every kernel compiles with gcc once.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ember import Tensor, dtypes
from tests.helpers import REDUCE_TOL, check, dtype_name, sample

NAN, INF = float("nan"), float("inf")
DTYPES = ["float32", "float64", "int32"]
SPECIAL = np.array([NAN, INF, -INF, 0.0, -0.0, 1.5, -2.5], dtype=np.float32)

# ---- construction ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data, dtype", [
    ([1.0, 2.0], "float32"), ([1, 2, 3], "int32"), ([True, False], "bool"), ([1, 2.5], "float32"),
    ([[1, 2], [3, 4], [5, 6]], "int32"), (3, "int32"), (2.5, "float32"), (True, "bool"), ([], "float32"),
    ([[]], "float32"), (np.arange(6, dtype=np.float64).reshape(2, 3), "float64"), (np.int64(7), "int64"),
    (np.array(1.5, dtype=np.float32), "float32"), (np.zeros((3, 0), np.int32), "int32"),
])
def test_tensor_from_python_and_numpy_keeps_values_with_ember_default_dtypes(data, dtype):
    t = Tensor(data)
    want = np.array(data, dtype=dtype)
    assert t.dtype.name == dtype and t.shape == want.shape
    np.testing.assert_array_equal(t.numpy(), want)


@pytest.mark.parametrize("scalar", [np.float64(1.5), np.float32(-0.25), np.float16(2.0), np.int64(-3), np.int8(5),
                                    np.uint8(200), np.bool_(True)], ids=lambda s: type(s).__name__)
def test_tensor_from_a_numpy_scalar_keeps_its_dtype_as_torch(scalar):
    """np.float64 subclasses Python's float, yet it names its dtype: torch.tensor keeps float64, and so must ember."""
    t, want = Tensor(scalar), torch.tensor(scalar)
    assert t.shape == () and t.dtype.name == dtype_name(want)
    np.testing.assert_array_equal(t.numpy(), want.numpy())


@pytest.mark.parametrize("dtype", ["float64", "int8", "int64", "uint8", "bool", "float16"])
def test_tensor_with_dtype_converts_the_data(dtype):
    t = Tensor([0, 1, 2], dtype=dtype)
    assert t.dtype.name == dtype
    np.testing.assert_array_equal(t.numpy(), np.array([0, 1, 2]).astype(dtype))


@pytest.mark.parametrize("make, want", [
    (lambda: Tensor.zeros(2, 3), np.zeros((2, 3), np.float32)),
    (lambda: Tensor.zeros((3,), dtype=dtypes.int32), np.zeros(3, np.int32)),
    (lambda: Tensor.ones(17), np.ones(17, np.float32)),
    (lambda: Tensor.ones(3, 0), np.ones((3, 0), np.float32)),
    (lambda: Tensor.ones(()), np.ones((), np.float32)),
    (lambda: Tensor.full((2, 2), 7), np.full((2, 2), 7, np.int32)),
    (lambda: Tensor.full((3,), 2.5, dtype="float64"), np.full(3, 2.5)),
    (lambda: Tensor.full(4, True), np.full(4, True)),
    (lambda: Tensor.empty(2, 5), np.zeros((2, 5), np.float32)),  # ember documents that empty gives zeros
    (lambda: Tensor.arange(5), np.arange(5, dtype=np.int32)),
    (lambda: Tensor.arange(2, 11, 3), np.arange(2, 11, 3, dtype=np.int32)),
    (lambda: Tensor.arange(5, 0, -2), np.arange(5, 0, -2, dtype=np.int32)),
    (lambda: Tensor.arange(0.0, 1.0, 0.25), np.arange(0, 1, 0.25, dtype=np.float32)),
    (lambda: Tensor.arange(3, 3), np.arange(3, 3, dtype=np.int32)),
    (lambda: Tensor.arange(4, dtype="float64"), np.arange(4, dtype=np.float64)),
    (lambda: Tensor.eye(3), np.eye(3, dtype=np.float32)),
    (lambda: Tensor.eye(2, 4, dtype=dtypes.int32), np.eye(2, 4, dtype=np.int32)),
    (lambda: Tensor.ones(2, 3).zeros_like(), np.zeros((2, 3), np.float32)),
    (lambda: Tensor([1, 2]).full_like(9), np.full(2, 9, np.int32)),
])
def test_constructors_give_numpy_values_and_dtype(make, want):
    got = make().numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rand_is_uniform_in_unit_interval_and_seeded(dtype):
    Tensor.manual_seed(3)
    a = Tensor.rand(1000, dtype=dtype).numpy()
    Tensor.manual_seed(3)
    b = Tensor.rand(1000, dtype=dtype).numpy()
    assert a.dtype == np.dtype(dtype) and a.shape == (1000,)
    assert a.min() >= 0 and a.max() < 1 and abs(a.mean() - 0.5) < 0.05
    np.testing.assert_array_equal(a, b)


def test_randn_is_standard_normal():
    Tensor.manual_seed(0)
    x = Tensor.randn(20, 50).numpy()
    assert x.shape == (20, 50) and x.dtype == np.float32
    assert abs(x.mean()) < 0.1 and abs(x.std() - 1) < 0.1


# ---- unary elementwise -------------------------------------------------------------------------------------------

# (name, ember/torch function, low, high): the same lambda runs on both sides unless the op is named differently.
UNARY = [
    ("neg", lambda x: -x, -4, 4),
    ("exp", lambda x: x.exp(), -4, 4),
    ("log", lambda x: x.log(), 1, 100),
    ("exp2", lambda x: x.exp2(), -4, 4),
    ("log2", lambda x: x.log2(), 1, 100),
    ("sqrt", lambda x: x.sqrt(), 0, 100),
    ("sin", lambda x: x.sin(), -4, 4),
    ("reciprocal", lambda x: x.reciprocal(), 1, 9),
    ("relu", lambda x: x.relu(), -4, 4),
    ("abs", lambda x: x.abs(), -4, 4),
    ("sign", lambda x: x.sign(), -4, 4),
    ("floor", lambda x: x.floor(), -4, 4),
    ("ceil", lambda x: x.ceil(), -4, 4),
    ("trunc", lambda x: x.trunc(), -4, 4),
    ("sigmoid", lambda x: x.sigmoid(), -4, 4),
    ("clamp", lambda x: x.clamp(-1, 2), -4, 4),
    ("clamp_min", lambda x: x.clamp(0), -4, 4),
    ("clamp_max", lambda x: x.clamp(None, 1), -4, 4),
]


@pytest.mark.parametrize("name, fn, low, high", UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("dtype, shape", [("float32", (17,)), ("float64", (17,)), ("int32", (17,)), ("float32", ())],
                         ids=["float32", "float64", "int32", "float32-0d"])
def test_unary_matches_torch(name, fn, low, high, dtype, shape):
    check(fn, None, [sample(shape, dtype, low, high)])


@pytest.mark.parametrize("name, fn, low, high", UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_unary_on_zero_size_tensors_keeps_shape_and_dtype(name, fn, low, high, shape):
    check(fn, None, [sample(shape, "float32")])
    check(fn, None, [sample(shape, "int32")])


@pytest.mark.parametrize("shape", [(1,), (3,), (1000,), (3, 17), (2, 3, 5)])
@pytest.mark.parametrize("fn", [lambda x: (x * 2 + 1).exp(), lambda x: x.relu() - x.sin()], ids=["exp", "relu_sin"])
def test_fused_unary_chains_on_odd_shapes(shape, fn):
    check(fn, None, [sample(shape, "float32", -2, 2)])


@pytest.mark.parametrize("fn, name", [
    (lambda x: x.relu(), "relu"), (lambda x: x.exp(), "exp"), (lambda x: x.log(), "log"), (lambda x: x.sqrt(), "sqrt"),
    (lambda x: x.sin(), "sin"), (lambda x: x.exp2(), "exp2"), (lambda x: x.log2(), "log2"),
    (lambda x: x.reciprocal(), "reciprocal"), (lambda x: x.sigmoid(), "sigmoid"), (lambda x: x.abs(), "abs"),
    (lambda x: x.sign(), "sign"), (lambda x: x.floor(), "floor"), (lambda x: x.ceil(), "ceil"),
    (lambda x: x.trunc(), "trunc"), (lambda x: -x, "neg"), (lambda x: x.clamp(-1, 1), "clamp"),
])
def test_unary_on_nan_inf_and_signed_zero(fn, name):
    check(fn, None, [SPECIAL])


@pytest.mark.parametrize("x, want", [(-1.0, NAN), (0.0, -INF), (-0.0, -INF), (INF, INF), (NAN, NAN)])
def test_log_outside_its_domain_gives_nan_or_inf(x, want):
    got = Tensor([x]).log().item()
    assert (math.isnan(got) and math.isnan(want)) or got == want


# ---- binary elementwise ------------------------------------------------------------------------------------------

BINARY = [
    ("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / b), ("floordiv", lambda a, b: a // b),
    ("maximum", lambda a, b: a.maximum(b)), ("minimum", lambda a, b: a.minimum(b)),
    ("lt", lambda a, b: a < b), ("le", lambda a, b: a <= b), ("gt", lambda a, b: a > b), ("ge", lambda a, b: a >= b),
    ("eq", lambda a, b: a == b), ("ne", lambda a, b: a != b),
]
BITWISE = [("and", lambda a, b: a & b), ("or", lambda a, b: a | b), ("xor", lambda a, b: a ^ b)]


def nonzero(x: np.ndarray) -> np.ndarray:
    """x with zeros replaced by 1, for divisors (integer division by zero is undefined in C)."""
    return np.where(x == 0, np.ones_like(x), x)


@pytest.mark.parametrize("name, fn, dtype_a, dtype_b", [
    pytest.param(name, fn, da, db, id=f"{name}-{da}-{db}")
    for name, fn in BINARY
    for da, db in [("float32", "float32"), ("float64", "float64"), ("int32", "int32"), ("int32", "float32"),
                   ("float32", "float64")]
])
def test_binary_broadcast_matches_torch(name, fn, dtype_a, dtype_b):
    a = sample((3, 1), dtype_a, -9, 9, seed=1)
    b = nonzero(sample((17,), dtype_b, -5, 5, seed=2))
    b[:3] = a[:, 0]  # some equal pairs for the comparisons and for exact division
    check(fn, None, [a, nonzero(b)])


@pytest.mark.parametrize("a, b", [(-7, 2), (7, -2), (-8, 3), (-6, 3), (6, 4), (0, -5)])
def test_int_floordiv_by_a_scalar_rounds_toward_negative_infinity(a, b):
    check(lambda x: x // b, None, [np.array([a], np.int32)])


@pytest.mark.parametrize("a, b", [(-7, 2), (7, -2), (-8, 3), (-6, 3), (6, 4)])
def test_int_floordiv_of_two_tensors_rounds_toward_negative_infinity(a, b):
    check(lambda x, y: x // y, None, [np.array([a], np.int32), np.array([b], np.int32)])


def test_float_floordiv_agrees_with_python_where_the_quotient_rounds_up():
    check(lambda x: x // 0.1, None, [np.array([1.0], np.float32)])  # Python and torch: 1 // 0.1 == 9


FUSED = [
    ("(a-b)*b", lambda a, b, c: (a - b) * b), ("b*(a-b)", lambda a, b, c: b * (a - b)),
    ("(b-a)*a", lambda a, b, c: (b - a) * a), ("a-b*c", lambda a, b, c: a - b * c),
    ("(a-c)*(b-c)", lambda a, b, c: (a - c) * (b - c)), ("c-(b-a)", lambda a, b, c: c - (b - a)),
    ("max(a-b,c)", lambda a, b, c: (a - b).maximum(c)), ("abs(a-b)*c", lambda a, b, c: (a - b).abs() * c),
]


@pytest.mark.parametrize("name, fn, dtype", [
    pytest.param(name, fn, dtype, id=f"{name}-{dtype}")
    for name, fn in FUSED for dtype in DTYPES
])
def test_fused_expressions_of_several_inputs_match_torch(name, fn, dtype):
    check(fn, None, [sample((17,), dtype, -9, 9, seed=s) for s in (1, 2, 3)])


def test_int_kernel_reads_each_input_from_its_own_buffer_minimal():
    a, b = Tensor([7, 9]), Tensor([2, 4])
    assert (b * (a - b)).tolist() == [10, 20]


def test_int_kernel_reads_each_input_from_its_own_buffer_minimal_swapped_order():
    a, b = Tensor([7, 9]), Tensor([2, 4])
    assert ((a - b) * b).tolist() == [10, 20]  # ember: [-35, -45], the kernel signature lists data2 before data1


@pytest.mark.parametrize("name, fn", BITWISE, ids=[b[0] for b in BITWISE])
@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_bitwise_matches_torch(name, fn, dtype):
    check(fn, None, [sample((3, 1), dtype, -99, 99, seed=1), sample((17,), dtype, -99, 99, seed=2)])


@pytest.mark.parametrize("shape_a, shape_b", [
    ((), (5,)), ((5,), ()), ((), ()), ((1,), (3,)), ((3, 1), (1, 4)), ((2, 1, 3), (4, 1)), ((17,), (1000, 17)),
    ((0,), (3, 1)), ((1,), (0,)), ((3, 0), (3, 1)), ((1, 1), ()),
])
@pytest.mark.parametrize("name, fn", [BINARY[0], BINARY[7]], ids=["add", "lt"])
def test_broadcasting_shapes_including_0d_and_zero_size(shape_a, shape_b, name, fn):
    check(fn, None, [sample(shape_a, "float32", seed=1), sample(shape_b, "float32", seed=2)])


@pytest.mark.parametrize("name, fn", [
    pytest.param(*b, id=b[0]) for b in BINARY])
def test_binary_on_nan_inf_and_signed_zero(name, fn):
    check(fn, None, [SPECIAL.reshape(7, 1), SPECIAL])


@pytest.mark.parametrize("dtype, scalar", [
    ("int32", -3), ("int32", 2.5), ("float32", 2), ("float64", 0.1), ("bool", 1.5),
], ids=lambda v: str(v))
@pytest.mark.parametrize("op", ["add", "radd", "sub", "rsub", "mul", "rmul", "div", "rdiv", "floordiv", "lt",
                                "maximum"])
def test_tensor_op_python_scalar_promotes_as_torch(dtype, scalar, op):
    if dtype == "bool" and op in ("sub", "rsub"): pytest.skip("torch refuses subtraction with a bool tensor")
    fn = {"add": lambda x: x + scalar, "radd": lambda x: scalar + x, "sub": lambda x: x - scalar,
          "rsub": lambda x: scalar - x, "mul": lambda x: x * scalar, "rmul": lambda x: scalar * x,
          "div": lambda x: x / scalar, "rdiv": lambda x: scalar / x, "floordiv": lambda x: x // scalar,
          "lt": lambda x: x < scalar, "maximum": lambda x: torch.clamp(x, min=scalar)}[op]
    ember_fn = (lambda x: x.maximum(scalar)) if op == "maximum" else fn
    check(ember_fn, fn, [sample((17,), dtype, 1, 9) if op == "rdiv" else sample((17,), dtype, -9, 9)])


@pytest.mark.parametrize("fn, inputs, want", [
    (lambda x: x * 2.5, [np.array([1, 2], np.int32)], "float32"),
    (lambda x, y: x / y, [np.array([1, 2], np.int32), np.array([2, 4], np.int32)], "float32"),
    (lambda x: x.sum(), [np.array([1, 2], np.int32)], "int64"),
    (lambda x: x.sum(), [np.array([True, False, True])], "int64"),
    (lambda x: x.prod(), [np.array([3, 2], np.int32)], "int64"),
    (lambda x, y: x + y, [np.array([1, 2], np.int32), np.array([0.5, 1], np.float64)], "float64"),
    (lambda x, y: x + y, [np.array([1, 2], np.int8), np.array([1, 2], np.uint8)], "int16"),
    (lambda x, y: x * y, [np.array([1, 2], np.int32), np.array([True, False])], "int32"),
    (lambda x: x + 1, [np.array([1, 2], np.int8)], "int8"),
    (lambda x: x.exp(), [np.array([1, 2], np.int32)], "float32"),
    (lambda x: x.sqrt(), [np.array([1, 4], np.int64)], "float32"),
    (lambda x, y: x // y, [np.array([7, 9], np.int32), np.array([2, 4], np.int32)], "int32"),
    (lambda x, y: x < y, [np.array([1, 2], np.int32), np.array([2.0, 1.0], np.float32)], "bool"),
    (lambda x: x.abs(), [np.array([-1, 2], np.int32)], "int32"),
    (lambda x: x.clamp(0.5, 3), [np.array([0, 2, 9], np.int32)], "float32"),
])
def test_result_dtype_matches_torch(fn, inputs, want):
    got, oracle = fn(*(Tensor(x) for x in inputs)), fn(*(torch.from_numpy(x) for x in inputs))
    assert got.dtype.name == dtype_name(oracle) == want


def test_0d_tensor_does_not_widen_a_dimensioned_tensor_within_its_category():
    check(lambda x, y: x + y, None, [np.ones(3, np.float32), np.array(2.0, np.float64)])


# ---- where, cast, bitcast ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("x_dtype, y_dtype", [("float32", "float32"), ("int32", "float32"), ("int32", "int32"),
                                              ("float64", "float32"), ("bool", "bool")])
@pytest.mark.parametrize("shapes", [((3, 1), (17,), ()), ((17,), (17,), (17,)), ((), (), ()), ((0,), (3, 1), ())],
                         ids=["broadcast", "same", "0d", "empty"])
def test_where_broadcasts_and_promotes_like_torch(x_dtype, y_dtype, shapes):
    cond, x = sample(shapes[0], "bool", seed=1), sample(shapes[1], x_dtype, seed=2)
    y = sample(shapes[2], y_dtype, seed=3)
    check(lambda c, a, b: c.where(a, b), lambda c, a, b: torch.where(c, a, b), [cond, x, y])


@pytest.mark.parametrize("scalar", [0.0, -1.5])
def test_where_with_python_scalar_branch(scalar):
    cond, x = sample((17,), "bool", seed=1), sample((17,), "float32", seed=2)
    check(lambda c, a: c.where(a, scalar), lambda c, a: torch.where(c, a, scalar), [cond, x])


def test_where_takes_a_non_bool_condition_as_nonzero():
    cond, x = np.array([0.0, 2.0, -0.5, 0.0], np.float32), np.arange(4, dtype=np.float32)
    check(lambda c, a: c.where(a, -a), lambda c, a: torch.where(c != 0, a, -a), [cond, x])


@pytest.mark.parametrize("src, dst, low, high", [
    ("float32", "int32", -99, 99), ("int32", "float32", -99, 99), ("float32", "bool", -2, 2), ("bool", "float32", 0, 1),
    ("int32", "float64", -99, 99), ("float64", "float32", -1e3, 1e3), ("int32", "int8", -1000, 1000),
    ("float32", "int64", -1e6, 1e6), ("int32", "bool", -2, 2), ("bool", "int32", 0, 1), ("int64", "int32", -99, 99),
    ("float32", "float16", -99, 99), ("uint8", "int32", 0, 255), ("int32", "uint8", 0, 255),
])
def test_cast_matches_torch(src, dst, low, high):
    x = sample((17,), src, low, high)
    check(lambda t: t.cast(dst), lambda t: t.to(getattr(torch, dst)), [x])


@pytest.mark.parametrize("src, dst", [("float32", "int32"), ("int32", "float32"), ("float64", "int64"),
                                      ("int64", "float64"), ("int16", "float16")])
def test_bitcast_reinterprets_bits_like_torch_view(src, dst):
    x = sample((17,), src, -99, 99)
    check(lambda t: t.bitcast(dst), lambda t: t.view(getattr(torch, dst)), [x])


def test_bitcast_of_a_computed_value():
    check(lambda t: (t + 1).bitcast("int32"), lambda t: (t + 1).view(torch.int32), [np.array([0.0, 1.0], np.float32)])


# ---- reductions --------------------------------------------------------------------------------------------------

def torch_reduce(name: str, axis, keepdim: bool):
    """The torch reduction matching ember's `name(axis, keepdim)` (torch.prod takes one axis, mean needs floats)."""
    def run(x: torch.Tensor) -> torch.Tensor:
        if name == "mean" and not x.dtype.is_floating_point: x = x.float()
        op = {"max": torch.amax, "min": torch.amin}.get(name, getattr(torch, name))
        if axis is None:
            out = op(x) if name not in ("max", "min") else op(x, dim=tuple(range(x.ndim)))
            return out.reshape((1,) * x.ndim) if keepdim else out.reshape(())
        axes = sorted(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))
        out = x
        for a in reversed(axes): out = op(out, dim=a, keepdim=True)
        return out if keepdim else out.reshape([s for i, s in enumerate(x.shape) if i not in axes])
    return run


REDUCE_CASES = [((3, 17), None), ((3, 17), 0), ((3, 17), 1), ((3, 17), -1), ((2, 3, 4), (0, 2)), ((1000,), 0),
                ((), None)]


@pytest.mark.parametrize("shape, axis", REDUCE_CASES, ids=lambda v: str(v).replace(" ", ""))
@pytest.mark.parametrize("name", ["sum", "max", "min", "mean", "prod"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_matches_torch(shape, axis, name, dtype):
    low, high = (0.5, 2) if dtype != "int32" else (-4, 4)  # positive floats: relative error stays meaningful
    if name == "prod" and dtype == "int32": low, high = -2, 3
    check(lambda x: getattr(x, name)(axis=axis), torch_reduce(name, axis, False), [sample(shape, dtype, low, high)],
          **REDUCE_TOL)


@pytest.mark.parametrize("name", ["sum", "max", "min", "mean", "prod"])
@pytest.mark.parametrize("axis", [None, 1, (0, 2)], ids=str)
def test_reduce_keepdim_keeps_reduced_axes_as_size_one(name, axis):
    check(lambda x: getattr(x, name)(axis=axis, keepdim=True), torch_reduce(name, axis, True),
          [sample((2, 3, 4), "float32", 0.5, 2)], **REDUCE_TOL)


@pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
def test_reduce_of_bool_matches_torch(name):
    check(lambda x: getattr(x, name)(axis=1), torch_reduce(name, 1, False), [sample((3, 17), "bool")])


@pytest.mark.parametrize("shape, axis", [((0,), None), ((3, 0), 1), ((3, 0), None), ((0, 4), 0), ((3, 0), 0)],
                         ids=str)
@pytest.mark.parametrize("name", ["sum", "prod", "mean"])
def test_reduce_over_zero_size_gives_identity_or_nan(shape, axis, name):
    check(lambda x: getattr(x, name)(axis), torch_reduce(name, axis, False), [sample(shape, "float32")])


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_over_nonempty_axis_of_zero_size_tensor(name):
    check(lambda x: getattr(x, name)(axis=0), torch_reduce(name, 0, False), [sample((3, 0), "float32")])


@pytest.mark.parametrize("name", ["sum", "max", "min", "mean", "prod"])
@pytest.mark.parametrize("values", [[1.0, NAN, 3.0], [NAN, -INF, 2.0], [INF, 1.0, -2.0], [-INF, -INF], [INF, -INF]],
                         ids=str)
def test_reduce_propagates_nan_and_inf(name, values):
    check(lambda x: getattr(x, name)(), torch_reduce(name, None, False), [np.array(values, np.float32)])


def test_sum_of_int32_does_not_overflow_in_int64():
    check(lambda x: x.sum(), None, [np.full(1000, 2**30, np.int32)])


# ---- matmul ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape_a, shape_b", [
    ((3, 4), (4, 5)), ((17,), (17,)), ((17,), (17, 3)), ((3, 17), (17,)), ((1, 1), (1, 1)), ((2, 3, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 5)), ((1, 3, 4), (5, 4, 2)), ((5, 1000), (1000, 3)), ((0, 3), (3, 4)), ((3, 0), (0, 4)),
    ((3, 4), (4, 0)),
], ids=lambda s: str(s).replace(" ", ""))
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_matches_torch(shape_a, shape_b, dtype):
    check(lambda a, b: a @ b, None, [sample(shape_a, dtype, -3, 3, seed=1), sample(shape_b, dtype, -3, 3, seed=2)],
          **REDUCE_TOL)


def test_matmul_of_mixed_dtypes_promotes():
    a, b = sample((3, 4), "int32", seed=1), sample((4, 2), "float32", seed=2)
    check(lambda x, y: x.matmul(y), lambda x, y: x.float() @ y, [a, b], **REDUCE_TOL)


def test_matmul_propagates_nan_and_inf():
    a = np.array([[1.0, NAN], [INF, 1.0], [1.0, 2.0]], np.float32)
    check(lambda x, y: x @ y, None, [a, np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)])


# ---- realize and conversion back to Python -----------------------------------------------------------------------


def test_realize_returns_the_tensor_and_keeps_its_values():
    x = Tensor([1.0, 2.0, 3.0]) * 2
    assert x.realize() is x
    np.testing.assert_array_equal(x.numpy(), [2.0, 4.0, 6.0])
    np.testing.assert_array_equal((x + 1).realize().numpy(), [3.0, 5.0, 7.0])


def test_realize_of_several_tensors_sharing_an_input():
    a = Tensor([1, 2, 3])
    b, c = a * 2, a + 1
    b.realize(c)
    assert b.tolist() == [2, 4, 6] and c.tolist() == [2, 3, 4]


@pytest.mark.parametrize("make, want", [
    (lambda: Tensor(3.5), 3.5), (lambda: Tensor([7]), 7), (lambda: Tensor([[True]]), True),
    (lambda: Tensor([1, 2, 3]).sum(), 6), (lambda: Tensor([2.0, 3.0]).max(), 3.0),
])
def test_item_gives_a_python_scalar(make, want):
    got = make().item()
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("make, want", [
    (lambda: Tensor([[1, 2], [3, 4]]), [[1, 2], [3, 4]]), (lambda: Tensor(2.5), 2.5), (lambda: Tensor([]), []),
    (lambda: Tensor.ones(2, 0), [[], []]), (lambda: Tensor([True, False]), [True, False]),
    (lambda: Tensor.arange(6).reshape(2, 3).T, [[0, 3], [1, 4], [2, 5]]),
])
def test_tolist_gives_nested_python_lists(make, want):
    assert make().tolist() == want


def test_numpy_returns_an_independent_copy():
    x = Tensor([1.0, 2.0]).realize()
    arr = x.numpy()
    arr[0] = 99
    assert x.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("args", [(0, 1, 0.1), (-3.5, 7.25, 0.3), (1e3, 1e3 + 1, 1 / 3), (10, -10, -0.7), (0, 300, 1)])
def test_arange_is_the_nearest_value_to_start_plus_i_times_step(args):
    """Each element is start + i*step rounded once (numpy's float64 arange, cast); torch rounds in float32 on the
    way and can be an ulp off, so numpy is the oracle here."""
    is_float = any(isinstance(a, float) for a in args)
    expected = np.arange(*args, dtype=np.float64).astype(np.float32 if is_float else np.int32)
    got = Tensor.arange(*args)
    assert got.dtype.name == expected.dtype.name
    assert len(got) == len(torch.arange(*args))
    np.testing.assert_array_equal(got.numpy(), expected)


def test_arange_and_eye_fuse_into_their_consumer_without_memory():
    x = Tensor.arange(12).reshape(3, 4) * 2 + Tensor.eye(3, 4, dtype="int32")
    (item,) = x.schedule()
    assert len(item.bufs) == 1  # only the output: the index and the identity are computed in the kernel
    np.testing.assert_array_equal(x.numpy(), np.arange(12).reshape(3, 4) * 2 + np.eye(3, 4, dtype=np.int32))


# ---- deep graphs: every stage walks them without recursion, and no kernel grows past what a C compiler can take ---


def test_a_chain_of_3000_adds_realizes() -> None:
    # raised RecursionError in codegen/expand.py (the example); now 3 kernels of 1000 adds, compiled once
    start = np.arange(16, dtype=np.float32)
    x = Tensor(start)
    for _ in range(3000): x = x + 1
    np.testing.assert_array_equal(x.numpy(), start + 3000)


@pytest.mark.slow  # about 7 s of CPU (12 s on a loaded 2-core machine)
def test_a_chain_of_100000_ops_realizes() -> None:
    start = np.arange(16, dtype=np.float32)
    x = Tensor(start)
    for _ in range(100_000): x = x + 1
    np.testing.assert_array_equal(x.numpy(), start + 100_000)


# ---- nbytes, is_floating_point, clone ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "uint8",
                                   "bool"])
def test_nbytes_and_is_floating_point_match_torch(dtype):
    t = Tensor.zeros(3, 5, dtype=dtype)
    want = torch.zeros(3, 5, dtype=getattr(torch, dtype))
    assert t.nbytes() == want.nbytes == 15 * want.element_size()
    assert t.is_floating_point() is want.is_floating_point()
    assert Tensor.zeros(0, 4, dtype=dtype).nbytes() == 0


def test_clone_copies_into_its_own_buffer_and_passes_gradients():
    a = Tensor([1.0, 2.0, 3.0]).realize()
    b = a.clone().realize()
    assert b.tolist() == [1.0, 2.0, 3.0] and b._buffer() is not a._buffer()
    a.assign(Tensor([9.0, 9.0, 9.0])).realize()
    assert b.tolist() == [1.0, 2.0, 3.0]
    x = Tensor([1.0, 2.0], requires_grad=True)
    assert (x.clone() * x).sum().gradient(x)[0].tolist() == [2.0, 4.0]
    assert Tensor([1, 2]).clone(device=a.device).tolist() == [1, 2]
