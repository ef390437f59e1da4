"""``HtmlExporter``: one self-contained HTML page per window, beside its trace file.

The page is the one ``torch-profiled report`` writes for a trace (``exporters.html_page``):
header and verdict, ranges with CPU vs device bars, verdict badges and MFU, top operators and
kernels, and a zoomable timeline of the window's ranges, operators and kernels per thread and
stream. It loads nothing (inline script and style, no request allowed).

The timeline is made by the session's analysis where it reads the window's trace (the analysis
helper process, off the program's GIL: this exporter asks for it with ``occurrence_budget``'s
``timeline_events``) and comes in the report (``report.timeline``, JSON ready for the page):
this exporter parses no trace and only joins text on its lane, so a 300k-event window does not
stall the program's steps, and the page of a window ended at exit needs no more time than the
analysis every exporter waits for. A report without a timeline (analysed from torch's own
events with ``PROFILED_ANALYSIS_PROCESS=0``, whose work all runs in the program anyway; one
whose timeline could not be made; one built by hand) gets it drawn from its trace file here,
on this lane (a trace file that cannot be read, gone or past ``max_mb``, costs the timeline,
never the page).

The page is ``<trace name>.html`` beside the window's trace file when the trace exporter wrote
one (``host_pid_rank0.1765...html`` for ``host_pid_rank0.1765...pt.trace.json.gz``), else in
``dir``, named ``{host}_{pid}_rank{rank}.{time_ns}.html``; without either timeline the page has
the ranges and bars only and a line saying that the timeline needs the trace exporter.

The directory stays bounded: a page whose trace file is gone (the trace exporter keeps only
its newest ``keep``) is one of the pages "without trace", of which only the newest ``keep`` of
this worker are kept (``keep=0`` keeps all). Only regular files whose whole name is this
exporter's pattern are ever removed.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import threading
import time
from typing import TYPE_CHECKING, Any, BinaryIO

from instrument.base.files import write_atomic
from instrument.base.warn import warn

from ._base import Exporter, ExporterWarning, ExportResult
from .html_page import PageWindow, build_page
from .html_timeline import DEFAULT_MAX_EVENTS, timeline_from_trace

if TYPE_CHECKING:
    from instrument.base.report import OccurrenceBudget, WindowReport

__all__ = ["HtmlExporter", "page_path"]

MIB = 1 << 20
_TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")
# a page of this exporter: {host}_{pid}_rank{rank}.{time_ns}.html (always ``fullmatch``)
_OURS = re.compile(r"(?P<worker>.+_\d+_rank\d+)\.(?P<stamp>\d+)\.html")
NO_TRACE = (
    "No timeline: it is drawn from the window's trace file, and this window has none. Add "
    "the trace exporter (PROFILED_EXPORTERS=trace,html) to get one."
)


def _write(f: BinaryIO, data: bytes) -> None:
    f.write(data)


def page_path(trace_file: str) -> str:
    """The page beside ``trace_file``: its name less the trace suffix, plus ``.html``."""
    for suffix in _TRACE_SUFFIXES:
        if trace_file.endswith(suffix):
            return trace_file[: -len(suffix)] + ".html"
    return trace_file + ".html"


def _worker(report: WindowReport) -> str:
    return f"{report.host}_{report.pid}_rank{report.rank}"


def _load(path: str, max_bytes: int) -> dict[str, Any]:
    """A trace's JSON (``.json`` or ``.json.gz``), at most ``max_bytes`` of it, else
    ``ValueError``."""
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"more than {max_bytes // MIB} MiB of JSON (max_mb)")
    trace = json.loads(data)
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict):
        raise ValueError("not a trace (JSON object with traceEvents)")
    return trace


def _budget(max_events: int) -> OccurrenceBudget:
    from instrument.base.report import OccurrenceBudget

    return OccurrenceBudget(0, timeline_events=max_events)


class HtmlExporter(Exporter):
    """Writes each window's HTML page (see the module docstring). ``last_file`` is the page
    the last successful ``export`` wrote (None after a failure)."""

    def __init__(
        self,
        dir: str | os.PathLike[str] = "./profiled_traces",
        keep: int = 20,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_mb: float = 1024,
    ) -> None:
        for name, value in (("keep", keep), ("max_events", max_events)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) or not max_mb > 0:
            raise ValueError(f"max_mb must be a number of MiB > 0, got {max_mb!r}")
        self.dir = os.fspath(dir)
        if not self.dir:
            raise ValueError("dir must not be empty")
        self.keep = keep
        self.max_events = max_events
        # the analysis makes each window's timeline (no per-call occurrences: max_spans 0)
        self.occurrence_budget = _budget(max_events)
        self.max_bytes = int(max_mb * MIB)
        self.last_file: str | None = None
        self._lock = threading.Lock()
        self._warned: set[tuple[object, ...]] = set()

    def export(self, report: WindowReport) -> ExportResult:
        window = self._window(report)
        if report.trace_file:
            path = page_path(os.path.abspath(report.trace_file))
        else:
            directory = os.path.abspath(self.dir)
            path = os.path.join(directory, f"{_worker(report)}.{time.time_ns()}.html")
        page = build_page([window], title=f"torch-profiled | window {report.window}")
        data = page.encode("utf-8", "backslashreplace")  # a lone surrogate in a name
        with self._lock:
            self.last_file = None
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                write_atomic(path, lambda f: _write(f, data))
            except OSError as exc:
                self._warn_once(
                    ("write", type(exc), exc.errno, os.path.dirname(path)),
                    f"the HTML page of window {report.window} was not written to {path!r}: "
                    f"{exc.strerror or exc}; later failures like it are not warned about "
                    "until a page is written",
                )
                return ExportResult.FAILURE
            self._warned.clear()
            self.last_file = path
            self._tidy(os.path.dirname(path), _worker(report), path)
        return ExportResult.SUCCESS

    def _window(self, report: WindowReport) -> PageWindow:
        """The report with its timeline, or with a line saying why it has none."""
        if report.timeline is not None:
            return PageWindow(report, report.timeline)
        if not report.trace_file:
            return PageWindow(report, None, NO_TRACE)
        try:
            trace = _load(report.trace_file, self.max_bytes)
            timeline = timeline_from_trace(
                trace, range_names=report.ranges, max_events=self.max_events
            )
        except (OSError, EOFError, ValueError, UnicodeDecodeError) as exc:
            return PageWindow(
                report,
                None,
                f"No timeline: the trace file {report.trace_file} could not be read "
                f"({type(exc).__name__}: {exc}).",
            )
        return PageWindow(report, timeline)

    def _tidy(self, directory: str, worker: str, newest: str) -> None:
        """Keep the newest ``keep`` of this worker's pages whose trace file is gone."""
        if not self.keep:
            return
        alone: list[tuple[int, str]] = []
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    m = _OURS.fullmatch(entry.name)
                    if m is None or m.group("worker") != worker:
                        continue
                    stem = os.path.join(directory, entry.name[: -len(".html")])
                    if any(os.path.exists(stem + s) for s in _TRACE_SUFFIXES[:2]):
                        continue
                    try:
                        if not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
                            continue
                    except OSError:
                        continue
                    alone.append((int(m.group("stamp")), entry.name))
        except OSError:
            return  # cannot be listed now: the next window tidies
        for _, name in sorted(alone)[: max(len(alone) - self.keep, 0)]:
            if os.path.join(directory, name) != newest:
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass

    def _warn_once(self, key: tuple[object, ...], message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message, ExporterWarning)
