"""safetensors files (ember/nn/safetensors.py): round trips, bytes as the format specifies, files written and read by a
small reference implementation here, every kind of malformed file refused with the file and tensor named, and memory:
loading and saving do not copy a file's worth of bytes more than once."""

import json
import math
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable

import numpy as np
import pytest
import torch

import ember.nn.safetensors as st
from ember import Tensor, dtypes
from ember.errors import EmberError
from ember.nn.safetensors import SafetensorsError, safe_load, safe_load_metadata, safe_save
from tests.helpers import cpu_only

DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "uint16",
          "uint32", "uint64", "bool"]
SAFETENSORS_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                     "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "uint16": "U16", "uint32": "U32",
                     "uint64": "U64", "bool": "BOOL"}
TORCH_DTYPES = {name: getattr(torch, dtype) for dtype, name in SAFETENSORS_NAMES.items()}


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


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def raw_bytes(t: torch.Tensor) -> bytes:
    """torch's own little-endian bytes of t (this machine is little-endian, as safetensors files are)."""
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


# ---- a reference reader and writer, from the format's description alone ------------------------------------------

def write_raw(path, header: dict | bytes, chunks: Iterable[bytes] = ()) -> None:
    """A file of the given header (JSON-encoded unless bytes already) and data, with nothing checked."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for chunk in chunks: f.write(chunk)


def reference_write(path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Tensors in the given order, header unpadded and not compact: unlike ember's layout, still a valid file."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": SAFETENSORS_NAMES[str(t.dtype).removeprefix("torch.")], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    write_raw(path, header, [raw_bytes(t) for t in tensors.values()])


def reference_read(path) -> dict[str, torch.Tensor]:
    blob = open(path, "rb").read()
    size = int.from_bytes(blob[:8], "little")
    header, data = json.loads(blob[8:8 + size]), blob[8 + size:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__": continue
        start, end = info["data_offsets"]
        flat = torch.frombuffer(bytearray(data[start:end]), dtype=torch.uint8) if end > start else torch.empty(0)
        out[name] = flat.to(torch.uint8).view(TORCH_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


# ---- round trips and layout --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (), (0, 2), (7,)])
def test_safetensors_round_trip(tmp_path, dtype, shape):
    want = sample_torch(dtype, shape)
    safe_save({"x": to_ember(want)}, tmp_path / "t.safetensors")
    got = safe_load(tmp_path / "t.safetensors")["x"]
    assert got.dtype.name == dtype and got.shape == shape
    np.testing.assert_array_equal(got.numpy(), as_numpy(want))


def test_files_of_the_reference_writer_load_and_ember_files_read_back_by_the_reference_reader(tmp_path):
    tensors = {f"{i}.{dtype}": sample_torch(dtype, (2, 3, 1) if i % 2 else (5,), seed=i)
               for i, dtype in enumerate(DTYPES)}
    tensors["empty"] = torch.zeros((0, 4))
    reference_write(tmp_path / "ref.safetensors", tensors, metadata={"format": "pt"})
    loaded = safe_load(tmp_path / "ref.safetensors")
    assert list(loaded) == list(tensors)  # header order, not ember's alignment order
    assert safe_load_metadata(tmp_path / "ref.safetensors") == {"format": "pt"}
    for name, want in tensors.items():
        assert loaded[name].dtype.name == str(want.dtype).removeprefix("torch.") and loaded[name].shape == want.shape
        np.testing.assert_array_equal(loaded[name].numpy(), as_numpy(want), err_msg=name)
    safe_save(loaded, tmp_path / "ours.safetensors")
    back = reference_read(tmp_path / "ours.safetensors")
    assert sorted(back) == sorted(tensors)
    for name, want in tensors.items(): assert torch.equal(back[name], want), name


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


def test_saved_lazy_and_strided_tensors_hold_their_values(tmp_path):
    base = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    tensors = {"sum": base + 1, "transposed": base.T, "slice": base[1:, ::2]}
    safe_save(tensors, tmp_path / "t.safetensors")
    for name, got in reference_read(tmp_path / "t.safetensors").items():
        np.testing.assert_array_equal(got.numpy(), tensors[name].numpy(), err_msg=name)


def test_loaded_tensors_do_not_depend_on_the_file(tmp_path):
    path = tmp_path / "t.safetensors"
    reference_write(path, {"x": torch.arange(5, dtype=torch.int32)})
    loaded = safe_load(path)
    path.write_bytes(b"\0" * path.stat().st_size)
    path.unlink()
    assert loaded["x"].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensors_larger_than_a_chunk_cross_chunk_boundaries_intact(tmp_path, monkeypatch, dtype):
    monkeypatch.setattr(st, "CHUNK_BYTES", 16)  # 37 elements of up to 8 bytes: several pieces, the last one short
    tensors = {"a": sample_torch(dtype, (37,), seed=1), "b": sample_torch(dtype, (3, 3), seed=2)}
    reference_write(tmp_path / "ref.safetensors", tensors)
    loaded = safe_load(tmp_path / "ref.safetensors")
    for name, want in tensors.items(): np.testing.assert_array_equal(loaded[name].numpy(), as_numpy(want))
    safe_save(loaded, tmp_path / "ours.safetensors")
    for name, got in reference_read(tmp_path / "ours.safetensors").items(): assert torch.equal(got, tensors[name])


# ---- BOOL bytes --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk_bytes", [st.CHUNK_BYTES, 2])
def test_bool_bytes_other_than_zero_and_one_load_as_true(tmp_path, monkeypatch, chunk_bytes):
    monkeypatch.setattr(st, "CHUNK_BYTES", chunk_bytes)
    write_raw(tmp_path / "t.safetensors", {"m": {"dtype": "BOOL", "shape": [5], "data_offsets": [0, 5]}},
              [bytes([2, 0, 1, 255, 128])])
    mask = safe_load(tmp_path / "t.safetensors")["m"]
    assert mask.tolist() == [True, False, True, True, True]
    assert mask.logical_not().tolist() == [False, True, False, False, False]
    assert mask.cast(dtypes.uint8).tolist() == [1, 0, 1, 1, 1]
    safe_save({"m": mask}, tmp_path / "back.safetensors")
    assert (tmp_path / "back.safetensors").read_bytes().endswith(bytes([1, 0, 1, 1, 1]))


# ---- malformed files ---------------------------------------------------------------------------------------------

def entry(dtype: str = "F32", shape: list | None = None, offsets: list | None = None) -> dict:
    return {"dtype": dtype, "shape": [2] if shape is None else shape, "data_offsets": offsets or [0, 8]}


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# (header: dict, JSON text or whole-file bytes, data bytes after it, message, tensor named or None)
MALFORMED = [
    pytest.param(None, b"", "is 0 bytes, too short", None, id="empty file"),
    pytest.param(None, b"\x01\x00", "is 2 bytes, too short", None, id="short length"),
    pytest.param(None, b"\xff" + b"\x00" * 7 + b"{}", "declares a 255-byte header but has 2 bytes", None,
                 id="header longer than the file"),
    pytest.param(None, (2 << 30).to_bytes(8, "little") + b"{}", "declares a 2147483648-byte header", None,
                 id="header of 2 GB claimed"),
    pytest.param(b"\xff\xfe{}", b"", "is not JSON", None, id="not UTF-8"),
    pytest.param(b"{x", b"", "is not JSON", None, id="not JSON"),
    pytest.param(b"[1, 2]", b"", "is a JSON list, not an object", None, id="header a list"),
    pytest.param(deep(100_000).encode(), b"", "nests too deeply", None, id="absurd nesting"),
    pytest.param(b'{"x": ' + json.dumps(entry()).encode() + b', "x": ' + json.dumps(entry()).encode() + b"}",
                 bytes(8), "gives the key 'x' twice", "x", id="duplicate tensor"),
    pytest.param(b'{"x": {"dtype": "F32", "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', bytes(8),
                 "gives the key 'dtype' twice", "dtype", id="duplicate field"),
    pytest.param({"x": [1]}, b"", r"tensor 'x' in .* is \[1\], not an object", "x", id="entry a list"),
    pytest.param({"x": {"shape": [2], "data_offsets": [0, 8]}}, bytes(8), "tensor 'x' in .* has no dtype", "x",
                 id="no dtype"),
    pytest.param({"x": {"dtype": "F32", "data_offsets": [0, 8]}}, bytes(8), "has no shape", "x", id="no shape"),
    pytest.param({"x": {"dtype": "F32", "shape": [2]}}, bytes(8), "has no data_offsets", "x", id="no offsets"),
    pytest.param({"x": entry("F8_E4M3", [8])}, bytes(8), "has dtype 'F8_E4M3', which ember does not read", "x",
                 id="unknown dtype"),
    pytest.param({"x": entry(5)}, bytes(8), "has dtype 5, which ember does not read", "x", id="dtype not a string"),
    pytest.param({"x": entry(["F32"])}, bytes(8), r'has dtype \["F32"\], which', "x", id="dtype a list"),
    pytest.param({"x": entry(shape=[-2])}, bytes(8), r"has shape \[-2\]; a shape is a list of non-negative", "x",
                 id="negative dim"),
    pytest.param({"x": entry(shape=[2.0])}, bytes(8), r"has shape \[2.0\]", "x", id="float dim"),
    pytest.param({"x": entry(shape=[True, True])}, bytes(8), r"has shape \[true, true\]", "x", id="bool dims"),
    pytest.param({"x": entry(shape="2")}, bytes(8), "has shape '2'", "x", id="shape a string"),
    pytest.param({"x": entry(shape=json.loads(deep(500)))}, bytes(8), r"has shape \[\[\[\[", "x",
                 id="deeply nested shape"),
    pytest.param({"x": entry(offsets=[8])}, bytes(8), r"has data_offsets \[8\]; they are \[begin, end\]", "x",
                 id="one offset"),
    pytest.param({"x": entry(offsets=[8, 0])}, bytes(8), r"has data_offsets \[8, 0\]", "x", id="end before begin"),
    pytest.param({"x": entry(offsets=[-8, 0])}, bytes(8), r"has data_offsets \[-8, 0\]", "x",
                 id="negative offset"),
    pytest.param({"x": entry(offsets=[0, 16])}, bytes(8), r"data_offsets \[0, 16\] past the end of the data: the "
                 "file holds 8 data bytes", "x", id="offsets past the end"),
    pytest.param({"x": entry(offsets=[0, 4])}, bytes(4), r"\[0, 4\] \(4 bytes\) for F32 \[2\], which takes 8",
                 "x", id="size not shape times itemsize"),
    pytest.param({"a": entry(), "b": entry(offsets=[4, 12])}, bytes(12),
                 "tensor 'b' in .* overlaps tensor 'a': it begins at byte 4, before 8", "b", id="overlap"),
    pytest.param({"b": entry(offsets=[0, 8]), "a": entry(offsets=[0, 8])}, bytes(8),
                 "tensor 'a' in .* overlaps tensor 'b'", "a", id="same bytes twice"),
    pytest.param({"a": entry(), "b": entry(offsets=[12, 20])}, bytes(20),
                 r"tensor 'b' in .* begins at byte 12, leaving bytes \[8, 12\) unused", "b", id="gap"),
    pytest.param({"a": entry(offsets=[4, 12])}, bytes(12), r"leaving bytes \[0, 4\) unused", "a",
                 id="gap at the start"),
    pytest.param({"a": entry()}, bytes(12), "has 12 data bytes but its tensors cover 8, up to the end of tensor "
                 "'a'", "a", id="bytes after the last tensor"),
    pytest.param({}, bytes(4), "has 4 data bytes but its tensors cover 0", None, id="data and no tensors"),
    pytest.param({"__metadata__": {"k": 1}}, b"", """the '__metadata__' entry of .* is {"k": 1}; it must be an """
                 "object of strings", "__metadata__", id="metadata not strings"),
    pytest.param({"__metadata__": ["k"]}, b"", r"'__metadata__' entry of .* is \[\"k\"\]", "__metadata__",
                 id="metadata a list"),
]


@pytest.mark.parametrize("header, data, message, tensor", MALFORMED)
def test_malformed_files_raise_safetensors_error_naming_file_and_tensor(tmp_path, header, data, message, tensor):
    path = tmp_path / "bad.safetensors"
    if header is None: path.write_bytes(data)
    else: write_raw(path, header, [data])
    for read in (safe_load, safe_load_metadata):
        start = time.perf_counter()
        with pytest.raises(SafetensorsError, match=message) as info:
            read(path)
        assert time.perf_counter() - start < 2, "a malformed file must be refused before its data is touched"
        error = info.value
        assert isinstance(error, EmberError) and isinstance(error, ValueError)
        assert str(error).startswith("safe_load: ") and str(path) in str(error)
        assert (error.path, error.tensor) == (str(path), tensor)
        if tensor is not None: assert f"'{tensor}'" in str(error)


def test_a_header_longer_than_the_librarys_limit_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "MAX_HEADER_BYTES", 64)
    write_raw(tmp_path / "t.safetensors", b"{}" + b" " * 100)
    with pytest.raises(SafetensorsError, match="declares a 102-byte header; safetensors headers are at most 64 bytes"):
        safe_load(tmp_path / "t.safetensors")


def test_long_values_in_messages_are_cut_short(tmp_path):
    write_raw(tmp_path / "t.safetensors", {"x": entry("F" * 10_000)}, [bytes(8)])
    with pytest.raises(SafetensorsError, match=r"has dtype 'FFFF[F.]*, which") as info:
        safe_load(tmp_path / "t.safetensors")
    assert len(str(info.value)) < 400


@pytest.mark.parametrize("state_dict, metadata, message, tensor", [
    ({"__metadata__": Tensor([1.0])}, None, "cannot name a tensor '__metadata__'", "__metadata__"),
    ({3: Tensor([1.0])}, None, "cannot name a tensor 3", "3"),
    ({"x": np.ones(2)}, None, "cannot write 'x' to .*: it is a ndarray, not a Tensor", "x"),
    ({"x": Tensor([1.0])}, {"step": 3}, "metadata for .* is {'step': 3}; it must map strings to strings", None),
])
def test_safe_save_refuses_what_a_file_cannot_hold(tmp_path, state_dict, metadata, message, tensor):
    with pytest.raises(SafetensorsError, match=message) as info:
        safe_save(state_dict, tmp_path / "t.safetensors", metadata=metadata)
    assert info.value.tensor == tensor and str(tmp_path / "t.safetensors") in str(info.value)
    assert not (tmp_path / "t.safetensors").exists(), "nothing is written when the state dict is refused"


# ---- memory --------------------------------------------------------------------------------------------------------

# Peak memory is VmHWM, this process's own high-water mark. resource.getrusage's ru_maxrss will not do: exec
# carries the parent's peak into it (the kernel records the old address space's high-water mark at exec), so under a
# pytest worker that has imported torch it starts above what these scripts use and measures nothing.
PEAK = "int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) * 1024"

LOAD_SCRIPT = f"""
import sys
from ember import Tensor
from ember.nn.safetensors import safe_load
Tensor([1.0]).numpy()  # open the device first: its cost is not the load's
before = {PEAK}
tensors = safe_load(sys.argv[1])
grown = {PEAK} - before
print(grown, *(int(t.numpy().reshape(-1)[-1]) for t in tensors.values()))
"""

SAVE_SCRIPT = f"""
import sys
from ember import Tensor
from ember.nn.safetensors import safe_save
big = Tensor.full((int(sys.argv[2]),), 1.5).contiguous().realize()
small = Tensor.full((3,), 2.5).contiguous().realize()
before = {PEAK}
safe_save({{"big": big, "small": small}}, sys.argv[1])
print({PEAK} - before)
"""


def run_measured(script: str, *args: str) -> list[str]:
    """Run script in a fresh interpreter (peak RSS is per process) and return the words it printed."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and madvise are Linux's")


