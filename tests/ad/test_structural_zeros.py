"""spjacobian and sphessian with structural_zeros=True read a product with a constant zero as CasADi's SX does: zero
whatever the other factor, so the entries it alone reaches leave the pattern (a quadrotor whose inertias about x and
y are equal: (ix - iy) * p * q gave 100 entries of its MPC jacobian that CasADi's pattern does not have).

Oracles: torch.func's dense jacobian and hessian (the pattern is where they are not zero at a generic point, the
values are theirs), and, at an infinite input, the jacobian written by hand with the zero terms left out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember.ad
from ember import Tensor
from ember.export import Arg, NumericalFunction

IX = IY = 4.856e-3  # equal inertias: IX - IY is a constant 0.0


def residual(x, stack):
    return stack([x[0] * x[1] + (IX - IY) * x[2] * x[3], x[1] - x[3] * 0.0 * x[0], x[2] * x[2] + 1.0])


def jacobian_without_zero_terms(x: np.ndarray) -> np.ndarray:
    """By hand: the residual's jacobian with its products with 0.0 left out (torch's jacfwd and jacrev both meet
    0 * inf on the way, as IEEE arithmetic must)."""
    return np.array([[x[1], x[0], 0, 0], [0, 1, 0, 0], [0, 0, 2 * x[2], 0]])


def lagrangian(x):
    return x[0] * x[0] * x[1] + (IX - IY) * x[2] * x[3] * x[3] + x[3].sin()


def dense(sp: ember.ad.SparseFunction, values: np.ndarray) -> np.ndarray:
    return sp.to_dense(np.asarray(values))


def torch_jacobian(f, x: np.ndarray) -> np.ndarray:
    return torch.func.jacrev(lambda t: f(t, torch.stack))(torch.from_numpy(x)).numpy()


F = NumericalFunction("residual", lambda x: residual(x, lambda v: Tensor.stack(*v)), [Arg(4)])


def test_structural_zeros_leave_the_pattern_and_keep_the_values():
    x = np.array([0.3, -1.2, 0.7, 2.1])
    want = torch_jacobian(residual, x)
    ieee, casadi_like = ember.ad.spjacobian(F), ember.ad.spjacobian(F, structural_zeros=True)
    assert ieee.nnz == 8 and casadi_like.nnz == 4  # (0, 2), (0, 3), (1, 0), (1, 3): products with a zero
    np.testing.assert_array_equal(casadi_like.to_dense(np.ones(casadi_like.nnz)) != 0, want != 0)
    for sp in (ieee, casadi_like):
        np.testing.assert_allclose(dense(sp, sp(x)), want, rtol=1e-15, atol=0)
        sp.compile()
        np.testing.assert_allclose(dense(sp, sp(x)), want, rtol=1e-15, atol=0)


def test_a_product_of_a_structural_zero_with_inf_is_zero():
    """x[2] = inf: IEEE's d/dx3 of 0.0 * x2 * x3 is 0 * inf, NaN; read structurally it is no term at all."""
    x = np.array([0.3, -1.2, np.inf, 2.1])
    want = jacobian_without_zero_terms(x)
    casadi_like = ember.ad.spjacobian(F, structural_zeros=True)
    casadi_like.compile()
    np.testing.assert_array_equal(dense(casadi_like, casadi_like(x)), want)
    ieee = ember.ad.spjacobian(F)
    assert np.isnan(dense(ieee, ieee(x))[0, 3])


def test_the_hessian_of_a_structural_zero_term_has_no_entries():
    f = NumericalFunction("lagrangian", lagrangian, [Arg(4)])
    x = np.array([0.3, -1.2, 0.7, 2.1])
    want = torch.func.hessian(lagrangian)(torch.from_numpy(x)).numpy()
    ieee, casadi_like = ember.ad.sphessian(f), ember.ad.sphessian(f, structural_zeros=True)
    assert casadi_like.nnz < ieee.nnz
    np.testing.assert_array_equal(casadi_like.to_dense(np.ones(casadi_like.nnz)) != 0, want != 0)
    for sp in (ieee, casadi_like):
        sp.compile()
        np.testing.assert_allclose(dense(sp, sp(x)), want, rtol=1e-15, atol=0)


def test_structural_zeros_must_be_a_bool():
    with pytest.raises(TypeError, match="structural_zeros must be True or False"):
        ember.ad.spjacobian(F, structural_zeros="yes")
    with pytest.raises(TypeError, match="structural_zeros must be True or False"):
        ember.ad.sphessian(NumericalFunction("lagrangian", lagrangian, [Arg(4)]), structural_zeros=1)
