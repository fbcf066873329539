"""UPat matching, PatternMatcher dispatch and order, graph_rewrite orders and fixed points, rewrite tracking."""

from __future__ import annotations

import os

import pytest

from ember.dtype import dtypes
from ember.helpers import Context
from ember.uop import upat
from ember.uop.ops import Ops, UOp
from ember.uop.upat import PatternMatcher, RewriteEvent, UPat, graph_rewrite, graph_rewrite_map

a = UOp.variable("a", 0, 10)
b = UOp.variable("b", 0, 10)
a64 = UOp.variable("a64", 0, 10, dtypes.int64)
one, two = UOp.const(dtypes.int32, 1), UOp.const(dtypes.int32, 2)


def matches(pat: UPat, uop: UOp) -> list[dict[str, UOp]]:
    return list(pat.match(uop, {}))


# ---- UPat ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("uop, hit", [(a + b, True), (a * b, True), (a - b, False), (a, False)],
                         ids=["add", "mul", "sub", "var"])
def test_upat_matches_op_set(uop, hit):
    assert bool(matches(UPat((Ops.ADD, Ops.MUL)), uop)) is hit
    assert bool(matches(UPat({Ops.ADD, Ops.MUL}), uop)) is hit


def test_upat_without_op_matches_anything():
    assert all(matches(UPat(), u) == [{}] for u in (a, one, a + b, (a < b).where(a, b)))


def test_upat_matches_dtype_or_dtype_set():
    assert matches(UPat(dtype=dtypes.int32), a) and not matches(UPat(dtype=dtypes.int32), a64)
    assert matches(UPat(dtype={dtypes.int32, dtypes.int64}), a64)
    assert not matches(UPat(dtype=dtypes.bool), a)
    assert matches(UPat(dtype=dtypes.bool), a < b)


def test_upat_scalar_dtype_matches_its_vectors():
    vec = UOp(Ops.VECTORIZE, dtypes.int32.vec(4), (a, a, a, a))
    assert matches(UPat(Ops.VECTORIZE, dtype=dtypes.int32), vec)
    assert not matches(UPat(Ops.VECTORIZE, dtype=dtypes.int64), vec)


def test_upat_ordered_src_matches_in_order_only():
    pat = UPat(Ops.SUB, src=(UPat.var("x"), UPat.cvar("c")))
    assert matches(pat, a - 1) == [{"x": a, "c": one}]
    assert matches(pat, 1 - a) == []


def test_upat_commutative_src_matches_either_order():
    pat = UPat(Ops.ADD, src=[UPat.var("x"), UPat.cvar("c")])
    assert matches(pat, a + 1) == [{"x": a, "c": one}]
    assert matches(pat, 1 + a) == [{"x": a, "c": one}]
    assert matches(pat, a + b) == []


