"""The oracle check every tensor test goes through: run a function in ember and in torch (or numpy), compare.

`check(fn, oracle, inputs)` builds ember Tensors and oracle tensors from the same numpy inputs, runs both sides and
asserts that shape, dtype and values agree. Values are compared exactly for bool and integer results and with a
tolerance chosen by the result dtype for floats (NaN equals NaN, infinities must match in sign).
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ember.engine.realize as realize
import ember.schedule.cache as schedule_cache
from ember import Tensor
from ember.device import Device
from ember.errors import DeviceError
from ember.export import Arg
from ember.helpers import cache_dir

# Elementwise float tolerances: ember calls libm (expf, logf, ...), torch and numpy use their own vector math.
# Reductions and matmul sum in another order than torch; their tests pass REDUCE_TOL.
TOL = {"float16": (1e-3, 1e-3), "bfloat16": (1e-2, 1e-2), "float32": (1e-6, 1e-7), "float64": (1e-12, 1e-14)}
REDUCE_TOL = {"rtol": 1e-5, "atol": 1e-6}
# the least tolerance on a device other than the CPU (DEVICE=CL: the op suite on OpenCL): its math builtins are
# accurate to the ulp bounds OpenCL sets (exp 3 ulp, pow 16), not correctly rounded as glibc's mostly are, and a
# chain of them (a gradient of mish) carries those ulps further
DEVICE_TOL = {"float16": (1e-3, 1e-3), "bfloat16": (1e-2, 1e-2), "float32": (2e-4, 1e-5), "float64": (1e-12, 1e-14)}


def device_or_skip(name: str) -> Any:
    """The device `name`, opened; where it cannot be opened here, the calling test module is skipped with the
    reason (what to install)."""
    try:
        return Device[name]
    except DeviceError as e:
        pytest.skip(f"{name}: {e}", allow_module_level=True)


def tensor_on(name: str) -> Callable[[np.ndarray], Tensor]:
    """A maker of Tensors on device `name` from numpy arrays."""
    return lambda a: Tensor(a, device=name)


def cpu_only(why: str) -> pytest.MarkDecorator:
    """Marks a test of what only the CPU device does (its thread pool, memory plans of host arrays): skipped, with
    `why`, when the tests run on another device (DEVICE=CL)."""
    return pytest.mark.skipif(Device.DEFAULT != "CPU", reason=f"CPU only: {why}")


def tolerance(dtype: str, rtol: float, atol: float) -> tuple[float, float]:
    """(rtol, atol) for a float result of `dtype` on the device the tests run on (Device.DEFAULT)."""
    if Device.DEFAULT == "CPU" or dtype not in DEVICE_TOL: return rtol, atol
    return max(rtol, DEVICE_TOL[dtype][0]), max(atol, DEVICE_TOL[dtype][1])


def dtype_name(x: Any) -> str:
    """The dtype of an ember Tensor, torch tensor or numpy array, spelled as numpy spells it ('float32')."""
    if isinstance(x, Tensor): return x.dtype.name
    if isinstance(x, torch.Tensor): return str(x.dtype).removeprefix("torch.")
    return np.asarray(x).dtype.name


def to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, Tensor): return x.numpy()
    if isinstance(x, torch.Tensor): return x.detach().numpy()
    return np.asarray(x)


def check(fn: Callable[..., Any], oracle: Callable[..., Any] | None, inputs: Sequence[Any], *, lib: str = "torch",
          rtol: float | None = None, atol: float | None = None) -> np.ndarray:
    """Assert that fn on ember Tensors equals `oracle` (fn itself when None) on torch tensors or numpy arrays.

    `inputs` are numpy arrays (or what np.asarray takes); each side gets its own copy. Returns ember's values.
    """
    arrays = [np.asarray(x) for x in inputs]
    got = fn(*(Tensor(a.copy()) for a in arrays))
    wrap = (lambda a: torch.from_numpy(a.copy())) if lib == "torch" else (lambda a: a.copy())
    want = (oracle or fn)(*(wrap(a) for a in arrays))
    assert isinstance(got, Tensor), f"ember side returned {type(got).__name__}, not a Tensor"
    assert dtype_name(got) == dtype_name(want), f"dtype: ember {dtype_name(got)}, {lib} {dtype_name(want)}"
    got_np, want_np = got.numpy(), to_numpy(want)
    assert got_np.shape == want_np.shape, f"shape: ember {got_np.shape}, {lib} {want_np.shape}"
    if got_np.dtype.kind in "biu":
        np.testing.assert_array_equal(got_np, want_np)
    else:
        default_rtol, default_atol = TOL[got.dtype.name]
        rtol, atol = tolerance(got.dtype.name, default_rtol if rtol is None else rtol,
                               default_atol if atol is None else atol)
        np.testing.assert_allclose(got_np, want_np, rtol=rtol, atol=atol, equal_nan=True)
    return got_np


def sample(shape: tuple[int, ...], dtype: str, low: float = -4, high: float = 4, seed: int = 0) -> np.ndarray:
    """Deterministic inputs in [low, high): uniform floats, or integers for int dtypes, or random bools."""
    rng = np.random.default_rng(seed)
    if dtype == "bool": return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu": return rng.integers(int(low), int(high), shape).astype(dtype)
    return rng.uniform(low, high, shape).astype(dtype)


def T(a: np.ndarray) -> torch.Tensor: return torch.from_numpy(a)


def scaled_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over the largest |want|: a relative error that tolerates exact zeros among the entries."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    if want.size == 0: return 0.0
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


def cpp_driver(module: str, fns: Sequence[Any], inputs: Sequence[Sequence[np.ndarray]]) -> str:
    """A C++ main() for a generate_module output: calls each NumericalFunction through call_raw on `inputs` and
    prints every output element with %a (exact), one per line."""
    lines = ["#include <cstdio>", f'#include "{module}.hpp"', "", "int main() {"]
    for f, args in zip(fns, inputs, strict=True):
        ns = f"{module}::{f.name}"
        lines += ["  {", f"    auto ws = {ns}::make_ws();"]
        for i, a in enumerate(args):
            values = ", ".join(float(v).hex() for v in a.reshape(-1))
            lines.append(f"    static const double in{i}[] = {{{values}}};")
        outs = [f"out{i}" for i in range(len(f.output_shapes))]
        shapes = list(zip(outs, f.output_shapes, strict=True))
        lines += [f"    static double {o}[{max(int(np.prod(s)), 1)}];" for o, s in shapes]
        lines.append(f"    {ns}::call_raw({', '.join([f'in{i}' for i in range(len(args))] + outs)}, ws->bytes);")
        for o, s in shapes:
            lines.append(f'    for (int i = 0; i < {int(np.prod(s))}; i++) std::printf("%a\\n", {o}[i]);')
        lines.append("  }")
    return "\n".join([*lines, "  return 0;", "}", ""])


# ---- derivative test cases (tests/ad) ------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One function in ember and in torch, its float argument shapes, the argnums to differentiate, where to sample.
    `ints` are extra integer arguments (index tensors) given after the float ones, as (shape, upper bound)."""

    name: str
    ember: Callable
    torch: Callable
    shapes: tuple[tuple[int, ...], ...]
    argnums: tuple[int, ...] = (0,)
    low: float = -1.0
    high: float = 1.0
    ints: tuple[tuple[tuple[int, ...], int], ...] = ()

    def inputs(self) -> list[np.ndarray]:
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        floats = [rng.uniform(self.low, self.high, s) for s in self.shapes]
        return floats + [rng.integers(0, bound, s) for s, bound in self.ints]

    def args(self) -> list[Arg]:
        return [Arg(s) for s in self.shapes] + [Arg(s, "int64") for s, _ in self.ints]


