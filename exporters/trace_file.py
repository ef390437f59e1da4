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
limit). Temporary files older than an hour, left by a writer that was killed mid-write
(``SIGKILL``, the OOM killer), are removed after every window whatever the bounds (a live
write touches its file every few milliseconds, so a fresh one is never taken). Only regular
files whose whole name is one of this exporter's patterns are ever removed: names are matched
in full (a name with a trailing newline or any other extra character is someone else's) and
entries are looked at with ``lstat`` (a symbolic link is never followed nor removed).

A directory that cannot be written (missing permission, read-only, full, a file where the
directory should be) costs one warning saying what was found, not one per window; the warning
comes again only after a trace was written there meanwhile.

With ``gzip=True`` the exporter asks for the window's trace compressed (``wants_gzip_trace``):
where the analysis helper process shaped the trace, it wrote it compressed too
(``report.raw_trace_gz_path``), and the file is that one hard-linked into place (a link
creates the name with the whole file: atomic as the rename is), or, where no link can be made
(another filesystem), copied as it is under a temporary name and renamed; the program's
process never reads or compresses the trace. Without it (the helper off or failed) the raw
trace is compressed here, as with ``gzip=False`` it is copied.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import threading
import time
from typing import TYPE_CHECKING, BinaryIO

from instrument.base.files import TEMP_NAME, write_atomic
from instrument.base.warn import warn

from ._base import Exporter, ExporterWarning, ExportResult

if TYPE_CHECKING:
    from instrument.base.report import WindowReport

__all__ = ["TraceFileExporter", "worker_name"]

SUFFIX_GZIP = ".pt.trace.json.gz"
SUFFIX_JSON = ".pt.trace.json"
MIB = 1 << 20
# a trace file of this exporter, any worker: {host}_{pid}_rank{rank}.{time_ns}.pt.trace.json[.gz]
# (always ``fullmatch``: ``$`` would also accept the name followed by a newline)
_OURS = re.compile(r"(?P<worker>.+_\d+_rank\d+)\.(?P<stamp>\d+)\.pt\.trace\.json(?:\.gz)?")
# a temporary file of ``write_atomic``; one this old was left by a writer that was killed
_TEMP = TEMP_NAME
STALE_TEMP_S = 3600
# what ``os.link`` says where the file can be copied instead: another filesystem, one without
# hard links, a link count at its limit
_NO_LINK = frozenset(
    code
    for code in (
        errno.EXDEV,
        errno.EPERM,
        errno.EMLINK,
        getattr(errno, "ENOTSUP", None),
        getattr(errno, "EOPNOTSUPP", None),
        getattr(errno, "ENOSYS", None),
    )
    if code is not None
)


def worker_name(report: WindowReport) -> str:
    return f"{report.host}_{report.pid}_rank{report.rank}"


def _regular_size(entry: os.DirEntry) -> tuple[int, float] | None:
    """(size, mtime) of ``entry`` if it is a regular file itself (``lstat``: a symbolic link
    named like ours is not ours, and its target must never be touched), else None."""
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return None  # removed meanwhile (another rank tidying the same directory)
    return (st.st_size, st.st_mtime) if stat.S_ISREG(st.st_mode) else None


def _unlink(directory: str, name: str) -> bool:
    """Remove ``name``; True when it is gone (also when another worker removed it first)."""
    try:
        os.unlink(os.path.join(directory, name))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _not_a_directory(directory: str) -> tuple[str, str] | None:
    """The first existing part of ``directory``'s path that is not a directory, and what it
    is, or None. ``os.makedirs`` reports that case as "File exists" or "Not a directory",
    which does not say which path is in the way."""
    chain = [directory]
    while os.path.dirname(chain[-1]) != chain[-1]:
        chain.append(os.path.dirname(chain[-1]))
    for path in reversed(chain):
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            return (path, "a symbolic link to nothing") if os.path.islink(path) else None
        except OSError:
            return None
        if not stat.S_ISDIR(mode):
            return path, _file_kind(mode)
    return None


def _file_kind(mode: int) -> str:
    for test, what in (
        (stat.S_ISREG, "a file"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return what
    return "not a directory"


class TraceFileExporter(Exporter):
    """Writes each window's trace to ``dir`` (``.pt.trace.json.gz``, or ``.pt.trace.json``
    with ``gzip=False``). ``last_path`` is the absolute path of the file the last successful
    ``export`` wrote (None after a failure); ``lost`` counts windows whose trace file was not
    written or not kept."""

    writes_trace_file = True

    def __init__(
        self,
        dir: str | os.PathLike[str] = "./profiled_traces",
        gzip: bool = True,
        keep: int = 20,
        max_mb: float = 1024,
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise ValueError(f"keep must be an int >= 0 (0 keeps all), got {keep!r}")
        if (
            isinstance(max_mb, bool)
            or not isinstance(max_mb, (int, float))
            or not 0 <= max_mb < float("inf")
        ):
            raise ValueError(
                f"max_mb must be a finite number of MiB >= 0 (0: no limit), got {max_mb!r}"
            )
        if not isinstance(gzip, bool):
            raise TypeError(f"gzip must be a bool, got {gzip!r}")
        self.dir = os.fspath(dir)
        if not self.dir:
            raise ValueError("dir must not be empty")
        self.gzip = gzip
        self.wants_gzip_trace = gzip  # the helper compresses the trace, off this process
        self.keep = keep
        self.max_bytes = int(max_mb * MIB)
        self.last_path: str | None = None
        self.lost = 0
        self._lock = threading.Lock()
        self._warned: set[tuple[object, ...]] = set()

    def export(self, report: WindowReport) -> ExportResult:
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
                gz = report.raw_trace_gz_path if self.gzip else None
                stamp = time.time_ns()
                while True:
                    path = os.path.join(directory, f"{worker}.{stamp}{suffix}")
                    if not os.path.exists(path):
                        if gz is None:
                            self._copy_atomic(report.raw_trace_path, path)
                            break
                        if self._place(gz, path):
                            break
                    stamp += 1  # the name is taken (by another worker, meanwhile)
            except OSError as exc:
                self.lost += 1
                self._warn_write_failed(exc, directory, report.window)
                return ExportResult.FAILURE
            if not self._tidy(directory, worker, path, report.window):
                self.lost += 1
                return ExportResult.FAILURE
            self._warned.clear()  # written: the next failure is news again
            self.last_path = path
        return ExportResult.SUCCESS

    def _warn_write_failed(self, exc: OSError, directory: str, window: int) -> None:
        """One warning per kind of failure and directory, keyed by what failed and where, not
        by file name: the temporary name is new at every window, and a full disk must not
        warn at every window."""
        again = (
            "Later windows failing the same way are not warned about again until a trace "
            "is written there (TraceFileExporter.lost counts them); the report's other "
            "outputs are unaffected"
        )
        blocked = (
            _not_a_directory(directory)
            if isinstance(exc, (FileExistsError, NotADirectoryError))
            else None
        )
        if blocked is not None:
            where, what = blocked
            found = (
                f"is {what}, not a directory"
                if where == directory
                else f"cannot be created: {where!r} on its path is {what}, not a directory"
            )
            self._warn_once(
                ("not a directory", directory),
                f"trace directory {self.dir!r} (PROFILED_TRACE_DIR, or TraceFileExporter's "
                f"dir) {found}: no trace files are written (window {window}'s is lost), and "
                f"nothing there is changed. Point it at a directory, or move {where!r} away. "
                + again,
            )
            return
        self._warn_once(
            ("write", type(exc), exc.errno, directory),
            f"trace file for window {window} was not written to {self.dir!r}: "
            f"{exc.strerror or exc}{self._where(exc, directory)}; no partial file was left. "
            + again,
        )

    @staticmethod
    def _where(exc: OSError, directory: str) -> str:
        name = exc.filename
        if not name or os.path.basename(str(name)).startswith(".tmp-"):
            return ""  # the temporary file says nothing the directory does not
        return f" ({name})" if os.path.abspath(str(name)) != directory else ""

    def _copy_atomic(self, src: str, dst: str, *, compress: bool | None = None) -> None:
        def copy(out: BinaryIO) -> None:
            with open(src, "rb") as inp:
                shutil.copyfileobj(inp, out, 1 << 20)

        write_atomic(dst, copy, compress=self.gzip if compress is None else compress)

    def _place(self, gz: str, dst: str) -> bool:
        """The compressed trace ``gz`` at ``dst``: linked, else copied as it is; False where
        ``dst`` was taken meanwhile (nothing written)."""
        try:
            os.link(gz, dst)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                if exc.errno == errno.ENOENT and not os.path.exists(gz):
                    raise FileNotFoundError(exc.errno, exc.strerror, gz) from None
                # the directory's own failure (no permission, read-only, full), said as a
                # write's (the scratch file's name says nothing about it)
                raise OSError(exc.errno, exc.strerror) from None
            self._copy_atomic(gz, dst, compress=False)
        return True

    def _tidy(self, directory: str, worker: str, newest: str, window: int) -> bool:
        """After a write, one pass over ``directory``: stale temporary files go (whatever the
        bounds), then ``keep``, then ``max_mb``. False when the file just written had to go
        too (it alone, with files that could not be removed, is over ``max_mb``)."""
        stale = time.time() - STALE_TEMP_S
        files: list[tuple[int, str, int]] = []  # (time in the name, name, size), every worker
        mine: list[tuple[int, str]] = []
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    m = _OURS.fullmatch(entry.name)
                    if m is None:
                        if _TEMP.fullmatch(entry.name):
                            found = _regular_size(entry)
                            if found is not None and found[1] < stale:
                                _unlink(directory, entry.name)  # a killed writer's leftover
                        continue
                    found = _regular_size(entry)
                    if found is None:
                        continue
                    files.append((int(m.group("stamp")), entry.name, found[0]))
                    if m.group("worker") == worker:
                        mine.append((int(m.group("stamp")), entry.name))
        except OSError:
            return True  # cannot be listed now: the next window tidies
        gone = self._prune(directory, mine)
        return self._bound_size(directory, [f for f in files if f[1] not in gone], newest, window)

    def _prune(self, directory: str, mine: list[tuple[int, str]]) -> set[str]:
        """Keep the newest ``keep`` files of this worker (either suffix, so that switching
        ``gzip`` does not leave the other kind behind forever); returns the names removed."""
        if not self.keep:
            return set()
        gone = set()
        for _, name in sorted(mine)[: max(len(mine) - self.keep, 0)]:
            if _unlink(directory, name):
                gone.add(name)
        return gone

    def _bound_size(
        self, directory: str, files: list[tuple[int, str, int]], newest: str, window: int
    ) -> bool:
        """Keep all workers' trace ``files`` in ``directory`` within ``max_bytes``, oldest (by
        the time in their names) first; see ``_tidy``."""
        if not self.max_bytes:
            return True
        total = sum(size for _, _, size in files)
        if total <= self.max_bytes:
            return True
        newest_name = os.path.basename(newest)
        for _, name, size in sorted(files):
            if total <= self.max_bytes:
                break
            if name != newest_name and _unlink(directory, name):
                total -= size
        if total <= self.max_bytes:
            return True
        size = os.path.getsize(newest) if os.path.exists(newest) else 0
        _unlink(directory, newest_name)
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
