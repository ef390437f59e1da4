"""Do windows ended by the deferred stop keep their kernels? A reproducer (needs a CUDA GPU).

    python bench/deferred_stop_kernels.py [--steps 40] [--size 16]

Seen on an H100 (torch 2.11, 2026-12-06): with ``PROFILED_EVERY=10`` over steps of a few
microseconds of device work (16x16 matmuls), every window but the last before a flush or the
program's exit reported 0 device time and lacked its CUDA runtime and kernel events (21
events instead of 33); with torch's synchronising stop (``MAX_DRAIN_STEPS = 0``) every window
kept them. ``tests/test_cuda.py`` holds the same case as an expected failure. The likely
cause, not yet confirmed: Kineto in torch 2.11 drops the buffers CUPTI has returned when it
flushes at the stop and none is still out (pytorch/kineto#1362, in PyTorch's main branch since
2026-04-15). To check, run with ``KINETO_LOG_LEVEL=0``: Kineto logs "Processed N GPU records"
only for windows whose buffers it read.

Each variant runs the program in a fresh interpreter and prints, per window, its first
recorded step, its device, its device time, its event count, and the deferred stops' log
(steps waited, whether the end event had completed: ``Stops.drain_log``):

- *default*: the deferred stop as shipped;
- *sync stop*: ``instrument.runtime.stops.MAX_DRAIN_STEPS = 0`` (torch's stop: synchronise first);
- *event sync*: the deferred stop, but each time it asks whether the window's end event has
  completed it first waits on it (``cudaEventSynchronize``), so the stop runs at the first
  step boundary, as in *default*, once a synchronising call has been made;
- *stream sync*: the same with the current stream synchronised instead;
- *cpu first*: the default, in a program that runs its first 40 steps on the CPU.

A diagnostic, not a benchmark: it times nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = r"""
import json, sys, torch
import instrument
import instrument.runtime.lifetime
from instrument import profiled

steps, size, device = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

@profiled("work", step=True)
def work(x):
    return (x @ x).sum()

x = torch.ones(size, size, device=device)
for _ in range(steps):
    work(x)
if device == "cpu":
    x = x.cuda()
    for _ in range(steps):
        work(x)
sess = instrument.runtime.lifetime.session_for_calls()
print(json.dumps({"drain_log": list(sess._stops.drain_log)}), flush=True)
"""

WAIT_ALWAYS = """
import instrument.runtime.stops as _stops, torch as _t
_defer = _stops.Stops.defer
class _Ev:  # waits (the variant's wait) each time the stop asks whether the window's end has run
    def __init__(self, event): self.event = event
    def query(self):
        MODE
        return self.event.query()
    def synchronize(self): self.event.synchronize()
_stops.Stops.defer = lambda self, window, event, recorded: _defer(
    self, window, _Ev(event), recorded)
"""

VARIANTS = {
    "default": ("", "cuda"),
    "sync stop": (
        "import instrument.runtime.stops; instrument.runtime.stops.MAX_DRAIN_STEPS = 0\n",
        "cuda",
    ),
    "event sync": (WAIT_ALWAYS.replace("MODE", "self.event.synchronize()"), "cuda"),
    "stream sync": (WAIT_ALWAYS.replace("MODE", "_t.cuda.current_stream().synchronize()"), "cuda"),
    "cpu first": ("", "cpu"),
}


def run(name: str, steps: int, size: int, workdir: str) -> None:
    prelude, device = VARIANTS[name]
    script = os.path.join(workdir, "prog.py")
    with open(script, "w") as f:
        f.write(prelude + PROGRAM)
    path = os.path.join(workdir, name.replace(" ", "_") + ".jsonl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFILED_")}
    env.update(PROFILED_EXPORTERS="json", PROFILED_JSON_PATH=path, PROFILED_EVERY="10")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, script, str(steps), str(size), device]
    out = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True)
    if out.returncode:
        print(f"{name}: exit {out.returncode}\n{out.stderr[-2000:]}")
        return
    drains = json.loads(out.stdout.strip().splitlines()[-1])["drain_log"]
    windows = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r["schema"] == "torch-profiled/window-report/1":
                windows.append(
                    (
                        r["steps"][0],
                        r["device"].split()[0],
                        r["self_device_time_total_us"],
                        r["event_count"],
                    )
                )
    print(f"{name}: windows (first step, device, device us, events) {windows}")
    print(f"{' ' * len(name)}  deferred stops (steps waited, had completed) {drains}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--only", default=",".join(VARIANTS), help="variants, comma-separated")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/deferred_stop_kernels.py needs a CUDA GPU")
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.only.split(","):
            run(name, args.steps, args.size, workdir)


if __name__ == "__main__":
    main()
