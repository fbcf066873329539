"""The schedule cache (ember/schedule/cache.py): a graph of a known structure reuses its schedule on new buffers,
with the values a fresh schedule gives; graphs that differ in anything the kernels depend on do not share one."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from ember import Tensor, jit, no_grad
from ember.device import buffer_of
from ember.helpers import Context
from ember.schedule import cache
from ember.schedule.kernelize import is_buffer_view
from ember.uop.ops import Ops


@pytest.fixture
def schedules(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the graphs kernelize schedules (the cache's misses) into its one element."""
    count = [0]
    original = cache.create_schedule

    def counted(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)
    monkeypatch.setattr(cache, "create_schedule", counted)
    return count


def rand(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def mlp(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    return (x @ w1).relu().matmul(w2).log_softmax(-1)


PROGRAMS = {
    "add": (lambda a, b: a + 1, lambda a, b: a + 1),
    "broadcast": (lambda a, b: a * b[:1] - a.sum(0), lambda a, b: a * b[:1] - a.sum(0)),
    "softmax": (lambda a, b: a.softmax(-1), lambda a, b: torch.softmax(a, -1)),
    "pad-cat": (lambda a, b: a.pad(((1, 0), (0, 2))).cat(b.pad(((0, 1), (2, 0))), dim=0).exp(),
                lambda a, b: torch.cat([torch.nn.functional.pad(a, (0, 2, 1, 0)),
                                        torch.nn.functional.pad(b, (2, 0, 0, 1))], 0).exp()),
    "mlp": (lambda a, b: mlp(a, b.T, b), lambda a, b: torch.log_softmax(torch.relu(a @ b.T) @ b, -1)),
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_second_graph_of_the_same_structure_reuses_the_schedule(name: str, schedules: list[int]) -> None:
    ours, theirs = PROGRAMS[name]
    for seed in range(3):
        a, b = rand(6, 5, seed=seed), rand(6, 5, seed=seed + 10)
        got = ours(Tensor(a), Tensor(b)).numpy()
        want = theirs(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        if seed == 0: first = schedules[0]
    assert schedules[0] == first, "the second and third graphs were scheduled anew"


def test_backward_and_an_optimizer_step_reuse_schedules(schedules: list[int]) -> None:
    from ember.nn.optim import SGD
    w = Tensor(rand(4, 3, seed=1), requires_grad=True)
    opt = SGD([w], lr=0.1)
    w_torch = torch.tensor(rand(4, 3, seed=1), requires_grad=True)
    opt_torch = torch.optim.SGD([w_torch], lr=0.1)
    for step in range(4):
        x = rand(5, 4, seed=step)
        opt.zero_grad()
        (Tensor(x) @ w).tanh().sum().backward()
        opt.step()
        opt_torch.zero_grad()
        (torch.tensor(x) @ w_torch).tanh().sum().backward()
        opt_torch.step()
        np.testing.assert_allclose(w.numpy(), w_torch.detach().numpy(), rtol=1e-5, atol=1e-6)
        if step == 1: settled = schedules[0]
    assert schedules[0] == settled


@pytest.mark.parametrize("make", [
    lambda a: a + 0.0, lambda a: a + (-0.0),  # the same number to ==, not to the bits
    lambda a: a * 2, lambda a: a.cast("float64") * 2, lambda a: a.reshape(5, 6) * 2, lambda a: a + a,
])
def test_graphs_that_differ_get_their_own_schedule(make, schedules: list[int]) -> None:
    x = Tensor(np.array([-0.0] * 30, dtype=np.float32).reshape(6, 5))
    others = [lambda a: a + 0.0, lambda a: a + (-0.0), lambda a: a * 2, lambda a: a.cast("float64") * 2,
              lambda a: a.reshape(5, 6) * 2, lambda a: a + a]
    for other in others: other(x).numpy()
    before = schedules[0]
    y = make(Tensor(np.array([-0.0] * 30, dtype=np.float32).reshape(6, 5)))
    got = y.numpy()
    assert schedules[0] == before  # each shape above is a template now: hits
    want = make(Tensor(np.array([-0.0] * 30, dtype=np.float32).reshape(6, 5)).contiguous()).numpy()
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    np.testing.assert_array_equal(got, want)


def test_negative_zero_constant_is_not_served_the_positive_one() -> None:
    x = Tensor(np.full(4, -0.0, dtype=np.float32))
    assert np.signbit((x + 0.0).numpy()).sum() == 0  # -0 + 0 = +0
    assert np.signbit((Tensor(np.full(4, -0.0, dtype=np.float32)) + (-0.0)).numpy()).all()  # -0 + -0 = -0


def test_a_flag_change_schedules_anew(schedules: list[int]) -> None:
    a = Tensor(rand(64, 64, seed=3))
    (a * 3).sum(1).numpy()
    before = schedules[0]
    with Context(NOOPT=1): got = (Tensor(rand(64, 64, seed=3)) * 3).sum(1).numpy()
    assert schedules[0] == before + 1
    np.testing.assert_allclose(got, (rand(64, 64, seed=3) * 3).sum(1), rtol=1e-4, atol=1e-5)


def test_aliased_inputs_are_their_own_structure(schedules: list[int]) -> None:
    a, b = rand(8, seed=4), rand(8, seed=5)
    np.testing.assert_allclose((Tensor(a) * Tensor(b)).numpy(), a * b, rtol=1e-6)
    t = Tensor(a)
    np.testing.assert_allclose((t * t).numpy(), a * a, rtol=1e-6)  # one buffer twice: not the a * b template
    np.testing.assert_allclose((Tensor(b) * Tensor(a)).numpy(), a * b, rtol=1e-6)


def test_a_stored_node_is_read_not_recomputed(schedules: list[int]) -> None:
    """A node an earlier realize stored (kernelize.computed) keys by the view it is read through."""
    for seed in range(2):
        a = Tensor(rand(16, seed=seed))
        s = a.exp()
        s.realize()
        out = (s + 1).numpy()
        np.testing.assert_allclose(out, np.exp(rand(16, seed=seed)) + 1, rtol=1e-6)


def test_folds_are_scheduled_every_time(schedules: list[int]) -> None:
    from ember.scan import fold
    for seed in range(2):
        xs = rand(5, 3, seed=seed)
        got = fold(lambda c, x: c * 0.5 + x, Tensor(np.zeros(3, np.float32)), Tensor(xs)).numpy()
        want = np.zeros(3, np.float32)
        for row in xs: want = want * 0.5 + row
        np.testing.assert_allclose(got, want, rtol=1e-6)


def arr(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- moved from the review of eager dispatch: cached graphs, broadcast constants -----------------------------------


def test_cache_node_stored_under_a_rebuilt_form() -> None:
    """x + 1 is computed twice (one node, two tensors); (x + 1) * 2 was realized from the realized x: a later
    x2 * 2 reads that stored value. The second and third rounds (new data, same structure) read zeros."""
    for seed in range(3):
        a = arr(8, seed=seed)
        t = Tensor(a)
        x, x2 = t + 1, t + 1      # one node: x2 keeps it alive after x is realized
        x.realize()
        y, y2 = x * 2, x * 2      # one node on x's buffer: y2 keeps it (and its stored value) alive
        y.realize()
        z = (x2 * 2).realize()    # kernelize: x2 -> x's buffer, then x's buffer * 2 -> y's buffer
        np.testing.assert_allclose(z.numpy(), (a + 1) * 2, rtol=1e-6)
        del y2


def test_cache_output_that_is_a_view_of_a_stored_node_is_realized() -> None:
    for seed in range(3):
        t = Tensor(arr(8, seed=seed))
        x, x2 = t + 1, t + 1
        x.realize()
        r = x2.reshape(2, 4).realize()
        assert is_buffer_view(r.uop), f"round {seed}: realize() left {r.uop.op} lazy"


def test_jit_output_that_is_a_view_of_a_stored_node() -> None:
    @jit
    def f(x: Tensor) -> Tensor:
        y, y2 = x * 2, x * 2
        y.realize()
        return y2.reshape(2, 4)
    for i in range(4):
        a = np.arange(8, dtype=np.float32) + i
        np.testing.assert_array_equal(f(Tensor(a)).numpy(), (a * 2).reshape(2, 4))


def test_cache_stored_node_read_directly_works() -> None:
    """The case cache.structure does key: an output that is itself a stored node, and a graph over one."""
    for seed in range(3):
        a = arr(8, seed=seed)
        t = Tensor(a)
        x, x2 = t.exp(), t.exp()
        x.realize()
        np.testing.assert_allclose(x2.realize().numpy(), np.exp(a), rtol=1e-6)
        np.testing.assert_allclose((x2 * 3).numpy(), np.exp(a) * 3, rtol=1e-6)


@pytest.mark.parametrize("make", [
    lambda a: a.reshape(1, 8) + 1, lambda a: a.reshape(1, 1, 8) + 1, lambda a: a.reshape(8, 1) + 1,
    lambda a: a + float("nan"), lambda a: a + float("inf"), lambda a: a + (-float("inf")),
    lambda a: (a > 0) + 1, lambda a: (a > 0).int() + 1, lambda a: a.pad(((1, 0),)), lambda a: a.flip(0) * 2,
    lambda a: a.cast("float64") + 1, lambda a: a.cast("float16") + 1,
])
def test_cache_graphs_that_differ_keep_their_own_values(make) -> None:
    """Graphs alike but for shapes (1,) vs (1, 1), NaN/inf constants, bool vs int, dtypes, movement args: each
    gets its own schedule; every variant is run after every other so a collision would serve a wrong template."""
    variants = [lambda a: a.reshape(1, 8) + 1, lambda a: a.reshape(1, 1, 8) + 1, lambda a: a.reshape(8, 1) + 1,
                lambda a: a + float("nan"), lambda a: a + float("inf"), lambda a: a + (-float("inf")),
                lambda a: (a > 0) + 1, lambda a: (a > 0).int() + 1, lambda a: a.pad(((1, 0),)),
                lambda a: a.flip(0) * 2, lambda a: a.cast("float64") + 1, lambda a: a.cast("float16") + 1]
    for v in variants: v(Tensor(arr(8, seed=1))).numpy()
    a = arr(8, seed=2)
    got = make(Tensor(a))
    want = make(Tensor(a).contiguous().realize() + 0)  # another structure: scheduled on its own
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_cache_flag_flip_and_back_keeps_values() -> None:
    a = arr(64, 64, seed=3)
    want = (a * 3).sum(1)
    for flags in ({}, {"NOOPT": 1}, {}, {"UNROLL": 0}, {}):
        with Context(**flags): got = (Tensor(a) * 3).sum(1).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_cache_keys_hold_no_graph() -> None:
    """A template's key holds no UOp but constants (a graph would keep its buffers alive for the cache's life); the
    constants it holds are the graph's own nodes (what a key compares by identity must stay alive with it)."""
    x = Tensor(arr(8))
    (x * 5 + 2).realize()
    from ember.schedule.kernelize import is_constant
    from ember.uop.ops import UOp

    def uops(k) -> list:
        return [k] if isinstance(k, UOp) else [u for v in k for u in uops(v)] if isinstance(k, tuple) else []
    held = [u for k in list(cache.templates)[-5:] for u in uops(k)]
    assert held and all(is_constant(u) for u in held)
    assert all(u.op is not Ops.BUFFER for k in held for u in k.toposort())



def test_broadcast_constant_under_no_grad_and_with_gradients() -> None:
    a = arr(4, seed=6)
    w = Tensor(a, requires_grad=True)
    with no_grad():
        d = w * 2 + 1
    assert d.uop.op is Ops.DETACH
    loss = ((w * 2 + 1) * d).sum()
    np.testing.assert_allclose(loss.gradient(w)[0].numpy(), 2 * (a * 2 + 1), rtol=1e-6)
    assert (1 - Tensor(a) * 0.5).tolist() == pytest.approx((1 - a * 0.5).tolist())
    assert ((Tensor(a) > 0.0).numpy() == (a > 0)).all()


def test_pickled_buffer_uop_is_the_live_node() -> None:
    t = Tensor(arr(4, seed=7))
    u = t.uop.src[0]
    assert u.op is Ops.BUFFER
    back = pickle.loads(pickle.dumps(t.uop))
    assert back is t.uop and buffer_of(back.src[0]) is buffer_of(u)
