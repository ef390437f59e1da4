"""The process-level API: ``session()``, ``configure()``, ``step()``, ``flush()``,
``shutdown()``, the ambient session and the exit hook. The state they change is ``state``'s."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, cast

from exporters import ExporterWarning, check_exporter_names, resolve_exporters
from instrument.base.settings import quote, reason
from instrument.base.warn import warn

from ..analysis import peaks
from ..export import analysis_process
from . import _torch, collectives, metrics, state, triggers
from ._atomic import _StandIn, atomic
from .config import Config, _reject_unknown, _reset_warnings, enabled_from_env
from .profiling_session import Session
from .sampling import Schedule

__all__ = ["configure", "flush", "get_config", "peak_tflops", "session", "shutdown", "step"]


def ambient_config() -> Config:
    """The configuration the ambient session uses: the environment, then ``configure()``."""
    config = Config.from_env()
    if config.strict and config.exporters:
        _check_env_exporter_names(config.exporters)
    if state.overrides:
        config = config.replace(**state.overrides)
    return config


def _check_env_exporter_names(names: Sequence[Any]) -> None:
    """``PROFILED_STRICT=1``: an unknown name in ``PROFILED_EXPORTERS`` is an error with the
    other bad values (without strict it warns, ``ExporterWarning``, when the exporters are
    resolved). Here, not in ``Config.from_env``: the exporter registry is above the config."""
    try:
        check_exporter_names(names)
    except ValueError as exc:
        raw = os.environ.get("PROFILED_EXPORTERS", "")
        raise ValueError(
            f"PROFILED_EXPORTERS={quote(raw)} is invalid ({reason(exc)}); "
            "PROFILED_STRICT=1 makes this an error"
        ) from None


def _builtin_kwargs(config: Config) -> dict[str, dict[str, Any]]:
    return {
        "trace": {
            "dir": config.trace_dir,
            "gzip": config.trace_gzip,
            "keep": config.trace_keep,
            "max_mb": config.trace_max_mb,
        },
        "json": {"path": config.json_path},
        "html": {"dir": config.trace_dir, "keep": config.trace_keep},
        "prometheus": {"addr": config.prometheus_addr},
    }


def _warn_once(message: str, category: type[Warning]) -> None:
    """Once per process, like warnings about other environment values (the ambient session is
    rebuilt by configure())."""
    if message not in state.exporter_warnings_seen:
        state.exporter_warnings_seen.add(message)
        warn(message, category)


def _session(sess: state.Session | None) -> Session | None:
    """A session ``state`` holds, as the ``Session`` it is (``state`` names sessions by a
    protocol, not by their class: the runtime keeps no import cycle, not even for types)."""
    return cast("Session | None", sess)


def _sessions(found: Sequence[state.Session | None]) -> list[Session]:
    """The sessions of ``found`` that are there, as ``Session`` objects (see ``_session``)."""
    return [cast(Session, s) for s in found if s is not None]


def session_for_calls() -> Session | None:
    """The session a decorated call reports to, or None when none needs it."""
    cur = _session(state.current)
    if cur is None:
        cur = _make_ambient()
        if cur is None:
            state.resume_idle_thread()
            return None
    if not cur._started:
        cur._start()
    if cur.finished:
        state.resume_idle_thread()
        return None
    return cur


def _make_ambient() -> Session | None:
    sess = _build_ambient()
    if sess is not None and sess.ambient and sess.config.enabled:
        _arm_sigterm()  # outside the lock: a SIGTERM may come as soon as it is armed
    return sess


def _build_ambient() -> Session | None:
    with state.lock:
        if state.current is not None:
            return _session(state.current)
        if state.shut_down:
            return None
        config = ambient_config()
        exporters = (
            resolve_exporters(
                config.exporters, builtin_kwargs=_builtin_kwargs(config), warn=_warn_once
            )
            if config.enabled
            else []
        )
        sess = Session(config, exporters, ambient=True)
        if exporters and not any(getattr(e, "takes_windows", True) for e in exporters):
            sess._open_no_windows()  # metrics exporters only (prometheus): no window to open
        elif not exporters:
            # disabled, or nothing would see a window: open none (PROFILED_EXPORTERS=none, or
            # every name unknown, each of which has warned already)
            sess._open_no_windows()
            if config.enabled and config.exporters:
                _warn_once(
                    "no exporter named in PROFILED_EXPORTERS could be used, so no "
                    "profiler windows are opened (decorated calls cost what idle ones "
                    "do)",
                    ExporterWarning,
                )
        # the session, its metrics and their switch all or none: a signal handler's exception
        # (a program's timeout) waits for the block, so metrics are never left off for good
        with atomic():
            if config.enabled and metrics.wanted(config.metrics, exporters):
                feed = metrics.Feed(
                    config.metrics_interval_s,
                    sess._pipeline.submit_metrics,
                    lambda: state.set_metrics(False),
                    max_ranges=config.metrics_max_ranges,
                )
                sess._use_metrics(feed)
            state.ambient = state.current = sess
            if sess.metrics is not None:
                state.set_metrics(True, config.metrics_modules, config.metrics_device_every)
                collectives.install()  # time outside collectives names a late rank
        _register_atexit()
        state.refresh_idle()
        return sess


def enter_explicit(found: state.Session) -> None:
    sess = cast(Session, found)  # (``state`` names it by its protocol: see ``_session``)
    # atomic() outside the locks: a signal held back by it comes when they are free
    with atomic(), state.lock:
        if state.explicit is not None:
            raise RuntimeError(
                "a torch-profiled session is already open; sessions do not nest "
                "(one torch profiler per process)"
            )
        if sess.closed:
            raise RuntimeError("this session has ended; create a new one with session(...)")
        amb = _session(state.ambient)
        if amb is not None:  # its profiler must stop before ours
            amb._give_way("an explicit session() started before the ambient window recorded a step")
        state.cpu_ops.resume_here()  # a stop the timer ended left this thread paused
        state.explicit = state.current = sess
        _register_atexit()
    _arm_sigterm()
    sess._start()  # outside atomic(): it may arm a trigger (see Session._start)
    state.refresh_idle()


def exit_explicit(found: state.Session) -> None:
    sess = cast(Session, found)
    try:
        sess.close()
    finally:
        with state.lock:
            if state.explicit is sess:
                state.explicit = None
                state.current = state.ambient
            state.refresh_idle()


def session(
    *,
    exporters: Sequence[Any] | None = None,
    schedule: Schedule | None = None,
    activities: Sequence[Any] | None = None,
    record_shapes: bool | None = None,
    profile_memory: bool | None = None,
    with_stack: bool | None = None,
    with_flops: bool | None = None,
    **fields: Any,
) -> Session:
    """An explicit profiling lifetime: ``with session(exporters=[...]) as s: ... s.step()``.

    Unset arguments come from the ambient configuration (environment, then ``configure()``).
    Exporter names resolve like ``PROFILED_EXPORTERS``; an unknown name raises ``ValueError``.
    Everything still open is exported when the block exits.
    """
    _reject_unknown(fields)
    given: dict[str, Any] = dict(fields)
    for key, value in (
        ("exporters", exporters),
        ("schedule", schedule),
        ("activities", activities),
        ("record_shapes", record_shapes),
        ("profile_memory", profile_memory),
        ("with_stack", with_stack),
        ("with_flops", with_flops),
    ):
        if value is not None:
            given[key] = value
    config = ambient_config().replace(**given)
    if "exporters" in given:
        check_exporter_names(config.exporters)
    exps = resolve_exporters(config.exporters, builtin_kwargs=_builtin_kwargs(config))
    if not config.enabled:
        return _DisabledSession(config, exps)
    return Session(config, exps, ambient=False)


class _DisabledSession(Session):
    """``PROFILED_ENABLED=0``: a session that never starts a profiler."""

    def __init__(self, config: Config, exporters: Sequence[Any]) -> None:
        super().__init__(config, exporters, ambient=False)
        self.finished = True

    def _start(self) -> None:
        self._started = True

    def close(self, timeout: float | None = None) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._pipeline.close(self.config.export_timeout_s if timeout is None else timeout)
        state.refresh_idle()


def configure(**fields: Any) -> None:
    """Set the ambient configuration from code (overrides the environment).

    Unknown field names raise ``TypeError``, bad values ``ValueError``/``TypeError``. The
    current ambient session (if any) is closed (an open window is exported as partial) and a
    new one starts with the next decorated call.
    """
    _reject_unknown(fields)
    candidate = dict(state.overrides)
    candidate.update(fields)
    Config().replace(**candidate)  # validates every value
    if "exporters" in fields:
        check_exporter_names(Config().replace(exporters=fields["exporters"]).exporters)
    with state.lock:
        old = _session(state.ambient)
        state.overrides.clear()
        state.overrides.update(candidate)
        state.ambient = None
        if state.current is old:
            state.current = state.explicit
        state.shut_down = False
        state.refresh_idle()
    if old is not None:
        old.close()


def get_config() -> Config:
    """The configuration the ambient session uses (or the next one will): the environment,
    then ``configure()``'s fields, as one frozen ``Config``. Reading it starts nothing."""
    return ambient_config()


