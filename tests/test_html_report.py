"""The HTML report (issue 18, item 4): the ``html`` exporter's page per window and
``torch-profiled report PATH... -o FILE`` (``instrument.cli.html_command``), opened in a real
headless Chromium (Debian's ``chromium``, driven by Playwright): the page loads with no console
error and no request but its own file, shows the ranges and their numbers, its timeline draws the
recorded events, and zoom (buttons, wheel) and pan (drag, buttons) change the visible range.
Traces come from a real program in a subprocess; the large window (140k events) is synthesised
in the shape of our trace files by ``bench/html_report_speed.py``.
"""

from __future__ import annotations

import gzip
import html
import importlib.util
import json
import os
import shutil
import time

import pytest

from exporters import ExportResult, known_exporter_names, resolve_exporters
from exporters.html import NO_TRACE, HtmlExporter, page_path
from exporters.html_page import PageWindow, build_page, range_mfu
from exporters.html_timeline import timeline_from_trace
from instrument import cli
from instrument.analysis.throughput import with_peaks
from instrument.base.formatting import format_time_us
from instrument.base.report import FrozenMap, RangeStats, Verdict, WindowReport
from instrument.cli import diff
from instrument.cli import html_command as html_report
from instrument.cli import inputs as traces
from tests import _proc
from tests._proc import REPO

CHROMIUM = "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="needs Chromium (apt-get install chromium)"
)

# the seed's two windows (matmul+bias, small then large), nested in an outer range, on the CPU
PROGRAM = r"""
import torch
from instrument import Schedule, profiled, session

@profiled("matmul_bias")
def matmul_bias(x, w, b):
    return x @ w + b

@profiled("outer")
def outer(x, w, b):
    return matmul_bias(x, w, b).relu()

for size in (64, 256):
    x, w, b = torch.randn(size, size), torch.randn(size, size), torch.randn(size)
    with session(schedule=Schedule(wait=1, warmup=1, active=3)) as s:
        for _ in range(5):
            outer(x, w, b)
            s.step()
"""


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    """Two windows written by a real program with the trace and html exporters."""
    d = tmp_path_factory.mktemp("seed")
    env = _proc.sdk_env(PROFILED_EXPORTERS="trace,html", PROFILED_TRACE_DIR=str(d / "traces"))
    out = _proc.run("-c", PROGRAM, env=env, cwd=d, timeout=180)
    assert out.returncode == 0, out.stderr
    traces = sorted(str(p) for p in (d / "traces").glob("*.pt.trace.json.gz"))
    assert len(traces) == 2, os.listdir(d / "traces")
    return {"dir": str(d / "traces"), "traces": traces, "tmp": d}


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip("needs Chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


class Opened:
    """A page opened from a file, with every console error, page error and request seen."""

    def __init__(self, browser, path: str) -> None:
        self.url = "file://" + os.path.abspath(path)
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else 0)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(self.url)
        self.until("window.__profiled ? window.__profiled.timelines() : -1", 0)

    def js(self, expression: str):
        return self.page.evaluate(expression)

    def until(self, expression: str, at_least: float, timeout_s: float = 30):
        """Poll (Playwright's wait_for_function evaluates strings with eval, which the
        page's Content-Security-Policy forbids, as it should)."""
        until = time.monotonic() + timeout_s
        while True:
            value = self.js(expression)
            if value >= at_least:
                return value
            assert time.monotonic() < until, f"{expression} stayed {value}"
            time.sleep(0.005)

    def view(self, i: int = 0) -> list[float]:
        return self.js(f"window.__profiled.view({i})")

    def act(self, button: str, i: int = 0) -> None:
        """Click a timeline button and wait for the frame it asks for."""
        before = self.js(f"window.__profiled.draws({i})")
        self.page.locator(".timeline").nth(i).locator(f"button[data-act={button}]").click()
        self.until(f"window.__profiled.draws({i})", before + 1)

    def canvas_box(self, i: int = 0) -> dict:
        return self.page.locator(".timeline canvas").nth(i).bounding_box()

    def clean(self) -> None:
        assert self.errors == []
        assert self.requests == [self.url]  # the file itself, nothing else

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def opened(browser):
    pages: list[Opened] = []

    def open_(path: str) -> Opened:
        pages.append(Opened(browser, path))
        return pages[-1]

    yield open_
    for p in pages:
        p.close()


