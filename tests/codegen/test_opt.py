"""Opts (codegen/opt.py) change how a kernel runs, never what it computes; the heuristic's picks run right.

Oracle: the same kernel AST compiled with no opts (the NOOPT kernel). The single opts `Case.single_opts` lists for
each kernel below (UPCAST, THREAD and SWAP of output axes, UNROLL of reduce axes) and a few opt lists per kernel must
give its bits; float sums and matmuls, whose additions lane opts reorder (and fuse into fma), agree within
FLOAT_SUM_TOL of each element's sum of |terms| (bit for bit under THREAD and SWAP alone). Sizes are odd (1, 3, 17,
1023) and multiples of 8 and 16; inputs hold NaN, infinities and signed zeros where the kernel is elementwise or a
max; outputs start full of SENTINEL bytes, so an element no slice writes shows. Every kernel is built under SPEC=1.
Illegal opts raise KernelOptError naming the kernel, the opt and the reason. The heuristic's kernels are checked
against numpy in float64 on the CPU's renderer, and against NOOPT on renderers of other widths and core counts.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

import ember.mixin.reduce as reduce_mixin
from ember import Tensor
from ember.codegen import get_program
from ember.codegen.heuristic import hand_coded_opts, stride_one
from ember.codegen.opt import KernelOptError, Opt, OptOps, apply_opt, kernel_axes
from ember.codegen.periodic import split_periodic
from ember.codegen.rangeify import rangeify
from ember.device import Device
from ember.dtype import to_numpy
from ember.helpers import Context
from ember.renderer.cstyle import CRenderer
from ember.uop.ops import AxisKind, Ops, UOp
from tests.helpers import fresh_module_cache

LANE_AMOUNTS = {OptOps.UPCAST: (3, 4, 8, 16, 31), OptOps.UNROLL: (2, 3, 4, 16, 31, 32)}  # as single opts
THREAD_AMOUNTS = (2, 3)
FLOAT_SUM_TOL = {"float32": 1e-6, "float64": 1e-14}  # times the sum of |terms| of the element
SENTINEL = 0xAB  # the bytes outputs hold before a kernel runs: an element it does not write shows


@pytest.fixture(scope="module", autouse=True)
def fresh_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield from fresh_module_cache(tmp_path_factory)


def up(axis: int, amount: int) -> Opt: return Opt(OptOps.UPCAST, axis, amount)
def unroll(axis: int, amount: int) -> Opt: return Opt(OptOps.UNROLL, axis, amount)
def thread(axis: int, amount: int) -> Opt: return Opt(OptOps.THREAD, axis, amount)
def swap(axis: int, other: int) -> Opt: return Opt(OptOps.SWAP, axis, other)


# ---- inputs --------------------------------------------------------------------------------------------------------

def floats(shape: tuple[int, ...], dtype: str = "float32", seed: int = 0, special: bool = False) -> np.ndarray:
    """Uniform values in [-2, 2); with `special`, NaN, +-inf and +-0 at a few places (and ties at others)."""
    x = np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype)
    if special:
        flat = x.reshape(-1)
        for i, v in zip(range(0, flat.size, 5), [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0], strict=False): flat[i] = v
    return x


def ints(shape: tuple[int, ...], seed: int = 0, bound: int = 50) -> np.ndarray:
    return np.random.default_rng(seed).integers(-bound, bound, shape).astype(np.int32)


def pair(shape: tuple[int, ...], dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """Two inputs with specials in different places; y equals x at some places (ties of maximum and comparisons)."""
    x, y = floats(shape, dtype, 1, special=True), floats(shape, dtype, 2)
    y.reshape(-1)[1::7] = x.reshape(-1)[1::7]
    y.reshape(-1)[3::11] = np.nan
    return x, y


# ---- kernels --------------------------------------------------------------------------------------------------------

def elementwise_float(n: int, dtype: str = "float32") -> Callable[[], tuple[Tensor, None]]:
    def build() -> tuple[Tensor, None]:
        x, y = (Tensor(a) for a in pair((n,), dtype))
        value = (x > y).where(x.maximum(y), x.relu() - y) * 0.5 + (x == y).cast(dtype) + x.maximum(0.25)
        return value + (x * 8).cast("int32").cast(dtype), None
    return build


def elementwise_int(n: int) -> Callable[[], tuple[Tensor, None]]:
    def build() -> tuple[Tensor, None]:
        x, y = Tensor(ints((n,), 1)), Tensor(ints((n,), 2, bound=3))
        value = x.maximum(y) * 3 - (x < y).cast("int32") + (x >= 0).where(x // 7, y)
        return value + (x.cast("float32") * 0.75).cast("int32"), None
    return build


def matmul(m: int, k: int, n: int) -> Callable[[], tuple[Tensor, np.ndarray]]:
    def build() -> tuple[Tensor, np.ndarray]:
        a, b = floats((m, k), seed=3), floats((k, n), seed=4)
        return Tensor(a) @ Tensor(b), np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return build


def summed(shape: tuple[int, ...], axis: int | None, dtype: str = "float32",
           view: Callable[[Tensor], Tensor] = lambda t: t,
           np_view: Callable[[np.ndarray], np.ndarray] = lambda a: a) -> Callable[[], tuple[Tensor, np.ndarray]]:
    def build() -> tuple[Tensor, np.ndarray]:
        x = floats(shape, dtype, seed=5)
        return view(Tensor(x)).sum(axis), np.abs(np_view(x).astype(np.float64)).sum(axis).reshape(-1)
    return build


def maxed(shape: tuple[int, ...], axis: int) -> Callable[[], tuple[Tensor, None]]:
    def build() -> tuple[Tensor, None]:
        x = floats(shape, seed=6)
        x[1, 2] = np.nan  # a NaN, an inf, and a line of -inf holding one -0.0
        x[2, 5] = np.inf
        x[3] = -np.inf
        x[3, -1] = -0.0
        return Tensor(x).max(axis=axis), None
    return build


def int_sum(shape: tuple[int, ...]) -> Callable[[], tuple[Tensor, None]]:
    def build() -> tuple[Tensor, None]:
        big = ints(shape, 7) * 40_000_000  # sums wrap around, the same in any order
        return Tensor(big).sum(1, dtype="int32"), None
    return build


def padded(shape: tuple[int, ...], padding: tuple[tuple[int, int], ...]) -> Callable[[], tuple[Tensor, None]]:
    def build() -> tuple[Tensor, None]:
        return Tensor(floats(shape, seed=8, special=True)).pad(padding) * 2 + 1, None
    return build


def sliced(shape: tuple[int, ...], index: tuple[slice, ...]) -> Callable[[], tuple[Tensor, None]]:
    def build() -> tuple[Tensor, None]:
        return Tensor(floats(shape, seed=9, special=True))[index] * 3 - 1, None
    return build


def indexed(rows: int, cols: int, picks: list[int]) -> Callable[[], tuple[Tensor, None]]:
    def build() -> tuple[Tensor, None]:
        table = floats((rows, cols), seed=10)
        return Tensor(table)[Tensor(np.array(picks, dtype=np.int32))] + 1, None
    return build


def gathered(rows: int, cols: int) -> Callable[[], tuple[Tensor, None]]:
    def build() -> tuple[Tensor, None]:
        table = floats((rows, cols), seed=11)
        index = np.random.default_rng(12).integers(0, cols, (rows, cols)).astype(np.int32)
        return Tensor(table).gather(1, Tensor(index)) * 2, None
    return build


@dataclass(frozen=True)
class Case:
    """A one-kernel computation: `build` gives its value and, for float sums, the sum of |terms| of each element
    (None: the result must be exact); `axes` the sizes of its kernel_axes (output axes, then `reduces` reduce axes);
    `lists` opt lists to try besides the single opts."""

    name: str
    build: Callable[[], tuple[Tensor, np.ndarray | None]]
    axes: tuple[int, ...]
    reduces: int = 0
    lists: tuple[tuple[Opt, ...], ...] = ()

    def is_reduce(self, axis: int) -> bool: return axis >= len(self.axes) - self.reduces

    def single_opts(self) -> list[Opt]:
        """Each lane amount of LANE_AMOUNTS (and the whole axis, up to 32) that divides an axis: all of them on the
        last output axis and the reduce axes, the smallest on other output axes; THREAD_AMOUNTS on output axes;
        SWAP of each two output axes."""
        opts, outputs = [], len(self.axes) - self.reduces
        for axis, size in enumerate(self.axes):
            op = OptOps.UNROLL if self.is_reduce(axis) else OptOps.UPCAST
            amounts = sorted({a for a in LANE_AMOUNTS[op] if size % a == 0} | ({size} if 1 < size <= 32 else set()))
            opts += [Opt(op, axis, a) for a in (amounts if op is OptOps.UNROLL or axis == outputs - 1 else amounts[:1])]
            if op is OptOps.UPCAST: opts += [thread(axis, a) for a in THREAD_AMOUNTS if size % a == 0]
        return opts + [swap(a, b) for a in range(outputs) for b in range(a + 1, outputs)]


GEMM_LIST = (up(1, 32), up(0, 4), thread(0, 2))  # a GEMM's 4x32 register tile (AVX-512: 4x2 vectors), 2 cores
CASES = [
    Case("elementwise_f32_3", elementwise_float(3), (3,)),
    Case("elementwise_f32_17", elementwise_float(17), (17,), lists=((up(0, 8),), (up(0, 4), up(0, 2)))),  # padded
    Case("elementwise_f32_1023", elementwise_float(1023), (1023,),
         lists=((up(0, 31), up(0, 3)), (thread(0, 3), up(0, 11)))),
    Case("elementwise_f32_64", elementwise_float(64), (64,),
         lists=((up(0, 16), up(0, 4)), (up(0, 8), thread(0, 2)), (thread(0, 2), up(0, 32)))),
    Case("elementwise_f64_48", elementwise_float(48, "float64"), (48,), lists=((up(0, 8), up(0, 3), thread(0, 2)),)),
    Case("elementwise_i32_17", elementwise_int(17), (17,), lists=((up(0, 16),),)),
    Case("elementwise_i32_1023", elementwise_int(1023), (1023,)),
    Case("elementwise_i32_48", elementwise_int(48), (48,), lists=((up(0, 16), up(0, 3)),)),
    Case("relu_2d_4x32", lambda: (Tensor(floats((4, 32), special=True)).relu(), None), (4, 32),
         lists=((up(1, 16), up(0, 4)), (up(0, 2), up(1, 8), thread(0, 2)), (swap(0, 1), up(0, 16)),
                (up(1, 16), swap(0, 1), thread(1, 2)))),
    Case("row_sum_3x17", summed((3, 17), 1), (3, 17), 1, lists=((unroll(1, 17), up(0, 3)), (up(0, 2), unroll(1, 17)))),
    Case("row_sum_17x1023", summed((17, 1023), 1), (17, 1023), 1, lists=((unroll(1, 31), unroll(1, 3)),)),
    Case("row_sum_8x64", summed((8, 64), 1), (8, 64), 1,
         lists=((unroll(1, 16), unroll(1, 2)), (up(0, 4), unroll(1, 16), thread(0, 2)))),
    Case("col_sum_17x3", summed((17, 3), 0), (3, 17), 1, lists=((up(0, 4),),)),
    Case("col_sum_1023x16", summed((1023, 16), 0), (16, 1023), 1,
         lists=((up(0, 16), unroll(0, 3)), (up(0, 4), unroll(1, 31), thread(0, 2)))),
    Case("full_sum_1023", summed((1023,), None), (1023,), 1, lists=((unroll(0, 3), unroll(0, 11)),)),
    Case("full_sum_4096", summed((4096,), None), (4096,), 1, lists=((unroll(0, 16), unroll(0, 4)),)),
    Case("full_sum_f64_1023", summed((1023,), None, "float64"), (1023,), 1),
    Case("int_row_sum_16x48", int_sum((16, 48)), (16, 48), 1, lists=((unroll(1, 16), up(0, 4), thread(0, 2)),)),
    Case("row_max_17x1023", maxed((17, 1023), 1), (17, 1023), 1, lists=((unroll(1, 31), unroll(1, 3)),)),
    Case("col_max_16x32", maxed((16, 32), 0), (32, 16), 1, lists=((up(0, 16), unroll(1, 4)),)),
    Case("matmul_3x17x5", matmul(3, 17, 5), (3, 5, 17), 1,
         lists=((up(1, 5), up(0, 3)), (unroll(2, 17), up(1, 5), thread(0, 3)), (up(1, 8), up(0, 2)))),
    Case("matmul_64x48x32", matmul(64, 48, 32), (64, 32, 48), 1,
         lists=(GEMM_LIST, (up(1, 16), up(0, 4), unroll(2, 4)),
                (thread(0, 2), up(1, 16), up(0, 8)), (up(1, 16), up(1, 2), unroll(1, 16)),
                (up(1, 16), up(0, 4), swap(0, 1)), (up(1, 8), up(0, 4), swap(0, 1), thread(0, 4)))),
    Case("matmul_5x1023x16", matmul(5, 1023, 16), (5, 16, 1023), 1, lists=((up(1, 16), up(0, 5), unroll(0, 3)),)),
    Case("pad_1021", padded((1021,), ((1, 1),)), (1023,), lists=((up(0, 16), thread(0, 2)),)),
    Case("pad_30", padded((30,), ((1, 1),)), (32,), lists=((up(0, 8), up(0, 4)),)),
    Case("pad_2d_3x17", padded((3, 17), ((1, 2), (3, 0))), (20,)),
    Case("padded_row_sum_30x14", summed((30, 14), 1, view=lambda t: t.pad(((1, 1), (1, 1))),
                                        np_view=lambda a: np.pad(a, ((1, 1), (1, 1)))), (32, 16), 1,
         lists=((unroll(1, 16), up(0, 4)),)),
    Case("stride_2_of_2048", sliced((2048,), (slice(None, None, 2),)), (1024,)),
    Case("slice_8x32", sliced((8, 32), (slice(1, None, 2), slice(3, None))), (29,)),
    Case("index_rows_17x64", indexed(17, 64, [3, 0, 16, 3, 5, 9]), (6, 64), lists=((up(1, 16), up(0, 3)),)),
    Case("gather_72x32", gathered(72, 32), (72, 32), lists=((up(1, 16), thread(0, 2)), (up(0, 3), up(1, 4)))),
]
CASE_BY_NAME = {c.name: c for c in CASES}


# ---- running a kernel with opts --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kernel:
    ast: UOp
    inputs: tuple[np.ndarray, ...]
    outputs: tuple[tuple[int, np.dtype], ...]  # (elements, dtype) of each output buffer
    terms: np.ndarray | None  # the sum of |terms| of each element, for a float sum; None: exact


@functools.cache
def kernel_of(name: str) -> Kernel:
    value, terms = CASE_BY_NAME[name].build()
    (item,) = value.schedule()
    inputs = tuple(b.numpy() for b in item.bufs[item.outs:])
    outputs = tuple((b.size, np.dtype(to_numpy(b.dtype))) for b in item.bufs[:item.outs])
    return Kernel(item.ast, inputs, outputs, None if terms is None else terms.reshape(-1))


def run_kernel(kernel: Kernel, opts: list[Opt], renderer: CRenderer | None = None) -> list[np.ndarray]:
    """The kernel compiled with exactly `opts` (every stage checked: SPEC=1), run once on fresh outputs full of
    SENTINEL bytes. A threaded kernel runs here one slice after another, last core first, each call given its core
    number (the argument the pool passes): this tests what THREAD does to the kernel; the pool that runs the slices
    at once is tests/runtime/test_thread_pool.py's subject (and has a bug that would crash this module's process,
    see test_fewer_threads_after_more there)."""
    device = Device["CPU"]
    with Context(SPEC=1): spec = get_program(kernel.ast, renderer or device.renderer, opts=opts)
    assert spec.opts == tuple(opts)
    program = device.program(dataclasses.replace(spec, global_size=(1,)), device.compiler.compile_cached(spec.src))
    outputs = [np.full(size * dtype.itemsize, SENTINEL, np.uint8).view(dtype) for size, dtype in kernel.outputs]
    if spec.threads == 1: program(*outputs, *kernel.inputs)
    else:
        for core in reversed(range(spec.threads)): program(*outputs, *kernel.inputs, vals=(core,))
    return outputs


@functools.cache
def reference(name: str) -> tuple[np.ndarray, ...]:
    return tuple(run_kernel(kernel_of(name), []))


def assert_same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal bits, but any NaN equals any NaN (its sign and payload are not ember's to promise)."""
    if got.dtype.kind == "f":
        bits = np.dtype(f"u{got.dtype.itemsize}")
        differ = (got.view(bits) != want.view(bits)) & ~(np.isnan(got) & np.isnan(want))
    else:
        differ = got != want
    if differ.any():
        first = int(np.flatnonzero(differ)[0])
        raise AssertionError(f"{what}: {int(differ.sum())} of {got.size} elements differ from the NOOPT kernel's; "
                             f"first at {first}: {got[first]!r}, NOOPT {want[first]!r}")


