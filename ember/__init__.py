"""ember: a small tensor compiler. Lazy tensors in, fused kernels out."""

from ember.device import Device, devices
from ember.dtype import DType, dtypes
from ember.engine.jit import TinyJit, jit
from ember.engine.realize import GlobalCounters
from ember.errors import JitError
from ember.helpers import Context, getenv
from ember.tensor import Tensor, no_grad
from ember.variables import Variable

__all__ = ["Tensor", "dtypes", "DType", "Device", "devices", "Context", "GlobalCounters", "getenv", "no_grad", "jit",
           "TinyJit", "JitError", "Variable"]
