"""Movement Tensor ops: reshape, permute, expand, pad, shrink, flip and what is built from them (slicing, transpose).

Each builds one movement node and copies nothing; the scheduler turns chains of them into index arithmetic.
Arguments are checked here, before a graph is built, and errors name the op and the shapes involved.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.dtype import least_upper_dtype
from ember.errors import ArgumentError, AxisError, ModeError, ShapeError, SizeTypeError
from ember.helpers import prod
from ember.uop.ops import Ops, UOp
from ember.variables import Sint, check_dim, concrete, is_symbolic, same_axes

if TYPE_CHECKING:
    from ember.tensor import Tensor


def either_axis(op: str, axis: Any, dim: Any, default: Any = None) -> Any:
    """The axis given as `axis=` (tinygrad's name) or `dim=` (torch's); both at once is an error, neither gives
    `default`."""
    if axis is not None and dim is not None:
        raise TypeError(f"{op}: got both axis={axis!r} and dim={dim!r}; pass one of them (they mean the same)")
    if axis is None and dim is None: return default
    return dim if axis is None else axis


def is_int_axis(axis: Any) -> bool:
    """Whether `axis` names one axis (a Python or numpy int), not a sequence of them or None. A bool is no axis,
    as in torch; Tensor._axis checks each axis with this."""
    return isinstance(axis, (int, np.integer)) and not isinstance(axis, bool)


def axis_list(x: Tensor, axis: Any, op: str) -> list[int]:
    """`axis` (an int or a sequence of ints) as non-negative axes of x, each at most once."""
    items = [axis] if is_int_axis(axis) else (list(axis) if isinstance(axis, (tuple, list)) else None)
    if items is None:
        raise TypeError(f"{op}: axis must be an int or a sequence of ints, got {axis!r} ({type(axis).__name__})")
    axes = [x._axis(a, op) for a in items]
    for a in axes:
        if axes.count(a) > 1:
            raise ShapeError(f"{op}: axis {a} appears more than once in {tuple(items)}; name each axis once")
    return axes


def reduce_axes(x: Tensor, axis: Any, op: str) -> tuple[int, ...]:
    """The sorted axes a reduction over `axis` covers: all of them for None or (), as torch."""
    if axis is None or (isinstance(axis, (tuple, list)) and len(axis) == 0): return tuple(range(x.ndim))
    axes = axis_list(x, axis, op)
    return () if x.ndim == 0 else tuple(sorted(axes))


def _shape_arg(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """Accept `f(2, 3)` and `f((2, 3))`."""
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)


def size_args(shape: tuple[Any, ...], op: str, variables: bool = True) -> tuple[Sint, ...]:
    """The sizes of `f(2, 3)` or `f((2, 3))` as Python ints, read as torch reads a size: an int, a numpy int or
    anything else with __index__ (a one-element int tensor), but not a bool. A bound Variable (a UOp) stays one
    where `variables`. Anything else (a float, None, a bool) raises SizeTypeError: a TypeError, as torch's, and a
    ShapeError, as ember raised before. Signs are the caller's to check."""
    given, sizes = _shape_arg(shape), []
    if all(type(s) is int for s in given): return given  # the common case, checked at once
    for s in given:
        if type(s) is UOp and variables:
            sizes.append(s)
            continue
        try:
            if isinstance(s, (bool, np.bool_)): raise TypeError
            sizes.append(operator.index(s))
        except TypeError:
            raise SizeTypeError(f"{op}: sizes must be ints, got {given} ({type(s).__name__} {s!r})") from None
    return tuple(sizes)


def _real_axis(x: Tensor, dim: int, op: str) -> int:
    """x._axis for ops that cut or shift along an axis: a 0-d tensor has none (torch's other ops take dim 0 or -1
    on it as a stand-in axis of size 1)."""
    if x.ndim == 0: raise AxisError(f"{op}: a 0-d tensor has no axis {dim} to {op} along; reshape it to 1-d first")
    return x._axis(dim, op)


def _tensor_list(op: str, first: Any, others: tuple[Any, ...], dim: int) -> tuple[list[Tensor], int]:
    """The tensors and the axis of a cat or stack called on a tensor (`x.cat(y)`) or on a sequence of them (torch's
    `Tensor.cat((x, y), dim)`, where a second positional argument is the axis)."""
    from ember.tensor import Tensor
    if isinstance(first, (tuple, list)):
        if len(others) > 1 or (others and not is_int_axis(others[0])):
            raise TypeError(f"{op}: after a sequence of tensors, only the axis may follow, got {others!r}")
        if others: dim = operator.index(others[0])
        if not first: raise ShapeError(f"{op}: got an empty sequence of tensors; give at least one")
        tensors = list(first)
    else: tensors = [first, *others]
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: expected Tensors, got {type(t).__name__}; pass the axis as dim=")
    return tensors, dim


