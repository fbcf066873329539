"""The UOp, ember's one IR, and the `Ops` it is made of.

A UOp is an immutable node `(op, dtype, src, arg)`. Construction is hash-consed: the same four fields give the
same object, so identity is equality and caches keyed on UOps are cheap. The cache holds nodes weakly; a graph no
one refers to is freed. The same node type serves the tensor level (BUFFER, RESHAPE, REDUCE_AXIS, ...), the kernel
level (RANGE, INDEX, LOAD, STORE, ...) and the ALU level (ADD, MUL, WHERE, ...).
"""

from __future__ import annotations

import enum
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ember.dtype import DType, PtrDType, dtypes, truncate


class Ops(enum.IntEnum):
    """Every operation, at every level. An IntEnum: its hash is int's, which pattern matching pays on every node."""

    # graph structure
    SINK = enum.auto(); NOOP = enum.auto(); AFTER = enum.auto()  # noqa: E702
    BIND = enum.auto()  # BIND(DEFINE_VAR, CONST): a variable with the value it has for one call (a symbolic size)
    # tensor level
    BUFFER = enum.auto(); CONST = enum.auto(); COPY = enum.auto(); CONTIGUOUS = enum.auto()  # noqa: E702
    ASSIGN = enum.auto(); DETACH = enum.auto(); KERNEL = enum.auto()  # noqa: E702
    CONTIGUOUS_BACKWARD = enum.auto()  # the identity forward; its gradient is stored (CONTIGUOUS) before it flows on
    VJP = enum.auto()  # VJP(value, *inputs), arg a pull: value, its gradient pull(ctx, *inputs) (Tensor.custom_vjp)
    RESHAPE = enum.auto(); PERMUTE = enum.auto(); EXPAND = enum.auto()  # noqa: E702
    PAD = enum.auto(); SHRINK = enum.auto(); FLIP = enum.auto()  # noqa: E702
    REDUCE_AXIS = enum.auto(); ARANGE = enum.auto()  # noqa: E702  (ARANGE: the tensor 0..arg-1)
    GATHER = enum.auto()  # GATHER(x, idx), arg axis: x with axis `arg` indexed by the values of idx
    SCATTER_ADD = enum.auto()  # SCATTER_ADD(src, idx), arg ScatterArg: GATHER's transpose, summed by index
    FOLD = enum.auto()  # FOLD(carry0, [xs], *params), arg FoldArg: a loop of `length` steps of one body graph
    # kernel level
    DEFINE_GLOBAL = enum.auto(); DEFINE_VAR = enum.auto(); DEFINE_REG = enum.auto()  # noqa: E702
    DEFINE_LOCAL = enum.auto(); SPECIAL = enum.auto()  # noqa: E702
    RANGE = enum.auto(); END = enum.auto(); REDUCE = enum.auto()  # noqa: E702
    INDEX = enum.auto(); LOAD = enum.auto(); STORE = enum.auto()  # noqa: E702
    VECTORIZE = enum.auto(); GEP = enum.auto(); BARRIER = enum.auto()  # noqa: E702
    WMMA = enum.auto()  # WMMA(a, b, c), arg TensorCore: a warp's tensor-core product, each lane's fragments as vectors
    IF = enum.auto(); ENDIF = enum.auto()  # noqa: E702
    # ALU: unary
    CAST = enum.auto(); BITCAST = enum.auto(); NEG = enum.auto()  # noqa: E702
    EXP = enum.auto(); LOG = enum.auto(); EXP2 = enum.auto(); LOG2 = enum.auto()  # noqa: E702
    SIN = enum.auto(); SQRT = enum.auto(); RECIPROCAL = enum.auto(); TRUNC = enum.auto()  # noqa: E702
    # libm functions: rendered as calls where the device has them, so they are as exact as the C library
    COS = enum.auto(); TAN = enum.auto(); ASIN = enum.auto(); ACOS = enum.auto(); ATAN = enum.auto()  # noqa: E702
    SINH = enum.auto(); COSH = enum.auto(); TANH = enum.auto(); ASINH = enum.auto()  # noqa: E702
    ACOSH = enum.auto(); ATANH = enum.auto(); ERF = enum.auto(); EXPM1 = enum.auto(); LOG1P = enum.auto()  # noqa
    # ALU: binary
    ADD = enum.auto(); SUB = enum.auto(); MUL = enum.auto(); FDIV = enum.auto()  # noqa: E702
    IDIV = enum.auto(); MOD = enum.auto(); MAX = enum.auto(); POW = enum.auto(); ATAN2 = enum.auto()  # noqa: E702
    CMPLT = enum.auto(); CMPNE = enum.auto(); CMPEQ = enum.auto()  # noqa: E702
    AND = enum.auto(); OR = enum.auto(); XOR = enum.auto(); SHL = enum.auto(); SHR = enum.auto()  # noqa: E702
    # ALU: ternary
    WHERE = enum.auto(); MULACC = enum.auto()  # noqa: E702

    def __repr__(self) -> str: return f"Ops.{self.name}"


