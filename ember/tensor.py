"""The lazy Tensor: a user-facing handle on a tensor-level UOp graph. Nothing runs until it is realized.

The op families live in ember/mixin/ (elementwise, movement, reduce, creation); this module holds construction,
gradients, assignment and the in-place ops built on it, realization, and conversion back to Python and numpy
(float(), int(), np.asarray(), repr). Names, arguments and semantics follow PyTorch and tinygrad.

In-place ops (`t += 1`, `t.add_(1)`) give the Tensor object a new lazy value, so everyone holding that object sees
it; unlike torch, a view taken before (`t[0]`, `t.reshape(...)`) keeps the old values: views do not share storage.

>>> (Tensor([1.0, 2.0, 3.0]) * 2 + 1).tolist()
[3.0, 5.0, 7.0]
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import ContextDecorator
from typing import Any, ClassVar

import numpy as np

from ember.device import Buffer, Device, buffer_of, buffer_uop
from ember.dtype import DType, dtypes, to_bfloat16_bits, to_dtype, to_numpy
from ember.engine.realize import realize_graph
from ember.errors import AxisError, DeviceError, DTypeError, EmberError, JitError, ShapeError
from ember.helpers import ASSIGN_HOOKS, RECORDERS, prod
from ember.mixin.activation import ActivationMixin
from ember.mixin.creation import CreationMixin, int_dtype_for
from ember.mixin.elementwise import ElementwiseMixin
from ember.mixin.indexing import IndexingMixin
from ember.mixin.linalg import LinalgMixin
from ember.mixin.movement import MovementMixin, is_int_axis
from ember.mixin.nn import NNMixin
from ember.mixin.ordering import OrderingMixin
from ember.mixin.random import RandomMixin
from ember.mixin.reduce import ReduceMixin
from ember.schedule.kernelize import computed, create_schedule, is_buffer_view
from ember.uop.ops import Ops, UOp
from ember.variables import concrete

Scalar = int | float | bool


class _ClassFlag(ContextDecorator):
    """Sets a class-level flag of Tensor for a `with` block or a decorated function, then restores it."""

    def __init__(self, name: str, value: bool) -> None: self.name, self.value = name, value

    def __enter__(self) -> None:
        self.prev = getattr(Tensor, self.name)
        setattr(Tensor, self.name, self.value)

    def __exit__(self, *exc: object) -> None: setattr(Tensor, self.name, self.prev)


def no_grad() -> _ClassFlag:
    """`with no_grad():` (or `@no_grad()`): tensors computed inside carry no gradient back to their inputs.

    >>> x = Tensor([1.0, 2.0], requires_grad=True)
    >>> with no_grad(): y = x * 2
    >>> (x * y).sum().gradient(x)[0].tolist()
    [2.0, 4.0]
    """
    return _ClassFlag("no_grad", True)


def _data_to_uop(data: Any, dtype: DType | None, device: str) -> UOp:
    if isinstance(data, UOp): return data if dtype is None else data.cast(dtype)
    if isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):  # np.float64 is a float too
        dt = dtype or dtypes.from_py(data)
        if dtype is None and dt.is_int: dt = int_dtype_for("Tensor", data)
        return UOp.const(dt, data)
    if isinstance(data, (list, tuple)):
        dt = dtype or dtypes.from_py(data)
        arr = _nested_to_numpy(data, dt, infer=dtype is None)
        return _numpy_to_uop(arr, dtypes.from_numpy(arr.dtype) if dtype is None and dt.is_int else dt, device)
    if isinstance(data, np.ndarray) or np.isscalar(data):
        arr = np.asarray(data)
        dt = dtype or dtypes.from_numpy(arr.dtype)
        return _numpy_to_uop(arr, dt, device)
    raise DTypeError(f"Tensor: cannot make a tensor from {type(data).__name__}; give a number, list or numpy array")


def _nested_to_numpy(data: list | tuple, dtype: DType, infer: bool) -> np.ndarray:
    """Nested lists as an array of `dtype`; inferred ints that do not fit int32 come back as int64, as torch infers
    (then `_data_to_uop` reads the array's dtype)."""
    try:
        return np.array(data, dtype=np.float32 if dtype is dtypes.bfloat16 else to_numpy(dtype))
    except ValueError as e:
        raise ShapeError(f"Tensor: nested lists must be rectangular: {e}") from None
    except OverflowError as e:
        if not (infer and dtype.is_int): raise OverflowError(f"Tensor: {e}; valid values are {dtype.min}..{dtype.max} "
                                                             f"for {dtype.name}") from None
    try:
        return np.array(data, dtype=np.int64)
    except OverflowError:
        int_dtype_for("Tensor", *(v for v in _flat_ints(data) if isinstance(v, int)))  # raises, naming the value
        raise


def _flat_ints(data: Any) -> Iterator[Any]:
    if isinstance(data, (list, tuple)):
        for v in data: yield from _flat_ints(v)
    else: yield data


def _host_constant(u: UOp) -> np.ndarray | None:
    """The value of a constant tensor (a CONST reshaped, expanded or detached) as a 0-d numpy array of its dtype, or
    None. bfloat16 constants are left to a kernel: numpy has no bfloat16 to round in the same way."""
    while u.op in (Ops.RESHAPE, Ops.EXPAND, Ops.DETACH): u = u.src[0]
    if u.op is not Ops.CONST or u.dtype is dtypes.bfloat16: return None
    return np.asarray(u.arg, dtype=to_numpy(u.dtype))


def _host_values(x: Any) -> Any:
    """x with every Tensor in it (nested in tuples, lists and dicts) replaced by a numpy copy of its values."""
    if isinstance(x, Tensor): return x.numpy()
    if isinstance(x, (list, tuple)): return type(x)(_host_values(v) for v in x)
    if isinstance(x, dict): return {k: _host_values(v) for k, v in x.items()}
    return x


_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2}  # an in-place result may go down this order into self, never up


