"""Newton's method on a Rosenbrock chain, with the gradient and hessian from ember.ad.

Run: python examples/newton.py [--size N] [--dense]

f(x) = sum_i 100 (x[i+1] - x[i]^2)^2 + (1 - x[i])^2 over i < N - 1 (N = 100), minimum 0 at x = 1. ember traces f
once; ember.ad.gradient and ember.ad.hessian turn it into NumericalFunctions that run as compiled C++. Each
iteration solves H d = -g and backtracks along d (Armijo) until f drops enough; where H is not positive definite
it is shifted by a multiple of the identity until it is, so d always points downhill. It stops when |g| < 1e-10.

The hessian is tridiagonal: ember.ad.sphessian finds that from the graph, star-colors it (3 colors, whatever N)
and returns its nonzeros in compressed sparse columns, solved with scipy.sparse.linalg.spsolve (numpy.linalg.solve
on the densified matrix without scipy). --dense uses ember.ad.hessian and numpy's Cholesky instead.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

import ember.ad
from ember import Tensor
from ember.export import Arg, NumericalFunction

TOLERANCE = 1e-10  # on the gradient's 2-norm
ARMIJO = 1e-4  # the fraction of the predicted decrease a step must achieve

Solve = Callable[[np.ndarray, float], np.ndarray]  # (x, shift) -> solution d of (H(x) + shift I) d = -g(x)


def rosenbrock(x: Tensor) -> Tensor:
    """The Rosenbrock chain: a sum of N - 1 curved valleys, each coupling x[i] and x[i+1]."""
    head, tail = x[:-1], x[1:]
    return (100.0 * (tail - head * head) ** 2 + (1.0 - head) ** 2).sum()


def dense_newton_system(hessian: NumericalFunction) -> Callable[[np.ndarray, np.ndarray], Solve]:
    """For (x, g): a solver of (H + shift I) d = -g by Cholesky, raising LinAlgError when not positive definite."""
    def at(x: np.ndarray, g: np.ndarray) -> Solve:
        h = hessian(x)
        def solve(_: np.ndarray, shift: float) -> np.ndarray:
            shifted = h + shift * np.eye(len(x))
            np.linalg.cholesky(shifted)  # raises LinAlgError unless positive definite
            return np.linalg.solve(shifted, -g)
        return solve
    return at


def sparse_newton_system(f: NumericalFunction, n: int) -> Callable[[np.ndarray, np.ndarray], Solve]:
    """Like dense_newton_system with the nonzeros of ember.ad.sphessian, solved by scipy's sparse LU (or numpy on
    the densified matrix where scipy is missing)."""
    sparse = ember.ad.sphessian(f)
    indptr, indices = sparse.indptr, sparse.indices
    try:
        import scipy.sparse  # type: ignore[import-untyped]  # optional, and without stubs here
        import scipy.sparse.linalg  # type: ignore[import-untyped]
    except ImportError: scipy = None
    print(f"sparse hessian: {sparse.nnz} nonzeros of {n * n}, {sparse.colors} hessian-vector products per "
          f"evaluation (star coloring), solved with "
          f"{'scipy.sparse.linalg.spsolve' if scipy else 'numpy.linalg.solve (no scipy)'}")

    def at(x: np.ndarray, g: np.ndarray) -> Solve:
        values = np.asarray(sparse(x)).reshape(-1)
        def solve(_: np.ndarray, shift: float) -> np.ndarray:
            if scipy is not None:
                h = scipy.sparse.csc_matrix((values, indices, indptr), shape=(n, n))
                shifted = (h + shift * scipy.sparse.identity(n, format="csc")).tocsc()
                lowest = scipy.sparse.linalg.eigsh(shifted, k=1, which="SA", return_eigenvectors=False)[0]
                if lowest <= 0: raise np.linalg.LinAlgError("not positive definite")
                d = scipy.sparse.linalg.spsolve(shifted, -g)
            else:
                shifted = sparse.to_dense(values) + shift * np.eye(n)
                np.linalg.cholesky(shifted)  # raises LinAlgError unless positive definite
                d = np.linalg.solve(shifted, -g)
            if not np.all(np.isfinite(d)) or g @ d >= 0: raise np.linalg.LinAlgError("not a descent direction")
            return d
        return solve
    return at


def newton(f: NumericalFunction, gradient: NumericalFunction, system: Callable[[np.ndarray, np.ndarray], Solve],
           x: np.ndarray, max_iterations: int = 100) -> tuple[np.ndarray, int]:
    """Damped Newton from x until |gradient| < TOLERANCE; prints one line per iteration."""
    for iteration in range(max_iterations):
        g = np.asarray(gradient(x))
        value, norm = float(np.asarray(f(x))), float(np.linalg.norm(g))
        print(f"{iteration:4d}  f = {value:.6e}  |g| = {norm:.3e}")
        if norm < TOLERANCE: return x, iteration
        solve, shift = system(x, g), 0.0
        while True:
            try:
                d = solve(x, shift)
                break
            except np.linalg.LinAlgError:
                shift = max(2.0 * shift, 1e-3)
        step = 1.0
        while float(np.asarray(f(x + step * d))) > value + ARMIJO * step * float(g @ d) and step > 1e-12: step /= 2
        x = x + step * d
    raise RuntimeError(f"newton: |g| = {norm:.3e} after {max_iterations} iterations; tolerance {TOLERANCE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=100, help="length N of the chain")
    parser.add_argument("--dense", action="store_true", help="use the dense hessian and numpy's Cholesky")
    opts = parser.parse_args()
    n = opts.size

    start = time.perf_counter()
    f = NumericalFunction("rosenbrock", rosenbrock, [Arg(n)])
    gradient = ember.ad.gradient(f)
    if opts.dense:
        print(f"dense hessian: {n} x {n}, solved with numpy (Cholesky)")
        system = dense_newton_system(ember.ad.hessian(f))
    else: system = sparse_newton_system(f, n)
    x0 = np.full(n, 0.5)
    system(x0, np.asarray(gradient(x0)))  # the first call compiles
    print(f"traced and compiled f, its gradient and hessian in {time.perf_counter() - start:.1f} s")

    start = time.perf_counter()
    x, iterations = newton(f, gradient, system, x0)
    print(f"converged in {iterations} iterations ({time.perf_counter() - start:.2f} s): "
          f"|g| = {np.linalg.norm(gradient(x)):.2e}, max |x - 1| = {np.abs(x - 1).max():.2e}")


if __name__ == "__main__":
    main()