REARRANGE_TOKEN = re.compile(r"\.\.\.|[()]|[A-Za-z_][A-Za-z0-9_]*|\d+|\S")


def _rearrange_side(side: str, formula: str) -> list[tuple[list[str], bool]]:
    """One side of a rearrange formula as its axes, each (the names it is made of, whether parenthesized): "(h w)"
    is (["h", "w"], True), "h" is (["h"], False), "1" and "()" are a unit axis ([]); "..." stays a name here."""
    groups: list[tuple[list[str], bool]] = []
    group: list[str] | None = None
    for token in REARRANGE_TOKEN.findall(side):
        if token == "(":
            if group is not None: raise ValueError(f"rearrange: nested parentheses in {formula!r}; groups are flat")
            group = []
        elif token == ")":
            if group is None: raise ValueError(f"rearrange: ')' without '(' in {formula!r}")
            groups.append((group, True))
            group = None
        elif token == "..." or token[0].isalpha() or token[0] == "_":
            if group is None: groups.append(([token], False))
            else: group.append(token)
        elif token.isdigit() and int(token) == 1:
            if group is None: groups.append(([], True))  # a unit axis; inside a group, a factor 1 changes nothing
        else:
            what = "a size" if token.isdigit() else "character"
            raise ValueError(f"rearrange: unexpected {what} {token!r} in {formula!r}; a side holds axis names, '...', "
                             "'1' or '()' for a unit axis, and parenthesized groups (sizes go in keywords: h=2)")
    if group is not None: raise ValueError(f"rearrange: '(' without ')' in {formula!r}")
    names = [n for g, _ in groups for n in g]
    if repeated := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"rearrange: {', '.join(repeated)} appears more than once on one side of {formula!r}")
    return groups


def _expand_ellipsis(groups: list[tuple[list[str], bool]], ellipsis: list[str]) -> list[list[str]]:
    """The axes' names with "..." replaced by the names of the axes it stands for: one axis each when alone, one
    axis made of all of them inside parentheses (the right side's "(...)" merges them)."""
    out: list[list[str]] = []
    for names, grouped in groups:
        if names == ["..."] and not grouped: out.extend([e] for e in ellipsis)
        else: out.append([e for n in names for e in (ellipsis if n == "..." else [n])])
    return out


def _part(x: Tensor, axis: int, lo: int, hi: int) -> Tensor:
    """Elements lo..hi-1 of `axis`."""
    return x.shrink([(lo, hi) if i == axis else None for i in range(x.ndim)])


