"""A window's deferred stop, and a torch profiler the program starts while a window records.

On a CUDA window the session does not synchronise the device at the window's end: it records a
CUDA event and stops the (real) profiler at a later step boundary once that event completed,
or at MAX_DRAIN_STEPS / DRAIN_MAX_S after waiting for it. The device part is the event, so on
the CPU these tests hand the session a stand-in event and drive real torch.profiler windows;
tests/test_cuda.py runs the same with a real one. The profiler tests run in a subprocess: the
failure they guard against is a segmentation fault in the program's own trace export.

Windows here record every thread (``PROFILED_ALL_THREADS=1``): the stops from other threads
these tests drive (the timer, another thread's step, close) exist only there. Windows that
record only their own thread wait for it to stop them: tests/test_never_crash.py.
"""

from __future__ import annotations

import os
import queue
import textwrap
import threading
import time

import pytest
import torch

import instrument
from instrument import Schedule, profiled
from instrument.runtime import _torch, state  # noqa: E402
from instrument.runtime import stops as stops_mod
from instrument.testing import InMemoryExporter, capture, process_status
from tests import _early, _proc

X = torch.randn(32, 32)


@profiled("work", step=True)
def work() -> torch.Tensor:
    return X @ X


class StandInEvent:
    """A CUDA event's part in a deferred stop: ``query`` says whether the window's kernels
    have run; ``synchronize`` waits for them."""

    def __init__(self, done_after: int | None, window) -> None:
        self.window = window  # the ended window whose stop waits for this event
        self.queries = 0
        self.done_after = done_after  # completes at this query; None: only when waited for
        self.synchronized = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done_after is not None and self.queries >= self.done_after

    def synchronize(self) -> None:
        self.synchronized += 1


@pytest.fixture(autouse=True)
def _all_threads(monkeypatch):
    monkeypatch.setenv("PROFILED_ALL_THREADS", "1")


@pytest.fixture
def stand_in(monkeypatch):
    """A stand-in end event per window, completing at its ``done_after[0]``-th query; the
    window's end polls it not at all (``DRAIN_SPIN_S`` 0: these tests drive the deferred
    path; the poll has its own tests below)."""
    events: list[StandInEvent] = []
    done_after = [2]
    monkeypatch.setattr(stops_mod, "DRAIN_SPIN_S", 0.0)

    def end_marker_event(window):
        assert window.recording and window.all_threads
        events.append(StandInEvent(done_after[0], window))
        return events[-1]

    monkeypatch.setattr(_torch.ProfilerWindow, "end_marker_event", end_marker_event)
    return events, done_after


def _window(**kw):
    return capture(schedule=Schedule(warmup=1, active=3), activities=["cpu"], **kw)


def test_the_stop_waits_for_the_event_then_cuts_what_ran_after_the_end(stand_in):
    events, _ = stand_in
    with _window() as cap:
        sess = cap.session
        for _ in range(4):  # warm-up + 3 recorded steps
            work()
        assert sess.status().stop_deferred and not sess.status().window_open
        window = events[0].window
        assert window.recording and _torch.profiler_on()
        work()  # first boundary: the event has not completed, the profiler records on
        assert sess.status().stop_deferred
        work()  # second: completed, stopped without a synchronisation
        assert not sess.status().stop_deferred and not window.recording
        # no device-wide synchronisation asked of torch's stop: only the window's own profiler
        # object shows it
        assert window._prof.profiler.use_device is None
        assert not _torch.profiler_on()
    (event,) = events
    assert event.synchronized == 0
    assert sess.status().deferred_stops == ((2, True),)
    (report,) = cap.reports
    assert report.steps == (1, 2, 3)
    assert report.ranges["work"].calls == 3  # the two calls after the window's end are cut


