"""Slow-step windows in whole programs (issue 30, 5): they open whatever the schedule has used
up, a cap that holds one back says so, and a slow step that recurs every N steps is learned
as normal instead of being profiled forever. The rule itself is tested in test_planner.py."""

from __future__ import annotations

import pytest

from tests._records import window_records

PROGRAM = """
import os
import time
import torch
from instrument import profiled

x = torch.randn(16, 16)
STEPS, STEP_S = int(os.environ["T_STEPS"]), float(os.environ["T_STEP_S"])
SLOW_AT, SLOW_S = int(os.environ["T_SLOW_AT"]), float(os.environ["T_SLOW_S"])
EVERY = int(os.environ.get("T_EVERY", "0"))  # every EVERY-th step is slow (a checkpoint)

@profiled("train_step", step=True)
def train_step(i):
    y = x @ x
    slow = i == SLOW_AT or (EVERY and i % EVERY == EVERY - 1)
    time.sleep(SLOW_S if slow else STEP_S)
    return y

for i in range(STEPS):
    train_step(i)
"""


def _run(run_python, tmp_path, **env: str) -> tuple[list[dict], str]:
    path = tmp_path / "reports.jsonl"
    base = {
        # 20x: a 2 ms step descheduled on a busy box must not pass for the slow one
        "PROFILED_SLOW_STEP": "20",
        "PROFILED_EXPORTERS": "console,json",
        "PROFILED_JSON_PATH": str(path),
        "T_STEPS": "200",
        "T_STEP_S": "0.002",
        "T_SLOW_AT": "150",
        "T_SLOW_S": "0.5",  # 250x
    }
    out = run_python(PROGRAM, env={**base, **env})
    assert out.returncode == 0, out.stderr
    return (window_records(path.read_text()) if path.exists() else []), out.stderr


@pytest.mark.parametrize(
    "schedule",
    [
        None,  # the default: one window at the start
        "wait=5,warmup=1,active=2,repeat=2",
        "skip_first=10,warmup=2,active=1",
    ],
)
def test_a_slow_step_opens_a_window_after_the_schedule_is_used_up(run_python, tmp_path, schedule):
    """2 ms steps, the schedule's windows at the start, a 250x step at step 150 (0.3 s later):
    it opens a window (before, a fixed second of settling after the schedule's window judged
    none of those steps; the tests' PROFILED_SAMPLE_RATE=0, no window at the start, hid it)."""
    env = {"PROFILED_SCHEDULE": schedule} if schedule else {}
    records, stderr = _run(run_python, tmp_path, **env)
    kinds = [r["reason"]["kind"] for r in records]
    assert "schedule" in kinds, records
    slow = [r for r in records if r["reason"]["kind"] == "slow_step"]
    assert [r["reason"]["step"] for r in slow] == [150], (kinds, stderr)
    assert slow[0]["steps"][0] >= 152  # step 151 warms up
    assert "opened by slow_step: step 150 took " in stderr


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"PROFILED_MAX_WINDOWS": "1"}, "max_windows=1 windows have opened"),
        ({"PROFILED_MIN_INTERVAL_S": "3600"}, "min_interval_s=3600 has not passed"),
    ],
)
def test_a_cap_keeps_the_slow_step_window_out_and_says_so(run_python, tmp_path, env, says):
    records, stderr = _run(run_python, tmp_path, **env)
    assert [r["reason"]["kind"] for r in records] == ["schedule"], records
    assert f"torch-profiled: {says}" in stderr or f"but {says}" in stderr, stderr
    assert stderr.count(says) == 1, stderr  # said once


def test_a_slow_step_every_n_steps_is_learned_and_stops_opening_windows(run_python, tmp_path):
    """Every 15th step a 'checkpoint' (150 ms against 10 ms steps): the first ones open
    windows, then the period is learned (said once) and the rest open none. Before, a window
    opened at each one that came after the last window's second of settling: back to back."""
    records, stderr = _run(
        run_python,
        tmp_path,
        T_STEPS="180",  # 12 checkpoints: 3 to learn the period, 9 after it
        T_STEP_S="0.01",
        T_SLOW_AT="-1",
        T_SLOW_S="0.15",
        T_EVERY="15",
        PROFILED_SLOW_STEP="6",
    )
    slow = [r["reason"]["step"] for r in records if r["reason"]["kind"] == "slow_step"]
    checkpoints = [step for step in slow if step % 15 == 14]  # (not a descheduled step)
    assert 1 <= len(checkpoints) <= 2, (slow, stderr)  # of 12 checkpoints
    assert stderr.count("were learned as periodic") == 1, stderr
    assert "slow steps every 15 steps" in stderr
