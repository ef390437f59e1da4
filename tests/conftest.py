"""Shared fixtures: every test starts from a fresh SDK state and its own trace directory."""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager

import pytest

import instrument.testing
from tests import _early, _proc


@contextmanager
def counting_ambient():
    """The ambient session (built and started here) of a program with no ``step=True``
    function that has not called ``step()``, the only session where root calls end steps; it
    counts them and never opens a window. Shut down at the end."""
    from exporters import InMemoryExporter
    from instrument import Schedule

    instrument.configure(schedule=Schedule(skip_first=10**6), exporters=[InMemoryExporter()])
    sess = instrument.runtime.lifetime.session_for_calls()
    assert sess is not None and sess.ambient and sess.status().root_calls_end_steps
    yield sess
    instrument.shutdown()


@pytest.fixture(autouse=True)
def _fresh_sdk(tmp_path, monkeypatch):
    """No PROFILED_* leaks in from the outside; traces go to the test's tmp dir."""
    for var in list(os.environ):
        if var.startswith("PROFILED_"):
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PROFILED_TRACE_DIR", str(tmp_path / "traces"))
    monkeypatch.setenv("PROFILED_EXPORTERS", "memory")
    instrument.testing.reset()
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        instrument.testing.reset()


@pytest.fixture
def run_python(tmp_path):
    """Run a Python snippet in a fresh interpreter (real process, real exit) in the test's
    directory, with :func:`tests._proc.sdk_env` plus ``env``."""

    def run(code: str, env: dict[str, str] | None = None, timeout: float = 120):
        return _proc.run("-c", code, env=_proc.sdk_env(env), cwd=tmp_path, timeout=timeout)

    return run


def pytest_collection_finish(session):
    """The type checker's run (``tests/test_lint.py``, at the lowest priority) and the children
    the modules registered with ``tests._early`` (while a core is idle) start now, in the
    background."""
    from tests import test_lint

    test_lint.start_early(session.items)
    _early.start(session.items)


def pytest_sessionfinish(session, exitstatus):
    from tests import test_lint

    test_lint.stop_early()
    _early.stop()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``@pytest.mark.cuda`` run only where torch sees a CUDA GPU."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
