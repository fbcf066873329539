"""generate_module: the C++ compiles with strict flags, runs, and agrees with the Python call bit for bit."""

import os
import shutil
import subprocess

import numpy as np
import pytest

from ember import Tensor
from ember.export import Arg, NumericalFunction, generate_module, render_module

CXX = [c for c in ("g++", "clang++") if shutil.which(c)]
FLAGS = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror"]
RNG = np.random.default_rng(5)
C = RNG.standard_normal((2, 3))


def functions() -> list[NumericalFunction]:
    def model(x, u):
        return (Tensor(C) @ x).tanh() * u + (x * x).sum(), x[:2], (x.exp() * Tensor(C).exp().sum()).max()
    return [NumericalFunction("model", model, [Arg(3), Arg(2)]),
            NumericalFunction("energy", lambda q: (0.5 * q * q).sum(), [Arg((2, 2))]),
            NumericalFunction("unused_arg", lambda a, b: a * 2, [Arg(2), Arg(1)])]


def driver(fns: list[NumericalFunction], inputs: list[list[np.ndarray]]) -> str:
    """A main() that fills each function's inputs, calls it, and prints every output element as a hex float."""
    lines = ['#include <cstdio>', '#include "mod.hpp"', "int main() {"]
    for f, args in zip(fns, inputs):
        names = [f"in{i}" for i in range(len(args))]
        lines.append("  {")
        lines.append(f"    auto ws = mod::{f.name}::make_ws();")
        params = list(__import__("inspect").signature(f.fn).parameters)
        for n, p, a in zip(names, params, args):
            lines.append(f"    mod::{f.name}::{p}_t {n};")
            lines += [f"    {n}[{i}] = {float(v).hex()};" for i, v in enumerate(a.reshape(-1))]
        outs = [f"out{i}" for i in range(len(f.plan.outputs))]
        lines += [f"    mod::{f.name}::{o}_t {o};" for o in outs]
        lines.append(f"    mod::{f.name}::call({', '.join(names + outs)}, *ws);")
        for o, shape in zip(outs, f.output_shapes):
            count = int(np.prod(shape))
            lines.append(f"    for (std::size_t i = 0; i < {count}; i++) std::printf(\"%a\\n\", {o}[i]);")
        lines.append("  }")
    return "\n".join(lines + ["  return 0;", "}"]) + "\n"


@pytest.mark.parametrize("cxx", CXX)
def test_generated_cpp_compiles_strictly_and_matches_python_bit_for_bit(cxx, tmp_path):
    fns = functions()
    inputs = [[RNG.standard_normal(a.shape) for a in f.args] for f in fns]
    generate_module("mod", fns, str(tmp_path))
    (tmp_path / "main.cpp").write_text(driver(fns, inputs))
    exe = tmp_path / "main"
    subprocess.run([cxx, *FLAGS, "-o", str(exe), str(tmp_path / "mod.cpp"), str(tmp_path / "main.cpp")], check=True,
                   capture_output=True, text=True)
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    expected = []
    for f, args in zip(fns, inputs):
        outs = f(*args)
        outs = (outs,) if isinstance(outs, np.ndarray) else outs
        expected += [float(v).hex() for o in outs for v in o.reshape(-1)]
    assert [float.fromhex(p) for p in printed] == [float.fromhex(e) for e in expected]


def test_generated_files_are_deterministic_and_self_contained(tmp_path):
    first = render_module("mod", functions())
    second = render_module("mod", functions())
    assert first == second
    header, source = first
    includes = {line.split()[1] for text in first for line in text.splitlines() if line.startswith("#include")}
    assert includes <= {"<cstddef>", "<cstdint>", "<memory>", "<cmath>", "<math.h>", "<cstring>", "<limits>",
                        '"mod.hpp"'}
    assert "model_k0_" in source and "static constexpr double model_const0[6]" in source
    assert "using x_t = Buffer<double, 3>;" in header and "using u_t = Buffer<double, 2>;" in header


