"""Finding, naming, saving and loading a model's tensors: state dicts and the safetensors file format.

A model is any object whose attributes, lists, tuples and dicts hold Tensors (see ember.nn). `get_state_dict`
names each tensor by its path, as torch's state_dict does ("layers.0.weight"), so torch-trained weights load by
name. Files are safetensors, read and written by ember.nn.safetensors (safe_load, safe_save, safe_load_metadata are
re-exported here, where users look for them beside the state dict). No pickle: loading a file runs no code from it.

>>> from ember.nn import Linear
>>> sorted(get_state_dict([Linear(2, 3)]))
['0.bias', '0.weight']
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

from ember.errors import EmberError, ShapeError
from ember.nn.safetensors import SafetensorsError, safe_load, safe_load_metadata, safe_save
from ember.tensor import Tensor

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


__all__ = ["get_state_dict", "get_parameters", "load_state_dict", "safe_save", "safe_load", "safe_load_metadata",
           "StateDictError", "SafetensorsError"]
