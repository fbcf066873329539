"""How long ember's pipeline takes for one 20-op elementwise kernel: schedule, codegen, compile; cold and cached.

Run: python bench/pipeline.py
Cold: an empty on-disk compile cache (a temporary EMBER_CACHE). Cached: the same kernel again in the same process,
so the compiler is skipped (the on-disk cache hits) but scheduling and codegen run again, as for a new graph.
Also prints the end-to-end realize time with everything warm, and numpy's time for the same 20 ops as a yardstick.
"""

import os
import statistics
import tempfile
import time

import numpy as np

os.environ["EMBER_CACHE"] = tempfile.mkdtemp(prefix="ember-bench-")

from ember import Tensor  # noqa: E402  (the cache location must be set first)
from ember.codegen import get_program  # noqa: E402
from ember.device import Device  # noqa: E402

N = 4096


def build(x: Tensor, y: Tensor) -> Tensor:
    """20 elementwise ops on two inputs."""
    z = x
    for i in range(5):
        z = (z * y + float(i)).maximum(x) - y / 3.0
    return z


def timed(fn):  # noqa: ANN001, ANN201
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def measure() -> dict[str, float]:
    x, y = Tensor.rand(N).realize(), Tensor.rand(N).realize()
    out = build(x, y)
    schedule, t_sched = timed(out.schedule)
    dev = Device["CPU"]
    spec, t_codegen = timed(lambda: get_program(schedule[0].ast, dev.renderer))
    _, t_compile = timed(lambda: dev.compiler.compile_cached(spec.src))
    return {"schedule": t_sched, "codegen": t_codegen, "compile": t_compile}


def main() -> None:
    Device["CPU"]  # open the device (finds the C compiler) outside the timings
    cold = measure()
    cached = [measure() for _ in range(5)]
    print(f"20-op elementwise kernel over {N} float32, times in ms")
    print(f"{'stage':10s} {'cold':>9s} {'cached':>9s}")
    for stage in cold:
        print(f"{stage:10s} {1e3 * cold[stage]:9.2f} {1e3 * statistics.median(c[stage] for c in cached):9.2f}")
    total_cold = sum(cold.values())
    total_cached = statistics.median(sum(c.values()) for c in cached)
    print(f"{'total':10s} {1e3 * total_cold:9.2f} {1e3 * total_cached:9.2f}")

    x, y = Tensor.rand(N).realize(), Tensor.rand(N).realize()
    build(x, y).realize()  # warm: the runner is now cached in memory
    runs = []
    for _ in range(20):
        x, y = Tensor.rand(N).realize(), Tensor.rand(N).realize()
        runs.append(timed(lambda x=x, y=y: build(x, y).realize())[1])
    xn, yn = x.numpy(), y.numpy()

    def numpy_20_ops() -> np.ndarray:
        z = xn
        for i in range(5):
            z = np.maximum(z * yn + np.float32(i), xn) - yn / np.float32(3.0)
        return z

    numpy_runs = [timed(numpy_20_ops)[1] for _ in range(20)]
    ember_ms, numpy_ms = 1e3 * statistics.median(runs), 1e3 * statistics.median(numpy_runs)
    print(f"\nwarm end to end (build graph + schedule + codegen + run): ember {ember_ms:.2f} ms, "
          f"numpy {numpy_ms:.3f} ms, ratio ember/numpy {ember_ms / numpy_ms:.1f}x")


if __name__ == "__main__":
    main()
