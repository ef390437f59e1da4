"""The ``torch-profiled`` command: summarize and diff traces from plain torch.profiler, from
tensorboard_trace_handler, from the SDK; per-rank directories; every bad input, traces past
``--max-mb`` (gzip bombs included) and ``--range`` names that are not there."""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import instrument
from instrument import cli
from tests import _proc
from tests._proc import REPO

ITERS = 10


def _run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """``python -m instrument ARGS`` in a real process."""
    return _proc.run("-m", "instrument", *args, cwd=cwd)


def _main(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _us(text: str) -> float:
    """``2.342ms`` -> 2342.0 (the console's time format)."""
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    assert m, text
    return float(m.group(1)) * {"us": 1.0, "ms": 1e3, "s": 1e6}[m.group(2)]


def _self_cpu_total(out: str) -> float:
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Self CPU time total:")]
    return _us(line.split(":", 1)[1])


def _scaled(trace: dict, factor: float, **top) -> dict:
    """A copy of ``trace`` whose every complete event is ``factor`` times slower."""
    out = copy.deepcopy(trace)
    for ev in out["traceEvents"]:
        if ev.get("ph") == "X":
            ev["ts"] = ev["ts"] * factor
            ev["dur"] = ev["dur"] * factor
    out.update(top)
    return out


def _write(path, trace) -> str:
    with open(path, "w") as f:
        json.dump(trace, f)
    return str(path)


def _mb_loop(x, w, b, n):
    for _ in range(n):
        with torch.profiler.record_function("mb"):
            x @ w + b


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Traces written by plain torch.profiler (no SDK), with torch's own totals beside them."""
    d = tmp_path_factory.mktemp("traces")
    x, w, b = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64)
    cpu = [torch.profiler.ProfilerActivity.CPU]  # CPU-only traces, also on a GPU host
    with torch.profiler.profile(activities=cpu) as p:
        _mb_loop(x, w, b, ITERS)
    plain = str(d / "plain.json")
    p.export_chrome_trace(plain)
    plain_ka = p.key_averages()

    tb_dir = d / "tb"
    seen = {}

    def on_ready(prof):
        torch.profiler.tensorboard_trace_handler(str(tb_dir), use_gzip=True)(prof)
        seen["ka"] = prof.key_averages()

    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(activities=cpu, schedule=sched, on_trace_ready=on_ready) as p:
        for _ in range(5):
            _mb_loop(x, w, b, 5)
            p.step()
    return {
        "dir": d,
        "plain": plain,
        "plain_ka": plain_ka,
        "tb": str(tb_dir),
        "tb_ka": seen["ka"],
        "trace": json.load(open(plain)),
    }


# ---------------------------------------------------------------- summarize


def test_summarize_plain_torch_trace_in_a_real_process(traces):
    out = _run("summarize", traces["plain"])
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    text = out.stdout
    (row,) = [ln for ln in text.splitlines() if ln.split()[:1] == ["mb"]]
    assert row.split()[1] == str(ITERS)  # calls
    assert "cpu-only" in row
    assert "cpu-only" in text.split("@profiled range")[0]  # the window's verdict
    ops = text.split("top operators by self CPU time")[1]
    assert "aten::mm" in ops and "aten::add" in ops
    assert all(len(ln) <= 100 for ln in text.splitlines())
    # "Self CPU time total" as torch's table prints it (record_function self time included)
    torch_total = sum(e.self_cpu_time_total for e in traces["plain_ka"])
    assert _self_cpu_total(text) == pytest.approx(torch_total, rel=0.01)
    assert f"Trace: {traces['plain']}" in text or "plain.json" in text.splitlines()[-1]


