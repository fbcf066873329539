"""UOp construction, identity, graph walks, printing and value ranges."""

from __future__ import annotations

import gc
import itertools
import math
import pickle
import weakref
from collections.abc import Callable

import pytest

from ember.dtype import dtypes
from ember.uop.interpret import evaluate
from ember.uop.ops import AxisKind, Ops, UOp, UOpMetaClass, print_graph, render_tree
from ember.uop.symbolic import simplify
from ember.uop.upat import PatternMatcher, UPat, graph_rewrite

# ---- hash-consing ----------------------------------------------------------------------------------------------


def test_same_fields_give_the_same_node():
    a = UOp.variable("a", 0, 10)
    assert UOp.variable("a", 0, 10) is a
    assert a + 1 is a + 1
    assert UOp(Ops.ADD, dtypes.int32, (a, UOp.const(dtypes.int32, 1))) is a + 1
    assert (a * 4 + 3) // 4 is (a * 4 + 3) // 4
    assert UOp.const(dtypes.float32, 0.1) is UOp.const(dtypes.float32, 0.1)


@pytest.mark.parametrize("other", [
    lambda: UOp.variable("a", 0, 11),  # other arg
    lambda: UOp.variable("b", 0, 10),
    lambda: UOp.variable("a", 0, 10, dtypes.int64),  # other dtype
    lambda: UOp(Ops.DEFINE_VAR, dtypes.int32, (UOp.const(dtypes.int32, 0),), UOp.variable("a", 0, 10).arg),  # src
    lambda: UOp(Ops.SPECIAL, dtypes.int32, (), UOp.variable("a", 0, 10).arg),  # other op
], ids=["arg-bound", "arg-name", "dtype", "src", "op"])
def test_any_other_field_gives_another_node(other):
    assert other() is not UOp.variable("a", 0, 10)


def test_positive_and_negative_zero_are_distinct_constants():
    pos, neg = UOp.const(dtypes.float32, 0.0), UOp.const(dtypes.float32, -0.0)
    assert pos is not neg
    assert math.copysign(1.0, pos.arg) == 1.0 and math.copysign(1.0, neg.arg) == -1.0
    assert UOp.const(dtypes.float32, -0.0) is neg and UOp.const(dtypes.float32, 0.0) is pos


def test_nan_constants_are_shared():
    assert UOp.const(dtypes.float32, math.nan) is UOp.const(dtypes.float32, math.nan)


def test_int_and_float_constants_are_distinct():
    assert UOp.const(dtypes.int32, 1) is not UOp.const(dtypes.float32, 1.0)
    assert UOp.const(dtypes.int32, True) is UOp.const(dtypes.int32, 1)  # wrapped to the dtype first


def test_replace_returns_the_node_itself_when_nothing_changes():
    a = UOp.variable("a", 0, 10)
    x = a + 1
    assert x.replace() is x and x.replace(src=x.src) is x
    assert x.replace(op=Ops.MUL) is a * 1
    assert x.cast(dtypes.int32) is x


def test_operators_build_alu_nodes():
    a = UOp.variable("a", 0, 10)
    three = UOp.const(dtypes.int32, 3)
    assert (a + 3).op is Ops.ADD and (a + 3).src == (a, three)
    assert (3 + a).src == (three, a) and (3 * a).src == (three, a) and (3 - a).src == (three, a)
    assert (a > 3) is (three < a) and (a < 3).dtype is dtypes.bool
    assert (a < 3).where(a, a + 1).dtype is dtypes.int32
    assert UOp.const(dtypes.float32, 2.0) * 3 is UOp.const(dtypes.float32, 2.0) * UOp.const(dtypes.float32, 3.0)


def test_where_with_a_python_scalar_branch_keeps_the_value_dtype():  # regression: the scalar became a bool
    a = UOp.variable("a", 0, 10)
    x = (a < 3).where(a, 0)
    assert x.dtype is dtypes.int32 and x.src[2] is UOp.const(dtypes.int32, 0)
    assert evaluate(x, {a: 2}) == 2
    y = (a < 3).where(2.5, UOp.const(dtypes.float32, 1.0))
    assert y.dtype is dtypes.float32 and y.src[1] is UOp.const(dtypes.float32, 2.5)


