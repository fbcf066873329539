"""torch's calling conventions in reductions, scans and movement ops (issue 12), each against torch, values and
gradients: min at the extremes of every dtype, max/min/cummax/cummin returning (values, indices), `dim=` beside
`axis=`, unfold's window axis last, roll without dims, cat/stack of a sequence, prod(dtype=), negative padding in
reflect/replicate/circular modes, diag and diagonal, and the errors for repeated, misplaced and non-int axes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import Tensor
from ember.errors import ShapeError
from tests.helpers import check, sample

F64 = {"rtol": 1e-10, "atol": 1e-12}


def match_gradient(ours: Callable[..., Tensor], theirs: Callable[..., torch.Tensor], *xs: np.ndarray,
                   seed: int = 1) -> None:
    """In float64, the gradients of a random linear function of the output equal torch's, through `.backward()`."""
    arrays = [np.asarray(x, dtype=np.float64) for x in xs]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    es = [Tensor(a, requires_grad=True) for a in arrays]
    want, got = theirs(*ts), ours(*es)
    assert got.shape == tuple(want.shape)
    cotangent = np.random.default_rng(seed).standard_normal(got.shape)
    (want * torch.from_numpy(cotangent)).sum().backward()
    (got * Tensor(cotangent)).sum().backward()
    for e, t in zip(es, ts, strict=True):
        assert e.grad is not None
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), **F64)


def distinct(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Floats with no ties, so torch's choice among equal elements never matters for gradients."""
    n = int(np.prod(shape))
    return np.random.default_rng(seed).permutation(np.linspace(-3, 3, n)).reshape(shape)


def assert_pair(got: Any, want: Any) -> None:
    """An ember (values, indices) pair equals torch's: fields, dtypes, shapes and values (indices exactly)."""
    assert got.values is got[0] and got.indices is got[1]
    assert got.indices.dtype.name == "int64" and got.values.dtype.name == str(want.values.dtype).removeprefix("torch.")
    assert got.values.shape == tuple(want.values.shape) and got.indices.shape == tuple(want.indices.shape)
    np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())


# ---- min and max at the extremes of each dtype ---------------------------------------------------------------------

def extremes(dtype: str) -> np.ndarray:
    """A (2, 4) array holding the dtype's smallest and largest values, zeros and (for floats) -0.0, inf and NaN."""
    if dtype == "bool": return np.array([[True, False, True, True], [True, True, True, True]])
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[0, info.min, info.max, 1], [info.max, info.max - 1, info.min + 1, info.min]], dtype)
    return np.array([[0.0, -0.0, np.inf, -np.inf], [1.5, np.nan, -2.0, np.finfo(dtype).min]], dtype)


EXTREME_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "bool", "float32", "float64"]


def test_min_of_the_most_negative_int32_is_itself():
    assert Tensor([0, -2**31], dtype="int32").min().item() == -2**31


@pytest.mark.parametrize("dtype", EXTREME_DTYPES)
@pytest.mark.parametrize("fn", ["min", "max"])
def test_min_and_max_at_the_dtype_extremes_match_torch(fn, dtype):
    x = extremes(dtype)
    check(lambda t: getattr(t, fn)(), None, [x])
    check(lambda t: getattr(t, fn)(axis=1), lambda t: getattr(t, "a" + fn)(1), [x])
    check(lambda t: getattr(t, fn)(axis=0, keepdim=True), lambda t: getattr(t, "a" + fn)(0, keepdim=True), [x])
    assert_pair(getattr(Tensor(x), fn)(1), getattr(torch.from_numpy(x), fn)(1))


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
@pytest.mark.parametrize("fn", ["min", "max"])
def test_min_and_max_of_wide_unsigned_extremes_match_numpy(fn, dtype):
    """torch has no min/max for these dtypes, so numpy is the oracle."""
    x = extremes(dtype)
    check(lambda t: getattr(t, fn)(), lambda a: getattr(a, fn)(), [x], lib="numpy")
    check(lambda t: getattr(t, fn)(axis=1), lambda a: getattr(a, fn)(1), [x], lib="numpy")
    np.testing.assert_array_equal(getattr(Tensor(x), fn)(1).indices.numpy(), getattr(x, "arg" + fn)(1))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_argmin_and_cummin_at_the_most_negative_int_match_torch(dtype):
    x = extremes(dtype)
    check(lambda t: t.argmin(1), None, [x])
    assert_pair(Tensor(x).cummin(1), torch.from_numpy(x).cummin(1))