def test_plain_trace_totals_and_ops_agree_with_key_averages(traces):
    report = cli.report_from_trace(traces["plain"], cli.load_checked(traces["plain"]), rows=50)
    ka = {e.key: e for e in traces["plain_ka"]}
    torch_total = sum(e.self_cpu_time_total for e in ka.values())
    ours = report.self_cpu_time_total_us + report.profiler_overhead_us
    assert ours == pytest.approx(torch_total, rel=0.01)
    assert report.ranges["mb"].calls == ka["mb"].count == ITERS
    assert report.ranges["mb"].self_cpu_time_us == pytest.approx(
        ka["mb"].self_cpu_time_total, rel=0.01
    )
    for op in report.top_ops:
        assert op.calls == ka[op.name].count, op.name
        assert op.self_cpu_time_us == pytest.approx(
            ka[op.name].self_cpu_time_total, rel=0.01, abs=0.01
        ), op.name
    assert report.verdict.kind == "cpu-only"
    assert report.device == "cpu" and report.activities == ("cpu",)
    assert report.rank == 0 and report.world_size == 1
    assert report.start_ns > 1_600_000_000 * 10**9  # epoch ns from baseTimeNanoseconds
    assert report.end_ns > report.start_ns
    assert report.pid == os.getpid()
    assert report.trace_file == traces["plain"]


def test_tensorboard_handler_directory_with_gzip(traces, capsys):
    (name,) = os.listdir(traces["tb"])
    assert name.endswith(".pt.trace.json.gz")
    rc, out, err = _main(capsys, "summarize", traces["tb"])
    assert rc == 0 and err == ""
    assert "steps 2-3" in out.splitlines()[0]  # ProfilerStep#2, #3
    (row,) = [ln for ln in out.splitlines() if ln.split()[:1] == ["mb"]]
    assert row.split()[1] == "10"  # 2 active steps x 5
    assert name in out


def test_tensorboard_trace_user_time_matches_key_averages(traces):
    """torch's total = user self time + ProfilerStep#N's self time."""
    (name,) = os.listdir(traces["tb"])
    path = os.path.join(traces["tb"], name)
    report = cli.report_from_trace(path, cli.load_checked(path))
    ka = traces["tb_ka"]
    torch_total = sum(e.self_cpu_time_total for e in ka)
    step_self = sum(e.self_cpu_time_total for e in ka if e.key.startswith("ProfilerStep"))
    assert report.self_cpu_time_total_us + step_self == pytest.approx(torch_total, rel=0.01)


def test_tensorboard_trace_bookkeeping_is_the_step_spans_self_time(traces):
    (name,) = os.listdir(traces["tb"])
    path = os.path.join(traces["tb"], name)
    report = cli.report_from_trace(path, cli.load_checked(path))
    torch_total = sum(e.self_cpu_time_total for e in traces["tb_ka"])
    ours = report.self_cpu_time_total_us + report.profiler_overhead_us
    assert ours == pytest.approx(torch_total, rel=0.01)


def test_json_output(traces, capsys, tmp_path):
    rc, out, _ = _main(capsys, "summarize", "--json", traces["plain"])
    assert rc == 0
    doc = json.loads(out)
    assert isinstance(doc, dict)
    assert doc["ranges"]["mb"]["calls"] == ITERS
    assert doc["verdict"]["kind"] == "cpu-only"
    assert doc["trace_file"] == traces["plain"]
    other = _write(tmp_path / "other.json", traces["trace"])
    rc, out, _ = _main(capsys, "summarize", "--json", traces["plain"], other)
    docs = json.loads(out)
    assert isinstance(docs, list) and len(docs) == 2
    assert [d["window"] for d in docs] == [0, 1]
    assert all(d["ranges"]["mb"]["calls"] == ITERS for d in docs)


def test_range_filter(traces, capsys, tmp_path):
    trace = copy.deepcopy(traces["trace"])
    trace["traceEvents"] += [
        dict(e, name="other") for e in trace["traceEvents"] if e.get("name") == "mb"
    ][:1]
    path = _write(tmp_path / "two_ranges.json", trace)
    rc, out, _ = _main(capsys, "summarize", "--json", path)
    assert set(json.loads(out)["ranges"]) == {"mb", "other"}
    rc, out, _ = _main(capsys, "summarize", "--json", "--range", "mb", path)
    assert rc == 0 and set(json.loads(out)["ranges"]) == {"mb"}
    rc, out, _ = _main(capsys, "summarize", "--range", "other", path)
    assert rc == 0
    names = [
        ln.split()[0]
        for ln in out.split("@profiled range")[1].split("---")[0].splitlines()
        if ln.strip()
    ][1:]
    assert "other" in names and "mb" not in names
    # a range recorded as a plain operator (@profiled inside someone else's profiler)
    rc, out, _ = _main(capsys, "summarize", "--json", "--range", "aten::mm", path)
    assert json.loads(out)["ranges"]["aten::mm"]["calls"] == ITERS
    rc, out, err = _main(capsys, "summarize", "--range", "mb", "--range", "nope", path)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("torch-profiled: error:")
    assert "'nope'" in err and "mb" in err


