"""``InMemoryExporter``: keeps every report in a list, for tests (ours and users')."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ._base import Exporter, ExportResult

if TYPE_CHECKING:
    from instrument.base.report import WindowReport

__all__ = ["InMemoryExporter"]


class InMemoryExporter(Exporter):
    """Collects reports in ``.reports`` (oldest first). Thread-safe; ``clear()`` empties it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports: list[WindowReport] = []
        self.notices: list[str] = []
        self.is_shutdown = False

    @property
    def reports(self) -> list[WindowReport]:
        with self._lock:
            return list(self._reports)

    def export(self, report: WindowReport) -> ExportResult:
        with self._lock:
            self._reports.append(report)
        return ExportResult.SUCCESS

    def notice(self, message: str) -> None:
        with self._lock:
            self.notices.append(message)

    def clear(self) -> None:
        with self._lock:
            self._reports.clear()
            self.notices.clear()

    def shutdown(self) -> None:
        self.is_shutdown = True
