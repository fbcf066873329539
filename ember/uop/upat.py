"""Pattern rewriting, the one mechanism every stage uses: `UPat`, `PatternMatcher`, `graph_rewrite`.

A rule is a row `(UPat, fn)`: when the pattern matches a node, `fn` gets the bound names (and `ctx` if it asks for
it) and returns the replacement, or None for "does not apply". Rules are indexed by op, so a node only meets the
rules that can fire on it. `graph_rewrite` applies a matcher to a whole graph until nothing changes.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ember.dtype import DType
from ember.helpers import DEBUG, SPEC, TRACK_REWRITES
from ember.uop.ops import GroupOp, MathMixin, Ops, UOp

Bindings = dict[str, Any]


class UPat(MathMixin):
    """A pattern over UOps.

    `op` and `dtype` may be one value or a set; `src` is a tuple (sources in order), a list (sources in any order),
    or one UPat (every source matches it); `arg` must be equal when given; `name` binds the matched node.
    """

    __slots__ = ("op", "dtype", "src", "arg", "name", "allow_any_len", "is_commutative")

    def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
                 src: tuple[UPat, ...] | list[UPat] | UPat | None = None, arg: Any = None, name: str | None = None,
                 allow_any_len: bool = False) -> None:
        self.op: frozenset[Ops] | None = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
        self.dtype: frozenset[DType] | None = None if dtype is None else \
            frozenset((dtype,) if isinstance(dtype, DType) else dtype)
        self.is_commutative = isinstance(src, list)
        self.src: tuple[UPat, ...] | UPat | None = tuple(src) if isinstance(src, (list, tuple)) else src
        self.arg, self.name, self.allow_any_len = arg, name, allow_any_len

    @staticmethod
    def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        """Any node, bound to `name`."""
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        """A constant, bound to `name`."""
        return UPat(Ops.CONST, dtype=dtype, name=name)

    @staticmethod
    def const(dtype: DType | Iterable[DType] | None, value: Any) -> UPat:
        """The constant `value` (compared with ==, so 1 matches 1.0)."""
        return UPat(Ops.CONST, dtype=dtype, arg=value)

    def const_like(self, value: Any) -> UPat: return UPat.const(None, value)

    def alu(self, op: Ops, *src: UPat) -> UPat:
        both = [self, *src]
        return UPat(op, src=both if op in GroupOp.Commutative else tuple(both))

    def named(self, name: str) -> UPat:
        out = UPat(self.op, self.dtype, None, self.arg, name, self.allow_any_len)
        out.src, out.is_commutative = self.src, self.is_commutative
        return out

    def __repr__(self) -> str:
        ops = "*" if self.op is None else "|".join(sorted(o.name for o in self.op))
        return f"UPat({ops}{', name=' + self.name if self.name else ''})"

    # ---- matching ------------------------------------------------------------------------------------------------

    def match(self, uop: UOp, bound: Bindings) -> Iterator[Bindings]:
        """Every way this pattern matches `uop`, each as the bindings extended from `bound`."""
        if self.op is not None and uop.op not in self.op: return
        if self.dtype is not None and uop.dtype not in self.dtype and uop.dtype.scalar not in self.dtype: return
        if self.arg is not None and (uop.arg != self.arg or (type(uop.arg) is bool) != (type(self.arg) is bool)):
            return  # == alone would let True match 1
        if self.name is not None:
            if self.name in bound:
                if bound[self.name] is not uop: return
            else:
                bound = {**bound, self.name: uop}
        if self.src is None:
            yield bound
            return
        if isinstance(self.src, UPat):
            yield from _match_all(tuple(self.src for _ in uop.src), uop.src, bound)
            return
        if len(self.src) != len(uop.src) and not (self.allow_any_len and len(uop.src) >= len(self.src)): return
        orders = itertools.permutations(self.src) if self.is_commutative else (self.src,)
        for pats in orders:
            yield from _match_all(pats, uop.src[:len(pats)], bound)


def _match_all(pats: tuple[UPat, ...], srcs: tuple[UOp, ...], bound: Bindings) -> Iterator[Bindings]:
    if not pats:
        yield bound
        return
    for b in pats[0].match(srcs[0], bound):
        yield from _match_all(pats[1:], srcs[1:], b)


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of a matcher, with what `graph_rewrite` needs to call it and to record it."""

    pattern: UPat
    fn: Callable[..., Any]
    wants_ctx: bool
    location: str
    needs_src_ops: frozenset[Ops]  # ops that must appear among a node's sources for the pattern to match


@dataclass(frozen=True, slots=True)
class RewriteEvent:
    """A rule that fired: where it is defined, the node before and its replacement."""

    stage: str
    location: str
    before: UOp
    after: Any


rewrite_log: list[RewriteEvent] = []  # filled while TRACK_REWRITES is set, for tests and a future visualizer


def _needed_src_ops(pattern: UPat) -> frozenset[Ops]:
    """The ops that sub-patterns naming exactly one op require among the sources."""
    if not isinstance(pattern.src, tuple): return frozenset()
    return frozenset(next(iter(p.op)) for p in pattern.src if p.op is not None and len(p.op) == 1)


def _location(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}" if code else repr(fn)