def test_rows_limits_every_section(traces, capsys):
    rc, out, _ = _main(capsys, "summarize", "--rows", "1", traces["plain"])
    assert rc == 0
    section = out.split("top operators by self CPU time")[1].split("-" * 20)[0]
    assert len([ln for ln in section.splitlines()[1:] if ln.strip()]) == 1
    rc, out, _ = _main(capsys, "summarize", "--json", "--rows", "2", traces["plain"])
    assert len(json.loads(out)["top_ops"]) == 2
    for bad in ("0", "-3", "x"):
        rc, _, err = _main(capsys, "summarize", "--rows", bad, traces["plain"])
        assert rc == 2 and "--rows" in err


def _rank_dir(tmp_path, trace, factors):
    d = tmp_path / "ranks"
    d.mkdir()
    for rank, factor in enumerate(factors):
        t = _scaled(
            trace,
            factor,
            distributedInfo={"backend": "gloo", "rank": rank, "world_size": len(factors)},
        )
        _write(d / f"host_{rank}.{rank}.pt.trace.json", t)
    (d / "notes.json").write_text("{}")  # ignored: the .pt.trace.json files are preferred
    return str(d)


def test_directory_of_two_ranks(traces, capsys, tmp_path):
    d = _rank_dir(tmp_path, traces["trace"], [1.0, 2.0])
    rc, out, err = _main(capsys, "summarize", d)
    assert rc == 0, err
    titles = [ln for ln in out.splitlines() if ln.startswith("torch-profiled | window")]
    assert len(titles) == 2
    assert "rank 0/2" in titles[0] and "rank 1/2" in titles[1]
    side = out.split("ranks side by side")[1]
    assert "rank 0" in side and "rank 1" in side
    (row,) = [ln for ln in side.splitlines() if ln.startswith("mb ")]
    cells = row.split()
    assert cells[-4:-2] == ["rank", "1"]  # slowest rank
    assert cells[-1] == "2.00x"
    assert _us(cells[2]) == pytest.approx(2 * _us(cells[1]), rel=0.001)
    assert _us(cells[-2]) == pytest.approx(_us(cells[1]), rel=0.001)  # spread = max - min
    assert all(len(ln) <= 100 for ln in out.splitlines())

    rc, out, _ = _main(capsys, "summarize", "--json", d)
    doc = json.loads(out)
    assert [r["rank"] for r in doc["reports"]] == [0, 1]
    mb = doc["ranks"]["ranges"]["mb"]
    assert mb["slowest_rank"] == 1 and mb["ratio"] == pytest.approx(2.0, rel=1e-3)
    assert mb["spread_us"] == pytest.approx(mb["by_rank_us"]["0"], rel=1e-3)


def test_many_ranks_show_min_median_max_within_100_columns(traces, capsys, tmp_path):
    d = _rank_dir(tmp_path, traces["trace"], [1 + r / 10 for r in range(8)])
    rc, out, _ = _main(capsys, "summarize", "--rows", "3", d)
    assert rc == 0
    side = out.split("ranks side by side")[1].splitlines()
    header = next(ln for ln in side if ln.startswith("range"))
    assert header.split()[1:4] == ["min", "median", "max"]
    (row,) = [ln for ln in side if ln.startswith("mb ")]
    assert "rank 7" in row and row.split()[-1] == "8/8"
    assert all(len(ln) <= 100 for ln in out.splitlines())


