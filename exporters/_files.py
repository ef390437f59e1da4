"""Writing a file atomically: the one helper for the SDK and its exporters. No torch imports.

A file written with ``write_atomic`` either does not exist under its name or is complete: it
is written under a hidden temporary name in the same directory (``.tmp-<16 hex>.partial``,
which no trace reader picks up, matched by ``TEMP_NAME``) and renamed over the final name
once complete; on any error the temporary file is removed and the error re-raised.

It lives in ``exporters`` (not ``instrument``) because exporters may import neither torch nor
``instrument``'s internals, while ``instrument`` may import this: the trace-file exporter
copies the window's trace with it and ``instrument.tracefile`` writes the shaped trace.
"""

from __future__ import annotations

import gzip
import os
import re
import secrets
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["TEMP_NAME", "open_temp", "write_atomic"]

TEMP_NAME = re.compile(r"\.tmp-[0-9a-f]{16}\.partial")
"""The name of a temporary file of ``open_temp`` (match it with ``fullmatch``)."""


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
    into ``f``, a binary file (gzip-compressed at level 6 with ``compress``). ``durable``
    ``fsync``s before the rename (a scratch file that dies with the process skips it: ~7 ms
    for a window's trace)."""
    fd, tmp = open_temp(os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as raw:
            if compress:
                with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as gz:
                    write(gz)  # type: ignore[arg-type]
            else:
                write(raw)
            raw.flush()
            if durable:
                os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
