"""Optimizers: SGD, Adam, AdamW, Muon (torch.optim's semantics) and LAMB (You et al. 2019).

`step()` builds the update of every parameter and every piece of optimizer state with `assign`, then realizes them
all in one `Tensor.realize` call, so a training step (forward, backward and update) is one schedule.

State that changes every step lives in tensors (moments, the step count, the learning rate), never in Python
numbers baked into kernels: the compiled-kernel cache keys on the kernel AST, so a step count written as a
constant would compile new kernels every step. Bias corrections are computed from the step-count tensor in float64,
as torch computes them in Python floats, and rounded to the parameter's dtype once.

>>> from ember import Tensor
>>> w = Tensor([1.0, 2.0])
>>> opt = SGD([w], lr=0.1)
>>> _ = (w * w).sum().backward()
>>> _ = opt.step()
>>> w.tolist()
[0.800000011920929, 1.600000023841858]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

from ember.dtype import DType, dtypes
from ember.nn.module import take_pending_buffers
from ember.tensor import Tensor, take_backward_outputs


class Optimizer:
    """Holds the parameters (tensors that require a gradient) and the buffers to realize with each step.

    A tensor whose requires_grad is None (not decided, as layers create their parameters) is made trainable, as
    tinygrad does; one with requires_grad=False (BatchNorm's running statistics) is a buffer: not updated, but
    realized with the step so its lazy updates from the forward pass do not pile up."""

    def __init__(self, params: Iterable[Tensor], lr: float) -> None:
        unique = list({id(t): t for t in params}.values())
        for t in unique:
            if t.requires_grad is None: t.requires_grad_(True)
        self.params = [t for t in unique if t.requires_grad]
        self.buffers = [t for t in unique if not t.requires_grad]
        if not self.params: raise ValueError(f"{type(self).__name__}: got no tensor to optimize")
        self.lr = Tensor(float(lr), dtype=dtypes.float64, device=self.params[0].device).contiguous().realize()

    def zero_grad(self) -> None:
        """Forget the gradients, so the next backward() starts from zero."""
        for p in self.params: p.grad = None

    def step(self, *outputs: Tensor) -> list[Tensor]:
        """Update every parameter from its gradient, in one schedule; returns the parameters, state and buffers of
        this optimizer that it realized.

        `outputs` are realized in the same schedule, and so is every tensor backward() was called on since the last
        step (the loss): realized afterwards, they would recompute the forward pass from the old parameters."""
        grads = [p.grad for p in self.params]
        missing = [i for i, g in enumerate(grads) if g is None]
        if missing: raise RuntimeError(f"{type(self).__name__}.step: parameters {missing} have no gradient; "
                                       "call backward() on a loss that uses them first")
        updated = self._updates(cast(list[Tensor], grads)) + self.buffers  # cast: None was ruled out above
        # also every buffer a forward pass updated lazily since the last step (BatchNorm's running statistics),
        # whether or not this optimizer was given it: model.parameters() leaves buffers out
        Tensor.realize(*outputs, *take_backward_outputs(), *updated, *take_pending_buffers())
        return updated

    def _updates(self, grads: list[Tensor]) -> list[Tensor]:
        """Assign the new values to parameters and state; return every tensor assigned."""
        raise NotImplementedError

    def _state(self) -> list[Tensor]:
        """One zero tensor per parameter, stored in a buffer from the start so that step 1 compiles the same kernels
        as every later step."""
        return [Tensor.zeros(p.shape, dtype=p.dtype, device=p.device).contiguous().realize() for p in self.params]

    def _counter(self) -> Tensor:
        return Tensor(0, dtype=dtypes.int64, device=self.params[0].device).contiguous().realize()


class SGD(Optimizer):
    """Stochastic gradient descent with torch.optim.SGD's momentum, dampening, Nesterov and L2 weight decay.

    As in torch the momentum buffer starts as the first gradient itself (not dampened); the first step therefore
    compiles its own kernels, and every later step reuses the second step's."""

    def __init__(self, params: Iterable[Tensor], lr: float = 0.001, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, dampening: float = 0.0) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening = 0")
        super().__init__(params, lr)
        self.momentum, self.weight_decay, self.nesterov, self.dampening = momentum, weight_decay, nesterov, dampening
        self.momentum_buffers = self._state() if momentum else []
        self.is_first_step = True

    def _updates(self, grads: list[Tensor]) -> list[Tensor]:
        out: list[Tensor] = []
        for i, (p, g) in enumerate(zip(self.params, grads, strict=True)):
            if self.weight_decay: g = g + p * self.weight_decay
            if self.momentum:
                buf = self.momentum_buffers[i]
                damped = g if self.is_first_step or not self.dampening else g * (1 - self.dampening)
                buf.assign(damped if self.is_first_step else buf * self.momentum + damped)
                g = g + buf * self.momentum if self.nesterov else buf
                out.append(buf)
            out.append(p.assign(p - g * self.lr.cast(p.dtype)))
        self.is_first_step = False
        return out


class Adam(Optimizer):
    """Adam (Kingma & Ba) with torch.optim.Adam's semantics: weight decay is L2, added to the gradient.

    AdamW sets `decoupled` (decay the weights directly, Loshchilov & Hutter)."""

    decoupled = False

    def __init__(self, params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.weight_decay = b1, b2, eps, weight_decay
        self.m, self.v, self.t = self._state(), self._state(), self._counter()

    def _updates(self, grads: list[Tensor]) -> list[Tensor]:
        self.t.assign(self.t + 1)
        t = self.t.cast(dtypes.float64)
        # scalars of the step, one tiny kernel each instead of a pow per parameter element
        step_size = (self.lr / (1 - self.b1 ** t)).contiguous()
        correction2_sqrt = (1 - self.b2 ** t).sqrt().contiguous()
        decay = (1 - self.lr * self.weight_decay).contiguous()
        out: list[Tensor] = [self.t]
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            w = p
            if self.weight_decay and self.decoupled: w = w * decay.cast(p.dtype)
            elif self.weight_decay: g = g + w * self.weight_decay
            m.assign(m.lerp(g, 1 - self.b1))
            v.assign(v * self.b2 + (1 - self.b2) * g * g)
            denom = v.sqrt() / correction2_sqrt.cast(p.dtype) + self.eps
            out += [m, v, p.assign(w + -step_size.cast(p.dtype) * m / denom)]
        return out


class AdamW(Adam):
    """Adam with decoupled weight decay, as torch.optim.AdamW: w *= 1 - lr * weight_decay before the Adam step."""

    decoupled = True

    def __init__(self, params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        super().__init__(params, lr, b1, b2, eps, weight_decay)


class LAMB(Optimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning", 2019): the Adam update plus decoupled weight
    decay, scaled per parameter tensor by the trust ratio ||w|| / ||update|| (1 where either norm is 0).

    `adam=True` drops the trust ratio, leaving Adam with decoupled weight decay added to the update."""

    def __init__(self, params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False) -> None:
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.weight_decay, self.adam = b1, b2, eps, weight_decay, adam
        self.m, self.v, self.t = self._state(), self._state(), self._counter()

    def _updates(self, grads: list[Tensor]) -> list[Tensor]:
        self.t.assign(self.t + 1)
        t = self.t.cast(dtypes.float64)
        correction1, correction2 = (1 - self.b1 ** t).contiguous(), (1 - self.b2 ** t).contiguous()
        out: list[Tensor] = [self.t]
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            w = p
            m.assign(m * self.b1 + g * (1 - self.b1))
            v.assign(v * self.b2 + g * g * (1 - self.b2))
            m_hat, v_hat = m / correction1.cast(p.dtype), v / correction2.cast(p.dtype)
            update = m_hat / (v_hat.sqrt() + self.eps) + w * self.weight_decay
            if self.adam:
                scaled = update * self.lr.cast(p.dtype)
            else:
                w_norm, u_norm = w.square().sum().sqrt(), update.square().sum().sqrt()
                trust = ((w_norm > 0) & (u_norm > 0)).where(w_norm / u_norm, 1.0)
                scaled = update * (trust * self.lr.cast(p.dtype))
            out += [m, v, p.assign(w - scaled)]
        return out


def newton_schulz(g: Tensor, steps: int, coefficients: tuple[float, float, float], eps: float,
                  dtype: DType) -> Tensor:
    """An approximately orthogonal matrix with g's singular vectors (U S' V^T with S' near 1), by `steps` quintic
    Newton-Schulz iterations X <- a X + (b A + c A^2) X with A = X X^T, computed in `dtype`.

    As torch.optim.Muon: g is scaled to Frobenius norm 1 (at least eps below), so every singular value starts in
    (0, 1]; a tall g is transposed so that A is the smaller Gram matrix. Products accumulate in float32 and each
    matmul-and-add result is rounded to `dtype` once, as torch's bfloat16 addmm."""
    a, b, c = coefficients
    tall = g.shape[0] > g.shape[1]
    x = (g.T if tall else g).cast(dtype)
    wide = dtypes.float32 if dtype.itemsize < 4 else dtype
    x = (x.cast(wide) / x.cast(wide).square().sum().sqrt().cast(dtype).cast(wide).maximum(eps)).cast(dtype)
    for _ in range(steps):
        xw = x.cast(wide)
        gram = (xw @ xw.T).cast(dtype).cast(wide)
        update = (gram * b + (gram @ gram) * c).cast(dtype).cast(wide)
        x = (xw * a + update @ xw).cast(dtype)
    return x.T if tall else x


class Muon(Optimizer):
    """Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"), as torch.optim.Muon:
    momentum whose update is orthogonalized by Newton-Schulz iterations, for 2-d weights only.

    Per step: buf = lerp(buf, g, 1 - momentum); the update is lerp(g, buf, momentum) with Nesterov, else buf; it is
    orthogonalized (newton_schulz, in bfloat16 as torch; `ns_dtype` chooses another), the weight decays by
    1 - lr * weight_decay, and the update is subtracted times lr * sqrt(max(1, rows / cols)) ("original") or
    lr * 0.2 * sqrt(max(rows, cols)) ("match_rms_adamw", AdamW's update size). Give biases, embeddings and other
    tensors to another optimizer, as torch's documentation advises."""

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315), eps: float = 1e-7,
                 ns_steps: int = 5, adjust_lr_fn: str | None = None, ns_dtype: DType = dtypes.bfloat16) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"Muon: lr ({lr}), momentum ({momentum}) and weight_decay ({weight_decay}) must be >= 0")
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ValueError(f"Muon: adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}")
        if not 0 <= ns_steps < 100: raise ValueError(f"Muon: ns_steps must be in [0, 100), got {ns_steps}")
        if len(ns_coefficients) != 3:
            raise ValueError(f"Muon: ns_coefficients must be 3 values (a, b, c), got {ns_coefficients}")
        super().__init__(params, lr)
        for p in self.params:
            if p.ndim != 2: raise ValueError(f"Muon: only 2-d parameters are supported, got one of shape {p.shape}; "
                                             "optimize the others with AdamW, say")
        self.weight_decay, self.momentum, self.nesterov, self.eps = weight_decay, momentum, nesterov, eps
        self.ns_coefficients, self.ns_steps, self.ns_dtype = tuple(ns_coefficients), ns_steps, ns_dtype
        self.adjust_lr_fn = adjust_lr_fn
        self.momentum_buffers = self._state()

    def _lr_ratio(self, shape: tuple[int, ...]) -> float:
        rows, cols = shape
        if self.adjust_lr_fn == "match_rms_adamw": return 0.2 * math.sqrt(max(rows, cols))
        return math.sqrt(max(1, rows / cols))

    def _updates(self, grads: list[Tensor]) -> list[Tensor]:
        decay = (1 - self.lr * self.weight_decay).contiguous()
        out: list[Tensor] = []
        for p, g, buf in zip(self.params, grads, self.momentum_buffers, strict=True):
            buf.assign(buf.lerp(g, 1 - self.momentum))
            update = g.lerp(buf, self.momentum) if self.nesterov else buf
            ortho = newton_schulz(update, self.ns_steps, self.ns_coefficients, self.eps, self.ns_dtype)
            step = (self.lr * self._lr_ratio(p.shape)).cast(p.dtype)
            out += [buf, p.assign(p * decay.cast(p.dtype) - ortho.cast(p.dtype) * step)]
        return out


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LAMB", "Muon", "newton_schulz"]
