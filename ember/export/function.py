"""NumericalFunction: a function of fixed-shape arrays, traced once into kernels and called with numpy arrays.

Tracing calls `fn` on placeholder tensors (buffers that stand for the arguments); the outputs are scheduled when
first needed (a call, an export). The result is a plan: the kernels in order and the buffers they read and write,
each of one kind: an input (the placeholders), a constant (data captured from the closure, or computed from such
data alone: those kernels run once, when the plan is made), an intermediate, or an output. Every output is a
fresh C-contiguous buffer, also when `fn` returns an input or a view of one. The same plan is what
generate_module writes as C++.

>>> import numpy as np
>>> f = NumericalFunction("energy", lambda x: (0.5 * x * x).sum(), [Arg((3,))])
>>> float(f(np.array([1.0, 2.0, 3.0])))
7.0
"""

from __future__ import annotations

import atexit
import inspect
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.device import Buffer, Device, buffer_uop
from ember.dtype import DType, dtypes, to_dtype, to_numpy
from ember.errors import DTypeError, EmberError, ShapeError
from ember.export.cpp_names import check_cpp_name
from ember.helpers import INTERPRET, prod
from ember.schedule.kernelize import ExecItem, LoopItem, create_schedule, view_buffer
from ember.tensor import Tensor, tracing
from ember.uop.ops import Ops, UOp

INTERPRET_SECONDS = 0.05  # the interpreter's estimated time per call above which a first call waits for the compiler


_BUILD_SLOTS = threading.BoundedSemaphore(os.cpu_count() or 1)  # native builds compiling at once, in background
_running: set[threading.Thread] = set()
_exiting = threading.Event()


@atexit.register
def _finish_builds() -> None:
    _exiting.set()
    for thread in list(_running): thread.join()


class _TensorArguments(Exception):
    """Raised by the argument check when a call's arguments are Tensors: __call__ then traces fn on them."""


@dataclass(frozen=True)
class Arg:
    """The shape and dtype of one argument of a NumericalFunction (float64 unless told otherwise)."""

    shape: tuple[int, ...]
    dtype: DType = dtypes.float64

    def __init__(self, shape: int | Sequence[int], dtype: DType | str = dtypes.float64) -> None:
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        if any(not isinstance(d, int) or d < 0 for d in dims):
            raise ShapeError(f"Arg: shape sizes must be non-negative ints, got {shape!r}")
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "dtype", to_dtype(dtype))


@dataclass
class Plan:
    """What tracing found: kernels to run per call and the role of every buffer they touch."""

    items: list[ExecItem | LoopItem]
    inputs: list[Buffer]
    outputs: list[Buffer]
    output_shapes: list[tuple[int, ...]]
    constants: list[Buffer]  # hold their values from trace time on
    intermediates: list[Buffer]


