"""ember's numerical functions against CasADi and JAX: per-call time from Python and from C++, and first-call latency.

Run: python bench/numerical.py            (about 10 minutes; peers: pip install casadi jax jaxlib)
     python bench/numerical.py --only a   (one case: a, b-eval, b-jac, c, d, e, e3, f-eval, f-jac, g, m-jac,
                                          m-hess, p, q, v or h)

Cases, all float64:
  a      energy sum(0.5 x^2), x in R^3: the cost of a call itself
  b-eval cart-pole, 10 RK4 steps (examples/cartpole.py): final state from (state, controls)
  b-jac  the same plus the jacobians by state (4 x 4) and by controls (4 x 10), one function with three outputs
  c      jacobian of the 1-D Bratu residual, n = 1000 (tridiagonal): ember.ad.spjacobian, else ember.ad.jacobian
  d      hessian of the Rosenbrock chain, n = 100 (tridiagonal): ember.ad.sphessian, else ember.ad.hessian
  e      jacobian of the 2-D Bratu residual on a 50 x 50 grid (5-point Laplacian, zero boundary): 2500 x 2500 with
         12300 nonzeros, ember.ad.spjacobian
  e3     the same in 3-D on a 5 x 5 x 5 grid (7-point Laplacian): 125 x 125 with 725 nonzeros
  f-eval quadrotor, 20 RK4 steps (examples/quadrotor.py): final state[12] from (state[12], controls[20, 4])
  f-jac  the same plus the jacobians by state (12 x 12) and by controls (12 x 20 x 4), one function with three
         outputs; the rollout is ember.ad.fold of one step (a loop in the C++); ember's process stops after JAC_LIMIT s
  g      hessian of the Lagrangian of a pendulum swing-up, multiple shooting with one RK4 step on each of 50
         intervals: 152 unknowns (angle and rate at 51 nodes, a torque per interval), 104 equality constraints
         (100 continuity defects, angle and rate at both ends); ember.ad.sphessian wrt the unknowns: a full 3 x 3
         block (angle, rate, torque) per interval, 450 nonzeros
  m-jac  multiple-shooting MPC of the quadrotor (examples/quadrotor.py), one RK4 step on each of 50 intervals,
         written vectorized over the intervals (w: each state component at the 51 nodes, then each thrust on the 50
         intervals): the sparse jacobian of its 600 continuity defects by the 812 unknowns, ember.ad.spjacobian
  m-hess the same problem's Lagrangian (sum of thrust^2 + lam . defects): its sparse hessian by the unknowns,
         ember.ad.sphessian(argnum=0) (issue 27: both at most 1.0x CasADi, built in under 30 s)
  p      a planar chain of 7 point-mass links: accelerations from the (symmetric positive-definite) mass matrix by
         cholesky_solve(cholesky) (CasADi: its SX solve), and their jacobians by the angles and by the rates (7 x 7
         each), one function with three outputs (ember's linalg.solve, LU with pivoting, measured 3.3x CasADi)
  q      the 12 x 16 jacobian of one quadrotor RK4 step by its state and thrusts, ember.ad.vmap over 1000 points
         on one thread against CasADi's map(N, 'serial') (issue 27: at most 1.0x)
  v      the 4 x 4 jacobian of one cart-pole RK4 step by its state, ember.ad.vmap over 100,000 points: ember's C++
         on 2 threads (generate_module threads=2) against CasADi's map(N, 'serial') (issue 27: at most 0.6x)
  h      O(n) check of ember.ad.gradient: sum(sin(x[:n] * x[n])) for n = 100 to 1600, per-call time from Python
         and its growth per doubling of n (CasADi's for reference): a table of its own
CasADi builds each case in SX with its sparse jacobian/hessian; JAX with jax.jacrev/jacfwd/hessian (dense), the
cart-pole and quadrotor loops as a lax.scan.

Three measurements per case and framework:
  python  median per-call time of a warm call from Python: ember's NumericalFunction (numpy arrays in and out),
          CasADi's Function (numpy in, DM out; also its compiled code loaded with casadi.external), a jax.jit'd
          function on device arrays with block_until_ready
  C++     median per-call time of the native code in a C++ loop, no Python in the timed region: ember's
          generate_module output on this CPU's vectors (vector_bytes: 64 with AVX-512, 32 with AVX2, as ember's
          own native build takes them), CasADi's C code generation (as C++), both compiled with the same compiler
          (ember's: $CXX, else g++, else clang++) and CXX_FLAGS below, and timed in turns by one loop; ember
          also as ember+FMA (EMBER_KERNEL defined to let g++ fuse a*b + c, as it does CasADi's code; ember's
          kernels as exported forbid that to keep the Python call's bits) and as ember-scalar (vector_bytes=0:
          ISO C++, any compiler); then ember and CasADi again, both compiled at -O3, in a second loop. JAX has
          no C export.
  first   the first call's latency: ember in a fresh process with an empty EMBER_CACHE (trace, derivatives,
          schedule, call; imports excluded): the first call's result comes from ember's numpy interpreter while the
          native code builds in a thread (ember/export/interpreter.py), so a second time is given, ember-native:
          until the native code is loaded (codegen, compile); CasADi: build the SX function, generate C, compile a
          shared library, load it, call; JAX: define, jit, first call (backend already started).
  build   the native build alone, nothing read from or written to the cache: ember's fresh functions traced,
          differentiated, scheduled, rendered as C++ and compiled (NumericalFunction.compile), in seconds of wall
          time and of CPU time (ember's process and the compiler it runs: the machine may be shared), with the
          part before the C++ compiler; CasADi: its SX function built, C generated and compiled (wall).
Ratios are ember/peer: above 1, ember is slower. Where ember falls back to a dense derivative its process gets a
time limit (--dense-limit) and the table says what it reached.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numerical_models import (  # this script's folder is first on sys.path
    BRATU_SIZE,
    CHAIN_LINKS,
    CUBE_SIZE,
    GRID_SIZE,
    MPC_INTERVALS,
    QUADROTOR_STEPS,
    ROSENBROCK_SIZE,
    STEP_POINTS,
    STEPS,
    SWINGUP_INTERVALS,
    VMAP_POINTS,
    VMAP_THREADS,
    cartpole_inputs,
    casadi_bratu,
    casadi_bratu2d,
    casadi_bratu3d,
    casadi_cartpole,
    casadi_chain,
    casadi_mpc,
    casadi_quadrotor,
    casadi_rosenbrock,
    casadi_step_jacobian,
    casadi_swingup,
    casadi_vmap,
    chain_inputs,
    ember_bratu,
    ember_bratu2d,
    ember_bratu3d,
    ember_cartpole,
    ember_chain,
    ember_energy,
    ember_mpc,
    ember_quadrotor,
    ember_rosenbrock,
    ember_step_jacobian,
    ember_swingup,
    ember_vmap,
    jax_bratu,
    jax_bratu2d,
    jax_bratu3d,
    jax_cartpole,
    jax_chain,
    jax_mpc,
    jax_quadrotor,
    jax_rosenbrock,
    jax_step_jacobian,
    jax_swingup,
    jax_vmap,
    mpc_inputs,
    quadrotor_inputs,
    step_inputs,
    swingup_inputs,
    vmap_inputs,
)

from ember.export.native import find_cxx
from ember.runtime.ops_cpu import native_target, vector_bytes

CXX = find_cxx() or "g++"  # the compiler ember's first call uses ($CXX, else g++, else clang++): CasADi gets it too
CXX_FLAGS = ["-std=c++17", "-O2", "-march=native"]
VECTOR_BYTES = vector_bytes(native_target(CXX))  # the vectors of the CPU -march=native compiles for
JAC_LIMIT = 120.0  # s for ember's f-jac process (3-4 s with the fold; unrolled, from 12 steps on, codegen of the
# jacobians took over a minute, 84 s at 12 steps for 14 MB of C++, and g++ far longer: 25+ min at 20 steps)
GRADIENT_SIZES = (100, 200, 400, 800, 1600)
# ember's kernels as exported keep the Python call's bits (no a*b + c fused into an FMA, see module.cpp.j2); the
# ember+FMA column compiles the same code with this EMBER_KERNEL, which lets g++ fuse as it does CasADi's code
FMA_KERNEL = '__attribute__((optimize("no-tree-slp-vectorize", "vect-cost-model=dynamic")))'

TIMING_MAIN = """#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
{includes}

