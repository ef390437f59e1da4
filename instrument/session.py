"""Sessions: who owns torch.profiler's lifetime, counts steps and turns windows into reports.

There is at most one *current* session per process: an explicit ``with session(...)`` block
while one is open, else the *ambient* session, built lazily from the environment and
``configure()`` on the first decorated call. Steps and windows:

- A step ends when a ``step=True`` function returns or ``step()`` is called. Only the ambient
  session of a program that has no ``step=True`` function (``decorator.STEPS_DECLARED``) and
  has not called ``step()`` also ends one when a root call (outermost decorated call on its
  thread or asyncio task) returns; an explicit session steps at ``s.step()``, as torch's
  profiler does at ``prof.step()``.
- ``Schedule.action(step)`` says what each step does; transitions follow torch's
  ``action_map``: NONE->WARMUP prepares a profiler, ->RECORD starts it, the end of the
  RECORD_AND_SAVE step stops it and exports one report. Windows never use torch's own
  schedule; the session decides every transition, so it can refuse to start one while the
  user's own torch.profiler runs (a second profiler silently breaks theirs).
- ``close()`` (session exit, ``shutdown()``, interpreter exit) ends an open window: one that
  recorded steps is exported with ``partial=True``; otherwise one line says why there is no table.
"""

from __future__ import annotations

import atexit
import collections
import gc
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from exporters import ExporterWarning, check_exporter_names, resolve_exporters
from exporters._warn import warn

from . import _torch, analysis_process, decorator, rawtraces, triggers
from ._atomic import atomic
from .analysis import analyze, drop_warmup
from .analysis import gc_paused as analysis_gc_paused
from .analysis_process import shape_and_analyse
from .config import Config, _reject_unknown, _reset_warnings, mark_profiled_process
from .pipeline import ExportPipeline
from .report import WindowReport
from .sampling import Action, Schedule
from .tracefile import STEP_MARKER, WINDOW_END, shape_file

__all__ = ["ProfilerWarning", "Session", "configure", "session", "shutdown", "step"]

_RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)

MAX_DRAIN_STEPS = 4
"""A CUDA window's deferred stop (see ``_end_window``) waits at most this many step boundaries
for the window's kernels to have run, then waits for them (not for the whole device) and
stops; 0 stops at the window's end the way torch does (synchronising the device first)."""
DRAIN_MAX_S = 2.0
"""... and at most this long, should the program stop ending steps (a timer thread stops it)."""
DEFER_MAX_STEP_NS = 250_000_000
"""Deferred only where the window's steps took less than this on average: a longer step hides
a synchronising stop's ~20-30 ms, and would keep the profiler on for long after the window."""
DRAIN_PAUSES_CPU_OPS = True
"""During a deferred stop the thread that steps records no CPU operators or ranges (torch's
RecordFunction off on that thread): what the profiler records after the window's end is cut
anyway, and recording it cost each drained step and the stop's processing (H200: the stop
49 -> 34 ms on the caller; sampled 97.1-99.0% -> 98.5-99.6% over BENCHMARKS.md's runs).
The thread records them again when the stop runs on it; where it ran elsewhere (the timer,
another thread's step, flush, close, configure or shutdown), at its next step
(``_advance``), a decorated call in a recording window (``_first_call_in_window``) or with
no session running (``session_for_calls``; ``_refresh_idle`` keeps calls awake meanwhile), a
session's start, ``flush()``/``shutdown()`` on it, or in a child it forks; a thread that
ends paused leaves the set by itself (``_torch._PausedThread``). Not once a second thread has stepped in the
session's windows or drains (``_advance`` skips idle steps before it looks): a thread's switch
can only be turned back on by that thread."""
EXPORT_DELAY_S = 0.3
"""After a deferred stop the export worker waits this long (from the stop) before torch's
``export_chrome_trace``, which holds the GIL for ~15-30 ms: right after the stop the device's
queue is short, and the training thread must refill it first."""


class ProfilerWarning(UserWarning):
    """A profiler window could not be opened, ended or analysed; the program goes on."""


