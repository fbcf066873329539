"""Module conveniences against torch.nn.Module: parameters and buffers, train()/eval() over submodules, Sequential,
module-style activations and pools; BatchNorm and Dropout following their module's flag; optimizers given
model.parameters() training a model as torch's do."""

import numpy as np
import pytest
import torch

from ember import Tensor
from ember.nn import (
    GELU,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    Identity,
    Linear,
    MaxPool2d,
    Module,
    ReLU,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from ember.nn.optim import SGD, Adam, AdamW
from ember.nn.state import get_state_dict
from tests.test_nn import TOL, check_module, copy_weights, data


def small_convnet() -> tuple[Sequential, torch.nn.Sequential]:
    """No conv bias: BatchNorm cancels it, so its gradient is rounding noise that Adam would scale up to lr."""
    ours = Sequential(Conv2d(2, 4, 3, padding=1, bias=False), BatchNorm2d(4), ReLU(), MaxPool2d(2), Flatten(),
                      Linear(36, 5), Tanh())
    theirs = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4),
                                 torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(36, 5),
                                 torch.nn.Tanh())
    return ours, theirs


# ---- stateless modules ---------------------------------------------------------------------------------------------

STATELESS = [(ReLU(), torch.nn.ReLU(), (3, 4)), (ReLU(inplace=True), torch.nn.ReLU(), (5,)),
             (GELU(), torch.nn.GELU(), (3, 4)), (GELU("tanh"), torch.nn.GELU("tanh"), (2, 3, 2)),
             (Sigmoid(), torch.nn.Sigmoid(), (4, 3)), (Tanh(), torch.nn.Tanh(), (4, 3)),
             (SiLU(), torch.nn.SiLU(), (6,)), (Softmax(1), torch.nn.Softmax(1), (3, 4, 2)),
             (Softmax(dim=-1), torch.nn.Softmax(-1), (3, 5)), (Flatten(), torch.nn.Flatten(), (2, 3, 4, 2)),
             (Flatten(0, 1), torch.nn.Flatten(0, 1), (2, 3, 4)), (Flatten(2), torch.nn.Flatten(2), (2, 3, 4, 5)),
             (Identity(3, bias=False), torch.nn.Identity(3, bias=False), (2, 2)),
             (MaxPool2d(2), torch.nn.MaxPool2d(2), (2, 3, 6, 6)),
             (MaxPool2d((3, 2), stride=(2, 1), padding=1, dilation=(1, 2), ceil_mode=True),
              torch.nn.MaxPool2d((3, 2), stride=(2, 1), padding=1, dilation=(1, 2), ceil_mode=True), (1, 2, 7, 8)),
             (AvgPool2d(2), torch.nn.AvgPool2d(2), (2, 3, 6, 5)),
             (AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
              torch.nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), (1, 2, 8, 7))]


@pytest.mark.parametrize("ours, theirs, shape", STATELESS, ids=lambda v: type(v).__name__ if not
                         isinstance(v, tuple) else str(v))
def test_stateless_modules_match_torch(ours, theirs, shape):
    check_module(ours, theirs, data(*shape))


def test_max_pool_module_returns_indices_as_torch():
    x = data(2, 3, 6, 4)
    (values, idx), (want, want_idx) = MaxPool2d(2, return_indices=True)(Tensor(x)), torch.nn.MaxPool2d(
        2, return_indices=True)(torch.from_numpy(x))
    np.testing.assert_array_equal(values.numpy(), want.numpy())
    np.testing.assert_array_equal(idx.numpy(), want_idx.numpy())


def test_stateless_modules_check_arguments():
    with pytest.raises(ValueError, match="GELU: approximate must be 'none' or 'tanh', got 'fast'"):
        GELU("fast")


# ---- Sequential --------------------------------------------------------------------------------------------------

def test_sequential_matches_torch_in_training_then_in_eval():
    """Both start in training mode: BatchNorm uses batch statistics and updates its running ones."""
    ours, theirs = small_convnet()
    assert list(get_state_dict(ours)) == list(theirs.state_dict())
    check_module(ours, theirs, data(3, 2, 6, 6))
    bn = ours[1]
    np.testing.assert_allclose(bn.running_mean.numpy(), theirs[1].running_mean.numpy(), **TOL)
    np.testing.assert_allclose(bn.running_var.numpy(), theirs[1].running_var.numpy(), **TOL)
    theirs.zero_grad()
    for p in ours.parameters(): p.grad = None
    check_module(ours.eval(), theirs.eval(), data(3, 2, 6, 6, seed=5))


def test_sequential_indexes_slices_iterates_and_has_a_length():
    layers = [Linear(3, 4), ReLU(), Linear(4, 2)]
    model = Sequential(*layers)
    assert len(model) == 3 and list(model) == layers and model[0] is layers[0] and model[-1] is layers[2]
    head = model[1:]
    assert isinstance(head, Sequential) and list(head) == layers[1:]
    assert [name for name, _ in head.named_parameters()] == ["1.weight", "1.bias"]
    x = Tensor(data(5, 3))
    np.testing.assert_allclose(model(x).numpy(), head(layers[0](x)).numpy(), **TOL)
    assert len(Sequential()) == 0 and Sequential()(x) is x


# ---- parameters, buffers, train and eval -------------------------------------------------------------------------

