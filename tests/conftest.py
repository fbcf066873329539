"""Test-wide settings: every NumericalFunction's first call also runs the numpy interpreter and checks that its
results are the native code's bit for bit (INTERPRET=2, see ember/export/interpreter.py). Tests marked slow run only
when asked for (`-m slow`): the default run stays within CI's time.

DEVICE=CL (any device name) runs the tests on that device: tensors land there by default (Device.DEFAULT). Where
that device cannot be opened here, every test is skipped with the reason, never passed without running.

DEVICE=NULL:CUDA compiles every kernel a test makes with the target's compiler and runs none: a test passes once it
reaches a value read (NullDeviceError) with every kernel before it compiled, and fails on a CompileError. The summary
counts the kernels compiled, and names those on tensor cores."""

import glob
import json
import os
import tempfile

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


RUN = os.getppid() if os.getenv("PYTEST_XDIST_WORKER") else os.getpid()  # the pytest process that reports
NULL_COUNTS = os.path.join(tempfile.gettempdir(), f"ember-null-kernels-{RUN}")  # each process's count of kernels


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):  # type: ignore[no-untyped-def]
    from ember.runtime.ops_null import NO_VALUES
    try:
        return (yield)
    except (Exception, pytest.fail.Exception) as e:  # DEVICE=NULL:...: every kernel up to the first read compiled
        if NO_VALUES not in str(e): raise  # (the read's error may come wrapped: the fuzzer's pytest.fail, a subprocess)
        if pyfuncitem.get_closest_marker("xfail"): pytest.skip("NULL device: compiled; its expected failure is a value")
        return True


def pytest_sessionfinish(session: pytest.Session) -> None:
    from ember.device import Device
    if not Device.DEFAULT.startswith("NULL"): return
    from ember.runtime.ops_null import NullCounters
    os.makedirs(NULL_COUNTS, exist_ok=True)
    with open(os.path.join(NULL_COUNTS, os.getenv("PYTEST_XDIST_WORKER", "main")), "w") as f:
        json.dump({"compiled": NullCounters.compiled, "tensor_cores": NullCounters.tensor_cores}, f)


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    from ember.device import Device
    if not Device.DEFAULT.startswith("NULL"): return
    counts = [json.load(open(p)) for p in glob.glob(os.path.join(NULL_COUNTS, "*"))]
    on_tc = sorted(set(name for c in counts for name in c["tensor_cores"]))
    terminalreporter.write_line(f"{Device.DEFAULT}: {sum(c['compiled'] for c in counts)} kernels compiled (none run); "
                                f"{sum(len(c['tensor_cores']) for c in counts)} on tensor cores: {', '.join(on_tc)}")
