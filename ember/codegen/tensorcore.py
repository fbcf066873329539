"""TC: a matmul's tiles spread over the lanes of a warp and multiplied on a tensor core (renderer/tensorcore.py).

Before: a kernel with one `REDUCE(ADD)` of dtype_out over a product `x * y` of two values of dtype_in (each maybe
        CAST up to dtype_out, as Tensor.matmul casts half), whose ranges make it a matmul: an output axis m that
        only x moves with, an output axis n that only y moves with, and the reduce axis k that both move with
        (a batch axis, or a convolution's other axes, may move with both).
After (Opt(TC, k's axis, which tensor core) with the core's M x N x K):
        m, n and k padded to multiples of M, N and K (the steps past their ends gated off: loads give 0, stores
        write nothing); m = m' * M + (row of the lane's element), likewise n and k, per operand as the core's
        layout says; one WARP range of `threads` lanes (gpudims makes it thread index 0); each lane gathers its
        fragments of x and y as vectors and the REDUCE sums WMMA products over k':

    C[m, n] = sum_k A[m, k] * B[k, n]
    -> for each m', n' (workgroups) and lane l (32 threads), acc (4 floats) = sum_k' WMMA(
           [A[16m' + row_a(l, e), 16k' + col_a(l, e)] for e in 0..7], [B[16k' + row_b(l, e), 8n' + col_b(l, e)]
           for e in 0..3], 0);  C[16m' + row_c(l, e), 8n' + col_c(l, e)] = acc[e] for e in 0..3

The REDUCE's consumers (a cast back to half, a bias, an activation) are computed per element of the accumulator,
with m and n at that element's position. lower.py folds the sum into the WMMA's accumulator operand.
"""

from __future__ import annotations

from ember.renderer.tensorcore import TensorCore
from ember.uop.ops import AxisKind, Ops, UOp
from ember.uop.symbolic import symbolic
from ember.uop.upat import graph_rewrite, substitute


class TensorCoreError(ValueError):
    """Why a TC opt does not apply (opt.py raises it as a KernelOptError)."""


def operands(value: UOp, tc: TensorCore) -> tuple[UOp, UOp]:
    """The two factors of dtype_in of a product of dtype_out (each maybe cast up); TensorCoreError otherwise."""
    if value.op is not Ops.MUL or value.dtype != tc.dtype_out:
        raise TensorCoreError(f"the reduced value is not a product of {tc.dtype_out.name}")
    factors = tuple(s.src[0] if s.op is Ops.CAST and s.src[0].dtype == tc.dtype_in else s for s in value.src)
    if any(f.dtype != tc.dtype_in for f in factors):
        raise TensorCoreError(f"the factors are {', '.join(f.dtype.name for f in factors)}, not {tc.dtype_in.name}")
    return factors  # type: ignore[return-value]


def matmul_axes(sink: UOp, red: UOp, k: UOp) -> tuple[UOp, UOp, UOp, UOp]:
    """(x, y, m, n) of a REDUCE over k: x moves with output axis m and not y, y with n and not x (the innermost
    such axes), both with k."""
    x, y = red.src[0].src
    outputs = set.intersection(*(set(st.ranges) for st in sink.toposort() if st.op is Ops.STORE))
    if k not in x.ranges or k not in y.ranges: raise TensorCoreError("both factors must move with the reduce axis")

    def only(a: UOp, b: UOp) -> list[UOp]:
        return sorted((r for r in a.ranges if r in outputs and r not in b.ranges and r.src[0].op is Ops.CONST),
                      key=lambda r: r.arg.axis)
    if not only(x, y) or not only(y, x):
        x, y = y, x
        if not only(x, y) or not only(y, x):
            raise TensorCoreError("no output axis that moves with one factor only (not a matrix product)")
    return x, y, only(x, y)[-1], only(y, x)[-1]


