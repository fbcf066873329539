"""Linear algebra (ember/mixin/linalg.py, ember.linalg): values against numpy.linalg and torch.linalg, gradients
against torch's autograd, jacobians in NumericalFunctions against torch.func and central differences, for both
forms of the algorithms (a matrix's elements up to SCALAR_LIMIT, whole-matrix steps above it)."""

import numpy as np
import pytest
import torch

import ember.ad
from ember import Tensor, linalg
from ember.errors import DTypeError, ShapeError
from ember.export import Arg, NumericalFunction
from ember.mixin.linalg import SCALAR_LIMIT

SIZES = [1, 5, SCALAR_LIMIT + 3]  # the elements' form, and the steps' form


def rng(seed=0):
    return np.random.default_rng(seed)


def spd(n, batch=(), seed=1):
    a = rng(seed).standard_normal((*batch, n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


@pytest.mark.parametrize("n", SIZES)
def test_solve_matches_numpy_for_matrices_vectors_and_broadcast_batches(n):
    a, b = rng().standard_normal((3, n, n)), rng(2).standard_normal((3, n, 2))
    np.testing.assert_allclose(linalg.solve(Tensor(a), Tensor(b)).numpy(), np.linalg.solve(a, b), rtol=1e-11,
                               atol=1e-11)
    vec = rng(3).standard_normal((3, n))
    np.testing.assert_allclose(linalg.solve(Tensor(a), Tensor(vec)).numpy(), np.linalg.solve(a, vec[..., None])[..., 0],
                               rtol=1e-11, atol=1e-11)
    shared = rng(4).standard_normal((n, 2))  # one right-hand side for the whole batch
    np.testing.assert_allclose(Tensor(a).solve(Tensor(shared)).numpy(), np.linalg.solve(a, shared), rtol=1e-11,
                               atol=1e-11)
    right = rng(5).standard_normal((3, 2, n))
    want = torch.linalg.solve(torch.tensor(a), torch.tensor(right), left=False).numpy()
    np.testing.assert_allclose(linalg.solve(Tensor(a), Tensor(right), left=False).numpy(), want, rtol=1e-11, atol=1e-11)


def test_solve_pivots_where_the_leading_entry_is_zero_and_float32_stays_float32():
    a = np.array([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [3.0, 0.0, 1.0]])  # no LU without a row swap
    b = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(linalg.solve(Tensor(a), Tensor(b)).numpy(), np.linalg.solve(a, b), rtol=1e-14)
    x = linalg.solve(Tensor(a.astype(np.float32)), Tensor(b.astype(np.float32)))
    assert x.dtype.name == "float32"
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(a, b), rtol=1e-5)


@pytest.mark.parametrize("n", SIZES)
def test_inv_det_slogdet_logdet_match_numpy(n):
    a = rng(6).standard_normal((4, n, n))
    np.testing.assert_allclose(linalg.inv(Tensor(a)).numpy(), np.linalg.inv(a), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(linalg.det(Tensor(a)).numpy(), np.linalg.det(a), rtol=1e-11)
    sign, logabs = linalg.slogdet(Tensor(a))
    want_sign, want_logabs = np.linalg.slogdet(a)
    np.testing.assert_array_equal(sign.numpy(), want_sign)
    np.testing.assert_allclose(logabs.numpy(), want_logabs, rtol=1e-12, atol=1e-12)
    want = torch.logdet(torch.tensor(a)).numpy()  # NaN where the determinant is negative
    np.testing.assert_allclose(Tensor(a).logdet().numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [3, SCALAR_LIMIT + 3])
def test_a_singular_matrix_has_determinant_zero_and_log_determinant_minus_infinity(n):
    a = rng(7).standard_normal((n, n))
    a[2] = a[0]  # eliminated exactly: the factor is x / x = 1
    assert Tensor(a).det().item() == 0
    sign, logabs = Tensor(a).slogdet()
    assert sign.item() == 0 and logabs.item() == -np.inf


@pytest.mark.parametrize("n", SIZES)
def test_cholesky_and_cholesky_solve_match_numpy_reading_the_lower_triangle_only(n):
    s = spd(n, (2,))
    lower = np.linalg.cholesky(s)
    garbage = s + np.triu(np.full((n, n), 1e3), 1)  # the upper triangle is not read
    np.testing.assert_allclose(linalg.cholesky(Tensor(garbage)).numpy(), lower, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(Tensor(s).cholesky(upper=True).numpy(), np.swapaxes(lower, -1, -2), rtol=1e-12,
                               atol=1e-12)
    b = rng(8).standard_normal((2, n, 3))
    np.testing.assert_allclose(Tensor(b).cholesky_solve(Tensor(lower)).numpy(), np.linalg.solve(s, b), rtol=1e-11,
                               atol=1e-11)
    upper = np.swapaxes(lower, -1, -2)
    np.testing.assert_allclose(linalg.cholesky_solve(Tensor(b), Tensor(upper), upper=True).numpy(),
                               np.linalg.solve(s, b), rtol=1e-11, atol=1e-11)


def test_cholesky_of_a_matrix_that_is_not_positive_definite_holds_nan():
    assert np.isnan(linalg.cholesky(Tensor(np.array([[1.0, 2.0], [2.0, 1.0]]))).numpy()[1, 1])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular_matches_torch(n, upper, left, unit):
    a = rng(9).standard_normal((2, n, n)) + 3 * np.eye(n)  # the other triangle is not read
    b = rng(10).standard_normal((2, n, 3) if left else (2, 3, n))
    want = torch.linalg.solve_triangular(torch.tensor(a), torch.tensor(b), upper=upper, left=left,
                                         unitriangular=unit).numpy()
    got = linalg.solve_triangular(Tensor(a), Tensor(b), upper=upper, left=left, unitriangular=unit).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("n", [4, SCALAR_LIMIT + 2])
def test_gradients_match_torch(n):
    a, b, s = rng(11).standard_normal((n, n)) + n * np.eye(n), rng(12).standard_normal((n, 2)), spd(n)
    weights = rng(13).standard_normal((n, 2))

    def both(fn, *arrays):
        mine = [Tensor(x, requires_grad=True) for x in arrays]
        fn(linalg, *mine).backward()
        theirs = [torch.tensor(x, requires_grad=True) for x in arrays]
        fn(torch.linalg, *theirs).backward()
        return [(m.grad.numpy(), t.grad.numpy()) for m, t in zip(mine, theirs, strict=True)]

    w = weights
    cases = {
        "solve": both(lambda la, x, y: (la.solve(x, y) * (Tensor(w) if la is linalg else torch.tensor(w))).sum(), a, b),
        "inv": both(lambda la, x: (la.inv(x) ** 2).sum(), a),
        "det": both(lambda la, x: la.det(x), a),
        "slogdet": both(lambda la, x: la.slogdet(x)[1], a),
        "solve_triangular": both(lambda la, x, y: la.solve_triangular(x, y, upper=True).sum(), a, b),
    }
    for name, pairs in cases.items():
        for got, want in pairs:
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=name)
    # cholesky reads one triangle, torch's gradient is symmetric: they agree on symmetric perturbations
    mine = Tensor(s, requires_grad=True)
    (linalg.cholesky(mine) ** 2).sum().backward()
    theirs = torch.tensor(s, requires_grad=True)
    (torch.linalg.cholesky(theirs) ** 2).sum().backward()
    g, t = mine.grad.numpy(), theirs.grad.numpy()
    np.testing.assert_allclose(g + g.T, t + t.T, rtol=1e-9, atol=1e-9)


def torch_dynamics(q, rhs):
    c, s = torch.cos(q), torch.sin(q)
    mass = c[None] * c[:, None] + 3 * torch.eye(len(q), dtype=q.dtype) + 0.5 * s[None] * s[:, None]
    return torch.linalg.solve(mass, rhs)


def dynamics(q, rhs):
    """A configuration-dependent SPD matrix solved against forces: the shape of a robot's forward dynamics."""
    c, s = q.cos(), q.sin()
    mass = c.unsqueeze(0) * c.unsqueeze(1) + Tensor.eye(q.shape[0], dtype=q.dtype) * 3 + s.unsqueeze(0) * s.unsqueeze(
        1) * 0.5
    return linalg.solve(mass, rhs)


@pytest.mark.parametrize("n, argnum", [(7, 0), (4, (0, 1))])  # forward mode; reverse (more inputs than outputs)
def test_a_small_solve_and_its_jacobians_are_one_kernel_each_with_torchs_values(n, argnum):
    f = NumericalFunction("dyn", dynamics, [Arg(n), Arg(n)])
    jac = ember.ad.jacobian(f, argnum=argnum)
    assert len(f.plan.items) == 1 and len(jac.plan.items) == 1
    q, rhs = np.linspace(0.1, 1.0, n), np.arange(1.0, n + 1)
    np.testing.assert_allclose(f(q, rhs), torch_dynamics(torch.tensor(q), torch.tensor(rhs)).numpy(), rtol=1e-14,
                               atol=1e-15)
    want = torch.func.jacrev(torch_dynamics, argnums=(0, 1))(torch.tensor(q), torch.tensor(rhs))
    got = jac(q, rhs)
    for g, w in zip(got if isinstance(argnum, tuple) else [got], want, strict=False):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, atol=1e-13)


def test_a_vmapped_solve_jacobian_matches_central_differences():
    n, points = 4, 50
    jac = ember.ad.jacobian(NumericalFunction("dyn", dynamics, [Arg(n), Arg(n)]), argnum=0)
    many = ember.ad.vmap(jac, in_axes=(0, None), axis_size=points)
    qs, rhs = rng(14).uniform(-1, 1, (points, n)), np.arange(1.0, n + 1)
    got, h = many(qs, rhs), 1e-6
    for p in (0, points - 1):
        at = [torch.tensor(qs[p] + s * h * np.eye(n)) for s in (1, -1)]
        columns = [(torch_dynamics(at[0][k], torch.tensor(rhs)) - torch_dynamics(at[1][k], torch.tensor(rhs))).numpy()
                   / (2 * h) for k in range(n)]
        np.testing.assert_allclose(got[p], np.stack(columns, axis=1), rtol=1e-7, atol=1e-8)


def test_bad_input_names_the_problem():
    with pytest.raises(ShapeError, match="square"): linalg.det(Tensor(np.ones((2, 3))))
    with pytest.raises(ShapeError, match="square"): linalg.inv(Tensor(np.ones(3)))
    with pytest.raises(DTypeError, match="floating-point"): linalg.det(Tensor(np.eye(2, dtype=np.int32)))
    with pytest.raises(ShapeError, match=r"right-hand side \(4,\)"): linalg.solve(Tensor(np.eye(3)), Tensor(np.ones(4)))
    with pytest.raises(ShapeError, match="batch shapes"):
        linalg.solve(Tensor(np.ones((2, 3, 3))), Tensor(np.ones((4, 3, 1))))
    with pytest.raises(ShapeError, match="column axis"):
        linalg.solve_triangular(Tensor(np.eye(3)), Tensor(np.ones(3)), upper=True)
