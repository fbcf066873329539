"""Tests of the tinygrad Tensor names added from docs/tinygrad_api_gap.md §1: rearrange, multinomial, data, replace,
to_, contiguous_backward, __delitem__, from_blob and from_url.

rearrange is checked against the reshape/permute each einops formula stands for, run in torch, forward and
backward; multinomial statistically under fixed seeds, against the exact probabilities; the rest against numpy.
Argument errors are matched by message, and where torch refuses the same input, torch is run to show it does.
"""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Callable

import numpy as np
import pytest
import torch

from ember import Tensor, dtypes
from ember.errors import DeviceError, DTypeError, ShapeError
from ember.uop.ops import Ops
from tests.helpers import check, sample

# ---- rearrange -----------------------------------------------------------------------------------------------------

# (formula, sizes, input shape, the same rearrangement written with torch's reshape/permute)
REARRANGE_CASES: list[tuple[str, dict[str, int], tuple[int, ...], Callable[[torch.Tensor], torch.Tensor]]] = [
    ("b c h w -> b h w c", {}, (2, 3, 4, 5), lambda x: x.permute(0, 2, 3, 1)),
    ("b c h w -> b c h w", {}, (2, 3, 4, 5), lambda x: x),
    ("b (h w) c -> b h w c", {"h": 2}, (2, 6, 4), lambda x: x.reshape(2, 2, 3, 4)),
    ("b (h w) c -> b h w c", {"h": 2, "w": 3}, (2, 6, 4), lambda x: x.reshape(2, 2, 3, 4)),
    # space to depth, from the einops docs
    ("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", {"p1": 2, "p2": 3}, (2, 3, 4, 6),
     lambda x: x.reshape(2, 3, 2, 2, 2, 3).permute(0, 2, 4, 3, 5, 1).reshape(2, 4, 18)),
    # the einops tutorial's image-batch examples: stack along height, along width, channels first, a 2x2 mosaic
    ("b h w c -> (b h) w c", {}, (4, 3, 5, 2), lambda x: x.reshape(12, 5, 2)),
    ("b h w c -> h (b w) c", {}, (4, 3, 5, 2), lambda x: x.permute(1, 0, 2, 3).reshape(3, 20, 2)),
    ("b h w c -> b c h w", {}, (4, 3, 5, 2), lambda x: x.permute(0, 3, 1, 2)),
    ("(b1 b2) h w c -> (b1 h) (b2 w) c", {"b1": 2}, (4, 3, 5, 2),
     lambda x: x.reshape(2, 2, 3, 5, 2).permute(0, 2, 1, 3, 4).reshape(6, 10, 2)),
    ("(a b) c -> (b a) c", {"a": 2}, (6, 4), lambda x: x.reshape(2, 3, 4).permute(1, 0, 2).reshape(6, 4)),
    ("a b c -> (a b c)", {}, (2, 3, 4), lambda x: x.reshape(-1)),
    ("... h w -> ... w h", {}, (2, 3, 4, 5), lambda x: x.transpose(-1, -2)),
    ("... h w -> (...) (h w)", {}, (2, 3, 4, 5), lambda x: x.reshape(6, 20)),
    ("b ... -> b (...)", {}, (2, 3, 4, 5), lambda x: x.reshape(2, 60)),
    ("b ... c -> c ... b", {}, (2, 3), lambda x: x.permute(1, 0)),  # "..." may stand for no axis
    ("a 1 b -> b a", {}, (2, 1, 3), lambda x: x.reshape(2, 3).T),
    ("a () b -> b a", {}, (2, 1, 3), lambda x: x.reshape(2, 3).T),
    ("a b -> a () b 1", {}, (2, 3), lambda x: x.reshape(2, 1, 3, 1)),
    ("(a 1) b -> b a", {}, (2, 3), lambda x: x.T),
    (" -> 1", {}, (), lambda x: x.reshape(1)),
    ("a_1 B2 -> B2 a_1", {}, (2, 3), lambda x: x.T),
]


@pytest.mark.parametrize("formula, sizes, shape, torch_fn", REARRANGE_CASES, ids=[c[0] for c in REARRANGE_CASES])
def test_rearrange_equals_its_reshape_and_permute(formula, sizes, shape, torch_fn):
    check(lambda x: x.rearrange(formula, **sizes), torch_fn, [sample(shape, "float32")])


@pytest.mark.parametrize("formula, sizes, shape, torch_fn", REARRANGE_CASES[:10],
                         ids=[c[0] for c in REARRANGE_CASES[:10]])
