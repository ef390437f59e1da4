"""Every process-wide mutable thing of the SDK, in one place, behind one lock.

- the sessions: ``ambient`` (built from the environment and ``configure()`` overrides),
  ``explicit`` (an open ``with session(...)``) and ``current`` (what decorated calls report to);
  ``shut_down`` after ``shutdown()``;
- ``overrides``: the fields given to ``configure()``;
- ``PENDING``: the sessions' stops (``stops.Stops``) whose window's stop waits for the thread
  that started it;
- ``cpu_ops``: the threads a deferred stop paused (torch's per-thread RecordFunction switch);
- ``steps_declared`` and ``RANGE_NAMES``: what decorations applied so far declared;
- ``metrics_on``: decorated calls time themselves into ``metrics.recorder``;
- the call mode (``mode``: ``IDLE``, ``COUNT_ONLY``, ``RANGE`` or ``SESSION``), computed here
  whenever what it depends on changes (the idle flag, the first-call hook, metrics, any
  profiler's start or stop), with what the slow path needs (the session calls report to,
  the first-call hook, the metrics recorder or None): the decorator keeps them as module
  globals for speed, and only this module writes them (``refresh_idle``,
  ``set_first_call_hook``, ``set_metrics``), through the writer the decorator registers.

``reset()`` puts it all back as a new process has it (for tests); ``_after_fork_in_child`` as a
forked child must have it. This module imports nothing of the SDK's upper layers: the session
module registers what decorated calls need from it (``bind``).
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from instrument.base.warn import warn

from ..analysis.events import gc_paused
from . import _torch, metrics


class Session(Protocol):
    """What this module and the decorator need of a session (``profiling_session.Session``
    is the one kind there is): named by this protocol, not imported, as that module imports
    this one and the runtime keeps no import cycle, not even for types. ``lifetime``, which
    makes the sessions, reads them back as its ``Session`` (``lifetime._session``)."""

    finished: bool
    closed: bool
    _started: bool

    def _declare_steps(self) -> None: ...
    def _step_function_returned(self) -> None: ...


class Stops(Protocol):
    """A session's stops waiting for the thread that owns their window (``stops.Stops``)."""

    def pending_is_here(self) -> bool: ...
    def run_pending_here(self) -> None: ...


Hook = Callable[[], None]
"""The first-call hook: run by the next decorated call (see ``window.Windows.first_call``)."""

__all__ = ["RANGE_NAMES", "cpu_ops", "refresh_idle", "reset"]

lock = threading.RLock()
mirror_lock = threading.Lock()
"""Held while the decorator's hot-path flags are written (its ``_mirror`` and the listener of
profiler starts and stops): a leaf, nothing else is taken under it; a forked child gets a new
one before anything writes them."""
ambient: Session | None = None
explicit: Session | None = None
current: Session | None = None  # explicit or ambient: what decorated calls report to
shut_down = False
overrides: dict[str, Any] = {}
PENDING: list[Stops] = []
"""The sessions' stops whose window's stop waits for the thread that started it."""
atexit_registered = False
exporter_warnings_seen: set[str] = set()
helper_warned = False

steps_declared = False
"""A ``step=True`` function, block or module exists in this process (set when it is applied):
from then on only those (and ``step()``) end steps, never a root call. Else the first ``data``
block of a loop, a root call, would end step 0 before the step function first returned."""

RANGE_NAMES: set[str] = set()
"""Every range name a decoration created; the analysis tells user ranges from operators by
it. Decorations outlive sessions, so ``reset()`` keeps it. Windows read it through
``window_names``, never copied whole at each window."""

WINDOW_NAMES_MAX = 10_000
"""The most range names a window's analysis is given (``window_names``)."""
_window_names: tuple[int, frozenset[str]] = (0, frozenset())
_window_names_told = False


