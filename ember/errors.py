"""The exceptions ember raises to users. Messages read `<op>: <what is wrong>: <values>; <what is valid>`.

Each class also derives from the builtin exception PyTorch raises for the same mistake, so code written against
torch (`except RuntimeError`, `except IndexError`) catches ember's errors too, and from the builtin ember raised
before (ValueError, TypeError), so code written against earlier ember keeps working. The builtins combined here
add no fields to BaseException, so one class can derive from several of them.
"""

from __future__ import annotations


class EmberError(Exception):
    """Base of every error ember raises on purpose."""


class ShapeError(EmberError, ValueError, RuntimeError):
    """Shapes that do not fit the op: broadcasting, reshape sizes, element counts.

    A ValueError as in Python and numpy, and a RuntimeError because torch raises that for shape mismatches."""


class AxisError(ShapeError, IndexError):
    """An axis (dim) outside -ndim..ndim-1: an IndexError, as torch's "Dimension out of range"."""


class SizeTypeError(ShapeError, TypeError):
    """A size that is not an int (a float, None, a bool) where a shape is given: a TypeError, as torch's "must be
    tuple of ints", and a ShapeError, as ember raised before."""


class DTypeError(EmberError, TypeError, RuntimeError):
    """A dtype the op cannot take, or two dtypes with no common type.

    A TypeError as in Python, and a RuntimeError because torch raises that for dtypes an op refuses ("result type
    Float can't be cast to the desired output type Long", "Only Tensors of floating point ... can require
    gradients")."""


class ArgumentError(EmberError, ValueError, RuntimeError):
    """An argument value the op cannot take (no clamp bound, an integer to a negative power): a ValueError as in
    Python, and a RuntimeError because torch raises that for these calls."""


class ModeError(ArgumentError, NotImplementedError):
    """A mode name the op does not know (pad's or interpolate's `mode`): also a NotImplementedError, as torch's
    "Unrecognised padding mode"."""


class DeviceError(EmberError, RuntimeError):
    """A device that does not exist or is not available here; names what to install."""


class CompileError(EmberError, RuntimeError):
    """The device compiler rejected generated source; the message carries its output and the failing line."""


class JitError(EmberError, RuntimeError):
    """A jitted function called in a way its replay would get wrong (ember/engine/jit.py lists the cases)."""


class SpecError(EmberError, AssertionError):
    """A UOp graph broke the rules of the stage it is in (stage, node, rule)."""
