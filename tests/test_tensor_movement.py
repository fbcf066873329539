"""End-to-end tests of Tensor's movement ops and basic indexing against numpy (and torch for torch-only forms).

Movement ops build views; each test realizes the view (or a computation on it) and compares with the oracle's
values, shape and dtype through tests.helpers.check.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812  (torch's own spelling)

from ember import Tensor
from ember.errors import ShapeError
from tests.helpers import REDUCE_TOL, check, match_torch_gradient, sample


def arange(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """Distinct values in row-major order, so a wrong element shows which element it came from."""
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


def same(fn):
    """The case where ember and the oracle spell the call the same way."""
    return fn, None


# ---- reshape, permute, expand ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, new", [
    ((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((2, 3, 4), (4, -1)), ((2, 3, 4), (2, -1, 3)), ((17,), (1, 17, 1)),
    ((3, 0), (0, 5)), ((3, 0), (-1, 3)), ((), (1, 1)), ((1,), ()), ((), (-1,)), ((6,), (6,)), ((1000,), (10, 100)),
], ids=str)
def test_reshape_matches_numpy(shape, new):
    check(lambda x: x.reshape(new), None, [arange(shape)], lib="numpy")


def test_reshape_takes_sizes_as_arguments_and_view_is_reshape():
    check(lambda x: x.reshape(4, -1), lambda x: x.reshape(4, -1), [arange((2, 6))], lib="numpy")
    check(lambda x: x.view(3, 4), lambda x: x.reshape(3, 4), [arange((2, 6))], lib="numpy")


def test_reshape_of_a_permuted_view_reads_elements_in_logical_order():
    check(lambda x: x.permute(1, 0, 2).reshape(-1), lambda x: x.transpose(1, 0, 2).reshape(-1), [arange((2, 3, 4))],
          lib="numpy")


@pytest.mark.parametrize("shape, order", [
    ((2, 3, 4), (2, 0, 1)), ((2, 3, 4), (1, 0, 2)), ((2, 3, 4), (-1, 0, 1)), ((2, 3, 4), (0, 1, 2)), ((17,), (0,)),
    ((), ()), ((3, 0, 2), (2, 1, 0)), ((2, 1, 3, 1), (3, 2, 1, 0)),
], ids=str)
def test_permute_matches_numpy_transpose(shape, order):
    check(lambda x: x.permute(order), lambda x: x.transpose(order), [arange(shape)], lib="numpy")


def test_permute_takes_axes_as_arguments():
    check(lambda x: x.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1), [arange((2, 3, 4))], lib="numpy")


@pytest.mark.parametrize("shape, new", [
    ((3, 1), (3, 4)), ((1,), (5,)), ((), (2, 3)), ((3, 1), (2, 3, 5)), ((3, 1), (-1, 4)), ((1, 3), (0, 3)),
    ((17, 1), (17, 1000)), ((3,), (3,)), ((1, 1), (1, 1)),
], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_expand_matches_torch(shape, new, dtype):
    check(lambda x: x.expand(new), None, [sample(shape, dtype)])


# ---- pad and shrink ----------------------------------------------------------------------------------------------


PAD_PAIRS = [((3, 4), ((1, 2), (0, 3)), 0.0), ((3, 4), ((0, 0), (2, 2)), -1.5), ((17,), ((1, 0),), 2.0),
             ((3, 0), ((0, 0), (1, 1)), 0.0), ((2, 3, 4), ((1, 1), (0, 0), (0, 2)), 7.0), ((1,), ((3, 3),), 0),
             ((0,), ((2, 1),), 4.0), ((3, 4), ((1, 0), (2, 1)), 7)]


@pytest.mark.parametrize("shape, pairs, value, dtype", [
    pytest.param(*case, dtype, id=f"{dtype}-{case}".replace(" ", ""))
    for case in PAD_PAIRS for dtype in ("float32", "int32")
])
def test_pad_with_pairs_matches_numpy(shape, pairs, value, dtype):
    check(lambda x: x.pad(pairs, value=value), lambda x: np.pad(x, pairs, constant_values=value),
          [arange(shape, dtype)], lib="numpy")


def test_pad_with_none_pairs_leaves_an_axis_alone():
    check(lambda x: x.pad((None, (1, 2))), lambda x: np.pad(x, ((0, 0), (1, 2))), [arange((3, 4))], lib="numpy")


@pytest.mark.parametrize("shape, flat, value", [
    ((3, 4), (1, 2), 0.0), ((3, 4), (1, 2, 3, 0), 0.0), ((2, 3, 4), (0, 1, 2, 0), 5.0), ((3, 4), (0, 0, -1, 1), 0.0),
    ((3, 4), (-1, -1), 0.0), ((3, 4), (-1, 2, 1, -2), -2.0), ((5,), (-2, 3), 9.0), ((3, 4), (0, 0), 0.0),
], ids=str)
def test_pad_in_torch_flat_form_including_negative_padding_matches_torch(shape, flat, value):
    check(lambda x: x.pad(flat, value=value), lambda x: F.pad(x, flat, value=value), [arange(shape)])


def test_pad_of_an_int_tensor_with_a_float_value_keeps_the_dtype_like_torch():
    check(lambda x: x.pad((1, 1), value=2.0), lambda x: F.pad(x, (1, 1), value=2.0), [arange((3,), "int32")])


def test_negative_pad_pairs_crop_like_torch():
    check(lambda x: x.pad(((-1, 2), (0, -2))), lambda x: F.pad(x, (0, -2, -1, 2)), [arange((3, 4))])


@pytest.mark.parametrize("shape, box", [
    ((3, 4), ((0, 2), (1, 3))), ((3, 17), (None, (2, 17))), ((3, 4), ((1, 1), (0, 4))), ((), ()),
    ((2, 3, 4), ((1, 2), None, (3, 4))), ((1000,), ((999, 1000),)),
], ids=str)
def test_shrink_matches_numpy_slices(shape, box):
    def ref(x):
        return x[tuple(slice(None) if b is None else slice(*b) for b in box)]
    check(lambda x: x.shrink(box), ref, [arange(shape)], lib="numpy")


# ---- flip, transpose and shape helpers ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape, axis", [
    ((17,), 0), ((3, 4), 0), ((3, 4), 1), ((3, 4), (0, 1)), ((2, 3, 4), -1), ((2, 1, 4), 1), ((2, 3, 4), (0, 2)),
    ((3, 0), 0),
], ids=str)
def test_flip_matches_numpy(shape, axis):
    check(lambda x: x.flip(axis), lambda x: np.flip(x, axis), [arange(shape)], lib="numpy")


@pytest.mark.parametrize("fn, shape", [
    ((lambda x: x.transpose(), lambda x: x.t()), (3, 4)), (same(lambda x: x.transpose(0, 2)), (2, 3, 4)),
    (same(lambda x: x.transpose(-1, -2)), (2, 3, 4)), (same(lambda x: x.transpose(1, 1)), (2, 3)),
    ((lambda x: x.T, lambda x: x.permute(*reversed(range(x.ndim)))), (2, 3, 4)), (same(lambda x: x.T), (3, 4)),
    ((lambda x: x.T, lambda x: x.permute(0)), (17,)), (same(lambda x: x.flatten()), (2, 3, 4)),
    (same(lambda x: x.flatten(1)), (2, 3, 4)), (same(lambda x: x.flatten(0, 1)), (2, 3, 4)),
    (same(lambda x: x.flatten()), ()), (same(lambda x: x.flatten()), (3, 0)),
    (same(lambda x: x.squeeze()), (1, 3, 1, 4)), (same(lambda x: x.squeeze(2)), (1, 3, 1, 4)),
    (same(lambda x: x.squeeze(1)), (1, 3, 1, 4)), (same(lambda x: x.squeeze(-1)), (3, 1)),
    (same(lambda x: x.squeeze()), ()),
    (same(lambda x: x.unsqueeze(0)), (3, 4)), (same(lambda x: x.unsqueeze(-1)), (3, 4)),
    (same(lambda x: x.unsqueeze(1)), (3, 4)), (same(lambda x: x.unsqueeze(0)), ()),
], ids=lambda v: str(v) if isinstance(v, tuple) and all(isinstance(s, int) for s in v) else None)
def test_transpose_flatten_squeeze_unsqueeze_match_torch(fn, shape):
    check(fn[0], fn[1], [arange(shape)])


# ---- basic indexing ----------------------------------------------------------------------------------------------

IDX = np.s_
INDEX_CASES = [
    ((17,), IDX[1:3]), ((17,), IDX[::2]), ((17,), IDX[::-1]), ((17,), IDX[-3:]), ((17,), IDX[15:1:-2]),
    ((17,), IDX[::-3]), ((17,), IDX[2:100]), ((17,), IDX[-100:4]), ((17,), IDX[5:2]), ((17,), IDX[::100]),
    ((17,), IDX[3]), ((17,), IDX[-1]), ((17,), IDX[None]), ((17,), IDX[...]), ((17,), IDX[None, 3:, None]),
    ((3, 4), IDX[1]), ((3, 4), IDX[:, 1]), ((3, 4), IDX[-1, ::-1]), ((3, 4), IDX[1, 2]), ((3, 4), IDX[..., 0]),
    ((3, 4), IDX[::-2, 1::2]), ((3, 4), IDX[None, ..., None]), ((3, 4), IDX[()]), ((3, 4), IDX[1:2, 3:1:-1]),
    ((4, 5, 6, 7), IDX[1:3, ::2, None, ..., -1]), ((4, 5, 6, 7), IDX[..., ::-2, 3]),
    ((4, 5, 6, 7), IDX[-1, None, 1:, ...]),
    ((4, 5, 6, 7), IDX[::3, ::-4, 1:5:2, ::-7]), ((4, 5, 6, 7), IDX[2, 3, 4, 5]),
    ((), IDX[None]), ((), IDX[...]), ((), IDX[()]), ((3, 0), IDX[1]), ((3, 0), IDX[::-1, ::2]), ((0,), IDX[1:]),
    ((1000,), IDX[7::13]), ((1000,), IDX[-1:-1000:-9]),
]


@pytest.mark.parametrize("shape, index", INDEX_CASES, ids=[f"{s}-{i}".replace(" ", "") for s, i in INDEX_CASES])
def test_basic_indexing_matches_numpy(shape, index):
    check(lambda x: x[index], None, [arange(shape)], lib="numpy")


def test_indexing_a_computed_tensor_then_computing_on_it():
    check(lambda x: (x * 2 + 1)[1:, None][..., ::-2] - 3, None, [arange((3, 5))], lib="numpy")


# ---- composed movement chains ------------------------------------------------------------------------------------

# (ember function, numpy function, input shape); each chain ends in a computation so a kernel reads the view.
CHAINS = [
    ("permute_reshape_slice_expand_sum",
     lambda x: x.permute(2, 0, 1).reshape(8, 3)[1:7:2].reshape(3, 1, 3).expand(3, 4, 3).sum(1),
     lambda x: np.broadcast_to(x.transpose(2, 0, 1).reshape(8, 3)[1:7:2].reshape(3, 1, 3), (3, 4, 3)).sum(1),
     (2, 3, 4)),
    ("flip_slice_transpose_flatten_step",
     lambda x: x[::-1, 1:].T.reshape(-1)[::3] + 1, lambda x: x[::-1, 1:].T.reshape(-1)[::3] + 1, (4, 5)),
    ("flip_pad_shrink_permute_sum",
     lambda x: x.flip(1).pad(((0, 0), (1, 2), (2, 0)), value=1).shrink(((1, 3), (2, 6), None))
                .permute(2, 0, 1).sum((0, 2)),
     lambda x: np.pad(x[:, ::-1], ((0, 0), (1, 2), (2, 0)), constant_values=1)[1:3, 2:6].transpose(2, 0, 1).sum((0, 2)),
     (3, 4, 5)),
    ("reshape_expand_permute_reshape_negstep",
     lambda x: x.reshape(2, 3).expand(4, 2, 3).permute(1, 2, 0).reshape(6, 4)[::-2],
     lambda x: np.broadcast_to(x.reshape(2, 3), (4, 2, 3)).transpose(1, 2, 0).reshape(6, 4)[::-2], (6,)),
    ("expand_then_reshape", lambda x: x.expand(3, 4).reshape(2, 6) * 3,
     lambda x: np.broadcast_to(x, (3, 4)).reshape(2, 6) * 3, (3, 1)),
    ("pad_reshape_step", lambda x: x.pad(((1, 1), (0, 2))).reshape(-1)[::7],
     lambda x: np.pad(x, ((1, 1), (0, 2))).reshape(-1)[::7], (3, 4)),
    ("same_input_through_two_views", lambda x: x + x.T - x.flip(0) * x[:, ::-1],
     lambda x: x + x.T - x[::-1] * x[:, ::-1], (5, 5)),
    ("index_newaxis_matmul", lambda x: x[..., None, ::-1][1].reshape(3, 4).T @ x[0],
     lambda x: x[..., None, ::-1][1].reshape(3, 4).T @ x[0], (2, 3, 4)),
    ("squeeze_unsqueeze_transpose_max", lambda x: x.unsqueeze(1).transpose(0, 2).squeeze(1).max(axis=0),
     lambda x: x[:, None].transpose(2, 1, 0).squeeze(1).max(axis=0), (4, 6)),
    ("zero_size_chain", lambda x: x.permute(1, 0)[:, 1:].reshape(0, 2).expand(0, 2).sum(0),
     lambda x: x.transpose(1, 0)[:, 1:].reshape(0, 2).sum(0), (3, 0)),
]


@pytest.mark.parametrize("name, fn, ref, shape", CHAINS, ids=[c[0] for c in CHAINS])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_movement_chains_match_numpy(name, fn, ref, shape, dtype):
    check(fn, ref, [arange(shape, dtype) - 7], lib="numpy", **REDUCE_TOL)


def test_movement_views_share_one_realized_input():
    from ember import Tensor
    x = Tensor(arange((3, 4))).realize()
    a, b = x.T.contiguous(), x[::-1].contiguous()
    a.realize(b)
    np.testing.assert_array_equal(a.numpy(), arange((3, 4)).T)
    np.testing.assert_array_equal(b.numpy(), arange((3, 4))[::-1])
    assert torch.equal(torch.from_numpy(x.numpy()), torch.from_numpy(arange((3, 4))))


def test_flip_of_a_permuted_view_read_again_through_a_reshape():
    # regression: the index of (8 - 2j + l) // 2 lost its j term (symbolic fold_divmod) and read the wrong elements
    a = np.arange(100.0)
    got = Tensor(a).reshape(5, 10, 2).permute(1, 0, 2).reshape(10, 10).reshape(10, 5, 2).flip(1).reshape(100)
    np.testing.assert_array_equal(got.numpy(), a.reshape(5, 10, 2).transpose(1, 0, 2)[:, ::-1].reshape(100))


# ---- unflatten, unfold, meshgrid against torch ---------------------------------------------------------------------


@pytest.mark.parametrize("shape, dim, sizes", [
    ((3, 4, 1), 1, (2, 2)), ((3, 4, 1), 1, (-1, 2)), ((5, 12, 3), -2, (2, 2, 3, 1, 1)), ((6,), 0, (6,)),
    ((2, 0), 1, (2, -1)), ((4, 6), -1, (3, 1, 2)),
])
def test_unflatten_matches_torch(shape, dim, sizes):
    check(lambda x: x.unflatten(dim, sizes), None, [sample(shape, "float32")])


@pytest.mark.parametrize("shape, dim, sizes, match", [
    ((3, 4), 1, (3, 2), r"unflatten: sizes \(3, 2\) do not multiply to 4, the size of axis 1 of \(3, 4\)"),
    ((3, 4), 1, (-1, 3), r"sizes \(-1, 3\) do not multiply to 4"),
    ((3, 4), 1, (-1, -1), "at most one -1"),
    ((3, 4), 1, (), "non-empty"),
    ((3, 4), 2, (2, 2), "unflatten: axis 2 is out of range"),
    ((), 0, (1,), "unflatten: a 0-d tensor has no axis"),
])
def test_unflatten_rejects_sizes_that_do_not_fit(shape, dim, sizes, match):
    with pytest.raises(ShapeError, match=match): Tensor.zeros(*shape).unflatten(dim, sizes)


def torch_unfold(dim: int, size: int, step: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch's unfold: `dim` becomes the window count, the window axis goes last."""
    return lambda x: x.unfold(dim, size, step)


