"""``TraceFileExporter``: one Chrome/Perfetto trace file per window.

Files are named ``{worker}.{time_ns}.pt.trace.json[.gz]`` (the convention of
``torch.profiler.tensorboard_trace_handler``, so TensorBoard's profiler plugin and Holistic
Trace Analysis find them), with ``worker`` = ``{host}_{pid}_rank{rank}``. A file appears
atomically: it is written under a hidden temporary name (``.tmp-*.partial``, which no trace
reader picks up) and renamed when complete; on failure the temporary file is removed and no
file appears under the final name. Files get the usual permissions (``0o666`` less the umask).
Only the newest ``keep`` files of this worker are kept (``keep=0`` keeps all); other workers'
files are never touched.
"""

from __future__ import annotations

import gzip
import os
import re
import secrets
import shutil
import threading
import time
import warnings
from typing import TYPE_CHECKING

from . import Exporter, ExporterWarning, ExportResult

if TYPE_CHECKING:
    from instrument.report import WindowReport

__all__ = ["TraceFileExporter", "worker_name"]

SUFFIX_GZIP = ".pt.trace.json.gz"
SUFFIX_JSON = ".pt.trace.json"


def worker_name(report: "WindowReport") -> str:
    return f"{report.host}_{report.pid}_rank{report.rank}"


def _open_temp(directory: str) -> tuple[int, str]:
    """A new hidden file in ``directory``, created with mode 0o666 (less the umask).

    ``tempfile.mkstemp`` would create it 0o600, which a TensorBoard or trace server running
    as another user cannot read.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".tmp-{secrets.token_hex(8)}.partial")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {directory!r}")  # pragma: no cover


class TraceFileExporter(Exporter):
    """Writes each window's trace to ``dir`` (``.pt.trace.json.gz``, or ``.pt.trace.json``
    with ``gzip=False``). ``last_path`` is the absolute path of the file the last successful
    ``export`` wrote (None after a failure)."""

    writes_trace_file = True

    def __init__(self, dir: str | os.PathLike[str] = "./profiled_traces", gzip: bool = True,
                 keep: int = 20) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise ValueError(f"keep must be an int >= 0 (0 keeps all), got {keep!r}")
        if not isinstance(gzip, bool):
            raise TypeError(f"gzip must be a bool, got {gzip!r}")
        self.dir = os.fspath(dir)
        if not self.dir:
            raise ValueError("dir must not be empty")
        self.gzip = gzip
        self.keep = keep
        self.last_path: str | None = None
        self._lock = threading.Lock()
        self._warned: set[tuple[object, ...]] = set()

    def export(self, report: "WindowReport") -> ExportResult:
        with self._lock:
            self.last_path = None
            if not report.raw_trace_path:
                self._warn_once(
                    ("no raw trace",),
                    f"window {report.window}'s report carries no raw trace (raw_trace_path is "
                    "empty), so no trace file was written",
                )
                return ExportResult.FAILURE
            worker = worker_name(report)
            suffix = SUFFIX_GZIP if self.gzip else SUFFIX_JSON
            directory = os.path.abspath(self.dir)
            try:
                os.makedirs(directory, exist_ok=True)
                stamp = time.time_ns()
                path = os.path.join(directory, f"{worker}.{stamp}{suffix}")
                while os.path.exists(path):
                    stamp += 1
                    path = os.path.join(directory, f"{worker}.{stamp}{suffix}")
                self._copy_atomic(report.raw_trace_path, path)
            except OSError as exc:
                where = f" ({exc.filename})" if exc.filename else ""
                self._warn_once(
                    (type(exc), exc.errno, exc.filename),
                    f"trace file for window {report.window} was not written to {self.dir!r}: "
                    f"{exc.strerror or exc}{where}; the report's other outputs are unaffected",
                )
                return ExportResult.FAILURE
            self.last_path = path
            self._prune(directory, worker)
        return ExportResult.SUCCESS

    def _copy_atomic(self, src: str, dst: str) -> None:
        fd, tmp = _open_temp(os.path.dirname(dst))
        try:
            with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
                if self.gzip:
                    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6) as gz:
                        shutil.copyfileobj(inp, gz, 1 << 20)
                else:
                    shutil.copyfileobj(inp, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dst)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _prune(self, directory: str, worker: str) -> None:
        """Keep the newest ``keep`` files of ``worker`` (either suffix, so that switching
        ``gzip`` does not leave the other kind behind forever)."""
        if not self.keep:
            return
        pattern = re.compile(re.escape(worker) + r"\.(\d+)\.pt\.trace\.json(?:\.gz)?$")
        try:
            names = os.listdir(directory)
        except OSError:
            return
        mine = sorted((int(m.group(1)), name) for name in names if (m := pattern.match(name)))
        for _, name in mine[: max(len(mine) - self.keep, 0)]:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass

    def _warn_once(self, key: tuple[object, ...], message: str) -> None:
        """One warning per distinct failure: a full disk must not warn at every window."""
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(message, ExporterWarning, stacklevel=3)
