"""``TraceFileExporter``: one Chrome/Perfetto trace file per window.

Files are named ``{worker}.{time_ns}.pt.trace.json[.gz]`` (the convention of
``torch.profiler.tensorboard_trace_handler``, so TensorBoard's profiler plugin and Holistic
Trace Analysis find them), with ``worker`` = ``{host}_{pid}_rank{rank}``. A file appears
atomically: it is written under a hidden temporary name (``.tmp-*.partial``, which no trace
reader picks up) and renamed when complete; on failure the temporary file is removed and no
file appears under the final name. Files get the usual permissions (``0o666`` less the umask).

The directory stays bounded: only the newest ``keep`` files of this worker are kept
(``keep=0`` keeps all; other workers' files are not counted), and all workers' trace files
together stay within ``max_mb`` MiB (oldest first, whoever wrote them; ``max_mb=0``: no
limit); temporary files older than an hour, left by a writer that was killed mid-write
(``SIGKILL``, the OOM killer), are removed then too. Only names of this exporter's patterns
are ever removed. A directory that cannot be written (missing permission, read-only, full,
not a directory) costs one warning, not one per window; the warning comes again only after a
trace was written there meanwhile.
"""

from __future__ import annotations

import gzip
import os
import re
import secrets
import shutil
import threading
import time
from typing import TYPE_CHECKING

from . import Exporter, ExporterWarning, ExportResult
from ._warn import warn

if TYPE_CHECKING:
    from instrument.report import WindowReport

__all__ = ["TraceFileExporter", "worker_name"]

SUFFIX_GZIP = ".pt.trace.json.gz"
SUFFIX_JSON = ".pt.trace.json"
MIB = 1 << 20
# a trace file of this exporter, any worker: {host}_{pid}_rank{rank}.{time_ns}.pt.trace.json[.gz]
_OURS = re.compile(r".+_\d+_rank\d+\.(\d+)\.pt\.trace\.json(?:\.gz)?$")
# a temporary file of ``_open_temp``; one this old was left by a writer that was killed
_TEMP = re.compile(r"\.tmp-[0-9a-f]{16}\.partial$")
STALE_TEMP_S = 3600


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


def _remove_if_older(entry: os.DirEntry, cutoff: float) -> None:
    """Remove a temporary file last written before ``cutoff`` (a killed writer's leftover;
    a live write touches its file every few milliseconds)."""
    try:
        if entry.is_file(follow_symlinks=False) and \
                entry.stat(follow_symlinks=False).st_mtime < cutoff:
            os.unlink(entry.path)
    except OSError:
        pass


class TraceFileExporter(Exporter):
    """Writes each window's trace to ``dir`` (``.pt.trace.json.gz``, or ``.pt.trace.json``
    with ``gzip=False``). ``last_path`` is the absolute path of the file the last successful
    ``export`` wrote (None after a failure); ``lost`` counts windows whose trace file was not
    written or not kept."""

    writes_trace_file = True

    def __init__(self, dir: str | os.PathLike[str] = "./profiled_traces", gzip: bool = True,
                 keep: int = 20, max_mb: float = 1024) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise ValueError(f"keep must be an int >= 0 (0 keeps all), got {keep!r}")
        if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) \
                or not 0 <= max_mb < float("inf"):
            raise ValueError(f"max_mb must be a finite number of MiB >= 0 (0: no limit), "
                             f"got {max_mb!r}")
        if not isinstance(gzip, bool):
            raise TypeError(f"gzip must be a bool, got {gzip!r}")
        self.dir = os.fspath(dir)
        if not self.dir:
            raise ValueError("dir must not be empty")
        self.gzip = gzip
        self.keep = keep
        self.max_bytes = int(max_mb * MIB)
        self.last_path: str | None = None
        self.lost = 0
        self._lock = threading.Lock()
        self._warned: set[tuple[object, ...]] = set()

    def export(self, report: "WindowReport") -> ExportResult:
        with self._lock:
            self.last_path = None
            if not report.raw_trace_path:
                self.lost += 1
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
                self.lost += 1
                # keyed by what failed and where, not by file name: the temporary name is new
                # at every window, and a full disk must not warn at every window
                self._warn_once(
                    ("write", type(exc), exc.errno, directory),
                    f"trace file for window {report.window} was not written to {self.dir!r}: "
                    f"{exc.strerror or exc}{self._where(exc, directory)}; no partial file was "
                    "left. Later windows failing the same way are not warned about again until "
                    "a trace is written there (TraceFileExporter.lost counts them); the "
                    "report's other outputs are unaffected",
                )
                return ExportResult.FAILURE
            self._prune(directory, worker)
            if not self._bound_size(directory, path, report.window):
                self.lost += 1
                return ExportResult.FAILURE
            self._warned.clear()  # written: the next failure is news again
            self.last_path = path
        return ExportResult.SUCCESS

    @staticmethod
    def _where(exc: OSError, directory: str) -> str:
        name = exc.filename
        if not name or os.path.basename(str(name)).startswith(".tmp-"):
            return ""  # the temporary file says nothing the directory does not
        return f" ({name})" if os.path.abspath(str(name)) != directory else ""

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

    def _bound_size(self, directory: str, newest: str, window: int) -> bool:
        """Keep all workers' trace files in ``directory`` within ``max_bytes``, oldest (by the
        time in their names) first. False when the file just written had to go too (it alone,
        with files that could not be removed, is over the limit)."""
        if not self.max_bytes:
            return True
        files: list[tuple[int, str, int]] = []
        stale = time.time() - STALE_TEMP_S
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    m = _OURS.match(entry.name)
                    if m is None:
                        if _TEMP.match(entry.name):
                            _remove_if_older(entry, stale)
                        continue
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    try:
                        size = entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue  # removed meanwhile (another rank bounding the same directory)
                    files.append((int(m.group(1)), entry.name, size))
        except OSError:
            return True
        total = sum(size for _, _, size in files)
        if total <= self.max_bytes:
            return True
        newest_name = os.path.basename(newest)
        for _, name, size in sorted(files):
            if total <= self.max_bytes:
                break
            if name == newest_name:
                continue
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass  # another worker removed it first
            except OSError:
                continue
            total -= size
        if total <= self.max_bytes:
            return True
        size = os.path.getsize(newest) if os.path.exists(newest) else 0
        try:
            os.unlink(newest)
        except OSError:
            pass
        self._warn_once(
            ("over max_mb", directory),
            f"trace file for window {window} ({size / MIB:.2f} MiB) was not kept: with it the "
            f"trace files in {self.dir!r} exceed the limit of {self.max_bytes / MIB:g} MiB "
            f"(PROFILED_TRACE_MAX_MB) even after removing older ones; raise the limit "
            "(0: none) or record fewer steps per window",
        )
        return False

    def _warn_once(self, key: tuple[object, ...], message: str) -> None:
        """One warning per distinct failure until a trace is written again."""
        if key in self._warned:
            return
        self._warned.add(key)
        warn(message, ExporterWarning)
