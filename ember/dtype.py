"""Data types: scalars, vectors and pointers, promotion rules, numpy interop.

A `DType` is a frozen value. Scalars are module-level singletons in `dtypes`; a vector is `scalar.vec(n)` and a
pointer is `scalar.ptr(size, addrspace)`. Promotion follows PyTorch: bool < integers < floats by category, the
wider type inside a category, and Python scalars are weak (they never widen a tensor's dtype within a category).
"""

from __future__ import annotations

import enum
import math
import struct
import zlib
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from ember.errors import DTypeError


class AddrSpace(enum.Enum):
    """Where a pointer points: device memory, workgroup-shared memory, or registers."""

    GLOBAL = "global"
    LOCAL = "local"
    REG = "reg"


@dataclass(frozen=True, slots=True)
class DType:
    """A scalar or vector type. `count` > 1 is a vector of `count` lanes of `scalar`."""

    name: str
    itemsize: int  # bytes of one lane
    kind: str  # "b" bool, "i" signed, "u" unsigned, "f" float, "v" void
    fmt: str | None  # struct format character, None where struct has none
    count: int = 1
    # every UOp's key holds a dtype: its hash is made once (hashing all fields per lookup cost eager dispatch 10%),
    # from the name's bytes, not hash(str), which differs between processes: a pickled dtype keeps its field
    hashed: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None: object.__setattr__(self, "hashed", zlib.crc32(self.name.encode()) ^ self.count)

    def __repr__(self) -> str:
        return f"dtypes.{self.name}" if self.count == 1 else f"dtypes.{self.name}.vec({self.count})"

    def __hash__(self) -> int: return self.hashed

    @property
    def scalar(self) -> DType:
        return DTYPES_BY_NAME[self.name]

    @property
    def nbytes(self) -> int:
        return self.itemsize * self.count

    def vec(self, count: int) -> DType:
        """The vector of `count` lanes of this scalar type."""
        assert self.count == 1, f"vec of a vector {self}"
        return self if count == 1 else DType(self.name, self.itemsize, self.kind, self.fmt, count)

    def ptr(self, size: int = -1, addrspace: AddrSpace = AddrSpace.GLOBAL) -> PtrDType:
        """A pointer to `size` elements of this type (-1: unknown size)."""
        return PtrDType(self.name, self.itemsize, self.kind, self.fmt, self.count, self, size, addrspace)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "u"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def min(self) -> int | float | bool:
        """Smallest value of the type (-inf for floats)."""
        if self.is_bool: return False
        if self.is_unsigned: return 0
        if self.is_int: return -(1 << (8 * self.itemsize - 1))
        return -math.inf

    @property
    def max(self) -> int | float | bool:
        """Largest value of the type (inf for floats)."""
        if self.is_bool: return True
        if self.is_unsigned: return (1 << (8 * self.itemsize)) - 1
        if self.is_int: return (1 << (8 * self.itemsize - 1)) - 1
        return math.inf


@dataclass(frozen=True, slots=True, repr=False)
class PtrDType(DType):
    """A pointer to `base` elements; `size` is the element count (-1 when unknown)."""

    base: DType = None  # type: ignore[assignment]  # always given by DType.ptr
    size: int = -1
    addrspace: AddrSpace = AddrSpace.GLOBAL

    def __post_init__(self) -> None:
        object.__setattr__(self, "hashed", zlib.crc32(self.name.encode()) ^ self.count ^ (self.size << 8))

    def __hash__(self) -> int: return self.hashed

    def __repr__(self) -> str:
        space = "" if self.addrspace is AddrSpace.GLOBAL else f", {self.addrspace}"
        return f"{self.base!r}.ptr({self.size}{space})"


def _scalar(name: str, itemsize: int, kind: str, fmt: str | None) -> DType:
    return DType(name, itemsize, kind, fmt)


