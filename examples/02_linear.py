"""The second rung: ``nn.Linear`` with bias, instrumented without touching its code.

``examples/01_matmul_bias.py`` writes ``x @ w + b``: two operators, two device kernels (a
GEMM, then an elementwise add that reads and writes the whole output again). ``nn.Linear``
computes the same ``x @ W.T + b`` as one ``aten::addmm``: on a GPU one GEMM kernel with the bias
added in its epilogue, on a CPU one BLAS call. The table shows it: one operator under the range
and, on a GPU, one kernel per call.

    python examples/02_linear.py

``instrument_module(layer, prefix="linear")`` gives the layer's forward a range named
``linear``. Sizes as in 01: 64x64 and 4096x4096 bf16 on a GPU, 64x64 and 1024x1024 fp32 on a CPU.
Each size gets its own session (one unprofiled step, one warm-up step, three recorded steps): a
table on standard error and a trace file under ./profiled_traces. ``PROFILED_*`` variables
apply (``PROFILED_EXPORTERS=console`` for no trace files).
"""

from __future__ import annotations

import torch
from torch import nn

from instrument import Schedule, instrument_module, session


def run(size: int, device: str, dtype: torch.dtype) -> None:
    layer = nn.Linear(size, size, bias=True, device=device, dtype=dtype)
    x = torch.randn(size, size, device=device, dtype=dtype)
    print(f"\nlinear {size}x{size} {str(dtype).replace('torch.', '')} on {device}", flush=True)
    with instrument_module(layer, prefix="linear"):  # the hooks are removed at the end
        # each forward of the layer is one step (s.step() ends it): step 0 is not
        # profiled, step 1 warms the profiler up, steps 2-4 are recorded
        with session(schedule=Schedule(wait=1, warmup=1, active=3)) as s, torch.no_grad():
            for _ in range(5):
                layer(x)
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