# ---- max and min with an int dim return (values, indices) ----------------------------------------------------------

MAX_CASES = [((5,), 0, "float32"), ((3, 4), 1, "float32"), ((3, 4), -2, "int32"), ((2, 3, 4), 1, "int8"),
             ((2, 3, 4), 2, "bool"), ((4, 1), 1, "uint8"), ((), 0, "float32"), ((1, 6), 1, "float64")]


@pytest.mark.parametrize("shape, dim, dtype", MAX_CASES)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("fn", ["max", "min"])
def test_max_and_min_with_an_int_dim_return_values_and_first_indices(fn, shape, dim, dtype, keepdim):
    x = sample(shape, dtype, low=-2, high=3, seed=3)  # few distinct values: many ties, torch takes the first
    want = getattr(torch.from_numpy(x), fn)(dim, keepdim)
    assert_pair(getattr(Tensor(x), fn)(dim, keepdim), want)
    assert_pair(getattr(Tensor(x), fn)(dim=dim, keepdim=keepdim), want)


@pytest.mark.parametrize("fn", ["max", "min"])
def test_max_and_min_indices_point_at_the_first_nan(fn):
    x = np.array([[1, np.nan, 3, np.nan], [2, 2, -1, -1], [-np.inf, np.inf, 0, np.inf]], np.float32)
    assert_pair(getattr(Tensor(x), fn)(1), getattr(torch.from_numpy(x), fn)(1))


@pytest.mark.parametrize("call", [lambda t: t.max(), lambda t: t.max(axis=1), lambda t: t.max((0, 1)),
                                  lambda t: t.min(axis=-1, keepdim=True), lambda t: t.min(None), lambda t: t.min([1])])
def test_max_and_min_without_an_int_dim_return_the_values_only(call):
    assert isinstance(call(Tensor(distinct((3, 4)))), Tensor)


@pytest.mark.parametrize("fn", ["max", "min"])
@pytest.mark.parametrize("shape, dim", [((3, 4), 1), ((2, 3, 4), 0), ((5,), -1)])
def test_gradient_flows_through_max_and_min_values(fn, shape, dim):
    match_gradient(lambda t: getattr(t, fn)(dim).values, lambda t: getattr(t, fn)(dim).values, distinct(shape))
    match_gradient(lambda t: getattr(t, fn)(dim=dim, keepdim=True)[0],
                   lambda t: getattr(t, fn)(dim=dim, keepdim=True)[0], distinct(shape, seed=1))


# ---- cummax and cummin return (values, indices) --------------------------------------------------------------------

CUM_INPUTS = {
    "ties": np.array([[1, 1, 3, 3, 2, 5, 5, 0], [2, 2, 2, 2, 2, 2, 2, 2]], np.float32),
    "nan": np.array([[1, np.nan, 3, np.nan, -1, 0, 2, 1], [-np.inf, np.inf, -np.inf, 0, np.inf, 1, 1, np.nan]],
                    np.float32),
    "int32": sample((3, 9), "int32", low=-3, high=3, seed=4),
    "uint8": sample((3, 9), "uint8", low=0, high=4, seed=5),
    "bool": sample((3, 9), "bool", seed=6),
    "long": np.tile(sample((2, 7), "int64", low=-50, high=50, seed=7), (1, 100)),  # 700: the blocked scan
}


