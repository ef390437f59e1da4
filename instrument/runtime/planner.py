"""When windows open: a pure planner over steps and the clock, testable without torch.

Given a step, ``plan`` says what it does (``Action``) and whether a new window cycle starts
there; nothing changes until ``commit``. A cycle is the schedule's warm-up + active steps from
the step it starts at; it starts where the schedule's own table (``Schedule.action``) starts
one, or, with sampling (``every``/``sample_rate``), where ``Sampling.opens`` says, spaced by
``min_interval_s``; a fired trigger opens one at the next step; with ``slow_step`` (a factor,
``PROFILED_SLOW_STEP``) a step slower than that factor times the rolling median step time opens
one at the next step, spaced by ``min_interval_s`` too (``SlowSteps``), whether or not the
schedule's own windows are used up; ``max_windows`` caps them all. Each plan that opens a window
says why (``WindowReason``, carried to its report); what a slow step did not do, and why (a cap,
a period learned), is said once through ``tell`` (the session's: its exporters' notices).
"""

from __future__ import annotations

import dataclasses
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..base.report import WindowReason
from .sampling import Action, Sampling, Schedule

__all__ = [
    "SLOW_HISTORY",
    "SLOW_SETTLE_MAX_NS",
    "SLOW_SETTLE_STEPS",
    "SLOW_WARMUP",
    "UNSCHEDULED",
    "Plan",
    "SlowSteps",
    "WindowPlanner",
]

SLOW_HISTORY = 100
"""The rolling median is over the last this many judged step times."""

SLOW_WARMUP = 10
"""Judged steps that only feed the median before a step can be found slow."""

SLOW_SETTLE_STEPS = 5
SLOW_SETTLE_MAX_NS = 60_000_000_000
"""After a window's last step, this many steps, and the steps while the window is still
stopping or being analysed and exported (``busy``: reading its events holds the interpreter's
lock), are neither judged nor counted: they are slowed by the SDK, and must not open the next
window. ``busy`` is believed at most this long (60 s) after the window: a report lost on the
way must not end slow-step windows. (A fixed second here, before, kept a program of 2 ms steps
from judging any of its first ~500 steps after the default schedule's window at the start.)"""

PERIOD_MATCHES = 3
"""A slow step whose time recurs at a regular period is learned as normal once this many in a
row (the same interval between them, similar times) were seen: the first ones still open
windows; from then on those on the beat open none (a checkpoint, an eval every N steps)."""

UNSCHEDULED = 1 << 62
"""``next_possible`` where no step is scheduled but a slow step may still open a window."""


@dataclass(frozen=True)
class Plan:
    """What a step does: its action; ``opens`` where a window cycle starts at it (then the
    commit counts a window, and consumes a pending trigger where ``by_trigger``)."""

    action: Action
    opens: bool = False
    by_trigger: bool = False
    cycle_over: bool = False  # the cycle before this step has ended
    # why the window that ``opens`` opens (plans compare by what they do, not by this)
    reason: WindowReason | None = field(default=None, compare=False)


def _ms(ns: float) -> str:
    """A step time as people read it: ``41.2 ms``, ``850 µs``, ``12.30 s``."""
    if ns >= 10e9:
        return f"{ns / 1e9:.2f} s"
    return f"{ns / 1e6:.1f} ms" if ns >= 1e6 else f"{ns / 1e3:.0f} µs"