class Session:
    """One profiling lifetime: a schedule, exporters, and the windows it opens.

    Use ``with instrument.session(...) as s`` rather than building one directly.
    """

    def __init__(self, config: Config, exporters: Sequence[Any], *, ambient: bool) -> None:
        self.config = config
        self.schedule: Schedule = config.schedule
        self.exporters = list(exporters)
        self._pipeline = ExportPipeline(self.exporters, self._build_report, self._remove_raw)
        self._window_hooks = [
            e.window_started for e in self.exporters if callable(getattr(e, "window_started", None))
        ]
        self.ambient = ambient
        self.activities = config.activities or _torch.default_activities()
        self._record_warmup = any(a != "cpu" for a in self.activities)
        self.step_index = 0  # the step in progress
        self.windows_ended = 0
        self.finished = False  # the schedule can open no more windows
        self.closed = False
        self._lock = threading.RLock()
        self._action = Action.NONE
        self._window: _torch.ProfilerWindow | None = None
        # a CUDA window that ended but whose profiler still runs until its kernels have run
        # (see _end_window): (window, CUDA event, (steps, partial, end_ns, start_ns), steps
        # waited, timer)
        self._draining: tuple[Any, ...] | None = None
        # a window's stop waiting for the thread that started it: (window, sync, lost, then)
        self._pending_stop: tuple[Any, ...] | None = None
        # the last deferred stops, (steps waited, kernels had run): for the benches
        self._drain_log: collections.deque[tuple[int, bool]] = collections.deque(maxlen=64)
        self._cpu_ops_paused: int | None = None  # the thread whose CPU ops the drain pauses
        self._step_thread: int | None = None  # the thread of the last step
        self._step_threads_mixed = False  # steps came from more than one thread
        self._window_steps: list[int] = []
        self._window_start_ns = 0
        self._active_started = False  # the open window has begun its recorded steps
        self._window_told = False  # the exporters' window_started hooks were called
        # The ambient session starts a window's profiler at the first decorated call of its
        # first recorded step (on the thread that stepped), not at the step boundary before
        # it: a program's last step ending opens no profiler that records nothing at exit.
        self._lazy_start = ambient
        self._start_due = False  # a window's profiler waits for that call
        self._window_index = 0
        # root calls end steps only in the ambient session of a program with no step=True
        # function (``decorator.STEPS_DECLARED``) that has not called step(); an explicit
        # session steps by s.step() (and step=True functions)
        self._steps_declared = not ambient or decorator.STEPS_DECLARED
        self._started = False
        self._idle_until = 0  # steps before this one are idle (no window, action NONE)
        self._skip_reason: str | None = None
        # window cycles: each is the schedule's warm-up + active steps from _cycle_start
        self.sampling = config.sampling
        self._cycle_start: int | None = None
        self.windows_opened = 0
        self._last_window_end: float | None = None  # time.monotonic()
        self._trigger: triggers.Trigger | None = None
        self._trigger_pending = False
        self._warned_double_step = False

    # ------------------------------------------------------------ public

    def step(self) -> None:
        """End the current step (and, in the ambient session, from now on no root call ends
        one)."""
        inside = decorator.IN_STEP_FUNCTION.get()
        if inside is not None and not self._warned_double_step:
            self._warned_double_step = True
            self._warn(f"step() was called inside the step=True function {inside!r}: each of "
                       "its calls ends two steps (this one and its return); use one or the "
                       "other")
        self._steps_declared = True
        self._advance()

    def close(self, timeout: float | None = None) -> None:
        """End the session: export an open window that recorded steps (``partial=True``),
        then wait for everything queued to be exported; all within ``timeout`` seconds
        (``export_timeout_s`` by default) from now."""
        timeout = self.config.export_timeout_s if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + timeout
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.finished = True
            if self._trigger is not None:  # outside atomic(): see _start
                self._trigger.disarm()
                self._trigger = None
            with atomic():
                if self._window is not None:
                    self._end_window(partial=True)
                self._finish_drain(force=True)
                self._run_pending_stop()  # this thread started the window: stop it now
                self._resume_cpu_ops()
        _refresh_idle()
        # outside the lock: decorated calls in other threads must not wait for exporters
        lost = self._pipeline.close(max(0.0, deadline - time.monotonic()),
                                    self._why_no_report())
        if lost:
            what = ", ".join(f"{name}: {n}" for name, n in lost.items())
            warn(f"torch-profiled: window reports not exported within "
                 f"PROFILED_EXPORT_TIMEOUT_S={self.config.export_timeout_s:g}s were dropped "
                 f"({what}); the program goes on", ExporterWarning)
        if not lost:  # else a lane may still read a raw trace (the next process cleans up)
            rawtraces.release()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every window that ended so far has been exported (False on timeout)."""
        with self._lock, atomic():
            self._finish_drain(force=True)
            self._run_pending_stop()
            self._resume_cpu_ops()
        return self._pipeline.flush(timeout)

    @property
    def dropped(self) -> dict[str, int]:
        """Reports dropped because an export queue was full, per queue."""
        return self._pipeline.dropped

    def __enter__(self) -> "Session":
        _enter_explicit(self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        _exit_explicit(self)

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

    # ------------------------------------------------------------ state machine

    def _start(self) -> None:
        with self._lock:
            self._resume_cpu_ops()
            if self._started:
                return
            if not self.finished and not self._rank_selected():
                self.finished = True  # decorated calls go idle (below)
            self._started = True
            # the trigger outside atomic(): that swaps signal handlers, and puts back at its
            # end the one it found, over a trigger's installed meanwhile
            if not self.finished:  # else disabled (PROFILED_ENABLED=0) or rank not selected
                mark_profiled_process()  # the processes it starts stay silent (by default)
                if self.config.trigger:
                    self._trigger = triggers.arm(self.config.trigger, self._triggered)
                with atomic():
                    first = self._action_for(0)
                    self._transition(Action.NONE, first, 0)
                    self._action = first
                    self._check_finished()
            elif self._skip_reason and self.config.trigger and not any(
                    c in self.config.trigger for c in (os.sep, "/", ".")):
                # a rank that does not profile still takes the trigger's signal (not a file:
                # that is for the ranks that profile), and drops it: an operator signalling
                # every rank must not terminate this one (SIGUSR2's default action)
                self._trigger = triggers.arm(self.config.trigger, lambda: None)
        _refresh_idle()

    def _triggered(self) -> None:
        """A trigger fired (signal handler or poll thread): lock-free, open at the next step
        (the idle fast path in ``_advance`` checks the flag)."""
        self._trigger_pending = True

    def _rank_selected(self) -> bool:
        """``PROFILED_RANKS``: a rank not listed never opens a window; the reason is the
        session's one line at its end."""
        ranks = self.config.ranks
        if ranks.ranks is None:
            return True
        dist = _torch.distributed_info()
        if ranks.selects(dist["rank"]):
            return True
        self._skip_reason = (
            f"rank {dist['rank']} (of {dist['world_size']}) is not among the ranks that profile "
            f"(PROFILED_RANKS={ranks}), so this process started no profiler"
        )
        return False

    def _advance(self) -> None:
        if _PENDING:  # a window waits for its thread to stop it: this may be the one
            _run_pending_stops()
        with self._lock:
            if _torch.PAUSED_CPU_OPS:  # even when closed: another thread may have closed it
                self._resume_cpu_ops()
            if self.closed or self.finished:
                return
            if not self._started:
                self._start()
            if self._draining is not None:
                with atomic():
                    self._finish_drain(force=False)
                if self._draining is None:
                    self._check_finished()
                    if self.finished:
                        return
            if (self._cycle_start is None and self._window is None
                    and self.step_index + 1 < self._idle_until and not self._trigger_pending):
                self.step_index += 1  # an idle step: nothing else changes
                return
            ident = threading.get_ident()
            if ident != self._step_thread:
                self._step_threads_mixed = self._step_thread is not None
                self._step_thread = ident
            window = self._window
            if (window is not None and window.recording
                    and self._action in (Action.WARMUP, Action.RECORD)):
                self._next_step(window)  # inside a window: no profiler starts or stops here
            else:
                with atomic():  # a window may start or end: never cut short by a signal
                    self._next_step(window)

    def _next_step(self, window: Any) -> None:
        """The step boundary's work past the fast paths: the window's transition."""
        ended = self.step_index
        prev = self._action
        if (window is not None and window.recording and window.overtaken()
                and not _torch.profiler_on()):
            # a profiler of the user's started and stopped meanwhile (on this window's
            # thread, or any for an all-threads window): its exit ended ours
            self._skip_reason = (
                "your own torch.profiler ran while a window recorded, and its end ended "
                "torch-profiled's (torch profilers do not nest); that window is lost"
            )
            self._warn(self._skip_reason)
            window.abandon()
            self._window = None
            self._window_steps = []
            decorator.set_first_call_hook(None)
        elif prev in _RECORDING and window is not None and window.recording:
            self._window_steps.append(ended)
        self.step_index += 1
        cur = self._action_for(self.step_index)
        self._transition(prev, cur, self.step_index, lazy=self._lazy_start)
        self._action = cur
        self._check_finished()

    # ------------------------------------------------------------ when windows open

    def _action_for(self, step: int) -> Action:
        """The action of ``step``: inside a window cycle by its offset, else NONE unless a
        window may open here (then a new cycle starts at ``step``)."""
        sched = self.schedule
        if self._cycle_start is not None:
            offset = step - self._cycle_start
            last = sched.warmup + sched.active - 1
            if offset < sched.warmup:
                return Action.WARMUP
            if offset < last:
                return Action.RECORD
            if offset == last:
                return Action.RECORD_AND_SAVE
            self._cycle_start = None
        if self._may_open(step):
            self._cycle_start = step
            self.windows_opened += 1
            return self._action_for(step)
        return Action.NONE

    def _capped(self) -> bool:
        cap = self.config.max_windows
        return cap is not None and self.windows_opened >= cap

    def _may_open(self, step: int) -> bool:
        sched = self.schedule
        if self._trigger_pending:
            self._trigger_pending = False
            if not self._capped():
                return True
        if self._capped():
            return False
        if self.sampling.enabled:
            if not self.sampling.opens(step - sched.skip_first):
                return False
            gap = self.config.min_interval_s
            if not gap:
                return True
            # a window still open here ends at this very step boundary
            last = time.monotonic() if self._window is not None else self._last_window_end
            return last is None or time.monotonic() - last >= gap
        # the schedule: torch's table, a window starting where its cycle does
        if sched.action(step) is Action.NONE:
            return False
        return step == 0 or sched.action(step - 1) in (Action.NONE, Action.RECORD_AND_SAVE)

    def _check_finished(self) -> None:
        if self._window is not None or self._cycle_start is not None:
            return
        if self._draining is not None:  # steps must still reach _advance to stop it
            self._idle_until = 0
            return
        nxt = self._next_possible(self.step_index + 1)
        if nxt is None and self._trigger is None:
            self.finished = True
            _refresh_idle()
        else:
            self._idle_until = nxt if nxt is not None else 1 << 62

    def _next_possible(self, step: int) -> int | None:
        """The first step at or after ``step`` where a window may open (triggers aside)."""
        if self._capped():
            return None
        sched = self.schedule
        if self.sampling.enabled:
            if self.sampling.sample_rate <= 0.0:
                return None
            rel = self.sampling.next_open(max(step - sched.skip_first, 0))
            return step + (1 << 20) if rel is None else rel + sched.skip_first
        if sched.finished(step):
            return None
        return sched.next_active(step)

    def _transition(self, prev: Action, cur: Action, step: int, *, lazy: bool = False) -> None:
        if prev is Action.RECORD_AND_SAVE:
            if self._window is not None:
                self._end_window(partial=False)
            prev = Action.NONE
        if cur is Action.NONE:
            if self._window is not None:  # only reachable with a hand-made schedule
                self._discard_window()
            return
        if self._window is None:
            if prev is not Action.NONE:
                return  # this cycle's window could not open: wait for the next one
            if not self._open_window():
                return
        if (cur is Action.WARMUP and self._record_warmup) or cur in _RECORDING:
            if lazy and not self._window.recording:
                self._start_due = True  # at the step's first decorated call (_first_call_in_window)
                decorator.set_first_call_hook(self._first_call_in_window)
                return
            self._begin(cur, step)

    def _begin(self, cur: Action, step: int) -> None:
        """Step ``step`` of the open window records (or warms up a device): start its profiler
        if it is not on yet, and mark the step."""
        # With a device, the profiler records from the first warm-up step: its start-up
        # costs (CUPTI's buffer request, slow first launches: ~3 ms on an H200) land in
        # warm-up events, which the analysis and the trace drop (everything before the
        # first step marker), as torch's own warm-up keeps them out of the recorded steps.
        # CPU-only windows have no such cost and start at the first recorded step, so a
        # profiler the user starts during the warm-up is unaffected.
        window = self._window
        assert window is not None
        if not window.recording:
            if _torch.profiler_on():  # the user's profiler started during our warm-up
                self._skip_reason = self._foreign_reason()
                window.abandon()
                self._window = None
                self._window_steps = []
                return
            try:
                started = window.start()
            except Exception as exc:  # noqa: BLE001
                self._warn(f"the profiler could not start ({exc!r}); window skipped")
                self._discard_window()
                return
            if not started:  # another session's window (ending on its thread) is on
                self._skip_reason = ("another torch-profiled window's profiler was still on "
                                     "when this one was due")
                window.abandon()
                self._window = None
                self._window_steps = []
                return
        if cur is Action.WARMUP:
            return
        if not self._active_started:
            self._active_started = True
            self._window_start_ns = time.time_ns()
            self._window_told = False
            if self._window_hooks or _torch.PAUSED_CPU_OPS:
                decorator.set_first_call_hook(self._first_call_in_window)
        _mark(STEP_MARKER + str(step))

    def _open_window(self) -> bool:
        self._finish_drain(force=True)  # torch profilers do not overlap
        self._resume_cpu_ops()
        if _PENDING:
            _run_pending_stops()
            if _PENDING:
                self._skip_reason = (
                    "a window's profiler records only the thread that started it, and that "
                    "thread has not come back to stop it, so the next window could not start")
                return False
        if _torch.end_orphaned_profiler():
            self._warn("a profiler of torch-profiled's was still on with no window to end it "
                       "(a start or stop cut short); it was switched off, its events dropped")
        if _torch.profiler_on():
            self._skip_reason = self._foreign_reason()
            return False
        try:
            window = _torch.ProfilerWindow(
                self.activities,
                record_shapes=self.config.record_shapes,
                profile_memory=self.config.profile_memory,
                with_stack=self.config.with_stack,
                with_flops=self.config.with_flops,
                all_threads=self.config.all_threads,
            )
            # Not prepared here: Kineto is prepared and started together at the first
            # recorded step. A prepared CUDA profiler makes a profiler the user starts during
            # our warm-up fail in its own prepare (seen on an H200 with torch 2.11), and
            # telemetry must never break the program. Warm-up steps are still counted.
        except Exception as exc:  # noqa: BLE001
            self._skip_reason = f"the profiler could not be prepared ({exc!r})"
            self._warn(f"the profiler could not be prepared ({exc!r}); window skipped")
            return False
        self._window = window
        self._window_steps = []
        self._active_started = False
        self._start_due = False
        return True

    @staticmethod
    def _foreign_reason() -> str:
        return (
            "your own torch.profiler was running when a window was due, so torch-profiled "
            "started none (a second profiler breaks the first); the @profiled ranges are "
            "in your profile"
        )

    def _first_call_in_window(self) -> None:
        """The first decorated call of the recording window began: tell the exporters that
        asked (``window_started``), on that call's thread and in its context. Called on every
        decorated call while a thread a deferred stop paused has not resumed (that stop ended
        on another thread): the calling thread records CPU ops again from this call on."""
        _torch.resume_cpu_ops()
        if _PENDING:
            _run_pending_stops()
        with self._lock:
            if (self._start_due and self._window is not None and not self.closed
                    and (self.config.all_threads
                         or threading.get_ident() == self._step_thread)):
                self._start_due = False
                with atomic():
                    self._begin(self._action, self.step_index)
            if not _torch.PAUSED_CPU_OPS and not _PENDING and not self._start_due:
                decorator.set_first_call_hook(None)
            if self._window is None or not self._active_started or self._window_told:
                return
            self._window_told = True
            index = self._window_index
        for hook in self._window_hooks:
            try:
                hook(index)
            except Exception as exc:  # noqa: BLE001 - telemetry never breaks the program
                self._warn(f"exporter hook {hook!r} raised {exc!r} at window start; ignored")

    def _discard_window(self) -> None:
        decorator.set_first_call_hook(None)
        self._start_due = False
        window, self._window = self._window, None
        self._window_steps = []
        if window is not None:
            self._stop_then(window, lost="")

    def _stop_then(self, window: Any, *, sync: bool = True, lost: str = "; window lost",
                   then: Any = None) -> None:
        """Stop ``window``'s profiler, then ``then()`` (its hand-over to the pipeline).

        A window records only the thread that started its profiler (``_torch``: torch's
        all-threads profiling crashes with operators running on other threads), and torch
        keeps such a profiler in that thread's locals: only that thread can stop it. When
        another thread ends the window (its step, ``close()``, ``flush()``, the drain's
        timer), the stop waits for the owner (``_PENDING``): its next step or decorated call,
        ``flush()``/``shutdown()``/``close()`` there, or its end (``_torch._ThreadLife`` stops
        the profiler as the thread ends; ``forget`` where even that could not run). No
        window opens meanwhile."""
        if window.stoppable_here():
            if self._stop(window, sync=sync, lost=lost) and then is not None:
                then()
            return
        self._pending_stop = (window, sync, lost, then)
        if self not in _PENDING:
            _PENDING.append(self)
        decorator.set_first_call_hook(self._first_call_in_window)

    def _run_pending_stop(self) -> None:
        """Under the lock: do the stop ``_stop_then`` left for the window's owner thread, if
        this is that thread; forget the window if that thread has ended."""
        pending = self._pending_stop
        if pending is None:
            return
        window, sync, lost, then = pending
        if window.owner_gone():
            self._pending_stop = None
            window.forget()
            self._warn(f"the thread that recorded a window ({window.owner.name}) ended before "
                       "it could stop its profiler; that window is lost")
        elif window.stoppable_here():
            self._pending_stop = None
            self._stop_then(window, sync=sync, lost=lost, then=then)
        else:
            return
        if self in _PENDING:
            _PENDING.remove(self)

    def _stop(self, window: Any, *, sync: bool = True, lost: str = "; window lost") -> bool:
        """Stop ``window``'s profiler; False where it was not stopped cleanly. A torch profiler
        the program started while the window recorded took torch's profiling state over:
        stopping ours would end the program's (and crash its trace export), so the window is
        abandoned instead, with a warning, and the program's profiler runs on."""
        if window.overtaken():
            self._skip_reason = (
                "your own torch.profiler started while a torch-profiled window recorded; torch "
                "profilers do not nest, so torch-profiled dropped its window and left yours "
                "alone"
            )
            self._warn(self._skip_reason)
            window.abandon()
            return False
        try:
            window.stop(sync=sync)
        except Exception as exc:  # noqa: BLE001
            self._warn(f"the profiler could not be stopped cleanly ({exc!r}){lost}")
            return False
        return True

    def _end_window(self, *, partial: bool) -> None:
        decorator.set_first_call_hook(None)
        self._start_due = False
        window, self._window = self._window, None
        steps = tuple(self._window_steps)
        self._window_steps = []
        if window is None:
            return
        try:
            self._wind_down(window, steps, partial)
        except BaseException:
            # nothing else holds the window now: never leave its profiler on
            if self._draining is None or self._draining[0] is not window:
                self._stop_then(window)
            raise

    def _wind_down(self, window: Any, steps: tuple[int, ...], partial: bool) -> None:
        """The ended window's stop: now, or deferred until its kernels have run."""
        if window.recording and not window.overtaken():
            _mark(WINDOW_END)
        end_ns = time.time_ns()
        self._last_window_end = time.monotonic()
        short_steps = steps and (end_ns - self._window_start_ns) / len(steps) < DEFER_MAX_STEP_NS
        event = (window.end_marker_event()
                 if short_steps and not partial and MAX_DRAIN_STEPS > 0
                 and not window.overtaken() else None)
        if event is not None:
            # Deferred stop: torch's stop would synchronise the device here and process
            # Kineto's buffers while the device idles (~20-30 ms on an H200). Instead the
            # profiler runs on until this event has completed, at a later step boundary, or
            # at most MAX_DRAIN_STEPS steps or DRAIN_MAX_S seconds (_finish_drain), and then
            # stops without synchronising the device while it works through the steps queued
            # meanwhile. What it records after the window's end marker is cut from the report
            # and the trace.
            if (DRAIN_PAUSES_CPU_OPS and not self._step_threads_mixed
                    and self._step_thread == threading.get_ident()
                    and _torch.pause_cpu_ops()):
                self._cpu_ops_paused = self._step_thread
            timer = threading.Timer(DRAIN_MAX_S, self._drain_timed_out, (window,))
            timer.daemon = True
            timer.name = "torch-profiled-drain"
            self._draining = (window, event, (steps, partial, end_ns, self._window_start_ns),
                              0, timer)
            timer.start()
            return
        # the caller's whole cost of a window end: the stop, and the hand-over
        self._stop_then(window, then=(lambda: self._pipeline.submit(
            self._hand_over(window, steps, partial, end_ns))) if steps else None)

    def _hand_over(self, window: Any, steps: tuple[int, ...], partial: bool, end_ns: int,
                   start_ns: int | None = None, deferred: bool = False) -> "_EndedWindow":
        index = self._window_index
        self._window_index += 1
        self.windows_ended += 1
        return _EndedWindow(window, index, steps, partial,
                            self._window_start_ns if start_ns is None else start_ns, end_ns,
                            frozenset(decorator.RANGE_NAMES), _torch.distributed_info(),
                            time.monotonic() if deferred else None)

    def _resume_cpu_ops(self) -> None:
        """The calling thread records CPU ops again, unless this session's deferred stop runs
        and paused them there. Torch's switch is per thread: a thread paused by a stop that
        ended elsewhere (the timer, ``close()`` from another thread) resumes at its next step,
        session start or flush, whichever session that is."""
        if not _torch.PAUSED_CPU_OPS:
            return
        ident = threading.get_ident()
        if self._draining is not None and self._cpu_ops_paused == ident:
            return
        _torch.resume_cpu_ops()

    def _drain_timed_out(self, window: Any) -> None:
        """DRAIN_MAX_S after a deferred stop began and no step ended it (the program stopped
        stepping): stop it from this timer thread (deferred stops are all-threads windows)."""
        with self._lock:
            if self._draining is not None and self._draining[0] is window:
                self._finish_drain(force=True)

    def _finish_drain(self, *, force: bool) -> None:
        """Stop a window whose stop was deferred, once its end event has completed, or now
        (``force``, or after MAX_DRAIN_STEPS) after waiting for that event; either way without
        synchronising the whole device."""
        if self._draining is None:
            return
        window, event, (steps, partial, end_ns, start_ns), waited, timer = self._draining
        try:
            done = event.query()
        except Exception:  # noqa: BLE001 - a device error: take torch's own way out
            done = False
            force = True
        if window.overtaken():
            force = True  # nothing of ours to wait for: the program's profiler took over
        if not (done or force or waited + 1 >= MAX_DRAIN_STEPS):
            self._draining = (window, event, (steps, partial, end_ns, start_ns), waited + 1,
                              timer)
            return
        self._draining = None
        self._cpu_ops_paused = None  # a pause on another thread ends at that thread's next step
        timer.cancel()
        self._resume_cpu_ops()
        self._drain_log.append((waited + 1, done))
        synced = done
        if not done and not window.overtaken():
            # wait for the window's own kernels only: the steps queued after them keep the
            # device busy while Kineto processes its buffers (a device-wide synchronisation
            # would empty the queue first and leave the device idle meanwhile)
            try:
                event.synchronize()
                synced = True
            except Exception:  # noqa: BLE001 - a device error: take torch's own way out
                synced = False
        self._stop_then(window, sync=not synced, then=lambda: self._pipeline.submit(
            self._hand_over(window, steps, partial, end_ns, start_ns, deferred=True)))

    def _remove_raw(self, report: WindowReport) -> None:
        rawtraces.remove(report.raw_trace_path)

    def _build_report(self, ended: "_EndedWindow") -> WindowReport | None:
        """On the export worker: the window's report and its shaped trace file."""
        try:
            return self._analyse(ended)
        except Exception as exc:  # noqa: BLE001
            self._warn(f"window {ended.index} could not be analysed ({exc!r}); its report is lost")
            return None

    def _analyse(self, ended: "_EndedWindow") -> WindowReport | None:
        window, names, dist = ended.window, ended.names, ended.dist
        ended.window = None  # the profiler's results go when this report is built
        with self._lock:
            if self._pipeline.closed:  # the session ended past its deadline: nobody waits
                return None
        raw = rawtraces.new_path(ended.index)
        try:
            if ended.stopped_at is not None:  # a deferred stop: let the device's queue refill
                delay = ended.stopped_at + EXPORT_DELAY_S - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            # straight from Kineto's events where this torch allows it, on the export thread
            events = None if self.config.analysis_process else window.events()
            window.export_chrome_trace(raw)  # needs the profiler's results: in this process
            del window
            if events is not None:
                analysis = analyze(drop_warmup(events), names)
                del events
                shape_file(raw, names, dist)  # the trace exporters get (tracefile.shape_trace)
            else:
                # reading, shaping and analysing the trace: in the helper process, off this
                # program's GIL, unless it is off or cannot
                analysis = (self._analyse_in_helper(raw, names, dist)
                            if self.config.analysis_process else None)
                if analysis is None:
                    analysis = shape_and_analyse(raw, names, dist)
        except BaseException:
            rawtraces.remove(raw)  # no report will carry it: nobody else would remove it
            raise
        return WindowReport(
            window=ended.index,
            steps=ended.steps,
            partial=ended.partial,
            start_ns=ended.start_ns,
            end_ns=ended.end_ns,
            rank=int(dist["rank"]),
            world_size=int(dist["world_size"]),
            host=_torch.host_name(),
            pid=os.getpid(),
            device=_torch.device_name(self.activities),
            activities=tuple(self.activities),
            raw_trace_path=raw,
            **analysis.report_fields(),
        )

    def _analyse_in_helper(self, raw: str, names: frozenset[str],
                           dist: dict[str, Any]) -> Any:
        """The window's trace work in the shared helper process; None (the caller does it
        here) when the helper cannot, with one warning the first time it fails."""
        if not analysis_process.SUPPORTED:
            return None
        helper = analysis_process.shared()
        if helper.failed is not None:
            return None
        try:
            analysis, said = helper.analyse(raw, names, dist)
        except analysis_process.AnalysisProcessError as exc:
            if helper.failed is not None:
                _warn_helper_once(f"{exc}; windows are analysed in this process from now on")
            else:  # this window's trace only
                self._warn(str(exc) + "; analysing it in this process instead")
            return None
        for message in said:
            self._warn(message)
        return analysis

    def _why_no_report(self) -> str:
        if self._skip_reason:
            return f"no table: {self._skip_reason}."
        steps = self.step_index
        first_record = self.schedule.skip_first + self.schedule.wait + self.schedule.warmup
        needed = first_record + 1
        if steps >= needed:
            return f"no table: no window recorded a step in the {steps} step(s) that ended."
        if steps == 0:
            if not self.ambient:
                return ("no table: no step ended before the session ended (in a session a step "
                        "ends at s.step() or when a step=True function returns: call s.step() "
                        "at the end of each step).")
            return (
                "no table: no step ended before the program stopped (a step ends when a "
                "step=True function returns or at instrument.step(); in a program with "
                "neither, when a root @profiled call returns)."
            )
        return (
            f"no table: {steps} step(s) ended, but the schedule ({self.schedule.to_env()}) "
            f"records from step {first_record}, so at least {needed} steps are needed; "
            "run more steps or set PROFILED_SCHEDULE."
        )

    def _warn(self, message: str) -> None:
        warn(message, ProfilerWarning)


