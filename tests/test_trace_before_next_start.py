"""A window's trace is written before the next window's profiler starts.

On an H100 with torch 2.11, windows of tiny steps whose trace torch wrote
(``export_chrome_trace``) after the next window's profiler had started lost every CUDA runtime
and kernel event (``bench/kineto_loss_sdk.py``); plain torch.profiler, which exports before it
starts again, kept them. So when a window starts while an ended window's trace is still
unwritten (the export worker waits ``EXPORT_DELAY_S`` after a deferred stop, or is busy), the
starting thread writes it first (``reporting.write_pending``). Real torch.profiler windows of
a real session here; the export worker is held back so that the race is certain.
"""

from __future__ import annotations

import time

import torch

from instrument import Schedule, profiled, session
from instrument.export import builder as reporting
from instrument.runtime import _torch
from instrument.testing import InMemoryExporter

X = torch.randn(16, 16)


@profiled("tiny", step=True)
def tiny() -> torch.Tensor:
    return X @ X


def _order(monkeypatch) -> tuple[list[tuple[str, int]], list]:
    """Run 4 back-to-back windows of tiny steps with a slow export worker; the order in
    which windows' profilers started and their traces were written."""
    seen: list[tuple[str, int]] = []
    start, export = _torch.ProfilerWindow.start, _torch.ProfilerWindow.export_chrome_trace

    def started(self):
        seen.append(("start", id(self)))
        return start(self)

    def exported(self, path):
        seen.append(("write", id(self)))
        return export(self, path)

    def slow_worker(ended):  # the worker waits as after a deferred stop, every time
        if ended.raw is None:
            time.sleep(0.3)

    monkeypatch.setattr(_torch.ProfilerWindow, "start", started)
    monkeypatch.setattr(_torch.ProfilerWindow, "export_chrome_trace", exported)
    monkeypatch.setattr(reporting, "_let_the_queue_refill", slow_worker)
    memory = InMemoryExporter()
    with session(schedule=Schedule(wait=1, warmup=0, active=2, repeat=4), exporters=[memory]):
        for _ in range(12):
            tiny()
    return seen, memory.reports


def _late_writes(seen: list[tuple[str, int]]) -> list[int]:
    """Windows whose trace was written after a later window's profiler started."""
    late = []
    for i, (what, _) in enumerate(seen):
        if what == "start":
            earlier = {w for kind, w in seen[:i] if kind == "start"}
            written = {w for kind, w in seen[:i] if kind == "write"}
            late.extend(sorted(earlier - written))
    return late


def test_the_last_windows_trace_is_written_before_the_next_start(monkeypatch):
    seen, reports = _order(monkeypatch)
    assert [k for k, _ in seen].count("start") == 4, seen
    assert [k for k, _ in seen].count("write") == 4, seen  # once each, not twice
    assert _late_writes(seen) == [], seen
    assert [r.steps for r in reports] == [(1, 2), (4, 5), (7, 8), (10, 11)]
    assert all(r.ranges["tiny"].calls == 2 for r in reports)
    assert reporting._PENDING == []  # nothing held once the reports are built


def test_without_it_the_race_is_real(monkeypatch):
    """The check above can fail: with the switch off the slow worker writes late."""
    monkeypatch.setattr(reporting, "WRITE_BEFORE_NEXT_START", False)
    seen, reports = _order(monkeypatch)
    assert _late_writes(seen), seen
    assert len(reports) == 4


def test_a_write_that_fails_at_the_start_is_left_to_the_worker(monkeypatch):
    """A failing export never reaches the starting thread (the user's step): the window is
    left to the export worker, which writes it (or reports its loss), and windows go on."""
    calls = []
    export = _torch.ProfilerWindow.export_chrome_trace

    def broken_once(self, path):
        calls.append(path)
        if len(calls) == 1:  # the first window's, written at the second window's start
            raise OSError("disk full")
        return export(self, path)

    monkeypatch.setattr(_torch.ProfilerWindow, "export_chrome_trace", broken_once)
    monkeypatch.setattr(
        reporting, "_let_the_queue_refill", lambda ended: ended.raw is None and time.sleep(0.3)
    )
    memory = InMemoryExporter()
    with session(schedule=Schedule(wait=1, warmup=0, active=2, repeat=3), exporters=[memory]):
        for _ in range(9):
            tiny()
    assert len(calls) == 4, calls  # the failed one at the start, then each window's once
    assert [r.steps for r in memory.reports] == [(1, 2), (4, 5), (7, 8)]


FORK_WITH_A_PENDING_WINDOW = r"""
import os, threading
from instrument.export import builder as reporting

class Ended:  # an ended window whose trace the export worker is writing (its lock held)
    def __init__(self):
        self.lock, self.raw, self.window, self.index = threading.Lock(), None, object(), 0

ended = Ended()
reporting._PENDING.append(ended)
with ended.lock, reporting._PENDING_LOCK:  # held by the parent's worker at the fork
    pid = os.fork()
    if pid == 0:
        reporting.write_pending()  # the child's next window start: must not wait, nor write
        os._exit(0 if not reporting._PENDING else 3)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_forked_child_writes_none_of_the_parents_pending_traces(tmp_path):
    """A child forked while the export worker held an ended window's lock (and the list's)
    starts its own windows at once: the parent's windows are forgotten there, not waited for."""
    from tests import _proc

    done = _proc.run("-c", FORK_WITH_A_PENDING_WINDOW, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0"], (done.stdout, done.stderr[-2000:])
