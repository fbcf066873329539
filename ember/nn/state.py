"""Finding, naming, saving and loading a model's tensors: state dicts and the safetensors file format.

A model is any object whose attributes, lists, tuples and dicts hold Tensors (see ember.nn). `get_state_dict`
names each tensor by its path, as torch's state_dict does ("layers.0.weight"), so torch-trained weights load by
name. Files are safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian header length,
a JSON header giving each tensor's dtype, shape and byte range, then the raw little-endian data. No pickle: loading
a file runs no code from it, and no package beyond numpy is needed.

>>> from ember.nn import Linear
>>> sorted(get_state_dict([Linear(2, 3)]))
['0.bias', '0.weight']
"""

from __future__ import annotations

import json
import os
import types
from typing import Any

import numpy as np

from ember.dtype import DType, dtypes, to_numpy
from ember.errors import EmberError, ShapeError
from ember.tensor import Tensor

# safetensors' dtype names, in the order of its Rust `Dtype` enum (by alignment), which orders the tensors in a file
SAFETENSORS_DTYPES: dict[DType, str] = {
    dtypes.bool: "BOOL", dtypes.uint8: "U8", dtypes.int8: "I8", dtypes.int16: "I16", dtypes.uint16: "U16",
    dtypes.float16: "F16", dtypes.bfloat16: "BF16", dtypes.int32: "I32", dtypes.uint32: "U32",
    dtypes.float32: "F32", dtypes.float64: "F64", dtypes.int64: "I64", dtypes.uint64: "U64",
}
DTYPES_BY_NAME = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}
ALIGNMENT_RANK = {dtype: rank for rank, dtype in enumerate(SAFETENSORS_DTYPES)}
# Objects that hold attributes but are not part of a model: walking a module or a class would reach everything.
NOT_MODELS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


