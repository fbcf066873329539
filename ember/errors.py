"""The exceptions ember raises to users. Messages read `<op>: <what is wrong>: <values>; <what is valid>`."""

from __future__ import annotations


class EmberError(Exception):
    """Base of every error ember raises on purpose."""


class ShapeError(EmberError, ValueError):
    """Shapes that do not fit the op: broadcasting, reshape sizes, axes out of range."""


class DTypeError(EmberError, TypeError):
    """A dtype the op cannot take, or two dtypes with no common type."""


class DeviceError(EmberError, RuntimeError):
    """A device that does not exist or is not available here; names what to install."""


class CompileError(EmberError, RuntimeError):
    """The device compiler rejected generated source; the message carries its output and the failing line."""


class SpecError(EmberError, AssertionError):
    """A UOp graph broke the rules of the stage it is in (stage, node, rule)."""
