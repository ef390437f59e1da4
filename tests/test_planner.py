"""The window planner on its own: no profiler, a fake clock; decisions change nothing until
they are committed."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from instrument.runtime.planner import (
    PERIOD_MATCHES,
    SLOW_SETTLE_MAX_NS,
    SLOW_SETTLE_STEPS,
    SLOW_WARMUP,
    UNSCHEDULED,
    Plan,
    WindowPlanner,
)
from instrument.runtime.sampling import Action, Sampling, Schedule

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _run(
    planner: WindowPlanner, steps: int, clock: Clock | None = None, step_s: float = 0.0
) -> list[Action]:
    out = []
    for step in range(steps):
        out.append(planner.advance(step))
        if clock is not None:
            clock.now += step_s
    return out


@pytest.mark.filterwarnings("ignore:Profiler won.t be using warmup")
@pytest.mark.parametrize(
    "wait,warmup,active,repeat,skip_first",
    [
        (0, 1, 3, 1, 0),
        (1, 1, 2, 2, 0),
        (2, 0, 1, 3, 1),
        (0, 2, 2, 0, 3),
        (1, 0, 3, 0, 0),
    ],
)
def test_the_schedule_plans_the_actions_torch_profilers_schedule_gives(
    wait, warmup, active, repeat, skip_first
):
    planner = WindowPlanner(Schedule(wait, warmup, active, repeat, skip_first), Sampling())
    theirs = torch.profiler.schedule(
        wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first
    )
    assert [a.name for a in _run(planner, 40)] == [theirs(s).name for s in range(40)]


def test_a_plan_changes_nothing_until_it_is_committed():
    planner = WindowPlanner(Schedule(warmup=1, active=2), Sampling(every=5))
    planner.triggered()
    first = planner.plan(3)
    assert planner.plan(3) == first == Plan(Action.WARMUP, opens=True, by_trigger=True)
    assert planner.trigger_pending and planner.windows_opened == 0 and not planner.in_cycle()
    assert planner.commit(first, 3) is Action.WARMUP
    assert not planner.trigger_pending and planner.windows_opened == 1 and planner.in_cycle()
    assert [planner.advance(s) for s in (4, 5, 6)] == [
        Action.RECORD,
        Action.RECORD_AND_SAVE,
        Action.NONE,
    ]


def test_every_n_with_a_minimum_interval_skips_windows_due_too_soon():
    clock = Clock()
    planner = WindowPlanner(
        Schedule(warmup=0, active=1), Sampling(every=2), min_interval_s=5.0, clock=clock
    )
    opened = []
    for step in range(20):
        action = planner.advance(step, window_open=False)
        if action is Action.RECORD_AND_SAVE:
            opened.append(step)
            planner.window_ended()
        clock.now += 1.0  # a step a second: a window every 2 steps would be 2 s apart
    assert opened == [0, 6, 12, 18]


def test_max_windows_caps_every_way_of_opening_and_a_capped_trigger_is_consumed():
    planner = WindowPlanner(Schedule(warmup=0, active=1), Sampling(every=3), max_windows=2)
    assert [s for s in range(20) if planner.advance(s) is not Action.NONE] == [0, 3]
    assert planner.capped() and planner.next_possible(20) is None
    planner.triggered()
    assert planner.advance(20) is Action.NONE and not planner.trigger_pending


def test_next_possible_names_the_first_step_a_window_may_open():
    planner = WindowPlanner(Schedule(warmup=1, active=2, repeat=0, skip_first=4), Sampling())
    assert planner.next_possible(0) == 4
    rate_zero = WindowPlanner(Schedule(), Sampling(every=1, sample_rate=0.0))
    assert rate_zero.next_possible(0) is None


def test_the_planner_needs_no_torch():
    for module in ("planner.py", "sampling.py"):
        tree = ast.parse((ROOT / "instrument" / "runtime" / module).read_text())
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        imported |= {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0
        }
        assert "torch" not in imported, module


# ---------------------------------------------------------------- slow steps (issue 17, 4)

MS = 1_000_000  # ns


def _drive(
    planner: WindowPlanner,
    step_ms: list[float],
    clock: Clock | None = None,
    busy: frozenset[int] = frozenset(),
) -> dict:
    """Steps of ``step_ms[i]`` milliseconds, as the session drives the planner: at each
    boundary the step's end (``step_ended``; the steps in ``busy`` end while the last
    window is still exported), then the next step's plan, then a window that saved ends.
    Returns {step a window opened at: its reason}."""
    now_ns = 10**12
    opened = {}
    prev = planner.advance(0)
    if planner.windows_opened:
        opened[0] = planner.reason
    for step, ms in enumerate(step_ms):
        now_ns += int(ms * MS)
        if clock is not None:
            clock.now += ms / 1000.0
        planner.step_ended(step, now_ns, busy=step in busy)
        before = planner.windows_opened
        cur = planner.advance(step + 1, window_open=prev is not Action.NONE)
        if prev is Action.RECORD_AND_SAVE:
            planner.window_ended()
        if planner.windows_opened > before:
            opened[step + 1] = planner.reason
        prev = cur
    return opened


def _slow_only(**kw) -> WindowPlanner:
    """Only slow steps open windows (sample rate 0), each of 1 warm-up + 2 active steps."""
    kw.setdefault("slow_step", 3.0)
    return WindowPlanner(Schedule(warmup=1, active=2), Sampling(sample_rate=0.0), **kw)


def test_a_slow_step_opens_a_window_at_the_next_step_and_says_why():
    times = [10.0] * 40
    times[25] = 41.0
    opened = _drive(_slow_only(), times)
    assert list(opened) == [26]
    reason = opened[26]
    assert (reason.kind, reason.step) == ("slow_step", 25)
    assert reason.step_time_us == pytest.approx(41_000) and reason.median_step_us == 10_000
    assert reason.detail.startswith("step 25 took 41.0 ms, 4.1x the median 10.0 ms")


def test_the_warm_up_only_feeds_the_median():
    # step 0's start is unknown; steps 1-10 are the warm-up; step 11 is the first judged
    for slow, expected in ((10, []), (11, [12])):
        times = [10.0] * 30
        times[slow] = 100.0
        assert list(_drive(_slow_only(), times)) == expected, slow
    assert SLOW_WARMUP == 10


def test_the_factor_is_respected():
    for ms, expected in ((29.0, []), (31.0, [21])):
        times = [10.0] * 30
        times[20] = ms
        assert list(_drive(_slow_only(), times)) == expected, ms
    times = [10.0] * 30
    times[20] = 31.0
    assert _drive(_slow_only(slow_step=4.0), times) == {}


def test_a_window_and_the_steps_settling_after_it_are_not_judged():
    """The slow window's own steps (the profiler on) and the export after it are slow too:
    they neither open the next window nor count in the median."""
    planner = _slow_only()
    times = [10.0] * 300
    times[20] = 50.0  # opens a window at 21: steps 21-23
    for step in range(21, 24):
        times[step] = 200.0  # profiled steps are slow
    for step in range(24, 46):  # the export slows the steps while it runs (0.88 s)
        times[step] = 40.0
    times[60] = 50.0  # after the export: opens the next one (a fixed second kept it out)
    opened = _drive(planner, times, busy=frozenset(range(24, 46)))
    assert list(opened) == [21, 61]
    assert opened[61].median_step_us == 10_000  # the window's steps were not counted
    assert SLOW_SETTLE_STEPS >= 1 and SLOW_SETTLE_MAX_NS == 60_000_000_000


def test_the_settle_after_a_window_is_steps_not_a_second():
    """After a window, SLOW_SETTLE_STEPS steps and the export's are not judged, then every
    step is: with 2 ms steps a slow step 0.3 s after the window opens one (a fixed second of
    settling let none of the next ~500 steps be judged)."""
    times = [2.0] * 200
    times[20] = 20.0  # opens a window at 21
    times[150] = 200.0
    opened = _drive(_slow_only(), times, busy=frozenset(range(24, 40)))
    assert list(opened) == [21, 151]
    # the export is believed busy at most SLOW_SETTLE_MAX_NS: a report lost on the way does
    # not end slow-step windows
    times = [2.0] * 31_000
    times[20] = 20.0
    times[10_000] = 400.0  # 20 s after the window: still settling (believed busy)
    times[30_500] = 400.0  # 61 s after: judged
    opened = _drive(_slow_only(), times, busy=frozenset(range(24, 31_000)))
    assert list(opened) == [21, 30_501]


def test_slow_steps_open_windows_after_the_schedule_is_used_up():
    """The default schedule (one window at the start) and slow_step: a slow step long after
    it still opens a window; no scheduled one."""
    planner = WindowPlanner(Schedule(), Sampling(), slow_step=3.0)
    times = [2.0] * 300
    times[250] = 200.0
    opened = _drive(planner, times)
    assert [r.kind for r in opened.values()] == ["schedule", "slow_step"]
    assert list(opened) == [0, 251]
    assert planner.next_possible(300) == UNSCHEDULED


def test_a_periodic_slow_step_is_learned_as_normal():
    """Every 50th step a checkpoint: the first slow ones open windows, the third in a row at
    the same period and a similar time is learned as normal (said once in notes), and from
    then on they open none; a slow step off the beat, or of another time, still opens one."""
    planner = _slow_only()
    times = [10.0] * 700
    for step in range(49, 700, 50):
        times[step] = 80.0 if step != 449 else 78.0  # a step or two off time is still the beat
    times[400] = 60.0  # off the beat
    times[599] = 900.0  # on the beat but of another time
    opened = _drive(planner, times)
    assert list(opened) == [50, 100, 401, 600], opened
    assert PERIOD_MATCHES == 3 and planner.slow is not None and planner.slow.period == 50
    assert len(planner.notes) == 1 and "every 50 steps" in planner.notes[0]
    assert "learned as periodic" in planner.notes[0]
    assert planner.slow.periodic_steps == 11  # 149..649 but 599 (of another time)


def test_periods_are_not_learned_from_irregular_or_unlike_slow_steps():
    for slow, ms in (
        ((49, 99, 170, 230, 310), (80.0,) * 5),  # irregular gaps
        ((49, 99, 149, 199, 249), (40.0, 200.0, 40.0, 200.0, 40.0)),  # unlike times
    ):
        times = [10.0] * 320
        for step, t in zip(slow, ms):
            times[step] = t
        planner = _slow_only()
        opened = _drive(planner, times)
        assert list(opened) == [s + 1 for s in slow], (slow, ms)
        assert planner.notes == [] and planner.slow is not None and planner.slow.period is None


def test_a_cap_that_holds_a_slow_step_back_says_so_once():
    clock = Clock()
    spaced = _slow_only(min_interval_s=100.0, clock=clock)
    times = [10.0] * 300
    for slow in (20, 150, 250):
        times[slow] = 100.0
    assert list(_drive(spaced, times, clock)) == [21]
    (note,) = spaced.notes
    assert note.startswith("a slow step opened no window: step 150 took 100.0 ms")
    assert "min_interval_s=100 has not passed" in note and "PROFILED_MIN_INTERVAL_S" in note


def test_max_windows_and_min_interval_apply_to_slow_steps():
    times = [10.0] * 400
    for slow in (20, 150, 300):
        times[slow] = 100.0
    assert list(_drive(_slow_only(max_windows=1), times)) == [21]
    capped = _slow_only(max_windows=1)
    _drive(capped, times)
    assert capped.next_possible(400) is None
    # windows at least 2.5 s apart: the step at 150 (about 1.3 s after the first window)
    # opens none, and is not kept for later; the one at 300 does
    clock = Clock()
    spaced = _slow_only(min_interval_s=2.5, clock=clock)
    assert list(_drive(spaced, times, clock)) == [21, 301]


def test_without_slow_step_nothing_is_timed_and_the_session_may_finish():
    planner = WindowPlanner(Schedule(warmup=1, active=2), Sampling(sample_rate=0.0))
    assert planner.slow is None and planner.step_ended(5, 10**12) is False
    assert planner.next_possible(0) is None
    assert _slow_only().next_possible(0) == UNSCHEDULED  # a slow step may still open one


def test_every_window_says_why_it_opened():
    def reasons(planner: WindowPlanner, steps: int = 30) -> list[str]:
        return [r.kind for r in _drive(planner, [10.0] * steps).values()]

    assert reasons(WindowPlanner(Schedule(warmup=1, active=2, repeat=2), Sampling())) == [
        "schedule",
        "schedule",
    ]
    assert set(reasons(WindowPlanner(Schedule(warmup=1, active=2), Sampling(every=5)))) == {"every"}
    sampled = WindowPlanner(Schedule(warmup=1, active=2), Sampling(sample_rate=0.3, seed=3))
    assert set(reasons(sampled, 60)) == {"sample"}
    triggered = _slow_only()
    triggered.triggered()
    (why,) = _drive(triggered, [10.0] * 5).values()
    assert why.kind == "trigger" and "trigger" in why.detail
    first = WindowPlanner(Schedule(), Sampling())
    first.advance(0)
    assert first.reason is not None
    assert str(first.reason) == (
        "schedule: the schedule (wait=0,warmup=1,active=3,repeat=1,skip_first=0) opens one "
        "at step 0"
    )
