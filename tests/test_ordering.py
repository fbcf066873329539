"""Tests of ember/mixin/ordering.py and the data-dependent movement ops against torch: cumsum, cumprod, cummax, cummin
(short axes and the blocked path of axes over 512), sort, argsort, topk, pad in reflect, replicate and circular
modes, repeat_interleave; their gradients and their errors.

Scans that only pick values (cummax, cummin, sort, topk, pad, repeat_interleave) and integer scans are compared
exactly; float sums and products with a tolerance for adding in another order than torch. Gradients are taken in
float64 under a random cotangent and compared with torch's autograd.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import Tensor
from ember.errors import ShapeError
from tests.helpers import check, sample

EXACT = {"rtol": 0, "atol": 0}
F64 = {"rtol": 1e-10, "atol": 1e-12}


def match_gradient(ours: Callable[[Tensor], Tensor], theirs: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray,
                   seed: int = 1) -> None:
    """In float64, the gradient of a random linear function of the output equals torch's. (The forward values are
    checked in float32 by the caller; checking them here too would compile one more kernel.)"""
    x = np.asarray(x, dtype=np.float64)
    t, e = torch.tensor(x, requires_grad=True), Tensor(x)
    want, got = theirs(t), ours(e)
    assert got.shape == tuple(want.shape) and got.dtype.name == "float64"
    cotangent = np.random.default_rng(seed).standard_normal(got.shape)
    (want * torch.from_numpy(cotangent)).sum().backward()
    (grad,) = (got * Tensor(cotangent)).sum().gradient(e)
    np.testing.assert_allclose(grad.numpy(), t.grad.numpy(), **F64)


def distinct(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Float values with no ties (so torch's choice among equal elements never matters), shuffled."""
    n = int(np.prod(shape))
    return np.random.default_rng(seed).permutation(np.linspace(-3, 3, n)).reshape(shape)