def test_at_the_cap_it_waits_for_the_event_not_the_device(stand_in, monkeypatch):
    events, done_after = stand_in
    done_after[0] = None  # never completes by itself
    monkeypatch.setattr(stops_mod, "MAX_DRAIN_STEPS", 3)
    with _window() as cap:
        sess = cap.session
        for _ in range(4):
            work()
        for _ in range(2):
            work()
            assert sess.status().stop_deferred
        work()  # the third boundary: the cap
        assert not sess.status().stop_deferred
    (event,) = events
    assert event.synchronized == 1
    assert sess.status().deferred_stops == ((3, False),)
    assert cap.reports[0].ranges["work"].calls == 3


@pytest.mark.parametrize("done_after", [1, 3])
def test_device_work_done_by_the_windows_end_stops_it_there(stand_in, monkeypatch, done_after):
    """Where the window's kernels have run by its end, or within DRAIN_SPIN_S of it (the
    event's first, or third, poll), the profiler stops at once: no drained step recorded, no
    synchronisation, and the drain log says 0 steps waited."""
    events, done = stand_in
    done[0] = done_after
    monkeypatch.setattr(stops_mod, "DRAIN_SPIN_S", 30.0)  # ample: the poll ends at its query
    with _window() as cap:
        sess = cap.session
        for _ in range(4):  # warm-up + 3 recorded steps: the 4th step's end ends the window
            work()
        (event,) = events
        window = event.window
        assert not sess.status().stop_deferred
        assert not window.recording and not _torch.profiler_on()
        assert window._prof.profiler.use_device is None  # no device-wide synchronisation
        assert event.queries == done_after and event.synchronized == 0
        assert sess.status().deferred_stops == ((0, True),)
        work()  # recorded by no profiler
    (report,) = cap.reports
    assert report.steps == (1, 2, 3)
    assert report.ranges["work"].calls == 3
    assert report.cost is not None and report.cost.stop_stall_us > 0


def test_device_work_still_queued_after_the_poll_defers_the_stop(stand_in, monkeypatch):
    """An end event that has not completed within DRAIN_SPIN_S: polled more than once, then
    the stop is deferred to a later step as before."""
    events, done = stand_in
    done[0] = None  # completes only when waited for
    monkeypatch.setattr(stops_mod, "DRAIN_SPIN_S", 0.05)
    monkeypatch.setattr(stops_mod, "MAX_DRAIN_STEPS", 2)
    with _window() as cap:
        sess = cap.session
        for _ in range(4):
            work()
        (event,) = events
        assert event.queries > 1  # polled, with sleeps between
        assert sess.status().stop_deferred and event.window.recording
        work()  # the first boundary: not completed
        work()  # the cap: waited for, then stopped
        assert not sess.status().stop_deferred
    assert event.synchronized == 1
    assert sess.status().deferred_stops == ((2, False),)
    (report,) = cap.reports
    assert report.ranges["work"].calls == 3
    # the poll ran to its deadline on the caller: part of the window's stop stall
    assert report.cost is not None and report.cost.stop_stall_us >= 50_000


