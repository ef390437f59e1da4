"""On-demand windows: a signal or a file asks the session to open a window at the next step.

Signals. ``PROFILED_TRIGGER=SIGUSR2`` (or ``SIGUSR1``) puts our handler on the signal when
``instrument`` is imported (``install_from_env``), from the main thread (Python only installs
handlers there), also with ``PROFILED_ENABLED=0``: a runbook that says "send SIGUSR2 to profile
the job" must never kill a job, and the signal's default action (terminate) would, whenever it
arrived before the first decorated call (a job still loading a checkpoint), with profiling
off, or after ``shutdown()``. One handler per signal, kept for the process's life:

- a session arms the trigger by giving the handler its callback (no handler of its own), and
  disarms it by taking the callback back (from any thread); while an explicit session and
  the ambient one both have theirs, both are called (the ambient one opens its window when
  it resumes);
- with no callback the handler is idle: before a session arms it, a request is remembered
  and the session opens its window at its first step; where no window can come of it
  (profiling off, ended, or the session watches something else) it says so once and the
  signal is ignored;
- a Python handler that was there before is chained (it runs after ours, always);
- a handler that C code installed (``faulthandler.register``, a native library), which
  ``signal.getsignal`` cannot see (it reports SIG_DFL), is never replaced: Python could
  neither chain nor put it back. The trigger compares the handler the system holds
  (``sigaction``) with Python's view; where C code holds the signal it warns (where that
  handler lives, what to do) and leaves the signal alone.

Only ``TRIGGER_SIGNALS`` (SIGUSR1, SIGUSR2) may be used: every other signal already means
something to the program, its terminal, its launcher or the kernel (SIGTERM and SIGINT stop
it, SIGSEGV/SIGBUS/SIGFPE/SIGILL/SIGABRT report a crash, SIGCHLD/SIGPIPE/SIGHUP/SIGQUIT/
SIGWINCH/SIGURG have their own jobs), and a trigger that took one over would change what
happens when it arrives.

Files. ``PROFILED_TRIGGER=/path/to/file`` polls the path from a daemon thread every
``POLL_S`` seconds. A request is an *empty regular file owned by the program's effective
user that was not at the path when the trigger was armed* (``touch PATH``), taken by removing
it (``unlink``, which never follows a link); the first process to remove it takes the request,
so one file opens one window even when several processes watch the same path. Nothing else is
ever opened, followed or removed: what was at the path when the trigger was armed (a file of
the program's, a leftover request of an earlier run; it is told apart by device, inode, type
and owner until the path is seen free of it), a file with content, a directory, a symlink, a
FIFO, a socket, a file of another user (in a shared sticky directory such as /tmp another user
can put one there, and it must neither fire windows nor turn the trigger off). The trigger
warns once, keeps polling, and fires as soon as the path holds a request.

The callback must be cheap and lock-free: it runs inside a signal handler or the poll thread.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from instrument.base.warn import warn

__all__ = [
    "POLL_S",
    "TRIGGER_SIGNALS",
    "Trigger",
    "arm",
    "arm_to_drop",
    "held_by_c_code",
    "install_from_env",
    "signal_name",
]

POLL_S = 0.1

TRIGGER_SIGNALS: tuple[str, ...] = ("SIGUSR2", "SIGUSR1")
"""The signals a trigger may take (see the module docstring for why no other)."""

ENV = "PROFILED_TRIGGER"


class Trigger:
    """An armed trigger; ``disarm()`` ends what it asks of the session (a signal's handler
    stays, idle: see the module docstring)."""

    description = ""

    def disarm(self) -> None:  # pragma: no cover - overridden
        pass


def signal_name(text: str) -> str | None:
    """``SIGUSR2`` for ``SIGUSR2``/``usr2``/`` USR2 ``: the trigger signal ``text`` names,
    or None (a path, an empty value, or a signal a trigger may not take)."""
    text = text.strip()
    if not text or os.sep in text or "/" in text or "." in text or "\0" in text:
        return None
    name = text.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    if name in TRIGGER_SIGNALS and isinstance(getattr(signal, name, None), signal.Signals):
        return name
    return None


# ---------------------------------------------------------------- signals


def _never_idle(name: str) -> str | None:
    return None


_why_idle: Callable[[str], str | None] = _never_idle
"""Why a signal that arrives while no session has armed the trigger opens no window (None:
it is remembered for the next session that arms it); given by ``install_from_env``."""

_said: set[str] = set()  # the messages about trigger signals already given (once each)


class _Slot:
    """Our handler on one signal, for the process's life once installed."""

    __slots__ = ("callbacks", "handler", "name", "pending", "signum")

    def __init__(self, signum: signal.Signals) -> None:
        self.signum = signum
        self.name = signum.name
        self.handler: Callable[[int, Any], None] | None = None  # ours, as last installed
        self.callbacks: tuple[Callable[[], None], ...] = ()  # the armed sessions' (replaced
        # whole, never changed in place: the handler may run between any two bytecodes)
        self.pending = False  # a request that came before any session armed the trigger

    def deliver(self) -> None:
        """The signal came: the armed sessions' callbacks, else the idle behaviour. Never
        raises (it runs between any two bytecodes of the program's main thread)."""
        try:
            callbacks = self.callbacks
            if callbacks:
                for callback in callbacks:
                    callback()
                return
            why = _why_idle(self.name)
            if why is None:
                self.pending = True  # the session opens its window at its first step
                return
            _say_once(
                f"the trigger signal {self.name} arrived while {why}: it opens no window "
                "and is ignored; the program goes on"
            )
        except Exception:  # noqa: BLE001 - a signal handler must not raise into the program
            pass


