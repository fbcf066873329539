"""Random tensors from a counter-based generator (Threefry-2x32, 20 rounds) computed in the kernel that uses them.

Element i of the k-th draw after `manual_seed(s)` is a pure function of (s, the draw's counter offset, i), so the
same seed gives the same numbers on every device and no random state lives in memory. Threefry is Salmon et al.'s
"Parallel random numbers: as easy as 1, 2, 3" (SC'11); its known-answer vectors are in the tests.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.device import buffer_of
from ember.dtype import DType, dtypes, to_dtype
from ember.errors import DTypeError
from ember.helpers import RECORDERS
from ember.mixin.creation import accepts_requires_grad

if TYPE_CHECKING:
    from ember.tensor import Tensor

ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
PARITY = 0x1BD11BDA  # Threefry's key-schedule constant
MANTISSA_BITS = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24}


def threefry2x32(key: tuple[Any, Any], c0: Tensor, c1: Tensor) -> tuple[Tensor, Tensor]:
    """The two uint32 words Threefry-2x32-20 makes of counters (c0, c1) under `key` (two ints, or two uint32
    tensors that broadcast against the counters)."""
    ks = (key[0], key[1], key[0] ^ key[1] ^ PARITY)
    x0, x1 = c0 + ks[0], c1 + ks[1]
    for group in range(5):
        for r in ROTATIONS[4 * (group % 2): 4 * (group % 2) + 4]:
            x0 = x0 + x1
            x1 = ((x1 << r) | (x1 >> (32 - r))) ^ x0
        x0, x1 = x0 + ks[(group + 1) % 3], x1 + ks[(group + 2) % 3] + (group + 1)  # uint32 adds wrap mod 2**32
    return x0, x1


class RandomMixin:
    """rand, randn, randint, randperm, uniform, normal and the *_like forms: deterministic given `manual_seed`."""

    __slots__ = ()
    _seed: int = 0
    _drawn: int = 0  # counters used since the seed was set: each draw takes the next ones

    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Restart the generator: the draws after this are a function of `seed` alone."""
        RandomMixin._seed, RandomMixin._drawn = seed, 0

    @classmethod
    def _random_words(cls, n: int, device: str | None) -> tuple[Tensor, Tensor]:
        """Two tensors of n random uint32 words each, from the next n counters.

        The seed and the first counter are data, not constants of the graph: four uint32 words in a buffer the
        kernel reads. So every draw of one shape is the same kernel, compiled once (a dropout mask per training
        step would otherwise be a new program per step, and a new file in the compile cache)."""
        from ember.tensor import Tensor
        words = Tensor(cls.next_random_words(n), device=device)
        if RECORDERS: RECORDERS[-1].draw(buffer_of(words.uop.src[0]), n)  # a jit replay draws new words here
        key_low, key_high, start_low, start_high = (w.reshape(1) for w in words)
        counter = Tensor.arange(n, device=device).cast(dtypes.uint64) + \
            (start_low.cast(dtypes.uint64) | (start_high.cast(dtypes.uint64) << 32))
        low = (counter & 0xFFFFFFFF).cast(dtypes.uint32)
        high = (counter >> 32).cast(dtypes.uint32)
        return threefry2x32((key_low, key_high), low, high)

    @staticmethod
    def next_random_words(n: int) -> np.ndarray:
        """The key and first counter of the next n random numbers, as four uint32 words; takes the n counters."""
        start, RandomMixin._drawn = RandomMixin._drawn, RandomMixin._drawn + n
        seed = RandomMixin._seed & 0xFFFFFFFFFFFFFFFF
        return np.array([seed & 0xFFFFFFFF, seed >> 32, start & 0xFFFFFFFF, (start >> 32) & 0xFFFFFFFF], np.uint32)

    @classmethod
    @accepts_requires_grad
    def rand(cls, *shape: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Uniform samples in [0, 1): the top mantissa-many bits of a random word, so every value is exact."""
        from ember.mixin.creation import shape_of
        dims, dt = shape_of(shape, "rand"), to_dtype(dtype or dtypes.default_float)
        if not dt.is_float: raise DTypeError(f"rand: needs a float dtype, got {dt.name}")
        n = math.prod(dims)
        x0, x1 = cls._random_words(n, device)
        if dt is dtypes.float64:  # 53 bits from two words
            value = ((x0 >> 5).cast(dt) * 2.0**26 + (x1 >> 6).cast(dt)) * 2.0**-53
        else:
            bits = MANTISSA_BITS[dt.scalar]
            value = ((x0 >> (32 - bits)).cast(dtypes.float32) * 2.0**-bits).cast(dt)
        return value.reshape(dims)

    @classmethod
    @accepts_requires_grad
    def uniform(cls, *shape: Any, low: float = 0.0, high: float = 1.0, dtype: DType | str | None = None,
                device: str | None = None) -> Tensor:
        """Uniform samples in [low, high)."""
        return cls.rand(*shape, dtype=dtype, device=device) * (high - low) + low

    @classmethod
    @accepts_requires_grad
    def randn(cls, *shape: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Standard normal samples (Box-Muller on two uniform draws, computed in float32 or float64)."""
        from ember.mixin.creation import shape_of
        dims, dt = shape_of(shape, "randn"), to_dtype(dtype or dtypes.default_float)
        work = dtypes.float64 if dt is dtypes.float64 else dtypes.float32
        u1, u2 = cls.rand(*dims, dtype=work, device=device), cls.rand(*dims, dtype=work, device=device)
        radius = ((1 - u1).log() * -2).sqrt()  # 1 - u1 is in (0, 1]: the log is finite
        return (radius * (u2 * (2 * math.pi)).cos()).cast(dt)

    @classmethod
    @accepts_requires_grad
    def normal(cls, *shape: Any, mean: float = 0.0, std: float = 1.0, dtype: DType | str | None = None,
               device: str | None = None) -> Tensor:
        return cls.randn(*shape, dtype=dtype, device=device) * std + mean

    @classmethod
    @accepts_requires_grad
    def randint(cls, *shape: Any, low: int = 0, high: int = 10, dtype: DType | str | None = None,
                device: str | None = None) -> Tensor:
        """Integers uniform in [low, high)."""
        if high <= low: raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
        dt = to_dtype(dtype or dtypes.default_int)
        return (cls.rand(*shape, dtype=dtypes.float64, device=device) * (high - low)).floor().cast(dt) + low

    @classmethod
    @accepts_requires_grad
    def randperm(cls, n: int, device: str | None = None, dtype: DType | str = dtypes.int32) -> Tensor:
        """A random permutation of 0..n-1: the ranks of n float64 uniform draws (53 bits make ties rare, and the
        stable sort still gives a permutation when they happen)."""
        if not isinstance(n, int) or n < 0: raise ValueError(f"randperm: n must be a non-negative int, got {n!r}")
        return cls.rand(n, dtype=dtypes.float64, device=device).argsort().cast(to_dtype(dtype))

    @accepts_requires_grad
    def rand_like(self: Tensor, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Uniform samples in [0, 1) with self's shape, and self's dtype and device unless given."""
        dt = to_dtype(dtype or self.dtype)
        if not dt.is_float: raise DTypeError(f"rand_like: needs a float dtype, got {dt.name}; pass dtype=")
        return type(self).rand(*self.shape, dtype=dt, device=device or self.device)

    @accepts_requires_grad
    def randn_like(self: Tensor, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Standard normal samples with self's shape, and self's dtype and device unless given."""
        dt = to_dtype(dtype or self.dtype)
        if not dt.is_float: raise DTypeError(f"randn_like: needs a float dtype, got {dt.name}; pass dtype=")
        return type(self).randn(*self.shape, dtype=dt, device=device or self.device)

    def multinomial(self: Tensor, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """int64 indices of categories drawn with probabilities proportional to the weights in self's last axis
        (1-D: one distribution, shape (num_samples,); 2-D: one per row, shape (rows, num_samples)), as torch.

        With replacement each draw inverts the running sum of the weights at a uniform value. Without, each
        category gets the key log(w) - log(E) for an exponential E, and the largest keys win, in order: the
        exponential race, whose order is that of drawing one at a time and renormalizing. The weights are read
        once to check them as torch does (finite, non-negative, a positive sum). As torch, drawing more samples
        without replacement than there are categories with weight gives the others last, in random order.

        >>> from ember import Tensor
        >>> Tensor([0.0, 1.0, 0.0]).multinomial(2, replacement=True).tolist()
        [1, 1]
        """
        from ember.errors import ShapeError
        from ember.tensor import Tensor
        if self.ndim not in (1, 2): raise ShapeError(f"multinomial: weights must be 1-D or 2-D, got {self.shape}")
        if not self.dtype.is_float:
            raise DTypeError(f"multinomial: weights must have a float dtype, got {self.dtype.name}")
        n = self.shape[-1]
        if not isinstance(num_samples, int) or num_samples <= 0:
            raise ValueError(f"multinomial: num_samples must be a positive int, got {num_samples!r}")
        if not replacement and num_samples > n:
            raise ValueError(f"multinomial: cannot draw {num_samples} samples from {n} categories without "
                             "replacement; num_samples must be at most the number of categories")
        weights = self.reshape(-1, n).float() if self.dtype.itemsize < 4 else self.reshape(-1, n)
        _check_weights(weights)
        rows = weights.shape[0]
        if replacement:
            cdf = weights.cumsum(-1)
            point = Tensor.rand(rows, num_samples, 1, dtype=weights.dtype, device=self.device) * cdf[:, -1:, None]
            count = (cdf.unsqueeze(1) <= point).sum(-1, dtype=dtypes.int64)
            # u * total can round up to total: stop at the last category that has weight
            position = Tensor.arange(n, dtype=dtypes.int64, device=self.device)
            last = (weights > 0).where(position, 0).max(axis=-1, keepdim=True)
            index = count.minimum(last)
        else:
            uniform = Tensor.rand(rows, n, dtype=weights.dtype, device=self.device)
            exponential = -(1 - uniform).log()
            # categories without weight come only after all others, in random order, as torch's: keys far below
            # any log(w) - log(E) (which stays above -800 even in float64)
            key = (weights > 0).where(weights.log() - exponential.log(), (1 + uniform) * -1e30)
            index = key.topk(num_samples, -1).indices
        return index.reshape(num_samples) if self.ndim == 1 else index

    # ---- initializers (torch's fan conventions: fan_in = shape[1] * receptive field, fan_out = shape[0] * ...) ----

    @classmethod
    @accepts_requires_grad
    def kaiming_uniform(cls, *shape: Any, a: float = 0.01, dtype: DType | str | None = None,
                        device: str | None = None) -> Tensor:
        """He initialization for a leaky-relu slope `a`: uniform in +-gain * sqrt(3 / fan_in)."""
        fan_in, _ = _fans(shape, "kaiming_uniform")
        bound = math.sqrt(2 / (1 + a * a)) * math.sqrt(3 / fan_in)
        return cls.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device)

    @classmethod
    @accepts_requires_grad
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, dtype: DType | str | None = None,
                       device: str | None = None) -> Tensor:
        """He initialization, normal with std gain / sqrt(fan_in)."""
        fan_in, _ = _fans(shape, "kaiming_normal")
        return cls.normal(*shape, std=math.sqrt(2 / (1 + a * a)) / math.sqrt(fan_in), dtype=dtype, device=device)

    @classmethod
    @accepts_requires_grad
    def glorot_uniform(cls, *shape: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Glorot (Xavier) initialization: uniform in +-sqrt(6 / (fan_in + fan_out))."""
        fan_in, fan_out = _fans(shape, "glorot_uniform")
        bound = math.sqrt(6 / (fan_in + fan_out))
        return cls.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device)

    @classmethod
    @accepts_requires_grad
    def scaled_uniform(cls, *shape: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """Uniform in [-1, 1) scaled by prod(shape) ** -0.5, as tinygrad's scaled_uniform."""
        from ember.mixin.creation import shape_of
        n = math.prod(shape_of(shape, "scaled_uniform"))
        return cls.uniform(*shape, low=-1.0, high=1.0, dtype=dtype, device=device) * (n ** -0.5 if n else 1.0)


def _fans(shape: tuple[Any, ...], op: str) -> tuple[int, int]:
    from ember.mixin.creation import shape_of
    dims = shape_of(shape, op)
    if len(dims) < 2 or 0 in dims: raise ValueError(f"{op}: needs a shape with 2 or more nonzero axes, got {dims}")
    receptive = math.prod(dims[2:])
    return dims[1] * receptive, dims[0] * receptive


def _check_weights(weights: Tensor) -> None:
    """Raise as torch does for weights no distribution has: inf, NaN or negative ones, or a row summing to 0."""
    bad = (weights < 0) | weights.isnan() | weights.isinf()
    positive = (weights > 0).sum(-1)
    if bad.any().item():
        raise ValueError("multinomial: the weights contain inf, NaN or a negative value; weights must be finite and "
                         ">= 0")
    if (positive == 0).any().item():
        raise ValueError("multinomial: a row of weights sums to 0; each distribution needs a positive weight")