def _report(path: str) -> WindowReport:
    return cli.report_from_trace(path, cli.load_checked(path))


def _row(o: Opened, name: str, i: int = 0) -> list[str]:
    """The cells of range ``name`` in window ``i``'s range table, as the page shows them."""
    table = o.page.locator("section.window").nth(i).locator("table.ranges")
    row = table.locator("tr", has=o.page.locator("td.name", has_text=name)).first
    return [c.strip() for c in row.locator("td").all_inner_texts()]


# ---------------------------------------------------------------- the report command


@needs_chromium
def test_report_of_the_seed_windows_shows_ranges_numbers_and_draws_timelines(
    seed, opened, tmp_path
):
    out = str(tmp_path / "report.html")
    run = _proc.run("-m", "instrument.cli.html_command", seed["dir"], "-o", out)
    assert run.returncode == 0, run.stderr
    assert run.stderr == "" and run.stdout.startswith(f"wrote {out}")
    o = opened(out)
    o.clean()
    assert o.js("window.__profiled.timelines()") == 2
    for i, trace in enumerate(seed["traces"]):
        rep = _report(trace)
        for name in ("outer", "matmul_bias"):
            stats = rep.ranges[name]
            cells = _row(o, name, i)
            assert cells[:4] == [
                name,
                str(stats.calls),
                format_time_us(stats.cpu_time_us),
                format_time_us(stats.self_cpu_time_us),
            ]
            assert "cpu-only" in cells[-1]
        title = o.page.locator("section.window h2").nth(i).inner_text()
        assert f"{rep.event_count:,} events" in title and "steps 2-4" in title
        drawn = o.js(f"window.__profiled.visibleEvents({i})")
        assert 0 < drawn <= rep.event_count
        assert o.js(f"window.__profiled.drawnRects({i})") > 0
    assert "ranks side by side" not in o.page.content()  # one rank


@needs_chromium
def test_zoom_and_pan_change_the_visible_range(seed, opened, tmp_path):
    out = str(tmp_path / "report.html")
    assert html_report.main([seed["traces"][1], "-o", out]) == 0
    o = opened(out)
    v0, v1 = o.view()
    everything = o.js("window.__profiled.visibleEvents(0)")
    o.act("in")
    z0, z1 = o.view()
    assert z1 - z0 == pytest.approx((v1 - v0) / 2, rel=1e-6)
    for _ in range(5):
        o.act("in")
    s0, s1 = o.view()
    assert s1 - s0 == pytest.approx((v1 - v0) / 64, rel=1e-6)
    assert o.js("window.__profiled.visibleEvents(0)") < everything
    o.act("right")
    assert o.view()[0] > s0
    # the wheel zooms around the pointer, a drag pans
    box = o.canvas_box()
    x, y = box["x"] + box["width"] * 0.6, box["y"] + 30
    before = o.view()
    draws = o.js("window.__profiled.draws(0)")
    o.page.mouse.move(x, y)
    o.page.mouse.wheel(0, 400)  # out
    o.until("window.__profiled.draws(0)", draws + 1)
    after = o.view()
    assert after[1] - after[0] > before[1] - before[0]
    draws = o.js("window.__profiled.draws(0)")
    o.page.mouse.down()
    o.page.mouse.move(x - 200, y, steps=4)
    o.page.mouse.up()
    o.until("window.__profiled.draws(0)", draws + 1)
    dragged = o.view()
    assert dragged[0] > after[0]  # dragging left shows what comes later
    assert dragged[1] - dragged[0] == pytest.approx(after[1] - after[0], rel=1e-6)
    o.act("reset")
    assert o.view() == [v0, v1]
    assert o.js("window.__profiled.visibleEvents(0)") == everything
    o.clean()


