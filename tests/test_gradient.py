"""Reverse-mode derivatives against torch: every primitive rule, compositions, second derivatives."""

import numpy as np
import pytest
import torch

from ember import Tensor
from ember.errors import ShapeError

RNG = np.random.default_rng(7)
X = RNG.uniform(0.5, 2.0, (3, 4)).astype(np.float32)  # positive: log, sqrt and division are defined
Y = RNG.uniform(-2.0, 2.0, (3, 4)).astype(np.float32)
Y[0, 0] = X[0, 0]  # a tie for max

def amax(x, axis, keepdim=False):
    """max over an axis in ember or torch (torch's max(dim) returns a tuple)."""
    return x.max(axis=axis, keepdim=keepdim) if isinstance(x, Tensor) else x.amax(axis, keepdim)


UNARY = [
    ("neg", lambda x: -x), ("exp", lambda x: x.exp()), ("log", lambda x: x.log()), ("sqrt", lambda x: x.sqrt()),
    ("sin", lambda x: x.sin()), ("reciprocal", lambda x: x.reciprocal()), ("exp2", lambda x: x.exp2()),
    ("log2", lambda x: x.log2()), ("relu", lambda x: (x - 1).relu()), ("sigmoid", lambda x: x.sigmoid()),
    ("square", lambda x: x.square()), ("abs", lambda x: (x - 1).abs()),
    ("cast", lambda x: x.double() * 3 if isinstance(x, Tensor) else x.double() * 3),
]
BINARY = [
    ("add", lambda x, y: x + y), ("sub", lambda x, y: x - y), ("mul", lambda x, y: x * y),
    ("div", lambda x, y: y / x), ("maximum", lambda x, y: x.maximum(y)),
    ("where", lambda x, y: (x > y).where(x * 2, y * 3) if isinstance(x, Tensor) else torch.where(x > y, x * 2, y * 3)),
    ("broadcast", lambda x, y: x[:, :1] * y + x[0]),
]
SHAPED = [
    ("sum", lambda x: x.sum(1)), ("sum_all", lambda x: x.sum()), ("mean", lambda x: x.mean(0)),
    ("max", lambda x: amax(x, 1)), ("max_tie", lambda x: amax(x * 0 + 1, 1) * x.sum(1)),
    ("reshape", lambda x: x.reshape(2, 6) * Tensor(np.arange(12, dtype=np.float32).reshape(2, 6))
     if isinstance(x, Tensor) else x.reshape(2, 6) * torch.arange(12, dtype=torch.float32).reshape(2, 6)),
    ("permute", lambda x: x.permute(1, 0)[:, 1:] * 3), ("expand", lambda x: x.reshape(3, 1, 4).expand(3, 5, 4)),
    ("pad", lambda x: x.pad(((1, 0), (2, 1))) * 2 if isinstance(x, Tensor) else
     torch.nn.functional.pad(x, (2, 1, 1, 0)) * 2),
    ("shrink_slice", lambda x: x[1:, ::2]), ("flip", lambda x: x.flip(1) * torch.arange(4.0)
     if not isinstance(x, Tensor) else x.flip(1) * Tensor.arange(4.0)),
    ("matmul", lambda x: x @ x.T), ("softmax", lambda x: (x - amax(x, 1, True)).exp() /
                                    (x - amax(x, 1, True)).exp().sum(1, keepdim=True)),
]


def grads_of(fn, *arrays):
    """(ember grads, torch grads) of sum(fn(...) * fixed weights) with respect to every input."""
    ours = [Tensor(a) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, ref = fn(*ours), fn(*theirs)
    weights = np.linspace(-1, 2, ref.numel(), dtype=np.float32).reshape(tuple(ref.shape))
    loss = (out * Tensor(weights).cast(out.dtype)).sum()
    (ref * torch.tensor(weights).to(ref.dtype)).sum().backward()
    return [g.numpy() for g in loss.gradient(*ours)], [t.grad.numpy() for t in theirs]


@pytest.mark.parametrize("name, fn", UNARY, ids=[u[0] for u in UNARY])
def test_unary_gradient_matches_torch(name, fn):
    (ours,), (theirs,) = grads_of(fn, X)
    np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("name, fn", BINARY, ids=[b[0] for b in BINARY])
def test_binary_gradient_matches_torch(name, fn):
    ours, theirs = grads_of(fn, X, Y)
    for a, b in zip(ours, theirs, strict=True): np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name, fn", SHAPED, ids=[s[0] for s in SHAPED])
def test_reduce_and_movement_gradient_matches_torch(name, fn):
    (ours,), (theirs,) = grads_of(fn, X)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_backward_fills_grad_of_every_parameter_and_accumulates():
    w = Tensor(X.copy(), requires_grad=True)
    b = Tensor(Y[0].copy(), requires_grad=True)
    tw, tb = torch.tensor(X, requires_grad=True), torch.tensor(Y[0], requires_grad=True)
    for _ in range(2):  # a second backward adds to .grad, as in torch
        ((Tensor(Y) @ w.T + b[:3]).relu().sum()).backward()
        ((torch.tensor(Y) @ tw.T + tb[:3]).relu().sum()).backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5)


