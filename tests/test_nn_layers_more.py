"""ConvTranspose1d, InstanceNorm1d/2d, LSTMCell and max_unpool2d against torch (forward, input and parameter
gradients), and the errors of convolutions and pools with impossible arguments."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import Tensor
from ember.errors import ShapeError
from ember.nn import Conv2d as EmberConv2d
from ember.nn import ConvTranspose1d, ConvTranspose2d, InstanceNorm1d, InstanceNorm2d, LSTMCell, MaxUnpool2d
from ember.nn.state import get_state_dict
from tests.test_nn import TOL, check_module, copy_weights, data

# ---- ConvTranspose1d ---------------------------------------------------------------------------------------------

CONV_TRANSPOSE1D = [((3, 4, 3), {}, (2, 3, 7)),
                    ((4, 6, 2), dict(stride=2, padding=1, output_padding=1, groups=2), (2, 4, 5)),
                    ((2, 3, 4), dict(stride=3, dilation=2, output_padding=2, bias=False), (1, 2, 4)),
                    ((3, 2, 1), dict(stride=1), (3, 6))]  # unbatched (C, L)


@pytest.mark.parametrize("args, kwargs, shape", CONV_TRANSPOSE1D)
def test_conv_transpose1d(args, kwargs, shape):
    check_module(ConvTranspose1d(*args, **kwargs), torch.nn.ConvTranspose1d(*args, **kwargs), data(*shape))


def test_conv_transpose_takes_torch_argument_order():
    """torch's order is (..., output_padding, groups, bias, dilation): positional arguments mean the same."""
    ours = ConvTranspose2d(4, 6, 3, 2, 1, 1, 2, False, 2)
    assert (ours.output_padding, ours.groups, ours.bias, ours.dilation) == ((1, 1), 2, None, (2, 2))


# ---- InstanceNorm ------------------------------------------------------------------------------------------------

INSTANCE_NORM = [(InstanceNorm1d, torch.nn.InstanceNorm1d, (3, 4, 6)),
                 (InstanceNorm1d, torch.nn.InstanceNorm1d, (4, 5)),
                 (InstanceNorm2d, torch.nn.InstanceNorm2d, (2, 4, 3, 5)),
                 (InstanceNorm2d, torch.nn.InstanceNorm2d, (4, 3, 3))]
INSTANCE_KWARGS = [{}, dict(affine=True), dict(eps=1e-3, affine=True), dict(track_running_stats=True),
                   dict(affine=True, track_running_stats=True, momentum=0.3)]


@pytest.mark.parametrize("cls, torch_cls, shape", INSTANCE_NORM)
@pytest.mark.parametrize("kwargs", INSTANCE_KWARGS)
def test_instance_norm_trains_and_tracks_running_statistics(cls, torch_cls, shape, kwargs):
    ours, theirs = cls(4, **kwargs), torch_cls(4, **kwargs)
    assert list(get_state_dict(ours)) == list(theirs.state_dict())
    for step in range(2):
        theirs.zero_grad()
        for p in ours.parameters(): p.grad = None
        check_module(ours, theirs.train(), data(*shape, seed=step) * (step + 1) + step, seed=step)
        if ours.track_running_stats:
            Tensor.realize(ours.running_mean, ours.running_var)
            np.testing.assert_allclose(ours.running_mean.numpy(), theirs.running_mean.numpy(), **TOL)
            np.testing.assert_allclose(ours.running_var.numpy(), theirs.running_var.numpy(), **TOL)
    theirs.zero_grad()
    for p in ours.parameters(): p.grad = None
    check_module(ours.eval(), theirs.eval(), data(*shape, seed=9) * 2 + 1)


def test_instance_norm_momentum_none_leaves_running_statistics_as_torch():
    ours, theirs = InstanceNorm1d(3, momentum=None, track_running_stats=True), torch.nn.InstanceNorm1d(
        3, momentum=None, track_running_stats=True)
    x = data(2, 3, 5) + 1
    ours(Tensor(x)).realize()
    theirs(torch.from_numpy(x))
    np.testing.assert_allclose(ours.running_mean.numpy(), theirs.running_mean.numpy())


def test_instance_norm_checks_the_input():
    with pytest.raises(ShapeError, match=r"InstanceNorm2d: expected a 3-d unbatched or 4-d batched input"):
        InstanceNorm2d(3)(Tensor.ones(2, 3))
    with pytest.raises(ShapeError, match=r"InstanceNorm1d: expected input of shape \(N, 4, ...\), got \(2, 3, 5\)"):
        InstanceNorm1d(4, affine=True)(Tensor.ones(2, 3, 5))


