"""Compile latency per kernel, device against device in one run: the time each device's compiler takes for one
kernel it has not seen (no cache), for kernels of the kind a model's first step makes.

    python bench/compile.py [--rounds 5] [--devices CPU,CL,NULL:CUDA,NULL:PTX]

Each round renders KERNELS distinct kernels for every device, then compiles them device after device in turns (the
order rotates each round, so a machine's load falls on all of them); prints per device the median and range over
rounds of the median time per kernel, and its ratio to the first device's. Devices that cannot open here are
skipped with the reason.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ember import Tensor
from ember.codegen import get_program
from ember.device import Device

KERNELS = 12


def sources(device: str, round_: int) -> list[str]:
    """KERNELS distinct kernels for `device` (a fused elementwise chain and its row sum, a matmul, a softmax), new
    constants each round so that no compiler cache can answer."""
    out = []
    for i in range(KERNELS):
        x = Tensor(np.ones((64, 65 + i), np.float32), device=device)
        t = [(x * (1.5 + round_) + i).exp().sum(1), x @ x.T * (i + round_), (x + round_ * 0.5 + i).softmax(-1)][i % 3]
        for item in t.schedule(): out.append(get_program(item.ast, Device[device].renderer).src)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--devices", default="CPU,CL,NULL:CUDA,NULL:PTX")
    args = parser.parse_args()
    devices = []
    for name in args.devices.split(","):
        if (why := Device.why_not(name)) is None: devices.append(name)
        else: print(f"{name}: skipped ({why})")
    times: dict[str, list[float]] = {d: [] for d in devices}
    for r in range(args.rounds):
        work = {d: sources(d, r) for d in devices}
        for d in devices[r % len(devices):] + devices[:r % len(devices)]:
            per = []
            for src in work[d]:
                start = time.perf_counter()
                Device[d].compiler.compile(src)
                per.append(time.perf_counter() - start)
            times[d].append(statistics.median(per))
    first = statistics.median(times[devices[0]])
    for d in devices:
        ms = [t * 1e3 for t in times[d]]
        print(f"{d:10s} {statistics.median(ms):7.1f} ms per kernel (range {min(ms):.1f}-{max(ms):.1f}, "
              f"{len(ms)} rounds of {KERNELS}+ kernels)  x{statistics.median(times[d]) / first:.2f} of {devices[0]}")


if __name__ == "__main__":
    main()
