"""JsonLinesExporter: one parseable line per report, atomic appends, from several processes."""

from __future__ import annotations

import json
import os

import pytest
import torch

from exporters import ExporterWarning, ExportResult, JsonLinesExporter, resolve_exporters
from instrument import Schedule, profiled
from instrument.testing import capture
from tests import _proc


@profiled("mb")
def mb(x):
    return x @ x + 1


def test_one_line_per_window_with_the_report(tmp_path):
    path = tmp_path / "out" / "reports.jsonl"
    x = torch.randn(16, 16)
    with capture(
        exporters=[JsonLinesExporter(path)], schedule=Schedule(wait=0, warmup=1, active=2, repeat=2)
    ) as cap:
        for _ in range(8):
            mb(x)
            cap.step()
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

    from instrument.runtime.lifetime import _builtin_kwargs, ambient_config

    (exp,) = resolve_exporters(["json"], builtin_kwargs=_builtin_kwargs(ambient_config()))
    assert isinstance(exp, JsonLinesExporter) and exp.path == str(tmp_path / "r.jsonl")


def test_unwritable_path_fails_with_one_warning_and_no_partial_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    exp = JsonLinesExporter(blocker / "sub" / "r.jsonl")  # a directory under a regular file
    x = torch.randn(4, 4)
    with pytest.warns(ExporterWarning, match="was not appended") as rec:
        with capture(
            exporters=[exp], schedule=Schedule(wait=0, warmup=1, active=1, repeat=2)
        ) as cap:
            for _ in range(5):
                mb(x)
                cap.step()
    assert len(cap.reports) == 2
    assert len([w for w in rec if issubclass(w.category, ExporterWarning)]) == 1
    assert blocker.read_text() == "x"


def test_concurrent_processes_append_whole_lines(tmp_path):
    """Four processes append 50 big reports each to one file: every line parses."""
    path = tmp_path / "shared.jsonl"
    code = f"""
import sys
from exporters import JsonLinesExporter, ExportResult
from instrument.base.report import WindowReport, RangeStats, FrozenMap
ranges = FrozenMap({{f"r{{i}}": RangeStats(f"r{{i}}", i, 1.0, 1.0, 0.0, 0) for i in range(400)}})
exp = JsonLinesExporter({str(path)!r})
for w in range(50):
    rep = WindowReport(window=w, steps=(w,), partial=False, start_ns=0, end_ns=1,
                       rank=int(sys.argv[1]), world_size=4, host="h", pid=0, device="cpu",
                       activities=("cpu",), ranges=ranges)
    assert exp.export(rep) is ExportResult.SUCCESS
"""
    procs = [_proc.start("-c", code, str(rank), stdout=None, stderr=None) for rank in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    records = [json.loads(line) for line in lines[:-1]]
    assert len(records) == 200
    assert sorted((r["rank"], r["window"]) for r in records) == [
        (rank, w) for rank in range(4) for w in range(50)
    ]
    assert all(len(r["ranges"]) == 400 for r in records)


def test_stdout_dash(capsys):
    from instrument.base.report import WindowReport

    rep = WindowReport(
        window=0,
        steps=(1,),
        partial=True,
        start_ns=0,
        end_ns=1,
        rank=0,
        world_size=1,
        host="h",
        pid=os.getpid(),
        device="cpu",
        activities=("cpu",),
    )
    assert JsonLinesExporter("-").export(rep) is ExportResult.SUCCESS
    out = capsys.readouterr().out
    assert out.endswith("\n") and json.loads(out)["partial"] is True


# ---------------------------------------------------------------- what is at the path


def _report(window: int = 0):
    from instrument.base.report import WindowReport

    return WindowReport(
        window=window,
        steps=(1,),
        partial=False,
        start_ns=0,
        end_ns=1,
        rank=0,
        world_size=1,
        host="h",
        pid=os.getpid(),
        device="cpu",
        activities=("cpu",),
    )


def _export_twice(exp) -> tuple[list, list[str]]:
    """Two windows' exports; the results and the ExporterWarnings they cost."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [exp.export(_report(0)), exp.export(_report(1))]
    return results, [str(w.message) for w in caught if issubclass(w.category, ExporterWarning)]


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_at_the_path_is_not_followed(tmp_path, dangling):
    """A link planted in a shared directory must not redirect the appends: the file it points
    at stays as it was (or is not created), one warning names the path and the link."""
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = tmp_path / "victim.txt"
    if not dangling:
        victim.write_text("precious\n")
    link = shared / "reports.jsonl"
    link.symlink_to(victim)
    results, warned = _export_twice(JsonLinesExporter(link))
    assert results == [ExportResult.FAILURE, ExportResult.FAILURE]
    if dangling:
        assert not victim.exists()  # O_CREAT through the link would have made it
    else:
        assert victim.read_text() == "precious\n"
    assert link.is_symlink() and os.readlink(link) == str(victim)
    assert len(warned) == 1, warned  # once, not per window
    assert f"{str(link)!r} is a symbolic link (to {str(victim)!r})" in warned[0]
    assert "was not appended there" in warned[0] and "PROFILED_JSON_PATH" in warned[0]


def test_a_fifo_at_the_path_does_not_hang_the_export(tmp_path):
    """A named pipe nobody reads would block open() for ever; one somebody reads is still not
    a report file. Neither gets a line; one warning says what is there."""
    import threading

    fifo = tmp_path / "reports.jsonl"
    os.mkfifo(fifo)
    exp = JsonLinesExporter(fifo)
    done: list = []
    worker = threading.Thread(target=lambda: done.append(_export_twice(exp)), daemon=True)
    worker.start()
    worker.join(60)  # a bound for a hang, not a timing: the export returns at once
    if worker.is_alive():  # release the stuck open() before failing
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    assert done, "the export hung on the FIFO"
    ((results, warned),) = done
    assert results == [ExportResult.FAILURE, ExportResult.FAILURE]
    assert len(warned) == 1 and f"{str(fifo)!r} is a named pipe (FIFO)" in warned[0], warned

    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # now somebody reads it
    try:
        assert exp.export(_report(2)) is ExportResult.FAILURE
        assert os.read(reader, 1 << 16) == b""  # no writer left, nothing was written
    finally:
        os.close(reader)


def test_a_directory_at_the_path_is_refused_with_what_it_is(tmp_path):
    target = tmp_path / "reports.jsonl"
    target.mkdir()
    results, warned = _export_twice(JsonLinesExporter(target))
    assert results == [ExportResult.FAILURE, ExportResult.FAILURE]
    assert len(warned) == 1 and f"{str(target)!r} is a directory" in warned[0], warned
    assert os.listdir(target) == []


def test_a_regular_file_is_appended_to_after_what_was_in_the_way_is_gone(tmp_path):
    path = tmp_path / "reports.jsonl"
    path.symlink_to(tmp_path / "elsewhere")
    exp = JsonLinesExporter(path)
    _export_twice(exp)
    path.unlink()
    assert exp.export(_report(5)) is ExportResult.SUCCESS
    assert exp.export(_report(6)) is ExportResult.SUCCESS
    assert [json.loads(line)["window"] for line in path.read_text().splitlines()] == [5, 6]
    assert not (tmp_path / "elsewhere").exists()
