"""torch.linalg's names for ember's linear algebra (ember/mixin/linalg.py has the algorithms): `from ember import
linalg; linalg.solve(a, b)`. Each works on the last two axes and broadcasts the others."""

from __future__ import annotations

from ember.tensor import Tensor


def solve(a: Tensor, b: Tensor, *, left: bool = True) -> Tensor:
    """x with a @ x = b (x @ a = b if not left), by LU with partial pivoting."""
    return a.solve(b, left=left)


def solve_triangular(a: Tensor, b: Tensor, *, upper: bool, left: bool = True, unitriangular: bool = False) -> Tensor:
    """x with a @ x = b (x @ a = b if not left) for triangular a: only the named triangle of a is read."""
    return a.solve_triangular(b, upper=upper, left=left, unitriangular=unitriangular)


def cholesky(a: Tensor, *, upper: bool = False) -> Tensor:
    """L (lower) with a = L @ L^T, or its transpose if upper."""
    return a.cholesky(upper=upper)


def inv(a: Tensor) -> Tensor:
    return a.inverse()


def det(a: Tensor) -> Tensor:
    return a.det()


def slogdet(a: Tensor) -> tuple[Tensor, Tensor]:
    """(sign, log|det|)."""
    return a.slogdet()


def cholesky_solve(b: Tensor, factor: Tensor, *, upper: bool = False) -> Tensor:
    """x with (L @ L^T) x = b for the Cholesky factor L (U^T U with upper): torch.cholesky_solve(b, factor)."""
    return b.cholesky_solve(factor, upper=upper)


__all__ = ["solve", "solve_triangular", "cholesky", "inv", "det", "slogdet", "cholesky_solve"]
