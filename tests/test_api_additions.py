"""Tests of the tinygrad Tensor names ember added from docs/tinygrad_api_gap.md, against torch (or numpy).

Random constructors are checked for range, shape, dtype and determinism under Tensor.manual_seed; every other name
runs in ember and in torch on the same inputs through tests.helpers.check, and its gradient (where it has one) is
compared with torch's in float64. Argument errors are matched by message.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import Tensor, dtypes
from ember.errors import DTypeError, ShapeError
from tests.helpers import REDUCE_TOL, check, sample

NAN, INF = float("nan"), float("inf")


def match_gradient(ours: Callable[..., Tensor], theirs: Callable[..., torch.Tensor], *arrays: np.ndarray) -> None:
    """In float64, the gradient of a random linear function of the output, for every input, equals torch's."""
    inputs = [np.asarray(a, dtype=np.float64) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in inputs]
    want = theirs(*ts)
    cotangent = np.random.default_rng(7).normal(size=tuple(want.shape))
    (want * torch.from_numpy(cotangent)).sum().backward()
    es = [Tensor(a) for a in inputs]
    grads = (ours(*es) * Tensor(cotangent)).sum().gradient(*es)
    for i, (g, t) in enumerate(zip(grads, ts)):
        want_grad = np.zeros(t.shape) if t.grad is None else t.grad.numpy()  # None: the output does not use it
        np.testing.assert_allclose(g.numpy(), want_grad, rtol=1e-10, atol=1e-12, err_msg=f"gradient of input {i}")


# ---- random constructors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [None, "float64", "float16"])
def test_rand_like_and_randn_like_take_the_shape_and_dtype_of_self(dtype):
    base = Tensor.zeros(3, 50, dtype="float32")
    u, n = base.rand_like(dtype=dtype), base.randn_like(dtype=dtype)
    want = dtypes.float32 if dtype is None else getattr(dtypes, dtype)
    assert u.shape == n.shape == (3, 50) and u.dtype is want and n.dtype is want
    values = u.numpy().astype(np.float64)
    assert values.min() >= 0 and values.max() < 1
    assert abs(n.numpy().astype(np.float64).mean()) < 0.3 and 0.7 < n.numpy().astype(np.float64).std() < 1.3


@pytest.mark.parametrize("make", [lambda: Tensor.ones(4, 5).rand_like(), lambda: Tensor.ones(4, 5).randn_like(),
                                  lambda: Tensor.randperm(20), lambda: Tensor.scaled_uniform(4, 5)],
                         ids=["rand_like", "randn_like", "randperm", "scaled_uniform"])
def test_random_additions_repeat_under_manual_seed(make):
    Tensor.manual_seed(11)
    first = make().numpy()
    Tensor.manual_seed(11)
    np.testing.assert_array_equal(make().numpy(), first)
    Tensor.manual_seed(12)
    assert not np.array_equal(make().numpy(), first)


@pytest.mark.parametrize("n", [0, 1, 7, 300])
def test_randperm_is_a_permutation_of_0_to_n(n):
    Tensor.manual_seed(5)
    p = Tensor.randperm(n)
    assert p.dtype is dtypes.int32 and p.shape == (n,)
    np.testing.assert_array_equal(np.sort(p.numpy()), np.arange(n))


def test_randperm_takes_a_dtype_and_mixes():
    Tensor.manual_seed(6)
    p = Tensor.randperm(50, dtype="int64")
    assert p.dtype is dtypes.int64 and not np.array_equal(p.numpy(), np.arange(50))


def test_scaled_uniform_is_bounded_by_the_inverse_sqrt_of_numel():
    Tensor.manual_seed(8)
    x = Tensor.scaled_uniform(16, 25).numpy()
    assert x.shape == (16, 25) and x.dtype == np.float32
    assert np.abs(x).max() <= 20 ** -1 and np.abs(x).max() > 0.8 * 20 ** -1 and x.min() < 0 < x.max()
    assert Tensor.scaled_uniform(0, 3).shape == (0, 3)


