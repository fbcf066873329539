"""Newton's method on a Rosenbrock chain, with the gradient and hessian from ember.ad.

Run: python examples/newton.py [--size N]

f(x) = sum_i 100 (x[i+1] - x[i]^2)^2 + (1 - x[i])^2 over i < N - 1 (N = 100), minimum 0 at x = 1. ember traces f
once; ember.ad.gradient and ember.ad.hessian turn it into NumericalFunctions that run as compiled C++. Each
iteration solves H d = -g and backtracks along d (Armijo) until f drops enough; where H is not positive definite
it is shifted by a multiple of the identity until it is, so d always points downhill. It stops when |g| < 1e-10.

The hessian is tridiagonal. When ember.ad.sphessian exists the script uses it: its values in compressed sparse
columns, solved with scipy.sparse.linalg.spsolve (numpy.linalg.solve on the densified matrix without scipy).
Otherwise it uses the dense hessian.
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


def csc_pattern(sparse: NumericalFunction, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(indptr, indices) of a sparse derivative's compressed columns, under the names ember might give them."""
    for ptr_name, idx_name in (("indptr", "indices"), ("colptr", "rowval"), ("col_ptr", "row_idx")):
        ptr, idx = getattr(sparse, ptr_name, None), getattr(sparse, idx_name, None)
        if ptr is not None and idx is not None and len(ptr) == n + 1: return np.asarray(ptr), np.asarray(idx)
    pattern = getattr(sparse, "pattern", None) or getattr(sparse, "sparsity", None)
    if pattern is not None and hasattr(pattern, "indptr"):
        return np.asarray(pattern.indptr), np.asarray(pattern.indices)
    return None


def sparse_newton_system(f: NumericalFunction, n: int) -> Callable[[np.ndarray, np.ndarray], Solve] | None:
    """Like dense_newton_system with ember.ad.sphessian's nonzeros; None where that is missing or unreadable."""
    if not hasattr(ember.ad, "sphessian"): return None
    sparse = ember.ad.sphessian(f)
    pattern = csc_pattern(sparse, n)
    if pattern is None:
        print("ember.ad.sphessian exists, but its sparsity pattern is not under indptr/indices, colptr/rowval, "
              "col_ptr/row_idx or .pattern: using the dense hessian")
        return None
    indptr, indices = pattern
    try:
        import scipy.sparse  # type: ignore[import-untyped]  # optional, and without stubs here
        import scipy.sparse.linalg  # type: ignore[import-untyped]
    except ImportError:
        scipy = None
    print(f"sparse hessian: {len(indices)} nonzeros of {n * n}, solved with "
          f"{'scipy.sparse.linalg.spsolve' if scipy else 'numpy.linalg.solve (no scipy)'}")

    def at(x: np.ndarray, g: np.ndarray) -> Solve:
        values = np.asarray(sparse(x)).reshape(-1)
        def solve(_: np.ndarray, shift: float) -> np.ndarray:
            if scipy is not None:
                h = scipy.sparse.csc_matrix((values, indices, indptr), shape=(n, n))
                shifted = (h + shift * scipy.sparse.identity(n, format="csc")).tocsc()
                d = scipy.sparse.linalg.spsolve(shifted, -g)
            else:
                dense = np.zeros((n, n))
                dense[indices, np.repeat(np.arange(n), np.diff(indptr))] = values
                d = np.linalg.solve(dense + shift * np.eye(n), -g)
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
    n = parser.parse_args().size

    start = time.perf_counter()
    f = NumericalFunction("rosenbrock", rosenbrock, [Arg(n)])
    gradient = ember.ad.gradient(f)
    system = sparse_newton_system(f, n)
    if system is None:
        print(f"dense hessian: {n} x {n}, solved with numpy (Cholesky)")
        system = dense_newton_system(ember.ad.hessian(f))
    x0 = np.full(n, 0.5)
    system(x0, np.asarray(gradient(x0)))  # the first call compiles
    print(f"traced and compiled f, its gradient and hessian in {time.perf_counter() - start:.1f} s")

    start = time.perf_counter()
    x, iterations = newton(f, gradient, system, x0)
    print(f"converged in {iterations} iterations ({time.perf_counter() - start:.2f} s): "
          f"|g| = {np.linalg.norm(gradient(x)):.2e}, max |x - 1| = {np.abs(x - 1).max():.2e}")


if __name__ == "__main__":
    main()