def assert_close_sums(got: np.ndarray, want: np.ndarray, terms: np.ndarray, what: str) -> None:
    """|got - want| within FLOAT_SUM_TOL of the element's sum of |terms| (reordered additions round differently)."""
    bound = FLOAT_SUM_TOL[got.dtype.name] * terms
    error = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert np.isfinite(got).all(), f"{what}: non-finite sums {got[~np.isfinite(got)][:4]}"
    if (bad := ~(error <= bound)).any():
        first = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {got.size} elements off by more than the bound; first at "
                             f"{first}: {got[first]!r}, NOOPT {want[first]!r}, bound {bound[first]:.3g}")


def assert_like_noopt(name: str, opts: list[Opt], got: list[np.ndarray]) -> None:
    """`got` (the kernel `name` run with `opts`) is the NOOPT kernel's output: its bits, or close for float sums."""
    kernel, what = kernel_of(name), f"{name} with {[str(o) for o in opts]}"
    in_order = all(o.op in (OptOps.THREAD, OptOps.SWAP) for o in opts)  # each sum adds its terms as NOOPT does
    for g, w in zip(got, reference(name), strict=True):
        if kernel.terms is None or in_order: assert_same_bits(g, w, what)
        else: assert_close_sums(g, w, kernel.terms, what)