class _EndedWindow:
    """What the caller hands to the export worker when a window ends."""

    __slots__ = ("window", "index", "steps", "partial", "start_ns", "end_ns", "names", "dist",
                 "stopped_at")

    def __init__(self, window: Any, index: int, steps: tuple[int, ...], partial: bool,
                 start_ns: int, end_ns: int, names: frozenset[str], dist: dict[str, Any],
                 stopped_at: float | None = None):
        self.window = window
        self.index = index
        self.steps = steps
        self.partial = partial
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.names = names
        self.dist = dist
        self.stopped_at = stopped_at  # time.monotonic() of a deferred stop, else None


def _mark(name: str) -> None:
    """A zero-length marker event in the running profiler (see ``tracefile.shape_trace``)."""
    _torch.range_exit(_torch.range_enter(name))


# ---------------------------------------------------------------- process-wide state

_state_lock = threading.RLock()
_PENDING: list[Session] = []
"""Sessions whose window's stop waits for the thread that started it (``_stop_then``)."""
_overrides: dict[str, Any] = {}
_ambient: Session | None = None
_explicit: Session | None = None
_current: Session | None = None  # _explicit or _ambient: what decorated calls report to
_shut_down = False
_atexit_registered = False


def _run_pending_stops() -> None:
    """Stop the windows that wait for this thread (or whose thread has ended)."""
    for sess in list(_PENDING):
        pending = sess._pending_stop
        if pending is None or not (pending[0].stoppable_here() or pending[0].owner_gone()):
            continue  # not this thread's to stop (checked before any lock: calls stay cheap)
        with sess._lock, atomic():
            sess._run_pending_stop()