_slots: dict[int, _Slot] = {}
_arming = threading.Lock()  # sessions arm and disarm from any thread (never the handler)


def _handler_for(slot: _Slot, previous: Any) -> Callable[[int, Any], None]:
    """A handler that delivers to ``slot`` while it is the one installed there, then runs
    ``previous`` (a program's Python handler found when it was installed; SIG_DFL, SIG_IGN
    are not called). A program handler that chains to an older one of ours (it saved it)
    reaches one that no longer delivers: one signal, one delivery."""

    def handler(signum: int, frame: Any) -> None:
        if slot.handler is handler:
            slot.deliver()
        if callable(previous):
            previous(signum, frame)

    return handler


def _take(signum: signal.Signals, outside_main: str) -> _Slot | None:
    """Our handler on ``signum``, installed here where it is not there yet; None (warned
    once) where it cannot be: outside the main thread (``outside_main`` says what then), or
    where C code holds the signal."""
    slot = _slots.get(signum)
    current = signal.getsignal(signum)
    if slot is not None and slot.handler is not None and current is slot.handler:
        c_handler = _c_handler(signum, current)  # put over ours since (faulthandler.register)
        if c_handler is not None:
            _refuse(slot.name, c_handler)
            return None
        return slot
    if threading.current_thread() is not threading.main_thread():
        _say_once(
            f"{ENV}={signum.name}: {outside_main}, where Python cannot install signal "
            f"handlers; until the trigger is armed from the main thread, {signum.name} keeps "
            "the action it had (by default it ends the process)"
        )
        return None
    c_handler = _c_handler(signum, current)
    if c_handler is not None:
        _refuse(signum.name, c_handler)
        return None
    if slot is None:
        slot = _slots[signum] = _Slot(signum)
    handler = _handler_for(slot, current)
    signal.signal(signum, handler)
    slot.handler = handler
    return slot


class _SignalTrigger(Trigger):
    def __init__(self, slot: _Slot, callback: Callable[[], None]) -> None:
        self.signum = slot.signum
        self.description = slot.name
        self._slot = slot
        self._callback = callback
        with _arming:
            slot.callbacks = (*slot.callbacks, callback)
        if slot.pending:  # it came before any session armed the trigger: this one takes it
            slot.pending = False
            callback()

    def disarm(self) -> None:
        """From any thread: the handler stays, idle (a later signal never ends the process)."""
        slot = self._slot
        with _arming:
            slot.callbacks = tuple(c for c in slot.callbacks if c is not self._callback)


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        warn(message, UserWarning)


def _refuse(name: str, address: int) -> None:
    _say_once(
        f"{ENV}={name}: {name} already has a handler installed by C code "
        f"({_describe(address)}; faulthandler.register() or a native library), which Python "
        "cannot see, chain or put back: the trigger leaves it in place and is off. Use "
        f"{' or '.join(n for n in TRIGGER_SIGNALS if n != name)} or a file path for "
        f"{ENV}, or register that handler on another signal"
    )


def _after_fork_in_child() -> None:
    """A forked child's copy of the parent's session is not its own: idle, nothing pending."""
    global _arming
    _arming = threading.Lock()  # another thread may have held it as the parent forked
    for slot in _slots.values():
        slot.callbacks = ()
        slot.pending = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ------------------------------------------------ the handler the system holds (sigaction)

