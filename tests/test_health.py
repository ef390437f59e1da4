"""Window health (issue 30, item 1): a window that lost device events says so, with numbers.

The fixtures (``tests/data/health/``, see its README) are Kineto JSON in the shape of a real
H100 trace (``healthy_h100_real.json`` is one, unchanged), each missing what one reason is
about. They go through the same analysis the CLI (``torch-profiled summarize``, a real
process) and the helper process (``shape_and_analyze``) use, and through the front end of
torch's raw Kineto events (step markers, ``drop_warmup``). A real CPU program's windows read
``complete``; the exporters show what the report says.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest

from instrument.analysis.analyze import TAIL_LAUNCHES, analyze, drop_warmup, events_from_trace
from instrument.analysis.kineto_json import STEP_MARKER, WINDOW_END, load_trace
from instrument.base.report import HEALTH_STATUSES
from instrument.export.analysis_process import shape_and_analyze
from tests._proc import run, sdk_env

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "health")

# fixture -> (status, {reason kind: count})
EXPECTED = {
    "healthy_h100_real.json": ("complete", {}),
    "healthy_steps.json": ("complete", {}),
    "cpu_only_no_runtime.json": ("complete", {}),
    # 3 of 8 calls lost their matmul kernel and their memcpy: 6 of 16 launches
    "launches_without_kernels.json": ("partial", {"launch-without-device": 6}),
    # step 3 of 4 lost its runtime calls and its device work (the bench's class of loss)
    "step_without_kernels.json": ("partial", {"step-without-device": 1}),
    # 16 launches on the host, not one device event
    "device_missing_launches.json": ("device-missing", {"no-device-events": 16}),
    # a process using CUDA (profiledWindow), 24 aten operators, no runtime or device event
    "device_missing_no_runtime.json": ("device-missing", {"no-device-events": 24}),
}


def _kinds(health) -> dict[str, int]:
    return {r.kind: r.count for r in health.reasons}


def test_every_fixture_is_expected():
    assert sorted(f for f in os.listdir(DATA) if f.endswith(".json")) == sorted(EXPECTED)
    assert {status for status, _ in EXPECTED.values()} == set(HEALTH_STATUSES)


def test_summarize_states_health_of_each_fixture():
    """The CLI, a real process, reads each fixture's health into its JSON and its table."""
    proc = run("-m", "instrument", "summarize", DATA, "--json")
    assert proc.returncode == 0, proc.stderr
    got = {os.path.basename(r["trace_file"]): r["health"] for r in json.loads(proc.stdout)}
    assert set(got) == set(EXPECTED)
    for name, (status, kinds) in EXPECTED.items():
        health = got[name]
        assert health["status"] == status, (name, health)
        assert {r["kind"]: r["count"] for r in health["reasons"]} == kinds, (name, health)
        for r in health["reasons"]:  # the numbers are in the sentence too
            assert str(r["count"]) in r["detail"], r
    table = run("-m", "instrument", "summarize", os.path.join(DATA, "step_without_kernels.json"))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[1].startswith("!! HEALTH: PARTIAL"), lines[:3]
    assert "1 of 4 step(s)" in table.stdout.replace("\n  ", " ")
    assert any(ln.startswith("Self CUDA time total:") and ln.endswith("(partial)") for ln in lines)
    healthy = run("-m", "instrument", "summarize", os.path.join(DATA, "healthy_steps.json"))
    assert healthy.stdout.splitlines()[1] == "health: complete"
    assert "(partial)" not in healthy.stdout and "HEALTH" not in healthy.stdout


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_helper_path_reads_the_same(name, tmp_path):
    """The helper process's work (shape the raw trace in place, then analyze it)."""
    raw = tmp_path / name
    shutil.copy(os.path.join(DATA, name), raw)
    analysis = shape_and_analyze(str(raw), frozenset({"train_step"}), {"rank": 0, "world_size": 1})
    status, kinds = EXPECTED[name]
    assert analysis.health.status == status
    assert _kinds(analysis.health) == kinds