def _steps_declared_by_decoration() -> None:
    """A ``step=True`` decoration was applied (``decorator.declare_steps``)."""
    for sess in (_ambient, _explicit):
        if sess is not None:
            sess._steps_declared = True


def _seen() -> tuple[Any, ...]:
    cur = _current
    if cur is None:
        return (None, _shut_down, bool(_torch.PAUSED_CPU_OPS))
    return (cur, _shut_down, bool(_torch.PAUSED_CPU_OPS), cur.finished, cur.closed,
            cur._started)


def _refresh_idle() -> None:
    """Decorated calls may skip all bookkeeping when no session needs to see them.

    Lock-free (it runs under sessions' locks, which ``_state_lock`` holders also take), so it
    checks that what it read still holds after ``set_idle``: a ``configure()``, ``shutdown()``
    or session change on another thread in between would otherwise be overwritten by a stale
    flag (idle calls then never make the new ambient session)."""
    while True:
        seen = _seen()
        cur = seen[0]
        if _torch.PAUSED_CPU_OPS and (cur is None or cur.finished or cur.closed):
            # a thread a deferred stop paused must still reach session_for_calls to resume
            decorator.set_idle(False, None)
        elif cur is None:
            decorator.set_idle(seen[1])
        else:
            decorator.set_idle(cur.finished or cur.closed, cur if cur._started else None)
        if _seen() == seen:
            return


