"""Derivative code shares its primal: the C++ of a jacobian or hessian calls sin and cos no more than twice as
often as the function's own code, for an RK4 step of a 9-state model, its vmap and a fold of steps (issue 27).

Oracle: the primal's rendered code (its transcendental calls), and torch.func for the values of the vmapped
jacobian. A derivative that recomputed the primal per direction called them once per direction: the vmapped
quadrotor step's jacobian looped over its 16 input columns with the whole reverse sweep in each iteration."""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest
import torch

import ember.ad
from ember import Tensor
from ember.export import Arg, NumericalFunction, render_module
from tests.helpers import scaled_error

# a kernel's call of a sine or cosine: libm's, or ember's float64 ones (renderer/sincos.py), not their definitions
# or the libm fallback inside them
CALLS = re.compile(r"(?:::(?:sin|cos)f?|\bember_(?:sin|cos)_f64(?:x\d+)?)\((?!x\)|x\[i\]|double x|f64x\d+ x)")


STATES = 9  # 9 x 10 jacobian entries a point: more than helpers.UNROLL (64), which a loop over them once took


def rk4_step(z, sin, cos, stack):
    """One RK4 step (h = 0.05) of a ring of STATES pendulum-like states pulled by their neighbours and a shared
    control z[STATES]: ds_i/dt = sin(s_{i-1}) cos(s_i) - 0.1 s_i + u."""
    def slope(s):
        return tuple(sin(s[i - 1]) * cos(s[i]) - 0.1 * s[i] + z[STATES] for i in range(STATES))
    s = tuple(z[i] for i in range(STATES))
    k1 = slope(s)
    k2 = slope(tuple(a + 0.025 * b for a, b in zip(s, k1)))
    k3 = slope(tuple(a + 0.025 * b for a, b in zip(s, k2)))
    k4 = slope(tuple(a + 0.05 * b for a, b in zip(s, k3)))
    return stack([a + 0.05 / 6 * (p + 2 * q + 2 * r + w) for a, p, q, r, w in zip(s, k1, k2, k3, k4)])


def ember_step(z: Tensor) -> Tensor:
    return rk4_step(z, Tensor.sin, Tensor.cos, lambda v: Tensor.stack(*v))


def calls(f: NumericalFunction) -> int:
    return len(CALLS.findall(render_module("m", [f])[1]))


STEP = NumericalFunction("step", ember_step, [Arg(STATES + 1)])
ENERGY = NumericalFunction("energy", lambda z: ember_step(z).square().sum(), [Arg(STATES + 1)])


@pytest.mark.parametrize("name", ["jacobian", "vmap_jacobian", "hessian", "vmap_hessian"])
def test_derivative_code_calls_transcendentals_at_most_twice_as_often_as_the_primal(name: str):
    primal, derivative = {
        "jacobian": (STEP, lambda: ember.ad.jacobian(STEP)),
        "vmap_jacobian": (STEP, lambda: ember.ad.vmap(ember.ad.jacobian(STEP), axis_size=1000)),
        "hessian": (ENERGY, lambda: ember.ad.hessian(ENERGY)),
        "vmap_hessian": (ENERGY, lambda: ember.ad.vmap(ember.ad.hessian(ENERGY), axis_size=1000)),
    }[name]
    assert 0 < calls(derivative()) <= 2 * calls(primal)


def test_a_fold_of_steps_jacobian_calls_transcendentals_at_most_twice_as_often():
    def rollout(s: Tensor, us: Tensor) -> Tensor:
        return ember.ad.fold(lambda st, u: ember_step(Tensor.cat(st, u.reshape(1))), s, us)
    f = NumericalFunction("rollout", rollout, [Arg(STATES), Arg(20)])
    assert calls(ember.ad.jacobian(f, (0, 1))) <= 2 * calls(f)


