"""ember.jit (engine/jit.py): a function's kernels recorded on its first calls and replayed on later ones.

Oracle: the same function run eagerly on the same inputs, compared bit for bit (the replay runs the very kernels the
eager run schedules, so nothing may differ, not even rounding). Random programs come from the fuzzer of
tests/test_random_programs.py: its ember lines, inputs made arguments, run inside a jitted function. Footguns must
raise JitError naming the problem; what the module docstring documents (a global changed after the recordings is not
seen, a weight assigned outside is followed) is asserted as documented.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
import ember.schedule.cache
import ember.schedule.kernelize
from ember import JitError, Tensor, TinyJit, jit
from ember.device import buffer_of
from ember.engine.jit import stored_buffer
from ember.engine.memory import MemoryPlan
from ember.nn import Linear
from ember.nn.optim import SGD, Adam
from tests.helpers import cpu_only
from tests.test_random_programs import Program, ints, leaf, perm, weights


def arr(*shape: int, seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
    """Standard normal values of `shape` from `seed`."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def assert_same(got: Tensor, want: Tensor) -> None:
    """Same dtype, shape and bytes."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    g, w = got.numpy(), want.numpy()
    assert g.tobytes() == w.tobytes(), f"replay\n{g}\neager\n{w}"


def full(value: float, n: int = 3) -> Tensor:
    return Tensor(np.full(n, value, np.float32))


# ---- 1a. random programs: replay == eager, bit for bit ---------------------------------------------------------------

INPUT_LINE = re.compile(r"^(v\d+) = Tensor\((leaf|ints)\((\(.*?\)), (\d+)\)(, requires_grad=True)?\)$")


def program_function(seed: int) -> tuple[Callable[..., Tensor], list[tuple[str, tuple[int, ...]]]]:
    """The ember side of random program `seed` as a function of its inputs (the leaf()/ints() lines), returning every
    value it made flattened into one tensor (as Program.check compares them), and the inputs' kinds and shapes.

    An input the program writes with setitem is cloned first (a jitted function may not assign its arguments)."""
    program = Program(seed, 6).build()
    program.release()
    inputs: list[tuple[str, str, tuple[int, ...]]] = []
    body: list[str] = []
    for ours, _ in program.lines:
        if (m := INPUT_LINE.match(ours)) is not None: inputs.append((m[1], m[2], eval(m[3])))
        else: body.append(ours)
    names = [name for name, _, _ in inputs]
    written = {name for name in names if any(line.startswith(f"{name}[") for line in body)}
    cast = ".long()" if program.is_int else ".float()"
    made = [v.name for v in program.values if not v.is_input]
    # one output of every value the program made; the zero at the end keeps the output from being an input when the
    # program made nothing but a view of one
    result = f"Tensor.cat({', '.join(f'{name}.flatten(){cast}' for name in made)}, Tensor.zeros(1){cast})"

    def fn(*tensors: Tensor) -> Tensor:
        ns: dict[str, Any] = {"Tensor": Tensor, "leaf": leaf, "ints": ints, "perm": perm, "weights": weights, "np": np}
        ns.update({n: t.clone() if n in written else t for n, t in zip(names, tensors)})
        for line in body: exec(line, ns)
        return eval(result, ns)

    fn.__doc__ = "\n".join(body)
    return fn, [(kind, shape) for _, kind, shape in inputs]


@pytest.mark.parametrize("seed", range(30))
def test_random_program_replays_equal_eager(seed: int) -> None:
    """Five calls with new input values: every one (two recordings, three replays) equals the eager run."""
    fn, inputs = program_function(seed)
    f = jit(fn)
    for call in range(5):
        values = [(leaf if kind == "leaf" else ints)(shape, 1000 * seed + call) for kind, shape in inputs]
        got = f(*[Tensor(v) for v in values])
        want = fn(*[Tensor(v) for v in values])
        assert got.numpy().tobytes() == want.numpy().tobytes(), f"seed {seed}, call {call}:\n{fn.__doc__}"
    assert f.replay is not None


@cpu_only("kernels on the thread pool")
def test_large_threaded_kernels_replay_equal_eager() -> None:
    """512x512 operands: kernels that run on the thread pool inside the native graph."""
    def fn(x: Tensor, y: Tensor) -> Tensor: return ((x * y + 1).sqrt() @ y.T).relu().sum(1)
    f = jit(fn)
    for call in range(4):
        a, b = arr(512, 512, seed=call), arr(512, 512, seed=call + 50)
        assert_same(f(Tensor(a), Tensor(b)), fn(Tensor(a), Tensor(b)))
    assert f.replay is not None and any(runner.program.threads > 1 for runner, _, _ in f.replay.kernels)


def test_output_fed_back_as_next_input() -> None:
    """x = f(x) in a loop: each call's input is the previous call's output, still held while the call runs."""
    def fn(x: Tensor) -> Tensor: return x.softmax(-1) @ x.T - 0.25
    f = jit(fn)
    x = y = Tensor(arr(4, 4))
    for _ in range(8):
        x, y = f(x), fn(y)
        assert_same(x, y)


# ---- 1b. training loops ----------------------------------------------------------------------------------------------

def train(optimizer: Callable[[list[Tensor]], Any], jitted: bool, steps: int = 6) -> tuple[list[bytes], list[bytes]]:
    """An MLP (Linear, relu, Linear) trained on new data every step; the losses and final parameters as bytes."""
    Tensor.manual_seed(0)
    l1, l2 = Linear(4, 8), Linear(8, 3)
    params = [l1.weight, l1.bias, l2.weight, l2.bias]
    opt = optimizer(params)

    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = ((l2(l1(x).relu()) - y) ** 2).mean()
        loss.backward()
        opt.step(loss)
        return loss

    f = jit(step) if jitted else step
    losses = [f(Tensor(arr(5, 4, seed=k)), Tensor(arr(5, 3, seed=k + 100))).numpy().tobytes() for k in range(steps)]
    if jitted: assert f.replay is not None
    return losses, [p.numpy().tobytes() for p in params]


@pytest.mark.parametrize("optimizer", [
    lambda ps: SGD(ps, lr=0.1), lambda ps: SGD(ps, lr=0.1, momentum=0.9), lambda ps: Adam(ps, lr=0.01)],
    ids=["sgd", "sgd-momentum", "adam"])
def test_training_loop_jitted_equals_eager(optimizer: Callable[[list[Tensor]], Any]) -> None:
    """Losses of every step and the parameters after six steps, bit for bit (SGD with momentum's first step runs
    other kernels: a third recording stands in for it)."""
    eager_losses, eager_params = train(optimizer, jitted=False)
    jit_losses, jit_params = train(optimizer, jitted=True)
    assert jit_losses == eager_losses
    assert jit_params == eager_params
    assert len(set(jit_losses)) == len(jit_losses)  # the loss changes: the replays updated the parameters


@cpu_only("a replay's state buffers alternate on the CPU; on CL each step takes a new one (not done)")
def test_a_state_buffer_is_reused_only_when_nothing_reads_it() -> None:
    """A replay writes a parameter's new value into the buffer it left at the call before, when nothing else refers
    to that buffer: a snapshot of an old value (a detached view, the old tensor's graph) keeps its values."""
    w = Tensor(arr(4, 3), requires_grad=True)
    opt = SGD([w], lr=0.5)

    @jit
    def step(x: Tensor) -> Tensor:
        opt.zero_grad()
        loss = (x @ w).square().sum()
        loss.backward()
        opt.step(loss)
        return loss
    x = Tensor(arr(2, 4, seed=3))
    for _ in range(3): step(x)
    buffers = []
    for _ in range(4):
        step(x)
        buffers.append(id(stored_buffer(w.uop)))
    assert len(set(buffers)) == 2  # two buffers in turn: each call reads one and writes the other
    snapshot = w.detach()
    kept = snapshot.numpy().copy()
    expected = w.numpy().copy()
    for _ in range(3):
        step(x)
        x_np, w_np = x.numpy(), expected
        expected = w_np - 0.5 * (2 * x_np.T @ (x_np @ w_np))
        np.testing.assert_array_equal(snapshot.numpy(), kept)  # the old value's buffer is not written
        np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5, atol=1e-6)