def ambient_config() -> Config:
    """The configuration the ambient session uses: the environment, then ``configure()``."""
    config = Config.from_env()
    if _overrides:
        config = config.replace(**_overrides)
    return config


def _builtin_kwargs(config: Config) -> dict[str, dict[str, Any]]:
    return {
        "trace": {"dir": config.trace_dir, "gzip": config.trace_gzip, "keep": config.trace_keep,
                  "max_mb": config.trace_max_mb},
        "json": {"path": config.json_path},
    }


def _register_atexit() -> None:
    """Export what is queued when the interpreter exits, before the thread pools go.

    Exporters (OpenTelemetry's among them) use ``concurrent.futures``, which refuses new work
    once its own exit hook has run, and that hook runs at threading shutdown, before
    ``atexit``. So our hook is a threading exit hook too, registered after that module's
    (they run last-registered first); ``atexit`` where this Python has no such hook.
    """
    global _atexit_registered
    if _atexit_registered:
        return
    _atexit_registered = True
    import concurrent.futures.thread  # noqa: F401 - registers its exit hook before ours

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_at_exit)
            return
        except RuntimeError:  # already shutting down
            pass
    atexit.register(_at_exit)


_exporter_warnings_seen: set[str] = set()


def _resolve_warning_once(config: Config) -> list[Any]:
    """Resolve the ambient exporters; a warning about a name is given once per process, like
    warnings about other environment values (the ambient session is rebuilt by configure())."""
    def warn_once(message: str, category: type[Warning]) -> None:
        if message not in _exporter_warnings_seen:
            _exporter_warnings_seen.add(message)
            warn(message, category)

    return resolve_exporters(config.exporters, builtin_kwargs=_builtin_kwargs(config),
                             warn=warn_once)


