"""ember.ad: vjp, jvp, gradient, jacobian and hessian against torch.func and against finite differences.

Every case is one function written twice, with ember Tensor ops and with torch ops (the same math). Each transform
of a case is a NumericalFunction (compiled to native code on its first call, cached on disk), built once per process
and shared by the tests that need it. Oracles: torch.func in float64 (to 1e-12, scaled by the largest entry) and
central differences of the ember function's own Python call (to 1e-6, scaled the same way).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import zlib
from collections.abc import Callable

import numpy as np
import pytest
import torch

from ember import Tensor, ad
from ember.errors import ShapeError
from ember.export import Arg, NumericalFunction, generate_module, render_module
from tests.helpers import Case, T, cpp_driver, scaled_error

RNG = np.random.default_rng(11)
A = RNG.standard_normal((3, 3))
B = RNG.standard_normal(3)
K = RNG.standard_normal(3) * 0.5
C23 = RNG.standard_normal((2, 3))
C43 = RNG.standard_normal((4, 3))
C32 = RNG.standard_normal((3, 2))
W = RNG.standard_normal((3, 4)) * 0.5
M5 = RNG.standard_normal(5) * 0.5
IDX = np.array([0, 3, 3, 5])  # a repeated index: its gradient adds up
W4 = RNG.standard_normal(4)
A_EMBER = Tensor(A)  # a realized Tensor captured by the closure, next to ones made inside it

TORCH_TOL = 1e-12
FD_TOL = 1e-6


# ---- the cases ---------------------------------------------------------------------------------------------------

def rk4(deriv: Callable, state: tuple, dt: float, steps: int) -> tuple:
    """Classical Runge-Kutta on a state kept as separate components; only + and *, so it runs on ember and torch
    tensors alike. (A state vector rebuilt by cat at every stage makes ember's generated code grow exponentially
    with the number of stages: see test_chained_cat_code_grows_linearly_with_the_chain.)"""
    def shift(base: tuple, slope: tuple, h: float) -> tuple: return tuple(b + d * h for b, d in zip(base, slope))
    for _ in range(steps):
        k1 = deriv(state)
        k2 = deriv(shift(state, k1, dt / 2))
        k3 = deriv(shift(state, k2, dt / 2))
        k4 = deriv(shift(state, k3, dt))
        state = tuple(s + (a + b * 2 + c * 2 + d) * (dt / 6) for s, a, b, c, d in zip(state, k1, k2, k3, k4))
    return state


def pendulum_energy(s, p):
    """A damped pendulum (theta, omega) = s with stiffness and damping p, 4 RK4 steps; its final energy."""
    stiffness, damping = p[0], p[1]
    theta, omega = rk4(lambda q: (q[1], -stiffness * q[0].sin() - damping * q[1]), (s[0], s[1]), 0.1, 4)
    return 0.5 * omega * omega + stiffness * (1 - theta.cos())


def cartpole_deriv(q: tuple, u) -> tuple:
    """A cart-pole (cart mass 1, pole mass 0.1, half length 0.5, g 9.8) pushed by force u."""
    _, velocity, theta, omega = q
    sin, cos = theta.sin(), theta.cos()
    temp = (u + 0.05 * omega * omega * sin) / 1.1
    alpha = (9.8 * sin - cos * temp) / (0.5 * (4 / 3 - 0.1 * cos * cos / 1.1))
    return velocity, temp - 0.05 * alpha * cos / 1.1, omega, alpha


def cartpole_ember(s, u):
    x, v, theta, omega = rk4(lambda q: cartpole_deriv(q, u), (s[0], s[1], s[2], s[3]), 0.05, 3)
    return x.stack(v, theta, omega)


def cartpole_torch(s, u):
    return torch.stack(rk4(lambda q: cartpole_deriv(q, u), (s[0], s[1], s[2], s[3]), 0.05, 3))


SCALAR_CASES = [
    Case("quadratic",
         lambda x: 0.5 * (x * (A_EMBER @ x)).sum() + (Tensor(B) * x).sum() + (Tensor(K) * x).exp().sum(),
         lambda x: 0.5 * (x * (T(A) @ x)).sum() + (T(B) * x).sum() + (T(K) * x).exp().sum(), ((3,),)),
    Case("reductions",
         lambda x: x.logsumexp(axis=1).sum() + x.max() * x.mean() + (x * 0.5 + 1).prod(axis=0).sum()
         + x.sum(axis=1).max() + (x * x).mean(axis=0).prod(),
         lambda x: x.logsumexp(1).sum() + x.max() * x.mean() + (x * 0.5 + 1).prod(0).sum()
         + x.sum(1).max() + (x * x).mean(0).prod(), ((2, 3),)),
    Case("slicing",
         lambda x: (x[1:] * x[:-1]).sum() + (x[::2] ** 3).sum() + (x[Tensor(IDX)].sin() * Tensor(W4)).sum()
         + x[-1] * x[2] + x[::-1][1:4].exp().sum(),
         lambda x: (x[1:] * x[:-1]).sum() + (x[::2] ** 3).sum() + (x[T(IDX)].sin() * T(W4)).sum()
         + x[-1] * x[2] + x.flip(0)[1:4].exp().sum(), ((6,),)),
    Case("two_inputs",
         lambda x, y: (y @ x).sin().sum() * x.sum() + (y.tanh() * Tensor(C23)).sum() * x[0] + (y * y).sum(),
         lambda x, y: (y @ x).sin().sum() * x.sum() + (y.tanh() * T(C23)).sum() * x[0] + (y * y).sum(),
         ((3,), (2, 3)), argnums=(0, 1, -1)),
    Case("libm",
         lambda x: (x.exp() * x.log()).sum() + (x.sin() * x.sqrt()).sum() + x.tanh().prod() + (x ** 2.5).sum()
         + x.pow(x[::-1]).sum(),
         lambda x: (x.exp() * x.log()).sum() + (x.sin() * x.sqrt()).sum() + x.tanh().prod() + (x ** 2.5).sum()
         + x.pow(x.flip(0)).sum(), ((4,),), low=0.5, high=2.0),
    Case("polar",
         lambda y, x: (y.atan2(x) * (x * x + y * y).sqrt()).sum() + x.atan2(y + 2).sum(),
         lambda y, x: (torch.atan2(y, x) * (x * x + y * y).sqrt()).sum() + torch.atan2(x, y + 2).sum(),
         ((3,), (3,)), argnums=(0, 1)),
    Case("where_maximum",
         lambda x: (x > 0.1).where(x * x, x.sin()).sum() + x.maximum(Tensor(M5)).sum() * x.sum()
         + x.minimum(0.2).exp().sum(),
         lambda x: torch.where(x > 0.1, x * x, x.sin()).sum() + torch.maximum(x, T(M5)).sum() * x.sum()
         + torch.minimum(x, torch.tensor(0.2, dtype=torch.float64)).exp().sum(), ((5,),)),
    Case("reshape_join",
         lambda x: (x.reshape(3, 2).T.cat(x.exp(), dim=0).tanh() * Tensor(C43)).sum()
         + (x[0].stack(x[1].sin(), dim=1) * Tensor(C32)).sum() * x.transpose(0, 1)[2, 1],
         lambda x: (torch.cat([x.reshape(3, 2).T, x.exp()], 0).tanh() * T(C43)).sum()
         + (torch.stack([x[0], x[1].sin()], dim=1) * T(C32)).sum() * x.transpose(0, 1)[2, 1], ((2, 3),)),
    Case("einsum_matmul",
         lambda x: Tensor.einsum("ij,ij->", (x @ Tensor(W)).tanh(), (x @ Tensor(W)).sin())
         + Tensor.einsum("ii->", Tensor.einsum("ij,kj->ik", x, x)) ** 2,
         lambda x: torch.einsum("ij,ij->", (x @ T(W)).tanh(), (x @ T(W)).sin())
         + torch.einsum("ii->", torch.einsum("ij,kj->ik", x, x)) ** 2, ((2, 3),)),
    Case("pendulum_rk4", pendulum_energy, pendulum_energy, ((2,), (2,)), argnums=(0, 1), low=0.2, high=1.5),
    Case("rosenbrock",
         lambda x: (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum(),
         lambda x: (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum(), ((5,),), low=-1.5, high=1.5),
    Case("scalar_0d",
         lambda x: x.sin() * x.exp() + x ** 3 + (x * x + 1).log(),
         lambda x: x.sin() * x.exp() + x ** 3 + (x * x + 1).log(), ((),)),
]

VECTOR_CASES = [
    Case("cartpole_rk4", cartpole_ember, cartpole_torch, ((4,), ()), argnums=(0, 1)),
    Case("gram_tanh", lambda x: (x.T @ x).tanh(), lambda x: (x.T @ x).tanh(), ((2, 3),)),  # 9 outputs > 6 inputs
    Case("rows_logsumexp", lambda x: (x * Tensor(C23)).logsumexp(axis=1) + x.max(axis=1) * x[:, 0],
         lambda x: (x * T(C23)).logsumexp(1) + x.amax(1) * x[:, 0], ((2, 3),)),  # 2 outputs < 6 inputs
]

CASES = {c.name: c for c in SCALAR_CASES + VECTOR_CASES}


@functools.cache
def base(name: str) -> NumericalFunction:
    case = CASES[name]
    return NumericalFunction(name, case.ember, [Arg(s) for s in case.shapes])


@functools.cache
def derived(name: str, kind: str, argnum: int) -> NumericalFunction:
    return getattr(ad, kind)(base(name), argnum)


# ---- the oracles -------------------------------------------------------------------------------------------------

def extra_input(case: Case, kind: str, argnum: int, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The cotangent of a vjp (output-shaped) or the tangent of a jvp (argument-shaped); nothing otherwise."""
    rng = np.random.default_rng(zlib.crc32(f"{case.name}-{kind}-{argnum}".encode()))
    if kind == "vjp": return [rng.standard_normal(base(case.name).output_shapes[0])]
    if kind == "jvp": return [rng.standard_normal(inputs[argnum].shape)]
    return []