@pytest.mark.parametrize("name", list(CUM_INPUTS))
@pytest.mark.parametrize("fn", ["cummax", "cummin"])
def test_cummax_and_cummin_return_torchs_values_and_indices(fn, name):
    x = CUM_INPUTS[name]
    for dim in (1, -2):
        want = getattr(torch.from_numpy(x), fn)(dim)
        assert_pair(getattr(Tensor(x), fn)(dim), want)
        assert_pair(getattr(Tensor(x), fn)(dim=dim), want)


@pytest.mark.parametrize("shape, dim", [((3, 0), 1), ((0, 4), 0), ((0,), 0), ((0, 4), 1), ((), 0), ((), -1)])
@pytest.mark.parametrize("fn", ["cummax", "cummin", "cumsum", "cumprod", "logcumsumexp"])
def test_scans_over_empty_and_0d_tensors_match_torch(fn, shape, dim):
    x = sample(shape, "float32", seed=8)
    got, want = getattr(Tensor(x), fn)(dim), getattr(torch.from_numpy(x), fn)(dim)
    if fn in ("cummax", "cummin"): assert_pair(got, want)
    else: check(lambda t: getattr(t, fn)(dim), None, [x])


@pytest.mark.parametrize("fn", ["cummax", "cummin"])
@pytest.mark.parametrize("shape, dim", [((3, 5), 1), ((4, 3, 2), 0)])
def test_gradient_flows_through_cummax_and_cummin_values(fn, shape, dim):
    match_gradient(lambda t: getattr(t, fn)(dim).values, lambda t: getattr(t, fn)(dim).values, distinct(shape))


# ---- dim= beside axis= ---------------------------------------------------------------------------------------------

D = sample((3, 4, 5), "float32", seed=9)
DIM_CALLS = [  # (name, ember with dim=, torch with dim=): each the same call on both sides
    ("sum", lambda t: t.sum(dim=1), None), ("sum_tuple", lambda t: t.sum(dim=(0, 2), keepdim=True), None),
    ("mean", lambda t: t.mean(dim=-1), None), ("prod", lambda t: t.prod(dim=0), None),
    ("std", lambda t: t.std(dim=1), None), ("var", lambda t: t.var(dim=(0, 1), correction=0), None),
    ("logsumexp", lambda t: t.logsumexp(dim=2), None), ("softmax", lambda t: t.softmax(dim=0), None),
    ("log_softmax", lambda t: t.log_softmax(dim=1), None), ("cumsum", lambda t: t.cumsum(dim=2), None),
    ("cumprod", lambda t: t.cumprod(dim=1), None), ("logcumsumexp", lambda t: t.logcumsumexp(dim=0), None),
    ("cummax", lambda t: t.cummax(dim=1).values, None), ("cummin", lambda t: t.cummin(dim=2).values, None),
    ("argmax", lambda t: t.argmax(dim=1), None), ("argmin", lambda t: t.argmin(dim=-1, keepdim=True), None),
    ("max", lambda t: t.max(dim=0).values, None), ("min", lambda t: t.min(dim=2).indices, None),
    ("any", lambda t: (t > 1).any(dim=1), None), ("all", lambda t: (t > -3).all(dim=0), None),
    ("var_mean", lambda t: t.var_mean(dim=1)[0], lambda t: torch.var_mean(t, dim=1)[0]),
    ("std_mean", lambda t: t.std_mean(dim=2)[1], lambda t: torch.std_mean(t, dim=2)[1]),
    ("flip", lambda t: t.flip(dims=(0, 2)), None), ("roll", lambda t: t.roll(2, dims=1), None),
    ("squeeze", lambda t: t[:, :1].squeeze(dim=1), None), ("squeeze_tuple", lambda t: t[:1, :1].squeeze((0, 1, 2)),
                                                          None),
    ("unsqueeze", lambda t: t.unsqueeze(dim=-1), None), ("sort", lambda t: t.sort(dim=0).values, None),
    ("cat", lambda t: t.cat(t, dim=2), lambda t: torch.cat((t, t), dim=2)),
    ("stack", lambda t: t.stack(t, dim=3), lambda t: torch.stack((t, t), dim=3)),
]


