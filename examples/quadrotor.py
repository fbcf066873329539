"""Quadrotor: an RK4 rollout and its jacobians as ember NumericalFunctions, checked against finite differences.

Run: python examples/quadrotor.py [--steps N]    (N = 20 by default; ember today unrolls every step into
     straight-line C++, and from 12 steps on the jacobians take minutes to generate and to compile: --steps 2
     runs in seconds, 10 in about 20)

The model is the standard rigid-body quadrotor in the "+" configuration: state (x, y, z, vx, vy, vz, roll, pitch,
yaw, p, q, r), position and velocity in the world frame (z up), ZYX Euler angles, body rates; the controls are the
four rotor thrusts (N), rotor 1 on the body's +x arm, then counter-clockwise. The thrusts push along the body's
z axis (the third column of the rotation matrix R = Rz(yaw) Ry(pitch) Rx(roll)) against gravity; the arms give the
roll and pitch torques, each rotor's drag a yaw torque proportional to its thrust; the rates follow Euler's rigid
body equations with a diagonal inertia; the Euler angles follow the rates through the ZYX kinematics (tan(pitch)
written as sin/cos: singular at pitch = +-90 degrees). `rollout(state, controls)` integrates N steps of RK4 (step
DT), one row of thrusts per step, with ember.ad.fold, and returns the final state; ember.ad.jacobian gives its
derivatives with respect to the state (12 x 12) and to the controls (12 x N x 4). The script calls the three
functions from Python, checks the jacobians against central finite differences and prints the largest difference.

The physics is written once, on anything with + - * / and a sin and cos (ember Tensors here; bench/numerical.py
runs the same functions in CasADi and JAX).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import ember.ad
from ember import Tensor
from ember.export import Arg, NumericalFunction

GRAVITY = 9.81  # m/s^2
MASS = 0.5  # kg
ARM_LENGTH = 0.25  # m, centre to rotor
INERTIA = (4.856e-3, 4.856e-3, 8.801e-3)  # kg m^2, about the body's x, y, z axes
YAW_DRAG = 0.01  # m: a rotor's drag torque per N of its thrust
DT = 0.02  # s per RK4 step
STEPS = 20
STATE_SIZE, CONTROL_SIZE = 12, 4

State = tuple[Any, ...]  # the 12 components, each a scalar of the framework at hand


def rotation_matrix(roll: Any, pitch: Any, yaw: Any, sin: Callable[[Any], Any], cos: Callable[[Any], Any]
                    ) -> tuple[tuple[Any, Any, Any], ...]:
    """R = Rz(yaw) Ry(pitch) Rx(roll), by rows: body-frame vectors to the world frame."""
    sr, cr, sp, cp, sy, cy = sin(roll), cos(roll), sin(pitch), cos(pitch), sin(yaw), cos(yaw)
    return ((cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr),
            (sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr),
            (-sp, cp * sr, cp * cr))


def derivative(state: State, thrusts: Sequence[Any], sin: Callable[[Any], Any], cos: Callable[[Any], Any]) -> State:
    """d/dt of the 12 states under the four rotor thrusts: the quadrotor's equations of motion."""
    _, _, _, vx, vy, vz, roll, pitch, yaw, p, q, r = state
    t1, t2, t3, t4 = thrusts
    rotation = rotation_matrix(roll, pitch, yaw, sin, cos)
    lift = (t1 + t2 + t3 + t4) / MASS
    acc = tuple(row[2] * lift for row in rotation)
    ix, iy, iz = INERTIA
    torque = (ARM_LENGTH * (t2 - t4), ARM_LENGTH * (t3 - t1), YAW_DRAG * (t1 - t2 + t3 - t4))
    sr, cr, sp, cp = sin(roll), cos(roll), sin(pitch), cos(pitch)
    turn = q * sr + r * cr  # the rates' component that tilts the yaw axis
    return (vx, vy, vz, acc[0], acc[1], acc[2] - GRAVITY,
            p + turn * sp / cp, q * cr - r * sr, turn / cp,
            ((iy - iz) * q * r + torque[0]) / ix, ((iz - ix) * p * r + torque[1]) / iy,
            ((ix - iy) * p * q + torque[2]) / iz)


def rk4_step(state: State, thrusts: Sequence[Any], sin: Callable[[Any], Any], cos: Callable[[Any], Any]) -> State:
    """One classic Runge-Kutta step of length DT, the thrusts held constant."""
    def moved(by: float, slope: State) -> State:
        return tuple(s + by * d for s, d in zip(state, slope, strict=True))
    k1 = derivative(state, thrusts, sin, cos)
    k2 = derivative(moved(DT / 2, k1), thrusts, sin, cos)
    k3 = derivative(moved(DT / 2, k2), thrusts, sin, cos)
    k4 = derivative(moved(DT, k3), thrusts, sin, cos)
    return tuple(s + DT / 6 * (a + 2 * b + 2 * c + d) for s, a, b, c, d in zip(state, k1, k2, k3, k4, strict=True))


