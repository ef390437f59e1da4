"""JsonLinesExporter: one parseable line per report, atomic appends, from several processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from exporters import ExporterWarning, ExportResult, JsonLinesExporter, resolve_exporters
from instrument import Schedule, profiled
from instrument.testing import capture
from tests.conftest import REPO


@profiled("mb")
def mb(x):
    return x @ x + 1


def test_one_line_per_window_with_the_report(tmp_path):
    path = tmp_path / "out" / "reports.jsonl"
    x = torch.randn(16, 16)
    with capture(exporters=[JsonLinesExporter(path)],
                 schedule=Schedule(wait=0, warmup=1, active=2, repeat=2)) as cap:
        for _ in range(8):
            mb(x)
    lines = path.read_text().splitlines()
    assert len(lines) == 2 == len(cap.reports)
    records = [json.loads(line) for line in lines]
    for record, report in zip(records, cap.reports):
        assert record["schema"] == "torch-profiled/window-report/1"
        assert record["window"] == report.window
        assert record["steps"] == list(report.steps)
        assert record["ranges"]["mb"]["calls"] == report.ranges["mb"].calls == 2
        assert record["ranges"]["mb"]["verdict"]["kind"] == "cpu-only"
        assert record["self_cpu_time_total_us"] == pytest.approx(report.self_cpu_time_total_us)
        assert "raw_trace_path" not in record


def test_env_names_json_exporter_and_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PROFILED_JSON_PATH", str(tmp_path / "r.jsonl"))
    import instrument.session as _  # noqa: F401

    from instrument.session import _builtin_kwargs, ambient_config

    (exp,) = resolve_exporters(["json"], builtin_kwargs=_builtin_kwargs(ambient_config()))
    assert isinstance(exp, JsonLinesExporter) and exp.path == str(tmp_path / "r.jsonl")


def test_unwritable_path_fails_with_one_warning_and_no_partial_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    exp = JsonLinesExporter(blocker / "sub" / "r.jsonl")  # a directory under a regular file
    x = torch.randn(4, 4)
    with pytest.warns(ExporterWarning, match="was not appended") as rec:
        with capture(exporters=[exp], schedule=Schedule(wait=0, warmup=1, active=1,
                                                          repeat=2)) as cap:
            for _ in range(5):
                mb(x)
    assert len(cap.reports) == 2
    assert len([w for w in rec if issubclass(w.category, ExporterWarning)]) == 1
    assert blocker.read_text() == "x"


def test_concurrent_processes_append_whole_lines(tmp_path):
    """Four processes append 50 big reports each to one file: every line parses."""
    path = tmp_path / "shared.jsonl"
    code = f"""
import sys
sys.path.insert(0, {REPO!r})
from exporters import JsonLinesExporter, ExportResult
from instrument.report import WindowReport, RangeStats, FrozenMap
ranges = FrozenMap({{f"r{{i}}": RangeStats(f"r{{i}}", i, 1.0, 1.0, 0.0, 0) for i in range(400)}})
exp = JsonLinesExporter({str(path)!r})
for w in range(50):
    rep = WindowReport(window=w, steps=(w,), partial=False, start_ns=0, end_ns=1, rank=int(sys.argv[1]),
                       world_size=4, host="h", pid=0, device="cpu", activities=("cpu",), ranges=ranges)
    assert exp.export(rep) is ExportResult.SUCCESS
"""
    procs = [subprocess.Popen([sys.executable, "-c", code, str(rank)]) for rank in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    records = [json.loads(line) for line in lines[:-1]]
    assert len(records) == 200
    assert sorted((r["rank"], r["window"]) for r in records) == [
        (rank, w) for rank in range(4) for w in range(50)]
    assert all(len(r["ranges"]) == 400 for r in records)


def test_stdout_dash(capsys):
    from instrument.report import WindowReport

    rep = WindowReport(window=0, steps=(1,), partial=True, start_ns=0, end_ns=1, rank=0,
                       world_size=1, host="h", pid=os.getpid(), device="cpu",
                       activities=("cpu",))
    assert JsonLinesExporter("-").export(rep) is ExportResult.SUCCESS
    out = capsys.readouterr().out
    assert out.endswith("\n") and json.loads(out)["partial"] is True
