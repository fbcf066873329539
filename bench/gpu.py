"""ember on a GPU against the card's physical limits (issue 28): GEMM, elementwise, softmax and jit launch overhead.

    python bench/gpu.py                      # DEVICE=CUDA, the issue's sizes (GEMM 4096)
    python bench/gpu.py --device CL --small  # a smoke run anywhere (PoCL runs OpenCL on the CPU)

Each workload is jitted and replayed `--rounds` times after its warm-up calls, the device synchronized around each; the
median and the range are printed, with the fraction of the card's peak where the card is in PEAKS (its name as the
device reports it, matched by substring). Results are checked against numpy on the host (a failed check marks the
line with `!`). Peaks are the vendors' datasheet figures, dense (no sparsity):
- fp32 GEMM n x n x n: 2 n^3 flops against the FP32 peak;
- fp16 GEMM (products summed in float32, the result half): against the dense FP16 tensor-core peak (ember has no
  tensor-core opt yet: expect little);
- elementwise y = x * 2 + 1 over 2^26 floats and a row softmax of n x n: bytes read and written once against the
  memory bandwidth;
- a jitted graph of 32 small kernels: the time per kernel of a replay (launch overhead).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ember import Tensor, jit  # noqa: E402
from ember.device import Device  # noqa: E402

# name part -> (FP32 TFLOPS, dense FP16 tensor TFLOPS, memory TB/s): NVIDIA's datasheets (SXM parts)
PEAKS = {"H200": (67.0, 989.0, 4.8), "H100": (67.0, 989.0, 3.35), "A100": (19.5, 312.0, 2.0)}


def timed(device: str, fn: Callable[..., Tensor], rounds: int, *args: Tensor) -> tuple[float, float, float, np.ndarray]:
    """(median, min, max) seconds of a jitted `fn(*args)` replayed (no Python front end in the time) with the device
    synchronized, and the last result."""
    step = jit(fn)
    for _ in range(3): out = step(*args).realize()  # (record, record, replay: compiled and warm)
    Device[device].synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        out = step(*args)
        Device[device].synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times), out.numpy()


def report(name: str, seconds: tuple[float, float, float], work: float, unit: str, peak: float | None, ok: bool
           ) -> None:
    med, lo, hi = seconds
    rate = work / med
    share = f"{100 * rate / peak:5.1f}% of {peak:g}" if peak else "(card's peak unknown)"
    print(f"{'  ' if ok else '! '}{name:34s} {1e3 * med:9.3f} ms ({1e3 * lo:.3f}-{1e3 * hi:.3f})  "
          f"{rate:10.3f} {unit}  {share}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="CUDA")
    parser.add_argument("--small", action="store_true", help="small sizes: a smoke run on any device")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    dev = Device[args.device]
    name = getattr(dev, "device_name", args.device)
    peaks = next((p for part, p in PEAKS.items() if part in name), None)
    print(f"device {args.device}: {name}; peaks {peaks or 'unknown'} (FP32 TFLOPS, FP16 tensor TFLOPS, TB/s)")
    n, elems = (256, 1 << 20) if args.small else (4096, 1 << 26)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    ta, tb = Tensor(a, device=args.device), Tensor(b, device=args.device)
    t = timed(args.device, lambda x, y: x @ y, args.rounds, ta, tb)
    report(f"fp32 GEMM {n}", t[:3], 2 * n**3 / 1e12, "TFLOPS", peaks and peaks[0],
           np.allclose(t[3], a.astype(np.float64) @ b, rtol=1e-3, atol=1e-2))
    ha, hb = ta.cast("float16"), tb.cast("float16")
    ha, hb = ha.realize(), hb.realize()
    t = timed(args.device, lambda x, y: x @ y, args.rounds, ha, hb)  # (ember sums half products in float32)
    want = a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)
    report(f"fp16 GEMM {n} (fp32 sums)", t[:3], 2 * n**3 / 1e12, "TFLOPS", peaks and peaks[1],
           np.allclose(t[3].astype(np.float64), want, rtol=1e-2, atol=0.25))
    x = rng.standard_normal(elems).astype(np.float32)
    tx = Tensor(x, device=args.device)
    t = timed(args.device, lambda v: v * 2 + 1, args.rounds, tx)
    report(f"elementwise x*2+1, {elems} floats", t[:3], 8 * elems / 1e12, "TB/s", peaks and peaks[2],
           np.array_equal(t[3], x * 2 + 1))
    t = timed(args.device, lambda v: v.softmax(-1), args.rounds, ta)
    e = np.exp(a - a.max(-1, keepdims=True))
    report(f"softmax {n} x {n}", t[:3], 8 * n * n / 1e12, "TB/s", peaks and peaks[2],
           np.allclose(t[3], e / e.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6))

    small = Tensor(rng.standard_normal(64).astype(np.float32), device=args.device)

    def chain(v: Tensor) -> Tensor:
        for i in range(32): v = (v * 1.0001 + i).contiguous()
        return v
    t = timed(args.device, chain, args.rounds, small)
    print(f"  jit replay of 32 kernels: {1e6 * t[0] / 32:.2f} us per kernel ({1e6 * t[1] / 32:.2f}-"
          f"{1e6 * t[2] / 32:.2f})")


if __name__ == "__main__":
    main()