def test_bad_module_names_are_rejected():
    with pytest.raises(ValueError, match="identifier"):
        render_module("my-module", functions())
    f = functions()[1]
    with pytest.raises(ValueError, match="distinct"):
        render_module("mod", [f, f])


def test_generate_module_writes_both_files(tmp_path):
    paths = generate_module("mod", functions()[1:2], str(tmp_path / "out"))
    assert [os.path.basename(p) for p in paths] == ["mod.hpp", "mod.cpp"] and all(os.path.exists(p) for p in paths)


def test_kernels_turn_off_gccs_basic_block_vectorizer():
    """Every kernel, unrolled (a stack of scalars) or a loop, is declared EMBER_KERNEL; the macro is defined for
    every compiler (g++'s basic-block vectorizer off, empty for the others)."""
    scalar = NumericalFunction("scalar", lambda x: Tensor.stack(x[0].sin() * x[1], x[1] + x[2]), [Arg(3)])
    looped = NumericalFunction("looped", lambda x: (x * 2).sin(), [Arg(100)])
    _, source = render_module("m", [scalar, looped])
    declared = [line for line in source.splitlines() if "_k0_" in line and line.endswith("{")]
    assert [line.split("(")[0] for line in declared] == ["EMBER_KERNEL void scalar_k0_E_2",
                                                         "EMBER_KERNEL void looped_k0_E_100"]
    assert source.count("#define EMBER_KERNEL") == 2  # g++, and empty for the others


@pytest.mark.parametrize("cxx", CXX)
def test_a_module_holds_only_the_helpers_its_kernels_call(cxx, tmp_path):
    """Helpers in the anonymous namespace that nothing calls are a -Wunused-function error (clang++): a float64
    module has none, a bitcast brings bit_cast alone, bfloat16 arithmetic the three bf16 helpers; each compiles
    under -Werror and the bitcast agrees with numpy's view."""
    from ember import dtypes
    helpers = ("bf16_load", "bf16_bits", "bf16_round", "bit_cast")
    cases = {"plain": (NumericalFunction("plain", lambda x: x * 2, [Arg(3)]), set()),
             "bits": (NumericalFunction("bits", lambda x: x.bitcast(dtypes.int64) + 1, [Arg(3)]), {"bit_cast"}),
             "half": (NumericalFunction("half", lambda x: (x.cast(dtypes.bfloat16) * 3).cast(dtypes.float32),
                                        [Arg(3, dtypes.float32)]), {"bf16_load", "bf16_bits", "bf16_round"})}
    for name, (f, want) in cases.items():
        _, source = render_module("mod", [f])
        prelude = source.split("// ----")[0]
        assert {h for h in helpers if f" {h}(" in prelude} == want, name
        folder = tmp_path / name
        generate_module("mod", [f], str(folder))
        subprocess.run([cxx, *FLAGS, "-c", "-o", str(folder / "mod.o"), str(folder / "mod.cpp")], check=True)
    x = np.array([1.0, -0.0, 2.5])
    np.testing.assert_array_equal(cases["bits"][0](x), x.view(np.int64) + 1)


def test_the_python_extension_module_leaves_out_make_ws_and_memory():
    """generate_module's header offers make_ws() (so it includes <memory>); the module compiled into the Python
    extension has its own workspace and leaves both out (parsing <memory> was half a small function's compile)."""
    from ember.export.cpp import module_context, render_templates
    f = NumericalFunction("energy", lambda q: (0.5 * q * q).sum(), [Arg(3)])
    exported = render_templates(module_context("mod", [f]))
    internal = render_templates(module_context("mod", [f], make_ws=False))
    assert all("make_ws" in text for text in exported) and "#include <memory>" in exported[0]
    assert not any("make_ws" in text or "<memory>" in text for text in internal)


