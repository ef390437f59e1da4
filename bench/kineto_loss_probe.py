"""Which ways of running torch.profiler windows keep their kernels? Plain torch, no SDK.

    python bench/kineto_loss_probe.py [--windows 6] [--steps 40] [--size 16]

A diagnostic for the lost device events of windows of tiny steps (``bench/
deferred_stop_kernels.py`` shows the SDK's side; issue: window health). Each variant runs in a
fresh interpreter: a loop of tiny steps (``size`` x ``size`` matmuls), a window of 3 recorded
steps every 10 steps, and prints per window the number of kernel events, CUDA runtime events
and the device time it recorded. Variants differ only in how a window is started and stopped:

- *schedule*: one ``torch.profiler.profile(schedule=...)`` for the whole loop, as a user writes
  it by hand (``repeat=windows``);
- *per window*: a new ``profile`` object per window (``prepare_trace``/``start_trace`` at the
  window's first step, ``stop_trace`` at its end), the SDK's shape;
- *per window + sync*: the same, ``torch.cuda.synchronize()`` before the stop;
- *per window + sync + sleep*: the same, then 50 ms of sleep before the stop (Kineto's runloop
  ticks while buffers come back);
- *per window, no warm-up*: ``start_trace`` right after ``prepare_trace`` (no warm-up step);
- *per window + sync after start*: a synchronize right after ``start_trace``;
- *per window + big step*: one 1024-wide product in the window's first step.

It times nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PROGRAM = r"""
import json, sys, time, torch
from torch.profiler import profile, ProfilerActivity, schedule

variant = sys.argv[1]
windows, steps_between, size = (int(a) for a in sys.argv[2:5])
x = torch.ones(size, size, device="cuda")
big = torch.ones(1024, 1024, device="cuda")
acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
results = []

def count(prof):
    k = r = 0
    dev = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k += 1
            dev += e.device_time
        elif e.name.startswith("cuda") or e.name.startswith("cuLaunch"):
            r += 1
    results.append({"kernels": k, "runtime": r, "device_us": round(dev, 3)})

def step(i, first=False):
    y = (x @ x).sum()
    if first and variant == "per window + big step":
        (big @ big).sum()
    return y

# warm CUDA and the libraries outside any window
for i in range(5):
    step(i)
torch.cuda.synchronize()

if variant == "schedule":
    sched = schedule(wait=steps_between - 4, warmup=1, active=3, repeat=windows)
    with profile(activities=acts, schedule=sched, on_trace_ready=count) as prof:
        for i in range(windows * steps_between):
            step(i)
            prof.step()
else:
    for w in range(windows):
        for i in range(steps_between - 4):
            step(i)
        prof = profile(activities=acts)
        prof.prepare_trace()
        if variant != "per window, no warm-up":
            step(0)  # the warm-up step
        prof.start_trace()
        if variant == "per window + sync after start":
            torch.cuda.synchronize()
        for i in range(3):
            step(i, first=(i == 0))
        if variant.startswith("per window + sync"):
            torch.cuda.synchronize()
        if variant == "per window + sync + sleep":
            time.sleep(0.05)
        prof.stop_trace()
        count(prof)
print(json.dumps(results))
"""

VARIANTS = [
    "schedule",
    "per window",
    "per window + sync",
    "per window + sync + sleep",
    "per window, no warm-up",
    "per window + sync after start",
    "per window + big step",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10, help="steps from one window to the next")
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--only", default=",".join(VARIANTS), help="variants, comma-separated")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    out: dict[str, object] = {}
    for name in args.only.split(","):
        cmd = [
            sys.executable,
            "-c",
            PROGRAM,
            name,
            str(args.windows),
            str(args.steps),
            str(args.size),
        ]
        p = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        if p.returncode:
            print(f"{name}: exit {p.returncode}\n{p.stderr[-1500:]}")
            out[name] = {"exit": p.returncode}
            continue
        res = json.loads(p.stdout.strip().splitlines()[-1])
        kept = sum(1 for r in res if r["kernels"] > 0)
        print(
            f"{name:32s} windows with kernels {kept}/{len(res)}: "
            + " ".join(f"{r['kernels']}k/{r['runtime']}r" for r in res)
        )
        out[name] = res
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
