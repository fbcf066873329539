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


# ---- item 12: clear errors, and empty results over size-0 axes ---------------------------------------------------

ERRORS = [
    pytest.param(lambda: Tensor([[1.0]]).sum(axis=1.0), lambda: torch.tensor([[1.0]]).sum(dim=1.0), TypeError,
                 r"sum: axis must be an int or a sequence of ints, got 1\.0", id="sum-float-axis"),
    pytest.param(lambda: Tensor(2.0).cat(Tensor(3.0)), lambda: torch.cat([torch.tensor(2.0), torch.tensor(3.0)]),
                 RuntimeError, "cat: the 0-d tensor at position 0 cannot be concatenated", id="cat-0d"),
    pytest.param(lambda: Tensor([1.0]).cat(Tensor(3.0)), lambda: torch.cat([torch.tensor([1.0]), torch.tensor(3.0)]),
                 RuntimeError, "cat: the 0-d tensor at position 1", id="cat-0d-second"),
    pytest.param(lambda: Tensor(2.0).transpose(0, 1), lambda: torch.tensor(2.0).transpose(0, 1), IndexError,
                 "transpose: axis 1 is out of range for a 0-d tensor", id="transpose-0d-out-of-range"),
    pytest.param(lambda: Tensor(2.0).split(1), lambda: torch.tensor(2.0).split(1), RuntimeError,
                 "split: a 0-d tensor has no axis 0", id="split-0d"),
    pytest.param(lambda: Tensor(2.0).chunk(1), lambda: torch.tensor(2.0).chunk(1), RuntimeError,
                 "chunk: a 0-d tensor has no axis 0", id="chunk-0d"),
    pytest.param(lambda: Tensor(2.0).roll(1, 0), lambda: torch.tensor(2.0).roll(1, 0), IndexError,
                 "roll: a 0-d tensor has no axis 0", id="roll-0d"),
    pytest.param(lambda: Tensor.ones(1, 1, 3, 3).conv2d(Tensor.ones(2, 1, 1, 1), Tensor.ones(3)),
                 lambda: torch.nn.functional.conv2d(torch.ones(1, 1, 3, 3), torch.ones(2, 1, 1, 1), torch.ones(3)),
                 RuntimeError, r"conv: bias has shape \(3,\), expected \(2,\)", id="conv2d-bias"),
    pytest.param(lambda: Tensor.ones(1, 1, 3, 3).conv2d(Tensor.ones(2, 1, 1, 1), stride=0),
                 lambda: torch.nn.functional.conv2d(torch.ones(1, 1, 3, 3), torch.ones(2, 1, 1, 1), stride=0),
                 RuntimeError, "conv: stride must be positive", id="conv2d-stride-0"),
    pytest.param(lambda: Tensor.ones(1, 1, 3, 3).avg_pool2d(0),
                 lambda: torch.nn.functional.avg_pool2d(torch.ones(1, 1, 3, 3), 0), RuntimeError,
                 "avg_pool: kernel_size must be positive", id="avg-pool-0"),
]


@pytest.mark.parametrize(("ours", "theirs", "error", "match"), ERRORS)
def test_misuse_raises_a_clear_error_like_torch(ours: Callable[[], Any], theirs: Callable[[], Any],
                                                error: type[Exception], match: str) -> None:
    """torch raises `error`; so does ember (its errors derive from the builtin torch raises), naming the op."""
    with pytest.raises(error): theirs()
    with pytest.raises(error, match=match): ours()


def test_transpose_of_a_0d_tensor_is_itself_like_torch() -> None:
    for dims in [(0, 0), (0, -1), (-1, -1)]:
        assert Tensor(2.0).transpose(*dims).item() == torch.tensor(2.0).transpose(*dims).item() == 2.0


def _compare(ours: Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == tuple(theirs.shape)
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-6, atol=1e-6, equal_nan=True)


EMPTY_SHAPES = [(2, 0), (0, 3), (0,), (2, 0, 3)]
EMPTY_OPS = [
    pytest.param(lambda t: t.softmax(-1), id="softmax"),
    pytest.param(lambda t: t.softmax(0), id="softmax-0"),
    pytest.param(lambda t: t.log_softmax(-1), id="log_softmax"),
    pytest.param(lambda t: t.log_softmax(0), id="log_softmax-0"),
    pytest.param(lambda t: t.logsumexp(-1), id="logsumexp"),
    pytest.param(lambda t: t.logsumexp(0), id="logsumexp-0"),
    pytest.param(lambda t: t.logsumexp(0, keepdim=True), id="logsumexp-keepdim"),
    pytest.param(lambda t: t.cummax(-1)[0], id="cummax"),
    pytest.param(lambda t: t.cummax(-1)[1], id="cummax-indices"),
]


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=str)
@pytest.mark.parametrize("op", EMPTY_OPS)
def test_softmax_family_over_an_empty_axis_matches_torch(op: Callable[[Any], Any], shape: tuple[int, ...]) -> None:
    """Empty results (logsumexp: -inf, the log of an empty sum) instead of 'cannot reduce axis of size 0'."""
    _compare(op(Tensor(np.ones(shape, np.float32))), op(torch.ones(shape)))


def test_logsumexp_over_an_empty_axis_has_a_zero_gradient_like_torch() -> None:
    x, tx = Tensor(np.ones((2, 0), np.float32), requires_grad=True), torch.ones(2, 0, requires_grad=True)
    x.logsumexp(1).sum().backward()
    tx.logsumexp(1).sum().backward()
    assert x.grad is not None
    _compare(x.grad, tx.grad)


