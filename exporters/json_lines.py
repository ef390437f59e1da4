"""``JsonLinesExporter``: one JSON object per window report, one line each.

For CI regression checks (``jq``, pandas ``read_json(lines=True)``) and log pipelines. Each
line is written with a single ``write`` on a file opened with ``O_APPEND``, so lines from
several processes (ranks, DataLoader workers) appending to one file never interleave, and a
reader never sees half a line followed by another writer's data. ``path="-"`` writes to
standard output.

The file is opened without following a symbolic link (``O_NOFOLLOW``): a link planted at the
path in a shared directory (``/tmp``) would otherwise redirect the appends into a file of the
planter's choosing. Only a regular file is appended to: a named pipe, a device, a socket or a
directory at the path is refused (opened with ``O_NONBLOCK`` and checked with ``fstat``, so a
FIFO nobody reads cannot hang the export). Either costs one warning naming the path and what
was found there; those reports are not written. Directories above the file are followed.

Every line is valid UTF-8 JSON whatever the range names: a lone surrogate (a file name's
undecodable byte through ``os.fsdecode``) is written out as its escape text (``valid_text``),
not as a ``\\udcff`` JSON escape that strict readers refuse and that no UTF-8 text can hold.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import threading
from typing import TYPE_CHECKING, Any

from instrument.base.files import kind_of
from instrument.base.warn import warn

from ._base import Exporter, ExporterWarning, ExportResult

if TYPE_CHECKING:
    from instrument.base.report import MetricsReport, WindowReport

__all__ = [
    "METRICS_SCHEMA",
    "SCHEMA",
    "JsonLinesExporter",
    "metrics_record",
    "report_record",
    "valid_text",
]

SCHEMA = "torch-profiled/window-report/1"
METRICS_SCHEMA = "torch-profiled/metrics/1"


def valid_text(text: str) -> str:
    """``text`` with each lone surrogate written out as its escape text (six characters,
    ``\\udcff``), so that it encodes as UTF-8; any other text as it is.

    Lone surrogates are how Python holds bytes that are not UTF-8 (``os.fsdecode``,
    ``os.listdir`` of a name from another encoding): a range named after such a file is legal
    in the program, but no UTF-8 output (JSON lines, the Prometheus page, OTLP) can carry it,
    and an encoder that meets one raises. Here rather than in each exporter: every output
    shows the same name for it."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _valid(value: Any) -> Any:
    """A JSON-ready ``value`` with ``valid_text`` applied to every string and key; a key that
    became another key's text gets ``#2``, ``#3`` (both entries stay)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(key, str):
                text = valid_text(key)
                n = 1
                while (key := text if n == 1 else f"{text}#{n}") in out:
                    n += 1
            out[key] = _valid(item)
        return out
    if isinstance(value, (list, tuple)):
        return [_valid(item) for item in value]
    return value


def report_record(report: WindowReport) -> dict[str, Any]:
    """The JSON-ready object written for one report (``schema`` names its layout)."""
    record: dict[str, Any] = {"schema": SCHEMA}
    record.update(report.to_dict())
    record.pop("raw_trace_path", None)  # temporary files, gone once exporters have run
    record.pop("raw_trace_gz_path", None)
    return record


def metrics_record(report: MetricsReport) -> dict[str, Any]:
    """The JSON-ready object written for one metrics snapshot: who and when, then per range
    (and for steps) count, sum, min, p50, p90, p99 and max in seconds, cumulative since
    ``since_ns``."""
    record: dict[str, Any] = {"schema": METRICS_SCHEMA}
    record.update(report.summary())
    return record


_WHY_REFUSED = (
    "the JSON-lines exporter appends only to a regular file, and never through a "
    "link, which someone else could have planted to redirect the reports"
)


class _Refused(Exception):
    """Something other than a regular file is at the path; the message says what."""


def _what_is_at(path: str) -> str | None:
    """What non-regular thing is at ``path`` (``lstat``), or None (nothing, or a file)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            return "a symbolic link"
        return f"a symbolic link (to {target!r})"
    return None if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)


def _append(fd: int, data: bytes) -> None:
    """One ``write`` of the whole line; a short one (a full disk) is cut back off, so no half
    line is ever left for the next writer to continue."""
    written = os.write(fd, data)
    if written != len(data):
        os.ftruncate(fd, os.fstat(fd).st_size - written)
        raise OSError(28, "short write (disk full?)")


