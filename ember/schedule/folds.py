"""One loop where two compute the same carries: a scheduling step over FOLD nodes (ember/scan.py builds them).

Before: a SINK whose FOLDs may include a rollout (it emits ys) and a replay of the same steps that only records its
carries (reverse mode's, gradient.py grad_fold). After: the replay read from the rollout's carries, so the steps run
once.
"""

from __future__ import annotations

from ember.device import Buffer, Device, buffer_uop
from ember.dtype import DType, dtypes
from ember.helpers import prod
from ember.uop.ops import Ops, UOp
from ember.uop.upat import substitute


def placeholder_uop(shape: tuple[int, ...], dtype: DType) -> UOp:
    """A value a body is traced on: a view of a buffer that no kernel fills."""
    buf = buffer_uop(Buffer(Device.DEFAULT, prod(shape), dtype))
    return UOp(Ops.RESHAPE, dtype, (buf,), shape)


_stand_ins: dict[tuple[str, int, tuple[int, ...], DType], UOp] = {}


def stand_in(role: str, i: int, like: UOp) -> UOp:
    """One placeholder per (role, position, shape, dtype), the same for every FOLD: two bodies traced apart that
    compute the same from their placeholders become the same graph once these replace them."""
    key = (role, i, like.shape, like.dtype)
    if key not in _stand_ins: _stand_ins[key] = placeholder_uop(like.shape, like.dtype)
    return _stand_ins[key]


def carry_updates(u: UOp) -> tuple[UOp, ...]:
    """A FOLD's next carries with its placeholders replaced by stand-ins: equal for two FOLDs whose steps update
    their carries alike, however apart their bodies were traced."""
    a = u.arg
    mapping = {p: stand_in(role, i, p) for role, ps in (("carry", a.carry), ("x", a.x), ("param", a.params))
               for i, p in enumerate(ps)}
    return substitute(UOp(Ops.SINK, dtypes.void, a.out[:-1]), mapping).src


def share_folds(sink: UOp) -> UOp:
    """sink with every FOLD that has no y read from another FOLD over the same sources and length whose carries
    step alike and that also emits ys: a function returning a rollout and its reverse-mode jacobian runs the steps
    once, not once for the rollout and again for the replay that records the carries (gradient.py grad_fold)."""
    folds = [u for u in sink.toposort() if u.op is Ops.FOLD]
    if len(folds) < 2: return sink
    emitting = {}
    for u in folds:
        if u.arg.y_size: emitting.setdefault((u.arg.length, u.src, carry_updates(u)), u)
    mapping = {}
    for u in folds:
        if u.arg.y_size or (other := emitting.get((u.arg.length, u.src, carry_updates(u)))) is None: continue
        mapping[u] = UOp(Ops.SHRINK, u.dtype, (other,), ((0, u.arg.carry_size),))
    return substitute(sink, mapping) if mapping else sink
