"""The Module base of ember's layers: parameters(), buffers(), train()/eval(), and Sequential.

A model need not derive from Module: any object holding layers in attributes, lists, tuples or dicts is one, and
`ember.nn.state` finds its tensors. Module adds torch's conveniences on top of that walk, nothing more: it has no
__init__ to call and no registration; attributes are found where they are.

Training mode. A module runs as in training (BatchNorm's batch statistics, Dropout's masks) when its own `training`
flag is set (True by default, as torch; `model.eval()` clears it for every module reachable from model) or inside
`with Tensor.train():`, which puts every module in training whatever its flag. The functional ops
(`Tensor.dropout`) follow `Tensor.training` only.

>>> from ember import Tensor
>>> from ember.nn import Linear, ReLU
>>> model = Sequential(Linear(3, 4), ReLU(), Linear(4, 2))
>>> [name for name, _ in model.named_parameters()]
['0.weight', '0.bias', '2.weight', '2.bias']
>>> model.eval().training, model[0].training
(False, False)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any, Self, overload

from ember.nn.state import NOT_MODELS, get_state_dict
from ember.tensor import Tensor

# Buffers a forward pass assigned lazily (BatchNorm's running statistics), realized by the next optimizer step so
# that their update graphs do not pile up across steps even when the optimizer was given parameters() only.
_pending_buffers: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()


def defer_realize(*buffers: Tensor) -> None:
    """Mark buffers updated with `assign` in a forward pass, for the next optimizer step to realize.

    Not while a NumericalFunction is traced: those updates depend on placeholders and belong to the trace."""
    if Tensor.traced_inputs: return
    for t in buffers: _pending_buffers[id(t)] = t


def take_pending_buffers() -> list[Tensor]:
    """The buffers marked by defer_realize since the last call, forgotten by this one."""
    out = list(_pending_buffers.values())
    _pending_buffers.clear()
    return out


def modules_of(obj: Any) -> Iterator[Module]:
    """Every Module reachable from obj (obj included) through attributes, list/tuple items and dict values, each
    once, parents before children."""
    seen: set[int] = set()
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, Tensor) or isinstance(item, NOT_MODELS) or id(item) in seen: continue
        seen.add(id(item))
        if isinstance(item, Module): yield item
        if isinstance(item, (list, tuple)): children: list[Any] = list(item)
        elif isinstance(item, dict): children = list(item.values())
        elif hasattr(item, "__dict__"): children = list(vars(item).values())
        else: continue
        stack.extend(reversed(children))


class Module:
    """torch.nn.Module's conveniences for a class whose tensors and sublayers are plain attributes.

    Parameters are the tensors whose requires_grad is not False (None: not decided yet, as layers create them;
    an optimizer makes them trainable); buffers are the ones with requires_grad False (running statistics)."""

    training: bool = True  # the class's default until train()/eval() sets it on the instance

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """(dotted name, tensor) for every trainable tensor, in definition order, each once under its first name."""
        return [(name, t) for name, t in self._named_tensors() if t.requires_grad is not False]

    def parameters(self) -> list[Tensor]:
        """Every trainable tensor, in definition order, each once: what an optimizer takes."""
        return [t for _, t in self.named_parameters()]

    def named_buffers(self) -> list[tuple[str, Tensor]]:
        """(dotted name, tensor) for every state tensor that is saved but not trained (requires_grad False)."""
        return [(name, t) for name, t in self._named_tensors() if t.requires_grad is False]

    def buffers(self) -> list[Tensor]:
        """Every state tensor that is saved but not trained, such as BatchNorm's running statistics."""
        return [t for _, t in self.named_buffers()]

    def _named_tensors(self) -> list[tuple[str, Tensor]]:
        unique: dict[int, tuple[str, Tensor]] = {}
        for name, t in get_state_dict(self).items(): unique.setdefault(id(t), (name, t))
        return list(unique.values())

    def train(self, mode: bool = True) -> Self:
        """Set the training flag of this module and of every module reachable from it; returns self."""
        for module in modules_of(self): module.training = mode
        return self

    def eval(self) -> Self:
        """train(False): normalize with running statistics, no dropout."""
        return self.train(False)

    @property
    def is_training(self) -> bool:
        """Whether to run as in training now: this module's flag, or `with Tensor.train()` around the call."""
        return self.training or Tensor.training


class Sequential(Module):
    """Layers applied one after the other, as torch.nn.Sequential: callable, indexable, iterable, with a length.

    Layer i is the attribute named "i", so state dict names are torch's ("0.weight", "2.bias")."""

    def __init__(self, *layers: Callable[[Tensor], Tensor]) -> None:
        for i, layer in enumerate(layers): setattr(self, str(i), layer)

    @property
    def layers(self) -> list[Callable[[Tensor], Tensor]]:
        """The layers in order."""
        return [layer for name, layer in vars(self).items() if name.isdigit()]

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers: x = layer(x)
        return x

    @overload
    def __getitem__(self, index: int) -> Callable[[Tensor], Tensor]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequential: ...

    def __getitem__(self, index: int | slice) -> Callable[[Tensor], Tensor] | Sequential:
        if isinstance(index, slice): return Sequential(*self.layers[index])
        return self.layers[index]

    def __len__(self) -> int: return len(self.layers)

    def __iter__(self) -> Iterator[Callable[[Tensor], Tensor]]: return iter(self.layers)


__all__ = ["Module", "Sequential", "modules_of"]