class dtypes:  # noqa: N801  (the namespace reads as in tinygrad and torch: dtypes.float32)
    """All scalar dtypes, with the defaults and helpers users reach for."""

    void = _scalar("void", 0, "v", None)
    bool = _scalar("bool", 1, "b", "?")
    int8 = _scalar("int8", 1, "i", "b")
    int16 = _scalar("int16", 2, "i", "h")
    int32 = _scalar("int32", 4, "i", "i")
    int64 = _scalar("int64", 8, "i", "q")
    uint8 = _scalar("uint8", 1, "u", "B")
    uint16 = _scalar("uint16", 2, "u", "H")
    uint32 = _scalar("uint32", 4, "u", "I")
    uint64 = _scalar("uint64", 8, "u", "Q")
    float16 = _scalar("float16", 2, "f", "e")
    bfloat16 = _scalar("bfloat16", 2, "f", None)
    float32 = _scalar("float32", 4, "f", "f")
    float64 = _scalar("float64", 8, "f", "d")
    # aliases, as torch spells them
    half, float, double = float16, float32, float64
    char, short, int, long = int8, int16, int32, int64
    uchar = uint8
    default_float: DType = float32
    default_int: DType = int32

    @staticmethod
    def from_py(x: object) -> DType:
        """The dtype a Python scalar or nested list gets: bool, default_int or default_float."""
        if isinstance(x, (list, tuple)):
            return max((dtypes.from_py(v) for v in x), key=lambda d: _CATEGORY[d.kind], default=dtypes.default_float)
        x = as_python_number(x)
        if isinstance(x, bool): return dtypes.bool
        if isinstance(x, int): return dtypes.default_int
        if isinstance(x, float): return dtypes.default_float
        raise DTypeError(f"dtype: cannot infer a dtype for {type(x).__name__} value {x!r}; use int, float or bool")

    @staticmethod
    def from_numpy(dt: np.dtype) -> DType:
        """The ember dtype of a numpy dtype."""
        name = np.dtype(dt).name
        if name not in DTYPES_BY_NAME or name in ("void",):
            raise DTypeError(f"dtype: numpy dtype {name} has no ember equivalent; supported: {', '.join(SCALARS)}")
        return DTYPES_BY_NAME[name]


DTYPES_BY_NAME: dict[str, DType] = {
    d.name: d for d in vars(dtypes).values() if isinstance(d, DType)
}
SCALARS: tuple[str, ...] = tuple(n for n in DTYPES_BY_NAME if n != "void")
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "v": -1}


def as_python_number(x: object) -> object:
    """A numpy scalar (np.float32(2), np.int64(3), np.bool_(True)) as the Python number it holds, which then acts
    as a Python scalar does in an op with a tensor (weak: it raises the category, never the width); else x."""
    return x.item() if isinstance(x, np.generic) and x.dtype.kind in "biuf" else x


def to_numpy(dtype: DType) -> np.dtype:
    """The numpy dtype that stores `dtype` (bfloat16 has none in numpy: its raw bits are uint16)."""
    if dtype.scalar is dtypes.bfloat16: return np.dtype(np.uint16)
    return np.dtype(dtype.scalar.name)


def to_dtype(x: DType | str | type | np.dtype) -> DType:
    """Accept a DType, its name, or a numpy dtype/type and return the DType."""
    if isinstance(x, DType): return x
    if isinstance(x, str):
        if x in DTYPES_BY_NAME: return DTYPES_BY_NAME[x]
        alias = getattr(dtypes, x, None)
        if isinstance(alias, DType): return alias
        raise DTypeError(f"dtype: unknown dtype {x!r}; known: {', '.join(SCALARS)}")
    if x is float: return dtypes.default_float
    if x is int: return dtypes.default_int
    if x is bool: return dtypes.bool
    try:
        return dtypes.from_numpy(np.dtype(x))
    except TypeError as e:
        raise DTypeError(f"dtype: cannot interpret {x!r} as a dtype; known: {', '.join(SCALARS)}") from e


# ---- promotion --------------------------------------------------------------------------------------------------


@cache
def _promote_pair(a: DType, b: DType) -> DType:
    if a is b: return a
    ca, cb = _CATEGORY[a.kind], _CATEGORY[b.kind]
    if ca != cb: return a if ca > cb else b
    if a.is_float:  # float16 and bfloat16 meet in float32, as in torch
        if {a, b} == {dtypes.float16, dtypes.bfloat16}: return dtypes.float32
        return a if a.itemsize > b.itemsize else b
    if a.kind == b.kind: return a if a.itemsize > b.itemsize else b
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.itemsize > unsigned.itemsize: return signed
    if unsigned.itemsize == 8:
        raise DTypeError(f"promote: {a.name} and {b.name} have no common integer type; cast one of them explicitly")
    return {1: dtypes.int16, 2: dtypes.int32, 4: dtypes.int64}[unsigned.itemsize]


def least_upper_dtype(*ds: DType) -> DType:
    """The dtype two or more tensors promote to (PyTorch's `promote_types`)."""
    out = ds[0].scalar
    for d in ds[1:]: out = _promote_pair(out, d.scalar)
    return out


