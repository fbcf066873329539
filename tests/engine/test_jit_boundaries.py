"""What crosses a jitted function's boundary (engine/jit.py): outputs the caller keeps, intermediates the function
keeps, calls from several threads, Python numbers that change from call to call, gradients asked of a replay's output.

Oracle: the same function run eagerly (bit for bit where the replay runs the eager kernels), numpy for values."""

from __future__ import annotations

import sys
import threading

import numpy as np

from ember import JitError, Tensor, Variable, jit


def full(shape: tuple[int, ...], value: float) -> Tensor:
    return Tensor(np.full(shape, value, np.float32))


# ---- outputs the caller keeps ----------------------------------------------------------------------------------------

def test_kept_symbolic_outputs_keep_their_values_when_the_batch_changes() -> None:
    """A replay reuses an output's buffer only when nothing refers to the last one; a view of this call's sizes (a
    symbolic batch rebound) is another node on the same buffer, and the caller's reference to it counts."""
    bs = Variable("bs", 1, 64)

    @jit
    def double(x: Tensor) -> Tensor: return x * 2
    def call(n: int, v: float) -> Tensor: return double(full((n, 4), v).reshape(bs.bind(n), 4))
    call(8, 0.0)
    call(8, 0.0)
    kept = [(v, call(n, v)) for n, v in [(4, 1.0), (4, 2.0), (5, 3.0), (4, 4.0), (8, 5.0)]]
    for v, out in kept:
        np.testing.assert_array_equal(out.numpy(), (full((out.shape[0].unbind()[1], 4), v) * 2).numpy())


# ---- intermediates the function keeps --------------------------------------------------------------------------------

class Probe:
    """A two-layer model that keeps its realized activations (an attribute and a debug dict), as a user inspecting a
    network does; jitted or not."""

    def __init__(self, is_jitted: bool) -> None:
        rng = np.random.default_rng(3)
        self.w1, self.w2 = (Tensor(rng.standard_normal((6, 6)).astype(np.float32)).realize() for _ in range(2))
        self.debug: dict[str, Tensor] = {}
        self.last: Tensor | None = None
        self.step = jit(self.forward) if is_jitted else self.forward

    def forward(self, x: Tensor) -> Tensor:
        h = (x @ self.w1).relu().realize()
        self.last = h
        g = (h @ self.w2).tanh().realize()
        self.debug["g"] = g
        self.debug["lazy"] = g * 3  # a lazy value built on an intermediate
        return ((g @ self.w1).exp() + 1).sum(1)


def test_intermediates_the_function_keeps_read_each_calls_values() -> None:
    """Kept intermediates get memory of their own, outside the replay's arena, which each replay rewrites: after
    every call they hold that call's values, as after an eager call."""
    jitted, eager = Probe(True), Probe(False)
    for i in range(6):
        x = np.random.default_rng(i).standard_normal((4, 6)).astype(np.float32)
        got, want = jitted.step(Tensor(x)), eager.step(Tensor(x))
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        np.testing.assert_array_equal(jitted.last.numpy(), eager.last.numpy())
        for name in ("g", "lazy"): np.testing.assert_array_equal(jitted.debug[name].numpy(), eager.debug[name].numpy())


# ---- threads ---------------------------------------------------------------------------------------------------------

def test_threads_recording_at_once_get_right_values_and_a_working_function() -> None:
    """Recording is one call at a time per function (replays were already locked): threads that start together
    neither crash on the recordings' bookkeeping nor leave the function unable to replay."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # (threads switch often: their recordings overlap)
    try:
        for _ in range(4): record_from_threads()
    finally: sys.setswitchinterval(interval)


def record_from_threads() -> None:
    @jit
    def f(x: Tensor) -> Tensor: return (x * 2 + 1).sum()
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(i: int) -> None:
        try:
            start.wait()
            for _ in range(5): assert f(full((8,), float(i))).item() == (2 * i + 1) * 8
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors, errors
    assert f(full((8,), 5.0)).item() == 88 and f.replay is not None