@pytest.mark.parametrize("make, error, match", [
    (lambda: Tensor.randperm(-1), ValueError, "randperm: n must be a non-negative int"),
    (lambda: Tensor([1, 2]).rand_like(), DTypeError, "rand_like: needs a float dtype, got int32"),
    (lambda: Tensor([1, 2]).randn_like(), DTypeError, "randn_like: needs a float dtype, got int32"),
    (lambda: Tensor.scaled_uniform(2, -1), ShapeError, "scaled_uniform: shape sizes must be non-negative"),
])
def test_random_additions_reject_bad_arguments(make, error, match):
    with pytest.raises(error, match=match): make()


# ---- movement ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, dim, sizes", [
    ((3, 4, 1), 1, (2, 2)), ((3, 4, 1), 1, (-1, 2)), ((5, 12, 3), -2, (2, 2, 3, 1, 1)), ((6,), 0, (6,)),
    ((2, 0), 1, (2, -1)), ((4, 6), -1, (3, 1, 2)),
])
def test_unflatten_matches_torch(shape, dim, sizes):
    check(lambda x: x.unflatten(dim, sizes), None, [sample(shape, "float32")])


@pytest.mark.parametrize("shape, dim, sizes, match", [
    ((3, 4), 1, (3, 2), r"unflatten: sizes \(3, 2\) do not multiply to 4, the size of axis 1 of \(3, 4\)"),
    ((3, 4), 1, (-1, 3), r"sizes \(-1, 3\) do not multiply to 4"),
    ((3, 4), 1, (-1, -1), "at most one -1"),
    ((3, 4), 1, (), "non-empty"),
    ((3, 4), 2, (2, 2), "unflatten: axis 2 is out of range"),
    ((), 0, (1,), "unflatten: a 0-d tensor has no axis"),
])
def test_unflatten_rejects_sizes_that_do_not_fit(shape, dim, sizes, match):
    with pytest.raises(ShapeError, match=match): Tensor.zeros(*shape).unflatten(dim, sizes)


def torch_unfold(dim: int, size: int, step: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch's unfold: `dim` becomes the window count, the window axis goes last."""
    return lambda x: x.unfold(dim, size, step)


UNFOLD_CASES = [((8,), 0, 2, 2), ((8,), 0, 3, 1), ((3, 3, 3), -1, 2, 3), ((2, 12), 1, 3, 2), ((2, 12), 1, 12, 1),
                ((5, 4), 0, 2, 3), ((2, 3, 4), 1, 1, 1), ((2, 7), 1, 0, 2)]


@pytest.mark.parametrize("shape, dim, size, step", UNFOLD_CASES)
def test_unfold_matches_torch_with_the_window_axis_last(shape, dim, size, step):
    out = check(lambda x: x.unfold(dim, size, step), torch_unfold(dim, size, step), [sample(shape, "int32")])
    d = dim % len(shape)
    assert out.shape == shape[:d] + ((shape[d] - size) // step + 1,) + shape[d + 1:] + (size,)


def test_unfold_gradient_matches_torch():
    match_gradient(lambda x: x.unfold(1, 3, 2), torch_unfold(1, 3, 2), sample((2, 9, 3), "float64"))


@pytest.mark.parametrize("shape, dim, size, step, match", [
    ((8,), 0, 9, 1, r"unfold: size 9 is larger than axis 0 of \(8,\) \(8\)"),
    ((8,), 0, 2, 0, "unfold: size must be >= 0 and step > 0, got size=2, step=0"),
    ((8,), 0, -1, 1, "size=-1"),
    ((8,), 1, 2, 1, "unfold: axis 1 is out of range"),
    ((), 0, 1, 1, "unfold: a 0-d tensor has no axis"),
])
def test_unfold_rejects_bad_windows(shape, dim, size, step, match):
    with pytest.raises(ShapeError, match=match): Tensor.zeros(*shape).unfold(dim, size, step)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("shapes", [[(3,), (2,)], [(3,), (2,), (4,)], [(3,)], [(), (2,)], [(0,), (2,)]])
def test_meshgrid_matches_torch(shapes, indexing):
    arrays = [sample(s, "int32", seed=i) for i, s in enumerate(shapes)]
    got = Tensor(arrays[0]).meshgrid(*(Tensor(a) for a in arrays[1:]), indexing=indexing)
    want = torch.meshgrid(*(torch.from_numpy(a) for a in arrays), indexing=indexing)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape) and g.dtype.name == "int32"
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_meshgrid_rejects_bad_indexing_and_2d_tensors():
    with pytest.raises(ValueError, match="meshgrid: indexing must be 'ij' or 'xy', got 'ji'"):
        Tensor([1]).meshgrid(Tensor([2]), indexing="ji")
    with pytest.raises(ShapeError, match=r"meshgrid: tensors must be 0-d or 1-d, got \(2, 2\) at position 1"):
        Tensor([1]).meshgrid(Tensor.zeros(2, 2))


# ---- elementwise -------------------------------------------------------------------------------------------------

SIGNED = np.array([-7, -3, -1, 0, 1, 2, 5, 100], dtype=np.int32)
SHIFTS = np.array([0, 1, 2, 3, 4, 5, 30, 1], dtype=np.int32)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "bool"])
@pytest.mark.parametrize("name, oracle", [("bitwise_and", torch.bitwise_and), ("bitwise_or", torch.bitwise_or),
                                          ("bitwise_xor", torch.bitwise_xor)])