def session_for_calls() -> Session | None:
    """The session a decorated call reports to, or None when none needs it."""
    cur = _current
    if cur is None:
        cur = _make_ambient()
        if cur is None:
            _resume_idle_thread()
            return None
    if not cur._started:
        cur._start()
    if cur.finished:
        _resume_idle_thread()
        return None
    return cur


def _resume_idle_thread() -> None:
    """No session wants this call: resume the thread if a deferred stop paused it, and let
    decorated calls go idle again once no thread is left paused (``_refresh_idle`` kept them
    awake for it). Rare: idle calls do not get here."""
    _torch.resume_cpu_ops()
    if _PENDING:
        _run_pending_stops()
    if not _torch.PAUSED_CPU_OPS:
        _refresh_idle()


_helper_warned = False


def _warn_helper_once(message: str) -> None:
    global _helper_warned
    if not _helper_warned:
        _helper_warned = True
        warn(message, ProfilerWarning)


def _make_ambient() -> Session | None:
    global _ambient, _current
    with _state_lock:
        if _current is not None:
            return _current
        if _shut_down:
            return None
        config = ambient_config()
        if not config.enabled:
            sess = Session(config, [], ambient=True)
            sess.finished = True
        else:
            exporters = _resolve_warning_once(config)
            sess = Session(config, exporters, ambient=True)
            if not exporters:
                # nothing would see a window: open none (PROFILED_EXPORTERS=none, or every
                # name unknown, each of which has warned already)
                sess.finished = True
                message = ("no exporter named in PROFILED_EXPORTERS could be used, so no "
                           "profiler windows are opened (decorated calls cost what idle ones do)")
                if config.exporters and message not in _exporter_warnings_seen:
                    _exporter_warnings_seen.add(message)
                    warn(message, ExporterWarning)
        _ambient = sess
        _current = sess
        _register_atexit()
        _refresh_idle()
        return sess