def _as_kineto(trace: dict) -> list:
    """The fixture's events as the raw Kineto front end gives them: no ``ProfilerStep#N``
    spans but the SDK's zero-length step markers, and its last one, the window's end."""
    events = events_from_trace(trace)
    steps = sorted(ev for ev in events if ev.name.startswith("ProfilerStep#"))
    rest = [ev for ev in events if not ev.name.startswith("ProfilerStep#")]
    markers = [ev._replace(name=STEP_MARKER + ev.name.split("#")[1], dur=0) for ev in steps] + [
        steps[-1]._replace(name=WINDOW_END, start=steps[-1].start + steps[-1].dur, dur=0)
    ]
    return rest + markers


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_kineto_events_with_step_markers(name):
    trace = load_trace(os.path.join(DATA, name))
    in_use = bool(trace.pop("profiledWindow", None))  # said by the builder there, not the trace
    events = drop_warmup(_as_kineto(trace))
    analysis = analyze(events, {"train_step"}, device_in_use=in_use)
    status, kinds = EXPECTED[name]
    assert analysis.health.status == status
    assert _kinds(analysis.health) == kinds


def _drop_device_of_last(trace: dict, launches: int) -> dict:
    """The trace without the device work of its last ``launches`` launches (and their arrows)."""
    trace = copy.deepcopy(trace)
    evs = trace["traceEvents"]
    runtime = sorted(
        (e for e in evs if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"]
    )
    gone = {e["args"]["correlation"] for e in runtime[-launches:]}
    trace["traceEvents"] = [
        e
        for e in evs
        if not (e.get("cat") in ("kernel", "gpu_memcpy") and e["args"]["correlation"] in gone)
        and not (e.get("cat") == "ac2g" and e.get("id") in gone)
    ]
    return trace


def test_a_short_tail_at_the_stop_is_tolerated_a_longer_one_is_not():
    """Device work still queued at the stop is out of Kineto's range: the last TAIL_LAUNCHES
    launches may lack it (complete); one more, and the window is partial with the count."""
    trace = load_trace(os.path.join(DATA, "healthy_steps.json"))
    names = {"train_step"}
    tail = analyze(events_from_trace(_drop_device_of_last(trace, TAIL_LAUNCHES)), names)
    assert tail.health.status == "complete", tail.health
    longer = analyze(events_from_trace(_drop_device_of_last(trace, TAIL_LAUNCHES + 1)), names)
    assert longer.health.status == "partial"
    assert _kinds(longer.health) == {"launch-without-device": TAIL_LAUNCHES + 1}


@pytest.mark.parametrize(
    "where",
    [
        {"cupti_dropped_records": 12},
        {"profiler": {"droppedRecords": 12}},
        {"WARNING": ["CUPTI: Dropped 12 activity records", "unrelated warning"]},
    ],
)
def test_records_the_profiler_says_it_dropped(where):
    trace = load_trace(os.path.join(DATA, "healthy_steps.json"))
    trace.update(where)
    health = analyze(events_from_trace(trace), {"train_step"}).health
    assert health.status == "partial"
    assert _kinds(health) == {"profiler-dropped": 12}


def test_no_device_in_use_no_alarm():
    """A window of CPU operators only (no runtime call, no device work) in a process that never
    initialized CUDA is a CPU window, complete; the same in a process using CUDA lost them."""
    trace = load_trace(os.path.join(DATA, "cpu_only_no_runtime.json"))
    assert analyze(events_from_trace(trace), ()).health.status == "complete"
    lost = analyze(events_from_trace(trace), (), device_in_use=True).health
    assert lost.status == "device-missing"


PROGRAM = r"""
import torch
from instrument import profiled

@profiled("work", step=True)
def work(x):
    return (x @ x).relu().sum()

x = torch.ones(32, 32)
for _ in range(40):
    work(x)
"""


def test_real_cpu_windows_read_complete(tmp_path):
    path = tmp_path / "w.jsonl"

    env = sdk_env(PROFILED_EXPORTERS="json", PROFILED_JSON_PATH=str(path), PROFILED_EVERY="10")
    proc = run("-c", PROGRAM, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    reports = [json.loads(line) for line in path.read_text().splitlines()]
    windows = [r for r in reports if r.get("schema") == "torch-profiled/window-report/1"]
    assert len(windows) >= 3, reports
    assert [w["health"] for w in windows] == [{"status": "complete", "reasons": []}] * len(windows)


def _report(name: str):
    from instrument.cli.inputs import report_from_trace

    path = os.path.join(DATA, name)
    return report_from_trace(path, load_trace(path), range_names={"train_step"})


def test_exporters_show_health():
    from exporters.console import format_report
    from exporters.html_page import PageWindow, build_page
    from exporters.otel import _window_attributes

    lost, whole = _report("launches_without_kernels.json"), _report("healthy_steps.json")
    assert lost.health.status == "partial"
    text = format_report(lost)
    assert text.splitlines()[1].startswith("!! HEALTH: PARTIAL")
    assert "6 of 16 launch(es)" in text.replace("\n  ", " ")
    assert format_report(whole).splitlines()[1] == "health: complete"
    attrs = _window_attributes(lost)
    assert attrs["profiled.health"] == "partial"
    assert attrs["profiled.health.reason_kinds"] == ["launch-without-device"]
    assert attrs["profiled.health.lost"] == 6
    assert "6 of 16" in attrs["profiled.health.reasons"][0]
    assert _window_attributes(whole)["profiled.health"] == "complete"
    assert "profiled.health.reasons" not in _window_attributes(whole)
    page = build_page([PageWindow(lost)])
    assert "health: partial" in page and "6 of 16 launch(es)" in page
    assert "(partial)" in page
    assert "health: complete" in build_page([PageWindow(whole)])
    assert lost.to_dict()["health"]["reasons"][0]["count"] == 6


def test_launches_captured_into_a_cuda_graph_owe_no_device_event():
    """Between cudaStreamBeginCapture and cudaStreamEndCapture launches run nothing: the
    launches of a captured step are no lost events (the same trace without the capture is)."""
    trace = load_trace(os.path.join(DATA, "launches_without_kernels.json"))
    evs = trace["traceEvents"]
    first = min(e["ts"] for e in evs if e.get("cat") == "cuda_driver")
    last = max(e["ts"] for e in evs if e.get("cat") == "cuda_runtime")
    for name, ts in (("cudaStreamBeginCapture", first - 1), ("cudaStreamEndCapture", last + 7)):
        evs.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": name,
                "pid": 624,
                "tid": 624,
                "ts": ts,
                "dur": 0.5,
                "args": {"External id": 0, "correlation": 1},
            }
        )
    assert analyze(events_from_trace(trace), {"train_step"}).health.status == "complete"