def peak_tflops(device: str) -> dict[str, float]:
    """The dense peak TFLOP/s per dtype (``"bf16"``, ...) of the device named ``device``
    (torch's name, as ``WindowReport.device``) that the reports rate MFU by:
    ``PROFILED_PEAK_TFLOPS`` (or ``configure(peak_tflops=...)``) for every dtype, else the
    SDK's table; ``{}`` for a device the table does not know."""
    peak = peaks.lookup(device, ambient_config().peak_tflops)
    return dict(peak.tflops) if peak is not None else {}


def step() -> None:
    """End the current step of the current session (explicit, else ambient)."""
    sess = _session(state.current) or _make_ambient()
    if sess is not None:
        if not sess._started:
            sess._start()
        sess.step()
    else:
        state.cpu_ops.resume_here()  # after shutdown() from another thread during a stop
        if state.PENDING:
            state.run_pending_stops()


def flush(timeout_s: float | None = None) -> bool:
    """Wait until every window that has ended so far has been exported by every exporter.

    Reports are built and exported on background threads; call this before reading what an
    exporter produced (a test, a notebook cell). Returns False if ``timeout_s`` passed first.
    """
    state.resume_idle_thread()
    if state.PENDING:
        state.run_pending_stops()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    ok = True
    for sess in _sessions((state.explicit, state.ambient)):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ok = sess.flush(left) and ok
    return ok