// Seconds per call of each function: batches of at least 10 ms, taken in turn (one batch of each per round, 15
// rounds), the median batch of each. Taking turns lets a drift of the machine's speed hit every function alike.
template <typename... F>
void per_call(F&&... fs) {{
  using clock = std::chrono::steady_clock;
  auto batch = [](auto& f, long n) {{
    const auto start = clock::now();
    for (long i = 0; i < n; i++) f();
    return std::chrono::duration<double>(clock::now() - start).count();
  }};
  auto calls = [&](auto& f) {{ long n = 1; while (batch(f, n) < 0.01) n *= 2; return n; }};
  const std::vector<long> n{{calls(fs)...}};
  std::vector<std::vector<double>> times(sizeof...(fs));
  for (int r = 0; r < 15; r++) {{
    std::size_t k = 0;
    ((times[k].push_back(batch(fs, n[k]) / static_cast<double>(n[k])), k++), ...);
  }}
  for (auto& t : times) {{
    std::sort(t.begin(), t.end());
    std::printf("%.9g\\n", t[t.size() / 2]);
  }}
}}

int main() {{
{body}
  per_call({calls});
  return 0;
}}
"""


@dataclass
class Case:
    """One benchmark: inputs, and how each framework builds it."""

    key: str
    title: str
    inputs: list[np.ndarray]
    ember: Callable[[], tuple[list[Any], str]]  # fresh NumericalFunctions called together, and what they are
    casadi: Callable[[Any], Any]  # casadi module -> casadi.Function
    jax: Callable[[Any, Any], Callable[..., Any]]  # (jax, jax.numpy) -> function to jit
    limited: bool = False  # ember's version is the dense fallback: give its process --dense-limit seconds
    limit: float = 600.0  # seconds for ember's process otherwise
    threads: int = 1  # ember's C++ module splits its large kernels across this many threads (generate_module)
    to_casadi: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None  # the inputs in CasADi's layout
    from_casadi: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None  # its outputs in ember's, to compare


def cases() -> list[Case]:
    has_sparse_jacobian = has_sparse_hessian = False
    try:
        import ember.ad
        has_sparse_jacobian, has_sparse_hessian = hasattr(ember.ad, "spjacobian"), hasattr(ember.ad, "sphessian")
    except ImportError: pass
    wave = 0.5 + 0.1 * np.sin(np.arange(BRATU_SIZE))
    grid = 0.5 + 0.1 * np.sin(np.arange(GRID_SIZE ** 2)).reshape(GRID_SIZE, GRID_SIZE)
    return [
        Case("a", "energy sum(0.5 x^2), x in R^3", [np.array([1.0, 2.0, 3.0])], ember_energy,
             lambda ca: (lambda x: ca.Function("energy", [x], [ca.sum1(0.5 * x ** 2)]))(ca.SX.sym("x", 3)),
             lambda jax, jnp: lambda x: jnp.sum(0.5 * x ** 2)),
        Case("b-eval", f"cart-pole RK4, {STEPS} steps", cartpole_inputs(), lambda: ember_cartpole(False),
             lambda ca: casadi_cartpole(ca, False), lambda jax, jnp: jax_cartpole(jax, jnp, False)),
        Case("b-jac", "cart-pole + its 2 jacobians", cartpole_inputs(), lambda: ember_cartpole(True),
             lambda ca: casadi_cartpole(ca, True), lambda jax, jnp: jax_cartpole(jax, jnp, True)),
        Case("c", f"Bratu jacobian, n={BRATU_SIZE}", [wave], ember_bratu, casadi_bratu, jax_bratu,
             limited=not has_sparse_jacobian),
        Case("d", f"Rosenbrock hessian, n={ROSENBROCK_SIZE}", [wave[:ROSENBROCK_SIZE] + 0.5], ember_rosenbrock,
             casadi_rosenbrock, jax_rosenbrock, limited=not has_sparse_hessian),
        Case("e", f"2-D Bratu jacobian, {GRID_SIZE}x{GRID_SIZE}", [grid],
             ember_bratu2d, casadi_bratu2d, jax_bratu2d),
        Case("e3", f"3-D Bratu jacobian, {CUBE_SIZE}^3", [0.5 + 0.1 * np.sin(np.arange(CUBE_SIZE ** 3)).reshape(
            (CUBE_SIZE,) * 3)], ember_bratu3d, casadi_bratu3d, jax_bratu3d,
             to_casadi=lambda xs: [xs[0].reshape(-1)]),  # CasADi's x: the grid as a row-major vector
        Case("f-eval", f"quadrotor RK4, {QUADROTOR_STEPS} steps", quadrotor_inputs(), lambda: ember_quadrotor(False),
             lambda ca: casadi_quadrotor(ca, False), lambda jax, jnp: jax_quadrotor(jax, jnp, False)),
        Case("f-jac", "quadrotor + its 2 jacobians", quadrotor_inputs(), lambda: ember_quadrotor(True),
             lambda ca: casadi_quadrotor(ca, True), lambda jax, jnp: jax_quadrotor(jax, jnp, True), limit=JAC_LIMIT),
        Case("g", f"pendulum swing-up hessian, N={SWINGUP_INTERVALS}", swingup_inputs(), ember_swingup,
             casadi_swingup, jax_swingup),
        Case("p", f"{CHAIN_LINKS}-link chain, Cholesky + 2 jacobians", chain_inputs(), ember_chain, casadi_chain,
             jax_chain),
        Case("m-jac", f"MPC constraint jacobian, N={MPC_INTERVALS}", mpc_inputs(False), lambda: ember_mpc(False),
             lambda ca: casadi_mpc(ca, False), lambda jax, jnp: jax_mpc(jax, jnp, False)),
        Case("m-hess", f"MPC Lagrangian hessian, N={MPC_INTERVALS}", mpc_inputs(True), lambda: ember_mpc(True),
             lambda ca: casadi_mpc(ca, True), lambda jax, jnp: jax_mpc(jax, jnp, True)),
        Case("q", f"vmap quadrotor step jacobian, {STEP_POINTS} pts", step_inputs(), ember_step_jacobian,
             casadi_step_jacobian, jax_step_jacobian, to_casadi=lambda xs: [xs[0].T],
             from_casadi=lambda outs: [o.T.reshape(-1, 12, 16) for o in outs]),
        Case("v", f"vmap cart-pole jacobian, {VMAP_POINTS} pts", vmap_inputs(), ember_vmap, casadi_vmap, jax_vmap,
             threads=VMAP_THREADS, to_casadi=lambda xs: [xs[0].T, xs[1][None, :]],
             from_casadi=lambda outs: [o.T for o in outs]),
    ]


# ---- timing ----

def per_call(call: Callable[[], Any], budget: float = 1.0) -> float:
    """Median seconds per call over up to 7 batches of at least 20 ms, within about `budget` seconds."""
    start = time.perf_counter()
    call()
    once = time.perf_counter() - start
    n = max(1, int(0.02 / max(once, 1e-9)))
    times: list[float] = []
    deadline = time.perf_counter() + budget
    while len(times) < 7 and (len(times) < 3 or time.perf_counter() < deadline):
        start = time.perf_counter()
        for _ in range(n): call()
        times.append((time.perf_counter() - start) / n)
    return statistics.median(times)


def compile_cxx(sources: Sequence[str], out: str, extra: Sequence[str] = ()) -> None:
    done = subprocess.run([CXX, *CXX_FLAGS, *extra, "-o", out, *sources], capture_output=True, text=True)
    if done.returncode: raise RuntimeError(f"{CXX} failed on {sources}:\n{done.stderr[-3000:]}")


@dataclass
class NativeCall:
    """One framework's generated code, as a C++ loop times it: its sources and header, the statements that set up
    its inputs, outputs and workspace, and the statements of one call."""
    sources: list[str]
    include: str
    setup: list[str]
    call: list[str]


def time_native(folder: str, natives: Sequence[NativeCall], flags: Sequence[str] = ()) -> list[float]:
    """Seconds per call of each, timed in turns by one compiled C++ loop (TIMING_MAIN), compiled with CXX_FLAGS
    and then `flags` (the last -O wins)."""
    main = os.path.join(folder, "timing_main.cpp")
    lambdas = ", ".join("[&] {\n" + "\n".join(f"    {c}" for c in n.call) + "\n  }" for n in natives)
    with open(main, "w") as fh:
        fh.write(TIMING_MAIN.format(includes="\n".join(n.include for n in natives),
                                    body="\n".join(line for n in natives for line in n.setup), calls=lambdas))
    exe = os.path.join(folder, "timing")
    compile_cxx([main, *(src for n in natives for src in n.sources)], exe, [*flags, "-pthread"] + [
        f"-I{os.path.dirname(n.sources[0])}" for n in natives])  # -pthread: a module on threads (case v)
    out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    return [float(line) for line in out.split()]


def c_array(name: str, values: np.ndarray, const: bool = True) -> str:
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    return f"  static {'const ' if const else ''}double {name}[{max(flat.size, 1)}] = {{" + \
        ", ".join(float(v).hex() for v in flat) + "};"


# ---- ember, in a process of its own ----

def measure_ember(case: Case, folder: str) -> None:
    """Print, as a JSON line after each step: first-call latency, Python and C++ per-call time of case's ember
    functions. Runs in a fresh process; the lines let a caller that stops it keep what it reached."""
    from ember.device import Device
    from ember.export import generate_module
    Device["CPU"]  # opening the device (finding the C compiler) is not part of a function's first call
    start = time.perf_counter()
    fns, what = case.ember()
    print(json.dumps({"what": what}), flush=True)
    for f in fns: f(*case.inputs)
    got: dict[str, Any] = {"what": what, "first": time.perf_counter() - start}
    for f in fns: f.compile()  # waits for the native build the first call started (or loads it)
    got["native_ready"] = time.perf_counter() - start
    outputs = [f.to_dense(out) if hasattr(f, "to_dense") else np.asarray(out) for f in fns
               for out in (lambda o: o if isinstance(o, tuple) else (o,))(f(*case.inputs))]
    if any(hasattr(f, "colors") for f in fns):
        got["what"] += f" ({', '.join(f'{f.nnz} nonzeros, {f.colors} colors' for f in fns)})"
    np.savez(os.path.join(folder, "outputs.npz"), *outputs)  # for the check against CasADi
    print(json.dumps(got), flush=True)
    got["python"] = per_call(lambda: [f(*case.inputs) for f in fns])
    print(json.dumps(got), flush=True)
    got.update(measure_build(case))
    print(json.dumps(got), flush=True)
    natives = {}
    # as exported for this CPU; the same with FMAs allowed; without vectors (ISO C++)
    for kind, attribute, width in (("native", None, VECTOR_BYTES), ("native_fma", FMA_KERNEL, VECTOR_BYTES),
                                   ("native_scalar", None, 0)):
        module = f"ember_{case.key.replace('-', '_')}" + kind.removeprefix("native")
        generate_module(module, fns, folder, threads=case.threads, vector_bytes=width)
        source = os.path.join(folder, f"{module}.cpp")
        if attribute:  # the same file, compiled with EMBER_KERNEL defined first
            with open(unit := os.path.join(folder, f"{module}_unit.cpp"), "w") as fh:
                fh.write(f'#define EMBER_KERNEL {attribute}\n#include "{module}.cpp"\n')
            source = unit
        setup = [c_array(f"{module}_in{i}", a) for i, a in enumerate(case.inputs)]
        calls = []
        for j, f in enumerate(fns):
            setup.append(f"  auto {module}_ws{j} = {module}::{f.name}::make_ws();")
            outs = [f"{module}_f{j}_out{k}" for k in range(len(f.output_shapes))]
            setup += [c_array(o, np.zeros(shape), const=False) for o, shape in zip(outs, f.output_shapes,
                                                                                   strict=True)]
            args = [f"{module}_in{i}" for i in range(len(case.inputs))] + outs + [f"{module}_ws{j}->bytes"]
            calls.append(f"{module}::{f.name}::call_raw({', '.join(args)});")
        natives[kind] = NativeCall([source], f'#include "{module}.hpp"', setup, calls).__dict__
    with open(os.path.join(folder, "native.json"), "w") as fh: json.dump(natives, fh)


def cpu_seconds() -> float:
    """CPU seconds of this process and of the children it waited for (the C++ compiler)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def measure_build(case: Case) -> dict[str, float]:
    """Seconds (wall and CPU) to build case's functions from nothing, with no cache, and the part of them before the
    C++ compiler (trace, derivatives, schedule, C++ text: ember's own work)."""
    from ember.export import render_module
    from ember.helpers import Context
    with Context(CACHELEVEL=0):  # nothing from the cache: every step of the build runs
        wall, cpu = time.perf_counter(), cpu_seconds()
        for f in case.ember()[0]: f.compile()
        built = {"build": time.perf_counter() - wall, "build_cpu": cpu_seconds() - cpu}
        wall = time.perf_counter()
        render_module("ember_build", case.ember()[0], vector_bytes=VECTOR_BYTES)
    return built | {"build_ember": time.perf_counter() - wall}