def _rank_dir(tmp_path, trace_path: str, factors) -> str:
    """Per-rank copies of a real trace, rank r's events ``factors[r]`` times slower."""
    trace = cli.load_checked(trace_path)
    d = tmp_path / "ranks"
    d.mkdir()
    for rank, factor in enumerate(factors):
        t = json.loads(json.dumps(trace))
        for ev in t["traceEvents"]:
            if ev.get("ph") == "X":
                ev["ts"], ev["dur"] = ev["ts"] * factor, ev["dur"] * factor
        t["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": len(factors)}
        with open(d / f"host_{rank}.{rank}.pt.trace.json", "w") as f:
            json.dump(t, f)
    return str(d)


def test_each_trace_is_read_once_and_the_windows_keep_their_rank_order(seed, tmp_path, monkeypatch):
    """The page of a directory of three ranks' traces parses each trace once (its report and
    its timeline from the same parse), and its windows come in rank order with their own
    timelines whatever order the files were read in."""
    d = _rank_dir(tmp_path, seed["traces"][0], [3.0, 1.0, 2.0])
    for name in os.listdir(d):  # read in the reverse of rank order (host_7 is rank 2)
        rank = int(name.split(".")[1])
        os.rename(os.path.join(d, name), os.path.join(d, f"host_{9 - rank}.pt.trace.json"))
    reads: list[str] = []
    real = traces.load_checked

    def counting(path, *args, **kwargs):
        reads.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(traces, "load_checked", counting)
    built = []
    real_build = html_report.build_page
    monkeypatch.setattr(
        html_report,
        "build_page",
        lambda windows, **kw: built.extend(windows) or real_build(windows, **kw),
    )
    out = str(tmp_path / "ranks.html")
    assert html_report.main([d, "-o", out]) == 0
    assert reads == ["host_7.pt.trace.json", "host_8.pt.trace.json", "host_9.pt.trace.json"]
    assert [w.report.rank for w in built] == [0, 1, 2]
    # each window's timeline is its own trace's: rank r's events last factors[r] times as long
    ends = [w.timeline["end_ns"] for w in built]
    assert ends[0] == pytest.approx(3 * ends[1], rel=0.01)
    assert ends[2] == pytest.approx(2 * ends[1], rel=0.01)


@needs_chromium
def test_ranks_side_by_side_for_a_multi_rank_directory(seed, opened, tmp_path):
    d = _rank_dir(tmp_path, seed["traces"][0], [1.0, 2.0])
    out = str(tmp_path / "ranks.html")
    assert html_report.main([d, "-o", out]) == 0
    o = opened(out)
    o.clean()
    summary = cli.rank_summary(cli._reports([d], rows=15))
    table = o.page.locator("table.ranks")
    heads = [h.strip() for h in table.locator("th").all_inner_texts()]
    assert heads[:3] == ["range", "rank 0", "rank 1"]
    row = table.locator("tr", has=o.page.locator("td.name", has_text="matmul_bias")).first
    cells = [c.strip() for c in row.locator("td").all_inner_texts()]
    mb = summary["ranges"]["matmul_bias"]
    assert cells == [
        "matmul_bias",
        format_time_us(mb["by_rank_us"]["0"]),
        format_time_us(mb["by_rank_us"]["1"]),
        "rank 1",
        format_time_us(mb["spread_us"]),
        "2.00x",
    ]
    assert o.js("window.__profiled.timelines()") == 2  # each rank's window too