def check_opts(name: str, opts: list[Opt]) -> None:
    assert_like_noopt(name, opts, run_kernel(kernel_of(name), opts))


SINGLE = [(c.name, opt) for c in CASES for opt in c.single_opts()]
LISTS = [(c.name, opts) for c in CASES for opts in c.lists]


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_declared_axes(name: str) -> None:
    """The kernel has the loops its Case says (so the opts tried are the legal ones), and NOOPT writes every output
    element."""
    case, kernel = CASE_BY_NAME[name], kernel_of(name)
    axes = kernel_axes(split_periodic(rangeify(kernel.ast)))
    assert [int(a.src[0].arg) for a in axes] == list(case.axes)
    assert [a.arg.kind is AxisKind.REDUCE for a in axes] == [case.is_reduce(i) for i in range(len(axes))]
    (out,) = reference(name)
    assert not (out.view(np.uint8) == SENTINEL).reshape(out.size, -1).all(axis=1).any(), "an element is not written"


@pytest.mark.parametrize("name, opt", SINGLE, ids=[f"{n}-{o}" for n, o in SINGLE])
def test_single_opt(name: str, opt: Opt) -> None:
    check_opts(name, [opt])


@pytest.mark.parametrize("name, opts", LISTS, ids=[f"{n}-{'-'.join(map(str, o))}" for n, o in LISTS])
def test_opt_list(name: str, opts: tuple[Opt, ...]) -> None:
    check_opts(name, list(opts))


