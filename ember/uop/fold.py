"""A FOLD node's parts, at the UOp level: what the scheduler, the derivative rules and the interpreter all read of a
loop built by ember.scan, without importing the Tensor front end that builds it."""

from __future__ import annotations

from collections.abc import Sequence

from ember.dtype import dtypes
from ember.uop.ops import FoldArg, Ops, UOp
from ember.uop.upat import substitute


def fold_parts(u: UOp) -> tuple[tuple[UOp, ...], tuple[UOp, ...], tuple[UOp, ...]]:
    """A FOLD's sources: (initial carries, xs (length, X_i) each, params)."""
    c, x = len(u.arg.carry), len(u.arg.x)
    return u.src[:c], u.src[c:c + x], u.src[c + x:]


def body_with(a: FoldArg, carry: Sequence[UOp], x: Sequence[UOp], params: Sequence[UOp]) -> list[UOp]:
    """The body's results (next carries, y) with its placeholders replaced by these values."""
    mapping = dict(zip(a.carry, carry, strict=True)) | dict(zip(a.x, x, strict=True)) | \
        dict(zip(a.params, params, strict=True))
    return list(substitute(UOp(Ops.SINK, dtypes.void, a.out), mapping).src)
