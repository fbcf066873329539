"""expand (ember/codegen/expand.py): lane ranges become vector lanes or unrolled copies, at any depth of graph."""

import numpy as np
import pytest

import ember.schedule.kernelize as kernelize
from ember import Tensor


def test_deep_chain_expands_without_recursion(monkeypatch: pytest.MonkeyPatch) -> None:
    # one kernel of 2000 adds over a 16-element axis the heuristic upcasts into vector lanes: the expander walked its
    # values recursively, one frame pair per node, and raised RecursionError past Python's limit of 1000
    monkeypatch.setattr(kernelize, "CUT_EVERY", 1 << 30)  # no cut: the whole chain in one kernel
    start = np.arange(16, dtype=np.float32)
    x = Tensor(start)
    for _ in range(2000): x = x + 1
    (item,) = x.schedule()
    assert sum(u.op.name == "ADD" for u in item.ast.toposort()) == 2000
    np.testing.assert_array_equal(x.numpy(), start + 2000)


def conv_program(padding: int, width: int, vector_bytes: int):
    """The heuristic's program for a stride-one conv2d over a padded input of rows `width` wide, on a C renderer
    with `vector_bytes` vectors, its input and weight, and torch's answer."""
    from ember.codegen import get_program
    from ember.helpers import Context
    from ember.renderer.cstyle import CRenderer
    rng = np.random.default_rng(7)
    k = 2 * padding + 1
    x = rng.standard_normal((2, 4, 6, width)).astype(np.float32)
    w = rng.standard_normal((8, 4, k, k)).astype(np.float32)
    out = Tensor(x).conv2d(Tensor(w), padding=padding)
    (item,) = out.schedule()
    with Context(NOOPT=0, BEAM=0): spec = get_program(item.ast, CRenderer(vector_bytes, 1))
    return spec, out, torch_conv(x, w, padding)


def torch_conv(x: np.ndarray, w: np.ndarray, padding: int) -> np.ndarray:
    import torch
    return torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=padding).numpy()


@pytest.mark.parametrize("padding, width", [(1, 16), (1, 24), (2, 16), (3, 32)])
def test_a_window_over_a_padding_loads_whole_and_partial_vectors(padding: int, width: int) -> None:
    """A stride-one convolution reads its input through the padding's gates: with kx unrolled (heuristic), each
    lane's gate settles to true, false or the row's test, so every load of the input is one vector (with a gate per
    lane where the window starts on the pad) and none is a gathered lane; values as torch's."""
    spec, out, want = conv_program(padding, width, 32)
    loads = [u for u in spec.uops if u.op.name == "LOAD" and u.src[0].src[0].op.name == "DEFINE_GLOBAL" and
             u.src[0].src[0].arg == 1]
    assert loads and all(u.dtype.count == 8 for u in loads), [u.dtype for u in loads]
    assert any(len(u.src) > 1 for u in loads), "a row's first vector starts on the pad: LOAD(INDEX, *a gate per lane)"
    assert "load_part_f32x8" in spec.src
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def test_partial_vector_load_without_avx_reads_only_its_lanes(tmp_path) -> None:
    """load_part's portable form (no AVX: a loop over the lanes) reads no memory outside the lanes it is given: a
    window whose first lane lies before the buffer, in a page that faults, loads the rest and 0 there."""
    import ctypes
    import mmap
    import subprocess

    from ember.dtype import dtypes
    from ember.renderer.cvector import partial_load
    src = ("#include <stdint.h>\ntypedef float f32x8 __attribute__((vector_size(32)));\n"
           "typedef int32_t i32x8 __attribute__((vector_size(32)));\n" + partial_load(dtypes.float32.vec(8)) +
           "\nvoid probe(const float* p, float* out) {\n"
           "  f32x8 v = load_part_f32x8(p - 1, (i32x8){0,-1,-1,-1,-1,-1,-1,-1});\n"
           "  for (int i = 0; i < 8; i++) out[i] = v[i];\n}\n")
    (tmp_path / "p.c").write_text(src)
    subprocess.run(["cc", "-O2", "-mno-avx", "-shared", "-fPIC", str(tmp_path / "p.c"), "-o", str(tmp_path / "p.so")],
                   check=True)
    lib = ctypes.CDLL(str(tmp_path / "p.so"))
    # two pages, the first made unreadable: the window's lane 0 (p - 1) would fault if read
    page = mmap.PAGESIZE
    mem = mmap.mmap(-1, 2 * page)
    buf = (ctypes.c_char * (2 * page)).from_buffer(mem)
    base = ctypes.addressof(buf)
    values = np.arange(1, 8, dtype=np.float32)
    ctypes.memmove(base + page, values.ctypes.data, values.nbytes)
    libc = ctypes.CDLL(None)
    assert libc.mprotect(ctypes.c_void_p(base), ctypes.c_size_t(page), 0) == 0
    out = np.full(8, np.nan, np.float32)
    lib.probe(ctypes.c_void_p(base + page), out.ctypes.data_as(ctypes.c_void_p))
    assert libc.mprotect(ctypes.c_void_p(base), ctypes.c_size_t(page), 3) == 0
    np.testing.assert_array_equal(out, np.concatenate([[0], values]))
    del buf
    mem.close()


def test_unrolled_reduce_copies_add_in_the_loops_order() -> None:
    """An UNROLL of a reduce axis that is not the vector one chains its copies into the chunk's accumulator (SERIAL):
    the sum is the loop's, bit for bit (NOOPT), where one accumulator per copy added last would round differently."""
    from ember.codegen import get_program
    from ember.codegen.opt import Opt, OptOps
    from ember.device import Device
    from ember.helpers import Context
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((8, 256)) * 10 ** rng.uniform(-4, 4, (8, 256))).astype(np.float32)
    (item,) = Tensor(x).sum(axis=1).schedule()
    with Context(NOOPT=1): want = Tensor(x).sum(axis=1).numpy()
    renderer = Device["CPU"].renderer
    # the output axis in vector lanes, then 4 copies of the reduce loop's body
    spec = get_program(item.ast, renderer, opts=[Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 4)])
    assert sum(u.op.name == "DEFINE_REG" for u in spec.uops) == 1, "one accumulator: the copies chained into it"
    program = Device["CPU"].program(spec, Device["CPU"].compiler.compile_cached(spec.src))
    out = np.full(8, np.nan, np.float32)
    program(out, x)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_reciprocal_divides_whole_vectors(dtype) -> None:
    """1/x on vector lanes is one vector division (a lane-by-lane 1/x extracts, divides and inserts each lane: the
    vmapped cart-pole jacobian has four a point), each lane numpy's 1/x, inf and -0 included."""
    from ember.codegen import get_program
    from ember.device import Device
    x = np.concatenate([np.random.default_rng(3).uniform(-4, 4, 1021), [0.0, -0.0, np.inf]]).astype(dtype)
    value = Tensor(x).reciprocal()
    (item,) = value.schedule()
    spec = get_program(item.ast, Device["CPU"].renderer)
    assert any(u.op.name == "RECIPROCAL" and u.dtype.count > 1 for u in spec.uops)
    with np.errstate(divide="ignore"): want = 1 / x
    np.testing.assert_array_equal(value.numpy().view(np.uint64 if dtype is np.float64 else np.uint32),
                                  want.view(np.uint64 if dtype is np.float64 else np.uint32))
