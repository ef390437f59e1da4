"""Found trying it as a new user would: with nothing to send reports to, the ambient session
opens no window at all (before, a profiler started every window for nobody); a ``step()``
inside a ``step=True`` function, which ends two steps per call, is said once."""

from __future__ import annotations

import warnings

import pytest

import instrument
from exporters import ExporterWarning
from instrument import profiled, step
from instrument.runtime import state
from instrument.testing import process_status


@profiled("f")
def f() -> int:
    return 1


def _run_steps(n: int = 12) -> list[bool]:
    seen = []
    for _ in range(n):
        f()
        step()
        seen.append(bool(process_status().windows_recording))
    return seen


@pytest.mark.parametrize("value", ["none", "  None "])
def test_exporters_none_opens_no_window_and_says_nothing(monkeypatch, value):
    monkeypatch.setenv("PROFILED_EXPORTERS", value)
    monkeypatch.setenv("PROFILED_EVERY", "4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a word
        assert _run_steps() == [False] * 12
    assert state.current.finished and process_status().calls_idle


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
    from instrument import Schedule
    from instrument.testing import capture

    @profiled("train_step", step=True)
    def train_step() -> None:
        step()

    with pytest.warns(UserWarning, match="inside the step=True function 'train_step'") as w:
        with capture(schedule=Schedule(skip_first=100)) as cap:
            for _ in range(3):
                train_step()
            assert cap.session.step_index == 6  # two a call, as said
    assert sum("inside the step=True" in str(x.message) for x in w) == 1


def _profiler_on() -> bool:
    status = process_status()
    return bool(status.windows_recording) or status.profiler_on


def test_the_last_step_of_a_program_starts_no_profiler(monkeypatch):
    """With PROFILED_EVERY=4 a program of 5 root calls ended step 4 (the next window's warm-up)
    and its profiler started at that boundary, to record nothing before the exit. The ambient
    session starts a window's profiler at the first decorated call of its first recorded step."""
    from exporters import InMemoryExporter

    mem = InMemoryExporter()
    instrument.configure(exporters=[mem], every=4)
    seen = []
    for _ in range(5):
        f()
        seen.append(_profiler_on())
    # window 0 records steps 1-3 (on from the first call of step 1 to the end of step 3);
    # step 4 is window 1's warm-up, and no call came after it
    assert seen == [False, True, True, False, False]
    f()  # step 5: window 1's first recorded step begins with this call
    assert _profiler_on()
    instrument.shutdown()
    assert not _profiler_on()
    assert [r.steps for r in mem.reports] == [(1, 2, 3), (5,)]
    assert mem.reports[1].partial


def test_a_window_started_at_its_first_call_records_the_whole_step():
    """The README's loop: a ``data`` block, then the step function. The window starts at the
    ``data`` block, the step's first call, and records both, as it did when it started at the
    step boundary."""
    from exporters import InMemoryExporter

    mem = InMemoryExporter()
    instrument.configure(exporters=[mem], every=4)

    @profiled("train_step", step=True)
    def train_step() -> None:
        pass

    for _ in range(8):
        with profiled("data"):
            pass
        train_step()
    instrument.flush()
    assert [r.steps for r in mem.reports] == [(1, 2, 3), (5, 6, 7)]
    for report in mem.reports:
        calls = {name: r.calls for name, r in report.ranges.items()}
        assert calls == {"data": 3, "train_step": 3}, calls


def test_a_window_starts_on_the_thread_that_steps():
    """Another thread's decorated call while a window waits for its first call starts nothing:
    the profiler records the thread that started it, and that is the stepping thread."""
    import threading

    from exporters import InMemoryExporter

    mem = InMemoryExporter()
    instrument.configure(exporters=[mem], every=4)

    @profiled("train_step", step=True)
    def train_step() -> None:
        pass

    on_other: list[bool] = []

    def other() -> None:
        f()
        on_other.append(_profiler_on())

    train_step()  # step 0 (warm-up) ends: step 1 records from its first call
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert on_other == [False]
    train_step()
    train_step()
    train_step()
    instrument.flush()
    assert [r.steps for r in mem.reports] == [(1, 2, 3)]
    assert {n: r.calls for n, r in mem.reports[0].ranges.items()} == {"train_step": 3}