def test_sdk_trace_files(tmp_path, capsys):
    from exporters import TraceFileExporter
    from instrument import Schedule, profiled
    from instrument.testing import capture

    @profiled("sdk_range")
    def work(x):
        return x @ x

    x = torch.randn(32, 32)
    with capture(
        schedule=Schedule(wait=0, warmup=1, active=2),
        exporters=[TraceFileExporter(tmp_path / "sdk")],
    ) as cap:
        for _ in range(3):
            work(x)
            cap.step()
    live = cap.reports[0]
    rc, out, _ = _main(capsys, "summarize", "--json", str(tmp_path / "sdk"))
    doc = json.loads(out)
    assert doc["ranges"]["sdk_range"]["calls"] == live.ranges["sdk_range"].calls == 2
    assert tuple(doc["steps"]) == live.steps
    assert doc["rank"] == 0 and doc["world_size"] == 1


def _gpu_trace(kernel_us: float, extra_kernel: bool = False) -> dict:
    def ev(name, ts, dur, cat, tid=1, ext=0):
        return {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": 7,
            "tid": tid,
            "ts": ts,
            "dur": dur,
            "args": {"External id": ext, "correlation": ext},
        }

    events = [
        ev("step", 0, 100, "user_annotation", ext=1),
        ev("aten::mm", 10, 20, "cpu_op", ext=2),
        ev("cudaLaunchKernel", 12, 5, "cuda_runtime", ext=2),
        ev("gemm", 1000, kernel_us, "kernel", tid=9, ext=2),
    ]
    if extra_kernel:
        events += [
            ev("aten::add", 40, 10, "cpu_op", ext=3),
            ev("cudaLaunchKernel", 42, 5, "cuda_runtime", ext=3),
            ev("add_kernel", 2000, 7, "kernel", tid=9, ext=3),
        ]
    return {
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
        "baseTimeNanoseconds": 1_700_000_000 * 10**9,
        "traceEvents": events,
    }


def test_device_trace_summary(tmp_path, capsys):
    path = _write(tmp_path / "gpu.json", _gpu_trace(40.0))
    rc, out, _ = _main(capsys, "summarize", path)
    assert rc == 0
    assert "NVIDIA H200" in out.splitlines()[0]
    assert "gemm" in out and "Self CUDA time total: 40.000us" in out
    doc = json.loads(_main(capsys, "summarize", "--json", path)[1])
    assert doc["activities"] == ["cpu", "cuda"]
    assert doc["ranges"]["step"]["device_time_us"] == pytest.approx(40.0)
    assert doc["start_ns"] == 1_700_000_000 * 10**9 and doc["end_ns"] > doc["start_ns"]


# ---------------------------------------------------------------- diff


def test_diff_twice_slower_range(traces, capsys, tmp_path):
    slow = _write(tmp_path / "slow.json", _scaled(traces["trace"], 2.0))
    rc, out, _ = _main(capsys, "diff", traces["plain"], slow)
    assert rc == 0
    (row,) = [ln for ln in out.splitlines() if ln.startswith("mb ")]
    cells = row.split()
    assert cells[4] == "2.00x" and cells[5] == str(ITERS)
    assert cells[3].startswith("+")
    assert all(len(ln) <= 100 for ln in out.splitlines())
    doc = json.loads(_main(capsys, "diff", "--json", traces["plain"], slow)[1])
    (mb,) = doc["ranges"]
    assert mb["name"] == "mb" and mb["ratio"] == pytest.approx(2.0, rel=1e-3)
    assert mb["delta_us"] == pytest.approx(mb["before_us"], rel=1e-3)
    ops = doc["operators"]
    assert [abs(o["delta_us"]) for o in ops] == sorted(
        (abs(o["delta_us"]) for o in ops), reverse=True
    )
    assert doc["totals"]["self_cpu_time_total_us"]["ratio"] == pytest.approx(2.0, rel=1e-3)


def _ranges_trace(durations: dict[str, float]) -> dict:
    events, ts = [], 0.0
    for i, (name, dur) in enumerate(durations.items()):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "dur": dur,
                "args": {"External id": i + 1},
            }
        )
        ts += dur + 1
    return {"traceEvents": events}