# ---- 1c. random numbers ----------------------------------------------------------------------------------------------

def noisy(x: Tensor) -> Tensor:
    """Dropout and a uniform draw: two draws a call."""
    with Tensor.train():
        return x.dropout(0.5) + Tensor.rand(6)


def draw_sequence(f: Callable[[Tensor], Tensor]) -> list[bytes]:
    """Six calls after manual_seed(7), then the generator reseeded and three more calls."""
    Tensor.manual_seed(7)
    out = [f(Tensor(arr(6, seed=k))).numpy().tobytes() for k in range(6)]
    Tensor.manual_seed(7)
    return out + [f(Tensor(arr(6, seed=k))).numpy().tobytes() for k in range(3)]


def test_random_draws_are_new_each_replay_and_equal_eager() -> None:
    """Each replay draws new numbers, the ones the eager calls draw after the same seed; reseeding restarts them."""
    f = jit(noisy)
    got, want = draw_sequence(f), draw_sequence(noisy)
    assert f.replay is not None
    assert got == want
    assert len(set(got[:6])) == 6  # new numbers every call (the inputs alone would not differ this way)
    assert got[6:] == got[:3]


# ---- 2. arguments ----------------------------------------------------------------------------------------------------

def nested(a: Tensor, pair: list[Tensor], d: dict[str, Tensor], scale: float = 1.0, *, bias: Tensor
           ) -> dict[str, Any]:
    x, y = pair
    return {"s": (a * scale + x).sum(0), "t": (d["w"] @ y + bias, a.max())}