_trampoline: int | None = None
"""The address of Python's own C-level handler (``_python_handler_address``)."""
_libc: Any = None  # ctypes' handle, False where sigaction cannot be asked
_SIGACTION_SIZE = 512  # larger than any libc's struct sigaction (glibc x86-64: 152 bytes)


def _sigaction() -> Any:
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith(("linux", "darwin")):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
                libc.sigaction.restype = ctypes.c_int
                _libc = libc
            except (ImportError, OSError, AttributeError):
                pass
    return _libc or None


def _system_handler(signum: int) -> int | None:
    """The address of the handler the system holds for ``signum`` (0: SIG_DFL, 1: SIG_IGN),
    or None where it cannot be asked. It is ``struct sigaction``'s first member on Linux
    (glibc, musl) and macOS."""
    libc = _sigaction()
    if libc is None:
        return None
    import ctypes

    buf = ctypes.create_string_buffer(_SIGACTION_SIZE)
    if libc.sigaction(int(signum), None, buf) != 0:
        return None
    return ctypes.c_void_p.from_buffer(buf).value or 0


def _python_handler_address() -> int | None:
    """The address of Python's own C-level handler: what the system holds for a signal with a
    Python handler. Learnt once, from the main thread, by putting a do-nothing Python handler
    on SIGURG for a moment (its default action is to ignore it: nothing changes meanwhile) where
    nobody has one there; None where it cannot be learnt (then Python's view is trusted)."""
    global _trampoline
    if _trampoline is not None or threading.current_thread() is not threading.main_thread():
        return _trampoline
    probe = getattr(signal, "SIGURG", None)
    if probe is None or signal.getsignal(probe) != signal.SIG_DFL:
        return None
    if _system_handler(probe) != 0:
        return None
    try:
        signal.signal(probe, _ignore)
        now = _system_handler(probe)
    finally:
        signal.signal(probe, signal.SIG_DFL)
    if now is not None and now not in (0, 1):
        _trampoline = now
    return _trampoline


def _ignore(signum: int, frame: Any) -> None:
    pass


def _c_handler(signum: int, python_view: Any) -> int | None:
    """The address of a handler that C code installed on ``signum`` behind Python's back, or
    None (Python's view holds, or it cannot be checked)."""
    address = _system_handler(signum)
    if address is None:
        return None
    if python_view is None:  # Python found a handler it did not install (at its start)
        return address if address not in (0, 1) else None
    if python_view == signal.SIG_DFL:
        return address if address != 0 else None
    if python_view == signal.SIG_IGN:
        return address if address != 1 else None
    ours = _python_handler_address()
    return address if ours is not None and address != ours else None


def held_by_c_code(signum: int) -> bool:
    """True when C code (``faulthandler.register``, a native library) has put its handler on
    ``signum`` over what ``signal.getsignal`` reports: replacing it there with
    ``signal.signal`` would drop that handler for good (``_atomic`` must leave it alone)."""
    try:
        return _c_handler(signum, signal.getsignal(signum)) is not None
    except (OSError, ValueError):
        return False


def _describe(address: int) -> str:
    """Where a C handler lives: its address and library (``dladdr``), as far as known."""
    where = f"at {address:#x}"
    try:
        import ctypes

        class _DlInfo(ctypes.Structure):
            _fields_ = [
                ("fname", ctypes.c_char_p),
                ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p),
            ]

        info = _DlInfo()
        libc = ctypes.CDLL(None)
        libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        if libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) and info.fname:
            where += f" in {os.path.basename(os.fsdecode(info.fname))}"
            if info.sname and info.saddr == address:
                where += f" ({os.fsdecode(info.sname)})"
    except Exception:  # noqa: BLE001 - only a description
        pass
    return where


