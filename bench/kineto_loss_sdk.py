"""Where do the lost device events of the SDK's tiny-step windows go? (needs a CUDA GPU)

    python bench/kineto_loss_sdk.py [--steps 40] [--size 16]

``bench/kineto_loss_probe.py`` showed plain torch keeping every window's kernels however its
windows start and stop, while ``bench/deferred_stop_kernels.py`` shows the SDK's windows of the
same steps losing theirs. This runs the SDK's program (``PROFILED_EVERY=10``, 16x16 matmuls)
with ``instrument.runtime._torch.ProfilerWindow.stop`` wrapped: right after torch's stop it counts
the device events and CUDA runtime events in Kineto's results (what torch handed back, before any
SDK analysis), and prints them beside the window's report (what the analysis kept). Variants
differ in one SDK knob each, to find the one that loses them; *trace written late* turns off
``instrument.export.builder.WRITE_BEFORE_NEXT_START`` (the window's trace written by the export
worker only, possibly after the next window started: the SDK before the fix).
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
import instrument, instrument.runtime._torch as T
from instrument import profiled

counts = []
_stop = T.ProfilerWindow.stop
def stop(self, *, sync=True):
    _stop(self, sync=sync)
    k = r = c = 0
    inner = self._prof.profiler
    if inner is not None and inner.kineto_results is not None:
        for e in inner.kineto_results.events():
            t = e.device_type()
            if t == torch.autograd.DeviceType.CUDA:
                k += 1
            elif e.name().startswith(("cudaLaunch", "cuLaunch")):
                r += 1
            else:
                c += 1
    counts.append({"kineto_device": k, "kineto_launch": r, "kineto_other": c, "sync": sync})
T.ProfilerWindow.stop = stop

steps, size = int(sys.argv[1]), int(sys.argv[2])

@profiled("work", step=True)
def work(x):
    return (x @ x).sum()

x = torch.ones(size, size, device="cuda")
for _ in range(steps):
    work(x)
instrument.flush()
print(json.dumps(counts), flush=True)
"""

VARIANTS = {
    "default": ("", {}),
    "trace written late": (
        "import instrument.export.builder as R; R.WRITE_BEFORE_NEXT_START = False\n",
        {},
    ),
    "sync stop": (
        "import instrument.runtime.stops; instrument.runtime.stops.MAX_DRAIN_STEPS = 0\n",
        {},
    ),
    "cpu ops kept": (
        "import instrument.runtime.stops; instrument.runtime.stops.DRAIN_PAUSES_CPU_OPS = False\n",
        {},
    ),
    "all threads": ("", {"PROFILED_ALL_THREADS": "1"}),
    "no helper process": ("", {"PROFILED_ANALYSIS_PROCESS": "0"}),
    "inductor asked": (
        "import contextlib, instrument.runtime._torch as T2\n"
        "T2._inductor_left_alone = contextlib.nullcontext\n",
        {},
    ),
}


def run(name: str, steps: int, size: int, workdir: str) -> None:
    prelude, extra = VARIANTS[name]
    script = os.path.join(workdir, "prog.py")
    with open(script, "w") as f:
        f.write(prelude + PROGRAM)
    path = os.path.join(workdir, name.replace(" ", "_") + ".jsonl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFILED_")}
    env.update(PROFILED_EXPORTERS="json", PROFILED_JSON_PATH=path, PROFILED_EVERY="10", **extra)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, script, str(steps), str(size)],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode:
        print(f"{name}: exit {out.returncode}\n{out.stderr[-2000:]}")
        return
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    reports = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["schema"] == "torch-profiled/window-report/1":
                    health = (r.get("health") or {}).get("status", "?")
                    reports.append((r["self_device_time_total_us"], r["event_count"], health))
    print(f"{name}:")
    print(
        f"  at torch's stop (device, launches, other, sync): {[tuple(c.values()) for c in counts]}"
    )
    print(f"  reports (device us, events, health): {reports}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--only", default=",".join(VARIANTS), help="variants, comma-separated")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/kineto_loss_sdk.py needs a CUDA GPU")
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.only.split(","):
            run(name, args.steps, args.size, workdir)


if __name__ == "__main__":
    main()