def test_named_bitwise_ops_match_torch(name, oracle, dtype):
    a, b = sample((4, 5), dtype, 0, 50, seed=1), sample((5,), dtype, 0, 50, seed=2)
    check(lambda x, y: getattr(x, name)(y), oracle, [a, b])
    check(lambda x, y: getattr(y, name)(x, reverse=True), oracle, [a, b])


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8", "bool"])
def test_bitwise_not_matches_torch(dtype):
    check(lambda x: x.bitwise_not(), torch.bitwise_not, [sample((9,), dtype, -100, 100)])


@pytest.mark.parametrize("name, oracle", [("lshift", torch.bitwise_left_shift),
                                          ("rshift", torch.bitwise_right_shift)])
def test_shifts_match_torch(name, oracle):
    check(lambda x, n: getattr(x, name)(n), oracle, [SIGNED, SHIFTS])
    check(lambda x, n: getattr(n, name)(x, reverse=True), oracle, [SIGNED, SHIFTS])
    check(lambda x: getattr(x, name)(2), lambda x: oracle(x, 2), [np.array([1, 3, 31, 200], np.uint8)])


@pytest.mark.parametrize("name", ["bitwise_and", "bitwise_or", "bitwise_xor", "lshift", "rshift"])
def test_bitwise_ops_reject_floats(name):
    with pytest.raises(DTypeError, match=f"{name}: bitwise ops need bool or integer tensors, got float32"):
        getattr(Tensor([1.0]), name)(1)
    with pytest.raises(DTypeError, match="bitwise_not: needs a bool or integer tensor, got float32"):
        Tensor([1.0]).bitwise_not()


@pytest.mark.parametrize("dtype", ["int32", "float32", "float64"])
def test_mod_is_torch_remainder(dtype):
    a = np.array([-7, 7, -7, 7, 5, -5, 0, 3], dtype=dtype)
    b = np.array([3, 3, -3, -3, 5, 2, 4, -2], dtype=dtype)
    if dtype != "int32": a, b = a + 0.25, b * 1.5
    check(lambda x, y: x.mod(y), torch.remainder, [a, b])
    check(lambda x, y: y.mod(x, reverse=True), torch.remainder, [a, b])
    check(lambda x: x.mod(3), lambda x: torch.remainder(x, 3), [a])


COPYSIGN_A = np.array([-3.0, -0.0, 0.0, 2.0, NAN, INF, 1.5, -INF], dtype=np.float32)
COPYSIGN_B = np.array([1.0, -1.0, -0.0, -NAN, -2.0, -0.0, NAN, 0.0], dtype=np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_copysign_takes_the_sign_bit_as_torch(dtype):
    got = check(lambda x, y: x.copysign(y), torch.copysign, [COPYSIGN_A.astype(dtype), COPYSIGN_B.astype(dtype)])
    want = torch.copysign(torch.from_numpy(COPYSIGN_A.astype(dtype)), torch.from_numpy(COPYSIGN_B.astype(dtype)))
    np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want.numpy()[~np.isnan(got)]))


