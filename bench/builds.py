"""Build times of the numerical functions that issue 26 lists (target: each under 5 s, as CasADi's codegen + g++).

Run: python bench/builds.py [name ...]   (names: substrings of the case names below; none: all of them)

Each case is built from nothing (`Context(CACHELEVEL=0)`: traced, differentiated, scheduled, rendered as C++ and
compiled by NumericalFunction.compile), and rendered once more alone for ember's own part. Printed per case: the
build's wall seconds, ember's own seconds (before the C++ compiler), the C++ module's size and the plan's kernels.
The machine may be shared: run it alone, or twice.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "examples")]

import numerical_models  # noqa: E402

from ember import Tensor, ad  # noqa: E402
from ember.export import Arg, NumericalFunction, render_module  # noqa: E402
from ember.helpers import Context  # noqa: E402


def cartpole_steps(z: Tensor, steps: int = 10) -> Tensor:
    """The issue's repro: a cart-pole's RK4 steps unrolled by a Python loop, written with s[0]-style reads and
    Tensor.stack of scalar rows."""
    def f(s: Tensor, u: Tensor) -> Tensor:
        th, thd = s[2], s[3]
        st, ct = th.sin(), th.cos()
        tmp = (u + 0.05 * thd * thd * st) / 1.1
        thdd = (9.81 * st - ct * tmp) / (0.5 * (4 / 3 - 0.1 * ct * ct / 1.1))
        return Tensor.stack(s[1], tmp - 0.05 * thdd * ct / 1.1, thd, thdd)
    s, u, h = z[0:4], z[4], 0.05
    for _ in range(steps):
        k1 = f(s, u)
        k2 = f(s + h / 2 * k1, u)
        k3 = f(s + h / 2 * k2, u)
        k4 = f(s + h * k3, u)
        s = s + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return s


def mpc_hessian(intervals: int) -> list[NumericalFunction]:
    numerical_models.MPC_INTERVALS, before = intervals, numerical_models.MPC_INTERVALS
    try:
        return numerical_models.ember_mpc(True)[0]
    finally:
        numerical_models.MPC_INTERVALS = before


def quadrotor_jacobians(steps: int) -> list[NumericalFunction]:
    import quadrotor
    return [quadrotor.with_jacobians(quadrotor.build_functions(steps, True))]


def cases() -> Iterator[tuple[str, Callable[[], list[NumericalFunction]]]]:
    yield "cart-pole 10 steps, jacobian", lambda: [ad.jacobian(NumericalFunction("cp", cartpole_steps, [Arg(5)]))]
    yield "3-D Bratu 5^3, spjacobian", lambda: numerical_models.ember_bratu3d()[0]
    yield "quadrotor MPC N=3, Lagrangian sphessian", lambda: mpc_hessian(3)
    yield "folded quadrotor N=2 + jacobians", lambda: quadrotor_jacobians(2)


def main() -> None:
    wanted = sys.argv[1:]
    for name, make in cases():
        if wanted and not any(w in name for w in wanted): continue
        with Context(CACHELEVEL=0):
            start = time.perf_counter()
            fns = make()
            for f in fns: f.compile()
            build = time.perf_counter() - start
            start = time.perf_counter()
            source = render_module("m", make())[1]
            own = time.perf_counter() - start
        kernels = sum(len(f.plan.items) for f in fns)
        print(f"{name}: build {build:.2f} s (ember's own {own:.2f} s), C++ {len(source) / 1e3:.0f} KB, "
              f"{kernels} kernels", flush=True)


if __name__ == "__main__":
    main()
