"""The symbolic simplifier: constant folding, identities, canonical sums, `//` and `%` folding, range decisions.

Index arithmetic decides kernel speed, so these rules run on every kernel. Every rule keeps the value of the
expression at every point (C semantics: `//` truncates, `%` takes the dividend's sign, fixed-width ints wrap);
tests/uop/test_symbolic.py checks that with a fuzzer. Rules that reorder arithmetic (reassociation, distribution)
apply to integers only: reordering float arithmetic changes rounding.

`simplify(x)` applies `symbolic`, the sum of the matchers below.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

from ember.dtype import DType, dtypes
from ember.uop.interpret import exec_alu
from ember.uop.ops import TANGENT, GroupOp, Ops, UOp
from ember.uop.upat import PatternMatcher, UPat, graph_rewrite

INTS: frozenset[DType] = frozenset(d for d in vars(dtypes).values() if isinstance(d, DType) and d.is_int)
INTS_AND_BOOL = INTS | {dtypes.bool}
FLOATS: frozenset[DType] = frozenset({dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64})

# ---- constant folding --------------------------------------------------------------------------------------------


def fold_constant_alu(x: UOp) -> UOp | None:
    """An ALU op whose sources are all constants is the constant it computes (never folds undefined C)."""
    if x.dtype.count > 1: return None
    try:
        value = exec_alu(x.op, x.dtype, tuple(s.arg for s in x.src), x.src[0].dtype)
    except ZeroDivisionError:
        return None
    return UOp.const(x.dtype, value)


def fold_by_range(x: UOp) -> UOp | None:
    """An integer or bool value whose range is one point is that constant."""
    return UOp.const(x.dtype, x.vmin) if x.dtype.count == 1 and x.vmin == x.vmax and x.op is not Ops.CONST else None


pm_fold_constants = PatternMatcher([
    (UPat(GroupOp.Elementwise, name="x", src=UPat(Ops.CONST)), fold_constant_alu),
    (UPat(GroupOp.ALU | {Ops.CAST}, dtype=INTS_AND_BOOL, name="x"), fold_by_range),
])

# ---- identities ------------------------------------------------------------------------------------------------


def drop_exact_float_identity(x: UOp, c: UOp) -> UOp | None:
    """x + (-0.0) and x * 1.0 are x for every float x; x + 0.0 is not (it turns -0.0 into 0.0)."""
    return x if c.arg == 0 and math.copysign(1.0, c.arg) < 0 else None


def bool_not(c: UOp) -> UOp:
    """not c, in the one form the rules know: c != True."""
    return c.ne(True)


pm_identities = PatternMatcher([
    # integer identities (x+0, x*1, x*0, x//1, x%1, x-0)
    (UPat.var("x", INTS) + 0, lambda x: x),
    (UPat.var("x", INTS) - 0, lambda x: x),
    (UPat.var("x", INTS) * 1, lambda x: x),
    (UPat.var("x", INTS) * 0, lambda x: x.const_like(0)),
    (UPat.var("x", INTS) // 1, lambda x: x),
    (UPat.var("x", INTS) % 1, lambda x: x.const_like(0)),
    # float identities that hold bit for bit
    (UPat.var("x", FLOATS) * 1.0, lambda x: x),
    (UPat.var("x", FLOATS) / 1.0, lambda x: x),
    (UPat.var("x", FLOATS) - 0.0, lambda x: x),
    (UPat.var("x", FLOATS) + UPat.cvar("c", FLOATS), drop_exact_float_identity),
    (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("x"),)),)), lambda x: x),  # -(-x) -> x
    # bool and bitwise algebra
    (UPat.var("x", INTS_AND_BOOL) & UPat.var("x"), lambda x: x),
    (UPat.var("x", INTS_AND_BOOL) | UPat.var("x"), lambda x: x),
    (UPat.var("x", dtypes.bool) & True, lambda x: x),
    (UPat.var("x", dtypes.bool) & False, lambda x: x.const_like(False)),
    (UPat.var("x", dtypes.bool) | False, lambda x: x),
    (UPat.var("x", dtypes.bool) | True, lambda x: x.const_like(True)),
    (UPat.var("x", INTS) & 0, lambda x: x.const_like(0)),
    (UPat.var("x", INTS) | 0, lambda x: x),
    (UPat.var("x", INTS_AND_BOOL) ^ 0, lambda x: x),
    (UPat.var("x", dtypes.bool).ne(False), lambda x: x),
    (UPat.var("x", dtypes.bool).ne(True).ne(True), lambda x: x),  # not not x -> x
    # comparisons of a value with itself (x != x is True for a float NaN: ints only)
    (UPat.var("x") < UPat.var("x"), lambda x: UOp.const(dtypes.bool, False)),
    (UPat.var("x", INTS_AND_BOOL).ne(UPat.var("x")), lambda x: UOp.const(dtypes.bool, False)),
    (UPat.var("x", INTS_AND_BOOL).eq(UPat.var("x")), lambda x: UOp.const(dtypes.bool, True)),
    (UPat.var("x", INTS).maximum(UPat.var("x")), lambda x: x),
    # where
    (UPat.var("c").where(UPat.var("x"), UPat.var("x")), lambda c, x: x),
    (UPat.cvar("c", dtypes.bool).where(UPat.var("x"), UPat.var("y")), lambda c, x, y: x if c.arg else y),
    (UPat.var("c", dtypes.bool).where(True, False), lambda c: c),
    (UPat.var("c", dtypes.bool).where(False, True), bool_not),
    (UPat.var("c", dtypes.bool).ne(True).where(UPat.var("x"), UPat.var("y")), lambda c, x, y: c.where(y, x)),
    # casts
    (UPat(Ops.CAST, name="x", src=(UPat.var("y"),)), lambda x, y: y if x.dtype == y.dtype else None),
])

# ---- canonical integer sums and products -----------------------------------------------------------------------


def order_key(u: UOp) -> tuple:
    """A total order on nodes that does not depend on memory addresses, so canonical forms are reproducible."""
    return u._bottom_up("_order_key", lambda n: (n.op.value, n.dtype.name, repr(n.arg) if n.arg is not None else "",
                                                 tuple(s._order_key for s in n.src)))


def split_sum(x: UOp) -> tuple[dict[UOp, int], int]:
    """x as {term: coefficient} plus a constant, looking through ADD, SUB, NEG and MUL by constants."""
    terms: dict[UOp, int] = {}
    const = 0
    stack: list[tuple[UOp, int]] = [(x, 1)]
    while stack:
        u, coeff = stack.pop()
        if u.op is Ops.ADD: stack.extend([(u.src[1], coeff), (u.src[0], coeff)])
        elif u.op is Ops.SUB: stack.extend([(u.src[1], -coeff), (u.src[0], coeff)])
        elif u.op is Ops.NEG: stack.append((u.src[0], -coeff))
        elif u.op is Ops.MUL and u.src[1].op is Ops.CONST: stack.append((u.src[0], coeff * u.src[1].arg))
        elif u.op is Ops.CONST: const += coeff * u.arg
        else: terms[u] = terms.get(u, 0) + coeff
    return terms, const


def merge_divmod_pairs(terms: dict[UOp, int]) -> dict[UOp, int]:
    """(x//c)*(k*c) + (x%c)*k -> x*k: the two halves of a split index join again. Also through a middle axis:
    (x//(c*d))*(k*c*d) + ((x//c)%d)*(k*c) -> (x//c)*(k*c), since x//(c*d) is (x//c)//d, and that joins with
    (x%c)*k in turn: a flat position read back through a contiguous (a, b, c) view is the position."""
    merged = True
    while merged:
        merged = False
        for t, coeff in list(terms.items()):
            if t.op is not Ops.IDIV or t not in terms or t.src[1].op is not Ops.CONST or t.src[1].arg <= 0: continue
            x, big = t.src[0], t.src[1].arg
            for m in [m for m in terms if m.op is Ops.MOD and m.src[1].op is Ops.CONST and m.src[1].arg > 0]:
                y, d = m.src[0], m.src[1].arg
                if not (y is x and d == big or y.op is Ops.IDIV and y.src[0] is x and y.src[1].op is Ops.CONST
                        and y.src[1].arg * d == big) or coeff != d * terms[m]: continue
                k = terms.pop(m)
                del terms[t]
                terms[y] = terms.get(y, 0) + k
                merged = True
                break
    return terms


def build_sum(dtype: DType, terms: Iterable[tuple[UOp, int]], const: int) -> UOp:
    """The canonical sum: terms in `order_key` order, coefficients as MUL by constant, the constant last."""
    out: UOp | None = None
    for t, coeff in sorted(((t, c) for t, c in terms if c != 0), key=lambda tc: order_key(tc[0])):
        term = t if coeff == 1 else UOp(Ops.MUL, dtype, (t, UOp.const(dtype, coeff)))
        out = term if out is None else UOp(Ops.ADD, dtype, (out, term))
    if out is None: return UOp.const(dtype, const)
    return out if const == 0 else UOp(Ops.ADD, dtype, (out, UOp.const(dtype, const)))


def _no_wrap(x: UOp) -> bool:
    """The value range of x is known to stay inside its dtype, so integer algebra on it is exact."""
    return (x.vmin, x.vmax) != (x.dtype.min, x.dtype.max)


def canonicalize_sum(x: UOp) -> UOp | None:
    """Flatten an integer sum, combine like terms, sort them, fold constants: a+3+a*2+1 -> a*3+4."""
    terms, const = split_sum(x)
    out = build_sum(x.dtype, merge_divmod_pairs(terms).items(), const)
    return out if out is not x else None


def distribute_mul(x: UOp, y: UOp, c: UOp) -> UOp:
    """(x + y) * c -> x*c + y*c, so sums of scaled indices become one flat sum."""
    return x * c + y * c


def order_product(x: UOp, y: UOp) -> UOp | None:
    """A product of two non-constants lists its factors in `order_key` order."""
    return y * x if order_key(y) < order_key(x) else None


pm_canonical_ints = PatternMatcher([
    (UPat(Ops.ADD, dtype=INTS, name="x"), canonicalize_sum),
    (UPat(Ops.SUB, dtype=INTS, name="x"), canonicalize_sum),
    (UPat(Ops.NEG, dtype=INTS, name="x"), canonicalize_sum),
    (UPat(Ops.MUL, dtype=INTS, src=(UPat.cvar("c"), UPat.var("x"))), lambda c, x: x * c if x.op is not Ops.CONST
     else None),
    ((UPat.var("x", INTS) * UPat.cvar("c1")) * UPat.cvar("c2"), lambda x, c1, c2: x * (c1.arg * c2.arg)),
    ((UPat.var("x", INTS) + UPat.var("y")) * UPat.cvar("c"), distribute_mul),
    (UPat(Ops.MUL, dtype=INTS, src=(UPat.var("x"), UPat.var("y"))), lambda x, y: order_product(x, y)
     if x.op is not Ops.CONST and y.op is not Ops.CONST else None),
])

# ---- // and % ----------------------------------------------------------------------------------------------------


def fold_divmod(root: UOp, x: UOp, d: UOp) -> UOp | None:
    """x // d and x % d for a constant d: sign, common factors, and terms of x that d divides.

    With q*d a multiple of d, (q*d + r) // d = q + r // d and (q*d + r) % d = r % d, exact in C when x >= 0 and
    r >= 0 (truncation is floor there). r in [0, d) then gives q and r. A term's coefficient k >= d splits into
    k//d (to q) and k%d (stays in r).
    """
    c, is_div = d.arg, root.op is Ops.IDIV
    if c == 0 or c == d.dtype.min or not _no_wrap(x): return None  # -INT_MIN wraps; a wrapping x is no plain sum
    if c < 0: return -(x // -c) if is_div else x % -c  # C: x/-c = -(x/c), x%-c = x%c
    terms, const = split_sum(x)
    if (g := math.gcd(c, const, *terms.values())) > 1:  # (g*y) // (g*c') = y // c', (g*y) % (g*c') = g*(y % c')
        y = build_sum(x.dtype, ((t, k // g) for t, k in terms.items()), const // g)
        return y // (c // g) if is_div else (y % (c // g)) * g
    if x.vmin < 0: return None
    if x.vmax < c: return x.const_like(0) if is_div else x
    # k*t = (k//d)*d*t + (k%d)*t: the multiples of d move to the quotient (a pool's (h + 31*kh) % 30 is h + kh), a
    # negative coefficient only when d divides it (else the rest could go negative, where C's / is not floor)
    quotient = {t: k // c for t, k in terms.items() if k >= c or k % c == 0}
    if not quotient and const < c: return None  # only dropping multiples of d from a constant >= d is progress
    rest = build_sum(x.dtype, ((t, k % c if t in quotient else k) for t, k in terms.items()), const % c)
    if rest.vmin < 0: return None
    q = build_sum(x.dtype, quotient.items(), const // c)
    if rest.vmax < c: return q if is_div else rest
    return q + rest // c if is_div else rest % c


def fold_lane_divmod(root: UOp, x: UOp, d: UOp) -> UOp | None:
    """(f*y + r) // (f*c) = y // c and (f*y + r) % (f*c) = f*(y % c) + r, for y >= 0 and r in [0, f): the lanes of a
    vector of f inside a row of f*c (a head's 64 columns read 16 at a time: (16*o + lane) // 64 = o // 4). Only in
    `lane_symbolic` (the heuristic's question whether lanes are consecutive): in the kernels themselves it would
    turn a loop's i % p, which split_periodic takes apart, into forms it does not."""
    c, is_div = d.arg, root.op is Ops.IDIV
    if c <= 0 or not _no_wrap(x) or x.vmin < 0: return None
    terms, const = split_sum(x)
    for f in sorted({math.gcd(c, k) for k in terms.values()}, reverse=True):
        if f < 2 or f == c: continue
        big = {t: k // f for t, k in terms.items() if k % f == 0}
        r = build_sum(x.dtype, ((t, k) for t, k in terms.items() if t not in big), const)
        if r.vmin < 0 or r.vmax >= f or (y := build_sum(x.dtype, big.items(), 0)).vmin < 0: continue
        return y // (c // f) if is_div else (y % (c // f)) * f + r
    return None


def fold_nested_div(x: UOp, a: UOp, b: UOp) -> UOp | None:
    """(x // a) // b -> x // (a*b) for positive a, b (truncation composes)."""
    return x // (a.arg * b.arg) if a.arg > 0 and b.arg > 0 else None


def fold_nested_mod(x: UOp, m: UOp, c: UOp) -> UOp | None:
    """(x % m) % c -> x % c when c divides m and x >= 0."""
    return x % c if c.arg > 0 and m.arg % c.arg == 0 and x.vmin >= 0 else None


def fold_mod_in_range(x: UOp, c: UOp) -> UOp | None:
    """x % c -> x when 0 <= x < c."""
    return x if 0 <= x.vmin and x.vmax < c.arg else None


pm_fold_divmod = PatternMatcher([
    (UPat((Ops.IDIV, Ops.MOD), dtype=INTS, name="root", src=(UPat.var("x"), UPat.cvar("d"))), fold_divmod),
    ((UPat.var("x", INTS) // UPat.cvar("a")) // UPat.cvar("b"), fold_nested_div),
    ((UPat.var("x", INTS) % UPat.cvar("m")) % UPat.cvar("c"), fold_nested_mod),
    (UPat.var("x", INTS) % UPat.cvar("c"), fold_mod_in_range),
])

# ---- comparisons, max ------------------------------------------------------------------------------------------


def simplify_lt_const(x: UOp, c: UOp) -> UOp | None:
    """Move constants and common factors of an integer sum across `<`: a*4 + 8 < 20 -> a < 3."""
    if not _no_wrap(x) or x.op is Ops.CONST: return None
    terms, const = split_sum(x)
    if not terms: return None
    bound = c.arg - const
    g = math.gcd(*terms.values())
    if const == 0 and g == 1: return None
    y = build_sum(x.dtype, ((t, k // g) for t, k in terms.items()), 0)
    return y < -((-bound) // g)  # y*g < bound  <=>  y < ceil(bound / g)


def decide_max(x: UOp, y: UOp) -> UOp | None:
    """max(x, y) is x or y when the value ranges do not overlap (integers: floats have NaN)."""
    if x.vmin >= y.vmax: return x
    if y.vmin >= x.vmax: return y
    return None


def as_remainder(u: UOp) -> tuple[UOp, int] | None:
    """u as `x % m`: u itself, or `(x % k) * c` for c > 0, which is `(c*x) % (c*k)` (the form the rules give
    `(3j + 3) % 9`: `((j + 1) % 3) * 3`)."""
    if u.op is Ops.MOD and u.src[1].op is Ops.CONST: return u.src[0], int(u.src[1].arg)
    if u.op is not Ops.MUL: return None
    rem, c = u.src if u.src[1].op is Ops.CONST else u.src[::-1]
    if c.op is not Ops.CONST or c.arg <= 0 or rem.op is not Ops.MOD or rem.src[1].op is not Ops.CONST: return None
    return rem.src[0] * c, int(rem.src[1].arg) * int(c.arg)


def decide_equal_remainders(root: UOp, a: UOp, b: UOp) -> UOp | None:
    """x % m == y % m (or !=) for x, y >= 0 whose difference is a constant plus multiples of m: the remainders are
    equal exactly when m divides that constant. A sparse jacobian's seeds compare the color `(a . p) % m` of two
    grid positions p (ad/sparse.py); at a fixed offset between them it is one answer over the whole grid."""
    if (left := as_remainder(a)) is None or (right := as_remainder(b)) is None: return None
    (x, m), (y, n) = left, right
    if m != n or m <= 0 or min(x.vmin, y.vmin) < 0 or not (_no_wrap(x) and _no_wrap(y)): return None
    (xs, cx), (ys, cy) = split_sum(x), split_sum(y)
    for t, k in ys.items(): xs[t] = xs.get(t, 0) - k
    if any(k % m for k in xs.values()): return None
    return root.const_like(((cx - cy) % m == 0) == (root.op is Ops.CMPEQ))


pm_decide_comparisons = PatternMatcher([
    (UPat.var("x", INTS) < UPat.cvar("c"), simplify_lt_const),
    (UPat((Ops.CMPEQ, Ops.CMPNE), name="root", src=(UPat((Ops.MOD, Ops.MUL), INTS, name="a"),
                                                   UPat((Ops.MOD, Ops.MUL), INTS, name="b"))), decide_equal_remainders),
    (UPat.var("x", INTS).maximum(UPat.var("y")), decide_max),
])

def same_kind(*us: UOp) -> bool: return len({u.arg for u in us}) == 1  # all tangent arithmetic, or none of it


def alu(like: UOp, op: Ops, *src: UOp) -> UOp:
    """`op` on src, of like's dtype and kind (tangent arithmetic stays tangent arithmetic, see below)."""
    return UOp(op, like.dtype, src, like.arg)


def double_times(x: UOp, c: UOp, m: UOp, a: UOp) -> UOp | None:
    """(x + x) * c -> x * 2c: x + x is 2x exactly; where it overflows, |c| >= 1 makes x * 2c overflow too."""
    two_c = 2.0 * c.arg
    if not same_kind(m, a) or abs(c.arg) < 1 or not math.isfinite(two_c): return None
    return alu(m, Ops.MUL, x, x.const_like(two_c))


# Negations moved into a constant or a subtraction: each rewrite gives the same bits for every input (IEEE negation
# and rounding are symmetric; a - b is a + (-b)). Derivative rules produce many (d(-x), 2 * -(100 * ...)).
pm_exact_floats = PatternMatcher([
    (UPat(Ops.MUL, dtype=FLOATS, src=[UPat(Ops.NEG, src=(UPat.var("x"),), name="n"), UPat.cvar("c")], name="m"),
     lambda m, n, x, c: alu(m, Ops.MUL, x, c.const_like(-c.arg)) if same_kind(m, n) else None),
    (UPat(Ops.NEG, dtype=FLOATS, src=(UPat(Ops.MUL, src=[UPat.var("x"), UPat.cvar("c")], name="m"),), name="n"),
     lambda n, m, x, c: alu(m, Ops.MUL, x, c.const_like(-c.arg)) if same_kind(n, m) else None),
    (UPat(Ops.ADD, dtype=FLOATS, src=[UPat.var("a"), UPat(Ops.NEG, src=(UPat.var("b"),), name="n")], name="s"),
     lambda s, n, a, b: alu(s, Ops.SUB, a, b) if same_kind(s, n) else None),
    (UPat(Ops.SUB, dtype=FLOATS, src=(UPat.var("a"), UPat(Ops.NEG, src=(UPat.var("b"),), name="n")), name="s"),
     lambda s, n, a, b: alu(s, Ops.ADD, a, b) if same_kind(s, n) else None),
    (UPat(Ops.MUL, dtype=FLOATS, src=[UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")), name="a"), UPat.cvar("c")],
          name="m"), double_times),
    (UPat(Ops.MUL, dtype=FLOATS, src=[UPat(Ops.NEG, src=(UPat.var("a"),), name="n"), UPat.var("b")], name="m"),
     lambda m, n, a, b: alu(n, Ops.NEG, alu(m, Ops.MUL, a, b)) if same_kind(m, n) and b.op is not Ops.CONST else None),
    (UPat(Ops.ADD, dtype=FLOATS, src=(UPat(Ops.NEG, src=(UPat.var("a"),), name="n1"),
                                      UPat(Ops.NEG, src=(UPat.var("b"),), name="n2")), name="s"),
     lambda s, n1, n2, a, b: alu(n1, Ops.NEG, alu(s, Ops.ADD, a, b)) if same_kind(s, n1, n2) else None),
    (UPat(Ops.SUB, dtype=FLOATS, src=(UPat.var("a"), UPat.cvar("c")), name="s"),
     lambda s, a, c: alu(s, Ops.ADD, a, c.const_like(-c.arg)) if c.arg < 0 else None),
])


def is_zero(z: UOp) -> bool: return z.arg == 0  # +0.0 and -0.0


# A derivative's directions are seeded with exact zeros and ones; a zero tangent (a seed that is 0, a padding)
# stands for "this term is absent", as JAX's symbolic zeros: it adds nothing and zeroes any product, whatever the
# partial derivative it meets (inf and NaN included). IEEE arithmetic could not drop them (0 * inf is NaN,
# -0.0 + 0.0 is +0.0), so forward mode marks its tangent arithmetic (arg TANGENT) and only that folds here.
pm_structural_zeros = PatternMatcher([
    (UPat(Ops.MUL, arg=TANGENT, src=[UPat.cvar("z", FLOATS), UPat()], name="m"),
     lambda m, z: m.const_like(0.0) if is_zero(z) else None),
    (UPat(Ops.ADD, arg=TANGENT, src=[UPat.cvar("z", FLOATS), UPat.var("x")]), lambda z, x: x if is_zero(z) else None),
    (UPat(Ops.NEG, arg=TANGENT, src=(UPat.cvar("z", FLOATS),), name="n"),
     lambda n, z: n.const_like(0.0) if is_zero(z) else None),
    (UPat(Ops.SUB, arg=TANGENT, src=(UPat.var("x"), UPat.cvar("z", FLOATS))), lambda x, z: x if is_zero(z) else None),
    (UPat(Ops.SUB, arg=TANGENT, src=(UPat.cvar("z", FLOATS), UPat.var("x")), name="s"),
     lambda s, z, x: alu(s, Ops.NEG, x) if is_zero(z) else None),
])

symbolic = pm_fold_constants + pm_identities + pm_canonical_ints + pm_fold_divmod + pm_decide_comparisons + \
    pm_exact_floats + pm_structural_zeros
# symbolic, and a lane's place in a row of lanes (fold_lane_divmod): for the heuristic's question, not for kernels
lane_symbolic = PatternMatcher([(UPat((Ops.IDIV, Ops.MOD), dtype=INTS, name="root", src=(UPat.var("x"),
                                                                                          UPat.cvar("d"))),
                                 fold_lane_divmod)]) + symbolic


def simplify(x: UOp) -> UOp:
    """`x` with the symbolic rules applied to a fixed point."""
    return graph_rewrite(x, symbolic)


@functools.lru_cache(maxsize=1 << 14)
def affine_step(x: UOp, rng: UOp) -> int | None:
    """k where the integer x is f + rng*k with f free of rng (a sum whose terms hold rng only as rng or rng*c);
    None otherwise."""
    if x.dtype.is_float or x.dtype.is_bool: return None
    terms, todo, step = [], [x], 0
    while todo:
        t = todo.pop()
        if t.op is Ops.ADD: todo.extend(t.src)
        else: terms.append(t)
    for t in terms:
        if rng not in t.ranges: continue
        if t is rng: step += 1
        elif t.op is Ops.MUL and t.src[0] is rng and t.src[1].op is Ops.CONST: step += t.src[1].arg
        else: return None
    return step
