"""When windows open: a pure planner over steps and the clock, testable without torch.

Given a step, ``plan`` says what it does (``Action``) and whether a new window cycle starts
there; nothing changes until ``commit``. A cycle is the schedule's warm-up + active steps from
the step it starts at; it starts where the schedule's own table (``Schedule.action``) starts
one, or, with sampling (``every``/``sample_rate``), where ``Sampling.opens`` says, spaced by
``min_interval_s``; a fired trigger opens one at the next step; ``max_windows`` caps them all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .sampling import Action, Sampling, Schedule

__all__ = ["Plan", "WindowPlanner"]


@dataclass(frozen=True)
class Plan:
    """What a step does: its action; ``opens`` where a window cycle starts at it (then the
    commit counts a window, and consumes a pending trigger where ``by_trigger``)."""

    action: Action
    opens: bool = False
    by_trigger: bool = False
    cycle_over: bool = False  # the cycle before this step has ended


class WindowPlanner:
    """The window-opening policy of one session."""

    def __init__(
        self,
        schedule: Schedule,
        sampling: Sampling,
        *,
        max_windows: int | None = None,
        min_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
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
        opens, by_trigger = self._opens_at(step, window_open)
        if not opens:
            return Plan(Action.NONE, by_trigger=by_trigger, cycle_over=over)
        first = (
            Action.WARMUP
            if sched.warmup
            else (Action.RECORD if sched.active > 1 else Action.RECORD_AND_SAVE)
        )
        return Plan(first, opens=True, by_trigger=by_trigger, cycle_over=over)

    def capped(self) -> bool:
        return self.max_windows is not None and self.windows_opened >= self.max_windows

    def next_possible(self, step: int) -> int | None:
        """The first step at or after ``step`` where a window may open (triggers aside)."""
        if self.capped():
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

    def in_cycle(self) -> bool:
        return self.cycle_start is not None

    # ------------------------------------------------------------ commits

    def commit(self, plan: Plan, step: int) -> Action:
        """Make ``plan`` (from ``plan(step)``) happen; its action."""
        if plan.by_trigger:
            self.trigger_pending = False
        if plan.cycle_over:
            self.cycle_start = None
        if plan.opens:
            self.cycle_start = step
            self.windows_opened += 1
        return plan.action

    def advance(self, step: int, *, window_open: bool = False) -> Action:
        """``commit(plan(step))``: the action of ``step``."""
        return self.commit(self.plan(step, window_open=window_open), step)

    def triggered(self) -> None:
        """A trigger fired (signal handler or poll thread): a window opens at the next step."""
        self.trigger_pending = True

    def window_ended(self) -> None:
        self.last_window_end = self.clock()

    # ------------------------------------------------------------ the rule

    def _opens_at(self, step: int, window_open: bool) -> tuple[bool, bool]:
        """(a cycle may start at ``step``, a pending trigger is consumed there)."""
        sched = self.schedule
        if self.trigger_pending:
            return (not self.capped(), True)
        if self.capped():
            return False, False
        if self.sampling.enabled:
            if not self.sampling.opens(step - sched.skip_first):
                return False, False
            gap = self.min_interval_s
            if not gap:
                return True, False
            last = self.clock() if window_open else self.last_window_end
            return last is None or self.clock() - last >= gap, False
        # the schedule: torch's table, a window starting where its cycle does
        if sched.action(step) is Action.NONE:
            return False, False
        return (step == 0 or sched.action(step - 1) in (Action.NONE, Action.RECORD_AND_SAVE), False)