def test_kwargs_containers_and_nested_outputs() -> None:
    """Tensors in a list, a dict and a keyword argument; a dict holding a tuple comes back with the same structure."""
    f = jit(nested)
    for k in range(5):
        def args(k: int = k) -> tuple[tuple, dict]:
            return ((Tensor(arr(3, 4, seed=k)), [Tensor(arr(4, seed=k + 10)), Tensor(arr(4, 2, seed=k + 20))],
                     {"w": Tensor(arr(2, 4, seed=k + 30))}, 2.0), {"bias": Tensor(arr(2, 2, seed=k + 40))})
        got, want = f(*args()[0], **args()[1]), nested(*args()[0], **args()[1])
        assert list(got) == ["s", "t"] and type(got["t"]) is tuple and len(got["t"]) == 2
        assert_same(got["s"], want["s"])
        assert_same(got["t"][0], want["t"][0])
        assert_same(got["t"][1], want["t"][1])
    assert f.replay is not None


def test_keyword_order_keys_a_recording() -> None:
    """f(x=a, y=b) and f(y=b, x=a) are both right (two keys)."""
    def fn(x: Tensor, y: Tensor) -> Tensor: return x - y
    f = jit(fn)
    for k in range(4):
        a, b = Tensor(arr(3, seed=k)), Tensor(arr(3, seed=k + 9))
        assert_same(f(x=a, y=b), fn(a, b))
        assert_same(f(y=b, x=a), fn(a, b))


def test_non_tensor_argument_keys_recordings() -> None:
    """A new value of a non-Tensor argument records anew and gives its own result; the old value still replays. A
    float that takes a second value is fed as data from then on: one replay serves both of its values."""
    def fn(x: Tensor, k: float, mode: str) -> Tensor: return x * k if mode == "mul" else x + k
    f = jit(fn)
    for call in range(4):
        for k, mode in [(2.0, "mul"), (3.0, "mul"), (2.0, "add")]:
            x = Tensor(arr(5, seed=call))
            assert_same(f(x, k, mode), fn(x, k, mode))
    assert len(f.replays) == 2 and not f.recordings


def test_non_tensor_arguments_equal_but_of_other_types_do_not_share_a_recording() -> None:
    """jit(lambda x, k: x * k) on an int32 x: three calls with k=2, then k=2.0 must give float32."""
    def fn(x: Tensor, k: float) -> Tensor: return x * k
    f = jit(fn)
    x = Tensor(np.array([1, 2, 3], np.int32))
    for _ in range(3): f(x, 2)
    assert_same(f(x, 2.0), fn(x, 2.0))