def ember_in_fresh_process(case: Case, limit: float, folder: str) -> dict[str, Any]:
    """measure_ember in a new Python process with an empty EMBER_CACHE, stopped after `limit` seconds."""
    env = dict(os.environ, EMBER_CACHE=os.path.join(folder, "cache"))
    cmd = [sys.executable, os.path.abspath(__file__), "--ember-case", case.key, "--folder", folder]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group: stopping it also stops the compiler it runs
    stopped = False
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()  # what it printed before
        stopped = True
    if os.path.exists(saved := os.path.join(folder, "outputs.npz")):
        with np.load(saved) as data: outputs = [data[k] for k in data.files]
    else: outputs = []
    if os.path.exists(saved := os.path.join(folder, "native.json")):
        with open(saved) as fh: natives = {kind: NativeCall(**n) for kind, n in json.load(fh).items()}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    got = json.loads(lines[-1]) if lines else {}
    measured = [k for k in ("first", "python") if k in got]
    got["outputs"] = outputs
    if os.path.exists(saved): got.update(natives)
    if stopped: got["error"] = f"stopped after {limit:.0f} s with {', '.join(measured) or 'nothing'} measured"
    elif proc.returncode: got["error"] = f"failed: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}"
    return got


# ---- CasADi and JAX, in this process ----

