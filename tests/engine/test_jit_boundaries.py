"""What crosses a jitted function's boundary (engine/jit.py): outputs the caller keeps, intermediates the function
keeps, calls from several threads, Python numbers that change from call to call, gradients asked of a replay's output.

Oracle: the same function run eagerly (bit for bit where the replay runs the eager kernels), numpy for values."""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any, NamedTuple

import numpy as np
import pytest

from ember import JitError, Tensor, Variable, jit
from ember.helpers import RECORDERS


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
        for _ in range(12): record_from_threads()
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


# ---- Python numbers that change from call to call --------------------------------------------------------------------

def test_a_float_that_changes_every_call_is_fed_as_data_and_replays() -> None:
    """A learning-rate schedule: after the float took a second value it reaches fn as a 0-d tensor whose buffer each
    replay fills, so one replay serves every later value (no recording per value) with eager's bits, for float32 and
    float16 tensors (a 0-d tensor does not promote them, as the number does not)."""
    def step(w: Tensor, g: Tensor, lr: float) -> Tensor: return w - g * lr
    for dtype in (np.float32, np.float16):
        f = jit(step)
        w, g = (Tensor(np.random.default_rng(s).standard_normal(16).astype(dtype)) for s in (1, 2))
        for i in range(12):
            lr = 0.1 * 0.9 ** i
            got, want = f(w, g, lr), step(w, g, lr)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert len(f.replays) == 1 and not f.recordings  # one, whatever the number of learning rates


def test_a_float_fed_as_data_with_a_symbolic_batch_replays_one_recording() -> None:
    """Both change from call to call: the batch (a Variable) and the float (data); one replay serves them all."""
    bs = Variable("bs", 1, 32)
    def step(x: Tensor, lr: float) -> Tensor: return (x - x * lr).sum(1)
    f = jit(step)
    for i, n in enumerate([4, 9, 4, 17, 32, 1, 9]):
        x = Tensor(np.random.default_rng(i).standard_normal((n, 6)).astype(np.float32)).reshape(bs.bind(n), 6)
        lr = 0.5 / (i + 1)
        np.testing.assert_array_equal(f(x, lr).numpy(), step(x, lr).numpy())
    assert len(f.replays) == 1 and not f.recordings


def test_a_lazy_value_kept_from_a_recording_keeps_its_float() -> None:
    """A float fed as data lives in a buffer the next calls refill when nothing else refers to it; a lazy value the
    function kept from a recording (x * lr, unrealized) reads that buffer, so the next calls get buffers of their own
    and the kept value is the one its eager call computed."""
    kept: list[Tensor] = []

    def keep(x: Tensor, lr: float) -> Tensor:
        kept.append(x * lr)
        return x + lr
    f = jit(keep)
    x = full((4,), 2.0)
    for i in range(6): np.testing.assert_array_equal(f(x, 0.5 * (i + 1)).numpy(), (x + 0.5 * (i + 1)).numpy())
    assert len(kept) == 3  # (the recordings ran Python; replays do not)
    for i, t in enumerate(kept): np.testing.assert_array_equal(t.numpy(), np.full(4, 2.0 * 0.5 * (i + 1), np.float32))


def test_a_float_read_in_python_keys_recordings_and_stays_right() -> None:
    """Where fn reads the float's value in Python (a branch, math on it, returning it), feeding it as data would
    compute otherwise: jit finds the read and goes back to keying recordings by the value, with eager's results."""
    def branch(x: Tensor, lr: float) -> Tensor: return x * lr if lr > 0.5 else x - lr
    def returned(x: Tensor, lr: float) -> tuple[Tensor, float]: return x + lr, lr
    f, g = jit(branch), jit(returned)
    x = full((4,), 3.0)
    for lr in [1.0, 0.25, 2.0, 0.75, 0.1, 1.0, 0.25, 2.0]:
        np.testing.assert_array_equal(f(x, lr).numpy(), branch(x, lr).numpy())
        out, back = g(x, lr)
        assert type(back) is float and back == lr
        np.testing.assert_array_equal(out.numpy(), (x + lr).numpy())


