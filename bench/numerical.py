"""ember's numerical functions against CasADi and JAX: per-call time from Python and from C++, and first-call latency.

Run: python bench/numerical.py            (about 3 minutes; peers: pip install casadi jax jaxlib)
     python bench/numerical.py --only a   (one case: a, b-eval, b-jac, c or d)

Cases, all float64:
  a      energy sum(0.5 x^2), x in R^3: the cost of a call itself
  b-eval cart-pole, 10 RK4 steps (examples/cartpole.py): final state from (state, controls)
  b-jac  the same plus the jacobians by state (4 x 4) and by controls (4 x 10), one function with three outputs
  c      jacobian of the 1-D Bratu residual, n = 1000 (tridiagonal): ember.ad.spjacobian, else ember.ad.jacobian
  d      hessian of the Rosenbrock chain, n = 100 (tridiagonal): ember.ad.sphessian, else ember.ad.hessian
CasADi builds each case in SX with its sparse jacobian/hessian; JAX with jax.jacrev/jacfwd/hessian (dense), the
cart-pole loop as a lax.scan.

Three measurements per case and framework:
  python  median per-call time of a warm call from Python: ember's NumericalFunction (numpy arrays in and out),
          CasADi's Function (numpy in, DM out; also its compiled code loaded with casadi.external), a jax.jit'd
          function on device arrays with block_until_ready
  C++     median per-call time of the native code in a C++ loop, no Python in the timed region: ember's
          generate_module output, CasADi's C code generation (as C++), both compiled with the same compiler
          (ember's: $CXX, else g++, else clang++) and CXX_FLAGS below, and timed in turns by one loop; ember
          also as ember+FMA (EMBER_KERNEL defined to let g++ fuse a*b + c, as it does CasADi's code; ember's
          kernels as exported forbid that to keep the Python call's bits). JAX has no C export.
  first   the first call's latency: ember in a fresh process with an empty EMBER_CACHE (trace, derivatives,
          schedule, call; imports excluded): the first call's result comes from ember's numpy interpreter while the
          native code builds in a thread (ember/export/interpreter.py), so a second time is given, ember-native:
          until the native code is loaded (codegen, compile); CasADi: build the SX function, generate C, compile a
          shared library, load it, call; JAX: define, jit, first call (backend already started).
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

from ember.export.native import find_cxx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
CXX = find_cxx() or "g++"  # the compiler ember's first call uses ($CXX, else g++, else clang++): CasADi gets it too
CXX_FLAGS = ["-std=c++17", "-O2", "-march=native"]
STEPS = 10  # cart-pole RK4 steps
BRATU_SIZE, BRATU_LAMBDA = 1000, 1.0
ROSENBROCK_SIZE = 100
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
    limited: bool = False  # ember's version is the dense fallback: give its process a time limit


# ---- the models, written once per framework ----

def cartpole_inputs() -> list[np.ndarray]:
    return [np.array([0.0, 0.0, 0.2, 0.0]), 2.0 * np.cos(np.linspace(0.0, np.pi, STEPS))]


def ember_cartpole(with_jacobians: bool) -> tuple[list[Any], str]:
    import cartpole
    fns = cartpole.build_functions(STEPS, with_jacobians)
    if not with_jacobians: return fns, "rollout"
    return [cartpole.with_jacobians(fns)], "one function: rollout, jacobian(argnum=0), jacobian(argnum=1)"


def casadi_cartpole(ca: Any, with_jacobians: bool) -> Any:
    import cartpole
    state, controls = ca.SX.sym("state", 4), ca.SX.sym("controls", STEPS)
    final = ca.vertcat(*cartpole.simulate(tuple(state[i] for i in range(4)), [controls[k] for k in range(STEPS)],
                                          ca.sin, ca.cos))
    outs = [final, ca.jacobian(final, state), ca.jacobian(final, controls)] if with_jacobians else [final]
    return ca.Function("cartpole", [state, controls], outs)


def jax_cartpole(jax: Any, jnp: Any, with_jacobians: bool) -> Callable[..., Any]:
    """The rollout as a lax.scan over the controls: JAX's idiom for a loop. The unrolled Python loop (as ember and
    CasADi trace it) compiles in 20 s with jacobians and runs 4 to 10 times slower on XLA's CPU backend."""
    import cartpole

    def step(state: Any, force: Any) -> tuple[Any, None]:
        return jnp.stack(cartpole.rk4_step(tuple(state[i] for i in range(4)), force, jnp.sin, jnp.cos)), None

    def rollout(state: Any, controls: Any) -> Any: return jax.lax.scan(step, state, controls)[0]
    if not with_jacobians: return rollout
    return lambda state, controls: (rollout(state, controls), *jax.jacrev(rollout, argnums=(0, 1))(state, controls))


