"""Optimistic tangent products: which outputs of a plan an unchecked forward-mode product can reach, if any.

A forward-mode product (arg TANGENT, ad/forward.py) is 0 where a zero factor meets inf or NaN, not IEEE's NaN: a
test and a branch per product (renderer/cstyle.render_tangent_product), which cost a quarter of a multiple-shooting
hessian's time. The exported C++ therefore runs each function first with plain products, and again with the tested
ones only if an output that such a product reaches holds a NaN.

Why the first run's outputs are then exactly the tested run's: a plain product differs from the tested one only
where it is NaN. So every value of the plain run equals the tested run's or is NaN, as long as what consumes a
product's value passes a NaN on: sums, differences, products (NaN * 0 is NaN), quotients, negations, float casts,
movement, gathers, the branches (not the condition) of a select, a sum over an axis, stores and the loads of what
was stored. Forward mode builds exactly those on its tangents; `reached_outputs` checks it, and gives None where a
tangent's value meets anything else (a comparison, a max, a libm call: a user's function of a jacobian), which
then runs the tested products only. An output with no NaN had no NaN on any path into it: no product on those paths
differed. Before: a plan (export/function.Plan). After: the outputs to test, or None.
"""

from __future__ import annotations

from ember.device import Buffer
from ember.export.function import Plan
from ember.schedule.kernelize import ExecItem, LoopItem
from ember.uop.ops import TANGENT, GroupOp, Ops, UOp

# consumers that give NaN whenever the source at these positions is NaN (None: any position)
PASSES_NAN: dict[Ops, tuple[int, ...] | None] = {
    **{op: None for op in GroupOp.Movement}, Ops.ADD: None, Ops.SUB: None, Ops.MUL: None, Ops.NEG: None,
    Ops.FDIV: None, Ops.MULACC: None, Ops.CONTIGUOUS: None, Ops.CONTIGUOUS_BACKWARD: None, Ops.COPY: None,
    Ops.WHERE: (1, 2), Ops.GATHER: (0,), Ops.SCATTER_ADD: (0,), Ops.STORE: (1,)}


def passes_nan(consumer: UOp, position: int) -> bool:
    if consumer.op is Ops.CAST: return consumer.dtype.is_float
    if consumer.op is Ops.REDUCE_AXIS: return consumer.arg[0] in (Ops.ADD, Ops.MUL)
    if consumer.op not in PASSES_NAN: return False
    return (at := PASSES_NAN[consumer.op]) is None or position in at


def store_target(store: UOp) -> tuple[UOp, list[UOp]]:
    """The DEFINE_GLOBAL a STORE writes, and the views between them."""
    views, u = [], store.src[0]
    while u.op is not Ops.DEFINE_GLOBAL: views, u = [*views, u], u.src[0]
    return u, views


def kernel_reaches(item: ExecItem, tainted: set[int], checked: set[UOp]) -> set[int] | None:
    """The buffers (by id) `item` stores a tangent product's value into, given the `tainted` buffers it may read
    (its own products count if its AST is among the `checked` ones); None when such a value meets a consumer that
    may not pass its NaN on."""
    order = list(item.ast.toposort())
    users: dict[UOp, list[tuple[UOp, int]]] = {}
    for u in order:
        for i, s in enumerate(u.src): users.setdefault(s, []).append((u, i))
    targets = {u: store_target(u) for u in order if u.op is Ops.STORE}
    writing = {v for g, views in targets.values() for v in (g, *views)}  # the stores' side: not values
    stored = {g for g, _ in targets.values()}
    if any(id(item.bufs[g.arg]) in tainted and any(user not in writing and user.op is not Ops.STORE
                                                   for v in writing for user, _ in users.get(v, []))
           for g in stored):
        return None  # a tainted buffer read and written by one kernel: not followed
    products = item.ast in checked
    reached: set[UOp] = {u for u in order if (products and u.op is Ops.MUL and u.arg == TANGENT and u.dtype.is_float) or
                         (u.op is Ops.DEFINE_GLOBAL and u not in stored and id(item.bufs[u.arg]) in tainted)}
    written: set[int] = set()
    for u in order:  # sources before their users: `reached` is complete when u is looked at
        if u not in reached: continue
        for user, i in users.get(u, []):
            if not passes_nan(user, i): return None
            if user.op is Ops.STORE: written.add(id(item.bufs[targets[user][0].arg]))
            else: reached.add(user)
    return written


def items_reach(items: list[ExecItem | LoopItem], tainted: set[int], checked: set[UOp]) -> bool:
    """Add to `tainted` the buffers the items write a tangent product's value into; False if one meets a consumer
    that may not pass its NaN on. A loop's carries and rows are followed to a fixed point."""
    for item in items:
        if isinstance(item, ExecItem):
            if (written := kernel_reaches(item, tainted, checked)) is None: return False
            tainted |= written
            continue
        while True:
            before = len(tainted)
            tainted |= {id(x) for x, xs in zip(item.x, item.xs, strict=True) if id(xs) in tainted}
            tainted |= {id(c) for c, c0 in zip(item.carry, item.carry0, strict=True) if id(c0) in tainted}
            if not items_reach(item.body, tainted, checked): return False
            tainted |= {id(c) for c, nxt in zip(item.carry, item.out, strict=False) if id(nxt) in tainted}
            if any(id(b) in tainted for b in [*item.carry, item.out[-1]]): tainted.add(id(item.result))
            if len(tainted) == before: break
    return True


def reached_outputs(plan: Plan, checked: set[UOp]) -> list[Buffer] | None:
    """The outputs that the products of the `checked` kernels (those whose C tests them: codegen folds or leaves
    untested the others) reach; empty if none. None where one meets a consumer that may not pass its NaN on (see
    the module's docstring)."""
    tainted: set[int] = set()
    if not items_reach(plan.items, tainted, checked): return None
    return [b for b in plan.outputs if id(b) in tainted]