class GroupOp:
    """Named sets of Ops."""

    Libm = frozenset({Ops.COS, Ops.TAN, Ops.ASIN, Ops.ACOS, Ops.ATAN, Ops.SINH, Ops.COSH, Ops.TANH, Ops.ASINH,
                      Ops.ACOSH, Ops.ATANH, Ops.ERF, Ops.EXPM1, Ops.LOG1P})
    Unary = frozenset({Ops.NEG, Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL,
                       Ops.TRUNC}) | Libm
    Binary = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.POW, Ops.ATAN2, Ops.CMPLT,
                        Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR})
    Ternary = frozenset({Ops.WHERE, Ops.MULACC})
    ALU = Unary | Binary | Ternary
    Elementwise = ALU | {Ops.CAST, Ops.BITCAST}
    Movement = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})
    Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR})
    Associative = frozenset({Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX})
    Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
    Transcendental = frozenset({Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.POW, Ops.ATAN2}) | Libm
    Defines = frozenset({Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.DEFINE_REG, Ops.DEFINE_LOCAL})


class AxisKind(enum.Enum):
    """What a RANGE loops over: an output axis (GLOBAL, split across threads), a sequential LOOP, a REDUCE axis, the
    lanes of an UPCAST or UNROLL, the threads of a workgroup (LOCAL: codegen/gpudims.py makes them thread ids), the
    lanes of a warp that a tensor core's fragments are spread over (WARP: thread index 0, codegen/tensorcore.py)."""

    GLOBAL = "g"; LOOP = "l"; REDUCE = "r"; UPCAST = "u"; UNROLL = "ur"; LOCAL = "lo"; WARP = "w"  # noqa: E702


@dataclass(frozen=True, slots=True)
class RangeArg:
    """The arg of a RANGE: a kernel-unique id (outer loops get smaller ids) and its kind."""

    axis: int
    kind: AxisKind


@dataclass(frozen=True, slots=True)
class VarArg:
    """The arg of a DEFINE_VAR: a name and inclusive bounds."""

    name: str
    min: int
    max: int


class BufferArg(NamedTuple):
    """The arg of a tensor-level BUFFER: a process-unique id, its device and its element count. A NamedTuple: its
    hash is the tuple's, in C (a new buffer per eager op hashes it to make its node and to drop it)."""

    uid: int
    device: str
    size: int


@dataclass(frozen=True, slots=True)
class ScatterArg:
    """The arg of a SCATTER_ADD(src, idx): src's axes axis .. axis+k-1 (idx's shape, k = idx's rank) are replaced by
    one axis of `size`; each element of src is added at the position along it that idx holds for it (an index
    outside [0, size) adds nowhere). The transpose of GATHER(x, idx) along `axis`, so its gradient."""

    axis: int
    size: int