def measure_casadi(case: Case, ca: Any, folder: str) -> dict[str, Any]:
    name = f"cas_{case.key.replace('-', '_')}"
    start = time.perf_counter()
    function = case.casadi(ca)
    generator = ca.CodeGenerator(f"{name}.cpp", {"with_header": True, "cpp": True})
    generator.add(function)
    generator.generate(folder + os.sep)
    library = os.path.join(folder, f"{name}.so")
    compile_cxx([os.path.join(folder, f"{name}.cpp")], library, ["-shared", "-fPIC"])
    built = time.perf_counter() - start
    compiled = ca.external(function.name(), library)
    inputs = case.to_casadi(case.inputs) if case.to_casadi else case.inputs
    compiled(*inputs)
    first = time.perf_counter() - start
    outputs = function(*inputs)
    outputs = [np.asarray(o.full()) for o in (outputs if isinstance(outputs, (tuple, list)) else [outputs])]
    if case.from_casadi: outputs = case.from_casadi(outputs)
    python = per_call(lambda: function(*inputs))
    python_compiled = per_call(lambda: compiled(*inputs))
    fn = function.name()
    # CasADi's C code reads a matrix argument column by column
    setup = [c_array(f"c_in{i}", np.asarray(a).reshape(-1, order="F")) for i, a in enumerate(inputs)]
    setup += ["  casadi_int n_arg, n_res, n_iw, n_w;", f"  {fn}_work(&n_arg, &n_res, &n_iw, &n_w);",
              "  std::vector<const double*> arg(n_arg);", "  std::vector<double*> res(n_res);",
              "  std::vector<casadi_int> iw(n_iw);", "  std::vector<double> w(n_w);",
              f"  {fn}_incref();", f"  const int mem = {fn}_checkout();"]
    setup += [f"  arg[{i}] = c_in{i};" for i in range(len(inputs))]
    for k in range(function.n_out()):
        setup += [f"  std::vector<double> c_out{k}({max(function.nnz_out(k), 1)});", f"  res[{k}] = c_out{k}.data();"]
    native = NativeCall([os.path.join(folder, f"{name}.cpp")], f'#include "{name}.h"', setup,
                        [f"{fn}(arg.data(), res.data(), iw.data(), w.data(), mem);"])
    return {"first": first, "build": built, "python": python, "python_compiled": python_compiled, "native": native,
            "outputs": outputs}


