"""The models of bench/numerical.py, each written once per framework: ember (NumericalFunctions and what they are),
CasADi (an SX or mapped Function) and JAX (a function to jit), with their inputs and sizes. numerical.py measures
them (its docstring lists the cases)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

STEPS = 10  # cart-pole RK4 steps
BRATU_SIZE, BRATU_LAMBDA = 1000, 1.0
ROSENBROCK_SIZE = 100
GRID_SIZE = 50  # 2-D Bratu: a GRID_SIZE x GRID_SIZE grid of unknowns
CUBE_SIZE = 5  # 3-D Bratu: a CUBE_SIZE^3 grid of unknowns (its sparse jacobian took 102 s to build, issue 26)
QUADROTOR_STEPS = 20  # lower it for a quick check of f-eval and f-jac
SWINGUP_INTERVALS, SWINGUP_TIME = 50, 2.5  # s
PENDULUM_GRAVITY, PENDULUM_DAMPING = 9.81, 0.1  # g / l in 1/s^2, damping in 1/s
MPC_INTERVALS = 50  # cases m-jac and m-hess: RK4 intervals of the quadrotor's multiple shooting
VMAP_POINTS, VMAP_THREADS = 100_000, 2  # case v: points, and the threads of ember's C++ (CasADi's map is serial)
STEP_POINTS = 1000  # case q: quadrotor states at which one RK4 step's jacobian is taken


def cartpole_inputs() -> list[np.ndarray]:
    return [np.array([0.0, 0.0, 0.2, 0.0]), 2.0 * np.cos(np.linspace(0.0, np.pi, STEPS))]


def vmap_inputs() -> list[np.ndarray]:
    """VMAP_POINTS cart-pole states and forces, one row per point."""
    k = np.arange(VMAP_POINTS)
    return [0.3 * np.sin(0.37 * k[:, None] + np.arange(4)), 2.0 * np.cos(0.11 * k)]


def ember_vmap() -> tuple[list[Any], str]:
    """The 4x4 jacobian of one cart-pole RK4 step by the state, vmapped over the points."""
    import cartpole

    import ember.ad
    from ember import Tensor
    from ember.export import Arg, NumericalFunction

    def stage(state: Tensor, force: Tensor) -> Tensor:
        return Tensor.stack(*cartpole.rk4_step(tuple(state[i] for i in range(4)), force, Tensor.sin, Tensor.cos))
    step = NumericalFunction("stage", stage, [Arg(4), Arg(())])
    return [ember.ad.vmap(ember.ad.jacobian(step), axis_size=VMAP_POINTS)], \
        f"vmap(jacobian) over {VMAP_POINTS} points; C++ on {VMAP_THREADS} threads"


def casadi_vmap(ca: Any) -> Any:
    """The same jacobian as an SX function mapped serially (CasADi's map(N, 'serial')): 4 x N states and 1 x N
    forces in, each point's jacobian as 16 entries (row by row) of a 16 x N result."""
    import cartpole
    x, u = ca.SX.sym("x", 4), ca.SX.sym("u")
    out = ca.vertcat(*cartpole.rk4_step(tuple(x[i] for i in range(4)), u, ca.sin, ca.cos))
    point = ca.Function("point", [x, u], [ca.reshape(ca.jacobian(out, x).T, 16, 1)])
    return point.map(VMAP_POINTS, "serial")


def jax_vmap(jax: Any, jnp: Any) -> Callable[..., Any]:
    import cartpole

    def stage(state: Any, force: Any) -> Any:
        return jnp.stack(cartpole.rk4_step(tuple(state[i] for i in range(4)), force, jnp.sin, jnp.cos))
    return jax.vmap(jax.jacfwd(stage))


def step_inputs() -> list[np.ndarray]:
    """STEP_POINTS quadrotor states and thrusts near hover, one row of 16 (12 states, 4 thrusts) per point."""
    import quadrotor
    k = np.arange(STEP_POINTS)[:, None]
    states = 0.2 * np.sin(0.37 * k + np.arange(quadrotor.STATE_SIZE))
    return [np.concatenate([states, 1.2 + 0.1 * np.cos(0.11 * k + np.arange(quadrotor.CONTROL_SIZE))], axis=1)]


def quadrotor_step(point: Any, sin: Callable[[Any], Any], cos: Callable[[Any], Any]) -> list[Any]:
    """The 12 states after one RK4 step of the quadrotor from point = (state, thrusts)."""
    import quadrotor
    n = quadrotor.STATE_SIZE
    return list(quadrotor.rk4_step(tuple(point[i] for i in range(n)),
                                   tuple(point[n + j] for j in range(quadrotor.CONTROL_SIZE)), sin, cos))


def ember_step_jacobian() -> tuple[list[Any], str]:
    """The 12 x 16 jacobian of one quadrotor RK4 step by (state, thrusts), ember.ad.vmap over the points."""
    import quadrotor

    import ember.ad
    from ember import Tensor
    from ember.export import Arg, NumericalFunction
    size = quadrotor.STATE_SIZE + quadrotor.CONTROL_SIZE
    step = NumericalFunction("step", lambda z: Tensor.stack(*quadrotor_step(z, Tensor.sin, Tensor.cos)), [Arg(size)])
    return [ember.ad.vmap(ember.ad.jacobian(step), axis_size=STEP_POINTS)], \
        f"vmap(jacobian) over {STEP_POINTS} points, one thread"


def casadi_step_jacobian(ca: Any) -> Any:
    """The same jacobian as an SX function mapped serially: 16 x N points in, each point's jacobian as 192 entries
    (row by row) of a 192 x N result."""
    import quadrotor
    size = quadrotor.STATE_SIZE + quadrotor.CONTROL_SIZE
    z = ca.SX.sym("z", size)
    out = ca.vertcat(*quadrotor_step(z, ca.sin, ca.cos))
    point = ca.Function("point", [z], [ca.reshape(ca.jacobian(out, z).T, quadrotor.STATE_SIZE * size, 1)])
    return point.map(STEP_POINTS, "serial")


def jax_step_jacobian(jax: Any, jnp: Any) -> Callable[..., Any]:
    return jax.vmap(jax.jacfwd(lambda z: jnp.stack(quadrotor_step(z, jnp.sin, jnp.cos))))


def ember_cartpole(with_jacobians: bool) -> tuple[list[Any], str]:
    import cartpole
    fns = cartpole.build_functions(STEPS, with_jacobians)
    if not with_jacobians: return fns, "rollout"
    return [cartpole.with_jacobians(fns)], "one function: rollout, jacobian(argnum=(0, 1))"


def casadi_cartpole(ca: Any, with_jacobians: bool) -> Any:
    import cartpole
    state, controls = ca.SX.sym("state", 4), ca.SX.sym("controls", STEPS)
    final = ca.vertcat(*cartpole.simulate(tuple(state[i] for i in range(4)), [controls[k] for k in range(STEPS)],
                                          ca.sin, ca.cos))
    outs = [final, ca.jacobian(final, state), ca.jacobian(final, controls)] if with_jacobians else [final]
    return ca.Function("cartpole", [state, controls], outs)


def jax_cartpole(jax: Any, jnp: Any, with_jacobians: bool) -> Callable[..., Any]:
    """The rollout as a lax.scan over the controls: JAX's idiom for a loop. The unrolled Python loop (as ember and
    CasADi trace it) compiles in 20 s with jacobians and runs 4 to 10 times slower on XLA's CPU backend."""
    import cartpole

    def step(state: Any, force: Any) -> tuple[Any, None]:
        return jnp.stack(cartpole.rk4_step(tuple(state[i] for i in range(4)), force, jnp.sin, jnp.cos)), None

    def rollout(state: Any, controls: Any) -> Any: return jax.lax.scan(step, state, controls)[0]
    if not with_jacobians: return rollout
    return lambda state, controls: (rollout(state, controls), *jax.jacrev(rollout, argnums=(0, 1))(state, controls))


def bratu_terms(x: Any, left: Any, right: Any, exp: Callable[[Any], Any]) -> Any:
    """F_i = x_{i-1} - 2 x_i + x_{i+1} + h^2 lambda exp(x_i), with x_0 = x_{n+1} = 0 (left, right: the shifts)."""
    h = 1.0 / (BRATU_SIZE + 1)
    return left - 2.0 * x + right + h * h * BRATU_LAMBDA * exp(x)


def ember_bratu() -> tuple[list[Any], str]:
    import ember.ad
    from ember import Tensor
    from ember.export import Arg, NumericalFunction
    n = BRATU_SIZE
    f = NumericalFunction("bratu", lambda x: bratu_terms(x, x.pad((1, 0))[:n], x.pad((0, 1))[1:], Tensor.exp),
                          [Arg(n)])
    if hasattr(ember.ad, "spjacobian"): return [ember.ad.spjacobian(f)], "sparse: ember.ad.spjacobian"
    return [ember.ad.jacobian(f)], "dense: ember.ad.jacobian (no ember.ad.spjacobian)"


def casadi_bratu(ca: Any) -> Any:
    x = ca.SX.sym("x", BRATU_SIZE)
    residual = bratu_terms(x, ca.vertcat(0, x[:-1]), ca.vertcat(x[1:], 0), ca.exp)
    return ca.Function("bratu", [x], [ca.jacobian(residual, x)])


def jax_bratu(jax: Any, jnp: Any) -> Callable[..., Any]:
    return jax.jacfwd(lambda x: bratu_terms(x, jnp.pad(x[:-1], (1, 0)), jnp.pad(x[1:], (0, 1)), jnp.exp))


def rosenbrock_terms(head: Any, tail: Any) -> Any:
    return 100.0 * (tail - head * head) ** 2 + (1.0 - head) ** 2


def ember_rosenbrock() -> tuple[list[Any], str]:
    import ember.ad
    from ember.export import Arg, NumericalFunction
    f = NumericalFunction("rosenbrock", lambda x: rosenbrock_terms(x[:-1], x[1:]).sum(), [Arg(ROSENBROCK_SIZE)])
    if hasattr(ember.ad, "sphessian"): return [ember.ad.sphessian(f)], "sparse: ember.ad.sphessian"
    return [ember.ad.hessian(f)], "dense: ember.ad.hessian (no ember.ad.sphessian)"


def casadi_rosenbrock(ca: Any) -> Any:
    x = ca.SX.sym("x", ROSENBROCK_SIZE)
    return ca.Function("rosenbrock", [x], [ca.hessian(ca.sum1(rosenbrock_terms(x[:-1], x[1:])), x)[0]])


def jax_rosenbrock(jax: Any, jnp: Any) -> Callable[..., Any]:
    return jax.hessian(lambda x: jnp.sum(rosenbrock_terms(x[:-1], x[1:])))


def ember_energy() -> tuple[list[Any], str]:
    from ember.export import Arg, NumericalFunction
    return [NumericalFunction("energy", lambda x: (0.5 * x ** 2).sum(), [Arg(3)])], "energy"


def bratu2d_terms(x: Any, up: Any, down: Any, left: Any, right: Any, exp: Callable[[Any], Any]) -> Any:
    """F_ij = the 5-point Laplacian of x (neighbours as shifted grids, zero beyond the edge) + h^2 lambda exp(x_ij)."""
    h = 1.0 / (GRID_SIZE + 1)
    return up + down + left + right - 4.0 * x + h * h * BRATU_LAMBDA * exp(x)


def ember_bratu2d() -> tuple[list[Any], str]:
    import ember.ad
    from ember import Tensor
    from ember.export import Arg, NumericalFunction
    n = GRID_SIZE

    def residual(x: Tensor) -> Tensor:
        return bratu2d_terms(x, x.pad(((1, 0), (0, 0)))[:n], x.pad(((0, 1), (0, 0)))[1:],
                             x.pad(((0, 0), (1, 0)))[:, :n], x.pad(((0, 0), (0, 1)))[:, 1:], Tensor.exp)
    return [ember.ad.spjacobian(NumericalFunction("bratu2d", residual, [Arg((n, n))]))], "sparse: ember.ad.spjacobian"


def casadi_bratu2d(ca: Any) -> Any:
    """The grid as an n x n SX matrix; the jacobian of the row-major flattened residual by the row-major flattened
    grid (CasADi flattens column by column), as ember's."""
    n = GRID_SIZE
    x, rows, cols = ca.SX.sym("x", n, n), ca.SX.zeros(1, n), ca.SX.zeros(n, 1)
    residual = bratu2d_terms(x, ca.vertcat(rows, x[:-1, :]), ca.vertcat(x[1:, :], rows), ca.horzcat(cols, x[:, :-1]),
                             ca.horzcat(x[:, 1:], cols), ca.exp)
    return ca.Function("bratu2d", [x], [ca.jacobian(ca.vec(residual.T), ca.vec(x.T))])


def jax_bratu2d(jax: Any, jnp: Any) -> Callable[..., Any]:
    return jax.jacfwd(lambda x: bratu2d_terms(x, jnp.pad(x[:-1], ((1, 0), (0, 0))), jnp.pad(x[1:], ((0, 1), (0, 0))),
                                              jnp.pad(x[:, :-1], ((0, 0), (1, 0))), jnp.pad(x[:, 1:], ((0, 0), (0, 1))),
                                              jnp.exp))


def cube_shifts(x: Any, pad: Callable[[Any, tuple[tuple[int, int], ...]], Any]) -> list[Any]:
    """The six neighbours of every point of an n x n x n grid, zero beyond its faces, as shifted grids."""
    n, out = CUBE_SIZE, []
    for axis in range(3):
        for width, cut in (((1, 0), slice(0, n)), ((0, 1), slice(1, n + 1))):
            widths, cuts = [(0, 0)] * 3, [slice(None)] * 3
            widths[axis], cuts[axis] = width, cut
            out.append(pad(x, tuple(widths))[tuple(cuts)])
    return out


def bratu3d_terms(x: Any, neighbours: Sequence[Any], exp: Callable[[Any], Any]) -> Any:
    """F = the 7-point Laplacian of x + h^2 lambda exp(x)."""
    h = 1.0 / (CUBE_SIZE + 1)
    return sum(neighbours[1:], neighbours[0]) - 6.0 * x + h * h * BRATU_LAMBDA * exp(x)


def ember_bratu3d() -> tuple[list[Any], str]:
    import ember.ad
    from ember import Tensor
    from ember.export import Arg, NumericalFunction
    f = NumericalFunction("bratu3d", lambda x: bratu3d_terms(x, cube_shifts(x, Tensor.pad), Tensor.exp),
                          [Arg((CUBE_SIZE,) * 3)])
    return [ember.ad.spjacobian(f)], "sparse: ember.ad.spjacobian"


def casadi_bratu3d(ca: Any) -> Any:
    """The grid as a row-major vector; each point's residual from its neighbours' entries (zero beyond the faces)."""
    n = CUBE_SIZE
    x = ca.SX.sym("x", n ** 3)

    def at(i: int, j: int, k: int) -> Any:
        return x[(i * n + j) * n + k] if 0 <= min(i, j, k) and max(i, j, k) < n else 0
    moves = ((-1, 0, 0), (1, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, -1), (0, 0, 1))
    residual = ca.vertcat(*(bratu3d_terms(at(i, j, k), [at(i + a, j + b, k + c) for a, b, c in moves], ca.exp)
                            for i in range(n) for j in range(n) for k in range(n)))
    return ca.Function("bratu3d", [x], [ca.jacobian(residual, x)])


def jax_bratu3d(jax: Any, jnp: Any) -> Callable[..., Any]:
    def residual(x: Any) -> Any: return bratu3d_terms(x, cube_shifts(x, jnp.pad), jnp.exp).reshape(-1)
    return jax.jacfwd(residual)


def quadrotor_inputs() -> list[np.ndarray]:
    import quadrotor
    return list(quadrotor.start_and_controls(QUADROTOR_STEPS))


def ember_quadrotor(with_jacobians: bool) -> tuple[list[Any], str]:
    import quadrotor
    fns = quadrotor.build_functions(QUADROTOR_STEPS, with_jacobians)
    if not with_jacobians: return fns, "rollout"
    return [quadrotor.with_jacobians(fns)], "one function: rollout, jacobian(argnum=(0, 1))"


def casadi_quadrotor(ca: Any, with_jacobians: bool) -> Any:
    """controls is a steps x 4 SX matrix; its jacobian is by the row-major flattened controls, as ember's."""
    import quadrotor
    state, controls = ca.SX.sym("state", quadrotor.STATE_SIZE), ca.SX.sym("controls", QUADROTOR_STEPS, 4)
    rows = [[controls[k, j] for j in range(4)] for k in range(QUADROTOR_STEPS)]
    final = ca.vertcat(*quadrotor.simulate(tuple(state[i] for i in range(quadrotor.STATE_SIZE)), rows, ca.sin, ca.cos))
    outs = [final, ca.jacobian(final, state), ca.jacobian(final, ca.vec(controls.T))] if with_jacobians else [final]
    return ca.Function("quadrotor", [state, controls], outs)


def jax_quadrotor(jax: Any, jnp: Any, with_jacobians: bool) -> Callable[..., Any]:
    """The rollout as a lax.scan over the rows of controls, as jax_cartpole's."""
    import quadrotor

    def step(state: Any, thrusts: Any) -> tuple[Any, None]:
        return jnp.stack(quadrotor.rk4_step(tuple(state[i] for i in range(quadrotor.STATE_SIZE)),
                                            tuple(thrusts[j] for j in range(4)), jnp.sin, jnp.cos)), None

    def rollout(state: Any, controls: Any) -> Any: return jax.lax.scan(step, state, controls)[0]
    if not with_jacobians: return rollout
    return lambda state, controls: (rollout(state, controls), *jax.jacrev(rollout, argnums=(0, 1))(state, controls))


def swingup_lagrangian(w: Any, lam: Any, sin: Callable[[Any], Any], total: Callable[[Any], Any]) -> Any:
    """objective + lam . constraints of the pendulum swing-up in multiple shooting: w = (angle at the N + 1 nodes,
    rate at the nodes, torque on each of the N intervals), angle 0 hanging down; the dynamics angle' = rate,
    rate' = torque - g/l sin(angle) - damping rate, one RK4 step per interval. Objective: sum of torque^2 dt.
    Constraints (lam in this order): the N angle defects, the N rate defects (next node - RK4 step), then angle and
    rate at the start (0, 0) and at the end (pi, 0)."""
    n, dt = SWINGUP_INTERVALS, SWINGUP_TIME / SWINGUP_INTERVALS
    angle, rate, torque = w[:n + 1], w[n + 1:2 * n + 2], w[2 * n + 2:]

    def slope(a: Any, r: Any) -> tuple[Any, Any]:
        return r, torque - PENDULUM_GRAVITY * sin(a) - PENDULUM_DAMPING * r
    a, r = angle[:n], rate[:n]
    k1 = slope(a, r)
    k2 = slope(a + dt / 2 * k1[0], r + dt / 2 * k1[1])
    k3 = slope(a + dt / 2 * k2[0], r + dt / 2 * k2[1])
    k4 = slope(a + dt * k3[0], r + dt * k3[1])
    step_a, step_r = ((x + dt / 6 * (p + 2 * q + 2 * s + t)) for x, p, q, s, t in zip((a, r), k1, k2, k3, k4,
                                                                                       strict=True))
    boundary = (angle[0], rate[0], angle[n] - np.pi, rate[n])
    constraints = total(lam[:n] * (angle[1:] - step_a)) + total(lam[n:2 * n] * (rate[1:] - step_r))
    return total(torque * torque) * dt + constraints + sum(lam[2 * n + i] * b for i, b in enumerate(boundary))


def swingup_inputs() -> list[np.ndarray]:
    """Unknowns on the way up (angle 0 to pi, a constant rate, a torque wave) and some multipliers."""
    n = SWINGUP_INTERVALS
    w = np.concatenate([np.linspace(0.0, np.pi, n + 1), np.full(n + 1, np.pi / SWINGUP_TIME),
                        2.0 * np.sin(np.linspace(0.0, 2 * np.pi, n))])
    return [w, 0.1 * np.cos(np.arange(2 * n + 4))]


def ember_swingup() -> tuple[list[Any], str]:
    import ember.ad
    from ember import Tensor
    from ember.export import Arg, NumericalFunction
    n = SWINGUP_INTERVALS
    lagrangian = NumericalFunction("swingup", lambda w, lam: swingup_lagrangian(w, lam, Tensor.sin, Tensor.sum),
                                   [Arg(3 * n + 2), Arg(2 * n + 4)])
    return [ember.ad.sphessian(lagrangian, argnum=0)], "sparse: ember.ad.sphessian(argnum=0)"


def casadi_swingup(ca: Any) -> Any:
    n = SWINGUP_INTERVALS
    w, lam = ca.SX.sym("w", 3 * n + 2), ca.SX.sym("lam", 2 * n + 4)
    return ca.Function("swingup", [w, lam], [ca.hessian(swingup_lagrangian(w, lam, ca.sin, ca.sum1), w)[0]])


def jax_swingup(jax: Any, jnp: Any) -> Callable[..., Any]:
    return lambda w, lam: jax.hessian(lambda w: swingup_lagrangian(w, lam, jnp.sin, jnp.sum))(w)


CHAIN_LINKS = 7  # case p: links of the planar pendulum chain
CHAIN_MASSES, CHAIN_LENGTHS = np.linspace(1.0, 0.4, CHAIN_LINKS), np.linspace(0.5, 0.3, CHAIN_LINKS)


def chain_mass_scale() -> np.ndarray:
    """mu[i, j] = l_i l_j (sum of the masses at or beyond link max(i, j)): M[i, j] = mu[i, j] cos(a_i - a_j)."""
    beyond = np.cumsum(CHAIN_MASSES[::-1])[::-1]
    return np.outer(CHAIN_LENGTHS, CHAIN_LENGTHS) * beyond[np.maximum.outer(np.arange(CHAIN_LINKS),
                                                                          np.arange(CHAIN_LINKS))]


def chain_terms(angle: Sequence[Any], rate: Sequence[Any], torque: Sequence[Any], sin: Callable[[Any], Any],
                cos: Callable[[Any], Any]) -> tuple[list[list[Any]], list[Any]]:
    """The mass matrix (rows of scalars) and the right-hand side of M angle'' = torque - c - g for a planar chain of
    point masses at the links' ends, each angle from the downward vertical: c_i = sum_j mu[i, j] sin(a_i - a_j)
    a_j'^2 (centrifugal), g_i = 9.81 l_i (masses at or beyond i) sin(a_i)."""
    n, mu = CHAIN_LINKS, chain_mass_scale()
    beyond = np.cumsum(CHAIN_MASSES[::-1])[::-1]
    mass = [[float(mu[i, j]) * cos(angle[i] - angle[j]) for j in range(n)] for i in range(n)]
    rhs = []
    for i in range(n):
        total = torque[i] - 9.81 * float(CHAIN_LENGTHS[i] * beyond[i]) * sin(angle[i])
        for j in range(n):
            if j != i: total = total - float(mu[i, j]) * sin(angle[i] - angle[j]) * rate[j] * rate[j]
        rhs.append(total)
    return mass, rhs


def chain_inputs() -> list[np.ndarray]:
    n = CHAIN_LINKS
    return [0.3 * np.sin(np.arange(1.0, n + 1)), 0.5 * np.cos(np.arange(1.0, n + 1)), 0.1 * np.arange(n) - 0.2]


def ember_chain() -> tuple[list[Any], str]:
    import ember.ad
    from ember import Tensor
    from ember.export import Arg, NumericalFunction

    def accel(angle: Tensor, rate: Tensor, torque: Tensor) -> Tensor:
        n = CHAIN_LINKS
        mass, rhs = chain_terms([angle[i] for i in range(n)], [rate[i] for i in range(n)],
                                [torque[i] for i in range(n)], Tensor.sin, Tensor.cos)
        matrix = Tensor.stack(*[Tensor.stack(*row) for row in mass])  # symmetric positive-definite
        return Tensor.stack(*rhs).unsqueeze(-1).cholesky_solve(matrix.cholesky())[:, 0]
    f = NumericalFunction("chain", accel, [Arg(CHAIN_LINKS)] * 3)
    by_angle, by_rate = ember.ad.jacobian(f, argnum=0), ember.ad.jacobian(f, argnum=1)
    both = NumericalFunction("chain_jac", lambda a, r, t: (f(a, r, t), by_angle(a, r, t), by_rate(a, r, t)), f.args)
    return [both], "one function: cholesky_solve(cholesky), jacobian(argnum=0), jacobian(argnum=1)"


def casadi_chain(ca: Any) -> Any:
    n = CHAIN_LINKS
    angle, rate, torque = (ca.SX.sym(s, n) for s in ("angle", "rate", "torque"))
    mass, rhs = chain_terms([angle[i] for i in range(n)], [rate[i] for i in range(n)], [torque[i] for i in range(n)],
                            ca.sin, ca.cos)
    accel = ca.solve(ca.vertcat(*[ca.horzcat(*row) for row in mass]), ca.vertcat(*rhs))
    return ca.Function("chain", [angle, rate, torque], [accel, ca.jacobian(accel, angle), ca.jacobian(accel, rate)])


def jax_chain(jax: Any, jnp: Any) -> Callable[..., Any]:
    def accel(angle: Any, rate: Any, torque: Any) -> Any:
        mass, rhs = chain_terms(angle, rate, torque, jnp.sin, jnp.cos)
        return jnp.linalg.solve(jnp.stack([jnp.stack(row) for row in mass]), jnp.stack(rhs))
    return lambda a, r, t: (accel(a, r, t), *jax.jacfwd(accel, argnums=(0, 1))(a, r, t))


def mpc_defects(w: Any, sin: Callable[[Any], Any], cos: Callable[[Any], Any], join: Callable[[list[Any]], Any]) -> Any:
    """The continuity defects of the quadrotor's (examples/quadrotor.py) multiple shooting over MPC_INTERVALS RK4
    steps: w holds each of the 12 state components at the N + 1 nodes, then each of the 4 thrusts on the N intervals
    (a vector per component, as one writes the steps vectorized over the intervals); the defects (next node minus
    the RK4 step from the node before) component by component, 12 N of them."""
    import quadrotor
    n, nx = MPC_INTERVALS, quadrotor.STATE_SIZE
    states = [w[i * (n + 1):(i + 1) * (n + 1)] for i in range(nx)]
    thrusts = [w[nx * (n + 1) + j * n:nx * (n + 1) + (j + 1) * n] for j in range(quadrotor.CONTROL_SIZE)]
    step = quadrotor.rk4_step(tuple(x[:n] for x in states), thrusts, sin, cos)
    return join([x[1:] - s for x, s in zip(states, step, strict=True)])


def mpc_lagrangian(w: Any, lam: Any, sin: Callable[[Any], Any], cos: Callable[[Any], Any],
                   join: Callable[[list[Any]], Any], total: Callable[[Any], Any]) -> Any:
    """sum of thrust^2 + lam . defects: the Lagrangian whose hessian an SQP or interior-point step needs."""
    import quadrotor
    thrusts = w[quadrotor.STATE_SIZE * (MPC_INTERVALS + 1):]
    return total(thrusts * thrusts) + total(lam * mpc_defects(w, sin, cos, join))


def mpc_inputs(with_multipliers: bool) -> list[np.ndarray]:
    """Near hover: small states, thrusts about mass * g / 4, and multipliers of both signs."""
    import quadrotor
    n, nx = MPC_INTERVALS, quadrotor.STATE_SIZE
    r = np.random.default_rng(0)
    w = np.concatenate([0.1 * r.standard_normal(nx * (n + 1)), 1.2 + 0.1 * r.standard_normal(4 * n)])
    return [w, r.standard_normal(nx * n)] if with_multipliers else [w]


def mpc_sizes() -> tuple[int, int]:
    import quadrotor
    return quadrotor.STATE_SIZE * (MPC_INTERVALS + 1) + quadrotor.CONTROL_SIZE * MPC_INTERVALS, \
        quadrotor.STATE_SIZE * MPC_INTERVALS


def ember_mpc(hessian: bool) -> tuple[list[Any], str]:
    import ember.ad
    from ember import Tensor
    from ember.export import Arg, NumericalFunction
    unknowns, defects = mpc_sizes()
    if hessian:
        lagrangian = NumericalFunction("mpc_lagrangian", lambda w, lam: mpc_lagrangian(
            w, lam, Tensor.sin, Tensor.cos, lambda xs: Tensor.cat(*xs), Tensor.sum), [Arg(unknowns), Arg(defects)])
        return [ember.ad.sphessian(lagrangian, argnum=0)], "sparse: ember.ad.sphessian(argnum=0)"
    constraints = NumericalFunction("mpc_defects", lambda w: mpc_defects(w, Tensor.sin, Tensor.cos,
                                                                         lambda xs: Tensor.cat(*xs)), [Arg(unknowns)])
    return [ember.ad.spjacobian(constraints)], "sparse: ember.ad.spjacobian"


def casadi_mpc(ca: Any, hessian: bool) -> Any:
    unknowns, defects = mpc_sizes()
    w, lam = ca.SX.sym("w", unknowns), ca.SX.sym("lam", defects)
    if hessian:
        lagrangian = mpc_lagrangian(w, lam, ca.sin, ca.cos, lambda xs: ca.vertcat(*xs), ca.sum1)
        return ca.Function("mpc_hess", [w, lam], [ca.hessian(lagrangian, w)[0]])
    return ca.Function("mpc_jac", [w], [ca.jacobian(mpc_defects(w, ca.sin, ca.cos, lambda xs: ca.vertcat(*xs)), w)])


def jax_mpc(jax: Any, jnp: Any, hessian: bool) -> Callable[..., Any]:
    join = jnp.concatenate
    if hessian: return lambda w, lam: jax.hessian(lambda w: mpc_lagrangian(w, lam, jnp.sin, jnp.cos, join, jnp.sum))(w)
    return jax.jacfwd(lambda w: mpc_defects(w, jnp.sin, jnp.cos, join))