def scan_input(op: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Standard normal values; for cumprod, factors near ±1 so that a product of 3000 stays in range."""
    rng = np.random.default_rng(seed)
    if op != "cumprod": return rng.standard_normal(shape).astype(np.float32)
    return (rng.uniform(0.98, 1.02, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


def ember_scan(op: str, axis: int) -> Callable[[Tensor], Tensor]:
    """ember's cumsum and cumprod, and the values of its cummax and cummin (which return (values, indices))."""
    if op in ("cummax", "cummin"): return lambda t: getattr(t, op)(axis).values
    return lambda t: getattr(t, op)(axis)


def torch_scan(op: str, axis: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch's cumsum and cumprod, and the values of its cummax and cummin."""
    if op in ("cummax", "cummin"): return lambda t: getattr(torch, op)(t, axis).values
    return lambda t: getattr(torch, op)(t, axis)


# ---- cumulative scans ----------------------------------------------------------------------------------------------

SCANS = ["cumsum", "cumprod", "cummax", "cummin"]
# (shape, axis): every axis of a 3-d tensor, 0-d, size 1, and axes over 512 that take the blocked path
SCAN_AXES = [((7,), 0), ((3, 4, 5), 0), ((3, 4, 5), 1), ((3, 4, 5), -1), ((3, 4, 5), -3), ((), 0), ((1,), 0),
             ((4, 1), 1), ((5, 1, 3), -2), ((2, 1000), 1), ((3000,), 0)]


@pytest.mark.parametrize("shape, axis", SCAN_AXES, ids=[f"{s}-axis{a}" for s, a in SCAN_AXES])
@pytest.mark.parametrize("op", SCANS)
def test_scan_float32_matches_torch(op, shape, axis):
    """cummax and cummin pick values, so they match exactly; sums and products of up to 3000 terms drift by some
    ulps of the running value (ember sums blocks, then the block totals)."""
    long = max(shape, default=1) > 512
    tol = EXACT if op in ("cummax", "cummin") else {"rtol": 1e-5 if long else 1e-6, "atol": 1e-4 if long else 1e-6}
    check(ember_scan(op, axis), torch_scan(op, axis), [scan_input(op, shape)], **tol)


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8", "bool"])
@pytest.mark.parametrize("op", SCANS)
def test_scan_of_integers_and_bools_has_torchs_values_and_dtype(op, dtype):
    """cumsum and cumprod of any integer or bool give int64, as torch; cummax and cummin keep the dtype."""
    x = sample((3, 7), dtype, low=-3 if dtype != "uint8" else 0, high=4, seed=2)
    check(ember_scan(op, 1), torch_scan(op, 1), [x], **EXACT)


@pytest.mark.parametrize("op", SCANS)
def test_long_integer_scan_over_a_leading_axis_is_exact(op):
    x = sample((1500, 2), "int32", low=-2 if op != "cumprod" else 1, high=3 if op != "cumprod" else 2, seed=3)
    if op == "cumprod": x[::100] = -1  # a product of ±1 that still changes sign along the axis
    check(ember_scan(op, 0), torch_scan(op, 0), [x], **EXACT)


NAN_ROWS = np.array([[np.nan, 1, 2, -1, 5, 0, 3, -2, 4],
                     [1, 3, np.nan, 2, 5, np.nan, -np.inf, 0, 1],
                     [-1, -np.inf, 2, np.inf, 0, 1, -np.inf, 3, np.nan],
                     [2, 1, 3, 1, 2, 4, -1, 5, 0]], dtype=np.float32)


@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("long", [False, True])
def test_cummax_and_cummin_keep_a_nan_once_seen(op, long):
    x = np.tile(NAN_ROWS, (1, 70)) if long else NAN_ROWS  # 630 columns: the blocked path
    got = check(ember_scan(op, 1), torch_scan(op, 1), [x], **EXACT)
    assert np.isnan(got[1, 2:]).all() and not np.isnan(got[3]).any()


SCAN_GRADIENTS = [(op, shape, axis) for op in ("cumsum", "cumprod") for shape, axis in [((3, 4, 5), 1), ((2, 600), -1),
                                                                                        ((), 0)]]
SCAN_GRADIENTS += [("cummax", (3, 4, 5), 1), ("cummin", (3, 4, 5), -1)]


@pytest.mark.parametrize("op, shape, axis", SCAN_GRADIENTS, ids=[f"{o}-{s}-axis{a}" for o, s, a in SCAN_GRADIENTS])
def test_scan_gradient_matches_torch(op, shape, axis):
    """cumprod's input has no zeros; cummax's and cummin's has no ties (torch gives a tied maximum's gradient to one
    element, ember shares it among them)."""
    x = scan_input(op, shape, seed=4) if op in ("cumsum", "cumprod") else distinct(shape)
    match_gradient(ember_scan(op, axis), torch_scan(op, axis), x)


@pytest.mark.parametrize("op", SCANS)
def test_scan_rejects_an_axis_out_of_range(op):
    with pytest.raises(ShapeError, match=rf"{op}: axis 2 is out of range for a 2-d tensor \(3, 4\); valid axes are "
                                         r"-2..1"):
        getattr(Tensor.ones(3, 4), op)(2)


# ---- sort, argsort, topk -------------------------------------------------------------------------------------------

SORT_AXES = [((9,), -1), ((3, 4, 5), 0), ((3, 4, 5), 1), ((4, 1), 1), ((2, 33), -1), ((), 0)]


def torch_sort(dim: int, descending: bool) -> Callable[[torch.Tensor], Any]:
    return lambda t: torch.sort(t, dim=dim, descending=descending, stable=True)


def assert_sorted_like_torch(x: np.ndarray, dim: int, descending: bool) -> None:
    x = np.asarray(x)
    values, indices = Tensor(x).sort(dim, descending)
    want_values, want_indices = torch_sort(dim, descending)(torch.from_numpy(x))
    assert values.dtype.name == x.dtype.name and indices.dtype.name == "int64"
    np.testing.assert_array_equal(values.numpy(), want_values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("shape, dim", SORT_AXES, ids=[f"{s}-dim{d}" for s, d in SORT_AXES])
def test_sort_is_stable_like_torch(shape, dim, descending):
    """Values are halves from -2 to 2, so most have ties: equal values keep their order in both directions."""
    assert_sorted_like_torch(sample(shape, "float32", seed=5).round() / 2, dim, descending)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_puts_nan_last_ascending_and_first_descending(descending):
    x = np.array([[3, np.nan, -np.inf, 1, np.nan, np.inf, 1, -2, np.nan, 0],
                  [np.nan, np.nan, 2, 2, -np.inf, -np.inf, np.inf, np.inf, 0, 5]], dtype=np.float32)
    assert_sorted_like_torch(x, -1, descending)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "bool"])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_of_integers_and_bools_matches_torch(dtype, descending):
    x = sample((6, 5), dtype, low=-50 if dtype != "uint8" else 0, high=120, seed=6)
    x[0] = x[1]  # ties across the axis
    assert_sorted_like_torch(x, 0, descending)


def test_sort_of_large_int64_values_is_exact():
    x = np.array([2**62 + 1, -(2**62), 2**62, -(2**63), 2**63 - 1, 0, 2**62 + 1], dtype=np.int64)
    assert_sorted_like_torch(x, 0, False)
    assert_sorted_like_torch(x, 0, True)


@pytest.mark.parametrize("name, ours, theirs", [
    ("sort", lambda t: t.sort()[0], lambda t: torch.sort(t, stable=True)[0]),
    ("sort_descending", lambda t: t.sort(descending=True)[0], lambda t: torch.sort(t, descending=True, stable=True)[0]),
    ("topk", lambda t: t.topk(3)[0], lambda t: torch.topk(t, 3)[0]),
    ("topk_smallest", lambda t: t.topk(3, largest=False)[0], lambda t: torch.topk(t, 3, largest=False)[0]),
])
def test_sort_and_topk_keep_the_sign_of_negative_zero(name, ours, theirs):
    """Values are moved, not summed into place: -0.0 stays -0.0 (only one zero here, so no tie decides its place)."""
    x = np.array([1.0, -0.0, -1.0, 2.0, np.nan], dtype=np.float32)
    got, want = ours(Tensor(x)).numpy(), theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("shape, dim, descending", [((3, 4, 5), 1, False), ((3, 4, 5), -1, True), ((8,), 0, True)])
def test_argsort_matches_torch(shape, dim, descending):
    x = sample(shape, "int32", low=0, high=4, seed=7)
    check(lambda t: t.argsort(dim, descending), lambda t: torch.argsort(t, dim=dim, descending=descending,
                                                                        stable=True), [x], **EXACT)


# (shape, k, dim, largest)
TOPK = [((3, 7), 3, -1, True), ((3, 7), 3, -1, False), ((3, 7), 0, -1, True), ((3, 7), 7, -1, False),
        ((3, 7), 1, 0, True), ((4, 5, 6), 2, 1, False), ((4, 5, 6), 6, 2, True), ((), 1, 0, True)]


@pytest.mark.parametrize("shape, k, dim, largest", TOPK, ids=[f"{c[0]}-k{c[1]}-dim{c[2]}-{c[3]}" for c in TOPK])
def test_topk_matches_torch(shape, k, dim, largest):
    """Values with ties compare exactly; indices are compared where all values differ (torch does not promise
    which of equal elements it returns)."""
    ties = sample(shape, "float32", seed=8).round()
    check(lambda t: t.topk(k, dim, largest)[0], lambda t: torch.topk(t, k, dim, largest).values, [ties], **EXACT)
    x = distinct(shape).astype(np.float32)
    values, indices = Tensor(x).topk(k, dim, largest)
    want = torch.topk(torch.from_numpy(x), k, dim, largest)
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())


