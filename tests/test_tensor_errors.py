"""User errors raised by Tensor methods: the exception class and a message naming the op and the values involved.

Messages read `<op>: <what is wrong>: <values>; <what is valid>` (ember/errors.py); each case matches the op name
and the values in the order the message gives them. Errors are raised before any kernel is built or run.
"""

from __future__ import annotations

import re

import pytest

from ember import GlobalCounters, Tensor
from ember.errors import DeviceError, DTypeError, EmberError, ShapeError


def parts(*fragments: str) -> str:
    """A regex matching the literal fragments in this order, anything between them."""
    return ".*".join(re.escape(f) for f in fragments)


def ones(*shape: int) -> Tensor:
    return Tensor.ones(*shape)


BROADCAST = [
    ("add", lambda: ones(3) + ones(4), "(3,)", "(4,)"),
    ("sub", lambda: ones(3) - ones(4), "(3,)", "(4,)"),
    ("mul", lambda: ones(2, 3) * ones(3, 2), "(2, 3)", "(3, 2)"),
    ("div", lambda: ones(3) / ones(4), "(3,)", "(4,)"),
    ("div", lambda: ones(3) // ones(4), "(3,)", "(4,)"),
    ("lt", lambda: ones(3) < ones(4), "(3,)", "(4,)"),
    ("eq", lambda: ones(3).eq(ones(4)), "(3,)", "(4,)"),
    ("ne", lambda: ones(3).ne(ones(4)), "(3,)", "(4,)"),
    ("maximum", lambda: ones(3).maximum(ones(4)), "(3,)", "(4,)"),
    ("minimum", lambda: ones(3).minimum(ones(4)), "(3,)", "(4,)"),
    ("and", lambda: Tensor([1, 2, 3]) & Tensor([1, 2]), "(3,)", "(2,)"),
    ("add", lambda: ones(2, 0) + ones(3, 1), "(2, 0)", "(3, 1)"),
    ("add", lambda: ones(5, 3) + ones(2, 1, 4), "(5, 3)", "(2, 1, 4)"),
    ("where", lambda: Tensor([True, False, True]).where(ones(4), 0), "(3,)", "(4,)"),
]


@pytest.mark.parametrize("op, fn, shape_a, shape_b", BROADCAST, ids=[f"{b[0]}{b[2]}{b[3]}" for b in BROADCAST])
def test_broadcast_mismatch_raises_shape_error_naming_op_and_both_shapes(op, fn, shape_a, shape_b):
    with pytest.raises(ShapeError, match=parts(f"{op}:", shape_a, shape_b)):
        fn()


def test_shape_error_is_a_value_error_and_an_ember_error():
    with pytest.raises(ValueError):
        ones(3) + ones(4)
    with pytest.raises(EmberError):
        ones(3) + ones(4)


@pytest.mark.parametrize("fn, fragments", [
    (lambda: ones(2, 3).reshape(7), ("reshape:", "(2, 3)", "6", "(7,)", "7")),
    (lambda: ones(3).reshape(2, 2), ("reshape:", "(3,)", "3", "(2, 2)", "4")),
    (lambda: ones(3, 4).T.reshape(5, 2), ("reshape:", "(4, 3)", "12", "(5, 2)", "10")),
    (lambda: ones(2, 3).reshape(-1, 4), ("reshape:", "(-1, 4)", "6")),
    (lambda: ones(0).reshape(-1, 0), ("reshape:", "(-1, 0)", "0")),
    (lambda: ones(3).reshape(-1, -1), ("reshape:", "-1", "(-1, -1)")),
    (lambda: ones(6).reshape(2, -2), ("reshape:", "(2, -2)")),
    (lambda: ones(6).reshape(2.0, 3), ("reshape:", "(2.0, 3)")),
], ids=["sizes", "sizes_2", "view", "infer", "infer_zero", "two_infer", "negative", "float"])
def test_reshape_to_incompatible_size_names_both_sizes(fn, fragments):
    with pytest.raises(ShapeError, match=parts(*fragments)):
        fn()


@pytest.mark.parametrize("fn, fragments", [
    (lambda: ones(3, 4) @ ones(5, 6), ("matmul:", "(3, 4)", "(5, 6)", "4", "5")),
    (lambda: ones(3) @ ones(4), ("matmul:", "(3,)", "(4,)")),
    (lambda: ones(3, 4) @ ones(3, 4), ("matmul:", "(3, 4) @ (3, 4)")),
    (lambda: ones(2, 3, 4).matmul(ones(5)), ("matmul:", "(2, 3, 4)", "(5,)")),
    (lambda: Tensor(2.0) @ ones(3), ("matmul:", "()", "(3,)")),
    (lambda: ones(3).matmul([1, 2, 3]), ("matmul:", "list")),
], ids=["2d", "1d", "same_shape", "batched_vector", "0d", "not_tensor"])
def test_matmul_shape_mismatch_names_both_shapes(fn, fragments):
    with pytest.raises(ShapeError, match=parts(*fragments)):
        fn()


def test_matmul_batch_mismatch_names_matmul_and_the_operand_shapes():
    with pytest.raises(ShapeError, match=parts("matmul:", "(2, 3, 4)", "(3, 4, 5)")):
        ones(2, 3, 4) @ ones(3, 4, 5)


@pytest.mark.parametrize("device", ["FOO", "gpu:0", "metal"])
def test_unknown_device_raises_device_error_naming_available_devices(device):
    with pytest.raises(DeviceError, match=parts(repr(device), "available", "CPU")):
        Tensor([1], device=device)
    with pytest.raises(DeviceError, match="CPU"):
        Tensor.ones(2, device=device)


def test_device_names_are_case_insensitive_and_take_an_index():
    assert Tensor([1], device="cpu:0").device == "CPU"


AXIS_ERRORS = [
    ("sum", lambda: ones(3, 4).sum(axis=2), "2", "(3, 4)"),
    ("sum", lambda: ones(3, 4).sum(axis=(0, 5)), "5", "(3, 4)"),
    ("sum", lambda: Tensor(1.0).sum(1), "1", "()"),
    ("max", lambda: ones(3, 4).max(axis=-3), "-3", "(3, 4)"),
    ("min", lambda: ones(3, 4).min(axis=2), "2", "(3, 4)"),
    ("mean", lambda: ones(3, 4).mean(axis=-3), "-3", "(3, 4)"),
    ("prod", lambda: ones(3).prod(axis=1), "1", "(3,)"),
    ("permute", lambda: ones(3).permute(1), "1", "(3,)"),
    ("transpose", lambda: ones(3, 4).transpose(0, 2), "2", "(3, 4)"),
    ("flip", lambda: ones(3, 4).flip(2), "2", "(3, 4)"),
    ("squeeze", lambda: ones(3, 4).squeeze(-3), "-3", "(3, 4)"),
    ("unsqueeze", lambda: ones(3, 4).unsqueeze(3), "3", "(3, 4)"),
    ("flatten", lambda: ones(3, 4).flatten(2), "2", "(3, 4)"),
]


@pytest.mark.parametrize("op, fn, axis, shape", AXIS_ERRORS, ids=[f"{a[0]}{a[2]}" for a in AXIS_ERRORS])
def test_bad_axis_raises_shape_error_naming_op_axis_and_shape(op, fn, axis, shape):
    with pytest.raises(ShapeError, match=parts(f"{op}: axis {axis}", shape, "valid axes")):
        fn()


def test_flatten_with_start_after_end_raises():
    with pytest.raises(ShapeError, match="flatten"):
        ones(2, 3, 4).flatten(2, 1)


@pytest.mark.parametrize("fn, fragments", [
    (lambda: ones(3, 4).permute(0, 0), ("permute:", "(0, 0)", "(3, 4)")),
    (lambda: ones(3, 4).permute(0), ("permute:", "(0,)", "(3, 4)")),
    (lambda: ones(3, 1).expand(2, 4), ("expand:", "(3, 1)", "(2, 4)")),
    (lambda: ones(3, 2).expand(3), ("expand:", "(3,)", "(3, 2)")),
    (lambda: ones(3).pad(((1, 1), (1, 1))), ("pad:", "2", "(3,)")),
    (lambda: ones(3).pad((1, 1, 1)), ("pad:", "(1, 1, 1)", "(3,)")),
    (lambda: ones(3).pad((1, 1, 1, 1)), ("pad:", "(1, 1, 1, 1)", "(3,)")),
    (lambda: ones(3, 4).shrink(((0, 4), None)), ("shrink:", "(0, 4)", "(3, 4)")),
    (lambda: ones(3, 4).shrink(((2, 1), None)), ("shrink:", "(2, 1)", "(3, 4)")),
    (lambda: ones(3, 4).shrink(((0, 1),)), ("shrink:", "1", "(3, 4)")),
    (lambda: ones(0).max(), ("max:", "0", "(0,)")),
    (lambda: ones(3, 0).min(1), ("min:", "1", "(3, 0)")),
    (lambda: Tensor.ones(2, -3), ("ones:", "(2, -3)")),
    (lambda: Tensor.zeros(-1), ("zeros:", "(-1,)")),
    (lambda: Tensor([[1, 2], [3]]), ("Tensor:", "rectangular")),
], ids=["permute_repeat", "permute_short", "expand_size", "expand_rank", "pad_pairs", "pad_flat_odd", "pad_flat_long",
        "shrink_past_end", "shrink_reversed", "shrink_rank", "max_empty", "min_empty", "ones_negative",
        "zeros_negative", "ragged_list"])
def test_movement_reduce_and_creation_errors_name_op_and_values(fn, fragments):
    with pytest.raises(ShapeError, match=parts(*fragments)):
        fn()


def test_negative_padding_larger_than_the_axis_is_reported_by_pad():
    with pytest.raises(ShapeError, match=parts("pad:", "(3,)")):
        ones(3).pad((-2, -2))


def test_eye_with_negative_size_raises_shape_error():
    with pytest.raises(ShapeError, match="eye"):
        Tensor.eye(-1)


@pytest.mark.parametrize("fn, fragments", [
    (lambda: ones(2, 3).item(), ("item:", "6", "(2, 3)")),
    (lambda: ones(0).item(), ("item:", "0", "(0,)")),
    (lambda: ones(3, 1).item(), ("item:", "3", "(3, 1)")),
])
def test_item_on_a_tensor_without_exactly_one_element_raises(fn, fragments):
    with pytest.raises(ShapeError, match=parts(*fragments)):
        fn()


INDEX_ERRORS = [
    (lambda: Tensor([1, 2, 3])[3], ("3", "axis 0", "size 3")),
    (lambda: Tensor([1, 2, 3])[-4], ("-4", "axis 0", "size 3")),
    (lambda: ones(2, 3)[0, 5], ("5", "axis 1", "size 3")),
    (lambda: ones(3)[None, None, 5], ("5", "axis 0", "size 3")),
    (lambda: ones(0)[0], ("0", "axis 0", "size 0")),
    (lambda: ones(2, 3)[0, 0, 0], ("too many indices", "(2, 3)")),
    (lambda: Tensor(3.0)[0], ("too many indices", "()")),
    (lambda: ones(2, 3)[..., ...], ("ellipsis",)),
    (lambda: ones(2, 3)[[0.5, 1]], ("must be int or bool", "float64")),
    (lambda: ones(2, 3)[Tensor([0, 2])], ("2", "axis 0", "size 2")),
    (lambda: ones(2, 3)[:, Tensor([[-4]])], ("-4", "axis 1", "size 3")),
    (lambda: ones(2, 3)[1.5], ("unsupported index", "1.5")),
    (lambda: Tensor([1, 2])["a"], ("unsupported index", "'a'")),
    (lambda: ones(3, 4)[Tensor([True, False])], ("mask of shape (2,)", "(3,)")),
]


@pytest.mark.parametrize("fn, fragments", INDEX_ERRORS, ids=range(len(INDEX_ERRORS)))
def test_indexing_out_of_bounds_or_unsupported_raises_index_error(fn, fragments):
    with pytest.raises(IndexError, match=parts("index:", *fragments)):
        fn()


@pytest.mark.parametrize("fn, fragments", [
    (lambda: ones(3) & ones(3), ("and:", "float32")),
    (lambda: ~ones(3), ("invert:", "float32")),
    (lambda: Tensor([True, False]).neg(), ("neg:", "bool")),
    (lambda: ones(3).bitcast("int64"), ("bitcast:", "float32", "4", "int64", "8")),
    (lambda: Tensor.ones(3, dtype="foo"), ("dtype:", "'foo'", "float32")),
    (lambda: ones(3).cast("int128"), ("dtype:", "'int128'")),
    (lambda: ones(3) + "a", ("'a'",)),
    (lambda: Tensor(object()), ("Tensor:", "object")),
    (lambda: Tensor([1], dtype="int8") + Tensor([1], dtype="uint64"), ("promote:", "int8", "uint64")),
], ids=["and_float", "invert_float", "neg_bool", "bitcast_size", "unknown_dtype", "unknown_cast", "str_operand",
        "object_data", "no_common_type"])
def test_dtype_errors_raise_dtype_error_naming_op_and_dtypes(fn, fragments):
    with pytest.raises(DTypeError, match=parts(*fragments)):
        fn()


def test_dtype_error_is_a_type_error():
    with pytest.raises(TypeError):
        ones(3) & ones(3)


@pytest.mark.parametrize("fn, exc, match", [
    (lambda: bool(ones(3)), ValueError, "ambiguous"),
    (lambda: len(Tensor(1.0)), TypeError, "0-d"),
    (lambda: Tensor.arange(0, 5, 0), ValueError, "arange: step"),
    (lambda: ones(3).div(ones(3), rounding_mode="x"), ValueError, "rounding_mode"),
], ids=["bool_many", "len_0d", "arange_step", "rounding_mode"])
def test_python_protocol_errors(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()


def test_errors_are_raised_before_any_kernel_runs():
    before = GlobalCounters.kernel_count
    with pytest.raises(ShapeError):
        (ones(3) * 2).exp() + ones(4)
    assert GlobalCounters.kernel_count == before
