"""Can a window end without idling the device? A probe on plain torch.profiler.

    python bench/deferred_stop.py [--rounds 3] [--every 100] [--run-steps 200]

torch.profiler's stop synchronises the device, then Kineto processes its buffers on the
caller's thread while the device idles (~20-30 ms a window on the H200, bench/stop_cost.py).
This probe tries the alternative on examples/06's loop, plain torch.profiler only (no SDK):

- *sync stop*: a window of 1 warm-up + 3 recorded steps every ``--every`` steps, stopped at
  the step boundary the usual way (``prof.stop()``: synchronise, then process);
- *no-sync stop*: stopped at the same boundary without synchronising first;
- *deferred stop*: the same window, but at its end collection is only toggled off
  (``toggle_collection_dynamic(False)``) and a CUDA event is recorded; the profiler is
  stopped, without synchronising, at the first later step boundary where that event has
  completed (the recorded kernels have run), while the device still has queued work;
  *deferred, CPU toggle*: the same, toggling only CPU operators off (kernels launched after the
  window are then recorded too, for the trace shaping to drop).

Both write each window's trace (``export_chrome_trace``), and the probe checks the deferred
windows hold as many kernels as the synchronised ones. Interleaved rounds; throughput relative
to the unprofiled loop of the same round. A diagnostic, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
from e2e_overhead import EX, plain_step  # noqa: E402 - bench/ is this script's directory

WINDOW = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--run-steps", type=int, default=200)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device, sizes = ("cuda", EX.GPU) if cuda else ("cpu", EX.CPU)
    model, opt, task = EX.build(device, sizes)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    tmp = tempfile.mkdtemp(prefix="deferred-")
    kernels: dict[str, list[int]] = {"sync": [], "deferred": [], "nosync": [], "deferred_cpu": []}
    waited: list[int] = []
    it = [0]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def finish(prof, kind: str) -> None:
        path = os.path.join(tmp, f"{kind}.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            evs = json.load(fh)["traceEvents"]
        kernels[kind].append(sum(1 for e in evs if e.get("cat") == "kernel"))

    def run(kind: str) -> float:
        sync()
        t0 = time.perf_counter()
        prof = None
        pending = None  # (prof, event, steps waited)
        for s in range(args.run_steps):
            k = s % args.every
            if kind != "plain" and k == 0:
                prof = torch.profiler.profile(activities=acts)
                prof.start()
            x, y = task.batch_at(it[0])
            it[0] += 1
            plain_step(model, opt, x, y)
            if pending is not None:
                p, ev, n = pending
                if ev is None or ev.query():
                    p.profiler.use_device = None  # no synchronize in stop()
                    p.stop()
                    finish(p, kind)
                    waited.append(n)
                    pending = None
                else:
                    pending = (p, ev, n + 1)
            if prof is not None and k == WINDOW - 1:
                if kind == "sync":
                    prof.stop()
                    finish(prof, "sync")
                elif kind == "nosync":
                    prof.profiler.use_device = None
                    prof.stop()
                    finish(prof, "nosync")
                else:
                    prof.toggle_collection_dynamic(False, acts if kind == "deferred" else acts[:1])
                    ev = None
                    if cuda:
                        ev = torch.cuda.Event()
                        ev.record()
                    pending = (prof, ev, 0)
                prof = None
        if pending is not None:
            p, _, n = pending
            sync()
            p.profiler.use_device = None
            p.stop()
            finish(p, kind)
            waited.append(n)
        sync()
        return args.run_steps / (time.perf_counter() - t0)

    kinds = ["plain", "sync", "nosync", "deferred", "deferred_cpu"]
    for kind in kinds:  # warm-up
        run(kind)
    for v in kernels.values():
        v.clear()
    waited.clear()
    runs: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            runs[kind].append(run(kind))
    print(
        f"torch {torch.__version__} {torch.cuda.get_device_name() if cuda else 'cpu'}; "
        f"{args.rounds} rounds x {args.run_steps} steps, a window every {args.every}"
    )
    for kind in kinds:
        ratio = statistics.median(runs[kind][r] / runs["plain"][r] for r in range(args.rounds))
        print(f"  {kind:<9} {statistics.median(runs[kind]):8.2f} steps/s  {100 * ratio:6.2f}%")
    print(
        "  kernels per window: "
        + "  ".join(f"{k} {sorted(set(v))}" for k, v in kernels.items())
        + f"; steps waited for the event: {sorted(set(waited))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
