"""The raw window traces' directory: one per process, private, bounded, cleaned after a crash.

Each window's raw trace (``export_chrome_trace``'s JSON, ~90 MB for a big GPU window) is
written here by the export worker, shaped in place (by the analysis helper process or in this
one) and removed once every exporter is done with it, with its gzip-compressed copy where the
helper made one (``gz_path``: the trace exporter links it into place). What this module
guarantees:

- One directory per process, ``<tempdir>/torch-profiled-<pid>-<start>-<scope>-<random>``,
  created ``0700`` (only this user reads the traces: they hold the program's operator names,
  shapes and stacks). ``<start>`` is the process's start time in clock ticks since boot
  (``/proc/<pid>/stat``; ``0`` where there is no ``/proc``) and ``<scope>`` a digest of the
  boot, the PID namespace and the host name, so that a name says which process made it,
  even after its PID was reused, and which machine and namespace it came from.
- Stale directories are removed at this process's first window (``clean_stale``): those of
  this user whose maker is dead (a ``SIGKILL``, a crash, a deadline that kept its traces)
  or whose PID now belongs to a process that started later (a PID reused: containers give
  the same low PIDs on every restart). Nothing else is ever touched: other users'
  directories, live processes' directories, directories made on another boot, host or PID
  namespace (a shared or network temporary directory: their PIDs mean nothing here), names
  that merely look alike (the pattern is anchored with ``\\Z``), and symbolic links (never
  followed: the entry itself is ``lstat``-ed, and ``shutil.rmtree`` refuses a link).
  Without ``/proc`` (macOS) a live PID keeps its directory, reused or not; where there is
  no user id (not POSIX) nothing is cleaned.
- Bounded: at most ``MAX_WAITING`` raw traces wait in the directory. Exporters that missed
  their deadline (a hung exporter, a session closed past ``PROFILED_EXPORT_TIMEOUT_S``) keep
  theirs; when a new window would exceed the bound the oldest traces are removed first (an
  exporter still working on one then cannot read it and loses that window's trace, with its
  own warning), and one warning per process says so.
- ``release()`` (session close) removes the directory once no trace handed out is waiting;
  a process that ends with traces still waiting leaves it to the next process's first window.

Only paths handed out by ``new_path`` are ever removed by ``remove``; a forked child starts
with a directory of its own and never removes its parent's traces.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
import threading

from exporters import ExporterWarning
from instrument.base.warn import warn

from .pipeline import QUEUE_SIZE

__all__ = [
    "MAX_WAITING",
    "PREFIX",
    "clean_stale",
    "directory",
    "gz_path",
    "new_path",
    "release",
    "remove",
]

PREFIX = "torch-profiled-"
MAX_WAITING = QUEUE_SIZE + 2
"""Raw traces that may wait at once: what one session's slowest exporter can legitimately
hold (its queue and the report it is exporting) plus the window being written."""

# a directory of this module's making: pid, start ticks (0: unknown), scope, random
_NAME = re.compile(r"torch-profiled-([1-9][0-9]{0,9})-([0-9]{1,20})-([0-9a-f]{8})-[0-9a-f]{16}\Z")
# a raw trace in it: a process-wide sequence number (its age), then the session's window
_TRACE = re.compile(r"([0-9]{8,})-window[0-9]+\.pt\.trace\.json\Z")

_lock = threading.Lock()
_owner = 0  # the pid whose state below this is (a forked child starts afresh)
_dir: str | None = None
_live: set[str] = set()  # paths handed out and not removed yet
_seq = itertools.count()
_cleaned: set[str] = set()  # base directories already cleaned by this process
_warned = False


# ---------------------------------------------------------------- who made a directory


def _start_ticks(pid: int | str) -> int | None:
    """When ``pid`` started, in clock ticks since boot (Linux); None when there is no such
    process, it is a zombie, or there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    try:
        return int(fields[19])  # field 22, counted from the state (field 3)
    except ValueError:
        return None


def _scope() -> str:
    """This boot, PID namespace and host, as 8 hex digits: a PID means something only
    within one scope."""
    parts = []
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            parts.append(fh.read().strip())
    except OSError:
        parts.append("")
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        parts.append("")
    parts.append(socket.gethostname())
    return hashlib.sha256("\0".join(parts).encode("utf-8", "replace")).hexdigest()[:8]


def _maker_alive(pid: int, start: int) -> bool:
    """True unless the process that made a directory is certainly gone."""
    if start:
        return _start_ticks(pid) == start  # gone, a zombie, or a later process on its PID
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process: alive
        return True
    return True


