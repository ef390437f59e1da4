"""From a stopped window to its ``WindowReport``: the report room.

Runs on the export pipeline's analysis worker. The window's events are read straight from
Kineto's results where this torch allows it (then analyzed on that worker), else its exported
trace is read, shaped and analyzed in the shared helper process (off the program's GIL; in this
process where the helper cannot). Also the one line a session without reports ends with, and
why a rank profiles nothing.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..analysis.analyze import Analysis, analyze, drop_warmup
from ..analysis.kineto_json import shape_file
from ..analysis.throughput import with_peaks
from ..base.files import current_umask
from ..base.report import Cost, OccurrenceBudget, WindowReason, WindowReport
from ..runtime import _torch, ledger, state
from ..runtime.config import Config
from ..runtime.sampling import Schedule
from . import analysis_process
from . import scratch as rawtraces
from .analysis_process import shape_and_analyze

__all__ = [
    "EndedWindow",
    "ReportBuilder",
    "occurrence_budget",
    "rank_skip_reason",
    "forget",
    "wants_gzip_trace",
    "pending",
    "remove_raw",
    "write_pending",
    "write_raw",
    "why_no_report",
]

EXPORT_DELAY_S = 0.3
"""After a deferred stop the export worker waits this long (from the stop) before torch's
``export_chrome_trace``, which holds the GIL for ~15-30 ms: right after the stop the device's
queue is short, and the training thread must refill it first."""

WRITE_BEFORE_NEXT_START = True
"""Write an ended window's trace (torch's ``export_chrome_trace``) before the next window's
profiler starts, on the starting thread if the export worker has not done it yet
(``write_pending``). On an H100 with torch 2.11, windows of tiny steps whose trace was written
after the next window had started lost every CUDA runtime and kernel event
(``bench/kineto_loss_sdk.py``); plain torch.profiler, which exports before it starts again,
kept them."""

_PENDING: list[EndedWindow] = []  # handed to the pipeline, trace not written yet
_PENDING_LOCK = threading.Lock()


def _forget_pending_in_child() -> None:
    """A forked child: the parent's ended windows are not its own (their profiler results are
    a copy, and the parent's export worker may have held a window's or the list's lock at the
    fork): a window the child starts writes none of them."""
    global _PENDING_LOCK
    _PENDING_LOCK = threading.Lock()
    _PENDING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pending_in_child)


@dataclass
class EndedWindow:
    """What the caller hands to the export worker when a window ends."""

    window: Any  # the stopped ProfilerWindow; None once its report is built
    index: int
    steps: tuple[int, ...]
    partial: bool
    start_ns: int
    end_ns: int
    names: frozenset[str]
    dist: dict[str, Any]
    stopped_at: float | None = None  # time.monotonic() of a deferred stop, else None
    reason: WindowReason | None = None  # why the window opened (the planner's decision)
    raw: str | None = None  # its trace file, once written (``write_raw``)
    cost: ledger.Entry | None = None  # what the caller measured of its cost
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


def pending(ended: EndedWindow) -> None:
    """``ended`` was handed to the pipeline: its trace is written before the next start."""
    if WRITE_BEFORE_NEXT_START:
        with _PENDING_LOCK:
            _PENDING.append(ended)


def forget(ended: EndedWindow) -> None:
    """``ended``'s trace is not wanted (the pipeline did not take it, or its report is
    built or lost)."""
    with _PENDING_LOCK:
        if ended in _PENDING:
            _PENDING.remove(ended)


def write_raw(ended: EndedWindow) -> str:
    """Write ``ended``'s trace to a raw trace file once (whichever thread comes first: the
    export worker, or one starting the next window) and return its path."""
    with ended.lock:
        if ended.raw is None:
            window = ended.window
            if window is None:
                raise RuntimeError(f"window {ended.index}'s profiler results are gone")
            raw = rawtraces.new_path(ended.index)
            try:
                window.export_chrome_trace(raw)  # needs the profiler's results: this process
            except BaseException:
                rawtraces.remove(raw)
                raise
            ended.raw = raw
    forget(ended)
    return ended.raw


def _let_the_queue_refill(ended: EndedWindow) -> None:
    """After a deferred stop, wait until ``EXPORT_DELAY_S`` after it before torch's export
    (unless a window start wrote the trace meanwhile: then at once)."""
    if ended.stopped_at is not None:
        delay = ended.stopped_at + EXPORT_DELAY_S - time.monotonic()
        if delay > 0 and ended.raw is None:
            time.sleep(delay)


def write_pending() -> None:
    """Before a window's profiler starts: write every ended window's trace the export worker
    has not written yet (``WRITE_BEFORE_NEXT_START``). A failure is left to the worker, which
    meets it again and warns; nothing is raised here."""
    while True:
        with _PENDING_LOCK:
            if not _PENDING:
                return
            ended = _PENDING[0]
        try:
            write_raw(ended)
        except Exception:  # noqa: BLE001 - the worker reports it with the window's report
            forget(ended)


def occurrence_budget(exporters: Sequence[Any]) -> OccurrenceBudget | None:
    """The widest of the exporters' ``occurrence_budget``s (None: no exporter wants per-call
    occurrences, and the analysis makes none)."""
    budgets = []
    for exporter in exporters:
        budget = getattr(exporter, "occurrence_budget", None)
        if isinstance(budget, OccurrenceBudget):
            budgets.append(budget)
    return OccurrenceBudget.widest(budgets)


def wants_gzip_trace(exporters: Sequence[Any]) -> bool:
    """An exporter wants the window's trace gzip-compressed (``Exporter.wants_gzip_trace``)."""
    return any(getattr(exporter, "wants_gzip_trace", False) is True for exporter in exporters)


