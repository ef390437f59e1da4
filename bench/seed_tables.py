"""The seed's two tables, plain torch.profiler next to torch-profiled, on one machine and run.

    python bench/seed_tables.py            # GPU: 64 and 4096 bf16; CPU: 64 and 1024 fp32

For each size: torch's own ``key_averages().table()`` for a window of three recorded steps,
then torch-profiled's console table for a window of the same shape over the same workload.
"""

from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from exporters import ConsoleExporter
from instrument import Schedule, profiled, session


@profiled("matmul_bias")
def matmul_bias(x, w, b):
    return x @ w + b


def plain(x, w, b, activities):
    def fn(x, w, b):
        with torch.profiler.record_function("matmul_bias"):
            return x @ w + b

    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for _ in range(5):
            fn(x, w, b)
            prof.step()
    t0 = time.perf_counter()
    table = prof.key_averages().table(
        sort_by="cuda_time_total" if ProfilerActivity.CUDA in activities else "cpu_time_total",
        row_limit=8,
    )
    took = time.perf_counter() - t0
    print(table)
    print(f"(key_averages + table: {took * 1e3:.1f} ms)")


def ours(x, w, b):
    with session(
        schedule=Schedule(wait=1, warmup=1, active=3),
        exporters=[ConsoleExporter(stream=sys.stdout)],
    ) as s:
        for _ in range(5):
            matmul_bias(x, w, b)
            s.step()


def main() -> None:
    cuda = torch.cuda.is_available()
    device, dtype, sizes = (
        ("cuda", torch.bfloat16, (64, 4096)) if cuda else ("cpu", torch.float32, (64, 1024))
    )
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for n in sizes:
        x = torch.randn(n, n, device=device, dtype=dtype)
        w = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, device=device, dtype=dtype)
        print(f"\n=== {n}x{n} {dtype} on {device}: plain torch.profiler ===")
        plain(x, w, b, activities)
        print(f"\n=== {n}x{n} {dtype} on {device}: torch-profiled ===")
        ours(x, w, b)


if __name__ == "__main__":
    main()
