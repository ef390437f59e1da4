"""On-demand windows: a signal or a file asks the session to open a window at the next step.

``PROFILED_TRIGGER=SIGUSR2`` installs a handler from the main thread (Python only runs signal
handlers there); a handler that was already installed keeps running after ours (it is chained,
never replaced), and the default action of the signal (for SIGUSR2: terminate) no longer
applies while the trigger is armed. Only ``TRIGGER_SIGNALS`` (SIGUSR1, SIGUSR2) may be used:
every other signal already means something to the program, its terminal, its launcher or the
kernel (SIGTERM and SIGINT stop it, SIGSEGV/SIGBUS/SIGFPE/SIGILL/SIGABRT report a crash,
SIGCHLD/SIGPIPE/SIGHUP/SIGQUIT/SIGWINCH/SIGURG have their own jobs), and a trigger that took one
over would change what happens when it arrives.

``PROFILED_TRIGGER=/path/to/file`` polls the path from a daemon thread every ``POLL_S`` seconds.
What fires: a *regular file owned by the program's effective user*, taken by removing it
(``unlink``, which never follows a link); the first process to remove it takes the request, so
one file opens one window even when several processes watch the same path. Anything else at the
path (a directory, a symlink, a FIFO, a socket, a file of another user, a file that cannot be
removed) is never opened, followed or removed: in a shared sticky directory such as /tmp another
user can put one there, and it must neither fire windows nor turn the trigger off. The trigger
warns once, keeps polling, and fires again as soon as the path holds a file of ours.

The callback must be cheap and lock-free: it runs inside a signal handler or the poll thread.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import threading
from collections.abc import Callable
from typing import Any

from exporters._warn import warn

__all__ = ["POLL_S", "TRIGGER_SIGNALS", "Trigger", "arm", "arm_to_drop"]

POLL_S = 0.1

TRIGGER_SIGNALS: tuple[str, ...] = ("SIGUSR2", "SIGUSR1")
"""The signals a trigger may take (see the module docstring for why no other)."""


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
            signal.signal(
                self.signum, self._previous if self._previous is not None else signal.SIG_DFL
            )


class _FileTrigger(Trigger):
    def __init__(self, path: str, callback: Callable[[], None]) -> None:
        self.path = os.path.abspath(path)
        self.description = self.path
        self._callback = callback
        self._stop = threading.Event()
        self._warned = False  # about something at the path that is not a request (once)
        self._thread = threading.Thread(
            target=self._poll, name="torch-profiled-trigger", daemon=True
        )
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            if self._take():
                self._callback()

    def _take(self) -> bool:
        """True when a request was taken: a regular file of ours was at the path and this
        process removed it. Never raises, never opens or follows what is there."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:  # e.g. a parent we may not search: maybe later
            self._blocked(f"cannot be looked at ({getattr(exc, 'strerror', None) or exc})")
            return False
        what = _not_ours(st)
        if what:
            self._blocked(what)
            return False
        try:
            os.unlink(self.path)  # taking it: whoever removes it opens the window
        except FileNotFoundError:
            return False  # another process took it
        except OSError as exc:  # not ours to remove (EPERM, EACCES, EISDIR after a swap...)
            why = (
                "is a directory"
                if exc.errno == errno.EISDIR
                else (f"cannot be removed ({exc.strerror or exc})")
            )
            self._blocked(why)
            return False
        return True

    def _blocked(self, why: str) -> None:
        """Something that is not a trigger request sits at the path: say so once, go on."""
        if self._warned:
            return
        self._warned = True
        uid = _euid()
        whose = f"a regular file owned by uid {uid}" if uid is not None else "a regular file"
        warn(
            f"PROFILED_TRIGGER path {self.path} holds something that cannot fire the trigger: "
            f"it {why}. Only {whose} (this program's user), which the trigger removes, opens "
            "a window; what is there is left alone and the trigger keeps watching the path "
            "(use a path in a directory only this user can write to)",
            UserWarning,
        )

    def disarm(self) -> None:
        self._stop.set()


def _euid() -> int | None:
    geteuid = getattr(os, "geteuid", None)  # not on Windows
    return geteuid() if geteuid is not None else None


def _not_ours(st: os.stat_result) -> str:
    """Why what ``lstat`` found cannot be a request ("" when it can)."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "is a symbolic link (never followed)"
    if stat.S_ISDIR(mode):
        return "is a directory"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a FIFO, socket or device is never opened)"
    uid = _euid()
    if uid is not None and st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by this program's user"
    return ""


def arm_to_drop(spec: str) -> Trigger | None:
    """For a rank that does not profile: take a signal trigger's signal and drop it, as an
    operator signalling every rank must not terminate this one (SIGUSR2's default action).
    None for a file trigger: that is for the ranks that profile."""
    return arm(spec, lambda: None) if _is_signal(spec) else None


def _is_signal(spec: str) -> bool:
    return spec.startswith("SIG") and os.sep not in spec and "/" not in spec and "." not in spec


def arm(spec: str, callback: Callable[[], None]) -> Trigger | None:
    """Arm ``spec`` (a ``SIG*`` name or a file path, as checked by ``config``); None (with a
    warning) when a signal trigger is armed outside the main thread, or names a signal that
    is not in ``TRIGGER_SIGNALS`` (``config`` refuses those first)."""
    if _is_signal(spec):
        if spec not in TRIGGER_SIGNALS or not hasattr(signal.Signals, spec):
            warn(
                f"PROFILED_TRIGGER={spec}: not a signal a trigger may take over; expected one "
                f"of {', '.join(TRIGGER_SIGNALS)}; the trigger is off",
                UserWarning,
            )
            return None
        signum = signal.Signals[spec]
        if threading.current_thread() is not threading.main_thread():
            warn(
                f"PROFILED_TRIGGER={spec}: the profiling session started outside the main "
                "thread, where Python cannot install signal handlers; the trigger is off "
                "(use a file trigger, or make the first decorated call from the main thread)",
                UserWarning,
            )
            return None
        return _SignalTrigger(signum, callback)
    return _FileTrigger(spec, callback)
