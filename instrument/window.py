"""One session's profiler windows, from open to stopped: the window room.

A window is opened (a ``ProfilerWindow``, not started), begun (its profiler started at its
first recorded step, or its first warm-up step with a device; the ambient session starts it at
that step's first decorated call), marked at each recorded step, and ended: stopped now, or
deferred until its kernels have run (``DeferredStop``), and handed to the session's pipeline.
Its profiler records the thread that started it, and only that thread can stop it: a stop due
on another thread waits for the owner (``PendingStop``). A window the program's own
torch.profiler overtook is abandoned, never stopped (that would end the program's).

Every method runs under the session's lock, in an ``atomic()`` block where it starts or stops a
profiler. ``Session._transition`` calls them through the table ``TRANSITIONS``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _torch, state
from ._atomic import atomic
from .sampling import Action
from .tracefile import STEP_MARKER, WINDOW_END

if TYPE_CHECKING:
    from .sessions import Session

MAX_DRAIN_STEPS = 4
"""A CUDA window's deferred stop waits at most this many step boundaries for the window's
kernels to have run, then waits for them (not for the whole device) and stops; 0 stops at the
window's end the way torch does (synchronising the device first)."""
DRAIN_MAX_S = 2.0
"""... and at most this long, should the program stop ending steps (a timer stops it; the
stop itself waits for the window's thread, ``PendingStop``)."""
DEFER_MAX_STEP_NS = 250_000_000
"""Deferred only where the window's steps took less than this on average: a longer step hides
a synchronising stop's ~20-30 ms, and would keep the profiler on for long after the window."""
DRAIN_PAUSES_CPU_OPS = True
"""During a deferred stop the thread that steps records no CPU operators or ranges
(``state.cpu_ops``): what the profiler records after the window's end is cut anyway, and
recording it cost each drained step and the stop's processing (H200: the stop 49 -> 34 ms on
the caller; sampled 97.1-99.0% -> 98.5-99.6% over BENCHMARKS.md's runs). Not once a second
thread has stepped in the session (a thread's switch can only be turned back on by itself)."""

# What happens at a step boundary, by (previous action, this step's action), after torch's
# ``action_map``: "save" ends the window (its report is exported), "discard" drops it, "open"
# makes a new one (only where a cycle starts), "begin" starts its profiler if due and marks
# the step. Pairs not listed do nothing.
_A = Action
TRANSITIONS: dict[tuple[Action, Action], tuple[str, ...]] = {}
for _prev in _A:
    for _cur in _A:
        _steps: list[str] = []
        if _prev is _A.RECORD_AND_SAVE:
            _steps.append("save")
        if _cur is _A.NONE:
            if _prev in (_A.WARMUP, _A.RECORD):  # only with a hand-made schedule
                _steps.append("discard")
        else:
            if _prev in (_A.NONE, _A.RECORD_AND_SAVE):
                _steps.append("open")
            _steps.append("begin")
        TRANSITIONS[(_prev, _cur)] = tuple(_steps)
del _prev, _cur, _steps


@dataclass(frozen=True)
class Recorded:
    """What an ended window recorded: its steps, whether the session ended it early, and its
    wall-clock span (``time.time_ns()``)."""

    steps: tuple[int, ...]
    partial: bool
    start_ns: int
    end_ns: int


@dataclass
class DeferredStop:
    """A CUDA window whose stop waits until the event recorded at its end has completed (at a
    later step boundary), or at most ``MAX_DRAIN_STEPS`` steps or ``DRAIN_MAX_S`` seconds."""

    window: _torch.ProfilerWindow
    event: Any
    recorded: Recorded
    timer: threading.Timer
    waited: int = 0
    paused_thread: int | None = None  # the thread whose CPU ops it paused


@dataclass
class PendingStop:
    """A window's stop waiting for the thread that started its profiler."""

    window: _torch.ProfilerWindow
    sync: bool = True
    lost: str = "; window lost"
    then: Callable[[], None] | None = None


