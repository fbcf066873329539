"""Linear algebra on the last two axes: LU with partial pivoting, Cholesky, triangular solves, and what they give
(solve, inv, det, slogdet, logdet). `ember.linalg` holds the same under torch.linalg's names.

The algorithms are written with tensor ops, not as new primitive ops (n is the matrix size, known when the graph is
built), in one of two forms:
- up to SCALAR_LIMIT, on the matrix's elements: each element a tensor of the batch shape, the elimination unrolled
  into straight-line arithmetic, a pivot chosen by comparisons and rows swapped by selects. That is one kernel, an
  elementwise loop over the batch, and its derivatives too (a 7 x 7 solve and its jacobian: 1 kernel each, where
  whole-matrix steps gave 39 and 85);
- above it, as n steps of whole-matrix ops: a step of LU picks its pivot with argmax, swaps two rows with one
  gather and subtracts a rank-one update below the pivot row; a step of a triangular solve or of Cholesky finishes
  one row or column. O(n) ops and kernels, where the elements' form would have O(n^3) nodes.
Either way everything ember does with tensors works on them unchanged: derivatives in both modes come by
composition (the adjoint of the elimination, never an explicit inverse), batch axes broadcast (`vmap` too), and
NumericalFunctions export them as C++ with no BLAS or LAPACK. Meant for the small dense systems of robotics and
control (mass matrices, Kalman gains, Newton steps), not for n in the thousands.

A lazy tensor cannot raise on its values: where torch raises (a singular matrix in solve or inv, a matrix that is
not positive-definite in cholesky), the results hold inf or NaN instead, as torch's `*_ex` variants would report.
A zero pivot is skipped rather than divided by, so det and slogdet of a singular matrix are exactly 0 and -inf.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.errors import DTypeError, ShapeError
from ember.mixin.elementwise import broadcast_shape

if TYPE_CHECKING:
    from ember.tensor import Tensor

SCALAR_LIMIT = 16  # the largest n whose algorithms run on the matrix's elements (O(n^3) graph nodes)
Elements = list[list["Tensor"]]  # a matrix's rows, each element a tensor of the batch shape


def _square(a: Tensor, name: str) -> int:
    """n for a batch of n x n float matrices, else a ShapeError or DTypeError naming the problem."""
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"{name}: expected a square matrix or a batch of them (..., n, n), got shape {a.shape}")
    if not all(isinstance(s, int) for s in a.shape[-2:]):
        raise ShapeError(f"{name}: the matrix size must be known when the graph is built, got {a.shape}")
    if not a.dtype.is_float:
        raise DTypeError(f"{name}: expected a floating-point matrix, got {a.dtype.name}")
    return int(a.shape[-1])


def _with_rhs(a: Tensor, b: Tensor, name: str, left: bool = True) -> tuple[Tensor, Tensor, bool]:
    """a and b broadcast to one batch shape, b as (..., n, k), and whether b was a vector (torch's rule: b is one
    where it has one axis, or one axis fewer than a with a's batch shape)."""
    from ember.tensor import Tensor
    if not isinstance(b, Tensor): raise ShapeError(f"{name}: expected a Tensor right-hand side, got {type(b).__name__}")
    n = _square(a, name)
    if not left:  # x a = b is a^T x^T = b^T
        a_t, b_t, vector = _with_rhs(a.transpose(-2, -1), b if b.ndim < 2 else b.transpose(-2, -1), name)
        return a_t, b_t, vector
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    rhs = b.unsqueeze(-1) if vector else b
    if rhs.ndim < 2 or rhs.shape[-2] != n:
        raise ShapeError(f"{name}: the right-hand side {tuple(b.shape)} does not fit the {n} x {n} matrix {a.shape}: "
                         f"expected (..., {n}) or (..., {n}, k)")
    try:
        batch = broadcast_shape(name, a.shape[:-2], rhs.shape[:-2])
    except ShapeError:
        raise ShapeError(f"{name}: batch shapes {a.shape[:-2]} and {rhs.shape[:-2]} of {a.shape} and {b.shape} "
                         "cannot be broadcast") from None
    if not b.dtype.is_float: raise DTypeError(f"{name}: expected a floating-point right-hand side, got {b.dtype.name}")
    dtype = a.dtype if a.dtype.itemsize >= b.dtype.itemsize else b.dtype
    return a.cast(dtype).expand(*batch, n, n), rhs.cast(dtype).expand(*batch, n, rhs.shape[-1]), vector


def _batch_ones(a: Tensor) -> Tensor:
    """Ones of a's batch shape: the determinant of 0 x 0 matrices."""
    from ember.tensor import Tensor
    return Tensor.ones(*a.shape[:-2], dtype=a.dtype, device=a.device)


def _pivots(a: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """U's diagonal (..., n) from LU with partial pivoting, and the permutation's sign."""
    from ember.tensor import Tensor
    if n <= SCALAR_LIMIT:
        rows, sign = lu_eliminate_elements(elements(a), n)
        return Tensor.stack(*[rows[i][i] for i in range(n)], dim=-1), sign
    u, sign = lu_eliminate(a, n)
    return u.diagonal(0, -2, -1), sign


def _finish(x: Tensor, vector: bool, left: bool) -> Tensor:
    if not left: x = x.transpose(-2, -1)
    return x.squeeze(-1 if left else -2) if vector else x


def lu_eliminate(m: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Gaussian elimination with partial pivoting on the first n columns of m (..., n, n + k): U beside the right-
    hand sides transformed alike, and the permutation's sign (..., ) as m's dtype. The pivot of column j is the
    first largest |m[i, j]| for i >= j (LAPACK's getrf); a zero pivot (a singular matrix) eliminates nothing."""
    from ember.tensor import Tensor
    rows = Tensor.arange(n, device=m.device).reshape(n, 1)
    sign = m[..., 0, 0].ones_like()
    for j in range(n - 1):
        pivot_at = m[..., j:, j].abs().argmax(-1).cast(rows.dtype) + j  # (...,)
        at = pivot_at.unsqueeze(-1).unsqueeze(-1)  # (..., 1, 1)
        source = rows.eq(j).where(at, rows.eq(at).where(j, rows))  # row j <- the pivot's row, and back
        m = m.gather(-2, source.expand(*m.shape))
        sign = pivot_at.eq(j).where(sign, -sign)
        pivot = m[..., j:j + 1, j:j + 1]
        factors = (rows > j).where(m[..., :, j:j + 1] / pivot.eq(0).where(1, pivot), 0)
        m = m - factors * m[..., j:j + 1, :]
    return m, sign


def substitute(a: Tensor, b: Tensor, lower: bool, unit: bool = False) -> Tensor:
    """x with a x = b for triangular a (..., n, n) and b (..., n, k), row by row from the top (lower) or the bottom.
    Only a's triangle is read (its diagonal too unless unit)."""
    from ember.tensor import Tensor
    n = a.shape[-1]
    rows = Tensor.arange(n, device=a.device).reshape(n, 1)
    off = a.tril(-1) if lower else a.triu(1)
    x = b.zeros_like()
    for i in range(n) if lower else range(n - 1, -1, -1):
        row = b[..., i:i + 1, :] - off[..., i:i + 1, :].matmul(x)  # x is 0 in the rows not solved yet
        if not unit: row = row / a[..., i:i + 1, i:i + 1]
        x = rows.eq(i).where(row, x)
    return x


def elements(a: Tensor) -> Elements:
    return [[a[..., i, j] for j in range(a.shape[-1])] for i in range(a.shape[-2])]


def matrix(rows: Elements) -> Tensor:
    from ember.tensor import Tensor
    return Tensor.stack(*[Tensor.stack(*row, dim=-1) for row in rows], dim=-2)


def lu_eliminate_elements(m: Elements, n: int) -> tuple[Elements, Tensor]:
    """lu_eliminate on elements: the pivot found by comparisons (the first largest |m[i][j]|, i >= j), rows j and
    the pivot's swapped by selects. Only the columns a later step reads are carried: U's upper triangle and the
    right-hand sides."""
    sign = m[0][0].ones_like()
    for j in range(n - 1):
        best, row, taken = m[j][j].abs(), m[j][j:], []
        for i in range(j + 1, n):
            take = m[i][j].abs() > best
            best = take.where(m[i][j].abs(), best)
            row = [take.where(new, old) for new, old in zip(m[i][j:], row, strict=True)]
            taken.append(take)
        later = None  # whether a row below i was taken: the pivot is the last row taken
        for i in range(n - 1, j, -1):
            pivot_here = taken[i - j - 1] if later is None else taken[i - j - 1] & ~later
            m[i] = m[i][:j] + [pivot_here.where(old, mine) for old, mine in zip(m[j][j:], m[i][j:], strict=True)]
            later = taken[i - j - 1] if later is None else later | taken[i - j - 1]
            sign = pivot_here.where(-sign, sign)
        m[j] = m[j][:j] + row
        pivot = m[j][j]
        safe = pivot.eq(0).where(1, pivot)
        for i in range(j + 1, n):
            factor = m[i][j] / safe
            m[i] = m[i][:j + 1] + [mine - factor * top for mine, top in zip(m[i][j + 1:], m[j][j + 1:], strict=True)]
    return m, sign


def substitute_elements(a: Elements, b: Elements, lower: bool, unit: bool = False) -> Elements:
    """substitute on elements: x's rows from the top (lower) or the bottom, each an inner product in order."""
    n = len(a)
    x: list[list[Tensor]] = [[] for _ in range(n)]
    order = range(n) if lower else range(n - 1, -1, -1)
    for i in order:
        done = range(i) if lower else range(i + 1, n)
        row = []
        for c, rhs in enumerate(b[i]):
            for k in done: rhs = rhs - a[i][k] * x[k][c]
            row.append(rhs if unit else rhs / a[i][i])
        x[i] = row
    return x


def cholesky_elements(a: Elements) -> Elements:
    """L with a = L L^T from a's lower triangle, column by column (each inner product in order)."""
    n = len(a)
    low: list[list[Tensor]] = [[a[0][0].zeros_like()] * n for _ in range(n)]
    for j in range(n):
        for i in range(j, n):
            rest = a[i][j]
            for k in range(j): rest = rest - low[i][k] * low[j][k]
            low[i][j] = rest.sqrt() if i == j else rest / low[j][j]
    return low


class LinalgMixin:
    """Tensor methods: torch's spellings (det, logdet, slogdet, inverse, cholesky, cholesky_solve)."""

    def det(self: Tensor) -> Tensor:
        """The determinant of each n x n matrix of the last two axes."""
        n = _square(self, "det")
        if n == 0: return _batch_ones(self)
        diagonal, sign = _pivots(self, n)
        return sign * diagonal.prod(-1)

    def slogdet(self: Tensor) -> tuple[Tensor, Tensor]:
        """(sign, log|det|) of each matrix: sign is -1, 0 or 1 and log|det| -inf where the matrix is singular."""
        n = _square(self, "slogdet")
        if n == 0: return _batch_ones(self), _batch_ones(self) * 0
        diagonal, sign = _pivots(self, n)
        return sign * diagonal.sign().prod(-1), diagonal.abs().log().sum(-1)

    def logdet(self: Tensor) -> Tensor:
        """log(det): NaN where the determinant is negative, -inf where it is 0 (as torch.logdet)."""
        sign, logabs = self.slogdet()
        return sign.lt(0).where(float("nan"), logabs)

    def inverse(self: Tensor) -> Tensor:
        """The inverse of each matrix, by solving against the identity (inf or NaN where it is singular)."""
        from ember.tensor import Tensor
        n = _square(self, "inverse")
        return self.solve(Tensor.eye(n, dtype=self.dtype, device=self.device))

    def solve(self: Tensor, b: Tensor, *, left: bool = True) -> Tensor:
        """x with self @ x = b (left) or x @ self = b, by LU with partial pivoting: torch.linalg.solve(self, b)."""
        a, rhs, vector = _with_rhs(self, b, "solve", left)
        n = a.shape[-1]
        if n == 0: return _finish(rhs, vector, left)
        if n <= SCALAR_LIMIT:
            rows, _ = lu_eliminate_elements([r + s for r, s in zip(elements(a), elements(rhs), strict=True)], n)
            x = substitute_elements([r[:n] for r in rows], [r[n:] for r in rows], lower=False)
            return _finish(matrix(x), vector, left)
        eliminated, _ = lu_eliminate(a.cat(rhs, dim=-1), n)
        return _finish(substitute(eliminated[..., :n], eliminated[..., n:], lower=False), vector, left)

    def solve_triangular(self: Tensor, b: Tensor, *, upper: bool, left: bool = True, unitriangular: bool = False
                         ) -> Tensor:
        """x with self @ x = b (left) or x @ self = b for triangular self: torch.linalg.solve_triangular. Only the
        triangle named by `upper` is read, and its diagonal is taken as ones if unitriangular."""
        a, rhs, vector = _with_rhs(self, b, "solve_triangular", left)
        if vector: raise ShapeError(f"solve_triangular: b must have a column axis (..., n, k), got {tuple(b.shape)} "
                                    "(as torch.linalg.solve_triangular; unsqueeze(-1) a vector)")
        lower = not upper if left else upper
        if a.shape[-1] <= SCALAR_LIMIT:
            return _finish(matrix(substitute_elements(elements(a), elements(rhs), lower, unitriangular)), False, left)
        return _finish(substitute(a, rhs, lower, unitriangular), False, left)

    def cholesky(self: Tensor, upper: bool = False) -> Tensor:
        """L with self = L @ L^T for symmetric positive-definite self, reading its lower triangle only (L^T if
        upper): torch.linalg.cholesky. NaN where a leading minor is not positive."""
        from ember.tensor import Tensor
        n = _square(self, "cholesky")
        if 0 < n <= SCALAR_LIMIT:
            low = matrix(cholesky_elements(elements(self)))
            return low.transpose(-2, -1) if upper else low
        rows, cols = Tensor.arange(n, device=self.device).reshape(n, 1), Tensor.arange(n, device=self.device)
        lower = self.zeros_like()
        for j in range(n):
            rest = self[..., :, j] - (lower * lower[..., j:j + 1, :]).sum(-1) if j else self[..., :, j]
            root = rest[..., j:j + 1].sqrt()
            column = rows[:, 0].eq(j).where(root, rows[:, 0].gt(j).where(rest / root, 0))
            lower = cols.eq(j).where(column.unsqueeze(-1), lower)
        return lower.transpose(-2, -1) if upper else lower

    def cholesky_solve(self: Tensor, factor: Tensor, *, upper: bool = False) -> Tensor:
        """x with A x = self where A = L L^T (factor = L) or U^T U (factor = U, upper): torch.cholesky_solve(self,
        factor). Two triangular solves: the path for symmetric positive-definite systems."""
        lower = factor.transpose(-2, -1) if upper else factor
        return lower.transpose(-2, -1).solve_triangular(lower.solve_triangular(self, upper=False), upper=True)
