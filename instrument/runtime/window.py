"""One session's profiler windows, from open to stopped: the window room.

A window is opened (a ``ProfilerWindow``, not started), begun (its profiler started at its
first recorded step, or its first warm-up step with a device; the ambient session starts it at
that step's first decorated call), marked at each recorded step, and ended: stopped now, or
deferred until its kernels have run, by its owner thread (``stops``), and handed to the
session's pipeline.

Every method runs under the session's lock, in an ``atomic()`` block where it starts or stops a
profiler. The session calls ``transition`` at each step boundary, which calls them through
the table ``TRANSITIONS``.

``Windows`` holds no session: its configuration and the session's parts it uses (planner,
cost ledger, stops, lock) come in as arguments, the session's step as ``now()`` (``Now``), and
what happens goes back through the session's methods it was given (``lost(why)``: why no
report came; ``warn``) or what its methods return.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from instrument.base.warn import warn

from ..analysis.kineto_json import STEP_MARKER, WINDOW_END
from ..base.report import WindowReason
from ..export import builder as reporting
from ..export.pipeline import describe
from . import _torch, ledger, state, stops
from ._atomic import atomic
from .config import Config
from .sampling import Action
from .stops import TORCH_FAILURES, Recorded, Stops

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

WARMUP_PAUSES_CPU_OPS = True
"""A window that records its warm-up (a device's: ``Windows.begin``) records no CPU operators
or ranges of the thread that steps during its warm-up steps (``state.cpu_ops``, the drain's
switch: ``stops.DRAIN_PAUSES_CPU_OPS``); it records them again from the first recorded step.
The profiler still starts at the warm-up, so CUPTI's start-up and the slow first launches land
there (their runtime calls and kernels are still recorded, and cut with the warm-up), but the
warm-up step's operators, cut from the report and the trace anyway, no longer cost their
recording, the stop's processing and the trace export (on an H100, ~1,300 kernels a step: a
few thousand events of the window's ~46,000). Only on the thread that started the window's
profiler, and not once a second thread has stepped in the session (a thread's switch can
only be turned back on by itself); other threads an all-threads window records are not
paused (their warm-up is cut by time)."""


class Now(NamedTuple):
    """Where the session is, as a window's first decorated call needs it (``Windows.now``)."""

    action: Action  # the step in progress's
    step: int
    step_thread: int | None  # the thread of the last step
    closed: bool
    window_index: int  # the index the open window's report will have


@dataclass
class Windows:
    """The open window of a session and its transitions; its stop is ``stops``'.

    ``config``, ``activities``, ``exporters`` (those with ``window_started`` are told when a
    window begins: ``window_hooks``); ``planner`` and ``costs``:
    the session's window policy and cost ledger; ``lock``: the session's; ``now()``: where
    the session is; ``warn(message)``; ``lost(why)``: why the session has no report."""

    config: Config
    activities: tuple[str, ...]
    exporters: list[Any]
    planner: Any
    costs: ledger.Ledger
    lock: Any
    now: Callable[[], Now]
    warn: Callable[[str], None]
    lost: Callable[[str], None]
    stops: Stops
    window: _torch.ProfilerWindow | None = None
    steps: list[int] = field(default_factory=list)
    start_ns: int = 0
    step_start_ns: int = 0  # when the step in progress began recording
    active_started: bool = False  # the open window has begun its recorded steps
    told: bool = False  # the exporters' window_started hooks were called
    start_due: bool = False  # its profiler waits for the step's first decorated call
    reason: WindowReason | None = None  # why the open window opened (the planner's)
    cost: ledger.Entry | None = None  # the open window's figures as the caller measures them
    warmup_paused: int | None = None  # the thread whose CPU ops the warm-up paused
    record_warmup: bool = field(init=False)  # a device: record from the first warm-up step
    window_hooks: list[Callable[[int], Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.record_warmup = any(a != "cpu" for a in self.activities)
        self.window_hooks = [
            e.window_started for e in self.exporters if callable(getattr(e, "window_started", None))
        ]

    def transition(self, prev: Action, cur: Action, step: int, *, lazy: bool = False) -> None:
        """Do what ``TRANSITIONS`` names for (prev, cur) at the boundary into ``step``."""
        for what in TRANSITIONS[(prev, cur)]:
            if what == "save":
                if self.window is not None:
                    self.end(partial=False)
            elif what == "discard":
                if self.window is not None:
                    self.discard()
            elif what == "open":
                if self.window is None and not self.open():
                    return
            else:  # "begin"
                self.begin(cur, step, lazy=lazy)

    # ------------------------------------------------------------ open and begin

    def open(self) -> bool:
        """A new window (not started); False, with the session's reason, where none can be."""
        self.stops.finish_drain(force=True)  # torch profilers do not overlap
        self.stops.resume_cpu_ops()
        if state.PENDING:
            state.run_pending_stops()
            if state.PENDING:
                self.lost(
                    "a window's profiler records only the thread that started it, and that "
                    "thread has not come back to stop it, so the next window could not start"
                )
                return False
        if _torch.end_orphaned_profiler():
            self.warn(
                "a profiler of torch-profiled's was still on with no window to end it "
                "(a start or stop cut short); it was switched off, its events dropped"
            )
        if _torch.profiler_on():
            self.lost(foreign_reason())
            return False
        config = self.config
        cost, detail = self._opened()
        try:
            # Not prepared here: Kineto is prepared and started together at the first
            # recorded step. A prepared CUDA profiler makes a profiler the user starts during
            # our warm-up fail in its own prepare (seen on an H200 with torch 2.11), and
            # telemetry must never break the program. Warm-up steps are still counted.
            window = _torch.ProfilerWindow(
                self.activities,
                record_shapes=(config.record_shapes and detail) or config.with_flops,
                profile_memory=config.profile_memory and detail,
                with_stack=config.with_stack and detail,
                with_flops=config.with_flops,
                all_threads=config.all_threads,
            )
        except TORCH_FAILURES as exc:
            self.lost(f"the profiler could not be prepared ({describe(exc)})")
            self.warn(f"the profiler could not be prepared ({describe(exc)}); window skipped")
            return False
        self.window = window
        self.reason = self.planner.reason
        self.cost = cost
        self.steps = []
        self.active_started = False
        self.start_due = False
        self.warmup_paused = None
        return True

    def begin(self, cur: Action, step: int, *, lazy: bool = False) -> None:
        """Step ``step`` of the open window records (or warms up a device): start its profiler
        if it is not on yet (with ``lazy``, at the step's first decorated call), mark the step.

        With a device, the profiler records from the first warm-up step: its start-up costs
        (CUPTI's buffer request, slow first launches: ~3 ms on an H200) land in warm-up events,
        which the analysis and the trace drop (everything before the first step marker), as
        torch's own warm-up keeps them out of the recorded steps. CPU-only windows have no
        such cost and start at the first recorded step, so a profiler the user starts during
        the warm-up is unaffected. During a recorded warm-up the stepping thread records no
        CPU operators (``WARMUP_PAUSES_CPU_OPS``)."""
        window = self.window
        if window is None:  # this cycle's window could not open: wait for the next one
            return
        if cur is Action.WARMUP and not self.record_warmup:
            return
        if not window.recording:
            if lazy:
                self.start_due = True
                state.set_first_call_hook(self.first_call)
                return
            if not self._start(window):
                return
        if cur is Action.WARMUP:
            self._pause_warmup(window)
            return
        self._resume_warmup()
        self.step_start_ns = time.time_ns()  # the boundary: the last recorded step's end
        if not self.active_started:
            self.active_started = True
            self.start_ns = self.step_start_ns
            self.told = False
            if self.window_hooks or state.cpu_ops:
                state.set_first_call_hook(self.first_call)
        mark(STEP_MARKER + str(step))

    def _pause_warmup(self, window: _torch.ProfilerWindow) -> None:
        """The calling thread records no CPU ops in this warm-up step (``WARMUP_PAUSES_CPU_OPS``;
        a step boundary resumes it, and the next warm-up step pauses it again)."""
        if not WARMUP_PAUSES_CPU_OPS:
            return
        ident = threading.get_ident()
        step_thread, mixed = self.stops.stepping()
        if (
            mixed
            or step_thread not in (None, ident)  # (None: the session's first step)
            or window.owner.ident != ident
            or ident in state.cpu_ops.paused
        ):
            return
        if state.cpu_ops.pause():
            self.warmup_paused = ident

    def _resume_warmup(self) -> None:
        """The first recorded step: the warm-up's paused thread records again (here, or at its
        next decorated call: the first-call hook is set while a thread is paused)."""
        held, self.warmup_paused = self.warmup_paused, None
        if held is not None and held == threading.get_ident():
            state.cpu_ops.resume_here()

    def start_if_due(self, now: Now) -> None:
        """The ambient session's first decorated call of the step: start a due window."""
        if (
            self.start_due
            and self.window is not None
            and not now.closed
            and (self.config.all_threads or threading.get_ident() == now.step_thread)
        ):
            self.start_due = False
            with atomic():
                self.begin(now.action, now.step)

    def first_call(self) -> None:
        """The first decorated call of a window (``state.set_first_call_hook``), on its
        thread and in its context: a due window starts (ambient session), then the exporters
        that asked are told (``window_started``). Called on every decorated call while a
        paused thread has not resumed or a stop waits for its thread (but for the thread the
        warm-up paused, which its next step resumes)."""
        held = self.warmup_paused
        if held is None or held != threading.get_ident():
            state.cpu_ops.resume_here()
        if state.PENDING:
            state.run_pending_stops()
        with self.lock:
            now = self.now()
            self.start_if_due(now)
            paused = state.cpu_ops.paused
            others_paused = bool(paused) and (
                self.warmup_paused is None or len(paused) > 1 or self.warmup_paused not in paused
            )
            if not others_paused and not state.PENDING and not self.start_due:
                state.set_first_call_hook(None)
            if self.window is None or not self.active_started or self.told:
                return
            self.told = True
            index = now.window_index
        for hook in self.window_hooks:
            try:
                hook(index)
            except Exception as exc:  # noqa: BLE001 - telemetry never breaks the program
                owner = type(getattr(hook, "__self__", hook)).__name__  # its repr may raise
                self.warn(
                    f"exporter {owner}'s window_started raised {describe(exc, Exception)} at "
                    "window start; ignored"
                )

    def _start(self, window: _torch.ProfilerWindow) -> bool:
        if _torch.profiler_on():  # the user's profiler started during our warm-up
            self.lost(foreign_reason())
            self.drop()
            return False
        began = time.perf_counter_ns()
        try:
            started = start_keeping_warnings(window)
        except TORCH_FAILURES as exc:
            self.warn(f"the profiler could not start ({describe(exc)}); window skipped")
            self.discard()
            return False
        except BaseException:
            # not torch's failure: the program's own exception (a timeout injected into this
            # thread, PyThreadState_SetAsyncExc) landed in the start: it is the program's,
            # and ``ProfilerWindow.start`` left no profiler on
            self.drop()
            raise
        finally:  # the caller's stall in the start (the last window's trace written first)
            if self.cost is not None:
                self.cost.start_stall_ns += time.perf_counter_ns() - began
        if not started:  # another session's window (ending on its thread) is on
            self.lost("another torch-profiled window's profiler was still on when this one was due")
            self.drop()
            return False
        return True

    # ------------------------------------------------------------ end

    def drop(self) -> None:
        """Forget the open window without touching torch (``ProfilerWindow.abandon``)."""
        self._resume_warmup()
        if self.window is not None:
            self.window.abandon()
        self.window = None
        self.steps = []
        self.start_due = False

    def discard(self) -> None:
        """Stop the open window's profiler; no report."""
        self._resume_warmup()
        state.set_first_call_hook(None)
        self.start_due = False
        window, self.window = self.window, None
        self.steps = []
        if window is not None:
            self.stops.stop_then(window, lost="")

    def end(self, *, partial: bool) -> None:
        """The window's end: stop it (now or deferred) and hand its report over."""
        self._resume_warmup()  # (a window ended in its warm-up: the session's close)
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
            if self.stops.draining is None or self.stops.draining.window is not window:
                self.stops.stop_then(window)
            raise

    def _wind_down(
        self, window: _torch.ProfilerWindow, steps: tuple[int, ...], partial: bool
    ) -> None:
        """The ended window's stop: now, or deferred until its kernels have run."""
        if window.recording and not window.overtaken():
            mark(WINDOW_END)
        end_ns = time.time_ns()
        if partial and steps and self.step_start_ns:
            # ended between steps (the session's close, the exit): what it recorded ends with
            # its last recorded step, not with the idle time until this stop
            end_ns = self.step_start_ns
        recorded = Recorded(steps, partial, self.start_ns, end_ns, self.reason, self.cost)
        self.costs.ended()  # window-free steps count from here
        self.stops.stop_stall_ns = 0
        self.planner.window_ended()
        short_steps = steps and (recorded.end_ns - recorded.start_ns) / len(steps) < (
            stops.DEFER_MAX_STEP_NS
        )
        event = (
            window.end_marker_event()
            if short_steps and not partial and stops.MAX_DRAIN_STEPS > 0 and not window.overtaken()
            else None
        )
        if event is None:  # the caller's whole cost of a window end: the stop, the hand-over
            self.stops.stop_then(
                window, then=(lambda: self.stops.hand_over(window, recorded)) if steps else None
            )
        else:  # (~20-30 ms less on an H200 than torch's synchronising stop)
            self.stops.defer(window, event, recorded)

    def _opened(self) -> tuple[ledger.Entry, bool]:
        """A window opens: its ledger entry (the budget may back off here), and whether it
        records the detail (stacks, shapes, memory: the budget's first back-off turns it
        off)."""
        config = self.config
        detail_on = config.record_shapes or config.profile_memory or config.with_stack
        cost = self.costs.opened(bool(detail_on), self.planner.halve_frequency)
        return cost, not self.costs.detail_off

    def overtaken_and_off(self) -> bool:
        """A profiler of the program's started and stopped while the window recorded (on its
        thread, or any for an all-threads window): its exit ended ours."""
        window = self.window
        return (
            window is not None
            and window.recording
            and window.overtaken()
            and not _torch.profiler_on()
        )


def foreign_reason() -> str:
    return (
        "your own torch.profiler was running when a window was due, so torch-profiled "
        "started none (a second profiler breaks the first); the @profiled ranges are "
        "in your profile"
    )


def mark(name: str) -> None:
    """A zero-length marker event in the running profiler (see ``kineto_json.shape_trace``)."""
    _torch.range_exit(_torch.range_enter(name))


def start_keeping_warnings(window: _torch.ProfilerWindow) -> bool:
    """``window.start()`` with the warnings torch gives there (``CUDA is not available,
    disabling CUDA profiling`` for ``PROFILED_ACTIVITIES=cpu,cuda`` on a host without a GPU)
    issued as the SDK's own (``warn``: never raised): under ``python -W error`` torch's
    ``warnings.warn`` would raise out of its start and lose the window. The filters are
    process-wide, so another thread's warning given during the start is collected and
    issued the same way (never lost, never raised)."""
    with warnings.catch_warnings(record=True) as caught, state.own_switch():
        warnings.simplefilter("always")
        reporting.write_pending()  # the last window's trace first (reporting: why)
        started = window.start()
    for item in caught:
        category = item.category if issubclass(item.category, Warning) else UserWarning
        warn(str(item.message), category)
    return started