@pytest.mark.parametrize("build, op", [(lambda a: 7 // a, Ops.IDIV), (lambda a: 7 % a, Ops.MOD),
                                       (lambda a: 7 & a, Ops.AND), (lambda a: 7 | a, Ops.OR),
                                       (lambda a: 7 ^ a, Ops.XOR), (lambda a: 7 << a, Ops.SHL),
                                       (lambda a: 7 >> a, Ops.SHR)],
                         ids=["rfloordiv", "rmod", "rand", "ror", "rxor", "rlshift", "rrshift"])
def test_reflected_operators_put_the_constant_first(build, op):
    a = UOp.variable("a", 1, 10)
    assert build(a) is UOp(op, dtypes.int32, (UOp.const(dtypes.int32, 7), a))


def test_pickle_round_trip_gives_the_same_node():
    x = (UOp.variable("a", 0, 10) * 4 + 3) // 4
    assert pickle.loads(pickle.dumps(x)) is x


def _fresh_graph(tag: str, n: int) -> UOp:
    x = UOp.variable(f"gc_{tag}", 0, 10)
    for i in range(n): x = x * 3 + i
    return x


def test_weak_cache_frees_dead_graphs():
    gc.collect()
    before = len(UOpMetaClass.cache)
    x = _fresh_graph("free", 1000)
    built = len(UOpMetaClass.cache)
    assert built >= before + 2000
    del x
    gc.collect()
    assert len(UOpMetaClass.cache) <= before


def test_weak_cache_frees_graphs_after_analysis_and_rewrite():
    x = _fresh_graph("analysed", 300)
    probe = weakref.ref(x.src[0])
    _ = x.vmin, x.vmax, x.ranges, x.toposort(), repr(x), x.render(), print_graph(x)
    s = simplify(x)
    simple_probe = weakref.ref(s)
    del x, s, _
    gc.collect()
    assert probe() is None and simple_probe() is None


def test_a_node_alive_elsewhere_stays_in_the_cache():
    x = _fresh_graph("alive", 10)
    inner = x.src[0]  # (... + 8) * 3
    del x
    gc.collect()
    assert inner.src[0] * 3 is inner  # rebuilding finds the surviving node, not a copy


# ---- toposort ---------------------------------------------------------------------------------------------------


def test_toposort_lists_sources_first_in_source_order():
    a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 10)
    x = a + b
    y = x * x
    z = y + a
    assert list(z.toposort()) == [a, b, x, y, z]
    assert list((b + a).toposort()) == [b, a, b + a]


def test_toposort_lists_each_shared_node_once():
    a = UOp.variable("a", 0, 10)
    x = a
    for _ in range(20): x = x + x  # 2**20 paths, 21 nodes
    order = list(x.toposort())
    assert len(order) == 21 and order[0] is a and order[-1] is x


def test_toposort_puts_every_node_after_its_sources():
    a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 10)
    nodes = [a, b]
    for i in range(60):  # a random-ish DAG with sharing
        nodes.append(nodes[(7 * i) % len(nodes)] * nodes[(3 * i + 1) % len(nodes)] + i)
    root = UOp.sink(*nodes[-5:])
    pos = {u: i for i, u in enumerate(root.toposort())}
    assert all(pos[s] < pos[u] for u in pos for s in u.src)
    assert list(pos)[-1] is root


def test_toposort_descend_stops_below_a_node():
    a, b = UOp.variable("a", 0, 10), UOp.variable("b", 0, 10)
    y = (a + b) * 2
    z = y + a
    assert list(z.toposort(descend=lambda u: u.op is not Ops.MUL)) == [y, a, z]


# ---- deep graphs: a chain of 100,000 nodes --------------------------------------------------------------------

CHAIN = 100_000


@pytest.fixture(scope="module")
def chain():
    a = UOp.variable("a", 0, 10)
    x = a
    for _ in range(CHAIN): x = x + 1
    return a, x


def test_toposort_of_deep_chain(chain):
    a, x = chain
    order = list(x.toposort())
    assert len(order) == CHAIN + 2  # a, the constant 1 and the adds
    assert order[0] is a and order[-1] is x


def test_vmin_vmax_of_deep_chain(chain):
    a, x = chain
    assert (x.vmin, x.vmax) == (CHAIN, CHAIN + 10)


def test_graph_rewrite_of_deep_chain_in_both_orders(chain):
    a, x = chain
    pm = PatternMatcher([(UPat.var("x") + 1, lambda x: x - 1)])
    top_down = graph_rewrite(x, pm)
    bottom_up = graph_rewrite(x, pm, bottom_up=True)
    assert top_down is bottom_up
    assert top_down.op is Ops.SUB and evaluate(top_down, {a: 3}) == 3 - CHAIN


def test_simplify_of_deep_int_chain(chain):
    a, x = chain
    assert simplify(x) is a + CHAIN


def test_printing_deep_chain_does_not_recurse(chain):
    a, x = chain
    text = print_graph(x)
    assert text.count("\n") == CHAIN + 1 and text.splitlines()[-1].startswith(f"n{CHAIN + 1} = UOp(Ops.ADD")
    assert repr(x).startswith("UOp(Ops.ADD, dtypes.int32, src=(")  # repr prints three levels


def test_render_tree_of_deep_chain(chain):
    a, x = chain
    small = a
    for _ in range(2000): small = small + 1
    # linear in the node count (indentation is capped); checked on a small chain first, since a quadratic printer
    # would need ~10 GB for the big one
    assert len(render_tree(small)) < 200 * 2000
    text = render_tree(x)
    assert len(text) < 200 * CHAIN
    lines = text.splitlines()
    assert lines[0] == "UOp(Ops.ADD, dtypes.int32, src=(" and lines[-1] == "))"
    assert sum(line.lstrip().startswith("UOp(Ops.ADD") for line in lines) == CHAIN


def test_render_tree_marks_shared_nodes():
    a = UOp.variable("a", 0, 10)
    text = render_tree((a + 1) * (a + 1))
    assert text.count("UOp(Ops.ADD") == 1 and "x1" in text


