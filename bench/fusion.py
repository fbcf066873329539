"""Kernel counts of ember and tinygrad for the same programs: how well each fuses a convolution's epilogue, a ResNet
basic block and attention (issue 26).

Run: python bench/fusion.py              (ember, and tinygrad 0.14 with DEV=CPU if installed: about a minute)
     python bench/fusion.py --sizes 2x128x28x28

Programs, float32, NCHW (sizes N x C x H x W; convolutions C -> C, 3x3, padding 1, no bias):
  conv+bn      an eval-mode BatchNorm2d after a convolution
  basic-block  relu(bn2(conv2(relu(bn1(conv1(x))))) + x), both BatchNorms in eval mode
  sdpa         scaled_dot_product_attention(q, k, v), q, k, v of (batch, heads, length, head dim)

What is counted: the kernels the forward runs. Inputs, weights and the BatchNorms' parameters and running statistics
are realized first and are not counted. ember: the kernels of `Tensor.schedule()`. tinygrad: GlobalCounters.
kernel_count over the forward's realize (copies are not kernels there either). Each framework runs in a process of
its own; tinygrad is a peer here, never a dependency of ember.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SIZES = ["2x8x16x16", "2x64x28x28", "2x128x14x14"]
ATTENTION = ["2x4x16x8", "1x8x64x64", "2x8x128x64"]

WORKER = r"""
import json, sys
lib, sizes, attention = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
if lib == "ember":
    from ember import Tensor, nn
    from ember.schedule.kernelize import kernels
    def count(t): return len(list(kernels(t.schedule())))
    def conv(c): return nn.Conv2d(c, c, 3, padding=1, bias=False)
    def norm(c): return nn.BatchNorm2d(c).eval()
    def realize(ms): [t.realize() for m in ms for t in nn.state.get_state_dict(m).values()]
else:
    from tinygrad import Tensor, nn
    from tinygrad.helpers import GlobalCounters
    Tensor.training = False
    def count(t):
        GlobalCounters.reset()
        t.realize()
        return GlobalCounters.kernel_count
    def conv(c): return nn.Conv2d(c, c, 3, padding=1, bias=False)
    def norm(c): return nn.BatchNorm2d(c)
    def realize(ms): [t.realize() for m in ms for t in nn.state.get_state_dict(m).values()]
out = {}
for size in sizes:
    n, c, h, w = map(int, size.split("x"))
    x = Tensor.randn(n, c, h, w).realize()
    c1, b1, c2, b2 = conv(c), norm(c), conv(c), norm(c)
    realize([c1, b1, c2, b2])
    out[f"conv+bn {size}"] = count(b1(c1(x)))
    out[f"basic-block {size}"] = count((b2(c2(b1(c1(x)).relu())) + x).relu())
for size in attention:
    q, k, v = (Tensor.randn(*map(int, size.split("x"))).realize() for _ in range(3))
    out[f"sdpa {size}"] = count(q.scaled_dot_product_attention(k, v))
print(json.dumps(out))
"""


def counts(lib: str, sizes: list[str], attention: list[str]) -> dict[str, int] | str:
    """The kernel counts one framework schedules, from a process of its own; a string says why there are none."""
    env = dict(os.environ, DEV="CPU") if lib == "tinygrad" else dict(os.environ)
    done = subprocess.run([sys.executable, "-c", WORKER, lib, json.dumps(sizes), json.dumps(attention)],
                          capture_output=True, text=True, env=env)
    if done.returncode: return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help="NxCxHxW of the conv programs, comma separated")
    parser.add_argument("--attention", default=",".join(ATTENTION), help="BxHxLxD of sdpa, comma separated")
    opts = parser.parse_args()
    sizes, attention = opts.sizes.split(","), opts.attention.split(",")
    results = {lib: counts(lib, sizes, attention) for lib in ("ember", "tinygrad")}
    for lib, got in results.items():
        if isinstance(got, str): print(f"{lib}: skipped, {got}")
    table = {lib: got for lib, got in results.items() if not isinstance(got, str)}
    names = next(iter(table.values()), {}).keys()
    width = max((len(n) for n in names), default=8)
    print(f"| {'program':<{width}} | " + " | ".join(f"{lib:>8}" for lib in table) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("-" * 10 for _ in table) + "|")
    for name in names: print(f"| {name:<{width}} | " + " | ".join(f"{table[lib][name]:>8}" for lib in table) + " |")


if __name__ == "__main__":
    main()
