"""Activation functions, composed from elementwise ops (their gradients come by composition).

Each follows torch's definition and default arguments; where torch uses expm1 or log1p for accuracy near zero,
so does ember.
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
        """1 / (1 + exp(-x))."""
        return (1 + (-self.float_like()).exp()).reciprocal()

    def softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """log(1 + exp(beta*x)) / beta, and x itself where beta*x > threshold (as torch)."""
        x = self.float_like() * beta
        return (x > threshold).where(self.float_like(), x.exp().log1p() / beta)

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
        if approximate == "tanh": out = 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
        else: out = 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())
        return out.cast(out_dtype)

    def quick_gelu(self: Tensor) -> Tensor: return self * (self * 1.702).sigmoid()
    def mish(self: Tensor) -> Tensor: return self * self.softplus().tanh()
    def hardsigmoid(self: Tensor) -> Tensor: return (self + 3).relu6() / 6
    def hardswish(self: Tensor) -> Tensor: return self * (self + 3).relu6() / 6
    def hardtanh(self: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        """x limited to [min_val, max_val]; unlike clamp the derivative is 0 at the bounds, as torch's."""
        return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))
    def logsigmoid(self: Tensor) -> Tensor: return -(-self).softplus()

    def softsign(self: Tensor) -> Tensor:
        """x / (1 + |x|)."""
        return self.float_like() / (1 + self.float_like().abs())