def test_second_derivative_matches_the_calculus():
    x = Tensor(X)
    (first,) = (x * x * x).sum().gradient(x)  # 3x^2
    (second,) = first.sum().gradient(x)  # 6x
    np.testing.assert_allclose(second.numpy(), 6 * X, rtol=1e-6)


def test_detach_stops_the_gradient():
    x = Tensor(X)
    (g,) = (x * x.detach()).sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), X, rtol=1e-7)


def test_gradient_of_an_unused_input_is_zero_and_forward_kernels_are_unchanged():
    x, unused = Tensor(X), Tensor(Y)
    loss = (x.exp() * 2).sum()
    before = len(loss.schedule())
    gx, gu = loss.gradient(x, unused)
    assert gu.numpy().tolist() == np.zeros_like(Y).tolist()
    np.testing.assert_allclose(gx.numpy(), 2 * np.exp(X), rtol=1e-6)
    assert len(loss.schedule()) == before


def test_gradient_of_a_non_scalar_needs_a_seed():
    x = Tensor(X)
    with pytest.raises(ShapeError, match=r"gradient: the output has shape \(3, 4\)"):
        (x * 2).gradient(x)
    (g,) = (x * 2).gradient(x, gradient=Tensor(Y))
    np.testing.assert_allclose(g.numpy(), 2 * Y)


def test_backward_without_parameters_says_so():
    with pytest.raises(RuntimeError, match="no tensor with requires_grad"):
        Tensor(X).sum().backward()


def test_relu_matches_torch_at_zero_and_nan():
    x = np.array([-1.0, -0.0, 0.0, 2.0, np.nan], np.float32)
    t = torch.tensor(x, requires_grad=True)
    torch.relu(t).sum().backward()
    ours = Tensor(x)
    np.testing.assert_array_equal(ours.relu().numpy(), torch.relu(torch.tensor(x)).numpy())
    np.testing.assert_array_equal(ours.relu().sum().gradient(ours)[0].numpy(), t.grad.numpy())


def test_equal_scalar_parameters_and_constants_keep_separate_gradients():
    a, b = Tensor(2.0, requires_grad=True), Tensor(3.0, requires_grad=True)
    (a * Tensor(2.0) + b * 3.0).backward()
    assert (a.grad.item(), b.grad.item()) == (2.0, 3.0)
    ones = Tensor.ones(3).requires_grad_()
    (ones * Tensor.ones(3)).sum().backward()
    assert ones.grad.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("values", [[2.0, 0.0, 3.0], [2.0, 0.0, 0.0], [1.5, -2.0, 4.0]])
def test_prod_gradient_with_zeros_matches_torch(values):
    t = torch.tensor(values, requires_grad=True)
    t.prod().backward()
    x = Tensor(values)
    np.testing.assert_allclose(x.prod().gradient(x)[0].numpy(), t.grad.numpy())


@pytest.mark.parametrize("name, ours, theirs", [
    ("clamp_at_bounds", lambda x: x.clamp(0, 1), lambda t: t.clamp(0, 1)),
    ("pow_zero_exponent", lambda x: x ** 0, lambda t: t ** 0),
    ("abs_at_zero", lambda x: x.abs(), lambda t: t.abs()),
])
def test_derivatives_at_kinks_match_torch(name, ours, theirs):
    values = np.array([0.0, 1.0, 0.5, -1.0, 2.0, -0.0], np.float32)
    t = torch.tensor(values, requires_grad=True)
    theirs(t).sum().backward()
    x = Tensor(values)
    np.testing.assert_array_equal(ours(x).sum().gradient(x)[0].numpy(), t.grad.numpy())
    np.testing.assert_array_equal(ours(x).numpy(), theirs(torch.tensor(values)).numpy())
    np.testing.assert_array_equal(np.signbit(ours(x).numpy()), np.signbit(theirs(torch.tensor(values)).numpy()))