@dataclass(frozen=True)
class FoldArg:
    """The arg of a FOLD: a body graph run `length` times (ember/scan.py builds it).

    The body reads placeholders: `carry`, flat BUFFERs (one per carried vector), `x`, flat BUFFERs (one per xs
    source: the step's row of it) and `params` (a placeholder per further FOLD source, of its shape, the same at
    every step). `out` holds the body's results, flat: the next value of each carry, then the step's y (Y elements,
    maybe none). The FOLD's sources are the initial carries, the xs (length, X_i) and the params; its value is the
    final carries (C elements in all) followed by the length rows of y: shape (C + length * Y,)."""

    length: int
    carry: tuple[UOp, ...]
    x: tuple[UOp, ...]
    params: tuple[UOp, ...]
    out: tuple[UOp, ...]

    @property
    def carry_size(self) -> int: return sum(c.shape[0] for c in self.carry)

    @property
    def y_size(self) -> int: return self.out[-1].shape[0]

    @property
    def shape(self) -> tuple[int]: return (self.carry_size + self.length * self.y_size,)


ConstType = float | int | bool
BOUND = [False]  # set at the first bind: realize looks for variables in graphs only from then on (schedule/unbind)
TANGENT = "tangent"  # the arg of the MUL, ADD and NEG that forward mode builds on tangents (ad/forward.py): in
# them a zero is a structural zero, which the symbolic rules fold whatever it meets (pm_structural_zeros)
SERIAL = "serial"  # the arg of the ADD/MUL/MAX chaining an unrolled reduction's terms (codegen/expand.py): the
# accumulator takes them one after another, in the loop's order (codegen/lowerer.py)


def arg_key(arg: Any) -> Any:
    # floats key by their bits, so 0.0 and -0.0 stay apart and NaN constants are shared
    return ("float", arg.hex()) if type(arg) is float else arg


class UOpMetaClass(type):
    """Makes `UOp(...)` return the existing node when one with the same fields is alive."""

    cache: dict[tuple, weakref.ReferenceType[UOp]] = {}

    def __call__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        key = (op, dtype, src, ("float", arg.hex()) if type(arg) is float else arg)  # (arg_key, inline)
        if (ref := UOpMetaClass.cache.get(key)) is not None and (node := ref()) is not None: return node
        node = object.__new__(cls)  # (the fields set here, without an __init__ frame: every node is made here)
        node.op, node.dtype, node.src, node.arg, node._key = op, dtype, src, arg, key
        ref = weakref.ref(node)
        # setdefault is one step under the GIL: two threads building the same node (a native build in the
        # background, function.py) both get the one that was stored first
        if (old := UOpMetaClass.cache.setdefault(key, ref)) is not ref:
            if (first := old()) is not None: return first
            UOpMetaClass.cache[key] = ref
        return node


