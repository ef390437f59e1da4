"""How long the HTML report of a large window takes to build, load and pan, in headless Chromium.

    python bench/html_report_speed.py                 # 140k events (the large window)
    python bench/html_report_speed.py --events 5000   # smaller (tests/test_html_report.py)

The window is synthesised with the shape of our trace files (``synth_trace``): on one CPU
thread, ``ProfilerStep#N`` spans holding ``@profiled`` ranges (``user_annotation``), each with
``aten::linear`` -> ``aten::addmm`` -> ``cudaLaunchKernel`` and the kernel it launched on one
of two CUDA streams (``External id`` / ``correlation`` linking them), 5 events per call, times
in integer microseconds with fractions as Kineto writes them. Then:

- build: ``torch-profiled report TRACE -o PAGE`` in this process (read, analyse, page);
- load: open the page (``file://``) until its first frame is drawn;
- pan: click the page's pan button and wait for the next frame, at the whole window and
  zoomed in 64x (median of ``--pans``); ``draw`` is the frame's own time inside the page.

The page must load with no console error and no request but its own file, and draw events;
the script checks that before it prints. Needs Chromium at /usr/bin/chromium and the
``playwright`` package (dev extra).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

CHROMIUM = "/usr/bin/chromium"


def synth_trace(events: int = 140_000, seed: int = 0) -> dict[str, Any]:
    """A window trace of about ``events`` events, shaped like ours (see the docstring)."""
    rng = random.Random(seed)
    pid, tid = 4242, 4242
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "main"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    ]

    def x(name: str, cat: str, ts: float, dur: float, **kw: Any) -> dict[str, Any]:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
        ev.update(kw)
        return ev

    calls = max(events // 5, 1)
    per_step = 1000
    t, gpu_free, ext = 1_000_000.0, 0.0, 0
    for c in range(calls):
        if c % per_step == 0:
            out.append(x(f"ProfilerStep#{c // per_step}", "user_annotation", t - 0.5, 0.0))
            step = out[-1]
        ext += 1
        d = rng.uniform(8.0, 14.0)
        name = ("matmul_bias", "attention", "mlp")[c % 3]
        out.append(x(name, "user_annotation", t, d, args={"External id": ext}))
        out.append(x("aten::linear", "cpu_op", t + 0.5, d - 1.0, args={"External id": ext + 1}))
        out.append(x("aten::addmm", "cpu_op", t + 1.0, d - 2.5, args={"External id": ext + 2}))
        launch = x("cudaLaunchKernel", "cuda_runtime", t + 2.0, 4.0)
        launch["args"] = {"External id": ext + 2, "correlation": ext + 3}
        out.append(launch)
        start = max(gpu_free, t + 6.0)
        k = rng.uniform(3.0, 12.0)
        kernel = x(f"sm90_gemm_{c % 7}", "kernel", start, k, pid=0, tid=7 + 6 * (c % 2))
        kernel["args"] = {"External id": ext + 2, "correlation": ext + 3, "stream": 7}
        out.append(kernel)
        gpu_free = start + k
        ext += 3
        step["dur"] = t + d - step["ts"]
        t += d + rng.uniform(0.5, 2.0)
    for ev in out:
        if "ts" in ev:
            ev["ts"], ev["dur"] = round(ev["ts"], 3), round(ev["dur"], 3)
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "baseTimeNanoseconds": 1_765_000_000_000_000_000,
        "traceEvents": out,
    }


def write_trace(path: str, events: int) -> str:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(synth_trace(events), f)
    return path


def measure(page_path: str, pans: int) -> dict[str, Any]:
    """Open the page in headless Chromium; load and pan times (see the docstring)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        problems: list[str] = []
        requests: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        t0 = time.perf_counter()
        page.goto("file://" + page_path)
        wait_until(page, "window.__profiled ? window.__profiled.draws(0) : 0", 1)
        load_s = time.perf_counter() - t0
        visible = page.evaluate("window.__profiled.visibleEvents(0)")
        whole = _pans(page, pans)
        for _ in range(6):  # zoom in 64x
            page.click(".timeline button[data-act=in]")
        zoomed = _pans(page, pans)
        browser.close()
    if problems or requests != ["file://" + page_path] or not visible:
        raise SystemExit(f"page failed: errors {problems}, requests {requests}, drew {visible}")
    return {"load_s": load_s, "visible_events": visible, "pan_whole": whole, "pan_64x": zoomed}


def wait_until(page: Any, expression: str, at_least: float, timeout_s: float = 30) -> Any:
    """Poll ``expression`` until it is at least ``at_least``. (Playwright's wait_for_function
    evaluates strings with eval, which the page's Content-Security-Policy forbids.)"""
    until = time.monotonic() + timeout_s
    while True:
        value = page.evaluate(expression)
        if value >= at_least:
            return value
        if time.monotonic() > until:
            raise TimeoutError(f"{expression} stayed {value}, below {at_least}")
        time.sleep(0.002)


def _pans(page: Any, n: int) -> dict[str, float]:
    frame, draw = [], []
    for i in range(n):
        before = page.evaluate("window.__profiled.draws(0)")
        t = time.perf_counter()
        page.click(".timeline button[data-act=%s]" % ("right" if i % 2 == 0 else "left"))
        wait_until(page, "window.__profiled.draws(0)", before + 1)
        frame.append(time.perf_counter() - t)
        draw.append(page.evaluate("window.__profiled.drawMs(0)"))
    return {"frame_ms": 1e3 * statistics.median(frame), "draw_ms": statistics.median(draw)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=140_000)
    parser.add_argument("--pans", type=int, default=20)
    parser.add_argument("--out", help="keep the trace and page in this directory")
    args = parser.parse_args()
    from instrument.cli.html_command import main as report

    directory = args.out or tempfile.mkdtemp(prefix="html_report_speed.")
    os.makedirs(directory, exist_ok=True)
    trace = write_trace(os.path.join(directory, "synth.pt.trace.json.gz"), args.events)
    page = os.path.join(directory, "synth.html")
    t0 = time.perf_counter()
    if report([trace, "-o", page]) != 0:
        raise SystemExit("report failed")
    build_s = time.perf_counter() - t0
    result = {"events": args.events, "build_s": build_s, "page_mb": os.path.getsize(page) / 2**20}
    result.update(measure(page, args.pans))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
