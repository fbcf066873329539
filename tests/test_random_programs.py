"""Random programs of Tensor ops, run in ember and in torch and compared: a seeded fuzzer of the Tensor API.

`Program(seed)` builds a program of 3 to 8 random ops (3 to 6 in the default run) on one to three inputs: elementwise
ops with broadcasting, reductions (sum/mean/max/min/prod/logsumexp/var/std, dims and keepdim), movement ops (reshape,
permute, transpose, expand, pad in every mode, shrink, flip, roll, repeat, squeeze, cat, stack), basic and advanced
indexing, gather, index_select, setitem on non-leaf tensors, sort/argsort/topk/cummax/cummin followed by movement
ops, cumsum, softmax, matmul, clone, and reading a value midway. Every step is one line of ember code and one line of
torch code, run with exec on both sides: what a failure prints is what ran. Float programs run in float32 in ember
against torch in float64: every value the program made, then the gradient of every leaf for a weighted sum of the
output. Integer programs run in int32 on both sides and are compared exactly, as are all indices.

torch runs eagerly, so the generator looks at the values it has made: it keeps magnitudes bounded, puts the kinks of
relu/abs/clamp/maximum/where away from the data (no non-differentiable point), and makes values distinct before
sort, topk, cummax or max (no ties, so indices and gradients are defined). Index tensors are literals or indices the
program made (argsort of a value, then gather with it).

To replay a failure: the message names `run_program(seed, max_depth)` and prints both programs; the ember lines run
as printed after `from tests.test_random_programs import *`.
"""

from __future__ import annotations

import math
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ember import Tensor
from ember.helpers import Context

NUMEL_MAX = 240  # the largest tensor a program makes
MAGNITUDE_MAX = 40.0  # a float value larger than this is scaled down before the next op; ints are taken mod 97
KINK_MARGIN = 1e-3  # how far the data stays from a kink (relu, abs, clamp, maximum, where) and from a tie
VALUE_TOL = {"rtol": 1e-4, "atol": 1e-5}  # float32 against float64; atol is scaled by the largest |value|
GRAD_TOL = {"rtol": 1e-3, "atol": 1e-4}
DEFAULT_SEEDS = range(100)
DEFAULT_MAX_DEPTH = 6  # the default run's programs have 3 to 6 ops (the slow test's 3 to 8): fewer kernels to compile
SLOW_SEEDS = range(1000, 2000)  # the slow test's 1,000 programs, SLOW_CHUNK to a test
SLOW_CHUNK = 50

# Op variants a known ember bug makes fail; the generator does not draw them (the repro is in the comment).
KNOWN_BUGS: set[str] = set()  # "read_then_backward" was here until Tensor.realize kept the graph of a tensor that
# carries a gradient (reading x.clone() cut it from x, and backward found no tensor that requires grad)


# ---- inputs: numpy arrays from a seed, so that a printed program runs as it is -------------------------------------