@pytest.mark.parametrize(("lq", "lk"), [(0, 0), (0, 3), (2, 0)])
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_attention_with_an_empty_sequence_matches_torch(lq: int, lk: int, mask: str) -> None:
    """No queries: an empty result; no keys: zeros (torch's softmax over nothing is empty, its matmul is 0)."""
    q, k, v = np.ones((2, lq, 4), np.float32), np.ones((2, lk, 4), np.float32), np.ones((2, lk, 3), np.float32)
    masks = {"none": None, "causal": None, "bool": np.ones((lq, lk), bool), "float": np.zeros((lq, lk), np.float32)}
    m = masks[mask]
    got = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), None if m is None else Tensor(m),
                                                 is_causal=mask == "causal")
    want = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), None if m is None else torch.from_numpy(m),
        is_causal=mask == "causal")
    _compare(got, want)


# ---- item 13: corner cases decided as torch decides them ---------------------------------------------------------

INF = float("inf")


@pytest.mark.parametrize("row", [[1.0, INF, 2.0], [-INF, -INF], [INF, INF], [1.0, -INF, 3.0], [INF, -INF, 0.0]],
                         ids=str)
def test_log_softmax_with_infinities_matches_torch(row: list[float]) -> None:
    """A row whose max is +inf or -inf is all NaN in torch ((x - max) is NaN there), not -inf beside a NaN."""
    _compare(Tensor(row).log_softmax(0), torch.tensor(row).log_softmax(0))
    _compare(Tensor([row, [1.0] * len(row)]).log_softmax(1), torch.tensor([row, [1.0] * len(row)]).log_softmax(1))


# ---- numpy scalars are numbers (issue 13 item 13) ---------------------------------------------------------------

NUMPY_SCALARS = [np.float32(2.5), np.float64(-1.25), np.float16(0.5), np.int64(3), np.int16(-2), np.uint8(7)]


@pytest.mark.parametrize("scalar", NUMPY_SCALARS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("dtype", ["float32", "int32", "int8"])
@pytest.mark.parametrize("op", ["add", "rsub", "maximum", "eq"])
def test_numpy_scalar_operand_acts_as_the_number_it_holds_like_torch(scalar: Any, dtype: str, op: str) -> None:
    x = np.array([1, -2, 3], dtype=dtype)
    apply = {"add": lambda t: t + scalar, "mul": lambda t: t * scalar, "rsub": lambda t: scalar - t,
             "maximum": lambda t: t.maximum(scalar) if isinstance(t, Tensor) else torch.maximum(t, torch.tensor(
                 scalar.item())), "eq": lambda t: t == scalar}[op]
    want = apply(torch.from_numpy(x))
    got = apply(Tensor(x))
    assert isinstance(got, Tensor)
    if op != "maximum": assert str(got.dtype).split(".")[-1] == str(want.dtype).split(".")[-1]
    np.testing.assert_allclose(got.numpy(), want.numpy())


# ---- reading a value changes nothing for backward ----------------------------------------------------------------

MADE = {"clone": (lambda x: x.clone(), lambda t: t.clone()),
        "contiguous": (lambda x: (x * 2).contiguous(), lambda t: (t * 2).contiguous()),
        "realize": (lambda x: (x * 2).realize(), lambda t: t * 2),
        "elementwise": (lambda x: x * 2, lambda t: t * 2)}


@pytest.mark.parametrize("made", MADE)
@pytest.mark.parametrize("read", ["tolist", "numpy", "realize"])
def test_reading_a_tensor_keeps_its_gradient_like_torch(made: str, read: str) -> None:
    """Reading (or realizing) a tensor computed from one that requires grad stored it and cut it from its graph:
    a later backward() found no tensor that requires grad (torch: reading changes nothing)."""
    ours, theirs = MADE[made]
    x, tx = Tensor([1.0, 2.0, 3.0], requires_grad=True), torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y, ty = ours(x), theirs(tx)
    getattr(y, read)()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy())
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


@pytest.mark.parametrize("op", [
    pytest.param(lambda t: t.flip(0), id="flip_size_1"),
    pytest.param(lambda t: t.roll(0, 0), id="roll_0"),
    pytest.param(lambda t: t.roll(2, 1), id="roll_by_the_size"),
    pytest.param(lambda t: t.pad((0, 0, 0, 0)) if isinstance(t, Tensor) else torch.nn.functional.pad(t, (0, 0, 0, 0)),
                 id="pad_0"),
    pytest.param(lambda t: Tensor.cat(t) if isinstance(t, Tensor) else torch.cat([t]), id="cat_of_one"),
])
def test_a_write_to_a_copying_ops_result_leaves_its_input_like_torch(op: Callable[[Any], Any]) -> None:
    """flip, roll, pad and cat copy in torch even when they change nothing; ember returned the input object itself,
    so a setitem on the result changed the input (found by the random-program fuzzer's review)."""
    x, tx = Tensor([[1.0, 2.0]]) * 1, torch.tensor([[1.0, 2.0]]) * 1
    y, ty = op(x), op(tx)
    y[0, 0] = 5.0
    ty[0, 0] = 5.0
    np.testing.assert_array_equal(x.numpy(), tx.numpy())
    np.testing.assert_array_equal(y.numpy(), ty.numpy())
