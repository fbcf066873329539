"""The schedule cache (ember/schedule/cache.py): a graph of a known structure reuses its schedule on new buffers,
with the values a fresh schedule gives; graphs that differ in anything the kernels depend on do not share one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import Tensor
from ember.helpers import Context
from ember.schedule import cache


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