class MathMixin:
    """Python operators that build ALU nodes; shared by UOp (builds graphs) and UPat (builds patterns)."""

    __slots__ = ()

    def alu(self, op: Ops, *src: Any) -> Any: raise NotImplementedError
    def const_like(self, value: Any) -> Any: raise NotImplementedError

    def _operand(self, x: Any) -> Any: return x if isinstance(x, MathMixin) else self.const_like(x)
    def __add__(self, x: Any) -> Any: return self.alu(Ops.ADD, self._operand(x))
    def __radd__(self, x: Any) -> Any: return self._operand(x).alu(Ops.ADD, self)
    def __mul__(self, x: Any) -> Any: return self.alu(Ops.MUL, self._operand(x))
    def __rmul__(self, x: Any) -> Any: return self._operand(x).alu(Ops.MUL, self)
    def __sub__(self, x: Any) -> Any: return self.alu(Ops.SUB, self._operand(x))
    def __rsub__(self, x: Any) -> Any: return self._operand(x).alu(Ops.SUB, self)
    def __neg__(self) -> Any: return self.alu(Ops.NEG)
    def __floordiv__(self, x: Any) -> Any: return self.alu(Ops.IDIV, self._operand(x))  # C: truncates
    def __mod__(self, x: Any) -> Any: return self.alu(Ops.MOD, self._operand(x))  # C: sign of the dividend
    def __truediv__(self, x: Any) -> Any: return self.alu(Ops.FDIV, self._operand(x))
    def __lt__(self, x: Any) -> Any: return self.alu(Ops.CMPLT, self._operand(x))
    def __gt__(self, x: Any) -> Any: return self._operand(x).alu(Ops.CMPLT, self)
    def __and__(self, x: Any) -> Any: return self.alu(Ops.AND, self._operand(x))
    def __or__(self, x: Any) -> Any: return self.alu(Ops.OR, self._operand(x))
    def __xor__(self, x: Any) -> Any: return self.alu(Ops.XOR, self._operand(x))
    def __lshift__(self, x: Any) -> Any: return self.alu(Ops.SHL, self._operand(x))
    def __rshift__(self, x: Any) -> Any: return self.alu(Ops.SHR, self._operand(x))
    def ne(self, x: Any) -> Any: return self.alu(Ops.CMPNE, self._operand(x))
    def eq(self, x: Any) -> Any: return self.alu(Ops.CMPEQ, self._operand(x))
    def maximum(self, x: Any) -> Any: return self.alu(Ops.MAX, self._operand(x))
    def __rfloordiv__(self, x: Any) -> Any: return self._operand(x).alu(Ops.IDIV, self)
    def __rmod__(self, x: Any) -> Any: return self._operand(x).alu(Ops.MOD, self)
    def __rtruediv__(self, x: Any) -> Any: return self._operand(x).alu(Ops.FDIV, self)
    def __rand__(self, x: Any) -> Any: return self._operand(x).alu(Ops.AND, self)
    def __ror__(self, x: Any) -> Any: return self._operand(x).alu(Ops.OR, self)
    def __rxor__(self, x: Any) -> Any: return self._operand(x).alu(Ops.XOR, self)
    def __rlshift__(self, x: Any) -> Any: return self._operand(x).alu(Ops.SHL, self)
    def __rrshift__(self, x: Any) -> Any: return self._operand(x).alu(Ops.SHR, self)

    def where(self, a: Any, b: Any) -> Any:
        """a where self (a bool) is true, else b. A Python number takes the dtype of the other branch."""
        if not isinstance(a, MathMixin) and isinstance(b, MathMixin): a = b.const_like(a)
        if not isinstance(b, MathMixin) and isinstance(a, MathMixin): b = a.const_like(b)
        return self.alu(Ops.WHERE, self._operand(a), self._operand(b))


