"""The sanitizer job (slow): the op and random-program tests run again with every generated kernel compiled with
-fsanitize=address,undefined (and float-cast-overflow, which gcc leaves out of `undefined`), aborting on the first
report. It found the undefined shifts and float-to-int casts that renderer/cstyle.py now defines.

How: $EMBER_CFLAGS adds the flags (runtime/ops_cpu.c_flags, part of the cache key), and the sanitizer runtimes are
preloaded into Python (libstdc++ too: ASan's C++ exception interceptor needs it loaded first). Leak checking is off,
CPython's own allocations are not ember's. Needs gcc with its sanitizer runtimes; skipped where they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SANITIZED_TESTS = ["tests/test_tensor_ops.py", "tests/test_elementwise_api.py", "tests/test_binary_math.py",
                   "tests/test_reductions.py", "tests/test_indexing.py", "tests/test_tensor_movement.py",
                   "tests/test_defined_c.py", "tests/test_random_programs.py"]
FLAGS = "-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer"
REPORTS = ("runtime error:", "ERROR: AddressSanitizer", "AddressSanitizer: CHECK failed")


def sanitizer_env(cache: Path) -> dict[str, str]:
    gcc = shutil.which("gcc")
    if gcc is None: pytest.skip("the sanitizer job needs gcc")
    runtimes = [subprocess.run([gcc, f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
                for lib in ("libasan.so", "libubsan.so", "libstdc++.so")]
    if not all(os.path.isabs(r) and os.path.exists(r) for r in runtimes):
        pytest.skip(f"gcc's sanitizer runtimes are not installed: {runtimes}")
    return {**os.environ, "CC": gcc, "EMBER_CFLAGS": FLAGS, "EMBER_CACHE": str(cache),
            "LD_PRELOAD": " ".join(r for r in runtimes if "ubsan" not in r),  # asan's runtime carries ubsan's
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1"}


def run_sanitized(args: list[str], cache: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=sanitizer_env(cache), capture_output=True, text=True,
                          timeout=timeout)


UNDEFINED_KERNEL = """
from ember.device import Device
from ember.renderer import ProgramSpec
import ctypes, numpy as np
src = '''#include <stdint.h>
void shift(int32_t* restrict out, const int32_t* restrict a) { out[0] = a[0] << a[1]; }'''
spec = ProgramSpec.from_source("shift", src, "CPU", 2)
program = Device["CPU"].program(spec, Device["CPU"].compiler.compile(src))
out, a = np.zeros(1, np.int32), np.array([1, -1], np.int32)
program(out, a)
print("no report")
"""


@pytest.mark.slow
def test_the_sanitizer_job_catches_undefined_behaviour(tmp_path: Path):
    """The setup reports a C shift by -1 (what a kernel did before cstyle.render_shift): the job can fail."""
    done = run_sanitized(["-c", UNDEFINED_KERNEL], tmp_path / "cache", timeout=120)
    assert done.returncode != 0 and "shift exponent -1 is negative" in done.stderr, done.stdout + done.stderr[-3000:]


@pytest.mark.slow
def test_op_and_random_program_kernels_are_clean_under_asan_and_ubsan(tmp_path: Path):
    done = run_sanitized(["-m", "pytest", "-q", "-x", "-s", "-p", "no:cacheprovider", "-o", "addopts=",
                          "-p", "no:warnings", *SANITIZED_TESTS], tmp_path / "cache", timeout=3600)
    output = done.stdout + done.stderr
    found = [line for line in output.splitlines() if any(r in line for r in REPORTS)]
    assert done.returncode == 0 and not found, "\n".join(found[:20]) + "\n" + output[-6000:]
