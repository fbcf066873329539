"""Cart-pole: an RK4 rollout and its jacobians as ember NumericalFunctions, called from Python and from C++.

Run: python examples/cartpole.py [--steps N] [--build DIR]    (N = 10 by default: a few seconds, most of them in
     compiling the three functions on a cold cache)

The model is the classic cart-pole (Barto, Sutton and Anderson 1983): a cart on a track pushed by a force u, with
a pole hinged on it; state (x, x_dot, theta, theta_dot), theta = 0 upright. `rollout(state, controls)` integrates N
steps of RK4 (step DT), one control per step, and returns the final state. ember.ad.jacobian gives its derivatives
with respect to the state (4 x 4) and to the controls (4 x N). The script calls the three functions from Python,
checks the jacobians against central finite differences, exports them with generate_module into DIR
(examples/build/cartpole, git-ignored), compiles examples/cartpole_main.cpp against them with
g++ -std=c++17 -O2 -Wall -Wextra -Werror, runs it on the same inputs and prints the largest difference.

The physics is written once, on anything with + - * / and a sin and cos (ember Tensors here; bench/numerical.py
runs the same functions in CasADi and JAX).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import ember.ad
from ember import Tensor
from ember.export import Arg, NumericalFunction, generate_module

GRAVITY = 9.81  # m/s^2
CART_MASS = 1.0  # kg
POLE_MASS = 0.1  # kg
POLE_HALF_LENGTH = 0.5  # m, hinge to the pole's centre of mass
DT = 0.02  # s per RK4 step
STATE_SIZE = 4
CXX_FLAGS = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror"]
HERE = os.path.dirname(os.path.abspath(__file__))

State = tuple[Any, Any, Any, Any]


def derivative(state: State, force: Any, sin: Callable[[Any], Any], cos: Callable[[Any], Any]) -> State:
    """d/dt (x, x_dot, theta, theta_dot) under `force`: the cart-pole equations of motion."""
    _, x_dot, theta, theta_dot = state
    total_mass = CART_MASS + POLE_MASS
    sin_t, cos_t = sin(theta), cos(theta)
    push = (force + POLE_MASS * POLE_HALF_LENGTH * theta_dot * theta_dot * sin_t) / total_mass
    theta_acc = (GRAVITY * sin_t - cos_t * push) / \
        (POLE_HALF_LENGTH * (4.0 / 3.0 - POLE_MASS * cos_t * cos_t / total_mass))
    x_acc = push - POLE_MASS * POLE_HALF_LENGTH * theta_acc * cos_t / total_mass
    return (x_dot, x_acc, theta_dot, theta_acc)


def rk4_step(state: State, force: Any, sin: Callable[[Any], Any], cos: Callable[[Any], Any]) -> State:
    """One classic Runge-Kutta step of length DT, the force held constant."""
    def moved(by: float, slope: State) -> State:
        return tuple(s + by * d for s, d in zip(state, slope, strict=True))  # type: ignore[return-value]
    k1 = derivative(state, force, sin, cos)
    k2 = derivative(moved(DT / 2, k1), force, sin, cos)
    k3 = derivative(moved(DT / 2, k2), force, sin, cos)
    k4 = derivative(moved(DT, k3), force, sin, cos)
    return tuple(s + DT / 6 * (a + 2 * b + 2 * c + d)  # type: ignore[return-value]
                 for s, a, b, c, d in zip(state, k1, k2, k3, k4, strict=True))


def simulate(state: State, forces: Sequence[Any], sin: Callable[[Any], Any], cos: Callable[[Any], Any]) -> State:
    """The state after one RK4 step per force."""
    for force in forces: state = rk4_step(state, force, sin, cos)
    return state


def ember_rollout(steps: int) -> Callable[[Tensor, Tensor], Tensor]:
    """(state[4], controls[steps]) -> final state[4], in ember Tensor ops: components read with state[i], the
    final state assembled with Tensor.stack. ember stores such small outputs element by element, so each element
    computes only its own expression, sharing the common work with the others."""
    def rollout(state: Tensor, controls: Tensor) -> Tensor:
        start = tuple(state[i] for i in range(STATE_SIZE))
        final = simulate(start, [controls[k] for k in range(steps)], Tensor.sin, Tensor.cos)  # type: ignore[arg-type]
        return Tensor.stack(*final)
    return rollout


def numpy_rollout(state: np.ndarray, controls: np.ndarray) -> np.ndarray:
    """The same rollout in float64 numpy, for the finite-difference check."""
    return np.array(simulate(tuple(state), list(controls), np.sin, np.cos))  # type: ignore[arg-type]


def build_functions(steps: int, with_jacobians: bool = True) -> list[NumericalFunction]:
    """rollout, rollout_jac_state and rollout_jac_control (or rollout alone), traced for `steps` RK4 steps."""
    rollout = NumericalFunction("rollout", ember_rollout(steps), [Arg(STATE_SIZE), Arg(steps)])
    if not with_jacobians: return [rollout]
    jac_state, jac_control = ember.ad.jacobian(rollout, argnum=0), ember.ad.jacobian(rollout, argnum=1)
    jac_state.name, jac_control.name = "rollout_jac_state", "rollout_jac_control"  # both are called rollout_jac
    return [rollout, jac_state, jac_control]


def with_jacobians(fns: list[NumericalFunction]) -> NumericalFunction:
    """One function returning (final state, jacobian by state, jacobian by controls), traced together: both
    jacobians from one ember.ad.jacobian over both arguments, so the directions of the two share one pass."""
    rollout = fns[0]
    both = ember.ad.jacobian(rollout, argnum=(0, 1))
    return NumericalFunction("rollout_with_jacobians", lambda state, controls: (rollout(state, controls),
                                                                               *both(state, controls)), rollout.args)


def finite_differences(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], args: list[np.ndarray], argnum: int,
                       eps: float = 1e-6) -> np.ndarray:
    """Central differences of fn with respect to args[argnum]: shape (outputs, inputs)."""
    columns = []
    for j in range(args[argnum].size):
        up, down = [a.copy() for a in args], [a.copy() for a in args]
        up[argnum][j] += eps
        down[argnum][j] -= eps
        columns.append((fn(*up) - fn(*down)) / (2 * eps))
    return np.stack(columns, axis=1)


def run_cpp(fns: list[NumericalFunction], args: list[np.ndarray], build: str) -> dict[str, np.ndarray]:
    """Export `fns`, compile cartpole_main.cpp against them, run it on `args`; its printed outputs by name."""
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None: raise SystemExit("no C++ compiler: set CXX or install g++")
    generate_module("cartpole", fns, build)
    exe = os.path.join(build, "cartpole_main")
    cmd = [cxx, *CXX_FLAGS, f"-I{build}", "-o", exe, os.path.join(HERE, "cartpole_main.cpp"),
           os.path.join(build, "cartpole.cpp")]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    shown = [os.path.basename(cxx), *CXX_FLAGS, "cartpole_main.cpp", "cartpole.cpp"]
    print(f"compiled in {time.perf_counter() - start:.1f} s: {' '.join(shown)}")
    stdin = "\n".join(" ".join(f"{v:.17g}" for v in a) for a in args) + "\n"
    printed = subprocess.run([exe], input=stdin, capture_output=True, text=True, check=True).stdout
    outputs = {}
    for line in printed.splitlines():
        name, *values = line.split()
        outputs[name] = np.array([float(v) for v in values])
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="RK4 steps of the rollout")
    parser.add_argument("--build", default=os.path.join(HERE, "build", "cartpole"), help="where the C++ goes")
    opts = parser.parse_args()
    np.set_printoptions(precision=5, suppress=True, linewidth=120)

    start = time.perf_counter()
    fns = build_functions(opts.steps)
    print(f"traced rollout and its two jacobians ({opts.steps} RK4 steps of {DT} s) in "
          f"{time.perf_counter() - start:.1f} s")
    state = np.array([0.0, 0.0, 0.2, 0.0])  # at rest, the pole 0.2 rad off upright
    controls = 2.0 * np.cos(np.linspace(0.0, np.pi, opts.steps))  # push right, then left
    start = time.perf_counter()
    python_out = {f.name: np.asarray(f(state, controls)) for f in fns}
    print(f"first calls (compile on a cold cache) took {time.perf_counter() - start:.1f} s")
    for name, value in python_out.items(): print(f"{name} {list(value.shape)}:\n{value}")

    for argnum, f in ((0, fns[1]), (1, fns[2])):
        numeric = finite_differences(numpy_rollout, [state, controls], argnum)
        print(f"{f.name}: max |ember - finite differences| = {np.abs(python_out[f.name] - numeric).max():.1e}")

    cpp_out = run_cpp(fns, [state, controls], opts.build)
    worst = max(np.abs(cpp_out[name] - value.reshape(-1)).max() for name, value in python_out.items())
    print(f"C++ main: max |C++ - Python| over all outputs = {worst:.1e}")


if __name__ == "__main__":
    main()
