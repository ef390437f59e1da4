"""What one window costs in torch itself, phase by phase, and what the SDK's worker adds.

    python bench/stop_cost.py [--windows 6] [--json PATH]
    TEARDOWN_CUPTI=0 python bench/stop_cost.py     # Kineto keeps CUPTI attached between windows

Runs examples/06's loop (GPU sizes on CUDA, CPU sizes otherwise). First ``--idle`` plain steps
are timed (device synchronised per step), then ``--windows`` windows of plain
``torch.profiler.profile`` (1 warm-up + 3 recorded steps, like the SDK's default window), each
followed by ``--idle`` plain steps. Per window, timed on the training thread:

- *start*: ``prepare_trace`` + ``start_trace``;
- *drain*: ``torch.cuda.synchronize()`` before the stop (the queued steps finishing; not lost
  time, the device was busy);
- *stop*: ``stop_trace`` with the device already idle (Kineto/CUPTI processing; with
  TEARDOWN_CUPTI on, CUPTI's teardown);
- *export*: ``export_chrome_trace`` (torch's JSON writer);
- then the SDK worker's phases on the same window, one by one, without the training loop
  running: *load* (``json.load``), *shape* (``tracefile.shape_trace``), *write* (the shaped
  trace, uncompressed), *events* (``analysis.events_from_trace``), *analyze*
  (``analysis.analyze``), and *kineto* (``_torch.kineto_events`` + analyze, where this torch's
  events carry activity types);
- *after*: the median synchronised plain step after the window over the one before any window
  (CUPTI left attached slows every later launch).

A diagnostic for the sampled end-to-end figure in BENCHMARKS.md, not a pass/fail bench.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
from e2e_overhead import EX, plain_step  # noqa: E402 - bench/ is this script's directory

from instrument.analysis.analyze import analyze, drop_warmup, events_from_trace  # noqa: E402
from instrument.analysis.kineto_json import STEP_MARKER, load_trace, shape_trace, write_json_atomic  # noqa: E402
from instrument.runtime import _torch  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--idle", type=int, default=20, help="plain steps around each window")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    ex = EX
    cuda = torch.cuda.is_available()
    device, sizes = ("cuda", ex.GPU) if cuda else ("cpu", ex.CPU)
    model, opt, task = ex.build(device, sizes)
    activities = ("cpu", "cuda") if cuda else ("cpu",)
    i = 0

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def step(marker: str | None = None) -> None:
        nonlocal i
        x, y = task.batch_at(i)
        i += 1
        if marker:
            with torch.profiler.record_function(marker):
                pass
        plain_step(model, opt, x, y)

    def idle_steps(n: int) -> list[float]:
        out = []
        for _ in range(n):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            out.append(time.perf_counter() - t0)
        return out

    idle_steps(5)
    before = statistics.median(idle_steps(args.idle))
    tmp = tempfile.mkdtemp(prefix="stop-cost-")
    rows = []
    has_kineto_types = None
    for w in range(args.windows):
        row: dict[str, float] = {}
        win = _torch.ProfilerWindow(
            activities,
            record_shapes=False,
            profile_memory=False,
            with_stack=False,
            with_flops=False,
        )
        t0 = time.perf_counter()
        win.start()
        row["start"] = time.perf_counter() - t0
        step()  # warm-up step (recorded, dropped by the SDK)
        for s in range(3):
            step(STEP_MARKER + str(s))
        t0 = time.perf_counter()
        sync()
        row["drain"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        win.stop()
        row["stop"] = time.perf_counter() - t0
        raw = os.path.join(tmp, f"w{w}.json")
        t0 = time.perf_counter()
        win.export_chrome_trace(raw)
        row["export"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        trace = load_trace(raw)
        row["load"] = time.perf_counter() - t0
        row["events_n"] = len(trace.get("traceEvents", []))
        t0 = time.perf_counter()
        shaped = shape_trace(trace, frozenset(), {"rank": 0, "world_size": 1})
        row["shape"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_json_atomic(shaped, raw + ".shaped", compress=False, durable=False)
        row["write"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        evs = events_from_trace(shaped)
        row["events"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        analyze(evs, ())
        row["analyze"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        kev = win.events()
        if kev is not None:
            analyze(drop_warmup(kev), ())
            row["kineto"] = time.perf_counter() - t0
        has_kineto_types = kev is not None
        del trace, shaped, evs, kev, win
        row["after"] = statistics.median(idle_steps(args.idle)) / before
        rows.append(row)
        print(
            f"window {w}: "
            + "  ".join(
                f"{k} {v * 1e3:.1f} ms"
                if k not in ("after", "events_n")
                else f"{k} {v:.3f}"
                if k == "after"
                else f"{k} {int(v)}"
                for k, v in row.items()
            ),
            flush=True,
        )

    shutil.rmtree(tmp, ignore_errors=True)
    keys = [k for k in rows[0]]
    later = rows[1:] if len(rows) > 1 else rows
    print()
    print(
        f"torch {torch.__version__}  {torch.cuda.get_device_name() if cuda else 'cpu'}  "
        f"TEARDOWN_CUPTI={os.environ.get('TEARDOWN_CUPTI', '(unset)')}  "
        f"plain step {before * 1e3:.2f} ms (synchronised)  Kineto event types: "
        f"{has_kineto_types}"
    )
    print("median of windows 2..:")
    for k in keys:
        v = statistics.median(r[k] for r in later)
        unit = "x" if k == "after" else ("" if k == "events_n" else "ms")
        print(f"  {k:<9} {v if k in ('after', 'events_n') else v * 1e3:>10.2f} {unit}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "torch": torch.__version__,
                    "teardown": os.environ.get("TEARDOWN_CUPTI"),
                    "plain_step_s": before,
                    "windows": rows,
                },
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