class UOp(MathMixin, metaclass=UOpMetaClass):
    """An immutable, hash-consed IR node. Compare with `is`; never mutate."""

    __slots__ = ("op", "dtype", "src", "arg", "_key", "__weakref__", "__dict__")

    def __del__(self) -> None:
        try:
            if (ref := UOpMetaClass.cache.get(self._key)) is not None and ref() in (None, self):
                del UOpMetaClass.cache[self._key]
        except (AttributeError, TypeError):  # interpreter shutdown or a half-built node
            pass

    def __reduce__(self) -> tuple:
        return UOp, (self.op, self.dtype, self.src, self.arg)

    def __bool__(self) -> bool:
        """A comparison of symbolic sizes (`n < 4` for a bound n) is true or false where its bounds decide it, else a
        TypeError: code that branches on a size must not guess for a size that changes from call to call."""
        if self.op not in GroupOp.Comparison: return True
        if self.vmin == self.vmax: return bool(self.vmin)
        raise TypeError(f"the comparison {self.render()} of symbolic sizes depends on their values (bounds "
                        f"{self.src[0].vmin}..{self.src[0].vmax} and {self.src[1].vmin}..{self.src[1].vmax})")

    def replace(self, **fields: Any) -> UOp:
        """This node with some of op/dtype/src/arg changed (a new node, or the same if nothing changed)."""
        new = (fields.get("op", self.op), fields.get("dtype", self.dtype), fields.get("src", self.src),
               fields.get("arg", self.arg))
        return self if new == (self.op, self.dtype, self.src, self.arg) else UOp(*new)

    # ---- construction --------------------------------------------------------------------------------------------

    @staticmethod
    def const(dtype: DType, value: ConstType) -> UOp:
        """A scalar constant, its value rounded or wrapped to `dtype` as C would."""
        return UOp(Ops.CONST, dtype, arg=truncate(value, dtype))

    def const_like(self, value: ConstType) -> UOp:
        return UOp.const(self.dtype, value)

    @staticmethod
    def variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.int32) -> UOp:
        """A symbolic integer in [min_val, max_val]."""
        assert min_val <= max_val, f"variable {name}: empty range [{min_val}, {max_val}]"
        return UOp(Ops.DEFINE_VAR, dtype, arg=VarArg(name, min_val, max_val))

    def bind(self, value: int) -> UOp:
        """This variable (a DEFINE_VAR) with `value` for one call: a size a shape may hold (a batch that changes)."""
        if self.op is not Ops.DEFINE_VAR: raise TypeError(f"bind: only a Variable can be bound, not a {self.op.name}")
        if not isinstance(value, int) or isinstance(value, bool) or not self.arg.min <= value <= self.arg.max:
            raise ValueError(f"bind: {self.arg.name} takes an int in [{self.arg.min}, {self.arg.max}], got {value!r}")
        BOUND[0] = True
        return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, value)))

    def unbind(self) -> tuple[UOp, int]:
        """(variable, value) of a BIND."""
        return self.src[0], self.src[1].arg

    @staticmethod
    def range(end: int | UOp, axis: int, kind: AxisKind = AxisKind.LOOP, dtype: DType = dtypes.int32) -> UOp:
        """A loop index over [0, end)."""
        end_uop = end if isinstance(end, UOp) else UOp.const(dtype, end)
        return UOp(Ops.RANGE, dtype, (end_uop,), RangeArg(axis, kind))

    def alu(self, op: Ops, *src: UOp) -> UOp:
        """`op` applied to self and `src`. Comparisons give bool; other ops keep the first operand's dtype."""
        out = dtypes.bool if op in GroupOp.Comparison else (src[-1] if op is Ops.WHERE else self).dtype
        return UOp(op, out, (self, *src))

    def cast(self, dtype: DType) -> UOp:
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    def sink(self, *more: UOp) -> UOp:
        return UOp(Ops.SINK, dtypes.void, (self, *more))

    def after(self, *deps: UOp) -> UOp:
        """This value, available only once `deps` ran (orders effects, e.g. a register read after its stores)."""
        return UOp(Ops.AFTER, self.dtype, (self, *deps))

    # ---- inspection ----------------------------------------------------------------------------------------------

    def toposort(self, descend: Callable[[UOp], bool] | None = None) -> dict[UOp, None]:
        """Every node reachable from self, sources before users, as an ordered dict (iterative: no depth limit).

        `descend(node)` False keeps the node but not what lies below it."""
        order: dict[UOp, None] = {}
        stack: list[tuple[UOp, bool]] = [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if node in order: continue
            if expanded or (descend is not None and not descend(node)):
                order[node] = None
                continue
            stack.append((node, True))
            stack.extend((s, False) for s in reversed(node.src) if s not in order)
        return order

    def _bottom_up(self, attr: str, compute: Callable[[UOp], Any]) -> Any:
        """Compute a cached per-node attribute for all sources first, without recursion."""
        if attr in (cached := self.__dict__): return cached[attr]
        if all(attr in s.__dict__ for s in self.src):  # a new node over known ones, the usual case: no walk
            cached[attr] = value = compute(self)
            return value
        for node in self.toposort(descend=lambda n: attr not in n.__dict__):
            if attr not in node.__dict__: node.__dict__[attr] = compute(node)
        return self.__dict__[attr]

    @property
    def vmin(self) -> ConstType: return self._bottom_up("_min_max", _compute_min_max)[0]

    @property
    def vmax(self) -> ConstType: return self._bottom_up("_min_max", _compute_min_max)[1]

    @property
    def ranges(self) -> tuple[UOp, ...]:
        """The RANGEs this value depends on (open at it), in order of first appearance."""
        return tuple(n for n in self._bottom_up("_ranges", _compute_ranges))

    @property
    def bound(self) -> bool:
        """Whether the graph holds a bound variable (a BIND, as a value or in a shape): cached per node, so a new
        node over old ones costs a look at its sources."""
        return self._bottom_up("_bound", _compute_bound)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of a tensor-level node."""
        return self._bottom_up("_shape", _compute_shape)

    def __repr__(self) -> str:
        if self.op is Ops.BIND: return f"{self.src[0].arg.name}={self.src[1].arg}"  # a size in a shape: `bs=32`
        return render_tree(self, max_depth=3)

    def render(self) -> str:
        """A compact infix form of an integer or bool expression, e.g. `((a*4)+b)//4`."""
        return render_expr(self)


# ---- value ranges ----------------------------------------------------------------------------------------------

def _clamp_range(lo: ConstType, hi: ConstType, dtype: DType) -> tuple[ConstType, ConstType]:
    if dtype.is_int and (lo < dtype.min or hi > dtype.max): return dtype.min, dtype.max  # may wrap: no bound
    return lo, hi


def _compute_min_max(u: UOp) -> tuple[ConstType, ConstType]:
    d = u.dtype.scalar if not isinstance(u.dtype, PtrDType) else dtypes.void
    full = (d.min, d.max) if d.count and d.kind != "v" else (-math.inf, math.inf)
    if u.op is Ops.CONST: return u.arg, u.arg
    if u.op is Ops.DEFINE_VAR: return u.arg.min, u.arg.max
    if u.op is Ops.BIND: return u.src[0].arg.min, u.src[0].arg.max
    if u.op is Ops.RANGE: return 0, max(0, u.src[0].vmax - 1)
    if u.op in (Ops.AFTER, Ops.GEP): return u.src[0].vmin, u.src[0].vmax  # a lane of a vector: its bounds hold
    if u.op is Ops.SPECIAL: return 0, max(0, u.src[0].vmax - 1)
    if u.op is Ops.VECTORIZE: return min(s.vmin for s in u.src), max(s.vmax for s in u.src)
    if not (d.is_int or d.is_bool) or not u.src: return full
    s = [x._min_max for x in u.src]  # type: ignore[attr-defined]  # filled by _bottom_up before us
    (a0, a1), (b0, b1) = s[0], s[1] if len(s) > 1 else (0, 0)
    if u.op is Ops.ADD: return _clamp_range(a0 + b0, a1 + b1, d)
    if u.op is Ops.SUB: return _clamp_range(a0 - b1, a1 - b0, d)
    if u.op is Ops.NEG: return _clamp_range(-a1, -a0, d)
    if u.op is Ops.MUL:
        vals = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
        return _clamp_range(min(vals), max(vals), d)
    if u.op is Ops.MAX: return max(a0, b0), max(a1, b1)
    if u.op is Ops.IDIV and b0 == b1 and b0 != 0:
        vals = [c_idiv(a0, b0), c_idiv(a1, b0)]
        return min(vals), max(vals)
    if u.op is Ops.MOD and b0 > 0:
        if a0 >= 0: return (a0, a1) if a1 < b0 and b0 == b1 else (0, min(a1, b1 - 1))
        return max(-(b1 - 1), a0), min(b1 - 1, max(a1, 0))
    if u.op is Ops.CMPLT:
        return (a1 < b0, a0 < b1)
    if u.op in (Ops.CMPNE, Ops.CMPEQ):
        always_equal, never_equal = a0 == a1 == b0 == b1, a1 < b0 or b1 < a0
        lo, hi = (never_equal, not always_equal) if u.op is Ops.CMPNE else (always_equal, not never_equal)
        return lo, hi
    if u.op is Ops.WHERE:
        (c0, c1), (x0, x1), (y0, y1) = s
        if c0 == c1: return (x0, x1) if c0 else (y0, y1)
        return min(x0, y0), max(x1, y1)
    if u.op is Ops.AND and d.is_bool: return a0 and b0, a1 and b1
    if u.op is Ops.OR and d.is_bool: return a0 or b0, a1 or b1
    if u.op is Ops.AND and a0 >= 0 and b0 >= 0: return 0, min(a1, b1)
    if u.op is Ops.SHL and b0 == b1 and b0 >= 0: return _clamp_range(a0 << b0, a1 << b0, d)
    if u.op is Ops.SHR and b0 == b1 and b0 >= 0: return a0 >> b0, a1 >> b0
    if u.op is Ops.CAST and (u.src[0].dtype.is_int or u.src[0].dtype.is_bool):
        return _clamp_range(int(a0), int(a1), d)
    return full


def c_idiv(a: int, b: int) -> int:
    """a / b truncated toward zero, as in C. b must not be 0."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


_SHAPED = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.ARANGE, Ops.SHRINK})  # the ops whose arg may hold a bound size