@needs_chromium
def test_two_inputs_get_the_diff_view(seed, opened, tmp_path):
    a, b = seed["traces"]
    out = str(tmp_path / "diff.html")
    assert html_report.main([a, b, "-o", out]) == 0
    o = opened(out)
    o.clean()
    d = diff.diff_sides(traces._side(a, shapes=False), traces._side(b, shapes=False), 15)
    (mb,) = [r for r in d["ranges"] if r["name"] == "matmul_bias"]
    table = o.page.locator("section.diff table.diff").first
    row = table.locator("tr", has=o.page.locator("td.name", has_text="matmul_bias")).first
    cells = [c.strip() for c in row.locator("td").all_inner_texts()]
    assert cells[:5] == [
        "matmul_bias",
        format_time_us(mb["before_us"]),
        format_time_us(mb["after_us"]),
        ("+" if mb["delta_us"] >= 0 else "") + format_time_us(mb["delta_us"]),
        f"{mb['ratio']:.2f}x",
    ]
    assert o.js("window.__profiled.timelines()") == 2


def _bench():
    spec = importlib.util.spec_from_file_location(
        "html_report_speed", os.path.join(REPO, "bench", "html_report_speed.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_chromium
def test_the_140k_event_window_loads_and_pans(opened, tmp_path):
    # the bench's synthesised window, written in one go at the fastest compression (the
    # bench's ``write_trace`` streams json.dump through gzip at level 9: ~4 s here)
    trace = str(tmp_path / "big.pt.trace.json.gz")
    with gzip.open(trace, "wb", compresslevel=1) as f:
        f.write(json.dumps(_bench().synth_trace(140_000)).encode("utf-8"))
    out = str(tmp_path / "big.html")
    assert html_report.main([trace, "-o", out]) == 0
    assert os.path.getsize(out) < 3 * 2**20  # a few MB, not one object per event
    o = opened(out)
    o.clean()
    total = _report(trace).event_count
    assert total > 140_000 - 1
    assert o.js("window.__profiled.visibleEvents(0)") == total  # every event, at full view
    assert o.js("window.__profiled.drawnRects(0)") < total / 10  # merged per pixel column
    for _ in range(8):
        o.act("in")
    zoomed = o.view()
    box = o.canvas_box()
    draws = o.js("window.__profiled.draws(0)")
    o.page.mouse.move(box["x"] + 900, box["y"] + 40)
    o.page.mouse.down()
    o.page.mouse.move(box["x"] + 500, box["y"] + 40, steps=5)
    o.page.mouse.up()
    o.until("window.__profiled.draws(0)", draws + 1)
    panned = o.view()
    assert panned[0] > zoomed[0]
    assert 0 < o.js("window.__profiled.visibleEvents(0)") < total
    o.clean()


def test_bench_script_runs_small(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip("needs Chromium (apt-get install chromium)")
    out = _proc.run(
        os.path.join(REPO, "bench", "html_report_speed.py"),
        "--events",
        "3000",
        "--pans",
        "2",
        "--out",
        str(tmp_path),
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout[out.stdout.index("{") :])
    assert doc["visible_events"] > 3000 - 1 and doc["load_s"] > 0


# ---------------------------------------------------------------- bad input


def test_bad_input_is_one_line_and_exit_2(seed, tmp_path, capsys):
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    cases = {
        "missing": ([str(tmp_path / "nope"), "-o", str(tmp_path / "a.html")], "no such file"),
        "not json": ([str(junk), "-o", str(tmp_path / "a.html")], "not JSON"),
        "no dir": ([seed["dir"], "-o", str(tmp_path / "no" / "a.html")], "does not exist"),
        "a dir": ([seed["dir"], "-o", str(tmp_path)], "is a directory"),
    }
    for what, (argv, said) in cases.items():
        assert html_report.main(argv) == 2, what
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, (what, err)
        assert err.startswith("torch-profiled: error: ") and said in err, (what, err)
        assert "; expected" in err, (what, err)
    assert not os.path.exists(tmp_path / "a.html")
    assert html_report.main([seed["dir"]]) == 2  # -o is required (argparse's usage)
    assert "-o" in capsys.readouterr().err


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    out = _proc.run("-m", "instrument.cli.html_command", str(tmp_path / "nope"), "-o", "x.html")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert not os.path.exists(tmp_path / "x.html")


def test_the_report_command_runs_through_the_cli_like_the_other_commands(seed, tmp_path, capsys):
    out = str(tmp_path / "r.html")
    args = cli.build_parser().parse_args(["report", seed["traces"][0], "-o", out, "--rows", "3"])
    assert args.func is html_report.run_report
    assert cli.main(["report", seed["traces"][0], "-o", out, "--rows", "3"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}")
    assert os.path.getsize(out) > 0
    assert cli.main(["report", str(tmp_path / "missing"), "-o", out]) == 2
    assert "missing" in capsys.readouterr().err


# ---------------------------------------------------------------- the exporter


def test_the_exporter_wrote_a_page_beside_each_trace(seed):
    for trace in seed["traces"]:
        page = page_path(trace)
        assert page == trace[: -len(".pt.trace.json.gz")] + ".html"
        text = open(page, encoding="utf-8").read()
        assert "matmul_bias" in text and "outer" in text
        assert html.escape(NO_TRACE) not in text
    assert "html" in known_exporter_names()
    (exp,) = resolve_exporters(["html"])
    assert isinstance(exp, HtmlExporter)


@needs_chromium
def test_the_exporters_page_loads_clean_and_draws(seed, opened):
    o = opened(page_path(seed["traces"][0]))
    o.clean()
    assert o.js("window.__profiled.timelines()") == 1
    assert o.js("window.__profiled.visibleEvents(0)") > 0
    cells = _row(o, "matmul_bias")
    assert cells[1] == "3"  # three recorded steps, one call each
    assert "cpu-only" in o.page.locator("p.verdict").inner_text()


def _hand_report(**over) -> WindowReport:
    base = 1_765_000_000_000_000_000
    verdict = Verdict("compute-bound", "device busy 90%")
    fields = dict(
        window=0,
        steps=(3,),
        partial=False,
        start_ns=base,
        end_ns=base + 10_000,
        rank=0,
        world_size=1,
        host="h",
        pid=1,
        device="NVIDIA H200",
        activities=("cpu", "cuda"),
        ranges=FrozenMap(
            {"mm": RangeStats("mm", 2, 8.0, 5.0, 6.5, 2, 6.0, 8.0, 2_000_000, verdict=verdict)}
        ),
        verdict=verdict,
    )
    fields.update(over)
    return WindowReport(**fields)


def test_without_a_trace_file_the_page_says_the_timeline_needs_the_trace_exporter(tmp_path):
    exp = HtmlExporter(tmp_path / "pages", keep=2)
    for _ in range(4):
        assert exp.export(_hand_report()) is ExportResult.SUCCESS
    pages = sorted(os.listdir(tmp_path / "pages"))
    assert len(pages) == 2 and all(p.startswith("h_1_rank0.") for p in pages)  # keep=2
    text = open(exp.last_file, encoding="utf-8").read()
    assert html.escape(NO_TRACE) in text and 'class="timeline"' not in text
    assert "mm" in text and format_time_us(8.0) in text


def test_an_unreadable_trace_costs_the_timeline_not_the_page(tmp_path):
    trace = tmp_path / "h_1_rank0.5.pt.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        f.write("{not json")
    exp = HtmlExporter(tmp_path)
    assert exp.export(_hand_report(trace_file=str(trace))) is ExportResult.SUCCESS
    assert exp.last_file == str(tmp_path / "h_1_rank0.5.html")
    text = open(exp.last_file, encoding="utf-8").read()
    assert "could not be read" in text and "mm" in text
    shutil.rmtree(tmp_path)  # a directory that cannot be written: a warning, FAILURE
    (tmp_path).write_text("a file where the directory was")
    with pytest.warns(UserWarning, match="was not written"):
        assert exp.export(_hand_report(trace_file=None)) is ExportResult.FAILURE


def test_mfu_shows_where_the_devices_peak_is_known():
    plain = _hand_report()  # no peaks (not read through with_peaks), no dtype: no MFU
    assert range_mfu(plain, plain.ranges["mm"]) is None
    assert "<th>MFU</th>" not in build_page([PageWindow(plain)])
    verdict = Verdict("compute-bound", "busy")
    stats = RangeStats(
        "mm", 2, 8.0, 5.0, 6.5, 2, 6.0, 8.0, 4_000_000_000, verdict=verdict, flops_dtype="bf16"
    )
    with_mfu = with_peaks(_hand_report(ranges=FrozenMap({"mm": stats})))  # an H200's peaks
    expected = 4e9 / 6.5e-6 / 989.4e12
    assert range_mfu(with_mfu, with_mfu.ranges["mm"]) == pytest.approx(expected)
    page = build_page([PageWindow(with_mfu)])
    assert "<th>MFU</th>" in page and f"{100 * expected:.1f}%" in page
    assert "615.38 TFLOP/s" in page  # 4 GFLOP in 6.5 us of device time


def test_the_page_cannot_be_broken_out_of_by_names():
    evil = "</script><script>alert(1)</script>"
    rep = _hand_report(
        ranges=FrozenMap({evil: RangeStats(evil, 1, 1.0, 1.0, 0.0, 0)}), host="<b>h</b>"
    )
    tl = {"lanes": [], "names": [[evil, "cpu_op"]], "end_ns": 1, "t0_ns": None}
    page = build_page([PageWindow(rep, dict(tl, events=0, total=0))])
    assert evil not in page and "<b>h</b>" not in page
    assert page.count("</script>") == 2  # the data block's and the script's


# ---------------------------------------------------------------- the timeline's data


def _decode(row: dict) -> list[tuple[int, int, int]]:
    out, t = [], 0
    for s, d, n in zip(row["s"], row["d"], row["n"]):
        t += s
        out.append((t, d, n))
    return out


def test_timeline_lanes_per_thread_and_stream_rows_by_depth():
    def x(name, cat, ts, dur, pid=1, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}

    trace = {
        "baseTimeNanoseconds": 5_000,
        "traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "loader"}},
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
            x("step", "user_annotation", 10.0, 10.0),
            x("aten::mm", "cpu_op", 11.0, 4.5),
            x("cudaLaunchKernel", "cuda_runtime", 12.0, 1.0),
            x("aten::add", "cpu_op", 16.0, 2.0),
            x("mine", "cpu_op", 30.0, 1.0, tid=2),  # a range recorded as an operator
            x("gemm", "kernel", 13.0, 3.0, pid=0, tid=7),
            x("copy", "gpu_memcpy", 17.0, 0.5, pid=0, tid=13),
            x("PyTorch Profiler (0)", "Trace", 0.0, 100.0),  # the profiler's own: left out
            {"ph": "s", "name": "ac2g", "pid": 1, "tid": 1, "ts": 12.0},
        ],
    }
    tl = timeline_from_trace(trace, range_names={"mine"})
    assert [lane["label"] for lane in tl["lanes"]] == [
        "thread 1",
        "loader",
        "GPU 0 stream 7",
        "GPU 0 stream 13",
    ]
    assert [lane["device"] for lane in tl["lanes"]] == [False, False, True, True]
    names = [tuple(p) for p in tl["names"]]
    main = [_decode(r) for r in tl["lanes"][0]["rows"]]
    assert [[names[n][0] for _, _, n in row] for row in main] == [
        ["step"],
        ["aten::mm", "aten::add"],
        ["cudaLaunchKernel"],
    ]
    assert main[1][0][:2] == (1000, 4500)  # ns from the first event (ts 10 us)
    assert ("mine", "user_annotation") in names
    assert tl["t0_ns"] == 5_000 + 10_000 and tl["end_ns"] == 21_000
    assert tl["events"] == tl["total"] == 7
    longest = timeline_from_trace(trace, max_events=3)
    assert (longest["events"], longest["total"]) == (3, 7)
    kept = {
        tuple(longest["names"][n])
        for lane in longest["lanes"]
        for r in lane["rows"]
        for n in r["n"]
    }
    assert {k[0] for k in kept} == {"step", "aten::mm", "gemm"}


def test_a_partial_overlap_is_drawn_beside_not_below():
    def x(name, ts, dur):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    chain = [x(f"op{i}", 10.0 * i, 10.5) for i in range(20)]  # each overlaps the next by 0.5
    tl = timeline_from_trace({"traceEvents": chain})
    assert len(tl["lanes"][0]["rows"]) == 1  # no staircase


# ---------------------------------------------------------------- names inside <script> (issue 29)

# names that change the HTML parser's state inside <script> when embedded as they are: "<!--"
# then "<script" enters the "double escaped" state, where the data block's own "</script>" no
# longer ends it, and the page's script never runs (no timeline); "</script" ends it early
SCRIPT_STATE_NAMES = [
    "<!--<script>",
    "</script>",
    "<!--",
    "]]>",
    "<script>",
    "a\u2028b\u2029c",
    "x & <y> </SCRIPT",
]


def _named_trace(names: list[str]) -> dict:
    return {
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0}
            for i, n in enumerate(names)
        ]
    }


def test_embedded_data_holds_no_character_that_changes_the_parsers_state():
    from exporters.html_page import script_json

    text = script_json({"n": SCRIPT_STATE_NAMES})
    assert not any(c in text for c in "<>&\u2028\u2029")
    assert json.loads(text) == {"n": SCRIPT_STATE_NAMES}  # the same strings


@needs_chromium
@pytest.mark.parametrize("name", SCRIPT_STATE_NAMES)
def test_the_timeline_draws_whatever_the_names(name, opened, tmp_path):
    """Each name alone on a page built by ``torch-profiled report``'s path (a timeline dict)
    and by the exporter's (the analysis's ``PageTimeline``): the script runs, the timeline
    draws every event, and the names read back as they are."""
    from instrument.export.analysis_process import page_timeline

    names = [name, "plain", name + "2"]
    trace = _named_trace(names)
    rep = _hand_report(ranges=FrozenMap({name: RangeStats(name, 1, 1.0, 1.0, 0.0, 0)}))
    page = tmp_path / "report.html"
    page.write_text(build_page([PageWindow(rep, timeline_from_trace(trace))]), encoding="utf-8")
    exp = HtmlExporter(tmp_path / "pages")
    tl = page_timeline(trace, [name], 1000)
    assert exp.export(_hand_report(timeline=tl)) is ExportResult.SUCCESS
    for path in (str(page), exp.last_file):
        o = opened(path)
        o.clean()
        assert o.js("window.__profiled.timelines()") == 1
        assert o.js("window.__profiled.visibleEvents(0)") == len(names)
        assert o.js("window.__profiled.drawnRects(0)") > 0
        data = o.js("JSON.parse(document.getElementById('profiled-data').textContent)")
        assert [n for n, _ in data["windows"][0]["names"]] == names


def test_the_page_has_its_timeline_without_the_trace_exporter(tmp_path):
    """The timeline comes from the analysis (issue 29, item 17), not from a trace file: a
    program with the html exporter alone gets pages that draw the window."""
    env = _proc.sdk_env(PROFILED_EXPORTERS="html", PROFILED_TRACE_DIR=str(tmp_path / "pages"))
    out = _proc.run("-c", PROGRAM, env=env, cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr
    pages = sorted((tmp_path / "pages").glob("*.html"))
    assert len(pages) == 2 and not list((tmp_path / "pages").glob("*.json*"))
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert 'class="timeline"' in text and html.escape(NO_TRACE) not in text
        data = json.loads(text.split('type="application/json">')[1].split("</script>")[0])
        (tl,) = data["windows"]
        assert tl["events"] > 0 and ["matmul_bias", "user_annotation"] in tl["names"]
