"""Slow-step windows (``PROFILED_SLOW_STEP``) and why every window opened (``report.reason``),
with real torch.profiler windows: a whole program in a subprocess, then sessions in process.
The rule itself (warm-up, factor, caps, settle) is tested without torch in test_planner.py."""

from __future__ import annotations

import json
import time

import pytest
import torch

from exporters import InMemoryExporter
from exporters.console import format_report
from exporters.json_lines import report_record
from instrument import Schedule, profiled, session
from tests._records import window_records

X = torch.randn(8, 8)

PROGRAM = """
import time
import torch
from instrument import profiled

x = torch.randn(16, 16)

@profiled("train_step", step=True)
def train_step(i):
    y = x @ x
    time.sleep(0.3 if i == 30 else 0.02)  # step 30 stalls: 15x the others
    return y

for i in range(50):
    train_step(i)
"""


def test_a_slow_step_in_a_program_opens_a_window_whose_report_names_it(run_python, tmp_path):
    out = run_python(
        PROGRAM,
        env={
            "PROFILED_SLOW_STEP": "5",
            "PROFILED_SAMPLE_RATE": "0",  # no scheduled window: only slow steps open them
            "PROFILED_EXPORTERS": "console,json",
            "PROFILED_JSON_PATH": str(tmp_path / "reports.jsonl"),
        },
    )
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr  # the console table is on stderr
    records = window_records((tmp_path / "reports.jsonl").read_text())
    slow = [r for r in records if r["reason"]["step"] == 30]
    assert len(slow) == 1, records
    (record,) = slow
    reason = record["reason"]
    assert reason["kind"] == "slow_step"
    assert record["steps"] == [32, 33, 34]  # step 31 warms up, then the schedule's 3 steps
    assert reason["step_time_us"] >= 290_000
    assert 15_000 <= reason["median_step_us"] <= reason["step_time_us"] / 5
    assert reason["detail"].startswith("step 30 took ")
    assert "x the median " in reason["detail"] and "(slow_step=5)" in reason["detail"]
    assert record["ranges"]["train_step"]["calls"] == 3
    assert all(r["reason"]["kind"] == "slow_step" for r in records)  # sample rate 0
    assert "opened by slow_step: step 30 took " in out.stderr


@profiled("train_step", step=True)
def train_step(pause: float = 0.0) -> torch.Tensor:
    if pause:
        time.sleep(pause)
    return X @ X


def test_a_scheduled_window_says_so_in_the_report_and_every_exporter_shows_it():
    from exporters.otel import _window_attributes

    mem = InMemoryExporter()
    with session(schedule=Schedule(warmup=1, active=2), exporters=[mem]):
        for _ in range(5):
            train_step()
    (report,) = mem.reports
    assert report.reason is not None and report.reason.kind == "schedule"
    assert "opens one at step 0" in report.reason.detail
    table = format_report(report)
    assert table.splitlines()[1].startswith("opened by schedule: the schedule (wait=0,")
    record = report_record(report)
    assert record["reason"]["kind"] == "schedule" and record["reason"]["step"] is None
    json.dumps(record)
    attrs = _window_attributes(report)
    assert attrs["profiled.window.reason"] == "schedule"
    assert attrs["profiled.window.reason_detail"] == report.reason.detail


def test_sampled_windows_say_every_or_sample():
    mem = InMemoryExporter()
    with session(schedule=Schedule(warmup=1, active=2), every=5, max_windows=2, exporters=[mem]):
        for _ in range(12):
            train_step()
    assert [r.reason.kind for r in mem.reports] == ["every", "every"]
    assert mem.reports[1].reason.detail == "a window every 5 steps, at step 5"
    mem = InMemoryExporter()
    with session(
        schedule=Schedule(warmup=1, active=2), sample_rate=0.2, max_windows=1, exporters=[mem]
    ):
        for _ in range(60):
            train_step()
    (report,) = mem.reports
    assert report.reason.kind == "sample" and "sample_rate=0.2" in report.reason.detail


def test_a_triggered_window_says_trigger(tmp_path):
    request = tmp_path / "profile-now"
    mem = InMemoryExporter()
    with session(
        schedule=Schedule(warmup=1, active=2),
        sample_rate=0.0,
        trigger=str(request),
        exporters=[mem],
    ) as s:
        train_step()
        request.write_text("")
        deadline = time.monotonic() + 10
        while not mem.reports and time.monotonic() < deadline:
            train_step(0.01)
            s.flush(0.01)
    (report,) = mem.reports
    assert report.reason.kind == "trigger"


def test_a_slow_step_in_a_session_opens_one_window_and_caps_apply():
    mem = InMemoryExporter()
    with session(
        schedule=Schedule(warmup=1, active=2),
        sample_rate=0.0,
        slow_step=4.0,
        max_windows=1,
        exporters=[mem],
    ):
        for i in range(40):
            train_step(0.15 if i in (20, 30) else 0.01)  # 30 comes after the cap
    (report,) = mem.reports
    assert report.reason.kind == "slow_step" and report.reason.step == 20
    assert report.steps == (22, 23)


def test_slow_step_in_code_is_checked_at_once():
    with pytest.raises(ValueError, match="slow_step"):
        session(slow_step=1.0)
    with pytest.raises(TypeError, match="slow_step"):
        session(slow_step="3")
