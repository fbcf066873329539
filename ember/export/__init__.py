"""Numerical functions: trace a function of arrays once, call it from Python, export it as C++."""

from ember.export.cpp import generate_module, render_module
from ember.export.function import Arg, NumericalFunction, numerical_function

__all__ = ["Arg", "NumericalFunction", "numerical_function", "generate_module", "render_module"]