def test_every_odd_size_kernel_has_opts_tried() -> None:
    """The sizes the design names (3, 17, 1023) each get opts; size 1 has no loop for an opt to split."""
    sizes = {s for name, _ in SINGLE for s in CASE_BY_NAME[name].axes}
    assert {3, 17, 1023} <= sizes
    value = Tensor(floats((1,), special=True)).relu()
    (item,) = value.schedule()
    assert kernel_axes(split_periodic(rangeify(item.ast))) == []
    with pytest.raises(KernelOptError, match="no axis 0"):
        get_program(item.ast, Device["CPU"].renderer, opts=[up(0, 2)])


# ---- illegal opts ------------------------------------------------------------------------------------------------

def sink_of(name: str) -> UOp:
    return split_periodic(rangeify(kernel_of(name).ast))


ILLEGAL = [
    ("row_sum_3x17", up(2, 3), r"no axis 2 \(2 axes\)"),
    ("row_sum_3x17", up(-1, 3), r"no axis -1"),
    ("elementwise_f32_17", up(0, 34), r"34 does not divide the size 17 \(an UPCAST that does not divide its axis "
                                      r"must be less than twice its size\)"),
    ("elementwise_f32_17", up(0, 1), r"1 does not divide the size 17"),
    ("elementwise_f32_17", thread(0, 0), r"0 does not divide the size 17"),
    ("row_sum_8x64", unroll(0, 2), r"axis 0 is an output axis; UNROLL applies to reduce axes"),
    ("row_sum_8x64", up(1, 4), r"axis 1 is a reduce axis; UPCAST applies to output axes"),
    ("row_sum_8x64", thread(1, 2), r"axis 1 is a reduce axis; THREAD applies to output axes"),
    ("row_sum_8x64", unroll(1, 3), r"3 does not divide the size 64"),
    ("matmul_3x17x5", swap(0, 0), r"SWAP needs two different output axes"),
    ("matmul_3x17x5", swap(0, 2), r"SWAP needs two different output axes"),
    ("matmul_3x17x5", swap(2, 1), r"SWAP needs two different output axes"),
    ("matmul_3x17x5", swap(1, 3), r"SWAP needs two different output axes"),
    ("matmul_3x17x5", swap(3, 0), r"no axis 3 \(3 axes\)"),
]