def test_a_vmapped_jacobian_is_one_loop_with_the_values_of_torch():
    """Its 9 x 10 entries per point are unrolled stores of one loop iteration: a loop over the 10 columns computed
    every entry in each step and selected one (10x the work of the jacobian)."""
    f = ember.ad.vmap(ember.ad.jacobian(STEP), axis_size=512)
    src = render_module("m", [f])[1]
    assert src.count("for (int32_t") == 1  # (the kernels' loops; a scan for NaNs may follow them)
    z = np.random.default_rng(2).standard_normal((512, STATES + 1))
    want = torch.func.vmap(torch.func.jacrev(lambda t: rk4_step(t, torch.sin, torch.cos, torch.stack)))(
        torch.from_numpy(z)).numpy()
    assert scaled_error(f(z), want) < 1e-12


def test_a_reverse_jacobian_through_a_solve_is_one_kernel_computing_the_primal_once():
    """The jacobian of a 6x6 solve (mass matrix from cos/sin of q) by both arguments: 12 inputs, 6 outputs, so
    reverse mode, whose sweep through `c.unsqueeze(0) * c.unsqueeze(1)` sums rows of scalar cotangents. Summed by
    a loop, each step computed every entry of the row and the primal below (10x the sin/cos at n = 5); computed in
    two kernels, the values both read were stored, their sources then too, and so on (206 kernels)."""
    from ember import linalg

    def dynamics(q, rhs, cos, sin, eye, solve):
        c, s = cos(q), sin(q)
        return solve(c[None, :] * c[:, None] + eye * 3 + s[None, :] * s[:, None] * 0.5, rhs)
    n = 6
    f = NumericalFunction("dyn", lambda q, rhs: dynamics(q, rhs, Tensor.cos, Tensor.sin, Tensor.eye(n, dtype=q.dtype),
                                                          linalg.solve), [Arg(n), Arg(n)])
    jac = ember.ad.jacobian(f, argnum=(0, 1))
    assert len(jac.plan.items) == 1
    assert 0 < calls(jac) <= 2 * calls(f)
    q, rhs = np.linspace(0.1, 1.0, n), np.arange(1.0, n + 1)
    want = torch.func.jacrev(lambda a, b: dynamics(a, b, torch.cos, torch.sin, torch.eye(n, dtype=a.dtype),
                                                   torch.linalg.solve), argnums=(0, 1))(torch.tensor(q),
                                                                                        torch.tensor(rhs))
    for got, w in zip(jac(q, rhs), want, strict=True): assert scaled_error(got, w.numpy()) < 1e-12


def shooting_defects(w, intervals: int, sin, cos, join):
    """The continuity defects of the ring model's multiple shooting, laid out as in shooting_lagrangian: next node
    minus RK4 step, joined component by component."""
    n = intervals
    states = [w[i * (n + 1):(i + 1) * (n + 1)] for i in range(STATES)]
    step = rk4_step([*(x[:n] for x in states), w[STATES * (n + 1):]], sin, cos, list)
    return join([x[1:] - s for x, s in zip(states, step, strict=True)])


def shooting_lagrangian(w, lam, intervals: int, sin, cos, join, total):
    """A multiple-shooting Lagrangian written vectorized over the intervals, the way one writes an NLP: w holds each of
    the STATES components of the ring model at the nodes, then the control on each interval; thrust^2 plus lam .
    (next node - RK4 step), the defects joined component by component."""
    n = intervals
    states = [w[i * (n + 1):(i + 1) * (n + 1)] for i in range(STATES)]
    control = w[STATES * (n + 1):]
    step = rk4_step([*(x[:n] for x in states), control], sin, cos, list)
    return total(control * control) + total(lam * join([x[1:] - s for x, s in zip(states, step, strict=True)]))


