"""A schedule's new kernels compile in parallel (realize.prepare_runners): codegen in order, the compiler on a
thread per core. Checked by the overlap of compiler calls, and the results against numpy."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ember.engine.realize as realize
from ember import Tensor
from ember.device import Device
from tests.helpers import unique_constant, use_fresh_cache


def test_new_kernels_of_one_schedule_compile_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    use_fresh_cache(tmp_path, monkeypatch)
    compiler = Device["CPU"].compiler
    real, running, most = compiler.compile, [0], [0]
    lock = threading.Lock()

    def slow_compile(src: str) -> bytes:
        with lock: running[0] += 1; most[0] = max(most[0], running[0])  # noqa: E702
        try:
            time.sleep(0.05)  # long enough that compiles started together overlap
            return real(src)
        finally:
            with lock: running[0] -= 1

    monkeypatch.setattr(compiler, "compile", slow_compile)
    c = unique_constant()
    x = np.linspace(-1, 1, 48, dtype=np.float32).reshape(6, 8)
    outs = [(Tensor(x) * (c + i)).sum(i % 2) for i in range(4)]
    outs[0].realize(*outs[1:])
    for i, out in enumerate(outs):
        np.testing.assert_allclose(out.numpy(), (x * np.float32(c + i)).sum(i % 2), rtol=1e-6, atol=1e-5)
    assert len(realize._runners) >= 4
    assert most[0] == min(4, realize.os.cpu_count() or 1), "compiles ran one per core at once"


def test_a_compile_error_in_a_parallel_batch_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    use_fresh_cache(tmp_path, monkeypatch)
    compiler = Device["CPU"].compiler
    real = compiler.compile
    monkeypatch.setattr(compiler, "compile", lambda src: real(src + ("\n#error broken\n" if "data2" in src else "")))
    c = unique_constant()
    a, b = Tensor(np.ones(4, np.float32)) * c, Tensor(np.ones(4, np.float32)) * c + Tensor(np.ones(4, np.float32))
    with pytest.raises(Exception, match="broken"): a.realize(b)
