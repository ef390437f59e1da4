"""The cost ledger on every window's report (issue 31 item 1), against real programs with a
known injected cost: a busy step inside windows, a slow profiler start and stop, a sleeping
exporter; and ``PROFILED_OVERHEAD_BUDGET`` backing off (detail, then frequency) until the
measured cost is under it. Each program prints its reports' ledgers as JSON on its last line.

Costs are injected far above the box's noise (hundreds of ms against a step of a few ms) and
compared within +-10%; nothing here asserts a wall-clock time of its own."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from tests._proc import run, sdk_env

PROGRAM = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    import instrument
    from instrument import profiled
    from instrument.runtime import _torch, ledger
    from exporters.memory import InMemoryExporter

    BUSY_S = float(os.environ.get("T_BUSY_S", "0"))      # extra per recorded step
    START_S = float(os.environ.get("T_START_S", "0"))    # extra in each profiler start
    STOP_S = float(os.environ.get("T_STOP_S", "0"))      # extra in each profiler stop
    EXPORT_S = float(os.environ.get("T_EXPORT_S", "0"))  # a sleeping exporter
    STEP_S = float(os.environ.get("T_STEP_S", "0.004"))
    IDLE_S = float(os.environ.get("T_IDLE_S", "0"))      # a step that waits (I/O, no GIL)
    STEPS = int(os.environ.get("T_STEPS", "40"))
    EXPLICIT = os.environ.get("T_EXPLICIT") == "1"  # instrument.step() at each step's start
    ledger.INTERVAL_S = float(os.environ.get("T_INTERVAL_S", "60"))

    def spin(seconds):  # CPU work of a known wall time
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def slowed(method, seconds):
        def wrapper(self, *args, **kwargs):
            time.sleep(seconds)
            return method(self, *args, **kwargs)
        return wrapper

    if START_S:
        _torch.ProfilerWindow.start = slowed(_torch.ProfilerWindow.start, START_S)
    if STOP_S:
        _torch.ProfilerWindow.stop = slowed(_torch.ProfilerWindow.stop, STOP_S)

    class Sleeping(InMemoryExporter):
        def export(self, report):
            time.sleep(EXPORT_S)
            return super().export(report)

    memory = Sleeping() if EXPORT_S else InMemoryExporter()
    instrument.configure(exporters=[memory])

    @profiled("train_step", step=not EXPLICIT)
    def train_step(i):
        spin(STEP_S)
        time.sleep(IDLE_S)
        if BUSY_S and torch.autograd._profiler_enabled():
            spin(BUSY_S)
        return i

    for i in range(STEPS):
        if EXPLICIT and i:  # as a loop with prof.step() at each step's start
            instrument.step()
        train_step(i)
    instrument.shutdown()
    print(json.dumps([
        {**r.cost.to_dict(), "window": r.window, "steps_list": list(r.steps)}
        for r in memory.reports
    ]))
    """
)


