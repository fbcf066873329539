"""ember.ad.vmap against torch.func.vmap; vmap composed with jacobian and hessian; its errors; its code size.

Every case is one function written with ember Tensor ops and with torch ops (the same math) with the in_axes of both
vmaps. vmap(f) is a NumericalFunction over batched arguments, built once per process and shared by the tests.
Oracle: torch.func.vmap in float64, to 1e-12 scaled by the largest entry (the same kernels, other rounding order).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from ember import Tensor, ad
from ember.errors import EmberError, ShapeError
from ember.export import Arg, NumericalFunction, render_module
from tests.helpers import T, scaled_error

RNG = np.random.default_rng(7)
W = RNG.standard_normal((3, 4)) * 0.5
C = RNG.standard_normal((2, 3))
IDX = np.array([4, 0, 2, 2])  # a repeated constant index
A = RNG.standard_normal((3, 3))
B = RNG.standard_normal(3)
K = RNG.standard_normal(3) * 0.5
A_EMBER = Tensor(A)  # a realized Tensor captured by the closure

TOL = 1e-12
N = 4  # the batch size of the comparisons


# ---- the cases ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One function in ember and torch, its unbatched arguments and the in_axes of the vmap. An int64 argument
    holds indices in [0, bound)."""

    name: str
    ember: Callable
    torch: Callable
    args: tuple[Arg, ...]
    in_axes: int | None | tuple[int | None, ...] = 0
    bound: int = 1

    def axes(self) -> list[int | None]:
        return list(self.in_axes) if isinstance(self.in_axes, tuple) else [self.in_axes] * len(self.args)

    def inputs(self, size: int = N) -> list[np.ndarray]:
        """Batched inputs: each mapped argument with an axis of `size` at its in_axis."""
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        out = []
        for arg, ax in zip(self.args, self.axes()):
            shape = list(arg.shape)
            if ax is not None: shape.insert(ax % (len(shape) + 1), size)
            out.append(rng.integers(0, self.bound, shape) if arg.dtype.is_int else rng.uniform(-1, 1, shape))
        return out


def index_from(y):
    """Indices in [0, 5) computed from a float argument: a GATHER whose indices are batched when y is."""
    return ((y + 1) * 2.5).floor().clamp(0, 4)