@dataclass
class Windows:
    """The open window of a session, its deferred or pending stop, and their transitions."""

    session: "Session"
    window: _torch.ProfilerWindow | None = None
    steps: list[int] = field(default_factory=list)
    start_ns: int = 0
    active_started: bool = False  # the open window has begun its recorded steps
    told: bool = False  # the exporters' window_started hooks were called
    start_due: bool = False  # its profiler waits for the step's first decorated call
    draining: DeferredStop | None = None
    pending: PendingStop | None = None
    # the last deferred stops, (steps waited, kernels had run): for the benches
    drain_log: collections.deque[tuple[int, bool]] = field(
        default_factory=lambda: collections.deque(maxlen=64))

    # ------------------------------------------------------------ open and begin

    def open(self) -> bool:
        """A new window (not started); False, with the session's reason, where none can be."""
        sess = self.session
        self.finish_drain(force=True)  # torch profilers do not overlap
        self.resume_cpu_ops()
        if state.PENDING:
            state.run_pending_stops()
            if state.PENDING:
                sess._skip_reason = (
                    "a window's profiler records only the thread that started it, and that "
                    "thread has not come back to stop it, so the next window could not start")
                return False
        if _torch.end_orphaned_profiler():
            sess._warn("a profiler of torch-profiled's was still on with no window to end it "
                       "(a start or stop cut short); it was switched off, its events dropped")
        if _torch.profiler_on():
            sess._skip_reason = foreign_reason()
            return False
        config = sess.config
        try:
            # Not prepared here: Kineto is prepared and started together at the first
            # recorded step. A prepared CUDA profiler makes a profiler the user starts during
            # our warm-up fail in its own prepare (seen on an H200 with torch 2.11), and
            # telemetry must never break the program. Warm-up steps are still counted.
            window = _torch.ProfilerWindow(
                sess.activities, record_shapes=config.record_shapes,
                profile_memory=config.profile_memory, with_stack=config.with_stack,
                with_flops=config.with_flops, all_threads=config.all_threads)
        except Exception as exc:  # noqa: BLE001
            sess._skip_reason = f"the profiler could not be prepared ({exc!r})"
            sess._warn(f"the profiler could not be prepared ({exc!r}); window skipped")
            return False
        self.window = window
        self.steps = []
        self.active_started = False
        self.start_due = False
        return True

    def begin(self, cur: Action, step: int, *, lazy: bool = False) -> None:
        """Step ``step`` of the open window records (or warms up a device): start its profiler
        if it is not on yet (with ``lazy``, at the step's first decorated call), mark the step.

        With a device, the profiler records from the first warm-up step: its start-up costs
        (CUPTI's buffer request, slow first launches: ~3 ms on an H200) land in warm-up events,
        which the analysis and the trace drop (everything before the first step marker), as
        torch's own warm-up keeps them out of the recorded steps. CPU-only windows have no
        such cost and start at the first recorded step, so a profiler the user starts during
        the warm-up is unaffected."""
        window = self.window
        if window is None:  # this cycle's window could not open: wait for the next one
            return
        if cur is Action.WARMUP and not self.session._record_warmup:
            return
        if not window.recording:
            if lazy:
                self.start_due = True
                state.set_first_call_hook(self.session._first_call)
                return
            if not self._start(window):
                return
        if cur is Action.WARMUP:
            return
        if not self.active_started:
            self.active_started = True
            self.start_ns = time.time_ns()
            self.told = False
            if self.session._window_hooks or state.cpu_ops:
                state.set_first_call_hook(self.session._first_call)
        mark(STEP_MARKER + str(step))

    def start_if_due(self, action: Action, step: int) -> None:
        """The ambient session's first decorated call of the step: start a due window."""
        sess = self.session
        if (self.start_due and self.window is not None and not sess.closed
                and (sess.config.all_threads or threading.get_ident() == sess._step_thread)):
            self.start_due = False
            with atomic():
                self.begin(action, step)

    def _start(self, window: _torch.ProfilerWindow) -> bool:
        sess = self.session
        if _torch.profiler_on():  # the user's profiler started during our warm-up
            sess._skip_reason = foreign_reason()
            self.drop()
            return False
        try:
            started = window.start()
        except Exception as exc:  # noqa: BLE001
            sess._warn(f"the profiler could not start ({exc!r}); window skipped")
            self.discard()
            return False
        if not started:  # another session's window (ending on its thread) is on
            sess._skip_reason = ("another torch-profiled window's profiler was still on when "
                                 "this one was due")
            self.drop()
            return False
        return True

    # ------------------------------------------------------------ end

    def drop(self) -> None:
        """Forget the open window without touching torch (``ProfilerWindow.abandon``)."""
        if self.window is not None:
            self.window.abandon()
        self.window = None
        self.steps = []
        self.start_due = False

    def discard(self) -> None:
        """Stop the open window's profiler; no report."""
        state.set_first_call_hook(None)
        self.start_due = False
        window, self.window = self.window, None
        self.steps = []
        if window is not None:
            self.stop_then(window, lost="")

    def end(self, *, partial: bool) -> None:
        """The window's end: stop it (now or deferred) and hand its report over."""
        state.set_first_call_hook(None)
        self.start_due = False
        window, self.window = self.window, None
        steps = tuple(self.steps)
        self.steps = []
        if window is None:
            return
        try:
            self._wind_down(window, steps, partial)
        except BaseException:
            # nothing else holds the window now: never leave its profiler on
            if self.draining is None or self.draining.window is not window:
                self.stop_then(window)
            raise

    def _wind_down(self, window: _torch.ProfilerWindow, steps: tuple[int, ...],
                   partial: bool) -> None:
        """The ended window's stop: now, or deferred until its kernels have run."""
        sess = self.session
        if window.recording and not window.overtaken():
            mark(WINDOW_END)
        recorded = Recorded(steps, partial, self.start_ns, time.time_ns())
        sess._planner.window_ended()
        short_steps = steps and (recorded.end_ns - recorded.start_ns) / len(steps) < (
            DEFER_MAX_STEP_NS)
        event = (window.end_marker_event()
                 if short_steps and not partial and MAX_DRAIN_STEPS > 0
                 and not window.overtaken() else None)
        if event is None:
            # the caller's whole cost of a window end: the stop, and the hand-over
            self.stop_then(window, then=(lambda: sess._hand_over(window, recorded))
                           if steps else None)
            return
        # Deferred stop: torch's stop would synchronise the device here and process Kineto's
        # buffers while the device idles (~20-30 ms on an H200). Instead the profiler runs on
        # until the event has completed (finish_drain) and then stops without synchronising
        # the device while it works through the steps queued meanwhile. What it records after
        # the window's end marker is cut from the report and the trace.
        timer = threading.Timer(DRAIN_MAX_S, self._drain_timed_out, (window,))
        timer.daemon = True
        timer.name = "torch-profiled-drain"
        drain = DeferredStop(window, event, recorded, timer)
        if (DRAIN_PAUSES_CPU_OPS and not sess._step_threads_mixed
                and sess._step_thread == threading.get_ident() and state.cpu_ops.pause()):
            drain.paused_thread = sess._step_thread
        self.draining = drain
        timer.start()

    def _drain_timed_out(self, window: _torch.ProfilerWindow) -> None:
        """DRAIN_MAX_S after a deferred stop began and no step ended it (the program stopped
        stepping): stop it from this timer thread (or leave the stop to the window's thread)."""
        with self.session._lock:
            if self.draining is not None and self.draining.window is window:
                self.finish_drain(force=True)

    def finish_drain(self, *, force: bool) -> None:
        """Stop a window whose stop was deferred, once its end event has completed, or now
        (``force``, or after MAX_DRAIN_STEPS) after waiting for that event; either way without
        synchronising the whole device."""
        drain = self.draining
        if drain is None:
            return
        window = drain.window
        try:
            done = drain.event.query()
        except Exception:  # noqa: BLE001 - a device error: take torch's own way out
            done = False
            force = True
        if window.overtaken():
            force = True  # nothing of ours to wait for: the program's profiler took over
        if not (done or force or drain.waited + 1 >= MAX_DRAIN_STEPS):
            drain.waited += 1
            return
        self.draining = None
        drain.timer.cancel()
        self.resume_cpu_ops()  # a pause on another thread ends at that thread's next step
        self.drain_log.append((drain.waited + 1, done))
        synced = done
        if not done and not window.overtaken():
            # wait for the window's own kernels only: the steps queued after them keep the
            # device busy while Kineto processes its buffers (a device-wide synchronisation
            # would empty the queue first and leave the device idle meanwhile)
            try:
                drain.event.synchronize()
                synced = True
            except Exception:  # noqa: BLE001 - a device error: take torch's own way out
                synced = False
        sess = self.session
        self.stop_then(window, sync=not synced,
                       then=lambda: sess._hand_over(window, drain.recorded, deferred=True))

    def resume_cpu_ops(self) -> None:
        """The calling thread records CPU ops again, unless this session's deferred stop runs
        and paused them there."""
        if not state.cpu_ops:
            return
        drain = self.draining
        if drain is not None and drain.paused_thread == threading.get_ident():
            return
        state.cpu_ops.resume_here()

    # ------------------------------------------------------------ stop

    def stop_then(self, window: _torch.ProfilerWindow, *, sync: bool = True,
                  lost: str = "; window lost", then: Callable[[], None] | None = None) -> None:
        """Stop ``window``'s profiler, then ``then()`` (its hand-over to the pipeline).

        Torch keeps a thread-local profiler in the locals of the thread that started it: only
        that thread can stop it. When another thread ends the window (its step, ``close()``,
        ``flush()``, the drain's timer), the stop waits for the owner (``state.PENDING``): its
        next step or decorated call, ``flush()``/``shutdown()``/``close()`` there, or its end
        (``_torch._ThreadLife`` stops the profiler as the thread ends; ``forget`` where even
        that could not run). No window opens meanwhile."""
        if window.stoppable_here():
            if self.stop(window, sync=sync, lost=lost) and then is not None:
                then()
            return
        self.pending = PendingStop(window, sync, lost, then)
        if self.session not in state.PENDING:
            state.PENDING.append(self.session)
        state.set_first_call_hook(self.session._first_call)

    def pending_is_here(self) -> bool:
        """The pending stop is this thread's to do (or its thread has ended). Lock-free."""
        pending = self.pending
        return pending is not None and (pending.window.stoppable_here()
                                        or pending.window.owner_gone())

    def run_pending(self) -> None:
        """Do the stop ``stop_then`` left for the window's owner thread, if this is that
        thread; forget the window if that thread has ended."""
        pending = self.pending
        if pending is None:
            return
        window = pending.window
        if window.owner_gone():
            self.pending = None
            window.forget()
            self.session._warn(f"the thread that recorded a window ({window.owner.name}) ended "
                               "before it could stop its profiler; that window is lost")
        elif window.stoppable_here():
            self.pending = None
            self.stop_then(window, sync=pending.sync, lost=pending.lost, then=pending.then)
        else:
            return
        if self.session in state.PENDING:
            state.PENDING.remove(self.session)

    def stop(self, window: _torch.ProfilerWindow, *, sync: bool = True,
             lost: str = "; window lost") -> bool:
        """Stop ``window``'s profiler; False where it was not stopped cleanly. A torch profiler
        the program started while the window recorded took torch's profiling state over:
        stopping ours would end the program's (and crash its trace export), so the window is
        abandoned instead, with a warning, and the program's profiler runs on."""
        sess = self.session
        if window.overtaken():
            sess._skip_reason = (
                "your own torch.profiler started while a torch-profiled window recorded; torch "
                "profilers do not nest, so torch-profiled dropped its window and left yours "
                "alone"
            )
            sess._warn(sess._skip_reason)
            window.abandon()
            return False
        try:
            window.stop(sync=sync)
        except Exception as exc:  # noqa: BLE001
            sess._warn(f"the profiler could not be stopped cleanly ({exc!r}){lost}")
            return False
        return True

    def overtaken_and_off(self) -> bool:
        """A profiler of the program's started and stopped while the window recorded (on its
        thread, or any for an all-threads window): its exit ended ours."""
        window = self.window
        return (window is not None and window.recording and window.overtaken()
                and not _torch.profiler_on())


def foreign_reason() -> str:
    return (
        "your own torch.profiler was running when a window was due, so torch-profiled "
        "started none (a second profiler breaks the first); the @profiled ranges are "
        "in your profile"
    )


def mark(name: str) -> None:
    """A zero-length marker event in the running profiler (see ``tracefile.shape_trace``)."""
    _torch.range_exit(_torch.range_enter(name))
