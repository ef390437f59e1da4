"""The third rung: a GeGLU MLP, eager against ``torch.compile``, and the diff of the two traces.

    python examples/03_mlp.py

The MLP of many language models: ``down(gelu(gate(x)) * up(x))``. Eager PyTorch runs five
operators per call (three GEMMs, the GELU, the multiply), each reading and writing full
activations. ``torch.compile`` keeps the three GEMMs and fuses the GELU and the multiply into
one generated kernel. Both versions run under the same range name, ``mlp``, in sessions of the
same shape (one unprofiled step, one warm-up step, three recorded steps), each writing its trace
to a directory of its own; at the end ``torch-profiled diff`` compares the two traces per call, per
range, kernel and operator.

On a GPU: bf16, 2048 tokens, 4096 -> 11008 -> 4096 (a 7B model's MLP). On a CPU: fp32, 128
tokens, 256 -> 1024 -> 256, compiled by Inductor's C++ backend when a C++ compiler is on the
PATH, else by ``aot_eager`` (no fusion; the example says so). The first compiled call compiles
(seconds); it runs before the session, so the window holds only steady-state calls.

Traces go to ``$PROFILED_TRACE_DIR/03_mlp/{eager,compiled}`` (default ``./profiled_traces``);
both directories are emptied first, since ``diff`` pools every trace in a directory (a trace
left from an earlier run would count as one more window).
"""

from __future__ import annotations

import os
import shutil
import sys

import torch
import torch.nn.functional as F
from torch import nn

from exporters import TraceFileExporter
from instrument import Config, Schedule, profiled, session
from instrument.cli import main as torch_profiled


class GeGLU(nn.Module):
    """``down(gelu(gate(x)) * up(x))``, no biases (as in Gemma, T5 v1.1)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.gate(x), approximate="tanh") * self.up(x))


@profiled("mlp")
def mlp(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def compile_backend(device: str) -> str:
    if device == "cpu" and shutil.which(os.environ.get("CXX", "c++")) is None:
        print("no C++ compiler on the PATH: compiling with aot_eager (no fusion)", flush=True)
        return "aot_eager"
    return "inductor"


def profile_into(directory: str, model: nn.Module, x: torch.Tensor) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    with session(
        schedule=Schedule(wait=1, warmup=1, active=3),
        exporters=["console", TraceFileExporter(directory, keep=1)],
        with_flops=True,  # FLOP/s and MFU under the table
    ) as s:
        for _ in range(5):
            mlp(model, x)
            s.step()  # one step per call


def main() -> int:
    if torch.cuda.is_available():
        device, dtype, tokens, dim, hidden = "cuda", torch.bfloat16, 2048, 4096, 11008
    else:
        device, dtype, tokens, dim, hidden = "cpu", torch.float32, 128, 256, 1024
    torch.manual_seed(0)
    model = GeGLU(dim, hidden).to(device=device, dtype=dtype)
    x = torch.randn(tokens, dim, device=device, dtype=dtype)
    base = os.path.join(Config.from_env().trace_dir, "03_mlp")
    eager_dir, compiled_dir = os.path.join(base, "eager"), os.path.join(base, "compiled")

    with torch.no_grad():
        print(
            f"\nGeGLU MLP {tokens}x{dim} -> {hidden} -> {dim} "
            f"{str(dtype).replace('torch.', '')} on {device}: eager",
            flush=True,
        )
        profile_into(eager_dir, model, x)

        backend = compile_backend(device)
        compiled = torch.compile(model, backend=backend)
        expected = model(x)
        torch.testing.assert_close(compiled(x), expected, rtol=2e-2, atol=2e-2)  # compiles
        print(f"\nthe same MLP, torch.compile(backend={backend!r})", flush=True)
        profile_into(compiled_dir, compiled, x)

    print(f"\n$ torch-profiled diff {eager_dir} {compiled_dir}", flush=True)
    return torch_profiled(["diff", eager_dir, compiled_dir])


if __name__ == "__main__":
    sys.exit(main())
