"""The PTX renderer (renderer/ptx.py) and nvJitLink (runtime/nvjitlink.py): what is PTX's own. Every kernel of the op
suite is assembled for NULL:PTX in CI (DEVICE=NULL:PTX); here: the instructions that carry ember's semantics are
the ones printed, libm calls link with CUDA's math functions, an assembler error names its line, and CUDA:PTX says
why it cannot open without a driver. Nothing here executes PTX (no GPU on CI): values are checked on a GPU by the
op suite with DEVICE=CUDA:PTX."""

from __future__ import annotations

import numpy as np
import pytest

from ember import Tensor
from ember.device import Device
from ember.engine.realize import cached_program
from ember.errors import CompileError, DeviceError
from ember.runtime.nvjitlink import math_module
from tests.helpers import device_or_skip

NULL = device_or_skip("NULL:PTX")


def ptx_of(t: Tensor) -> list[str]:
    """The PTX of each kernel of `t`, each assembled and linked (nvJitLink) on the way."""
    sources = []
    for item in t.schedule():
        src = cached_program(item.ast, NULL.renderer).src
        assert NULL.compiler.compile(src)
        sources.append(src)
    return sources


def on(x: np.ndarray) -> Tensor: return Tensor(x, device="NULL:PTX")


def test_floats_round_as_numpy_does() -> None:
    x = on(np.ones((8, 40), np.float32))
    (src,) = ptx_of((x * 3 + 1) / x.sqrt())
    assert "mul.rn.f32" in src and "add.rn.f32" in src and "div.rn.f32" in src and "sqrt.rn.f32" in src
    assert "fma" not in src and "mad.f32" not in src  # (.rn: ptxas contracts nothing)
    (src,) = ptx_of(x.maximum(x * 2))
    assert "setp.nan" in src and "max.f32" not in src  # NaN from either side, as numpy.maximum


def test_integers_never_trap_and_narrow_ones_wrap() -> None:
    a = on(np.arange(1, 65, dtype=np.int32))
    (src,) = ptx_of(a // (a - 3))
    assert "div.s32" in src and "setp.eq.s32" in src  # x / 0 and x / -1 guarded
    (src,) = ptx_of(on(np.arange(64, dtype=np.int8)) * 5)
    assert "ld.global.s8" in src and "cvt.s16.s8" in src and "st.global.s8" in src
    (src,) = ptx_of(on(np.arange(64, dtype=np.int64)) << on(np.arange(64, dtype=np.int64)))
    assert "min.u64" in src and "shl.b64" in src


def test_libm_ops_call_cudas_math_functions() -> None:
    x = on(np.ones(100, np.float32))
    (src,) = ptx_of(x.sin() + x.erf() + x.pow(x))
    assert "call.uni (ret), ember_sinf" in src and "ember_erff" in src and "ember_powf" in src
    module = math_module(src)
    assert 'extern "C" __device__ float ember_powf(float x0, float x1) { return powf(x0, x1); }' in module
    (src,) = ptx_of(on(np.ones(100, np.float64)).exp())
    assert "ember_exp " in src and "double ember_exp(double x0)" in math_module(src)


def test_half_and_bfloat16_are_stored_as_16_bits() -> None:
    for dtype in ("float16", "bfloat16"):
        (src,) = ptx_of(on(np.ones(64, np.float32)).cast(dtype).realize() * 3)
        assert "ld.global.b16" in src and "st.global.b16" in src and "setp.nan.f32" in src


def test_a_half_matmul_is_mma_sync() -> None:
    a, b = on(np.ones((32, 48), np.float16)), on(np.ones((48, 24), np.float16))
    (src,) = ptx_of(a @ b)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src and "mov.b32 %r" in src


def test_an_assembler_error_names_its_line() -> None:
    src = ".version 8.3\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n  .reg .b32 %r<2>;\n" \
          "  add.bogus.s32 %r0, %r1, 1;\n  ret;\n}\n"
    with pytest.raises(CompileError, match=r"kernel\.ptx:7: error: Unknown modifier") as e:
        NULL.compiler.compile(src)
    assert ">>    7 |   add.bogus.s32" in str(e.value)


def test_cuda_ptx_without_a_driver_says_so() -> None:
    assert Device.canonicalize("cuda:ptx") == "CUDA:PTX"
    if Device.why_not("CUDA:PTX") is None: pytest.skip("a CUDA driver is here")
    with pytest.raises(DeviceError, match="no CUDA driver"):
        Device["CUDA:PTX"]


def test_int8_and_uint8_are_re_extended_when_they_change_sign() -> None:
    """A 16-bit register holds an 8-bit integer extended from its 8 bits by its own signedness: uint8 200 as int8 is
    -56, so a cast (or bitcast) between the two extends again."""
    u = on(np.arange(64, dtype=np.uint8)).realize()
    (src,) = ptx_of(u.cast("int8") // 3)
    assert "cvt.s16.s8" in src and "div.s16" in src
    (src,) = ptx_of(u.bitcast("int8") < 0)
    assert "cvt.s16.s8" in src


def test_a_float_to_uint64_is_bounded_above_too() -> None:
    """1e20 to uint64 gives float_to_int's answer (2**63, through int64), not cvt's clamp to 2**64 - 1."""
    (src,) = ptx_of(on(np.ones(64, np.float32)).cast("uint64"))
    assert "setp.lt.and.f32" in src and "0f5F800000" in src  # a < 2**64


def test_shared_memory_holds_half_partials_as_floats() -> None:
    """A GROUP of half: the partials in shared memory are floats, 4 bytes a slot, read and written as f32."""
    from ember.codegen import get_program
    from ember.codegen.opt import Opt, OptOps
    (item,) = on(np.ones((2, 1024), np.float16)).realize().max(-1).values.schedule()
    src = get_program(item.ast, NULL.renderer, opts=[Opt(OptOps.GROUP, 1, 16)]).src
    assert ".shared .align 16 .b8 temp0[64];" in src and "st.shared.f32" in src and "ld.shared.f32" in src
    assert NULL.compiler.compile(src)
    (item,) = on(np.ones((2, 1024), np.int8)).realize().max(-1).values.schedule()
    src = get_program(item.ast, NULL.renderer, opts=[Opt(OptOps.GROUP, 1, 16)]).src
    assert "temp0[16];" in src and "st.shared.s8" in src and "ld.shared.s8" in src