def test_upat_commutative_src_yields_every_assignment():
    got = matches(UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")]), a + b)
    assert got == [{"x": a, "y": b}, {"x": b, "y": a}]


def test_upat_single_src_pattern_applies_to_every_source():
    pat = UPat(Ops.SINK, src=UPat(Ops.CONST))
    assert matches(pat, one.sink(two, one))
    assert not matches(pat, one.sink(a))


def test_upat_src_count_must_match():
    pat = UPat(Ops.SINK, src=(UPat.var("x"),))
    assert matches(pat, a.sink()) == [{"x": a}]
    assert matches(pat, a.sink(b)) == []


def test_upat_allow_any_len_matches_a_prefix_of_sources():
    pat = UPat(Ops.SINK, src=(UPat.var("x"), UPat.var("y")), allow_any_len=True)
    assert matches(pat, a.sink(b, one)) == [{"x": a, "y": b}]
    assert matches(pat, a.sink(b)) == [{"x": a, "y": b}]
    assert matches(pat, a.sink()) == []  # fewer sources than the pattern


def test_upat_matches_arg():
    assert matches(UPat(Ops.CONST, arg=1), one) and not matches(UPat(Ops.CONST, arg=2), one)
    assert matches(UPat(Ops.DEFINE_VAR, arg=a.arg), a) and not matches(UPat(Ops.DEFINE_VAR, arg=a.arg), b)
    assert matches(UPat.const(dtypes.float32, 1), UOp.const(dtypes.float32, 1.0))  # compared with ==


def test_upat_int_arg_does_not_match_bool_constant():
    assert not matches(UPat.const(None, 1), UOp.const(dtypes.bool, True))
    assert not matches(UPat.const(None, 0), UOp.const(dtypes.bool, False))


def test_upat_bool_arg_does_not_match_int_constant():  # regression: True matched 1, so where(c, 1, 0) became c
    assert not matches(UPat.const(None, True), one)


def test_upat_name_binds_the_matched_node():
    assert matches(UPat(Ops.ADD, name="root"), a + b) == [{"root": a + b}]


def test_upat_repeated_name_must_bind_the_same_node():
    pat = UPat.var("x") + UPat.var("x")
    assert matches(pat, a + a) == [{"x": a}, {"x": a}]  # both orders of the commutative add
    assert matches(pat, a + b) == []
    nested = UPat(Ops.ADD, src=(UPat.var("x") * 2, UPat.var("x")))
    assert matches(nested, a * 2 + a) == [{"x": a}]
    assert matches(nested, a * 2 + b) == []


def test_upat_operator_sugar_builds_the_patterns():
    add = UPat.var("x") + 0
    assert add.op == {Ops.ADD} and add.is_commutative
    assert matches(add, a + 0) == [{"x": a}] and matches(add, 0 + a) == [{"x": a}]
    div = UPat.var("x") // 2
    assert div.op == {Ops.IDIV} and not div.is_commutative
    assert matches(div, a // 2) == [{"x": a}] and matches(div, two // a) == []
    assert matches(UPat.var("x") < 3, a < 3) and not matches(UPat.var("x") < 3, a > 3)
    assert matches(UPat.var("x") > 3, a > 3) and not matches(UPat.var("x") > 3, a < 3)
    assert matches(-UPat.var("x"), -a) == [{"x": a}]
    assert matches(UPat.var("x") - UPat.var("y"), a - b) == [{"x": a, "y": b}]
    assert matches(UPat.var("x").maximum(UPat.var("y")), b.maximum(a))
    assert matches(UPat.var("x").ne(1), a.ne(1)) and matches(UPat.var("x").eq(1), a.eq(1))
    cond = UPat.var("c").where(UPat.var("x"), UPat.var("y"))
    assert matches(cond, (a < b).where(a, b)) == [{"c": a < b, "x": a, "y": b}]


def test_upat_named_copies_the_pattern_with_a_name():
    pat = (UPat.var("x") * 2).named("m")
    assert matches(pat, a * 2) == [{"x": a, "m": a * 2}]


# ---- PatternMatcher --------------------------------------------------------------------------------------------


def test_pattern_matcher_first_matching_rule_wins():
    pm = PatternMatcher([(UPat(Ops.ADD), lambda: one), (UPat(Ops.ADD), lambda: two)])
    assert pm.rewrite(a + b) is one


def test_pattern_matcher_sum_tries_left_rules_first():
    pm1 = PatternMatcher([(UPat(Ops.ADD), lambda: one)])
    pm2 = PatternMatcher([(UPat(Ops.ADD), lambda: two), (UPat(Ops.MUL), lambda: two)])
    assert (pm1 + pm2).rewrite(a + b) is one
    assert (pm2 + pm1).rewrite(a + b) is two
    assert (pm1 + pm2).rewrite(a * b) is two  # rules of the right side still apply


def test_pattern_matcher_rule_returning_none_or_itself_falls_through():
    pm = PatternMatcher([(UPat(Ops.ADD), lambda: None), (UPat(Ops.ADD, name="x"), lambda x: x),
                         (UPat(Ops.ADD), lambda: two)])
    assert pm.rewrite(a + b) is two
    assert PatternMatcher([(UPat(Ops.ADD), lambda: None)]).rewrite(a + b) is None


def test_pattern_matcher_tries_every_binding_of_a_commutative_pattern():
    # the first binding (x=a) makes the rule return None; the second (x=b) fires
    pm = PatternMatcher([(UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")]), lambda x, y: x if x is b else None)])
    assert pm.rewrite(a + b) is b


def test_pattern_matcher_only_tries_rules_for_the_op():
    calls: list[UOp] = []
    pm = PatternMatcher([(UPat(Ops.MUL, name="x"), lambda x: calls.append(x))])
    assert pm.rewrite(a + b) is None and calls == []
    pm.rewrite(a * b)
    assert calls == [a * b]


def test_pattern_matcher_passes_ctx_to_rules_that_ask():
    seen: list[object] = []

    def with_ctx(ctx, x):
        seen.append(ctx)
        return None

    pm = PatternMatcher([(UPat(Ops.ADD, name="x"), with_ctx), (UPat(Ops.ADD, name="x"), lambda x: x.src[0])])
    ctx = object()
    assert pm.rewrite(a + b, ctx) is a
    assert seen == [ctx]
    assert graph_rewrite((a + b).sink(), pm, ctx="the ctx") is a.sink()
    assert seen[1:] == ["the ctx"]


# ---- graph_rewrite ---------------------------------------------------------------------------------------------

decrement = PatternMatcher([
    (UPat(Ops.CONST, dtype=dtypes.int32, name="c"), lambda c: c.const_like(c.arg - 1) if c.arg > 0 else None),
    (UPat.var("x") + 0, lambda x: x),
])


def test_graph_rewrite_reaches_a_fixed_point():
    out = graph_rewrite(a + 5, decrement)
    assert out is a  # 5 -> 4 -> ... -> 0, then a + 0 -> a
    assert graph_rewrite((a + 3) * (b + 2), decrement) is a * b
    for u in graph_rewrite(((a + 3) * 4).sink(b + 1), decrement).toposort():
        assert decrement.rewrite(u) is None


def test_graph_rewrite_rewrites_what_a_rule_returns():
    pm = PatternMatcher([(UPat.var("x") * 2, lambda x: x + x), (UPat.var("x") + UPat.var("x"), lambda x: x << 1)])
    assert graph_rewrite((a * 2).sink(), pm) is (a << 1).sink()


def test_graph_rewrite_keeps_an_untouched_graph():
    g = ((a * 4 + b) // 4).sink(a - 1)
    assert graph_rewrite(g, PatternMatcher([])) is g


def test_graph_rewrite_shares_rewritten_nodes():
    shared = a * 2
    pm = PatternMatcher([(UPat.var("x") * 2, lambda x: x + x)])
    out = graph_rewrite(shared.sink(shared + 1), pm)
    assert out.src[0] is out.src[1].src[0] is a + a


# parent rule sees MUL(x, 2); child rule turns MUL(x, 2) into ADD(x, x)
child_or_parent = PatternMatcher([
    (UPat.var("x") * 2 + UPat.var("y"), lambda x, y: x.maximum(y)),
    (UPat.var("x") * 2, lambda x: x + x),
])


def test_graph_rewrite_default_order_rewrites_sources_first():
    # the child becomes a + a before the parent is tried, so the parent rule never sees the MUL
    assert graph_rewrite(a * 2 + b, child_or_parent) is (a + a) + b


def test_graph_rewrite_bottom_up_tries_the_node_before_its_sources():
    assert graph_rewrite(a * 2 + b, child_or_parent, bottom_up=True) is a.maximum(b)


def test_graph_rewrite_bottom_up_also_rewrites_below():
    g = (a * 2).sink(b * 2 + a)
    assert graph_rewrite(g, child_or_parent, bottom_up=True) is (a + a).sink(b.maximum(a))


# ---- graph_rewrite_map -----------------------------------------------------------------------------------------

MAP_GRAPHS = [
    ("child then parent", lambda: (a * 2 + b).sink(b * 2)),
    ("rule replaces the root", lambda: (a * 2 + b) * 2 + a),
    ("shared subgraph", lambda: (a * 2).sink(a * 2 + b, (a * 2 + b) * 3)),
]


# regression (bottom_up): nodes below a node replaced before its sources were visited were left out of the map
@pytest.mark.parametrize("bottom_up", [False, True], ids=["default", "bottom_up"])
@pytest.mark.parametrize("build", [g[1] for g in MAP_GRAPHS], ids=[g[0] for g in MAP_GRAPHS])
def test_graph_rewrite_map_maps_every_input_node(build, bottom_up):
    g = build()
    mapping = graph_rewrite_map(g, child_or_parent, bottom_up=bottom_up)
    assert set(mapping) == set(g.toposort())
    assert mapping[g] is graph_rewrite(g, child_or_parent, bottom_up=bottom_up)


@pytest.mark.parametrize("build", [g[1] for g in MAP_GRAPHS], ids=[g[0] for g in MAP_GRAPHS])
def test_graph_rewrite_map_says_where_each_node_went(build):
    g = build()
    mapping = graph_rewrite_map(g, child_or_parent)
    for old, new in mapping.items():
        assert new is graph_rewrite(old, child_or_parent), old.render()
    assert mapping[a] is a and mapping[a * 2] is a + a


# ---- tracking rewrites -----------------------------------------------------------------------------------------


def double_to_add(x):
    return x + x


track_pm = PatternMatcher([(UPat.var("x") * 2, double_to_add)])
TRACK_LOCATION = f"{os.path.basename(__file__)}:{double_to_add.__code__.co_firstlineno}"


@pytest.fixture
def log():
    start = len(upat.rewrite_log)
    yield upat.rewrite_log
    del upat.rewrite_log[start:]


def test_track_rewrites_records_rule_location_before_and_after(log):
    start = len(log)
    with Context(TRACK_REWRITES=1):
        out = graph_rewrite((a * 2 + 1).sink(b * 2), track_pm, name="test stage")
    assert out is ((a + a) + 1).sink(b + b)
    events = log[start:]
    assert all(isinstance(e, RewriteEvent) for e in events)
    assert {(e.before, e.after) for e in events} == {(a * 2, a + a), (b * 2, b + b)}
    assert all(e.location == TRACK_LOCATION and e.stage == "test stage" for e in events)


def test_track_rewrites_records_nothing_when_off(log):
    start = len(log)
    with Context(TRACK_REWRITES=0):
        graph_rewrite((a * 2).sink(), track_pm)
    assert log[start:] == []


def test_track_rewrites_location_of_a_lambda_is_its_line(log):
    start = len(log)
    pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: x.src[0])])
    line = pm.rules[0].fn.__code__.co_firstlineno
    with Context(TRACK_REWRITES=1):
        assert pm.rewrite(a + b) is a
    location = f"{os.path.basename(__file__)}:{line}"
    assert [(e.location, e.before, e.after) for e in log[start:]] == [(location, a + b, a)]
