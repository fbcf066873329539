"""Activation functions and torch.nn.functional's softmin and normalize, composed from elementwise and reduce ops
(their gradients come by composition).

Each follows torch's definition and default arguments; where torch uses expm1 or log1p for accuracy near zero,
so does ember. Compositions are chosen so that no intermediate overflows: a where() keeps the value of an unused
branch out of the result, but not out of the gradient (0 * inf is NaN), so exp() only ever sees a number <= 0.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.dtype import dtypes

if TYPE_CHECKING:
    from ember.tensor import Tensor


class ActivationMixin:
    """Nonlinearities of neural networks."""

    __slots__ = ()

    def sigmoid(self: Tensor) -> Tensor:
        """1 / (1 + exp(-x)), written as e / (1 + e) with e = exp(x) for x <= 0: exp(-x) would overflow below
        x = -88 (float32) and make the gradient inf * 0 = NaN."""
        x = self.float_like()
        is_positive = x > 0
        e = is_positive.where(-x, x).exp()  # exp(-|x|), in (0, 1]; at 0 the derivative of the x branch is used
        return is_positive.where(1, e) / (1 + e)

    def softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """log(1 + exp(beta*x)) / beta, and x itself where beta*x > threshold (as torch).

        Computed as max(beta*x, 0) + log1p(exp(-|beta*x|)), whose exp cannot overflow: log1p(exp(beta*x)) as written
        has a NaN gradient above the threshold, in the branch where() drops."""
        x = self.float_like()
        scaled = x * beta
        is_positive = scaled > 0
        soft = is_positive.where(scaled, 0) + is_positive.where(-scaled, scaled).exp().log1p()
        return (scaled > threshold).where(x, soft / beta)

    def relu6(self: Tensor) -> Tensor: return self.hardtanh(0, 6)

    def leaky_relu(self: Tensor, negative_slope: float = 0.01) -> Tensor:
        return (self > 0).where(self, self * negative_slope)  # at 0 the slope is negative_slope, as torch

    def elu(self: Tensor, alpha: float = 1.0) -> Tensor:
        return (self > 0).where(self, self.expm1() * alpha)

    def celu(self: Tensor, alpha: float = 1.0) -> Tensor:
        return (self > 0).where(self, (self / alpha).expm1() * alpha)

    def selu(self: Tensor) -> Tensor:
        alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
        return self.elu(alpha) * scale

    def silu(self: Tensor) -> Tensor:
        """x * sigmoid(x)."""
        return self * self.sigmoid()

    swish = silu

    def gelu(self: Tensor, approximate: str = "none") -> Tensor:
        """x * Phi(x) with the exact normal CDF, or torch's tanh approximation with approximate='tanh'.

        float16 and bfloat16 compute in float32 and round once, as torch: in the half dtype 1 + erf(x / sqrt 2)
        cancels for x << 0 (gelu(-2.9) would be 5% off in float16)."""
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        out_dtype = self.float_like().dtype
        x = self.cast(dtypes.float32) if out_dtype.itemsize < 4 else self.float_like()
        # 0.5 (1 + tanh z) = sigmoid(2z): the same function, without 1 + tanh's cancellation for x << 0, and an exp
        # that vector lanes evaluate as a polynomial, not tanh called lane by lane (GPT-2's MLP: 8.4 -> ? ms)
        if approximate == "tanh": out = x * (math.sqrt(8 / math.pi) * (x + 0.044715 * x * x * x)).sigmoid()
        else: out = 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())
        return out.cast(out_dtype)

    def quick_gelu(self: Tensor) -> Tensor: return self * (self * 1.702).sigmoid()
    def mish(self: Tensor) -> Tensor: return self * self.softplus().tanh()
    def hardsigmoid(self: Tensor) -> Tensor: return (self + 3).relu6() / 6
    def hardswish(self: Tensor) -> Tensor: return self * (self + 3).relu6() / 6
    def hardtanh(self: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        """x limited to [min_val, max_val]; unlike clamp the derivative is 0 at the bounds, as torch's."""
        return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))
    def logsigmoid(self: Tensor) -> Tensor:
        """log(sigmoid(x)) = -softplus(-x), without softplus's threshold (torch has none here either)."""
        return -(-self.float_like()).softplus(threshold=math.inf)

    def softsign(self: Tensor) -> Tensor:
        """x / (1 + |x|)."""
        return self.float_like() / (1 + self.float_like().abs())

    def softmin(self: Tensor, axis: int = -1, *, dim: int | None = None) -> Tensor:
        """softmax(-x) along `axis` (torch's `dim=` is accepted too): weights that favour the smallest entries.

        >>> Tensor([1.0, 1.0, 3.0]).softmin(0).tolist()
        [0.46831053495407104, 0.46831053495407104, 0.06337893754243851]
        """
        return (-self.float_like()).softmax(axis if dim is None else dim)

    def normalize(self: Tensor, p: float = 2.0, axis: int = 1, eps: float = 1e-12, *, dim: int | None = None) -> Tensor:
        """self / max(||self||_p, eps) with the p-norm taken along `axis`, as torch.nn.functional.normalize (which
        calls the axis `dim`, also accepted; its default is 1). p may be any float, inf or -inf, as torch's norm:
        p=0 counts the nonzero elements (a count, so no gradient flows through it), and a negative p gives
        (sum |x|^p)^(1/p).

        The root of the norm is taken only where the sum of powers is positive, so an all-zero slice has a finite
        gradient (1 / eps, as torch's) where sqrt(0)'s derivative would make it NaN. For p < 1 a zero element's
        power is a constant (0, or inf for p < 0) with derivative 0, as torch's norm backward, not 0 * inf = NaN.

        >>> Tensor([[3.0, 4.0]]).normalize().tolist()
        [[0.6000000238418579, 0.800000011920929]]
        """
        if math.isnan(p): raise ValueError("normalize: the norm order p is NaN; p must be a number, inf or -inf")
        a = self._axis(axis if dim is None else dim, "normalize")
        x = self.float_like()
        if math.isinf(p): norm = x.abs().max(axis=a, keepdim=True) if p > 0 else x.abs().min(axis=a, keepdim=True)
        elif p == 0: norm = x.ne(0).sum(a, keepdim=True).cast(x.dtype)
        elif p == 1: norm = x.abs().sum(a, keepdim=True)
        else:
            is_nonzero = x.ne(0)
            powers = x.abs().pow(p) if p > 1 else is_nonzero.where(is_nonzero.where(x.abs(), 1).pow(p),
                                                                    0.0 if p > 0 else math.inf)
            total = (x * x if p == 2 else powers).sum(a, keepdim=True)
            is_positive = total > 0
            root = is_positive.where(total, 1).sqrt() if p == 2 else is_positive.where(total, 1).pow(1 / p)
            norm = is_positive.where(root, 0)
        return x / norm.maximum(eps)
