"""``TraceFileExporter``: one Chrome/Perfetto trace file per window.

Files are named ``{worker}.{time_ns}.pt.trace.json[.gz]`` (the convention of
``torch.profiler.tensorboard_trace_handler``, so TensorBoard's profiler plugin and Holistic
Trace Analysis find them), with ``worker`` = ``{host}_{pid}_rank{rank}``. A file appears
atomically: it is written under a hidden temporary name and renamed when complete. Only the
newest ``keep`` files of this worker are kept (``keep=0`` keeps all).
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from typing import TYPE_CHECKING

from . import Exporter, ExporterWarning, ExportResult

if TYPE_CHECKING:
    from instrument.report import WindowReport

__all__ = ["TraceFileExporter", "worker_name"]


def worker_name(report: "WindowReport") -> str:
    return f"{report.host}_{report.pid}_rank{report.rank}"


class TraceFileExporter(Exporter):
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
        self._warned: set[str] = set()

    def export(self, report: "WindowReport") -> ExportResult:
        self.last_path = None
        if not report.raw_trace_path:
            return ExportResult.FAILURE
        worker = worker_name(report)
        suffix = ".pt.trace.json.gz" if self.gzip else ".pt.trace.json"
        with self._lock:
            try:
                os.makedirs(self.dir, exist_ok=True)
                stamp = time.time_ns()
                path = os.path.join(self.dir, f"{worker}.{stamp}{suffix}")
                while os.path.exists(path):
                    stamp += 1
                    path = os.path.join(self.dir, f"{worker}.{stamp}{suffix}")
                self._copy_atomic(report.raw_trace_path, path)
            except OSError as exc:
                self._warn_once(
                    f"trace file for window {report.window} was not written to {self.dir!r}: "
                    f"{exc.strerror or exc}; the report's other outputs are unaffected"
                )
                return ExportResult.FAILURE
            self.last_path = path
            self._prune(worker, suffix)
        return ExportResult.SUCCESS

    def _copy_atomic(self, src: str, dst: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".partial", dir=self.dir)
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

    def _prune(self, worker: str, suffix: str) -> None:
        if not self.keep:
            return
        pattern = re.compile(re.escape(worker) + r"\.(\d+)" + re.escape(suffix) + "$")
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        mine = sorted(
            (int(m.group(1)), name) for name in names if (m := pattern.match(name))
        )
        for _, name in mine[: max(len(mine) - self.keep, 0)]:
            try:
                os.unlink(os.path.join(self.dir, name))
            except OSError:
                pass

    def _warn_once(self, message: str) -> None:
        key = message.split(":", 1)[-1]
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(message, ExporterWarning, stacklevel=2)