def test_diff_sorts_by_absolute_change_and_marks_missing_names(tmp_path, capsys):
    a = _write(tmp_path / "a.json", _ranges_trace({"r1": 100, "r2": 50, "gone": 5}))
    b = _write(tmp_path / "b.json", _ranges_trace({"r1": 110, "r2": 150, "new": 30}))
    rc, out, _ = _main(capsys, "diff", a, b)
    assert rc == 0
    section = out.split("range (CPU per call)")[1].split("-" * 20)[0]
    rows = [ln.split() for ln in section.splitlines()[1:] if ln.strip()]
    assert [r[0] for r in rows] == ["r2", "new", "r1", "gone"]
    assert rows[0][1:5] == ["50.000us", "150.000us", "+100.000us", "3.00x"]
    assert rows[1][1:5] == ["-", "30.000us", "+30.000us", "-"]
    assert rows[3][1:5] == ["5.000us", "-", "-5.000us", "-"]
    doc = json.loads(_main(capsys, "diff", "--json", "--rows", "2", a, b)[1])
    assert [r["name"] for r in doc["ranges"]] == ["r2", "new"]
    assert doc["ranges"][1]["before_us"] is None and doc["ranges"][1]["ratio"] is None


def test_diff_kernels_and_directories(tmp_path, capsys):
    before = _write(tmp_path / "before.json", _gpu_trace(40.0))
    after_dir = tmp_path / "after"
    after_dir.mkdir()
    _write(after_dir / "a.json", _gpu_trace(10.0, extra_kernel=True))
    _write(after_dir / "b.json", _gpu_trace(10.0))
    rc, out, _ = _main(capsys, "diff", before, str(after_dir))
    assert rc == 0
    assert "(2 traces, 2 windows)" in out
    kernels = out.split("device kernel (per launch)")[1].split("-" * 20)[0]
    rows = [ln.split() for ln in kernels.splitlines()[1:] if ln.strip()]
    # per launch, not summed: 40us once before, 10us per launch after (2 traces, 1 each)
    assert rows[0][:6] == ["gemm", "40.000us", "10.000us", "-30.000us", "0.25x", "1"]
    assert rows[1][:6] == ["add_kernel", "-", "7.000us", "+7.000us", "-", "0->0.5"]
    assert "Self CUDA time total per window" in out


# ---------------------------------------------------------------- bad input and usage