# ---- LSTMCell ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("input_size, hidden_size, bias, batch",
                         [(3, 5, True, 4), (6, 2, False, 1), (4, 3, True, None)])
@pytest.mark.parametrize("with_state", [False, True])
def test_lstm_cell_matches_torch_over_steps(input_size, hidden_size, bias, batch, with_state):
    """Three steps fed back into the cell; gradients of a loss on every step's h and c for the inputs, the initial
    state and the four weights."""
    ours, theirs = LSTMCell(input_size, hidden_size, bias), torch.nn.LSTMCell(input_size, hidden_size, bias)
    copy_weights(ours, theirs)
    for p in ours.parameters(): p.requires_grad_()
    lead = () if batch is None else (batch,)
    xs = [data(*lead, input_size, seed=s) for s in range(3)]
    h0, c0 = data(*lead, hidden_size, seed=7), data(*lead, hidden_size, seed=8)
    ex = [Tensor(x, requires_grad=True) for x in xs]
    tx = [torch.tensor(x, requires_grad=True) for x in xs]
    e_state = (Tensor(h0, requires_grad=True), Tensor(c0, requires_grad=True)) if with_state else None
    t_state = (torch.tensor(h0, requires_grad=True), torch.tensor(c0, requires_grad=True)) if with_state else None
    e_hx, t_hx, e_loss, t_loss = e_state, t_state, 0, 0
    for step, (x, y) in enumerate(zip(ex, tx)):
        e_hx, t_hx = ours(x, e_hx), theirs(y, t_hx)
        for e_out, t_out in zip(e_hx, t_hx):
            np.testing.assert_allclose(e_out.numpy(), t_out.detach().numpy(), **TOL)
        w = data(*t_hx[0].shape, seed=20 + step)
        e_loss = e_loss + (e_hx[0] * Tensor(w)).sum() + e_hx[1].square().sum()
        t_loss = t_loss + (t_hx[0] * torch.from_numpy(w)).sum() + t_hx[1].square().sum()
    e_loss.backward()
    t_loss.backward()
    for x, y in zip(ex, tx): np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), **TOL)
    if with_state:
        for e, t in zip(e_state, t_state): np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), **TOL)
    torch_params = dict(theirs.named_parameters())
    assert [name for name, _ in ours.named_parameters()] == list(torch_params)
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), torch_params[name].grad.numpy(), **TOL, err_msg=name)


def test_lstm_cell_checks_shapes():
    with pytest.raises(ShapeError, match=r"LSTMCell: input must be \(batch, 3\) or \(3,\), got \(2, 4\)"):
        LSTMCell(3, 5)(Tensor.ones(2, 4))
    with pytest.raises(ShapeError, match=r"hidden state \(h, c\) must both be \(2, 5\)"):
        LSTMCell(3, 5)(Tensor.ones(2, 3), (Tensor.ones(2, 5), Tensor.ones(1, 5)))


# ---- max_unpool2d ------------------------------------------------------------------------------------------------

# (input shape, kernel_size, stride, padding, output_size): the first two have non-overlapping windows
UNPOOL = [((2, 3, 8, 6), 2, None, 0, None), ((1, 2, 9, 9), 3, 3, 0, None), ((2, 3, 7, 9), 3, 2, 1, None),
          ((3, 5, 5), (2, 3), (1, 2), 0, None), ((1, 2, 7, 7), 2, 2, 0, (7, 7)), ((2, 1, 6, 5), 2, 1, 1, None)]