def measure_jax(case: Case, jax: Any, jnp: Any) -> dict[str, Any]:
    args = [jnp.asarray(a) for a in case.inputs]
    start = time.perf_counter()
    fn = jax.jit(case.jax(jax, jnp))
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    return {"first": first, "python": per_call(lambda: jax.block_until_ready(fn(*args)))}


def load_peers() -> tuple[Any, Any, Any, list[str]]:
    """(casadi, jax, jax.numpy), None for each one missing, and the lines saying what was skipped."""
    notes: list[str] = []
    ca: Any = None
    jax: Any = None
    jnp: Any = None
    try:
        ca = importlib.import_module("casadi")
    except ImportError:
        notes.append("CasADi not installed (pip install casadi): skipped")
    try:
        jax = importlib.import_module("jax")
        jax.config.update("jax_enable_x64", True)
        jnp = importlib.import_module("jax.numpy")
        jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros(2)))  # start the backend outside the timings
    except ImportError:
        jax, jnp = None, None
        notes.append("JAX not installed (pip install jax jaxlib): skipped")
    return ca, jax, jnp, notes


# ---- case h: how ember's gradient grows with n ----

def sines(x: Any, n: int, sin: Callable[[Any], Any], total: Callable[[Any], Any]) -> Any:
    """sum(sin(x[:n] * x[n])): every term reads x[n], so its gradient entry sums n terms."""
    return total(sin(x[:n] * x[n]))


