"""NumericalFunction: tracing, calls from Python with numpy arrays, buffer kinds, errors."""

import numpy as np
import pytest

from ember import Tensor
from ember.errors import DTypeError, EmberError, ShapeError
from ember.export import Arg, NumericalFunction, numerical_function

RNG = np.random.default_rng(4)
C = RNG.standard_normal((2, 3))


def test_single_output_matches_numpy_and_takes_lists():
    f = NumericalFunction("energy", lambda x: (0.5 * x * x).sum(), [Arg((3,))])
    x = RNG.standard_normal(3)
    assert f(x).shape == () and f(x).dtype == np.float64
    np.testing.assert_allclose(f(x), 0.5 * (x * x).sum(), rtol=1e-15)
    np.testing.assert_allclose(f([1, 2, 3]), 7.0)


def test_several_inputs_and_outputs_with_captured_constants():
    @numerical_function("g", (3,), (2,))
    def g(x, y):
        return (Tensor(C) @ x) * y, (x.exp() * 2).sum(0, keepdim=True)

    x, y = RNG.standard_normal(3), RNG.standard_normal(2)
    a, b = g(x, y)
    np.testing.assert_allclose(a, (C @ x) * y, rtol=1e-14)
    np.testing.assert_allclose(b, [(np.exp(x) * 2).sum()], rtol=1e-14)
    assert [arg.dtype.name for arg in g.args] == ["float64", "float64"]


def test_outputs_are_fresh_contiguous_arrays_even_when_they_alias_inputs():
    f = NumericalFunction("views", lambda x: (x, x[:2], x.T, x[:, ::-1]), [Arg((3, 2))])
    x = RNG.standard_normal((3, 2))
    outs = f(x)
    for got, want in zip(outs, (x, x[:2], x.T, x[:, ::-1])):
        np.testing.assert_array_equal(got, want)
        assert got.flags.c_contiguous and not np.shares_memory(got, x)
    first = outs[0]
    f(x + 1)
    np.testing.assert_array_equal(first, x)  # an earlier result is not overwritten by the next call


def test_kernels_of_constants_alone_run_once_when_planned():
    scale = Tensor(C)
    f = NumericalFunction("scaled", lambda x: x * (scale.exp() * 3).sum(1), [Arg((2,))])
    assert len(f.plan.items) == 1 and len(f.plan.constants) == 1
    x = RNG.standard_normal(2)
    np.testing.assert_allclose(f(x), x * (np.exp(C) * 3).sum(1), rtol=1e-14)


def test_zero_length_inputs_and_other_dtypes():
    f = NumericalFunction("empty", lambda x: x * 2, [Arg((0, 3))])
    assert f(np.zeros((0, 3))).shape == (0, 3)
    g = NumericalFunction("ints", lambda x: x * 3 + 1, [Arg((4,), "int32")])
    np.testing.assert_array_equal(g(np.arange(4)), np.arange(4) * 3 + 1)
    assert g(np.arange(4)).dtype == np.int32


@pytest.mark.parametrize("call, error, fragment", [
    (lambda f: f(np.ones(4)), ShapeError, "argument 0 has shape (4,), expected (3,)"),
    (lambda f: f(np.ones(3, np.complex128)), DTypeError, "complex128"),
    (lambda f: f(), TypeError, "takes 1 arguments, got 0"),
])
def test_bad_calls_name_the_problem(call, error, fragment):
    f = NumericalFunction("f", lambda x: x.sum(), [Arg((3,))])
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        call(f)


def test_fn_must_return_tensors():
    with pytest.raises(EmberError, match="must return a Tensor or a tuple of Tensors, got int"):
        NumericalFunction("bad", lambda x: 3, [Arg(3)])
    with pytest.raises(ValueError, match="identifier"):
        NumericalFunction("not a name", lambda x: x, [Arg(3)])


def test_a_function_called_inside_another_is_traced_into_it():
    """Calling a NumericalFunction on Tensors runs its fn on them: the caller's graph includes it, so the two
    derivatives of one model below come out of one trace (and, small, out of one kernel)."""
    norm = NumericalFunction("norm", lambda x, w: (w * x * x).sum().sqrt(), [Arg(3), Arg(3)])
    both = NumericalFunction("both", lambda x, w: (norm(x, w), norm(x * 2, w) + norm(x, [1.0, 1.0, 1.0])),
                             [Arg(3), Arg(3)])
    x, w = RNG.standard_normal(3), RNG.uniform(0.5, 2.0, 3)
    first, second = both(x, w)
    np.testing.assert_allclose(first, np.sqrt((w * x * x).sum()), rtol=1e-15)
    np.testing.assert_allclose(second, np.sqrt((w * 4 * x * x).sum()) + np.linalg.norm(x), rtol=1e-15)


@pytest.mark.parametrize("inner, error, fragment", [
    (lambda f, x: f(x[:2]), ShapeError, "f: argument 0 has shape (2,), expected (3,)"),
    (lambda f, x: f(x.cast("float32")), DTypeError, "f: argument 0 has dtype float32, expected float64"),
    (lambda f, x: f(x, x), TypeError, "f: takes 1 arguments, got 2"),
])
def test_a_function_called_on_tensors_checks_them(inner, error, fragment):
    f = NumericalFunction("f", lambda x: x.sum(), [Arg(3)])
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        NumericalFunction("g", lambda x: inner(f, x), [Arg(3)])


def test_a_function_is_scheduled_when_first_needed_and_never_when_only_traced_into_another():
    from ember.engine.realize import GlobalCounters
    scale = Tensor(C)
    inner = NumericalFunction("inner", lambda x: x * scale.exp().sum(), [Arg((2,))])  # the sum: a constant kernel
    outer = NumericalFunction("outer", lambda x: inner(x) + 1, [Arg((2,))])
    traced = GlobalCounters.kernel_count
    x = RNG.standard_normal(2)
    np.testing.assert_allclose(outer(x), x * np.exp(C).sum() + 1, rtol=1e-14)
    assert GlobalCounters.kernel_count == traced + 1  # outer's plan ran its constant kernel; inner planned nothing
    assert len(inner.plan.constants) == 1 and GlobalCounters.kernel_count == traced + 2  # now inner's, on demand


def test_tracing_runs_no_kernel(monkeypatch):
    """The placeholders that tracing calls fn on (and reverse mode's cotangent) are bare buffers: tracing a function
    and its reverse-mode jacobian runs no kernel. The jacobian is then checked against its formula."""
    import ember.ad
    import ember.engine.realize
    a = np.array([[1.0, 2.0, 0.5], [-1.0, 0.0, 3.0]])
    with monkeypatch.context() as m:
        m.setattr(ember.engine.realize, "get_runner", lambda device, ast: pytest.fail("tracing ran a kernel"))
        f = NumericalFunction("proj", lambda x: (Tensor(a) @ x).sin(), [Arg(3)])
        jac = ember.ad.jacobian(f)  # 2 outputs < 3 inputs: reverse mode, one cotangent placeholder
        assert jac.output_shapes == [(2, 3)]
    x = np.array([0.3, -0.2, 0.7])
    np.testing.assert_allclose(jac(x), np.cos(a @ x)[:, None] * a, rtol=1e-14)