def test_reducing_over_an_empty_axis_tuple_reduces_everything_and_squeeze_of_0d_is_itself():
    assert Tensor([1.0, 2.0]).sum(()).item() == torch.tensor([1.0, 2.0]).sum(()).item()
    assert Tensor(3.0).squeeze(0).shape == tuple(torch.tensor(3.0).squeeze(0).shape)


def test_requires_grad_twice_on_a_vector_keeps_one_gradient():
    t = Tensor([1.0, 2.0])
    t.requires_grad_()
    t.requires_grad_()
    (t * t).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), [2.0, 4.0])


def test_gradients_leave_the_forward_schedule_alone():
    """Building gradients does not change what the forward pass compiles to, and realizing the loss with its
    gradients costs no more kernels than the two apart (shared values are computed once)."""
    rng = np.random.default_rng(0)
    x, y = Tensor(rng.standard_normal((32, 64)).astype(np.float32)), Tensor(rng.integers(0, 10, 32))
    w1 = Tensor(rng.standard_normal((64, 128)).astype(np.float32), requires_grad=True)
    w2 = Tensor(rng.standard_normal((128, 10)).astype(np.float32), requires_grad=True)
    loss = ((x @ w1).relu() @ w2).cross_entropy(y)
    forward = [item.ast for item in loss.schedule()]
    grads = loss.gradient(w1, w2)
    assert [item.ast for item in loss.schedule()] == forward
    together = loss.schedule(*grads)
    assert len(together) <= len(forward) + len(grads[0].schedule(grads[1]))
    value = loss.numpy()
    loss2 = ((x @ w1).relu() @ w2).cross_entropy(y)
    loss2.realize(*loss2.gradient(w1, w2))
    np.testing.assert_array_equal(loss2.numpy(), value)


# ---- deep graphs: reverse mode over long chains and recurrences (every walk iterative, kernels cut to a depth) ----


def recurrence(h0: np.ndarray, w: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """h <- h * w + 0.001 in float64: the final h, dh/dh0 and dh/dw (forward mode, step by step)."""
    h, dh0, dw = h0.astype(np.float64), np.ones_like(h0, np.float64), np.zeros_like(h0, np.float64)
    for _ in range(steps): h, dh0, dw = h * w + 0.001, dh0 * w, dw * w + h
    return h, dh0, dw


def test_gradient_through_a_3000_step_recurrence() -> None:
    h0, w = np.linspace(1, 2, 16, dtype=np.float32), np.linspace(0.998, 0.999, 16, dtype=np.float32)  # vector lanes
    start, rate = Tensor(h0, requires_grad=True), Tensor(w)
    h = start
    for _ in range(3000): h = h * rate + 0.001
    h.sum().backward()
    final, dh0, _ = recurrence(h0, w.astype(np.float64), 3000)
    np.testing.assert_allclose(h.numpy(), final, rtol=1e-4)
    np.testing.assert_allclose(start.grad.numpy(), dh0, rtol=1e-4)


@pytest.mark.slow  # about 20 s of CPU, 13 of them gcc's: the backward kernels recompute forward values
def test_gradient_of_a_5000_step_scalar_recurrence() -> None:
    # the h = h * w + 0.001: d/dw reads every h, so the backward kernels recompute stretches of the forward
    w = Tensor(np.float32(0.999), requires_grad=True)
    h = Tensor(np.float32(1.0))
    for _ in range(5000): h = h * w + 0.001
    h.backward()
    final, _, dw = recurrence(np.array(1.0), np.float64(np.float32(0.999)), 5000)
    np.testing.assert_allclose(h.numpy(), final, rtol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), dw, rtol=1e-4)


@pytest.mark.slow  # about 30 s
def test_gradient_of_a_chain_of_100000_ops() -> None:
    x0 = np.array([0.5, 1.0, 2.0], np.float32)
    x = Tensor(x0, requires_grad=True)
    y = x
    for _ in range(50_000): y = y * 1.00001 + 0.001  # two ops a step
    y.sum().backward()
    steps = 50_000
    scale = np.float64(np.float32(1.00001)) ** steps
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, scale), rtol=1e-3)
    np.testing.assert_allclose(y.numpy(), x0 * scale + 0.001 * (scale - 1) / (np.float64(np.float32(1.00001)) - 1),
                               rtol=1e-3)


# ---- custom_vjp ----------------------------------------------------------------------------------------------------

def straight_through_round(x: Tensor) -> Tensor:
    """round(x), with the gradient of the identity (a straight-through estimator)."""
    return x.round().custom_vjp((x,), lambda g, x: (g,))