# ---- vmin / vmax against brute force ---------------------------------------------------------------------------

x_ = UOp.variable("x", -7, 9)
y_ = UOp.variable("y", -3, 4)
p_ = UOp.variable("p", 0, 11)
d_ = UOp.variable("d", 1, 4)
n_ = UOp.variable("n", 1, 6)
r5 = UOp.range(5, 0)
rn = UOp.range(n_, 1, AxisKind.REDUCE)

# (name, expression, bounds are exact). Every expression's bounds must contain every value; `exact` ones must be tight.
BOUNDS: list[tuple[str, Callable[[], UOp], bool]] = [
    ("define_var", lambda: x_, True),
    ("range", lambda: r5, True),
    ("range with a variable end", lambda: rn, True),
    ("add", lambda: x_ + y_, True),
    ("add const", lambda: x_ + 5, True),
    ("sub", lambda: x_ - y_, True),
    ("neg", lambda: -x_, True),
    ("mul", lambda: x_ * y_, True),
    ("mul by negative const", lambda: x_ * -3, True),
    ("mul of ranges", lambda: r5 * rn, True),
    ("idiv by const", lambda: x_ // 3, True),
    ("idiv by negative const", lambda: x_ // -2, True),
    ("idiv of non-negative", lambda: p_ // 4, True),
    ("idiv by variable", lambda: p_ // d_, False),
    ("mod by const", lambda: x_ % 3, True),
    ("mod of non-negative", lambda: p_ % 4, True),
    ("mod below the divisor", lambda: p_ % 12, True),
    ("mod by negative const", lambda: x_ % -3, False),
    ("mod by variable", lambda: p_ % d_, True),
    ("mod of signed by variable", lambda: x_ % d_, True),
    ("max", lambda: x_.maximum(y_), True),
    ("max of the wider second", lambda: y_.maximum(x_), True),
    ("max const", lambda: x_.maximum(2), True),
    ("cmplt undecided", lambda: x_ < y_, True),
    ("cmplt at the top of the range", lambda: p_ < 11, True),
    ("cmplt just above the range", lambda: p_ < 12, True),
    ("cmplt decided true", lambda: y_ < 10, True),
    ("cmplt decided false", lambda: p_ < 0, True),
    ("cmpne", lambda: x_.ne(y_), True),
    ("cmpeq decided", lambda: p_.eq(-1), True),
    ("where undecided", lambda: (x_ < y_).where(x_, y_ * 2), False),
    ("where decided", lambda: (p_ < 20).where(y_, x_), True),
    ("where of consts", lambda: (x_ < 0).where(-4, 7), True),
    ("and of non-negative", lambda: p_ & 6, False),
    ("shl", lambda: p_ << 2, True),
    ("shr", lambda: x_ >> 1, True),
    ("cast to int8", lambda: x_.cast(dtypes.int8), True),
    ("cast of bool", lambda: (x_ < y_).cast(dtypes.int32), True),
    ("index arithmetic", lambda: ((p_ * 3 + y_) // 4) % 3 + r5 * 2, False),
]


def _points(expr: UOp) -> list[dict[UOp, int]]:
    """Every assignment of the variables and ranges of expr (a range runs below its end at that point)."""
    leaves = [u for u in expr.toposort() if u.op in (Ops.DEFINE_VAR, Ops.RANGE)]
    variables = [u for u in leaves if u.op is Ops.DEFINE_VAR]
    ranges = [u for u in leaves if u.op is Ops.RANGE]
    out = []
    for vals in itertools.product(*[range(v.arg.min, v.arg.max + 1) for v in variables]):
        env = dict(zip(variables, vals))
        ends = [evaluate(r.src[0], env) for r in ranges]
        out += [{**env, **dict(zip(ranges, rv))} for rv in itertools.product(*[range(e) for e in ends])]
    return out


@pytest.mark.parametrize("build, exact", [c[1:] for c in BOUNDS], ids=[c[0] for c in BOUNDS])
def test_vmin_vmax_contain_every_value(build, exact):
    expr = build()
    for node in expr.toposort():  # every subexpression, not only the root
        if node.dtype is dtypes.void: continue
        values = [evaluate(node, env) for env in _points(node)]
        assert node.vmin <= min(values) and max(values) <= node.vmax, \
            f"{node.render()}: values [{min(values)}, {max(values)}] outside [{node.vmin}, {node.vmax}]"
    values = [evaluate(expr, env) for env in _points(expr)]
    if exact: assert (expr.vmin, expr.vmax) == (min(values), max(values))


def test_vmin_vmax_of_possible_overflow_is_the_whole_dtype():
    big = UOp.variable("big", 0, 2**30)
    for expr in (big * 4, big + big, -big - big - big):
        assert (expr.vmin, expr.vmax) == (dtypes.int32.min, dtypes.int32.max)
    assert evaluate(big * 4, {big: 2**29}) == dtypes.int32.min  # the wrapped value is inside the bounds
    u = UOp.variable("u", 0, 5, dtypes.uint8)
    assert ((u - 1).vmin, (u - 1).vmax) == (0, 255)