class SlowSteps:
    """The slow-step rule: step times in, "this step was slow" out.

    ``ended(step, now_ns, in_window)`` is called at every step boundary with one
    ``time.perf_counter_ns()``; the time from the previous boundary is the step's. Steps inside
    a window, those settling after one (``SLOW_SETTLE_STEPS``, ``busy``) and those in which a
    torch profiler started or stopped (the program's own too) are skipped; the others are
    judged against the median of the last ``SLOW_HISTORY`` judged steps, once
    ``SLOW_WARMUP`` of them are in, then added to it (kept sorted as they come and go: with
    the step's timing ~0.5 µs a step on the 2-core CPU box). A slow step that recurs at a
    regular period with a similar time (``PERIOD_MATCHES``) is learned as normal: it opens no
    window, and ``learned`` says so once."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.times: deque[int] = deque(maxlen=SLOW_HISTORY)
        self.switched_steps = 0  # steps left out because a profiler started or stopped in them
        self.median: int | None = None
        self._sorted: list[int] = []  # ``times`` in order
        self._last_ns: int | None = None
        self._last_switches = 0
        self._settle_left = 0
        self._settle_until_ns = 0
        self._slow_seen: deque[tuple[int, int]] = deque(maxlen=PERIOD_MATCHES)
        self.period: int | None = None  # steps between the slow steps learned as normal
        self._period_ns = 0  # their time
        self._period_last = 0  # the last of them
        self.periodic_steps = 0  # slow steps on that beat: they opened no window
        self.learned: str | None = None  # what was learned, once (the planner tells it)

    def ended(
        self, step: int, now_ns: int, in_window: bool, switches: int = 0, busy: bool = False
    ) -> WindowReason | None:
        """Step ``step`` ended at ``now_ns``: why it opens a window (it was slow), or None.
        ``switches``: profiler starts and stops so far (``_torch.switches``, read with
        ``now_ns``): a step in which it moved is neither judged nor counted (a profiler's
        start-up, torch's first of a process above all, is no step time of the program's).
        ``busy``: the last window is still being stopped, analysed or exported."""
        last, self._last_ns = self._last_ns, now_ns
        switched, self._last_switches = switches != self._last_switches, switches
        if in_window:
            self._settle_left = SLOW_SETTLE_STEPS
            self._settle_until_ns = now_ns + SLOW_SETTLE_MAX_NS
            return None
        if last is None:  # the first boundary: the step's start is unknown
            return None
        if switched:
            self.switched_steps += 1
            return None
        if self._settle_left or (busy and now_ns < self._settle_until_ns):
            self._settle_left = max(0, self._settle_left - 1)
            return None
        took = now_ns - last
        median, times, judged = self.median, self.times, len(self.times)
        slow = median is not None and judged >= SLOW_WARMUP and took > self.factor * median
        ordered = self._sorted
        if judged == SLOW_HISTORY:  # the oldest leaves
            del ordered[bisect_left(ordered, times[0])]
        times.append(took)
        insort(ordered, took)
        self.median = ordered[len(ordered) // 2]
        if not slow or median is None or self._recurs(step, took, median):
            return None
        return WindowReason(
            "slow_step",
            f"step {step} took {_ms(took)}, {took / max(median, 1):.1f}x the median "
            f"{_ms(median)} of the last {judged} steps (slow_step={self.factor:g})",
            step=step,
            step_time_us=took / 1000.0,
            median_step_us=median / 1000.0,
        )

    def _recurs(self, step: int, took: int, median: int) -> bool:
        """A slow step on the beat of a period learned (or learned now, with the slow steps
        before it): normal for this program, it opens no window."""
        period = self.period
        if period is not None and _similar(took, self._period_ns):
            gap = step - self._period_last
            beats = max(1, round(gap / period))
            if abs(gap - beats * period) <= beats * _slack(period):
                self._period_last = step
                self.periodic_steps += 1
                return True
        seen = self._slow_seen
        seen.append((step, took))
        if len(seen) < PERIOD_MATCHES:
            return False
        steps = [s for s, _ in seen]
        gaps = [b - a for a, b in zip(steps, steps[1:])]
        first = gaps[0]
        if first < 2 or any(abs(g - first) > _slack(first) for g in gaps):
            return False
        times = sorted(t for _, t in seen)
        if not _similar(times[0], times[-1]):
            return False
        self.period, self._period_ns, self._period_last = first, times[len(times) // 2], step
        self.periodic_steps += 1
        seen.clear()
        self.learned = (
            f"slow steps every {first} steps (steps {', '.join(map(str, steps))}: "
            f"{_ms(times[0])} to {_ms(times[-1])}, the median step {_ms(median)}) were learned "
            f"as periodic, normal for this program (a checkpoint, an eval): from now on those "
            f"open no window (slow_step={self.factor:g}); a slow step off that beat, or of "
            "another time, still does"
        )
        return True


def _similar(a: int, b: int) -> bool:
    """Two slow steps' times are alike: within a factor of two."""
    return max(a, b) <= 2 * max(min(a, b), 1)


