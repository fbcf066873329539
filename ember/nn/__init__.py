"""Neural-network layers with torch's constructor arguments, default initialization and state-dict names.

A layer is a Module (ember.nn.module): its parameters are Tensor attributes (named by
`ember.nn.state.get_state_dict` as torch names them: "weight", "bias", "running_mean", ...), and calling it applies
it. Module only adds conveniences (parameters(), buffers(), train()/eval()); any object holding layers in
attributes, lists or dicts is a model too. Layers run as in training by default, as torch's: call `model.eval()`
for inference (see ember.nn.module for the rule with `Tensor.train()`).

Initialization draws from ember's generator (`Tensor.manual_seed`), so the values differ from torch's, but the
distributions are torch's: Linear and Conv weights and biases uniform in ±1/sqrt(fan_in) (what torch's
kaiming_uniform with a=sqrt(5) reduces to), norms' weights ones and biases zeros, Embedding normal(0, 1).

The layers live in modules by purpose: layers (Linear, convolutions, Embedding, Dropout), norm, recurrent
(LSTMCell), stateless (activations, pooling, Flatten, Identity), module (Module, Sequential).

>>> from ember import Tensor
>>> layer = Linear(3, 2)
>>> layer(Tensor.ones(4, 3)).shape
(4, 2)
"""

from __future__ import annotations

from ember.nn.layers import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d, Dropout, Embedding, Linear
from ember.nn.module import Module, Sequential
from ember.nn.norm import (
    BatchNorm,
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    LayerNorm,
    RMSNorm,
)
from ember.nn.recurrent import LSTMCell
from ember.nn.stateless import (
    GELU,
    AvgPool2d,
    Flatten,
    Identity,
    MaxPool2d,
    MaxUnpool2d,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)

__all__ = ["Module", "Sequential", "Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "BatchNorm",
           "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "LayerNorm", "GroupNorm",
           "RMSNorm", "Embedding", "Dropout", "LSTMCell", "Identity", "ReLU", "GELU", "Sigmoid", "Tanh", "SiLU",
           "Softmax", "Flatten", "MaxPool2d", "AvgPool2d", "MaxUnpool2d"]