def _check_gradient_flows(graph: dict[UOp, None]) -> None:
    """Raise a JitError where a gradient would have to flow back through a node that has no graph below it for it:
    a jit replay's output (engine/jit.py marks its buffer node), which would otherwise give no gradient silently."""
    for u in graph:
        if u.op is Ops.BUFFER and (reason := u.__dict__.get("gradient_stop")) is not None: raise JitError(reason)


def _numpy_to_uop(arr: np.ndarray, dtype: DType, device: str) -> UOp:
    host = to_bfloat16_bits(arr) if dtype is dtypes.bfloat16 else arr.astype(to_numpy(dtype), copy=False)
    buf = Buffer(device, arr.size, dtype).copyin(host)
    return UOp(Ops.RESHAPE, dtype, (buffer_uop(buf),), arr.shape)


# the tensors backward() was called on (losses), realized by the next optimizer step with its updates: the forward
# pass they share with the gradients is computed once (a loss realized afterwards, as a torch user reads it after
# opt.step(), would recompute it). Weak: a loss nobody keeps is not computed.
BACKWARD_OUTPUTS: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()


def take_backward_outputs() -> list[Tensor]:
    """The tensors backward() was called on since the last call, forgotten by this one."""
    out = list(BACKWARD_OUTPUTS.values())
    BACKWARD_OUTPUTS.clear()
    return out