CASES = [
    Case("elementwise", lambda x: x.sin() * x.exp() + x ** 2 - (x * 0.5).tanh(),
         lambda x: x.sin() * x.exp() + x ** 2 - (x * 0.5).tanh(), (Arg((2, 3)),)),
    Case("reductions", lambda x: x.sum(axis=1) + x.max(axis=1) * x.prod(axis=1) + x.min() + x.logsumexp(axis=1),
         lambda x: x.sum(1) + x.amax(1) * x.prod(1) + x.min() + x.logsumexp(1), (Arg((2, 3)),)),
    Case("matmul", lambda x, y: (x @ Tensor(W)).tanh() @ y + Tensor.einsum("ij,jk->ik", x, x.T),
         lambda x, y: (x @ T(W)).tanh() @ y + torch.einsum("ij,jk->ik", x, x.T), (Arg((2, 3)), Arg((4, 2))),
         in_axes=(1, 0)),
    Case("constant_index", lambda x: x[Tensor(IDX)] * x[1:3].sum() + x[::-2].sum() + x[-1],
         lambda x: x[T(IDX)] * x[1:3].sum() + x.flip(0)[::2].sum() + x[-1], (Arg(5),)),
    Case("batched_gather", lambda x, y: x[index_from(y).cast("int32")] * y,
         lambda x, y: x[index_from(y).long()] * y, (Arg(5), Arg(3))),
    Case("gather_shared_table", lambda x, y: x[index_from(y).cast("int64")].exp() + x.gather(0, Tensor(IDX)).sum(),
         lambda x, y: x[index_from(y).long()].exp() + x.gather(0, T(IDX)).sum(), (Arg(5), Arg(3)), in_axes=(None, 0)),
    Case("index_argument", lambda x, i: x[:, i] + x.gather(1, i.reshape(1, 3).expand(2, 3)).sum(axis=0),
         lambda x, i: x[:, i] + x.gather(1, i.reshape(1, 3).expand(2, 3)).sum(0),
         (Arg((2, 4)), Arg(3, "int64")), bound=4),
    Case("movement",
         lambda x: x.reshape(3, 2).permute(1, 0).pad(((1, 0), (0, 2))).flip(1)[:, :3].cat(x * 2, dim=0).reshape(-1)[:9],
         lambda x: torch.cat([torch.nn.functional.pad(x.reshape(3, 2).permute(1, 0), (0, 2, 1, 0)).flip(1)[:, :3],
                              x * 2], 0).reshape(-1)[:9], (Arg((2, 3)),)),
    Case("mixed_axes", lambda x, y, z: (x * y).sum(axis=0) + z.sin() * Tensor(C).sum(),
         lambda x, y, z: (x * y).sum(0) + z.sin() * T(C).sum(), (Arg((2, 3)), Arg((2, 3)), Arg(3)),
         in_axes=(1, None, 0)),
    Case("negative_axis", lambda x, y: x @ y, lambda x, y: x @ y, (Arg((2, 3)), Arg(3)), in_axes=(-1, None)),
    Case("multiple_outputs", lambda x, y: (x.sin() + y, (x * y).sum(), y.cos() * 2),
         lambda x, y: (x.sin() + y, (x * y).sum(), y.cos() * 2), (Arg(3), Arg(3)), in_axes=(0, None)),
    Case("captured_constants",
         lambda x: 0.5 * (x * (A_EMBER @ x)).sum() + (Tensor(B) * x).sum() + (Tensor(K) * x).exp().sum(),
         lambda x: 0.5 * (x * (T(A) @ x)).sum() + (T(B) * x).sum() + (T(K) * x).exp().sum(), (Arg(3),)),
    Case("scalar_argument", lambda s, x: (x * s).softmax(0) + s.exp(), lambda s, x: (x * s).softmax(0) + s.exp(),
         (Arg(()), Arg(4)), in_axes=(0, None)),
    Case("argmax_index", lambda x, y: x[y.argmax()] * y, lambda x, y: x[y.argmax()] * y, (Arg(5), Arg(4))),
    Case("where_scans", lambda x: (x > 0).where(x.cumsum(0), x.maximum(-0.3)) + x.cumprod(0),
         lambda x: torch.where(x > 0, x.cumsum(0), x.maximum(torch.tensor(-0.3, dtype=torch.float64))) + x.cumprod(0),
         (Arg(4),)),
]
BY_NAME = {c.name: c for c in CASES}

KNOWN: dict[str, pytest.MarkDecorator] = {}


@functools.cache
def unbatched(name: str) -> NumericalFunction:
    case = BY_NAME[name]
    return NumericalFunction(name, case.ember, list(case.args))


@functools.cache
def vmapped(name: str, size: int = N) -> NumericalFunction:
    return ad.vmap(unbatched(name), BY_NAME[name].in_axes, axis_size=size)


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