def leaf(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Distinct float32 values in about [-2, 2], at least 2/n apart (n elements): no ties for sort or max."""
    n = math.prod(shape)
    rng = np.random.default_rng(seed)
    spread = (rng.permutation(n) - (n - 1) / 2) * (4 / n) + rng.uniform(-1, 1, n) / n
    return spread.astype(np.float32).reshape(shape)


def ints(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """int32 values in [-20, 20] (ties allowed)."""
    return np.random.default_rng(seed).integers(-20, 21, shape).astype(np.int32)


def perm(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A shuffled ramp of float32 values 4/n apart around 0: added to tanh(x) / n it makes any x distinct."""
    n = math.prod(shape)
    ramp = (np.random.default_rng(seed).permutation(n) - (n - 1) / 2) * (4 / n)
    return ramp.astype(np.float32).reshape(shape)


def weights(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The fixed weights of the scalar whose gradient is compared."""
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def f64(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a).double()


# ---- the generator ---------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Value:
    """A tensor the program made: `name` holds it in both namespaces (the ember one and the torch one)."""
    name: str
    shape: tuple[int, ...]
    is_int: bool
    is_leaf: bool = False  # requires grad (a float input)
    is_input: bool = False  # made from numpy or a literal: not compared
    ends_in_copy: bool = False  # setitem wrote it, or clone/contiguous made it

    @property
    def ndim(self) -> int: return len(self.shape)

    @property
    def numel(self) -> int: return math.prod(self.shape)


class TorchRaised(Exception):
    """The torch side of a step raised: a bug of the generator, not of ember."""


class Mismatch(AssertionError):
    """ember's result differs from torch's."""


class EmberRaised(Exception):
    """The ember side of a step raised."""


def compare(what: str, ours: np.ndarray, theirs: np.ndarray, tol: dict[str, float]) -> None:
    """Integers exactly; floats within tol, atol scaled by the largest |value| (float32 against float64)."""
    if theirs.dtype.kind in "biu":
        if not np.array_equal(ours, theirs):
            raise Mismatch(f"{what} differs (exact):\nember {ours.tolist()}\ntorch {theirs.tolist()}")
        return
    scale = max(1.0, float(np.abs(theirs).max())) if theirs.size else 1.0
    if not np.allclose(ours, theirs, rtol=tol["rtol"], atol=tol["atol"] * scale, equal_nan=True):
        worst = float(np.max(np.abs(ours - theirs)))
        raise Mismatch(f"{what} differs (max abs error {worst:.3g}):\nember {np.round(ours, 6).tolist()}\n"
                       f"torch {np.round(theirs, 6).tolist()}")


def fmt_slice(s: slice) -> str:
    text = f"{'' if s.start is None else s.start}:{'' if s.stop is None else s.stop}"
    return text + (f":{s.step}" if s.step is not None else "")


def fmt_key(key: list[Any]) -> str:
    parts = []
    for k in key:
        if isinstance(k, slice): parts.append(fmt_slice(k))
        elif k is None: parts.append("None")
        elif k is Ellipsis: parts.append("...")
        elif isinstance(k, Value): parts.append(k.name)
        else: parts.append(str(k))
    return ", ".join(parts) if parts else "..."


OpFn = Callable[["Program", Value], "Value | None"]


class Program:
    """A random program built from `seed`: ember and torch run each step as it is made."""

    def __init__(self, seed: int, max_depth: int = 8) -> None:
        self.seed, self.max_depth = seed, max_depth
        self.rng = random.Random(seed)
        self.is_int = self.rng.random() < 0.25
        self.theme = self.rng.choice(list(THEMES))
        self.lines: list[tuple[str, str]] = []
        helpers = {"leaf": leaf, "ints": ints, "perm": perm, "weights": weights, "np": np}
        self.ours: dict[str, Any] = {"Tensor": Tensor, **helpers}
        self.theirs: dict[str, Any] = {"torch": torch, "F": F, "f64": f64, **helpers}
        self.values: list[Value] = []
        self.latest: Value | None = None  # the value of the program's kind made or written last: the output
        self.leaves: list[Value] = []

    # ---- running steps ----

    def text(self) -> str:
        width = max((len(o) for o, _ in self.lines), default=0)
        return "\n".join(f"    {o:<{width}}  # torch: {t}" for o, t in self.lines)

    def run(self, ours: str, theirs: str) -> None:
        """One statement on both sides; torch first (if it raises, the generator is wrong)."""
        self.lines.append((ours, theirs))
        try: exec(theirs, self.theirs)
        except Exception as e: raise TorchRaised(f"{type(e).__name__}: {e}") from e
        try: exec(ours, self.ours)
        except Exception as e:
            raise EmberRaised(f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}") from e

    def let(self, ours: str, theirs: str | None = None, *, is_int: bool | None = None, **flags: bool) -> Value:
        """name = expr on both sides; the shapes must agree at once (ember knows shapes without running)."""
        name = f"v{len(self.values)}"
        self.run(f"{name} = {ours}", f"{name} = {ours if theirs is None else theirs}")
        return self.register(name, is_int, **flags)

    def let2(self, ours: str, theirs: str | None = None) -> tuple[Value, Value]:
        """values, indices = expr (max/min over an int dim, sort, topk, cummax, cummin)."""
        a, b = f"v{len(self.values)}", f"v{len(self.values) + 1}"
        self.run(f"{a}, {b} = {ours}", f"{a}, {b} = {ours if theirs is None else theirs}")
        return self.register(a, None), self.register(b, True)

    def register(self, name: str, is_int: bool | None, **flags: bool) -> Value:
        theirs, ours = self.theirs[name], self.ours[name]
        if not isinstance(ours, Tensor): raise Mismatch(f"{name}: ember gave a {type(ours).__name__}, not a Tensor")
        shape = tuple(theirs.shape)
        if tuple(ours.shape) != shape: raise Mismatch(f"{name}: shape: ember {tuple(ours.shape)}, torch {shape}")
        value = Value(name, shape, not theirs.is_floating_point() if is_int is None else is_int, **flags)
        self.values.append(value)
        if value.is_int == self.is_int and not value.is_input: self.latest = value
        return value

    def torch_value(self, v: Value) -> torch.Tensor: return self.theirs[v.name].detach()

    def magnitude(self, v: Value) -> float:
        return float(self.torch_value(v).abs().max()) if v.numel else 0.0

    # ---- choices ----

    def size(self) -> int: return self.rng.choice([1, 2, 2, 3, 3, 4, 5, 6])

    def shape(self) -> tuple[int, ...]:
        while True:
            shape = tuple(self.size() for _ in range(self.rng.choice([0, 1, 2, 2, 3, 3, 3, 4])))
            if math.prod(shape) <= NUMEL_MAX // 2: return shape

    def sub_seed(self) -> int: return self.rng.randrange(10**6)

    def new_leaf(self, shape: tuple[int, ...], requires_grad: bool = True) -> Value:
        s = self.sub_seed()
        if self.is_int:
            return self.let(f"Tensor(ints({shape}, {s}))", f"torch.from_numpy(ints({shape}, {s}))", is_int=True,
                            is_input=True)
        if not requires_grad:
            return self.let(f"Tensor(leaf({shape}, {s}))", f"f64(leaf({shape}, {s}))", is_input=True)
        v = self.let(f"Tensor(leaf({shape}, {s}), requires_grad=True)",
                     f"f64(leaf({shape}, {s})).requires_grad_()", is_leaf=True, is_input=True)
        self.leaves.append(v)
        return v

    def pick(self, accept: Callable[[Value], bool] = lambda v: True, *, is_int: bool | None = None) -> Value | None:
        """A value of the program's kind (or `is_int`), the newest one more often than not."""
        want = self.is_int if is_int is None else is_int
        found = [v for v in self.values if v.is_int == want and accept(v)]
        if not found: return None
        return found[-1] if self.rng.random() < 0.5 else self.rng.choice(found)

    def dim(self, v: Value, *, extra: int = 0) -> int:
        """A dim of v (of v with `extra` more axes), as often negative as not."""
        n = v.ndim + extra
        d = self.rng.randrange(n)
        return d - n if self.rng.random() < 0.3 else d

    def margin_constant(self, data: torch.Tensor, choices: list[float]) -> float | None:
        """A constant c from `choices` that no element of data comes within KINK_MARGIN of."""
        for c in self.rng.sample(choices, len(choices)):
            if data.numel() == 0 or float((data - c).abs().min()) > KINK_MARGIN: return c
        return None

    def is_distinct(self, v: Value) -> bool:
        data = self.torch_value(v).flatten().sort().values.double()
        if data.numel() < 2: return True
        return float((data[1:] - data[:-1]).min()) > KINK_MARGIN * max(1.0, self.magnitude(v))

    def distinct(self, v: Value) -> Value:
        """v itself if its elements are far apart, else tanh(v)/n + a shuffled ramp: distinct, and differentiable."""
        if v.is_int or self.is_distinct(v): return v
        s, n = self.sub_seed(), max(v.numel, 1)
        return self.let(f"{v.name}.tanh() * {1 / n:.6g} + Tensor(perm({v.shape}, {s}))",
                        f"{v.name}.tanh() * {1 / n:.6g} + f64(perm({v.shape}, {s}))")

    def tame(self, v: Value) -> Value:
        """v scaled down (floats) or taken mod 97 (ints) when it has grown large."""
        m = self.magnitude(v)
        if v.is_int: return self.let(f"{v.name} % 97", is_int=True) if m > 2000 else v
        if m <= MAGNITUDE_MAX: return v
        return self.let(f"{v.name} * {10.0 ** -math.ceil(math.log10(m / 4)):g}")

    def allowed(self, variant: str) -> bool: return variant not in KNOWN_BUGS

    # ---- building ----

    def build(self) -> Program:
        for _ in range(self.rng.choice([1, 1, 2, 3])): self.new_leaf(self.shape())
        names, weights_ = zip(*THEMES[self.theme].items())
        steps, attempts = 0, 0
        depth = self.rng.randint(3, self.max_depth)
        while steps < depth and attempts < 60:
            attempts += 1
            op = self.rng.choices(names, weights_)[0]
            a = self.pick()
            if a is None: continue
            if OPS[op](self, self.tame(a)) is not None: steps += 1
        return self

    def output(self) -> Value:
        return self.latest or [v for v in self.values if v.is_int == self.is_int][-1]

    # ---- comparing ----

    def check(self) -> int:
        """Compare every value the program made (inputs aside) and the leaves' gradients of a weighted sum of the
        output; return how many tensors were compared.

        ember computes them all as one flat tensor (`checked`, one realize: few kernels to compile), which is cut
        into its parts and compared with each torch tensor (programs also read values midway, before backward)."""
        out = self.output()
        parts: list[tuple[str, Tensor, torch.Tensor, dict[str, float]]] = []
        for v in self.values:
            if v.is_input: continue
            parts.append((f"value {v.name}", f"{v.name}", self.theirs[v.name].detach(), VALUE_TOL))
        if not self.is_int and self.theirs[out.name].requires_grad:
            s = self.sub_seed()
            self.run(f"loss = ({out.name} * Tensor(weights({out.shape}, {s}))).sum()",
                     f"loss = ({out.name} * f64(weights({out.shape}, {s}))).sum()")
            self.run("loss.backward()", "loss.backward()")
            for v in self.leaves:
                theirs = self.theirs[v.name].grad
                if self.ours[v.name].grad is None and theirs is None: continue
                if self.ours[v.name].grad is None: raise Mismatch(f"{v.name}.grad: ember None, torch {theirs}")
                if theirs is None: theirs = torch.zeros(v.shape, dtype=torch.float64)
                parts.append((f"{v.name}.grad", f"{v.name}.grad", theirs, GRAD_TOL))
        for what, ours, theirs, _ in parts:
            ours_dtype, theirs_dtype = eval(ours, self.ours).dtype.name, str(theirs.dtype).removeprefix("torch.")
            if ours_dtype != ("float32" if theirs_dtype == "float64" else theirs_dtype):
                raise Mismatch(f"{what}: dtype: ember {ours_dtype}, torch {theirs_dtype}")
        if not parts: return 0
        cast = ".long()" if self.is_int else ".float()"
        self.run(f"checked = Tensor.cat({', '.join(f'{o}.flatten(){cast}' for _, o, _, _ in parts)})", "pass")
        flat, offset = self.ours["checked"].numpy(), 0
        for what, _, theirs, tol in parts:
            got = flat[offset:offset + theirs.numel()].reshape(tuple(theirs.shape))
            offset += theirs.numel()
            compare(what, got, theirs.numpy(), tol)
        return len(parts)

    def release(self) -> None:
        """Take the leaves out of ember's registry of tensors that require grad (it is global)."""
        for v in self.leaves: self.ours[v.name].requires_grad_(False)


# ---- ops: each takes the program and an operand, emits one or more steps and returns the result (None: does not
# apply to this operand, nothing emitted) ------------------------------------------------------------------------------

# (ember, torch or None for the same text, the largest |x| the op takes)
FLOAT_UNARY = [
    ("-{a}", None, math.inf), ("({a} * 0.5).exp()", None, 6), ("{a}.tanh()", None, math.inf),
    ("{a}.sigmoid()", None, math.inf), ("{a}.sin()", None, math.inf), ("{a}.cos()", None, math.inf),
    ("{a}.square()", None, 6), ("({a}.square() + 1).log()", None, math.inf),
    ("({a}.square() + 0.5).sqrt()", None, math.inf), ("({a}.square() + 1).reciprocal()", None, math.inf),
    ("({a}.square() + 1).pow(0.75)", None, math.inf), ("{a}.erf()", None, math.inf), ("{a}.atan()", None, math.inf),
    ("{a}.silu()", "F.silu({a})", math.inf), ("{a}.softplus()", "F.softplus({a})", math.inf),
    ("({a} * 0.3).expm1()", None, 10), ("{a}.square().log1p()", None, math.inf), ("{a} * 1.7 - 0.3", None, math.inf),
    ("0.5 - {a} / 3", None, math.inf),
]
INT_UNARY = [
    "-{a}", "{a}.abs()", "{a} // 3", "{a} % 5", "{a} >> 1", "({a} & 15) << 2", "~{a}", "{a}.clamp(-5, 7)",
    "{a} * 3 - 1", "{a}.sign()", "({a} > 2).int() * {a}",
]
KINKS = [0.173, -0.291, 0.407, -0.533, 0.061, 0.88, -1.13]


def unary(p: Program, a: Value) -> Value | None:
    if p.is_int:
        return p.let(p.rng.choice(INT_UNARY).format(a=a.name), is_int=True)
    if p.rng.random() < 0.3:  # a kinked op, its kink away from the data
        data = p.torch_value(a)
        c = p.margin_constant(data, KINKS)
        if c is None: return None
        kind = p.rng.choice(["relu", "abs", "clamp", "where", "leaky_relu"])
        if kind == "relu": return p.let(f"({a.name} - {c}).relu()")
        if kind == "abs": return p.let(f"({a.name} - {c}).abs()")
        if kind == "leaky_relu": return p.let(f"({a.name} - {c}).leaky_relu(0.1)", f"F.leaky_relu({a.name} - {c}, 0.1)")
        if kind == "where":
            return p.let(f"({a.name} > {c}).where({a.name} * 2, {a.name}.sin())",
                         f"torch.where({a.name} > {c}, {a.name} * 2, {a.name}.sin())")
        high = p.margin_constant(data, [k for k in KINKS if k > c])
        if high is None: return None
        return p.let(f"{a.name}.clamp({c}, {high})")
    m = p.magnitude(a)
    ours, theirs, limit = p.rng.choice(FLOAT_UNARY)
    if m > limit: return None
    return p.let(ours.format(a=a.name), None if theirs is None else theirs.format(a=a.name))


def broadcast_partner_shape(p: Program, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `shape`: some axes 1, leading axes dropped, or a new leading axis."""
    r = p.rng.random()
    if r < 0.25: return shape
    new = [1 if p.rng.random() < 0.35 else s for s in shape]
    if r < 0.5 and new: new = new[p.rng.randint(0, len(new)):]
    if r > 0.85 and len(new) < 4: new = [p.rng.choice([2, 3])] + new
    return tuple(new)


def partner(p: Program, a: Value) -> Value | None:
    """Another operand for a: a value of the program that broadcasts with a, or a new leaf that does."""
    def fits(v: Value) -> bool:
        try: shape = torch.broadcast_shapes(v.shape, a.shape)
        except RuntimeError: return False
        return math.prod(shape) <= NUMEL_MAX and v is not a
    if p.rng.random() < 0.45:
        b = p.pick(fits)
        if b is not None: return p.tame(b)
    if not p.is_int and p.rng.random() < 0.15:  # indices the program made, as data
        b = p.pick(lambda v: fits(v) and not v.is_input, is_int=True)
        if b is not None: return p.let(f"{b.name}.float()", f"{b.name}.double()")
    shape = broadcast_partner_shape(p, a.shape)
    if math.prod(torch.broadcast_shapes(shape, a.shape)) > NUMEL_MAX: shape = a.shape
    return p.new_leaf(shape, requires_grad=p.rng.random() < 0.7)


def binary(p: Program, a: Value) -> Value | None:
    b = partner(p, a)
    if b is None: return None
    x, y = a.name, b.name
    if p.is_int:
        ops = ["{x} + {y}", "{x} - {y}", "{x} * {y}", "{x}.maximum({y})", "{x}.minimum({y})", "{x} & {y}",
               "{x} | {y}", "{x} ^ {y}", "{x} // ({y}.abs() + 1)", "{x} % ({y}.abs() + 1)"]
        if p.magnitude(a) * p.magnitude(b) > 2**24: ops = ops[:2] + ops[3:]
        if p.rng.random() < 0.15:
            return p.let(f"({x} > {y}).where({x}, {y} * 2)", f"torch.where({x} > {y}, {x}, {y} * 2)", is_int=True)
        return p.let(p.rng.choice(ops).format(x=x, y=y), is_int=True)
    kind = p.rng.choice(["+", "-", "*", "/", "/", "maximum", "minimum", "where"])
    if kind in "+-*": return p.let(f"{x} {kind} {y}")
    if kind == "/":
        return p.let(f"{x} / ({y}.square() + 1)" if p.rng.random() < 0.5 else f"{y} / ({x}.square() + 0.5)")
    c = p.margin_constant(p.torch_value(a) - p.torch_value(b), KINKS)  # x == y + c never happens
    if c is None: return None
    if kind == "maximum": return p.let(f"{x}.maximum({y} + {c})")
    if kind == "minimum": return p.let(f"{x}.minimum({y} + {c})")
    return p.let(f"({x} > {y} + {c}).where({x}, {y})", f"torch.where({x} > {y} + {c}, {x}, {y})")


def reduce(p: Program, a: Value) -> Value | None:
    kind = p.rng.choice(["sum", "max", "min"] if p.is_int else ["sum", "mean", "max", "min"])
    if not p.is_int and a.ndim and p.rng.random() < 0.25: return other_reduce(p, a)
    if kind in ("max", "min"): a = p.distinct(a)
    keep = p.rng.random() < 0.4
    r = p.rng.random()
    if a.ndim == 0 or r < 0.15: return p.let(f"{a.name}.{kind}()")
    if a.ndim >= 2 and r < 0.45:
        dims = tuple(sorted(p.rng.sample(range(a.ndim), p.rng.randint(1, a.ndim))))
        if kind in ("sum", "mean"): return p.let(f"{a.name}.{kind}({dims}, keepdim={keep})")
        return p.let(f"{a.name}.{kind}(axis={dims}, keepdim={keep})", f"{a.name}.a{kind}({dims}, keepdim={keep})")
    d = p.dim(a)
    if kind in ("sum", "mean"): return p.let(f"{a.name}.{kind}({d}, keepdim={keep})")
    if p.rng.random() < 0.25:  # argmax / argmin: indices only
        return p.let(f"{a.name}.arg{kind}({d}, keepdim={keep})", is_int=True)
    values, _ = p.let2(f"{a.name}.{kind}({d}, keepdim={keep})")
    return values


def other_reduce(p: Program, a: Value) -> Value | None:
    """prod, logsumexp, var, std over one axis (float programs)."""
    d, keep = p.dim(a), p.rng.random() < 0.4
    kind = p.rng.choice(["prod", "logsumexp", "var", "std"])
    if kind == "prod":
        if p.magnitude(a) > 3 or a.shape[d] > 4: return None
        return p.let(f"{a.name}.prod({d}, keepdim={keep})")
    if kind == "logsumexp": return p.let(f"{a.name}.logsumexp({d}, keepdim={keep})")
    if not p.is_distinct(a) or a.shape[d] < 2: return None  # std has no derivative where all values are equal
    return p.let(f"{a.name}.{kind}({d}, keepdim={keep})")


def scan(p: Program, a: Value) -> Value | None:
    """sort, argsort, topk, cummax/cummin, cumsum, softmax; then, most times, a movement op on the result."""
    if a.ndim == 0: return None
    kind = p.rng.choice(["sort", "sort", "argsort", "topk", "topk", "cummax", "cummin", "cumsum", "softmax"])
    if p.is_int and kind == "softmax": kind = "cumsum"
    if kind in ("sort", "argsort", "topk", "cummax", "cummin"): a = p.distinct(a)
    d = p.dim(a)
    x = a.name
    desc = p.rng.random() < 0.5
    # torch's sort is stable only when told; ember's always is (ties happen in int programs)
    if kind == "sort":
        out, _ = p.let2(f"{x}.sort({d}, descending={desc})", f"{x}.sort(dim={d}, descending={desc}, stable=True)")
    elif kind == "argsort":
        return p.let(f"{x}.argsort({d}, descending={desc})", f"{x}.argsort(dim={d}, descending={desc}, stable=True)",
                     is_int=True)
    elif kind == "topk":
        k = p.rng.randint(1, a.shape[d])
        # torch picks among tied values in no documented order: compare the indices only when values are distinct
        if p.is_int and not p.is_distinct(a): out = p.let(f"{x}.topk({k}, {d}, largest={not desc}).values")
        else: out, _ = p.let2(f"{x}.topk({k}, {d}, largest={not desc})")
    elif kind in ("cummax", "cummin"): out, _ = p.let2(f"{x}.{kind}({d})")
    elif kind == "cumsum": out = p.let(f"{x}.cumsum({d})")
    else: out = p.let(f"{x}.{p.rng.choice(['softmax', 'log_softmax'])}({d})")
    if p.rng.random() < 0.7:
        follow = p.rng.choice([roll, pad, flip, getitem, shrink])
        return follow(p, out) or out
    return out


# ---- movement ----


def factor_shape(p: Program, n: int) -> tuple[int, ...]:
    dims, rest = [], n
    for _ in range(p.rng.randint(0, 3)):
        d = p.rng.choice([d for d in range(1, min(rest, 6) + 1) if rest % d == 0])
        dims.append(d)
        rest //= d
    dims.append(rest)
    p.rng.shuffle(dims)
    return tuple(dims)


def reshape(p: Program, a: Value) -> Value | None:
    shape = factor_shape(p, a.numel)
    if p.rng.random() < 0.3 and shape:
        i = p.rng.randrange(len(shape))
        shape = shape[:i] + (-1,) + shape[i + 1:]
    return p.let(f"{a.name}.reshape({shape})")


def permute(p: Program, a: Value) -> Value | None:
    if a.ndim < 2: return None
    if p.rng.random() < 0.4: return p.let(f"{a.name}.transpose({p.dim(a)}, {p.dim(a)})")
    order = tuple(p.rng.sample(range(a.ndim), a.ndim))
    return p.let(f"{a.name}.permute({order})")


def expand(p: Program, a: Value) -> Value | None:
    ones = [i for i, s in enumerate(a.shape) if s == 1]
    x, shape = a.name, list(a.shape)
    if not ones or p.rng.random() < 0.4:
        if a.ndim >= 4: return None
        d = p.rng.randint(0, a.ndim)
        x, shape = f"{a.name}.unsqueeze({d})", shape[:d] + [1] + shape[d:]
        ones = [d]
    for i in ones: shape[i] = p.rng.randint(1, 4)
    if math.prod(shape) > NUMEL_MAX: return None
    if p.rng.random() < 0.3: shape = [-1 if i not in ones else s for i, s in enumerate(shape)]
    return p.let(f"{x}.expand({tuple(shape)})")


def squeeze(p: Program, a: Value) -> Value | None:
    r = p.rng.random()
    if r < 0.3 and a.ndim < 4: return p.let(f"{a.name}.unsqueeze({p.dim(a, extra=1)})")
    if r < 0.6:
        ones = [i for i, s in enumerate(a.shape) if s == 1]
        if not ones: return None
        return p.let(f"{a.name}.squeeze({p.rng.choice(ones)})")
    if a.ndim < 2: return None
    start = p.rng.randrange(a.ndim - 1)
    return p.let(f"{a.name}.flatten({start}, {p.rng.randrange(start + 1, a.ndim)})")


def pad(p: Program, a: Value) -> Value | None:
    if a.ndim == 0: return None
    if not p.is_int and p.rng.random() < 0.3 and a.ndim in (2, 3):  # reflect / replicate / circular on the last axis
        n, mode = a.shape[-1], p.rng.choice(["reflect", "replicate", "circular"])
        most = {"reflect": n - 1, "replicate": 3, "circular": n}[mode]
        before, after = p.rng.randint(0, min(most, 3)), p.rng.randint(0, min(most, 3))
        if before + after == 0 or a.numel // n * (n + before + after) > NUMEL_MAX: return None
        return p.let(f"{a.name}.pad(({before}, {after}), mode={mode!r})",
                     f"F.pad({a.name}, ({before}, {after}), mode={mode!r})")
    pairs = []
    for s in a.shape:
        low = -1 if s > 2 else 0
        pairs.append((p.rng.randint(low, 2), p.rng.randint(low, 2)) if p.rng.random() < 0.6 else (0, 0))
    new = [s + b + e for s, (b, e) in zip(a.shape, pairs)]
    if math.prod(new) > NUMEL_MAX or min(new) < 1: return None
    flat = tuple(x for pair in reversed(pairs) for x in pair)
    fill = p.rng.choice([0, 0, 3]) if p.is_int else p.rng.choice([0.0, 0.0, 0.75, -1.5])
    value = f", value={fill}" if fill else ""
    ours = f"{a.name}.pad({flat}{value})" if p.rng.random() < 0.3 else f"{a.name}.pad({tuple(pairs)}{value})"
    return p.let(ours, f"F.pad({a.name}, {flat}{value})")


def shrink(p: Program, a: Value) -> Value | None:
    if a.ndim == 0: return None
    box: list[tuple[int, int] | None] = []
    for s in a.shape:
        if p.rng.random() < 0.4: box.append(None)
        else:
            start = p.rng.randrange(s)
            box.append((start, p.rng.randint(start + 1, s)))
    theirs = ", ".join(":" if b is None else f"{b[0]}:{b[1]}" for b in box)
    return p.let(f"{a.name}.shrink({tuple(box)})", f"{a.name}[{theirs}]")


def flip(p: Program, a: Value) -> Value | None:
    if a.ndim == 0: return None
    dims = tuple(sorted(p.rng.sample(range(a.ndim), p.rng.randint(1, a.ndim))))
    return p.let(f"{a.name}.flip({dims})")


def roll(p: Program, a: Value) -> Value | None:
    if a.ndim == 0: return None
    if p.rng.random() < 0.6: return p.let(f"{a.name}.roll({p.rng.randint(-7, 7)}, {p.dim(a)})")
    dims = tuple(p.rng.sample(range(a.ndim), p.rng.randint(1, a.ndim)))
    shifts = tuple(p.rng.randint(-7, 7) for _ in dims)
    return p.let(f"{a.name}.roll({shifts}, {dims})")


def repeat(p: Program, a: Value) -> Value | None:
    reps = tuple([p.rng.choice([1, 2])] * (p.rng.random() < 0.3) + [p.rng.choice([1, 1, 2, 3]) for _ in a.shape])
    if not reps or a.numel * math.prod(reps) > NUMEL_MAX: return None
    return p.let(f"{a.name}.repeat({reps})")


def movement(p: Program, a: Value) -> Value | None:
    op = p.rng.choice([reshape, permute, expand, squeeze, pad, pad, shrink, flip, roll, roll, repeat])
    return op(p, a)


def join(p: Program, a: Value) -> Value | None:
    """cat of 2 or 3 tensors along an axis, or stack of 2."""
    if p.rng.random() < 0.3:  # stack
        if a.numel * 2 > NUMEL_MAX or a.ndim >= 4: return None
        b = p.pick(lambda v: v.shape == a.shape and v is not a)
        b = b or p.new_leaf(a.shape, requires_grad=p.rng.random() < 0.7)
        d = p.dim(a, extra=1)
        return p.let(f"{a.name}.stack({b.name}, dim={d})", f"torch.stack([{a.name}, {b.name}], {d})")
    if a.ndim == 0: return None
    d = p.dim(a)
    parts = [a.name]
    for _ in range(p.rng.choice([1, 1, 2])):
        same = p.pick(lambda v, d=d: v.ndim == a.ndim and all(x == y or i == d % a.ndim for i, (x, y)
                                                               in enumerate(zip(v.shape, a.shape))))
        if same is not None and p.rng.random() < 0.5: parts.append(same.name)
        elif p.rng.random() < 0.3: parts.append(f"{a.name}.flip({d})")
        else:
            shape = list(a.shape)
            shape[d] = p.rng.randint(1, 3)
            parts.append(p.new_leaf(tuple(shape), requires_grad=p.rng.random() < 0.7).name)
    total = sum(p.ours[x].shape[d] if x in p.ours else a.shape[d] for x in parts)
    if a.numel // a.shape[d] * total > NUMEL_MAX: return None
    ours = f"{parts[0]}.cat({', '.join(parts[1:])}, dim={d})" if p.rng.random() < 0.6 else \
        f"Tensor.cat({', '.join(parts)}, dim={d})"
    return p.let(ours, f"torch.cat([{', '.join(parts)}], {d})")


def matmul(p: Program, a: Value) -> Value | None:
    if p.is_int or a.ndim == 0 or p.magnitude(a) > 10: return None
    m = p.rng.randint(1, 4)
    if a.numel // a.shape[-1] * m > NUMEL_MAX: return None
    b = p.new_leaf((a.shape[-1], m), requires_grad=p.rng.random() < 0.7)
    return p.let(f"{a.name} @ {b.name}")


# ---- indexing ----


def slice_for(p: Program, n: int, *, negative_step: bool) -> slice:
    """A random slice of an axis of size n that selects at least one element."""
    while True:
        step = p.rng.choice([None, None, 1, 2, 3] + ([-1, -1, -2] if negative_step else []))
        start = None if p.rng.random() < 0.4 else p.rng.randint(-n, n)
        stop = None if p.rng.random() < 0.4 else p.rng.randint(-n - 1, n + 1)
        s = slice(start, stop, step)
        if len(range(*s.indices(n))): return s


def basic_key(p: Program, a: Value, *, setitem: bool = False) -> list[Any]:
    """Up to ndim entries (slices, ints; None and Ellipsis when reading)."""
    count = p.rng.randint(1, a.ndim)
    ellipsis = count < a.ndim and p.rng.random() < 0.2  # then the entries are for the last axes
    key: list[Any] = []
    for s in a.shape[-count:] if ellipsis else a.shape[:count]:
        r = p.rng.random()
        if r < 0.3: key.append(p.rng.randint(-s, s - 1))
        elif r < 0.4: key.append(slice(None))
        else: key.append(slice_for(p, s, negative_step=not setitem))
        if not setitem and p.rng.random() < 0.1: key.append(None)
    return [Ellipsis, *key] if ellipsis else key


def torch_key(key: list[Any], shape: tuple[int, ...]) -> tuple[list[Any], list[int]]:
    """The key torch can run (torch has no negative slice steps: those axes are flipped first) and those axes."""
    uses = sum(1 for k in key if k is not None and k is not Ellipsis)
    dim = len(shape) - uses if key and key[0] is Ellipsis else 0  # basic_key puts Ellipsis first or nowhere
    out, flips = [], []
    for k in key:
        if isinstance(k, slice) and k.step is not None and k.step < 0:
            idx = range(*k.indices(shape[dim]))
            n = shape[dim]
            k = slice(n - 1 - idx[0], n - idx[-1], -k.step)
            flips.append(dim)
        out.append(k)
        if k is not None and k is not Ellipsis: dim += 1
    return out, flips


def getitem(p: Program, a: Value) -> Value | None:
    if a.ndim == 0: return None
    key = basic_key(p, a)
    theirs, flips = torch_key(key, a.shape)
    base = f"{a.name}.flip({tuple(flips)})" if flips else a.name
    return p.let(f"{a.name}[{fmt_key(key)}]", f"{base}[{fmt_key(theirs)}]")


def index_tensor(p: Program, n: int, shape: tuple[int, ...], *, negative: bool, ndim: int | None = None) -> Value:
    """An int index tensor with values in [0, n) ([-n, n) when negative): one the program made, or a literal."""
    low = -n if negative else 0

    def fits(v: Value) -> bool:
        if v.numel == 0 or v.numel > 24 or (ndim is not None and v.ndim != ndim): return False
        data = p.torch_value(v)
        return not data.is_floating_point() and low <= int(data.min()) and int(data.max()) < n
    if p.rng.random() < 0.4:
        found = p.pick(fits, is_int=True)
        if found is not None: return found
    data = np.random.default_rng(p.sub_seed()).integers(low, n, shape).tolist()
    return literal(p, data)


def literal(p: Program, data: list[Any]) -> Value:
    """An int tensor from a nested list: int32 or int64 in ember; int64 in torch, except in int programs, where
    indices may be used as data and so take ember's dtype."""
    long = p.rng.random() < 0.3
    ours = ", dtype='int64'" if long else ""
    theirs = ", dtype=torch.int32" if p.is_int and not long else ""
    return p.let(f"Tensor({data}{ours})", f"torch.tensor({data}{theirs})", is_int=True, is_input=True)


def advanced_index(p: Program, a: Value) -> Value | None:
    """x[idx], x[:, idx], x[i, j], x[i, :, j], with slices and ints between: index tensors that broadcast."""
    if a.ndim == 0: return None
    index_shape = tuple(p.rng.choice([1, 2, 3, 4]) for _ in range(p.rng.choice([0, 1, 1, 2])))
    count = p.rng.randint(1, min(a.ndim, 3))
    axes = sorted(p.rng.sample(range(a.ndim), count))
    key: list[Any] = []
    tensors = []
    for i in range(axes[-1] + 1):
        if i in axes:
            shape = index_shape[p.rng.randint(0, len(index_shape)):] if tensors else index_shape
            t = index_tensor(p, a.shape[i], shape, negative=True)
            tensors.append(t)
            key.append(t)
        elif p.rng.random() < 0.2: key.append(p.rng.randrange(a.shape[i]))
        else: key.append(slice_for(p, a.shape[i], negative_step=False))
    try: broadcast = torch.broadcast_shapes(*(t.shape for t in tensors))
    except RuntimeError: return None
    rest = [len(range(*k.indices(a.shape[i]))) for i, k in enumerate(key) if isinstance(k, slice)]
    if math.prod(broadcast) * math.prod(rest) * math.prod(a.shape[len(key):]) > NUMEL_MAX: return None
    return p.let(f"{a.name}[{fmt_key(key)}]")


def gather(p: Program, a: Value) -> Value | None:
    if a.ndim == 0: return None
    d = p.dim(a)
    shape = tuple(p.rng.randint(1, 4) if i == d % a.ndim else p.rng.randint(1, s) for i, s in enumerate(a.shape))
    idx = index_tensor(p, a.shape[d], shape, negative=False, ndim=a.ndim)
    if any(s > t for i, (s, t) in enumerate(zip(idx.shape, a.shape)) if i != d % a.ndim): return None
    return p.let(f"{a.name}.gather({d}, {idx.name})", f"{a.name}.gather({d}, {idx.name}.long())")


def sort_by_gather(p: Program, a: Value) -> Value | None:
    """a.gather(d, b.argsort(d)) for a value b of a's shape: a reordered as b sorts."""
    if a.ndim == 0: return None
    b = p.pick(lambda v: v.shape == a.shape) or a
    b = p.distinct(b)
    d = p.dim(a)
    idx = p.let(f"{b.name}.argsort({d})", f"{b.name}.argsort(dim={d}, stable=True)", is_int=True)
    return p.let(f"{a.name}.gather({d}, {idx.name})")


def index_select(p: Program, a: Value) -> Value | None:
    if a.ndim == 0: return None
    d = p.dim(a)
    idx = index_tensor(p, a.shape[d], (p.rng.randint(1, 5),), negative=False, ndim=1)
    if a.numel // a.shape[d] * idx.numel > NUMEL_MAX: return None
    return p.let(f"{a.name}.index_select({d}, {idx.name})", f"{a.name}.index_select({d}, {idx.name}.long())")


def indexing(p: Program, a: Value) -> Value | None:
    op = p.rng.choice([getitem, advanced_index, advanced_index, gather, sort_by_gather, index_select])
    return op(p, a)


def setitem(p: Program, a: Value) -> Value | None:
    """target[key] = value on a tensor that is no leaf; the key holds slices and ints, or one index tensor without
    repeats (torch gives each repeated write a gradient, ember the last one only, as documented). torch writes into a
    clone: its autograd needs the original."""
    def writable(v: Value) -> bool:
        same = sum(1 for w in p.values if p.ours[w.name] is p.ours[v.name])  # ember returns self for no-op moves
        return not v.is_leaf and v.ndim > 0 and same == 1
    target = a if writable(a) else p.pick(writable)
    if target is None:
        if a.ndim == 0: return None
        target = p.let(f"{a.name} * 2", is_int=a.is_int)
    name = target.name
    if p.rng.random() < 0.25 and p.allowed("setitem_index_tensor"):
        d = p.rng.randrange(target.ndim)
        n = target.shape[d]
        rows = np.random.default_rng(p.sub_seed()).permutation(n)[:p.rng.randint(1, n)] - n * (p.rng.random() < 0.3)
        index = literal(p, rows.tolist())
        key: list[Any] = [slice(None)] * d + [index]
        shape = np.zeros(target.shape)[tuple(slice(None) if k is index else k for k in key[:-1]) + (rows,)].shape
    else:
        key = basic_key(p, target, setitem=True)
        shape = np.zeros(target.shape)[tuple(key)].shape
    r = p.rng.random()
    if r < 0.25: value = str(p.rng.choice([-3, 0, 4]) if p.is_int else p.rng.choice([0.0, 0.75, -1.25]))
    elif r < 0.4 and target.shape == shape:  # a value computed from the target itself, read before the write
        value = f"{name}.flip({p.rng.randrange(target.ndim)}) * 2"
    else:
        def fits(v: Value) -> bool:
            try: return torch.broadcast_shapes(v.shape, shape) == shape and v is not target
            except RuntimeError: return False
        found = p.pick(fits) if r < 0.7 else None
        if found is None: found = p.new_leaf(broadcast_partner_shape(p, shape)[-len(shape):] if shape else ())
        if torch.broadcast_shapes(found.shape, shape) != shape: return None
        value = found.name
    theirs = f"({value}).to({name}.dtype)" if value[0] == "v" else value  # torch's index_put wants one dtype
    p.run(f"{name}[{fmt_key(key)}] = {value}", f"{name} = {name}.clone(); {name}[{fmt_key(key)}] = {theirs}")
    target.is_input, target.ends_in_copy = False, True
    p.latest = target
    return target


def peek(p: Program, a: Value) -> Value | None:
    """Read a value in the middle of the program (as a user printing it would): it must not change what follows."""
    if a.ends_in_copy and not p.allowed("read_then_backward"): return None
    p.run(f"_ = {a.name}.tolist()", f"_ = {a.name}.tolist()")
    return a


def copy(p: Program, a: Value) -> Value | None:
    """clone() or contiguous(): the same values, a tensor of its own (a copy in ember)."""
    out = p.let(f"{a.name}.{p.rng.choice(['clone', 'contiguous'])}()")
    out.ends_in_copy = True
    return out


OPS: dict[str, OpFn] = {
    "unary": unary, "binary": binary, "reduce": reduce, "movement": movement, "indexing": indexing,
    "setitem": setitem, "scan": scan, "join": join, "matmul": matmul, "peek": peek, "copy": copy,
}
BASE = {"unary": 3, "binary": 3, "reduce": 2, "movement": 4, "indexing": 3, "setitem": 2, "scan": 2, "join": 1,
        "matmul": 0.5, "peek": 0.5, "copy": 0.5}
THEMES = {
    "mixed": BASE, "movement": {**BASE, "movement": 10}, "indexing": {**BASE, "indexing": 9},
    "setitem": {**BASE, "setitem": 7}, "scan": {**BASE, "scan": 7, "movement": 6}, "reduce": {**BASE, "reduce": 7},
}


# ---- the tests ---------------------------------------------------------------------------------------------------


def run_program(seed: int, max_depth: int = 8) -> int:
    """Build, run and check the program of `seed`; fail with both programs printed. Returns the tensors compared.

    Its kernels are generated under SPEC=1: each codegen stage is checked against ember/uop/spec.py, which says,
    among other things, that every ungated read is inside its buffer (seed 9 read a gather's table at -46..43)."""
    program = Program(seed, max_depth)
    head = f"run_program({seed}, {max_depth}) ({'int' if program.is_int else 'float'} program, theme {program.theme})"
    try:
        with Context(SPEC=1): return program.build().check()
    except Mismatch as e: failure = f"{head}: {e}"
    except EmberRaised as e: failure = f"{head}: ember raised {e}"
    except TorchRaised as e: failure = f"{head}: the fuzzer made a program torch rejects ({e})"
    except Exception as e:  # the fuzzer's own code
        failure = f"{head}: the fuzzer failed: {type(e).__name__}: {e}\n{traceback.format_exc()}"
    finally: program.release()
    pytest.fail(f"{failure}\n{program.text()}", pytrace=False)


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_random_program_matches_torch(seed):
    run_program(seed, DEFAULT_MAX_DEPTH)


@pytest.mark.slow
@pytest.mark.parametrize("first", SLOW_SEEDS[::SLOW_CHUNK])
def test_many_random_programs_match_torch(first):
    """SLOW_CHUNK programs a test (few skipped tests in the default run); every failing seed is reported."""
    failures = []
    for seed in range(first, first + SLOW_CHUNK):
        try: run_program(seed)
        except pytest.fail.Exception as e: failures.append(str(e))
    if failures: pytest.fail(f"{len(failures)} of {SLOW_CHUNK} programs failed:\n\n" + "\n\n".join(failures),
                             pytrace=False)


def test_programs_print_as_they_run():
    """The printed ember lines rebuild the program: run them again in a fresh namespace and get the same output."""
    program = Program(3).build()
    out = program.output()
    namespace: dict[str, Any] = {"Tensor": Tensor, "leaf": leaf, "ints": ints, "perm": perm, "weights": weights}
    try:
        for ours, _ in program.lines: exec(ours, namespace)
        np.testing.assert_array_equal(namespace[out.name].numpy(), program.ours[out.name].numpy())
    finally:
        program.release()
        for v in program.leaves: namespace[v.name].requires_grad_(False)