class Tensor(ElementwiseMixin, ActivationMixin, MovementMixin, IndexingMixin, ReduceMixin, OrderingMixin, NNMixin,
             CreationMixin, RandomMixin, LinalgMixin):
    """A lazy n-dimensional array.

    >>> Tensor([[1, 2], [3, 4]]).sum(axis=1).tolist()
    [3, 7]
    """

    __slots__ = ("uop", "device", "_requires_grad", "grad", "__weakref__")
    # the tensors backward() may fill .grad of, by id: a WeakSet would compare tensors with ==, which is elementwise
    _needs_grad: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
    no_grad: ClassVar[bool] = False  # set by `no_grad()`: new tensors are detached from their inputs
    training: ClassVar[bool] = False  # set by `Tensor.train()`: dropout and batchnorm behave as in training
    traced_inputs: ClassVar[set[UOp]] = set()  # placeholders of the NumericalFunctions being traced: no values yet
    # numpy binary operators (np.float32(2) * t) defer to Tensor's reflected ones; ufuncs (np.exp(t)) raise TypeError
    __array_ufunc__ = None

    @staticmethod
    def train(mode: bool = True) -> _ClassFlag:
        """`with Tensor.train():` runs Tensor.dropout and every module as in training. Modules (ember.nn.Module) also
        follow their own flag, True by default as in torch: `model.eval()` is how a model runs as in eval."""
        return _ClassFlag("training", mode)

    def __init__(self, data: Any, device: str | None = None, dtype: DType | str | None = None,
                 requires_grad: bool | None = None) -> None:
        self.device = Device.canonicalize(device or Device.DEFAULT)
        self.uop: UOp = _data_to_uop(data, None if dtype is None else to_dtype(dtype), self.device)
        self.grad: Tensor | None = None
        self._requires_grad: bool | None = None
        if requires_grad: self.requires_grad_()

    @classmethod
    def _from_uop(cls, uop: UOp, device: str) -> Tensor:
        out = cls.__new__(cls)
        out.uop, out.device, out._requires_grad, out.grad = uop, device, None, None
        return out

    # ---- derivatives ---------------------------------------------------------------------------------------------

    @property
    def requires_grad(self) -> bool | None:
        """Whether backward() fills `.grad`: True, False, or None (undecided: a layer's new parameter, which an
        optimizer makes trainable, where False marks a buffer it leaves alone). Setting it is `requires_grad_()`.

        >>> w = Tensor([1.0, 2.0])
        >>> w.requires_grad = True
        >>> _ = (w * w).sum().backward()
        >>> w.grad.tolist()
        [2.0, 4.0]
        """
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        if value is not None: self.requires_grad_(bool(value))
        else:
            Tensor._needs_grad.pop(id(self), None)
            self._requires_grad = None

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Mark self as a leaf whose gradient backward() fills in (or, with False, as one it does not).

        A leaf is stored in a buffer of its own first: gradients are found by node, and equal constants are one
        node (hash-consing), so `Tensor(2.0)` as a parameter must not be the same node as a constant 2.0."""
        if requires_grad and not self.dtype.is_float:
            raise DTypeError(f"requires_grad_: only tensors of floating point dtype can require gradients: got "
                             f"{self.dtype.name}; cast to a float dtype first (as torch)")
        self._requires_grad = requires_grad
        if requires_grad:
            if not is_buffer_view(self.uop): self.uop = self.contiguous()._stored()
            Tensor._needs_grad[id(self)] = self
        else: Tensor._needs_grad.pop(id(self), None)
        return self

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """d self / d target for each target, as lazy tensors (self must be a scalar unless `gradient` is given).

        >>> x = Tensor([1.0, 2.0, 3.0])
        >>> (x * x).sum().gradient(x)[0].tolist()
        [2.0, 4.0, 6.0]
        """
        if gradient is None:
            if self.numel() != 1:
                raise ShapeError(f"gradient: the output has shape {self.shape}; pass `gradient` for a non-scalar")
            gradient = Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
        elif gradient.shape != self.shape:
            raise ShapeError(f"gradient: seed shape {gradient.shape} does not match the output's {self.shape}")
        from ember.gradient import compute_gradient
        grads = compute_gradient(self.uop, gradient, {t.uop for t in targets})
        if len(grads) < len({t.uop for t in targets}): _check_gradient_flows(self.uop.toposort())
        return [grads[t.uop] if t.uop in grads else t.zeros_like() for t in targets]

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Accumulate d self / d t into `t.grad` for every tensor t with requires_grad that self depends on."""
        graph = self.uop.toposort()
        _check_gradient_flows(graph)
        targets = [t for t in list(Tensor._needs_grad.values()) if t.uop in graph]
        if not targets: raise RuntimeError("backward: no tensor with requires_grad=True is used to compute this one")
        for t, g in zip(targets, self.gradient(*targets, gradient=gradient), strict=True):
            t.grad = g if t.grad is None else t.grad + g
        if not Tensor.traced_inputs: BACKWARD_OUTPUTS[id(self)] = self
        return self

    def detach(self) -> Tensor:
        """The same values, with no gradient flowing back through them."""
        return self._wrap(UOp(Ops.DETACH, self.dtype, (self.uop,)))

    def contiguous_backward(self) -> Tensor:
        """self, unchanged; the gradient flowing back through this point is made contiguous (stored in a buffer of
        its own when realized) before it flows on, as tinygrad's: a kernel boundary in the backward pass."""
        return self._wrap(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)))

    def custom_vjp(self, inputs: Sequence[Tensor], pull: Callable[..., Sequence[Tensor | None]]) -> Tensor:
        """self's values, whose gradient with respect to `inputs` is `pull(grad, *inputs)` (one gradient, or None,
        per input) instead of the derivative of the graph that computes self: a derivative known in a form that
        runs faster than the one composition gives (a convolution's input gradient as a transposed convolution).
        Forward mode and vmap see self's own graph; under no_grad, self as it is."""
        if not callable(pull): raise TypeError(f"custom_vjp: pull must be callable, got {type(pull).__name__}")
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor):
                raise TypeError(f"custom_vjp: inputs[{i}] must be a Tensor, got {type(t).__name__}")
            if t.device != self.device:
                raise DeviceError(f"custom_vjp: inputs[{i}] is on {t.device}, the value on {self.device}")
        if Tensor.no_grad: return self
        return self._wrap(UOp(Ops.VJP, self.dtype, (self.uop, *(t.uop for t in inputs)), pull))

    # ---- assignment and in-place ops ----------------------------------------------------------------------------

    def assign(self, value: Tensor | Any) -> Tensor:
        """Give self the values of `value` (self's shape, or a number for every element; cast to self's dtype),
        keeping self's identity.

        This is how parameters and optimizer state are updated: the new value is lazy until realized, and tensors
        built from self before the assign keep reading the old values. A value known without running anything (a
        number, list or numpy array, or a constant tensor) is copied into a new buffer at once, with no kernel:
        kernels read it as data, so a learning rate assigned every step does not make each kernel reading it a new
        program, as a constant compiled into them would.

        >>> lr = Tensor(0.5)
        >>> lr.assign(0.25).item()
        0.25
        """
        if RECORDERS.stack: RECORDERS[-1].assign(self)  # a jitted call gives self a new value (engine/jit.py)
        else:
            for hook in ASSIGN_HOOKS: hook(self)
        if not isinstance(value, Tensor) and np.ndim(value) == 0:
            self.uop = _numpy_to_uop(np.broadcast_to(np.asarray(value), self.shape), self.dtype, self.device)
            return self
        if not isinstance(value, Tensor): value = Tensor(value, device=self.device, dtype=self.dtype)
        if value.shape != self.shape:
            raise ShapeError(f"assign: value of shape {value.shape} does not match the tensor's {self.shape}")
        if value.device != self.device:
            raise DeviceError(f"assign: value is on {value.device}, the tensor on {self.device}")
        constant = _host_constant(value.uop)
        if constant is not None:
            self.uop = _numpy_to_uop(np.broadcast_to(constant, self.shape), self.dtype, self.device)
        else: self.uop = value.cast(self.dtype).uop
        return self

    def _check_writable(self, op: str) -> None:
        if self.requires_grad and not Tensor.no_grad:
            raise RuntimeError(f"{op}: a leaf tensor that requires grad cannot change in place, as in torch: its "
                               "gradient would be lost; update it inside `with no_grad():` or with assign(), as "
                               "optimizers do, or compute a new tensor (t = t + x)")

    def _in_place(self, op: str, value: Tensor) -> Tensor:
        """self.assign(value), the result of the in-place op `op`, under torch's rules: no leaf that requires grad,
        the result's dtype must cast to self's without changing kind (float to int is refused), same shape."""
        self._check_writable(op)
        if _KIND_RANK[value.dtype.kind] > _KIND_RANK[self.dtype.kind]:
            raise DTypeError(f"{op}: result type {value.dtype.name} can't be cast to the tensor's dtype "
                             f"{self.dtype.name}; in-place ops keep the dtype: cast the operand, or write t = t op x")
        if value.shape != self.shape:
            raise ShapeError(f"{op}: the result's shape {value.shape} does not match the tensor's {self.shape}; an "
                             "in-place op cannot change the shape")
        return self.assign(value)

    def add_(self, other: Any, alpha: float = 1) -> Tensor:
        """self += alpha * other, in place (torch's add_)."""
        return self._in_place("add_", self + (other if alpha == 1 else other * alpha))

    def sub_(self, other: Any, alpha: float = 1) -> Tensor:
        """self -= alpha * other, in place (torch's sub_)."""
        return self._in_place("sub_", self - (other if alpha == 1 else other * alpha))

    def mul_(self, other: Any) -> Tensor: return self._in_place("mul_", self * other)

    def div_(self, other: Any, rounding_mode: str | None = None) -> Tensor:
        return self._in_place("div_", self.div(other, rounding_mode=rounding_mode))

    def clamp_(self, min_: Any = None, max_: Any = None) -> Tensor:
        return self._in_place("clamp_", self.clamp(min_, max_))

    clip_ = clamp_

    def zero_(self) -> Tensor:
        """Every element 0, in place: a new buffer copied in, no kernel."""
        self._check_writable("zero_")
        return self.assign(0)

    def fill_(self, value: Any) -> Tensor:
        """Every element `value` (a number or a one-element tensor), in place, cast to self's dtype."""
        self._check_writable("fill_")
        if not isinstance(value, Tensor): return self.assign(value)
        if value.numel() != 1:
            raise ShapeError(f"fill_: the value has {value.numel()} elements {value.shape}; give a number or a "
                             "one-element tensor")
        return self.assign(value.reshape((1,) * self.ndim).expand(self.shape))

    def copy_(self, src: Tensor | Any) -> Tensor:
        """The values of `src` (broadcast to self's shape, cast to self's dtype, moved to self's device), in place."""
        self._check_writable("copy_")
        if not isinstance(src, Tensor): src = Tensor(src, device=self.device)
        if src.device != self.device: src = src.to(self.device)
        return self.assign(src if src.shape == self.shape else src._broadcast_to(self.shape))

    def __iadd__(self, x: Any) -> Tensor: return self._in_place("+=", self + x)
    def __isub__(self, x: Any) -> Tensor: return self._in_place("-=", self - x)
    def __imul__(self, x: Any) -> Tensor: return self._in_place("*=", self * x)
    def __itruediv__(self, x: Any) -> Tensor: return self._in_place("/=", self / x)
    def __ifloordiv__(self, x: Any) -> Tensor: return self._in_place("//=", self // x)
    def __imod__(self, x: Any) -> Tensor: return self._in_place("%=", self % x)
    def __ipow__(self, x: Any) -> Tensor: return self._in_place("**=", self ** x)
    def __imatmul__(self, x: Tensor) -> Tensor: return self._in_place("@=", self @ x)
    def __iand__(self, x: Any) -> Tensor: return self._in_place("&=", self & x)
    def __ior__(self, x: Any) -> Tensor: return self._in_place("|=", self | x)
    def __ixor__(self, x: Any) -> Tensor: return self._in_place("^=", self ^ x)
    def __ilshift__(self, x: Any) -> Tensor: return self._in_place("<<=", self << x)
    def __irshift__(self, x: Any) -> Tensor: return self._in_place(">>=", self >> x)

    def _wrap(self, uop: UOp) -> Tensor:
        if Tensor.no_grad and uop.op is not Ops.DETACH: uop = UOp(Ops.DETACH, uop.dtype, (uop,))
        return Tensor._from_uop(uop, self.device)

    # ---- properties ----------------------------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]: return self.uop.shape

    @property
    def dtype(self) -> DType: return self.uop.dtype

    @property
    def ndim(self) -> int: return len(self.shape)

    def numel(self) -> int: return prod(self.shape)

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
        return self.shape if dim is None else self.shape[self._axis(dim, "size")]

    def element_size(self) -> int: return self.dtype.itemsize

    def nbytes(self) -> int:
        """The bytes the elements take: numel() * element_size() (a method, as tinygrad's)."""
        return self.numel() * self.element_size()

    def is_floating_point(self) -> bool:
        """Whether the dtype is a float type (float16, bfloat16, float32, float64)."""
        return self.dtype.is_float

    def __len__(self) -> int:
        if not self.shape: raise TypeError("len() of a 0-d tensor")
        if type(self.shape[0]) is UOp:
            raise TypeError(f"len() of a tensor whose first axis is symbolic ({self.shape[0]!r}): it has no int; use "
                            "t.shape[0]")
        return self.shape[0]

    def __hash__(self) -> int: return id(self)

    def __delitem__(self, key: Any) -> None:
        raise TypeError("del tensor[...]: a Tensor does not support item deletion (as tinygrad, torch and numpy); "
                        "select what to keep instead (t[mask], t.index_select, or cat of the slices)")

    # ---- Python and numpy protocols ------------------------------------------------------------------------------

    def __repr__(self) -> str:
        """The values (numpy's layout, summarized past 1000 elements as torch does), shape, dtype and device.

        Realizes the values, as torch's repr does; a tensor computed from a NumericalFunction's traced inputs shows
        no values: they are not known until the function is called.

        >>> Tensor([[1.0, 2.0], [3.0, 4.0]])
        Tensor([[1., 2.],
                [3., 4.]], shape=(2, 2), dtype=float32, device=CPU)
        """
        grad = ", requires_grad=True" if self.requires_grad else ""
        if self._traced():
            return f"Tensor(<traced>, shape={self.shape}, dtype={self.dtype.name}, device={self.device}{grad})"
        values = np.array2string(self.numpy(), separator=", ", prefix="Tensor(", threshold=1000, edgeitems=3)
        return f"Tensor({values}, shape={self.shape}, dtype={self.dtype.name}, device={self.device}{grad})"

    def __format__(self, spec: str) -> str:
        """f"{t:.3f}" formats the value of a one-element tensor; an empty spec is str(t)."""
        if not spec: return str(self)
        return format(self._scalar(f"format {spec!r}"), spec)

    def _scalar(self, op: str) -> Scalar:
        if self.numel() != 1:
            raise ShapeError(f"{op}: only one-element tensors convert to a Python scalar: got {self.numel()} elements "
                             f"{self.shape}; use .tolist(), or reduce first (.sum(), .any())")
        return self.item()

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise ShapeError(f"bool: the truth value of a tensor with {self.numel()} elements {self.shape} is "
                             "ambiguous; use .any() or .all()")
        return bool(self.item())

    def __float__(self) -> float: return float(self._scalar("float"))
    def __int__(self) -> int: return int(self._scalar("int"))

    def __index__(self) -> int:
        """A one-element integer tensor as a Python int, so it can index a list or give a size (as torch)."""
        if not self.dtype.is_int or self.numel() != 1:
            raise TypeError(f"index: only one-element integer tensors convert to an index: got {self.dtype.name} "
                            f"of shape {self.shape}")
        return int(self.item())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """np.asarray(t): the values, copied from the device (bfloat16 as float32)."""
        if copy is False:
            raise ValueError("__array__: a Tensor's values live in a device buffer and cannot be read without a copy: "
                             "copy=False is impossible; use copy=None or True")
        values = self.numpy()
        return values if dtype is None else values.astype(dtype, copy=False)

    def __array_function__(self, func: Callable[..., Any], types: tuple[type, ...], args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> Any:
        """numpy functions (np.sum(t), np.concatenate([t, u]), np.allclose(t, x)) run in numpy on the values and
        return numpy results; ufuncs (np.exp(t)) raise a TypeError instead (see __array_ufunc__)."""
        return func(*_host_values(args), **_host_values(kwargs))

    # ---- realization ---------------------------------------------------------------------------------------------

    def schedule(self, *others: Tensor) -> list:
        """The kernels realizing self and `others` would run, in order, without running them."""
        return create_schedule([t.uop for t in (self, *others)], self.device)[0]

    def realize(self, *others: Tensor) -> Tensor:
        """Compute self (and `others`) into device buffers; afterwards each reads its buffer. A tensor a gradient
        can pass through keeps its graph for backward(), as reading a torch tensor changes nothing; later schedules
        read its buffer all the same (kernelize.computed)."""
        tensors = (self, *others)
        views, walked = realize_graph([t.uop for t in tensors], self.device)
        leaves = Tensor._leaf_uops() if Tensor._needs_grad and not Tensor.no_grad else None
        for t, view in zip(tensors, views, strict=True):
            if leaves is None or id(t) in Tensor._needs_grad or \
                    leaves.isdisjoint(walked if walked is not None else t.uop.toposort()):
                t.uop = view
        return self

    def _stored(self) -> UOp:
        """Realize self; the view of the buffer holding it (self.uop itself, unless self keeps its graph)."""
        self.realize()
        return computed.get(self.uop, self.uop)

    def _carries_gradient(self) -> bool:
        """Whether backward() could pass a gradient through self: it is computed from a tensor that requires grad
        (a leaf that requires grad is where gradients end: realizing an update to it stores the new value)."""
        if Tensor.no_grad or not Tensor._needs_grad or id(self) in Tensor._needs_grad: return False
        return not Tensor._leaf_uops().isdisjoint(self.uop.toposort())

    @staticmethod
    def _leaf_uops() -> set[UOp]:
        """The nodes of the tensors that require grad (from the weak dictionary's references: a third of the time
        of its values())."""
        return {t.uop for ref in list(Tensor._needs_grad.data.values()) if (t := ref()) is not None}

    def contiguous(self) -> Tensor:
        """self stored in row-major order when realized: self itself when it reads a whole buffer in order already
        (as torch returns self when contiguous; no kernel), else a tensor with a buffer of its own. clone() always
        copies."""
        if is_buffer_view(self.uop) and not self._traced(): return self
        return self._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def clone(self, device: str | None = None) -> Tensor:
        """A copy with a buffer of its own when realized, on `device` if given. On the same device gradients flow
        through it, as torch's clone; unlike tinygrad's, it does not copy `.grad`."""
        if device is not None and Device.canonicalize(device) != self.device: return self.to(device)
        return self._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def _buffer(self) -> Buffer:
        """The buffer holding self in row-major order (realizing a contiguous copy if needed)."""
        u = self.uop if is_buffer_view(self.uop) else \
            (self if self.uop.op is Ops.CONTIGUOUS else self.contiguous())._stored()
        while u.op is Ops.RESHAPE: u = u.src[0]
        return buffer_of(u)

    def values_known(self) -> bool:
        """The values are in a buffer already (reading them runs no kernel) and are not a traced input's."""
        return is_buffer_view(self.uop) and not self._traced()

    def _traced(self) -> bool:
        return bool(Tensor.traced_inputs) and any(u in Tensor.traced_inputs for u in self.uop.toposort())

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values (bfloat16 comes back as float32)."""
        if self._traced():
            raise EmberError("reading the values of a tensor computed from a NumericalFunction's inputs while it is "
                             "traced: they are not known until it is called. Data-dependent shapes (boolean masks, "
                             "nonzero, masked_select, item) cannot be traced; use where() or index tensors instead")
        if RECORDERS.stack: RECORDERS[-1].read()  # a value read in a jitted call (engine/jit.py)
        shape = concrete(self.shape)  # (a symbolic size as its bound value)
        if prod(shape) == 0: return np.zeros(shape, dtype=to_numpy(self.dtype))
        flat = self._buffer().numpy(prod(shape))  # (a symbolic shape reads the start of a larger buffer)
        if self.dtype is dtypes.bfloat16:
            flat = (flat.astype(np.uint32) << 16).view(np.float32)
        return flat.reshape(shape)

    def data(self) -> memoryview:
        """The values as a read-only memoryview in self's shape, typed by the dtype's struct format ('f' for
        float32, 'e' for float16, '?' for bool), as tinygrad's data(). A copy: writing self later leaves it as is.

        >>> Tensor([[1, 2], [3, 4]]).data().tolist()
        [[1, 2], [3, 4]]
        """
        if self.dtype is dtypes.bfloat16:
            raise DTypeError("data: bfloat16 has no struct format for a memoryview; use numpy() (float32 values) or "
                             "cast first")
        values = self.numpy().copy(order="C")  # numpy() may be a view of a buffer that later writes change
        values.flags.writeable = False
        return memoryview(values)

    def item(self) -> Scalar:
        """The one value of a one-element tensor as a Python scalar."""
        if self.numel() != 1: raise ShapeError(f"item: the tensor has {self.numel()} elements {self.shape}; need 1")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        """The values as nested Python lists (a scalar for a 0-d tensor)."""
        return self.numpy().tolist()

    def to(self, device: str) -> Tensor:
        """self on `device` (a copy when it is another device)."""
        target = Device.canonicalize(device)
        return self if target == self.device else Tensor(self.numpy(), device=target)

    def to_(self, device: str) -> Tensor:
        """Move self to `device` in place (its `.grad` too): everyone holding this Tensor sees it there."""
        moved = self.to(device)
        if moved is self: return self
        if self.grad is not None: self.grad = self.grad.to(device)
        self.uop, self.device = moved.uop, moved.device
        return self

    def replace(self, x: Tensor) -> Tensor:
        """Give self x's graph (no copy and no kernel: self becomes another name for x's value), as tinygrad's
        replace. Unlike assign(), which casts and keeps self's dtype, both must agree in shape and dtype.

        >>> t = Tensor([1, 2])
        >>> t.replace(Tensor([3, 4])).tolist()
        [3, 4]
        """
        if not isinstance(x, Tensor): raise TypeError(f"replace: expected a Tensor, got {type(x).__name__}")
        if x.shape != self.shape:
            raise ShapeError(f"replace: the new tensor's shape {x.shape} differs from the tensor's {self.shape}; "
                             "use reshape first, or assign a new name")
        if x.dtype != self.dtype:
            raise DTypeError(f"replace: the new tensor's dtype {x.dtype.name} differs from the tensor's "
                             f"{self.dtype.name}; cast first, or use assign() (which casts)")
        self._check_writable("replace")
        self.uop, self.device = x.uop, x.device
        return self

    # ---- helpers the mixins build on -----------------------------------------------------------------------------

    def _axis(self, axis: int, op: str) -> int:
        """`axis` as a non-negative index, or an AxisError (a ShapeError and an IndexError) naming the op. An axis
        that is not an int (a float, None, a bool) is a TypeError, as torch's; every op's axes pass through here."""
        if not is_int_axis(axis): raise TypeError(f"{op}: axis must be an int, got {axis!r} ({type(axis).__name__})")
        axis, n = int(axis), max(self.ndim, 1) if op != "unsqueeze" else self.ndim + 1
        if not -n <= axis < n: raise AxisError(f"{op}: axis {axis} is out of range for a {self.ndim}-d tensor "
                                                f"{self.shape}; valid axes are {-n}..{n - 1}")
        return axis % n


@contextlib.contextmanager
def tracing(placeholders: Sequence[Tensor]) -> Iterator[None]:
    """While a function runs on placeholders (a NumericalFunction's inputs, a scan body's carries), reading a value
    computed from them is an error, not a silent garbage read (Tensor.numpy checks Tensor.traced_inputs)."""
    mine = {p.uop for p in placeholders} - Tensor.traced_inputs
    Tensor.traced_inputs |= mine
    try: yield
    finally: Tensor.traced_inputs -= mine


__all__ = ["Tensor", "no_grad", "tracing"]
