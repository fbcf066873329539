"""Stable text of UOp graphs and args: the same in every process, so that its hash can key caches shared between
processes (rendered programs in engine/realize.py, BEAM winners in codegen/search.py, native extensions in
export/native.py). Equal texts mean equal graphs; kinds of arg with no such text raise TypeError."""

from __future__ import annotations

import dataclasses
import enum
import json
import struct

from ember.dtype import DType
from ember.uop.ops import Ops, UOp


def graph_text(sink: UOp) -> str:
    """A UOp graph as text that is the same in every process: one line per node in toposort order, naming its op,
    dtype, sources by their line number and arg (floats by their bits). Equal texts mean equal graphs, so its hash
    keys caches shared between processes (see the module docstring)."""
    numbered: dict[UOp, int] = {}
    dtype_texts: dict[DType, str] = {}  # a graph has a few dtypes, each on many nodes
    lines = []
    for u in sink.toposort():
        if (dtype := dtype_texts.get(u.dtype)) is None: dtype = dtype_texts[u.dtype] = value_text(u.dtype, numbered)
        lines.append(f"{u.op.name} {dtype} {[numbered[s] for s in u.src]} {value_text(u.arg, numbered)}")
        numbered[u] = len(numbered)
    return "\n".join(lines)


def value_text(x: object, numbered: dict[UOp, int]) -> str:
    """An arg (or dtype) as text that tells apart every two values codegen could treat differently: True from 1,
    0.0 from -0.0, NaNs by payload; a UOp by its line in `numbered`. TypeError for a kind with no stable text (a
    repr may hold an address, or abbreviate as numpy does, where equal text would not mean equal value)."""
    if x is None or type(x) is bool or type(x) is int: return repr(x)
    if type(x) is float: return "f" + struct.pack("<d", x).hex()
    if type(x) is str: return json.dumps(x)
    if isinstance(x, tuple | list) and type(x) in (tuple, list):  # not a namedtuple: its fields would be lost
        inner = ",".join(value_text(v, numbered) for v in x)
        return f"({inner})" if type(x) is tuple else f"[{inner}]"
    if type(x) in (frozenset, set):  # (its members' texts in order: a set's own order varies between processes)
        return "{" + ",".join(sorted(value_text(v, numbered) for v in x)) + "}"  # type: ignore[union-attr]
    if isinstance(x, dict) and type(x) is dict:
        return "{" + ",".join(f"{value_text(k, numbered)}:{value_text(v, numbered)}" for k, v in x.items()) + "}"
    if isinstance(x, UOp):
        if x.op is Ops.DEFINE_VAR and x not in numbered: return f"var{value_text(x.arg, numbered)}"  # a size
        if x not in numbered: raise TypeError("value_text: a UOp arg outside the graph")
        return f"%{numbered[x]}"
    if isinstance(x, enum.Enum): return f"{type(x).__qualname__}.{x.name}"
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        inner = ",".join(f"{f.name}={value_text(getattr(x, f.name), numbered)}" for f in dataclasses.fields(x))
        return f"{type(x).__qualname__}{{{inner}}}"
    raise TypeError(f"value_text: no stable text for a {type(x).__name__}")
