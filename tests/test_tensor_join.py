"""cat, stack, split, chunk, repeat, roll, tril, triu, one_hot and linspace against torch."""

import numpy as np
import pytest
import torch

from ember import Tensor
from ember.errors import ShapeError

RNG = np.random.default_rng(5)
A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((2, 4)).astype(np.float32)
C = RNG.standard_normal((3, 5)).astype(np.float32)


@pytest.mark.parametrize("parts, dim", [((A, B), 0), ((A, C), 1), ((A, B, A), 0), ((A, C, A), -1), ((A,), 0),
                                        ((A, A[:0]), 0)])
def test_cat_matches_torch_values_and_gradients(parts, dim):
    ours = [Tensor(p) for p in parts]
    theirs = [torch.tensor(p, requires_grad=True) for p in parts]
    out, expected = ours[0].cat(*ours[1:], dim=dim), torch.cat(theirs, dim=dim)
    np.testing.assert_array_equal(out.numpy(), expected.detach().numpy())
    weights = np.arange(expected.numel(), dtype=np.float32).reshape(tuple(expected.shape))
    (expected * torch.tensor(weights)).sum().backward()
    grads = (out * Tensor(weights)).sum().gradient(*ours)
    for g, t in zip(grads, theirs, strict=True): np.testing.assert_array_equal(g.numpy(), t.grad.numpy())


def test_cat_keeps_negative_zero_and_promotes_dtypes():
    out = Tensor(np.array([-0.0], np.float32)).cat(Tensor([1, 2]))
    assert out.dtype.name == "float32" and np.signbit(out.numpy()[0])
    np.testing.assert_array_equal(out.numpy(), [-0.0, 1.0, 2.0])


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack_matches_torch(dim):
    out = Tensor(A).stack(Tensor(A * 2), Tensor(A - 1), dim=dim)
    expected = torch.stack([torch.tensor(A), torch.tensor(A * 2), torch.tensor(A - 1)], dim=dim)
    np.testing.assert_array_equal(out.numpy(), expected.numpy())


@pytest.mark.parametrize("sizes, dim", [(2, 1), (3, 0), ([1, 3], 1), ([0, 4, 0], 1), (10, 0)])
def test_split_matches_torch(sizes, dim):
    ours, theirs = Tensor(A).split(sizes, dim), torch.tensor(A).split(sizes, dim)
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs, strict=True): np.testing.assert_array_equal(o.numpy(), t.numpy())


@pytest.mark.parametrize("chunks, dim", [(2, 1), (3, 0), (4, 1), (5, 0)])
def test_chunk_matches_torch(chunks, dim):
    ours, theirs = Tensor(A).chunk(chunks, dim), torch.tensor(A).chunk(chunks, dim)
    assert [o.shape for o in ours] == [tuple(t.shape) for t in theirs]
    for o, t in zip(ours, theirs, strict=True): np.testing.assert_array_equal(o.numpy(), t.numpy())


@pytest.mark.parametrize("reps", [(2, 1), (1, 3), (2, 2, 3), (1, 1)])
def test_repeat_matches_torch(reps):
    np.testing.assert_array_equal(Tensor(A).repeat(*reps).numpy(), torch.tensor(A).repeat(*reps).numpy())


@pytest.mark.parametrize("shifts, dims", [(1, 0), (-1, 1), (5, 1), ((1, 2), (0, 1)), (0, 1)])
def test_roll_matches_torch(shifts, dims):
    np.testing.assert_array_equal(Tensor(A).roll(shifts, dims).numpy(), torch.tensor(A).roll(shifts, dims).numpy())


@pytest.mark.parametrize("diagonal", [-2, -1, 0, 1, 3])
def test_tril_triu_match_torch(diagonal):
    x = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(Tensor(x).tril(diagonal).numpy(), torch.tensor(x).tril(diagonal).numpy())
    np.testing.assert_array_equal(Tensor(x).triu(diagonal).numpy(), torch.tensor(x).triu(diagonal).numpy())


def test_one_hot_matches_torch():
    labels = np.array([[0, 3], [2, 1]], np.int64)
    expected = torch.nn.functional.one_hot(torch.tensor(labels))
    got = Tensor(labels.astype(np.int32)).one_hot()
    assert got.dtype.name == "int64"
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    np.testing.assert_array_equal(Tensor([1]).one_hot(5).numpy(), [[0, 1, 0, 0, 0]])


@pytest.mark.parametrize("start, end, steps", [(0, 1, 11), (-1, 2.5, 8), (5, -5, 7), (0, 1, 1), (0, 1, 0),
                                                (0, 1, 1001)])
def test_linspace_matches_torch_to_an_ulp(start, end, steps):
    got, expected = Tensor.linspace(start, end, steps).numpy(), torch.linspace(start, end, steps).numpy()
    assert got.shape == expected.shape
    if steps > 1: assert got[0] == start and got[-1] == np.float32(end)
    np.testing.assert_allclose(got, expected, rtol=0, atol=np.spacing(np.float32(max(abs(start), abs(end)))))


def test_join_and_split_errors_name_the_problem():
    with pytest.raises(ShapeError, match=r"cat: shapes \(3, 4\) and \(3, 5\) differ outside axis 0"):
        Tensor(A).cat(Tensor(C))
    with pytest.raises(ShapeError, match=r"split: sizes \[1, 1\] add up to 2, not 4"):
        Tensor(A).split([1, 1], 1)
    with pytest.raises(ShapeError, match="tril: needs at least 2 axes"):
        Tensor([1.0]).tril()
    with pytest.raises(ShapeError, match="one_hot: needs an integer tensor, got float32"):
        Tensor(A).one_hot(3)