def clean_stale(base: str | None = None) -> list[str]:
    """Remove the directories in ``base`` (the temporary directory) that dead processes of
    this user left (see the module docstring for what is never touched); returns them."""
    base = base or tempfile.gettempdir()
    scope, uid, mine = _scope(), _uid(), _dir
    removed: list[str] = []
    if uid is None:  # no owners to check (and os.kill would end a process there)
        return removed
    try:
        with os.scandir(base) as it:
            entries = [entry.name for entry in it]
    except OSError:
        return removed
    for name in entries:
        m = _NAME.match(name)
        if m is None or m.group(3) != scope:
            continue
        path = os.path.join(base, name)
        if path == mine or not _is_own_directory(path, uid):
            continue
        if _maker_alive(int(m.group(1)), int(m.group(2))):
            continue
        shutil.rmtree(path, ignore_errors=True)  # refuses a link swapped in meanwhile
        if not os.path.lexists(path):
            removed.append(path)
    return removed


def _uid() -> int | None:
    """This process's effective user; None where there is none (not POSIX)."""
    geteuid = getattr(os, "geteuid", None)
    return geteuid() if geteuid is not None else None


def _is_own_directory(path: str, uid: int | None) -> bool:
    """A real directory (not a link to one) owned by ``uid`` (any owner where there is no
    uid)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and (uid is None or st.st_uid == uid)


# ---------------------------------------------------------------- this process's directory


def _own_state() -> None:
    """Forget a parent's directory and traces in a forked child (under ``_lock``)."""
    global _owner, _dir, _seq, _warned
    pid = os.getpid()
    if _owner != pid:
        _owner, _dir, _seq, _warned = pid, None, itertools.count(), False
        _live.clear()
        _cleaned.clear()


def _make(base: str) -> str:
    pid = os.getpid()
    start = _start_ticks("self") or 0
    for _ in range(100):
        path = os.path.join(base, f"{PREFIX}{pid}-{start}-{_scope()}-{secrets.token_hex(8)}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)  # whatever the umask: private, and writable by us
        return path
    raise FileExistsError(f"no free directory name in {base!r}")  # pragma: no cover


def directory() -> str:
    """This process's directory (made, after cleaning stale ones, on the first call; made
    again if it was removed meanwhile, e.g. by a cleaner of old temporary files)."""
    with _lock:
        return _directory()


def _directory() -> str:
    global _dir
    _own_state()
    base = tempfile.gettempdir()
    if _dir is not None and os.path.dirname(_dir) == base and _is_own_directory(_dir, _uid()):
        return _dir
    _dir = None  # gone (or the temporary directory was changed): traces handed out stay live
    if base not in _cleaned:
        _cleaned.add(base)
        clean_stale(base)
    _dir = _make(base)
    return _dir


def new_path(window: int) -> str:
    """A fresh path for window ``window``'s raw trace; the oldest waiting traces are removed
    first if the directory already holds ``MAX_WAITING`` (see the module docstring)."""
    with _lock:
        folder = _directory()
        path = os.path.join(folder, f"{next(_seq):08d}-window{int(window)}.pt.trace.json")
        dropped = _bound(folder, MAX_WAITING - 1)
        _live.add(path)
    if dropped:
        _warn_bound(folder, dropped)
    return path


def _bound(folder: str, keep: int) -> int:
    """Leave at most ``keep`` raw traces in ``folder``, oldest removed first; how many of
    those removed were still handed out (under ``_lock``)."""
    try:
        names = sorted(
            (int(m.group(1)), name) for name in os.listdir(folder) if (m := _TRACE.match(name))
        )
    except OSError:
        return 0
    dropped = 0
    for _, name in names[: max(len(names) - keep, 0)]:
        path = os.path.join(folder, name)
        _unlink(path)
        _unlink(gz_path(path))
        if path in _live:
            _live.discard(path)
            dropped += 1
    return dropped


def _warn_bound(folder: str, dropped: int) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warn(
        f"torch-profiled: {MAX_WAITING} raw window traces were still waiting for exporters "
        f"in {folder!r} (exporters that missed their deadline keep them); the oldest "
        f"{dropped} removed: an exporter still working on one loses that window's trace. "
        "The program goes on (this warning is given once per process)",
        ExporterWarning,
    )


def gz_path(path: str) -> str:
    """Where the gzip-compressed copy of the raw trace at ``path`` goes (removed with it)."""
    return path + ".gz"


def remove(path: str | None) -> None:
    """Remove a raw trace (and its compressed copy) once its exporters are done with it; a
    path ``new_path`` did not hand out (to this process) is left alone."""
    if not path:
        return
    with _lock:
        _own_state()
        if path not in _live:
            return
        _live.discard(path)
    _unlink(path)
    _unlink(gz_path(path))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def release() -> bool:
    """Remove this process's directory, with whatever stray files it holds (a helper killed
    mid-write, a window whose report failed), unless a trace handed out is still waiting
    (an exporter past its deadline may still read it). True when no directory is left."""
    global _dir
    with _lock:
        _own_state()
        if _dir is None:
            return True
        if _live:
            return False
        folder, _dir = _dir, None
    shutil.rmtree(folder, ignore_errors=True)
    return not os.path.lexists(folder)
