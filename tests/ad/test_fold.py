"""ember.scan / ember.fold: a loop that stays a loop, checked against the same steps unrolled, numpy and finite
differences: values, forward and reverse derivatives, hessians, sparse derivatives, vmap, C++ size by horizon."""

from __future__ import annotations

import numpy as np
import pytest

import ember.ad
from ember import Tensor
from ember.errors import DTypeError, ShapeError
from ember.export import Arg, NumericalFunction, render_module
from ember.scan import fold, scan


def step(c: Tensor, u: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    n = c * w + u.sin() * c[0]
    return n, (n * n).sum().reshape(1)


def step_numpy(c: np.ndarray, u: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = c * w + np.sin(u) * c[0]
    return n, np.array([(n * n).sum()])


ARGS = [np.array([1.0, 2.0]), np.arange(10.0).reshape(5, 2) * 0.1, np.array([0.5, -0.25])]


def rollout(unroll: bool) -> NumericalFunction:
    def f(x0: Tensor, us: Tensor, w: Tensor) -> Tensor:
        c, ys = scan(lambda c, u: step(c, u, w), x0, us, unroll=unroll)
        return c.cat(ys.flatten())
    return NumericalFunction(f"roll{int(unroll)}", f, [Arg(2), Arg((5, 2)), Arg(2)])


def objective(unroll: bool) -> NumericalFunction:
    return NumericalFunction(f"obj{int(unroll)}", lambda *xs: (rollout(unroll).fn(*xs) ** 2).sum(),
                             [Arg(2), Arg((5, 2)), Arg(2)])


def reference() -> np.ndarray:
    c, ys = ARGS[0], []
    for u in ARGS[1]:
        c, y = step_numpy(c, u, ARGS[2])
        ys.append(y)
    return np.concatenate([c, *ys])


def both(f: NumericalFunction, *args: np.ndarray) -> np.ndarray:
    """f's native result, checked equal (bit for bit) to its numpy interpreter's and its kernels run from Python."""
    native, interpreted, kernels = f.compile()(*args), f.interpret(*args), f.call_kernels(*args)
    np.testing.assert_array_equal(native, interpreted)
    np.testing.assert_array_equal(native, kernels)
    return native


def test_scan_values_match_numpy_eager_and_traced():
    want = reference()
    x0, us, w = (Tensor(a) for a in ARGS)
    for unroll in (True, False):
        c, ys = scan(lambda c, u: step(c, u, w), x0, us, unroll=unroll)
        np.testing.assert_allclose(np.concatenate([c.numpy(), ys.numpy().ravel()]), want, rtol=1e-15)
        np.testing.assert_allclose(both(rollout(unroll), *ARGS), want, rtol=1e-15)


def test_the_loop_is_a_loop_in_the_cpp():
    source = render_module("m", [rollout(False)])[1]
    assert "for (long step0 = 0; step0 < 5; ++step0)" in source
    assert "for (long step0" not in render_module("m", [rollout(True)])[1]


@pytest.mark.parametrize("argnum", [0, 1, 2])  # the carry (forward mode), xs (reverse), a parameter (forward)
def test_jacobian_of_the_loop_equals_the_unrolled_one(argnum):
    looped = both(ember.ad.jacobian(rollout(False), argnum), *ARGS)
    np.testing.assert_array_equal(looped, ember.ad.jacobian(rollout(True), argnum)(*ARGS))
    f, h = rollout(False), 1e-6
    for i in np.ndindex(ARGS[argnum].shape):  # central differences
        up, down = [a.copy() for a in ARGS], [a.copy() for a in ARGS]
        up[argnum][i] += h
        down[argnum][i] -= h
        np.testing.assert_allclose(looped[(slice(None), *i)], (f(*up) - f(*down)) / (2 * h), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("argnums", [(0, 2), (2, 0), (0, 1), (1, 2, 0)])  # 4 inputs <= 7 outputs: forward; else reverse
def test_jacobian_by_several_arguments_equals_the_separate_jacobians(argnums):
    f = ember.ad.jacobian(rollout(False), argnums)
    together = f.compile()(*ARGS)
    assert len(together) == len(argnums)
    for native, interpreted in zip(together, f.interpret(*ARGS), strict=True):
        np.testing.assert_array_equal(native, interpreted)
    for jac, argnum in zip(together, argnums, strict=True):
        np.testing.assert_allclose(jac, ember.ad.jacobian(rollout(True), argnum)(*ARGS), rtol=1e-14, atol=1e-14)


def call_raw(f: NumericalFunction) -> str:
    """The C++ of f's call (without the cold rerun of its checked tangent products: export/optimistic.py)."""
    return render_module("m", [f])[1].split("void call_raw(")[1]


def test_jacobians_by_the_carry_and_the_xs_share_one_reverse_sweep():
    loops = lambda f: call_raw(f).count("for (long step0")  # noqa: E731
    by_state, by_xs = ember.ad.jacobian(rollout(False), 0), ember.ad.jacobian(rollout(False), 1)
    separate = NumericalFunction("separate", lambda *xs: (by_state(*xs), by_xs(*xs)), rollout(False).args)
    assert loops(separate) == 3  # forward mode over the carry; the replay and the reverse sweep for the xs
    assert loops(ember.ad.jacobian(rollout(False), (0, 1))) == 2  # the replay and one reverse sweep
    with pytest.raises(ValueError, match="distinct"): ember.ad.jacobian(rollout(False), (1, 1))


def final_state(unroll: bool) -> NumericalFunction:
    return NumericalFunction(f"final{int(unroll)}", lambda x0, us, w: fold(lambda c, u: step(c, u, w)[0], x0, us,
                                                                          unroll=unroll), [Arg(2), Arg((5, 2)), Arg(2)])


def test_a_loop_and_its_reverse_jacobian_run_the_steps_once_before_the_sweep():
    f, jac = final_state(False), ember.ad.jacobian(final_state(False), (0, 1))
    together = NumericalFunction("together", lambda *xs: (f(*xs), *jac(*xs)), f.args)
    assert call_raw(together).count("for (long step0") == 2  # the replay gives the value too
    got = together.compile()(*ARGS)
    for native, interpreted, kernels in zip(got, together.interpret(*ARGS), together.call_kernels(*ARGS), strict=True):
        np.testing.assert_array_equal(native, interpreted)
        np.testing.assert_array_equal(native, kernels)
    np.testing.assert_array_equal(got[0], final_state(True)(*ARGS))
    for jac_unrolled, argnum in zip(got[1:], (0, 1), strict=True):
        np.testing.assert_allclose(jac_unrolled, ember.ad.jacobian(final_state(True), argnum)(*ARGS), rtol=1e-14,
                                   atol=1e-14)


@pytest.mark.parametrize("argnum", [0, 1, 2])
def test_gradient_hessian_and_sparse_derivatives_of_the_loop(argnum):
    for transform in (ember.ad.gradient, ember.ad.hessian, ember.ad.sphessian):
        looped = both(transform(objective(False), argnum), *ARGS)
        np.testing.assert_allclose(looped, transform(objective(True), argnum)(*ARGS), rtol=1e-13, atol=1e-13)
    sparse = ember.ad.spjacobian(rollout(False), argnum)
    np.testing.assert_array_equal(sparse.to_dense(both(sparse, *ARGS)).reshape(7, -1),
                                  ember.ad.jacobian(rollout(True), argnum)(*ARGS).reshape(7, -1))


def test_vmap_of_the_loop_batches_only_what_depends_on_the_batch():
    batch = [np.stack([a, 0.5 * a, 2 * a]) for a in ARGS]
    looped = both(ember.ad.vmap(rollout(False), (0, None, 0), axis_size=3), batch[0], ARGS[1], batch[2])
    np.testing.assert_array_equal(looped, ember.ad.vmap(rollout(True), (0, None, 0), axis_size=3)(
        batch[0], ARGS[1], batch[2]))


def test_tuples_nested_scans_and_fold():
    def f(x0: Tensor, v0: Tensor, us: Tensor) -> Tensor:
        def outer(carry: tuple[Tensor, Tensor], u: Tensor) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
            x, v = carry
            inner = fold(lambda s, _: s * 0.5 + u, x, length=3, unroll=False)  # a loop inside the body
            return (inner + v, v - 0.1 * x.sum()), (x.sum().reshape(1), v)
        (x, v), (sums, vs) = scan(outer, (x0, v0), us, unroll=False)
        return x.cat(v, sums.flatten(), vs.flatten())
    args = [np.array([1.0, -1.0]), np.array([0.3]), np.linspace(0, 1, 8).reshape(4, 2)]
    x, v, rows = args[0], args[1], []
    for u in args[2]:
        s = x
        for _ in range(3): s = s * 0.5 + u
        rows.append((x.sum(), v.copy()))
        x, v = s + v, v - 0.1 * x.sum()
    want = np.concatenate([x, v, [r[0] for r in rows], np.concatenate([r[1] for r in rows])])
    got = both(NumericalFunction("nested", f, [Arg(2), Arg(1), Arg((4, 2))]), *args)
    np.testing.assert_allclose(got, want, rtol=1e-15)


def test_eager_gradient_through_the_loop():
    x0 = Tensor(ARGS[0], requires_grad=True)
    us, w = Tensor(ARGS[1]), Tensor(ARGS[2])
    c, ys = scan(lambda c, u: step(c, u, w), x0, us, unroll=False)
    (c.sum() + ys.sum()).backward()
    want = ember.ad.gradient(NumericalFunction("g", lambda *xs: rollout(True).fn(*xs).sum(),
                                               [Arg(2), Arg((5, 2)), Arg(2)]))(*ARGS)
    np.testing.assert_allclose(x0.grad.numpy(), want, rtol=1e-14)


def test_bad_steps_are_named():
    x0, us = Tensor(ARGS[0]), Tensor(ARGS[1])
    with pytest.raises(ShapeError, match="keeps its shapes"):
        scan(lambda c, u: (c.sum(), None), x0, us)
    with pytest.raises(TypeError, match="pair"):
        scan(lambda c, u: c, x0, us)
    with pytest.raises(ShapeError, match="length"):
        scan(lambda c, u: (c, None), x0, us, length=4)
    with pytest.raises(DTypeError, match="float32"):
        scan(lambda c, u: (c, None), x0, us.cast("float32"))


def test_horizon_does_not_grow_the_cpp():
    """The rollout and its two jacobians over 10, 100 and 1000 steps: the same C++ but for the loop bounds."""
    sizes = []
    for steps in (10, 100, 1000):
        def f(x0: Tensor, us: Tensor, w: Tensor, steps: int = steps) -> Tensor:
            return scan(lambda c, u: step(c, u, w), x0, us, unroll=False)[0]
        args = [Arg(2), Arg((steps, 2)), Arg(2)]
        roll = NumericalFunction(f"h{steps}", f, args)
        jacobians = [ember.ad.jacobian(roll, argnum) for argnum in (0, 1)]
        together = NumericalFunction("h", lambda *xs, fs=(roll, *jacobians): tuple(g.fn(*xs) for g in fs), args)
        sizes.append(len(render_module("m", [together])[1]))
    assert max(sizes) < 1.2 * min(sizes), sizes  # (10 steps: some small kernels unroll)


def test_a_build_over_the_size_limit_says_so():
    from ember.errors import CompileError
    from ember.helpers import Context
    with Context(EMBER_MAX_CXX_BYTES=2000), pytest.raises(CompileError, match="ember.ad.scan"):
        NumericalFunction("too_big", lambda x: (x.sin() * x).cumsum(0), [Arg(40)]).compile()