@pytest.mark.parametrize("name, opt, message", ILLEGAL, ids=[f"{n}-{o}" for n, o, _ in ILLEGAL])
def test_illegal_opt_raises(name: str, opt: Opt, message: str) -> None:
    with pytest.raises(KernelOptError, match=rf"^my_kernel: {opt}: .*{message}"):
        apply_opt(sink_of(name), opt, "my_kernel")


def test_thread_twice_raises() -> None:
    sink = apply_opt(sink_of("relu_2d_4x32"), thread(0, 2))
    with pytest.raises(KernelOptError, match=r"TH1x2: threaded twice"): apply_opt(sink, thread(1, 2))
    with pytest.raises(KernelOptError, match=r"TH0x2: threaded twice"): apply_opt(sink, thread(0, 2))


def test_axis_numbers_shift_when_an_axis_is_used_up() -> None:
    """UPCAST by the whole size leaves no outer loop: the next axis takes its number (the GEMM list relies on it)."""
    sink = apply_opt(sink_of("matmul_64x48x32"), up(1, 32))
    assert [int(a.src[0].arg) for a in kernel_axes(sink)] == [64, 48]
    with pytest.raises(KernelOptError, match=r"axis 1 is a reduce axis"): apply_opt(sink, up(1, 4))


def test_swap_renumbers_the_axes() -> None:
    """Axis numbers follow loop nesting, so after SWAP(0, 1) axis 0 is the loop that was axis 1 (the relu lists and
    the heuristic's GEMM list rely on it)."""
    sink = apply_opt(sink_of("matmul_3x17x5"), swap(0, 1))
    assert [int(a.src[0].arg) for a in kernel_axes(sink)] == [5, 3, 17]
    assert [int(a.src[0].arg) for a in kernel_axes(apply_opt(sink, swap(1, 0)))] == [3, 5, 17]