def window_names() -> frozenset[str]:
    """The range names a window's analysis tells ranges from operators by: ``RANGE_NAMES`` as
    of the last change, copied only when names were added since (never at every window: 100k
    run-time names copied at each window took a step's p99 from 4.4 to 270 ms), and at most
    ``WINDOW_NAMES_MAX`` of them (past it a new name's ranges are analysed as operators in
    window reports, told once): a window's work stays bounded whatever the names ever seen."""
    global _window_names, _window_names_told
    seen, names = _window_names
    size = len(RANGE_NAMES)
    if size == seen:
        return names
    if len(names) < WINDOW_NAMES_MAX:
        try:  # in C under the GIL: no name is added meanwhile
            names = frozenset(itertools.islice(RANGE_NAMES, WINDOW_NAMES_MAX))
        except RuntimeError:  # (it changed size all the same): the last copy will do
            return names
    _window_names = (size, names)
    if size > WINDOW_NAMES_MAX and not _window_names_told:
        _window_names_told = True
        warn(
            f"torch-profiled: more than {WINDOW_NAMES_MAX} distinct range names were made; "
            f"window reports tell the first {WINDOW_NAMES_MAX} from operators, the ranges of "
            "later names show as operators there (their metrics are counted as "
            "PROFILED_METRICS_MAX_RANGES says); give ranges fixed names",
            UserWarning,
        )
    return names


OWN_SWITCHES: collections.deque[tuple[float, float, int]] = collections.deque(maxlen=32)
"""The SDK's own profiler starts and stops, the last few: (began, took: seconds on
``time.perf_counter``, the metrics' clock; the thread that did it). A decorated call during
which a profiler started or stopped (``_torch.switches`` moved) takes the time of the SDK's
own on its thread out of its duration in the metrics (``own_switch_s``): a window's start or
stop is the SDK's cost, not the program's latency (the p99 of a 1 ms step read 10.7 ms at
``PROFILED_EVERY=100``). Only such calls read it: the others pay nothing."""


@contextmanager
def own_switch() -> Iterator[None]:
    """Around the SDK's own start or stop of a profiler (see ``OWN_SWITCHES``)."""
    began = time.perf_counter()
    try:
        yield
    finally:
        OWN_SWITCHES.append((began, time.perf_counter() - began, threading.get_ident()))


def own_switch_s(since: float) -> float:
    """Seconds the SDK spent starting and stopping profilers on this thread since ``since``
    (``time.perf_counter``)."""
    me = threading.get_ident()
    return sum(took for began, took, ident in list(OWN_SWITCHES) if ident == me and began >= since)


# ---------------------------------------------------------------- bindings


def _no_session() -> None:
    return None


session_for_calls: Callable[[], Session | None] = _no_session
"""The session a decorated call reports to (building the ambient one on first use), or None:
bound by ``instrument.runtime.profiling_session`` at import."""
enter_explicit: Callable[[Session], None] = lambda session: None  # noqa: E731
exit_explicit: Callable[[Session], None] = lambda session: None  # noqa: E731
"""``with session(...)``'s entry and exit: bound by ``instrument.runtime.lifetime`` at import."""
Mirror = Callable[["int | None", "Session | None", "Hook | None", "metrics.Recorder | None"], None]
_mirror: Mirror = lambda mode, session, hook, recorder: None  # noqa: E731
metrics_on = False
metrics_modules = False  # instrument_module's ranges are counted too
_idle = False
_session: Session | None = None
_hook: Hook | None = None


# ---------------------------------------------------------------- the call mode

IDLE = None
"""Nothing needs a decorated call: no session counts steps, metrics are off, no first-call
hook waits and no torch profiler records (every start and stop is seen: ``_torch.SWITCHES_SEEN``).
The call is the function's. None: the wrapper's first check is one jump on None (an int's
truth test cost the idle call ~5 ns, 4% of it, on the 2-core VM)."""
RANGE = 1
"""No session, metrics or hook needs the call, but a torch profiler may record (the program's
own, or one whose starts this process cannot see): the call is a range if one records."""
COUNT_ONLY = 2
"""Metrics are on and nothing else needs the call (no session, no first-call hook, no
device-time sampling, no profiler recording): the call times itself into its histogram."""
SESSION = 3
"""Anything else (a session counts steps, a first-call hook waits, metrics need more than a
duration): the slow path, one for every call form (``decorator._call`` around a call,
``decorator.Entry`` for the forms that open and close). In any other mode no session needs
the call. The modes are compared by identity (``mode is RANGE``)."""
Mode = int | None
mode: Mode = IDLE
"""What a decorated call does now (one of the four above): written with the
decorator's copy under ``mirror_lock`` (``_apply``); the hot path reads only that copy."""


def _call_mode(idle_now: bool, hook: Hook | None, recorder: metrics.Recorder | None) -> Mode:
    if hook is not None or not idle_now:
        return SESSION
    unseen_or_on = not _torch.SWITCHES_SEEN or _torch.profiler_on()
    if recorder is None:
        return RANGE if unseen_or_on else IDLE
    if recorder.device is None and not unseen_or_on:
        return COUNT_ONLY
    return SESSION