def test_same_tensor_twice_and_two_tensors() -> None:
    """f(t, t) and f(t, u) are recorded apart (which arguments share a buffer is part of the key), both right."""
    def fn(a: Tensor, b: Tensor) -> Tensor: return a * 2 + b
    f = jit(fn)
    for k in range(5):
        t, u = Tensor(arr(3, seed=k)), Tensor(arr(3, seed=k + 100))
        assert_same(f(t, t), fn(t, t))
        assert_same(f(t, u), fn(t, u))
    assert len(f.replays) == 2


@pytest.mark.parametrize("view", [lambda b: b.T, lambda b: b[1:], lambda b: b[1:].T, lambda b: b.exp() - 1],
                         ids=["transpose", "slice", "slice-transpose", "lazy"])
def test_lazy_and_non_contiguous_inputs_are_realized_first(view: Callable[[Tensor], Tensor]) -> None:
    """An input that is a view of part of a buffer, permuted, or not computed yet, gives the eager result; after the
    call it holds a buffer of its own."""
    def fn(a: Tensor) -> Tensor: return a * 3 + 1
    f = jit(fn)
    for k in range(5):
        base = Tensor(arr(4, 3, seed=k)).realize()
        x = view(base)
        want = fn(view(base))
        assert_same(f(x), want)
        assert stored_buffer(x.uop) is not None
    assert f.replay is not None


class Scaler:
    """A class with a jitted method: each instance keys its own recordings."""

    def __init__(self, k: float) -> None: self.w = full(k)

    @jit
    def forward(self, x: Tensor) -> Tensor: return x * self.w + 1


def test_jit_on_a_method_binds_each_instance() -> None:
    """Two instances, interleaved: each call uses its own instance's weight."""
    a, b = Scaler(2.0), Scaler(5.0)
    for k in range(4):
        x = Tensor(arr(3, seed=k))
        assert_same(a.forward(x), x * a.w + 1)
        assert_same(b.forward(x), x * b.w + 1)
    assert isinstance(Scaler.forward, TinyJit) and len(Scaler.forward.replays) == 2


# ---- 3. footguns -----------------------------------------------------------------------------------------------------

def recorded(fn: Callable[..., Any], *args: Any) -> jit:
    """jit(fn) called three times on args (two recordings and a replay)."""
    f = jit(fn)
    for _ in range(3): f(*args)
    assert f.replay is not None
    return f


def test_changed_shape_raises() -> None:
    f = recorded(lambda x: x + 1, full(0.0))
    with pytest.raises(JitError, match=r"argument 0 is float32 \(4,\).*recorded as float32 \(3,\)"): f(full(0.0, 4))


def test_changed_dtype_raises() -> None:
    f = recorded(lambda x: x + 1, full(0.0))
    with pytest.raises(JitError, match=r"argument 0 is int32 \(3,\).*recorded as float32"):
        f(Tensor(np.zeros(3, np.int32)))


SCALE = [1.0]  # a "global" the functions below read


def test_global_changing_between_recordings_raises() -> None:
    """A Python number read by the function, new at every call: the recordings differ and the jit refuses."""
    def fn(x: Tensor) -> Tensor: return x * SCALE[0]
    f = jit(fn)
    SCALE[0] = 1.0
    assert_same(f(full(1.0)), full(1.0))
    SCALE[0] = 2.0
    assert_same(f(full(1.0)), full(2.0))  # a second recording stands in for a first that may have differed
    SCALE[0] = 3.0
    with pytest.raises(JitError, match="do not run the same kernels.*a Python value it reads"): f(full(1.0))


def test_global_in_a_host_constant_changing_between_recordings_raises() -> None:
    """jit(lambda x: x * Tensor([S] * 3)) with S new at every call: the recordings differ, so JitError (or the
    right values)."""
    def fn(x: Tensor) -> Tensor: return x * Tensor([SCALE[0]] * 3)
    f = jit(fn)
    for k in range(1, 5):
        SCALE[0] = float(k)
        try: got = f(full(1.0))
        except JitError: return
        assert_same(got, full(float(k)))


def test_global_changed_after_recording_is_not_seen() -> None:
    """As documented: once replaying, the function's Python code does not run, so a changed global is not seen."""
    def fn(x: Tensor) -> Tensor: return x * SCALE[0]
    SCALE[0] = 2.0
    f = recorded(fn, full(1.0))
    SCALE[0] = 5.0
    assert_same(f(full(1.0)), full(2.0))
    assert_same(fn(full(1.0)), full(5.0))