def _enter_explicit(sess: Session) -> None:
    global _explicit, _current
    with _state_lock:
        if _explicit is not None:
            raise RuntimeError(
                "a torch-profiled session is already open; sessions do not nest "
                "(one torch profiler per process)"
            )
        if sess.closed:
            raise RuntimeError("this session has ended; create a new one with session(...)")
        if _ambient is not None:
            with _ambient._lock, atomic():
                if _ambient._window is not None:
                    if not _ambient._window_steps:
                        _ambient._skip_reason = ("an explicit session() started before the "
                                                 "ambient window recorded a step")
                    _ambient._end_window(partial=True)
                _ambient._finish_drain(force=True)  # its profiler must stop before ours starts
        _torch.resume_cpu_ops()  # a stop the timer ended left this thread paused
        _explicit = sess
        _current = sess
        _register_atexit()
        sess._start()
        _refresh_idle()


def _exit_explicit(sess: Session) -> None:
    global _explicit, _current
    try:
        sess.close()
    finally:
        with _state_lock:
            if _explicit is sess:
                _explicit = None
                _current = _ambient
            _refresh_idle()


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
        ("exporters", exporters), ("schedule", schedule), ("activities", activities),
        ("record_shapes", record_shapes), ("profile_memory", profile_memory),
        ("with_stack", with_stack), ("with_flops", with_flops),
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

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._pipeline.close(self.config.export_timeout_s)
        _refresh_idle()


