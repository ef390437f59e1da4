"""``JsonLinesExporter``: one JSON object per window report, one line each.

For CI regression checks (``jq``, pandas ``read_json(lines=True)``) and log pipelines. Each
line is written with a single ``write`` on a file opened with ``O_APPEND``, so lines from
several processes (ranks, DataLoader workers) appending to one file never interleave, and a
reader never sees half a line followed by another writer's data. ``path="-"`` writes to
standard output.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from . import Exporter, ExporterWarning, ExportResult
from ._warn import warn

if TYPE_CHECKING:
    from instrument.report import WindowReport

__all__ = ["JsonLinesExporter", "SCHEMA", "report_record"]

SCHEMA = "torch-profiled/window-report/1"


def report_record(report: "WindowReport") -> dict[str, Any]:
    """The JSON-ready object written for one report (``schema`` names its layout)."""
    record: dict[str, Any] = {"schema": SCHEMA}
    record.update(report.to_dict())
    record.pop("raw_trace_path", None)  # a temporary file, gone once exporters have run
    return record


class JsonLinesExporter(Exporter):
    def __init__(self, path: str | os.PathLike[str] = "./profiled_reports.jsonl") -> None:
        self.path = os.fspath(path)
        if not self.path:
            raise ValueError("path must not be empty (use '-' for standard output)")
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def export(self, report: "WindowReport") -> ExportResult:
        try:
            line = json.dumps(report_record(report), separators=(",", ":"),
                              allow_nan=False) + "\n"
        except (TypeError, ValueError) as exc:
            self._warn_once("encode", f"window {report.window} could not be encoded as JSON "
                                      f"({exc}); its line is not written")
            return ExportResult.FAILURE
        data = line.encode("utf-8")
        with self._lock:
            if self.path == "-":
                sys.stdout.write(line)
                sys.stdout.flush()
                return ExportResult.SUCCESS
            try:
                directory = os.path.dirname(os.path.abspath(self.path))
                os.makedirs(directory, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
                try:
                    written = os.write(fd, data)
                    if written != len(data):  # a full disk: never leave half a line behind
                        os.ftruncate(fd, os.fstat(fd).st_size - written)
                        raise OSError(28, "short write (disk full?)")
                finally:
                    os.close(fd)
            except OSError as exc:
                self._warn_once(type(exc).__name__ + str(exc.errno),
                                f"report of window {report.window} was not appended to "
                                f"{self.path!r}: {exc.strerror or exc}")
                return ExportResult.FAILURE
        return ExportResult.SUCCESS

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message, ExporterWarning)
