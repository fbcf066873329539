"""Sizes and axes given as arguments are read as torch reads them, with torch (CPU) as the oracle.

A size (reshape, view, expand, broadcast_to, repeat, unflatten and the constructors zeros, ones, full, empty, eye,
rand, randn) is an int, a numpy int or a one-element int tensor; a float, None or a bool is refused with a TypeError,
as torch's "must be tuple of ints" (ember's SizeTypeError, also a ShapeError as ember raised before). An axis
(permute, transpose, flip, squeeze, unsqueeze, flatten, reductions, scans, gather, ...) is an int or a numpy int; a
float, a bool, or None where None is not "every axis" (nor ember's default axis) is a TypeError, as torch's.
expand_as and broadcast_to follow torch's expand rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from ember import Tensor
from ember.errors import ShapeError, SizeTypeError

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
NUMPY_INTS = [np.int64(3), np.int32(3), np.uint8(3), np.int16(3)]
NOT_INTS = [3.0, None, True, np.float64(3.0), np.bool_(True)]


def _ids(values: list[Any]) -> list[str]:
    return [f"{type(v).__name__}" for v in values]


# ---- sizes ----------------------------------------------------------------------------------------------------------

# each maker is called as make(lib, n) where lib is torch or ember's Tensor and n stands for the size 3
SIZE_MAKERS: dict[str, Callable[[Any, Any], Any]] = {
    "reshape": lambda lib, n: tensor(lib, np.arange(6.0, dtype=np.float32)).reshape(n, 2),
    "reshape_tuple": lambda lib, n: tensor(lib, np.arange(6.0, dtype=np.float32)).reshape((n, 2)),
    "reshape_one": lambda lib, n: tensor(lib, np.arange(3.0, dtype=np.float32)).reshape(n),
    "view": lambda lib, n: tensor(lib, np.arange(6.0, dtype=np.float32)).view(n, 2),
    "zeros": lambda lib, n: lib.zeros(n, 2),
    "zeros_tuple": lambda lib, n: lib.zeros((n, 2)),
    "ones": lambda lib, n: lib.ones(n),
    "full": lambda lib, n: lib.full((n, 2), 1.5),
    "full_one": lambda lib, n: lib.full(n, 1.5) if lib is Tensor else lib.full((n,), 1.5),
    "empty": lambda lib, n: lib.empty(n, 2),
    "rand": lambda lib, n: lib.rand(n, 2),
    "randn": lambda lib, n: lib.randn((n, 2)),
    "eye": lambda lib, n: lib.eye(n),
    "expand": lambda lib, n: tensor(lib, np.ones((1, 2), np.float32)).expand(n, 2),
    "broadcast_to": lambda lib, n: tensor(lib, np.ones(2, np.float32)).broadcast_to((n, 2)),
    "repeat": lambda lib, n: tensor(lib, np.arange(2.0, dtype=np.float32)).repeat(n),
    "unflatten": lambda lib, n: tensor(lib, np.arange(6.0, dtype=np.float32)).unflatten(0, (n, 2)),
}
NOT_COMPARED = {"empty", "rand", "randn"}  # values not compared (unspecified or another generator)
SIZE_OP_NAMES = {"view": "reshape", "reshape_tuple": "reshape", "reshape_one": "reshape", "zeros_tuple": "zeros",
                 "full_one": "full"}  # the op an error names, where the case's name is not it


def tensor(lib: Any, a: np.ndarray) -> Any:
    return torch.from_numpy(a.copy()) if lib is torch else Tensor(a)


@pytest.mark.parametrize("n", NUMPY_INTS, ids=_ids(NUMPY_INTS))
@pytest.mark.parametrize("op", [op for op in SIZE_MAKERS if op != "expand"])  # expand took them (a3e0b26)
def test_a_numpy_int_is_a_size_as_in_torch(op: str, n: Any) -> None:
    # reshape(np.int64(3), 2) raised ShapeError and Tensor.ones(np.int64(3)) ShapeError; torch takes numpy ints
    want, got = SIZE_MAKERS[op](torch, n), SIZE_MAKERS[op](Tensor, n)
    assert got.shape == tuple(want.shape)
    assert all(type(s) is int for s in got.shape)  # Python ints in the shape, not numpy ones
    if op not in NOT_COMPARED: np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("op", ["reshape", "ones", "eye", "broadcast_to"])
def test_a_one_element_int_tensor_is_a_size_as_in_torch(op: str) -> None:
    want, got = SIZE_MAKERS[op](torch, torch.tensor(3)), SIZE_MAKERS[op](Tensor, Tensor(3))
    assert got.shape == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("n", NOT_INTS, ids=_ids(NOT_INTS))
@pytest.mark.parametrize("op", list(SIZE_MAKERS))
def test_a_size_that_is_not_an_int_is_a_type_error_as_in_torch(op: str, n: Any) -> None:
    # a bool was taken as 1 (Tensor.ones(True) had shape (1,)), eye(3.0) failed inside reshape; torch refuses each
    with pytest.raises(TypeError): SIZE_MAKERS[op](torch, n)
    with pytest.raises(SizeTypeError, match=rf"^{SIZE_OP_NAMES.get(op, op)}: sizes must be ints, got \(.*\)") as got:
        SIZE_MAKERS[op](Tensor, n)
    assert isinstance(got.value, TypeError) and isinstance(got.value, ShapeError)


def test_a_bool_is_no_size_or_axis_in_any_position() -> None:
    # torch's argument parser checks the type of a sequence's first element only, and takes a later bool as an int
    # (torch.arange(6.0).reshape((2, True, 3)) has shape (2, 1, 3)); ember refuses a bool wherever it is
    assert torch.arange(6.0).reshape((2, True, 3)).shape == (2, 1, 3)
    with pytest.raises(SizeTypeError, match=r"^reshape: sizes must be ints, got \(2, True, 3\) \(bool True\)"):
        Tensor.arange(6.0).reshape((2, True, 3))
    with pytest.raises(SizeTypeError, match=r"^zeros: sizes must be ints"): Tensor.zeros((2, np.bool_(True)))
    with pytest.raises(TypeError, match=r"^sum: axis must be an int, got True \(bool\)"): Tensor(X).sum((0, True))
    with pytest.raises(TypeError, match=r"^permute: axis must be an int"): Tensor(X).permute((1, False, 2))


def test_size_type_error_is_each_builtin_torch_and_ember_raised() -> None:
    assert issubclass(SizeTypeError, TypeError) and issubclass(SizeTypeError, ShapeError)
    assert issubclass(SizeTypeError, ValueError) and issubclass(SizeTypeError, RuntimeError)


def test_linspace_steps_is_a_size_and_negative_sizes_stay_shape_errors() -> None:
    np.testing.assert_array_equal(Tensor.linspace(0, 1, np.int64(5)).numpy(),
                                  torch.linspace(0, 1, np.int64(5)).numpy())
    for steps in NOT_INTS:
        with pytest.raises(TypeError): torch.linspace(0, 1, steps)
        with pytest.raises(SizeTypeError, match=r"^linspace: sizes must be ints"): Tensor.linspace(0, 1, steps)
    for make in (lambda lib: lib.linspace(0, 1, np.int64(-1)), lambda lib: lib.ones(np.int64(-1)),
                 lambda lib: lib.eye(np.int64(-2))):  # a negative size stays a ShapeError, as torch's RuntimeError
        with pytest.raises(RuntimeError): make(torch)
        with pytest.raises(ShapeError) as got: make(Tensor)
        assert not isinstance(got.value, TypeError)


# ---- axes -----------------------------------------------------------------------------------------------------------

def _gather(x: Any, a: Any) -> Any:
    index = torch.zeros((2, 1, 4), dtype=torch.int64) if isinstance(x, torch.Tensor) else \
        Tensor.zeros((2, 1, 4), dtype="int64")
    return x.gather(a, index)


# ops whose axes reached Tensor._axis unchecked: permute(1.0, 0, 2) was permute(1, 0, 2), transpose(True, 0) was
# transpose(1, 0), unsqueeze(None) failed inside a comparison
UNCHECKED_AXIS_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "permute": lambda x, a: x.permute(a, 0, 2),
    "permute_tuple": lambda x, a: x.permute((a, 2, 0)),
    "transpose": lambda x, a: x.transpose(a, 0),
    "unsqueeze": lambda x, a: x.unsqueeze(a),
    "flatten": lambda x, a: x.flatten(a),
    "size": lambda x, a: x.size(a),
    "gather": _gather,
}
# ops that refused a float axis already, but took a bool as an int: sum(True) was sum(1)
BOOL_AXIS_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "flip": lambda x, a: x.flip(a),
    "flip_list": lambda x, a: x.flip([a, 0]),
    "squeeze": lambda x, a: x.squeeze(a),
    "sum": lambda x, a: x.sum(a),
    "sum_dim": lambda x, a: x.sum(dim=a),
    "sum_tuple": lambda x, a: x.sum((a, 0)),
    "mean": lambda x, a: x.mean(a),
    "max": lambda x, a: x.max(a)[0],
    "argmax": lambda x, a: x.argmax(a),
    "cumsum": lambda x, a: x.cumsum(a),
    "softmax": lambda x, a: x.softmax(a),
    "logsumexp": lambda x, a: x.logsumexp(a),
}


@pytest.mark.parametrize("axis", [1.0, True, np.float64(1.0), np.bool_(True), None],
                         ids=["float", "bool", "numpy_float", "numpy_bool", "none"])
@pytest.mark.parametrize("op", list(UNCHECKED_AXIS_OPS))
def test_an_axis_that_is_not_an_int_is_a_type_error_as_in_torch(op: str, axis: Any) -> None:
    if axis is None and op == "size": pytest.skip("size(None) is the whole shape, in torch as in ember")
    with pytest.raises(TypeError): UNCHECKED_AXIS_OPS[op](torch.from_numpy(X.copy()), axis)
    with pytest.raises(TypeError, match=rf"^{op.split('_')[0]}: axis must be an int"):
        UNCHECKED_AXIS_OPS[op](Tensor(X), axis)


@pytest.mark.parametrize("op", list(BOOL_AXIS_OPS))
def test_a_bool_axis_is_a_type_error_as_in_torch(op: str) -> None:
    with pytest.raises(TypeError): BOOL_AXIS_OPS[op](torch.from_numpy(X.copy()), True)
    with pytest.raises(TypeError, match=r"^\w+: axis must be an int"): BOOL_AXIS_OPS[op](Tensor(X), True)


def test_a_numpy_int_axis_is_a_python_int_inside() -> None:
    # the axes of the permute node were numpy ints (np.int64(1) compared equal, but is no int for the graph's arg)
    got = Tensor(X).permute(np.int64(1), 0, 2)
    assert got.uop.arg == (1, 0, 2) and all(type(a) is int for a in got.uop.arg)
    np.testing.assert_array_equal(got.numpy(), torch.from_numpy(X.copy()).permute(np.int64(1), 0, 2).numpy())


# ---- expand_as and broadcast_to ------------------------------------------------------------------------------------

BROADCASTS = [((3,), (2, 3)), ((1, 3), (4, 3)), ((2, 1), (2, 5)), ((3,), (-1,)), ((3,), (2, -1)), ((), ()),
              ((), (2, 3)), ((1,), (0,)), ((2, 1, 3), (4, 2, 2, 3)), ((1, 3), (np.int64(2), 3))]


@pytest.mark.parametrize("shape, size", BROADCASTS, ids=[f"{a}->{b}" for a, b in BROADCASTS])
def test_broadcast_to_is_torchs(shape: tuple[int, ...], size: tuple[Any, ...]) -> None:
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    want = torch.broadcast_to(torch.from_numpy(x), size)
    for got in (Tensor(x).broadcast_to(size), Tensor(x).broadcast_to(*size), Tensor.broadcast_to(Tensor(x), size)):
        assert got.shape == tuple(want.shape)
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("shape, size", [((2, 3), (3,)), ((3,), (-1, 3)), ((2, 3), (3, 3)), ((3,), (-2, 3)),
                                         ((1,), ())], ids=["fewer_axes", "new_minus_one", "grow_3", "minus_two",
                                                           "to_0d"])
def test_broadcast_to_refuses_what_torch_refuses(shape: tuple[int, ...], size: tuple[int, ...]) -> None:
    with pytest.raises(RuntimeError): torch.broadcast_to(torch.zeros(shape), size)
    with pytest.raises(ShapeError, match=r"^broadcast_to: "): Tensor.zeros(shape).broadcast_to(size)


@pytest.mark.parametrize("shape, other", [((3,), (2, 3)), ((1, 3), (4, 3)), ((2, 1), (2, 5)), ((), (2,)),
                                          ((2, 3), (2, 3)), ((1,), (0,))])
def test_expand_as_is_expand_to_the_other_shape(shape: tuple[int, ...], other: tuple[int, ...]) -> None:
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    y = np.zeros(other, np.float32)
    want = torch.from_numpy(x).expand_as(torch.from_numpy(y))
    got = Tensor(x).expand_as(Tensor(y))
    assert got.shape == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_expand_as_refuses_what_torch_refuses() -> None:
    with pytest.raises(RuntimeError): torch.zeros(3).expand_as(torch.zeros(2, 4))
    with pytest.raises(ShapeError, match=r"^expand_as: cannot expand \(3,\) to \(2, 4\)"):
        Tensor.zeros(3).expand_as(Tensor.zeros(2, 4))
    with pytest.raises(TypeError): torch.zeros(3).expand_as((2, 3))
    with pytest.raises(TypeError, match=r"^expand_as: expected a Tensor, got tuple"): Tensor.zeros(3).expand_as((2, 3))


def test_expand_as_and_broadcast_to_carry_gradients_as_torch() -> None:
    x = np.array([[1.0], [2.0]], np.float32)
    tx = torch.from_numpy(x.copy()).requires_grad_()
    (tx.expand_as(torch.zeros(2, 3)) * torch.arange(6.0).reshape(2, 3)).sum().backward()
    ex = Tensor(x, requires_grad=True)
    (ex.expand_as(Tensor.zeros(2, 3)) * Tensor.arange(6.0).reshape(2, 3)).sum().backward()
    np.testing.assert_array_equal(ex.grad.numpy(), tx.grad.numpy())
    tx.grad = None
    tx.broadcast_to((4, 2, 3)).sum().backward()
    ey = Tensor(x, requires_grad=True)
    ey.broadcast_to((4, 2, 3)).sum().backward()
    np.testing.assert_array_equal(ey.grad.numpy(), tx.grad.numpy())


@pytest.mark.parametrize("n", NUMPY_INTS, ids=_ids(NUMPY_INTS))
def test_split_and_repeat_interleave_take_numpy_ints(n: Any) -> None:
    # both refused them (split took a numpy int for a list of sections and failed inside sum()); torch takes a list
    # of numpy ints and repeat_interleave(np.int64(3)); split(np.int64(2)) it refuses, an accident of its dispatch
    x = np.arange(6.0, dtype=np.float32)
    want = torch.from_numpy(x).split([int(n), 6 - int(n)])
    got = Tensor(x).split([n, 6 - int(n)])
    assert [p.shape for p in got] == [tuple(p.shape) for p in want]
    for g, w in zip(got, want, strict=True): np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert [p.shape for p in Tensor(x).split(n)] == [tuple(p.shape) for p in torch.from_numpy(x).split(int(n))]
    np.testing.assert_array_equal(Tensor(x).repeat_interleave(n).numpy(),
                                  torch.from_numpy(x).repeat_interleave(n).numpy())


@pytest.mark.parametrize("n", NOT_INTS, ids=_ids(NOT_INTS))
def test_split_and_repeat_interleave_refuse_what_is_not_an_int(n: Any) -> None:
    x = np.arange(6.0, dtype=np.float32)
    with pytest.raises(TypeError): torch.from_numpy(x).split(n)
    with pytest.raises(SizeTypeError, match=r"^split: sizes must be ints"): Tensor(x).split(n)
    with pytest.raises(SizeTypeError, match=r"^split: sizes must be ints"): Tensor(x).split([n, 3])
    with pytest.raises(TypeError): torch.from_numpy(x).repeat_interleave(n)
    with pytest.raises(SizeTypeError, match=r"^repeat_interleave: sizes must be ints"): Tensor(x).repeat_interleave(n)
