"""The ``Exporter`` interface: what an exporter is given and may define.

Its own module so that the built-in exporters and ``exporters/__init__`` (which re-exports it)
do not import each other.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from instrument.base.report import MetricsReport, OccurrenceBudget, WindowReport

__all__ = ["ExportResult", "Exporter", "ExporterWarning"]


class ExportResult(enum.Enum):
    SUCCESS = 0
    FAILURE = 1


class ExporterWarning(UserWarning):
    """An exporter could not be found, built, or failed to export a report."""


class Exporter(abc.ABC):
    """Receives each finished window's report, once.

    ``export`` runs off the program's hot path after a window ends; it should return
    ``ExportResult.FAILURE`` rather than raise, but an exception is caught, reported as a
    warning, and never reaches the program. ``shutdown`` is called once when the session ends.
    """

    #: exporters that write the window's trace file run first, so that the others can name it
    #: (``last_path``)
    writes_trace_file: bool = False

    #: The file the last successful ``export`` of a trace writer (``writes_trace_file``)
    #: wrote; the other exporters' reports carry it as ``trace_file``. None: no file (an
    #: instance attribute or a property in a subclass overrides it).
    last_path: str | None = None

    #: True: this exporter wants each report to carry the window's shaped trace
    #: gzip-compressed too (``report.raw_trace_gz_path``), written by the analysis helper
    #: process, off the program's GIL and CPU (the trace exporter with ``gzip=True`` links it
    #: into place). Where the helper does not run the field is None.
    wants_gzip_trace: bool = False

    #: The per-call occurrences this exporter needs in each report (``report.occurrences``),
    #: as a span budget; None (the default): none. The session's analysis makes them once per
    #: window, off the program's GIL, fitted to the widest budget its exporters ask for.
    occurrence_budget: OccurrenceBudget | None = None

    #: Optional hook ``window_started(window: int) -> None``. When an exporter defines it, the
    #: session calls it once per window at the first ``@profiled`` call (or ``with profiled``
    #: entry) that begins while the window records: on that call's thread and in its
    #: ``contextvars`` context, so the exporter can capture what is current there (the
    #: OpenTelemetry span of the request being profiled). ``window`` is the ``report.window`` the
    #: window's report will carry. It runs on the program's hot path: keep it to a dictionary
    #: store. Not called for a window in which no decorated call begins.
    window_started: Callable[[int], None] | None = None

    #: Optional hook ``export_metrics(report: MetricsReport) -> None``. When an exporter
    #: defines it, metrics are on by default (``PROFILED_METRICS=auto``) and it gets the
    #: process's per-range histograms every ``PROFILED_METRICS_INTERVAL_S`` and at exit, on its
    #: own lane like reports.
    export_metrics: Callable[[MetricsReport], None] | None = None

    #: False: this exporter defines ``export_metrics`` but takes no metrics now (the otel
    #: exporter with a meter provider of the application's); they are not turned on for it.
    takes_metrics: bool = True

    #: False: this exporter does nothing with window reports (``prometheus``); a session whose
    #: exporters are all such opens no profiler window (only the metrics count).
    takes_windows: bool = True

    @abc.abstractmethod
    def export(self, report: WindowReport) -> ExportResult:
        """Handle one window's report."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called once at the end of the session."""

    def notice(self, message: str) -> None:  # noqa: B027 - optional hook
        """A human-readable line about the session (for example why no report was made)."""