def test_recordings_are_bounded_with_a_warning_naming_the_argument() -> None:
    """A step counter passed as an int keys a recording per value; past the limit jit warns once, naming it, and
    runs later new values eagerly: results stay right and no more recordings (with their buffers) are kept."""
    def step(x: Tensor, n: int) -> Tensor: return x * n + 1
    f = jit(step)
    x = full((1024,), 2.0)
    with pytest.warns(UserWarning, match=r"argument 'n' took 9 values") as caught:
        for n in range(30): np.testing.assert_array_equal(f(x, n).numpy(), step(x, n).numpy())
    assert len(caught) == 1
    assert len(f.recordings) + len(f.replays) == 8


# ---- gradients asked of a replay's output ----------------------------------------------------------------------------

def test_backward_through_a_replayed_output_raises_a_jit_error() -> None:
    """The recording calls return a graph, and gradients flow through it (checked against the derivative, x); a
    replay's output has none: backward() or gradient() through it raise a JitError saying so, not a misleading
    "no tensor with requires_grad" or a zero gradient."""
    w = Tensor(np.ones(4, np.float32), requires_grad=True)

    @jit
    def f(x: Tensor) -> Tensor: return (x * w).sum()
    for i in range(4):
        x = np.full(4, i + 1.0, np.float32)
        w.grad = None
        loss = f(Tensor(x))
        assert loss.item() == x.sum()
        if i < 2:
            loss.backward()
            np.testing.assert_array_equal(w.grad.numpy(), x)
        else:
            with pytest.raises(JitError, match="gradient would flow back through output 0 of a replay of f"):
                loss.backward()
            with pytest.raises(JitError, match="replay"): (loss * 2).gradient(w)


# ---- jit corner cases found in review ------------------------------------------------------------------------------


def test_nested_jit_replays_the_inner_kernels() -> None:
    @jit
    def inner(x: Tensor) -> Tensor: return x * 2 + 1

    @jit
    def outer(x: Tensor) -> Tensor: return inner(x).exp().sum() * 1.0
    for _ in range(3): inner(Tensor(np.ones(4, np.float32)))
    for i in range(6):
        a = np.full(4, i / 10, np.float32)
        np.testing.assert_allclose(outer(Tensor(a)).item(), np.exp(a * 2 + 1).sum(), rtol=1e-5)


@pytest.mark.xfail(strict=True, reason="jit: a weight's buffer is followed by buffer id: assigning w makes replays "
                                       "read w's new value where the function reads another tensor (a view taken "
                                       "before) that keeps the old one")
def test_jit_does_not_follow_a_tensor_it_does_not_read() -> None:
    w = Tensor(np.arange(4, dtype=np.float32))
    frozen = w.reshape(2, 2)  # a view taken now keeps these values (ember: views do not share storage)

    @jit
    def f(x: Tensor) -> Tensor: return (x * frozen).sum(axis=1)
    x = Tensor(np.ones((2, 2), np.float32))
    for _ in range(3): f(x)
    w.assign(Tensor(np.full(4, 100.0, np.float32))).realize()
    np.testing.assert_array_equal(f(x).numpy(), (x * frozen).sum(axis=1).numpy())


def test_jit_recording_ignores_other_threads() -> None:
    go, done = threading.Event(), threading.Event()
    results: list[Tensor] = []
    b_in = Tensor(np.arange(8, dtype=np.float32))

    def other_thread() -> None:
        go.wait()
        results.append((b_in * 3).realize())
        done.set()

    @jit
    def f(x: Tensor) -> Tensor:
        if not done.is_set():  # let the other thread run its eager op while this call records
            go.set()
            done.wait()
        y = (x + 1).realize()
        return (y * 2).exp2()
    for _ in range(2):
        go.clear()
        done.clear()
        t = threading.Thread(target=other_thread)
        t.start()
        f(Tensor(np.ones(8, np.float32)))
        t.join()
    f(Tensor(np.full(8, 5.0, np.float32)))
    for r in results: np.testing.assert_array_equal(r.numpy(), np.arange(8) * 3)


REUSED = 33_331  # floats: over Allocator's REUSE_MIN_BYTES, a size no other test frees


def refill(n: int) -> list[Tensor]:
    """Tensors of n floats filled with 7 until the allocator's pool of that size is empty (the freed memory is
    written)."""
    from ember.device import Device
    pool = Device["CPU"].allocator.kept
    out = [Tensor(np.full(n, 7.0, np.float32))]
    while pool.get(n * 4): out.append(Tensor(np.full(n, 7.0, np.float32)))
    return out


