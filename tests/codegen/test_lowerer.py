"""lower replaces every REDUCE with an accumulator register and closes every RANGE with exactly one END.

Input: the rangeified ASTs of small programs. Checks: the facts the module docstring promises after the stage, and
the identity each reduction starts from. Each test also runs with SPEC=1.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from ember import Tensor
from ember.codegen.lowerer import lower
from ember.codegen.rangeify import rangeify
from ember.dtype import AddrSpace
from ember.errors import SpecError
from ember.helpers import Context
from ember.uop.ops import Ops, UOp
from ember.uop.spec import check_stage


@pytest.fixture(params=[0, 1], ids=["spec0", "spec1"], autouse=True)
def spec(request: pytest.FixtureRequest) -> Iterator[int]:
    with Context(SPEC=request.param): yield request.param


def f32(*shape: int) -> Tensor:
    return Tensor(np.arange(math.prod(shape), dtype=np.float32).reshape(shape))


PROGRAMS: list[tuple[str, Callable[[], Tensor]]] = [
    ("elementwise", lambda: f32(4, 6) * 2 + 1),
    ("scalar", lambda: f32(1) + 1),
    ("sum_all", lambda: f32(4, 6).sum()),
    ("sum_axis", lambda: f32(4, 6).sum(1)),
    ("max_axis0", lambda: f32(4, 6).max(axis=0)),
    ("matmul", lambda: f32(3, 4) @ f32(4, 5)),
    ("nested", lambda: f32(4, 6).sum(1).sum(0)),
    ("two_reduces", lambda: f32(4, 6).sum(1) * f32(4, 6).max(axis=1)),
    ("sum_3d_middle", lambda: f32(2, 3, 4).sum(1)),
]


def rangeified(build: Callable[[], Tensor]) -> UOp:
    (item,) = build().schedule()
    return rangeify(item.ast)


def of(sink: UOp, op: Ops) -> list[UOp]:
    return [u for u in sink.toposort() if u.op is op]


@pytest.mark.parametrize("name, build", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_no_reduce_survives_and_each_became_a_register(name: str, build: Callable[[], Tensor]):
    before = rangeified(build)
    after = lower(before)
    assert of(after, Ops.REDUCE) == []
    regs = of(after, Ops.DEFINE_REG)
    assert len(regs) == len(of(before, Ops.REDUCE))
    assert sorted(r.arg for r in regs) == list(range(len(regs)))
    assert all(r.dtype.addrspace is AddrSpace.REG and r.dtype.size == 1 for r in regs)


@pytest.mark.parametrize("name, build", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_every_range_closed_by_exactly_one_end(name: str, build: Callable[[], Tensor]):
    after = lower(rangeified(build))
    ends = Counter(e.src[1] for e in of(after, Ops.END))
    assert set(ends) == set(of(after, Ops.RANGE))
    assert set(ends.values()) <= {1}
    assert all(e.src[1].op is Ops.RANGE and len(e.src) == 2 for e in of(after, Ops.END))
    for u in after.src: assert u.op is not Ops.STORE or not u.ranges, "a STORE under the SINK is left open"
    assert after.ranges == (), "nothing is open at the SINK"
    check_stage(after, "lower")


@pytest.mark.parametrize("name, build", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_lower_is_idempotent(name: str, build: Callable[[], Tensor]):
    once = lower(rangeified(build))
    assert lower(once) is once


def test_output_loops_close_innermost_first():
    after = lower(rangeified(lambda: f32(4, 6) * 2))
    (outer,) = after.src
    assert outer.op is Ops.END and outer.src[0].op is Ops.END and outer.src[0].src[0].op is Ops.STORE
    assert outer.src[1].arg.axis < outer.src[0].src[1].arg.axis


def test_elementwise_kernel_only_gets_ends():
    before = rangeified(lambda: f32(4, 6) * 2)
    after = lower(before)
    assert of(after, Ops.DEFINE_REG) == []
    assert set(after.toposort()) - set(before.toposort()) == set(of(after, Ops.END)) | {after}


@pytest.mark.parametrize("build, identity", [
    (lambda: f32(4, 6).sum(1), 0.0), (lambda: f32(4, 6).max(axis=1), -math.inf), (lambda: f32(4, 6).prod(1), 1.0),
    (lambda: Tensor(np.ones((4, 6), np.int32)).max(axis=1), -2**31),
    (lambda: Tensor(np.ones((4, 6), np.int32)).sum(1), 0),
], ids=["sum", "max", "prod", "int_max", "int_sum"])
def test_accumulator_starts_at_the_identity(build: Callable[[], Tensor], identity: float):
    after = lower(rangeified(build))
    (reg,) = of(after, Ops.DEFINE_REG)
    inits = [s for s in of(after, Ops.STORE) if s.src[1].op is Ops.CONST and s.src[0].src[0].src[0] is reg]
    assert len(inits) == 1 and inits[0].src[1].arg == identity


def test_accumulator_restarts_in_every_output_step_and_is_read_after_its_loop():
    after = lower(rangeified(lambda: f32(4, 6).sum(1)))
    (reg,) = of(after, Ops.DEFINE_REG)
    (out_range,) = [r for r in of(after, Ops.RANGE) if r.arg.axis == 0]
    (red_range,) = [r for r in of(after, Ops.RANGE) if r.arg.axis == 1]
    init = next(s for s in of(after, Ops.STORE) if s.src[1].op is Ops.CONST)
    assert init.ranges == (out_range,), "set once per output element, outside the reduce loop"
    update = next(s for s in of(after, Ops.STORE) if s.src[0].src[0].src[0] is reg and s is not init)
    assert set(update.ranges) == {out_range, red_range}
    (red_end,) = [e for e in of(after, Ops.END) if e.src[1] is red_range]
    assert red_end.src[0] is update
    result = [u for u in of(after, Ops.AFTER) if red_end in u.src]
    assert len(result) == 1 and result[0].src[0] is reg
    store = next(s for s in of(after, Ops.STORE) if s.src[0].src[0].op is Ops.DEFINE_GLOBAL)
    assert result[0] in store.toposort() and store.ranges == (out_range,)


def test_nested_reduce_restarts_inner_accumulator_in_outer_loop():
    after = lower(rangeified(lambda: f32(4, 6).sum(1).sum(0)))
    inits = [s for s in of(after, Ops.STORE) if s.src[1].op is Ops.CONST]
    assert sorted(len(s.ranges) for s in inits) == [0, 1], "outer sum set once, inner sum once per outer step"


def test_spec_rejects_a_reduce_after_lower():
    with pytest.raises(SpecError, match="spec after lower: REDUCE survived lowering"):
        check_stage(rangeified(lambda: f32(4, 6).sum(1)), "lower")


@pytest.mark.parametrize("shape", [(1, 1, 16, 16), (2, 3, 16, 12)])
def test_an_unrolled_copy_that_ignores_the_outer_loop_still_restarts_in_it(shape: tuple[int, ...]):
    """A convolution of a constant input, its rows unrolled by 8: the middle rows' copies of the reduction read no
    value of the row loop (the window never reaches the padding there) and share one accumulator, but their loops
    merge with the edge rows' copies inside the row loop, so that accumulator must restart in each of its steps.
    Once it was set before the row loop and the second block of rows came out doubled."""
    import torch
    w = np.ones((4, shape[1], 3, 3), np.float32)
    want = torch.nn.functional.conv2d(torch.ones(shape), torch.tensor(w), padding=1).numpy()
    np.testing.assert_array_equal(Tensor.ones(*shape).conv2d(Tensor(w), padding=1).numpy(), want)