def test_copysign_of_integers_and_scalars_is_float_as_torch():
    check(lambda x, y: x.copysign(y), torch.copysign, [SIGNED, SIGNED[::-1].copy()])
    check(lambda x: x.copysign(-1), lambda x: torch.copysign(x, torch.tensor(-1.0)), [SIGNED])


def test_copysign_gradient_matches_torch():
    a = np.array([-3.0, 2.0, 1.5, -0.5])
    match_gradient(lambda x: x.copysign(Tensor([1.0, -1.0, -2.0, 3.0], dtype="float64")),
                   lambda x: torch.copysign(x, torch.tensor([1.0, -1.0, -2.0, 3.0], dtype=torch.float64)), a)


def test_softsign_matches_torch_with_its_gradient():
    x = sample((4, 6), "float64", -10, 10)
    check(lambda t: t.softsign(), F.softsign, [x.astype(np.float32)])
    check(lambda t: t.softsign(), lambda t: F.softsign(t.float()), [SIGNED])
    match_gradient(lambda t: t.softsign(), F.softsign, x)


ISCLOSE_A = np.array([1e-7, 1e-8, 1e-9, NAN, INF, INF, 1.0, 100.0, -INF, NAN, 1.0, 0.0], dtype=np.float32)
ISCLOSE_B = np.array([0.0, 0.0, 0.0, NAN, INF, -INF, INF, 100.001, -INF, 1.0, 1.1, -0.0], dtype=np.float32)


@pytest.mark.parametrize("kwargs", [{}, {"equal_nan": True}, {"rtol": 0.2}, {"atol": 0.1, "rtol": 0.0},
                                    {"rtol": 0.0, "atol": 0.0}])
def test_isclose_matches_torch(kwargs):
    check(lambda x, y: x.isclose(y, **kwargs), lambda x, y: torch.isclose(x, y, **kwargs), [ISCLOSE_A, ISCLOSE_B])
    check(lambda x, y: x.isclose(y, **kwargs), lambda x, y: torch.isclose(x, y, **kwargs),
          [ISCLOSE_A.astype(np.float64), ISCLOSE_B[::-1].astype(np.float64)])


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_isclose_of_integers_and_bools_matches_torch(dtype):
    a, b = sample((10,), dtype, -5, 5, seed=3), sample((10,), dtype, -5, 5, seed=4)
    check(lambda x, y: x.isclose(y, rtol=0.5), lambda x, y: torch.isclose(x, y, rtol=0.5), [a, b])


def test_isclose_broadcasts_a_scalar_and_rejects_negative_tolerances():
    check(lambda x: x.isclose(1.0, atol=0.01), lambda x: torch.isclose(x, torch.tensor(1.0), atol=0.01),
          [np.array([0.995, 1.0, 1.02], np.float32)])
    with pytest.raises(ValueError, match="isclose: rtol and atol must be >= 0, got rtol=-1"):
        Tensor([1.0]).isclose(Tensor([1.0]), rtol=-1)


# ---- reductions and scans ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis, keepdim, correction", [(None, False, 1), (0, False, 1), (1, True, 0),
                                                       ((0, 2), False, 2), (-1, True, 1)])
@pytest.mark.parametrize("name", ["var_mean", "std_mean"])
def test_var_mean_and_std_mean_match_torch(name, axis, keepdim, correction):
    x = sample((3, 4, 5), "float32")
    for part in (0, 1):
        check(lambda t, part=part: getattr(t, name)(axis, keepdim, correction)[part],
              lambda t, part=part: getattr(torch, name)(t, dim=axis, keepdim=keepdim, correction=correction)[part],
              [x], **REDUCE_TOL)


def test_var_mean_gradient_matches_torch():
    match_gradient(lambda t: (lambda v, m: v * 2 + m)(*t.var_mean(1)),
                   lambda t: (lambda v, m: v * 2 + m)(*torch.var_mean(t, dim=1)), sample((3, 5), "float64"))


