"""The last rung: a training loop that stays profiled, with the sampling chosen from outside.

    python examples/06_training_loop.py                              # one window (steps 1-3)
    PROFILED_EVERY=100 python examples/06_training_loop.py --steps 400  # windows at 0, 100, ...
    python examples/06_training_loop.py --modules                    # also a range per block

The code holds one decorator, ``@profiled("train_step", step=True)``, and three named phases;
everything else comes from the environment (``PROFILED_*``): which steps are recorded, what is
exported, or ``PROFILED_ENABLED=0`` for nothing at all. Each return of ``train_step`` ends a
step.

The model is a residual MLP classifier (LayerNorm + GeGLU blocks) learning labels from a fixed
random teacher network, trained with AdamW, so the loss really falls. On a GPU: batch 4096, width
2048, 4 blocks, bf16 autocast. On a CPU: batch 64, width 64, 2 blocks, fp32.

Traces go to ``./runs/06_training_loop`` unless ``PROFILED_TRACE_DIR`` says otherwise: a
TensorBoard run directory (``tensorboard --logdir runs`` with the ``torch-tb-profiler`` plugin
lists every window), and each file opens in Holistic Trace Analysis (``TraceAnalysis`` on a
directory holding one rank's file), Perfetto and ``chrome://tracing``. ``bench/e2e_overhead.py``
times this loop unprofiled, decorated-but-idle and sampled.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from instrument import instrument_module, profiled

os.environ.setdefault("PROFILED_TRACE_DIR", os.path.join("runs", "06_training_loop"))

GPU = dict(batch=4096, width=2048, blocks=4, classes=1000, steps=300)
CPU = dict(batch=64, width=64, blocks=2, classes=10, steps=40)


class Block(nn.Module):
    """x + down(gelu(gate(norm(x))) * up(norm(x)))"""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.gate = nn.Linear(width, 4 * width, bias=False)
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.gelu(self.gate(h), approximate="tanh") * self.up(h))


class Classifier(nn.Module):
    def __init__(self, width: int, blocks: int, classes: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width) for _ in range(blocks)))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


class Task:
    """Random inputs labelled by a fixed random teacher network: a learnable problem.

    A pool of batches is made on the device once and cycled, so the loop times the training
    step, not the making of data."""

    def __init__(self, width: int, classes: int, batch: int, device: str, pool: int = 16) -> None:
        g = torch.Generator(device="cpu").manual_seed(1)  # the same data on every device
        teacher = torch.randn(width, classes, generator=g).to(device)
        self.x = torch.randn(pool, batch, width, generator=g).to(device)
        self.y = (self.x @ teacher).argmax(dim=-1)

    def batch_at(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i % len(self.x)], self.y[i % len(self.y)]


def build(device: str, sizes: dict) -> tuple[nn.Module, torch.optim.Optimizer, Task]:
    torch.manual_seed(0)
    model = Classifier(sizes["width"], sizes["blocks"], sizes["classes"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, Task(sizes["width"], sizes["classes"], sizes["batch"], device)


def autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")


@profiled("train_step", step=True)
def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    with profiled("forward"), autocast(x.device.type):
        loss = F.cross_entropy(model(x), y)
    with profiled("backward"):
        loss.backward()
    with profiled("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss.detach()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="training steps (default: 300 GPU, 40 CPU)")
    parser.add_argument(
        "--modules",
        action="store_true",
        help="instrument_module(model, depth=2): a range per block and layer",
    )
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device, sizes = ("cuda", GPU) if cuda else ("cpu", CPU)
    steps = args.steps or sizes["steps"]
    model, opt, task = build(device, sizes)
    if args.modules:
        instrument_module(model, prefix="model", depth=2)
    print(
        f"training {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters on "
        f"{device}, batch {sizes['batch']}, {steps} steps",
        flush=True,
    )
    t0 = time.perf_counter()
    first = last = None
    for i in range(steps):
        x, y = task.batch_at(i)
        loss = train_step(model, opt, x, y)
        if i == 0:
            first = loss.item()
    last = loss.item()
    took = time.perf_counter() - t0
    print(f"loss {first:.3f} -> {last:.3f}; {steps / took:.1f} steps/s", flush=True)


if __name__ == "__main__":
    main()