def test_jit_exception_after_lazy_assign_does_not_read_freed_memory() -> None:
    n = REUSED  # freed buffers this big are kept for reuse
    w = Tensor(np.zeros(n, np.float32))

    @jit
    def step(x: Tensor) -> Tensor:
        w.assign(w + x)
        raise ValueError("boom")
    x = Tensor(np.ones(n, np.float32))
    with pytest.raises(ValueError): step(x)
    del x
    gc.collect()
    reuse = refill(n)  # gets the freed memory
    assert w.numpy()[0] == 1.0
    del reuse


def test_jit_lazy_tensor_kept_by_the_function_does_not_read_freed_memory() -> None:
    n = REUSED
    kept: list[Tensor] = []

    @jit
    def f(x: Tensor) -> Tensor:
        kept.append(x * 2)
        return x + 1
    x = Tensor(np.ones(n, np.float32))
    f(x)
    del x
    gc.collect()
    reuse = refill(n)
    assert kept[0].numpy()[0] == 2.0
    del reuse


def test_jit_exception_while_recording_leaves_no_recorder_and_restores_inputs() -> None:
    calls = [0]

    @jit
    def f(x: Tensor) -> Tensor:
        calls[0] += 1
        y = (x * 2).realize()
        if calls[0] == 2: raise RuntimeError("inside")
        return y + 1
    x = Tensor(np.arange(4, dtype=np.float32))
    before = x.uop
    f(x)
    with pytest.raises(RuntimeError): f(x)
    assert not RECORDERS and x.uop is before
    for _ in range(3): np.testing.assert_array_equal(f(x).numpy(), np.arange(4) * 2 + 1)


def test_jit_returned_python_value_read_from_a_tensor() -> None:
    @jit
    def step(x: Tensor) -> tuple[Tensor, float]:
        y = (x * 2).contiguous()
        return y, y.sum().item()
    for i in range(4):
        try:
            t, v = step(Tensor(np.full(4, float(i), np.float32)))
        except JitError:
            return  # refusing is fine; returning the stale value is not
        assert v == t.numpy().sum() == 8.0 * i


def test_jit_namedtuple_output() -> None:
    class Out(NamedTuple):
        y: Tensor
        z: Tensor

    @jit
    def f(x: Tensor) -> Out: return Out(x * 2, x + 1)
    for i in range(4):
        r = f(Tensor(np.full(2, float(i), np.float32)))
        assert isinstance(r, Out)
        np.testing.assert_array_equal(r.y.numpy(), np.full(2, 2.0 * i))


def test_jit_non_tensor_output_and_kwargs() -> None:
    @jit
    def f(x: Tensor, *, scale: float = 2.0) -> tuple[Tensor, int, None]:
        return x * scale, 3, None
    for i in range(4):
        a = np.full(3, float(i), np.float32)
        t, k, n = f(Tensor(a), scale=3.0)
        np.testing.assert_array_equal(t.numpy(), a * 3)
        assert (k, n) == (3, None)
        np.testing.assert_array_equal(f(Tensor(a)).__getitem__(0).numpy(), a * 2)


def test_jit_numpy_negative_zero_argument_keys_apart() -> None:
    @jit
    def f(x: Tensor, s: float) -> Tensor: return x * s
    x = Tensor(np.ones(4, np.float32))
    for _ in range(3): f(x, np.float64(0.0))
    assert np.signbit(f(x, np.float64(-0.0)).numpy()).all()


def test_jit_nan_argument_replays() -> None:
    @jit
    def f(x: Tensor, s: float) -> Tensor: return x + s
    x = Tensor(np.ones(4, np.float32))
    for _ in range(6): assert np.isnan(f(x, float("nan")).numpy()).all()
    assert len(f.replays) == 1 and sum(map(len, f.recordings.values())) == 0


def test_jit_float_arguments_key_apart() -> None:
    @jit
    def f(x: Tensor, s: float) -> Tensor: return x * s
    x = Tensor(np.ones(4, np.float32))
    for s in [0.0, 0.0, 0.0, -0.0, -0.0, -0.0, 2, 2.0, True]:
        got, want = f(x, s).numpy(), (x * s).numpy()
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(got, want)


def arr(*shape: int, seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
    """Standard normal values of `shape` from `seed`."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
