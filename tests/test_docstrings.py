"""Every `>>>` example in ember's docstrings runs and prints what it says (STYLE.md: documentation that must not rot).

Oracle: the expected output written in the docstring, checked by the standard library's doctest."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ember
from ember import Tensor, dtypes

MODULES = sorted(m.name for m in pkgutil.walk_packages(ember.__path__, "ember."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str):
    module = importlib.import_module(name)
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(module, name, extraglobs={"Tensor": Tensor, "dtypes": dtypes}):  # mixins name Tensor late
        if test.examples: runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