def write_int32_file(path, sizes: dict[str, int]) -> None:
    """Tensors of the values 0, 1, 2, ... as int32, written a piece at a time so the test itself stays small."""
    header, offset = {}, 0
    for name, count in sizes.items():
        header[name] = {"dtype": "I32", "shape": [count], "data_offsets": [offset, offset + 4 * count]}
        offset += 4 * count
    pieces = (np.arange(start, min(start + (1 << 22), count), dtype=np.int32).tobytes()
              for count in sizes.values() for start in range(0, count, 1 << 22))
    write_raw(path, header, pieces)


@needs_linux
@cpu_only("the host memory a file costs; PoCL's device memory is host memory too, so CL counts it twice")
@pytest.mark.parametrize("megabytes", [200, pytest.param(1024, marks=pytest.mark.slow)])
def test_loading_a_large_file_costs_about_its_size_in_memory(tmp_path, megabytes):
    count = megabytes * (1 << 20) // 4
    write_int32_file(tmp_path / "big.safetensors", {"big": count, "tail": 1000})
    grown, *last = run_measured(LOAD_SCRIPT, str(tmp_path / "big.safetensors"))
    assert [int(v) for v in last] == [count - 1, 999]
    size = (tmp_path / "big.safetensors").stat().st_size
    assert int(grown) < 1.25 * size, f"loading {size} bytes grew peak memory by {int(grown)}"