def _slack(period: int) -> int:
    """How far off a period of ``period`` steps a slow step may land and still be on its beat."""
    return max(1, period // 10)


class WindowPlanner:
    """The window-opening policy of one session."""

    def __init__(
        self,
        schedule: Schedule,
        sampling: Sampling,
        *,
        max_windows: int | None = None,
        min_interval_s: float = 0.0,
        slow_step: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        tell: Callable[[str], None] | None = None,
    ) -> None:
        self.schedule = schedule
        self.sampling = sampling
        self.max_windows = max_windows
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.cycle_start: int | None = None
        self.windows_opened = 0
        self.last_window_end: float | None = None  # clock() when the last window ended
        self.trigger_pending = False
        self.slow = SlowSteps(slow_step) if slow_step else None
        self.slow_pending: WindowReason | None = None  # the step that just ended was slow
        self.reason: WindowReason | None = None  # why the last cycle opened
        self.notes: list[str] = []  # what a slow step did not open, and why (each said once)
        self._tell = tell or self.notes.append  # where they go (the session: its exporters)
        self._said: set[str] = set()
        self.stride = 1  # the schedule's cycles: only every stride-th opens (the budget)

    # ------------------------------------------------------------ queries

    def plan(self, step: int, *, window_open: bool = False) -> Plan:
        """What ``step`` does; ``window_open``: a window is open now (it ends at this step
        boundary, which counts as its end for ``min_interval_s``)."""
        sched = self.schedule
        over = False
        if self.cycle_start is not None:
            offset = step - self.cycle_start
            last = sched.warmup + sched.active - 1
            if offset < sched.warmup:
                return Plan(Action.WARMUP)
            if offset < last:
                return Plan(Action.RECORD)
            if offset == last:
                return Plan(Action.RECORD_AND_SAVE)
            over = True
        reason, by_trigger = self._opens_at(step, window_open)
        if reason is None:
            return Plan(Action.NONE, by_trigger=by_trigger, cycle_over=over)
        first = (
            Action.WARMUP
            if sched.warmup
            else (Action.RECORD if sched.active > 1 else Action.RECORD_AND_SAVE)
        )
        return Plan(first, opens=True, by_trigger=by_trigger, cycle_over=over, reason=reason)

    def capped(self) -> bool:
        return self.max_windows is not None and self.windows_opened >= self.max_windows

    def next_possible(self, step: int) -> int | None:
        """The first step at or after ``step`` where a window may open (triggers aside); with
        ``slow_step``, ``UNSCHEDULED`` where none is scheduled (a slow step may open one), and
        once capped it says (once) that slow steps open no more."""
        if self.capped():
            if self.slow is not None:
                self.say(
                    "max_windows",
                    f"max_windows={self.max_windows} windows have opened (PROFILED_MAX_WINDOWS):"
                    " slow steps open no more windows (and are no longer timed)",
                )
            return None
        nxt = self._next_scheduled(step)
        return UNSCHEDULED if nxt is None and self.slow is not None else nxt

    def _next_scheduled(self, step: int) -> int | None:
        sched = self.schedule
        if self.sampling.enabled:
            if self.sampling.sample_rate <= 0.0:
                return None
            rel = self.sampling.next_open(max(step - sched.skip_first, 0))
            return step + (1 << 20) if rel is None else rel + sched.skip_first
        if sched.finished(step):
            return None
        return sched.next_active(step)

    def in_cycle(self) -> bool:
        return self.cycle_start is not None

    # ------------------------------------------------------------ commits

    def commit(self, plan: Plan, step: int) -> Action:
        """Make ``plan`` (from ``plan(step)``) happen; its action."""
        if plan.by_trigger:
            self.trigger_pending = False
        if self.slow_pending is not None and not plan.opens:
            self._held_back(self.slow_pending)
        self.slow_pending = None  # a slow step opens a window at the next step, or none
        if plan.cycle_over:
            self.cycle_start = None
        if plan.opens:
            self.cycle_start = step
            self.windows_opened += 1
            self.reason = plan.reason
        return plan.action

    def advance(self, step: int, *, window_open: bool = False) -> Action:
        """``commit(plan(step))``: the action of ``step``."""
        return self.commit(self.plan(step, window_open=window_open), step)

    def _held_back(self, slow: WindowReason) -> None:
        """A slow step opened no window: say why, once per cap."""
        if self.capped():
            cap = "max_windows"
            why = f"max_windows={self.max_windows} windows have opened (PROFILED_MAX_WINDOWS)"
        elif self.trigger_pending:
            return  # a trigger's window is due (and its own cap said so)
        else:
            cap = "min_interval_s"
            why = (
                f"min_interval_s={self.min_interval_s:g} has not passed since the last window "
                "ended (PROFILED_MIN_INTERVAL_S)"
            )
        self.say(
            cap,
            f"a slow step opened no window: {slow.detail}, but {why}; later slow steps held "
            "back by this cap are not announced",
        )

    def say(self, key: str, message: str) -> None:
        """Tell ``message`` (``tell``; by default into ``notes``) unless one for ``key`` was
        told already."""
        if key not in self._said:
            self._said.add(key)
            self._tell(message)

    def triggered(self) -> None:
        """A trigger fired (signal handler or poll thread): a window opens at the next step."""
        self.trigger_pending = True

    def step_ended(self, step: int, now_ns: int, switches: int = 0, busy: bool = False) -> bool:
        """With ``slow_step``: step ``step`` ended at ``now_ns`` (``time.perf_counter_ns()``,
        once per step boundary, before its work; ``switches`` and ``busy`` read with it, see
        ``SlowSteps.ended``); True when it was slow, and then the plan of the next step opens
        a window if the caps and ``min_interval_s`` allow."""
        slow = self.slow
        if slow is None:
            return False
        self.slow_pending = slow.ended(step, now_ns, self.cycle_start is not None, switches, busy)
        if slow.learned is not None:
            self._tell(slow.learned)
            slow.learned = None
        return self.slow_pending is not None

    def window_ended(self) -> None:
        self.last_window_end = self.clock()

    def halve_frequency(self) -> str:
        """Open half as many windows from now on (``PROFILED_OVERHEAD_BUDGET``): ``every``
        doubled, else the sample rate halved, else only every other cycle of the schedule
        opens (and so on); what it did, for the next report."""
        sampling = self.sampling
        if sampling.every is not None:
            self.sampling = dataclasses.replace(sampling, every=sampling.every * 2)
            return f"a window every {sampling.every * 2} steps instead of {sampling.every}"
        if sampling.enabled:
            rate = sampling.sample_rate / 2
            self.sampling = dataclasses.replace(sampling, sample_rate=rate)
            return f"sample_rate {rate:g} instead of {sampling.sample_rate:g}"
        self.stride *= 2
        return f"one in {self.stride} of the schedule's cycles opens a window"

    # ------------------------------------------------------------ the rule

    def _opens_at(self, step: int, window_open: bool) -> tuple[WindowReason | None, bool]:
        """(why a cycle starts at ``step``, or None; a pending trigger is consumed there)."""
        if self.trigger_pending:
            why = WindowReason("trigger", f"a trigger fired; the window opened at step {step}")
            return (None if self.capped() else why), True
        if self.capped():
            return None, False
        reason = self._due(step, window_open)
        if reason is None and self.slow_pending is not None and self._spaced(window_open):
            reason = self.slow_pending
        return reason, False

    def _spaced(self, window_open: bool) -> bool:
        """``min_interval_s`` has passed since the last window ended (one ending now: not)."""
        gap = self.min_interval_s
        if not gap:
            return True
        last = self.clock() if window_open else self.last_window_end
        return last is None or self.clock() - last >= gap

    def _due(self, step: int, window_open: bool) -> WindowReason | None:
        """Why the schedule or sampling opens a window at ``step``, or None."""
        sched, sampling = self.schedule, self.sampling
        if sampling.enabled:
            if not sampling.opens(step - sched.skip_first) or not self._spaced(window_open):
                return None
            every = f"every {sampling.every} steps, " if sampling.every else ""
            if sampling.sample_rate < 1.0:
                return WindowReason(
                    "sample",
                    f"step {step} was drawn ({every}sample_rate={sampling.sample_rate:g}, "
                    f"seed {sampling.seed})",
                )
            return WindowReason("every", f"a window every {sampling.every} steps, at step {step}")
        # the schedule: torch's table, a window starting where its cycle does
        if sched.action(step) is Action.NONE:
            return None
        if step and sched.action(step - 1) not in (Action.NONE, Action.RECORD_AND_SAVE):
            return None
        if ((step - sched.skip_first) // sched.cycle) % self.stride:
            return None  # the budget's back-off skips this cycle
        return WindowReason("schedule", f"the schedule ({sched.to_env()}) opens one at step {step}")