class PatternMatcher:
    """An ordered list of rules, indexed by the op each pattern matches. `pm1 + pm2` tries pm1's rules first."""

    def __init__(self, rules: list[tuple[UPat, Callable[..., Any]]]) -> None:
        self.rules = [Rule(p, fn, "ctx" in inspect.signature(fn).parameters, _location(fn), _needed_src_ops(p))
                      for p, fn in rules]
        self.by_op: dict[Ops, list[Rule]] = {op: [] for op in Ops}
        for rule in self.rules:
            for op in rule.pattern.op if rule.pattern.op is not None else Ops:
                self.by_op[op].append(rule)

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher([(r.pattern, r.fn) for r in self.rules + other.rules])

    def rewrite(self, uop: UOp, ctx: Any = None, stage: str = "") -> Any:
        """The replacement the first matching rule gives for `uop`, or None when no rule applies."""
        src_ops = {s.op for s in uop.src}
        for rule in self.by_op[uop.op]:
            if not rule.needs_src_ops <= src_ops: continue  # cheap early reject: e.g. `x + 0` needs a CONST source
            for bound in rule.pattern.match(uop, {}):
                out = rule.fn(ctx=ctx, **bound) if rule.wants_ctx else rule.fn(**bound)
                if out is not None and out is not uop:
                    if TRACK_REWRITES: rewrite_log.append(RewriteEvent(stage, rule.location, uop, out))
                    if DEBUG >= 6: print(f"{stage or 'rewrite'}: {rule.location} {uop.op.name} -> "
                                         f"{out.op.name if isinstance(out, UOp) else type(out).__name__}")
                    return out
        return None


# ---- applying a matcher to a graph -----------------------------------------------------------------------------

_VISIT, _REBUILD, _LINK, _EXPAND = 0, 1, 2, 3  # _EXPAND: visit the sources of a node no rule fires on


def _rewrite_to_fixed_point(pm: PatternMatcher, node: UOp, ctx: Any, stage: str, done: dict[UOp, UOp]) -> list[UOp]:
    """The nodes rules rewrite `node` through, `node` first, until none fires or a step lands on a node already
    rewritten (`done`). Every step is linked to the end, so a rule that makes fresh nodes (new loop axes) runs
    once per node however many paths reach it (`relu(x @ w)` reads the matmul directly and through a DETACH)."""
    chain = [node]
    while chain[-1] not in done and (new := pm.rewrite(chain[-1], ctx, stage)) is not None: chain.append(new)
    return chain


def _rewrite_graph(sink: UOp, pm: PatternMatcher, ctx: Any, bottom_up: bool, stage: str,
                   replace: dict[UOp, UOp] | None = None) -> dict[UOp, UOp]:
    """The engine of graph_rewrite: returns old -> new for every node it visited.

    Default order rewrites the sources of a node first, then the node (its rewrite sees rewritten sources).
    `bottom_up` tries the node before its sources, so a rule sees the original sources and may replace them.
    Whatever a rule returns is itself rewritten until nothing changes. Iterative: no recursion on deep graphs.
    """
    replace = {} if replace is None else replace
    stack: list[tuple[UOp, int, UOp | None]] = [(sink, _VISIT, None)]
    while stack:
        node, step, target = stack.pop()
        if node in replace: continue
        if step == _LINK:  # node was rewritten to target; its final form is target's
            assert target is not None
            replace[node] = replace[target]
            continue
        if step == _VISIT or step == _EXPAND:
            if step == _VISIT and bottom_up and len(chain := _rewrite_to_fixed_point(pm, node, ctx, stage,
                                                                                      replace)) > 1:
                # the chain ends on a node no rule fires on (or one already done): only its sources are left
                stack.extend([(n, _LINK, chain[-1]) for n in chain[:-1]] + [(chain[-1], _EXPAND, None)])
                continue
            stack.append((node, _REBUILD, None))
            stack.extend((s, _VISIT, None) for s in reversed(node.src) if s not in replace)
            continue
        new_src = tuple(replace[s] for s in node.src)
        rebuilt = node if all(a is b for a, b in zip(new_src, node.src, strict=True)) else node.replace(src=new_src)
        if bottom_up:
            if rebuilt is node: replace[node] = node
            else: stack.extend([(node, _LINK, rebuilt), (rebuilt, _VISIT, None)])
            continue
        new = pm.rewrite(rebuilt, ctx, stage)
        if new is None: replace[node] = replace[rebuilt] = rebuilt  # its sources are final and no rule fires
        else: stack.extend([(node, _LINK, new), (new, _VISIT, None)])
    return replace


def graph_rewrite(sink: UOp, pm: PatternMatcher, ctx: Any = None, *, bottom_up: bool = False, name: str = "") -> UOp:
    """`sink` with `pm` applied everywhere until no rule fires. `name` labels the stage in logs and spec errors."""
    out = _rewrite_graph(sink, pm, ctx, bottom_up, name)[sink]
    if SPEC and name:
        from ember.uop.spec import check_stage
        check_stage(out, name)
    return out


def graph_rewrite_map(sink: UOp, pm: PatternMatcher, ctx: Any = None, *, bottom_up: bool = False,
                      name: str = "") -> dict[UOp, UOp]:
    """Like graph_rewrite, and also where every node of the input graph went: {old: new}."""
    replace = _rewrite_graph(sink, pm, ctx, bottom_up, name)
    for u in sink.toposort():  # bottom-up may replace a node before seeing what lies below it: rewrite those too
        if u not in replace: _rewrite_graph(u, pm, ctx, bottom_up, name, replace)
    return {u: replace[u] for u in sink.toposort()}


pm_substitute = PatternMatcher([(UPat(name="x"), lambda ctx, x: ctx.get(x))])


def substitute(x: UOp, mapping: dict[UOp, UOp]) -> UOp:
    """x with every node in `mapping` replaced."""
    return graph_rewrite(x, pm_substitute, ctx=mapping, bottom_up=True)
