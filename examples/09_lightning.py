"""Lightning, profiled by one callback, beside Lightning's own ThroughputMonitor.

    python examples/09_lightning.py                                 # one window (steps 1-3)
    PROFILED_EVERY=100 python examples/09_lightning.py --steps 400  # windows at 0, 100, ...

``instrument.integrations.lightning.ProfiledCallback`` makes each training batch a profiler
step (``PROFILED_*`` choose which are recorded), records its phases as ranges
(``lightning.data_wait``, ``lightning.forward_backward`` with ``lightning.backward`` inside,
``lightning.optimizer``), and logs each step's time, data wait and, with FLOP counting on (set
here unless ``PROFILED_WITH_FLOPS`` says otherwise), FLOP/s and MFU through ``self.log`` to
the Trainer's loggers. ``ThroughputMonitor`` needs the FLOPs of a batch from you
(``flops_per_batch``, measured here with Lightning's ``measure_flops`` on a meta-device copy);
the callback counts them in its windows, and rates ``flops_per_batch`` too (``declared``):
the last lines put the three side by side.

The model is a small decoder-only transformer in plain PyTorch learning token sequences that
follow a fixed rule. On a GPU: 8 layers, width 768, sequences of 512, batch 16, bf16-mixed.
On a CPU: 2 layers, width 64, sequences of 64, batch 8, fp32 (no peak is known for a CPU, so
no MFU unless ``PROFILED_PEAK_TFLOPS`` gives one; ThroughputMonitor gives none there).
Needs the ``lightning`` extra: ``pip install -c constraints.txt -e '.[lightning]'``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from typing import Any

os.environ.setdefault("PROFILED_WITH_FLOPS", "1")

import torch
import torch.nn.functional as F
from torch import nn

try:
    import lightning.pytorch as L
    from lightning.fabric.utilities.throughput import measure_flops
    from lightning.pytorch.callbacks import ThroughputMonitor
    from lightning.pytorch.loggers import Logger
except ImportError as exc:
    sys.exit(
        f"examples/09_lightning.py needs lightning ({exc}): "
        "pip install -c constraints.txt -e '.[lightning]'; nothing was run"
    )

from instrument.integrations.lightning import ProfiledCallback

GPU = dict(layers=8, width=768, heads=12, vocab=8192, seq=512, batch=16, steps=300, window=50)
CPU = dict(layers=2, width=64, heads=4, vocab=256, seq=64, batch=8, steps=60, window=10)


class DecoderLM(nn.Module):
    """Token and position embeddings, pre-norm causal transformer layers, a linear head."""

    def __init__(self, s: dict) -> None:
        super().__init__()
        self.tokens = nn.Embedding(s["vocab"], s["width"])
        self.positions = nn.Embedding(s["seq"], s["width"])
        layer = nn.TransformerEncoderLayer(
            s["width"], s["heads"], 4 * s["width"], dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, s["layers"], enable_nested_tensor=False)
        self.head = nn.Linear(s["width"], s["vocab"], bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        h = self.layers(self.tokens(x) + self.positions(pos), mask=mask, is_causal=True)
        return self.head(h)


class LitLM(L.LightningModule):
    def __init__(self, sizes: dict) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.sizes = sizes
        self.model = DecoderLM(sizes)
        self.flops_per_batch = batch_flops(sizes)  # what ThroughputMonitor reads

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self.model(batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def batch_flops(sizes: dict) -> int:
    """Forward and backward FLOPs of one batch, counted on a meta-device copy (no memory,
    no time): Lightning's ``measure_flops``, torch's FlopCounterMode underneath."""
    with torch.device("meta"):
        model = DecoderLM(sizes)
        x = torch.zeros(sizes["batch"], sizes["seq"] - 1, dtype=torch.long)
    return int(measure_flops(model, lambda: model(x), loss_fn=lambda logits: logits.sum()))


class RuleTokens(torch.utils.data.Dataset):
    """Each token is the last one plus 3 (mod vocab): the next token is learnable."""

    def __init__(self, vocab: int, seq: int, samples: int) -> None:
        self.vocab, self.seq, self.samples = vocab, seq, samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> torch.Tensor:
        return (i * 7919 + 3 * torch.arange(self.seq)) % self.vocab


class Collect(Logger):
    """Keeps every metric the loggers get, for the lines at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, dict[str, float]] = {}

    @property
    def name(self) -> str:
        return "collect"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.setdefault(step or 0, {}).update(metrics)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="training batches (default: 300 GPU, 60 CPU)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", module="lightning")  # its notes about CPU-only runs
    cuda = torch.cuda.is_available()
    sizes = GPU if cuda else CPU
    steps = args.steps or sizes["steps"]
    data = torch.utils.data.DataLoader(
        RuleTokens(sizes["vocab"], sizes["seq"], steps * sizes["batch"]),
        batch_size=sizes["batch"],
        num_workers=2 if cuda else 0,
    )
    logger = Collect()
    monitor = ThroughputMonitor(lambda batch: batch.shape[0], window_size=sizes["window"])
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            max_steps=steps,
            accelerator="gpu" if cuda else "cpu",
            devices=1,
            precision="bf16-mixed" if cuda else "32-true",
            callbacks=[ProfiledCallback(), monitor],
            logger=logger,
            log_every_n_steps=sizes["window"],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        module = LitLM(sizes)
        print(
            f"training a {sizes['layers']}-layer LM for {steps} batches; flops_per_batch "
            f"(measure_flops, for ThroughputMonitor): {module.flops_per_batch / 1e6:.2f} MFLOP",
            flush=True,
        )
        trainer.fit(module, data)
    print_summary(logger.rows)


def print_summary(rows: dict[int, dict[str, float]]) -> None:
    """Per logged step: the callback's step time, data wait and MFU (counted by its last
    window; declared: ``flops_per_batch``), and ThroughputMonitor's over its window."""
    print(
        "\nstep  step ms  data ms  counted MFU  declared MFU  ThroughputMonitor MFU"
        "  (TFLOP/s: counted, declared, ThroughputMonitor)"
    )
    for step, m in sorted(rows.items()):
        if "profiled/step_time_s" not in m:
            continue
        tm_rate = next((v for k, v in m.items() if k.endswith("device/flops_per_sec")), None)
        tm_mfu = next((v for k, v in m.items() if k.endswith("device/mfu")), None)
        rates = [m.get("profiled/flops_per_s"), m.get("profiled/declared_flops_per_s"), tm_rate]
        print(
            f"{step:4d} {m['profiled/step_time_s'] * 1e3:8.2f} "
            f"{m['profiled/data_wait_s'] * 1e3:8.2f} {_pct(m.get('profiled/mfu')):>12} "
            f"{_pct(m.get('profiled/declared_mfu')):>13} {_pct(tm_mfu):>22}  "
            + ", ".join("-" if r is None else f"{r / 1e12:.3f}" for r in rates),
            flush=True,
        )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


if __name__ == "__main__":
    main()