def gradient_growth(ca: Any) -> None:
    """Case h: per-call time from Python of ember.ad.gradient of `sines` (compiled first) for each n, and its growth
    per doubling of n: about 2 if the gradient is O(n), 4 if O(n^2). CasADi's SX gradient for reference."""
    import ember.ad
    from ember import Tensor
    from ember.export import Arg, NumericalFunction

    def ember_gradient(n: int) -> NumericalFunction:
        return ember.ad.gradient(NumericalFunction(f"sines_{n}", lambda x: sines(x, n, Tensor.sin, Tensor.sum),
                                                   [Arg(n + 1)]))
    times: list[tuple[float, float | None]] = []
    errors = []
    for n in GRADIENT_SIZES:
        x = 0.5 + 0.1 * np.sin(np.arange(n + 1))
        grad = ember_gradient(n).compile()
        exact = np.append(x[n] * np.cos(x[:n] * x[n]), (x[:n] * np.cos(x[:n] * x[n])).sum())
        errors.append(float(np.abs(grad(x) - exact).max()))
        theirs = None
        if ca is not None:
            sym = ca.SX.sym("x", n + 1)
            peer = ca.Function(f"sines_{n}", [sym], [ca.gradient(sines(sym, n, ca.sin, ca.sum1), sym)])
            theirs = per_call(lambda peer=peer, x=x: peer(x))
        times.append((per_call(lambda grad=grad, x=x: grad(x)), theirs))
    print("\nh: gradient of sum(sin(x[:n] * x[n])) called from Python, µs per call (median); growth: time(n) / "
          "time(n/2), about 2 for O(n)")
    print(f"| {'n':>5s} | {'ember':>10s} | {'growth':>7s} | {'CasADi':>10s} | {'growth':>7s} | {'ember error':>11s} |")
    print(f"|{'-' * 6}:|{'-' * 11}:|{'-' * 8}:|{'-' * 11}:|{'-' * 8}:|{'-' * 12}:|")
    for i, (n, (ours, theirs), error) in enumerate(zip(GRADIENT_SIZES, times, errors, strict=True)):
        before = times[i - 1] if i else (None, None)
        print(f"| {n:5d} | {cell(ours, 1e6, 2):>10s} | {growth(ours, before[0]):>7s} | "
              f"{cell(theirs, 1e6, 2):>10s} | {growth(theirs, before[1]):>7s} | {error:11.1e} |")