# ---- the on-disk cache ------------------------------------------------------------------------------------------

def use_fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point $EMBER_CACHE at an empty folder and forget this process's compiled programs: each realization then
    reads the cache as the test left it."""
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE", str(root))
    monkeypatch.setattr(realize, "_runners", {})
    schedule_cache.forget()  # (its constants' history too: a scalar that varied in another test is no buffer here)
    assert cache_dir() == str(root)
    return root


def fresh_module_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """use_fresh_cache for a whole module (one empty cache for its many kernels): `yield from` it in a
    module-scoped fixture."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE", str(tmp_path_factory.mktemp("cache")))
        mp.setattr(realize, "_runners", {})
        schedule_cache.forget()
        yield


def unique_constant() -> float:
    """A float32 constant no other test uses: a kernel scaling by it is new to every cache."""
    return float(np.float32(1 + uuid.uuid4().int % 100_000 / 2**17))


def scaled_sums(c: float) -> tuple[Tensor, np.ndarray]:
    """A one-kernel computation and its value; the same `c` gives the same kernel AST, and kernels of different `c`
    have the same name (the same symbol)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    return (Tensor(x) * c).sum(1), (x * np.float32(c)).sum(1)


def match_torch_gradient(ours: Callable[..., Tensor], theirs: Callable[..., torch.Tensor], *arrays: np.ndarray) -> None:
    """In float64, the gradient of a random linear function of the output, for every input, equals torch's."""
    inputs = [np.asarray(a, dtype=np.float64) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in inputs]
    want = theirs(*ts)
    cotangent = np.random.default_rng(7).normal(size=tuple(want.shape))
    (want * torch.from_numpy(cotangent)).sum().backward()
    es = [Tensor(a) for a in inputs]
    grads = (ours(*es) * Tensor(cotangent)).sum().gradient(*es)
    for i, (g, t) in enumerate(zip(grads, ts)):
        want_grad = np.zeros(t.shape) if t.grad is None else t.grad.numpy()  # None: the output does not use it
        np.testing.assert_allclose(g.numpy(), want_grad, rtol=1e-10, atol=1e-12, err_msg=f"gradient of input {i}")
