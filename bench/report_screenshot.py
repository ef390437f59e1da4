"""The README's screenshot: the HTML report of the seed's two windows, as a PNG.

    python bench/report_screenshot.py                  # -> docs/report.png
    python bench/report_screenshot.py --sizes 64 1024  # smaller, quicker
    python bench/report_screenshot.py --traces DIR --where "NVIDIA H200, bf16"
                                                       # the seed's traces made elsewhere

Runs the seed (``examples/01_matmul_bias.py``'s ``run``: matmul+bias, one session per size,
three recorded steps) at each size with the trace exporter, then ``torch-profiled report`` of
the trace directory, opens the page in headless Chromium (/usr/bin/chromium, Playwright) and
saves a screenshot of it. On a machine without a GPU the seed runs on the CPU in fp32 (the
caption in the README says so); with one, on the GPU in bf16.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _seed():
    path = os.path.join(REPO, "examples", "01_matmul_bias.py")
    spec = importlib.util.spec_from_file_location("seed_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_seed(work: str, sizes: list[int]) -> tuple[str, str]:
    traces = os.path.join(work, "profiled_traces")
    os.environ.update(PROFILED_EXPORTERS="trace", PROFILED_TRACE_DIR=traces)
    import torch

    seed = _seed()
    cuda = torch.cuda.is_available()
    for size in sizes:
        seed.run(size, "cuda" if cuda else "cpu", torch.bfloat16 if cuda else torch.float32)
    return traces, "GPU, bf16" if cuda else "CPU, fp32"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 4096])
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "report.png"))
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--traces", help="the seed's trace directory, made elsewhere (a GPU)")
    parser.add_argument("--where", help="what --traces ran on, for the title")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="report_screenshot.")
    if args.traces:
        traces, where = args.traces, args.where or "elsewhere"
    else:
        traces, where = _run_seed(work, args.sizes)
    from instrument.cli.html_command import main as report

    page = os.path.join(work, "report.html")
    title = f"torch-profiled report: the seed, matmul+bias at {' and '.join(map(str, args.sizes))}"
    if report([traces, "-o", page, "--rows", "5", "--title", f"{title} ({where})"]) != 0:
        raise SystemExit("report failed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium")
        tab = browser.new_page(viewport={"width": args.width, "height": 800})
        tab.goto("file://" + page)
        tab.wait_for_timeout(300)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        tab.screenshot(path=args.out, full_page=True)
        browser.close()
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1024:.0f} KB) from {page}")


if __name__ == "__main__":
    main()