@pytest.mark.parametrize("in_use", [True, False])
def test_the_builder_tells_the_helper_through_the_shaped_trace(in_use, tmp_path):
    """The report builder passes ``device_in_use`` with the window's distributed info; shaping
    writes it into the trace (``profiledWindow``), where the helper's analysis and later the
    CLI read it: a window of operators without any device event is then device-missing."""
    raw = tmp_path / "w.json"
    shutil.copy(os.path.join(DATA, "cpu_only_no_runtime.json"), raw)
    dist = {"rank": 0, "world_size": 1, "device_in_use": in_use}
    analysis = shape_and_analyze(str(raw), frozenset({"train_step"}), dist)
    assert analysis.health.status == ("device-missing" if in_use else "complete")
    assert ("profiledWindow" in load_trace(str(raw))) is in_use
    again = run("-m", "instrument", "summarize", str(raw), "--json") if in_use else None
    if again is not None:
        doc = json.loads(again.stdout)
        assert doc["health"]["status"] == "device-missing", again.stderr
        assert doc["device"] != "cpu" and "cuda" in doc["activities"], doc  # its title: the GPU


def test_the_gate_refuses_windows_that_lost_events(tmp_path):
    """``diff --fail-over`` in a real process: a side whose windows lost device events
    (partial, device-missing) is not comparable, each left-out trace named; with
    ``--allow-partial`` it is gated."""
    base, after = tmp_path / "base", tmp_path / "after"
    base.mkdir()
    after.mkdir()
    lost = ("launches_without_kernels", "step_without_kernels", "device_missing_launches")
    for i in range(5):
        shutil.copy(os.path.join(DATA, "healthy_steps.json"), base / f"w{i}.json")
        shutil.copy(os.path.join(DATA, lost[i % 3] + ".json"), after / f"w{i}.json")
    proc = run("-m", "instrument", "diff", str(base), str(after), "--fail-over", "10%")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "1 not comparable" in proc.stdout, proc.stdout
    text = " ".join(proc.stdout.split())
    for i in range(5):
        assert f"w{i}.json" in text, text  # each left-out window named
    assert "partial" in text and "device-missing" in text, text
    again = run(
        "-m", "instrument", "diff", str(base), str(after), "--fail-over", "10%", "--allow-partial"
    )
    assert again.returncode == 0, (again.stdout, again.stderr)  # the same per-call times
    assert "0 not comparable" in again.stdout and "1 passed" in again.stdout, again.stdout