@pytest.mark.parametrize("name, ours, theirs", DIM_CALLS, ids=[c[0] for c in DIM_CALLS])
def test_dim_keyword_matches_torch(name, ours, theirs):
    check(ours, theirs, [D], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", ["sum", "mean", "prod", "std", "var", "logsumexp", "softmax", "log_softmax", "cumsum",
                                "cumprod", "cummax", "cummin", "argmax", "argmin", "max", "min", "any", "all",
                                "logcumsumexp", "var_mean", "std_mean"])
def test_axis_and_dim_together_are_an_error(fn):
    with pytest.raises(TypeError, match=rf"{fn}: got both axis=0 and dim=1; pass one of them"):
        getattr(Tensor(D), fn)(axis=0, dim=1)


def test_flip_with_positional_axes_and_dims_is_an_error():
    with pytest.raises(TypeError, match="flip: got both"): Tensor(D).flip(0, dims=1)


@pytest.mark.parametrize("fn", ["sum", "mean", "std", "logsumexp", "any"])
def test_gradient_through_dim_keyword_matches_torch(fn):
    if fn == "any":
        check(lambda t: t.any(dim=(0, 2)), None, [D > 0])
        return
    match_gradient(lambda t: getattr(t, fn)(dim=(0, 2), keepdim=True), lambda t: getattr(t, fn)(dim=(0, 2),
                                                                                               keepdim=True), D)


# ---- unfold puts the window axis last ------------------------------------------------------------------------------

UNFOLD_CASES = [((9,), 0, 3, 2), ((2, 9, 3), 1, 3, 2), ((4, 5), 0, 2, 1), ((4, 5), -1, 5, 1), ((3, 7, 2), -2, 1, 3),
                ((2, 6), 1, 0, 2), ((6, 2, 3), 0, 4, 4)]


@pytest.mark.parametrize("shape, dim, size, step", UNFOLD_CASES)
@pytest.mark.parametrize("dtype", ["int32", "float32", "bool"])
def test_unfold_matches_torchs_layout(shape, dim, size, step, dtype):
    check(lambda t: t.unfold(dim, size, step), None, [sample(shape, dtype, seed=10)])


@pytest.mark.parametrize("shape, dim, size, step", UNFOLD_CASES[:5])
def test_unfold_gradient_matches_torch(shape, dim, size, step):
    match_gradient(lambda t: t.unfold(dim, size, step), lambda t: t.unfold(dim, size, step),
                   sample(shape, "float64", seed=11))


# ---- roll, cat, stack, prod(dtype=), padding modes -----------------------------------------------------------------

@pytest.mark.parametrize("shape, shifts", [((3, 4), 1), ((3, 4), -5), ((2, 3, 2), (7,)), ((5,), 2), ((0, 3), 1),
                                           ((), 3)])
def test_roll_without_dims_rolls_the_flattened_tensor(shape, shifts):
    x = sample(shape, "int32", seed=12)
    check(lambda t: t.roll(shifts), None, [x])
    if x.size: match_gradient(lambda t: t.roll(shifts), lambda t: t.roll(shifts), x)


@pytest.mark.parametrize("fn", ["cat", "stack"])
@pytest.mark.parametrize("form", ["tuple", "list", "tuple_dim_positional", "method", "unbound"])
def test_cat_and_stack_take_torchs_sequence_form(fn, form):
    a, b = sample((2, 3), "float64", seed=13), sample((2, 3), "float64", seed=14)
    theirs = lambda x, y: getattr(torch, fn)((x, y), 1)  # noqa: E731
    ours = {"tuple": lambda x, y: getattr(Tensor, fn)((x, y), dim=1),
            "list": lambda x, y: getattr(Tensor, fn)([x, y], dim=1),
            "tuple_dim_positional": lambda x, y: getattr(Tensor, fn)((x, y), 1),
            "method": lambda x, y: getattr(x, fn)(y, dim=1),
            "unbound": lambda x, y: getattr(Tensor, fn)(x, y, dim=1)}[form]
    check(ours, theirs, [a, b])
    match_gradient(ours, theirs, a, b)


