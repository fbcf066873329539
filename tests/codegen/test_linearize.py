"""linearize orders a lowered kernel: sources first, loops well nested, loop-invariant code outside the loop.

Input: rangeified and lowered ASTs of small programs. Checks: the ordering facts of the module docstring on every
program, hoisting on kernels with a known invariant value, and the same list on every run (also across processes
with other hash seeds). Each test also runs with SPEC=1.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from ember import Tensor
from ember.codegen.linearize import linearize
from ember.codegen.lowerer import lower
from ember.codegen.rangeify import rangeify
from ember.helpers import Context
from ember.uop.ops import Ops, UOp


@pytest.fixture(params=[0, 1], ids=["spec0", "spec1"], autouse=True)
def spec(request: pytest.FixtureRequest) -> Iterator[int]:
    with Context(SPEC=request.param): yield request.param


def f32(*shape: int) -> Tensor:
    return Tensor(np.arange(math.prod(shape), dtype=np.float32).reshape(shape))


def softmax(x: Tensor) -> Tensor:
    e = (x - x.max(axis=1, keepdim=True)).exp()
    return e / e.sum(1, keepdim=True)


PROGRAMS: list[tuple[str, Callable[[], Tensor]]] = [
    ("elementwise", lambda: f32(4, 6) * 2 + 1),
    ("scalar", lambda: f32(1) + 1),
    ("sum_all", lambda: f32(4, 6).sum()),
    ("sum_axis_scaled", lambda: (f32(4, 6) * f32(4).reshape(4, 1)).sum(1)),
    ("matmul", lambda: f32(3, 4) @ f32(4, 5)),
    ("nested", lambda: f32(4, 6).sum(1).sum(0)),
    ("two_sibling_reduces", lambda: f32(4, 6).sum(1) * f32(4, 6).max(axis=1)),
    ("padded_transposed", lambda: f32(3, 4).pad(((1, 0), (0, 2))).T.sum(0)),
    ("softmax", lambda: softmax(f32(4, 6))),
]


def lowered_kernels(build: Callable[[], Tensor]) -> list[UOp]:
    return [lower(rangeify(item.ast)) for item in build().schedule()]


def loops_around(uops: list[UOp]) -> dict[UOp, list[UOp]]:
    """For each node, the RANGEs whose loops enclose it in the list, outermost first."""
    open_loops: list[UOp] = []
    around: dict[UOp, list[UOp]] = {}
    for u in uops:
        if u.op is Ops.END:
            assert open_loops and open_loops[-1] is u.src[1], "an END closes the innermost open loop"
            open_loops.pop()
        around[u] = list(open_loops)
        if u.op is Ops.RANGE: open_loops.append(u)
    assert not open_loops, "every loop is closed"
    return around


@pytest.mark.parametrize("name, build", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_every_node_once_and_after_its_sources(name: str, build: Callable[[], Tensor]):
    for sink in lowered_kernels(build):
        uops = linearize(sink)
        assert len(uops) == len(set(uops)) and set(uops) == set(sink.toposort())
        position = {u: i for i, u in enumerate(uops)}
        for u in uops:
            for s in u.src: assert position[s] < position[u], f"{s.op} used by {u.op} before it is defined"
        assert uops[-1] is sink


@pytest.mark.parametrize("name, build", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_loops_nest_and_hold_exactly_their_body(name: str, build: Callable[[], Tensor]):
    for sink in lowered_kernels(build):
        uops = linearize(sink)
        position = {u: i for i, u in enumerate(uops)}
        end_of = {u.src[1]: u for u in uops if u.op is Ops.END}
        around = loops_around(uops)
        for u in uops:
            if u.op in (Ops.RANGE, Ops.END): continue
            for r in u.ranges:
                assert position[r] < position[u] < position[end_of[r]], f"{u.op} outside the loop of r{r.arg.axis}"
            if around[u]:  # hoisted: the innermost loop around a node is one it depends on
                assert around[u][-1] in u.ranges, f"{u.op} sits in loop r{around[u][-1].arg.axis} it does not use"


def test_loop_invariant_load_is_hoisted_out_of_the_reduce_loop():
    (sink,) = lowered_kernels(lambda: (f32(4, 6) * f32(4).reshape(4, 1)).sum(1))
    uops = linearize(sink)
    position = {u: i for i, u in enumerate(uops)}
    (reduce_range,) = [u for u in uops if u.op is Ops.RANGE and u.arg.axis == 1]
    (reduce_end,) = [u for u in uops if u.op is Ops.END and u.src[1] is reduce_range]
    (row_scale,) = [u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_GLOBAL
                    and u.src[0].src[0].arg == 2]
    (element,) = [u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_GLOBAL
                  and u.src[0].src[0].arg == 1]
    assert position[row_scale] < position[reduce_range], "a load that depends only on the row runs once per row"
    assert position[reduce_range] < position[element] < position[reduce_end]


def test_row_offset_is_computed_outside_the_inner_loop():
    (sink,) = lowered_kernels(lambda: f32(3, 4) @ f32(4, 5))
    uops = linearize(sink)
    around = loops_around(uops)
    row_only = [u for u in uops if u.op is Ops.MUL and u.dtype.is_int and [r.arg.axis for r in u.ranges] == [0]]
    assert row_only, "the matmul reads a[r0*4 + r2]: r0*4 depends on the row only"
    for u in row_only: assert [r.arg.axis for r in around[u]] == [0]


def test_sibling_reduce_loops_do_not_nest():
    (sink,) = lowered_kernels(lambda: f32(4, 6).sum(1) * f32(4, 6).max(axis=1))
    around = loops_around(linearize(sink))
    ranges = [u for u in around if u.op is Ops.RANGE]
    assert len(ranges) == 3
    assert sorted(len(around[r]) for r in ranges) == [0, 1, 1], "two reduce loops side by side in the row loop"


def test_constants_and_buffers_sit_at_top_level():
    (sink,) = lowered_kernels(lambda: (f32(4, 6) * 3).sum(1))
    around = loops_around(linearize(sink))
    for u, loops in around.items():
        if u.op in (Ops.CONST, Ops.DEFINE_GLOBAL, Ops.DEFINE_REG): assert loops == [], f"{u.op} inside a loop"


def test_sum_over_an_empty_axis_reads_no_memory():
    """A reduction over an axis of size 0 is its identity: no loop that never runs, no read hoisted out of one."""
    (sink,) = lowered_kernels(lambda: Tensor(np.zeros((4, 0), np.float32)).sum(1))
    uops = linearize(sink)
    assert not [u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_GLOBAL]
    assert Tensor(np.zeros((4, 0), np.float32)).sum(1).tolist() == [0.0] * 4


@pytest.mark.parametrize("name, build", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_same_list_on_every_run(name: str, build: Callable[[], Tensor]):
    for first, second in zip(lowered_kernels(build), lowered_kernels(build), strict=True):
        assert first is second
        a, b = linearize(first), linearize(second)
        assert len(a) == len(b) and all(x is y for x, y in zip(a, b))


SCRIPT = """
import numpy as np
from ember import Tensor
from ember.codegen.linearize import linearize
from ember.codegen.lowerer import lower
from ember.codegen.rangeify import rangeify
x = Tensor(np.ones((4, 6), np.float32))
e = (x - x.max(axis=1, keepdim=True)).exp()
for t in (e / e.sum(1, keepdim=True), Tensor(np.ones((3, 4), np.float32)) @ Tensor(np.ones((4, 5), np.float32))):
    for item in t.schedule():
        print([(u.op.name, str(u.arg), [s.op.name for s in u.src]) for u in linearize(lower(rangeify(item.ast)))])
"""


def test_same_list_in_processes_with_other_hash_seeds(spec: int):
    def run(seed: str) -> str:
        env = {**os.environ, "PYTHONHASHSEED": seed, "SPEC": str(spec)}
        return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                              check=True, timeout=60).stdout
    first = run("1")
    assert first.count("\n") == 4 and first == run("12345")
