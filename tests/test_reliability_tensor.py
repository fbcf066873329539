"""Regression tests for tensor-level reliability bugs (issue 13, items 5, 7, 12 and 13), each against torch.

Item 5: `x[index] = value` keeps gradients flowing to what self was computed from and to `value`.
Item 7: an index outside its axis raises IndexError (naming op, index and size) where torch raises, instead of
reading 0; lazily computed indices are checked under `Tensor.check_indices`.
Item 12: clear errors for misused dims, and empty results (not errors) for softmax-like ops over size-0 axes.
Item 13: numpy scalars as operands, log_softmax with +inf, and other corner cases decided as torch decides them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from ember import Tensor

# ---- item 5: __setitem__ and gradients ------------------------------------------------------------------------

# (index, value shape): every kind of index __setitem__ takes; each value is written over part of y = x * 2
SETITEM_CASES = [
    pytest.param(0, (), id="int"),
    pytest.param(slice(1, 3), (2,), id="slice"),
    pytest.param(slice(None, None, 2), (), id="slice-step-broadcast"),
    pytest.param(np.array([True, False, True, False]), (2,), id="bool-mask"),
    pytest.param([3, 1], (2,), id="index-list"),
    pytest.param("tensor", (2,), id="index-tensor"),
    pytest.param("negative-tensor", (1,), id="negative-index-tensor"),
]


def _index_for(index: Any, lib: str) -> Any:
    """The same index as ember and torch each take it (tensors of their own library)."""
    if isinstance(index, str):
        values = [0, 2] if index == "tensor" else [-1]
        return Tensor(values) if lib == "ember" else torch.tensor(values)
    if isinstance(index, np.ndarray): return Tensor(index) if lib == "ember" else torch.from_numpy(index)
    return index


def _setitem_grads(lib: str, index: Any, value_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """x.grad and v.grad after y = x * 2; y[index] = v * 3; (y * w).sum() + x.sum() is differentiated."""
    x_np = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    v_np = np.arange(1, 1 + int(np.prod(value_shape)), dtype=np.float32).reshape(value_shape) + 10
    weights = np.array([1.0, 10.0, 100.0, 1000.0], np.float32)  # tells the positions' gradients apart
    if lib == "ember":
        x, v = Tensor(x_np, requires_grad=True), Tensor(v_np, requires_grad=True)
        y = x * 2
        y[_index_for(index, lib)] = v * 3
        ((y * Tensor(weights)).sum() + x.sum()).backward()
        assert x.grad is not None and v.grad is not None
        return x.grad.numpy(), v.grad.numpy()
    tx, tv = torch.tensor(x_np, requires_grad=True), torch.tensor(v_np, requires_grad=True)
    ty = tx * 2
    ty[_index_for(index, lib)] = tv * 3
    ((ty * torch.from_numpy(weights)).sum() + tx.sum()).backward()
    return tx.grad.numpy(), tv.grad.numpy()


@pytest.mark.parametrize(("index", "value_shape"), SETITEM_CASES)
def test_setitem_passes_gradients_like_torch(index: Any, value_shape: tuple[int, ...]) -> None:
    got_x, got_v = _setitem_grads("ember", index, value_shape)
    want_x, want_v = _setitem_grads("torch", index, value_shape)
    np.testing.assert_allclose(got_x, want_x)
    np.testing.assert_allclose(got_v, want_v)


def test_setitem_issue_example() -> None:
    """The example of the issue: the overwritten element gets no gradient through y, the others do."""
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y[0] = 0
    (y.sum() + x.sum()).backward()
    assert x.grad is not None and x.grad.tolist() == [1.0, 3.0, 3.0]
    x2 = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    y2 = x2 * 2
    y2[1:] = 5
    y2.sum().backward()  # used to raise: the write cut y2 from x2
    assert x2.grad is not None and x2.grad.tolist() == [2.0, 0.0, 0.0]


def test_setitem_value_with_grad_into_plain_tensor() -> None:
    """A value that requires grad written into a tensor that does not still gets its gradient (torch does)."""
    v = Tensor([5.0, 6.0], requires_grad=True)
    y = Tensor.zeros(4)
    y[Tensor([3, 0])] = v
    (y * Tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert v.grad is not None and v.grad.tolist() == [4.0, 1.0]
    assert y.tolist() == [6.0, 0.0, 0.0, 5.0]


def test_setitem_without_gradients_still_realizes() -> None:
    """Without gradients the write is realized at once, as before: a loop of writes does not grow a graph."""
    y = Tensor.zeros(3)
    for i in range(3): y[i] = i + 1
    assert y.values_known() and y.tolist() == [1.0, 2.0, 3.0]


def test_setitem_on_leaf_that_requires_grad_raises() -> None:
    """torch: 'a leaf Variable that requires grad is being used in an in-place operation'."""
    x = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="setitem: a leaf tensor that requires grad"): x[0] = 3.0
    with pytest.raises(RuntimeError): torch.tensor([1.0, 2.0], requires_grad=True)[0] = 3.0


# ---- item 7: indices out of range --------------------------------------------------------------------------------

def _raises_like_torch(ours: Callable[[], Any], theirs: Callable[[], Any], match: str) -> None:
    """torch raises (IndexError or RuntimeError); ember raises IndexError with a message matching `match`."""
    with pytest.raises((IndexError, RuntimeError)): theirs()
    with pytest.raises(IndexError, match=match): ours()


X34 = np.arange(12, dtype=np.float32).reshape(3, 4)

OUT_OF_RANGE = [
    pytest.param(lambda: _embedding_ember([[4, -1]]), lambda: _embedding_torch([[4, -1]]),
                 "Embedding: index 4 is out of bounds with size 4", id="embedding-too-large"),
    pytest.param(lambda: _embedding_ember([[-1]]), lambda: _embedding_torch([[-1]]),
                 "Embedding: index -1 is out of bounds with size 4", id="embedding-negative"),
    pytest.param(lambda: Tensor([0, -1]).one_hot(3), lambda: torch.nn.functional.one_hot(torch.tensor([0, -1]), 3),
                 "one_hot: index -1 is out of bounds with size 3", id="one-hot-negative"),
    pytest.param(lambda: Tensor([3, 0]).one_hot(3), lambda: torch.nn.functional.one_hot(torch.tensor([3, 0]), 3),
                 "one_hot: index 3 is out of bounds with size 3", id="one-hot-too-large"),
    pytest.param(lambda: Tensor([0, -2]).one_hot(), lambda: torch.nn.functional.one_hot(torch.tensor([0, -2])),
                 "one_hot: class -2 is negative", id="one-hot-inferred-classes-negative"),
    pytest.param(lambda: Tensor(X34).gather(1, Tensor([[0], [-1], [1]])),
                 lambda: torch.from_numpy(X34).gather(1, torch.tensor([[0], [-1], [1]])),
                 "gather: index -1 is out of bounds for axis 1 with size 4", id="gather-negative"),
    pytest.param(lambda: Tensor(X34).scatter(0, Tensor([[-1, 0, 0, 0]]), 1.0),
                 lambda: torch.from_numpy(X34).scatter(0, torch.tensor([[-1, 0, 0, 0]]), 1.0),
                 "scatter: index -1 is out of bounds for axis 0 with size 3", id="scatter-negative"),
    pytest.param(lambda: Tensor(X34).index_select(1, Tensor([0, -1])),
                 lambda: torch.from_numpy(X34).index_select(1, torch.tensor([0, -1])),
                 "index_select: index -1 is out of bounds for axis 1 with size 4", id="index-select-negative"),
    pytest.param(lambda: Tensor(X34).index_select(0, Tensor([3])),
                 lambda: torch.from_numpy(X34).index_select(0, torch.tensor([3])),
                 "index_select: index 3 is out of bounds for axis 0 with size 3", id="index-select-too-large"),
    pytest.param(lambda: Tensor(X34)[Tensor([-4])], lambda: torch.from_numpy(X34)[torch.tensor([-4])],
                 "index: index -4 is out of bounds for axis 0 with size 3", id="index-tensor-below-wrap"),
]


def _embedding_ember(idx: list) -> Tensor:
    from ember.nn import Embedding
    return Embedding(4, 2)(Tensor(idx))


def _embedding_torch(idx: list) -> torch.Tensor:
    return torch.nn.Embedding(4, 2)(torch.tensor(idx))


@pytest.mark.parametrize(("ours", "theirs", "match"), OUT_OF_RANGE)
def test_known_out_of_range_index_raises_like_torch(ours: Callable[[], Any], theirs: Callable[[], Any],
                                                    match: str) -> None:
    _raises_like_torch(ours, theirs, match)


def test_negative_index_tensor_wraps_like_torch() -> None:
    """Plain tensor indexing takes [-n, n), as torch does; only the ops above reject negative indices."""
    got = Tensor(X34)[Tensor([-1, 0])].numpy()
    np.testing.assert_array_equal(got, torch.from_numpy(X34)[torch.tensor([-1, 0])].numpy())


LAZY_OUT_OF_RANGE = [
    pytest.param(lambda i: _embedding_ember_lazy(i + 3), "Embedding: index 4", id="embedding"),
    pytest.param(lambda i: (i + 2).one_hot(3), "one_hot: index 3", id="one-hot"),
    pytest.param(lambda i: Tensor(X34).gather(1, (i + 3).reshape(2, 1)), "gather: index 4", id="gather"),
    pytest.param(lambda i: Tensor(X34)[i - 5], "index: index -5", id="index-tensor"),
    pytest.param(lambda i: Tensor(X34).index_select(1, i - 2), "index_select: index -2", id="index-select"),
    pytest.param(lambda i: Tensor(X34[:2]).cross_entropy(i + 3), "cross_entropy: target 4", id="cross-entropy"),
]


def _embedding_ember_lazy(idx: Tensor) -> Tensor:
    from ember.nn import Embedding
    return Embedding(4, 2)(idx)


@pytest.mark.parametrize(("op", "match"), LAZY_OUT_OF_RANGE)
def test_lazy_out_of_range_index_raises_under_check_indices(op: Callable[[Tensor], Tensor], match: str) -> None:
    """A computed index is realized and checked under CHECK_INDICES; without it no kernel runs for the check."""
    from ember.helpers import Context
    with Context(CHECK_INDICES=1), pytest.raises(IndexError, match=match): op(Tensor([0, 1]) + 0).realize()
    op(Tensor([0, 1]) + 0)  # unchecked: builds the graph without raising (an index outside its range reads 0)


def test_lazy_index_in_range_is_correct_under_check_indices() -> None:
    from ember.helpers import Context
    with Context(CHECK_INDICES=1):
        idx = (Tensor([2, 0]) + 1).reshape(2, 1)
        got = Tensor(X34).gather(1, idx).numpy()
        assert idx.values_known()  # realized in place for the check: the gather reads its buffer
    np.testing.assert_array_equal(got, torch.from_numpy(X34).gather(1, torch.tensor([[3], [1]])).numpy())
