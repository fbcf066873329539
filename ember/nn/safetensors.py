"""Reading and writing safetensors files: tensors by name, no pickle, no code run on load.

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian length N, N bytes of UTF-8 JSON
naming each tensor's dtype, shape and `data_offsets` [begin, end) into the byte buffer that follows (plus an optional
"__metadata__" object of strings), then that buffer: every tensor's little-endian bytes, back to back, covering it
without gaps or overlaps.

A file is untrusted input. `safe_load` checks the header length against the file size before reading the header,
checks every entry before copying any data, and raises SafetensorsError naming the file and the tensor for anything
malformed. It memory-maps the file and copies each tensor into its buffer in CHUNK_BYTES pieces, dropping the mapped
pages behind it, so loading costs about the tensors' own size in memory; `safe_save` writes the header, then each
tensor's buffer in pieces, so saving costs next to nothing beyond the tensors. Both go through host memory.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
>>> safe_save({"w": Tensor([[1.0, 2.0]])}, path)
>>> safe_load(path)["w"].tolist()
[[1.0, 2.0]]
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from ember.device import Buffer, Device, buffer_uop
from ember.dtype import DType, dtypes, to_numpy
from ember.errors import EmberError
from ember.tensor import Tensor
from ember.uop.ops import Ops, UOp
from ember.variables import concrete

# safetensors' dtype names, in the order of its Rust `Dtype` enum (by alignment), which orders the tensors in a file
SAFETENSORS_DTYPES: dict[DType, str] = {
    dtypes.bool: "BOOL", dtypes.uint8: "U8", dtypes.int8: "I8", dtypes.int16: "I16", dtypes.uint16: "U16",
    dtypes.float16: "F16", dtypes.bfloat16: "BF16", dtypes.int32: "I32", dtypes.uint32: "U32",
    dtypes.float32: "F32", dtypes.float64: "F64", dtypes.int64: "I64", dtypes.uint64: "U64",
}
DTYPES_BY_NAME = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}
ALIGNMENT_RANK = {dtype: rank for rank, dtype in enumerate(SAFETENSORS_DTYPES)}
# The safetensors library refuses longer headers; without a cap a file claiming a 2 GB header would be read whole
# and parsed before anything could be found wrong with it.
MAX_HEADER_BYTES = 100_000_000
# Bytes copied (and mapped pages held) at a time: big enough that per-piece overhead vanishes, small against a model.
CHUNK_BYTES = 16 << 20
TENSOR_KEYS = ("dtype", "shape", "data_offsets")


class SafetensorsError(EmberError, ValueError):
    """A file that is not a valid safetensors file, or a state dict that cannot be written as one.

    `path` is the file and `tensor` the entry at fault (None when the fault is the file's as a whole)."""

    def __init__(self, message: str, path: str | None = None, tensor: str | None = None) -> None:
        super().__init__(message)
        self.path, self.tensor = path, tensor


# ---- saving --------------------------------------------------------------------------------------------------------


def safe_save(state_dict: dict[str, Tensor], path: str | os.PathLike[str],
              metadata: dict[str, str] | None = None) -> None:
    """Write the tensors to a safetensors file, laid out as the safetensors library lays them out.

    Tensors are ordered by dtype alignment (widest first) then name, so each one's data is aligned in the file;
    the JSON header is compact and padded with spaces to a multiple of 8 bytes. The header is written first, from
    shapes and dtypes alone; then each tensor is realized and its buffer written piece by piece, so no copy of the
    whole state dict (or of one whole tensor) is ever made."""
    file = os.fspath(path)
    _check_savable(state_dict, metadata, file)
    order = sorted(state_dict, key=lambda name: (-ALIGNMENT_RANK[state_dict[name].dtype], name))
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in order:
        t = state_dict[name]
        shape = concrete(t.shape)  # (a symbolic size as its bound value: the file holds the values of this call)
        nbytes = math.prod(shape) * t.dtype.itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    with open(file, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name in order: _write_tensor(f, state_dict[name])


def _check_savable(state_dict: dict[str, Tensor], metadata: dict[str, str] | None, file: str) -> None:
    for name, t in state_dict.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError(f"safe_save: cannot name a tensor {name!r} in {file}; names are strings other "
                                   "than '__metadata__'", file, str(name))
        if not isinstance(t, Tensor):
            raise SafetensorsError(f"safe_save: cannot write '{name}' to {file}: it is a {type(t).__name__}, not a "
                                   "Tensor; safe_save writes Tensors", file, name)
        if t.dtype not in SAFETENSORS_DTYPES:
            storable = ", ".join(d.name for d in SAFETENSORS_DTYPES)
            raise SafetensorsError(f"safe_save: cannot write '{name}' to {file}: it has dtype {t.dtype.name}, which "
                                   f"safetensors cannot store; it stores {storable}", file, name)
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise SafetensorsError(f"safe_save: metadata for {file} is {metadata!r}; it must map strings to strings "
                               "(other readers refuse anything else)", file)


def _write_tensor(f: BinaryIO, t: Tensor) -> None:
    """Write t's values: its buffer's first bytes (all of a concrete tensor's; a symbolic one's buffer is sized for its
    variables' maxima)."""
    if (nbytes := math.prod(concrete(t.shape)) * t.dtype.itemsize) == 0: return
    for piece in _host_pieces(t._buffer(), nbytes): f.write(piece)


def _host_pieces(buf: Buffer, nbytes: int) -> Iterator[np.ndarray]:
    """The first `nbytes` of the buffer in little-endian order, CHUNK_BYTES at a time: views of it where it lives in
    host memory."""
    raw = buf.ensure_allocated().raw
    flat = raw[:nbytes] if isinstance(raw, np.ndarray) else \
        buf.numpy(nbytes // buf.dtype.itemsize).view(np.uint8)
    for start in range(0, nbytes, CHUNK_BYTES):
        yield _swap_on_big_endian(flat[start:start + CHUNK_BYTES], buf.dtype)


def _swap_on_big_endian(piece: np.ndarray, dtype: DType) -> np.ndarray:
    """Bytes of `dtype` values converted between little-endian (the file's order) and this machine's order: the same
    bytes on a little-endian machine, each value's bytes reversed on a big-endian one."""
    if sys.byteorder == "little" or dtype.itemsize == 1: return piece
    return piece.view(to_numpy(dtype)).byteswap().view(np.uint8)


# ---- loading -------------------------------------------------------------------------------------------------------


def safe_load(path: str | os.PathLike[str], device: str | None = None) -> dict[str, Tensor]:
    """The tensors of a safetensors file, by name in header order, each in its own buffer on `device`.

    Raises SafetensorsError (a ValueError) naming the file and tensor when the file is malformed; nothing is
    allocated before the whole header has been checked. BOOL bytes other than 0 load as True, stored as 1: ember's
    kernels treat bools as 0 or 1 (logical_not of a stored 2 would give 3)."""
    file = os.fspath(path)
    target = Device.canonicalize(device or Device.DEFAULT)
    with open(file, "rb") as f:
        header, data_start = _read_header(f, file)
        entries = _check_entries(header, os.fstat(f.fileno()).st_size - data_start, file)
        if not entries: return {}
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return {name: _load_tensor(mapped, data_start, entry, target) for name, entry in entries.items()}
    finally:
        with contextlib.suppress(BufferError): mapped.close()  # an exception's traceback may still hold a view


def safe_load_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The free-form `__metadata__` strings of a safetensors file ({} when it has none); the data is not read."""
    file = os.fspath(path)
    with open(file, "rb") as f:
        header, data_start = _read_header(f, file)
        _check_entries(header, os.fstat(f.fileno()).st_size - data_start, file)
    return header.get("__metadata__", {})


class _Entry:
    """One checked header entry: dtype, shape and the byte range [begin, end) in the data buffer."""

    __slots__ = ("dtype", "shape", "begin", "end")

    def __init__(self, dtype: DType, shape: tuple[int, ...], begin: int, end: int) -> None:
        self.dtype, self.shape, self.begin, self.end = dtype, shape, begin, end


def _read_header(f: BinaryIO, file: str) -> tuple[dict[str, Any], int]:
    """The parsed JSON header and the file offset where the data buffer starts; reads nothing past the header."""
    size = os.fstat(f.fileno()).st_size
    if size < 8:
        raise SafetensorsError(f"safe_load: {file} is {size} bytes, too short for a safetensors file; it starts with "
                               "an 8-byte header length", file)
    length = int.from_bytes(f.read(8), "little")
    if length > size - 8:
        raise SafetensorsError(f"safe_load: {file} declares a {length}-byte header but has {size - 8} bytes after the "
                               "length; it is not a safetensors file or it is truncated", file)
    if length > MAX_HEADER_BYTES:
        raise SafetensorsError(f"safe_load: {file} declares a {length}-byte header; safetensors headers are at most "
                               f"{MAX_HEADER_BYTES} bytes", file)
    text = f.read(length)
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_refuse_duplicates(file))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"safe_load: the header of {file} is not JSON: {e}; it must be a UTF-8 JSON object",
                               file) from None
    except RecursionError:
        raise SafetensorsError(f"safe_load: the header of {file} nests too deeply to parse; a safetensors header is "
                               "an object of objects holding lists of integers", file) from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"safe_load: the header of {file} is a JSON {type(header).__name__}, not an object; "
                               "it must map tensor names to entries", file)
    return header, 8 + length


def _refuse_duplicates(file: str) -> Any:
    """A json object_pairs_hook that raises on a key given twice (json.loads would keep the last one silently)."""
    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise SafetensorsError(f"safe_load: the header of {file} gives the key '{key}' twice in one object; "
                                       "tensor names and entry fields must be unique", file, key)
            out[key] = value
        return out
    return build


def _check_entries(header: dict[str, Any], data_bytes: int, file: str) -> dict[str, _Entry]:
    """Every tensor entry of the header, checked one by one and then together against the data buffer's size."""
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"safe_load: the '__metadata__' entry of {file} is {_short(metadata)}; it must be an "
                               "object of strings", file, "__metadata__")
    entries = {name: _check_entry(name, info, data_bytes, file) for name, info in header.items()
               if name != "__metadata__"}
    covered, previous = 0, None
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin < covered:
            raise SafetensorsError(f"safe_load: tensor '{name}' in {file} overlaps tensor '{previous}': it begins at "
                                   f"byte {entry.begin}, before {covered}; tensors must not share bytes", file, name)
        if entry.begin > covered:
            raise SafetensorsError(f"safe_load: tensor '{name}' in {file} begins at byte {entry.begin}, leaving bytes "
                                   f"[{covered}, {entry.begin}) unused; tensors must cover the data without gaps",
                                   file, name)
        covered, previous = entry.end, name
    if covered != data_bytes:
        last = f", up to the end of tensor '{previous}'" if previous is not None else ""
        raise SafetensorsError(f"safe_load: {file} has {data_bytes} data bytes but its tensors cover {covered}{last}; "
                               "the data must end where the last tensor ends", file, previous)
    return entries


def _check_entry(name: str, info: Any, data_bytes: int, file: str) -> _Entry:
    def fail(what: str) -> SafetensorsError:
        return SafetensorsError(f"safe_load: tensor '{name}' in {file} {what}", file, name)

    if not isinstance(info, dict):
        raise fail(f"is {_short(info)}, not an object; entries are objects with dtype, shape and data_offsets")
    for key in TENSOR_KEYS:
        if key not in info: raise fail(f"has no {key}; entries are objects with dtype, shape and data_offsets")
    dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES_BY_NAME:  # a list would not even hash
        raise fail(f"has dtype {_short(dtype_name)}, which ember does not read; ember reads "
                   f"{', '.join(DTYPES_BY_NAME)}")
    if not _is_naturals(shape):
        raise fail(f"has shape {_short(shape)}; a shape is a list of non-negative integers")
    if not (_is_naturals(offsets) and len(offsets) == 2 and offsets[0] <= offsets[1]):
        raise fail(f"has data_offsets {_short(offsets)}; they are [begin, end] with 0 <= begin <= end")
    dtype, (begin, end) = DTYPES_BY_NAME[dtype_name], offsets
    if end > data_bytes:
        raise fail(f"has data_offsets [{begin}, {end}] past the end of the data: the file holds {data_bytes} data "
                   "bytes; offsets count from the first byte after the header")
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise fail(f"has data_offsets [{begin}, {end}] ({end - begin} bytes) for {dtype_name} {shape}, which takes "
                   f"{math.prod(shape) * dtype.itemsize}; end - begin must be the element count times "
                   f"{dtype.itemsize}")
    return _Entry(dtype, tuple(shape), begin, end)


def _is_naturals(value: Any) -> bool:
    return isinstance(value, list) and all(type(x) is int and x >= 0 for x in value)  # type(): True is not a size


def _short(value: Any) -> str:
    """A JSON value for a message, cut short: a malformed header may hold anything, of any size."""
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _load_tensor(mapped: mmap.mmap, data_start: int, entry: _Entry, device: str) -> Tensor:
    """A tensor holding the entry's bytes, copied a piece at a time from the mapped file into a new buffer."""
    buf = Buffer(device, math.prod(entry.shape), entry.dtype).ensure_allocated()
    # Host memory (the CPU's buffers are numpy arrays) is filled in place; other devices get a host copy in one go.
    host = buf.raw if isinstance(buf.raw, np.ndarray) else np.empty(buf.nbytes, dtype=np.uint8)
    for start in range(0, buf.nbytes, CHUNK_BYTES):
        begin, count = data_start + entry.begin + start, min(CHUNK_BYTES, buf.nbytes - start)
        piece = np.frombuffer(mapped, dtype=np.uint8, count=count, offset=begin)
        if entry.dtype is dtypes.bool: np.not_equal(piece, 0, out=host[start:start + count].view(np.bool_))
        else: np.copyto(host[start:start + count], _swap_on_big_endian(piece, entry.dtype))
        del piece  # no view may outlive the loop: the map is closed after loading
        _drop_pages(mapped, begin, count)
    if host is not buf.raw: buf.copyin(host.view(to_numpy(entry.dtype)))
    return Tensor(UOp(Ops.RESHAPE, entry.dtype, (buffer_uop(buf),), entry.shape), device=device)


def _drop_pages(mapped: mmap.mmap, begin: int, nbytes: int) -> None:
    """Let the kernel take back the mapped pages of bytes already copied, so they stop counting as this process's
    memory; reading them again would fault them back in from the page cache."""
    if not hasattr(mmap, "MADV_DONTNEED"): return  # not on Windows or macOS's older Pythons: pages stay mapped
    page_start = begin - begin % mmap.PAGESIZE
    with contextlib.suppress(OSError): mapped.madvise(mmap.MADV_DONTNEED, page_start, begin + nbytes - page_start)


__all__ = ["safe_save", "safe_load", "safe_load_metadata", "SafetensorsError", "SAFETENSORS_DTYPES"]
