"""Export off the hot path: an analysis worker and one lane per exporter, bounded, with deadlines.

When a window ends the caller only stops the profiler and hands the stopped window to this
pipeline (``ExportPipeline.submit``). A worker thread then builds the report (analysis, the
shaped trace file) and gives it to every exporter through that exporter's *lane*: its own
thread and bounded queue. So an exporter that raises, hangs or is slow loses only its own
reports; the others still get every one.

- Bounded: each lane holds at most ``QUEUE_SIZE`` reports, the analysis queue at most
  ``ANALYSIS_QUEUE_SIZE`` stopped windows (each holds a whole profile); when one is full the
  oldest item is dropped, counted (``dropped``) and one warning per queue says so.
- Trace writers first: exporters with ``writes_trace_file`` get the report before the others,
  so those can name the file; the worker waits for them at most ``TRACE_WAIT_S``, and once
  ``close(timeout)`` has begun no later than ``TRACE_SHARE_AT_CLOSE`` of its timeout: the rest
  is the others' time, and past it they export without the trace's path.
- Deadline: ``close(timeout)`` (session end, interpreter exit) waits for everything queued at
  most ``timeout`` seconds (``PROFILED_EXPORT_TIMEOUT_S``) and returns by then whatever the
  exporters do; past it the program goes on and one warning says what was not exported. The
  analysis stage gets at most ``ANALYSIS_SHARE_AT_CLOSE`` of it, so a hung analysis still
  leaves the lanes time for their last reports and ``shutdown()``.
- Threads: every thread the pipeline starts ends at ``close`` (joined within the deadline). One
  stuck in a hung exporter past the deadline is a daemon (it never holds up exit), its reports
  are counted as not exported, and it ends as soon as the exporter returns.
- Faults: a lane survives anything its exporter raises, ``BaseException`` included
  (``SystemExit``, ``KeyboardInterrupt``): lanes are torch-profiled's threads, so there it is
  the exporter's error, reported as a warning. ``export_report``, which runs on the caller's
  thread, lets those through: there they are the program's.
- The raw trace file of a report is removed when the last lane is done with it (or dropped it).

``export_report`` is the same fan-out done synchronously, for callers that have a report in
hand (tests, tools).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from exporters import ExporterWarning, ExportResult
from instrument.base.warn import warn

from ..base.report import WindowReport
from ..runtime.metrics import takes_metrics

__all__ = [
    "ANALYSIS_QUEUE_SIZE",
    "ANALYSIS_SHARE_AT_CLOSE",
    "QUEUE_SIZE",
    "TRACE_SHARE_AT_CLOSE",
    "TRACE_WAIT_S",
    "ExportPipeline",
    "describe",
    "export_report",
    "warn_not_exported",
]

QUEUE_SIZE = 8  # reports waiting per exporter (small: plain data, the trace file is on disk)
ANALYSIS_QUEUE_SIZE = 8  # stopped windows waiting for analysis (each holds a whole profile)
TRACE_WAIT_S = 10.0
# shares of close's timeout: the trace writers may hold the others up for the first half, the
# analysis stage (trace writers' wait included) may use three quarters, the rest is the lanes'
TRACE_SHARE_AT_CLOSE = 0.5
ANALYSIS_SHARE_AT_CLOSE = 0.75


def _name(exporter: Any) -> str:
    return type(exporter).__name__


def _labels(exporters: Sequence[Any]) -> list[str]:
    """One label per exporter instance: its class name, ``#2``, ``#3``... for a second and
    third of one class, so two exporters of one class never share a count or a thread name."""
    seen: dict[str, int] = {}
    out = []
    for exporter in exporters:
        name = _name(exporter)
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


def _trace_path(exporter: Any) -> str | None:
    """The file a trace writer's last export wrote (``Exporter.last_path``; an exporter that
    does not subclass ``Exporter`` may lack it)."""
    path = getattr(exporter, "last_path", None)
    return path if isinstance(path, str) and path else None


MAX_DESCRIBED = 500
"""Characters of an exception's ``repr()`` a warning keeps (an exporter's error may carry a
whole response body; the warnings registry keeps every distinct message)."""


def describe(exc: BaseException, catch: type[BaseException] = BaseException) -> str:
    """``repr(exc)`` for a warning, whatever the exception does: its ``__repr__`` (or its
    args') may raise, return no ``str`` or return megabytes, its class may hide attributes.
    Never raises what ``catch`` covers: on an SDK thread (``BaseException``) nothing, on the
    caller's thread (``Exception``) an interrupt that lands in the ``repr`` is the program's."""
    try:
        text = repr(exc)  # repr() itself refuses a __repr__ that returns no str
    except catch:
        return f"{_type_name(exc)} (its repr() raised)"
    if len(text) > MAX_DESCRIBED:
        text = f"{text[:MAX_DESCRIBED]}... ({len(text)} characters)"
    return text


def _type_name(exc: BaseException) -> str:
    try:
        name = type(exc).__qualname__
        if isinstance(name, str):
            return name[:MAX_DESCRIBED]
    except BaseException:  # noqa: BLE001 - a metaclass may do anything
        pass
    return "an exception"


def _raised(exc: BaseException, catch: type[BaseException] = BaseException) -> str:
    """How a warning names what an exporter raised; a ``BaseException`` that is no
    ``Exception`` says it went no further (it would otherwise look like the program's).
    ``issubclass`` on the type: ``isinstance`` would ask the object's ``__class__``."""
    if issubclass(type(exc), Exception):
        return describe(exc, catch)
    return (
        f"{describe(exc, catch)} (caught on torch-profiled's export thread: it stops that call "
        "only, not the program)"
    )


def _export_one(
    exporter: Any,
    report: WindowReport,
    catch: type[BaseException] = Exception,
    label: str | None = None,
) -> ExportResult | None:
    """``catch`` is ``BaseException`` on a lane (an SDK thread nothing may end) and
    ``Exception`` on the caller's thread (``KeyboardInterrupt`` there is the program's)."""
    try:
        return exporter.export(report)
    except catch as exc:  # telemetry never breaks the program
        warn(
            f"exporter {label or _name(exporter)} raised {_raised(exc, catch)} on window "
            f"{report.window}; its output for this window is lost, the other exporters "
            "still ran",
            ExporterWarning,
        )
        return None


def export_report(report: WindowReport, exporters: Sequence[Any]) -> WindowReport:
    """Give ``report`` to each exporter once, here and now (trace writers first); returns the
    report as the last exporter saw it (with ``trace_file`` set when one was written)."""
    ordered = sorted(exporters, key=lambda e: not getattr(e, "writes_trace_file", False))
    for exporter in ordered:
        result = _export_one(exporter, report)
        if result is ExportResult.SUCCESS and getattr(exporter, "writes_trace_file", False):
            path = _trace_path(exporter)
            if path and report.trace_file is None:
                report = dataclasses.replace(report, trace_file=path)
    return report


class _Job:
    """One queued unit of work for a lane; ``done`` is set when it ran or was dropped, then
    ``wake`` (if any) is notified, so one wait can watch a job and a deadline that moves."""

    __slots__ = ("done", "kind", "on_done", "payload", "result", "wake")

    def __init__(
        self,
        kind: str,
        payload: Any,
        on_done: Callable[[], None] | None = None,
        wake: threading.Condition | None = None,
    ):
        self.kind = kind  # "report" | "notice" | "shutdown" | "window" | "noop"
        self.payload = payload
        self.done = threading.Event()
        self.result: Any = None
        self.on_done = on_done
        self.wake = wake

    def finish(self, result: Any = None) -> None:
        self.result = result
        if self.on_done is not None:
            try:
                self.on_done()
            except Exception:  # noqa: BLE001
                pass
        self.done.set()
        if self.wake is not None:
            with self.wake:
                self.wake.notify_all()


class _Worker:
    """A daemon thread draining a bounded deque; full means the oldest job is dropped. It ends
    after a ``shutdown`` job, or once stopped (``stop_accepting``) and idle."""

    def __init__(
        self, name: str, handle: Callable[[_Job], Any], what: str, maxsize: int = QUEUE_SIZE
    ) -> None:
        self.name = name
        self.what = what  # how the warning names a dropped job: "window report for console"
        self.maxsize = maxsize
        self._handle = handle
        self._queue: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        self._busy: _Job | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.dropped = 0
        self._warned = False

    def put(self, job: _Job) -> None:
        dropped = None
        with self._cond:
            if self._stopped:  # closed past its deadline: already counted as not exported
                stopped = True
            else:
                stopped = False
                if job.kind in ("report", "window"):  # markers and notices never count
                    queued = [j for j in self._queue if j.kind in ("report", "window")]
                    if len(queued) >= self.maxsize:
                        dropped = queued[0]
                        self._queue.remove(dropped)
                self._queue.append(job)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                    self._thread.start()
                self._cond.notify_all()
        if stopped:
            job.finish(None)
        elif dropped is not None:
            self._drop(dropped)

    def _drop(self, job: _Job) -> None:
        job.finish(None)  # first: its cleanup must run whatever the warning does
        if job.kind in ("report", "window"):
            self.dropped += 1
            if not self._warned:
                self._warned = True
                warn(
                    f"torch-profiled: the {self.what} queue is full ({self.maxsize} "
                    "waiting): the oldest was dropped; exporting cannot keep up with the "
                    "windows (this warning is given once; see the session's dropped counts)",
                    ExporterWarning,
                )

    def _next(self) -> _Job | None:
        """The next job, or None when stopped and nothing is left (the thread ends)."""
        with self._cond:
            while not self._queue:
                if self._stopped:
                    return None
                self._cond.wait()
            job = self._queue.popleft()
            self._busy = job
            return job

    def _run(self) -> None:
        while (job := self._next()) is not None:
            result = None
            try:
                result = self._handle(job)
            except BaseException as exc:  # noqa: BLE001 - an SDK thread: nothing may end it
                try:
                    warn(
                        f"torch-profiled: the {self.name} thread caught {_raised(exc)} during "
                        f"a {job.kind} job; that job's output is lost, the thread goes on",
                        ExporterWarning,
                    )
                except BaseException:  # noqa: BLE001 - nor may its warning (flush waits on it)
                    pass
            finally:
                with self._cond:
                    self._busy = None
                    self._cond.notify_all()
                job.finish(result)
            if job.kind == "shutdown":
                return

    def is_current(self) -> bool:
        """True on this worker's own thread (an exporter calling flush/close from export)."""
        return self._thread is threading.current_thread()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + (self._busy is not None)

    def pending_reports(self) -> int:
        with self._cond:
            busy = self._busy is not None and self._busy.kind in ("report", "window")
            return sum(j.kind in ("report", "window") for j in self._queue) + busy

    def wait_idle(self, deadline: float | None) -> bool:
        """Wait until nothing is queued or running (never on its own thread: that would wait
        for itself); False if ``deadline`` (``time.monotonic()``) came first."""
        if self.is_current():
            return False
        with self._cond:
            while self._queue or self._busy is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def stop_accepting(self) -> list[_Job]:
        """No more jobs; return (and forget) the ones still queued. The thread ends once its
        running job (if any) returns."""
        with self._cond:
            self._stopped = True
            left = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
            return left

    def join(self, deadline: float) -> None:
        """Wait for the thread to end, at most until ``deadline``."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


class _Lane(_Worker):
    """One exporter instance's worker; ``label`` names it in counts and warnings."""

    def __init__(self, exporter: Any, label: str) -> None:
        super().__init__(f"torch-profiled-export-{label}", self._do, f"window report for {label}")
        self.exporter = exporter
        self.label = label
        self.writes_trace_file = bool(getattr(exporter, "writes_trace_file", False))
        self.stalled = False  # a trace writer that missed its wait
        self.takes_metrics = takes_metrics(exporter)

    def _do(self, job: _Job) -> Any:
        """Run one job; whatever the exporter raises ends here (see the module)."""
        exporter = self.exporter
        if job.kind == "report":
            result = _export_one(exporter, job.payload, BaseException, self.label)
            if result is ExportResult.SUCCESS and self.writes_trace_file:
                return _trace_path(exporter)
            return None
        if job.kind == "metrics":
            try:
                exporter.export_metrics(job.payload)
            except BaseException as exc:  # noqa: BLE001 - the exporter's error (see the module)
                warn(
                    f"exporter {self.label} raised {_raised(exc)} in export_metrics()",
                    ExporterWarning,
                )
            return None
        if job.kind == "notice":
            hook = getattr(exporter, "notice", None)
            if hook is not None:
                try:
                    hook(job.payload)
                except BaseException:  # noqa: BLE001 - a notice is only informational
                    pass
            return None
        if job.kind == "shutdown":
            try:
                exporter.shutdown()
            except BaseException as exc:  # noqa: BLE001
                warn(f"exporter {self.label} raised {_raised(exc)} in shutdown()", ExporterWarning)
        return None


class ExportPipeline:
    """The export path of one session (see the module docstring).

    ``build`` turns a submitted window into a ``WindowReport`` (or None) on the worker thread;
    ``cleanup(report)`` runs once every lane is done with that report.
    """

    def __init__(
        self,
        exporters: Sequence[Any],
        build: Callable[[Any], WindowReport | None],
        cleanup: Callable[[WindowReport], None],
    ) -> None:
        self.exporters = list(exporters)
        self._build = build
        self._cleanup = cleanup
        self._lanes = [_Lane(e, label) for e, label in zip(self.exporters, _labels(self.exporters))]
        self._analysis = _Worker(
            "torch-profiled-analysis", self._analyze, "window analysis", ANALYSIS_QUEUE_SIZE
        )
        self.exported = 0  # reports handed to the lanes
        self.refused = 0  # windows submitted past the closing deadline (not analysed)
        self._close_by = math.inf
        self._closing = False
        self._closed = False
        # trace writers' jobs notify it; close moves _trace_cutoff (time.monotonic()) and
        # notifies it too, so a wait for a trace writer ends as soon as either happens
        self._wake = threading.Condition()
        self._trace_cutoff = math.inf

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def dropped(self) -> dict[str, int]:
        """Reports dropped because a queue was full: ``{"analysis": n, "<Exporter>": n}``, one
        key per exporter instance (``<Exporter>#2`` for a second one of a class)."""
        out = {"analysis": self._analysis.dropped}
        for lane in self._lanes:
            out[lane.label] = lane.dropped
        return out

    def submit(self, window: Any, on_done: Callable[[], None] | None = None) -> bool:
        """Hand over a stopped window (the caller's whole cost of a window end). False (not
        taken) once the closing deadline (``close_by``) has passed: its analysis would only
        hold the interpreter's lock (reading a big window's events) past the deadline, for a
        report nobody waits for; it is counted as not exported. ``on_done`` runs once the
        window is analysed or dropped."""
        if time.monotonic() >= self._close_by:
            self.refused += 1
            return False
        self._analysis.put(_Job("window", window, on_done))
        return True

    def close_by(self, deadline: float) -> None:
        """The session is closing, within ``deadline`` (``time.monotonic()``): a window
        stopped past it is not analysed (``submit``)."""
        self._close_by = min(self._close_by, deadline)

    def notice(self, message: str) -> None:
        for lane in self._lanes:
            lane.put(_Job("notice", message))

    def submit_metrics(self, report: Any) -> None:
        """Hand a ``MetricsReport`` to every exporter that takes metrics (``export_metrics``)."""
        for lane in self._lanes:
            if lane.takes_metrics:
                lane.put(_Job("metrics", report))

    def _analyze(self, job: _Job) -> None:
        report = self._build(job.payload)
        job.payload = None  # free the profiler's results as soon as they are analyzed
        if report is None:
            return
        if self._closed or not self._lanes:  # closed past its deadline: nobody waits
            self._cleanup(report)
            return
        remaining = [len(self._lanes)]
        lock = threading.Lock()
        final = [report]

        def lane_done() -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                self._cleanup(final[0])

        writers = [lane for lane in self._lanes if lane.writes_trace_file]
        others = [lane for lane in self._lanes if not lane.writes_trace_file]
        jobs = [_Job("report", report, lane_done, self._wake) for _ in writers]
        for lane, wjob in zip(writers, jobs):
            lane.put(wjob)
        until = time.monotonic() + TRACE_WAIT_S
        for lane, wjob in zip(writers, jobs):
            if lane.stalled and lane.pending() > 1:
                continue  # still stuck on an earlier report: do not hold the others up again
            if not self._wait_for_writer(wjob, until):
                lane.stalled = True
                continue
            lane.stalled = False
            if wjob.result and final[0].trace_file is None:
                final[0] = dataclasses.replace(final[0], trace_file=wjob.result)
        for lane in others:
            lane.put(_Job("report", final[0], lane_done))
        self.exported += 1

    def _wait_for_writer(self, job: _Job, until: float) -> bool:
        """Wait for a trace writer's job until ``until`` or the close cutoff, whichever comes
        first (close may move the cutoff while this waits); False if it did not finish."""
        with self._wake:
            while not job.done.is_set():
                left = min(until, self._trace_cutoff) - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
            return True

    def _cut_trace_wait(self, cutoff: float) -> None:
        """From now on no wait for a trace writer lasts past ``cutoff``."""
        with self._wake:
            self._trace_cutoff = min(self._trace_cutoff, cutoff)
            self._wake.notify_all()

    def flush(self, timeout: float | None) -> bool:
        """Wait until everything submitted so far has been exported; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # the analysis worker first: once it is idle, every report is in the lanes
        if not self._analysis.is_current() and not self._analysis.wait_idle(deadline):
            return False
        waits = []
        for lane in self._lanes:
            if lane.is_current():  # called from this exporter's own export(): not itself
                continue
            job = _Job("noop", None)
            lane.put(job)
            waits.append(job)
        for job in waits:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not job.done.wait(left):
                return False
        return True

    def close(self, timeout: float, no_report_notice: str | None = None) -> dict[str, int]:
        """Export what is queued, then shut the exporters down; returns within ``timeout``
        seconds whatever they do. ``no_report_notice`` goes to the exporters if no report was
        made. Returns what was not exported per queue (empty when everything was)."""
        if self._closing:
            return {}
        self._closing = True
        start = time.monotonic()
        deadline = start + timeout
        self._cut_trace_wait(start + TRACE_SHARE_AT_CLOSE * timeout)
        # every report reaches the lanes before their shutdown, unless the analysis hangs
        idle = self._analysis.wait_idle(start + ANALYSIS_SHARE_AT_CLOSE * timeout)
        if no_report_notice and self.exported == 0 and idle:
            self.notice(no_report_notice)
        shutdowns = []
        for lane in self._lanes:  # queued behind each lane's reports: healthy lanes end soon
            job = _Job("shutdown", None)
            lane.put(job)
            shutdowns.append((lane, job))
        for lane, job in shutdowns:
            if not lane.is_current():
                job.done.wait(max(0.0, deadline - time.monotonic()))
        self._closed = True  # past the deadline: what is still in flight is given up
        lost = self._give_up()
        if self.refused:
            lost["analysis"] = lost.get("analysis", 0) + self.refused
        for worker in (self._analysis, *self._lanes):  # healthy ones are ending: wait for it
            worker.join(deadline)
        return lost

    def _give_up(self) -> dict[str, int]:
        """Stop every worker; what they still hold or hold up is counted, per queue."""
        lost: dict[str, int] = {}
        for name, worker in (
            ("analysis", self._analysis),
            *((lane.label, lane) for lane in self._lanes),
        ):
            count = worker.pending_reports()
            for job in worker.stop_accepting():
                job.finish(None)
            if count:
                lost[name] = lost.get(name, 0) + count
        return lost


def warn_not_exported(lost: dict[str, int], timeout_s: float) -> None:
    """The one warning for reports ``ExportPipeline.close`` returned as not exported."""
    what = ", ".join(f"{name}: {n}" for name, n in lost.items())
    warn(
        f"torch-profiled: window reports not exported within "
        f"PROFILED_EXPORT_TIMEOUT_S={timeout_s:g}s were dropped ({what}); the program goes on",
        ExporterWarning,
    )