def test_cat_and_stack_reject_an_empty_sequence_and_stack_rejects_two_shapes():
    with pytest.raises(ShapeError, match="cat: got an empty sequence of tensors"): Tensor.cat(())
    with pytest.raises(ShapeError, match=r"stack: shapes \(2,\) and \(3,\) differ"):
        Tensor.stack((Tensor([1, 2]), Tensor([1, 2, 3])))
    with pytest.raises(TypeError, match="cat: after a sequence of tensors, only the axis may follow"):
        Tensor.cat((Tensor([1]),), Tensor([2]))


@pytest.mark.parametrize("dtype, out", [("int32", torch.int32), ("int32", torch.float64), ("float32", torch.float64),
                                        ("uint8", torch.int16), ("float64", torch.float32), ("bool", torch.int64)])
@pytest.mark.parametrize("fn", ["prod", "sum", "cumsum", "cumprod"])
def test_prod_sum_and_scans_with_dtype_match_torch(fn, dtype, out):
    x = sample((3, 4), dtype, low=-3, high=4, seed=15)
    name = str(out).removeprefix("torch.")
    if fn in ("prod", "sum"): check(lambda t: getattr(t, fn)(dtype=name), lambda t: getattr(t, fn)(dtype=out), [x])
    check(lambda t: getattr(t, fn)(1, dtype=name), lambda t: getattr(t, fn)(1, dtype=out), [x])


NEGATIVE_PADS = [((2, 3, 5), (-1, 2)), ((2, 3, 5), (2, -3)), ((2, 3, 5), (-3, 2)), ((2, 3, 5), (1, -1, -1, 2)),
                 ((2, 3, 5), (-2, -2)), ((1, 4, 6), (0, -4, 2, 0)), ((2, 3, 5), (4, -4)), ((2, 3, 5), (-6, 3))]


@pytest.mark.parametrize("shape, pads", NEGATIVE_PADS)
@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_negative_padding_in_modes_crops_as_torch(mode, shape, pads):
    x = distinct(shape, seed=16)
    if mode == "circular" and pads in ((4, -4), (-6, 3)):  # torch reads past the cropped axis here; ember refuses
        with pytest.raises(ShapeError, match="pad: "): Tensor(x).pad(pads, mode=mode)
        return
    try:
        F.pad(torch.from_numpy(x), pads, mode=mode)
    except RuntimeError:
        with pytest.raises(ShapeError, match=f"pad: {mode} padding"): Tensor(x).pad(pads, mode=mode)
        return
    check(lambda t: t.pad(pads, mode=mode), lambda t: F.pad(t, pads, mode=mode), [x])
    match_gradient(lambda t: t.pad(pads, mode=mode), lambda t: F.pad(t, pads, mode=mode), x)


# ---- diag and diagonal ---------------------------------------------------------------------------------------------

DIAGONAL_CASES = [((3, 3), 0, 0, 1), ((3, 5), 1, 0, 1), ((5, 3), -2, 0, 1), ((3, 5), 7, 0, 1), ((2, 3, 4), 0, 1, 2),
                  ((2, 3, 4), -1, 2, 0), ((2, 3, 4, 5), 1, -1, 1), ((4, 4), -4, 1, 0), ((0, 3), 0, 0, 1)]


@pytest.mark.parametrize("shape, offset, dim1, dim2", DIAGONAL_CASES)
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_diagonal_matches_torch(shape, offset, dim1, dim2, dtype):
    check(lambda t: t.diagonal(offset, dim1, dim2), None, [sample(shape, dtype, seed=17)])
    check(lambda t: t.diagonal(offset=offset, dim1=dim1, dim2=dim2), None, [sample(shape, dtype, seed=17)])