class StateDictError(EmberError, KeyError):
    """A state dict whose names do not match the model's (missing or unexpected keys)."""

    def __str__(self) -> str: return str(self.args[0])  # KeyError would print the message quoted


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every Tensor reachable from obj through attributes, list/tuple items and dict values, by dotted path.

    Attributes come in definition order, so a layer's "weight" precedes its "bias" as in torch. A tensor reachable
    by two paths appears under both (torch does the same for shared weights); None attributes are skipped."""
    out: dict[str, Tensor] = {}
    _walk(obj, prefix, out, set())
    return out


def _walk(obj: Any, path: str, out: dict[str, Tensor], seen: set[int]) -> None:
    if isinstance(obj, Tensor):
        out[path] = obj
        return
    if id(obj) in seen or isinstance(obj, NOT_MODELS): return  # seen: a cycle (a layer that refers to its model)
    if isinstance(obj, (list, tuple)): items: Any = enumerate(obj)
    elif isinstance(obj, dict): items = obj.items()
    elif hasattr(obj, "__dict__"): items = vars(obj).items()
    else: return
    seen.add(id(obj))
    for key, value in items: _walk(value, f"{path}.{key}" if path else str(key), out, seen)
    seen.discard(id(obj))


def get_parameters(obj: Any) -> list[Tensor]:
    """Every distinct trainable Tensor reachable from obj (see get_state_dict), in order, each once.

    Buffers (requires_grad False: BatchNorm's running statistics) are left out, as torch's parameters() leaves them
    out; get_state_dict has them. An optimizer step realizes the buffers a forward pass updated all the same."""
    return [t for t in {id(t): t for t in get_state_dict(obj).values()}.values() if t.requires_grad is not False]


def load_state_dict(obj: Any, state_dict: dict[str, Tensor], strict: bool = True) -> tuple[list[str], list[str]]:
    """Give every tensor of obj the value of the state_dict entry of the same name; returns (missing, unexpected).

    Values are cast to the model tensor's dtype and moved to its device. With `strict`, names that do not match
    raise StateDictError (a KeyError) listing both kinds; a shape mismatch always raises ShapeError. Nothing is
    changed when either is raised. The new values are realized together, in one schedule."""
    targets = get_state_dict(obj)
    missing = [name for name in targets if name not in state_dict]
    unexpected = [name for name in state_dict if name not in targets]
    if strict and (missing or unexpected):
        raise StateDictError(f"load_state_dict: names do not match the model's: missing keys {missing}, "
                             f"unexpected keys {unexpected}; pass strict=False to load the names that match")
    pairs = [(name, t, _as_tensor(state_dict[name])) for name, t in targets.items() if name in state_dict]
    for name, t, value in pairs:
        if value.shape != t.shape:
            raise ShapeError(f"load_state_dict: '{name}' has shape {value.shape} in the state dict and {t.shape} "
                             "in the model; shapes must match")
    for _, t, value in pairs: t.assign(value.to(t.device))
    if pairs: Tensor.realize(*{id(t): t for _, t, _ in pairs}.values())
    return missing, unexpected


def _as_tensor(value: Any) -> Tensor:
    return value if isinstance(value, Tensor) else Tensor(np.asarray(value))


def safe_save(state_dict: dict[str, Tensor], path: str | os.PathLike[str],
              metadata: dict[str, str] | None = None) -> None:
    """Write the tensors to a safetensors file, laid out as the safetensors library lays them out.

    Tensors are ordered by dtype alignment (widest first) then name, so each one's data is aligned in the file;
    the JSON header is compact and padded with spaces to a multiple of 8 bytes."""
    for name, t in state_dict.items():
        if t.dtype not in SAFETENSORS_DTYPES:
            raise EmberError(f"safe_save: '{name}' has dtype {t.dtype.name}, which safetensors cannot store")
    order = sorted(state_dict, key=lambda name: (-ALIGNMENT_RANK[state_dict[name].dtype], name))
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    chunks, offset = [], 0
    for name in order:
        data = _little_endian_bytes(state_dict[name])
        header[name] = {"dtype": SAFETENSORS_DTYPES[state_dict[name].dtype], "shape": list(state_dict[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for data in chunks: f.write(data)


def _little_endian_bytes(t: Tensor) -> bytes:
    values = t.numpy()
    if t.dtype is dtypes.bfloat16:  # numpy() widened it to float32 exactly: the top 16 bits are the bfloat16
        values = (values.view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes()


def safe_load(path: str | os.PathLike[str], device: str | None = None) -> dict[str, Tensor]:
    """The tensors of a safetensors file, by name, each in its own buffer (in file order)."""
    with open(path, "rb") as f: blob = f.read()
    header, data = _read_header(blob, str(path))
    out: dict[str, Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__": continue
        if info["dtype"] not in DTYPES_BY_NAME:
            raise EmberError(f"safe_load: '{name}' in {path} has dtype {info['dtype']}, which ember does not have; "
                             f"ember reads {sorted(DTYPES_BY_NAME)}")
        dtype, (start, end) = DTYPES_BY_NAME[info["dtype"]], info["data_offsets"]
        shape = tuple(info["shape"])
        if not 0 <= start <= end <= len(data) or end - start != int(np.prod(shape)) * dtype.itemsize:
            raise EmberError(f"safe_load: '{name}' in {path}: byte range [{start}, {end}) does not hold "
                             f"{info['dtype']} {list(shape)} within the {len(data)} data bytes")
        values = np.frombuffer(data[start:end], dtype=to_numpy(dtype).newbyteorder("<")).reshape(shape)
        out[name] = _tensor_of(values, dtype, device)
    return out


def _tensor_of(values: np.ndarray, dtype: DType, device: str | None) -> Tensor:
    if dtype is dtypes.bfloat16:  # the stored uint16 bits are the top half of the float32 of the same value
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return Tensor(values.astype(values.dtype.newbyteorder("=")), device=device, dtype=dtype)


def safe_load_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The free-form `__metadata__` strings of a safetensors file ({} when it has none)."""
    with open(path, "rb") as f: blob = f.read()
    return _read_header(blob, str(path))[0].get("__metadata__", {})


def _read_header(blob: bytes, path: str) -> tuple[dict[str, Any], bytes]:
    """The parsed JSON header and the data bytes after it."""
    if len(blob) < 8: raise EmberError(f"safe_load: {path} is {len(blob)} bytes, too short for a safetensors file")
    size = int.from_bytes(blob[:8], "little")
    if 8 + size > len(blob):
        raise EmberError(f"safe_load: {path} declares a {size}-byte header but has {len(blob) - 8} bytes after the "
                         "length; it is not a safetensors file or it is truncated")
    try:
        header = json.loads(blob[8:8 + size].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EmberError(f"safe_load: the header of {path} is not JSON: {e}") from None
    return header, blob[8 + size:]


__all__ = ["get_state_dict", "get_parameters", "load_state_dict", "safe_save", "safe_load", "safe_load_metadata",
           "StateDictError"]