def _bad_inputs(tmp_path, trace) -> dict[str, tuple[str, str]]:
    """case -> (path, a phrase the error line must hold)."""
    raw = gzip.compress(json.dumps(trace).encode())
    files = {
        "not_json.json": (b"hello, not json", "not JSON"),
        "truncated.json": (json.dumps(trace)[:300].encode(), "truncated JSON"),
        "truncated.json.gz": (raw[: len(raw) // 2], "truncated gzip"),
        "not_gzip.json.gz": (b"{}", "not gzip"),
        "gzip_named.json": (raw, "gzip-compressed"),
        "no_events.json": (b'{"schemaVersion": 1}', 'without "traceEvents"'),
        "events_not_list.json": (b'{"traceEvents": 3}', "not a list"),
        "event_not_object.json": (b'{"traceEvents": [1]}', "not an object"),
        "json_number.json": (b"42", "not an object"),
        "binary.json": (b"\xff\xfe\x00garbage", "not JSON"),
        "empty.json": (b"", "empty file"),
        "spaces.json": (b" \n\t\r\n   ", "only whitespace"),
        "spaces.json.gz": (gzip.compress(b" \n" * 50_000), "only whitespace (100,000 bytes)"),
    }
    cases = {}
    for name, (data, phrase) in files.items():
        (tmp_path / name).write_bytes(data)
        cases[name] = (str(tmp_path / name), phrase)
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "empty_dir" / "readme.txt").write_text("no traces here")
    cases["empty_dir"] = (str(tmp_path / "empty_dir"), "no trace files")
    cases["missing"] = (str(tmp_path / "missing.json"), "no such file")
    cases["device_file"] = (os.devnull, "neither a regular file nor a directory")
    return cases


def test_every_bad_input_is_one_line_and_exit_2(traces, tmp_path, capsys):
    for case, (path, phrase) in _bad_inputs(tmp_path, traces["trace"]).items():
        for argv in (
            ["summarize", path],
            ["summarize", "--json", traces["plain"], path],
            ["diff", traces["plain"], path],
            ["diff", path, traces["plain"]],
        ):
            rc, out, err = _main(capsys, *argv)
            assert rc == 2, (case, argv, err)
            assert out == "", (case, argv)
            assert err.count("\n") == 1 and err.endswith("\n"), (case, err)
            assert err.startswith(f"torch-profiled: error: {path}: "), (case, err)
            assert phrase in err and "; expected " in err, (case, err)
            assert "Traceback" not in err


def test_bad_input_in_a_real_process_has_no_traceback(traces, tmp_path):
    cases = _bad_inputs(tmp_path, traces["trace"])
    out = _run("summarize", cases["truncated.json.gz"][0])
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("torch-profiled: error:") and out.stderr.count("\n") == 1
    out = _run("diff", traces["plain"], cases["empty_dir"][0])
    assert out.returncode == 2
    assert out.stderr.startswith("torch-profiled: error:") and out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr


def test_usage(capsys):
    rc, out, err = _main(capsys)
    assert rc == 2 and "summarize" in err and "diff" in err and out == ""
    rc, out, _ = _main(capsys, "--version")
    assert rc == 0 and out.strip() == f"torch-profiled {instrument.__version__}"
    for argv in (
        ["frobnicate"],
        ["summarize"],
        ["diff", "only_one"],
        ["summarize", "--bogus", "x.json"],
    ):
        rc, out, err = _main(capsys, *argv)
        assert rc == 2, argv
        assert "torch-profiled" in err and "Traceback" not in err


def test_broken_pipe_prints_no_traceback(traces):
    proc = _proc.start("-m", "instrument", "summarize", traces["plain"], text=False)
    proc.stdout.close()  # the reader is gone before the first write (`| head` that quit)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    # the command's own status: exit 1 means a regression, and a reader that left is none
    assert proc.wait(timeout=120) == 0
    assert err == ""


def test_broken_pipe_in_process(traces, monkeypatch, tmp_path):
    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Closed())
    assert cli.main(["summarize", traces["plain"]]) == 0
    slower = _write(tmp_path / "slower.json", _scaled(traces["trace"], 3.0))
    # the gate keeps its answer, whoever reads the table: passed (0) or a regression (1) with
    # five windows a side, inconclusive (3) with one
    same, slow = tmp_path / "same", tmp_path / "slow"
    for d, src in ((same, traces["plain"]), (slow, slower)):
        d.mkdir()
        for i in range(5):
            shutil.copy(src, d / f"w{i}.json")
    assert cli.main(["diff", str(same), str(same), "--fail-over", "10%"]) == 0
    assert cli.main(["diff", str(same), str(slow), "--fail-over", "10%"]) == 1
    assert cli.main(["diff", traces["plain"], slower, "--fail-over", "10%"]) == 3


def test_console_script_and_cheap_import():
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["torch-profiled"] == "instrument.cli:main"
    code = (
        "import instrument, sys; before = set(sys.modules); import instrument.cli; "
        "print(sorted(m for m in set(sys.modules) - before if m.partition('.')[0] in "
        "('instrument', 'exporters', 'torch')))"
    )
    out = _proc.run("-c", code)
    assert out.returncode == 0, out.stderr
    # the command and its trace readers (both the standard library only); nothing else: the
    # analysis, the console table and the HTML report load when a command runs, torch never
    # (tests/test_cli_start.py)
    assert eval(out.stdout) == ["instrument.cli", "instrument.cli.inputs"]


# ---------------------------------------------------------------- input bounds (--max-mb)

BOMB_MB = 200  # what the bomb expands to; the runs below use --max-mb LIMIT_MB
LIMIT_MB = 5


def _gzip_stream(path, pieces) -> str:
    """Compress ``pieces`` (bytes, streamed) into ``path``: GBs of output never sit in memory."""
    with gzip.GzipFile(path, "wb", compresslevel=9) as gz:
        for piece in pieces:
            gz.write(piece)
    return str(path)


def _space_bomb(path, mb: int) -> str:
    return _gzip_stream(path, (b" " * (1 << 20) for _ in range(mb)))