def _ledgers(**env: str) -> list[dict]:
    base = {"PROFILED_METRICS": "1", "PROFILED_EVERY": "10", "PROFILED_ANALYSIS_PROCESS": "0"}
    proc = run("-c", PROGRAM, env=sdk_env({**base, **env}), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _within(measured: float, expected: float, share: float = 0.10) -> bool:
    return abs(measured - expected) <= share * expected


@pytest.mark.parametrize("steps", ["step_function", "step_calls"])
def test_busy_steps_show_as_the_steps_excess_over_window_free_steps(steps: str) -> None:
    """The same with the steps ended by a ``step=True`` function's return and by
    ``instrument.step()`` calls (no step function: the time between the calls is the step)."""
    busy = 0.12  # per recorded step: 3 steps a window, 360 ms of excess against ~32 ms steps
    # steps that wait 30 ms: the last window's analysis is done before the next one records
    explicit = "1" if steps == "step_calls" else "0"
    ledgers = _ledgers(
        T_BUSY_S=str(busy), T_STEPS="31", T_STEP_S="0.002", T_IDLE_S="0.03", T_EXPLICIT=explicit
    )
    later = [c for c in ledgers if c["baseline_step_us"] is not None]
    assert len(later) >= 2, ledgers  # the first window (step 0) has no window-free steps yet
    for cost in later:
        assert cost["baseline_steps"] >= 4, cost
        expected_us = cost["steps"] * busy * 1e6
        assert _within(cost["steps_excess_us"], expected_us), (cost, expected_us)
        assert cost["total_us"] >= cost["steps_excess_us"]


def test_slow_start_and_stop_are_the_callers_stalls() -> None:
    start, stop = 0.2, 0.3
    ledgers = _ledgers(T_START_S=str(start), T_STOP_S=str(stop), T_STEPS="31")
    assert len(ledgers) == 3, ledgers
    for cost in ledgers[1:]:  # the first start of a process is torch's own, much dearer
        assert _within(cost["start_stall_us"], start * 1e6), cost
        assert _within(cost["stop_stall_us"], stop * 1e6), cost
    # what the window's steps recorded is not charged twice: the stalls are outside them
    for cost in ledgers:
        assert cost["steps_time_us"] < (start + stop) * 1e6, cost


def test_a_sleeping_exporter_shows_in_the_next_report() -> None:
    sleep = 0.3
    ledgers = _ledgers(T_EXPORT_S=str(sleep), T_STEPS="31", T_STEP_S="0.002", T_IDLE_S="0.04")
    assert len(ledgers) == 3, ledgers
    assert ledgers[0]["exporters_window"] is None  # no earlier window was exported
    for before, cost in zip(ledgers, ledgers[1:]):
        assert cost["exporters_window"] == before["window"], cost
        assert _within(cost["exporters_s"], sleep), cost
    for cost in ledgers:  # the trace file the window wrote, its export and analysis CPU
        assert cost["bytes_written"] > 1000, cost
        assert cost["export_cpu_s"] > 0 and cost["analysis_cpu_s"] > 0, cost
        assert cost["helper_cpu_s"] is None, cost  # PROFILED_ANALYSIS_PROCESS=0


def test_the_helper_process_cpu_is_counted_where_it_analyses() -> None:
    ledgers = _ledgers(PROFILED_ANALYSIS_PROCESS="1", T_STEPS="11")
    assert len(ledgers) == 1 + (os.name != "posix"), ledgers
    assert ledgers[0]["helper_cpu_s"] is not None and ledgers[0]["helper_cpu_s"] > 0, ledgers


def test_the_budget_halves_the_frequency_until_the_cost_is_under_it() -> None:
    """Windows every 8 steps of 2 ms, each costing >= 30 ms of busy steps, against 25% of a
    1 s interval: over it, the first back-off is the detail (shapes on), then every doubles
    at each window measured over it, until the windows' share is under the budget (every 64
    steps: ~32 ms of ~160 ms, 20%; every 32 is ~33%)."""
    budget = 25.0
    ledgers = _ledgers(
        PROFILED_EVERY="8",
        PROFILED_RECORD_SHAPES="1",
        PROFILED_OVERHEAD_BUDGET=str(budget),
        T_INTERVAL_S="1",
        T_BUSY_S="0.01",
        T_STEP_S="0.002",
        T_STEPS="700",
    )
    backed = [(i, c["backed_off"]) for i, c in enumerate(ledgers) if c["backed_off"]]
    assert len(backed) >= 3, ledgers
    assert "stacks, shapes and memory" in backed[0][1], backed
    everies = [8]
    for i, note in backed[1:]:
        assert f"every {everies[-1] * 2} steps instead of {everies[-1]}:" in note, (note, everies)
        everies.append(everies[-1] * 2)
        assert f"PROFILED_OVERHEAD_BUDGET={budget:g}%" in note, note
        assert ledgers[i - 1]["share_pct"] > budget, (ledgers[i - 1], note)  # only when over
    # the windows opened at the frequency the back-offs said, each gap one of them
    firsts = [c["steps_list"][0] for c in ledgers if c["steps_list"]]
    gaps = [b - a for a, b in zip(firsts, firsts[1:])]
    assert all(g in everies for g in gaps), (gaps, everies)
    assert gaps == sorted(gaps), gaps
    # half the windows or fewer than without the budget (700 / 8), and the cost ends under it
    assert len(ledgers) < 700 / 8 / 2, len(ledgers)
    assert ledgers[-1]["share_pct"] <= budget, ledgers[-1]


def test_no_budget_backs_nothing_off() -> None:
    ledgers = _ledgers(
        PROFILED_EVERY="4",
        PROFILED_OVERHEAD_BUDGET="0",
        T_INTERVAL_S="1",
        T_BUSY_S="0.01",
        T_STEP_S="0.002",
        T_STEPS="60",
    )
    assert len(ledgers) == 15, len(ledgers)
    assert not any(c["backed_off"] for c in ledgers)


def test_halving_the_frequency_for_every_kind_of_plan() -> None:
    """The budget's second notch on each policy: every doubles, a sample rate halves, and a
    repeating schedule opens one cycle in two (then four)."""
    from instrument.runtime.planner import WindowPlanner
    from instrument.runtime.sampling import Sampling, Schedule

    def starts(planner: WindowPlanner, steps: int) -> list[int]:
        out = []
        for s in range(steps):
            plan = planner.plan(s)
            planner.commit(plan, s)
            if plan.opens:
                out.append(s)
        return out

    every = WindowPlanner(Schedule(warmup=1, active=3), Sampling(every=4))
    assert "every 8 steps instead of 4" in every.halve_frequency()
    assert starts(every, 40) == [0, 8, 16, 24, 32]

    rate = WindowPlanner(Schedule(), Sampling(sample_rate=0.5))
    assert "sample_rate 0.25 instead of 0.5" in rate.halve_frequency()
    assert rate.sampling.sample_rate == 0.25

    sched = WindowPlanner(Schedule(wait=1, warmup=1, active=2, repeat=0), Sampling())
    assert starts(sched, 16) == [1, 5, 9, 13]
    sched = WindowPlanner(Schedule(wait=1, warmup=1, active=2, repeat=0), Sampling())
    assert "one in 2" in sched.halve_frequency()
    assert starts(sched, 32) == [1, 9, 17, 25]
    sched = WindowPlanner(Schedule(wait=1, warmup=1, active=2, repeat=0), Sampling())
    sched.halve_frequency()
    assert "one in 4" in sched.halve_frequency()
    assert starts(sched, 64) == [1, 17, 33, 49]