def test_topk_treats_nan_as_the_largest():
    x = np.array([1, np.nan, 3, -np.inf, 2], dtype=np.float32)
    check(lambda t: t.topk(2)[0], lambda t: torch.topk(t, 2).values, [x], **EXACT)
    check(lambda t: t.topk(2, largest=False)[0], lambda t: torch.topk(t, 2, largest=False).values, [x], **EXACT)


@pytest.mark.parametrize("name, ours, theirs", [
    ("sort", lambda t: t.sort(1)[0], lambda t: torch.sort(t, 1)[0]),
    ("sort_descending", lambda t: t.sort(-1, descending=True)[0], lambda t: torch.sort(t, -1, descending=True)[0]),
    ("topk", lambda t: t.topk(2, 1)[0], lambda t: torch.topk(t, 2, 1)[0]),
    ("topk_smallest", lambda t: t.topk(3, -1, largest=False)[0], lambda t: torch.topk(t, 3, -1, largest=False)[0]),
])
def test_sort_and_topk_values_gradient_matches_torch(name, ours, theirs):
    match_gradient(ours, theirs, distinct((3, 4, 5), seed=9))


@pytest.mark.parametrize("shape, k, match", [
    ((3, 7), 8, r"topk: k=8 is out of range for an axis of size 7 in \(3, 7\)"),
    ((3, 7), -1, r"topk: k=-1 is out of range for an axis of size 7 in \(3, 7\)"),
    ((), 2, r"topk: k=2 is out of range for an axis of size 1 in \(\)"),
])
def test_topk_rejects_k_out_of_range(shape, k, match):
    with pytest.raises(ShapeError, match=match):
        Tensor(np.zeros(shape, np.float32)).topk(k)


def test_sort_rejects_an_axis_out_of_range():
    with pytest.raises(ShapeError, match=r"sort: axis -3 is out of range for a 2-d tensor \(3, 4\)"):
        Tensor.ones(3, 4).sort(-3)


# ---- pad with data, repeat_interleave ------------------------------------------------------------------------------

