"""Which UOps are legal after each stage. With SPEC=1, graph_rewrite checks a named stage's output here.

A spec is a list of checks, each a function of one node returning a message when the node breaks a rule. The rules
common to all stages (operand dtypes of ALU ops) come first; each stage adds what must no longer appear.
"""

from __future__ import annotations

from collections.abc import Callable

from ember.dtype import PtrDType, dtypes
from ember.errors import SpecError
from ember.uop.ops import GroupOp, Ops, UOp

Check = Callable[[UOp], str | None]


def alu_operands_agree(u: UOp) -> str | None:
    """Binary ALU ops take one dtype on both sides; comparisons give bool (one per lane of a vector); WHERE takes a
    bool condition with a lane per lane of its values."""
    if u.op in GroupOp.Binary and u.op not in (Ops.SHL, Ops.SHR) and u.src[0].dtype != u.src[1].dtype:
        return f"operands of {u.op.name} differ: {u.src[0].dtype} and {u.src[1].dtype}"
    if u.op in GroupOp.Comparison and u.dtype != dtypes.bool.vec(u.src[0].dtype.count):
        return f"{u.op.name} must give bool, gives {u.dtype}"
    if u.op is Ops.WHERE and u.src[0].dtype != dtypes.bool.vec(u.dtype.count):
        return f"WHERE condition is {u.src[0].dtype}, not bool"
    return None


def no_tensor_level_ops(u: UOp) -> str | None:
    """After rangeify: no movement op, REDUCE_AXIS or value-level INDEX is left."""
    if u.op in GroupOp.Movement or u.op in (Ops.REDUCE_AXIS, Ops.ARANGE, Ops.GATHER, Ops.SCATTER_ADD):
        return f"{u.op.name} survived rangeify"
    if u.op is Ops.INDEX and not isinstance(u.dtype, PtrDType): return "a tensor-level INDEX survived rangeify"
    if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is not Ops.INDEX: return f"{u.op.name} must go through INDEX"
    return None


def reads_in_bounds(u: UOp) -> str | None:
    """After rangeify: a read or write with no gate (or a gate that is always true) has an offset whose bounds lie
    inside its buffer. The offset's loads and arithmetic run whatever a WHERE around them decides, so the gate
    that keeps a position in bounds must stay on the INDEX itself."""
    if u.op not in (Ops.LOAD, Ops.STORE) or u.src[0].op is not Ops.INDEX: return None
    idx = u.src[0]
    if idx.src[0].op is not Ops.DEFINE_GLOBAL: return None
    if len(idx.src) > 2 and not (idx.src[2].op is Ops.CONST and idx.src[2].arg): return None
    offset, size = idx.src[1], idx.src[0].dtype.size  # type: ignore[attr-defined]  # a DEFINE_GLOBAL's is a PtrDType
    # a vector load with a gate per lane (codegen/expand.partial_load) reads only the lanes whose gate is true
    lanes = u.src[1:] if u.op is Ops.LOAD else ()
    if any(g.op is not Ops.CONST for g in lanes): return None
    read = [i for i, g in enumerate(lanes) if g.arg] if lanes else [0]
    lo, hi = offset.vmin + read[0], offset.vmax + read[-1]
    if 0 <= lo and hi < size: return None
    return f"an ungated access of buffer {idx.src[0].arg} ({size} elements) at offsets {lo}..{hi}"


def no_reduce(u: UOp) -> str | None:
    """After lower: reductions are accumulator loops."""
    return "REDUCE survived lowering" if u.op is Ops.REDUCE else None


STAGE_CHECKS: dict[str, list[Check]] = {
    "rangeify": [alu_operands_agree, no_tensor_level_ops, reads_in_bounds],
    "lower": [alu_operands_agree, no_tensor_level_ops, reads_in_bounds, no_reduce],
}


def check_stage(sink: UOp, stage: str) -> None:
    """Raise SpecError naming the stage, the node and the rule when `sink` breaks the stage's spec."""
    checks = STAGE_CHECKS.get(stage, [alu_operands_agree])
    for u in sink.toposort():
        for check in checks:
            if (problem := check(u)) is not None:
                raise SpecError(f"spec after {stage}: {problem}\n  at {u.op.name} {u.dtype} ({check.__name__})")
    if stage == "lower":
        ends = [u.src[1] for u in sink.toposort() if u.op is Ops.END]
        ranges = [u for u in sink.toposort() if u.op is Ops.RANGE]
        if sorted(r.arg.axis for r in ranges) != sorted(r.arg.axis for r in ends):
            raise SpecError(f"spec after lower: every RANGE needs exactly one END; ranges {len(ranges)}, "
                            f"ends {len(ends)}")