@pytest.mark.parametrize("realized", [True, False], ids=["realized", "lazy"])
def test_weight_assigned_outside_is_followed(realized: bool) -> None:
    """A global weight the function reads, given a new value outside it (assign, realized or not): the replay
    reads the new value, as the eager function does."""
    w = full(1.0).realize()
    f = recorded(lambda x: x * w, full(2.0))
    w.assign(full(10.0))
    if realized: w.realize()
    assert_same(f(full(2.0)), full(20.0))
    w.assign(w * 3)
    assert_same(f(full(2.0)), full(60.0))


def test_weight_assigned_by_another_jitted_function_is_seen() -> None:
    """A jitted train step assigns w; a jitted eval reading w must see the new value (or raise JitError)."""
    w = full(1.0).realize()

    def step(x: Tensor) -> Tensor:
        w.assign(w + x)
        return (w * 1).sum()

    def evaluate(x: Tensor) -> Tensor: return (x * w).sum()
    train_step, eval_step = jit(step), recorded(evaluate, full(1.0))
    for _ in range(3):
        train_step(full(1.0))
        try: got = eval_step(full(1.0))
        except JitError: return
        assert_same(got, evaluate(full(1.0)))


@pytest.mark.parametrize("fn", [lambda x: x.reshape(3, 1), lambda x: x[None], lambda x: (x * 2, x.reshape(1, 3))],
                         ids=["reshape", "unsqueeze", "second-output"])
def test_output_that_is_a_view_of_an_input_raises(fn: Callable[[Tensor], Any]) -> None:
    f = jit(fn)
    with pytest.raises(JitError, match=r"output \d is input 0"): f(full(1.0))


@pytest.mark.parametrize("fn", [lambda x: x, lambda x: x.contiguous()], ids=["return-x", "contiguous"])
def test_output_that_is_an_input_raises(fn: Callable[[Tensor], Tensor]) -> None:
    """jit(lambda x: x) called on 0, 1, 2: JitError (or the input's values)."""
    f = jit(fn)
    for k in range(3):
        try: got = f(full(float(k)))
        except JitError: return
        assert_same(got, full(float(k)))


def test_assigning_an_argument_raises() -> None:
    def fn(x: Tensor) -> Tensor:
        x.assign(x + 1)
        return x * 2
    f = jit(fn)
    with pytest.raises(JitError, match="assigns one of its Tensor arguments"): f(full(1.0))


@pytest.mark.parametrize("value", [np.ones(3), [1, 2], {"a": [1]}], ids=["ndarray", "list", "dict"])
def test_unhashable_argument(value: Any) -> None:
    """A numpy array cannot key a recording: JitError naming its type; lists and dicts of numbers are walked (their
    items key it)."""
    def fn(x: Tensor, a: Any) -> Tensor: return x + 1
    f = jit(fn)
    if isinstance(value, np.ndarray):
        with pytest.raises(JitError, match="ndarray cannot key a recording"): f(full(1.0), value)
    else:
        for _ in range(3): assert_same(f(full(1.0), value), full(2.0))


@pytest.mark.parametrize("case", ["constant", "view-of-argument", "setitem-on-view"])
def test_local_tensor_assigned_inside(case: str) -> None:
    """Repros (found by the random programs, seeds 58, 138, 152 with inputs as arguments):
    `c = Tensor([1.0, 2.0]); c.assign(c * 2); return x + c` and `v = x.reshape(1, 2); v.assign(v * 2)`."""
    def fn(x: Tensor) -> Tensor:
        if case == "constant":
            c = Tensor([1.0, 2.0])
            c.assign(c * 2)
            return x + c
        v = x.reshape(1, 2)
        if case == "view-of-argument": v.assign(v * 2)
        else: v[0, 0] = 7.0
        return v + 1
    f = jit(fn)
    for k in range(5):
        a = np.array([k, 10 * k], np.float32)
        assert_same(f(Tensor(a)), fn(Tensor(a)))