def test_a_program_that_stops_stepping_is_stopped_by_the_timer(stand_in, monkeypatch):
    events, done_after = stand_in
    done_after[0] = None
    monkeypatch.setattr(stops_mod, "DRAIN_MAX_S", 0.2)
    with _window() as cap:
        sess = cap.session
        for _ in range(4):
            work()
        assert sess.status().stop_deferred
        deadline = time.monotonic() + 30
        # no step ends: only the timer thread can stop it (it clears the drain, then stops)
        while (sess.status().stop_deferred or _torch.profiler_on()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not sess.status().stop_deferred
        assert not _torch.profiler_on()
        assert sess.flush(30)
        assert cap.reports and cap.reports[0].steps == (1, 2, 3)
    assert events[0].synchronized == 1


def test_long_steps_stop_at_the_windows_end(stand_in, monkeypatch):
    events, _ = stand_in
    monkeypatch.setattr(stops_mod, "DEFER_MAX_STEP_NS", 0)  # every step counts as long
    with _window() as cap:
        for _ in range(4):
            work()
        assert not cap.session.status().stop_deferred and not _torch.profiler_on()
    assert events == []
    assert cap.reports[0].ranges["work"].calls == 3


def test_closing_the_session_stops_a_deferred_window(stand_in):
    events, done_after = stand_in
    done_after[0] = None
    with _window() as cap:
        for _ in range(4):
            work()
        assert cap.session.status().stop_deferred
    assert not cap.session.status().stop_deferred and not _torch.profiler_on()
    assert events[0].synchronized == 1
    assert cap.reports[0].steps == (1, 2, 3)


# A torch profiler of the program's own starts while a window records (or drains) and is still
# running when the window ends: torch profilers do not nest, and stopping the window would end
# the program's profiler, whose export then crashed (SIGSEGV, torch 2.13). The session must
# leave the program's profiler running, drop its own window and say so.
_PROGRAM = """
import json, sys, warnings
import torch
from instrument import Schedule, profiled, session; from instrument.runtime import _torch
from instrument import ProfilerWarning

{setup}

@profiled("step", step=True)
def step(x):
    return x @ x

x = torch.randn(64, 64)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with session(schedule=Schedule(warmup=1, active=3), activities=["cpu"],
                 exporters=[]) as s:
        for i in range(8):
            if i == {start_at}:
                theirs = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                theirs.start()
            step(x)
    said = [str(w.message) for w in caught if issubclass(w.category, ProfilerWarning)]
    torch.ones(3).mul(2)
    theirs.stop()
theirs.export_chrome_trace(sys.argv[1])
names = [e.get("name") for e in json.load(open(sys.argv[1]))["traceEvents"]]
print(json.dumps({{"said": said, "steps": names.count("step"), "mul": "aten::mul" in names,
                  "windows": s.windows_ended, "on": _torch.profiler_on()}}))
"""

_STAND_IN = """
from instrument.runtime import _torch, stops
stops.DRAIN_MAX_S = 600.0  # the drain ends at a step, never by the timer (a loaded box's pace)
class Event:
    def query(self): return False
    def synchronize(self): pass
_torch.ProfilerWindow.end_marker_event = lambda self: Event()
"""


# recording: theirs starts at step 2 (of the recorded 1-3); draining: at step 4, after the
# window's end, while its deferred stop waits (a stand-in event that never completes); each its
# own program, run early (tests/_early.py)
for _case in ("recording", "draining"):
    _early.add(
        __name__,
        f"test_a_profiler_the_program_starts_meanwhile_survives_the_windows_end[{_case}]",
        "-c",
        textwrap.dedent(_PROGRAM).format(
            setup=_STAND_IN if _case == "draining" else "",
            start_at=2 if _case == "recording" else 4,
        ),
        "theirs.json",
        env=_proc.sdk_env(),
    )


@pytest.mark.parametrize("case", ["recording", "draining"])
def test_a_profiler_the_program_starts_meanwhile_survives_the_windows_end(request, case):
    proc, _cwd = _early.result(request)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["windows"] == 0  # the session's window was dropped, not stopped
    assert any(
        "your own torch.profiler started while a torch-profiled window recorded" in m
        for m in out["said"]
    ), out["said"]
    # the program's profiler recorded on past the window's end, to its own stop; started during
    # the drain, it misses the step it started in (the drain paused the stepping thread's CPU
    # ops; the step's end drops the window and resumes them)
    assert out["steps"] == (8 - 2 if case == "recording" else 8 - 4 - 1)
    assert out["mul"] and out["on"] is False


def test_a_profiler_the_program_starts_and_stops_during_the_drain(stand_in, tmp_path):
    """Its stop ended our window's profiler too: the session must not stop it again (torch
    would find no session), and drops the window with the same warning."""
    events, done_after = stand_in
    done_after[0] = None
    with pytest.warns(instrument.ProfilerWarning, match="your own torch.profiler started"):
        with _window() as cap:
            for _ in range(4):
                work()
            assert cap.session.status().stop_deferred
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                torch.ones(3).mul(2)  # no step boundary while it runs
            assert cap.session.status().stop_deferred and not _torch.profiler_on()
            work()  # the next boundary sees that ours was ended: dropped, not stopped again
            assert not cap.session.status().stop_deferred
    assert cap.session.windows_ended == 0 and cap.reports == []
    assert events[0].synchronized == 0  # nothing of ours left to wait for
    # theirs ran while the drain paused this thread's CPU ops (on CUDA, torch 2.11 records no
    # CPU ops in a profiler started while another runs either); the next step resumed them
    assert "aten::mul" not in [e.name for e in prof.events()]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(3).mul(2)
    assert "aten::mul" in [e.name for e in prof.events()]


def _work_ranges(window) -> int:
    """What the window's profiler recorded, the drain's steps included (the report cuts them):
    only torch's own results show it."""
    return [e.name() for e in window._prof.profiler.kineto_results.events()].count("work")


@pytest.mark.parametrize("paused", [True, False])
def test_during_the_drain_the_stepping_thread_records_no_cpu_ops(stand_in, monkeypatch, paused):
    events, done_after = stand_in
    done_after[0] = 3
    monkeypatch.setattr(stops_mod, "DRAIN_PAUSES_CPU_OPS", paused)
    with capture(schedule=Schedule(warmup=1, active=3, repeat=1), activities=["cpu"]) as cap:
        sess = cap.session
        for _ in range(4):
            work()
        (event,) = events
        window = event.window
        for _ in range(3):
            work()
        assert not sess.status().stop_deferred and not window.recording
        # the 3 recorded steps (a CPU window records from its first); the drain's 3 steps
        # only where not paused
        assert _work_ranges(window) == (3 if paused else 6)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            torch.ones(3).mul(2)  # recorded again once the window stopped
        assert "aten::mul" in [e.name for e in prof.events()]
    assert cap.reports[0].ranges["work"].calls == 3


def _records_cpu_ops() -> bool:
    """Whether a profiler the program starts on this thread now sees its CPU operators."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(3).mul(2)
    return "aten::mul" in [e.name for e in prof.events()]


def _ambient_window_stopped_by_the_timer(monkeypatch, mem) -> None:
    """An ambient session's window whose deferred stop the timer ended (the program stopped
    stepping): torch's switch is per thread, so the timer thread cannot turn this thread's
    CPU ops back on."""
    monkeypatch.setattr(stops_mod, "DRAIN_PAUSES_CPU_OPS", True)
    monkeypatch.setattr(stops_mod, "DRAIN_MAX_S", 0.2)
    instrument.configure(
        exporters=[mem], activities=["cpu"], schedule=Schedule(warmup=1, active=3, repeat=1)
    )
    for _ in range(4):
        work()
    sess = state.ambient
    assert sess.status().stop_deferred
    # the timer clears the drain, then stops the profiler on its own thread (a while, under load)
    deadline = time.monotonic() + 30
    while (sess.status().stop_deferred or _torch.profiler_on()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not sess.status().stop_deferred and not _torch.profiler_on()


@pytest.mark.parametrize("then", ["step", "flush", "shutdown", "explicit session"])
def test_after_the_timer_stopped_a_drain_the_thread_records_cpu_ops_again(
    stand_in, monkeypatch, then
):
    events, done_after = stand_in
    done_after[0] = None
    mem = InMemoryExporter()
    _ambient_window_stopped_by_the_timer(monkeypatch, mem)
    assert not _records_cpu_ops()  # the documented gap: until this thread's next step or call
    if then == "step":
        work()
    elif then == "flush":
        instrument.flush()
    elif then == "shutdown":
        instrument.shutdown()
    else:  # its window must see this thread's ranges and operators
        with capture(schedule=Schedule(warmup=0, active=2, repeat=1), activities=["cpu"]) as cap:
            work()
            work()
        assert cap.reports[0].ranges["work"].calls == 2
        assert any(op.name == "aten::mm" for op in cap.reports[0].top_ops)
    assert _records_cpu_ops()
    instrument.flush()
    assert [r.steps for r in mem.reports] == [(1, 2, 3)]


def test_a_session_closed_from_another_thread_during_the_drain(stand_in, monkeypatch):
    """configure() on another thread closes the ambient session and stops its drain there: the
    stepping thread, still paused, records again from its first step in the next session."""
    events, done_after = stand_in
    done_after[0] = None
    monkeypatch.setattr(stops_mod, "DRAIN_PAUSES_CPU_OPS", True)
    first, second = InMemoryExporter(), InMemoryExporter()
    instrument.configure(
        exporters=[first], activities=["cpu"], schedule=Schedule(warmup=1, active=3, repeat=1)
    )
    for _ in range(4):
        work()
    assert state.ambient.status().stop_deferred
    other = threading.Thread(
        target=instrument.configure,
        kwargs=dict(
            exporters=[second], activities=["cpu"], schedule=Schedule(warmup=1, active=3, repeat=1)
        ),
    )
    other.start()
    other.join()
    assert [r.steps for r in first.reports] == [(1, 2, 3)] and not _torch.profiler_on()
    for _ in range(4):  # the new ambient session's window
        work()
    instrument.flush()
    assert [r.steps for r in second.reports] == [(1, 2, 3)]
    assert second.reports[0].ranges["work"].calls == 3
    assert any(op.name == "aten::mm" for op in second.reports[0].top_ops)


class _Stepper(threading.Thread):
    """A thread that runs ``work()`` steps when asked, and stays alive in between."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.asks: queue.Queue[int | None] = queue.Queue()
        self.done: queue.Queue[BaseException | None] = queue.Queue()
        self.start()

    def run(self) -> None:
        while (n := self.asks.get()) is not None:
            try:
                for _ in range(n):
                    work()
                self.done.put(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                self.done.put(exc)

    def steps(self, n: int) -> None:
        self.asks.put(n)
        exc = self.done.get(timeout=60)
        if exc is not None:
            raise exc

    def stop(self) -> None:
        self.asks.put(None)
        self.join()


@pytest.fixture
def a():
    """Thread A, a ``_Stepper``; it ends with the test."""
    stepper = _Stepper()
    yield stepper
    stepper.stop()


def test_steps_from_two_threads_are_never_left_paused(stand_in, monkeypatch, a):
    """Thread A ends a window (its CPU ops paused), this thread steps on and the drain ends
    here: A records again from its first call in the next window, and a session whose steps
    came from more than one thread pauses none again (no thread can turn another's back on)."""
    events, done_after = stand_in
    done_after[0] = 2
    monkeypatch.setattr(stops_mod, "DRAIN_PAUSES_CPU_OPS", True)
    with capture(
        schedule=Schedule(wait=2, warmup=1, active=3, repeat=2), activities=["cpu"]
    ) as cap:
        sess = cap.session
        a.steps(6)  # wait, wait, warm-up, 3 recorded: the window's end pauses A
        assert sess.status().stop_deferred and state.cpu_ops.paused == {a.ident}
        work()
        work()  # the drain ends here, on another thread: A stays paused
        assert not sess.status().stop_deferred and state.cpu_ops.paused == {a.ident}
        work()  # the second window's warm-up
        a.steps(3)  # its 3 recorded steps: A's first call resumes A
        assert sess.status().stop_deferred and sess.status().stop_paused_thread is None
        assert not state.cpu_ops.paused
        work()
        work()
    assert [r.steps for r in cap.reports] == [(3, 4, 5), (9, 10, 11)]
    assert [r.ranges["work"].calls for r in cap.reports] == [3, 3]
    assert all(any(op.name == "aten::mm" for op in r.top_ops) for r in cap.reports)
    assert _records_cpu_ops()


@profiled("helper")
def helper() -> torch.Tensor:
    return X + 1


@pytest.mark.parametrize("then", ["step", "decorated call", "flush"])
def test_after_shutdown_on_another_thread_the_paused_thread_records_again(
    stand_in, monkeypatch, then
):
    """shutdown() elsewhere stops the drain there; with no session left, decorated calls would
    go idle: they stay awake while a thread is paused, and the first one resumes it."""
    events, done_after = stand_in
    done_after[0] = None
    monkeypatch.setattr(stops_mod, "DRAIN_PAUSES_CPU_OPS", True)
    mem = InMemoryExporter()
    instrument.configure(
        exporters=[mem], activities=["cpu"], schedule=Schedule(warmup=1, active=3, repeat=1)
    )
    for _ in range(4):
        work()
    assert state.cpu_ops.paused == {threading.get_ident()}
    other = threading.Thread(target=instrument.shutdown)
    other.start()
    other.join()
    assert [r.steps for r in mem.reports] == [(1, 2, 3)] and not _torch.profiler_on()
    {"step": work, "decorated call": helper, "flush": instrument.flush}[then]()
    assert not state.cpu_ops.paused and _records_cpu_ops()
    assert process_status().calls_idle  # and calls are idle again once nobody is paused


def test_a_thread_paused_by_a_sessions_last_window_records_again(stand_in, monkeypatch, a):
    """A ends the schedule's last window; the drain ends on this thread and the session is
    finished, so decorated calls would go idle: A's next step still resumes it."""
    events, done_after = stand_in
    done_after[0] = 1
    monkeypatch.setattr(stops_mod, "DRAIN_PAUSES_CPU_OPS", True)
    with capture(schedule=Schedule(warmup=1, active=3, repeat=1), activities=["cpu"]) as cap:
        sess = cap.session
        a.steps(4)
        assert sess.status().stop_deferred and state.cpu_ops.paused == {a.ident}
        work()  # the drain ends here: the session is done
        assert not sess.status().stop_deferred and sess.finished
        a.steps(1)
        assert not state.cpu_ops.paused
        assert process_status().calls_idle
    assert [r.steps for r in cap.reports] == [(1, 2, 3)]


def test_an_explicit_session_closed_on_another_thread_than_its_steps(stand_in, monkeypatch, a):
    """The ``with`` block exits on this thread while A, which steps, is paused; the ambient
    session current again has finished: A's next step resumes it all the same."""
    events, done_after = stand_in
    done_after[0] = 1
    monkeypatch.setattr(stops_mod, "DRAIN_PAUSES_CPU_OPS", True)
    instrument.configure(
        exporters=[InMemoryExporter()],
        activities=["cpu"],
        schedule=Schedule(warmup=0, active=1, repeat=1),
    )
    for _ in range(4):
        work()
    assert state.ambient.finished and not state.cpu_ops.paused
    done_after[0] = None
    with capture(schedule=Schedule(warmup=1, active=3, repeat=1), activities=["cpu"]) as cap:
        a.steps(4)
        assert cap.session.status().stop_deferred and state.cpu_ops.paused == {a.ident}
    assert state.current is state.ambient
    a.steps(1)
    assert not state.cpu_ops.paused
    assert [r.steps for r in cap.reports] == [(1, 2, 3)]


def test_a_thread_that_ends_paused_no_longer_keeps_calls_awake(stand_in, monkeypatch, a):
    """Nothing can resume a thread that ended: it leaves the paused set by itself, and the
    next decorated call goes idle again."""
    events, done_after = stand_in
    done_after[0] = None
    monkeypatch.setattr(stops_mod, "DRAIN_PAUSES_CPU_OPS", True)
    instrument.configure(
        exporters=[InMemoryExporter()],
        activities=["cpu"],
        schedule=Schedule(warmup=1, active=3, repeat=1),
    )
    a.steps(4)  # A ends the window: paused
    assert state.cpu_ops.paused == {a.ident}
    instrument.shutdown()  # here: the drain stops here, A stays paused
    assert state.cpu_ops.paused == {a.ident} and not process_status().calls_idle
    a.stop()  # A ends without another decorated call
    assert not state.cpu_ops.paused
    helper()
    assert process_status().calls_idle


def test_a_refresh_that_read_before_configure_does_not_undo_it(monkeypatch):
    """A thread reads the state to set the idle flag, configure() lands on another thread before
    it writes the flag: the new session must still see decorated calls."""
    instrument.configure(
        exporters=[InMemoryExporter()],
        activities=["cpu"],
        schedule=Schedule(warmup=0, active=1, repeat=1),
    )
    for _ in range(3):
        work()
    assert state.current.finished and process_status().calls_idle
    real_write = state._write
    configured = threading.Event()

    def write_after_configure(*args, **kwargs):  # the flushing thread is preempted here
        if threading.current_thread().name == "late-refresh":
            configured.wait(10)
        real_write(*args, **kwargs)

    monkeypatch.setattr(state, "_write", write_after_configure)
    late = threading.Thread(target=instrument.flush, name="late-refresh")
    late.start()
    time.sleep(0.2)
    mem = InMemoryExporter()
    instrument.configure(
        exporters=[mem], activities=["cpu"], schedule=Schedule(warmup=0, active=1, repeat=2)
    )
    configured.set()
    late.join()
    for _ in range(4):
        work()
    instrument.flush()
    assert len(mem.reports) == 2


_FORK = """
import os, threading, time
import torch
import instrument
from instrument import Schedule, profiled; from instrument.runtime import _torch
from instrument.testing import InMemoryExporter
from instrument.runtime import state, stops as stops_mod
{stand_in}
stops_mod.DRAIN_MAX_S = 0.2

@profiled("work", step=True)
def work():
    return torch.ones(8) @ torch.ones(8)

def records_cpu_ops():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(3).mul(2)
    return "aten::mul" in [e.name for e in prof.events()]

instrument.configure(exporters=[InMemoryExporter()], activities=["cpu"],
                     schedule=Schedule(warmup=1, active=3, repeat=1))
for _ in range(4):
    work()
while state.ambient.status().stop_deferred:
    time.sleep(0.02)
pid = os.fork()  # this thread is still paused (the timer stopped the drain)
if pid == 0:
    os._exit(0 if records_cpu_ops() else 3)
_, status = os.waitpid(pid, 0)
print("parent", records_cpu_ops(), "child", os.waitstatus_to_exitcode(status))
"""


_early.add(
    __name__,
    "test_a_child_forked_while_the_thread_is_paused_records_cpu_ops",
    *("-W", "ignore::DeprecationWarning", "-c", _FORK.format(stand_in=_STAND_IN)),
    env=_proc.sdk_env(),
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")
def test_a_child_forked_while_the_thread_is_paused_records_cpu_ops(request):
    """A DataLoader worker forked during a drain inherits the thread's switch, off."""
    proc, _cwd = _early.result(request)  # _FORK with the stand-in event
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "parent False child 0"


_CTRL_C_IN_THE_POLL = """
import os, signal, threading, time
import torch
from instrument import Schedule, profiled, session
from instrument.runtime import _torch, stops
from instrument.testing import InMemoryExporter
stops.DRAIN_SPIN_S = 2.0  # the window's end polls long enough for the signal to land there
class Event:  # a device whose queue never empties: only the poll's deadline would end it
    def query(self):
        return False
    def synchronize(self):
        pass
_torch.ProfilerWindow.end_marker_event = lambda self: Event()

@profiled("work", step=True)
def work():
    return torch.ones(8) @ torch.ones(8)

mem = InMemoryExporter()
try:
    with session(schedule=Schedule(warmup=1, active=3), activities=["cpu"], exporters=[mem],
                 all_threads=True) as s:
        for i in range(4):
            if i == 3:  # Ctrl-C half a second into the poll at this step's end
                threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            work()
except KeyboardInterrupt:
    print("interrupted")
print("on", _torch.profiler_on(), "deferred", s.status().stop_deferred,
      "recording", s.status().window_recording)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    torch.ones(3).mul(2)  # the program's own profiler works after it
print("theirs", "aten::mul" in [e.name for e in prof.events()])
"""


def test_ctrl_c_in_the_window_ends_poll_leaves_no_profiler_on():
    """A real SIGINT landing while the window's end polls its event: it waits for the poll's
    end (the window's end runs in an ``atomic`` block, which defers signals), then the program
    gets its KeyboardInterrupt, no profiler stays on, no stop is left deferred, and the
    program's own torch.profiler works afterwards."""
    proc = _proc.run("-W", "ignore::DeprecationWarning", "-c", _CTRL_C_IN_THE_POLL, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "interrupted" in lines, proc.stdout
    assert "on False deferred False recording False" in lines, proc.stdout
    assert lines[-1] == "theirs True", proc.stdout