def test_a_multiple_shooting_hessian_computes_each_interval_once_per_loop_step():
    """The gradient with respect to w is a sum of pieces padded into w's positions (the slices the function read):
    stored stretch by stretch between the pieces' ends (codegen/stores.py), the pieces of all components share one
    loop over the intervals, each step one RK4 step's primal and its tangents. Stored as one loop over w, every
    position computed every piece under gates (a loop of 9 x 21 + 20 steps, each with all nine components' sweeps)."""
    n = 20
    f = NumericalFunction("shoot", lambda w, lam: shooting_lagrangian(w, lam, n, Tensor.sin, Tensor.cos,
                                                                      lambda xs: Tensor.cat(*xs), Tensor.sum),
                          [Arg(STATES * (n + 1) + n), Arg(STATES * n)])
    hess = ember.ad.sphessian(f, argnum=0)
    src = render_module("m", [hess])[1]
    loops = re.findall(r"for \(int32_t \w+ = 0; \w+ < (\d+);", src)
    assert str(n) in loops and str(STATES * (n + 1) + n) not in loops, loops
    assert 0 < len(CALLS.findall(src)) <= 2 * calls(f)
    rng = np.random.default_rng(5)
    w, lam = 0.3 * rng.standard_normal(STATES * (n + 1) + n), rng.standard_normal(STATES * n)
    want = torch.func.hessian(lambda t: shooting_lagrangian(t, torch.tensor(lam), n, torch.sin, torch.cos,
                                                            torch.cat, torch.sum))(torch.tensor(w)).numpy()
    assert scaled_error(hess.to_dense(hess(w, lam)), want) < 1e-12


def test_a_multiple_shooting_jacobians_seeds_are_arithmetic_not_a_table():
    """The defects' rows alternate between two colors from interval to interval, in runs per component: the seeds are
    comparisons and remainders of the row, recomputed where read (kernelize never stores positional arithmetic);
    stored, they were a constant int32 table and every seed a load. Values against torch.func.jacfwd."""
    n = 20
    def cat(xs): return Tensor.cat(*xs)
    f = NumericalFunction("defects", lambda w: shooting_defects(w, n, Tensor.sin, Tensor.cos, cat),
                          [Arg(STATES * (n + 1) + n)])
    jac = ember.ad.spjacobian(f)
    assert not any(b.dtype.is_int and b.size in (STATES * n, STATES * (n + 1) + n) for b in jac.plan.constants)
    w = 0.3 * np.random.default_rng(6).standard_normal(STATES * (n + 1) + n)
    want = torch.func.jacfwd(lambda t: shooting_defects(t, n, torch.sin, torch.cos, torch.cat))(
        torch.tensor(w)).numpy()
    assert scaled_error(jac.to_dense(jac(w)), want) < 1e-12


DIVISIONS = re.compile(r"const double t\d+ = [^;]*/[^;]*;")


def test_a_reverse_jacobian_divides_once_per_division_of_its_primal_whatever_its_seeds():
    """d(a/b) is g * (1/b) and g * -(a/b * (1/b)): the partials' division is the values', shared by every seed's
    sweep. Dividing the cotangent (g / b, and g * (a/b) / b) gave two divisions per division and seed: 3 outputs by
    12 inputs, reverse mode with one sweep per output, and 36 divisions where the primal has 6."""
    def ratios(x):
        return Tensor.stack(*((x[2 * i] / (x[2 * i + 1] + 2)).square() + x[(4 * i + 5) % 12] / (x[i] * x[i] + 1)
                               for i in range(3)))
    f = NumericalFunction("ratios", ratios, [Arg(12)])
    jac = ember.ad.jacobian(f)
    def divisions(g: NumericalFunction) -> int: return len(DIVISIONS.findall(render_module("m", [g])[1]))
    assert 0 < divisions(jac) <= 2 * divisions(f), (divisions(jac), divisions(f))
    x = np.random.default_rng(7).standard_normal(12)
    want = torch.func.jacrev(lambda t: torch.stack([(t[2 * i] / (t[2 * i + 1] + 2)).square() +
                                                    t[(4 * i + 5) % 12] / (t[i] * t[i] + 1) for i in range(3)]))(
        torch.tensor(x)).numpy()
    assert scaled_error(jac(x), want) < 1e-14


