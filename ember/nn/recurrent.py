"""Recurrent cells: LSTMCell, as torch.nn.LSTMCell (one time step; loop over the sequence in Python).

>>> from ember import Tensor
>>> cell = LSTMCell(3, 5)
>>> h, c = cell(Tensor.ones(2, 3))
>>> h.shape, c.shape
((2, 5), (2, 5))
"""

from __future__ import annotations

from ember.errors import ShapeError
from ember.nn.layers import _uniform_fan_in
from ember.nn.module import Module
from ember.tensor import Tensor


class LSTMCell(Module):
    """One step of a long short-term memory cell: (x, (h, c)) -> (h', c'), with torch's weight names and layout.

    weight_ih (4 * hidden, input) and weight_hh (4 * hidden, hidden) stack the gates in torch's order: input,
    forget, cell (g), output; so do bias_ih and bias_hh. Every weight starts uniform in ±1/sqrt(hidden_size), as
    torch. c' = f * c + i * g and h' = o * tanh(c'), with i, f, o sigmoids and g a tanh."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        self.input_size, self.hidden_size = input_size, hidden_size
        self.weight_ih = _uniform_fan_in((4 * hidden_size, input_size), hidden_size)
        self.weight_hh = _uniform_fan_in((4 * hidden_size, hidden_size), hidden_size)
        self.bias_ih = _uniform_fan_in((4 * hidden_size,), hidden_size) if bias else None
        self.bias_hh = _uniform_fan_in((4 * hidden_size,), hidden_size) if bias else None

    def __call__(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """(h', c') for input x of shape (batch, input_size) or (input_size,); hx defaults to zeros."""
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise ShapeError(f"LSTMCell: input must be (batch, {self.input_size}) or ({self.input_size},), "
                             f"got {x.shape}")
        if x.ndim == 1:
            h, c = self(x.unsqueeze(0), None if hx is None else (hx[0].unsqueeze(0), hx[1].unsqueeze(0)))
            return h[0], c[0]
        state = (x.shape[0], self.hidden_size)
        if hx is None: hx = (Tensor.zeros(*state, dtype=x.dtype, device=x.device),) * 2
        if hx[0].shape != state or hx[1].shape != state:
            raise ShapeError(f"LSTMCell: hidden state (h, c) must both be {state}, got {hx[0].shape} and "
                             f"{hx[1].shape}")
        h, c = hx
        gates = x @ self.weight_ih.T + h @ self.weight_hh.T
        if self.bias_ih is not None and self.bias_hh is not None: gates = gates + self.bias_ih + self.bias_hh
        i, f, g, o = gates.chunk(4, dim=1)
        c_next = f.sigmoid() * c + i.sigmoid() * g.tanh()
        return o.sigmoid() * c_next.tanh(), c_next


__all__ = ["LSTMCell"]