@pytest.mark.parametrize("cxx", CXX)
def test_exported_code_never_fuses_a_multiply_add_even_with_native_flags(cxx, tmp_path):
    """g++ contracts a*b + c into an FMA across statements by default (-ffp-contract=fast outside ISO C), which
    -march=native makes available: the exported kernels turn that off themselves, so the C++ gives the Python
    call's bits. The inputs make the two differ: (1 + 2^-30)^2 - (1 + 2^-29) is 0 rounded, 2^-60 fused."""
    f = NumericalFunction("fma_probe", lambda a, b, c: a * b + c, [Arg(1), Arg(1), Arg(1)])
    inputs = [np.array([1 + 2.0 ** -30]), np.array([1 + 2.0 ** -30]), np.array([-(1 + 2.0 ** -29)])]
    generate_module("mod", [f], str(tmp_path))
    (tmp_path / "main.cpp").write_text(driver([f], [inputs]))
    exe = tmp_path / "main"
    subprocess.run([cxx, *FLAGS, "-march=native", "-o", str(exe), str(tmp_path / "mod.cpp"),
                    str(tmp_path / "main.cpp")], check=True, capture_output=True, text=True)
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert f(*inputs)[0] == 0.0 and [float.fromhex(p) for p in printed] == [0.0]


# ---- build time: linear in the traced graph, whatever its form ----------------------------------------------------


def rk4(slope, s: Tensor, steps: int, h: float = 0.05) -> Tensor:
    for _ in range(steps):
        k1 = slope(s)
        k2 = slope(s + h / 2 * k1)
        k3 = slope(s + h / 2 * k2)
        k4 = slope(s + h * k3)
        s = s + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return s


def cartpole_slope(s: Tensor, u: Tensor) -> Tensor:
    """The issue's cart-pole: the state read by s[0]-indexing, the slope a stack of scalars."""
    xd, th, thd = s[1], s[2], s[3]
    st, ct = th.sin(), th.cos()
    tmp = (u + 0.05 * thd * thd * st) / 1.1
    thdd = (9.81 * st - ct * tmp) / (0.5 * (4 / 3 - 0.1 * ct * ct / 1.1))
    return Tensor.stack(xd, tmp - 0.05 * thdd * ct / 1.1, thd, thdd)


def pendulums_slope(s: Tensor, u: Tensor) -> Tensor:
    """Two pendulums as slices: angles s[:2], rates s[2:], the slope a cat of the pieces."""
    angle, rate = s[:2], s[2:]
    return angle.cat(u - 9.81 * angle.sin() - 0.1 * rate * rate.abs()).flip(0).roll(1, 0)


SCALING_MODELS = {
    "stack_of_scalars": lambda steps: lambda z: rk4(lambda s: cartpole_slope(s, z[4]), z[:4], steps),
    "slices_and_cats": lambda steps: lambda z: rk4(lambda s: pendulums_slope(s, z[4]), z[:4], steps),
}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["stack_of_scalars", "slices_and_cats"])
def test_build_time_grows_linearly_with_the_steps_traced(model: str):
    """ember's part of a native build (trace, jacobian, schedule, codegen, C++ text) of 2, 4, 8 and 16 RK4 steps
    takes at most twice the time per traced node that 2 steps take (CPU time: the machine may be shared). The
    cart-pole jacobian's build grew 6x per step (issue 26: 83 s at 3 steps) while its graph grew linearly."""
    import time

    import ember.ad as ad
    from ember.helpers import Context
    seconds, nodes = [], []
    for steps in (2, 4, 8, 16):
        start = time.process_time()
        with Context(CACHELEVEL=0):
            f = ad.jacobian(NumericalFunction(f"{model}_{steps}", SCALING_MODELS[model](steps), [Arg(5)]))
            render_module("scaling", [f])
        seconds.append(time.process_time() - start)
        nodes.append(len(Tensor.stack(*f.traced_outputs).uop.toposort()))
    per_node = [s / n for s, n in zip(seconds, nodes)]
    assert max(per_node[1:]) <= 2 * per_node[0], list(zip(nodes, seconds))
