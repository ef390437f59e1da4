"""Found trying it as a new user would: with nothing to send reports to, the ambient session
opens no window at all (before, a profiler started every window for nobody); a ``step()``
inside a ``step=True`` function, which ends two steps per call, is said once."""

from __future__ import annotations

import sys
import warnings

import pytest

import instrument
from exporters import ExporterWarning
from instrument import _torch, decorator, profiled, step

session_mod = sys.modules["instrument.session"]


@profiled("f")
def f() -> int:
    return 1


def _run_steps(n: int = 12) -> list[bool]:
    seen = []
    for _ in range(n):
        f()
        step()
        seen.append(bool(_torch._LIVE))
    return seen


@pytest.mark.parametrize("value", ["none", "  None "])
def test_exporters_none_opens_no_window_and_says_nothing(monkeypatch, value):
    monkeypatch.setenv("PROFILED_EXPORTERS", value)
    monkeypatch.setenv("PROFILED_EVERY", "4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a word
        assert _run_steps() == [False] * 12
    assert session_mod._current.finished and decorator._IDLE


def test_exporters_all_unknown_open_no_window_with_one_warning(monkeypatch):
    monkeypatch.setenv("PROFILED_EXPORTERS", "consle,jsn")
    monkeypatch.setenv("PROFILED_EVERY", "4")
    with pytest.warns(ExporterWarning) as caught:
        assert _run_steps() == [False] * 12
    said = [str(w.message) for w in caught]
    assert sum("no profiler windows are opened" in m for m in said) == 1, said
    instrument.shutdown()


def test_step_inside_a_step_function_is_said_once(monkeypatch):
    """Each call then ends two steps: the session says so, once."""
    from instrument.testing import capture
    from instrument import Schedule

    @profiled("train_step", step=True)
    def train_step() -> None:
        step()

    with pytest.warns(UserWarning, match="inside the step=True function 'train_step'") as w:
        with capture(schedule=Schedule(skip_first=100)) as cap:
            for _ in range(3):
                train_step()
            assert cap.session.step_index == 6  # two a call, as said
    assert sum("inside the step=True" in str(x.message) for x in w) == 1
