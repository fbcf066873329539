"""Memory planning of eager schedules (Tensor.realize -> run_schedule): intermediates of PLAN_MIN_BYTES or more share
an arena, the peak is printed at DEBUG=2, and values stay what numpy computes, also for intermediates read again."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ember import Context, Tensor
from ember.device import Device
from ember.engine import realize
from tests.helpers import cpu_only


def chain(depth: int, seed: int = 0) -> tuple[Tensor, np.ndarray, list[Tensor]]:
    """relu(relu(x @ w0) @ w1)...: each layer's result an intermediate of 256 x 512 floats (512 KB)."""
    rng = np.random.default_rng(seed)
    x = rng.random((256, 512), dtype=np.float32)
    ws = [(rng.random((512, 512), dtype=np.float32) - 0.5) / 20 for _ in range(depth)]
    h, want, layers = Tensor(x), x, []
    for w in ws:
        h = (h @ Tensor(w)).relu()
        layers.append(h)
        want = np.maximum(want @ w, 0)
    return h, want, layers


def test_a_large_schedule_shares_memory_and_reports_its_peak(capsys: pytest.CaptureFixture[str]) -> None:
    h, want, _ = chain(5)
    with Context(DEBUG=2): got = h.sum(1).numpy()
    out = capsys.readouterr().out
    line = re.search(r"memory plan: (\d+) intermediates .* peak ([\d.]+) MB of ([\d.]+) MB unplanned", out)
    assert line, out
    assert int(line.group(1)) >= 3 and float(line.group(2)) < float(line.group(3))
    np.testing.assert_allclose(got, want.sum(1), rtol=2e-5, atol=1e-4)


def test_an_intermediate_read_again_is_computed_again(capsys: pytest.CaptureFixture[str]) -> None:
    """A planned intermediate's memory holds another value after the schedule: a later read must not use it."""
    h, want, layers = chain(4, seed=1)
    with Context(DEBUG=2): h.realize()
    assert "memory plan" in capsys.readouterr().out
    first = layers[0].numpy()  # was an intermediate of the schedule above, in the shared arena
    rng = np.random.default_rng(1)
    x, w0 = rng.random((256, 512), dtype=np.float32), (rng.random((512, 512), dtype=np.float32) - 0.5) / 20
    np.testing.assert_allclose(first, np.maximum(x @ w0, 0), rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(h.numpy(), want, rtol=2e-5, atol=1e-5)


def test_small_schedules_are_not_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = []
    monkeypatch.setattr(realize, "plan_memory", lambda *a: planned.append(a))
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(((x * 2).exp().sum(1) + x.max(axis=1)).numpy(), np.exp(a * 2).sum(1) + a.max(1),
                               rtol=1e-6)
    assert not planned


@cpu_only("the host allocator keeps a freed arena for the next plan; CL releases it")
def test_an_arena_goes_back_to_the_allocator_for_the_next_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """An eager schedule run again plans an arena of the same size: it takes the last one's memory (no fresh
    allocation to fault in page by page), and its values stay right."""
    from ember.engine import memory
    arenas = []
    real = memory.aligned_arena
    memory_aligned = lambda device, nbytes: arenas.append(real(device, nbytes)) or arenas[-1]  # noqa: E731
    try:
        memory.aligned_arena = memory_aligned
        for seed in range(3):
            h, want, _ = chain(4, seed=seed)
            np.testing.assert_allclose(h.numpy(), want, rtol=2e-5, atol=1e-5)
    finally:
        memory.aligned_arena = real
    assert len(arenas) == 3 and arenas[1].base is arenas[0].base and arenas[2].base is arenas[0].base


def test_realize_graph_is_the_engine_entry_that_computes_and_records_outputs() -> None:
    """Tensor.realize delegates to realize_graph: the outputs' views read numpy's values, each computed node is
    entered in kernelize.computed (a later graph over it runs one kernel, not two), and with a memory plan a view
    of a buffer that now holds another value is not entered."""
    from ember.engine.realize import GlobalCounters, realize_graph
    from ember.schedule.kernelize import computed
    x = np.arange(6, dtype=np.float32)
    a = Tensor(x).realize()
    u = ((a + 1) * 2).uop
    views, walked = realize_graph([u], Device.DEFAULT)
    assert computed[u] is views[0] and walked is not None and u in walked
    np.testing.assert_array_equal(Tensor(views[0]).numpy(), (x + 1) * 2)
    before = GlobalCounters.kernel_count
    np.testing.assert_array_equal(Tensor(u).exp2().numpy(), np.exp2((x + 1) * 2))
    assert GlobalCounters.kernel_count - before == 1
    h, want, layers = chain(4, seed=3)
    views, walked = realize_graph([h.uop], "CPU")  # intermediates of 512 KB: planned into an arena
    np.testing.assert_allclose(Tensor(views[0]).numpy(), want, rtol=1e-4, atol=1e-5)
    assert [layer.uop in computed for layer in layers] == [False, False, False, True]  # the arena's are reused


def arr(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- eager memory plan (Tensor.realize -> realize_graph) -----------------------------------------------------------

N = 1 << 18  # 1 MiB of float32: intermediates this big are planned


def test_eager_plan_several_outputs_and_held_intermediates() -> None:
    for seed in range(2):  # the second round runs from the schedule's template
        an = arr(N, seed=seed)
        a = Tensor(an)
        h1 = (a * 2).contiguous()
        h2 = (h1 + 1).contiguous()
        h3 = (h2 * h2).contiguous()
        out1, out2 = h3.sum(), (h3 - h1).contiguous()
        out1.realize(out2)
        np.testing.assert_allclose(out1.numpy(), ((an * 2 + 1) ** 2).sum(), rtol=1e-4)
        np.testing.assert_allclose(out2.numpy(), (an * 2 + 1) ** 2 - an * 2, rtol=1e-6)
        np.testing.assert_allclose(h2.numpy(), an * 2 + 1, rtol=1e-6)  # held, shared in the arena: recomputed
        np.testing.assert_allclose(h1.numpy(), an * 2, rtol=1e-6)


def test_eager_plan_with_a_tensor_that_carries_gradient() -> None:
    an = arr(N, seed=3)
    w = Tensor(an, requires_grad=True)
    g1 = (w * 3).contiguous()
    g2 = (g1.exp() * 0.001).contiguous()
    loss = (g2 * g1).sum()
    loss.realize()
    loss.backward()
    e = np.exp(an * 3) * 0.001
    np.testing.assert_allclose(w.grad.numpy(), e * 3 * an * 3 + e * 3, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(g2.numpy(), e, rtol=1e-4)


def test_eager_plan_with_a_loop() -> None:
    from ember.scan import scan
    cn, xn = arr(N, seed=4) * 0.1, arr(3, N, seed=5) * 0.1

    def step(c: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        c2 = (c * 0.5 + x).tanh()
        return c2, c2.sum().reshape(1)
    c, ys = scan(step, (Tensor(cn) * 1.0).contiguous(), (Tensor(xn) + 0.0).contiguous(), unroll=False)
    out = ((c * 2).contiguous() + 1).contiguous()
    out.realize(ys)
    want, wys = cn.copy(), []
    for k in range(3):
        want = np.tanh(want * 0.5 + xn[k])
        wys.append(want.sum())
    np.testing.assert_allclose(out.numpy(), want * 2 + 1, atol=1e-5)
    np.testing.assert_allclose(ys.numpy().ravel(), wys, rtol=1e-3)