def shutdown() -> None:
    """End every session: open windows that recorded steps are exported (``partial=True``);
    then the analysis helper process leaves (a later window starts a new one). All within one
    ``export_timeout_s`` (the longest of the sessions'), whatever the exporters do."""
    global _shutting_down, _term_pending
    main = threading.current_thread() is threading.main_thread()
    _shutting_down = _shutting_down or main  # a SIGTERM now waits for its end (_on_sigterm)
    me = threading.get_ident()
    _shutdowns[me] = time.monotonic() + Config().export_timeout_s  # (_close_sessions: its own)
    try:
        deadline = _close_sessions()
        if state.PENDING:  # windows this thread started (or whose thread has ended)
            state.run_pending_stops()
        _torch.end_orphaned_profiler()  # none should be left; if one is, it must not outlive us
        state.resume_idle_thread()
        analysis_process.close_shared(max(0.0, deadline - time.monotonic()))
    finally:
        _shutdowns.pop(me, None)
        if main:
            _shutting_down = False
            _disarm_sigterm()
            signum, _term_pending = _term_pending, None
            if signum is not None:  # it came meanwhile: the process ends by it now
                _end_by(signum, run_atexit=_exiting)


_closing: list[Session] = []  # the sessions the last shutdown closed (Ctrl-C abandons them)


def _close_sessions() -> float:
    """Close every session within one deadline (returned, ``time.monotonic()``)."""
    global _closing
    with state.lock:
        sessions = _sessions(state.take_sessions())
    _closing = sessions
    timeout = max((s.config.export_timeout_s for s in sessions), default=Config().export_timeout_s)
    deadline = time.monotonic() + timeout
    if threading.get_ident() in _shutdowns:  # a SIGTERM meanwhile waits for it until then
        _shutdowns[threading.get_ident()] = deadline
    for sess in sessions:  # a window stopped past the deadline is not analysed
        sess._pipeline.close_by(deadline)
    _stop_other_threads_windows(sessions, time.monotonic() + OWNER_WAIT_SHARE * timeout)
    for sess in sessions:
        try:
            sess.close(deadline - time.monotonic())
        except Exception as exc:  # noqa: BLE001
            warn(f"torch-profiled shutdown failed: {exc!r}", ExporterWarning)
    return deadline


OWNER_WAIT_SHARE = 0.5
"""Of the export deadline, what ``shutdown()`` may wait for another thread to stop its own
window (the rest is the export's)."""


def _stop_other_threads_windows(sessions: list[Session], until: float) -> None:
    """End the sessions' open windows; one whose profiler another thread records (a daemon
    thread still training at exit, a worker thread) can only be stopped by that thread:
    its next decorated call does it (``state.PENDING``), and the window is exported as
    usual, if it comes by ``until``. Else one warning says the truth: which thread, and that
    the window is lost."""
    waiting = []
    for sess in sessions:
        window = sess._windows.window
        if window is None or window.stoppable_here():
            continue  # none, or this thread's: close() stops it
        with atomic(), sess._lock:  # a signal held back meets no lock of ours
            if sess._windows.window is not None:
                sess._windows.end(partial=True)
        if sess._stops.pending is not None:
            waiting.append(sess)
    for sess in waiting:
        while sess._stops.pending is not None and time.monotonic() < until:
            time.sleep(0.005)
        pending = sess._stops.pending
        if pending is not None and not pending.window.owner_gone():
            owner = pending.window.owner
            why = (
                f"the open window's profiler records only the thread that started it "
                f"({owner.name}{', a daemon thread' if owner.daemon else ''}), which was still "
                f"running and made no decorated call within {OWNER_WAIT_SHARE:.0%} of "
                "PROFILED_EXPORT_TIMEOUT_S to stop it; that window is lost"
            )
            sess._lost(why)
            sess._warn(why)