UNFOLD_CASES = [((8,), 0, 2, 2), ((8,), 0, 3, 1), ((3, 3, 3), -1, 2, 3), ((2, 12), 1, 3, 2), ((2, 12), 1, 12, 1),
                ((5, 4), 0, 2, 3), ((2, 3, 4), 1, 1, 1), ((2, 7), 1, 0, 2)]


@pytest.mark.parametrize("shape, dim, size, step", UNFOLD_CASES)
def test_unfold_matches_torch_with_the_window_axis_last(shape, dim, size, step):
    out = check(lambda x: x.unfold(dim, size, step), torch_unfold(dim, size, step), [sample(shape, "int32")])
    d = dim % len(shape)
    assert out.shape == shape[:d] + ((shape[d] - size) // step + 1,) + shape[d + 1:] + (size,)


def test_unfold_gradient_matches_torch():
    match_torch_gradient(lambda x: x.unfold(1, 3, 2), torch_unfold(1, 3, 2), sample((2, 9, 3), "float64"))


@pytest.mark.parametrize("shape, dim, size, step, match", [
    ((8,), 0, 9, 1, r"unfold: size 9 is larger than axis 0 of \(8,\) \(8\)"),
    ((8,), 0, 2, 0, "unfold: size must be >= 0 and step > 0, got size=2, step=0"),
    ((8,), 0, -1, 1, "size=-1"),
    ((8,), 1, 2, 1, "unfold: axis 1 is out of range"),
    ((), 0, 1, 1, "unfold: a 0-d tensor has no axis"),
])
def test_unfold_rejects_bad_windows(shape, dim, size, step, match):
    with pytest.raises(ShapeError, match=match): Tensor.zeros(*shape).unfold(dim, size, step)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("shapes", [[(3,), (2,)], [(3,), (2,), (4,)], [(3,)], [(), (2,)], [(0,), (2,)]])
def test_meshgrid_matches_torch(shapes, indexing):
    arrays = [sample(s, "int32", seed=i) for i, s in enumerate(shapes)]
    got = Tensor(arrays[0]).meshgrid(*(Tensor(a) for a in arrays[1:]), indexing=indexing)
    want = torch.meshgrid(*(torch.from_numpy(a) for a in arrays), indexing=indexing)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape) and g.dtype.name == "int32"
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_meshgrid_rejects_bad_indexing_and_2d_tensors():
    with pytest.raises(ValueError, match="meshgrid: indexing must be 'ij' or 'xy', got 'ji'"):
        Tensor([1]).meshgrid(Tensor([2]), indexing="ji")
    with pytest.raises(ShapeError, match=r"meshgrid: tensors must be 0-d or 1-d, got \(2, 2\) at position 1"):
        Tensor([1]).meshgrid(Tensor.zeros(2, 2))
