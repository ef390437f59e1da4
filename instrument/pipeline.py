"""Hands a finished window's report to every exporter, isolating their failures.

Exporters that write the trace file run first, so that the others (the console table) can
name the file. An exporter that raises costs a warning (``ExporterWarning``) naming it and what
was lost; the other exporters still get the report and the program never sees the error. An
exporter that returns ``FAILURE`` has said why itself (``TraceFileExporter`` warns once per
kind of failure), so the pipeline adds no second warning.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

from exporters import ExporterWarning, ExportResult

from .report import WindowReport

__all__ = ["export_report", "notify", "shutdown_exporters"]


def _name(exporter: Any) -> str:
    return type(exporter).__name__


def export_report(report: WindowReport, exporters: Sequence[Any]) -> WindowReport:
    """Give ``report`` to each exporter once; returns the report as the last exporter saw it."""
    ordered = sorted(exporters, key=lambda e: not getattr(e, "writes_trace_file", False))
    for exporter in ordered:
        try:
            result = exporter.export(report)
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks the program
            warnings.warn(
                f"exporter {_name(exporter)} raised {exc!r} on window {report.window}; "
                "its output for this window is lost, the other exporters still ran",
                ExporterWarning,
                stacklevel=2,
            )
            continue
        if result is ExportResult.SUCCESS and getattr(exporter, "writes_trace_file", False):
            path = getattr(exporter, "last_path", None)
            if path and report.trace_file is None:
                report = dataclasses.replace(report, trace_file=path)
    return report


def notify(exporters: Sequence[Any], message: str) -> None:
    for exporter in exporters:
        hook = getattr(exporter, "notice", None)
        if hook is None:
            continue
        try:
            hook(message)
        except Exception:  # noqa: BLE001
            pass


def shutdown_exporters(exporters: Sequence[Any]) -> None:
    for exporter in exporters:
        try:
            exporter.shutdown()
        except Exception as exc:  # noqa: BLE001
            warnings.warn(
                f"exporter {_name(exporter)} raised {exc!r} in shutdown()",
                ExporterWarning,
                stacklevel=2,
            )