def sizes_of(u: UOp) -> tuple:
    """The sizes a RESHAPE's, EXPAND's, ARANGE's or SHRINK's arg holds (an ARANGE's is one, a SHRINK's are pairs)."""
    if u.op is Ops.ARANGE: return (u.arg,)
    return tuple(s for pair in u.arg for s in pair) if u.op is Ops.SHRINK else u.arg


def _compute_bound(u: UOp) -> bool:
    if (op := u.op) is Ops.BIND or (op in _SHAPED and any(type(s) is UOp for s in sizes_of(u))): return True
    for s in u.src:
        if s._bound: return True  # type: ignore[attr-defined]  # filled by _bottom_up before us
    return False


def _compute_ranges(u: UOp) -> dict[UOp, None]:
    if u.op is Ops.RANGE: return {u: None}
    out: dict[UOp, None] = {}
    for s in u.src: out.update(s._ranges)  # type: ignore[attr-defined]  # filled by _bottom_up before us
    if u.op is Ops.END:
        for r in u.src[1:]: out.pop(r, None)
    if u.op is Ops.REDUCE:
        for r in u.src[1:]: out.pop(r, None)
    return out


# ---- shapes of tensor-level nodes ------------------------------------------------------------------------------

def _compute_shape(u: UOp) -> tuple[int, ...]:
    if u.op is Ops.BUFFER: return (u.arg.size,)
    if u.op is Ops.DEFINE_GLOBAL: return (u.dtype.size,)
    if u.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND): return ()
    if u.op is Ops.ARANGE: return (u.arg,)
    if u.op is Ops.FOLD: return u.arg.shape
    if u.op in (Ops.RESHAPE, Ops.EXPAND): return u.arg
    src = u.src[0]._shape if u.src else ()  # type: ignore[attr-defined]  # filled by _bottom_up before us
    if u.op is Ops.PERMUTE: return tuple(src[i] for i in u.arg)
    # (an axis left as it is keeps its size itself: a symbolic one stays its bound variable, not `bs + 0`)
    if u.op is Ops.PAD: return tuple(s if b == a == 0 else s + b + a for s, (b, a) in zip(src, u.arg, strict=True))
    if u.op is Ops.SHRINK: return tuple(e if b == 0 else e - b for b, e in u.arg)
    if u.op is Ops.REDUCE_AXIS: return tuple(1 if i in u.arg[1] else s for i, s in enumerate(src))
    if u.op is Ops.GATHER: return src[:u.arg] + u.src[1]._shape + src[u.arg + 1:]  # type: ignore[attr-defined]
    if u.op is Ops.SCATTER_ADD:
        a, k = u.arg.axis, len(u.src[1]._shape)  # type: ignore[attr-defined]
        return src[:a] + (u.arg.size,) + src[a + k:]
    if u.op in (Ops.SINK, Ops.KERNEL): return ()
    return src


