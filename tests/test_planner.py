"""The window planner on its own: no profiler, a fake clock; decisions change nothing until
they are committed."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from instrument.planner import Plan, WindowPlanner
from instrument.sampling import Action, Sampling, Schedule

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
        tree = ast.parse((ROOT / "instrument" / module).read_text())
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