def simulate(state: State, controls: Sequence[Sequence[Any]], sin: Callable[[Any], Any],
             cos: Callable[[Any], Any]) -> State:
    """The state after one RK4 step per row of thrusts."""
    for thrusts in controls: state = rk4_step(state, thrusts, sin, cos)
    return state


def ember_rollout(steps: int) -> Callable[[Tensor, Tensor], Tensor]:
    """(state[12], controls[steps, 4]) -> final state[12], in ember Tensor ops: one RK4 step traced once and looped
    with ember.ad.fold, so the C++ holds one step (and one step of each derivative) inside a loop, whatever the
    horizon."""
    def step(state: Tensor, thrusts: Tensor) -> Tensor:
        now = tuple(state[i] for i in range(STATE_SIZE))
        return Tensor.stack(*rk4_step(now, [thrusts[j] for j in range(CONTROL_SIZE)], Tensor.sin, Tensor.cos))

    def rollout(state: Tensor, controls: Tensor) -> Tensor:
        return ember.ad.fold(step, state, controls)
    return rollout


def numpy_rollout(state: np.ndarray, controls: np.ndarray) -> np.ndarray:
    """The same rollout in float64 numpy, for the finite-difference check."""
    return np.array(simulate(tuple(state), [tuple(row) for row in controls], np.sin, np.cos))


def build_functions(steps: int, with_jacobians: bool = True) -> list[NumericalFunction]:
    """rollout, rollout_jac_state and rollout_jac_control (or rollout alone), traced for `steps` RK4 steps."""
    rollout = NumericalFunction("rollout", ember_rollout(steps), [Arg(STATE_SIZE), Arg((steps, CONTROL_SIZE))])
    if not with_jacobians: return [rollout]
    jac_state, jac_control = ember.ad.jacobian(rollout, argnum=0), ember.ad.jacobian(rollout, argnum=1)
    jac_state.name, jac_control.name = "rollout_jac_state", "rollout_jac_control"  # both are called rollout_jac
    return [rollout, jac_state, jac_control]


def with_jacobians(fns: list[NumericalFunction]) -> NumericalFunction:
    """One function returning (final state, jacobian by state, jacobian by controls), traced together: both
    jacobians from one ember.ad.jacobian over both arguments, one reverse sweep for 12 outputs by 92 inputs (two
    jacobians would add a forward pass of 12 directions over the state: 2.4x CasADi's time, not 1.3x)."""
    rollout = fns[0]
    both = ember.ad.jacobian(rollout, argnum=(0, 1))
    return NumericalFunction("rollout_with_jacobians", lambda state, controls: (rollout(state, controls),
                                                                               *both(state, controls)), rollout.args)


def start_and_controls(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """A state tilted and turning, 1 m up, and thrusts around hover that differ from rotor to rotor."""
    state = np.array([0.0, 0.0, 1.0, 0.5, -0.2, 0.1, 0.1, -0.05, 0.3, 0.2, -0.1, 0.05])
    hover = MASS * GRAVITY / 4
    phase = np.linspace(0.0, np.pi, steps)[:, None] + np.arange(CONTROL_SIZE)[None, :]
    return state, hover * (1.0 + 0.1 * np.sin(phase))


def finite_differences(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], args: list[np.ndarray], argnum: int,
                       eps: float = 1e-6) -> np.ndarray:
    """Central differences of fn with respect to args[argnum]: shape (outputs, *args[argnum].shape)."""
    columns = []
    for j in range(args[argnum].size):
        up, down = [a.copy() for a in args], [a.copy() for a in args]
        up[argnum].reshape(-1)[j] += eps
        down[argnum].reshape(-1)[j] -= eps
        columns.append((fn(*up) - fn(*down)) / (2 * eps))
    return np.stack(columns, axis=1).reshape(-1, *args[argnum].shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="RK4 steps of the rollout")
    opts = parser.parse_args()
    np.set_printoptions(precision=5, suppress=True, linewidth=120)

    start = time.perf_counter()
    fns = build_functions(opts.steps)
    print(f"traced rollout and its two jacobians ({opts.steps} RK4 steps of {DT} s) in "
          f"{time.perf_counter() - start:.1f} s")
    state, controls = start_and_controls(opts.steps)
    start = time.perf_counter()
    out = {f.name: np.asarray(f(state, controls)) for f in fns}
    print(f"first calls (compile on a cold cache) took {time.perf_counter() - start:.1f} s")
    print(f"final state:\n{out['rollout']}")
    error = np.abs(out["rollout"] - numpy_rollout(state, controls)).max()
    print(f"rollout: max |ember - numpy| = {error:.1e}")
    for argnum, f in ((0, fns[1]), (1, fns[2])):
        numeric = finite_differences(numpy_rollout, [state, controls], argnum)
        print(f"{f.name} {list(out[f.name].shape)}: max |ember - finite differences| = "
              f"{np.abs(out[f.name] - numeric).max():.1e}")


if __name__ == "__main__":
    main()