def constant_of(u: UOp) -> ConstType | None:
    """The value of a constant tensor (a CONST reshaped and expanded to any shape), else None."""
    while u.op in (Ops.RESHAPE, Ops.EXPAND): u = u.src[0]
    return u.arg if u.op is Ops.CONST else None


# ---- printing ---------------------------------------------------------------------------------------------------

def render_tree(root: UOp, max_depth: int = 1_000_000) -> str:
    """`UOp(Ops.ADD, dtypes.int32, src=(...))`, indented; a node seen before prints as its number `xN`."""
    lines: list[str] = []
    seen: dict[UOp, int] = {}
    stack: list[tuple[UOp | str, int, str]] = [(root, 0, "")]
    while stack:
        node, depth, comma = stack.pop()
        pad = "  " * min(depth, 16)  # capped: a deep chain prints in linear size
        if isinstance(node, str):  # the closing of a src tuple
            lines.append(node)
            continue
        if node in seen:
            lines.append(f"{pad}x{seen[node]}{comma}")
            continue
        seen[node] = len(seen)
        head = f"{pad}UOp({node.op!r}, {node.dtype!r}" + ("" if node.arg is None else f", arg={node.arg!r}")
        if not node.src:
            lines.append(head + f"){comma}")
        elif depth >= max_depth:
            lines.append(head + f", src=(...{len(node.src)})){comma}")
        else:
            lines.append(head + ", src=(")
            stack.append((pad + "))" + comma, 0, ""))
            stack.extend((s, depth + 1, ",") for s in reversed(node.src))
    return "\n".join(lines)