# ---------------------------------------------------------------- files


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells one thing at the path from another: device, inode, type, owner."""
    return (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode), st.st_uid)


class _FileTrigger(Trigger):
    def __init__(self, path: str, callback: Callable[[], None]) -> None:
        self.path = os.path.abspath(path)
        self.description = self.path
        self._callback = callback
        self._stop = threading.Event()
        self._warned = False  # about something at the path that is not a request (once)
        self._there = self._before()  # what was at the path when armed: never taken
        self._thread = threading.Thread(
            target=self._poll, name="torch-profiled-trigger", daemon=True
        )
        self._thread.start()

    def _before(self) -> tuple[int, int, int, int] | None:
        """What is at the path now, as the trigger is armed (said once): it is not a request
        for this process (someone's file; a request left from an earlier run) and is never
        taken or removed."""
        try:
            st = os.lstat(self.path)
        except (OSError, ValueError):
            return None  # nothing there (or not to be looked at yet: the poll says so)
        what = _not_ours(st) or "is a file of this user that was there before"
        self._warned = True
        warn(
            f"{ENV} path {self.path} already holds something as the trigger is armed (it "
            f"{what}): what is at the path before the trigger is armed cannot fire the "
            "trigger and is never removed. The trigger keeps watching the path: once that is "
            f"gone, {_request()} created there opens a window",
            UserWarning,
        )
        return _identity(st)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            if self._take():
                self._callback()

    def _take(self) -> bool:
        """True when a request was taken: an empty regular file of ours, not there when the
        trigger was armed, was at the path and this process removed it. Never raises, never
        opens or follows what is there."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            self._there = None  # what was there when armed is gone
            return False
        except (OSError, ValueError) as exc:  # e.g. a parent we may not search: maybe later
            self._blocked(f"cannot be looked at ({getattr(exc, 'strerror', None) or exc})")
            return False
        if self._there is not None:
            if _identity(st) == self._there:
                return False  # still what was there before: left alone (said when armed)
            self._there = None
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
        warn(
            f"{ENV} path {self.path} holds something that cannot fire the trigger: it {why}. "
            f"Only {_request()} opens a window, and the trigger removes it; what is there is "
            "left alone and the trigger keeps watching the path (use a path in a directory "
            "only this user can write to)",
            UserWarning,
        )

    def disarm(self) -> None:
        self._stop.set()


def _euid() -> int | None:
    geteuid = getattr(os, "geteuid", None)  # not on Windows
    return geteuid() if geteuid is not None else None


def _request() -> str:
    uid = _euid()
    whose = f" owned by uid {uid} (this program's user)" if uid is not None else ""
    return f"an empty regular file{whose} (touch PATH)"


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
    if st.st_size:
        return f"is a file of {st.st_size} bytes (a request is empty: a file with content is data)"
    return ""


# ---------------------------------------------------------------- arming


def _drop() -> None:
    pass


def arm_to_drop(spec: str) -> Trigger | None:
    """For a rank that does not profile: take a signal trigger's signal and drop it, as an
    operator signalling every rank must not terminate this one (SIGUSR2's default action).
    None for a file trigger: that is for the ranks that profile."""
    return arm(spec, _drop) if _is_signal(spec) else None


def _is_signal(spec: str) -> bool:
    return spec.startswith("SIG") and os.sep not in spec and "/" not in spec and "." not in spec


def arm(spec: str, callback: Callable[[], None]) -> Trigger | None:
    """Arm ``spec`` (a ``SIG*`` name or a file path, as checked by ``config``); None (with a
    warning) when a signal trigger cannot take its signal: outside the main thread where our
    handler is not installed yet, where C code holds the signal, or a signal that is not in
    ``TRIGGER_SIGNALS`` (``config`` refuses those first)."""
    if _is_signal(spec):
        if spec not in TRIGGER_SIGNALS or not hasattr(signal.Signals, spec):
            warn(
                f"{ENV}={spec}: not a signal a trigger may take over; expected one "
                f"of {', '.join(TRIGGER_SIGNALS)}; the trigger is off",
                UserWarning,
            )
            return None
        slot = _take(
            signal.Signals[spec],
            "the profiling session started outside the main thread (use a file trigger, or "
            "make the first decorated call from the main thread)",
        )
        return _SignalTrigger(slot, callback) if slot is not None else None
    return _FileTrigger(spec, callback)


def install_from_env(environ: Mapping[str, str], why_idle: Callable[[str], str | None]) -> None:
    """At the import of ``instrument``: where ``PROFILED_TRIGGER`` names a trigger signal, put
    our (idle) handler on it now, so that the signal never ends the process, whenever it comes
    and whether or not profiling is on. ``why_idle(name)`` says why a signal that comes while
    no session has armed the trigger opens no window (None: remember it for the session).
    Never raises: a bad value is ``config``'s to report."""
    global _why_idle
    _why_idle = why_idle
    try:
        name = signal_name(environ.get(ENV, ""))
        if name is not None:
            _take(signal.Signals[name], "instrument was first imported outside the main thread")
    except Exception as exc:  # noqa: BLE001 - importing the SDK must never fail for this
        warn(f"{ENV}: the trigger's signal handler could not be installed ({exc!r})", UserWarning)
