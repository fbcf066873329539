"""ember's demo: a two-layer network's forward pass, compiled to C kernels, checked against numpy.

Run: python examples/demo.py
"""

import time

import numpy as np

from ember import Context, GlobalCounters, Tensor
from ember.codegen import get_program
from ember.device import Device


def main() -> None:
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((64, 128)).astype(np.float32)
    w1_np = (rng.standard_normal((128, 256)) / 16).astype(np.float32)
    w2_np = (rng.standard_normal((256, 10)) / 16).astype(np.float32)
    x, w1, w2 = Tensor(x_np), Tensor(w1_np), Tensor(w2_np)

    # lazy: this builds a graph, nothing runs yet
    hidden = (x @ w1).relu()
    logits = hidden @ w2
    probs = (logits - logits.max(1, keepdim=True)).exp()
    probs = probs / probs.sum(1, keepdim=True)

    schedule = probs.schedule()
    print(f"the forward pass fuses into {len(schedule)} kernels:\n")
    for item in schedule:
        spec = get_program(item.ast, Device["CPU"].renderer)
        print(f"  {spec.name:12s} {len(item.bufs)} buffers, {spec.flops:>9,} ALU ops")

    print("\nrunning (DEBUG=1 prints each kernel as it runs):")
    GlobalCounters.reset()
    start = time.perf_counter()
    with Context(DEBUG=1):
        out = probs.numpy()
    print(f"first run {1e3 * (time.perf_counter() - start):.1f} ms (includes compiling with the C compiler, "
          f"cached on disk afterwards)")

    h = np.maximum(x_np @ w1_np, 0)
    logits_np = h @ w2_np
    e = np.exp(logits_np - logits_np.max(1, keepdims=True))
    expected = e / e.sum(1, keepdims=True)
    err = np.abs(out - expected).max()
    print(f"\nmax |ember - numpy| = {err:.2e} over {out.size} probabilities")
    assert err < 1e-5, "ember disagrees with numpy"

    print("\nthe generated C of the first kernel:\n")
    print(get_program(schedule[0].ast, Device["CPU"].renderer).src)


if __name__ == "__main__":
    main()
