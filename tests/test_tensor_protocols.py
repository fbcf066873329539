"""Tensor's Python and PyTorch protocols: the requires_grad attribute and keyword, assign, in-place ops, conversions
(float, int, bool, index, numpy), repr, dtype inference for large ints, empty and contiguous without kernels.

Each behavior is checked against torch 2.13 (the oracle) where torch has it: same values, same exception class.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import GlobalCounters, Tensor, dtypes, no_grad
from ember.device import Device
from ember.engine import realize as engine
from ember.errors import AxisError, DTypeError, EmberError, ShapeError
from ember.export import Arg, NumericalFunction

# ---- requires_grad -------------------------------------------------------------------------------------------------


def test_setting_requires_grad_makes_backward_fill_grad_as_torch():
    w, tw = Tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0])
    w.requires_grad, tw.requires_grad = True, True
    (w * w).sum().backward()
    (tw * tw).sum().backward()
    assert w.requires_grad is True
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy())


def test_setting_requires_grad_false_drops_the_tensor_from_backward():
    w, v = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0], requires_grad=True)
    w.requires_grad = False
    (w.sum() * v).sum().backward()
    assert w.requires_grad is False and w.grad is None and v.grad.tolist() == [3.0]


CREATORS = {
    "zeros": lambda **k: Tensor.zeros(2, 3, **k),
    "ones": lambda **k: Tensor.ones(2, 3, **k),
    "full": lambda **k: Tensor.full((2, 3), 0.5, **k),
    "empty": lambda **k: Tensor.empty(2, 3, **k),
    "arange": lambda **k: Tensor.arange(0.0, 3.0, **k),
    "eye": lambda **k: Tensor.eye(3, **k),
    "linspace": lambda **k: Tensor.linspace(0, 1, 5, **k),
    "zeros_like": lambda **k: Tensor.ones(2).zeros_like(**k),
    "ones_like": lambda **k: Tensor.ones(2).ones_like(**k),
    "full_like": lambda **k: Tensor.ones(2).full_like(7.0, **k),
    "empty_like": lambda **k: Tensor.ones(2).empty_like(**k),
    "rand": lambda **k: Tensor.rand(2, 3, **k),
    "randn": lambda **k: Tensor.randn(2, 3, **k),
    "uniform": lambda **k: Tensor.uniform(2, 3, low=-1.0, high=1.0, **k),
    "normal": lambda **k: Tensor.normal(2, 3, mean=1.0, **k),
    "rand_like": lambda **k: Tensor.ones(2).rand_like(**k),
    "randn_like": lambda **k: Tensor.ones(2).randn_like(**k),
    "kaiming_uniform": lambda **k: Tensor.kaiming_uniform(4, 3, **k),
    "kaiming_normal": lambda **k: Tensor.kaiming_normal(4, 3, **k),
    "glorot_uniform": lambda **k: Tensor.glorot_uniform(4, 3, **k),
    "scaled_uniform": lambda **k: Tensor.scaled_uniform(4, 3, **k),
}


@pytest.mark.parametrize("name", CREATORS)
def test_creators_take_requires_grad_and_make_a_leaf(name):
    t = CREATORS[name](requires_grad=True)
    assert t.requires_grad is True
    (t * 3).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), np.full(t.shape, 3.0, np.float32))


@pytest.mark.parametrize("make, oracle", [
    (lambda: Tensor([1, 2], requires_grad=True), lambda: torch.tensor([1, 2], requires_grad=True)),
    (lambda: Tensor.zeros(2, dtype="int32", requires_grad=True),
     lambda: torch.zeros(2, dtype=torch.int32, requires_grad=True)),
    (lambda: Tensor.arange(3, requires_grad=True), lambda: torch.arange(3, requires_grad=True)),
    (lambda: Tensor.randint(3, requires_grad=True), lambda: torch.randint(10, (3,), requires_grad=True)),
    (lambda: Tensor.ones(2, dtype="bool").requires_grad_(), lambda: torch.ones(2, dtype=torch.bool).requires_grad_()),
], ids=["list", "zeros", "arange", "randint", "bool"])
def test_requires_grad_on_a_non_float_tensor_raises_runtime_error_as_torch(make, oracle):
    with pytest.raises(RuntimeError, match="floating point"):
        oracle()
    with pytest.raises(DTypeError, match="requires_grad_: only tensors of floating point dtype .*: got"):
        make()


def test_setting_requires_grad_on_an_int_tensor_raises():
    t = Tensor([1, 2])
    with pytest.raises(RuntimeError, match="floating point"):
        t.requires_grad = True
    assert t.requires_grad is None


# ---- assign --------------------------------------------------------------------------------------------------------


def test_assigning_a_new_learning_rate_each_step_compiles_kernels_only_in_the_first_step():
    w, g, lr = Tensor([1.0, 2.0, 3.0]).realize(), Tensor([0.5, 0.5, 1.0]).realize(), Tensor(0.0)
    want = np.array([1.0, 2.0, 3.0], np.float32)
    compiled = []
    for i in range(4):
        value = 1e-1 * 0.9**i
        lr.assign(value)
        w.assign(w - lr * g).realize()
        want = want - np.float32(value) * np.array([0.5, 0.5, 1.0], np.float32)
        compiled.append(len(engine._runners))
    assert compiled[1:] == [compiled[0]] * 3
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("value, want", [
    (2.5, [[2.5, 2.5], [2.5, 2.5]]),
    ([[1, 2], [3, 4]], [[1.0, 2.0], [3.0, 4.0]]),
    (np.array([[1.5, 2], [3, 4]]), [[1.5, 2.0], [3.0, 4.0]]),
    (Tensor.full((2, 2), 7), [[7.0, 7.0], [7.0, 7.0]]),
], ids=["number", "list", "numpy", "constant_tensor"])
def test_assigning_a_known_value_stores_it_without_a_kernel(value, want):
    t = Tensor.zeros(2, 2)
    GlobalCounters.reset()
    t.assign(value).realize()
    assert GlobalCounters.kernel_count == 0 and t.dtype is dtypes.float32 and t.tolist() == want


# ---- in-place ops --------------------------------------------------------------------------------------------------

IN_PLACE = {
    "iadd": lambda t: t.__iadd__(2), "isub": lambda t: t.__isub__(1), "imul": lambda t: t.__imul__(3),
    "itruediv": lambda t: t.__itruediv__(4), "ifloordiv": lambda t: t.__ifloordiv__(2),
    "ipow": lambda t: t.__ipow__(2), "imod": lambda t: t.__imod__(3),
    "add_": lambda t: t.add_(1.5), "add_alpha": lambda t: t.add_(t, alpha=2), "sub_": lambda t: t.sub_(0.5),
    "mul_": lambda t: t.mul_(t), "div_": lambda t: t.div_(2), "clamp_": lambda t: t.clamp_(2, 3),
    "clip_": lambda t: t.clip_(None, 2), "zero_": lambda t: t.zero_(), "fill_": lambda t: t.fill_(9),
}
INT_IN_PLACE = {
    "iand": lambda t: t.__iand__(6), "ior": lambda t: t.__ior__(8), "ixor": lambda t: t.__ixor__(5),
    "ilshift": lambda t: t.__ilshift__(2), "irshift": lambda t: t.__irshift__(1), "iadd": lambda t: t.__iadd__(2),
    "ifloordiv": lambda t: t.__ifloordiv__(2), "fill_": lambda t: t.fill_(2.7),
}


@pytest.mark.parametrize("name", IN_PLACE)
def test_in_place_float_ops_update_the_same_object_as_torch(name):
    t, tt = Tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])
    out, tout = IN_PLACE[name](t), IN_PLACE[name](tt)
    assert out is t and tout is tt
    assert t.dtype is dtypes.float32
    np.testing.assert_allclose(t.numpy(), tt.numpy(), rtol=1e-6)


@pytest.mark.parametrize("name", INT_IN_PLACE)
def test_in_place_int_ops_keep_the_dtype_as_torch(name):
    t, tt = Tensor([1, 2, 3, 12], dtype="int32"), torch.tensor([1, 2, 3, 12], dtype=torch.int32)
    assert INT_IN_PLACE[name](t) is t
    INT_IN_PLACE[name](tt)
    assert t.dtype is dtypes.int32 and t.tolist() == tt.tolist()


def test_in_place_matmul_and_copy_match_torch():
    a, b = np.arange(4.0).reshape(2, 2), np.array([[0.0, 1.0], [1.0, 1.0]])
    t, tt = Tensor(a), torch.tensor(a)
    t @= Tensor(b)
    tt @= torch.tensor(b)
    np.testing.assert_allclose(t.numpy(), tt.numpy())
    t.copy_(Tensor([5, 6])), tt.copy_(torch.tensor([5, 6]))  # broadcast and cast
    assert t.dtype is dtypes.float64 and t.tolist() == tt.tolist()


def test_in_place_update_is_seen_by_every_holder_of_the_tensor():
    weight = Tensor([1.0, 2.0])
    layer = {"weight": weight}
    weight += 1
    weight.mul_(2)
    assert layer["weight"] is weight and layer["weight"].tolist() == [4.0, 6.0]


@pytest.mark.parametrize("fn", [lambda t: t.__iadd__(0.5), lambda t: t.__itruediv__(2), lambda t: t.mul_(1.5)],
                         ids=["iadd", "itruediv", "mul_"])
def test_in_place_result_that_cannot_cast_to_an_int_tensor_raises_as_torch(fn):
    with pytest.raises(RuntimeError, match="can't be cast"):
        fn(torch.tensor([1, 2]))
    with pytest.raises(DTypeError, match="can't be cast to the tensor's dtype int32"):
        fn(Tensor([1, 2]))


def test_in_place_result_of_another_shape_raises_as_torch():
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        torch.ones(3).add_(torch.ones(2, 3))
    with pytest.raises(ShapeError, match=r"add_: the result's shape \(2, 3\) does not match the tensor's \(3,\)"):
        Tensor.ones(3).add_(Tensor.ones(2, 3))


@pytest.mark.parametrize("fn", [lambda t: t.__iadd__(1), lambda t: t.zero_(), lambda t: t.fill_(1.0),
                                lambda t: t.copy_(Tensor([1.0, 1.0]))], ids=["iadd", "zero_", "fill_", "copy_"])
def test_in_place_on_a_leaf_that_requires_grad_raises_as_torch_unless_no_grad(fn):
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        torch.ones(2, requires_grad=True).add_(1)
    w = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf tensor that requires grad cannot change in place"):
        fn(w)
    with no_grad(): fn(w)
    assert w.requires_grad is True


def test_in_place_on_a_computed_tensor_keeps_the_gradient_as_torch():
    x, tx = Tensor([1.0, 2.0], requires_grad=True), torch.tensor([1.0, 2.0], requires_grad=True)
    y, ty = x * x, tx * tx
    y += x
    ty += tx
    y.sum().backward()
    ty.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


# ---- Python and numpy conversions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("convert", [float, int, bool], ids=["float", "int", "bool"])
@pytest.mark.parametrize("values", [[2.75], [[-3.5]], 0.0, [1]], ids=["vector", "matrix", "scalar", "int"])
def test_one_element_tensors_convert_to_python_scalars_as_torch(convert, values):
    got, want = convert(Tensor(values)), convert(torch.tensor(values))
    assert type(got) is type(want) and got == want


@pytest.mark.parametrize("convert, exc", [(float, ValueError), (int, ValueError), (bool, RuntimeError)],
                         ids=["float", "int", "bool"])
def test_converting_a_many_element_tensor_raises_the_class_torch_raises(convert, exc):
    with pytest.raises(exc):
        convert(torch.ones(2, 3))
    with pytest.raises(exc, match=r"6 elements \(2, 3\)"):
        convert(Tensor.ones(2, 3))


def test_integer_one_element_tensors_are_indices_as_torch():
    items = ["a", "b", "c"]
    assert items[Tensor(2)] == items[torch.tensor(2)] == "c"
    assert list(range(Tensor([3]))) == [0, 1, 2]
    for bad in (Tensor(1.0), Tensor([1, 2])):
        with pytest.raises(TypeError, match="only one-element integer tensors convert to an index"):
            items[bad]
    with pytest.raises(TypeError):
        items[torch.tensor([1, 2])]


def test_format_spec_formats_a_one_element_tensor():
    assert f"{Tensor(2.0):.3f}" == f"{torch.tensor(2.0):.3f}" == "2.000"


def test_numpy_asarray_gives_the_values_and_dtype():
    t = Tensor([[1, 2], [3, 4]], dtype="int16")
    got = np.asarray(t)
    assert got.dtype == np.int16 and got.tolist() == [[1, 2], [3, 4]]
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="copy=False"):
        np.array(t, copy=False)


def test_numpy_functions_compute_on_the_values_and_ufuncs_refuse():
    t = Tensor([[1.0, 2.0], [3.0, 4.0]])
    assert np.sum(t) == 10.0 and np.mean(t, axis=0).tolist() == [2.0, 3.0]
    assert np.concatenate([t, t]).shape == (4, 2) and np.allclose(t, [[1, 2], [3, 4]])
    with pytest.raises(TypeError, match="does not support ufuncs"):
        np.exp(t)


def test_repr_shows_values_shape_dtype_and_device():
    text = repr(Tensor([[1.5, 2.0], [3.0, 4.0]]))
    assert text == f"Tensor([[1.5, 2. ],\n        [3. , 4. ]], shape=(2, 2), dtype=float32, device={Device.DEFAULT})"
    assert str(Tensor([1.0], requires_grad=True)).endswith("requires_grad=True)")


def test_repr_of_a_large_tensor_is_summarized():
    text = repr(Tensor.arange(5000))
    assert "[   0,    1,    2, ..., 4997, 4998, 4999]" in text and "shape=(5000,), dtype=int32" in text


def test_repr_of_a_traced_tensor_shows_no_values_and_runs_nothing():
    shown = []
    f = NumericalFunction("f", lambda x: shown.append(repr(x * 2)) or x * 2, [Arg((3,))])
    f.traced_outputs  # noqa: B018  (tracing calls fn)
    assert shown == [f"Tensor(<traced>, shape=(3,), dtype=float64, device={Device.DEFAULT})"]


# ---- dtype inference for big ints ----------------------------------------------------------------------------------


@pytest.mark.parametrize("make, oracle", [
    (lambda: Tensor.arange(2**31, 2**31 + 3), lambda: torch.arange(2**31, 2**31 + 3)),
    (lambda: Tensor.arange(-(2**31) - 2, -(2**31) + 1), lambda: torch.arange(-(2**31) - 2, -(2**31) + 1)),
    (lambda: Tensor([2**40, 1]), lambda: torch.tensor([2**40, 1])),
    (lambda: Tensor([[1], [-(2**35)]]), lambda: torch.tensor([[1], [-(2**35)]])),
    (lambda: Tensor(2**40), lambda: torch.tensor(2**40)),
    (lambda: Tensor.full((2,), 2**40), lambda: torch.full((2,), 2**40)),
], ids=["arange", "arange_negative", "list", "nested", "scalar", "full"])
def test_ints_that_do_not_fit_int32_are_int64_as_torch(make, oracle):
    got, want = make(), oracle()
    assert got.dtype is dtypes.int64 and got.tolist() == want.tolist()


def test_ints_that_fit_int32_stay_int32():
    assert Tensor([2**31 - 1]).dtype is Tensor.arange(5).dtype is Tensor(-(2**31)).dtype is dtypes.int32


@pytest.mark.parametrize("make", [lambda: Tensor([1, 2**70]), lambda: Tensor(-(2**64)), lambda: Tensor([[2**63]]),
                                  lambda: Tensor.full((1,), 2**64)], ids=["list", "scalar", "nested", "full"])
def test_ints_past_int64_raise_overflow_error(make):
    with pytest.raises(OverflowError, match="does not fit any integer dtype"):
        make()


def test_linspace_with_bool_dtype_raises_as_torch():
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
        torch.linspace(0, 1, 5, dtype=torch.bool)
    with pytest.raises(DTypeError, match="linspace: dtype bool"):
        Tensor.linspace(0, 1, 5, dtype="bool")


# ---- exception classes ---------------------------------------------------------------------------------------------


def test_shape_errors_are_runtime_errors_as_torch_and_value_errors_as_before():
    with pytest.raises(RuntimeError):
        torch.ones(3) + torch.ones(4)
    for base in (RuntimeError, ValueError, EmberError):
        with pytest.raises(base):
            Tensor.ones(3) + Tensor.ones(4)


def test_dtype_errors_are_runtime_errors_and_type_errors():
    assert issubclass(DTypeError, RuntimeError) and issubclass(DTypeError, TypeError)


@pytest.mark.parametrize("fn, oracle", [
    (lambda t: t.sum(2), lambda t: t.sum(2)),
    (lambda t: t.softmax(-3), lambda t: t.softmax(-3)),
    (lambda t: t.unsqueeze(4), lambda t: t.unsqueeze(4)),
    (lambda t: t.transpose(0, 2), lambda t: t.transpose(0, 2)),
], ids=["sum", "softmax", "unsqueeze", "transpose"])
def test_axis_out_of_range_raises_index_error_as_torch(fn, oracle):
    with pytest.raises(IndexError):
        oracle(torch.ones(2, 3))
    with pytest.raises(AxisError, match="valid axes are"):
        fn(Tensor.ones(2, 3))
    assert issubclass(AxisError, IndexError) and issubclass(AxisError, ShapeError)


# ---- kernels that need not run -------------------------------------------------------------------------------------


def test_empty_is_a_buffer_no_kernel_writes():
    GlobalCounters.reset()
    t = Tensor.empty(4, 5, dtype="float64").realize()
    assert GlobalCounters.kernel_count == 0 and t.shape == (4, 5) and t.dtype is dtypes.float64
    assert t.numpy().shape == (4, 5) and GlobalCounters.kernel_count == 0


def test_contiguous_of_a_whole_buffer_view_runs_no_kernel_and_clone_copies():
    x = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    GlobalCounters.reset()
    y = x.reshape(2, 2).contiguous().realize()
    assert GlobalCounters.kernel_count == 0 and y.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    z = x.reshape(2, 2).clone().realize()
    assert GlobalCounters.kernel_count == 1 and z.tolist() == y.tolist()
    assert x.reshape(2, 2).T.contiguous().realize().tolist() == [[1.0, 3.0], [2.0, 4.0]]