LOGCUMSUMEXP_X = sample((3, 7), "float32", -40, 40)
LOGCUMSUMEXP_X[0, 0], LOGCUMSUMEXP_X[1, 3], LOGCUMSUMEXP_X[2, 6] = -1000.0, -INF, INF


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_logcumsumexp_matches_torch_far_below_the_row_maximum(axis):
    check(lambda t: t.logcumsumexp(axis), lambda t: torch.logcumsumexp(t, axis), [LOGCUMSUMEXP_X], **REDUCE_TOL)


def test_logcumsumexp_of_a_long_axis_is_split_into_blocks_and_matches_torch():
    x = sample((2, 1500), "float64", -30, 30, seed=5)
    x[:, 0] = -500.0
    got = check(lambda t: t.logcumsumexp(1), lambda t: torch.logcumsumexp(t, 1), [x], rtol=1e-12, atol=1e-12)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("shape, axis", [((), 0), ((5,), 0), ((2, 3, 4), 1)])
def test_logcumsumexp_shapes_and_integers_match_torch(shape, axis):
    check(lambda t: t.logcumsumexp(axis), lambda t: torch.logcumsumexp(t, axis), [sample(shape, "float64")])
    check(lambda t: t.logcumsumexp(axis), lambda t: torch.logcumsumexp(t.float(), axis),
          [sample(shape, "int32")], **REDUCE_TOL)


def test_logcumsumexp_gradient_matches_torch():
    match_gradient(lambda t: t.logcumsumexp(1), lambda t: torch.logcumsumexp(t, 1), sample((3, 6), "float64"))


def test_logcumsumexp_rejects_a_bad_axis():
    with pytest.raises(ShapeError, match="logcumsumexp: axis 2 is out of range"): Tensor.zeros(2, 3).logcumsumexp(2)


# ---- neural-network functions ------------------------------------------------------------------------------------


LINEAR_CASES = [  # (x shape, weight shape, ours, torch's): torch's F.linear takes weight (out, in), so it gets w.T
    ((4, 3), (3, 5), lambda x, w, b: x.linear(w, b), lambda x, w, b: F.linear(x, w.T, b)),
    ((2, 4, 3), (3, 5), lambda x, w, b: x.linear(w), lambda x, w, b: F.linear(x, w.T)),
    ((3,), (3, 2), lambda x, w, b: x.linear(w, b), lambda x, w, b: F.linear(x, w.T, b)),
    ((4, 3), (3,), lambda x, w, b: x.linear(w, b), lambda x, w, b: x * w + b),  # a 1-d weight scales elementwise
]


@pytest.mark.parametrize("x_shape, w_shape, ours, theirs", LINEAR_CASES)
def test_linear_is_x_at_weight_plus_bias_with_weight_in_by_out(x_shape, w_shape, ours, theirs):
    x, w, b = sample(x_shape, "float64", seed=1), sample(w_shape, "float64", seed=2), sample(w_shape[-1:], "float64")
    check(ours, theirs, [x, w, b], **REDUCE_TOL)
    match_gradient(ours, theirs, x, w, b)


def test_linear_casts_to_dtype_and_rejects_mismatched_shapes():
    out = Tensor([[1, 2], [3, 4]]).linear(Tensor([[1, 2], [3, 4]]), Tensor([1, 2]), dtype="float32")
    assert out.dtype is dtypes.float32 and out.tolist() == [[8.0, 12.0], [16.0, 24.0]]
    with pytest.raises(ShapeError, match="matmul: inner dimensions differ"):
        Tensor.zeros(4, 3).linear(Tensor.zeros(4, 3))


def test_sequential_applies_the_callables_in_order():
    assert Tensor([1, 2, 3]).sequential([lambda x: x * 2, lambda x: x + 1]).tolist() == [3, 5, 7]
    assert Tensor([1, 2, 3]).sequential([lambda x: x + 1, lambda x: x * 2]).tolist() == [4, 6, 8]
    assert Tensor([1, 2]).sequential([]).tolist() == [1, 2]


PROBS = np.array([0.1, 0.9, 0.2, 0.0, 1.0, 0.5], dtype=np.float32)
BINARY = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 0.3], dtype=np.float32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy_is_torchs_bce(reduction):
    """p = 0 with y = 1 (and p = 1 with y = 0) give torch's clamped 100, not tinygrad's NaN."""
    check(lambda p, y: p.binary_crossentropy(y, reduction), lambda p, y: F.binary_cross_entropy(p, y,
                                                                                                reduction=reduction),
          [PROBS, BINARY], **REDUCE_TOL)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("has_pos_weight", [False, True])
