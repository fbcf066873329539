"""Tensor constructors: zeros, ones, full, empty, arange, eye, linspace, the *_like forms, and tensors of outside
bytes (from_blob: host memory; from_url: a file or download, cached).

Constants are a CONST node broadcast to the shape, and `arange` an ARANGE node (its value is its index): no memory
until realized, and both fuse into their consumers. `empty` is a bare buffer: no kernel ever writes it. Random
tensors are in random.py; `accepts_requires_grad` gives them torch's `requires_grad=` keyword from tensor.py.
"""

from __future__ import annotations

import ctypes
import functools
import gzip
import hashlib
import inspect
import math
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.device import Buffer, Device, buffer_uop, cache_write
from ember.dtype import DType, dtypes, to_dtype, to_numpy
from ember.errors import DTypeError, ShapeError
from ember.helpers import CACHELEVEL, cache_dir
from ember.mixin.movement import size_args
from ember.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from ember.tensor import Tensor


def shape_of(shape: tuple[Any, ...], op: str) -> tuple[int, ...]:
    """The shape of a new tensor given as `f(2, 3)` or `f((2, 3))`: ints as movement.size_args reads them (numpy
    ints too; a float, None or a bool raises SizeTypeError), none negative."""
    out = size_args(shape, op, variables=False)
    if any(s < 0 for s in out): raise ShapeError(f"{op}: shape sizes must be non-negative ints, got {out}")
    return out


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def int_dtype_for(op: str, *values: int) -> DType:
    """The dtype inferred for Python ints: ember's default int (int32) when all fit, else int64 (torch infers
    int64 always; ember keeps int32 where it is exact, as the smaller type is faster and is what tests expect).

    Ints past int64 raise: no integer dtype holds them, and a silent wrap would give wrong values."""
    low, high = min(values, default=0), max(values, default=0)
    if INT32_MIN <= low and high <= INT32_MAX: return dtypes.default_int
    if INT64_MIN <= low and high <= INT64_MAX: return dtypes.int64
    bad = low if low < INT64_MIN else high
    raise OverflowError(f"{op}: integer {bad} does not fit any integer dtype; valid ints are {INT64_MIN}..{INT64_MAX} "
                        "(int64), or pass a float")


def check_fits(op: str, dtype: DType, *values: Any) -> None:
    """Raise OverflowError when a Python int does not fit the integer `dtype` it is written as, as `Tensor([300],
    dtype=int8)` does: a constant stored in too narrow a type would wrap to another value without a word."""
    if not dtype.is_int: return
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and not dtype.min <= v <= dtype.max:
            raise OverflowError(f"{op}: integer {v} does not fit {dtype.name}; valid values are {dtype.min}.."
                                f"{dtype.max}")