class ReportBuilder:
    """Builds one session's window reports (``build``, on the export worker); with
    ``occurrences`` (a budget) they carry the windows' per-call occurrences, with
    ``gzip_trace`` the shaped trace gzip-compressed too, where the helper process shapes it
    (``WindowReport.raw_trace_gz_path``)."""

    def __init__(
        self,
        config: Config,
        activities: Sequence[str],
        warn_: Callable[[str], None],
        cancelled: Callable[[], bool],
        occurrences: OccurrenceBudget | None = None,
        gzip_trace: bool = False,
    ) -> None:
        self.config = config
        self.occurrences = occurrences
        self.gzip_trace = gzip_trace
        self.activities = tuple(activities)
        self._warn = warn_
        self._cancelled = cancelled  # the session ended past its deadline: nobody waits
        self.ledger = ledger.Ledger(config.overhead_budget)  # the windows' costs, the budget
        self._helper_cpu_s: float | None = None  # the helper's CPU for the window in build

    def build(self, ended: EndedWindow) -> WindowReport | None:
        """The window's report and its shaped trace file; None (with a warning) on failure."""
        try:
            return self._build(ended)
        except Exception as exc:  # noqa: BLE001
            self._warn(f"window {ended.index} could not be analyzed ({exc!r}); its report is lost")
            return None

    def _build(self, ended: EndedWindow) -> WindowReport | None:
        window, names = ended.window, ended.names
        device = _torch.device_name(self.activities)
        # the window's health: a process using CUDA whose window holds no device event at all
        # lost them (the shaped trace says so too: ``kineto_json.shape_trace``)
        dist = {**ended.dist, "device_in_use": device != "cpu"}
        if self._cancelled():
            ended.window = None  # (the pipeline's on_done forgets it: ``pending``)
            return None
        raw = gz = None
        try:
            _let_the_queue_refill(ended)
            events, raw, export_s = self._trace(ended, window)
            ended.window = None  # the profiler's results go when this report is built
            del window
            exported_at = time.thread_time()  # this worker's CPU for the analysis from here
            analysis: Analysis | None
            if events is not None:  # Kineto's times are epoch ns already
                analysis = analyze(
                    drop_warmup(events),
                    names,
                    occurrences=self.occurrences,
                    device_in_use=dist["device_in_use"],
                )
                del events
                shape_file(raw, names, dist)  # the trace exporters get (kineto_json.shape_trace)
            else:
                analysis, gz = self._from_trace(raw, names, dist)
        except BaseException:
            ended.window = None
            if raw is not None:
                rawtraces.remove(raw)  # no report will carry it: nobody else would remove it
            raise
        report = WindowReport(
            window=ended.index,
            steps=ended.steps,
            partial=ended.partial,
            start_ns=ended.start_ns,
            end_ns=ended.end_ns,
            rank=int(dist["rank"]),
            world_size=int(dist["world_size"]),
            host=_torch.host_name(),
            pid=os.getpid(),
            device=device,
            activities=tuple(self.activities),
            raw_trace_path=raw,
            raw_trace_gz_path=gz,
            reason=ended.reason,
            cost=self._cost(ended, raw, export_s, time.thread_time() - exported_at),
            **analysis.report_fields(),
        )
        self.ledger.building(report.cost, ended.index)
        return with_peaks(report, self.config.peak_tflops)

    def _from_trace(
        self, raw: str, names: frozenset[str], dist: dict[str, Any]
    ) -> tuple[Analysis, str | None]:
        """Reading, shaping and analyzing the trace: in the helper process, off this
        program's GIL, unless it is off or cannot. With ``gzip_trace`` the helper writes the
        shaped trace compressed as well: its path, or None where it did not."""
        gz = rawtraces.gz_path(raw) if self.gzip_trace else None
        analysis = self._in_helper(raw, names, dist, gz) if self.config.analysis_process else None
        if analysis is None:  # (here the trace exporter compresses the trace itself)
            return shape_and_analyze(raw, names, dist, self.occurrences), None
        if gz is not None and not os.path.isfile(gz):
            gz = None  # the helper could not write it (its disk is full)
        return analysis, gz

    def _trace(self, ended: EndedWindow, window: Any) -> tuple[Any, str, float]:
        """The window's events straight from Kineto where this torch allows it (None: the
        trace is read instead), its trace file, and this worker's CPU seconds for both."""
        began = time.thread_time()
        events = None if self.config.analysis_process else window.events()
        raw = write_raw(ended)
        return events, raw, time.thread_time() - began

    def _cost(self, ended: EndedWindow, raw: str, export_s: float, analysis_s: float) -> Cost:
        """The window's ledger: what the caller measured, this worker's CPU for the trace
        and its analysis, the helper's, the trace's bytes; then its share of the budget."""
        entry = ended.cost or ledger.Entry()
        helper_s, self._helper_cpu_s = self._helper_cpu_s, None  # (``_in_helper``'s, if run)
        try:
            size = os.path.getsize(raw)
        except OSError:
            size = 0
        last = self.ledger.last_export
        baseline = entry.baseline_step_ns
        cost = Cost(
            steps=len(ended.steps),
            steps_time_us=(ended.end_ns - ended.start_ns) / 1e3,
            baseline_step_us=baseline / 1e3 if baseline is not None else None,
            baseline_steps=entry.baseline_steps,
            start_stall_us=entry.start_stall_ns / 1e3,
            stop_stall_us=entry.stop_stall_ns / 1e3,
            export_cpu_s=export_s,
            analysis_cpu_s=analysis_s,
            helper_cpu_s=helper_s,
            bytes_written=size,
            exporters_window=last[0] if last else None,
            exporters_s=last[1] if last else 0.0,
            exporters_bytes=last[2] if last else 0,
            budget_pct=self.ledger.budget_pct,
            interval_s=ledger.INTERVAL_S,
            backed_off=entry.backed_off,
        )
        share = self.ledger.add(cost.total_us, entry.epoch)
        return dataclasses.replace(cost, share_pct=share)

    def _in_helper(
        self, raw: str, names: frozenset[str], dist: dict[str, Any], gz: str | None
    ) -> Any:
        """The window's trace work in the shared helper process (and, with ``gz``, the
        shaped trace compressed there); None (the caller does it here) when the helper cannot,
        with one warning the first time it fails."""
        if not analysis_process.SUPPORTED:
            return None
        helper = analysis_process.shared()
        if helper.failed is not None:
            return None
        cpu_before = ledger.helper_cpu_s(helper.pid)
        try:
            analysis, said = helper.analyze(
                raw,
                names,
                dist,
                occurrences=self.occurrences,
                gzip_to=gz,
                umask=current_umask() if gz else None,
            )
        except analysis_process.AnalysisProcessError as exc:
            if helper.failed is not None:
                if not state.helper_warned:
                    state.helper_warned = True
                    self._warn(f"{exc}; windows are analyzed in this process from now on")
            else:  # this window's trace only
                self._warn(str(exc) + "; analyzing it in this process instead")
            return None
        cpu_after = ledger.helper_cpu_s(helper.pid)
        if cpu_after is not None:  # (not running before: its start-up was this window's)
            self._helper_cpu_s = cpu_after - (cpu_before or 0.0)
        for message in said:
            self._warn(message)
        return analysis


