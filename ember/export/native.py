"""The fast path of a NumericalFunction call: its C++ module compiled with a tiny CPython extension around it.

The extension's `call` checks each argument in C (an ndarray of the exact dtype, shape and C order, native byte
order and aligned: a few pointer compares and flag tests), allocates the outputs with numpy's C API and runs the
kernels, so a call from Python costs well under 2 µs beyond the kernels. Anything else (lists, other dtypes, views,
big-endian or misaligned arrays) goes through the Python check, which converts or raises the usual errors. The
shared object is cached on disk by a hash of what its source follows from (the plan: see `describe`; ember's own
code), the compiler and the Python/numpy versions: a second process loads it without rendering or compiling.
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.device import checked_name, discard_damaged, find_checked, scratch_dir, write_atomically, write_checked
from ember.dtype import dtypes
from ember.engine.realize import graph_text
from ember.errors import CompileError
from ember.export.cpp import _ENV, module_context, render_templates
from ember.helpers import CACHELEVEL, MAX_CXX_BYTES, UNROLL, cache_dir, source_hash
from ember.runtime.ops_cpu import half_flags, native_target, pick_compiler, vector_bytes
from ember.schedule.kernelize import LoopItem

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


@dataclass(frozen=True)
class NativeBuild:
    """Where f's extension lives in the cache and how it is built. The file is `<ext>.<checksum>` (device.
    write_checked): a truncated, zeroed or swapped one no longer matches its name and is built again."""

    ext: str  # the module's name (PyInit_<ext>) and the key of its file
    folder: str
    cxx: str

    def load(self, f: NumericalFunction) -> Callable[..., Any] | None:
        """The cached extension's `call`, or None when it was not built yet (or was evicted or damaged)."""
        if not CACHELEVEL or (found := find_checked(self.folder, self.ext)) is None: return None
        try:
            return _load(self.ext, found[0], f)
        except (ImportError, OSError) as e:  # evicted between the check and the load, or built for another CPU
            discard_damaged(found[0], f"it does not load ({e})")
            return None

    def store(self, data: bytes) -> str:
        """Keep the built extension in the cache, or where the cache cannot take it, in this process's scratch
        directory (device.cache_write has warned once); the path to load it from."""
        if CACHELEVEL and (path := write_checked(self.folder, self.ext, data)) is not None: return path
        path = os.path.join(scratch_dir(), checked_name(self.ext, data))
        write_atomically(path, data)
        return path


def locate_native(f: NumericalFunction) -> NativeBuild | None:
    """Where f's compiled extension is cached (found without rendering its source), or None where it cannot be
    built (no C++ compiler or Python headers, a dtype numpy has no C type for): then f runs kernel by kernel."""
    include = sysconfig.get_paths()["include"]
    if find_cxx() is None or not os.path.exists(os.path.join(include, "Python.h")): return None
    if any(a.dtype.name == "bfloat16" for a in f.args) or any(b.dtype.name == "bfloat16" for b in f.plan.outputs):
        return None
    description, float16 = describe(f)
    cxx = find_cxx(float16)
    assert cxx is not None
    key_text = "\0".join([description, cxx, *CXX_FLAGS, *half_flags(cxx, "c++"), native_target(cxx), sys.version,
                          np.__version__, source_hash()])
    ext = f"ember_{f.name}_{hashlib.sha256(key_text.encode()).hexdigest()[:16]}"
    return NativeBuild(ext, os.path.join(cache_dir(), "native"), cxx)


def build_native(f: NumericalFunction, where: NativeBuild | None = None) -> Callable[..., Any] | None:
    """The compiled `call` of f: loaded from the cache, else rendered, compiled and cached (None: see
    locate_native). Safe in a thread other than the one that traced f."""
    if (where := where or locate_native(f)) is None: return None
    if (call := where.load(f)) is not None: return call
    include = sysconfig.get_paths()["include"]
    # compiled here for this CPU (-march=native): kernels on its vectors where they pay, with the scalar code's bits
    ctx = module_context(f"ember_{f.name}", [f], make_ws=False, vector_bytes=vector_bytes(native_target(where.cxx)))
    header, source = render_templates(ctx)
    if len(source) > (limit := MAX_CXX_BYTES.value):
        raise CompileError(f"{f.name}: its C++ is {len(source) / 1e6:.1f} MB, over the limit of {limit / 1e6:.1f} MB "
                           f"(EMBER_MAX_CXX_BYTES): the compiler would take very long. A Python loop of identical "
                           f"steps unrolls into straight-line code; write it with ember.ad.scan to keep one loop")
    wrapper = _ENV.get_template("extension.cpp.j2").render(ext=where.ext, module=ctx["module"],
                                                           f=ctx["functions"][0])
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in ((f"{ctx['module']}.hpp", header), (f"{ctx['module']}.cpp", source),
                           ("extension.cpp", wrapper)):
            with open(os.path.join(tmp, name), "w") as fh: fh.write(text)
        out = os.path.join(tmp, "ext.so")
        cmd = [where.cxx, *CXX_FLAGS, *half_flags(where.cxx, "c++"), f"-I{include}", f"-I{np.get_include()}", "-o", out,
               os.path.join(tmp, "extension.cpp")]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode: raise CompileError(f"{f.name}: the C++ compiler failed:\n{done.stderr[-4000:]}")
        with open(out, "rb") as fh: path = where.store(fh.read())
    return _load(where.ext, path, f)


def _load(ext: str, path: str, f: NumericalFunction) -> Callable[..., Any]:
    loader = importlib.machinery.ExtensionFileLoader(ext, path)
    spec = importlib.util.spec_from_loader(ext, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.set_coerce(f._coerce)
    return module.call


def describe(f: NumericalFunction) -> tuple[str, bool]:
    """Everything the extension's source follows from, as text, and whether it holds float16: the plan's kernel
    ASTs, which buffer each kernel reads and writes, the constants' bytes, the signature and a sparse pattern. Its
    hash names the compiled extension, so a second process finds it without rendering the source (ember's codegen
    of a large function takes longer than loading it)."""
    plan = f.plan
    roles: dict[int, str] = {}
    for kind, bufs in (("in", plan.inputs), ("out", plan.outputs), ("const", plan.constants),
                       ("tmp", plan.intermediates)):
        for i, b in enumerate(bufs): roles.setdefault(id(b), f"{kind}{i}:{b.dtype.name}[{b.size}]")
    lines = [f"{f.name}({', '.join(f.arg_names)}) {[(a.shape, a.dtype.name) for a in f.args]} single={f.single}",
             f"outputs {plan.output_shapes}", f"UNROLL={UNROLL.value}"]
    lines += [hashlib.sha256(b.numpy().tobytes()).hexdigest() for b in plan.constants]
    for name in ("shape", "colors", "indptr", "indices"):  # a SparseFunction's pattern
        if (value := getattr(f, name, None)) is not None: lines.append(f"{name} {np.asarray(value).tolist()}")
    float16 = False

    def items(body: list[Any]) -> None:
        nonlocal float16
        for item in body:
            if isinstance(item, LoopItem):
                lines.append(f"loop {item.length} {[roles[id(b)] for b in item.bufs]} carries "
                             f"{[roles[id(b)] for b in item.carry]} xs {[roles[id(b)] for b in item.x]}")
                items(item.body)
                lines.append("end loop")
                continue
            float16 |= any(u.dtype.scalar is dtypes.float16 for u in item.ast.toposort())
            lines.extend([f"kernel {[roles[id(b)] for b in item.bufs]}", graph_text(item.ast)])
    items(plan.items)
    return "\n".join(lines), float16