def reset() -> None:
    """Close everything and forget ``configure()``: a fresh process, as far as we can tell
    (the analysis helper stays: starting one per test costs ~0.1 s)."""
    _close_sessions()
    _reset_warnings()
    state.reset()


def _register_atexit() -> None:
    """Export what is queued when the interpreter exits, before the thread pools go.

    Exporters (OpenTelemetry's among them) use ``concurrent.futures``, which refuses new work
    once its own exit hook has run, and that hook runs at threading shutdown, before
    ``atexit``. So our hook is a threading exit hook too, registered after that module's
    (they run last-registered first); ``atexit`` where this Python has no such hook.
    """
    if state.atexit_registered:
        return
    state.atexit_registered = True
    import concurrent.futures.thread  # noqa: F401 - registers its exit hook before ours

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_at_exit)
            return
        except RuntimeError:  # already shutting down
            pass
    atexit.register(_at_exit_in_atexit)


def _at_exit_in_atexit() -> None:
    global _in_atexit
    _in_atexit = True
    _exit_shutdown()


def _at_exit() -> None:
    """Runs at threading shutdown, before non-daemon threads are joined: if one still runs
    (a training thread the main thread left running), end the sessions only after it, from
    ``atexit``."""
    others = [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if others:
        atexit.register(_exit_shutdown_in_atexit)
        return
    _exit_shutdown()


def _exit_shutdown_in_atexit() -> None:
    global _in_atexit
    _in_atexit = True
    _exit_shutdown()


def _exit_shutdown() -> None:
    """``shutdown()`` at the interpreter's exit. Ctrl-C meanwhile (a slow exporter) abandons
    what is still being exported, with one line that says so, and the process then ends as
    an interrupted one (SIGINT, exit status 130 / -2), as it would have without us (run from
    atexit itself, the program's other exit functions run on after the line, as Python
    does for an interrupted exit function). A SIGTERM
    meanwhile lets the export finish within its deadline, then ends the process by that
    signal (``shutdown``)."""
    global _exiting
    _exiting = True
    try:
        shutdown()
    except KeyboardInterrupt:
        lost = _abandon_all()
        _say(
            "torch-profiled: interrupted (Ctrl-C) while exporting at exit: "
            + (f"abandoned {lost} window report(s) not yet exported" if lost else "nothing lost")
        )
        if not _in_atexit:
            _end_by(signal.SIGINT, run_atexit=True)
    finally:
        _exiting = False


# ---------------------------------------------------------------- SIGTERM
#
# torchrun, Kubernetes and Slurm end a job with SIGTERM. Its default action ends the process
# at once: no atexit, so the open window and the last metrics interval would be lost. Where
# the main thread finds SIGTERM at its default when the first session starts, a handler of
# ours takes its place: it stops the open window (on the main thread, which owns the
# window's profiler), exports on another thread within PROFILED_EXPORT_TIMEOUT_S, then puts
# the default back and sends SIGTERM again, so the process still ends BY the signal (the
# status a launcher sees: -15 / 143). Where the program has a Python handler of its own it is
# left alone: its graceful exit runs our exit hook. A C handler (one Python's getsignal
# reports as the default) is kept too: the handler is installed only where the process's
# real disposition is the default.
#
# - A program that installs its handler over ours later and calls ours from it (PyTorch
#   Lightning's signal connector, submitit: "chain to the previous handler") is shutting
#   down on its own terms: ours, called that way, does nothing, as such code expects of
#   SIG_DFL. Its exit runs our exit hook, which exports.
# - A Python handler runs only between two bytecodes of the main thread. Where that thread
#   holds a lock of ours (a SIGTERM that lands inside the SDK, or handed over by ``atomic()``
#   as a start or stop ends), the handler waits for the lock on another thread and has the
#   signal sent again once it is free: stopping the window needs it. Where the main thread
#   sits in native code (a collective that hangs, a long C call), no Python handler runs at
#   all: a watchdog thread, woken by Python's signal wakeup fd (only where nobody else uses
#   it, asyncio for one), ends the process by the signal when our handler has not started
#   within ``WATCHDOG_GRACE_S`` (what was not exported is lost, as without us).

WATCHDOG_GRACE_S = 1.0
"""How long the watchdog lets a SIGTERM wait for the main thread to reach Python code (time
inside an SDK start or stop, where the handler is held back on purpose, not counted)."""

_term_pid: int | None = None  # the process whose handler ours is (a forked child is not it)
_term_pending: int | None = None  # a SIGTERM that came while shutdown() ran on the main thread
_term_seen = False  # our handler has run (the watchdog stands down)
_term_runs = 0  # ... how often
_term_deadline: float | None = None  # the export's end (time.monotonic()), set by the first
_deferred = False  # a thread sends the signal again until the main thread meets it unlocked
_shutting_down = False  # shutdown() runs on the main thread
_shutdowns: dict[int, float] = {}  # shutdown() in progress: thread id -> its deadline
_exiting = False  # ... at the interpreter's exit
_in_atexit = False  # ... run from atexit's functions (they must not be run again)
_exitfuncs_ran = False
_wakeup_w = -1  # the write end of the watchdog's pipe, while it is the signal wakeup fd
_unset_for_fork = False  # ... unset by the fork in progress (put back after it)
_held_for_fork = False  # SIGTERM blocked on the forking thread by the fork in progress
_watchdog: threading.Thread | None = None


def _arm_sigterm() -> None:
    """Install ``_on_sigterm`` for SIGTERM: on the main thread, where its handler is the
    default (else the program's: left alone), once per process; and its watchdog."""
    global _term_pid, _term_seen, _term_deadline
    sigterm = getattr(signal, "SIGTERM", None)
    if (
        sigterm is None
        or _term_pid == os.getpid()
        or threading.current_thread() is not threading.main_thread()
    ):
        return
    try:
        if signal.getsignal(sigterm) is not signal.SIG_DFL or not _c_default(sigterm):
            return
        signal.signal(sigterm, _on_sigterm)
    except (ValueError, OSError):  # not the main interpreter, or no such signal here
        return
    _term_pid = os.getpid()
    _term_seen = False
    _term_deadline = None
    _start_watchdog()


def _disarm_sigterm() -> None:
    """``shutdown()``: SIGTERM's default again, if ours is still the handler (main thread)."""
    global _term_pid
    if _term_pid is None or threading.current_thread() is not threading.main_thread():
        return
    _term_pid = None
    _stop_watchdog()
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):
        pass


