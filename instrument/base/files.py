"""Writing a file atomically: the one helper for the SDK and its exporters. No torch imports.

A file written with ``write_atomic`` either does not exist under its name or is complete: it
is written under a hidden temporary name in the same directory (``.tmp-<16 hex>.partial``,
which no trace reader picks up, matched by ``TEMP_NAME``) and renamed over the final name
once complete; on any error the temporary file is removed and the error re-raised. What is
already at the name is replaced only when it is a regular file or a symbolic link (the link
itself, never what it points to): a directory, a device, a named pipe or a socket there is
left as it is and the write fails with ``NotAFileError`` (renaming over ``/dev/null`` as root
would replace the device node with a file).

A command's output path (``torch-profiled report -o``, ``diff --junit``) is named by the user,
who may mean a device or a pipe: ``write_output`` writes into those in place (streamed, as a
shell's ``>`` would), writes through a symbolic link to a regular file (atomically, the link
kept), and refuses what cannot take a file (``UnwritableOutput``: a directory, a block device,
a socket, a dangling link); ``output_target`` says which, before any work is done.

It lives in ``exporters`` (not ``instrument``) because exporters may import neither torch nor
``instrument``'s internals, while ``instrument`` may import this: the trace-file exporter
copies the window's trace with it and ``instrument.analysis.kineto_json`` writes the shaped trace.
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

__all__ = [
    "GZIP_LEVEL",
    "TEMP_NAME",
    "NotAFileError",
    "Output",
    "UnwritableOutput",
    "current_umask",
    "open_temp",
    "output_target",
    "write_atomic",
    "write_output",
]

TEMP_NAME = re.compile(r"\.tmp-[0-9a-f]{16}\.partial")
"""The name of a temporary file of ``open_temp`` (match it with ``fullmatch``)."""


GZIP_LEVEL = 1
"""The gzip level of compressed trace files (``write_atomic(compress=True)``). A CPU window's
6.2 MB trace: level 1 takes 19 ms and gives 0.66 MB, level 6 52 ms and 0.55 MB (2-core box):
the window's trace is compressed at every window, and level 1's files are ~20% larger."""


def current_umask() -> int | None:
    """This process's umask, read without changing it (``/proc/self/status``, Linux 4.7+);
    None where it cannot be read so (setting it to read it back would race with other threads
    creating files)."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def open_temp(directory: str) -> tuple[int, str]:
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