def test_get_program_names_the_kernel_in_the_error() -> None:
    kernel = kernel_of("row_sum_3x17")
    with pytest.raises(KernelOptError, match=r"^r_3: UP1x17: axis 1 is a reduce axis"):
        get_program(kernel.ast, Device["CPU"].renderer, opts=[up(1, 17)])
    with pytest.raises(KernelOptError, match=r"^named: UP0x3: no axis 0 \(0 axes\)"):
        get_program(kernel.ast, Device["CPU"].renderer, name="named", opts=[unroll(1, 17), up(0, 3), up(0, 3)])


# ---- the heuristic -----------------------------------------------------------------------------------------------

def rows_softmax(x: Tensor) -> Tensor: return x.softmax(1)


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


HEURISTIC = [  # name, inputs, ember, numpy in float64, tolerance
    ("matmul_64x48x32", [(64, 48), (48, 32)], lambda a, b: a @ b, lambda a, b: a @ b, 1e-5),
    ("elementwise_4096", [(4096,), (4096,)], lambda a, b: (a * b + 1).relu().maximum(b),
     lambda a, b: np.maximum(np.maximum(a * b + 1, 0), b), 1e-6),
    ("sum_4096", [(4096,)], lambda a: a.sum(), lambda a: a.sum(), 1e-5),
    ("softmax_rows_16x256", [(16, 256)], rows_softmax, np_softmax, 1e-5),
    # an MLP's three layouts: forward x @ w.T (dot products), the weight gradient g.T @ x, the input one g @ w
    ("matmul_a_bT_24x64x40", [(24, 64), (40, 64)], lambda a, b: a @ b.T, lambda a, b: a @ b.T, 1e-5),
    ("matmul_aT_b_64x24x48", [(64, 24), (64, 48)], lambda a, b: a.T @ b, lambda a, b: a.T @ b, 1e-5),
    ("masked_matmul_32x48x64", [(32, 48), (32, 48), (48, 64)], lambda g, h, w: (g * (h > 0)) @ w,
     lambda g, h, w: (g * (h > 0)) @ w, 1e-5),
]