def test_binary_crossentropy_logits_is_torchs_bce_with_logits(reduction, has_pos_weight):
    logits = np.array([[-1.0, 2.0, -3.0], [50.0, -50.0, 0.0]], np.float32)
    y = np.array([[0.0, 1.0, 0.0], [0.0, 1.0, 0.5]], np.float32)
    pw = np.array([2.0, 0.5, 3.0], np.float32)
    check(lambda x, y, w: x.binary_crossentropy_logits(y, reduction, pos_weight=w if has_pos_weight else None),
          lambda x, y, w: F.binary_cross_entropy_with_logits(x, y, reduction=reduction,
                                                             pos_weight=w if has_pos_weight else None),
          [logits, y, pw], **REDUCE_TOL)


def torch_sparse_ce(ignore_index: int, label_smoothing: float, reduction: str) -> Callable[..., torch.Tensor]:
    """torch's cross_entropy with the classes moved from the last axis to axis 1."""
    def oracle(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.movedim(-1, 1) if x.ndim > 2 else x
        return F.cross_entropy(x, y.long(), ignore_index=ignore_index, label_smoothing=label_smoothing,
                               reduction=reduction)
    return oracle


SPARSE_CASES = [((5, 4), [1, 2, -1, 0, 3], -1, 0.0, "mean"), ((5, 4), [1, 2, -1, 0, 3], -1, 0.1, "mean"),
                ((5, 4), [1, 2, 3, 0, 3], 3, 0.2, "sum"), ((5, 4), [1, 2, -1, 0, 3], -1, 0.0, "none"),
                ((2, 3, 4), [[0, 1, 2], [3, -1, 0]], -1, 0.3, "mean"), ((4,), 2, -1, 0.0, "mean")]


@pytest.mark.parametrize("shape, labels, ignore_index, smoothing, reduction", SPARSE_CASES)
def test_sparse_categorical_crossentropy_is_torchs_cross_entropy_with_classes_last(shape, labels, ignore_index,
                                                                                  smoothing, reduction):
    x, y = sample(shape, "float32"), np.array(labels, np.int32)
    check(lambda x, y: x.sparse_categorical_crossentropy(y, ignore_index, smoothing, reduction),
          torch_sparse_ce(ignore_index, smoothing, reduction), [x, y], **REDUCE_TOL)


def test_sparse_categorical_crossentropy_gradient_matches_torch():
    labels = [1, 2, -1, 0]
    match_gradient(lambda x: x.sparse_categorical_crossentropy(Tensor(labels), label_smoothing=0.1),
                   lambda x: torch_sparse_ce(-1, 0.1, "mean")(x, torch.tensor(labels)), sample((4, 3), "float64"))


@pytest.mark.parametrize("call, error, match", [
    (lambda x: x.sparse_categorical_crossentropy(Tensor([0, 1]), label_smoothing=1.5), ValueError,
     r"sparse_categorical_crossentropy: label_smoothing must be in \[0, 1\], got 1.5"),
    (lambda x: x.sparse_categorical_crossentropy(Tensor([0.0, 1.0])), DTypeError,
     "sparse_categorical_crossentropy: labels must be integers, got float32"),
    (lambda x: x.sparse_categorical_crossentropy(Tensor([0, 7])), IndexError, "target 7 is out of bounds for 3"),
    (lambda x: x.sparse_categorical_crossentropy(Tensor([0, 1]), reduction="avg"), ValueError,
     "reduction must be 'mean', 'sum' or 'none'"),
    (lambda x: x.binary_crossentropy(Tensor.zeros(2, 3), reduction="avg"), ValueError,
     "binary_cross_entropy: reduction must be"),
])
def test_losses_reject_bad_arguments(call, error, match):
    with pytest.raises(error, match=match): call(Tensor.zeros(2, 3))


# ---- properties and copies ---------------------------------------------------------------------------------------


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
