"""Whole training steps (and a large forward pass), ember jitted against torch eager and torch.compile.

Run: python bench/models.py                      (every model, 5 rounds)
     python bench/models.py --only mlp64,mlp256 --rounds 7

Models (name for --only), float32, weights and data drawn once in numpy and given to every framework:
  mlp64, mlp256  MLP 784-512-512-10, ReLU, cross-entropy, SGD; batch 64 and 256
  cnn            3 x (conv 3x3 - batchnorm - ReLU - max pool 2) with 32, 64, 128 channels, linear to 10; batch 32 of
                 3 x 32 x 32; Adam
  transformer    one pre-LN block: d 256, 4 heads, causal attention, GELU (tanh) MLP of 1024; 8 x 128 tokens; loss
                 the mean square of its output; AdamW
  resnet18       ResNet-18 (BasicBlocks 2-2-2-2, 1000 classes), batch 16 of 3 x 64 x 64, SGD
  gpt2           a GPT-2-small-sized forward pass (12 layers, d 768, 12 heads, vocabulary 50257, 124M parameters,
                 random weights), 1 x 128 tokens, no gradient

Each framework runs in a worker process of its own. A worker builds the step as a user would write it (ember: the
step under ember.jit; torch.compile: the forward and loss compiled, autograd and torch.optim as usual) and runs the
first step (timed: compile included, with caches empty, "cold", then again in a fresh worker over the same caches,
"warm"), then WARM more untimed; the first step's loss (gpt2: its logits) is checked against torch eager's. Then
rounds: each worker in turn (a different one first each round) runs `steps` steps, timing each; a round's figure is
its median step. Printed per model: each framework's median over rounds [range], and ember's speed as a ratio to
each peer per round, median and range (> 1: ember is faster). The machine's speed drifts; ratios of one round are
taken minutes apart at most.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

FRAMEWORKS = ("ember", "torch", "torch.compile")
MODELS = ("mlp64", "mlp256", "cnn", "transformer", "resnet18", "gpt2")
WARM = 2  # steps after the first, before any is timed
RESNET_STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, stride of the stage's first block)


# ---- weights and data ---------------------------------------------------------------------------------------------

def arrays(model: str) -> dict[str, np.ndarray]:
    """The model's weights (uniform in +-1/sqrt(fan_in), as torch's Linear and Conv2d) and one batch of data."""
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}

    def weight(name: str, *shape: int, fan_in: int | None = None) -> None:
        bound = 1 / np.sqrt(fan_in or shape[-1] if len(shape) == 2 else fan_in or int(np.prod(shape[1:])))
        out[name] = rng.uniform(-bound, bound, shape).astype(np.float32)

    if model.startswith("mlp"):
        for i, (n, k) in enumerate(((512, 784), (512, 512), (10, 512))):
            weight(f"w{i}", n, k)
            weight(f"b{i}", n, fan_in=k)
        batch = int(model[3:])
        out["x"] = rng.standard_normal((batch, 784)).astype(np.float32)
        out["y"] = rng.integers(0, 10, batch).astype(np.int64)
    elif model == "cnn":
        for i, (c, k) in enumerate(((32, 3), (64, 32), (128, 64))):
            weight(f"c{i}", c, k, 3, 3)
        weight("fc", 10, 128 * 4 * 4)
        out["x"] = rng.standard_normal((32, 3, 32, 32)).astype(np.float32)
        out["y"] = rng.integers(0, 10, 32).astype(np.int64)
    elif model == "transformer":
        d = 256
        for name, shape in (("qkv", (3 * d, d)), ("proj", (d, d)), ("fc1", (4 * d, d)), ("fc2", (d, 4 * d))):
            weight(name, *shape)
        out["x"] = rng.standard_normal((8, 128, d)).astype(np.float32)
    elif model == "resnet18":
        weight("conv1", 64, 3, 7, 7)
        c_in = 64
        for s, (c, stride) in enumerate(RESNET_STAGES):
            for b in range(2):
                weight(f"s{s}b{b}c1", c, c_in if b == 0 else c, 3, 3)
                weight(f"s{s}b{b}c2", c, c, 3, 3)
                if b == 0 and (stride != 1 or c_in != c): weight(f"s{s}down", c, c_in, 1, 1)
            c_in = c
        weight("fc", 1000, 512)
        out["x"] = rng.standard_normal((16, 3, 64, 64)).astype(np.float32)
        out["y"] = rng.integers(0, 1000, 16).astype(np.int64)
    elif model == "gpt2":
        d, vocab = 768, 50257
        out["wte"] = (rng.standard_normal((vocab, d)) * 0.02).astype(np.float32)
        out["wpe"] = (rng.standard_normal((1024, d)) * 0.02).astype(np.float32)
        for i in range(12):
            for name, shape in (("qkv", (3 * d, d)), ("proj", (d, d)), ("fc1", (4 * d, d)), ("fc2", (d, 4 * d))):
                out[f"h{i}{name}"] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        out["tokens"] = rng.integers(0, vocab, (1, 128)).astype(np.int64)
    return out


# ---- the models, in the style of each framework ------------------------------------------------------------------

class Ops:
    """What differs between the frameworks; the models are written once over it."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        if framework == "ember":
            import ember
            from ember import Tensor, nn
            from ember.nn import optim
            self.tensor = lambda a, grad=False: Tensor(a, requires_grad=grad).realize()
            self.conv = lambda x, w, stride=1, padding=0: x.conv2d(w, stride=stride, padding=padding)
            self.max_pool = lambda x, k, stride=None, padding=0: x.max_pool2d(k, stride, padding=padding)
            self.gelu = lambda x: x.gelu(approximate="tanh")
            self.attention = lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True)
            self.cross_entropy = lambda logits, y: logits.cross_entropy(y)
            self.layer_norm = lambda x: x.layernorm()
            self.batch_norm = nn.BatchNorm2d
            self.optimizers = {"sgd": lambda p: optim.SGD(p, lr=0.01), "adam": lambda p: optim.Adam(p, lr=1e-3),
                               "adamw": lambda p: optim.AdamW(p, lr=1e-3)}
            self.fetch = lambda t: t.numpy()
            self.sync = lambda t: t.realize()
            self.jit, self.compile = ember.jit, lambda fn: fn
            self.no_grad = ember.no_grad
        else:
            import torch
            import torch.nn.functional as F
            torch.manual_seed(0)
            self.tensor = lambda a, grad=False: torch.from_numpy(a.copy()).requires_grad_(grad)
            self.conv = lambda x, w, stride=1, padding=0: F.conv2d(x, w, stride=stride, padding=padding)
            self.max_pool = lambda x, k, stride=None, padding=0: F.max_pool2d(x, k, stride, padding)
            self.gelu = lambda x: F.gelu(x, approximate="tanh")
            self.attention = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
            self.cross_entropy = F.cross_entropy
            self.layer_norm = lambda x: F.layer_norm(x, x.shape[-1:])
            self.batch_norm = torch.nn.BatchNorm2d
            self.optimizers = {"sgd": lambda p: torch.optim.SGD(p, lr=0.01),
                               "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
                               "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3)}
            self.fetch = lambda t: t.detach().numpy()
            self.sync = lambda t: None
            self.jit = lambda fn: fn
            self.compile = torch.compile if framework == "torch.compile" else (lambda fn: fn)
            self.no_grad = torch.no_grad


def build(ops: Ops, model: str, data: dict[str, np.ndarray]) -> Any:
    """A function that runs one step and returns what the check compares (the loss, or gpt2's logits)."""
    if model == "gpt2": return build_gpt2(ops, data)
    params = {k: ops.tensor(v, True) for k, v in data.items() if k not in ("x", "y")}
    x, y = ops.tensor(data["x"]), ops.tensor(data["y"]) if "y" in data else None
    norms: list[Any] = []

    def bn(c: int) -> Any:
        norms.append(ops.batch_norm(c))
        return norms[-1]

    if model.startswith("mlp"):
        def forward() -> Any:
            h = x
            for i in range(3):
                h = h @ params[f"w{i}"].T + params[f"b{i}"]
                h = h.relu() if i < 2 else h
            return ops.cross_entropy(h, y)
        optimizer = "sgd"
    elif model == "cnn":
        layers = [bn(c) for c in (32, 64, 128)]

        def forward() -> Any:
            h = x
            for i in range(3): h = ops.max_pool(layers[i](ops.conv(h, params[f"c{i}"], padding=1)).relu(), 2)
            return ops.cross_entropy(h.reshape(h.shape[0], -1) @ params["fc"].T, y)
        optimizer = "adam"
    elif model == "transformer":
        def forward() -> Any:
            b, t, d = x.shape
            q, k, v = (ops.layer_norm(x) @ params["qkv"].T).reshape(b, t, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
            h = x + ops.attention(q, k, v).permute(0, 2, 1, 3).reshape(b, t, d) @ params["proj"].T
            h = h + ops.gelu(ops.layer_norm(h) @ params["fc1"].T) @ params["fc2"].T
            return (h * h).mean()
        optimizer = "adamw"
    elif model == "resnet18":
        stem = bn(64)
        blocks = {(s, b): (bn(c), bn(c), bn(c) if f"s{s}down" in params and b == 0 else None)
                  for s, (c, _) in enumerate(RESNET_STAGES) for b in range(2)}

        def forward() -> Any:
            h = ops.max_pool(stem(ops.conv(x, params["conv1"], 2, 3)).relu(), 3, 2, 1)
            for s, (_, stride) in enumerate(RESNET_STAGES):
                for b in range(2):
                    n1, n2, nd = blocks[(s, b)]
                    first = 1 if b else stride
                    out = n1(ops.conv(h, params[f"s{s}b{b}c1"], first, 1)).relu()
                    out = n2(ops.conv(out, params[f"s{s}b{b}c2"], 1, 1))
                    skip = nd(ops.conv(h, params[f"s{s}down"], first)) if nd is not None else h
                    h = (out + skip).relu()
            return ops.cross_entropy(h.mean((2, 3)) @ params["fc"].T, y)
        optimizer = "sgd"
    opt = ops.optimizers[optimizer](list(params.values()))
    loss_fn = ops.compile(forward)

    @ops.jit
    def step() -> Any:
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss
    return step


def build_gpt2(ops: Ops, data: dict[str, np.ndarray]) -> Any:
    p = {k: ops.tensor(v) for k, v in data.items() if k != "tokens"}
    tokens = ops.tensor(data["tokens"])
    d, heads = 768, 12

    def forward() -> Any:
        t = tokens.shape[1]
        h = p["wte"][tokens] + p["wpe"][:t]
        for i in range(12):
            q, k, v = (ops.layer_norm(h) @ p[f"h{i}qkv"].T).reshape(1, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            h = h + ops.attention(q, k, v).permute(0, 2, 1, 3).reshape(1, t, d) @ p[f"h{i}proj"].T
            h = h + ops.gelu(ops.layer_norm(h) @ p[f"h{i}fc1"].T) @ p[f"h{i}fc2"].T
        return ops.layer_norm(h) @ p["wte"].T
    run = ops.jit(ops.compile(forward))

    def step() -> Any:
        with ops.no_grad(): return run()
    return step


# ---- worker ---------------------------------------------------------------------------------------------------------

def worker(framework: str, model: str, folder: str) -> None:
    """Build the step, run it once (timed, checked output saved), then answer `steps n` requests with n step times."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the frameworks print goes to stderr
    ops = Ops(framework)
    data = arrays(model)
    start = time.perf_counter()
    step = build(ops, model, data)
    out = step()
    value = ops.fetch(out)
    first = time.perf_counter() - start
    np.save(os.path.join(folder, f"{framework}-{model}.npy"), value)
    for _ in range(WARM): ops.sync(step())  # (ember.jit captures on the second call, replays from the third)
    replies.write(json.dumps({"first": first}) + "\n")
    replies.flush()
    for line in sys.stdin:
        times = []
        for _ in range(json.loads(line)["steps"]):
            start = time.perf_counter()
            ops.sync(step())
            times.append(time.perf_counter() - start)
        replies.write(json.dumps({"times": times}) + "\n")
        replies.flush()


class Worker:
    def __init__(self, framework: str, model: str, folder: str, cache: str) -> None:
        env = os.environ | {"EMBER_CACHE": os.path.join(cache, "ember"),
                            "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor")}
        self.name = framework
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", framework, model, folder], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.first = self.read()["first"]

    def read(self) -> dict:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line: raise RuntimeError(f"{self.name}: the worker died (see its stderr above)")
        return json.loads(line)

    def steps(self, n: int) -> list[float]:
        self.proc.stdin.write(json.dumps({"steps": n}) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self.read()["times"]

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait()


def run_model(model: str, rounds: int, steps: int) -> None:
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as cache:
        cold = {f: Worker(f, model, folder, cache) for f in FRAMEWORKS}  # each starts with empty caches
        firsts = {f: w.first for f, w in cold.items()}
        for w in cold.values(): w.close()
        workers = {f: Worker(f, model, folder, cache) for f in FRAMEWORKS}  # over the caches the cold ones filled
        ref = np.load(os.path.join(folder, f"torch-{model}.npy"))
        checks = {}
        for f in FRAMEWORKS:
            got = np.load(os.path.join(folder, f"{f}-{model}.npy"))
            checks[f] = "ok" if np.allclose(got, ref, rtol=1e-4, atol=1e-4) else \
                f"DIFFERS (max |diff| {np.abs(got.astype(np.float64) - ref).max():.3g})"
        per_round: dict[str, list[float]] = {f: [] for f in FRAMEWORKS}
        for r in range(rounds):
            order = FRAMEWORKS[r % 3:] + FRAMEWORKS[:r % 3]
            for f in order: per_round[f].append(statistics.median(workers[f].steps(steps)))
        for w in workers.values(): w.close()
    print(f"\n{model}: {steps} steps a round, {rounds} rounds")
    for f in FRAMEWORKS:
        ms = [t * 1e3 for t in per_round[f]]
        print(f"  {f:14s} {statistics.median(ms):9.2f} ms [{min(ms):.2f}-{max(ms):.2f}]  first step: cold "
              f"{firsts[f]:.1f} s, warm {workers[f].first:.1f} s  check: {checks[f]}")
    for peer in FRAMEWORKS[1:]:
        ratios = [p / e for p, e in zip(per_round[peer], per_round["ember"], strict=True)]
        print(f"  ember speed vs {peer:14s} {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker": return worker(*sys.argv[2:5])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    import torch
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {os.cpu_count()} cores")
    for model in args.only.split(","): run_model(model, args.rounds, args.steps)


if __name__ == "__main__":
    main()