def accepts_requires_grad(method: Any) -> Any:
    """`method` (a function or classmethod that makes a tensor) also taking torch's `requires_grad=` keyword.

    random.py's creators take the keyword this way rather than each handling it; the signature shown by help()
    lists it."""
    is_class = isinstance(method, classmethod)
    fn: Callable[..., Tensor] = method.__func__ if is_class else method

    @functools.wraps(fn)
    def make(*args: Any, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        return with_requires_grad(fn(*args, **kwargs), requires_grad)

    sig = inspect.signature(fn)
    if all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        keyword = inspect.Parameter("requires_grad", inspect.Parameter.KEYWORD_ONLY, default=None)
        make.__signature__ = sig.replace(parameters=[*sig.parameters.values(), keyword])  # type: ignore[attr-defined]
    return classmethod(make) if is_class else make


def tensor_of_bytes(raw: bytes, shape: tuple[int, ...], dtype: DType, device: str | None) -> Tensor:
    """A tensor whose buffer holds `raw` as is, read as `dtype` in `shape` (bfloat16 bits stay bits: no numpy
    conversion of values)."""
    from ember.tensor import Tensor
    dev = Device.canonicalize(device or Device.DEFAULT)
    buf = Buffer(dev, math.prod(shape), dtype).copyin(np.frombuffer(raw, dtype=to_numpy(dtype)))
    return Tensor._from_uop(UOp(Ops.RESHAPE, dtype, (buffer_uop(buf),), shape), dev)


def fetch(url: str, gunzip: bool) -> bytes:
    """The bytes at `url` (decompressed when `gunzip`), from `<cache_dir>/downloads` when fetched before. Entries are
    named by a hash of the URL and the gunzip flag, so a changed file behind the same URL is not seen again until
    the entry is removed (or with CACHELEVEL=0, which neither reads nor writes the cache)."""
    name = hashlib.sha256(url.encode()).hexdigest() + (".gunzip" if gunzip else "")
    path = os.path.join(cache_dir(), "downloads", name)
    if CACHELEVEL and os.path.exists(path):
        with open(path, "rb") as f: return f.read()
    try:
        with urllib.request.urlopen(url, timeout=60) as response: data = response.read()
    except (urllib.error.URLError, ValueError, OSError) as e:
        raise OSError(f"from_url: cannot read {url!r}: {e}; check the URL (http://, https:// or file://)") from e
    if gunzip:
        try: data = gzip.decompress(data)
        except (gzip.BadGzipFile, EOFError) as e:
            raise ValueError(f"from_url: {url!r} is not a complete gzip file ({e}); pass gunzip=False") from e
    if CACHELEVEL: cache_write(path, data)
    return data


def with_requires_grad(t: Tensor, requires_grad: bool | None) -> Tensor:
    """t, made a leaf that requires a gradient when asked. False and None leave it undecided, as Tensor() does."""
    return t.requires_grad_() if requires_grad else t


class CreationMixin:
    """Class methods that make new tensors."""

    __slots__ = ()

    @classmethod
    def full(cls, shape: tuple[int, ...] | int, fill_value: Any, dtype: DType | str | None = None,
             device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        """A tensor of `shape` with every element `fill_value`.

        >>> from ember import Tensor
        >>> Tensor.full((2,), 7).tolist()
        [7, 7]
        """
        from ember.tensor import Tensor
        dims = shape_of(shape if isinstance(shape, tuple) else (shape,), "full")
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
        if dtype is None and dt.is_int: dt = int_dtype_for("full", fill_value)
        check_fits("full", dt, fill_value)
        scalar = Tensor(UOp.const(dt, fill_value), device=device)
        return with_requires_grad(scalar.reshape((1,) * len(dims)).expand(dims) if dims else scalar, requires_grad)

    @classmethod
    def zeros(cls, *shape: Any, dtype: DType | str | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        return cls.full(shape_of(shape, "zeros"), 0, dtype or dtypes.default_float, device, requires_grad)

    @classmethod
    def ones(cls, *shape: Any, dtype: DType | str | None = None, device: str | None = None,
             requires_grad: bool | None = None) -> Tensor:
        return cls.full(shape_of(shape, "ones"), 1, dtype or dtypes.default_float, device, requires_grad)

    @classmethod
    def empty(cls, *shape: Any, dtype: DType | str | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        """A tensor whose values are unspecified until written: a buffer of its own, which no kernel fills (as in
        torch and tinygrad, creating and realizing it runs nothing)."""
        from ember.tensor import Tensor
        dims, dt = shape_of(shape, "empty"), to_dtype(dtype or dtypes.default_float)
        dev = Device.canonicalize(device or Device.DEFAULT)
        buf = buffer_uop(Buffer(dev, math.prod(dims), dt))
        return with_requires_grad(Tensor._from_uop(UOp(Ops.RESHAPE, dt, (buf,), dims), dev), requires_grad)

    @classmethod
    def arange(cls, start: float, stop: float | None = None, step: float = 1, dtype: DType | str | None = None,
               device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        """Values from start (inclusive) to stop (exclusive) by step; int32 unless an argument is a float, or int64
        where a value does not fit int32 (torch: int64 always). A first or last value outside an integer `dtype`
        raises OverflowError (torch wraps it around).

        >>> from ember import Tensor
        >>> Tensor.arange(2**31, 2**31 + 2).tolist()
        [2147483648, 2147483649]
        """
        if stop is None: start, stop = 0, start
        if step == 0: raise ValueError("arange: step must be nonzero")
        if isinstance(start, UOp) or isinstance(stop, UOp): return cls._symbolic_arange(start, stop, step, dtype,
                                                                                        device, requires_grad)
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py([start, stop, step])
        n = max(0, math.ceil((stop - start) / step))
        if dtype is None and dt.is_int: dt = int_dtype_for("arange", start, start + max(n - 1, 0) * step)
        if n: check_fits("arange", dt, start, start + (n - 1) * step)
        from ember.tensor import Tensor
        index = Tensor._from_uop(UOp(Ops.ARANGE, dtypes.int64 if n > 2**31 - 1 else dtypes.int32, arg=n),
                                 Device.canonicalize(device or Device.DEFAULT))
        if start == 0 and step == 1: return with_requires_grad(index.cast(dt), requires_grad)
        wide = dtypes.float64 if dt.is_float else dtypes.int64  # start + i*step exactly, then one rounding
        return with_requires_grad((index.cast(wide) * step + start).cast(dt), requires_grad)

    @classmethod
    def _symbolic_arange(cls, start: Any, stop: Any, step: float, dtype: DType | str | None, device: str | None,
                         requires_grad: bool | None) -> Tensor:
        """arange(n) and arange(n, 0, -1) of a symbolic size n (a bound Variable: ember/variables.py)."""
        from ember.tensor import Tensor
        n = stop if isinstance(stop, UOp) else start
        if n.op is not Ops.BIND or (start, stop, step) not in ((0, n, 1), (n, 0, -1)):
            raise ShapeError(f"arange: of a symbolic size only arange(n) and arange(n, 0, -1) are supported, got "
                             f"arange({start!r}, {stop!r}, {step})")
        dt = to_dtype(dtype) if dtype is not None else dtypes.int32
        index = Tensor._from_uop(UOp(Ops.ARANGE, dtypes.int32, arg=n), Device.canonicalize(device or Device.DEFAULT))
        values = index if step == 1 else index._wrap(n) - index  # n, n-1, ..., 1
        return with_requires_grad(values.cast(dt), requires_grad)

    @classmethod
    def eye(cls, n: int, m: int | None = None, dtype: DType | str | None = None, device: str | None = None,
            requires_grad: bool | None = None) -> Tensor:
        """The identity matrix (n x m)."""
        n, m = shape_of((n, n if m is None else m), "eye")
        rows = cls.arange(n, device=device).reshape(n, 1)
        cols = cls.arange(m, device=device).reshape(1, -1)
        return with_requires_grad(rows.eq(cols).cast(dtype or dtypes.default_float), requires_grad)

    @classmethod
    def linspace(cls, start: float, end: float, steps: int, dtype: DType | str | None = None,
                 device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        """`steps` evenly spaced values from start to end inclusive, as torch: the first half counts up from start,
        the second half down from end, so both ends are exact."""
        (steps,) = size_args((steps,), "linspace", variables=False)
        if steps < 0: raise ShapeError(f"linspace: steps must be non-negative, got {steps}")
        dt = to_dtype(dtype or dtypes.default_float)
        if dt is dtypes.bool:
            raise DTypeError("linspace: dtype bool is not supported (torch: not implemented for 'Bool'); "
                             "use an integer or float dtype")
        if steps == 1: return cls.full((1,), start, dt, device, requires_grad)
        step = (end - start) / max(steps - 1, 1)
        i = cls.arange(steps, device=device).cast(dtypes.float64)
        values = (i < steps // 2).where(i * step + start, end - (steps - 1 - i) * step)
        return with_requires_grad(values.cast(dt), requires_grad)

    @classmethod
    def from_blob(cls, ptr: int, shape: tuple[int, ...] | int, dtype: DType | str | None = None,
                  device: str | None = None) -> Tensor:
        """A tensor of the prod(shape) elements of `dtype` (float32 by default) at host address `ptr`, such as
        numpy's `a.ctypes.data`.

        tinygrad's from_blob wraps the memory without copying; ember copies the bytes into a buffer of its own
        when called: ember's buffers belong to its device runtime, which cannot adopt memory it did not allocate.
        So later writes to the memory are not seen, and the caller may free it at once. `ptr` must point to at
        least that many readable bytes: nothing can check it, and a wrong one crashes the process."""
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise TypeError(f"from_blob: ptr must be an int address, got {type(ptr).__name__}; numpy gives "
                            "a.ctypes.data, ctypes gives ctypes.addressof(obj)")
        dims = shape_of(shape if isinstance(shape, tuple) else (shape,), "from_blob")
        dt = to_dtype(dtype or dtypes.default_float)
        nbytes = math.prod(dims) * dt.itemsize
        if nbytes and ptr <= 0: raise ValueError(f"from_blob: ptr must be a positive address, got {ptr}")
        return tensor_of_bytes(ctypes.string_at(ptr, nbytes) if nbytes else b"", dims, dt, device)

    @classmethod
    def from_url(cls, url: str, gunzip: bool = False, dtype: DType | str | None = None,
                 device: str | None = None) -> Tensor:
        """The bytes at `url` as a 1-D uint8 tensor, or read as `dtype`; with `gunzip`, a gzip file decompressed.
        Any URL urllib opens (http, https, file); the bytes are kept in the cache directory, so a URL is fetched
        once. tinygrad's tensor reads the cached file from disk lazily; ember reads it into a buffer at once."""
        data = fetch(url, gunzip)
        dt = to_dtype(dtype or dtypes.uint8)
        if len(data) % dt.itemsize:
            raise ShapeError(f"from_url: {len(data)} bytes are not a whole number of {dt.name} elements "
                             f"({dt.itemsize} bytes each); read it as uint8 and slice")
        return tensor_of_bytes(data, (len(data) // dt.itemsize,), dt, device)

    def tril(self: Tensor, diagonal: int = 0) -> Tensor:
        """The lower triangle of the last two axes (j <= i + diagonal), zeros above."""
        return self._triangle(diagonal, lower=True)

    def triu(self: Tensor, diagonal: int = 0) -> Tensor:
        """The upper triangle of the last two axes (j >= i + diagonal), zeros below."""
        return self._triangle(diagonal, lower=False)

    def _triangle(self: Tensor, diagonal: int, lower: bool) -> Tensor:
        if self.ndim < 2: raise ShapeError(f"{'tril' if lower else 'triu'}: needs at least 2 axes, got {self.shape}")
        n, m = self.shape[-2:]
        rows = type(self).arange(n, device=self.device).reshape(n, 1)
        cols = type(self).arange(m, device=self.device).reshape(1, m)
        keep = (cols <= rows + diagonal) if lower else (cols >= rows + diagonal)
        return keep.where(self, self.zeros_like())  # a literal 0 would promote bool to int

    def one_hot(self: Tensor, num_classes: int = -1) -> Tensor:
        """An int64 tensor with a new last axis of `num_classes`, 1 at each value's index (torch's one_hot)."""
        if not self.dtype.is_int: raise ShapeError(f"one_hot: needs an integer tensor, got {self.dtype.name}")
        if num_classes < 0: num_classes = int(self.max().item()) + 1 if self.numel() else 0
        classes = type(self).arange(num_classes, device=self.device)
        return self.unsqueeze(-1).eq(classes).cast(dtypes.int64)

    def full_like(self: Tensor, fill_value: Any, dtype: DType | str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        """`fill_value` in self's shape, with self's dtype and device unless `dtype` is given."""
        return type(self).full(self.shape, fill_value, dtype or self.dtype, self.device, requires_grad)

    def zeros_like(self: Tensor, dtype: DType | str | None = None, requires_grad: bool | None = None) -> Tensor:
        return self.full_like(0, dtype, requires_grad)

    def ones_like(self: Tensor, dtype: DType | str | None = None, requires_grad: bool | None = None) -> Tensor:
        return self.full_like(1, dtype, requires_grad)

    def empty_like(self: Tensor, dtype: DType | str | None = None, requires_grad: bool | None = None) -> Tensor:
        """A bare buffer in self's shape (see `empty`), with self's dtype and device unless `dtype` is given."""
        return type(self).empty(self.shape, dtype=dtype or self.dtype, device=self.device,
                                requires_grad=requires_grad)