def growth(now: float | None, before: float | None) -> str:
    return "—" if now is None or before is None else f"{now / before:.2f}"


# ---- the report ----

def cell(value: float | None, scale: float, digits: int) -> str:
    return "—" if value is None else f"{value * scale:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None else f"{a / b:.2f}x"


def print_table(title: str, rows: list[tuple[str, list[float | None]]], scale: float, digits: int,
                names: list[str], ratios: list[tuple[int, int]]) -> None:
    headers = names + [f"{names[i].split()[0]}/{names[j].split()[0]}" for i, j in ratios]
    print(f"\n{title}")
    print(f"| {'case':34s} | " + " | ".join(f"{h:>10s}" for h in headers) + " |")
    print(f"|{'-' * 36}|" + "|".join("-" * (max(10, len(h)) + 1) + ":" for h in headers) + "|")
    for label, values in rows:
        cells = [cell(v, scale, digits) for v in values] + [ratio(values[i], values[j]) for i, j in ratios]
        print(f"| {label:34s} | " + " | ".join(f"{c:>{max(10, len(h))}s}" for c, h in zip(cells, headers, strict=True))
              + " |")


def agreement(got: dict[str, dict[str, Any]]) -> str:
    """How far ember's outputs are from CasADi's, where both have them in the same (dense) layout."""
    ours, theirs = got["ember"].get("outputs", []), got.get("casadi", {}).get("outputs", [])
    if not ours or not theirs: return "outputs not compared (one side has none)"
    if [o.size for o in ours] != [o.size for o in theirs]: return "outputs not compared (sparse against dense)"
    worst = max(float(np.abs(a.reshape(-1) - b.reshape(-1)).max() / max(1.0, float(np.abs(b).max())))
                for a, b in zip(ours, theirs, strict=True))
    return f"max |ember - CasADi| / max(1, |CasADi|) = {worst:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run one case: a, b-eval, b-jac, c, d, e, e3, f-eval, f-jac, g, m-jac, "
                        "m-hess, p, q, v or h")
    parser.add_argument("--dense-limit", type=float, default=30.0,
                        help="seconds for ember's process where it falls back to a dense derivative (default 30)")
    parser.add_argument("--ember-case", help=argparse.SUPPRESS)  # internal: measure one case's ember functions
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    by_key = {c.key: c for c in cases()}
    if opts.ember_case:
        measure_ember(by_key[opts.ember_case], opts.folder)
        return

    if opts.only not in (None, "h", *by_key): parser.error(f"--only: no case {opts.only!r}")
    selected = [by_key[opts.only]] if opts.only in by_key else [] if opts.only else list(by_key.values())
    ca, jax, jnp, notes = load_peers()
    versions = [f"numpy {np.__version__}"] + ([f"casadi {ca.__version__}"] if ca else []) + \
        ([f"jax {jax.__version__}"] if jax else [])
    compiler = subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}; "
          f"{', '.join(versions)}; C++: {compiler} {' '.join(CXX_FLAGS)}")
    for note in notes: print(note)
    start = time.perf_counter()
    results = {case.key: measure_case(case, ca, jax, jnp, opts.dense_limit) for case in selected}
    if selected: report(selected, results)
    if opts.only in (None, "h"): gradient_growth(ca)
    print(f"total {time.perf_counter() - start:.0f} s")