# ---- vmap against torch.func.vmap ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [pytest.param(n, marks=KNOWN.get(n, ())) for n in BY_NAME])
def test_vmap_matches_torch_func_vmap(name):
    case = BY_NAME[name]
    inputs = case.inputs()
    got = as_tuple(vmapped(name)(*inputs))
    want = as_tuple(torch.func.vmap(case.torch, in_dims=case.in_axes)(*(T(a) for a in inputs)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == np.float64 and g.shape == tuple(w.shape), f"{g.dtype}{g.shape}, expected {tuple(w.shape)}"
        err = scaled_error(g, w.numpy())
        assert err < TOL, f"vmap vs torch.func.vmap: scaled error {err:.3g}\n{g}\n{w}"


@pytest.mark.parametrize("name", ["batched_gather", "mixed_axes", "multiple_outputs"])
def test_vmap_is_the_unbatched_function_on_each_slice(name):
    """Element b of the result is f on element b of every mapped argument (the shared ones as they are)."""
    case = BY_NAME[name]
    inputs = case.inputs()
    got = as_tuple(vmapped(name)(*inputs))
    for b in range(N):
        sliced = [a if ax is None else np.take(a, b, axis=ax) for a, ax in zip(inputs, case.axes())]
        for g, w in zip(got, as_tuple(unbatched(name)(*sliced))):
            np.testing.assert_allclose(g[b], w, rtol=1e-14, atol=1e-15)


def test_batched_indices_outside_their_axis_read_zero_not_a_neighbouring_batch_element():
    """The lifted GATHER reads one flat axis of all batch elements: index 5 of element 0 is not element 1's x[0]."""
    f = ad.vmap(NumericalFunction("pick", lambda x, i: x[i], [Arg(5), Arg(2, "int64")]), axis_size=3)
    x = np.arange(15.0).reshape(3, 5) + 1
    got = f(x, np.array([[0, 5], [9, -5], [-1, 4]]))
    np.testing.assert_array_equal(got, [[1, 0], [0, 6], [15, 15]])


def test_an_index_below_minus_n_reads_zero():
    f = NumericalFunction("pick_low", lambda x, i: x[i], [Arg(5), Arg(3, "int64")])
    np.testing.assert_array_equal(f(np.arange(5.0) + 1, np.array([-5, -6, -9])), [1, 0, 0])


def test_a_zero_d_index_argument_is_read_at_call_time():
    f = NumericalFunction("pick", lambda x, i: x[i], [Arg(5), Arg((), "int64")])
    assert f(np.arange(5.0), np.array(4)) == 4.0


def test_vmap_signature_puts_the_batch_axis_at_in_axes_and_outputs_first():
    f = vmapped("mixed_axes")
    assert [a.shape for a in f.args] == [(2, N, 3), (2, 3), (N, 3)]
    assert f.output_shapes == [(N, 3)]
    assert vmapped("multiple_outputs").output_shapes == [(N, 3), (N,), (N, 3)]  # y.cos() is unbatched: broadcast
    assert vmapped("negative_axis").args[0].shape == (2, 3, N)
    as_list = ad.vmap(unbatched("mixed_axes"), [1, None, -2], axis_size=N)  # a list, an axis counted from the end
    assert [a.shape for a in as_list.args] == [a.shape for a in f.args]


def test_vmap_of_an_output_that_ignores_the_batch_is_repeated():
    inputs = BY_NAME["multiple_outputs"].inputs()
    _, _, shared = vmapped("multiple_outputs")(*inputs)
    np.testing.assert_array_equal(shared, np.broadcast_to(np.cos(inputs[1]) * 2, (N, 3)))


def test_vmap_over_a_batch_of_one_and_of_zero():
    one = ad.vmap(unbatched("reductions"), axis_size=1)
    x = BY_NAME["reductions"].inputs(1)[0]
    np.testing.assert_allclose(one(x)[0], unbatched("reductions")(x[0]), rtol=1e-14)
    empty = ad.vmap(unbatched("elementwise"), axis_size=0)
    assert empty.output_shapes == [(0, 2, 3)] and empty(np.zeros((0, 2, 3))).shape == (0, 2, 3)


# ---- compositions --------------------------------------------------------------------------------------------------

def test_jacobian_of_a_vmap_matches_torch():
    case = BY_NAME["mixed_axes"]
    inputs = case.inputs()
    got = ad.jacobian(vmapped("mixed_axes"), 0)(*inputs)
    batched = torch.func.vmap(case.torch, in_dims=case.in_axes)
    want = torch.func.jacrev(batched, argnums=0)(*(T(a) for a in inputs)).numpy()
    assert got.shape == (N, 3, 2, N, 3) and scaled_error(got, want) < TOL


def test_vmap_of_a_jacobian_matches_torch():
    case = BY_NAME["batched_gather"]
    inputs = case.inputs()
    got = ad.vmap(ad.jacobian(unbatched("batched_gather"), 0), axis_size=N)(*inputs)
    want = torch.func.vmap(torch.func.jacfwd(case.torch, argnums=0))(*(T(a) for a in inputs)).numpy()
    assert got.shape == (N, 3, 5) and scaled_error(got, want) < TOL


def test_a_vmapped_jacobian_of_straight_line_code_is_one_kernel():
    """The jacobian of an RK4 step of a pendulum (2 states, sin and cos), vmapped over many points: each primal value
    is broadcast over the directions, whose entries the kernel stores unrolled, one loop iteration per point. It is
    computed once per iteration and shared, so nothing is stored by a kernel of its own (it was 6 kernels, each a
    pass over every point). Values as torch.func's vmap of jacrev."""
    def step(s, sin, cos, stack):
        def f(a, b): return (b, -9.81 * sin(a) - 0.1 * b * cos(a))
        k1 = f(s[0], s[1])
        k2 = f(s[0] + 0.05 * k1[0], s[1] + 0.05 * k1[1])
        return stack([s[0] + 0.05 * (k1[0] + k2[0]), s[1] + 0.05 * (k1[1] + k2[1])])
    points = 4096
    f = NumericalFunction("pendulum_step", lambda s: step(s, Tensor.sin, Tensor.cos, lambda v: Tensor.stack(*v)),
                          [Arg(2)])
    g = ad.vmap(ad.jacobian(f), axis_size=points)
    assert len(g.plan.items) == 1
    x = RNG.standard_normal((points, 2))
    want = torch.func.vmap(torch.func.jacrev(lambda s: step(s, torch.sin, torch.cos, torch.stack)))(T(x)).numpy()
    assert scaled_error(g(x), want) < TOL


def test_vmap_of_a_hessian_with_constants_is_exact():
    """0.5 x.Ax + b.x + sum exp(k x) has the hessian (A + A^T)/2 + diag(k^2 exp(k x)) at every batch element."""
    x = BY_NAME["captured_constants"].inputs()[0]
    got = ad.vmap(ad.hessian(unbatched("captured_constants")), axis_size=N)(x)
    want = (A + A.T) / 2 + K * K * np.exp(K * x)[:, None, :] * np.eye(3)
    assert scaled_error(got, want) < 1e-14


def test_hessian_of_a_sum_over_a_vmap_is_block_diagonal():
    """s(X) = sum_b f(X[b]): its hessian couples no two batch elements, and each block is f's hessian."""
    inner = vmapped("captured_constants")
    total = NumericalFunction("batch_energy", lambda x: inner.fn(x).sum(), inner.args)
    x = BY_NAME["captured_constants"].inputs()[0]
    got = ad.hessian(total)(x)
    want = np.zeros((N, 3, N, 3))
    for b in range(N): want[b, :, b, :] = (A + A.T) / 2 + np.diag(K * K * np.exp(K * x[b]))
    assert scaled_error(got, want) < 1e-14


def test_vmap_of_a_vmap_matches_torch():
    case = BY_NAME["matmul"]
    twice = ad.vmap(vmapped("matmul"), (None, 2), axis_size=2)
    inputs = case.inputs()
    y = np.random.default_rng(1).uniform(-1, 1, (N, 4, 2, 2))
    got = twice(inputs[0], y)
    want = torch.func.vmap(torch.func.vmap(case.torch, in_dims=(1, 0)), in_dims=(None, 2))(T(inputs[0]), T(y))
    assert got.shape == (2, N, 2, 2) and scaled_error(got, want.numpy()) < TOL


# ---- errors --------------------------------------------------------------------------------------------------------

def test_in_axes_of_the_wrong_length_raises():
    with pytest.raises(ValueError, match=r"vmap: in_axes has 1 entries for the 3 arguments of mixed_axes"):
        ad.vmap(unbatched("mixed_axes"), (0,), axis_size=2)


@pytest.mark.parametrize("axis", [3, -4])
def test_in_axis_out_of_range_raises_naming_it(axis):
    with pytest.raises(IndexError, match=rf"vmap: in_axes\[0\] = {axis} is out of range for argument 0 of shape "
                                         r"\(2, 3\)"):
        ad.vmap(unbatched("elementwise"), axis, axis_size=2)


@pytest.mark.parametrize("size", [-1, 2.0, "3"])
def test_bad_axis_size_raises(size):
    with pytest.raises(ValueError, match=rf"vmap: axis_size {re.escape(repr(size))} must be an int >= 0"):
        ad.vmap(unbatched("elementwise"), axis_size=size)


@pytest.mark.parametrize("in_axes", [None, (None, None)])
def test_in_axes_mapping_nothing_raises(in_axes):
    with pytest.raises(ValueError, match="vmap: in_axes maps no argument"):
        ad.vmap(unbatched("multiple_outputs"), in_axes, axis_size=2)


def test_vmapped_function_checks_the_batched_shapes():
    with pytest.raises(ShapeError, match=r"argument 0 has shape \(3, 2, 3\), expected \(4, 2, 3\)"):
        vmapped("elementwise")(np.zeros((3, 2, 3)))


# ---- loops stay loops ----------------------------------------------------------------------------------------------

CXX = shutil.which("g++")


W8 = np.random.default_rng(9).standard_normal((8, 8))


def batch_model(x):
    return (Tensor(W8) @ x).tanh() * x + x.sum() * x.cumsum(0)


@functools.cache
def batch_function() -> NumericalFunction:
    return NumericalFunction("batch_model", batch_model, [Arg(8)])


@functools.cache
def batch_modules() -> dict[int, tuple[str, str]]:
    """(header, source) of vmap(batch_model) for three batch sizes. Every kernel output has more than 64 elements at
    size 10: smaller outputs are unrolled on purpose (UNROLL_LIMIT in codegen/rangeify.py), whatever their origin."""
    return {n: render_module("batched", [ad.vmap(batch_function(), axis_size=n)]) for n in (10, 100, 1000)}


def test_vmap_code_does_not_grow_with_the_batch():
    """The batch is one more loop: the sources for 10, 100 and 1000 differ only in numbers."""
    sources = {n: source for n, (_, source) in batch_modules().items()}
    sizes = {n: len(s) for n, s in sources.items()}
    assert max(sizes.values()) <= 1.05 * min(sizes.values()), sizes
    shapes = {n: re.sub(r"\d+", "0", s) for n, s in sources.items()}
    assert shapes[10] == shapes[100] == shapes[1000]
    assert all(f"< {n};" in sources[n] for n in sources), "no loop over the batch"


@pytest.mark.skipif(CXX is None, reason="needs g++ (apt-get install g++)")
def test_vmap_code_for_a_large_batch_compiles_strictly(tmp_path):
    header, source = batch_modules()[1000]
    (tmp_path / "batched.hpp").write_text(header)
    (tmp_path / "batched.cpp").write_text(source)
    build = subprocess.run([CXX, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-c", "-o",
                            str(tmp_path / "batched.o"), str(tmp_path / "batched.cpp")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr


def test_vmap_over_a_large_batch_matches_the_unbatched_function():
    f = batch_function()
    x = np.random.default_rng(2).uniform(-1, 1, (1000, 8))
    got = ad.vmap(f, axis_size=1000)(x)
    for b in (0, 517, 999): np.testing.assert_allclose(got[b], f(x[b]), rtol=1e-13, atol=1e-15)


def test_reading_a_traced_value_is_an_error_not_a_garbage_read():
    """A boolean mask or nonzero needs the values to know the shape: while tracing there are none."""
    for fn in (lambda x: x[x > 0], lambda x: x.nonzero(), lambda x: x[(x > 0).any()], lambda x: x * x.sum().item()):
        with pytest.raises(EmberError, match="while it is traced"):
            NumericalFunction("data_dependent", fn, [Arg(4)])
