"""What each window cost the program (its report's ``Cost``), and the budget that backs off.

A window's cost is measured where it happens: the caller's stall in the profiler's start
(``window.Windows._start``) and stop (``stops.Stops.stop``), the export worker's thread CPU for
the trace and its analysis (``export.builder.ReportBuilder``), the helper process's CPU, the trace's
bytes, and its steps' wall time against the median of the window-free steps since the previous
window (the metrics' step histogram, read at each window's open and end: nothing is added to
a decorated call; with none since, the last such median).

``PROFILED_OVERHEAD_BUDGET`` (a percentage) is compared with the windows' summed cost over the
last ``INTERVAL_S`` of wall time. When a window opens and the cost measured since the last
back-off is over it too (the windows opened since, over the time since: the rolling share
still holds the dearer windows from before), the budget backs off one notch: first the detail
(stacks, shapes, memory) where any is on, then the frequency (halved:
``planner.WindowPlanner.halve_frequency``), at most once per window measured after the
previous notch, so it halves until the cost is under it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..base.report import RangeHistogram
from . import metrics, state

__all__ = ["INTERVAL_S", "Entry", "Ledger", "exported", "helper_cpu_s", "step_counts"]

INTERVAL_S = 60.0
"""The rolling interval of ``PROFILED_OVERHEAD_BUDGET``: the windows' cost over the last this
many seconds, over this many seconds (a program younger than that is judged over the whole
interval: a short run's one start-up window does not back off what follows)."""

_CLOCK_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


@dataclass
class Entry:
    """One window's figures as the caller's thread measures them (filled as it goes, read by
    the export worker once the window is handed over)."""

    epoch: int = 0  # the ledger's back-offs when the window opened
    start_stall_ns: int = 0
    stop_stall_ns: int = 0
    baseline_step_ns: float | None = None
    baseline_steps: int = 0
    backed_off: str = ""


def step_counts() -> list[int] | None:
    """The step histogram's bucket counts now (metrics on: ``step=True`` calls), else None.
    Folds the steps pending first (one lock, a few hundred integers copied)."""
    if not state.metrics_on:
        return None
    recorder = metrics.recorder
    if recorder.pending.get(metrics.STEP):
        recorder.fold(metrics.STEP)
    with recorder.lock:
        shard = recorder.folded.get(metrics.STEP)
        return (
            metrics.dense(shard)[: metrics.BUCKETS] if shard is not None else [0] * metrics.BUCKETS
        )


def median_ns(before: list[int] | None, after: list[int] | None) -> tuple[float | None, int]:
    """The median of the steps counted between two ``step_counts`` (within a bucket's width,
    3.1%) and how many there were; (None, 0) with none."""
    if after is None:
        return None, 0
    counts = [a - b for a, b in zip(after, before)] if before is not None else after
    n = sum(counts)
    if n <= 0 or any(c < 0 for c in counts):  # (the recorder was reset meanwhile)
        return None, 0
    bounds = metrics.BOUNDS_NS
    hist = RangeHistogram("step", n, 0, 0, bounds[-1], tuple(counts), bounds)
    return hist.quantile(0.5), n


def helper_cpu_s(pid: int | None) -> float | None:
    """A process's CPU time so far (user + system, ``/proc``), None where unreadable."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _CLOCK_TICK_S
    except (OSError, IndexError, ValueError):
        return None


class Ledger:
    """One session's windows' costs over the rolling interval, and its budget's back-offs."""

    def __init__(self, budget_pct: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_pct = budget_pct
        self.clock = clock
        self.epoch = 0  # back-offs so far
        self.detail_off = False  # stacks, shapes and memory no longer recorded
        self.last_export: tuple[int, float, int] | None = None  # window, seconds, bytes
        self._costs: deque[tuple[float, float]] = deque()  # (clock(), cost µs)
        self._fresh = False  # a window opened since the last back-off has been measured
        self._epoch_cost = 0.0  # µs: the cost of those windows
        self._epoch_since = clock()  # the last back-off (or the start)
        self._end_counts: list[int] | None = None  # the step histogram at the last window end
        self._baseline: tuple[float | None, int] = (None, 0)  # the last (median, steps)
        self._lock = threading.Lock()  # add (export worker) / decide (the stepping thread)

    # ------------------------------------------------------------ the caller's side

    def opened(self, detail_on: bool, halve: Callable[[], str]) -> Entry:
        """A window opens: its entry, with the window-free steps' baseline and what the
        budget backs off now (``halve`` halves the frequency and says how)."""
        median, n = median_ns(self._end_counts, step_counts())
        if median is None:  # no window-free step since the last window: the last baseline
            median, n = self._baseline
        self._baseline = (median, n)
        entry = Entry(baseline_step_ns=median, baseline_steps=n)
        entry.backed_off = self._decide(detail_on, halve)
        entry.epoch = self.epoch
        return entry

    def ended(self) -> None:
        """A window's steps ended: window-free steps count from here."""
        self._end_counts = step_counts()

    def _decide(self, detail_on: bool, halve: Callable[[], str]) -> str:
        budget = self.budget_pct
        with self._lock:
            if not budget or not self._fresh:
                return ""
            now = self.clock()
            share = self._share(now)
            # since the last back-off (its windows' cost over the time since): the rolling
            # share still holds the costlier windows before it, and must not back off twice
            # for them
            rate = self._epoch_cost / max((now - self._epoch_since) * 1e6, 1.0) * 100.0
            if share <= budget or rate <= budget:
                return ""
            self._fresh = False
            self.epoch += 1
            self._epoch_cost, self._epoch_since = 0.0, now
        if detail_on and not self.detail_off:
            self.detail_off = True
            what = "stacks, shapes and memory are no longer recorded"
        else:
            what = halve()
        return (
            f"{what}: the windows cost {share:.2g}% of wall time over the last {INTERVAL_S:g} s,"
            f" over PROFILED_OVERHEAD_BUDGET={budget:g}%"
        )

    # ------------------------------------------------------------ the export worker's side

    def add(self, cost_us: float, epoch: int) -> float:
        """A window's measured cost (opened at back-off ``epoch``); the share of wall time
        (%) the windows cost over the interval, this one counted."""
        with self._lock:
            now = self.clock()
            self._costs.append((now, cost_us))
            if epoch == self.epoch:
                self._fresh = True
                self._epoch_cost += cost_us
            return self._share(now)

    def _share(self, now: float) -> float:
        costs = self._costs
        while costs and costs[0][0] < now - INTERVAL_S:
            costs.popleft()
        return sum(c for _, c in costs) / (INTERVAL_S * 1e6) * 100.0

    def building(self, cost: Any, index: int) -> None:
        """``cost``'s report goes to the exporters now (``exported`` when they are done)."""
        with _OPEN_LOCK:
            _OPEN[id(cost)] = (self, index, time.monotonic())


_OPEN: dict[int, tuple[Ledger, int, float]] = {}  # id(report.cost): reports being exported
_OPEN_LOCK = threading.Lock()


def exported(report: Any) -> None:
    """Every exporter is done with ``report``: its exporters' wall time and the trace file one
    wrote go to its session's ledger (the next report carries them)."""
    cost = getattr(report, "cost", None)
    if cost is None:
        return
    with _OPEN_LOCK:
        found = _OPEN.pop(id(cost), None)
    if found is None:
        return
    ledger, index, since = found
    size = 0
    if report.trace_file:
        try:
            size = os.path.getsize(report.trace_file)
        except OSError:
            size = 0
    ledger.last_export = (index, time.monotonic() - since, size)
