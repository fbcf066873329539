"""The lazy Tensor: a user-facing handle on a tensor-level UOp graph. Nothing runs until it is realized.

The op families live in ember/mixin/ (elementwise, movement, reduce, creation); this module holds construction,
realization and conversion back to Python and numpy. Names, arguments and semantics follow PyTorch and tinygrad.

>>> (Tensor([1.0, 2.0, 3.0]) * 2 + 1).tolist()
[3.0, 5.0, 7.0]
"""

from __future__ import annotations

import weakref
from contextlib import ContextDecorator
from typing import Any, ClassVar

import numpy as np

from ember.device import Buffer, Device, buffer_of, buffer_uop
from ember.dtype import DType, dtypes, to_bfloat16_bits, to_dtype, to_numpy
from ember.errors import DeviceError, DTypeError, EmberError, ShapeError
from ember.helpers import prod
from ember.mixin.activation import ActivationMixin
from ember.mixin.creation import CreationMixin
from ember.mixin.elementwise import ElementwiseMixin
from ember.mixin.indexing import IndexingMixin
from ember.mixin.movement import MovementMixin
from ember.mixin.nn import NNMixin
from ember.mixin.random import RandomMixin
from ember.mixin.reduce import ReduceMixin
from ember.mixin.scan import ScanMixin
from ember.uop.ops import Ops, UOp

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
        return UOp.const(dt, data)
    if isinstance(data, (list, tuple)):
        dt = dtype or dtypes.from_py(data)
        try:
            arr = np.array(data, dtype=np.float32 if dt is dtypes.bfloat16 else to_numpy(dt))
        except ValueError as e:
            raise ShapeError(f"Tensor: nested lists must be rectangular: {e}") from None
        return _numpy_to_uop(arr, dt, device)
    if isinstance(data, np.ndarray) or np.isscalar(data):
        arr = np.asarray(data)
        dt = dtype or dtypes.from_numpy(arr.dtype)
        return _numpy_to_uop(arr, dt, device)
    raise DTypeError(f"Tensor: cannot make a tensor from {type(data).__name__}; give a number, list or numpy array")


def _numpy_to_uop(arr: np.ndarray, dtype: DType, device: str) -> UOp:
    host = to_bfloat16_bits(arr) if dtype is dtypes.bfloat16 else arr.astype(to_numpy(dtype), copy=False)
    buf = Buffer(device, arr.size, dtype).copyin(host)
    return UOp(Ops.RESHAPE, dtype, (buffer_uop(buf),), arr.shape)