class MovementMixin:
    """Views of a tensor's data in another shape or order."""

    __slots__ = ()

    def _movement(self: Tensor, op: Ops, arg: Any) -> Tensor:
        return self._wrap(UOp(op, self.dtype, (self.uop,), arg))

    def _copy(self: Tensor) -> Tensor:
        """self's value as a tensor of its own, for an op torch always copies (flip, roll, pad, cat) that changes
        nothing here: a setitem on the result must leave self as it is."""
        return self._wrap(self.uop)

    def reshape(self: Tensor, *shape: int | Sequence[int]) -> Tensor:
        """The same elements in row-major order, in `shape` (one -1 is inferred)."""
        new = size_args(shape, "reshape")
        if is_symbolic(new) or is_symbolic(self.shape): return self._symbolic_reshape(new)
        if new.count(-1) > 1: raise ShapeError(f"reshape: only one size may be -1, got {new}")
        if any(s < -1 for s in new): raise ShapeError(f"reshape: negative size in {new}")
        if -1 in new:
            known = prod(s for s in new if s != -1)
            if known == 0 or self.numel() % known:
                raise ShapeError(f"reshape: cannot infer -1 in {new} for {self.numel()} elements {self.shape}")
            new = tuple(self.numel() // known if s == -1 else s for s in new)
        if prod(new) != self.numel():
            raise ShapeError(f"reshape: cannot reshape {self.shape} ({self.numel()} elements) to {new} "
                             f"({prod(new)} elements); sizes must match")
        return self if new == self.shape else self._movement(Ops.RESHAPE, new)

    view = reshape

    def _symbolic_reshape(self: Tensor, new: tuple[Sint, ...]) -> Tensor:
        """reshape where either shape holds a bound variable (ember/variables.py): a view where every symbolic axis
        stays whole, else the buffer read in the new shape (realized first where self is not a buffer already)."""
        from ember.schedule.kernelize import is_buffer_view
        for s in new:
            check_dim("reshape", s)
            if type(s) is not UOp and (not isinstance(s, int) or s < 0):
                raise ShapeError(f"reshape: sizes must be ints or bound Variables (no -1 beside them), got {new}")
        if prod(concrete(new)) != prod(concrete(self.shape)):
            raise ShapeError(f"reshape: cannot reshape {self.shape} ({prod(concrete(self.shape))} elements) to {new} "
                             f"({prod(concrete(new))} elements with these values); sizes must match")
        if new == self.shape: return self
        if same_axes(new, self.shape): return self._movement(Ops.RESHAPE, new)
        base = self.contiguous().realize().uop
        while base.op is Ops.RESHAPE: base = base.src[0]
        assert is_buffer_view(base)
        return self._wrap(UOp(Ops.RESHAPE, self.dtype, (base,), new))

    def permute(self: Tensor, *order: int | Sequence[int]) -> Tensor:
        """The axes in `order` (a permutation of 0..ndim-1, negatives allowed)."""
        axes = tuple(self._axis(a, "permute") for a in _shape_arg(order))
        if sorted(axes) != list(range(self.ndim)):
            raise ShapeError(f"permute: {tuple(_shape_arg(order))} is not a permutation of the {self.ndim} axes of "
                             f"{self.shape}")
        return self if axes == tuple(range(self.ndim)) else self._movement(Ops.PERMUTE, axes)

    def expand(self: Tensor, *shape: int | Sequence[int]) -> Tensor:
        """Axes of size 1 repeated to `shape` (-1 keeps an axis; new leading axes may be added)."""
        return self._expand(size_args(shape, "expand"), "expand")

    def broadcast_to(self: Tensor, *shape: int | Sequence[int]) -> Tensor:
        """self broadcast to `shape`, as torch.broadcast_to: expand's rules (-1 keeps an axis; new leading axes may
        be added; only axes of size 1 grow), and a view as expand's."""
        return self._expand(size_args(shape, "broadcast_to"), "broadcast_to")

    def expand_as(self: Tensor, other: Tensor) -> Tensor:
        """self expanded to `other`'s shape: `self.expand(other.shape)`, as torch's expand_as."""
        from ember.tensor import Tensor
        if not isinstance(other, Tensor):
            raise TypeError(f"expand_as: expected a Tensor, got {type(other).__name__}; use expand for a shape")
        return self._expand(other.shape, "expand_as")

    def _expand(self: Tensor, new: tuple[Sint, ...], op: str) -> Tensor:
        """expand to the sizes `new` (ints or bound Variables, as size_args gives them), errors naming `op`."""
        if len(new) < self.ndim: raise ShapeError(f"{op}: {new} has fewer axes than {self.shape}")
        for i, n in enumerate(new):
            if type(n) is not UOp and (n < -1 or n == -1 and i < len(new) - self.ndim):
                raise ShapeError(f"{op}: negative size in {new}; -1 keeps an axis self has, no new one")
        old = (1,) * (len(new) - self.ndim) + self.shape
        new = tuple(o if n == -1 else n for o, n in zip(old, new, strict=True))
        for o, n in zip(old, new, strict=True):
            if o != n and o != 1:
                raise ShapeError(f"{op}: cannot expand {self.shape} to {new}; only axes of size 1 can grow")
        x = self.reshape(old) if old != self.shape else self
        return x if new == old else x._movement(Ops.EXPAND, new)

    def pad(self: Tensor, padding: Sequence[Any], mode: str = "constant", value: float = 0.0) -> Tensor:
        """Pad by ((before, after), ...) per axis from the first, or torch's flat form from the last axis back.

        mode "constant" fills with `value`; "reflect" mirrors without repeating the edge, "replicate" repeats the
        edge, "circular" wraps around (each as torch.nn.functional.pad). Negative padding crops, in every mode."""
        if mode not in ("constant", "reflect", "replicate", "circular"):
            raise ModeError(f"pad: mode must be constant, reflect, replicate or circular, got {mode!r}")
        if all(isinstance(p, int) for p in padding):
            if len(padding) % 2 or len(padding) // 2 > self.ndim:
                raise ShapeError(f"pad: flat padding {tuple(padding)} needs two values per axis for {self.shape}")
            pairs = [(0, 0)] * self.ndim
            for i in range(len(padding) // 2): pairs[self.ndim - 1 - i] = (padding[2 * i], padding[2 * i + 1])
        else:
            if len(padding) != self.ndim:
                raise ShapeError(f"pad: {len(padding)} (before, after) pairs for the {self.ndim} axes of {self.shape}")
            pairs = [(0, 0) if p is None else tuple(p) for p in padding]
        # negative padding crops. torch's circular mode crops first and wraps what is left; reflect and replicate
        # pad the whole axis first, then crop (the same for constant and replicate; reflect reads further in)
        pads_first = mode in ("reflect", "replicate")
        for (b, a), s in zip(pairs, self.shape, strict=True):
            if (s + b + a if pads_first else s + min(b, 0) + min(a, 0)) < 0:
                raise ShapeError(f"pad: padding {(b, a)} removes more than the {s} elements of an axis of {self.shape}")
        if any(b < 0 or a < 0 for b, a in pairs):
            grown = [(max(b, 0), max(a, 0)) for b, a in pairs]
            x = self.pad(grown, mode=mode) if pads_first else self
            crop = [(max(-b, 0), n - max(-a, 0)) for (b, a), n in zip(pairs, x.shape, strict=True)]
            return x.shrink(crop) if pads_first else x.shrink(crop).pad(grown, mode=mode, value=value)
        if mode != "constant": return self._pad_from_data(pairs, mode)
        arg = tuple((int(b), int(a)) for b, a in pairs)
        if all(p == (0, 0) for p in arg): return self._copy()
        out = self._movement(Ops.PAD, arg)
        if value == 0 and math.copysign(1, value) > 0: return out  # -0.0 must be written: 1 / it is -inf
        from ember.tensor import Tensor
        inside = Tensor.ones(self.shape, dtype="bool", device=self.device).pad(arg)
        return inside.where(out, value).cast(self.dtype)

    def _pad_from_data(self: Tensor, pairs: list[tuple[int, int]], mode: str) -> Tensor:
        """Padding made of the tensor's own elements, one axis at a time."""
        x = self
        for axis, (before, after) in enumerate(pairs):
            n = x.shape[axis]
            limit = n - 1 if mode == "reflect" else (n if mode == "circular" else math.inf)
            if max(before, after) > limit or (n == 0 and before + after):
                raise ShapeError(f"pad: {mode} padding {(before, after)} is too large for axis {axis} of size {n} "
                                 f"in {self.shape}")
            if mode == "reflect":
                head, tail = _part(x, axis, 1, before + 1).flip(axis), _part(x, axis, n - 1 - after, n - 1).flip(axis)
            elif mode == "circular": head, tail = _part(x, axis, n - before, n), _part(x, axis, 0, after)
            else:
                head = _part(x, axis, 0, 1).expand([before if i == axis else -1 for i in range(x.ndim)])
                tail = _part(x, axis, n - 1, n).expand([after if i == axis else -1 for i in range(x.ndim)])
            x = head.cat(x, tail, dim=axis)
        return x

    def shrink(self: Tensor, arg: Sequence[tuple[int, int] | None]) -> Tensor:
        """The sub-box [start, end) on every axis (None keeps an axis)."""
        if len(arg) != self.ndim:
            raise ShapeError(f"shrink: {len(arg)} ranges for the {self.ndim} axes of {self.shape}")
        for a, s in zip(arg, self.shape, strict=True):
            if type(s) is UOp and a is not None and tuple(a) != (0, s):
                raise ShapeError(f"shrink: range {tuple(a)} of the symbolic axis of size {s!r} in {self.shape}: only "
                                 "the whole axis is supported (reshape to a concrete shape first)")
        box = tuple((0, s) if a is None or type(s) is UOp else (int(a[0]), int(a[1]))
                    for a, s in zip(arg, self.shape, strict=True))
        for (b, e), s in zip(box, self.shape, strict=True):
            if type(s) is not UOp and not 0 <= b <= e <= s:
                raise ShapeError(f"shrink: range {(b, e)} does not fit in {self.shape}")
        return self if all(b == 0 and e == s for (b, e), s in zip(box, self.shape, strict=True)) else \
            self._movement(Ops.SHRINK, box)

    def flip(self: Tensor, *axis: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """The order of elements reversed along `axis` (torch's keyword: `dims`); naming an axis twice is an error."""
        if axis and dims is not None: either_axis("flip", axis, dims)
        axes = set(axis_list(self, _shape_arg(axis) if dims is None else dims, "flip"))
        flags = tuple(i in axes and (type(s) is UOp or s > 1) for i, s in enumerate(self.shape))  # (UOp: symbolic)
        return self._movement(Ops.FLIP, flags) if any(flags) else self._copy()

    # ---- composites ----------------------------------------------------------------------------------------------

    def transpose(self: Tensor, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = self._axis(dim0, "transpose"), self._axis(dim1, "transpose")
        if self.ndim == 0: return self  # dims 0 and -1 name the one "axis" of a scalar, as in torch
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self: Tensor) -> Tensor:  # noqa: N802  (numpy's name)
        return self.permute(tuple(reversed(range(self.ndim))))

    def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0: return self.reshape(1)
        a, b = self._axis(start_dim, "flatten"), self._axis(end_dim, "flatten")
        if a > b: raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for {self.shape}")
        return self.reshape(self.shape[:a] + (prod(self.shape[a:b + 1]),) + self.shape[b + 1:])

    def unflatten(self: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
        """Axis `dim` split into axes of `sizes` (one may be -1), the reverse of flatten."""
        if self.ndim == 0: raise ShapeError("unflatten: a 0-d tensor has no axis to split")
        d, new = self._axis(dim, "unflatten"), size_args((tuple(sizes),), "unflatten", variables=False)
        n = self.shape[d]
        if not new or any(s < -1 for s in new) or new.count(-1) > 1:
            raise ShapeError(f"unflatten: sizes must be a non-empty tuple of non-negative ints with at most one -1, "
                             f"got {new}")
        known = prod(s for s in new if s != -1)
        if (-1 not in new and known != n) or (-1 in new and (known == 0 or n % known)):
            raise ShapeError(f"unflatten: sizes {new} do not multiply to {n}, the size of axis {d} of {self.shape}")
        return self.reshape(self.shape[:d] + tuple(n // known if s == -1 else s for s in new) + self.shape[d + 1:])

    def unsqueeze(self: Tensor, dim: int) -> Tensor:
        """A new axis of size 1 at `dim` (counted in the result, so -1 appends)."""
        d = self._axis(dim, "unsqueeze")
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
        """The axes `dim` (an int or a tuple, as torch) removed where their size is 1; all such axes when None."""
        if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
        axes = axis_list(self, dim, "squeeze")
        if self.ndim == 0: return self
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in axes and s == 1)))

    def _strided(self: Tensor, steps: list[int]) -> Tensor:
        """Every steps[i]-th element along each axis, starting with the first."""
        if all(s == 1 for s in steps): return self
        x = self
        for axis, step in enumerate(steps):
            if step == 1: continue
            size = x.shape[axis]
            n = -(-size // step)
            x = x.pad([(0, 0)] * axis + [(0, n * step - size)] + [(0, 0)] * (x.ndim - axis - 1))
            x = x.reshape(x.shape[:axis] + (n, step) + x.shape[axis + 1:])
            x = x.shrink([None] * (axis + 1) + [(0, 1)] + [None] * (x.ndim - axis - 2))
            x = x.reshape(x.shape[:axis + 1] + x.shape[axis + 2:])
        return x

    def unfold(self: Tensor, dim: int, size: int, step: int) -> Tensor:
        """Windows of `size` elements every `step` along `dim`, as torch.Tensor.unfold: axis `dim` becomes the
        number of windows and a new last axis of length `size` holds each window.

        >>> from ember import Tensor
        >>> Tensor([1, 2, 3, 4, 5]).unfold(0, 2, 2).tolist()
        [[1, 2], [3, 4]]
        """
        if self.ndim == 0: raise ShapeError("unfold: a 0-d tensor has no axis to cut into windows")
        d = self._axis(dim, "unfold")
        n = self.shape[d]
        if not isinstance(size, int) or not isinstance(step, int) or size < 0 or step <= 0:
            raise ShapeError(f"unfold: size must be >= 0 and step > 0, got size={size!r}, step={step!r}")
        if size > n: raise ShapeError(f"unfold: size {size} is larger than axis {d} of {self.shape} ({n})")
        windows = (n - size) // step + 1
        if size == 0: return _part(self, d, 0, 0).reshape(self.shape[:d] + (windows,) + self.shape[d + 1:] + (0,))
        from ember.mixin.nn import _pool
        last = [a for a in range(self.ndim) if a != d] + [d]
        pooled = _pool(self.permute(last), (size,), (step,), (1,))  # (..., windows, size)
        return pooled.permute(list(range(d)) + [self.ndim - 1] + list(range(d, self.ndim - 1)) + [self.ndim])

    def rearrange(self: Tensor, formula: str, **sizes: int) -> Tensor:
        """The axes regrouped and reordered by an einops formula `"<axes in> -> <axes out>"`: names for axes,
        parentheses for an axis made of several (`(h w)`), `...` for any number of axes, `1` or `()` for a unit
        axis; keywords give sizes that the shape alone does not fix. A reshape, a permute and a reshape: no copy.

        >>> from ember import Tensor
        >>> Tensor.arange(6).reshape(2, 3).rearrange("a b -> b a").tolist()
        [[0, 3], [1, 4], [2, 5]]
        >>> Tensor.arange(6).rearrange("(h w) -> w h", h=2).shape
        (3, 2)
        """
        if not isinstance(formula, str) or formula.count("->") != 1:
            raise ValueError(f"rearrange: the formula must be one string '<axes in> -> <axes out>', got {formula!r}")
        left_text, right_text = formula.split("->")
        left, right = _rearrange_side(left_text, formula), _rearrange_side(right_text, formula)
        left_names, right_names = [n for g, _ in left for n in g], [n for g, _ in right for n in g]
        if set(left_names) != set(right_names):
            side, names = ("left", set(left_names) - set(right_names)) if set(left_names) - set(right_names) else \
                ("right", set(right_names) - set(left_names))
            raise ValueError(f"rearrange: {', '.join(sorted(names))} only on the {side} of {formula!r}; rearrange "
                             "keeps every axis, so each name is on both sides")
        if any("..." in g and grouped for g, grouped in left):
            raise ValueError(f"rearrange: '...' inside parentheses on the left of {formula!r}; it may be grouped on "
                             "the right only")
        if unused := sorted(set(sizes) - set(left_names)):
            raise ValueError(f"rearrange: sizes given for {', '.join(unused)}, which {formula!r} does not name")
        for name, size in sizes.items():
            if not isinstance(size, int) or size < 0:
                raise ShapeError(f"rearrange: size {name}={size!r} must be a non-negative int")
        named = len(left) - ("..." in left_names)
        if self.ndim != named and ("..." not in left_names or self.ndim < named):
            need = f"at least {named}" if "..." in left_names else str(named)
            raise ShapeError(f"rearrange: the left of {formula!r} names {need} axes, the tensor has {self.ndim} "
                             f"{self.shape}")
        ellipsis = [f"...{i}" for i in range(self.ndim - named)]
        axes_in, axes_out = _expand_ellipsis(left, ellipsis), _expand_ellipsis(right, ellipsis)
        known = dict(sizes)
        for group, n in zip(axes_in, self.shape, strict=True):
            unknown = [a for a in group if a not in known]
            given = prod(known[a] for a in group if a in known)
            if len(unknown) > 1 or (unknown and (given == 0 or n % given)) or (not unknown and given != n):
                text = group[0] if len(group) == 1 else f"({' '.join(group)})" if group else "1"
                why = f"cannot infer both {unknown[0]} and {unknown[1]}" if len(unknown) > 1 else \
                    f"the sizes {({a: known[a] for a in group if a in known})} do not divide or match it" if group \
                    else "'1' and '()' stand for an axis of size 1"
                raise ShapeError(f"rearrange: axis {text} has size {n} in {self.shape}: {why}; give the sizes of all "
                                 "but one name of a group as keywords, multiplying to the axis size")
            if unknown: known[unknown[0]] = n // given
        flat_in = [a for g in axes_in for a in g]
        split = self.reshape([known[a] for a in flat_in])
        moved = split.permute([flat_in.index(a) for g in axes_out for a in g])
        return moved.reshape([prod(known[a] for a in g) for g in axes_out])

    def meshgrid(self: Tensor, *others: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
        """Coordinate grids of self and `others` (0-d or 1-d), as torch.meshgrid; "xy" swaps the first two axes."""
        if indexing not in ("ij", "xy"):
            raise ArgumentError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
        tensors = (self, *others)
        for i, t in enumerate(tensors):
            if t.ndim > 1: raise ShapeError(f"meshgrid: tensors must be 0-d or 1-d, got {t.shape} at position {i}")
        sizes = [t.numel() for t in tensors]
        if indexing == "xy" and len(tensors) > 1: sizes[0], sizes[1] = sizes[1], sizes[0]
        grids = []
        for i, t in enumerate(tensors):
            axis = (1 - i if i < 2 else i) if indexing == "xy" and len(tensors) > 1 else i
            grids.append(t.reshape(tuple(-1 if a == axis else 1 for a in range(len(tensors)))).expand(sizes))
        return tuple(grids)

    def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The elements (i, i + offset) of axes `dim1` and `dim2`, as a new last axis; the other axes stay in order
        (torch.diagonal). A view built from movement ops, so gradients flow back to the diagonal only.

        >>> from ember import Tensor
        >>> Tensor([[1, 2, 3], [4, 5, 6]]).diagonal(1).tolist()
        [2, 6]
        """
        if self.ndim < 2: raise ShapeError(f"diagonal: needs at least 2 axes, got {self.shape}")
        a, b = self._axis(dim1, "diagonal"), self._axis(dim2, "diagonal")
        if a == b: raise ShapeError(f"diagonal: dim1 and dim2 name the same axis {a} of {self.shape}; give two axes")
        x = self.permute([i for i in range(self.ndim) if i not in (a, b)] + [a, b])
        rows, cols = x.shape[-2], x.shape[-1]
        lo_row, lo_col = max(-offset, 0), max(offset, 0)
        n = max(min(rows - lo_row, cols - lo_col), 0)
        if n == 0: return x.shrink([None] * (x.ndim - 2) + [(0, 0), (0, 0)]).reshape(x.shape[:-2] + (0,))
        x = x.shrink([None] * (x.ndim - 2) + [(lo_row, lo_row + n), (lo_col, lo_col + n)])  # square: (..., n, n)
        # element (i, i) of an n x n block is at flat position i * (n + 1): every (n+1)-th element from the first
        return x.flatten(-2)._strided([1] * (x.ndim - 2) + [n + 1])

    def diag(self: Tensor, diagonal: int = 0) -> Tensor:
        """A 1-d tensor laid on diagonal `diagonal` of a square matrix of zeros, or the diagonal of a 2-d tensor as
        a 1-d one (torch.diag).

        >>> from ember import Tensor
        >>> Tensor([1, 2]).diag(1).tolist()
        [[0, 1, 0], [0, 0, 2], [0, 0, 0]]
        """
        if self.ndim == 2: return self.diagonal(diagonal)
        if self.ndim != 1: raise ShapeError(f"diag: needs a 1-d or 2-d tensor, got {self.shape}")
        n, k = self.shape[0], abs(diagonal)
        # (n, 1) padded to (n, n+1) and read as n x n puts element i at (i, i)
        square = self.reshape(n, 1).pad(((0, 0), (0, n))).flatten()[:n * n].reshape(n, n) if n else \
            self.reshape(0, 0)
        return square.pad(((0, k), (k, 0)) if diagonal >= 0 else ((k, 0), (0, k)))

    # ---- joining and splitting -----------------------------------------------------------------------------------

    def cat(self: Tensor | Sequence[Tensor], *others: Tensor | int, dim: int = 0) -> Tensor:
        """self and `others` joined along `dim`; every other axis must match. Called as `x.cat(y, z)`,
        `Tensor.cat(x, y)` or torch's `Tensor.cat((x, y), dim)`.

        Each piece is padded to the full length and the pieces are selected by position with `where`, so the values
        are copied exactly (adding zero-padded pieces would turn -0.0 into 0.0)."""
        from ember.tensor import Tensor
        tensors, dim = _tensor_list("cat", self, others, dim)
        first = tensors[0]
        for i, t in enumerate(tensors):
            if t.ndim == 0: raise ShapeError(f"cat: the 0-d tensor at position {i} cannot be concatenated: it has no "
                                             "axis; reshape it to 1-d first (t.reshape(1)), or use stack")
        d = first._axis(dim, "cat")
        for t in tensors[1:]:
            if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape, strict=True))
                                           if i != d):
                raise ShapeError(f"cat: shapes {first.shape} and {t.shape} differ outside axis {d}")
        dtype = tensors[0].dtype
        for t in tensors[1:]: dtype = least_upper_dtype(dtype, t.dtype)
        sizes = [t.shape[d] for t in tensors]
        if any(type(size) is UOp for size in sizes):
            raise ShapeError(f"cat: joining along the symbolic axis {d} of {first.shape} is not supported (its length "
                             "would be a sum of variables); reshape to concrete shapes first")
        total = sum(sizes)
        position = Tensor.arange(total, device=first.device).reshape(tuple(total if i == d else 1
                                                                           for i in range(first.ndim)))
        out: Tensor | None = None
        end = total
        for t, size in zip(reversed(tensors), reversed(sizes), strict=True):  # the last piece is the fallback
            start = end - size
            piece = t.cast(dtype).pad(tuple((start, total - end) if i == d else (0, 0) for i in range(first.ndim)))
            out = piece if out is None else (position < end).where(piece, out)
            end = start
        assert out is not None
        return out

    def stack(self: Tensor | Sequence[Tensor], *others: Tensor | int, dim: int = 0) -> Tensor:
        """self and `others` (all of one shape) joined along a new axis `dim`. Called as `x.stack(y)`,
        `Tensor.stack(x, y)` or torch's `Tensor.stack((x, y), dim)`."""
        tensors, dim = _tensor_list("stack", self, others, dim)
        for t in tensors[1:]:
            if t.shape != tensors[0].shape:
                raise ShapeError(f"stack: shapes {tensors[0].shape} and {t.shape} differ; stacked tensors need one "
                                 "shape")
        d = tensors[0]._axis(dim, "unsqueeze")
        return tensors[0].unsqueeze(d).cat(*(t.unsqueeze(d) for t in tensors[1:]), dim=d)

    def split(self: Tensor, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        """Pieces of `sizes` elements along `dim` (an int: pieces of that size, the last one shorter)."""
        d = _real_axis(self, dim, "split")
        n = self.shape[d]
        if not isinstance(sizes, (list, tuple)):  # (an int, a numpy int: read as a size)
            size, = size_args((sizes,), "split", variables=False)
            if size <= 0: raise ShapeError(f"split: piece size must be positive, got {size}")
            sizes = [min(size, n - i) for i in range(0, n, size)] or [0]
        else: sizes = list(size_args(tuple(sizes), "split", variables=False))
        if sum(sizes) != n:
            raise ShapeError(f"split: sizes {list(sizes)} add up to {sum(sizes)}, not {n} ({self.shape})")
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return tuple(self.shrink(tuple((s, s + k) if i == d else None for i in range(self.ndim)))
                     for s, k in zip(starts, sizes, strict=True))

    def chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        """`chunks` pieces of equal size along `dim` (the last may be smaller), as torch.chunk."""
        if chunks <= 0: raise ShapeError(f"chunk: number of chunks must be positive, got {chunks}")
        return self.split(max(1, -(-self.shape[_real_axis(self, dim, "chunk")] // chunks)), dim)

    def repeat(self: Tensor, *repeats: int | Sequence[int]) -> Tensor:
        """The tensor tiled `repeats[i]` times along each axis (new leading axes allowed), as torch.repeat."""
        reps = size_args(repeats, "repeat")
        if len(reps) < self.ndim: raise ShapeError(f"repeat: {reps} has fewer entries than the axes of {self.shape}")
        shape = (1,) * (len(reps) - self.ndim) + self.shape
        x = self.reshape(tuple(v for s in shape for v in (1, s)))
        x = x.expand(tuple(v for r, s in zip(reps, shape, strict=True) for v in (r, s)))
        return x.reshape(tuple(r * s for r, s in zip(reps, shape, strict=True)))

    def repeat_interleave(self: Tensor, repeats: int, dim: int | None = None) -> Tensor:
        """Each element repeated `repeats` times along `dim` (of the flattened tensor when None), as torch."""
        repeats, = size_args((repeats,), "repeat_interleave", variables=False)
        if repeats < 0: raise ShapeError(f"repeat_interleave: repeats must be a non-negative int, got {repeats!r}")
        x = self.flatten() if dim is None else self
        d = x._axis(0 if dim is None else dim, "repeat_interleave")
        x = x.unsqueeze(d + 1)
        x = x.expand(x.shape[:d + 1] + (repeats,) + x.shape[d + 2:])
        return x.reshape(x.shape[:d] + (x.shape[d] * repeats,) + x.shape[d + 2:])

    def roll(self: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """Elements shifted along `dims` by `shifts`, wrapping around; without `dims`, the flattened tensor is rolled
        and the shape restored, as torch."""
        shifts_ = (shifts,) if is_int_axis(shifts) else tuple(shifts)
        if dims is None:
            if len(shifts_) != 1: raise ShapeError(f"roll: {len(shifts_)} shifts without dims; give one shift or dims")
            return self.flatten().roll(shifts_, 0).reshape(self.shape)
        dims_ = (dims,) if is_int_axis(dims) else tuple(dims)
        if len(shifts_) != len(dims_): raise ShapeError(f"roll: {len(shifts_)} shifts for {len(dims_)} dims")
        x = self
        for shift, dim in zip(shifts_, dims_, strict=True):
            d = _real_axis(self, dim, "roll")
            n = x.shape[d]
            if n == 0 or shift % n == 0: continue
            head, tail = x.split([n - shift % n, shift % n], d)
            x = tail.cat(head, dim=d)
        return x if x is not self else self._copy()