@pytest.mark.parametrize("name", ["matmul_a_bT_24x64x40", "matmul_aT_b_64x24x48", "masked_matmul_32x48x64"])
def test_heuristic_vectorizes_without_gathers(name: str) -> None:
    """The vector axis is one no access gathers along (a (g * mask) @ w once vectorized the sum, so every load
    of w was 16 scalar loads: 265 ms for an MLP's 256x512x512 gradient, 0.9 ms after)."""
    _, shapes, fn, _, _ = next(h for h in HEURISTIC if h[0] == name)
    (item,) = fn(*(Tensor(floats(s, seed=3)) for s in shapes)).schedule()
    renderer = Device["CPU"].renderer
    if renderer.vector_bytes == 0: pytest.skip("no vectors on this CPU")
    with Context(NOOPT=0): spec = get_program(item.ast, renderer)
    loads = [u for u in spec.uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_GLOBAL]
    assert any(u.dtype.count > 1 for u in loads), f"{spec.opts}: no vector load"
    gep_loads = [u for u in spec.uops if u.op is Ops.VECTORIZE and all(s.op is Ops.LOAD for s in u.src) and
                 len(set(u.src)) > 1]  # lanes loaded one by one (one load in every lane is a broadcast)
    assert not gep_loads, f"{spec.opts}: a gather"


@pytest.mark.parametrize("name, shapes, fn, oracle, tol", HEURISTIC, ids=[h[0] for h in HEURISTIC])
def test_heuristic_picks_opts_and_runs_right(name: str, shapes: list[tuple[int, ...]], fn: Callable,
                                             oracle: Callable, tol: float) -> None:
    renderer = Device["CPU"].renderer
    inputs = [floats(s, seed=20 + i) for i, s in enumerate(shapes)]
    value = fn(*(Tensor(a) for a in inputs))
    with Context(NOOPT=0):
        picked = [get_program(item.ast, renderer).opts for item in value.schedule()]
        if renderer.vector_bytes > 0: assert all(picked), f"{name}: a kernel got no opts: {picked}"
        got = value.numpy()
    want = oracle(*(a.astype(np.float64) for a in inputs))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.abs(want).max()))


