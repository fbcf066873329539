"""var, std, logsumexp, softmax, log_softmax, argmax, argmin, any, all against torch (values and gradients)."""

import numpy as np
import pytest
import torch

from ember import Tensor
from ember.errors import ShapeError
from tests.helpers import REDUCE_TOL, check, match_torch_gradient, sample

RNG = np.random.default_rng(11)
A = RNG.standard_normal((5, 7)).astype(np.float32)
B = RNG.standard_normal((3, 4, 6)).astype(np.float32) * 30  # large values: softmax must not overflow

# (name, ember, torch, input)
DIFFERENTIABLE = [
    ("var", lambda x: x.var(1), lambda t: t.var(1), A), ("var_all", lambda x: x.var(), lambda t: t.var(), A),
    ("var_c0_keepdim", lambda x: x.var(0, keepdim=True, correction=0),
     lambda t: t.var(0, keepdim=True, correction=0), A),
    ("std", lambda x: x.std((0, 2)), lambda t: t.std((0, 2)), B), ("std_all", lambda x: x.std(), lambda t: t.std(), A),
    ("logsumexp", lambda x: x.logsumexp(2), lambda t: t.logsumexp(2), B),
    ("logsumexp_keepdim", lambda x: x.logsumexp(0, keepdim=True), lambda t: t.logsumexp(0, keepdim=True), A),
    ("softmax", lambda x: x.softmax(-1), lambda t: t.softmax(-1), B), ("softmax0", lambda x: x.softmax(0),
                                                                       lambda t: t.softmax(0), A),
    ("log_softmax", lambda x: x.log_softmax(1), lambda t: t.log_softmax(1), B),
]


@pytest.mark.parametrize("name, ours, theirs, x", DIFFERENTIABLE, ids=[d[0] for d in DIFFERENTIABLE])
def test_value_and_gradient_match_torch(name, ours, theirs, x):
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    expected = theirs(t)
    weights = np.linspace(-1, 1, expected.numel()).reshape(tuple(expected.shape))
    (expected * torch.tensor(weights)).sum().backward()
    e = Tensor(x)
    out = ours(e)
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=2e-5, atol=1e-5)
    (grad,) = (out * Tensor(weights.astype(np.float32))).sum().gradient(e)
    np.testing.assert_allclose(grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


INDEX_INPUTS = [
    np.array([[1, 3, 3, -1], [np.nan, 2, 5, 5], [0, 0, 0, 0], [-np.inf, -np.inf, -np.inf, -np.inf]], np.float32),
    RNG.integers(-5, 5, (6, 9)).astype(np.int32),
    RNG.integers(-2**31, 2**31 - 1, (4, 3), dtype=np.int64).astype(np.int32),  # extremes: no overflow allowed
]


@pytest.mark.parametrize("x", INDEX_INPUTS, ids=["float_ties_nan", "int32", "int32_extremes"])
@pytest.mark.parametrize("fn", ["argmax", "argmin"])
@pytest.mark.parametrize("axis, keepdim", [(None, False), (0, False), (1, True), (-1, False)])
def test_argmax_argmin_give_torchs_first_index(x, fn, axis, keepdim):
    t = torch.tensor(x)
    expected = getattr(t, fn)() if axis is None else getattr(t, fn)(axis, keepdim=keepdim)
    got = getattr(Tensor(x), fn)(axis, keepdim)
    assert got.dtype.name == "int64" and got.shape == tuple(expected.shape)
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


@pytest.mark.parametrize("x", [A > 0, (A > 2).astype(np.int32), np.zeros((0, 3), bool), np.ones((2, 0), np.float32),
                               (np.arange(24).reshape(3, 8) % 5 == 0).astype(np.int32)])  # (8 columns: a vector)
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_any_all_match_torch(x, axis):
    t = torch.tensor(x)
    for fn in ("any", "all"):
        expected = getattr(t, fn)() if axis is None else getattr(t, fn)(axis)
        got = getattr(Tensor(x), fn)(axis)
        assert got.dtype.name == "bool"
        np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_logsumexp_of_infinite_rows_matches_torch():
    x = np.array([[-np.inf, -np.inf], [1.0, np.inf], [3.0, 4.0]], np.float32)
    np.testing.assert_array_equal(Tensor(x).logsumexp(1).numpy(), torch.tensor(x).logsumexp(1).numpy())


def test_isinf_isfinite_match_numpy():
    x = np.array([1.0, np.inf, -np.inf, np.nan, -0.0], np.float32)
    np.testing.assert_array_equal(Tensor(x).isinf().numpy(), np.isinf(x))
    np.testing.assert_array_equal(Tensor(x).isfinite().numpy(), np.isfinite(x))


def test_argmax_of_an_empty_axis_is_an_error():
    with pytest.raises(ShapeError, match=r"argmax: cannot reduce axis 0 of size 0 in \(0, 3\)"):
        Tensor(np.zeros((0, 3), np.float32)).argmax(0)


_E = np.random.default_rng(12)
_A, _B = _E.standard_normal((3, 4)), _E.standard_normal((4, 5))
_C, _D = _E.standard_normal((2, 3, 4, 4)), _E.standard_normal(5)
EINSUM_CASES = [
    ("ij,jk->ik", _A, _B), ("ij,jk", _A, _B), ("ij->ji", _A), ("ij->", _A),
    ("iijj->", _E.standard_normal((3, 3, 2, 2))),
    ("...ii->...i", _C), ("b...ij,jk->b...ik", _C, _E.standard_normal((4, 6))), ("i,i->", _D, _D), ("i,j->ij", _D, _D),
    ("ij,ij,ij->i", _A, _A, _A), ("bii->bi", _C[0]), ("ii", _C[0, 0]), ("...j,j->...", _C, _E.standard_normal(4)),
    ("bij,bjk->bik", _C[0], _C[1]), ("ij,kj->ik", _A, _E.standard_normal((1, 4))),
]


@pytest.mark.parametrize("case", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum_matches_torch_with_gradients(case):
    formula, *operands = case
    ours = [Tensor(o) for o in operands]
    theirs = [torch.tensor(o, requires_grad=True) for o in operands]
    out, expected = Tensor.einsum(formula, *ours), torch.einsum(formula, *theirs)
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    expected.sum().backward()
    for g, t in zip(out.sum().gradient(*ours), theirs):
        np.testing.assert_allclose(g.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("formula, shapes, fragment", [
    ("ij,jk->ik", [(3, 4), (3, 4)], "label 'j' has sizes"), ("ij->k", [(3, 4)], "must appear in the inputs"),
    ("ij,jk", [(3, 4)], "names 2 operands"), ("ijk", [(3, 4)], "do not match an operand"),
    ("i1", [(3, 4)], "bad subscripts"),
])
def test_einsum_errors_name_the_problem(formula, shapes, fragment):
    with pytest.raises(ShapeError, match=fragment):
        Tensor.einsum(formula, *[Tensor.ones(*s) for s in shapes])


# ---- var_mean, std_mean, logcumsumexp ------------------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")




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
    match_torch_gradient(lambda t: (lambda v, m: v * 2 + m)(*t.var_mean(1)),
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
    match_torch_gradient(lambda t: t.logcumsumexp(1), lambda t: torch.logcumsumexp(t, 1), sample((3, 6), "float64"))


def test_logcumsumexp_rejects_a_bad_axis():
    with pytest.raises(ShapeError, match="logcumsumexp: axis 2 is out of range"): Tensor.zeros(2, 3).logcumsumexp(2)
