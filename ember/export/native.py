"""The fast path of a NumericalFunction call: its C++ module compiled with a tiny CPython extension around it.

The extension's `call` checks each argument in C (an ndarray of the exact dtype, shape and C order: a few pointer
compares), allocates the outputs with numpy's C API and runs the kernels, so a call from Python costs well under
2 µs beyond the kernels. Anything else (lists, other dtypes, views) goes through the Python check, which converts or
raises the usual errors. The shared object is cached on disk by a hash of its source, the compiler and the
Python/numpy versions: a second process loads it without compiling.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.device import write_atomically
from ember.errors import CompileError
from ember.export.cpp import _ENV, module_context, render_templates
from ember.helpers import cache_dir
from ember.runtime.ops_cpu import pick_compiler

if TYPE_CHECKING:
    from ember.export.function import NumericalFunction

CXX_FLAGS = ["-std=c++17", "-O2", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-ffp-contract=off",
             "-fwrapv"]


def find_cxx(float16: bool = False) -> str | None:
    """$CXX, else g++, else clang++, else c++; for code with float16 the first that compiles it (see
    runtime/ops_cpu.pick_compiler). g++ first, unlike the CPU backend's C: measured in bench/numerical.py, clang++
    compiles an unrolled rollout and its jacobians in half the time, but its code ran the Bratu jacobian 45% and
    the Rosenbrock hessian 20% slower (the call's speed matters more than its first compile)."""
    return pick_compiler(os.environ.get("CXX"), ("g++", "clang++", "c++"), "c++", float16)


def build_native(f: NumericalFunction) -> Callable[..., Any] | None:
    """The compiled `call` of f, or None where it cannot be built (no C++ compiler or Python headers, a dtype
    numpy has no C type for): then f runs kernel by kernel from Python."""
    include = sysconfig.get_paths()["include"]
    if find_cxx() is None or not os.path.exists(os.path.join(include, "Python.h")): return None
    if any(a.dtype.name == "bfloat16" for a in f.args) or any(b.dtype.name == "bfloat16" for b in f.plan.outputs):
        return None
    ctx = module_context(f"ember_{f.name}", [f], make_ws=False)
    header, source = render_templates(ctx)
    cxx = find_cxx(float16="_Float16" in header + source)
    assert cxx is not None
    key_text = "\0".join([header, source, cxx, *CXX_FLAGS, sys.version, np.__version__])
    ext = f"ember_{f.name}_{hashlib.sha256(key_text.encode()).hexdigest()[:16]}"
    wrapper = _ENV.get_template("extension.cpp.j2").render(ext=ext, module=ctx["module"], f=ctx["functions"][0])
    path = os.path.join(cache_dir(), "native", ext + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    if not os.path.exists(path):
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in ((f"{ctx['module']}.hpp", header), (f"{ctx['module']}.cpp", source),
                               ("extension.cpp", wrapper)):
                with open(os.path.join(tmp, name), "w") as fh: fh.write(text)
            out = os.path.join(tmp, "ext.so")
            cmd = [cxx, *CXX_FLAGS, f"-I{include}", f"-I{np.get_include()}", "-o", out,
                   os.path.join(tmp, "extension.cpp")]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode: raise CompileError(f"{f.name}: the C++ compiler failed:\n{done.stderr[-4000:]}")
            with open(out, "rb") as fh: write_atomically(path, fh.read())
    loader = importlib.machinery.ExtensionFileLoader(ext, path)
    spec = importlib.util.spec_from_loader(ext, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.set_coerce(f._coerce)
    return module.call
