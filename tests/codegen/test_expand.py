"""expand (ember/codegen/expand.py): lane ranges become vector lanes or unrolled copies, at any depth of graph."""

import numpy as np
import pytest

import ember.schedule.kernelize as kernelize
from ember import Tensor


def test_deep_chain_expands_without_recursion(monkeypatch: pytest.MonkeyPatch) -> None:
    # one kernel of 2000 adds over a 16-element axis the heuristic upcasts into vector lanes: the expander walked its
    # values recursively, one frame pair per node, and raised RecursionError past Python's limit of 1000
    monkeypatch.setattr(kernelize, "CUT_EVERY", 1 << 30)  # no cut: the whole chain in one kernel
    start = np.arange(16, dtype=np.float32)
    x = Tensor(start)
    for _ in range(2000): x = x + 1
    (item,) = x.schedule()
    assert sum(u.op.name == "ADD" for u in item.ast.toposort()) == 2000
    np.testing.assert_array_equal(x.numpy(), start + 2000)