def _event_bomb(path, mb: float) -> str:
    """A valid trace (the JSON of ``mb`` MB of real-looking events): parses fine without a limit."""
    event = (
        json.dumps(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "mb",
                "pid": 1,
                "tid": 1,
                "ts": 1.0,
                "dur": 1.0,
                "args": {},
            }
        ).encode()
        + b","
    )
    n = int(mb * (1 << 20)) // len(event) + 1

    def pieces():
        yield b'{"traceEvents": ['
        for _ in range(n // 1000):
            yield event * 1000
        yield event * (n % 1000)
        yield event[:-1] + b"]}"

    return _gzip_stream(path, pieces())


def _sparse(path, size: int) -> str:
    """A file of ``size`` bytes that takes no disk space (the size is all that is read)."""
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def _peak_rss_mb(run_python, small: str, *argv: str) -> tuple[float, float, list]:
    """Peak RSS of ``torch-profiled summarize SMALL`` (the baseline: the interpreter, torch,
    the analysis) and then of ``torch-profiled ARGV``, each in its own real process; the second
    is ``max(baseline, run)`` (RUSAGE_CHILDREN), which is all an upper bound needs."""
    code = f"""
import json, resource, subprocess, sys
def run(args):
    p = subprocess.run([sys.executable, "-m", "instrument", *args], capture_output=True,
                       text=True)
    return [p.returncode, p.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]
base = run(["summarize", {small!r}])
print(json.dumps([base, run({list(argv)!r})]))
"""
    out = run_python(code, timeout=300)
    assert out.returncode == 0, out.stderr
    base, bomb = json.loads(out.stdout)
    assert base[0] == 0, base[1]
    return base[2] / 1024, bomb[2] / 1024, bomb[:2]


def test_gzip_bomb_stops_at_the_limit_with_bounded_memory(run_python, tmp_path, traces):
    """A 0.2 MB .json.gz that expands to 200 MB, read with --max-mb 5: refused while reading,
    with the memory of about the limit (before the fix it decompressed and held all of it)."""
    bomb = _space_bomb(tmp_path / "bomb.json.gz", BOMB_MB)
    assert os.path.getsize(bomb) < (1 << 20)
    small = str(tmp_path / "small.json.gz")  # the baseline run's trace: a real one, gzipped
    with gzip.open(small, "wt") as f:
        json.dump(traces["trace"], f)
    base, peak, (rc, err) = _peak_rss_mb(
        run_python, small, "summarize", "--max-mb", str(LIMIT_MB), bomb
    )
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"torch-profiled: error: {bomb}: decompresses to more than 5 MB")
    assert "--max-mb 10" in err  # how to raise it
    # a bound, not a timing: reading stops one 4 MB chunk past the 5 MB limit; holding the
    # bomb's text (200 MB, twice as bytes and str) would be hundreds of MB over the baseline
    assert peak - base < 10 * LIMIT_MB + 16, (base, peak)