def promote_operands(shaped: list[DType], zero_dim: list[DType], scalars: list[object]) -> DType:
    """The dtype of an op on tensors with dims, 0-d tensors and Python scalars, as torch decides it.

    The highest category (bool < int < float) present anywhere wins; inside it, tensors with dims decide, then 0-d
    tensors, then scalars (which give the default dtype of their category)."""
    groups = [shaped, zero_dim, [dtypes.from_py(s) for s in scalars]]
    top = max(_CATEGORY[d.kind] for g in groups for d in g)
    for g in groups:
        if candidates := [d for d in g if _CATEGORY[d.kind] == top]: return least_upper_dtype(*candidates)
    raise AssertionError("promote_operands: no operands")


def result_dtype(tensor_dtype: DType, scalar: object) -> DType:
    """The dtype of `tensor op scalar`: a Python scalar only raises the category (int tensor * 0.5 -> float)."""
    sd = dtypes.from_py(scalar)
    return tensor_dtype if _CATEGORY[sd.kind] <= _CATEGORY[tensor_dtype.kind] else sd


# ---- value conversion -------------------------------------------------------------------------------------------

def truncate(value: float | int | bool, dtype: DType) -> float | int | bool:
    """Round or wrap a Python value to what `dtype` can hold (C semantics: ints wrap, floats round to nearest)."""
    d = dtype.scalar
    if d.is_bool: return bool(value)
    if d.is_int:
        if isinstance(value, float): value = float_to_int(value, d)
        bits = 8 * d.itemsize
        value = int(value) & ((1 << bits) - 1)
        return value - (1 << bits) if d.kind == "i" and value >= 1 << (bits - 1) else value
    value = float(value)
    if d is dtypes.float64: return value
    if d is dtypes.bfloat16: return _round_bfloat16(value)
    try:
        return struct.unpack(d.fmt, struct.pack(d.fmt, value))[0]  # type: ignore[arg-type]  # floats have fmt
    except OverflowError:
        return math.copysign(math.inf, value)


# C leaves a float outside an integer type's range undefined (NaN and +-inf included); ember defines it as torch
# computes it on x86, so the C renderer, the constant folder and the numpy interpreter agree on every value:
# int32 and int64 take their minimum; 8- and 16-bit types wrap the int32 result (int8(300.7) is 44, int8(nan) 0);
# uint32 wraps the int64 result (uint32(-5.0) is 2**32-5); uint64 takes [2**63, 2**64) exactly and wraps the int64
# result elsewhere. In range, a float truncates toward zero.

def float_to_int_via(dtype: DType) -> int:
    """The width (32 or 64) of the signed integer a float converts through on its way to `dtype`."""
    return 64 if dtype.itemsize == 8 or dtype.scalar is dtypes.uint32 else 32


def float_to_int(value: float, dtype: DType) -> int:
    """`value` converted to the integer type `dtype` by the rule above, before wrapping to its width."""
    if dtype.scalar is dtypes.uint64 and 2**63 <= value < 2**64: return int(value)
    bits = float_to_int_via(dtype)
    return int(value) if -2**(bits - 1) <= value < 2**(bits - 1) else -2**(bits - 1)  # NaN compares false


def float_to_int_array(x: np.ndarray, dtype: DType) -> np.ndarray:
    """`x` (a float array) converted to the integer type `dtype` by the rule above: float_to_int on every element."""
    bits = float_to_int_via(dtype)
    inside = (x >= -2.0**(bits - 1)) & (x < 2.0**(bits - 1))
    wide = np.where(inside, np.where(inside, x, 0).astype(f"int{bits}"), np.int64(-2**(bits - 1)))
    if dtype.scalar is dtypes.uint64:
        top = (x >= 2.0**63) & (x < 2.0**64)
        return np.where(top, np.where(top, x, 0).astype(np.uint64), wide.astype(np.uint64))
    return wide.astype(to_numpy(dtype))


def to_bfloat16_bits(arr: np.ndarray) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) nearest to `arr`'s values, ties to even; NaN stays NaN."""
    bits = np.asarray(arr, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    is_nan = np.isnan(np.asarray(arr, dtype=np.float32))
    return np.where(is_nan, (bits >> 16).astype(np.uint16) | 0x40, rounded)


def _round_bfloat16(value: float) -> float:
    if not math.isfinite(value): return value
    bits = struct.unpack("I", struct.pack("f", truncate(value, dtypes.float32)))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round half to even on the dropped 16 bits
    return struct.unpack("f", struct.pack("I", (bits << 16) & 0xFFFFFFFF))[0]