def configure(**fields: Any) -> None:
    """Set the ambient configuration from code (overrides the environment).

    Unknown field names raise ``TypeError``, bad values ``ValueError``/``TypeError``. The
    current ambient session (if any) is closed (an open window is exported as partial) and a
    new one starts with the next decorated call.
    """
    global _ambient, _current, _shut_down
    _reject_unknown(fields)
    candidate = dict(_overrides)
    candidate.update(fields)
    Config().replace(**candidate)  # validates every value
    if "exporters" in fields:
        check_exporter_names(Config().replace(exporters=fields["exporters"]).exporters)
    with _state_lock:
        old = _ambient
        _overrides.clear()
        _overrides.update(candidate)
        _ambient = None
        if _current is old:
            _current = _explicit
        _shut_down = False
        _refresh_idle()
    if old is not None:
        old.close()


def step() -> None:
    """End the current step of the current session (explicit, else ambient)."""
    sess = _current
    if sess is None:
        sess = _make_ambient()
    if sess is not None:
        if not sess._started:
            sess._start()
        sess.step()
    else:
        _torch.resume_cpu_ops()  # after shutdown() from another thread during a stop
        if _PENDING:
            _run_pending_stops()


def flush(timeout_s: float | None = None) -> bool:
    """Wait until every window that has ended so far has been exported by every exporter.

    Reports are built and exported on background threads; call this before reading what an
    exporter produced (a test, a notebook cell). Returns False if ``timeout_s`` passed first.
    """
    _resume_idle_thread()
    if _PENDING:
        _run_pending_stops()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    ok = True
    for sess in [s for s in (_explicit, _ambient) if s is not None]:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ok = sess.flush(left) and ok
    return ok


def shutdown() -> None:
    """End every session: open windows that recorded steps are exported (``partial=True``);
    then the analysis helper process leaves (a later window starts a new one). All within one
    ``export_timeout_s`` (the longest of the sessions'), whatever the exporters do."""
    deadline = _close_sessions()
    if _PENDING:  # windows this thread started (or whose thread has ended)
        _run_pending_stops()
    _torch.end_orphaned_profiler()  # none should be left; if one is, it must not outlive us
    _resume_idle_thread()
    analysis_process.close_shared(max(0.0, deadline - time.monotonic()))


def _close_sessions() -> float:
    """Close every session within one deadline (returned, ``time.monotonic()``)."""
    global _ambient, _explicit, _current, _shut_down
    with _state_lock:
        sessions = [s for s in (_explicit, _ambient) if s is not None]
        _shut_down = True
        _ambient = _explicit = _current = None
        _refresh_idle()
    timeout = max((s.config.export_timeout_s for s in sessions),
                  default=Config().export_timeout_s)
    deadline = time.monotonic() + timeout
    for sess in sessions:
        try:
            sess.close(deadline - time.monotonic())
        except Exception as exc:  # noqa: BLE001
            warn(f"torch-profiled shutdown failed: {exc!r}", ExporterWarning)
    return deadline


def _reset_for_tests() -> None:
    """Close everything and forget ``configure()``: a fresh process, as far as we can tell."""
    global _shut_down
    _close_sessions()  # the analysis helper stays: starting one per test costs ~0.1 s
    if _PENDING:  # stops waiting for this thread, or for one that has ended
        _run_pending_stops()
    _torch.end_orphaned_profiler()
    _torch.resume_cpu_ops()
    # the step=True functions of the test modules imported so far would make every test's
    # root calls end no step: a test that wants them declared decorates its own
    decorator.STEPS_DECLARED = False
    _reset_warnings()
    _exporter_warnings_seen.clear()
    with _state_lock:
        _overrides.clear()
        _shut_down = False
        _refresh_idle()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) never exports the parent's windows, never stops the
    parent's profiler (its state is a copy) and starts none of its own: it forgets every
    session without touching torch, and its decorated calls run idle."""
    global _ambient, _explicit, _current, _shut_down, _state_lock
    _state_lock = threading.RLock()  # the parent may have held it while forking
    _ambient = _explicit = _current = None
    _shut_down = True
    _PENDING.clear()  # the parent's windows: never stopped from here
    _torch.after_fork_in_child()
    decorator.set_first_call_hook(None)
    decorator.set_idle(True)
    if analysis_gc_paused():  # forked while the export worker had the collector paused
        gc.enable()
    # forked while a deferred stop paused this thread's CPU ops (the DataLoader workers an
    # epoch's first batch starts): the child records them again; the other threads are gone
    _torch.resume_cpu_ops()
    _torch.PAUSED_CPU_OPS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _at_exit() -> None:
    """Runs at threading shutdown, before non-daemon threads are joined: if one still runs
    (a training thread the main thread left running), end the sessions only after it, from
    ``atexit``."""
    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if others:
        atexit.register(shutdown)
        return
    shutdown()