def _apply() -> None:
    """Under ``mirror_lock``: the mode from what it depends on, into the decorator's copy."""
    global mode
    recorder = metrics.recorder if metrics_on else None
    mode = _call_mode(_idle, _hook, recorder)
    _mirror(mode, _session, _hook, recorder)


def _profiler_switched() -> None:
    """After every start and stop of any torch profiler (``_torch.on_switch``): the mode
    depends on whether one records."""
    with mirror_lock:
        _apply()


_torch.on_switch(_profiler_switched)


def bind(
    *,
    calls: Callable[[], Session | None] | None = None,
    explicit: tuple[Callable[[Session], None], Callable[[Session], None]] | None = None,
    mirror: Mirror | None = None,
) -> None:
    """What the upper layers give: ``calls``, the lifetime module's ``session_for_calls``;
    ``explicit``, its (enter, exit) of a ``with session(...)`` block; ``mirror``, the
    decorator's writer of its hot-path globals (idle, session, first-call hook, recorder)."""
    global session_for_calls, enter_explicit, exit_explicit, _mirror
    if calls is not None:
        session_for_calls = calls
    if explicit is not None:
        enter_explicit, exit_explicit = explicit
    if mirror is not None:
        _mirror = mirror
        _write(_idle, _session, _hook)


writes = 0
"""How many times the decorator's hot-path flags were written (``_write``): a test counts
that a decorated call in a steady state writes none (``tests/test_call_forms.py``)."""


def _write(idle: bool, session: Session | None, hook: Hook | None) -> None:
    global _idle, _session, _hook, writes
    with mirror_lock:
        writes += 1
        _idle, _session, _hook = idle, session, hook
        _apply()


def set_metrics(on: bool, modules: bool = False, device_every: int = 0) -> None:
    """Decorated calls time themselves into ``metrics.recorder`` (``on``) or stop doing so;
    ``modules``: ``instrument_module``'s ranges too; ``device_every``: one call in that many
    per range also gets its device time (CUDA events; 0: none)."""
    global metrics_on, metrics_modules
    metrics_on, metrics_modules = on, on and modules
    metrics.sample_device(device_every if on else 0)
    _write(_idle, _session, _hook)


def set_first_call_hook(hook: Hook | None) -> None:
    """Called at the next decorated call (``None`` clears it): see ``window.Windows.first_call``."""
    _write(_idle, _session, hook)


def first_call_hook() -> Hook | None:
    return _hook


def idle() -> bool:
    return _idle


def declare_steps() -> None:
    """A ``step=True`` decoration was applied: root calls end no step in any session."""
    global steps_declared
    steps_declared = True
    for sess in (ambient, explicit):
        if sess is not None:
            sess._declare_steps()


# ---------------------------------------------------------------- the CPU-op pause


class _PausedThread:
    """Kept in the paused thread's thread-local storage: if the thread ends still paused, its
    storage goes and this drops it from the paused set (nothing could resume it, and decorated
    calls stay awake while the set is not empty)."""

    __slots__ = ("ident", "owner")

    def __init__(self, ident: int, owner: CpuOps) -> None:
        self.ident = ident
        self.owner = owner

    def __del__(self) -> None:
        self.owner.paused.discard(self.ident)


class CpuOps:
    """The threads whose CPU operators a deferred stop paused (torch's RecordFunction off on
    that thread). One resume protocol: a paused thread records again the next time it enters
    the SDK (a step, a decorated call, a session's start, ``flush()``/``shutdown()``), unless
    the drain that paused it still runs; a thread that ends paused leaves the set by itself;
    a forked child starts with none."""

    def __init__(self) -> None:
        self.paused: set[int] = set()
        self._token = threading.local()

    def __bool__(self) -> bool:
        return bool(self.paused)

    def pause(self) -> bool:
        """Stop recording CPU operators on the calling thread; False where this torch has no
        such switch."""
        switch = getattr(torch.autograd, "_enable_record_function", None)
        if switch is None:  # pragma: no cover - not in the torch versions we support
            return False
        ident = threading.get_ident()
        self._token.token = _PausedThread(ident, self)  # first: replacing one discards ident
        self.paused.add(ident)  # listed before it is off: never off unlisted
        switch(False)
        return True

    def resume_here(self) -> None:
        """Record CPU operators again on the calling thread if ``pause`` stopped them."""
        if self.paused:
            ident = threading.get_ident()
            if ident in self.paused:
                torch.autograd._enable_record_function(True)
                self.paused.discard(ident)
                self._token.token = None

    def forget_all(self) -> None:
        """A forked child: the calling thread records again; the other threads are gone."""
        self.resume_here()
        self.paused.clear()


