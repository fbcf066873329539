"""State dicts (names as torch's, loading and its errors) and safetensors files (round trips, bytes as specified)."""

import json

import numpy as np
import pytest
import torch

from ember import Tensor, dtypes
from ember.errors import EmberError, ShapeError
from ember.nn import BatchNorm, Linear
from ember.nn.state import (
    StateDictError,
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_load_metadata,
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


# ---- safetensors ---------------------------------------------------------------------------------------------------

DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "uint16",
          "uint32", "uint64", "bool"]
SAFETENSORS_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                     "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "uint16": "U16", "uint32": "U32",
                     "uint64": "U64", "bool": "BOOL"}


def sample_torch(dtype: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Values that use the whole range of the dtype: negative, fractional, large."""
    rng = np.random.default_rng(seed)
    if dtype == "bool": return torch.from_numpy(np.asarray(rng.random(shape) < 0.5))
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return torch.from_numpy(rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True))
    values = torch.from_numpy(np.asarray(rng.standard_normal(shape) * 100))
    return values.to(getattr(torch, dtype))


def to_ember(t: torch.Tensor) -> Tensor:
    if t.dtype == torch.bfloat16: return Tensor(t.float().numpy(), dtype=dtypes.bfloat16)  # exact: bf16 in f32
    return Tensor(t.numpy())


def raw_bytes(t: torch.Tensor) -> bytes:
    """torch's own little-endian bytes of t (this machine is little-endian, as safetensors files are)."""
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (), (0, 2), (7,)])
def test_safetensors_round_trip(tmp_path, dtype, shape):
    want = sample_torch(dtype, shape)
    safe_save({"x": to_ember(want)}, tmp_path / "t.safetensors")
    got = safe_load(tmp_path / "t.safetensors")["x"]
    assert got.dtype.name == dtype and got.shape == shape
    np.testing.assert_array_equal(got.numpy(), want.float().numpy() if dtype == "bfloat16" else want.numpy())


def test_safetensors_file_decodes_by_hand_to_torch_bytes(tmp_path):
    tensors = {name: sample_torch(dtype, (2, 3), seed=i) for i, (name, dtype) in enumerate(
        [("w.f32", "float32"), ("a.bf16", "bfloat16"), ("h", "float16"), ("idx", "int64"), ("mask", "bool"),
         ("d", "float64"), ("b", "int8")])}
    safe_save({k: to_ember(v) for k, v in tensors.items()}, tmp_path / "t.safetensors")
    blob = (tmp_path / "t.safetensors").read_bytes()
    size = int.from_bytes(blob[:8], "little")
    assert size % 8 == 0
    header, data = json.loads(blob[8:8 + size]), blob[8 + size:]
    for name, t in tensors.items():
        info = header[name]
        assert info["dtype"] == SAFETENSORS_NAMES[str(t.dtype).removeprefix("torch.")] and info["shape"] == [2, 3]
        start, end = info["data_offsets"]
        assert data[start:end] == raw_bytes(t)
        assert start % t.element_size() == 0, f"{name} is not aligned to its element size"
    assert sorted(header[n]["data_offsets"] for n in tensors)[-1][1] == len(data)


def test_safetensors_layout_is_the_libraries(tmp_path):
    """The format's own example: a compact JSON header, lengths little-endian, data right after."""
    values = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    safe_save({"attn.0": Tensor(values)}, tmp_path / "t.safetensors")
    header = b'{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}'
    assert len(header) % 8 == 0
    assert (tmp_path / "t.safetensors").read_bytes() == len(header).to_bytes(8, "little") + header + values.tobytes()


def test_safetensors_pads_header_with_spaces_and_keeps_metadata(tmp_path):
    safe_save({}, tmp_path / "t.safetensors", metadata={"format": "pt"})
    blob = (tmp_path / "t.safetensors").read_bytes()
    text = b'{"__metadata__":{"format":"pt"}}'
    assert blob == (len(text) + 7 & ~7).to_bytes(8, "little") + text + b" " * (-len(text) % 8)
    assert safe_load_metadata(tmp_path / "t.safetensors") == {"format": "pt"}
    assert safe_load(tmp_path / "t.safetensors") == {}


def test_safetensors_bytes_equal_the_safetensors_package(tmp_path):
    st_torch = pytest.importorskip("safetensors.torch", reason="the safetensors package is not installed")
    tensors = {f"t{i}.{dtype}": sample_torch(dtype, (3, 2), seed=i) for i, dtype in enumerate(DTYPES)}
    safe_save({k: to_ember(v) for k, v in tensors.items()}, tmp_path / "ours.safetensors", metadata={"k": "v"})
    assert (tmp_path / "ours.safetensors").read_bytes() == st_torch.save(tensors, metadata={"k": "v"})


def test_state_dict_round_trips_through_a_file(tmp_path):
    net, copy = Net(), Net()
    safe_save(get_state_dict(net), tmp_path / "net.safetensors")
    load_state_dict(copy, safe_load(tmp_path / "net.safetensors"))
    for (name, a), b in zip(get_state_dict(net).items(), get_state_dict(copy).values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)


@pytest.mark.parametrize("blob, message", [(b"\x01\x00", "too short"),
                                           (b"\xff\x00\x00\x00\x00\x00\x00\x00{}", "declares a 255-byte header"),
                                           (b"\x02\x00\x00\x00\x00\x00\x00\x00{x", "is not JSON")])
def test_safe_load_rejects_broken_files(tmp_path, blob, message):
    (tmp_path / "bad.safetensors").write_bytes(blob)
    with pytest.raises(EmberError, match=message):
        safe_load(tmp_path / "bad.safetensors")


def test_safe_load_checks_byte_ranges_and_dtypes(tmp_path):
    for info, message in [({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}, "does not hold F32 \\[2\\]"),
                          ({"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}, "has dtype F8_E4M3")]:
        header = json.dumps({"x": info}).encode()
        (tmp_path / "bad.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\x00" * 4)
        with pytest.raises(EmberError, match=message):
            safe_load(tmp_path / "bad.safetensors")