class JsonLinesExporter(Exporter):
    def __init__(self, path: str | os.PathLike[str] = "./profiled_reports.jsonl") -> None:
        self.path = os.fspath(path)
        if not self.path:
            raise ValueError("path must not be empty (use '-' for standard output)")
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def export(self, report: WindowReport) -> ExportResult:
        return self._write(report_record(report), f"the report of window {report.window}")

    def export_metrics(self, report: MetricsReport) -> None:
        """One ``torch-profiled/metrics/1`` record: the process's histograms so far."""
        self._write(metrics_record(report), "a metrics record")

    def _write(self, record: dict[str, Any], what: str) -> ExportResult:
        try:
            line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
            if "\\ud" in line:  # maybe a lone surrogate (or a pair: checked in valid_text)
                line = json.dumps(_valid(record), separators=(",", ":"), allow_nan=False) + "\n"
        except (TypeError, ValueError) as exc:
            self._warn_once("encode", f"{what} could not be encoded as JSON ({exc}); not written")
            return ExportResult.FAILURE
        with self._lock:
            if self.path == "-":
                sys.stdout.write(line)
                sys.stdout.flush()
                return ExportResult.SUCCESS
            try:
                self._append(line.encode("utf-8"))
            except _Refused as refused:
                self._warn_once(
                    f"refused:{refused}",
                    f"{self._shown()} is {refused}, not a regular file: {what} was not "
                    f"appended there, nor are later ones while it stays ({_WHY_REFUSED}). "
                    "Remove it or point PROFILED_JSON_PATH (JsonLinesExporter's path) "
                    "elsewhere; use '-' for standard output",
                )
                return ExportResult.FAILURE
            except OSError as exc:
                self._warn_once(
                    type(exc).__name__ + str(exc.errno),
                    f"{what} was not appended to {self._shown()}: {self._why(exc)}. Later "
                    "ones are tried again (this warning is not repeated); the program goes on. "
                    "Point PROFILED_JSON_PATH (JsonLinesExporter's path) at a file this "
                    "process can write, or '-' for standard output",
                )
                return ExportResult.FAILURE
        return ExportResult.SUCCESS

    def _shown(self) -> str:
        """The path as given, and where that is when it is relative."""
        full = os.path.abspath(self.path)
        return repr(self.path) if full == self.path else f"{self.path!r} ({full})"

    def _why(self, exc: OSError) -> str:
        """What failed: the OS's reason and its name, and where when not at the file itself
        (making the directories above it)."""
        code = errno.errorcode.get(exc.errno or 0)
        why = f"{exc.strerror or exc}" + (f" ({code})" if code else "")
        where = exc.filename
        if not isinstance(where, str) or os.path.abspath(where) == os.path.abspath(self.path):
            return why
        above = os.path.dirname(os.path.abspath(self.path))
        while not os.path.lexists(above) and os.path.dirname(above) != above:
            above = os.path.dirname(above)
        if os.path.lexists(above) and not os.path.isdir(above):
            found = _what_is_at(above) or "a regular file"
            return f"{above!r} is {found}, not a directory, so the file cannot be made under it"
        return f"{why}, making the directory {where!r} above the file"

    def _append(self, data: bytes) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        fd = self._open()
        try:
            _append(fd, data)
        finally:
            os.close(fd)

    def _open(self) -> int:
        """The file at ``path`` for appending, created if missing; never through a symbolic
        link, never anything but a regular file (``_Refused`` says what was there)."""
        flags = (
            os.O_WRONLY
            | os.O_APPEND
            | os.O_CREAT
            | getattr(os, "O_NONBLOCK", 0)
            | getattr(os, "O_NOFOLLOW", 0)
            | getattr(os, "O_CLOEXEC", 0)
        )
        try:
            fd = os.open(self.path, flags, 0o666)
        except OSError as exc:
            # ELOOP (a link), ENXIO (a FIFO or socket nobody reads), EISDIR: say what is there
            found = _what_is_at(self.path)
            if found is not None:
                raise _Refused(found) from exc
            raise
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            os.close(fd)
            raise
        if not stat.S_ISREG(mode):  # a FIFO someone reads, a device: not a report file
            os.close(fd)
            raise _Refused(kind_of(mode))
        return fd

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message, ExporterWarning)
