"""Achieved FLOP/s and MFU of the seed's matmul+bias, checked against the trace and CUDA events.

    python bench/flops_gpu.py [--n 4096] [--json PATH]      # needs a CUDA GPU

One window of three recorded calls of ``x @ w + b`` (bf16, n x n) with FLOPs on. Printed side by
side: the report's FLOPs per call (``2 n^3``: the bias add is not a counted FLOP), its achieved
FLOP/s (FLOPs over the device time of the range's kernels) and MFU against the device's dense
bf16 peak (``instrument/analysis/peaks.py``); the same FLOP/s computed here from the trace
file's kernel events (every kernel the window ran, summed by this script), and ``2 n^3`` over
the time CUDA events measure around one call outside any profiler. The issue's check: the
report's figure within 2% of ``2 n^3 / kernel time``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from exporters import TraceFileExporter
from instrument import Schedule, profiled
from instrument.testing import capture


@profiled("matmul_bias")
def matmul_bias(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return x @ w + b


def _event_timed(n_calls: int, *args: torch.Tensor) -> float:
    """Mean seconds per call, CUDA events around ``n_calls`` back-to-back calls."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(n_calls):
        args[0] @ args[1] + args[2]
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / 1e3 / n_calls


def _kernel_seconds(trace_dir: Path) -> float:
    """Total duration of the device kernels in the window's trace file (this script's sum)."""
    (path,) = trace_dir.glob("*.pt.trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    return sum(e["dur"] for e in events if e.get("cat") == "kernel") / 1e6


def run(n: int) -> dict[str, float | str | None]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    kw = dict(device="cuda", dtype=torch.bfloat16, generator=gen)
    x, w, b = torch.randn(n, n, **kw), torch.randn(n, n, **kw), torch.randn(n, **kw)
    for _ in range(3):  # warm-up, undecorated: no session of the SDK's own starts here
        x @ w + b
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        with capture(
            schedule=Schedule(wait=0, warmup=1, active=3),
            exporters=[TraceFileExporter(tmp, gzip=False)],
            with_flops=True,
        ) as cap:
            for _ in range(4):
                matmul_bias(x, w, b)
                cap.step()
        (report,) = cap.reports
        kernel_s = _kernel_seconds(Path(tmp))
    r = report.ranges["matmul_bias"]
    flops = 2 * n**3
    return {
        "device": report.device,
        "n": n,
        "report_flops_per_call": r.flops / r.calls,
        "report_tflops": r.flops_per_s / 1e12,
        "report_mfu": report.mfu(r),
        "peak_tflops": (report.peak_flops_per_s(r.flops_dtype) or 0) / 1e12,
        "trace_tflops": flops * r.calls / kernel_s / 1e12,
        "event_tflops": flops / _event_timed(20, x, w, b) / 1e12,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--json", help="write the figures as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("flops_gpu: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = run(args.n)
    for key, value in out.items():
        print(f"{key:>24}: {value}")
    ratio = out["report_tflops"] / out["trace_tflops"]  # type: ignore[operator]
    print(f"{'report / trace':>24}: {ratio:.4f} (the check: within 0.98..1.02)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