def padded(sink: UOp, rng: UOp, multiple: int) -> tuple[UOp, UOp]:
    """(sink, the range) with `rng` padded to a multiple of `multiple`, every global access that moves with it gated
    to the steps inside its size."""
    size = int(rng.src[0].arg)
    if size % multiple == 0: return sink, rng
    wide = rng.replace(src=(UOp.const(rng.dtype, -(-size // multiple) * multiple),))
    inside = wide < size

    def gated(idx: UOp) -> UOp:  # INDEX(buf, offset[, gate]) valid only where the step is inside the size
        return idx.replace(src=(*idx.src[:2], inside if len(idx.src) < 3 else idx.src[2] & inside))
    sink = substitute(sink, {u: gated(u) for u in sink.toposort() if u.op is Ops.INDEX and
                             u.src[0].op is Ops.DEFINE_GLOBAL and rng in u.src[1].ranges})
    return substitute(sink, {rng: wide}), wide


def split(rng: UOp, tile: int, kind: AxisKind) -> UOp | int:
    """The outer part of `rng` (a multiple of `tile`) in steps of tiles: a range of size / tile, or 0."""
    size = int(rng.src[0].arg)
    return UOp.range(size // tile, rng.arg.axis, kind, rng.dtype) if size > tile else 0


def apply_tensor_core(sink: UOp, k: UOp, tc: TensorCore, fresh: int) -> UOp:
    """`sink` with its matmul over reduce axis `k` on tensor core `tc` (see the module docstring)."""
    if any(u.op is Ops.WMMA for u in sink.toposort()): raise TensorCoreError("already on a tensor core")
    if any(u.op is Ops.RANGE and u.arg.kind in (AxisKind.UPCAST, AxisKind.UNROLL, AxisKind.LOCAL)
           for u in sink.toposort()):
        raise TensorCoreError("TC comes first (before UPCAST, UNROLL, LOCAL and GROUP)")
    reduces = [u for u in sink.toposort() if u.op is Ops.REDUCE]
    if len(reduces) != 1 or reduces[0].arg is not Ops.ADD or k not in reduces[0].src[1:]:
        raise TensorCoreError("the kernel must have one sum, over the reduce axis")
    operands(reduces[0].src[0], tc)
    _, _, m, n = matmul_axes(sink, reduces[0], k)
    M, N, K = tc.dims
    for rng, multiple in ((m, M), (n, N), (k, K)):
        sink, wide = padded(sink, rng, multiple)
        m, n, k = (wide if r is rng else r for r in (m, n, k))
    red = next(u for u in sink.toposort() if u.op is Ops.REDUCE)
    x, y, _, _ = matmul_axes(sink, red, k)
    x, y = (f.src[0] if f.op is Ops.CAST and f.src[0].dtype == tc.dtype_in else f for f in (x, y))
    lane = UOp.range(tc.threads, fresh, AxisKind.WARP, m.dtype)
    m_o, n_o, k_o = split(m, M, m.arg.kind), split(n, N, n.arg.kind), split(k, K, AxisKind.REDUCE)

    def fragment(value: UOp, operand: str, rows: tuple[UOp, UOp | int, int], cols: tuple[UOp, UOp | int, int]
                 ) -> UOp:
        elements = []
        for e in range(tc.elements(operand)):
            row, col = tc.position(operand, lane, e)
            elements.append(substitute(value, {rows[0]: rows[1] * rows[2] + row, cols[0]: cols[1] * cols[2] + col}))
        return UOp(Ops.VECTORIZE, tc.dtype_in.vec(len(elements)), tuple(elements))

    a = fragment(x, "a", (m, m_o, M), (k, k_o, K))
    b = fragment(y, "b", (k, k_o, K), (n, n_o, N))
    acc = tc.dtype_out.vec(tc.elements("c"))
    product = UOp(Ops.WMMA, acc, (a, b, UOp(Ops.VECTORIZE, acc, (UOp.const(tc.dtype_out, 0),) * acc.count)), tc)
    rest = tuple(r for r in red.src[1:] if r is not k) + ((k_o,) if isinstance(k_o, UOp) else ())
    total = UOp(Ops.REDUCE, acc, (product, *rest), Ops.ADD) if rest else product
    stores = []
    for st in sink.src:
        if st.op is not Ops.STORE:
            stores.append(st)
            continue
        for e in range(tc.elements("c")):
            row, col = tc.position("c", lane, e)
            one = substitute(st, {red: UOp(Ops.GEP, tc.dtype_out, (total,), e)})
            stores.append(substitute(one, {m: m_o * M + row, n: n_o * N + col}))
    return graph_rewrite(sink.replace(src=tuple(stores)), symbolic, name="opt TC")

