"""On-demand windows: a signal or a file asks the session to open a window at the next step.

``PROFILED_TRIGGER=SIGUSR2`` installs a handler from the main thread (Python only runs signal
handlers there); a handler that was already installed keeps running after ours (it is chained,
never replaced), and the default action of the signal (for SIGUSR2: terminate) no longer
applies while the trigger is armed. ``PROFILED_TRIGGER=/path/to/file`` polls for the file from a
daemon thread every ``POLL_S`` seconds; the first process to remove it takes the request, so
one file opens one window even when several processes watch the same path.

The callback must be cheap and lock-free: it runs inside a signal handler or the poll thread.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from exporters._warn import warn

__all__ = ["POLL_S", "Trigger", "arm"]

POLL_S = 0.1


class Trigger:
    """An armed trigger; ``disarm()`` restores what was there before."""

    description = ""

    def disarm(self) -> None:  # pragma: no cover - overridden
        pass


class _SignalTrigger(Trigger):
    def __init__(self, signum: signal.Signals, callback: Callable[[], None]) -> None:
        self.signum = signum
        self.description = signum.name
        self._callback = callback
        self._previous: Any = signal.getsignal(signum)
        previous = self._previous

        def handler(sig: int, frame: Any) -> None:
            callback()
            if callable(previous):  # SIG_DFL / SIG_IGN / None are not called
                previous(sig, frame)

        self._handler = handler
        signal.signal(signum, handler)

    def disarm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal only works there; the handler stays, calling a closed session
        if signal.getsignal(self.signum) is self._handler:
            signal.signal(self.signum, self._previous if self._previous is not None
                          else signal.SIG_DFL)


class _FileTrigger(Trigger):
    def __init__(self, path: str, callback: Callable[[], None]) -> None:
        self.path = os.path.abspath(path)
        self.description = self.path
        self._callback = callback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="torch-profiled-trigger",
                                        daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            if os.path.lexists(self.path):
                try:
                    os.unlink(self.path)  # taking it: whoever removes it opens the window
                except FileNotFoundError:
                    continue  # another process took it
                except OSError as exc:
                    warn(f"PROFILED_TRIGGER file {self.path} exists but cannot be removed "
                         f"({exc}); it cannot trigger windows, the trigger is off",
                         UserWarning)
                    return
                self._callback()

    def disarm(self) -> None:
        self._stop.set()


def arm(spec: str, callback: Callable[[], None]) -> Trigger | None:
    """Arm ``spec`` (a ``SIG*`` name or a file path, as checked by ``config``); None (with a
    warning) when a signal trigger is armed outside the main thread."""
    if spec.startswith("SIG") and os.sep not in spec and "/" not in spec and "." not in spec:
        signum = signal.Signals[spec]
        if threading.current_thread() is not threading.main_thread():
            warn(f"PROFILED_TRIGGER={spec}: the profiling session started outside the main "
                 "thread, where Python cannot install signal handlers; the trigger is off "
                 "(use a file trigger, or make the first decorated call from the main thread)",
                 UserWarning)
            return None
        return _SignalTrigger(signum, callback)
    return _FileTrigger(spec, callback)
