#!/usr/bin/env python
"""A recorded warm-up step with and without its CPU operators: what pausing them saves.

    python bench/warmup_ops.py [--windows 16] [--device cpu|cuda] [--json PATH]

A CUDA window starts its profiler at the warm-up step (CUPTI's start-up lands there, and is cut
with it); ``window.WARMUP_PAUSES_CPU_OPS`` keeps the stepping thread's CPU operators and ranges
out of that step. This runs ``--windows`` windows (default schedule: a warm-up and 3 recorded
steps) of ``bench/e2e_lm.py``'s small LM in explicit sessions (two more first, untimed), the
switch alternating on and off from one window to the next, and gives per setting the median
of: the raw trace's events, the profiler's stop (thread CPU and wall, on the caller) and
torch's ``export_chrome_trace`` (thread CPU, on the export worker). On a CPU the window is
made to record its warm-up as a CUDA window does (``record_warmup``). Timing wrappers only:
the product path is as it ships.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (REPO, os.path.join(REPO, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from e2e_lm import CPU_SIZES, LM, QUICK_SIZES, SIZES  # noqa: E402

import instrument  # noqa: E402
from exporters import InMemoryExporter  # noqa: E402
from instrument import Schedule, profiled, session  # noqa: E402
from instrument.runtime import _torch  # noqa: E402
from instrument.runtime import window as window_mod  # noqa: E402

FIELDS = ("events", "stop_cpu_ms", "stop_wall_ms", "export_cpu_ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=16, help="windows in all (default 16)")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available")
    parser.add_argument("--quick", action="store_true", help="tiny model (a smoke run)")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.windows < 2:
        parser.error("--windows must be >= 2 (one per setting at least)")
    shape = (QUICK_SIZES if args.quick else SIZES if device == "cuda" else CPU_SIZES)["small"]
    if device == "cpu":
        torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")

    torch.manual_seed(0)
    model = LM(**{k: shape[k] for k in ("d_model", "layers", "heads", "seq", "vocab")}).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    batch = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"] + 1), device=device)

    @profiled("forward")
    def forward() -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(batch[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())

    @profiled("train_step")
    def train_step() -> None:
        forward().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    seen: dict[bool, dict[str, list[float]]] = {k: {f: [] for f in FIELDS} for k in (True, False)}
    stop, export = _torch.ProfilerWindow.stop, _torch.ProfilerWindow.export_chrome_trace

    def timed_stop(self: _torch.ProfilerWindow, *a: object, **k: object) -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        stop(self, *a, **k)
        row = seen[window_mod.WARMUP_PAUSES_CPU_OPS]
        row["stop_cpu_ms"].append((time.thread_time() - cpu) * 1e3)
        row["stop_wall_ms"].append((time.perf_counter() - wall) * 1e3)

    def timed_export(self: _torch.ProfilerWindow, path: str) -> None:
        cpu = time.thread_time()
        export(self, path)
        row = seen[window_mod.WARMUP_PAUSES_CPU_OPS]
        row["export_cpu_ms"].append((time.thread_time() - cpu) * 1e3)
        with open(path, encoding="utf-8") as fh:
            row["events"].append(len(json.load(fh)["traceEvents"]))

    _torch.ProfilerWindow.stop = timed_stop  # type: ignore[method-assign]
    _torch.ProfilerWindow.export_chrome_trace = timed_export  # type: ignore[method-assign]
    pause = window_mod.WARMUP_PAUSES_CPU_OPS
    try:
        for i in range(-2, args.windows):  # two untimed: the first profiler start, launches
            if i == 0:
                for row in seen.values():
                    for values in row.values():
                        values.clear()
            window_mod.WARMUP_PAUSES_CPU_OPS = i % 2 == 0
            s = session(schedule=Schedule(warmup=1, active=3), exporters=[InMemoryExporter()])
            s._windows.record_warmup = True  # (a CUDA window's already; a CPU one's made so)
            with s:
                for _ in range(6):
                    train_step()
                    s.step()
            instrument.flush(60)  # its export done before the next window's stop is timed
    finally:
        window_mod.WARMUP_PAUSES_CPU_OPS = pause
        _torch.ProfilerWindow.stop = stop  # type: ignore[method-assign]
        _torch.ProfilerWindow.export_chrome_trace = export  # type: ignore[method-assign]
        instrument.shutdown()

    med = {
        paused: {f: statistics.median(v) if v else float("nan") for f, v in row.items()}
        for paused, row in seen.items()
    }
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"warm-up CPU ops, {args.windows} windows alternating, {name}, torch {torch.__version__}")
    head = f"  {'warm-up CPU ops':<16}{'raw events':>11}{'stop CPU':>10}{'stop wall':>10}"
    print(head + f"{'export CPU':>11}")
    for paused in (False, True):
        m = med[paused]
        what = "paused" if paused else "recorded"
        print(
            f"  {what:<16}{m['events']:>11.0f}{m['stop_cpu_ms']:>10.1f}"
            f"{m['stop_wall_ms']:>10.1f}{m['export_cpu_ms']:>11.1f}"
        )
    print("  (medians; ms: the caller's thread for the stop, the export worker's for the export)")
    if args.json:
        doc = {"device": name, "torch": torch.__version__, "windows": args.windows}
        doc["paused"], doc["recorded"] = med[True], med[False]
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