def test_rearrange_gradient_equals_torch(formula, sizes, shape, torch_fn):
    x = sample(shape, "float64")
    xt = torch.tensor(x, requires_grad=True)
    out = torch_fn(xt)
    cotangent = np.random.default_rng(3).normal(size=tuple(out.shape))
    (out * torch.from_numpy(cotangent)).sum().backward()
    xe = Tensor(x)
    (grad,) = (xe.rearrange(formula, **sizes) * Tensor(cotangent)).sum().gradient(xe)
    np.testing.assert_allclose(grad.numpy(), xt.grad.numpy(), rtol=1e-12)


def test_rearrange_copies_nothing():
    x = Tensor.arange(24).reshape(2, 3, 4).realize()
    moved = x.rearrange("a b c -> c (a b)")
    assert {u.op for u in moved.uop.toposort()} <= {Ops.BUFFER, Ops.RESHAPE, Ops.PERMUTE}


REARRANGE_ERRORS = [
    ("a b", {}, (2, 3), ValueError, r"one string '<axes in> -> <axes out>'"),
    ("a -> b -> a", {}, (2,), ValueError, r"one string"),
    ("a b -> a", {}, (2, 3), ValueError, r"b only on the left of 'a b -> a'"),
    ("a -> a b", {}, (2,), ValueError, r"b only on the right"),
    ("a a -> a", {}, (2, 2), ValueError, r"a appears more than once on one side"),
    ("(a (b)) -> a b", {}, (6,), ValueError, r"nested parentheses"),
    ("(a b -> a b", {}, (6,), ValueError, r"'\(' without '\)'"),
    ("a) -> a", {}, (6,), ValueError, r"'\)' without '\('"),
    ("a 2 -> a", {}, (2, 2), ValueError, r"unexpected a size '2'.*sizes go in keywords"),
    ("a + b -> a b", {}, (2, 2), ValueError, r"unexpected character '\+'"),
    ("... a ... -> a", {}, (2, 2), ValueError, r"\.\.\. appears more than once"),
    ("(... a) -> a ...", {}, (6,), ValueError, r"'\.\.\.' inside parentheses on the left"),
    ("a b -> b a", {"c": 2}, (2, 3), ValueError, r"sizes given for c, which 'a b -> b a' does not name"),
    ("a b -> b a", {"a": -1}, (2, 3), ShapeError, r"size a=-1 must be a non-negative int"),
    ("a b c -> a b c", {}, (2, 3), ShapeError, r"names 3 axes, the tensor has 2 \(2, 3\)"),
    ("a b c ... -> a b c ...", {}, (2, 3), ShapeError, r"names at least 3 axes, the tensor has 2"),
    ("(a b) c -> a b c", {}, (6, 4), ShapeError, r"axis \(a b\) has size 6 in \(6, 4\): cannot infer both a and b"),
    ("(a b) c -> a b c", {"a": 4}, (6, 4), ShapeError, r"the sizes \{'a': 4\} do not divide or match it"),
    ("a b -> b a", {"a": 3}, (2, 3), ShapeError, r"axis a has size 2 in \(2, 3\)"),
    ("1 b -> b", {}, (2, 3), ShapeError, r"axis 1 has size 2.*'1' and '\(\)' stand for an axis of size 1"),
]


@pytest.mark.parametrize("formula, sizes, shape, error, message", REARRANGE_ERRORS,
                         ids=[e[0] for e in REARRANGE_ERRORS])
def test_rearrange_rejects_a_bad_formula_by_name(formula, sizes, shape, error, message):
    with pytest.raises(error, match=r"^rearrange: .*" + message):
        Tensor.zeros(*shape).rearrange(formula, **sizes)


# ---- multinomial ---------------------------------------------------------------------------------------------------


def test_multinomial_with_replacement_follows_the_weights():
    Tensor.manual_seed(11)
    draws = Tensor([1.0, 2.0, 3.0, 0.0, 4.0]).multinomial(40000, replacement=True)
    assert draws.shape == (40000,) and draws.dtype is dtypes.int64
    counts = np.bincount(draws.numpy(), minlength=5)
    p = np.array([1, 2, 3, 0, 4]) / 10
    assert counts[3] == 0  # a category without weight is never drawn
    sigma = np.sqrt(40000 * p * (1 - p))
    assert np.all(np.abs(counts - 40000 * p) <= 5 * sigma + 1e-9), counts
    chi2 = (((counts - 40000 * p) ** 2)[p > 0] / (40000 * p[p > 0])).sum()
    assert chi2 < 18.5  # chi-square with 3 degrees of freedom: p-value 0.0003


