"""oclgrind, the OpenCL simulator that checks every access and every pair of threads, reaches ember's CL device as an
OpenCL platform (OCL_ICD_VENDORS pointing at its ICD: docs/backends.md); .ci/run runs the op suite's core under it and
fails on any report. Here: it does report a kernel's out-of-bounds read and its race, so that an empty log means
something, and ember's own kernels give none. Skipped where oclgrind is not installed (apt-get install oclgrind)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ICD = Path("/usr/lib/oclgrind/liboclgrind-rt-icd.so")
if not ICD.exists():
    pytest.skip(f"oclgrind is not installed ({ICD}): apt-get install oclgrind", allow_module_level=True)

BAD = """
from ember.device import Buffer, Device
from ember.dtype import dtypes
from ember.renderer import ProgramSpec
import numpy as np
src = '__kernel void bad(__global float* data0, __global const float* data1) {' \\
      ' int i = get_global_id(0); data0[i] = data1[i + 1]; data0[0] = (float)i; }'
spec = ProgramSpec("bad", src, "CL", ProgramSpec.from_source("bad", src, "CL", 2).ast, None, 2, (0,), 0, 0,
                   global_size=(1,), local_size=(4,))
d = Device["CL"]
out, x = Buffer("CL", 4, dtypes.float32), Buffer("CL", 4, dtypes.float32).copyin(np.ones(4, np.float32))
d.program(spec, d.compiler.compile(src))(out, x)
out.numpy()
"""

OURS = """
import numpy as np
from ember import Tensor
x = Tensor(np.random.default_rng(0).uniform(-2, 2, (33, 70)).astype(np.float32), device="CL")
for t in ((x * 2 + 1).exp().sum(1), x.softmax(-1), x @ x.T, x[:, ::3].max(0).values, x.cumsum(1)): t.numpy()
from ember.device import Device
print(Device["CL"].compiler.cache_key)
"""


def under_oclgrind(code: str, tmp_path: Path) -> tuple[str, str]:
    """(what `code` printed, oclgrind's log) of `code` run with oclgrind as the only OpenCL platform."""
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "oclgrind.icd").write_text(f"{ICD}\n")
    log = tmp_path / "oclgrind.log"
    env = os.environ | {"OCL_ICD_VENDORS": str(vendors), "OCLGRIND_LOG": str(log), "OCLGRIND_DATA_RACES": "1",
                        "EMBER_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300, capture_output=True,
                         text=True).stdout
    return out, log.read_text() if log.exists() else ""


def test_oclgrind_reports_an_out_of_bounds_read_and_a_race(tmp_path: Path) -> None:
    _, report = under_oclgrind(BAD, tmp_path)
    assert "Invalid read of size 4" in report and "data race" in report


def test_embers_kernels_give_no_report(tmp_path: Path) -> None:
    printed, report = under_oclgrind(OURS, tmp_path)
    assert "Oclgrind" in printed and report == ""


TENSOR_CORES = """
import numpy as np
from ember import Tensor
rng = np.random.default_rng(0)
a, b = (Tensor(rng.standard_normal(s).astype(np.float16), device="CL:CUDA") for s in ((2, 17, 40), (2, 40, 24)))
(a @ b).relu().numpy()
from ember.device import Device
print(Device["CL:CUDA"].compiler.cache_key)
"""


def test_the_tensor_core_reference_has_no_race(tmp_path: Path) -> None:
    """CL:CUDA's WMMA: the lanes of each warp write their fragments to local memory and read each other's, between
    barriers; a race or a read past a tile is reported."""
    printed, report = under_oclgrind(TENSOR_CORES, tmp_path)
    assert "Oclgrind" in printed and report == ""
