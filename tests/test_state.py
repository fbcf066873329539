"""State dicts: names as torch's, loading and its errors, and a round trip through a safetensors file."""

import numpy as np
import pytest
import torch

from ember import Tensor, dtypes
from ember.errors import ShapeError
from ember.nn import BatchNorm, Linear
from ember.nn.state import (
    StateDictError,
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_save,
)


class Net:
    """ember's twin of TorchNet: a list of layers and a named head."""

    def __init__(self) -> None:
        self.layers = [Linear(4, 8), BatchNorm(8), Linear(8, 8, bias=False)]
        self.head = Linear(8, 3)

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers: x = layer(x).relu() if isinstance(layer, Linear) else layer(x)
        return self.head(x)


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                           torch.nn.Linear(8, 8, bias=False)])
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers: x = layer(x).relu() if isinstance(layer, torch.nn.Linear) else layer(x)
        return self.head(x)


def torch_to_ember(sd: dict) -> dict:
    return {k: Tensor(v.detach().numpy()) for k, v in sd.items()}


# ---- state dicts ---------------------------------------------------------------------------------------------------

def test_state_dict_names_match_torch():
    assert list(get_state_dict(Net())) == list(TorchNet().state_dict())


def test_state_dict_walks_lists_tuples_dicts_and_attributes_and_skips_none():
    a, b, c = Tensor([1.0]), Tensor([2.0]), Tensor([3.0])

    class Holder:
        def __init__(self) -> None: self.pair, self.table, self.nothing, self.name = (a, [b]), {"c": c}, None, "x"

    assert get_state_dict(Holder(), prefix="model") == {"model.pair.0": a, "model.pair.1.0": b, "model.table.c": c}


def test_state_dict_survives_cycles():
    class Block:
        pass
    block = Block()
    block.weight, block.parent = Tensor([1.0]), block
    assert list(get_state_dict(block)) == ["weight"]


def test_get_parameters_lists_each_tensor_once_in_order():
    shared = Linear(2, 2)
    model = {"first": shared, "again": [shared], "norm": BatchNorm(2)}
    params = get_parameters(model)
    assert [id(p) for p in params] == [id(t) for t in (shared.weight, shared.bias, model["norm"].weight,
                                                        model["norm"].bias)]  # no running statistics: buffers


def test_torch_weights_load_by_name_and_give_torch_outputs():
    torch_net = TorchNet().eval()
    with torch.no_grad():  # running statistics that are not the defaults
        torch_net.layers[1].running_mean.uniform_(-1, 1)
        torch_net.layers[1].running_var.uniform_(0.5, 2)
    net = Net()
    net.layers[1].eval()  # BatchNorm trains by default, as torch's
    assert load_state_dict(net, torch_to_ember(torch_net.state_dict())) == ([], [])
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(x)).numpy(), torch_net(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_load_state_dict_casts_to_the_model_dtype():
    layer = Linear(2, 1)
    load_state_dict(layer, {"weight": Tensor([[1.5, -2.0]], dtype=dtypes.float64), "bias": Tensor([3], dtype="int32")})
    assert layer.weight.dtype is dtypes.float32 and layer.weight.tolist() == [[1.5, -2.0]]
    assert layer.bias.dtype is dtypes.float32 and layer.bias.tolist() == [3.0]


def test_load_state_dict_strict_names_missing_and_unexpected_keys():
    layer = Linear(2, 1)
    with pytest.raises(StateDictError, match=r"missing keys \['bias'\], unexpected keys \['extra'\]") as info:
        load_state_dict(layer, {"weight": Tensor([[1.0, 2.0]]), "extra": Tensor([0.0])})
    assert isinstance(info.value, KeyError)
    assert layer.weight.tolist() != [[1.0, 2.0]], "a failed strict load changed the model"


def test_load_state_dict_not_strict_loads_what_matches():
    layer = Linear(2, 1)
    missing, unexpected = load_state_dict(layer, {"weight": Tensor([[1.0, 2.0]]), "extra": Tensor([0.0])},
                                          strict=False)
    assert (missing, unexpected) == (["bias"], ["extra"]) and layer.weight.tolist() == [[1.0, 2.0]]


@pytest.mark.parametrize("strict", [True, False])
def test_load_state_dict_shape_mismatch_names_key_and_shapes(strict):
    layer = Linear(2, 1)
    before = layer.weight.numpy()
    with pytest.raises(ShapeError, match=r"'bias' has shape \(2,\) in the state dict and \(1,\) in the model"):
        load_state_dict(layer, {"weight": Tensor([[1.0, 2.0]]), "bias": Tensor([1.0, 2.0])}, strict=strict)
    np.testing.assert_array_equal(layer.weight.numpy(), before)


def test_loaded_parameters_still_train():
    layer = Linear(2, 1)
    load_state_dict(layer, {"weight": Tensor([[1.0, 2.0]]), "bias": Tensor([0.5])})
    layer.weight.requires_grad_()
    layer(Tensor([[3.0, 4.0]])).sum().backward()
    assert layer.weight.grad.tolist() == [[3.0, 4.0]]


# ---- through a file (the format itself: test_safetensors_files.py) ------------------------------------------------

def test_state_dict_round_trips_through_a_file(tmp_path):
    net, copy = Net(), Net()
    safe_save(get_state_dict(net), tmp_path / "net.safetensors")
    load_state_dict(copy, safe_load(tmp_path / "net.safetensors"))
    for (name, a), b in zip(get_state_dict(net).items(), get_state_dict(copy).values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