# (shape, torch's flat padding, last axis first): 1-d to 3-d padding, asymmetric, unbatched or batched
PADS = [((2, 3, 5), (2, 1)), ((1, 2, 4, 5), (1, 2, 3, 0)), ((2, 4, 5), (3, 1, 2, 2)),
        ((1, 1, 3, 4, 5), (1, 0, 2, 1, 0, 2))]


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape, pads", PADS, ids=[f"{s}-{p}" for s, p in PADS])
def test_pad_mode_matches_torch(shape, pads, mode):
    """Values exactly, and gradients; of 3-d padding only reflect's, whose graph takes ember seconds to compile
    (replicate and circular pad each axis with the code their 1-d and 2-d cases test)."""
    x = sample(shape, "float32", seed=10)
    check(lambda t: t.pad(pads, mode=mode), lambda t: F.pad(t, pads, mode=mode), [x], **EXACT)
    if len(pads) < 6 or mode == "reflect":
        match_gradient(lambda t: t.pad(pads, mode=mode), lambda t: F.pad(t, pads, mode=mode), x)


@pytest.mark.parametrize("mode, shape, pads", [
    ("reflect", (3, 5), (0, 4)),  # the largest reflect padding: size - 1
    ("reflect", (1, 2, 5), (4, 4)),
    ("circular", (1, 2, 5), (5, 5)),  # the largest circular padding: the size
    ("replicate", (1, 2, 2), (5, 7)),  # replicate may pad past the size
    ("replicate", (1, 1, 1, 3), (2, 0, 3, 1)),  # size-1 axis
])
def test_pad_mode_at_its_limits_matches_torch(mode, shape, pads):
    x = sample(shape, "float32", seed=11)
    check(lambda t: t.pad(pads, mode=mode), lambda t: F.pad(t, pads, mode=mode), [x], **EXACT)


def test_pad_mode_takes_pairs_from_the_first_axis():
    x = sample((2, 4, 5), "float32", seed=12)
    check(lambda t: t.pad(((0, 0), (1, 3), None), mode="reflect"), lambda t: F.pad(t, (0, 0, 1, 3), mode="reflect"),
          [x], **EXACT)


@pytest.mark.parametrize("mode, shape, pads, match", [
    ("reflect", (2, 3, 5), (5, 0), r"pad: reflect padding \(5, 0\) is too large for axis 2 of size 5 in \(2, 3, 5\)"),
    ("reflect", (2, 3, 5), (0, 0, 1, 3), r"pad: reflect padding \(1, 3\) is too large for axis 1 of size 3"),
    ("circular", (2, 3, 5), (6, 0), r"pad: circular padding \(6, 0\) is too large for axis 2 of size 5"),
    ("replicate", (2, 0), (1, 0), r"pad: replicate padding \(1, 0\) is too large for axis 1 of size 0"),
    ("reflect", (2, 3, 5), (-1, 5), r"pad: reflect padding \(0, 5\) is too large for axis 2 of size 5"),
])
def test_pad_mode_rejects_padding_too_large_for_the_axis(mode, shape, pads, match):
    with pytest.raises(ShapeError, match=match):
        Tensor(np.zeros(shape, np.float32)).pad(pads, mode=mode)


def test_pad_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="pad: mode must be constant, reflect, replicate or circular, got 'symmetric'"):
        Tensor.ones(3, 4).pad((1, 1), mode="symmetric")


REPEAT_INTERLEAVE = [(3, 0), (2, 1), (3, -1), (1, 2), (0, 1), (2, None), (3, None), (0, None)]


@pytest.mark.parametrize("repeats, dim", REPEAT_INTERLEAVE, ids=[f"{r}-dim{d}" for r, d in REPEAT_INTERLEAVE])
def test_repeat_interleave_matches_torch(repeats, dim):
    x = sample((2, 3, 4), "float32", seed=13)
    check(lambda t: t.repeat_interleave(repeats, dim), lambda t: t.repeat_interleave(repeats, dim), [x], **EXACT)
    if repeats:
        match_gradient(lambda t: t.repeat_interleave(repeats, dim), lambda t: t.repeat_interleave(repeats, dim), x)


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_repeat_interleave_of_a_0d_and_of_integers_matches_torch(dtype):
    check(lambda t: t.repeat_interleave(3), lambda t: t.repeat_interleave(3), [sample((), dtype, seed=14)], **EXACT)
    check(lambda t: t.repeat_interleave(2, 0), lambda t: t.repeat_interleave(2, 0), [sample((3, 2), dtype)], **EXACT)


def test_repeat_interleave_rejects_negative_repeats():
    with pytest.raises(ShapeError, match="repeat_interleave: repeats must be a non-negative int, got -1"):
        Tensor.ones(3).repeat_interleave(-1)