class NumericalFunction:
    """`fn` traced once on `args`; call it with arrays of those shapes, export it with generate_module.

    Constants captured by `fn` (`Tensor(numpy_array)`) are part of the function; kernels that depend on them alone
    run once when it is traced."""

    def __init__(self, name: str, fn: Callable[..., Any], args: Sequence[Arg],
                 arg_names: Sequence[str] | None = None, *, lazy: bool = False) -> None:
        """`lazy`: trace `fn` when first needed, not now (the transforms: their checks need only the function they
        transform, and a derivative used only inside another function is then never traced on its own)."""
        check_cpp_name(name, "NumericalFunction")  # it names the function's C++ namespace, native calls included
        self.name, self.fn, self.args = name, fn, [a if isinstance(a, Arg) else Arg(a) for a in args]
        self.arg_names = list(arg_names) if arg_names is not None else _parameter_names(fn, len(self.args))
        self._traced: tuple[list[Tensor], list[Tensor], bool] | None = None
        self._native: Callable[..., Any] | bool | None = None  # built on the first call
        self._building: threading.Thread | None = None  # the build a first call started
        self._failure: Exception | None = None  # how that build failed
        self._program: Any = None  # the interpreter's prepared kernels (export/interpreter.py)
        self._constants: dict[int, np.ndarray] = {}  # the constants' values, which the interpreter only reads
        self._planned: Plan | None = None
        # First calls may come from several threads at once: the trace, the plan and the native build are made
        # once, by whichever thread comes first, while the others wait (reentrant: the plan needs the trace).
        self._lock = threading.RLock()
        if not lazy: self._trace()

    def _trace(self) -> tuple[list[Tensor], list[Tensor], bool]:
        """(placeholders, outputs, whether fn returns one Tensor): fn run once on placeholders."""
        if self._traced is not None: return self._traced
        with self._lock:
            if self._traced is not None: return self._traced
            placeholders = placeholders_for(self.args)
            with tracing(placeholders): outs = self.fn(*placeholders)
            single = isinstance(outs, Tensor)
            outs = (outs,) if single else outs
            if not isinstance(outs, (tuple, list)) or not outs or not all(isinstance(o, Tensor) for o in outs):
                got = [type(o).__name__ for o in outs] if isinstance(outs, (tuple, list)) else type(outs).__name__
                raise EmberError(f"NumericalFunction {self.name!r}: fn must return a Tensor or a tuple of Tensors, "
                                 f"got {got}")
            self._traced = (placeholders, list(outs), single)
            return self._traced

    @property
    def traced_inputs(self) -> list[Tensor]: return self._trace()[0]

    @property
    def traced_outputs(self) -> list[Tensor]: return self._trace()[1]

    @property
    def single(self) -> bool: return self._trace()[2]

    @property
    def plan(self) -> Plan:
        """The kernels and buffers, scheduled when first needed: a function only ever used inside another (a
        model traced into its jacobian) is never scheduled on its own."""
        if self._planned is not None: return self._planned
        with self._lock:
            if self._planned is None:
                inputs = [p._buffer() for p in self.traced_inputs]
                self._planned = _plan(inputs, [o.clone() for o in self.traced_outputs])  # a copy even of an input
            return self._planned

    @property
    def output_shapes(self) -> list[tuple[int, ...]]: return [o.shape for o in self.traced_outputs]

    @property
    def output_dtypes(self) -> list[DType]: return [o.dtype for o in self.traced_outputs]

    def _coerce(self, *values: Any) -> tuple[np.ndarray, ...]:
        """The arguments as arrays the compiled code can read, or the error naming what is wrong. (The native call
        asks for this only when its arguments are not already such arrays: Tensors turn back here.)"""
        if any(isinstance(v, Tensor) for v in values): raise _TensorArguments
        return self._arrays_for(values)

    def _arrays_for(self, values: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """The checked arguments as plain C-ordered arrays of the argument dtypes, in native byte order and aligned:
        compiled code reads their memory as C values of that type, and a big-endian or misaligned array's bytes
        are not those (`np.asarray` keeps a misaligned array that already has the dtype: copied here)."""
        arrays = []
        for a, arg in zip(self._check(values), self.args, strict=True):
            a = np.asarray(a, dtype=to_numpy(arg.dtype), order="C")
            arrays.append(a if a.flags.aligned else a.copy())
        return tuple(arrays)

    def _check(self, values: Sequence[Any]) -> list[np.ndarray]:
        """The arguments as arrays of their Arg's shape whose dtype converts to the Arg's: numpy arrays and scalars
        of the same kind convert as `astype` does (an int64 or uint64 array wraps into int32, as torch's `.to`
        does; numpy does not call int to unsigned int the same kind, so an int64 array into uint32 is refused); Python
        ints, which have no dtype of their own, convert to any integer Arg whose range holds them, else raise
        OverflowError (as numpy 2 does for `np.array(300, np.uint8)`)."""
        if len(values) != len(self.args):
            raise TypeError(f"{self.name}: takes {len(self.args)} arguments, got {len(values)}")
        return [self._check_argument(i, v, arg) for i, (v, arg) in enumerate(zip(values, self.args, strict=True))]

    def _check_argument(self, i: int, value: Any, arg: Arg) -> np.ndarray:
        want = to_numpy(arg.dtype)
        where = f"{self.name}: argument {i} ({self.arg_names[i]})"
        expected = f"expected an array of shape {arg.shape} and dtype {_dtype_words(arg.dtype)}"
        try: a = np.asarray(value)
        except (ValueError, TypeError) as e:  # ragged nested lists, objects numpy refuses
            raise DTypeError(f"{where}: numpy cannot read it as an array ({e}); {expected}") from None
        from_python = not isinstance(value, (np.ndarray, np.generic))
        python_ints = from_python and a.dtype.kind in "iu"
        if from_python and (a.dtype.kind == "O" or a.dtype.kind == "f" and want.kind in "iu"):
            # numpy reads Python ints too large for int64 as uint64, float64 ([2**63, -1]) or objects (2**64)
            held = np.array(value, dtype=object)
            if python_ints := all(isinstance(x, int) for x in held.flat): a = held
        if a.dtype.kind in "OSUV" and not python_ints:
            if from_python and a.ndim == 0:
                shown = "None" if value is None else f"a {type(value).__name__} ({value!r:.40})"
                raise DTypeError(f"{where} is {shown}; {expected}")
            if a.dtype.kind == "O":
                raise DTypeError(f"{where} holds objects numpy cannot read as numbers (a {type(value).__name__} of "
                                 f"{sorted({type(x).__name__ for x in a.flat})}); {expected}")
        if a.shape != arg.shape:
            raise ShapeError(f"{self.name}: argument {i} has shape {a.shape}, expected {arg.shape}")
        if python_ints and want.kind in "iu": return _python_ints_as(a, want, where, arg.dtype)
        if python_ints and a.dtype.kind == "O":
            try: return np.asarray(a.tolist(), dtype=want)
            except OverflowError as e: raise OverflowError(f"{where} holds an int {e}; {expected}") from None
        if not np.can_cast(a.dtype, want, "same_kind"):
            raise DTypeError(f"{self.name}: argument {i} has dtype {a.dtype}, expected {_dtype_words(arg.dtype)} "
                             f"(or one that converts to it without changing kind)")
        return a

    def __call__(self, *values: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run on numpy arrays (or anything np.asarray takes); returns fresh arrays.

        The first call starts compiling the function into native code (cached on disk: a later process loads it)
        and is answered by the numpy interpreter of its kernels, as are the calls made until the native code is
        loaded (INTERPRET=0: the first call waits for it); then calls go straight to it. `compile()` waits.
        First calls from several threads start one build. Called with Tensors (inside another function being
        traced, say), it is `fn` on them: its graph becomes part of the caller's, so functions compose and share
        their common work."""
        if self._native:
            try: return self._native(*values)
            except _TensorArguments: return self.apply(*values)
        if any(isinstance(v, Tensor) for v in values): return self.apply(*values)
        with self._lock:
            if self._failure is not None:  # the build in the background failed: say so once, then try again
                failure, self._failure = self._failure, None
                raise failure
            if self._native is None and self._building is None: self._start_native(INTERPRET.value)
            native, building = self._native, self._building
        if native: return native(*values)
        if building is not None: return self.interpret(*values)
        if native is None: return self(*values)  # the build in the background ended just now
        return self.call_kernels(*values)

    def _start_native(self, interpret: int) -> None:
        """Load the native code from the cache, or build it: in a thread while calls are evaluated with numpy
        (`interpret` 1, when the interpreter can and is fast), else now. The caller holds the lock."""
        from ember.export.native import build_native, locate_native
        where = locate_native(self)
        call = where.load(self) if where is not None else None
        if interpret == 1 and where is not None and call is None and self._interpretable():
            self._building = threading.Thread(target=self._build_in_background, args=(where,), daemon=True,
                                              name=f"ember build {self.name}")
            self._building.start()
            return
        self._native = call or (build_native(self, where) if where is not None else None) or False
        if interpret == 2 and self._interpretable(): self._check_interpreter()

    def _interpretable(self) -> bool:
        """The interpreter gives the native code's results and is fast enough to stand in for it."""
        from ember.export.interpreter import cost, refusal
        return refusal(self.plan.items) is None and cost(self.plan.items) <= INTERPRET_SECONDS

    def _build_in_background(self, where: Any) -> None:
        """At most one build per core compiles at once; at exit, the running ones finish (their compiler would
        be orphaned, the cache left without them) and the waiting ones are dropped."""
        from ember.export.native import build_native
        try:
            with _BUILD_SLOTS:
                if _exiting.is_set(): return
                _running.add(threading.current_thread())
                self._native = build_native(self, where) or False
        except Exception as e:  # noqa: BLE001  (raised by the next call)
            self._failure = e
        finally:
            _running.discard(threading.current_thread())
            self._building = None

    def compile(self) -> NumericalFunction:
        """Build (or load) the native code now, waiting for a build that a first call started; returns self."""
        if (building := self._building) is not None: building.join()
        with self._lock:
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise failure
            if self._native is None: self._start_native(interpret=0)
        return self

    def interpret(self, *values: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """The plan evaluated with numpy (export/interpreter.py): the native code's results bit for bit.

        Reentrant: each call has its own intermediates and outputs (threads making first calls at once run here
        together); the constants are shared and only read."""
        plan, program = self.plan, self._program or self._prepare_interpreter()
        arrays = dict(self._constants)
        for buf, a in zip(plan.inputs, self._coerce(*values), strict=True): arrays[id(buf)] = a.reshape(-1)
        for b in plan.intermediates + plan.outputs: arrays[id(b)] = np.empty(b.size, to_numpy(b.dtype))
        program(arrays)
        outs = tuple(arrays[id(b)].reshape(s).copy() if any(c is b for c in plan.outputs[:i]) else
                     arrays[id(b)].reshape(s) for i, (b, s) in enumerate(zip(plan.outputs, plan.output_shapes,
                                                                             strict=True)))
        return outs[0] if self.single else outs

    def _prepare_interpreter(self) -> Any:
        """The interpreter's Program and the constants' values, made once."""
        from ember.export.interpreter import Program
        with self._lock:
            if self._program is None:
                plan = self.plan
                self._constants = {id(b): b.numpy() for b in plan.constants}
                self._program = Program(plan.items)  # set last: a thread that sees it sees the constants
            return self._program

    def _check_interpreter(self) -> None:
        """INTERPRET=2: the interpreter and the native code agree on random arguments, bit for bit but for the
        sign of zeros. The arguments lie in [0.25, 0.75] (integers in 1..9), inside most functions' domains."""
        if not self._native: return
        rng = np.random.default_rng(0)
        args = [rng.uniform(0.25, 0.75, a.shape).astype(to_numpy(a.dtype)) if a.dtype.is_float else
                rng.integers(1, 10, a.shape).astype(to_numpy(a.dtype)) for a in self.args]
        got, want = self.interpret(*args), self._native(*args)
        for i, (g, w) in enumerate(zip(*((g,) if self.single else g for g in (got, want)), strict=True)):
            if not _same_values(g, w):
                raise EmberError(f"{self.name}: output {i} of the numpy interpreter differs from the native code's:"
                                 f"\n{g}\n{w}")

    def apply(self, *xs: Any) -> Tensor | tuple[Tensor, ...]:
        """`fn` on Tensors of the argument shapes and dtypes (numbers and arrays become Tensors)."""
        if len(xs) != len(self.args):
            raise TypeError(f"{self.name}: takes {len(self.args)} arguments, got {len(xs)}")
        tensors = [x if isinstance(x, Tensor) else Tensor(np.asarray(x), dtype=a.dtype)
                   for x, a in zip(xs, self.args, strict=True)]
        for i, (t, a) in enumerate(zip(tensors, self.args, strict=True)):
            if t.shape != a.shape:
                raise ShapeError(f"{self.name}: argument {i} has shape {t.shape}, expected {a.shape}")
            if t.dtype is not a.dtype:
                raise DTypeError(f"{self.name}: argument {i} has dtype {t.dtype.name}, expected {a.dtype.name}")
        out = self.fn(*tensors)
        return out if isinstance(out, Tensor) else tuple(out)

    def call_kernels(self, *values: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """The slow path: run the traced kernels one by one from Python (no C++ compiler needed). One call at a
        time: the plan's buffers are the arguments and results of every call."""
        from ember.engine.realize import run_items
        arrays = self._arrays_for(values)
        with self._lock:
            for buf, a in zip(self.plan.inputs, arrays, strict=True): buf.copyin(a)
            run_items(self.plan.items)
            outs = tuple(b.numpy().reshape(s) for b, s in zip(self.plan.outputs, self.plan.output_shapes,
                                                               strict=True))
        return outs[0] if self.single else outs

    def __repr__(self) -> str:
        sig = ", ".join(f"{a.dtype.name}{list(a.shape)}" for a in self.args)
        return f"<NumericalFunction {self.name}({sig}) -> {len(self.plan.outputs)} outputs, " \
               f"{len(self.plan.items)} kernels>"


def _dtype_words(dtype: DType) -> str:
    """How an argument of `dtype` is passed, in words: bfloat16, which numpy lacks, is passed as its raw bits."""
    if dtype is dtypes.bfloat16: return "bfloat16 (passed as its raw bits, a uint16 array: numpy has no bfloat16)"
    return str(np.dtype(to_numpy(dtype)))


def _python_ints_as(a: np.ndarray, want: np.dtype, where: str, dtype: DType) -> np.ndarray:
    """Python ints (int64, uint64 or object array `a`) as `want`, or OverflowError naming the first that does not
    fit: converting would wrap it silently."""
    info = np.iinfo(want)
    if a.size and (int(a.min()) < info.min or int(a.max()) > info.max):
        bad = next(int(x) for x in a.flat if not info.min <= int(x) <= info.max)
        raise OverflowError(f"{where} holds {bad}, out of the range of {dtype.name} [{info.min}, {info.max}]; pass "
                            f"values in that range, or a numpy array of another dtype to convert as numpy does")
    return a.astype(want)


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values (0.0 equal to -0.0), NaN where NaN."""
    if a.shape != b.shape or a.dtype != b.dtype: return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def placeholders_for(args: Sequence[Arg]) -> list[Tensor]:
    """Tensors standing for the arguments while a function is traced: buffers of their shapes and dtypes, whose
    values never matter (allocated when first used; no kernel runs to fill them)."""
    device = Device.DEFAULT
    return [Tensor._from_uop(UOp(Ops.RESHAPE, a.dtype, (buffer_uop(Buffer(device, prod(a.shape), a.dtype)),),
                                 a.shape), device) for a in args]


def _parameter_names(fn: Callable[..., Any], count: int) -> list[str]:
    """fn's parameter names, used in the C++ it exports; in0, in1, ... where they are not `count` distinct names."""
    try: names = [p.name for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY,
                                                                                          p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError): names = []
    names = names[:count]
    if len(names) != count or len(set(names)) != count: return [f"in{i}" for i in range(count)]
    return names


def numerical_function(name: str, *shapes: int | Sequence[int] | Arg) -> Callable[[Callable[..., Any]],
                                                                                NumericalFunction]:
    """Decorator: `@numerical_function("f", (3,), (2, 2))` makes a NumericalFunction of float64 arguments."""
    def wrap(fn: Callable[..., Any]) -> NumericalFunction:
        return NumericalFunction(name, fn, [s if isinstance(s, Arg) else Arg(s) for s in shapes])
    return wrap


def _plan(inputs: list[Buffer], outputs: list[Tensor]) -> Plan:
    """Schedule the outputs; run now the kernels that read only constants; sort the buffers by kind."""
    from ember.engine.realize import run_schedule
    device = Device.DEFAULT
    items, views = create_schedule([o.uop for o in outputs], device)
    out_bufs = [view_buffer(views[o.uop]) for o in outputs]
    written = {id(b) for item in items for b in item.bufs[:item.outs]}
    known = {id(b) for item in items for b in item.bufs[item.outs:] if id(b) not in written} - {id(b) for b in inputs}
    per_call: list[ExecItem | LoopItem] = []
    for item in items:
        if all(id(b) in known for b in item.bufs[item.outs:]) and \
                not any(w is b for w in item.bufs[:item.outs] for b in out_bufs):
            run_schedule([item])  # depends on constants alone: its results are constants too
            known.update(id(b) for b in item.bufs[:item.outs])
        else: per_call.append(item)
    seen: dict[int, Buffer] = {}
    for item in per_call:
        for b in item.bufs: seen.setdefault(id(b), b)
    constants = [b for i, b in seen.items() if i in known]
    fixed = {id(b) for b in inputs + out_bufs + constants}
    intermediates = [b for i, b in seen.items() if i not in fixed]
    return Plan(per_call, inputs, out_bufs, [o.shape for o in outputs], constants, intermediates)