def write_atomic(
    path: str, write: Callable[[BinaryIO], None], *, compress: bool = False, durable: bool = True
) -> None:
    """Write ``path`` atomically (see the module docstring): ``write(f)`` writes the content
    into ``f``, a binary file (gzip-compressed at ``GZIP_LEVEL`` with ``compress``). ``durable``
    ``fsync``s before the rename (a scratch file that dies with the process skips it: ~7 ms
    for a window's trace)."""
    fd, tmp = open_temp(os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as raw:
            if compress:
                with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL) as gz:
                    write(gz)  # type: ignore[arg-type]
            else:
                write(raw)
            raw.flush()
            if durable:
                os.fsync(raw.fileno())
        _check_replaceable(path)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def kind_of(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in words."""
    for test, kind in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device (a disk or partition)"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"  # pragma: no cover - no other kinds on POSIX


class NotAFileError(OSError):
    """``write_atomic``: what is at the name is neither a regular file nor a symbolic link, and
    renaming over it would destroy it (a device node, a FIFO, a socket); it was left as is."""


def _check_replaceable(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return
    code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EEXIST
    raise NotAFileError(code, f"{kind_of(mode)} is there, not a regular file (left as it is)", path)


# ---------------------------------------------------------------- a command's output path


class UnwritableOutput(Exception):
    """An output path that cannot take a file: ``what`` says what is there and why."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass(frozen=True)
class Output:
    """Where ``write_output`` puts the bytes for a path (see ``output_target``)."""

    path: str  # as the user gave it
    target: str  # the file replaced atomically (a link's target), or the path streamed into
    stream: bool  # written in place: a character device, a FIFO, this process's stdout/stderr
    fd: int | None = None  # 1 or 2: the path is this process's standard output or error
    kind: str = "a regular file"


def _std_fd(st: os.stat_result) -> int | None:
    """1 or 2 when ``st`` is the file this process's standard output or error is open on."""
    for fd in (1, 2):
        try:
            own = os.fstat(fd)
        except OSError:
            continue
        if (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino):
            return fd
    return None


def _planted(path: str, link: os.stat_result) -> bool:
    """A link in a sticky world-writable directory (``/tmp``) owned by neither this user nor
    the directory's owner: the kernel's ``fs.protected_symlinks`` rule, which a program that
    resolves the link itself (``realpath``, then a rename) would bypass."""
    try:
        parent = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    shared = parent.st_mode & stat.S_ISVTX and parent.st_mode & stat.S_IWOTH
    return bool(shared) and link.st_uid not in (os.geteuid(), parent.st_uid)


def output_target(path: str) -> Output:
    """How ``write_output`` will write ``path``, or ``UnwritableOutput`` saying why it cannot.

    - nothing there, or a regular file: written atomically (``write_atomic``);
    - a symbolic link to a regular file: its target is written atomically, the link kept
      (a link planted in a shared sticky directory by another user is refused, as the kernel
      refuses to follow it);
    - a character device (``/dev/null``, a terminal), a named pipe (FIFO), or this process's
      own standard output or error however reached (``/dev/stdout``, ``/proc/self/fd/1``):
      written in place, streamed, never replaced;
    - a directory, a block device, a socket, a dangling or looping link: refused.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise UnwritableOutput(f"directory {parent!r} does not exist") from None
        return Output(path, path, stream=False, kind="a new file")
    except OSError as exc:
        raise UnwritableOutput(f"cannot be looked at ({exc.strerror or exc})") from None
    via = ""
    if stat.S_ISLNK(st.st_mode):
        followed = _through_link(path, st)
        if isinstance(followed, Output):
            return followed
        st, via = followed
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return Output(path, path, stream=False)
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return Output(path, path, stream=True, fd=_std_fd(st), kind=kind_of(mode) + via)
    if stat.S_ISBLK(mode):
        why = "a report written there would overwrite what it holds"
    elif stat.S_ISSOCK(mode):
        why = "a socket cannot be opened as a file"
    else:
        why = "a file cannot be written in its place"
    raise UnwritableOutput(f"is {kind_of(mode)}{via}: {why}; nothing was written")


def _through_link(path: str, link: os.stat_result) -> Output | tuple[os.stat_result, str]:
    """``output_target`` of a symbolic link: the ``Output`` where its target settles it (this
    process's stdout or stderr, a regular file), else the target's status for the caller to
    judge and the words that say it came through the link."""
    try:
        to = os.readlink(path)
    except OSError:
        to = "?"
    try:
        target = os.stat(path)
    except FileNotFoundError:
        raise UnwritableOutput(
            f"a symbolic link to {to!r}, which does not exist (a dangling link is not "
            "followed: no file is created where it points)"
        ) from None
    except OSError as exc:
        raise UnwritableOutput(
            f"a symbolic link to {to!r} that cannot be followed ({exc.strerror or exc})"
        ) from None
    if _planted(path, link):
        raise UnwritableOutput(
            f"a symbolic link to {to!r} in a shared sticky directory, owned by another "
            "user (not followed, as the kernel's protected_symlinks would not)"
        )
    via = f" (through the symbolic link to {to!r})"
    fd = _std_fd(target)
    if fd is not None:
        return Output(path, path, stream=True, fd=fd, kind=kind_of(target.st_mode) + via)
    if not stat.S_ISREG(target.st_mode):
        return target, via
    real = os.path.realpath(path)
    try:
        same = os.lstat(real)
    except OSError:
        same = None
    if same is not None and (same.st_dev, same.st_ino) == (target.st_dev, target.st_ino):
        return Output(path, real, stream=False, kind="a regular file" + via)
    # a /proc link to an open file (/dev/fd/N): its name cannot be renamed over
    return Output(path, path, stream=True, kind="a regular file" + via)


def write_output(
    out: Output,
    write: Callable[[BinaryIO], None],
    *,
    waiting: Callable[[Output], None] | None = None,
) -> Output:
    """Write a command's output as ``out = output_target(path)`` says (``OSError`` when
    writing fails). A FIFO that nobody reads yet is waited for, as a shell's ``>`` waits;
    ``waiting(out)`` is told first."""
    if not out.stream:
        write_atomic(out.target, write)
        return out
    if out.fd is not None:
        for stream in (sys.stdout, sys.stderr):  # what was printed comes first
            try:
                if stream is not None and stream.fileno() == out.fd:
                    stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        fd = os.dup(out.fd)
    else:
        fd = _open_in_place(out, waiting)
    with os.fdopen(fd, "wb") as f:
        write(f)
    return out


def _open_in_place(out: Output, waiting: Callable[[Output], None] | None) -> int:
    """The device or FIFO opened for writing: never created, truncated or replaced."""
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(out.target, flags | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: a FIFO with no reader yet
            raise
        if waiting is not None:
            waiting(out)
        fd = os.open(out.target, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
            raise UnwritableOutput(f"is {kind_of(mode)} now: nothing was written")
        os.set_blocking(fd, True)
        if stat.S_ISREG(mode):  # a /proc link to an open file: written like a shell's ">"
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd
