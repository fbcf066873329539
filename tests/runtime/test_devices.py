"""The device registry: Device.DEFAULT is the best device that works here unless DEVICE names one; devices() lists
every device with "available" or the reason it is not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ember import devices
from ember.device import Device
from ember.errors import DeviceError


def default_with(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "DEVICE"} | env
    out = subprocess.run([sys.executable, "-c", "from ember.device import Device; print(Device.DEFAULT)"],
                         capture_output=True, text=True, env=clean, check=True)
    return out.stdout.strip()


def test_devices_lists_each_with_available_or_why_not() -> None:
    listed = devices()
    assert listed["CPU"] == "available" and set(listed) == set(Device.LISTED)
    for name, status in listed.items():
        if status != "available": assert name.split(":")[-1] in status or "install" in status, (name, status)


def test_the_default_is_the_best_working_device_and_device_overrides_it() -> None:
    best = next((n for n in Device.PREFERRED if devices().get(n) == "available"), "CPU")
    assert default_with({}) == best
    assert default_with({"DEVICE": "null:cuda"}) == "NULL:CUDA"
    assert default_with({"DEVICE": "cpu"}) == "CPU"


def test_an_unknown_device_names_the_known_ones() -> None:
    with pytest.raises(DeviceError, match=r"unknown device 'TPU'.*CPU, CL, CUDA, NULL"):
        Device["TPU"]