def test_multinomial_draws_each_row_of_a_matrix_from_its_own_weights():
    Tensor.manual_seed(5)
    weights = np.array([[0.0, 0.0, 1.0], [1.0, 1.0, 0.0], [1.0, 3.0, 0.0]], np.float32)
    draws = Tensor(weights).multinomial(20000, replacement=True).numpy()
    assert draws.shape == (3, 20000)
    assert np.all(draws[0] == 2) and set(np.unique(draws[1])) == {0, 1}
    np.testing.assert_allclose((draws[2] == 1).mean(), 0.75, atol=0.015)
    np.testing.assert_allclose((draws[1] == 1).mean(), 0.5, atol=0.015)


def test_multinomial_without_replacement_gives_distinct_indices():
    Tensor.manual_seed(2)
    weights = sample((300, 7), "float32", 0.1, 4, seed=4)
    draws = Tensor(weights).multinomial(7).numpy()
    assert draws.dtype == np.int64
    assert np.all(np.sort(draws, axis=1) == np.arange(7))  # all 7 of 7: a permutation in each row
    part = Tensor(weights).multinomial(4).numpy()
    assert all(len(set(row)) == 4 for row in part)


def test_multinomial_without_replacement_has_the_sequential_draw_probabilities():
    """P(first = i) = p_i, and P(i among two draws) = p_i + sum_j p_j p_i / (1 - p_j), as in torch's sampler."""
    p = np.array([0.1, 0.2, 0.3, 0.4])
    Tensor.manual_seed(9)
    draws = Tensor(p.astype(np.float32)).reshape(1, 4).expand(30000, 4).contiguous().multinomial(2).numpy()
    first = np.bincount(draws[:, 0], minlength=4) / 30000
    included = np.array([(draws == i).any(axis=1).mean() for i in range(4)])
    want_included = np.array([p[i] + sum(p[j] * p[i] / (1 - p[j]) for j in range(4) if j != i) for i in range(4)])
    torch.manual_seed(9)
    torch_draws = torch.multinomial(torch.tensor(p).expand(30000, 4), 2).numpy()
    torch_included = np.array([(torch_draws == i).any(axis=1).mean() for i in range(4)])
    np.testing.assert_allclose(first, p, atol=0.012)
    np.testing.assert_allclose(included, want_included, atol=0.012)
    np.testing.assert_allclose(torch_included, want_included, atol=0.012)  # the oracle itself agrees


def test_multinomial_without_replacement_draws_zero_weights_last_as_torch():
    Tensor.manual_seed(1)
    weights = Tensor([[0.0, 5.0, 0.0, 1.0, 2.0]]).expand(500, 5).contiguous()
    assert set(np.unique(weights.multinomial(3).numpy())) <= {1, 3, 4}
    draws = weights.multinomial(5).numpy()
    assert np.all(np.sort(draws[:, :3], axis=1) == [1, 3, 4]) and np.all(np.sort(draws, axis=1) == np.arange(5))
    assert {tuple(row) for row in draws[:, 3:]} == {(0, 2), (2, 0)}  # in random order, as torch's
    torch.manual_seed(1)
    torch_draws = torch.multinomial(torch.tensor([0.0, 5.0, 0.0, 1.0, 2.0]), 5).numpy()
    assert sorted(torch_draws[:3]) == [1, 3, 4]


def test_multinomial_repeats_under_manual_seed():
    w = Tensor([1.0, 2.0, 3.0])
    Tensor.manual_seed(4)
    a, b = w.multinomial(50, replacement=True).tolist(), w.multinomial(3).tolist()
    Tensor.manual_seed(4)
    assert w.multinomial(50, replacement=True).tolist() == a and w.multinomial(3).tolist() == b


MULTINOMIAL_ERRORS = [
    (np.ones((2, 2, 2), np.float32), 1, False, ShapeError, r"weights must be 1-D or 2-D, got \(2, 2, 2\)"),
    (np.ones(3, np.int32), 1, False, DTypeError, r"weights must have a float dtype, got int32"),
    (np.ones(3, np.float32), 0, True, ValueError, r"num_samples must be a positive int, got 0"),
    (np.ones(3, np.float32), 4, False, ValueError, r"cannot draw 4 samples from 3 categories without replacement"),
    (np.array([1.0, -1.0], np.float32), 1, True, ValueError, r"inf, NaN or a negative value"),
    (np.array([1.0, np.nan], np.float32), 1, True, ValueError, r"inf, NaN or a negative value"),
    (np.array([1.0, np.inf], np.float32), 1, True, ValueError, r"inf, NaN or a negative value"),
    (np.array([[1.0, 1.0], [0.0, 0.0]], np.float32), 1, True, ValueError, r"a row of weights sums to 0"),
]


