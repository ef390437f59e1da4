"""Sessions: who owns torch.profiler's lifetime and counts steps.

There is at most one *current* session per process (``state.current``): an explicit ``with
session(...)`` block while one is open, else the *ambient* session, built lazily from the
environment and ``configure()`` on the first decorated call (``lifetime``). Steps:

- A step ends when a ``step=True`` function returns or ``step()`` is called. Only the ambient
  session of a program that has no ``step=True`` function (``state.steps_declared``) and has
  not called ``step()`` also ends one when a root call (outermost decorated call on its thread
  or asyncio task) returns; an explicit session steps at ``s.step()``, as torch's profiler
  does at ``prof.step()``.
- At each step boundary the planner (``planner.WindowPlanner``) says what the step does, and
  the window room (``window.Windows``) does the transition its table names: open, begin,
  save (stop, then the report room ``reporting`` builds the report on the pipeline), discard.
  Windows never use torch's own schedule, so a window never starts while the user's own
  torch.profiler runs (a second profiler silently breaks theirs).
- ``close()`` (session exit, ``shutdown()``, interpreter exit) ends an open window: one that
  recorded steps is exported with ``partial=True``; otherwise one line says why there is no table.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from instrument.base.warn import warn

from ..export import scratch as rawtraces
from ..export.builder import (
    ReportBuilder,
    occurrence_budget,
    rank_skip_reason,
    remove_raw,
    wants_gzip_trace,
    why_no_report,
)
from ..export.pipeline import ExportPipeline, warn_not_exported
from . import _torch, decorator, metrics, state, triggers
from ._atomic import atomic
from .config import Config, mark_profiled_process
from .planner import WindowPlanner
from .sampling import Action, Schedule
from .status import SessionStatus
from .stops import Handed, Stops
from .window import Now, Windows

__all__ = ["ProfilerWarning", "Session"]


class ProfilerWarning(UserWarning):
    """A profiler window could not be opened, ended or analyzed; the program goes on."""


class Session:
    """One profiling lifetime: a schedule, exporters, and the windows it opens.

    Use ``with instrument.session(...) as s`` rather than building one directly.
    """

    def __init__(self, config: Config, exporters: Sequence[Any], *, ambient: bool) -> None:
        self.config = config
        self.schedule: Schedule = config.schedule
        self.sampling = config.sampling
        self.exporters = list(exporters)
        self.ambient = ambient
        self.activities = config.activities or _torch.default_activities()
        self._lock = threading.RLock()
        self._reports = ReportBuilder(
            config,
            self.activities,
            self._warn,
            lambda: self._pipeline.closed,
            occurrence_budget(self.exporters),
            wants_gzip_trace(self.exporters),
        )
        self._handed = Handed(self._reports.build, remove_raw)  # (the steps it slows: not judged)
        self._pipeline = ExportPipeline(self.exporters, self._handed.build, self._handed.cleanup)
        self._planner = WindowPlanner(
            config.schedule,
            config.sampling,
            max_windows=config.max_windows,
            min_interval_s=config.min_interval_s,
            slow_step=config.slow_step,
            tell=self._pipeline.notice,  # what a slow step did not open, and why
        )
        self._stops, self._windows = _parts(self)
        self.step_index = 0  # the step in progress
        self.windows_ended = 0
        self.finished = False  # the schedule can open no more windows
        self.closed = False
        self._started = False
        self._action = Action.NONE
        self._idle_until = 0  # steps before this one are idle (no window, action NONE)
        self._step_thread: int | None = None  # the thread of the last step
        self._step_threads_mixed = False  # steps came from more than one thread
        # root calls end steps only in the ambient session of a program with no step=True
        # function that has not called step(); an explicit session steps by s.step()
        self._steps_declared = not ambient or state.steps_declared
        # the ambient session starts a window's profiler at the first decorated call of its
        # first recorded step (on the thread that stepped), not at the boundary before it: a
        # program's last step ending starts no profiler that records nothing at exit
        self._lazy_start = ambient
        self._skip_reason: str | None = None
        self._trigger: triggers.Trigger | None = None
        self._warned_double_step = False
        self._last_step_call: tuple[int, int] | None = None  # (perf_counter_ns, switches)
        # the step a root call's return began, while root calls end steps: a first step()
        # called right after it (no decorated call open) ends that same step (``step``)
        self._root_began_step: int | None = None
        self._window_index = 0
        self.metrics: metrics.Feed | None = None  # the ambient session's, when metrics are on

    @property
    def windows_opened(self) -> int:
        return self._planner.windows_opened

    # ------------------------------------------------------------ public

    def step(self) -> None:
        """End the current step (in the ambient session, from now on no root call ends one)."""
        inside = decorator.IN_STEP_FUNCTION.get()
        if inside is not None and not self._warned_double_step:
            self._warned_double_step = True
            self._warn(
                f"step() was called inside the step=True function {inside!r}: each of "
                "its calls ends two steps (this one and its return); use one or the "
                "other"
            )
        # the first step() right after a root call's return, as a prof.step()-style loop
        # calls it at an iteration's end (or the next one's start): that return ended the
        # step already; another boundary would make an empty step (a window's recorded step)
        same_boundary = (
            not self._steps_declared
            and self._root_began_step == self.step_index
            and decorator._DEPTH.get() == 0
        )
        self._steps_declared = True
        self._time_explicit_step()
        if not same_boundary:
            self._advance()

    def _time_explicit_step(self) -> None:
        """The time since the last ``step()`` into the metrics' step histogram, as a
        ``step=True`` function's return puts its call's there (so the step metric, and the
        ledger's window-free baseline, exist for a loop that steps as ``prof.step()`` does);
        only where no ``step=True`` decoration times the steps, and not for a step in which a
        profiler started or stopped (the SDK's own start or stop is in it)."""
        now, switches = time.perf_counter_ns(), _torch.switches()
        last, self._last_step_call = self._last_step_call, (now, switches)
        if last is None or switches != last[1] or state.steps_declared or not state.metrics_on:
            return
        metrics.record(metrics.recorder, metrics.STEP, float(now - last[0]))

    def close(self, timeout: float | None = None) -> None:
        """End the session: export an open window that recorded steps (``partial=True``),
        then wait for everything queued to be exported; all within ``timeout`` seconds
        (``export_timeout_s`` by default) from now."""
        timeout = self.config.export_timeout_s if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + timeout
        with self._lock:
            if self.closed:
                return
            self.closed = self.finished = True
            if self._trigger is not None:  # outside atomic(): see _start
                self._trigger.disarm()
                self._trigger = None
            with atomic():
                if self._windows.window is not None:
                    self._windows.end(partial=True)
                self._stops.finish_drain(force=True)
                self._stops.run_pending()  # this thread started the window: stop it now
                self._stops.resume_cpu_ops()
        state.refresh_idle()
        if self.metrics is not None:  # off, and the last snapshot queued before the lanes close
            self.metrics.close()
        # outside the lock: decorated calls in other threads must not wait for exporters
        lost = self._pipeline.close(
            max(0.0, deadline - time.monotonic()),
            why_no_report(self._skip_reason, self.step_index, self.schedule, self.ambient),
        )
        if lost:  # a lane may still read a raw trace (the next process cleans up)
            warn_not_exported(lost, self.config.export_timeout_s)
        else:
            rawtraces.release()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every window that ended so far has been exported (False on timeout)."""
        with atomic(), self._lock:
            self._stops.finish_drain(force=True)
            self._stops.run_pending()
            self._stops.resume_cpu_ops()
        return self._pipeline.flush(timeout)

    def status(self) -> SessionStatus:
        """What this session is doing now: its step, its window, a stop under way."""
        win, draining = self._windows.window, self._stops.draining
        return SessionStatus(
            step=self.step_index,
            root_calls_end_steps=not self._steps_declared,
            window_open=win is not None,
            window_recording=win is not None and win.recording,
            window_thread=win.owner.ident if win is not None else None,
            windows_opened=self.windows_opened,
            windows_ended=self.windows_ended,
            stop_deferred=draining is not None,
            stop_paused_thread=draining.paused_thread if draining is not None else None,
            stop_pending=self._stops.pending is not None,
            deferred_stops=tuple(self._stops.drain_log),
            finished=self.finished,
            closed=self.closed,
        )

    @property
    def dropped(self) -> dict[str, int]:
        """Reports dropped because an export queue was full, per queue."""
        return self._pipeline.dropped

    def __enter__(self) -> Session:
        state.enter_explicit(self)  # (``lifetime.enter_explicit``)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        state.exit_explicit(self)

    def __repr__(self) -> str:
        return (
            f"<Session {'ambient' if self.ambient else 'explicit'} step={self.step_index} "
            f"windows={self.windows_ended} schedule={self.schedule.to_env()}>"
        )

    # ------------------------------------------------------------ called by decorated code

    def _step_function_returned(self) -> None:
        self._steps_declared = True
        self._advance()

    def _root_call_returned(self) -> None:
        if not self._steps_declared:
            self._advance()
            self._root_began_step = self.step_index

    def _declare_steps(self) -> None:
        """A ``step=True`` decoration was applied (``state.declare_steps``)."""
        self._steps_declared = True

    def _open_no_windows(self) -> None:
        """Nothing would see a window (no exporter takes them): decorated calls go idle."""
        self.finished = True

    def _use_metrics(self, feed: metrics.Feed) -> None:
        self.metrics = feed  # metrics on

    def _give_way(self, why_if_no_step: str) -> None:
        """Another session starts: end the open window (``why_if_no_step`` where it recorded
        no step) and its drain (torch profilers do not overlap)."""
        with self._lock:
            if self._windows.window is not None:
                if not self._windows.steps:
                    self._skip_reason = why_if_no_step
                self._windows.end(partial=True)
            self._stops.finish_drain(force=True)

    def _now(self) -> Now:
        return Now(
            self._action, self.step_index, self._step_thread, self.closed, self._window_index
        )

    def _lost(self, why: str) -> None:
        """A window is lost or none could open: ``why`` says so where no report comes."""
        self._skip_reason = why

    def _window_counted(self) -> int:
        """A stopped window was handed to the pipeline: its index."""
        index = self._window_index
        self._window_index += 1
        self.windows_ended += 1
        return index

    # ------------------------------------------------------------ stepping

    def _start(self) -> None:
        with self._lock:
            self._stops.resume_cpu_ops()
            if self._started:
                return
            if not self.finished and (why := rank_skip_reason(self.config)) is not None:
                self._skip_reason = why
                self.finished = True  # decorated calls go idle
            self._started = True
            # the trigger outside atomic(): that swaps signal handlers, and puts back at its
            # end the one it found, over a trigger's installed meanwhile
            if not self.finished:  # else disabled (PROFILED_ENABLED=0) or rank not selected
                mark_profiled_process()  # the processes it starts stay silent (by default)
                if self.config.trigger:
                    self._trigger = triggers.arm(self.config.trigger, self._planner.triggered)
                with atomic():
                    first = self._planner.advance(0)
                    self._windows.transition(Action.NONE, first, 0)
                    self._action = first
                    self._check_finished()
            elif self._skip_reason and self.config.trigger:
                self._trigger = triggers.arm_to_drop(self.config.trigger)
        state.refresh_idle()

    def _advance(self) -> None:
        if state.PENDING:  # a window waits for its thread to stop it: this may be the one
            state.run_pending_stops()
        windows = self._windows
        with self._lock:
            if state.cpu_ops:  # even when closed: another thread may have closed it
                self._stops.resume_cpu_ops()
            if self.closed or self.finished:
                return
            if not self._started:
                self._start()
            if self._stops.draining is not None:
                with atomic():
                    self._stops.finish_drain(force=False)
                if self._stops.draining is None:
                    self._check_finished()
                    if self.finished:
                        return
            if self._planner.slow is not None and self._planner.step_ended(
                self.step_index, time.perf_counter_ns(), _torch.switches(), self._stops.busy()
            ):
                self._idle_until = 0  # a slow step: the next one may open a window
            if (
                not self._planner.in_cycle()
                and windows.window is None
                and self.step_index + 1 < self._idle_until
                and not self._planner.trigger_pending
            ):
                self.step_index += 1  # an idle step: nothing else changes
                return
            ident = threading.get_ident()
            if ident != self._step_thread:
                self._step_threads_mixed = self._step_thread is not None
                self._step_thread = ident
            window = windows.window
            if (
                window is not None
                and window.recording
                and self._action in (Action.WARMUP, Action.RECORD)
            ):
                self._next_step()  # inside a window: no profiler starts or stops here
            else:
                with atomic():  # a window may start or end: never cut short by a signal
                    self._next_step()

    def _next_step(self) -> None:
        """The step boundary's work past the fast paths: the window's transition."""
        windows = self._windows
        prev = self._action
        if windows.overtaken_and_off():
            self._skip_reason = (
                "your own torch.profiler ran while a window recorded, and its end ended "
                "torch-profiled's (torch profilers do not nest); that window is lost"
            )
            self._warn(self._skip_reason)
            windows.drop()
            state.set_first_call_hook(None)
        elif (
            prev in (Action.RECORD, Action.RECORD_AND_SAVE)
            and windows.window is not None
            and windows.window.recording
        ):
            windows.steps.append(self.step_index)
        self.step_index += 1
        cur = self._planner.advance(self.step_index, window_open=windows.window is not None)
        windows.transition(prev, cur, self.step_index, lazy=self._lazy_start)
        self._action = cur
        self._check_finished()

    def _check_finished(self) -> None:
        if self._windows.window is not None or self._planner.in_cycle():
            return
        if self._stops.draining is not None:  # steps must still reach _advance to stop it
            self._idle_until = 0
            return
        nxt = self._planner.next_possible(self.step_index + 1)
        if nxt is None and self._trigger is None:
            self.finished = True
            state.refresh_idle()
        else:
            self._idle_until = nxt if nxt is not None else 1 << 62

    def _warn(self, message: str) -> None:
        warn(message, ProfilerWarning)


def _parts(sess: Session) -> tuple[Stops, Windows]:
    """A session's stops and window room: they get what they need, and tell what happened
    through the session's own methods (they hold no session)."""
    stops = Stops(
        sess._lock,
        sess._pipeline,
        sess._handed,
        lambda: (sess._step_thread, sess._step_threads_mixed),
        sess._warn,
        sess._lost,
        sess._window_counted,
        lambda: windows.first_call(),
    )
    windows = Windows(
        sess.config,
        sess.activities,
        sess.exporters,
        sess._planner,
        sess._reports.ledger,
        sess._lock,
        sess._now,
        sess._warn,
        sess._lost,
        stops,
    )
    return stops, windows
