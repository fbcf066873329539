"""codegen/decompose.py: a renderer that lacks an op gets the op rewritten into ops it has, with the same bits, or
a clear error where no exact rewrite exists."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ember import Tensor
from ember.codegen import get_program
from ember.device import Device
from ember.renderer.cstyle import CRenderer
from ember.uop.ops import Ops


class Lacking(CRenderer):
    """The CPU's C without SUB, RECIPROCAL, CMPEQ and NEG: what a small target might print."""

    supported_ops = frozenset(Ops) - {Ops.SUB, Ops.RECIPROCAL, Ops.CMPEQ, Ops.NEG}


def run(t: Tensor, renderer: CRenderer) -> tuple[np.ndarray, set[Ops]]:
    (item,) = t.schedule()
    spec = get_program(item.ast, renderer)
    device = Device["CPU"]
    program = device.program(dataclasses.replace(spec, global_size=(1,)), device.compiler.compile_cached(spec.src))
    out = np.empty(item.bufs[0].size, item.bufs[0].dtype.name if item.bufs[0].dtype.name != "bool" else np.bool_)
    program(out, *[b.numpy() for b in item.bufs[1:]])
    return out, {u.op for u in spec.uops or []}


@pytest.mark.parametrize("dtype", ["float32", "int32", "float64"])
def test_rewrites_give_the_bits_of_the_ops_they_replace(dtype: str) -> None:
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-9, 9, 64).astype(dtype) for _ in range(2))
    b[b == 0] = 1
    fns = [lambda x, y: x - y, lambda x, y: -x, lambda x, y: (x == y.where(x, y)), lambda x, y: x.reciprocal()
           if x.dtype.is_float else x * 3 - y]
    for fn in fns:
        t = fn(Tensor(a), Tensor(b))
        want, _ = run(t, CRenderer())
        got, ops = run(t, Lacking())
        np.testing.assert_array_equal(got, want)
        assert not ops & (frozenset(Ops) - Lacking.supported_ops), ops


def test_an_op_without_an_exact_rewrite_is_named() -> None:
    class NoExp(CRenderer):
        supported_ops = frozenset(Ops) - {Ops.EXP2, Ops.EXP}
    (item,) = Tensor(np.ones(8, np.float32)).exp().schedule()
    with pytest.raises(NotImplementedError, match=r"NoExp \(CPU\): no EXP"):
        get_program(item.ast, NoExp())