def _c_default(signum: int) -> bool:
    """The process's real disposition of ``signum`` is the default: no C library (an MPI
    runtime, ``faulthandler``) installed a handler that Python's table does not show (where
    the system cannot be asked, Python's own view is taken)."""
    return triggers._system_handler(signum) in (None, 0)


def _installed(signum: int) -> bool:
    """Ours is the handler of ``signum`` (or ``atomic()``'s stand-in for it), not a handler
    the program put over it that calls ours."""
    handler = signal.getsignal(signum)
    if isinstance(handler, _StandIn):
        handler = handler.original
    return handler is _on_sigterm


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM: export within the deadline, then end by the signal (see above). Runs on the
    main thread, between two bytecodes; whatever happens meanwhile (Ctrl-C, a program's
    handler that raises), the process ends by the signal."""
    global _term_pending, _term_seen, _term_deadline, _term_runs, _deferred
    _term_seen = True
    _term_runs += 1
    if not _installed(signum):
        return  # called by the program's own handler: its shutdown, its exit hook exports
    if os.getpid() != _term_pid or (state.shut_down and not _shutdowns):
        _end_by(signum)  # a forked child, or nothing left to export
    sessions = _sessions((state.explicit, state.ambient))
    timeout = max((s.config.export_timeout_s for s in sessions), default=0.0)
    if _term_deadline is None:  # the first delivery: the deadline holds for the retries
        _term_deadline = max([time.monotonic() + timeout, *_shutdowns.values()])
    if not _shutting_down:
        held = [lk for lk in _sdk_locks(sessions) if lk._is_owned()]
        if held and time.monotonic() < _term_deadline:
            _defer(signum, held)  # the signal comes again once the main thread lets go
            return
    _deferred = False
    try:
        signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    except (ValueError, OSError):
        pass
    if _shutting_down and os.getpid() == _term_pid:
        _term_pending = signum  # shutdown() (the exit's) runs: it ends by the signal after
        return
    what = ""
    try:
        what = _export_before_end(sessions, _term_deadline, timeout)
    except BaseException as exc:  # noqa: BLE001 - Ctrl-C, a program's handler: we end anyway
        kind = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else type(exc).__name__
        what = f"interrupted ({kind}) while exporting: what was not exported is lost"
    finally:
        if what:
            _say(f"torch-profiled: SIGTERM: {what}; the process ends by the signal")
        _end_by(signum)


def _export_before_end(sessions: list[Session], deadline: float, timeout: float) -> str:
    """Stop the open windows here, export on another thread by ``deadline`` (and wait for a
    ``shutdown()`` another thread runs); what went wrong, or ""."""
    others = set(_shutdowns)
    for sess in sessions:  # a window whose stop outlasts the deadline is not analysed
        sess._pipeline.close_by(deadline)
    ended = _end_windows_here(sessions)
    worker = threading.Thread(target=_quiet_shutdown, name="torch-profiled-sigterm", daemon=True)
    worker.start()
    while (worker.is_alive() or others & set(_shutdowns)) and time.monotonic() < deadline:
        if state.PENDING:  # a shutdown elsewhere waits for this thread to stop its window
            state.run_pending_stops()
        worker.join(min(0.05, max(0.0, deadline - time.monotonic())))
    if worker.is_alive() or others & set(_shutdowns):
        return (
            f"the export did not finish within PROFILED_EXPORT_TIMEOUT_S={timeout:g}s: "
            "what it had not exported is lost"
        )
    if not ended:
        return "the open window could not be stopped (SIGTERM came inside torch-profiled)"
    return ""


def _sdk_locks(sessions: list[Session]) -> list[Any]:
    """The re-entrant locks of ours a thread may hold while it runs Python code."""
    return [state.lock, _torch._range_lock, *(s._lock for s in sessions)]


def _defer(signum: int, held: list[Any]) -> None:
    """The main thread holds ``held`` (SDK locks): send ``signum`` to it again and again from
    another thread until the handler finds it outside them, each time holding them first
    where that thread lets go in time (it then meets the signal outside them, or waiting for
    them); past the deadline, end the process by the signal."""
    global _deferred
    if _deferred:
        return  # the thread that sends it again is running
    _deferred = True
    main = threading.main_thread().ident
    deadline = _term_deadline if _term_deadline is not None else time.monotonic()

    def again() -> None:
        while _deferred and main is not None:
            if time.monotonic() >= deadline:
                _kill_from_thread(
                    signum,
                    "the main thread held a torch-profiled lock past the export deadline "
                    "(interrupted inside the SDK, or a program holding it): the open "
                    "window and what was not exported are lost",
                )
                return
            taken = []
            try:
                for lock in held:
                    if not lock.acquire(timeout=0.005):
                        break
                    taken.append(lock)
                runs = _term_runs
                signal.pthread_kill(main, signum)
                until = time.monotonic() + (0.2 if len(taken) == len(held) else 0.005)
                while _term_runs == runs and time.monotonic() < until:
                    time.sleep(0.001)
            finally:
                for lock in reversed(taken):
                    lock.release()
            time.sleep(0.001)

    threading.Thread(target=again, name="torch-profiled-sigterm-retry", daemon=True).start()


def _kill_from_thread(signum: int, what: str) -> None:
    """End the process by ``signum`` from a thread other than the main one (which cannot run
    Python now): the system's default action put back behind Python's back (``signal.signal``
    works on the main thread only), then the signal; ``os._exit`` where that fails. Streams
    are not flushed: the main thread may hold their locks."""
    try:
        os.write(2, f"torch-profiled: SIGTERM: {what}; the process ends by the signal\n".encode())
    except OSError:
        pass
    libc = triggers._sigaction()
    if libc is not None:
        import ctypes

        default = ctypes.create_string_buffer(triggers._SIGACTION_SIZE)  # SIG_DFL, no flags
        if libc.sigaction(int(signum), default, None) == 0:
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the signal ends the process meanwhile
    os._exit(128 + signum)


def _start_watchdog() -> None:
    """Point Python's signal wakeup fd at a pipe a daemon thread reads: its C-level handler
    writes there even while the main thread runs native code. Only where no one else set
    the wakeup fd (asyncio's event loops use it): theirs is put back and there is no
    watchdog. POSIX only."""
    global _wakeup_w
    if os.name != "posix" or _wakeup_w != -1:
        return
    r, w = os.pipe()
    try:
        os.set_blocking(w, False)
        prev = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        return
    if prev != -1:  # somebody's: theirs stays
        try:
            signal.set_wakeup_fd(prev)
        except (ValueError, OSError):
            pass
        os.close(r)
        os.close(w)
        return
    global _watchdog
    _wakeup_w = w
    _watchdog = threading.Thread(
        target=_watch, args=(r,), name="torch-profiled-sigterm-watchdog", daemon=True
    )
    _watchdog.start()


def _stop_watchdog() -> None:
    """The wakeup fd back to none (where it is still ours) and the pipe closed: the watchdog
    thread reads its end and leaves."""
    global _wakeup_w
    w, _wakeup_w = _wakeup_w, -1
    if w == -1:
        return
    try:
        now = signal.set_wakeup_fd(-1)
        if now not in (-1, w):  # set by someone else since: theirs stays
            signal.set_wakeup_fd(now)
    except (ValueError, OSError):
        pass
    os.close(w)
    if _watchdog is not None:  # it reads the end of the pipe and leaves: gone on return
        _watchdog.join(1.0)


def _watch(r: int) -> None:
    """The watchdog thread: a SIGTERM byte while ours is the handler, and our handler has not
    started within ``WATCHDOG_GRACE_S`` of the main thread's time outside SDK blocks: the
    main thread is stuck in native code; end the process by the signal."""
    sigterm = int(signal.SIGTERM)
    try:
        # no signal is delivered to this thread: the main thread's blocking calls stay
        # interrupted by them as before (a process-directed signal goes to any thread)
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            data = os.read(r, 512)
            if not data:
                return  # disarmed
            if sigterm not in data or _term_seen or not _installed(sigterm):
                continue
            waited = 0.0
            while not _term_seen and waited < WATCHDOG_GRACE_S:
                time.sleep(0.02)
                if not _atomic_depth():  # inside an SDK start or stop: held back on purpose
                    waited += 0.02
            if not _term_seen and _installed(sigterm):
                _kill_from_thread(
                    sigterm,
                    f"the main thread did not reach Python code within {WATCHDOG_GRACE_S:g}s "
                    "(it runs native code: a collective that hangs, a long C call); the open "
                    "window and the last metrics are not exported",
                )
    except OSError:
        return
    finally:
        os.close(r)


def _atomic_depth() -> int:
    from . import _atomic

    return _atomic._depth


def _unset_wakeup_before_fork() -> None:
    """Before ``os.fork()``: SIGTERM blocked on the forking thread while ours is its handler
    (``_hold_sigterm_for_fork``), and no wakeup fd, so the child never has ours, not even
    before its own fork hooks run (a SIGTERM to it then would wake our watchdog: ours, not
    the child's). The wakeup fd can only be unset on the main thread; elsewhere the child's
    hook below unsets it, and the blocked SIGTERM cannot write to it before that."""
    global _unset_for_fork, _held_for_fork
    _held_for_fork = _hold_sigterm_for_fork()
    if _wakeup_w != -1 and threading.current_thread() is threading.main_thread():
        try:
            prev = signal.set_wakeup_fd(-1)
            if prev != _wakeup_w:  # someone else's since (asyncio): theirs stays
                signal.set_wakeup_fd(prev)
            _unset_for_fork = prev == _wakeup_w
        except (ValueError, OSError):
            pass


def _hold_sigterm_for_fork() -> bool:
    """Where ours is this process's SIGTERM handler, block SIGTERM on the forking thread (the
    child's only thread inherits the mask); True where this blocked it.

    A child's SIGTERM that comes before CPython's own fork handling in the child (at once, as
    the child first runs: a launcher or a pool that ends a worker it just forked) finds a
    Python handler, ours, inherited: Python's C-level handler notes it, then
    ``PyOS_AfterFork_Child`` clears every noted signal (they are taken for the parent's), and
    the signal is lost: the child lives on, where without us SIGTERM's default action would
    have ended it. Blocked, the signal waits in the kernel until the child's hook has put the
    default back and unblocks it (``_forget_watchdog_in_child``)."""
    sigterm = getattr(signal, "SIGTERM", None)
    if sigterm is None or _term_pid != os.getpid() or not hasattr(signal, "pthread_sigmask"):
        return False
    try:
        if not _installed(sigterm):  # the program's own handler: left as it is
            return False
        return sigterm not in signal.pthread_sigmask(signal.SIG_BLOCK, {sigterm})
    except (ValueError, OSError):
        return False


def _release_sigterm_after_fork() -> None:
    """Unblock SIGTERM where the fork's ``_hold_sigterm_for_fork`` blocked it: one that came
    meanwhile is delivered now (in the child: to the handler just put back)."""
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        except (ValueError, OSError):
            pass


def _reset_wakeup_after_fork() -> None:
    """In the parent after ``os.fork()``: the watchdog's wakeup fd again, SIGTERM unblocked."""
    global _unset_for_fork
    try:
        if _unset_for_fork:
            _unset_for_fork = False
            try:
                signal.set_wakeup_fd(_wakeup_w, warn_on_full_buffer=False)
            except (ValueError, OSError):
                pass
    finally:
        _release_sigterm_after_fork()


def _forget_watchdog_in_child() -> None:
    """A forked child has no watchdog thread and does not export the parent's windows: Python's
    wakeup fd must not point at the parent's pipe there, and SIGTERM gets its default action
    back where ours is the handler (the child ends by it as it would without us, even in
    native code); then a SIGTERM that came since the fork, held back, ends the child."""
    global _wakeup_w
    w, _wakeup_w = _wakeup_w, -1
    try:
        if w != -1:
            try:
                signal.set_wakeup_fd(-1)  # the forking thread is the child's main thread
            except (ValueError, OSError):
                pass
            try:
                os.close(w)
            except OSError:
                pass
        sigterm = getattr(signal, "SIGTERM", None)
        if sigterm is not None and _term_pid is not None and _installed(sigterm):
            try:
                signal.signal(sigterm, signal.SIG_DFL)
            except (ValueError, OSError):
                pass  # ours stays: in a child it ends the process by the signal (_on_sigterm)
    finally:
        _release_sigterm_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_unset_wakeup_before_fork,
        after_in_parent=_reset_wakeup_after_fork,
        after_in_child=_forget_watchdog_in_child,
    )


def _end_windows_here(sessions: list[Any]) -> bool:
    """Stop the sessions' open windows on this (the main) thread, which owns their profilers;
    False where this thread holds an SDK lock (waiting for it would never end, ending the
    window inside would tear its state) or the flags' lock stays held: then the window is
    left to the shutdown thread, which cannot stop it, and is lost."""
    if any(lock._is_owned() for lock in _sdk_locks(sessions)) or not _free(state.mirror_lock):
        return False  # (held past the deadline: _on_sigterm waits for them until then)
    for sess in sessions:
        with atomic(), sess._lock:  # a signal held back meets no lock of ours
            if sess._windows.window is not None:
                sess._windows.end(partial=True)
            sess._stops.finish_drain(force=True)
            sess._stops.run_pending()
    return True


def _free(lock: Any, wait_s: float = 0.2) -> bool:
    """``lock`` (not re-entrant) is not held, or another thread lets it go within ``wait_s``:
    held by this thread, it never would."""
    end = time.monotonic() + wait_s
    while lock.locked():
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)
    return True


def _quiet_shutdown() -> None:
    try:
        shutdown()
    except BaseException:  # noqa: BLE001 - the process is ending: nothing to raise into
        pass


def _abandon_all() -> int:
    """The exit's export was interrupted: give up every session's pipeline now; returns how
    many window reports were not exported."""
    lost = 0
    for sess in _closing:
        try:
            lost += sum(sess._pipeline._give_up().values())
        except BaseException:  # noqa: BLE001 - a second Ctrl-C: what is left is lost anyway
            pass
    return lost


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - no stderr
        pass


def _end_by(signum: int, *, run_atexit: bool = False) -> None:
    """End the process by ``signum`` at its default action (the status a launcher expects),
    standard streams flushed; ``os._exit(128 + signum)`` where the signal could not end it.
    ``run_atexit`` (at the exit, as Python itself does before it ends an interrupted
    program by SIGINT): the program's ``atexit`` functions run first, once, and never from
    inside atexit's own run of them (that would run them all again, ours included)."""
    global _exitfuncs_ran
    if run_atexit and not _in_atexit and not _exitfuncs_ran:
        _exitfuncs_ran = True
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001 - they report their own errors; we end anyway
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    try:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
    except (ValueError, OSError):
        pass
    os._exit(128 + signum)


state.bind(calls=session_for_calls, explicit=(enter_explicit, exit_explicit))


def _trigger_idle_reason(name: str) -> str | None:
    """Why the trigger signal ``name``, arriving while no session has armed the trigger, opens
    no window (None: the next session that arms it opens one at its first step). Runs inside
    the signal handler: reads, never blocks."""
    enabled = state.overrides.get("enabled")
    if not (enabled_from_env() if enabled is None else enabled):
        return (
            "profiling is off in this process (PROFILED_ENABLED=0, configure(enabled=False), "
            "or a child of a profiled process)"
        )
    if state.shut_down:
        return (
            "profiling has ended in this process (after shutdown(), at exit, or in a forked child)"
        )
    cur = _session(state.current)
    if cur is not None and cur._started:
        if cur.config.trigger != name:
            return f"the profiling session's trigger is {cur.config.trigger or 'unset'}"
        if cur.finished:
            return "the profiling session opens no windows"
    return None


def install_trigger_signal() -> None:
    """``PROFILED_TRIGGER=SIGUSR2``: our handler goes on the signal as the SDK is imported, so
    that the signal never ends the process, profiling on or off (``triggers``)."""
    triggers.install_from_env(os.environ, _trigger_idle_reason)
