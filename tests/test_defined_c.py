"""What C leaves undefined has one answer in ember, torch's: shifts by amounts outside [0, bits) and float to integer
casts of NaN, infinities and values out of range (dtype.float_to_int states the rule).

Oracle: torch 2.13.0 CPU where it has the op (signed types and uint8), numpy (uint16-64 shifts) and the rule itself
for uint32/uint64 conversions out of range, where torch's answers are artifacts of its vector code. The generated
kernel, the constant folder (exec_alu) and NumericalFunction's numpy interpreter must all give the same answer.
"""

import math

import numpy as np
import pytest
import torch

from ember import Tensor
from ember.dtype import dtypes, float_to_int, to_dtype, truncate
from ember.export import Arg, NumericalFunction
from ember.uop.interpret import exec_alu
from ember.uop.ops import Ops

SIGNED = ["int8", "int16", "int32", "int64"]
UNSIGNED = ["uint8", "uint16", "uint32", "uint64"]


def amounts(bits: int) -> list[int]:
    return [-100, -40, -1, 0, 1, bits - 1, bits, bits + 1, 40, 63, 64, 100]


def shift_oracle(dtype: str, a: np.ndarray, b: np.ndarray, op: str) -> np.ndarray:
    if dtype in SIGNED or dtype == "uint8":
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        return (ta << tb if op == "<<" else ta >> tb).numpy()
    return np.left_shift(a, b) if op == "<<" else np.right_shift(a, b)  # torch has no uint16-64 shifts


@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED)
@pytest.mark.parametrize("op", ["<<", ">>"])
def test_shift_by_any_amount_matches_torch(dtype, op):
    bits = 8 * np.dtype(dtype).itemsize
    b = np.array(amounts(bits), dtype=np.int64 if dtype in SIGNED else np.int64)
    a = np.array([1, -3, 5, -128, 127, 7, -1, 2, -8, 3, 1, -5][:len(b)]).astype(dtype)
    b = b.astype(dtype) if dtype in SIGNED else np.where(b < 0, 200, b).astype(dtype)  # torch wants one dtype
    want = shift_oracle(dtype, a, b, op)
    got = (Tensor(a) << Tensor(b) if op == "<<" else Tensor(a) >> Tensor(b)).numpy()
    np.testing.assert_array_equal(got, want, err_msg=f"{dtype} {op} {b.tolist()}")


@pytest.mark.parametrize("amount", [-1, 40, 31, 32])
def test_shift_by_a_constant_amount_is_folded_and_rendered_alike(amount):
    """A constant amount reaches the renderer as a CONST (no range test needed inside [0, bits)), and shifts of two
    constants fold in exec_alu: both agree with torch."""
    a = np.array([1, -3, 2**30], np.int32)
    ta = torch.from_numpy(a)
    want_l = (ta << torch.tensor(amount, dtype=torch.int32)).numpy()
    want_r = (ta >> torch.tensor(amount, dtype=torch.int32)).numpy()
    np.testing.assert_array_equal((Tensor(a) << amount).numpy(), want_l)
    np.testing.assert_array_equal((Tensor(a) >> amount).numpy(), want_r)
    for value, wl, wr in zip(a.tolist(), want_l.tolist(), want_r.tolist()):
        assert exec_alu(Ops.SHL, dtypes.int32, (value, amount)) == wl
        assert exec_alu(Ops.SHR, dtypes.int32, (value, amount)) == wr
        both = Tensor.full((2,), value, dtype="int32") << Tensor.full((2,), amount, dtype="int32")
        assert both.tolist() == [wl] * 2


VALUES = [math.nan, math.inf, -math.inf, 1e20, -1e20, 2.0**63, -2.0**63, 2.0**64, 1.8e19, 3e9, -3e9, 2.0**31,
          -2.0**31, 2147483520.0, 300.7, -300.7, 65535.9, -5.5, -0.9, 0.9, 0.0, 255.5, 128.0, -129.0]


@pytest.mark.parametrize("src", ["float32", "float64"])
@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED)
def test_float_to_int_cast_matches_torch(src, dtype):
    x = np.array(VALUES, dtype=src)
    got = Tensor(x).cast(dtype).numpy()
    rule = np.array([truncate(float(v), to_dtype(dtype)) for v in x], dtype=dtype)
    np.testing.assert_array_equal(got, rule, err_msg=f"{src} -> {dtype}: the kernel against dtype.float_to_int")
    want = torch.from_numpy(x).to(getattr(torch, dtype)).numpy()
    if dtype in ("uint32", "uint64"):  # torch's out-of-range answers there come from its vector code: in range only
        low, high = (-2.0**31, 2.0**32) if dtype == "uint32" else (-2.0**63, 2.0**64)
        keep = (x >= low) & (x < high)
        got, want = got[keep], want[keep]
    np.testing.assert_array_equal(got, want, err_msg=f"{src} -> {dtype} against torch")


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint64"])
def test_float_to_int_is_one_rule_in_folder_kernel_and_interpreter(dtype):
    d = to_dtype(dtype)
    x = np.array(VALUES, np.float64)
    folded = [exec_alu(Ops.CAST, d, (float(v),), dtypes.float64) for v in x]
    single = [Tensor(float(v), dtype="float64").cast(dtype).item() for v in x[:6]]  # a constant: folded, or not
    assert single == folded[:6]
    f = NumericalFunction(f"cast_{dtype}", lambda t: t.cast(dtype), [Arg(len(x), "float64")])
    np.testing.assert_array_equal(f.interpret(x), np.array(folded, dtype=dtype))
    np.testing.assert_array_equal(Tensor(x).cast(dtype).numpy(), np.array(folded, dtype=dtype))


def test_float_to_int_rule_in_words():
    """The rule's stated values, not derived from the implementation: minimum of int32/int64 for NaN and out of
    range, the int32 answer wrapped for narrow types, the int64 one for uint32."""
    assert float_to_int(math.nan, dtypes.int32) == -2**31
    assert truncate(math.inf, dtypes.int64) == -2**63
    assert truncate(300.7, dtypes.int8) == 44 and truncate(math.nan, dtypes.int8) == 0
    assert truncate(-5.0, dtypes.uint32) == 2**32 - 5 and truncate(math.nan, dtypes.uint32) == 0
    assert truncate(2.0**63, dtypes.uint64) == 2**63 and truncate(-1.0, dtypes.uint64) == 2**64 - 1


def test_float16_and_bfloat16_sources_convert_by_the_same_rule():
    x = np.array([math.nan, math.inf, -math.inf, 300.5, -7.75], np.float16)
    want = torch.from_numpy(x).to(torch.int32).numpy()
    np.testing.assert_array_equal(Tensor(x).cast("int32").numpy(), want)
    np.testing.assert_array_equal(Tensor(x.astype(np.float32)).cast("bfloat16").cast("int16").numpy(),
                                  torch.from_numpy(x.astype(np.float32)).bfloat16().to(torch.int16).numpy())