_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.FDIV: "/", Ops.CMPLT: "<",
          Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}


def render_expr(root: UOp) -> str:
    """An infix string for an expression graph; unknown ops print as calls."""
    text: dict[UOp, str] = {}
    for u in root.toposort():
        s = [text[x] for x in u.src]
        if u.op is Ops.CONST: text[u] = repr(u.arg)
        elif u.op is Ops.DEFINE_VAR: text[u] = u.arg.name
        elif u.op is Ops.BIND: text[u] = f"{u.src[0].arg.name}={u.src[1].arg}"
        elif u.op is Ops.RANGE: text[u] = f"r{u.arg.axis}"
        elif u.op in _INFIX: text[u] = f"({s[0]}{_INFIX[u.op]}{s[1]})"
        elif u.op is Ops.NEG: text[u] = f"(-{s[0]})"
        elif u.op is Ops.WHERE: text[u] = f"({s[1]} if {s[0]} else {s[2]})"
        elif u.op is Ops.MAX: text[u] = f"max({s[0]}, {s[1]})"
        else: text[u] = f"{u.op.name.lower()}({', '.join(s)})"
    out = text[root]
    return out[1:-1] if out.startswith("(") and out.endswith(")") and root.op in _INFIX else out


def print_graph(root: UOp) -> str:
    """The graph as Python-like statements, one node per line, sources before users."""
    names: dict[UOp, str] = {}
    lines = []
    for i, u in enumerate(root.toposort()):
        names[u] = f"n{i}"
        src = ", ".join(names[s] for s in u.src)
        arg = "" if u.arg is None else f", arg={u.arg!r}"
        lines.append(f"n{i} = UOp({u.op!r}, {u.dtype!r}, ({src}{',' if len(u.src) == 1 else ''}){arg})")
    return "\n".join(lines)
