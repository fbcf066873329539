"""CUDA C through NVRTC on a machine without a GPU: every kernel compiles to an sm_90 cubin on NULL:CUDA, which runs
nothing; CUDA itself says there is no driver. Skipped with the reason where NVRTC is not installed."""

from __future__ import annotations

import numpy as np
import pytest

from ember.codegen import get_program
from ember.device import Device
from ember.errors import CompileError, DeviceError
from ember.runtime.ops_null import NullCounters, NullDeviceError
from tests.helpers import device_or_skip, tensor_on

NULL = device_or_skip("NULL:CUDA")
null = tensor_on("NULL:CUDA")


def test_kernels_of_every_dtype_compile_to_a_cubin() -> None:
    before = NullCounters.compiled
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    h = np.ones(6, np.float16)
    made = [(null(x) * 2 + 1).exp().sum(1), null(x).cast("float64").sin(), null(x).cast("int64") // 3,
            null(x).bitcast("int32") >> 2, null(h) * null(h) + 1, null(h).bitcast("int16"),
            null(x).cast("bfloat16") * 3, (null(x) > 2).where(null(x), float("nan")), null(x).max(1).values,
            null(x).softmax(-1), null(x) @ null(x).T]
    for t in made: t.realize()
    assert NullCounters.compiled - before >= len(made)


def test_kernels_launch_over_blocks_and_threads() -> None:
    (item,) = (null(np.ones((64, 64), np.float32)).exp() + 1).schedule()
    spec = get_program(item.ast, NULL.renderer)
    assert 'extern "C" __global__ void' in spec.src and "threadIdx.x" in spec.src and "blockIdx" in spec.src
    assert spec.local_size is not None and np.prod(spec.global_size) * np.prod(spec.local_size) == 64 * 64


def test_reading_a_value_is_a_clear_error() -> None:
    with pytest.raises(NullDeviceError, match="runs none"):
        (null(np.ones(4, np.float32)) + 1).numpy()


def test_a_compile_error_shows_the_log_and_the_line() -> None:
    src = 'extern "C" __global__ void broken(float* data0) {\n  data0[0] = undefined_name;\n}\n'
    with pytest.raises(CompileError, match=r"(?s)undefined_name.*>>\s+2 \|"):
        NULL.compiler.compile(src)


def test_cuda_without_a_driver_says_so() -> None:
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is installed here")
    except OSError:
        pass
    with pytest.raises(DeviceError, match="no CUDA driver"):
        Device["CUDA"]
