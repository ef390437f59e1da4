"""The one way torch-profiled warns: never raises into the program, points at its code.

``warnings.warn`` raises when the program runs with warnings as errors (``python -W error``,
``filterwarnings("error")`` in a test suite), and telemetry must never raise into the program
it observes: a window that could not be exported must not replace the user's own exception.
So every SDK warning goes through ``warn``:

- it is issued with ``warnings`` (filters, ``-W ignore::...``, ``logging.captureWarnings``
  and ``pytest.warns`` all see it), attributed to the first frame outside torch-profiled's
  packages (the line of the program that led there), or, on the SDK's own threads where no
  such frame exists (an export lane), to the SDK's line that warned, with its module's name
  (``exporters.json_lines``: a filter's ``module`` can name it). It once said
  ``torch-profiled:0:``, a file that does not exist; the message itself names what to change
  (the variable, the path and why);
- where the filters turn it into an exception (or a custom ``showwarning`` raises), it is
  written to standard error as one ``torch-profiled:`` line instead, once per message.

``PROFILED_STRICT=1`` stays the one way to get an exception from a bad setting: that is a
``ValueError`` raised on purpose, not a warning. Lives in ``exporters`` (the lower layer,
no torch) so both packages share it.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from types import FrameType

__all__ = ["warn"]

_HERE = os.path.dirname(os.path.abspath(__file__))  # instrument/base
_SDK_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(_HERE)), pkg) + os.sep
    for pkg in ("exporters", "instrument")
)
# the machinery between an SDK thread's target and its start: never the program's code
_STDLIB = os.path.dirname(os.path.abspath(threading.__file__)) + os.sep
_PLUMBING = tuple(
    _STDLIB + name
    for name in ("threading.py", "concurrent" + os.sep, "asyncio" + os.sep, "contextlib.py")
)

_shown_plain: set[str] = set()
_MAX_SHOWN = 1024  # distinct fallback lines remembered (bounded whatever the messages)


def _skipped(filename: str) -> bool:
    return filename.startswith(_SDK_DIRS) or filename.startswith(_PLUMBING)


def warn(message: str, category: type[Warning]) -> None:
    """Issue ``message`` as a ``category`` warning that never raises (see the module)."""
    try:
        frame: FrameType | None = sys._getframe(1)
        level = 2  # warnings.warn's stacklevel for warn()'s caller
        while frame is not None and _skipped(os.path.abspath(frame.f_code.co_filename)):
            frame = frame.f_back
            level += 1
        if frame is not None:
            warnings.warn(message, category, stacklevel=level)
        else:  # an SDK thread: nothing of the program's on the stack; the SDK's line that warned
            caller = sys._getframe(1)
            where = caller.f_globals
            warnings.warn_explicit(
                message,
                category,
                caller.f_code.co_filename,
                caller.f_lineno,
                module=where.get("__name__", "torch_profiled"),
                registry=where.setdefault("__warningregistry__", {}),
                module_globals=where,
            )
    except Exception:  # noqa: BLE001 - warnings as errors, or a showwarning that raises
        _plain(message, category)


def _plain(message: str, category: type[Warning]) -> None:
    if message in _shown_plain:
        return
    if len(_shown_plain) < _MAX_SHOWN:
        _shown_plain.add(message)
    try:
        sys.stderr.write(f"torch-profiled: {category.__name__}: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - no stderr (closed, a daemon): nothing left to tell
        pass