def test_setitem_on_a_local_computed_tensor() -> None:
    """y = x * 2; y[0] = 0: y's value before the write is lazy (no buffer), so it is no state; replays are right."""
    def fn(x: Tensor) -> Tensor:
        y = x * 2
        y[0] = 0.0
        return y + 1
    f = jit(fn)
    for k in range(5): assert_same(f(Tensor(arr(3, seed=k))), fn(Tensor(arr(3, seed=k))))


# ---- 4. outputs ------------------------------------------------------------------------------------------------------

def test_held_outputs_keep_their_values() -> None:
    """Outputs the caller holds (a tensor, a slice of one, a lazy tensor built on one) are not overwritten by later
    replays."""
    def fn(x: Tensor) -> tuple[Tensor, Tensor]: return (x * 2 + 1).exp2(), x.sum()
    f = jit(fn)
    held = [f(Tensor(arr(4, seed=k))) for k in range(6)]
    sliced = [f(Tensor(arr(4, seed=k)))[0][1:3] for k in range(6)]
    lazy = [f(Tensor(arr(4, seed=k)))[1] + 0 for k in range(6)]
    for k in range(6):
        want = fn(Tensor(arr(4, seed=k)))
        assert_same(held[k][0], want[0])
        assert_same(held[k][1], want[1])
        assert sliced[k].numpy().tobytes() == want[0].numpy()[1:3].tobytes()  # a lazy slice of eager would fuse
        assert_same(lazy[k], want[1] + 0)


def test_dropped_output_buffer_is_reused_with_right_values() -> None:
    """An output nothing refers to any more gives its buffer to the next call's output; the values are the call's."""
    def fn(x: Tensor) -> Tensor: return (x * 2 + 1).exp2()
    f = jit(fn)
    for k in range(2): f(Tensor(arr(4, seed=k)))
    buffers = set()
    for k in range(6):
        out = f(Tensor(arr(4, seed=k)))
        buffers.add(id(buffer_of(out.uop.src[0])))
        assert_same(out, fn(Tensor(arr(4, seed=k))))
        del out
        gc.collect()
    assert len(buffers) == 1
    kept = f(Tensor(arr(4, seed=1)))  # held: the next output gets a buffer of its own
    other = f(Tensor(arr(4, seed=2)))
    assert buffer_of(kept.uop.src[0]) is not buffer_of(other.uop.src[0])
    assert_same(kept, fn(Tensor(arr(4, seed=1))))
    assert_same(other, fn(Tensor(arr(4, seed=2))))


@pytest.mark.parametrize("fn", [lambda x: (x * 2, x * 2), lambda x: (lambda y: (y, y))(x * 2)],
                         ids=["equal-expressions", "same-tensor"])
def test_duplicate_outputs(fn: Callable[[Tensor], tuple[Tensor, Tensor]]) -> None:
    f = jit(fn)
    for k in range(4):
        got, want = f(full(float(k))), fn(full(float(k)))
        assert_same(got[0], want[0])
        assert_same(got[1], want[1])


def test_returning_an_assigned_state() -> None:
    v = Tensor(np.zeros(3, np.float32)).realize()

    def fn(x: Tensor) -> Tensor:
        v.assign(v + x)
        return v
    f = jit(fn)
    for k in range(1, 5):
        assert_same(f(full(1.0)), full(float(k)))
        assert_same(v, full(float(k)))


def test_state_assigned_inside_is_updated_every_replay() -> None:
    """An accumulator assigned inside (returned as a copy): the tensor holds the new value after each replay."""
    v = Tensor(np.zeros(3, np.float32)).realize()

    def fn(x: Tensor) -> Tensor:
        v.assign(v + x)
        return v * 1
    f = jit(fn)
    for k in range(1, 6):
        assert_same(f(full(1.0)), full(float(k)))
        assert_same(v, full(float(k)))


# ---- 5. memory -------------------------------------------------------------------------------------------------------

def chain(x: Tensor, w: Tensor) -> Tensor:
    """Several kernels with intermediates whose lifetimes do not all overlap."""
    h = (x @ w).relu()
    h = (h * 2 + 1).exp().log()
    h = h.softmax(-1)
    return (h @ w.T).sum(0)


