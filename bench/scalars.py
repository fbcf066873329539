"""Python scalars that vary (issue 26, item 17): programs made and time for `x * c` over 20 distinct c, in a fresh
cache directory; then the time per call once settled, and an `x * 2.0` kernel (a constant that never varies).

    python bench/scalars.py

Each value is checked against numpy. Programs made count codegen runs (engine/realize.get_program) and compiler
runs (the CPU compiler's compile); a cold process with an empty cache, as a user's first run.
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ["EMBER_CACHE"] = tempfile.mkdtemp(prefix="ember-bench-scalars-")

import numpy as np  # noqa: E402  (after EMBER_CACHE is set: ember reads it on import)

import ember.engine.realize as realize  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.device import Device  # noqa: E402


def main() -> None:
    device, made = Device["CPU"], {"codegen": 0, "compile": 0}
    compile_source, get_program = device.compiler.compile, realize.get_program

    def counted_compile(src: str) -> bytes:
        made["compile"] += 1
        return compile_source(src)

    def counted_codegen(*args: object) -> object:
        made["codegen"] += 1
        return get_program(*args)
    device.compiler.compile, realize.get_program = counted_compile, counted_codegen  # type: ignore[method-assign]
    xn = np.random.default_rng(0).random((64, 64)).astype(np.float32)
    x = Tensor(xn).realize()
    (x + 1).numpy()  # the thread pool and the compiler probe, out of the timing
    made.update(codegen=0, compile=0)
    start = time.perf_counter()
    for i in range(20):
        c = 0.37 + i / 100
        np.testing.assert_allclose((x * c).numpy(), xn * np.float32(c), rtol=1e-6)
    print(f"x * c, 20 distinct c: {made['codegen']} codegen, {made['compile']} compiles, "
          f"{time.perf_counter() - start:.2f} s, {len(realize._runners)} runners kept")
    times = []
    for i in range(20):
        start = time.perf_counter()
        (x * (1.0 + i / 1000)).numpy()  # (as the first loop: realize() alone is a graph of another structure)
        times.append(time.perf_counter() - start)
    print(f"x * c, 20 more distinct c: median {sorted(times)[10] * 1e6:.0f} us per call, {made['compile']} compiles "
          f"in all")
    big = Tensor(np.random.default_rng(1).random((4096, 1024)).astype(np.float32)).realize()
    for _ in range(3): (big * 2.0).realize()
    times = []
    for _ in range(30):
        start = time.perf_counter()
        (big * 2.0).realize()
        times.append(time.perf_counter() - start)
    print(f"big * 2.0 (4M floats, a constant that never varies): best {min(times) * 1e3:.2f} ms, "
          f"median {sorted(times)[15] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