def torch_results(case: Case, kind: str, argnum: int, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """What torch.func computes for this transform, by name (a jacobian both by jacrev and jacfwd)."""
    args = [T(a.copy()) for a in inputs]
    extra = [T(e) for e in extra_input(case, kind, argnum, inputs)]
    func, argnum = torch.func, argnum % len(inputs)  # torch 2.13's hessian gets argnums=-1 wrong (all zeros)
    def partial(x):
        return case.torch(*[x if i == argnum else a for i, a in enumerate(args)])
    if kind == "gradient": out = {"grad": func.grad(case.torch, argnums=argnum)(*args)}
    elif kind == "hessian": out = {"hessian": func.hessian(case.torch, argnums=argnum)(*args)}
    elif kind == "jacobian": out = {"jacrev": func.jacrev(case.torch, argnums=argnum)(*args),
                                    "jacfwd": func.jacfwd(case.torch, argnums=argnum)(*args)}
    elif kind == "vjp": out = {"vjp": func.vjp(partial, args[argnum])[1](extra[0])[0]}
    else: out = {"jvp": func.jvp(partial, (args[argnum],), (extra[0],))[1]}
    return {k: v.detach().numpy() for k, v in out.items()}


def fd_jacobian(call: Callable, inputs: list[np.ndarray], argnum: int, step: float = 1e-5) -> np.ndarray:
    """d call / d inputs[argnum] by central differences, of shape output.shape + argument.shape."""
    x = inputs[argnum]
    out_shape = np.shape(call(*inputs))
    jac = np.zeros(out_shape + (x.size,))
    for j in range(x.size):
        h = step * max(1.0, abs(x.flat[j]))
        plus, minus = x.copy(), x.copy()
        plus.flat[j] += h
        minus.flat[j] -= h
        args_plus = [plus if i == argnum else a for i, a in enumerate(inputs)]
        args_minus = [minus if i == argnum else a for i, a in enumerate(inputs)]
        jac[..., j] = (np.asarray(call(*args_plus)) - np.asarray(call(*args_minus))) / (2 * h)
    return jac.reshape(out_shape + x.shape)


def finite_difference(case: Case, kind: str, argnum: int, inputs: list[np.ndarray]) -> np.ndarray:
    """The transform from central differences of ember's own calls (a hessian: of ember's gradient)."""
    f, a = base(case.name), argnum % len(inputs)
    if kind == "hessian": return fd_jacobian(derived(case.name, "gradient", argnum), inputs, a)
    if kind == "jvp":
        v, h = extra_input(case, kind, argnum, inputs)[0], 1e-5
        shifted = [[x + sign * h * v if i == a else x for i, x in enumerate(inputs)] for sign in (1, -1)]
        return (np.asarray(f(*shifted[0])) - np.asarray(f(*shifted[1]))) / (2 * h)
    jac = fd_jacobian(f, inputs, a)
    if kind == "vjp":
        u = extra_input(case, kind, argnum, inputs)[0]
        return np.tensordot(u, jac, axes=u.ndim)
    return jac


# ---- each transform against torch.func and finite differences ----------------------------------------------------

TRANSFORMS = [(c.name, kind, a) for c in SCALAR_CASES for kind in ("gradient", "hessian", "jacobian", "vjp", "jvp")
              for a in c.argnums]
TRANSFORMS += [(c.name, kind, a) for c in VECTOR_CASES for kind in ("jacobian", "vjp", "jvp") for a in c.argnums]


@pytest.mark.parametrize("name, kind, argnum", TRANSFORMS, ids=[f"{n}-{k}-{a}" for n, k, a in TRANSFORMS])
def test_transform_matches_torch_func_and_finite_differences(name, kind, argnum):
    case = CASES[name]
    inputs = case.inputs()
    g = derived(name, kind, argnum)
    got = g(*inputs, *extra_input(case, kind, argnum, inputs))
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    for oracle, want in torch_results(case, kind, argnum, inputs).items():
        err = scaled_error(got, want)
        assert err < TORCH_TOL, f"{kind} vs torch.func {oracle}: scaled error {err:.3g}\n{got}\n{want}"
    err = scaled_error(got, finite_difference(case, kind, argnum, inputs))
    assert err < FD_TOL, f"{kind} vs central differences: scaled error {err:.3g}"


@pytest.mark.parametrize("kind", ["gradient", "hessian", "jacobian", "vjp", "jvp"])
def test_transforms_have_the_documented_signature(kind):
    f = base("two_inputs")
    g = derived("two_inputs", kind, 1)
    out_shape, arg_shape = f.output_shapes[0], f.args[1].shape
    extra = {"vjp": [out_shape], "jvp": [arg_shape]}.get(kind, [])
    assert [a.shape for a in g.args] == [a.shape for a in f.args] + extra
    assert all(a.dtype.name == "float64" for a in g.args) and len(g.output_shapes) == 1
    want = {"gradient": arg_shape, "hessian": arg_shape * 2, "jacobian": out_shape + arg_shape, "vjp": arg_shape,
            "jvp": out_shape}[kind]
    assert g.output_shapes[0] == want


def test_negative_argnum_is_the_same_transform_as_its_positive():
    inputs = CASES["two_inputs"].inputs()
    for kind in ("gradient", "hessian", "jacobian"):
        np.testing.assert_array_equal(derived("two_inputs", kind, -1)(*inputs), derived("two_inputs", kind, 1)(*inputs))


# ---- compositions ------------------------------------------------------------------------------------------------

def test_hessian_of_a_function_with_constants_is_exact():
    """0.5 x.Ax + b.x + sum exp(k x) has the hessian (A + A^T)/2 + diag(k^2 exp(k x))."""
    x = CASES["quadratic"].inputs()[0]
    want = (A + A.T) / 2 + np.diag(K * K * np.exp(K * x))
    assert scaled_error(derived("quadratic", "hessian", 0)(x), want) < 1e-14


@pytest.mark.parametrize("name, argnum", [("two_inputs", 1), ("pendulum_rk4", 0)])
def test_jacobian_of_the_gradient_is_the_hessian(name, argnum):
    inputs = CASES[name].inputs()
    jac_of_grad = ad.jacobian(derived(name, "gradient", argnum), argnum)
    np.testing.assert_array_equal(jac_of_grad(*inputs), derived(name, "hessian", argnum)(*inputs))


def sin_of_scaled_head(n: int) -> NumericalFunction:
    """sum(sin(x[:n] * x[n])): its gradient pads d/dx[n], a sum of n terms, into the last of n + 1 elements."""
    return NumericalFunction(f"sin_of_scaled_head_{n}", lambda x: (x[:n] * x[n]).sin().sum(), [Arg(n + 1)])


def executed_ops(f: NumericalFunction) -> int:
    """ALU ops one call of f's native code executes: each kernel's ops times the trip counts of their loops."""
    from ember.codegen import get_program
    from ember.export.cpp import CppRenderer
    return sum(get_program(item.ast, CppRenderer()).flops for item in f.plan.items)


@pytest.mark.parametrize("n", [8, 100, 400])
def test_gradient_with_a_sum_padded_into_one_element_is_linear_in_its_size(n):
    """d/dx[n] of sum(sin(x[:n] * x[n])) is sum(cos(x[:n] * x[n]) * x[:n]), padded into the gradient's last element:
    computed once (a kernel of its own), not once per element of the gradient's loop (O(n^2): 27 ms a call at
    n = 1600, now 27 us). Small, the gradient stays one unrolled kernel, where the padding folds away."""
    grad = ad.gradient(sin_of_scaled_head(n))
    x = np.random.default_rng(n).uniform(-1, 1, n + 1)
    c = np.cos(x[:n] * x[n])
    np.testing.assert_allclose(grad(x), np.append(c * x[n], (c * x[:n]).sum()), rtol=1e-13, atol=1e-15)
    assert len(grad.plan.items) == (1 if n == 8 else 2)
    if n > 8:
        double = ad.gradient(sin_of_scaled_head(2 * n))
        assert executed_ops(double) < 2.2 * executed_ops(grad)  # linear: 2x the ops for twice the size (it was 4x)


def test_mixed_second_derivative_matches_torch():
    """d/dy (df/dx): the jacobian of the gradient in x, taken with respect to the other argument."""
    case = CASES["two_inputs"]
    inputs = case.inputs()
    got = ad.jacobian(derived("two_inputs", "gradient", 0), 1)(*inputs)
    want = torch.func.jacrev(torch.func.grad(case.torch, argnums=0), argnums=1)(*(T(a) for a in inputs))
    assert got.shape == (3, 2, 3) and scaled_error(got, want.numpy()) < TORCH_TOL


@functools.cache
def vjp_in_force() -> NumericalFunction:
    """(state, u, w) -> w . d final_state / du: a scalar, so gradient applies to it."""
    return derived("cartpole_rk4", "vjp", 1)


def test_gradient_of_a_vjp_matches_torch_and_the_jvp():
    case = CASES["cartpole_rk4"]
    state, u = case.inputs()
    w = np.random.default_rng(3).standard_normal(4)
    by_state = ad.gradient(vjp_in_force(), 0)(state, u, w)
    def torch_vjp(s, w):
        return torch.func.vjp(lambda force: case.torch(s, force), T(u))[1](w)[0]
    want = torch.func.grad(torch_vjp, argnums=0)(T(state), T(w)).numpy()
    assert scaled_error(by_state, want) < TORCH_TOL
    assert scaled_error(by_state, fd_jacobian(vjp_in_force(), [state, u, w], 0)) < FD_TOL
    by_cotangent = ad.gradient(vjp_in_force(), -1)(state, u, w)  # w -> w . J is linear: its gradient is J = jvp(1)
    np.testing.assert_allclose(by_cotangent, derived("cartpole_rk4", "jvp", 1)(state, u, np.array(1.0)),
                               rtol=1e-14, atol=1e-15)


# ---- export: the derivatives as C++ --------------------------------------------------------------------------------

CXX = shutil.which("g++")
FLAGS = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror"]


@pytest.mark.skipif(CXX is None, reason="needs g++ (apt-get install g++)")
def test_exported_derivatives_compile_strictly_and_match_python_bit_for_bit(tmp_path):
    picks = [("quadratic", "hessian", 0), ("slicing", "gradient", 0), ("two_inputs", "vjp", 1),
             ("cartpole_rk4", "jvp", 1), ("gram_tanh", "jacobian", 0), ("scalar_0d", "hessian", 0)]
    fns = [derived(*p) for p in picks] + [ad.gradient(vjp_in_force(), 0)]  # a derivative of a derivative
    inputs = [CASES[n].inputs() + extra_input(CASES[n], k, a, CASES[n].inputs()) for n, k, a in picks]
    inputs.append(CASES["cartpole_rk4"].inputs() + [np.random.default_rng(3).standard_normal(4)])
    fns.append(with_jacobians("cartpole_rk4"))  # three outputs of one kernel
    inputs.append(CASES["cartpole_rk4"].inputs())
    generate_module("derivs", fns, str(tmp_path))
    (tmp_path / "main.cpp").write_text(cpp_driver("derivs", fns, inputs))
    exe = tmp_path / "main"
    build = subprocess.run([CXX, *FLAGS, "-o", str(exe), str(tmp_path / "derivs.cpp"), str(tmp_path / "main.cpp")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    expected = [float(v).hex() for f, args in zip(fns, inputs)
                for out in (lambda o: o if isinstance(o, tuple) else (o,))(f(*args)) for v in out.reshape(-1)]
    assert [float.fromhex(p).hex() for p in printed] == expected  # -0.0 and 0.0 differ here


def with_jacobians(name: str) -> NumericalFunction:
    """The function with its jacobians by each argument, all traced in one function."""
    fns = [base(name)] + [derived(name, "jacobian", a) for a in range(len(CASES[name].shapes))]
    return NumericalFunction(f"{name}_with_jacobians", lambda *xs: tuple(f(*xs) for f in fns), base(name).args)


def test_a_function_with_its_jacobians_is_one_kernel_equal_to_the_separate_functions():
    """Traced together, the rollout and its two jacobians are one straight-line kernel (the rollout they share is
    computed once) and give bit for bit what the three functions give."""
    both = with_jacobians("cartpole_rk4")
    assert len(both.plan.items) == 1 and both.plan.items[0].outs == 3
    inputs = CASES["cartpole_rk4"].inputs()
    separate = [base("cartpole_rk4")(*inputs)] + [derived("cartpole_rk4", "jacobian", a)(*inputs) for a in (0, 1)]
    for got, want in zip(both(*inputs), separate, strict=True): np.testing.assert_array_equal(got, want)


def test_a_derivative_is_traced_when_first_needed():
    """A transform checks its input at once but traces when first needed: a derivative used only inside another
    function is never traced on its own (fn runs once for f, once per use of it inside `both`)."""
    runs = []
    def fn(x: Tensor) -> Tensor:
        runs.append(x.shape)
        return (x * x * x).sum()
    f = NumericalFunction("cube", fn, [Arg(3)])
    grad = ad.gradient(f)
    assert len(runs) == 1
    both = NumericalFunction("both", lambda x: (f(x), grad(x)), f.args)
    assert len(runs) == 3
    x = np.array([1.0, -2.0, 0.5])
    value, slope = both(x)
    np.testing.assert_allclose(value, (x ** 3).sum(), rtol=1e-15)
    np.testing.assert_allclose(slope, 3 * x ** 2, rtol=1e-15)
    assert len(runs) == 3
    assert grad.output_shapes == [(3,)] and len(runs) == 4  # its own trace, now that something asks for it


def test_a_function_named_like_the_libm_function_it_calls_compiles():
    f = NumericalFunction("sin", lambda x: x.sin(), [Arg(3)])  # found as ember.ad's case "atan2" (which calls atan2)
    x = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(f(x), np.sin(x), rtol=1e-15)


# ---- cost of the generated code ------------------------------------------------------------------------------------

def chained_cat(steps: int, is_contiguous: bool) -> Callable:
    """q -> q' = (q[1], sin(q[0]) + q[1]) `steps` times, each step a cat (as an integrator stage builds its state)."""
    def fn(q):
        for _ in range(steps):
            q = q[1:2].cat(q[0:1].sin() + q[1:2], dim=0)
            if is_contiguous: q = q.contiguous()
        return q.sum()
    return fn


@pytest.mark.parametrize("kind", [
    "forward",
    "gradient_of_contiguous_steps"])
def test_chained_cat_code_grows_linearly_with_the_chain(kind):
    """Each step has one sin and (in the backward pass) one cos, so 5 steps need at most a few of each per output.
    Measured: the forward kernel has 23 sin calls (1, 3, 7, 13, 23, 39, 65 for 1..7 steps); with .contiguous()
    after every step the forward is fine, but its gradient has 23 sin/cos calls again, and 10 steps of it take a
    minute to compile. A 4-step RK4 written this way does not finish."""
    steps = 5
    f = NumericalFunction("chain", chained_cat(steps, kind != "forward"), [Arg(2)])
    if kind != "forward": f = ad.gradient(f)
    source = render_module("chain_module", [f])[1]
    assert source.count("sin(") + source.count("cos(") <= 4 * steps


# ---- errors --------------------------------------------------------------------------------------------------------

def test_gradient_and_hessian_of_a_non_scalar_raise_shape_error():
    for transform in (ad.gradient, ad.hessian):
        with pytest.raises(ShapeError, match=r"gradient: gram_tanh must return one scalar.*\(3, 3\)"):
            transform(base("gram_tanh"))


@pytest.mark.parametrize("kind", ["gradient", "hessian", "jacobian", "vjp", "jvp"])
@pytest.mark.parametrize("argnum", [2, -3, 7])
def test_argnum_out_of_range_raises_index_error_naming_it(kind, argnum):
    with pytest.raises(IndexError, match=f"argnum {argnum} is out of range for two_inputs, which takes 2 arguments"):
        getattr(ad, kind)(base("two_inputs"), argnum)


@pytest.mark.parametrize("kind", ["gradient", "hessian", "jacobian", "vjp", "jvp"])
@pytest.mark.parametrize("argnum", ["x", 1.0, True])
def test_argnum_that_is_not_an_int_raises_type_error_naming_it(kind, argnum):
    with pytest.raises(TypeError, match=r"(gradient|jvp|vjp|jacobian): argnum must be an int"):
        getattr(ad, kind)(base("two_inputs"), argnum)


@pytest.mark.parametrize("argnum, error", [((0, 0), ValueError), ((), ValueError), ((0, 5), IndexError),
                                           (("a",), TypeError)])
def test_jacobian_by_several_arguments_rejects_bad_argnums(argnum, error):
    with pytest.raises(error, match="jacobian: argnum"):
        ad.jacobian(base("two_inputs"), argnum)


@pytest.mark.parametrize("kind", ["gradient", "hessian", "jacobian", "vjp", "jvp"])
def test_integer_argument_raises_type_error(kind):
    f = NumericalFunction("scaled_by_count", lambda x, n: (x * n).sum(), [Arg(3), Arg(3, "int64")])
    with pytest.raises(TypeError, match="argument 1 of scaled_by_count is int64; derivatives need floats"):
        getattr(ad, kind)(f, 1)
    assert isinstance(getattr(ad, kind)(f, 0), NumericalFunction)  # the float argument is fine
