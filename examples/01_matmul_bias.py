"""The seed example: ``x @ w + b`` decorated with ``@profiled("matmul_bias")``.

At 64x64 the work is overhead-bound: the device finishes each kernel in a few microseconds
and then idles while the CPU dispatches the next operator, so the range's device time is a
small fraction of its CPU time. At 4096x4096 (bf16, on a GPU) it is compute-bound: the device
time approaches or exceeds the CPU time. Without a GPU the large case is 1024x1024 fp32 so the
demo stays within a few seconds; the tables then show CPU time only. Under each table a line
gives the range's FLOPs per call and, on a GPU, its achieved FLOP/s and MFU (the share of the
device's dense bf16 peak): the 4096x4096 case runs near the peak, the 64x64 one far below it.

    python examples/01_matmul_bias.py

Each size gets its own profiling session: one unprofiled step, one warm-up step, three recorded
steps, then a
table on standard error and a trace file under ./profiled_traces (open it in
https://ui.perfetto.dev or chrome://tracing). ``PROFILED_*`` variables apply, for example
``PROFILED_EXPORTERS=console`` for no trace files.
"""

from __future__ import annotations

import torch

from instrument import Schedule, profiled, session


@profiled("matmul_bias")
def matmul_bias(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return x @ w + b


def run(size: int, device: str, dtype: torch.dtype) -> None:
    x = torch.randn(size, size, device=device, dtype=dtype)
    w = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, device=device, dtype=dtype)
    print(f"\nmatmul_bias {size}x{size} {str(dtype).replace('torch.', '')} on {device}", flush=True)
    # Every call of matmul_bias is one step (s.step() ends it). Step 0 is not profiled (library
    # and kernel initialisation), step 1 warms the profiler up, steps 2-4 are recorded.
    # with_flops: FLOPs per call, achieved FLOP/s and MFU against the device's peak (recording
    # input shapes adds a little CPU time per operator)
    with session(schedule=Schedule(wait=1, warmup=1, active=3), with_flops=True) as s:
        for _ in range(5):
            matmul_bias(x, w, b)
            s.step()


def main() -> None:
    if torch.cuda.is_available():
        device, dtype, sizes = "cuda", torch.bfloat16, (64, 4096)
    else:
        device, dtype, sizes = "cpu", torch.float32, (64, 1024)
    for size in sizes:
        run(size, device, dtype)


if __name__ == "__main__":
    main()