def measure_case(case: Case, ca: Any, jax: Any, jnp: Any, dense_limit: float) -> dict[str, dict[str, Any]]:
    """Every framework's measurements of one case; ember's in a process of its own."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench-{case.key}-") as folder:
        os.mkdir(ember_folder := os.path.join(folder, "ember"))
        got = {"ember": ember_in_fresh_process(case, dense_limit if case.limited else case.limit, ember_folder)}
        if ca is not None: got["casadi"] = measure_casadi(case, ca, folder)
        timed = [(fw, kind) for fw, kind in (("ember", "native"), ("ember", "native_fma"), ("ember", "native_scalar"),
                                             ("casadi", "native")) if kind in got.get(fw, {})]
        seconds = time_native(folder, [got[fw][kind] for fw, kind in timed])
        for (fw, kind), s in zip(timed, seconds, strict=True): got[fw]["cpp" + kind.removeprefix("native")] = s
        plain = [(fw, kind) for fw, kind in timed if kind == "native"]  # again at -O3, as issue 27 asks
        for (fw, _), s in zip(plain, time_native(folder, [got[fw][kind] for fw, kind in plain], ["-O3"]),
                              strict=True): got[fw]["cpp_o3"] = s
        for fw in ("ember", "casadi"):  # the generated source's bytes (ember's C++ as exported, CasADi's C)
            if "native" in got.get(fw, {}): got[fw]["code"] = float(os.path.getsize(got[fw]["native"].sources[0]))
    if jax is not None: got["jax"] = measure_jax(case, jax, jnp)
    what = "; ".join(got["ember"][k] for k in ("what", "error") if k in got["ember"])
    print(f"{case.key}: {case.title}: done in {time.perf_counter() - start:.0f} s; ember: {what}", flush=True)
    return got


def report(selected: list[Case], results: dict[str, dict[str, dict[str, Any]]]) -> None:
    """The three tables, then what ember computed and how close it is to CasADi."""
    def row(case: Case, cells: Sequence[tuple[str, str]]) -> tuple[str, list[float | None]]:
        return f"{case.key} {case.title}", [results[case.key].get(fw, {}).get(kind) for fw, kind in cells]

    python_cells = [("ember", "python"), ("casadi", "python"), ("casadi", "python_compiled"), ("jax", "python")]
    print_table("Call from Python, µs per call (median)", [row(c, python_cells) for c in selected], 1e6, 2,
                ["ember", "CasADi", "CasADi-ext", "JAX"], [(0, 1), (0, 2), (0, 3)])
    print_table(f"Native code in a C++ loop, µs per call (median; {CXX} {' '.join(CXX_FLAGS)})",
                [row(c, [("ember", "cpp"), ("ember", "cpp_fma"), ("ember", "cpp_scalar"), ("casadi", "cpp")])
                 for c in selected], 1e6, 3, ["ember", "ember+FMA", "ember-scalar", "CasADi"], [(0, 3), (1, 3), (2, 3)])
    print_table(f"The same at -O3 (another binary: {CXX} {' '.join(CXX_FLAGS)} -O3)",
                [row(c, [("ember", "cpp_o3"), ("casadi", "cpp_o3")]) for c in selected], 1e6, 3,
                ["ember", "CasADi"], [(0, 1)])
    print_table("First call, s (ember: fresh process, empty cache; its result, and its native code loaded)",
                [row(c, [("ember", "first"), ("ember", "native_ready"), ("casadi", "first"), ("jax", "first")])
                 for c in selected], 1, 2, ["ember", "ember-native", "CasADi", "JAX"], [(0, 2), (0, 3), (1, 2)])
    print_table("Build, s (no cache: ember's functions traced, differentiated, scheduled, rendered and compiled; "
                "ember-cpu: CPU s of ember and its compiler; ember-own: wall s before the compiler; CasADi: SX "
                "function, C code, compile)",
                [row(c, [("ember", "build"), ("ember", "build_cpu"), ("ember", "build_ember"), ("casadi", "build")])
                 for c in selected], 1, 2, ["ember", "ember-cpu", "ember-own", "CasADi"], [(0, 3)])
    print_table("Generated code, KB (ember's C++ module; CasADi's CodeGenerator output)",
                [row(c, [("ember", "code"), ("casadi", "code")]) for c in selected], 1e-3, 1, ["ember", "CasADi"],
                [(0, 1)])
    print("\nCasADi: its Function called from Python (SX virtual machine); CasADi-ext: the same compiled and loaded "
          "with casadi.external.")
    derivatives = ("c", "d", "e", "e3", "g")  # the cases whose line says how ember computed them
    for case in selected:
        info = results[case.key]["ember"]
        told = "; ".join(info[k] for k in ("what", "error") if k in info and (k == "error" or case.key in derivatives))
        print(f"ember, case {case.key}: {told + '; ' if told else ''}{agreement(results[case.key])}")

if __name__ == "__main__":
    main()