@pytest.mark.parametrize("weights, n, replacement, error, message", MULTINOMIAL_ERRORS)
def test_multinomial_refuses_what_torch_refuses(weights, n, replacement, error, message):
    with pytest.raises(RuntimeError):
        torch.multinomial(torch.from_numpy(weights), n, replacement)
    with pytest.raises(error, match=r"^multinomial: .*" + message):
        Tensor(weights).multinomial(n, replacement)


# ---- data, replace, to_, __delitem__ -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, fmt", [("float32", "f"), ("float16", "e"), ("float64", "d"), ("int32", "i"),
                                        ("uint8", "B"), ("int8", "b"), ("bool", "?")])
def test_data_is_a_typed_read_only_memoryview_of_the_values(dtype, fmt):
    values = sample((2, 3), dtype)
    view = Tensor(values).data()
    assert view.format == fmt and view.shape == (2, 3) and view.readonly
    np.testing.assert_array_equal(np.asarray(view), values)


def test_data_of_an_int64_and_a_0d_tensor_and_a_lazy_one():
    assert np.asarray(Tensor([1, 2], dtype="int64").data()).dtype == np.int64
    assert Tensor(2.5).data().shape == () and Tensor(2.5).data().tolist() == 2.5
    assert (Tensor.arange(4) * 2).data().tolist() == [0, 2, 4, 6]


def test_data_is_a_copy_and_refuses_bfloat16():
    t = Tensor([1.0, 2.0])
    view = t.data()
    t.assign([5.0, 6.0]).realize()
    assert view.tolist() == [1.0, 2.0]
    with pytest.raises(DTypeError, match=r"^data: bfloat16 has no struct format"):
        Tensor([1.0], dtype="bfloat16").data()


def test_replace_gives_self_the_other_graph():
    t, other = Tensor([1.0, 2.0]), Tensor([3.0, 4.0]) * 2
    alias = t
    assert t.replace(other) is t and alias.tolist() == [6.0, 8.0]
    assert t.uop is other.uop


@pytest.mark.parametrize("other, error, message", [
    (Tensor([1.0, 2.0, 3.0]), ShapeError, r"shape \(3,\) differs from the tensor's \(2,\)"),
    (Tensor([1, 2]), DTypeError, r"dtype int32 differs from the tensor's float32"),
    ([1.0, 2.0], TypeError, r"expected a Tensor, got list"),
])
def test_replace_needs_the_same_shape_and_dtype(other, error, message):
    with pytest.raises(error, match=r"^replace: .*" + message):
        Tensor([1.0, 2.0]).replace(other)


def test_replace_refuses_a_leaf_that_requires_grad():
    with pytest.raises(RuntimeError, match=r"^replace: a leaf tensor that requires grad"):
        Tensor([1.0], requires_grad=True).replace(Tensor([2.0]))


def test_to_in_place_keeps_the_tensor_and_checks_the_device():
    t = Tensor([1.0, 2.0])
    assert t.to_("cpu") is t and t.device == "CPU" and t.tolist() == [1.0, 2.0]
    with pytest.raises(DeviceError, match=r"unknown device 'NOPE'"):
        t.to_("NOPE")
    assert t.device == "CPU" and t.tolist() == [1.0, 2.0]


def test_delitem_raises_a_type_error_as_tinygrad():
    t = Tensor([1, 2, 3])
    with pytest.raises(TypeError, match=r"^del tensor\[\.\.\.\]: a Tensor does not support item deletion"):
        del t[0]
    assert t.tolist() == [1, 2, 3]


# ---- contiguous_backward -------------------------------------------------------------------------------------------


def gradient_ops(t: Tensor) -> list[Ops]:
    return [u.op for u in t.uop.toposort()]


def test_contiguous_backward_is_the_identity_forward_and_in_gradients():
    x = sample((3, 4), "float64", seed=1)
    xe, xt = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (xe.exp().contiguous_backward() * xe).sum().backward()
    (xt.exp() * xt).sum().backward()
    np.testing.assert_allclose(xe.grad.numpy(), xt.grad.numpy(), rtol=1e-12)
    np.testing.assert_array_equal(Tensor(x).contiguous_backward().numpy(), x)