def bratu_terms(x: Any, left: Any, right: Any, exp: Callable[[Any], Any]) -> Any:
    """F_i = x_{i-1} - 2 x_i + x_{i+1} + h^2 lambda exp(x_i), with x_0 = x_{n+1} = 0 (left, right: the shifts)."""
    h = 1.0 / (BRATU_SIZE + 1)
    return left - 2.0 * x + right + h * h * BRATU_LAMBDA * exp(x)


def ember_bratu() -> tuple[list[Any], str]:
    import ember.ad
    from ember import Tensor
    from ember.export import Arg, NumericalFunction
    n = BRATU_SIZE
    f = NumericalFunction("bratu", lambda x: bratu_terms(x, x.pad((1, 0))[:n], x.pad((0, 1))[1:], Tensor.exp),
                          [Arg(n)])
    if hasattr(ember.ad, "spjacobian"): return [ember.ad.spjacobian(f)], "sparse: ember.ad.spjacobian"
    return [ember.ad.jacobian(f)], "dense: ember.ad.jacobian (no ember.ad.spjacobian)"


def casadi_bratu(ca: Any) -> Any:
    x = ca.SX.sym("x", BRATU_SIZE)
    residual = bratu_terms(x, ca.vertcat(0, x[:-1]), ca.vertcat(x[1:], 0), ca.exp)
    return ca.Function("bratu", [x], [ca.jacobian(residual, x)])


def jax_bratu(jax: Any, jnp: Any) -> Callable[..., Any]:
    return jax.jacfwd(lambda x: bratu_terms(x, jnp.pad(x[:-1], (1, 0)), jnp.pad(x[1:], (0, 1)), jnp.exp))


def rosenbrock_terms(head: Any, tail: Any) -> Any:
    return 100.0 * (tail - head * head) ** 2 + (1.0 - head) ** 2


def ember_rosenbrock() -> tuple[list[Any], str]:
    import ember.ad
    from ember.export import Arg, NumericalFunction
    f = NumericalFunction("rosenbrock", lambda x: rosenbrock_terms(x[:-1], x[1:]).sum(), [Arg(ROSENBROCK_SIZE)])
    if hasattr(ember.ad, "sphessian"): return [ember.ad.sphessian(f)], "sparse: ember.ad.sphessian"
    return [ember.ad.hessian(f)], "dense: ember.ad.hessian (no ember.ad.sphessian)"


def casadi_rosenbrock(ca: Any) -> Any:
    x = ca.SX.sym("x", ROSENBROCK_SIZE)
    return ca.Function("rosenbrock", [x], [ca.hessian(ca.sum1(rosenbrock_terms(x[:-1], x[1:])), x)[0]])


def jax_rosenbrock(jax: Any, jnp: Any) -> Callable[..., Any]:
    return jax.hessian(lambda x: jnp.sum(rosenbrock_terms(x[:-1], x[1:])))


def ember_energy() -> tuple[list[Any], str]:
    from ember.export import Arg, NumericalFunction
    return [NumericalFunction("energy", lambda x: (0.5 * x ** 2).sum(), [Arg(3)])], "energy"


def cases() -> list[Case]:
    has_sparse_jacobian = has_sparse_hessian = False
    try:
        import ember.ad
        has_sparse_jacobian, has_sparse_hessian = hasattr(ember.ad, "spjacobian"), hasattr(ember.ad, "sphessian")
    except ImportError: pass
    wave = 0.5 + 0.1 * np.sin(np.arange(BRATU_SIZE))
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


