"""Window health on a GPU: false alarms on healthy windows, and the lost windows named (needs CUDA).

    python bench/health_gpu.py [--windows 100] [--every 5] [--only 06,lost]

- *06*: ``examples/06_training_loop.py`` (residual MLP, bf16 autocast, ~10 ms steps on an
  H100) with ``PROFILED_EVERY`` so that it records ``--windows`` windows; every window should
  read ``complete`` (issue 30: 0 false alarms in 100 windows).
- *lost*: ``bench/deferred_stop_kernels.py``'s case (16x16 matmuls, ``PROFILED_EVERY=10``),
  with the deferred stop as shipped and with torch's synchronising stop: windows that lost
  their runtime and kernel events (0 device time) must read ``device-missing`` or
  ``partial``, and windows that kept them ``complete``.

Each case runs in a fresh interpreter with the JSON-lines exporter and prints the count of
windows per health status, then each window that is not complete with its reasons; *lost*
also prints, per window, its first step, device time and health. A diagnostic: it times
nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))

from deferred_stop_kernels import PROGRAM, VARIANTS  # noqa: E402  (the reproducer's program)

SCHEMA = "torch-profiled/window-report/1"


def _env(path: str, every: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFILED_")}
    env.update(PROFILED_EXPORTERS="json", PROFILED_JSON_PATH=path, PROFILED_EVERY=str(every))
    env["PROFILED_OVERHEAD_BUDGET"] = "0"  # every window the schedule asks for (no back-off)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _windows(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        reports = [json.loads(line) for line in f if line.strip()]
    return [r for r in reports if r.get("schema") == SCHEMA]


def _tell(name: str, windows: list[dict]) -> None:
    counts = collections.Counter(w["health"]["status"] for w in windows)
    print(f"{name}: {len(windows)} window(s) by health {dict(sorted(counts.items()))}")
    for w in windows:
        if w["health"]["status"] != "complete":
            reasons = "; ".join(r["detail"] for r in w["health"]["reasons"])
            print(
                f"  window {w['window']} (steps {w['steps']}): {w['health']['status']}: {reasons}"
            )


def run_06(windows: int, every: int, workdir: str) -> None:
    path = os.path.join(workdir, "06.jsonl")
    steps = windows * every + 1
    cmd = [sys.executable, os.path.join(REPO, "examples", "06_training_loop.py")]
    cmd += ["--steps", str(steps)]
    env = _env(path, every)
    env["PROFILED_TRACE_DIR"] = os.path.join(workdir, "traces")
    out = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True)
    if out.returncode:
        print(f"06: exit {out.returncode}\n{out.stderr[-2000:]}")
        return
    _tell(f"06 ({steps} steps, PROFILED_EVERY={every})", _windows(path))


def run_lost(workdir: str, steps: int = 40, size: int = 16) -> None:
    for name in ("default", "sync stop"):
        prelude, device = VARIANTS[name]
        script = os.path.join(workdir, "prog.py")
        with open(script, "w") as f:
            f.write(prelude + PROGRAM)
        path = os.path.join(workdir, name.replace(" ", "_") + ".jsonl")
        cmd = [sys.executable, script, str(steps), str(size), device]
        out = subprocess.run(cmd, env=_env(path, 10), cwd=workdir, capture_output=True, text=True)
        if out.returncode:
            print(f"lost/{name}: exit {out.returncode}\n{out.stderr[-2000:]}")
            continue
        found = _windows(path)
        _tell(f"lost/{name}", found)
        for w in found:
            kinds = [r["kind"] for r in w["health"]["reasons"]]
            print(
                f"  window {w['window']}: first step {w['steps'][0] if w['steps'] else '-'}, "
                f"device {w['self_device_time_total_us']:.1f} us, {w['event_count']} events, "
                f"{w['health']['status']} {kinds}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=100, help="06: windows to record")
    parser.add_argument("--every", type=int, default=5, help="06: PROFILED_EVERY (>= 4)")
    parser.add_argument("--only", default="06,lost", help="cases, comma-separated")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/health_gpu.py needs a CUDA GPU")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    with tempfile.TemporaryDirectory() as workdir:
        cases = args.only.split(",")
        if "06" in cases:
            run_06(args.windows, args.every, workdir)
        if "lost" in cases:
            run_lost(workdir)


if __name__ == "__main__":
    main()
