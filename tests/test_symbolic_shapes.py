"""Symbolic sizes (ember/variables.py): a Variable bound per call stands for a batch that changes; kernels are
compiled once for the variable and run with each call's value. Oracles: numpy, and ember's own concrete results."""

from __future__ import annotations

import numpy as np
import pytest

import ember.engine.realize as realize
from ember import JitError, Tensor, Variable, jit
from ember.errors import ShapeError
from ember.nn import Linear
from ember.nn.optim import SGD

rng = np.random.default_rng(7)


@pytest.fixture
def programs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the programs codegen makes from here on (each new kernel AST, compiled or read from disk)."""
    made: list[str] = []
    original = realize.cached_program

    def counted(ast, renderer):  # type: ignore[no-untyped-def]
        spec = original(ast, renderer)
        made.append(spec.name)
        return spec
    monkeypatch.setattr(realize, "cached_program", counted)
    return made


def batch(n: int, features: int, var: object) -> tuple[np.ndarray, Tensor]:
    x = rng.standard_normal((n, features)).astype(np.float32)
    return x, Tensor(x).realize().reshape(var.bind(n), features)  # type: ignore[attr-defined]


def test_variable_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="identifier"): Variable("batch size", 1, 8)
    with pytest.raises(ValueError, match="min <= max"): Variable("n", 5, 2)
    with pytest.raises(ValueError, match="need ints"): Variable("n", 0.5, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2\\*\\*31"): Variable("n", 1, 2**31)
    v = Variable("n", 1, 8)
    with pytest.raises(ValueError, match=r"n takes an int in \[1, 8\], got 9"): v.bind(9)
    with pytest.raises(ValueError, match="got 2.0"): v.bind(2.0)  # type: ignore[arg-type]
    assert repr(v.bind(3)) == "n=3"


def test_eager_ops_on_a_symbolic_batch_match_numpy_and_compile_once(programs: list[str]) -> None:
    bs = Variable("bs", 1, 64)
    w_np, b_np = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    w, b = Tensor(w_np).realize(), Tensor(b_np).realize()
    counts = []
    for n in (3, 17, 64, 1):
        x_np, x = batch(n, 8, bs)
        h = (x @ w + b).relu()
        assert h.shape == (bs.bind(n), 5)
        ref = np.maximum(x_np @ w_np + b_np, 0)
        m = ref.max(1, keepdims=True)
        np.testing.assert_allclose(h.numpy(), ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(h.sum(1).numpy(), ref.sum(1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(h.sum(0).numpy(), ref.sum(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(h.mean().numpy(), ref.mean(), rtol=1e-5)  # divides by the bound count
        np.testing.assert_allclose(h.log_softmax(1).numpy(), ref - m - np.log(np.exp(ref - m).sum(1, keepdims=True)),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(h.reshape(n, 5).numpy(), ref, rtol=1e-5, atol=1e-6)  # back to a concrete shape
        counts.append(len(programs))
    assert counts[0] > 0 and counts[1:] == counts[:1] * 3  # the batches after the first compiled nothing


def test_symbolic_results_equal_concrete_ones_bit_for_bit() -> None:
    bs = Variable("bs", 1, 32)
    w = Tensor(rng.standard_normal((16, 12)).astype(np.float32)).realize()
    for n in (5, 32):
        x_np, x = batch(n, 16, bs)
        symbolic = ((x @ w).tanh() * 3 - x.sum(1, keepdim=True)).numpy()
        concrete = ((Tensor(x_np) @ w).tanh() * 3 - Tensor(x_np).sum(1, keepdim=True)).numpy()
        np.testing.assert_array_equal(symbolic, concrete)


def test_gradients_through_a_symbolic_batch() -> None:
    bs = Variable("bs", 1, 64)
    w_np = rng.standard_normal((8, 5)).astype(np.float32)
    for n in (3, 10):
        w = Tensor(w_np.copy(), requires_grad=True)
        x_np, x = batch(n, 8, bs)
        (x @ w).relu().sum(1).mean().backward()
        np.testing.assert_allclose(w.grad.numpy(), x_np.T @ ((x_np @ w_np) > 0).astype(np.float32) / n,
                                   rtol=1e-5, atol=1e-6)


def test_reshapes_keep_or_read_through_the_symbolic_axis() -> None:
    bs = Variable("bs", 1, 16)
    x_np, x = batch(6, 12, bs)
    np.testing.assert_array_equal(x.reshape(bs.bind(6), 3, 4).numpy(), x_np.reshape(6, 3, 4))  # kept whole
    np.testing.assert_array_equal(x.reshape(12, bs.bind(6)).numpy(), x_np.reshape(12, 6))  # through the buffer
    np.testing.assert_array_equal((x + 1).reshape(72).numpy(), (x_np + 1).reshape(72))  # realized first
    with pytest.raises(ShapeError, match="elements with these values"): x.reshape(bs.bind(5), 12)
    with pytest.raises(ShapeError, match="must be a bound Variable"): x.reshape(bs, 12)
    other = Tensor(np.zeros((5, 12), np.float32)).reshape(bs.bind(5), 12)
    with pytest.raises(ShapeError, match=r"\(bs=6, 12\) and \(bs=5, 12\) cannot be broadcast"): x + other

    @jit
    def pair(a: Tensor, b: Tensor) -> Tensor: return a.sum() + b.sum()
    with pytest.raises(ShapeError, match="bs is bound to both 6 and 5"): pair(x, other)


def test_a_comparison_its_bounds_do_not_decide_raises() -> None:
    n = Variable("n", 1, 8).bind(4)
    assert bool(n.src[0] < 9) and not bool(n.src[0] < 1)  # decided by the bounds
    with pytest.raises(TypeError, match="depends on their values"): bool(n.src[0] < 4)


def test_jit_replays_any_batch_size_without_compiling(programs: list[str]) -> None:
    bs = Variable("bs", 1, 128)
    w_np = rng.standard_normal((24, 10)).astype(np.float32)
    w = Tensor(w_np).realize()

    @jit
    def predict(x: Tensor) -> Tensor: return (x @ w).relu().log_softmax(1)
    seen = []
    for n in (4, 9, 128, 1, 9, 33):
        x_np, x = batch(n, 24, bs)
        out = predict(x)
        assert out.shape == (bs.bind(n), 10)
        ref = np.maximum(x_np @ w_np, 0)
        m = ref.max(1, keepdims=True)
        np.testing.assert_allclose(out.numpy(), ref - m - np.log(np.exp(ref - m).sum(1, keepdims=True)), rtol=1e-5,
                                   atol=1e-5)
        seen.append(len(programs))
    assert predict.replay is not None and seen[1:] == seen[:1] * 5  # recorded at 4 and 9, then replayed


def test_jitted_training_step_with_a_changing_batch_equals_eager() -> None:
    bs = Variable("bs", 1, 64)

    def model() -> tuple[list[Linear], SGD]:
        layers = [Linear(32, 16), Linear(16, 4)]
        for k, layer in enumerate(layers):
            layer.weight = Tensor(np.random.default_rng(k).standard_normal(layer.weight.shape).astype(np.float32)
                                  * 0.3).realize()
            layer.bias = Tensor(np.zeros(layer.bias.shape, np.float32)).realize()
        return layers, SGD([t for layer in layers for t in (layer.weight, layer.bias)], lr=0.1)

    def step_of(layers: list[Linear], opt: SGD):  # type: ignore[no-untyped-def]
        def step(x: Tensor, y: Tensor) -> Tensor:
            opt.zero_grad()
            loss = layers[1](layers[0](x).relu()).cross_entropy(y)
            loss.backward()
            opt.step(loss)
            return loss
        return step
    (la, oa), (lb, ob) = model(), model()
    jitted, eager = jit(step_of(la, oa)), step_of(lb, ob)
    with Tensor.train():
        for n in (16, 7, 64, 16, 3):
            x = rng.random((n, 32), dtype=np.float32)
            y = rng.integers(0, 4, n).astype(np.int32)
            got = jitted(Tensor(x).realize().reshape(bs.bind(n), 32), Tensor(y).realize().reshape(bs.bind(n)))
            want = eager(Tensor(x), Tensor(y))
            # (sums over the batch may be added in another order than the concrete kernels': a rounding apart)
            np.testing.assert_allclose(got.item(), want.item(), rtol=1e-6)
            for a, b in zip(la, lb, strict=True):
                np.testing.assert_allclose(a.weight.numpy(), b.weight.numpy(), rtol=1e-5, atol=1e-7)
    assert jitted.replay is not None


def test_jit_refuses_a_variable_bound_inside_to_a_changing_value() -> None:
    bs = Variable("bs", 1, 16)
    sizes = iter([3, 5, 7, 9])
    data = Tensor(rng.standard_normal(16 * 4).astype(np.float32)).realize()

    @jit
    def head(x: Tensor) -> Tensor:
        n = next(sizes)  # a Python value read inside: its binding is a constant of each recording
        return x + data[:n * 4].reshape(n, 4).reshape(bs.bind(n), 4).sum(0)
    x = Tensor(np.ones(4, np.float32)).realize()
    head(x)
    head(x)
    with pytest.raises(JitError, match="do not run the same kernels"): head(x)


@pytest.mark.parametrize("n", [1, 5, 7, 13, 64])
def test_register_rows_of_a_symbolic_batch_past_its_end_store_nothing(n: int) -> None:
    """A matmul's batch rows are tiled into registers in steps of several rows (codegen/opt.py split_symbolic):
    the last step's rows past n read row n - 1 and are not stored. Equal to the concrete kernel's bits; right also
    where the batch axis is not the outermost of what is stored (the transpose: a row past the end would overwrite
    the next; its concrete kernel may sum in another order)."""
    bs = Variable("bs", 1, 96)
    w_np = rng.standard_normal((40, 48)).astype(np.float32)
    w = Tensor(w_np).realize()
    x_np, x = batch(n, 40, bs)
    np.testing.assert_array_equal((x @ w).numpy(), (Tensor(x_np) @ w).numpy())
    np.testing.assert_allclose((x @ w).T.contiguous().numpy(), (x_np @ w_np).T, rtol=1e-5, atol=1e-5)


def test_ops_along_other_axes_and_the_symbolic_one() -> None:
    """Slices, pads and joins of the concrete axes keep the symbolic one (its size stays the bound variable, not
    `bs + 0`); a reduction and an argmax over it; what is not supported along it raises a ShapeError naming it."""
    bs = Variable("bs", 1, 16)
    x_np, x = batch(5, 6, bs)
    assert x[:, 1:4].shape == (bs.bind(5), 3) and x.pad(((0, 0), (1, 1))).shape == (bs.bind(5), 8)
    np.testing.assert_array_equal(x[:, 1:4].numpy(), x_np[:, 1:4])
    np.testing.assert_array_equal(x.pad(((0, 0), (1, 1))).numpy(), np.pad(x_np, ((0, 0), (1, 1))))
    np.testing.assert_array_equal(x.cat(x * 2, dim=1).numpy(), np.concatenate([x_np, x_np * 2], 1))
    np.testing.assert_array_equal(x.max(0).values.numpy(), x_np.max(0))
    np.testing.assert_array_equal(x.argmax(0).numpy(), x_np.argmax(0))  # counts down from the symbolic size
    np.testing.assert_array_equal(x.argmax(1).numpy(), x_np.argmax(1))
    np.testing.assert_allclose(x.softmax(1).numpy(), np.exp(x_np) / np.exp(x_np).sum(1, keepdims=True), rtol=1e-5)
    with pytest.raises(ShapeError, match="indexing the symbolic axis 0"): x[1:3]
    with pytest.raises(ShapeError, match="indexing the symbolic axis 0"): x[0]
    with pytest.raises(ShapeError, match="joining along the symbolic axis 0"): x.cat(x)
    with pytest.raises(ShapeError, match="never merged with others"): x.flatten()
    with pytest.raises(ShapeError, match="only the whole axis"): x.shrink(((0, 2), None))
    with pytest.raises(TypeError, match="first axis is symbolic"): len(x)


def test_numpy_of_a_symbolic_tensor_copies_only_its_bound_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """A symbolic tensor's buffer is sized for its variable's maximum; reading its values copies the elements its
    bound shape has, not the whole buffer (with Variable('n', 1, 2**31 - 1), 3 floats took 8.2 GB before)."""
    from ember.device import Device
    n = Variable("n", 1, 2**20)
    allocator = Device[Device.DEFAULT].allocator
    copied: list[int] = []
    original = allocator.copyout

    def counted(dest: memoryview, src: object) -> None:
        copied.append(dest.nbytes)
        original(dest, src)
    monkeypatch.setattr(allocator, "copyout", counted)
    x = Tensor(np.arange(3, dtype=np.float32)).realize().reshape(n.bind(3))
    np.testing.assert_array_equal((x * 2).numpy(), np.arange(3, dtype=np.float32) * 2)
    assert copied == [3 * 4]


@pytest.mark.parametrize("n", [4, 7])
def test_gather_with_symbolic_shapes_matches_numpy(n: int) -> None:
    """gather where index and source share a symbolic axis (along it and along a concrete one; index values known
    on the host or not; an index narrower than the source), and its gradient, against numpy."""
    bs = Variable("bs", 1, 16)
    x_np, x = batch(n, 5, bs)
    for d, high, width in ((1, 5, 5), (0, n, 5), (1, 5, 3)):
        i_np = rng.integers(0, high, (n, width)).astype(np.int32)
        for idx in (Tensor(i_np), Tensor(i_np).realize()):
            got = x.gather(d, idx.reshape(bs.bind(n), width))
            np.testing.assert_array_equal(got.numpy(), np.take_along_axis(x_np, i_np, d))
    w = Tensor(np.ones(5, np.float32), requires_grad=True)  # (a gradient reaches the symbolic x through w)
    i_np = rng.integers(0, 5, (n, 5)).astype(np.int32)
    (x * w).gather(1, Tensor(i_np).reshape(bs.bind(n), 5)).sum().backward()
    want = np.zeros(5, np.float32)
    np.add.at(want, i_np, np.take_along_axis(x_np, i_np, 1))
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-6, atol=1e-6)
    other = Tensor(np.zeros((n, 5), np.int32)).reshape(Variable("m", 1, 16).bind(n), 5)
    with pytest.raises(ShapeError, match="which is symbolic"): x.gather(1, other)


@pytest.mark.parametrize("n", [1, 4, 7])
def test_flip_along_a_symbolic_axis_matches_numpy(n: int) -> None:
    bs = Variable("bs", 1, 16)
    x_np, x = batch(n, 5, bs)
    np.testing.assert_array_equal(x.flip(0).numpy(), np.flip(x_np, 0))
    np.testing.assert_array_equal(x.flip(0, 1).numpy(), np.flip(x_np, (0, 1)))
    np.testing.assert_array_equal((x.flip(0) * 2).sum(1).numpy(), (np.flip(x_np, 0) * 2).sum(1))


def test_safe_save_of_a_symbolic_tensor_writes_its_bound_values(tmp_path: object) -> None:
    """The file holds the values of the bound shape (not the buffer sized for the variable's maximum)."""
    from ember.nn.safetensors import safe_load, safe_save
    bs = Variable("bs", 1, 1000)
    x_np, x = batch(3, 4, bs)
    path = f"{tmp_path}/x.safetensors"
    safe_save({"x": x * 2, "y": Tensor(np.ones(2, np.float32))}, path)
    loaded = safe_load(path)
    assert loaded["x"].shape == (3, 4)
    np.testing.assert_array_equal(loaded["x"].numpy(), x_np * 2)
    np.testing.assert_array_equal(loaded["y"].numpy(), np.ones(2, np.float32))


@pytest.mark.parametrize("op", ["max", "min", "argmax"])
def test_a_reduction_without_identity_over_a_symbolic_axis_bound_to_zero_raises(op: str) -> None:
    """As over a concrete axis of size 0 (the oracle: the same call on the concrete tensor)."""
    bs = Variable("bs", 0, 16)
    concrete = Tensor(np.zeros((0, 3), np.float32))
    symbolic = concrete.realize().reshape(bs.bind(0), 3)
    with pytest.raises(ShapeError, match="cannot reduce axis 0 of size 0"): getattr(concrete, op)(0)
    with pytest.raises(ShapeError, match="cannot reduce axis 0 of size 0"): getattr(symbolic, op)(0)


def test_a_symbolic_buffer_too_large_to_allocate_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A buffer of a symbolic shape is sized for its variable's maximum (8.6 GB of float32 for 2**31 - 1): memory
    that is only reserved where the system allows it, else a MemoryError that says so, not numpy's bare one."""
    from ember.device import Device
    allocator = Device["CPU"].allocator
    original = allocator.alloc

    def limited(nbytes: int) -> object:  # (as a system with a 4 GB address-space limit refuses it)
        if nbytes > 2**32: raise MemoryError(f"Unable to allocate {nbytes} bytes")
        return original(nbytes)
    monkeypatch.setattr(allocator, "alloc", limited)
    n = Variable("n", 1, 2**31 - 1)
    x = Tensor(np.arange(3, dtype=np.float32)).realize().reshape(n.bind(3))
    with pytest.raises(MemoryError, match="symbolic size takes memory for its Variable's maximum"): (x * 2).numpy()