@pytest.mark.parametrize("shape, kernel, stride, padding, output_size", UNPOOL)
def test_max_unpool2d_inverts_max_pool2d_as_torch(shape, kernel, stride, padding, output_size):
    """Indices from both libraries' max_pool2d agree; unpooling other values with them gives torch's output, and
    the gradient reaches each value that the output kept (torch's also reaches values overwritten by a later
    window that picked the same element)."""
    x = data(*shape)
    t_values, t_idx = F.max_pool2d(torch.from_numpy(x), kernel, stride, padding, return_indices=True)
    e_values, e_idx = Tensor(x).max_pool2d(kernel, stride, 1, padding, return_indices=True)
    np.testing.assert_array_equal(e_idx.numpy(), t_idx.numpy())
    np.testing.assert_array_equal(e_values.numpy(), t_values.numpy())
    v = data(*t_values.shape, seed=3)
    ev, tv = Tensor(v, requires_grad=True), torch.tensor(v, requires_grad=True)
    out = ev.max_unpool2d(e_idx, kernel, stride, padding=padding, output_size=output_size)
    want = F.max_unpool2d(tv, t_idx, kernel, stride, padding, output_size)
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    w = data(*want.shape, seed=4)
    (out * Tensor(w)).sum().backward()
    (want * torch.from_numpy(w)).sum().backward()
    idx = t_idx.numpy().reshape(-1, t_idx.shape[-2] * t_idx.shape[-1])
    kept = np.zeros(idx.shape, bool)  # the last position in row-major order to write each output element
    for row, positions in enumerate(idx):
        _, last = np.unique(positions[::-1], return_index=True)
        kept[row, len(positions) - 1 - last] = True
    kept = kept.reshape(v.shape)
    np.testing.assert_allclose(ev.grad.numpy(), np.where(kept, tv.grad.numpy(), 0), **TOL)


def test_max_unpool2d_module_and_errors():
    x = data(1, 2, 4, 4)
    values, idx = Tensor(x).max_pool2d(2, return_indices=True)
    want = torch.nn.MaxUnpool2d(2)(*F.max_pool2d(torch.from_numpy(x), 2, return_indices=True))
    np.testing.assert_array_equal(MaxUnpool2d(2)(values, idx).numpy(), want.numpy())
    with pytest.raises(ValueError, match=r"max_unpool: output_size \(9, 9\) is not within stride \(2, 2\) of the "
                                         r"default \(4, 4\)"):
        values.max_unpool2d(idx, output_size=(9, 9))
    with pytest.raises(IndexError, match="max_unpool: index 16 is outside the output's 16 positions"):
        values.max_unpool2d(Tensor([[[[0, 1], [2, 16]]] * 2]))
    with pytest.raises(ShapeError, match="max_unpool: input .* and indices .* must have one shape"):
        values.max_unpool2d(idx[0])


# ---- errors of convolutions and pools ------------------------------------------------------------------------------

def test_conv2d_same_padding_with_stride_raises_as_torch():
    with pytest.raises(ValueError, match="padding='same' is not supported for strided convolutions"):
        torch.nn.Conv2d(3, 4, 3, padding="same", stride=2)
    with pytest.raises(ValueError, match=r"Conv2d: padding='same' is not supported for strided convolutions"):
        EmberConv2d(3, 4, 3, padding="same", stride=2)
    with pytest.raises(ValueError, match=r"conv: padding='same' is not supported for strided convolutions"):
        Tensor.ones(1, 3, 5, 5).conv2d(Tensor.ones(4, 3, 3, 3), padding="same", stride=(1, 2))


@pytest.mark.parametrize("call, message", [
    (lambda x: x.conv2d(Tensor.ones(2, 1, 2, 2), stride=0), r"conv: stride must be positive on every axis, got 0"),
    (lambda x: x.conv2d(Tensor.ones(2, 1, 2, 2), dilation=(1, 0)), r"conv: dilation must be positive"),
    (lambda x: x.conv_transpose2d(Tensor.ones(1, 2, 2, 2), stride=0), r"conv_transpose: stride must be positive"),
    (lambda x: x.avg_pool2d(0), r"avg_pool: kernel_size must be positive on every axis, got \(0, 0\)"),
    (lambda x: x.max_pool2d(0), r"max_pool: kernel_size must be positive on every axis, got \(0, 0\)"),
    (lambda x: x.max_pool2d(2, stride=0), r"max_pool: stride must be positive on every axis, got 0"),
    (lambda x: x.avg_pool2d((2, 2), stride=(1, 0)), r"avg_pool: stride must be positive"),
])
def test_zero_strides_and_kernels_raise_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(Tensor.ones(1, 1, 4, 6))


def test_conv2d_names_the_bias_shape():
    with pytest.raises(ShapeError, match=r"conv: bias has shape \(3,\), expected \(2,\): one value per output "
                                         r"channel of weight \(2, 1, 2, 2\)"):
        Tensor.ones(1, 1, 4, 6).conv2d(Tensor.ones(2, 1, 2, 2), bias=Tensor.ones(3))