@pytest.mark.parametrize("shape, offset, dim1, dim2", DIAGONAL_CASES[:7])
def test_diagonal_gradient_matches_torch(shape, offset, dim1, dim2):
    match_gradient(lambda t: t.diagonal(offset, dim1, dim2), lambda t: t.diagonal(offset, dim1, dim2),
                   distinct(shape, seed=18))


DIAG_CASES = [((4,), 0), ((4,), 2), ((3,), -1), ((1,), 0), ((0,), 2), ((3, 4), 0), ((3, 4), 1), ((4, 3), -2),
              ((3, 4), 5)]


@pytest.mark.parametrize("shape, diagonal", DIAG_CASES)
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_diag_matches_torch(shape, diagonal, dtype):
    check(lambda t: t.diag(diagonal), None, [sample(shape, dtype, seed=19)])


@pytest.mark.parametrize("shape, diagonal", [c for c in DIAG_CASES if 0 not in c[0]])
def test_diag_gradient_matches_torch(shape, diagonal):
    match_gradient(lambda t: t.diag(diagonal), lambda t: t.diag(diagonal), distinct(shape, seed=20))


@pytest.mark.parametrize("call, error, match", [
    (lambda: Tensor([1.0]).diagonal(), ShapeError, r"diagonal: needs at least 2 axes, got \(1,\)"),
    (lambda: Tensor.ones(2, 3).diagonal(0, 1, -1), ShapeError, r"diagonal: dim1 and dim2 name the same axis 1"),
    (lambda: Tensor.ones(2, 2, 2).diag(), ShapeError, r"diag: needs a 1-d or 2-d tensor, got \(2, 2, 2\)"),
])
def test_diag_and_diagonal_errors_name_the_problem(call, error, match):
    with pytest.raises(error, match=match): call()


# ---- axis errors ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, op", [
    (lambda t: t.sum(axis=(0, 0)), "sum"), (lambda t: t.sum(dim=(1, -2)), "sum"), (lambda t: t.mean((0, 0)), "mean"),
    (lambda t: t.flip((0, 0)), "flip"), (lambda t: t.flip(1, -2), "flip"), (lambda t: t.logsumexp((1, 1)), "logsumexp"),
    (lambda t: t.any((2, 2)), "any"), (lambda t: t.squeeze((0, 0)), "squeeze"),
])
def test_an_axis_named_twice_is_an_error_as_in_torch(call, op):
    x = sample((2, 3, 4), "float32")
    with pytest.raises(RuntimeError, match="appears multiple times"): call(torch.from_numpy(x))
    with pytest.raises(ShapeError, match=rf"{op}: axis \d appears more than once in \(.*\); name each axis once"):
        call(Tensor(x))


@pytest.mark.parametrize("call", [lambda t: t.sum(axis=1.0), lambda t: t.max(axis=(0, 1.5)), lambda t: t.mean("0"),
                                  lambda t: t.cumsum(1.0), lambda t: t.argmax(1.0), lambda t: t.flip(0.0)])
def test_a_non_integer_axis_is_a_type_error(call):
    with pytest.raises(TypeError, match=r"\w+: axis must be an int"): call(Tensor.ones(2, 3))


@pytest.mark.parametrize("call", [lambda t: t.sum(2), lambda t: t.max(-3), lambda t: t.flip(5), lambda t: t.cumsum(2),
                                  lambda t: t.diagonal(0, 0, 2), lambda t: t.unsqueeze(3)])
def test_an_axis_out_of_range_is_an_index_error_as_in_torch(call):
    with pytest.raises(IndexError): call(torch.ones(2, 3))
    with pytest.raises(IndexError, match="out of range"): call(Tensor.ones(2, 3))
