"""Test-wide settings: every NumericalFunction's first call also runs the numpy interpreter and checks that its
results are the native code's bit for bit (INTERPRET=2, see ember/export/interpreter.py). Tests marked slow run only
when asked for (`-m slow`): the default run stays within CI's time.

DEVICE=CL (any device name) runs the tests on that device: tensors land there by default (Device.DEFAULT). Where
that device cannot be opened here, every test is skipped with the reason, never passed without running."""

import os

import pytest

os.environ.setdefault("INTERPRET", "2")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from ember.device import Device
    from ember.errors import DeviceError
    try:
        Device[Device.DEFAULT]
    except DeviceError as e:
        for item in items: item.add_marker(pytest.mark.skip(reason=f"DEVICE={Device.DEFAULT}: {e}"))
        return
    if "slow" in (config.getoption("markexpr") or ""): return
    for item in items:
        if "slow" in item.keywords: item.add_marker(pytest.mark.skip(reason="slow: run with -m slow"))