cpu_ops = CpuOps()


# ---------------------------------------------------------------- derived flags


def _seen() -> tuple[Any, ...]:
    cur = current
    waiting = bool(cpu_ops) or bool(PENDING)
    if cur is None:
        return (None, shut_down, waiting)
    return (cur, shut_down, waiting, cur.finished, cur.closed, cur._started)


def refresh_idle() -> None:
    """Decorated calls may skip all bookkeeping when no session needs to see them.

    Lock-free (it runs under sessions' locks, which ``lock`` holders also take), so it checks
    that what it read still holds after writing: a ``configure()``, ``shutdown()`` or session
    change on another thread in between would otherwise be overwritten by a stale flag (idle
    calls then never make the new ambient session).

    Flags that already say what they should are not written again: decorated calls that are
    not idle (metrics on, a finished session) come here through ``resume_idle_thread`` at
    every call of the forms that ask for their session (the context form, async functions,
    generators, module hooks); a write per call took ``mirror_lock`` every time."""
    while True:
        seen = _seen()
        cur = seen[0]
        if seen[2] and (cur is None or cur.finished or cur.closed):
            # a thread a deferred stop paused must still reach session_for_calls to resume,
            # and the thread a window's stop waits for (``PENDING``) to stop it: a session
            # that closed (the exit) while another thread's window recorded
            idle_now, sess = False, None
        elif cur is None:
            idle_now, sess = seen[1], None
        else:
            idle_now = cur.finished or cur.closed
            sess = None if idle_now or not cur._started else cur
        if idle_now is not _idle or sess is not _session:
            _write(idle_now, sess, _hook)
        if _seen() == seen:
            return


def run_pending_stops() -> None:
    """Stop the windows that wait for this thread (or whose thread has ended)."""
    for stops in list(PENDING):
        if stops.pending_is_here():  # checked before any lock: calls stay cheap
            stops.run_pending_here()


def resume_idle_thread() -> None:
    """No session wants this call: resume the thread if a deferred stop paused it, and let
    decorated calls go idle again once no thread is left paused (``refresh_idle`` kept them
    awake for it). Rare: idle calls do not get here."""
    cpu_ops.resume_here()
    if PENDING:
        run_pending_stops()
    if not cpu_ops and not PENDING:
        refresh_idle()


def take_sessions() -> list[Session]:
    """Under ``lock``: forget every session (they are the caller's to close) and shut down."""
    global ambient, explicit, current, shut_down
    sessions = [s for s in (explicit, ambient) if s is not None]
    shut_down = True
    ambient = explicit = current = None
    refresh_idle()
    return sessions


def reset() -> None:
    """After the sessions were closed: as a new process has it, except ``RANGE_NAMES``; and
    ``steps_declared`` is cleared (the step=True functions of the modules imported so far
    would make every test's root calls end no step: a test that wants them decorates its own)."""
    global shut_down, steps_declared
    if PENDING:  # stops waiting for this thread, or for one that has ended
        run_pending_stops()
    _torch.end_orphaned_profiler()
    cpu_ops.resume_here()
    steps_declared = False
    OWN_SWITCHES.clear()
    exporter_warnings_seen.clear()
    metrics.reset()
    set_metrics(False)
    with lock:
        overrides.clear()
        shut_down = False
        refresh_idle()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) never exports the parent's windows, never stops the
    parent's profiler (its state is a copy) and starts none of its own: it forgets every
    session without touching torch, and its decorated calls run idle."""
    global ambient, explicit, current, shut_down, lock, mirror_lock, metrics_on
    lock = threading.RLock()  # the parent may have held it while forking
    mirror_lock = threading.Lock()  # (likewise; _torch's hook below writes the flags)
    ambient = explicit = current = None
    shut_down = True
    PENDING.clear()  # the parent's windows: never stopped from here
    _torch.after_fork_in_child()
    metrics_on = False  # nothing exports from here; and the parent's counts stay the parent's
    metrics.reset()
    _write(True, None, None)
    if gc_paused():  # forked while the export worker had the collector paused
        gc.enable()
    # forked while a deferred stop paused this thread's CPU ops (the DataLoader workers an
    # epoch's first batch starts): the child records them again; the other threads are gone
    cpu_ops.forget_all()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