def test_contiguous_backward_makes_the_gradient_contiguous():
    x = Tensor(sample((3, 4), "float32"), requires_grad=True)
    seed = Tensor([1.0, 2.0, 3.0, 4.0])
    plain = (x * 3).sum(0).gradient(x, gradient=seed)[0]
    marked = (x * 3).contiguous_backward().sum(0).gradient(x, gradient=seed)[0]
    assert Ops.CONTIGUOUS not in gradient_ops(plain) and Ops.CONTIGUOUS in gradient_ops(marked)
    np.testing.assert_array_equal(marked.numpy(), plain.numpy())


def test_contiguous_backward_nested_and_on_two_paths():
    """Markers inside markers, and a tensor reached both through a marker and around it: every path counts once."""
    x = sample((5,), "float64", seed=2)
    xe, xt = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    inner = (xe * 2).contiguous_backward()
    ((inner.sin() * 3).contiguous_backward() * xe + inner * inner).sum().backward()
    ((xt * 2).sin() * 3 * xt + (xt * 2) * (xt * 2)).sum().backward()
    np.testing.assert_allclose(xe.grad.numpy(), xt.grad.numpy(), rtol=1e-12)


# ---- from_blob and from_url ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "uint8", "bool", "float16"])
def test_from_blob_copies_the_memory_at_a_pointer(dtype):
    values = np.ascontiguousarray(sample((2, 3), dtype))
    t = Tensor.from_blob(values.ctypes.data, (2, 3), dtype=dtype)
    assert t.dtype is getattr(dtypes, dtype) and t.shape == (2, 3)
    np.testing.assert_array_equal(t.numpy(), values)


def test_from_blob_copies_rather_than_aliases_and_defaults_to_float32():
    values = np.arange(4, dtype=np.float32)
    t = Tensor.from_blob(values.ctypes.data, 4)
    values[:] = -1  # ember copied the bytes when called: the tensor keeps them
    assert t.dtype is dtypes.float32 and t.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_from_blob_reads_bfloat16_bits_as_they_are():
    bits = np.array([0x3F80, 0xC000, 0x4049], np.uint16)  # 1.0, -2.0, 3.140625
    assert Tensor.from_blob(bits.ctypes.data, (3,), dtype="bfloat16").tolist() == [1.0, -2.0, 3.140625]


def test_from_blob_checks_its_arguments():
    with pytest.raises(TypeError, match=r"^from_blob: ptr must be an int address, got float"):
        Tensor.from_blob(1.5, (2,))
    with pytest.raises(ValueError, match=r"^from_blob: ptr must be a positive address, got 0"):
        Tensor.from_blob(0, (2,))
    with pytest.raises(ShapeError, match=r"^from_blob: shape sizes must be non-negative ints"):
        Tensor.from_blob(1, (-1,))
    assert Tensor.from_blob(0, (0, 3)).shape == (0, 3)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory, so downloads of one test are not another's."""
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_from_url_reads_a_file_url_as_uint8_and_caches_it(tmp_path, cache):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(10)))
    t = Tensor.from_url(path.as_uri())
    assert t.dtype is dtypes.uint8 and t.tolist() == list(range(10))
    assert len(os.listdir(cache / "downloads")) == 1
    path.unlink()  # fetched once: the cached copy answers
    assert Tensor.from_url(path.as_uri()).tolist() == list(range(10))


def test_from_url_gunzips_and_reads_as_a_dtype(tmp_path, cache):
    values = np.arange(6, dtype=np.float32) * 1.5
    path = tmp_path / "data.gz"
    path.write_bytes(gzip.compress(values.tobytes()))
    t = Tensor.from_url(path.as_uri(), gunzip=True, dtype="float32")
    assert t.dtype is dtypes.float32 and t.tolist() == values.tolist()
    assert Tensor.from_url(path.as_uri()).shape == (len(path.read_bytes()),)  # the compressed bytes, kept apart


def test_from_url_errors_name_the_url(tmp_path, cache):
    missing = (tmp_path / "missing.bin").as_uri()
    with pytest.raises(OSError, match=r"^from_url: cannot read 'file://.*missing\.bin'"):
        Tensor.from_url(missing)
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"abc")
    with pytest.raises(ValueError, match=r"^from_url: 'file://.*plain\.bin' is not a complete gzip file"):
        Tensor.from_url(plain.as_uri(), gunzip=True)
    with pytest.raises(ShapeError, match=r"^from_url: 3 bytes are not a whole number of float32 elements"):
        Tensor.from_url(plain.as_uri(), dtype="float32")
    assert math.prod(Tensor.from_url(plain.as_uri()).shape) == 3