def test_custom_vjp_gradient_is_the_pulls():
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    ex = Tensor(X * 3, requires_grad=True)
    got = straight_through_round(ex) * Tensor(w)
    got.sum().backward()
    tx = torch.tensor(X * 3, requires_grad=True)
    want = ((tx.round() - tx).detach() + tx) * torch.tensor(w)
    want.sum().backward()
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    np.testing.assert_array_equal(ex.grad.numpy(), tx.grad.numpy())


def test_custom_vjp_none_stops_the_gradient_and_second_derivatives_differentiate_the_pull():
    x, y = Tensor(X, requires_grad=True), Tensor(Y, requires_grad=True)
    out = (x * y).custom_vjp((x, y), lambda g, x, y: (g * y * x, None))  # d/dx = x * y: not the product's own
    gx, = out.sum().gradient(x)
    np.testing.assert_allclose(gx.numpy(), X * Y, rtol=1e-6)
    gy = out.sum().gradient(x, y)[1]
    np.testing.assert_array_equal(gy.numpy(), np.zeros_like(Y))  # (the pull gives y none: a zero gradient)
    ggx, = gx.sum().gradient(x)  # d/dx sum(x * y) = y: the pull's graph is differentiated as any other
    np.testing.assert_allclose(ggx.numpy(), Y, rtol=1e-6)


def test_custom_vjp_value_graph_serves_forward_mode_and_vmap():
    from ember import ad
    from ember.export import Arg, NumericalFunction
    f = NumericalFunction("st", lambda x: (x * x).custom_vjp((x,), lambda g, x: (g * 0,)), [Arg(4)])
    x, v = np.array([1.0, -2.0, 0.5, 3.0], np.float32), np.array([1.0, 1.0, 2.0, -1.0], np.float32)
    np.testing.assert_allclose(ad.jvp(f)(x, v), 2 * x * v, rtol=1e-6)  # the value's derivative, not the pull's
    batch = np.stack([x, v])
    np.testing.assert_allclose(ad.vmap(f, axis_size=2)(batch), batch * batch, rtol=1e-6)


def test_custom_vjp_rejects_a_pull_of_the_wrong_shape():
    x = Tensor(X, requires_grad=True)
    out = x.exp().custom_vjp((x,), lambda g, x: (g.sum(0),))
    with pytest.raises(ShapeError, match="custom_vjp: the pull gave gradients of shapes"): out.sum().backward()
    bare = x.exp().custom_vjp((x,), lambda g, x: g)  # a Tensor, not a tuple of them
    with pytest.raises(TypeError, match="custom_vjp: the pull must return a tuple"): bare.sum().backward()


def test_custom_vjp_rejects_bad_arguments():
    x = Tensor(X, requires_grad=True)
    with pytest.raises(TypeError, match="custom_vjp: pull must be callable"): x.exp().custom_vjp((x,), 3)
    with pytest.raises(TypeError, match=r"custom_vjp: inputs\[0\] must be a Tensor, got ndarray"):
        x.exp().custom_vjp((X,), lambda g, x: (g,))


@pytest.mark.parametrize("name, ours, theirs", [
    ("softmax", lambda t: t.softmax(1), lambda t: t.softmax(1)),
    ("log_softmax", lambda t: t.log_softmax(-1), lambda t: t.log_softmax(-1)),
    ("layernorm", lambda t: t.layernorm(), lambda t: torch.nn.functional.layer_norm(t, (7,))),
    ("layernorm_two_axes", lambda t: t.layernorm((1, 2)), lambda t: torch.nn.functional.layer_norm(t, (5, 7))),
])
def test_closed_form_gradients_match_torch_to_second_order(name, ours, theirs):
    """softmax, log_softmax and layernorm pull their gradients back from their outputs in closed form
    (custom_vjp); the first derivative and the derivative of its square's sum equal torch's."""
    rng = np.random.default_rng(3)
    x, g = (rng.standard_normal((3, 5, 7)).astype(np.float32) for _ in range(2))
    ex, tx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    gx, = ours(ex).gradient(ex, gradient=Tensor(g))
    tgx, = torch.autograd.grad(theirs(tx), tx, torch.tensor(g), create_graph=True)
    np.testing.assert_allclose(gx.numpy(), tgx.detach().numpy(), rtol=1e-5, atol=1e-6)
    ggx, = (gx * gx).sum().gradient(ex)
    tggx, = torch.autograd.grad((tgx * tgx).sum(), tx)
    np.testing.assert_allclose(ggx.numpy(), tggx.numpy(), rtol=1e-4, atol=1e-4)