def test_memory_plan_of_a_chain_saves_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """The replay's plan puts intermediates in one arena (peak below the unplanned total); DEBUG=2 prints it when the
    replay is built (the second call); the planned replays still equal eager."""
    f = jit(chain)
    f(Tensor(arr(8, 16)), Tensor(arr(16, 16, seed=1)))
    capsys.readouterr()
    with ember.Context(DEBUG=2): f(Tensor(arr(8, 16, seed=2)), Tensor(arr(16, 16, seed=3)))
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("jit:")]
    plan = f.replay.plan if f.replay is not None else None
    assert isinstance(plan, MemoryPlan)
    assert len(f.replay.kernels) > 2
    assert 0 < plan.peak_bytes < plan.unplanned_bytes
    assert printed == [f"jit: {len(f.replay.kernels)} kernels; {plan.describe()}"]
    assert "peak" in printed[0]
    for k in range(4):
        x, w = arr(8, 16, seed=k + 10), arr(16, 16, seed=k + 20)
        assert_same(f(Tensor(x), Tensor(w)), chain(Tensor(x), Tensor(w)))


def test_one_kernel_has_no_plan() -> None:
    f = recorded(lambda x: x * 2 + 1, full(1.0))
    assert f.replay is not None and len(f.replay.kernels) == 1 and f.replay.plan is None


# ---- 6. replays skip the front end -----------------------------------------------------------------------------------

def test_replays_do_not_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler (the schedule cache and kernelize) runs while recording, never while replaying."""
    calls: list[str] = []

    def counting(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return original(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(ember.schedule.cache, "schedule", counting("schedule", ember.schedule.cache.schedule))
    monkeypatch.setattr(ember.schedule.cache, "create_schedule",
                        counting("cache.create_schedule", ember.schedule.cache.create_schedule))
    monkeypatch.setattr(ember.schedule.kernelize, "create_schedule",
                        counting("create_schedule", ember.schedule.kernelize.create_schedule))
    f = jit(chain)
    inputs = [(Tensor(arr(8, 16, seed=k)).realize(), Tensor(arr(16, 16, seed=k + 1)).realize()) for k in range(6)]
    for x, w in inputs[:2]: f(x, w)
    assert "schedule" in calls and f.replay is not None  # the counters see the recordings
    calls.clear()
    outs = [f(x, w) for x, w in inputs[2:]]
    assert calls == []
    monkeypatch.undo()
    for out, (x, w) in zip(outs, inputs[2:]): assert_same(out, chain(x, w))


def test_batchnorm_dropout_adam_step_replays_equal_eager() -> None:
    """A training step with BatchNorm (running statistics assigned inside: state), Dropout (new random numbers per
    replay) and Adam: losses, running statistics and parameters equal the eager run's, bit for bit."""
    from ember.nn import BatchNorm, Dropout

    def run(jitted: bool) -> tuple[list[float], list[np.ndarray]]:
        Tensor.manual_seed(0)
        l1, bn, l2, drop = Linear(8, 16), BatchNorm(16), Linear(16, 4), Dropout(0.3)
        params = [l1.weight, l1.bias, bn.weight, bn.bias, l2.weight, l2.bias]
        opt = Adam(params, lr=0.01)

        def step(x: Tensor, y: Tensor) -> Tensor:
            opt.zero_grad()
            loss = (l2(drop(bn(l1(x)).relu())) - y).square().mean()
            loss.backward()
            opt.step(loss)
            return loss
        f = jit(step) if jitted else step
        rng, losses = np.random.default_rng(1), []
        with Tensor.train():
            for _ in range(6):
                losses.append(f(Tensor(rng.standard_normal((5, 8)).astype(np.float32)),
                                Tensor(rng.standard_normal((5, 4)).astype(np.float32))).item())
        return losses, [t.numpy() for t in [bn.running_mean, bn.running_var, *params]]
    (eager_losses, eager_state), (jit_losses, jit_state) = run(False), run(True)
    assert jit_losses == eager_losses
    for got, want in zip(jit_state, eager_state, strict=True): assert got.tobytes() == want.tobytes()


def test_jit_of_something_not_callable_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="jit: expected a function to record, got int"): jit(3)  # type: ignore[arg-type]