def time_native(folder: str, natives: Sequence[NativeCall]) -> list[float]:
    """Seconds per call of each, timed in turns by one compiled C++ loop (TIMING_MAIN)."""
    main = os.path.join(folder, "timing_main.cpp")
    lambdas = ", ".join("[&] {\n" + "\n".join(f"    {c}" for c in n.call) + "\n  }" for n in natives)
    with open(main, "w") as fh:
        fh.write(TIMING_MAIN.format(includes="\n".join(n.include for n in natives),
                                    body="\n".join(line for n in natives for line in n.setup), calls=lambdas))
    exe = os.path.join(folder, "timing")
    compile_cxx([main, *(src for n in natives for src in n.sources)], exe, [f"-I{os.path.dirname(n.sources[0])}"
                                                                            for n in natives])
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
    if any(hasattr(f, "colors") for f in fns): got["what"] += f" ({', '.join(str(f.colors) for f in fns)} colors)"
    np.savez(os.path.join(folder, "outputs.npz"), *outputs)  # for the check against CasADi
    print(json.dumps(got), flush=True)
    got["python"] = per_call(lambda: [f(*case.inputs) for f in fns])
    print(json.dumps(got), flush=True)
    natives = {}
    for kind, attribute in (("native", None), ("native_fma", FMA_KERNEL)):  # as exported; with FMAs allowed
        module = f"ember_{case.key.replace('-', '_')}" + ("_fma" if attribute else "")
        generate_module(module, fns, folder)
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
    compiled = ca.external(function.name(), library)
    compiled(*case.inputs)
    first = time.perf_counter() - start
    outputs = function(*case.inputs)
    outputs = [np.asarray(o.full()) for o in (outputs if isinstance(outputs, (tuple, list)) else [outputs])]
    python = per_call(lambda: function(*case.inputs))
    python_compiled = per_call(lambda: compiled(*case.inputs))
    fn = function.name()
    setup = [c_array(f"c_in{i}", a) for i, a in enumerate(case.inputs)]
    setup += ["  casadi_int n_arg, n_res, n_iw, n_w;", f"  {fn}_work(&n_arg, &n_res, &n_iw, &n_w);",
              "  std::vector<const double*> arg(n_arg);", "  std::vector<double*> res(n_res);",
              "  std::vector<casadi_int> iw(n_iw);", "  std::vector<double> w(n_w);",
              f"  {fn}_incref();", f"  const int mem = {fn}_checkout();"]
    setup += [f"  arg[{i}] = c_in{i};" for i in range(len(case.inputs))]
    for k in range(function.n_out()):
        setup += [f"  std::vector<double> c_out{k}({max(function.nnz_out(k), 1)});", f"  res[{k}] = c_out{k}.data();"]
    native = NativeCall([os.path.join(folder, f"{name}.cpp")], f'#include "{name}.h"', setup,
                        [f"{fn}(arg.data(), res.data(), iw.data(), w.data(), mem);"])
    return {"first": first, "python": python, "python_compiled": python_compiled, "native": native,
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
    parser.add_argument("--only", help="run one case: a, b-eval, b-jac, c or d")
    parser.add_argument("--dense-limit", type=float, default=30.0,
                        help="seconds for ember's process where it falls back to a dense derivative (default 30)")
    parser.add_argument("--ember-case", help=argparse.SUPPRESS)  # internal: measure one case's ember functions
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    by_key = {c.key: c for c in cases()}
    if opts.ember_case:
        measure_ember(by_key[opts.ember_case], opts.folder)
        return

    selected = [by_key[opts.only]] if opts.only else list(by_key.values())
    ca, jax, jnp, notes = load_peers()
    versions = [f"numpy {np.__version__}"] + ([f"casadi {ca.__version__}"] if ca else []) + \
        ([f"jax {jax.__version__}"] if jax else [])
    compiler = subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}; "
          f"{', '.join(versions)}; C++: {compiler} {' '.join(CXX_FLAGS)}")
    for note in notes: print(note)
    start = time.perf_counter()
    results = {case.key: measure_case(case, ca, jax, jnp, opts.dense_limit) for case in selected}
    report(selected, results)
    print(f"total {time.perf_counter() - start:.0f} s")


def measure_case(case: Case, ca: Any, jax: Any, jnp: Any, dense_limit: float) -> dict[str, dict[str, Any]]:
    """Every framework's measurements of one case; ember's in a process of its own."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench-{case.key}-") as folder:
        os.mkdir(ember_folder := os.path.join(folder, "ember"))
        got = {"ember": ember_in_fresh_process(case, dense_limit if case.limited else 600, ember_folder)}
        if ca is not None: got["casadi"] = measure_casadi(case, ca, folder)
        timed = [(fw, kind) for fw, kind in (("ember", "native"), ("ember", "native_fma"), ("casadi", "native"))
                 if kind in got.get(fw, {})]
        seconds = time_native(folder, [got[fw][kind] for fw, kind in timed])
        for (fw, kind), s in zip(timed, seconds, strict=True): got[fw]["cpp" + kind.removeprefix("native")] = s
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
                [row(c, [("ember", "cpp"), ("ember", "cpp_fma"), ("casadi", "cpp")]) for c in selected], 1e6, 3,
                ["ember", "ember+FMA", "CasADi"], [(0, 2), (1, 2)])
    print_table("First call, s (ember: fresh process, empty cache; its result, and its native code loaded)",
                [row(c, [("ember", "first"), ("ember", "native_ready"), ("casadi", "first"), ("jax", "first")])
                 for c in selected], 1, 2, ["ember", "ember-native", "CasADi", "JAX"], [(0, 2), (0, 3), (1, 2)])
    print("\nCasADi: its Function called from Python (SX virtual machine); CasADi-ext: the same compiled and loaded "
          "with casadi.external.")
    for case in selected:
        info = results[case.key]["ember"]
        told = "; ".join(info[k] for k in ("what", "error") if k in info and (k == "error" or case.key in ("c", "d")))
        print(f"ember, case {case.key}: {told + '; ' if told else ''}{agreement(results[case.key])}")

if __name__ == "__main__":
    main()
