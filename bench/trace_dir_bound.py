"""What bounding the trace directory (PROFILED_TRACE_MAX_MB) adds to writing a window's trace.

One real CPU window's trace (a few hundred decorated calls) is exported by
``TraceFileExporter`` into a directory that already holds N trace files of other workers
(names of the SDK's pattern, 64 KiB each, under the limit so none is removed), with the bound
off (``max_mb=0``) and on (``max_mb=1024``: a directory scan and a stat per file after every
write). The variants alternate within each repeat; the table gives the median and minimum
milliseconds per export over the repeats.

    .venv/bin/python bench/trace_dir_bound.py [--files 0,1000,10000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from exporters import InMemoryExporter, TraceFileExporter  # noqa: E402
from instrument import Schedule, profiled  # noqa: E402
from instrument.testing import capture  # noqa: E402


class KeepRaw(InMemoryExporter):
    """Copies the window's raw trace aside (the session deletes it after exporting)."""

    def __init__(self, dest: str) -> None:
        super().__init__()
        self.dest = dest

    def export(self, report):
        shutil.copyfile(report.raw_trace_path, self.dest)
        return super().export(report)


def one_window(dest: str):
    """A real window's report, its raw trace kept at ``dest``."""
    import torch

    @profiled("bench.step")
    def step(x):
        for _ in range(100):
            x = torch.tanh(x)
        return x

    x = torch.ones(64, 64)
    with capture(
        schedule=Schedule(wait=0, warmup=1, active=3), activities=["cpu"], exporters=[KeepRaw(dest)]
    ) as cap:
        for _ in range(4):
            step(x)
            cap.step()
    (report,) = cap.reports
    return dataclasses.replace(report, raw_trace_path=dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="0,1000,10000")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-bound-")
    try:
        raw = os.path.join(work, "raw.json")
        report = one_window(raw)
        print(f"raw trace: {os.path.getsize(raw) / 1024:.0f} KiB; repeats: {args.repeats}")
        print(
            f"{'files in dir':>12} {'bound off ms (med/min)':>24} {'bound on ms (med/min)':>24}"
            f" {'on/off (med)':>13}"
        )
        blob = os.urandom(64 * 1024)
        for n in (int(v) for v in args.files.split(",")):
            d = os.path.join(work, f"dir{n}")
            os.makedirs(d)
            for i in range(n):
                with open(
                    os.path.join(d, f"other_{i}_rank9.{1000 + i}.pt.trace.json.gz"), "wb"
                ) as f:
                    f.write(blob)
            times: dict[str, list[float]] = {"off": [], "on": []}
            for rep in range(-2, args.repeats):  # two rounds of warm-up, not counted
                order = ("off", "on") if rep % 2 == 0 else ("on", "off")
                for variant in order:
                    exporter = TraceFileExporter(d, keep=1, max_mb=0 if variant == "off" else 1024)
                    t0 = time.perf_counter()
                    exporter.export(report)
                    if rep >= 0:
                        times[variant].append((time.perf_counter() - t0) * 1000)
                    os.unlink(exporter.last_path)
            off, on = times["off"], times["on"]
            print(
                f"{n:>12} {statistics.median(off):>15.2f} / {min(off):>6.2f}"
                f" {statistics.median(on):>15.2f} / {min(on):>6.2f}"
                f" {statistics.median(on) / statistics.median(off):>12.2f}x"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