def remove_raw(report: WindowReport) -> None:
    """The pipeline is done with a report's raw trace (its exporters are done: their time
    and the trace file they wrote go to the ledger, for the next report)."""
    try:
        ledger.exported(report)
    finally:
        rawtraces.remove(report.raw_trace_path)


def why_no_report(skip_reason: str | None, steps: int, schedule: Schedule, ambient: bool) -> str:
    """The one line a session that exported no report ends with."""
    if skip_reason:
        return f"no table: {skip_reason}."
    first_record = schedule.skip_first + schedule.wait + schedule.warmup
    needed = first_record + 1
    if steps >= needed:
        return f"no table: no window recorded a step in the {steps} step(s) that ended."
    if steps == 0:
        if not ambient:
            return (
                "no table: no step ended before the session ended (in a session a step "
                "ends at s.step() or when a step=True function returns: call s.step() "
                "at the end of each step)."
            )
        return (
            "no table: no step ended before the program stopped (a step ends when a "
            "step=True function returns or at instrument.step(); in a program with "
            "neither, when a root @profiled call returns)."
        )
    return (
        f"no table: {steps} step(s) ended, but the schedule ({schedule.to_env()}) "
        f"records from step {first_record}, so at least {needed} steps are needed; "
        "run more steps or set PROFILED_SCHEDULE."
    )


def rank_skip_reason(config: Config) -> str | None:
    """``PROFILED_RANKS``: why this rank opens no window (the session's one line at its end),
    or None where it profiles."""
    ranks = config.ranks
    if ranks.ranks is None:
        return None
    dist = _torch.distributed_info()
    if ranks.selects(dist["rank"]):
        return None
    return (
        f"rank {dist['rank']} (of {dist['world_size']}) is not among the ranks that profile "
        f"(PROFILED_RANKS={ranks}), so this process started no profiler"
    )