class Block(Module):
    """Submodules in every kind of place: an attribute, a list, a tuple, a dict and a plain object."""

    def __init__(self) -> None:
        self.first = Linear(2, 3)
        self.layers = [BatchNorm1d(3), Dropout(0.2)]
        self.pair = (Linear(3, 3), self.first)  # shared: listed once
        self.table = {"head": Linear(3, 1, bias=False)}
        self.holder = type("Holder", (), {})()
        self.holder.norm = BatchNorm1d(1)


class TorchBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(2, 3)
        self.layers = torch.nn.ModuleList([torch.nn.BatchNorm1d(3), torch.nn.Dropout(0.2)])
        self.pair = torch.nn.ModuleList([torch.nn.Linear(3, 3), self.first])
        self.table = torch.nn.ModuleDict({"head": torch.nn.Linear(3, 1, bias=False)})
        self.holder = torch.nn.Module()
        self.holder.norm = torch.nn.BatchNorm1d(1)


def test_parameters_and_buffers_are_torch_s_in_definition_order_each_once():
    ours, theirs = Block(), TorchBlock()
    assert [name for name, _ in ours.named_parameters()] == [name for name, _ in theirs.named_parameters()]
    assert [name for name, _ in ours.named_buffers()] == [name for name, _ in theirs.named_buffers()]
    assert [id(p) for p in ours.parameters()] == [id(p) for _, p in ours.named_parameters()]
    assert [id(b) for b in ours.buffers()] == [id(ours.layers[0].running_mean), id(ours.layers[0].running_var),
                                                id(ours.layers[0].num_batches_tracked),
                                                id(ours.holder.norm.running_mean), id(ours.holder.norm.running_var),
                                                id(ours.holder.norm.num_batches_tracked)]
    assert not {id(b) for b in ours.buffers()} & {id(p) for p in ours.parameters()}


def test_train_and_eval_reach_every_submodule_and_return_the_module():
    ours, theirs = Block(), TorchBlock()
    modules = [ours, ours.first, *ours.layers, ours.pair[0], ours.table["head"], ours.holder.norm]
    assert all(m.training for m in modules) and all(m.training for m in theirs.modules())
    assert ours.eval() is ours and not any(m.training for m in modules)
    assert ours.layers[0].train() is ours.layers[0] and ours.layers[0].training and not ours.layers[1].training
    assert ours.train() is ours and all(m.training for m in modules)
    ours.train(False)
    assert not any(m.training for m in modules)


def test_modules_survive_cycles():
    parent = Sequential(Linear(2, 2))
    parent[0].owner = parent
    assert parent.eval() is parent and not parent[0].training
    assert [name for name, _ in parent.named_parameters()] == ["0.weight", "0.bias"]


# ---- BatchNorm and Dropout follow their module ---------------------------------------------------------------------

def test_batchnorm_trains_by_default_and_normalizes_with_running_statistics_after_eval():
    """No Tensor.train() anywhere, as in a torch script."""
    ours, theirs = BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    x = data(6, 3) * 3 + 1
    check_module(ours, theirs, x)
    Tensor.realize(*ours.buffers())
    np.testing.assert_allclose(ours.running_mean.numpy(), theirs.running_mean.numpy(), **TOL)
    theirs.zero_grad()
    for p in ours.parameters(): p.grad = None
    check_module(ours.eval(), theirs.eval(), x)


def test_tensor_train_context_puts_evaluated_modules_in_training():
    norm = BatchNorm1d(3).eval()
    x = data(6, 3) * 3 + 1
    with Tensor.train():
        out = norm(Tensor(x)).numpy()
    np.testing.assert_allclose(out, torch.nn.BatchNorm1d(3).train()(torch.from_numpy(x)).detach().numpy(), **TOL)
    Tensor.realize(*norm.buffers())
    assert norm.num_batches_tracked.item() == 1


def test_dropout_module_drops_while_its_module_trains():
    x = Tensor(np.full((100, 100), 2.0, np.float32))
    layer = Dropout(0.5)
    kept = layer(x).numpy() != 0
    assert abs(kept.mean() - 0.5) < 0.03
    np.testing.assert_array_equal(layer.eval()(x).numpy(), x.numpy())
    np.testing.assert_array_equal(x.dropout(0.5).numpy(), x.numpy())  # the functional op follows Tensor.training


# ---- optimizers given model.parameters() -------------------------------------------------------------------------

@pytest.mark.parametrize("ours, theirs, kwargs", [(SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
                                                  (Adam, torch.optim.Adam, dict(lr=0.01)),
                                                  (AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1))])
def test_optimizers_train_a_model_from_its_parameters_as_torch(ours, theirs, kwargs):
    """The running statistics, not given to the optimizer, are realized with its step all the same."""
    model, torch_model = small_convnet()
    copy_weights(model, torch_model)
    opt, torch_opt = ours(model.parameters(), **kwargs), theirs(torch_model.parameters(), foreach=False, **kwargs)
    assert len(opt.params) == len(list(torch_model.parameters())) and not opt.buffers
    for step in range(3):
        x = data(4, 2, 6, 6, seed=step)
        target = data(4, 5, seed=10 + step)
        opt.zero_grad()
        loss = (model(Tensor(x)) - Tensor(target)).square().mean()
        loss.backward()
        opt.step(loss)
        torch_opt.zero_grad()
        torch_loss = (torch_model(torch.from_numpy(x)) - torch.from_numpy(target)).square().mean()
        torch_loss.backward()
        torch_opt.step()
        assert all(b.values_known() for b in model.buffers())
        np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-5)
    want = torch_model.state_dict()
    for name, t in get_state_dict(model).items():
        np.testing.assert_allclose(t.numpy(), want[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