@needs_linux
@cpu_only("the host memory a save costs; PoCL's device memory is host memory too, so CL counts it twice")
def test_saving_a_large_tensor_streams_its_buffer(tmp_path):
    count = 50 * (1 << 20)  # 200 MiB of float32
    grown, = run_measured(SAVE_SCRIPT, str(tmp_path / "big.safetensors"), str(count))
    assert int(grown) < 0.25 * 4 * count, f"saving {4 * count} bytes grew peak memory by {int(grown)}"
    header_size = int.from_bytes((tmp_path / "big.safetensors").read_bytes()[:8], "little")
    with open(tmp_path / "big.safetensors", "rb") as f:
        f.seek(8)
        header = json.loads(f.read(header_size))
        assert header["big"] == {"dtype": "F32", "shape": [count], "data_offsets": [0, 4 * count]}
        f.seek(8 + header_size + 4 * count - 8)
        assert np.frombuffer(f.read(), dtype=np.float32).tolist() == [1.5, 1.5, 2.5, 2.5, 2.5]
    assert (tmp_path / "big.safetensors").stat().st_size == 8 + header_size + 4 * (count + 3)


def test_saving_writes_pieces_no_bigger_than_a_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "CHUNK_BYTES", 64)
    sizes = []

    class Recorder:
        def __init__(self, f): self.f = f
        def write(self, data): sizes.append(memoryview(data).nbytes); return self.f.write(data)

    real = st._write_tensor
    monkeypatch.setattr(st, "_write_tensor", lambda f, t: real(Recorder(f), t))
    safe_save({"x": Tensor(np.arange(1000, dtype=np.float64))}, tmp_path / "t.safetensors")
    assert len(sizes) == math.ceil(8000 / 64) and max(sizes) == 64
    np.testing.assert_array_equal(safe_load(tmp_path / "t.safetensors")["x"].numpy(), np.arange(1000))
