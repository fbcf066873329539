"""Tensor cores as declarations: a matrix unit's shape, dtypes and how the lanes of a warp hold its fragments.

A tensor core computes D = A @ B + C for an M x K tile A, a K x N tile B and M x N tiles C and D, the `threads`
lanes of a warp together: each lane holds some elements of each tile (its fragment), and which lane holds which
element is fixed by the hardware. A layout says it bit by bit: a row or column index is a list of bits, lowest
first, each taken from the lane's index ("l3": bit 3 of the lane) or from the element's index in the lane's
fragment ("e1"). For the m16n8k16 MMA of sm_80 and newer (PTX ISA, "Matrix Fragments for mma.m16n8k16"), the
accumulator's element i of lane l sits at row (l >> 2) + 8 * (i >> 1) and column 2 * (l & 3) + (i & 1):

    c = (("l2", "l3", "l4", "e1"), ("e0", "l0", "l1"))

Who reads a declaration: codegen/tensorcore.py (the TC opt spreads a matmul's tiles over lanes and elements by
it), each renderer's WMMA (CUDA's mma.sync; OpenCL's reference, which gathers the fragments of a warp in local
memory and multiplies there, so that PoCL executes the fragment shuffling a GPU would), and the tests, which check
that every layout covers its tile once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from ember.dtype import DType, dtypes

Bits = tuple[str, ...]  # the bits of an index, lowest first: "l<b>" (bit b of the lane) or "e<b>" (of the element)
Layout = tuple[Bits, Bits]  # (row bits, column bits) of one operand's tile

Index = TypeVar("Index")  # an int, or a UOp (the lane as a thread index)


@dataclass(frozen=True)
class TensorCore:
    """A matrix unit: D (M x N, dtype_out) = A (M x K, dtype_in) @ B (K x N, dtype_in) + C, computed by `threads`
    lanes together, which hold the tiles as the layouts `a`, `b` and `c` (C and D alike) say."""

    name: str  # the instruction's shape, as the renderer spells it ("m16n8k16")
    dims: tuple[int, int, int]  # (M, N, K)
    dtype_in: DType
    dtype_out: DType
    threads: int
    a: Layout
    b: Layout
    c: Layout

    def __str__(self) -> str: return f"{self.name} {self.dtype_in.name}->{self.dtype_out.name}"

    def layout(self, operand: str) -> Layout:
        return {"a": self.a, "b": self.b, "c": self.c}[operand]

    def elements(self, operand: str) -> int:
        """How many elements of the operand's tile each lane holds."""
        return 2 ** sum(bit[0] == "e" for bits in self.layout(operand) for bit in bits)

    def position(self, operand: str, lane: Index, element: int) -> tuple[Index, Index]:
        """(row, column) in the operand's tile of element `element` of lane `lane`."""
        row, col = self.layout(operand)
        return index_of(row, lane, element), index_of(col, lane, element)


def index_terms(bits: Bits, element: int) -> tuple[int, list[tuple[int, int, int]]]:
    """The index whose bits are `bits` as (the element's part, a constant; the lane's runs): a run (b, n, p) is bits
    b..b+n-1 of the lane at positions p..p+n-1, (lane >> b) % 2**n << p, so that a lane expression stays short."""
    const, runs, p = 0, [], 0
    while p < len(bits):
        source, b = bits[p][0], int(bits[p][1:])
        n = 1
        if source == "e": const += ((element >> b) & 1) << p
        else:
            while p + n < len(bits) and bits[p + n] == f"l{b + n}": n += 1
            runs.append((b, n, p))
        p += n
    return const, runs


def index_of(bits: Bits, lane: Index, element: int) -> Index:
    """The index whose bits are `bits` for lane `lane` (an int, or a UOp: the thread index) and element `element`."""
    const, runs = index_terms(bits, element)
    total: Index = const  # type: ignore[assignment]
    for b, n, p in runs: total = total + lane // 2 ** b % 2 ** n * 2 ** p  # type: ignore[operator]
    return total


def c_index(bits: Bits, lane: str, element: int) -> str:
    """The index whose bits are `bits` as a C expression of the lane variable `lane`."""
    const, runs = index_terms(bits, element)
    return "+".join([str(const)] + [f"(({lane}>>{b})&{2 ** n - 1})*{2 ** p}" for b, n, p in runs])


# mma.sync.aligned.m16n8k16.row.col: A's element i of lane l at row (l >> 2) + 8 * ((i >> 1) & 1), column
# 2 * (l & 3) + (i & 1) + 8 * (i >> 2); B's at row 2 * (l & 3) + (i & 1) + 8 * (i >> 1), column l >> 2
MMA_16_8_16 = (("l2", "l3", "l4", "e1"), ("e0", "l0", "l1", "e2")), (("e0", "l0", "l1", "e1"), ("l2", "l3", "l4")), \
    (("l2", "l3", "l4", "e1"), ("e0", "l0", "l1"))

CUDA_TENSOR_CORES = tuple(TensorCore("m16n8k16", (16, 8, 16), dtype_in, dtypes.float32, 32, *MMA_16_8_16)
                          for dtype_in in (dtypes.float16, dtypes.bfloat16))