def test_limit_applies_to_a_valid_trace_on_every_command_and_can_be_raised(tmp_path, capsys):
    bomb = _event_bomb(tmp_path / "big.json.gz", 3)  # a real trace of 3 MB of JSON
    for argv in (
        ["summarize", "--max-mb", "1", bomb],
        ["summarize", "--json", "--max-mb", "2", bomb],
        ["diff", "--max-mb", "1", bomb, bomb],
    ):
        rc, out, err = _main(capsys, *argv)
        assert rc == 2 and out == "", (argv, err)
        assert err.count("\n") == 1 and f"{bomb}: decompresses to more than " in err, err
        assert "--max-mb" in err
    rc, out, err = _main(capsys, "summarize", "--json", "--max-mb", "4", bomb)
    assert rc == 0, err
    assert json.loads(out)["ranges"]["mb"]["calls"] > 10_000
    with gzip.open(bomb) as f:
        plain = _write(tmp_path / "big.json", json.load(f))
    rc, out, err = _main(capsys, "diff", "--max-mb", "2", plain, plain)
    size_mb = os.path.getsize(plain) / (1 << 20)
    assert rc == 2 and f"{plain}: {size_mb:,.1f} MB of JSON, past the 2 MB limit" in err, err
    suggested = re.search(r"--max-mb (\d+)$", err.strip()).group(1)
    assert int(suggested) == -(-os.path.getsize(plain) // (1 << 20))  # its size, rounded up
    rc, out, err = _main(capsys, "diff", "--max-mb", suggested, plain, plain)
    assert rc == 0, err


def test_default_limit_refuses_from_the_size_on_disk_without_reading(run_python, tmp_path, traces):
    """Past the default 1024 MB: a plain file by its size, a .gz too large to hold a trace
    within the limit by its compressed size; neither is read (sparse files: nothing on disk)."""
    plain = _sparse(tmp_path / "bomb.json", 1025 * (1 << 20))
    packed = _sparse(tmp_path / "bomb.json.gz", 1100 * (1 << 20))
    base, peak, (rc, err) = _peak_rss_mb(run_python, traces["plain"], "summarize", plain)
    assert rc == 2 and err.count("\n") == 1, err
    assert f"{plain}: 1,025.0 MB of JSON, past the 1024 MB limit (not read)" in err
    assert err.rstrip().endswith("--max-mb 1025")
    assert peak - base < 64, (base, peak)  # a bound: reading it would take over 1 GB
    out = _run("diff", traces["plain"], packed)
    assert out.returncode == 2 and out.stdout == ""
    assert f"{packed}: the compressed file alone is 1,100.0 MB" in out.stderr
    assert "1024 MB limit" in out.stderr and "--max-mb 2048" in out.stderr


def test_max_mb_is_documented_and_checked(capsys):
    for command in ("summarize", "diff"):
        rc, out, _ = _main(capsys, command, "--help")
        assert rc == 0
        assert "--max-mb MB" in out and "default 1024" in " ".join(out.split())
    for bad in ("0", "-1", "1.5", "lots"):
        rc, out, err = _main(capsys, "summarize", "--max-mb", bad, "x.json")
        assert rc == 2 and out == "" and "--max-mb" in err and "Traceback" not in err


# ---------------------------------------------------------------- --range NAME that is not there


def _named_ranges_trace(trace: dict, names: list[str]) -> dict:
    """The real trace with one more occurrence of its "mb" range under each of ``names``."""
    out = copy.deepcopy(trace)
    (mb,) = [e for e in out["traceEvents"] if e.get("name") == "mb"][:1]
    out["traceEvents"] += [dict(mb, name=n) for n in names]
    return out


def test_missing_range_lists_the_ranges_there_and_the_closest(traces, capsys):
    rc, out, err = _main(capsys, "summarize", "--range", "mbb", traces["plain"])
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "hold no ranges" not in err  # the bug: it said so with "mb" right there
    assert "--range 'mbb': no such range in the 1 trace read (did you mean 'mb'?)" in err
    assert "ranges there: 'mb';" in err


def test_missing_range_message_with_many_ranges(traces, capsys, tmp_path):
    names = ["forward", "backward", "optimizer_step", "data_loading"] + [
        f"stage_{i:02d}" for i in range(20)
    ]
    path = _write(tmp_path / "many.json", _named_ranges_trace(traces["trace"], names))
    rc, out, err = _main(capsys, "summarize", "--range", "fowrard", path, traces["plain"])
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "in the 2 traces read (did you mean 'forward'?)" in err
    listed = re.search(r"ranges there: (.*?); expected", err).group(1)
    everything = sorted(names + ["mb"])
    assert listed == ", ".join(repr(n) for n in everything[:20]) + ", ... (25 in all)"
    rc, _, err = _main(
        capsys,
        "summarize",
        "--range",
        "FORWARD",
        "--range",
        "backward",
        "--range",
        "optimiser_step",
        path,
    )
    assert rc == 2
    assert "--range 'FORWARD', 'optimiser_step': no such range" in err
    assert "(did you mean 'forward' for 'FORWARD', 'optimizer_step' for 'optimiser_step'?)" in err
    rc, _, err = _main(capsys, "summarize", "--range", "zzz", path)
    assert rc == 2 and "did you mean" not in err and "ranges there: 'backward', " in err
    rc, out, _ = _main(capsys, "summarize", "--json", "--range", "forward", path)
    assert rc == 0 and set(json.loads(out)["ranges"]) == {"forward"}


def test_missing_range_when_the_traces_hold_none(traces, tmp_path):
    trace = copy.deepcopy(traces["trace"])
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") != "user_annotation"]
    path = _write(tmp_path / "no_ranges.json", trace)
    out = _run("summarize", "--range", "mb", path)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1
    assert "--range 'mb': no such range in the 1 trace read: they hold no ranges" in out.stderr
    assert "Traceback" not in out.stderr
