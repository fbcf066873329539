"""ember's demo: train a small network on scikit-learn's 8x8 handwritten digits, every step compiled to C kernels.

Run: python examples/demo.py             trains a 64-128-10 MLP with Adam, printing loss and test accuracy per epoch
     python examples/demo.py --kernels   shows what ember makes of one forward pass: its kernels and their C source

The digits (1,797 images, bundled with scikit-learn, no download) are split 80/20 with a fixed seed. Each training
step (forward, backward, Adam update) is one schedule of fused kernels; the kernels compile on the first step and
are reused by every later one (and cached on disk across runs). The step is jitted (ember.jit): from its third call
on, its kernels replay in one native call, with no scheduling or Python per kernel. The batch size is a Variable, so
the last batch of an epoch (29 images) replays the same kernels as the full ones.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from ember import Context, GlobalCounters, Tensor, Variable, jit
from ember.device import Device
from ember.engine.realize import cached_program
from ember.nn import Linear
from ember.nn.optim import Adam
from ember.nn.state import get_parameters


class MLP:
    """64 pixels -> 128 hidden units (ReLU) -> 10 digit scores."""

    def __init__(self) -> None:
        self.hidden, self.out = Linear(64, 128), Linear(128, 10)

    def __call__(self, x: Tensor) -> Tensor: return self.out(self.hidden(x).relu())


def load_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels): pixels scaled to [0, 1], an 80/20 random split."""
    from sklearn.datasets import load_digits
    images, labels = load_digits(return_X_y=True)
    images, labels = (images / 16).astype(np.float32), labels.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    cut = int(0.8 * len(images))
    return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]


def train_digits(epochs: int = 20, batch_size: int = 64, lr: float = 3e-3, seed: int = 0,
                 log: Callable[..., None] = print) -> float:
    """Train the MLP and return its final test accuracy."""
    x_train, y_train, x_test, y_test = load_split(seed)
    Tensor.manual_seed(seed)
    model = MLP()
    opt = Adam(get_parameters(model), lr=lr)
    rng = np.random.default_rng(seed + 1)
    x_test_t = Tensor(x_test)
    log(f"digits: {len(x_train)} train, {len(x_test)} test images; MLP 64-128-10, Adam lr={lr}, batch {batch_size}")
    start = time.perf_counter()
    accuracy = 0.0

    @jit  # recorded on its first two calls, then replayed: its kernels in one native call, no Python per op
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).cross_entropy(y)
        loss.backward()
        opt.step(loss)  # the loss is computed in the step's schedule
        return loss

    # the batch size as a symbolic size: the last, smaller batch of an epoch runs the same kernels, replayed
    size = Variable("batch", 1, batch_size)
    for epoch in range(1, epochs + 1):
        order, losses = rng.permutation(len(x_train)), []
        with Tensor.train():
            for i in range(0, len(order), batch_size):
                rows = order[i:i + batch_size]
                n = size.bind(len(rows))
                losses.append(step(Tensor(x_train[rows]).reshape(n, 64), Tensor(y_train[rows]).reshape(n)))
        accuracy = float((model(x_test_t).argmax(1).numpy() == y_test).mean())
        mean_loss = sum(loss.item() for loss in losses) / len(losses)
        log(f"epoch {epoch:2d}  loss {mean_loss:.4f}  test accuracy {100 * accuracy:5.2f}%  "
            f"({time.perf_counter() - start:5.2f} s)")
    return accuracy


def show_kernels() -> None:
    """A two-layer network's forward pass: the kernels it fuses into, their run times, the C of the first."""
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((64, 128)).astype(np.float32)
    w1_np = (rng.standard_normal((128, 256)) / 16).astype(np.float32)
    w2_np = (rng.standard_normal((256, 10)) / 16).astype(np.float32)
    x, w1, w2 = Tensor(x_np), Tensor(w1_np), Tensor(w2_np)

    # lazy: this builds a graph, nothing runs yet
    hidden = (x @ w1).relu()
    logits = hidden @ w2
    probs = (logits - logits.max(axis=1, keepdim=True)).exp()
    probs = probs / probs.sum(1, keepdim=True)

    schedule = probs.schedule()
    print(f"the forward pass fuses into {len(schedule)} kernels:\n")
    for item in schedule:
        spec = cached_program(item.ast, Device["CPU"].renderer)
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
    print(cached_program(schedule[0].ast, Device["CPU"].renderer).src)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", action="store_true", help="show one forward pass's kernels and C instead")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    if args.kernels:
        show_kernels()
        return
    start = time.perf_counter()
    accuracy = train_digits(epochs=args.epochs)
    print(f"\nfinal test accuracy {100 * accuracy:.2f}% in {time.perf_counter() - start:.1f} s "
          f"({GlobalCounters.kernel_count:,} kernels run)")


if __name__ == "__main__":
    main()
