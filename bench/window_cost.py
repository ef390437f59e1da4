"""Where a sampled window's cost goes, in examples/06's training loop.

    python bench/window_cost.py [--every 50] [--steps 300] [--json PATH]

Runs 06's loop (GPU sizes on CUDA, CPU sizes otherwise) in a session with ``every`` and the
default window (1 warm-up + 3 recorded steps), timing every ``train_step`` call (no device
synchronisation per step) and, on the caller's thread, the profiler's start and stop and the
hand-over to the export worker; on the worker, the time to build each report. Printed: the
median step, each window's excess over it step by step (the window's first step through six
steps after it), and the totals per phase. Twice: with no exporters and with the trace file
exporter (gzip). A diagnostic for the end-to-end target in BENCHMARKS.md, not a pass/fail bench.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402
from e2e_overhead import load_example  # noqa: E402 - bench/ is this script's directory

import instrument  # noqa: E402
from exporters import TraceFileExporter  # noqa: E402
from instrument import Schedule, session  # noqa: E402
from instrument import session as _session_fn  # noqa: E402,F401
from instrument.export.pipeline import ExportPipeline  # noqa: E402
from instrument.runtime import _torch  # noqa: E402

_sess_mod = instrument.runtime.stops


PHASES: dict[str, list[float]] = defaultdict(list)


def timed(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            PHASES[label].append(time.perf_counter() - t0)

    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument(
        "--max-drain",
        type=int,
        metavar="N",
        help="instrument.runtime.stops.MAX_DRAIN_STEPS (0: stop at the window's end)",
    )
    parser.add_argument(
        "--drain-records-cpu",
        action="store_true",
        help="instrument.runtime.stops.DRAIN_PAUSES_CPU_OPS = False",
    )
    args = parser.parse_args(argv)
    _sess_mod.DRAIN_PAUSES_CPU_OPS = not args.drain_records_cpu
    if args.max_drain is not None:
        _sess_mod.MAX_DRAIN_STEPS = args.max_drain

    ex = load_example()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    sizes = ex.GPU if cuda else ex.CPU
    model, opt, task = ex.build(device, sizes)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    timed(_torch.ProfilerWindow, "start", "caller: profiler start")
    timed(_torch.ProfilerWindow, "stop", "caller: profiler stop")
    timed(ExportPipeline, "submit", "caller: hand-over")
    timed(_sess_mod.Session, "_analyze", "worker: build report")
    import instrument

    # the ambient session counts steps but never opens a window (no table during warm-up)
    instrument.configure(schedule=Schedule(skip_first=10**9), exporters=[])
    i = 0
    for _ in range(20):  # warm-up
        ex.train_step(model, opt, *task.batch_at(i))
        i += 1
    sync()
    result = {
        "device": _torch.device_name(("cpu", "cuda") if cuda else ("cpu",)),
        "torch": torch.__version__,
        "every": args.every,
        "steps": args.steps,
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for label, exporters in (
            ("no exporters", []),
            ("trace exporter", [TraceFileExporter(tmp, keep=2)]),
        ):
            PHASES.clear()
            times = []
            sync()
            t_run = time.perf_counter()
            with session(
                every=args.every, schedule=Schedule(warmup=1, active=3), exporters=exporters
            ) as s:
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    ex.train_step(model, opt, *task.batch_at(i))
                    times.append(time.perf_counter() - t0)
                    i += 1
                sync()
                t_close = time.perf_counter()
            close = time.perf_counter() - t_close
            total = time.perf_counter() - t_run
            med = statistics.median(times)
            windows = list(range(0, args.steps - 10, args.every))
            excess = []  # per window: excess of steps w .. w+9 over the median, ms
            for w in windows:
                excess.append([round((t - med) * 1e3, 1) for t in times[w : w + 10]])
            mean_excess = (
                [round(statistics.mean(col), 1) for col in zip(*excess[1:])]
                if len(excess) > 1
                else []
            )
            phases = {k: [round(v * 1e3, 1) for v in vals] for k, vals in PHASES.items()}
            run = {
                "median_step_ms": round(med * 1e3, 2),
                "windows": s.windows_opened,
                "total_s": round(total, 3),
                "close_ms": round(close * 1e3, 1),
                "plain_equivalent_s": round(med * args.steps, 3),
                "excess_per_window_ms": excess,
                "mean_excess_after_first_ms": mean_excess,
                "phases_ms": phases,
                "deferred_stops": list(s._stops.drain_log),
            }
            result["runs"][label] = run
            print(
                f"\n== {label}: median step {med * 1e3:.2f} ms, {s.windows_opened} windows, "
                f"run {total:.2f} s vs {med * args.steps:.2f} s at the median step; "
                f"close {close * 1e3:.1f} ms"
            )
            print("  excess over the median, steps w..w+9 of each window (ms):")
            for w, row in zip(windows, excess):
                print(f"    window at step {w:4d}: {row}  sum {sum(row):.1f}")
            if mean_excess:
                print(
                    f"    mean (windows after the first): {mean_excess}  sum {sum(mean_excess):.1f}"
                )
            if s._stops.drain_log:
                print(
                    "  deferred stops (steps after the window's end, kernels had run): "
                    f"{list(s._stops.drain_log)}"
                )
            for k, vals in phases.items():
                later = vals[1:] or vals
                print(
                    f"  {k:28s} n={len(vals):2d}  first {vals[0]:7.1f} ms  "
                    f"median of the rest {statistics.median(later):7.1f} ms"
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
