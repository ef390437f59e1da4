"""Exporters: registry (built-ins and entry points), console table, trace files, the pipeline,
the in-memory exporter and the WindowReport contract.

One real profiler window (module fixture ``window``) feeds the console and trace-file checks;
the rest uses hand-built reports whose ``raw_trace_path`` is a real file.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import pickle
import re
import sys
import textwrap
import time
import uuid
import warnings
from types import SimpleNamespace

import pytest

import instrument
import instrument.testing
from exporters import (
    ConsoleExporter,
    Exporter,
    ExporterWarning,
    ExportResult,
    InMemoryExporter,
    TraceFileExporter,
    check_exporter_names,
    known_exporter_names,
    resolve_exporters,
)
from exporters.console import WIDTH, format_report, format_time_us
from instrument import Schedule, WindowReport, profiled
from instrument.base.report import FrozenMap, OpStats, RangeStats
from instrument.export.pipeline import export_report
from instrument.testing import capture

HTA_RANK = re.compile(r'"rank":\s+(\d+)')  # Holistic Trace Analysis finds a file's rank so


# ---------------------------------------------------------------- helpers


def exporter_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ExporterWarning)]


def write_raw_trace(path, *, rank: int = 0, world_size: int = 1) -> str:
    """A small Kineto-shaped trace, as the session hands it to exporters."""
    trace = {
        "schemaVersion": 1,
        "traceEvents": [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "f",
                "pid": 1,
                "tid": 1,
                "ts": 100.0,
                "dur": 10.0,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": 101.0,
                "dur": 6.0,
            },
        ],
        "distributedInfo": {"backend": None, "rank": rank, "world_size": world_size},
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    return str(path)


def make_report(
    raw_trace_path: str | None,
    *,
    host: str = "hostA",
    pid: int = 111,
    rank: int = 0,
    window: int = 0,
) -> WindowReport:
    now = time.time_ns()
    return WindowReport(
        window=window,
        steps=(1, 2),
        partial=False,
        start_ns=now - 5_000_000,
        end_ns=now,
        rank=rank,
        world_size=2,
        host=host,
        pid=pid,
        device="cpu",
        activities=("cpu",),
        ranges=FrozenMap({"f": RangeStats("f", 2, 10.0, 4.0, 0.0, 0)}),
        top_ops=(OpStats("aten::mm", 2, 6.0, 6.0),),
        self_cpu_time_total_us=10.0,
        event_count=2,
        raw_trace_path=raw_trace_path,
    )


def listing(path) -> list[str]:
    return sorted(os.listdir(path))


# ---------------------------------------------------------------- one real window


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    """Two recorded steps of a real profiler, given to two consoles and two trace exporters
    (the consoles are listed before the trace exporters)."""
    base = tmp_path_factory.mktemp("window")
    with pytest.MonkeyPatch.context() as mp:
        for var in list(os.environ):
            if var.startswith("PROFILED_"):
                mp.delenv(var)
        mp.setenv("PROFILED_EXPORTERS", "memory")
        mp.setenv("PROFILED_TRACE_DIR", str(base / "ambient"))
        mp.chdir(base)  # the console shows the trace path relative to here
        instrument.testing.reset()
        import torch

        @profiled("matmul_bias")
        def matmul_bias(x, w, b):
            return x @ w + b

        x, w, b = torch.randn(384, 384), torch.randn(384, 384), torch.randn(384)
        for _ in range(3):  # first calls of an op pay one-off setup: keep that out of the window
            (x * 1.0) @ w + b
        console = ConsoleExporter(stream=io.StringIO())
        console_one_row = ConsoleExporter(stream=io.StringIO(), rows=1)
        trace_gz = TraceFileExporter(base / "gz")
        trace_json = TraceFileExporter(base / "json", gzip=False)
        before_ns = time.time_ns()
        with capture(
            schedule=Schedule(wait=0, warmup=1, active=2),
            activities=["cpu"],
            exporters=[console, console_one_row, trace_gz, trace_json],
        ) as cap:
            cap.step()  # ends step 0 (warm-up); from now on only step() ends steps
            for _ in range(2):
                with profiled("load_batch"):
                    batch = x * 1.0
                matmul_bias(batch, w, b)
                matmul_bias(batch, w, b)
                cap.step()
        after_ns = time.time_ns()
        reports = cap.reports
        instrument.testing.reset()
    assert len(reports) == 1, reports
    return SimpleNamespace(
        base=str(base),
        report=reports[0],
        text=console.stream.getvalue(),
        text_one_row=console_one_row.stream.getvalue(),
        gz=trace_gz.last_path,
        json=trace_json.last_path,
        before_ns=before_ns,
        after_ns=after_ns,
    )


def test_real_window_report(window):
    r = window.report
    assert r.steps == (1, 2) and r.window == 0 and not r.partial
    assert r.ranges["matmul_bias"].calls == 4
    assert r.ranges["load_batch"].calls == 2
    ops = {op.name: op for op in r.top_ops}
    assert ops["aten::mm"].calls == 4 and ops["aten::add"].calls == 4
    self_times = [op.self_cpu_time_us for op in r.top_ops]
    assert self_times == sorted(self_times, reverse=True)
    # the in-memory exporter (listed before the trace exporters) saw the written path
    assert r.trace_file == window.gz
    assert r.rank == 0 and r.world_size == 1 and r.pid == os.getpid()


def _sections(text: str) -> tuple[list[str], dict[str, int]]:
    lines = text.strip("\n").split("\n")
    where = {}
    for i, line in enumerate(lines):
        for key in ("@profiled range", "top operators", "Self CPU time total:", "Trace:"):
            if line.startswith(key) and key not in where:
                where[key] = i
    return lines, where


def _rows_between(lines: list[str], start: int) -> list[str]:
    rows = []
    for line in lines[start + 1 :]:
        if set(line) == {"-"}:
            break
        rows.append(line)
    return rows


def test_console_table(window):
    lines, where = _sections(window.text)
    assert lines[0].startswith("torch-profiled | window 0 | steps 1-2 | cpu | rank 0/1 | ")
    # the header's time is how long the profiler recorded, not a second "wall" beside the
    # verdict line's (which runs to the last kernel's end)
    assert lines[0].endswith(f" | recorded {format_time_us(window.report.duration_us)}")
    assert sum(" wall" in line for line in lines[:4]) <= 1
    # ranges first, then top operators, the total, the trace path
    assert (
        where["@profiled range"]
        < where["top operators"]
        < where["Self CPU time total:"]
        < where["Trace:"]
    )
    ranges = {row.split()[0]: row.split() for row in _rows_between(lines, where["@profiled range"])}
    assert set(ranges) == {"matmul_bias", "load_batch"}
    assert ranges["matmul_bias"][1] == "4" and ranges["load_batch"][1] == "2"
    ops = {row.split()[0]: row.split() for row in _rows_between(lines, where["top operators"])}
    assert list(ops) == [op.name for op in window.report.top_ops]  # by self CPU time
    assert ops["aten::mm"][1] == "4"  # the matmul's operator, with its calls
    total = format_time_us(window.report.self_cpu_time_total_us)
    assert lines[where["Self CPU time total:"]] == f"Self CPU time total: {total}"
    assert "Self CUDA time total" not in window.text  # CPU-only window
    # the trace line names the file the trace exporter wrote (relative to the cwd at export)
    shown = lines[where["Trace:"]][len("Trace: ") :]
    assert shown.startswith("./gz/")
    assert os.path.normpath(os.path.join(window.base, shown)) == window.gz
    assert os.path.isfile(os.path.join(window.base, shown))
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)


def test_console_rows_limits_every_section(window):
    lines, where = _sections(window.text_one_row)
    assert len(_rows_between(lines, where["@profiled range"])) == 1
    ops = _rows_between(lines, where["top operators"])
    assert len(ops) == 1 and ops[0].split()[0] == window.report.top_ops[0].name
    assert all(len(line) <= WIDTH for line in lines)
    with pytest.raises(ValueError, match="rows"):
        ConsoleExporter(rows=0)


def test_trace_file_names(window):
    r = window.report
    for path, suffix in ((window.gz, r".pt\.trace\.json\.gz"), (window.json, r".pt\.trace\.json")):
        assert os.path.isabs(path)
        name = os.path.basename(path)
        m = re.fullmatch(re.escape(f"{r.host}_{os.getpid()}_rank0.") + r"(\d+)" + suffix, name)
        assert m, name
        assert window.before_ns <= int(m.group(1)) <= window.after_ns
    assert listing(os.path.dirname(window.gz)) == [os.path.basename(window.gz)]  # no temp left
    assert listing(os.path.dirname(window.json)) == [os.path.basename(window.json)]


def test_trace_file_contents(window):
    with gzip.open(window.gz, "rt", encoding="utf-8") as f:
        gz_text = f.read()
    with open(window.json, encoding="utf-8") as f:
        json_text = f.read()
    assert json.loads(gz_text) == json.loads(json_text)
    for text in (gz_text, json_text):
        assert HTA_RANK.findall(text) == ["0"]
        trace = json.loads(text)
        assert trace["distributedInfo"]["rank"] == 0
        assert trace["distributedInfo"]["world_size"] == 1
        events = trace["traceEvents"]
        annotations = [e for e in events if e.get("cat") == "user_annotation"]
        names = [e["name"] for e in annotations]
        assert names.count("matmul_bias") == 4 and names.count("load_batch") == 2
        steps = {e["name"]: e for e in annotations if e["name"].startswith("ProfilerStep#")}
        assert sorted(steps) == ["ProfilerStep#1", "ProfilerStep#2"]
        assert all(s["ph"] == "X" and s["dur"] > 0 for s in steps.values())
        for e in annotations:
            if e["name"] in ("matmul_bias", "load_batch"):
                inside = [
                    s
                    for s in steps.values()
                    if s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"]
                ]
                assert len(inside) == 1, e
        assert not any(str(e.get("name", "")).startswith("profiled::") for e in events)


def test_trace_file_permissions_follow_the_umask(window):
    umask = os.umask(0)
    os.umask(umask)
    for path in (window.gz, window.json):
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


# ---------------------------------------------------------------- WindowReport


def test_window_report_is_frozen_plain_data(window):
    r = window.report
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.window = 7  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.ranges["matmul_bias"].calls = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        r.ranges["new"] = r.ranges["matmul_bias"]  # type: ignore[index]
    with pytest.raises(TypeError):
        del r.ranges["matmul_bias"]  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        r.ranges._data = {}  # type: ignore[attr-defined]
    assert r.ranges["matmul_bias"].calls == 4

    copy = pickle.loads(pickle.dumps(r))
    assert copy == r and copy.ranges["matmul_bias"] == r.ranges["matmul_bias"]
    assert isinstance(copy.ranges, FrozenMap)

    data = json.loads(json.dumps(r.to_dict()))
    assert data["ranges"]["matmul_bias"]["calls"] == 4
    assert data["steps"] == [1, 2]
    assert data["top_ops"][0]["name"] == r.top_ops[0].name
    assert data["trace_file"] == window.gz


# ---------------------------------------------------------------- TraceFileExporter alone


def test_trace_exporter_gzip_and_plain(tmp_path):
    raw = write_raw_trace(tmp_path / "raw.json", rank=1, world_size=2)
    for gzip_on, suffix in ((True, ".pt.trace.json.gz"), (False, ".pt.trace.json")):
        out = tmp_path / f"out-{gzip_on}"
        exporter = TraceFileExporter(out, gzip=gzip_on)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert exporter.export(make_report(raw, rank=1)) is ExportResult.SUCCESS
        (name,) = listing(out)
        assert re.fullmatch(r"hostA_111_rank1\.\d+" + re.escape(suffix), name)
        assert exporter.last_path == str(out / name)
        opener = gzip.open if gzip_on else open
        with opener(exporter.last_path, "rt", encoding="utf-8") as f:
            text = f.read()
        assert HTA_RANK.findall(text) == ["1"]
        assert json.loads(text)["distributedInfo"]["world_size"] == 2


def test_trace_exporter_links_the_compressed_trace_and_never_opens_the_raw_one(tmp_path):
    """Where the analysis helper wrote the shaped trace compressed (``raw_trace_gz_path``), the
    gzip exporter's file is that file linked into place: this process neither reads the raw
    trace (gone here) nor compresses anything."""
    raw = write_raw_trace(tmp_path / "raw.json", rank=1)
    with open(raw, "rb") as f:
        data = f.read()
    gz = tmp_path / "raw.json.gz"
    gz.write_bytes(gzip.compress(data))
    os.unlink(raw)
    report = dataclasses.replace(make_report(raw, rank=1), raw_trace_gz_path=str(gz))
    out = tmp_path / "out"
    exporter = TraceFileExporter(out)
    assert exporter.wants_gzip_trace
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert exporter.export(report) is ExportResult.SUCCESS
    (name,) = listing(out)
    assert re.fullmatch(r"hostA_111_rank1\.\d+\.pt\.trace\.json\.gz", name)
    assert exporter.last_path == str(out / name)
    assert os.path.samefile(exporter.last_path, gz)  # the same file: linked, not written
    with gzip.open(exporter.last_path, "rb") as f:
        assert f.read() == data
    plain = TraceFileExporter(tmp_path / "plain", gzip=False)  # copies the raw trace: gone
    assert not plain.wants_gzip_trace
    with pytest.warns(ExporterWarning, match="was not written"):
        assert plain.export(report) is ExportResult.FAILURE


def test_trace_exporter_copies_the_compressed_trace_as_it_is_across_filesystems(tmp_path):
    """No link across filesystems: the compressed file is copied byte for byte (not
    compressed again), atomically, with the usual permissions (not the scratch file's)."""
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second filesystem (/dev/shm)")
    raw = write_raw_trace(tmp_path / "raw.json")
    with open(raw, "rb") as f:
        compressed = gzip.compress(f.read())
    os.unlink(raw)
    gz = os.path.join(shm, f"torch-profiled-test-{uuid.uuid4().hex}.json.gz")
    try:
        with open(gz, "wb") as f:
            f.write(compressed)
        os.chmod(gz, 0o600)
        out = tmp_path / "out"
        exporter = TraceFileExporter(out)
        report = dataclasses.replace(make_report(raw), raw_trace_gz_path=gz)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert exporter.export(report) is ExportResult.SUCCESS
        assert listing(out) == [os.path.basename(exporter.last_path)]  # no temporary file left
        with open(exporter.last_path, "rb") as f:
            assert f.read() == compressed
        assert not os.path.samefile(exporter.last_path, gz)
        umask = os.umask(0)
        os.umask(umask)
        assert os.stat(exporter.last_path).st_mode & 0o777 == 0o666 & ~umask
    finally:
        os.unlink(gz)


@pytest.mark.parametrize("helper", [True, False])
def test_a_sessions_trace_file_holds_the_shaped_trace_byte_for_byte(tmp_path, helper):
    """Through real windows: the trace file decompresses to the very bytes of the shaped
    trace the other exporters are handed. With the analysis helper it is the helper's
    compressed file, linked (made with the program's umask of the moment, changed here after
    the helper started); without it, compressed here as before."""

    class Peek(Exporter):  # runs after the trace exporter (trace writers go first)
        def __init__(self) -> None:
            self.seen: list[tuple[bool, bool, int]] = []

        def export(self, report) -> ExportResult:
            with open(report.raw_trace_path, "rb") as f:
                raw = f.read()
            with gzip.open(report.trace_file, "rb") as f:
                same_bytes = f.read() == raw
            gz = report.raw_trace_gz_path
            linked = gz is not None and os.path.samefile(gz, report.trace_file)
            mode = os.stat(report.trace_file).st_mode & 0o777
            self.seen.append((same_bytes, linked, mode))
            return ExportResult.SUCCESS

    @profiled("gz.work")
    def work():
        import torch

        return float((torch.ones(48, 48) @ torch.ones(48, 48)).sum())

    peek, traces = Peek(), TraceFileExporter(tmp_path / "traces", keep=1)
    umask = os.umask(0o022)
    try:
        with capture(
            schedule=Schedule(wait=0, warmup=1, active=1, repeat=2),
            activities=["cpu"],
            exporters=[peek, traces],
            analysis_process=helper,
        ) as cap:
            for step in range(4):
                if step == 2:
                    assert instrument.flush(30)
                    os.umask(0o027)  # the helper, if any, started under 0o022
                work()
                cap.step()
    finally:
        os.umask(umask)
    assert len(cap.reports) == 2
    assert peek.seen == [(True, helper, 0o644), (True, helper, 0o640)]
    assert listing(tmp_path / "traces") == [os.path.basename(traces.last_path)]  # keep=1


def test_trace_exporter_keeps_newest_files_of_this_worker_only(tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    mine_old = [f"hostA_111_rank0.{n}.pt.trace.json.gz" for n in range(1, 6)]
    mine_old.append("hostA_111_rank0.6.pt.trace.json")  # same worker, other suffix, newest old
    others = [
        "hostA_222_rank0.1.pt.trace.json.gz",  # another process
        "hostA_111_rank1.1.pt.trace.json.gz",  # another rank
        "hostA_111_rank01.1.pt.trace.json.gz",  # a name that merely starts alike
        "hostB_111_rank0.1.pt.trace.json.gz",  # another host
        "hostA_111_rank0.notes.txt",  # not a trace file
    ]
    for name in mine_old + others:
        (out / name).write_text("{}")
    raw = write_raw_trace(tmp_path / "raw.json")
    exporter = TraceFileExporter(out, keep=3)
    written = []
    for window_index in range(2):
        assert exporter.export(make_report(raw, window=window_index)) is ExportResult.SUCCESS
        written.append(os.path.basename(exporter.last_path))
    assert listing(out) == sorted(others + ["hostA_111_rank0.6.pt.trace.json"] + written)

    keep_all = TraceFileExporter(out, keep=0)
    assert keep_all.export(make_report(raw)) is ExportResult.SUCCESS
    assert len(listing(out)) == len(others) + 4


def test_trace_exporter_dir_that_is_a_file_fails_cleanly(tmp_path):
    raw = write_raw_trace(tmp_path / "raw.json")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("keep me")
    exporter = TraceFileExporter(blocker)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert exporter.export(make_report(raw)) is ExportResult.FAILURE
    messages = exporter_warnings(caught)
    assert len(messages) == 1
    # the path, that it is a file, what happens; not os.makedirs' bare "File exists"
    assert f"trace directory {str(blocker)!r}" in messages[0]
    assert "is a file, not a directory: no trace files are written" in messages[0]
    assert "File exists" not in messages[0]
    assert exporter.last_path is None
    assert blocker.read_text() == "keep me"
    assert listing(tmp_path) == ["not-a-dir", "raw.json"]


def test_trace_exporter_source_that_disappears_leaves_no_file(tmp_path):
    raw = write_raw_trace(tmp_path / "raw.json")
    out = tmp_path / "traces"
    exporter = TraceFileExporter(out)
    report = make_report(raw)
    assert exporter.export(report) is ExportResult.SUCCESS
    first = listing(out)
    os.unlink(raw)  # the window's raw trace is gone while the copy is being made
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert exporter.export(make_report(raw, window=1)) is ExportResult.FAILURE
    messages = exporter_warnings(caught)
    assert len(messages) == 1 and "window 1" in messages[0] and raw in messages[0]
    assert exporter.last_path is None
    assert listing(out) == first  # no partial file, no temporary file


def test_trace_exporter_report_without_raw_trace(tmp_path):
    exporter = TraceFileExporter(tmp_path / "traces")
    with pytest.warns(ExporterWarning, match="raw"):
        assert exporter.export(make_report(None)) is ExportResult.FAILURE
    assert not (tmp_path / "traces").exists()


def test_trace_exporter_rejects_bad_arguments():
    with pytest.raises(ValueError, match="keep"):
        TraceFileExporter(keep=-1)
    with pytest.raises(TypeError, match="gzip"):
        TraceFileExporter(gzip=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dir"):
        TraceFileExporter("")


# ---------------------------------------------------------------- pipeline


class Boom(Exporter):
    def export(self, report):
        raise RuntimeError("backend down")


def test_pipeline_isolates_a_raising_exporter_and_names_the_trace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = write_raw_trace(tmp_path / "raw.json")
    stream = io.StringIO()
    memory = InMemoryExporter()
    trace = TraceFileExporter(tmp_path / "traces")
    report = make_report(raw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the console and the memory exporter are listed before the trace exporter
        final = export_report(report, [Boom(), ConsoleExporter(stream=stream), memory, trace])
    messages = exporter_warnings(caught)
    assert len(messages) == 1
    assert "Boom" in messages[0] and "backend down" in messages[0]
    assert final.trace_file == trace.last_path and os.path.isfile(trace.last_path)
    assert memory.reports == [final]
    lines = stream.getvalue().splitlines()
    assert lines[-1] == "Trace: " + os.path.join(".", "traces", os.path.basename(trace.last_path))
    assert report.trace_file is None  # the caller's report is never mutated


def test_pipeline_when_the_trace_exporter_fails(tmp_path):
    raw = write_raw_trace(tmp_path / "raw.json")
    blocker = tmp_path / "file"
    blocker.write_text("")
    stream = io.StringIO()
    memory = InMemoryExporter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        final = export_report(
            make_report(raw), [ConsoleExporter(stream=stream), TraceFileExporter(blocker), memory]
        )
    assert len(exporter_warnings(caught)) == 1  # the trace exporter's own, not a second one
    assert final.trace_file is None
    assert memory.reports == [final]
    assert "Trace:" not in stream.getvalue() and "Self CPU time total:" in stream.getvalue()


def test_console_never_cuts_a_long_trace_path():
    long_path = (
        "/" + "/".join(["a-rather-long-directory-name"] * 6) + "/h_1_rank0.1.pt.trace.json.gz"
    )
    report = dataclasses.replace(make_report(None), trace_file=long_path)
    lines = format_report(report).splitlines()
    assert long_path in lines
    assert all(len(line) <= WIDTH for line in lines if line != long_path)
    # wide numbers shrink the name column instead of passing the width
    wide = dataclasses.replace(
        report,
        ranges=FrozenMap({"n" * 80: RangeStats("n" * 80, 123_456_789, 9.9e9, 1.0, 9.9e9, 10**10)}),
        top_ops=(OpStats("o" * 90, 10**9, 9.9e9, 9.9e9),),
    )
    assert all(len(line) <= WIDTH for line in format_report(wide).splitlines() if line != long_path)


def test_console_range_column_grows_for_module_paths_and_cuts_their_middle():
    names = ["model.layers.11.self_attn", "model.layers.1.post_attention_layernorm", "f"]
    report = dataclasses.replace(
        make_report(None),
        ranges=FrozenMap({n: RangeStats(n, 3, 10.0 + i, 4.0, 0.0, 0) for i, n in enumerate(names)}),
    )
    lines = format_report(report).splitlines()
    header = next(line for line in lines if line.startswith("@profiled range"))
    column = header.index("calls") - 1  # where each row's 6-wide calls field starts
    rows = {line.split()[0]: line for line in lines if line.startswith(("model.", "f "))}
    assert "model.layers.11.self_attn" in rows  # 25 characters: shown whole
    cut = "model.layers.1...ntion_layernorm"  # 39 characters: layer index and leaf kept
    assert cut in rows and len(cut) == WIDTH - 68
    assert all(
        line[column - 1] == " " and line[column : column + 6].strip() == "3"
        for line in rows.values()
    )
    assert all(len(line) <= WIDTH for line in lines)
    short = format_report(make_report(None)).splitlines()
    assert next(line for line in short if line.startswith("@profiled range")).index("calls") == 26


# ---------------------------------------------------------------- registry


def test_builtin_exporters_by_name(tmp_path):
    built = resolve_exporters(
        ["console", " Trace ", "MEMORY"],
        builtin_kwargs={"trace": {"dir": str(tmp_path), "keep": 2}},
    )
    assert [type(e) for e in built] == [ConsoleExporter, TraceFileExporter, InMemoryExporter]
    assert built[1].dir == str(tmp_path) and built[1].keep == 2
    mine = InMemoryExporter()
    assert resolve_exporters([mine]) == [mine]  # instances pass through
    assert {"console", "trace", "memory"} <= set(known_exporter_names())


def test_unknown_exporter_name_warns_and_is_skipped():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = resolve_exporters(["memory", "zipkin"])
    assert [type(e) for e in built] == [InMemoryExporter]
    messages = exporter_warnings(caught)
    assert len(messages) == 1
    assert "zipkin" in messages[0]
    assert all(name in messages[0] for name in ("console", "memory", "trace"))


def test_unknown_name_in_the_environment_warns_when_the_session_is_built(monkeypatch):
    monkeypatch.setenv("PROFILED_EXPORTERS", "memory,zipkin")
    with pytest.warns(ExporterWarning, match="zipkin"):
        sess = instrument.session()
    assert [type(e) for e in sess.exporters] == [InMemoryExporter]


PLUGIN_SOURCE = """
from exporters import Exporter, ExportResult


class MineExporter(Exporter):
    def __init__(self):
        self.reports = []

    def export(self, report):
        self.reports.append(report)
        return ExportResult.SUCCESS


def make_shiny():
    return MineExporter()


def explode():
    raise RuntimeError("factory exploded")


def not_an_exporter():
    return object()
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A real installed distribution (a ``*.dist-info`` on sys.path) with entry points."""
    uid = uuid.uuid4().hex[:8]
    module = f"tp_plugin_{uid}"
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{module}.py").write_text(PLUGIN_SOURCE)
    info = site / f"tp_plugin_{uid}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tp-plugin-{uid}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(f"""\
        [torch_profiled.exporters]
        mine = {module}:MineExporter
        Shiny = {module}:make_shiny
        explodes = {module}:explode
        notexp = {module}:not_an_exporter
        missing = {module}_not_installed:Nothing
        """)
    )
    monkeypatch.syspath_prepend(str(site))
    yield module
    sys.modules.pop(module, None)


def test_entry_point_exporter_found_by_name(plugin, monkeypatch):
    assert {"mine", "shiny"} <= set(known_exporter_names())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built = resolve_exporters(["mine", "SHINY", "console"])
    assert [type(e).__name__ for e in built] == ["MineExporter", "MineExporter", "ConsoleExporter"]
    assert type(built[0]).__module__ == plugin
    check_exporter_names(["Mine", "shiny", "memory"])  # known: no error
    # by name in code and in the environment
    assert type(instrument.session(exporters=["mine"]).exporters[0]).__name__ == "MineExporter"
    monkeypatch.setenv("PROFILED_EXPORTERS", "Shiny")
    assert [type(e).__name__ for e in instrument.session().exporters] == ["MineExporter"]


@pytest.mark.parametrize(
    ("name", "why"),
    [("explodes", "factory exploded"), ("missing", "_not_installed"), ("notexp", "object")],
)
def test_broken_entry_point_warns_and_is_skipped(plugin, name, why):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = resolve_exporters([name, "memory"])
    assert [type(e) for e in built] == [InMemoryExporter]
    messages = exporter_warnings(caught)
    assert len(messages) == 1 and name in messages[0] and why in messages[0]


# ---------------------------------------------------------------- InMemoryExporter


def test_in_memory_exporter_collects_reports():
    memory = InMemoryExporter()
    first, second = make_report(None, window=0), make_report(None, window=1)
    assert memory.export(first) is ExportResult.SUCCESS
    assert memory.export(second) is ExportResult.SUCCESS
    got = memory.reports
    assert got == [first, second]
    got.clear()  # a copy: the exporter keeps its reports
    assert memory.reports == [first, second]
    memory.notice("hello")
    assert memory.notices == ["hello"]
    memory.clear()
    assert memory.reports == [] and memory.notices == []
    memory.shutdown()
    assert memory.is_shutdown


def test_in_memory_exporter_gets_the_notice_when_no_window_ran():
    with capture(schedule=Schedule(wait=5, warmup=1, active=1)) as cap:
        pass
    assert cap.reports == []
    assert len(cap.exporter.notices) == 1 and "no table" in cap.exporter.notices[0]
    assert cap.exporter.is_shutdown


def test_exporters_package_does_not_import_torch(run_python):
    # of instrument, exporters import only its base (instrument's face is lazy: no runtime)
    result = run_python(
        "import sys, exporters\n"
        "from exporters import ConsoleExporter, TraceFileExporter, InMemoryExporter\n"
        "print('torch' in sys.modules, 'instrument.runtime.decorator' in sys.modules)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]
