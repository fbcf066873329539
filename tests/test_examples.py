"""The numerical examples run end to end and reach what they claim (they are documentation that must not rot)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("mode", [[], ["--dense"]], ids=["sparse", "dense"])
def test_newton_converges_to_the_minimum(mode):
    out = run("newton.py", "--size", "20", *mode)
    assert ("3 hessian-vector products" in out) == (not mode)
    error = float(re.search(r"max \|x - 1\| = (\S+)", out).group(1))
    assert error < 1e-8


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_cartpole_jacobians_match_finite_differences_and_the_cpp_main(tmp_path):
    out = run("cartpole.py", "--steps", "2", "--build", str(tmp_path))
    for err in re.findall(r"max \|ember - finite differences\| = (\S+)", out): assert float(err) < 1e-7
    assert float(re.search(r"max \|C\+\+ - Python\| over all outputs = (\S+)", out).group(1)) <= 1e-12


def test_quadrotor_jacobians_match_finite_differences():
    out = run("quadrotor.py", "--steps", "2")
    assert float(re.search(r"rollout: max \|ember - numpy\| = (\S+)", out).group(1)) <= 1e-12
    errors = re.findall(r"max \|ember - finite differences\| = (\S+)", out)
    assert len(errors) == 2 and all(float(err) < 1e-7 for err in errors)