class Tensor(ElementwiseMixin, ActivationMixin, MovementMixin, IndexingMixin, ReduceMixin, ScanMixin, NNMixin,
             CreationMixin, RandomMixin):
    """A lazy n-dimensional array.

    >>> Tensor([[1, 2], [3, 4]]).sum(axis=1).tolist()
    [3, 7]
    """

    __slots__ = ("uop", "device", "requires_grad", "grad", "__weakref__")
    # the tensors backward() may fill .grad of, by id: a WeakSet would compare tensors with ==, which is elementwise
    _needs_grad: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
    no_grad: ClassVar[bool] = False  # set by `no_grad()`: new tensors are detached from their inputs
    training: ClassVar[bool] = False  # set by `Tensor.train()`: dropout and batchnorm behave as in training
    traced_inputs: ClassVar[set[UOp]] = set()  # placeholders of the NumericalFunctions being traced: no values yet

    @staticmethod
    def train(mode: bool = True) -> _ClassFlag:
        """`with Tensor.train():` runs dropout and batch statistics as in training; `Tensor.train(False)` as in eval."""
        return _ClassFlag("training", mode)

    def __init__(self, data: Any, device: str | None = None, dtype: DType | str | None = None,
                 requires_grad: bool | None = None) -> None:
        self.device = Device.canonicalize(device or Device.DEFAULT)
        self.uop: UOp = _data_to_uop(data, None if dtype is None else to_dtype(dtype), self.device)
        self.grad: Tensor | None = None
        self.requires_grad = None
        if requires_grad: self.requires_grad_()

    @classmethod
    def _from_uop(cls, uop: UOp, device: str) -> Tensor:
        out = cls.__new__(cls)
        out.uop, out.device, out.requires_grad, out.grad = uop, device, None, None
        return out

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Mark self as a leaf whose gradient backward() fills in.

        A leaf is stored in a buffer of its own first: gradients are found by node, and equal constants are one
        node (hash-consing), so `Tensor(2.0)` as a parameter must not be the same node as a constant 2.0."""
        from ember.schedule.kernelize import is_buffer_view
        self.requires_grad = requires_grad
        if requires_grad:
            if not is_buffer_view(self.uop): self.uop = self.contiguous().realize().uop
            Tensor._needs_grad[id(self)] = self
        else: Tensor._needs_grad.pop(id(self), None)
        return self

    # ---- derivatives ---------------------------------------------------------------------------------------------

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """d self / d target for each target, as lazy tensors (self must be a scalar unless `gradient` is given).

        >>> x = Tensor([1.0, 2.0, 3.0])
        >>> (x * x).sum().gradient(x)[0].tolist()
        [2.0, 4.0, 6.0]
        """
        from ember.gradient import compute_gradient
        if gradient is None:
            if self.numel() != 1:
                raise ShapeError(f"gradient: the output has shape {self.shape}; pass `gradient` for a non-scalar")
            gradient = Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
        elif gradient.shape != self.shape:
            raise ShapeError(f"gradient: seed shape {gradient.shape} does not match the output's {self.shape}")
        grads = compute_gradient(self.uop, gradient, {t.uop for t in targets})
        return [grads[t.uop] if t.uop in grads else t.zeros_like() for t in targets]

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Accumulate d self / d t into `t.grad` for every tensor t with requires_grad that self depends on."""
        graph = self.uop.toposort()
        targets = [t for t in list(Tensor._needs_grad.values()) if t.uop in graph]
        if not targets: raise RuntimeError("backward: no tensor with requires_grad=True is used to compute this one")
        for t, g in zip(targets, self.gradient(*targets, gradient=gradient), strict=True):
            t.grad = g if t.grad is None else t.grad + g
        return self

    def detach(self) -> Tensor:
        """The same values, with no gradient flowing back through them."""
        return self._wrap(UOp(Ops.DETACH, self.dtype, (self.uop,)))

    def assign(self, value: Tensor | Any) -> Tensor:
        """Give self the values of `value` (same shape; cast to self's dtype), keeping self's identity.

        This is how parameters and optimizer state are updated: the new value is lazy until realized, and tensors
        built from self before the assign keep reading the old values."""
        from ember.tensor import Tensor
        if not isinstance(value, Tensor): value = Tensor(value, device=self.device, dtype=self.dtype)
        if value.shape != self.shape:
            raise ShapeError(f"assign: value of shape {value.shape} does not match the tensor's {self.shape}")
        if value.device != self.device:
            raise DeviceError(f"assign: value is on {value.device}, the tensor on {self.device}")
        self.uop = value.cast(self.dtype).uop
        return self

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
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<Tensor shape={self.shape} dtype={self.dtype.name} device={self.device}>"

    def __hash__(self) -> int: return id(self)

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise ValueError(f"bool: the truth value of a tensor with {self.numel()} elements is ambiguous")
        return bool(self.item())

    # ---- realization ---------------------------------------------------------------------------------------------

    def schedule(self, *others: Tensor) -> list:
        """The kernels realizing self and `others` would run, in order, without running them."""
        from ember.schedule.kernelize import create_schedule
        return create_schedule([t.uop for t in (self, *others)], self.device)[0]

    def realize(self, *others: Tensor) -> Tensor:
        """Compute self (and `others`) into device buffers; afterwards each reads its buffer."""
        from ember.engine.realize import run_schedule
        from ember.schedule.kernelize import computed, create_schedule
        tensors = (self, *others)
        items, views = create_schedule([t.uop for t in tensors], self.device)
        run_schedule(items)
        computed.update({node: view for node, view in views.items() if node is not view})
        for t, view in [(t, views[t.uop]) for t in tensors]: t.uop = view
        return self

    def contiguous(self) -> Tensor:
        """A tensor stored in its own buffer in row-major order when realized."""
        return self._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def clone(self, device: str | None = None) -> Tensor:
        """A copy with a buffer of its own when realized, on `device` if given. On the same device gradients flow
        through it, as torch's clone; unlike tinygrad's, it does not copy `.grad`."""
        if device is not None and Device.canonicalize(device) != self.device: return self.to(device)
        return self.contiguous()

    def _buffer(self) -> Buffer:
        """The buffer holding self in row-major order (realizing a contiguous copy if needed)."""
        from ember.schedule.kernelize import is_buffer_view
        u = self.uop if is_buffer_view(self.uop) else (self if self.uop.op is Ops.CONTIGUOUS else self.contiguous())\
            .realize().uop
        while u.op is Ops.RESHAPE: u = u.src[0]
        return buffer_of(u)

    def values_known(self) -> bool:
        """The values are in a buffer already (reading them runs no kernel) and are not a traced input's."""
        from ember.schedule.kernelize import is_buffer_view
        return is_buffer_view(self.uop) and not self._traced()

    def _traced(self) -> bool:
        return bool(Tensor.traced_inputs) and any(u in Tensor.traced_inputs for u in self.uop.toposort())

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values (bfloat16 comes back as float32)."""
        if self._traced():
            raise EmberError("reading the values of a tensor computed from a NumericalFunction's inputs while it is "
                             "traced: they are not known until it is called. Data-dependent shapes (boolean masks, "
                             "nonzero, masked_select, item) cannot be traced; use where() or index tensors instead")
        if self.numel() == 0: return np.zeros(self.shape, dtype=to_numpy(self.dtype))
        flat = self._buffer().numpy()
        if self.dtype is dtypes.bfloat16:
            flat = (flat.astype(np.uint32) << 16).view(np.float32)
        return flat.reshape(self.shape)

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

    # ---- helpers the mixins build on -----------------------------------------------------------------------------

    def _axis(self, axis: int, op: str) -> int:
        """`axis` as a non-negative index, or a ShapeError naming the op."""
        n = max(self.ndim, 1) if op != "unsqueeze" else self.ndim + 1
        if not -n <= axis < n: raise ShapeError(f"{op}: axis {axis} is out of range for a {self.ndim}-d tensor "
                                                f"{self.shape}; valid axes are {-n}..{n - 1}")
        return axis % n


__all__ = ["Tensor", "no_grad"]