OTHER_RENDERERS = [CRenderer(64, 4), CRenderer(32, 3), CRenderer(16, 2), CRenderer(0, 2)]
HEURISTIC_KERNELS = ["matmul_64x48x32", "row_sum_8x64", "col_sum_1023x16", "full_sum_4096", "elementwise_i32_48",
                     "pad_30"]


@pytest.mark.parametrize("vector_bytes, cores", [(r.vector_bytes, r.cores) for r in OTHER_RENDERERS])
def test_heuristic_on_other_renderers(vector_bytes: int, cores: int) -> None:
    """The heuristic's opts for a CPU of another vector width or core count are legal and give the NOOPT values
    (GCC vector types of any width compile on any x86 or ARM CPU)."""
    renderer = CRenderer(vector_bytes, cores)
    for name in HEURISTIC_KERNELS:
        with Context(NOOPT=0): opts = list(get_program(kernel_of(name).ast, renderer).opts)
        if vector_bytes == 0: assert all(o.op is OptOps.THREAD for o in opts), f"{name}: {opts} without vectors"
        assert_like_noopt(name, opts, run_kernel(kernel_of(name), opts, renderer))


def test_heuristic_threads_big_kernels_only() -> None:
    big, small = sink_of("matmul_64x48x32"), sink_of("row_sum_8x64")
    assert any(o.op is OptOps.THREAD for o in hand_coded_opts(big, CRenderer(64, 4)))
    assert not any(o.op is OptOps.THREAD for o in hand_coded_opts(big, CRenderer(64, 1)))
    assert not any(o.op is OptOps.THREAD for o in hand_coded_opts(small, CRenderer(64, 4)))
    assert hand_coded_opts(big, CRenderer(0, 1)) == []


def test_noopt_gives_no_opts() -> None:
    kernel = kernel_of("matmul_64x48x32")
    with Context(NOOPT=1): spec = get_program(kernel.ast, CRenderer(64, 4))
    assert spec.opts == () and spec.threads == 1
    with Context(NOOPT=0): spec = get_program(kernel.ast, CRenderer(64, 4))
    assert spec.opts and spec.threads == 4


def test_stride_one_within_aligned_groups() -> None:
    """A matmul's right operand in panels one vector wide, offset (j//16)*K*16 + k*16 + j%16: stride one inside
    each group of 16 values of j (a vector's lanes), not across groups."""
    j = UOp.range(64, 0, AxisKind.GLOBAL)
    k = UOp.range(8, 1, AxisKind.REDUCE)
    offset = (j // 16) * (8 * 16) + k * 16 + j % 16
    assert stride_one(offset, j, 16)
    assert not stride_one(offset, j) and not stride_one(offset, j, 32) and not stride_one(offset, k, 16)


@pytest.mark.parametrize("shapes", [[(48, 64), (64, 32)], [(3, 24, 16), (3, 16, 48)]])
def test_matmul_in_panels_runs_right_and_vectorized(shapes: list[tuple[int, ...]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """From PANEL_MACS multiply-adds, matmul copies its right operand into panels one vector wide: the product reads
    them in vectors (no gather), values and gradients as numpy's."""
    renderer = Device["CPU"].renderer
    if renderer.vector_bytes == 0: pytest.skip("no vectors on this CPU")
    monkeypatch.setattr(reduce_mixin, "PANEL_MACS", 1)
    a, b = (floats(s, seed=9 + i) for i, s in enumerate(shapes))
    tb = Tensor(b, requires_grad=True)
    out = Tensor(a) @ tb
    items = out.schedule()
    assert len(items) == 2, "a panel copy, then the product"
    with Context(NOOPT=0): spec = get_program(items[-1].ast, renderer)
    assert any(u.op is Ops.LOAD and u.dtype.count > 1 for u in spec.uops), spec.opts
    assert not [u for u in spec.uops if u.op is Ops.VECTORIZE and all(s.op is Ops.LOAD for s in u.src) and
                len(set(u.src)) > 1], f"{spec.opts}: a gather"
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    np.testing.assert_allclose(tb.grad.numpy(), np.swapaxes(a, -1, -2) @ np.ones_like(want), rtol=1e-5, atol=1e-5)
