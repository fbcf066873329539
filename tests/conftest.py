"""Test-wide settings: every NumericalFunction's first call also runs the numpy interpreter and checks that its
results are the native code's bit for bit (INTERPRET=2, see ember/export/interpreter.py). Tests marked slow run only
when asked for (`-m slow`): the default run stays within CI's time."""

import os

import pytest

os.environ.setdefault("INTERPRET", "2")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr") or ""): return
    for item in items:
        if "slow" in item.keywords: item.add_marker(pytest.mark.skip(reason="slow: run with -m slow"))