def test_a_reverse_sweep_adds_no_structural_zeros():
    """The cotangent of a slice is padded with zeros to its source's shape, and the source's cotangent is the sum of
    its slices': summed as tangent arithmetic (gradient.accumulate) the pads' zeros fold away where codegen sees
    them; IEEE addition kept each (-0.0 + 0.0 is +0.0): 4,775 `+0.0` in the MPC jacobian's C++."""
    n = 20
    def defects(w: Tensor) -> Tensor: return shooting_defects(w, n, Tensor.sin, Tensor.cos, lambda xs: Tensor.cat(*xs))
    f = NumericalFunction("defects", defects, [Arg(STATES * (n + 1) + n)])
    src = render_module("m", [ember.ad.spjacobian(f)])[1]
    assert not re.search(r"[+-]0\.0;|= 0\.0[+-]", src)


def quadrotor_step(z, sin, cos, stack):
    """One RK4 step of examples/quadrotor.py's model from z = (12 states, 4 thrusts)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import quadrotor
    return stack(quadrotor.rk4_step(tuple(z[i] for i in range(12)), tuple(z[12 + j] for j in range(4)), sin, cos))


def float_statements(src: str) -> int:
    return src.count("const double t")


def test_a_reverse_jacobian_drops_the_terms_its_unit_seeds_zero():
    """12 outputs of 16 inputs: reverse mode, one sweep per output. A sweep's cotangent is zero on the other 11
    outputs; its products with partials were IEEE products, kept in the code (0.0 * x: 18 in the 9-state step's
    jacobian, 1843 statements against 1188) and NaN where a partial is inf. Marked as forward mode's tangent
    arithmetic, they fold, and the jacobian is forward mode's whichever mode computes it."""
    f = NumericalFunction("f", lambda z: Tensor.stack(z[0] * z[1], z[2] * z[3], z[0] + z[2]), [Arg(4)])
    jac = ember.ad.jacobian(f)  # 3 x 4: reverse
    src = render_module("m", [jac])[1]
    assert not re.search(r"\b0\.0\*|\*0\.0\b", src)
    z = np.array([2.0, np.inf, 3.0, 5.0])
    want = np.array([[z[1], z[0], 0, 0], [0, 0, z[3], z[2]], [1, 0, 1, 0]])  # d out_i / d z_j, structural zeros 0
    np.testing.assert_array_equal(jac(z), want)  # the interpreter's, then the native code's
    jac.compile()
    np.testing.assert_array_equal(jac(z), want)
    step = render_module("m", [ember.ad.jacobian(STEP)])[1]
    assert not re.search(r"\b0\.0\*|\*0\.0\b", step)


def test_a_vmapped_jacobian_runs_what_one_points_jacobian_does_per_point():
    """The quadrotor step's jacobian has constant entries (a position moves with its velocity: d x' / d v = h).
    Vmapped, those were computed apart from the points, stored as four tables of 12 x 16 and added to every entry
    of every point (3,003 statements a point against 1,899): a padded value computed from positions alone is
    now left to codegen, which folds it into each unrolled entry."""
    step = NumericalFunction("step", lambda z: quadrotor_step(z, Tensor.sin, Tensor.cos, lambda v: Tensor.stack(*v)),
                             [Arg(16)])
    one = render_module("m", [ember.ad.jacobian(step)])[1]
    f = ember.ad.vmap(ember.ad.jacobian(step), axis_size=64)
    many = render_module("m", [f])[1]
    assert "static constexpr" not in many and float_statements(many) <= float_statements(one)
    z = np.concatenate([0.2 * np.sin(np.arange(64 * 12).reshape(64, 12)), np.full((64, 4), 1.2)], axis=1)
    want = torch.func.vmap(torch.func.jacrev(lambda t: quadrotor_step(t, torch.sin, torch.cos, torch.stack)))(
        torch.from_numpy(z)).numpy()
    assert scaled_error(f(z), want) < 1e-13
