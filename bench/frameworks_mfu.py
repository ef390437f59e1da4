"""MFU per step from the framework callbacks against Lightning's ThroughputMonitor (issue 33).

    python bench/frameworks_mfu.py [--steps 300] [--window 100] [--json PATH]   # a CUDA GPU

Two runs of examples/08_trainer.py's GPT-2 at its GPU sizes (12 layers, width 768, sequences
of 512, batch 16, bf16), with FLOP counting on (``PROFILED_WITH_FLOPS=1``; the default
schedule's one window, steps 1-3, counts the FLOPs of a step):

1. Lightning: the model in a LightningModule (bf16-mixed) with ``ThroughputMonitor``
   (``flops_per_batch`` from Lightning's ``measure_flops`` on a meta-device copy) and
   ``instrument.integrations.lightning.ProfiledCallback``, every metric logged at every step.
   Over ThroughputMonitor's last window of ``--window`` batches: its ``device/mfu`` (and
   ``device/flops_per_sec``), and the callback's MFU over the same batches (the window's
   counted FLOPs per step times the batches, over the sum of their step times).
2. The Hugging Face Trainer of example 08 with ``profile_trainer``, logging every
   ``--window`` steps: ``profiled/mfu`` of its last log (the same number of steps).

How each step is timed. ThroughputMonitor: ``torch.cuda.synchronize()`` and
``time.perf_counter()`` at each ``on_train_batch_end``, its rate the FLOPs of the window's last
``window - 1`` batches over the time from the end of its first batch to the end of its last.
The callbacks: ``time.perf_counter()`` at the step's end hook (Lightning's
``on_train_batch_end``, just before ThroughputMonitor's there; the Trainer's ``on_step_end``),
no synchronisation, a step from one end to the next (data wait included): summed over the same
batches that is ThroughputMonitor's interval, up to where the two clocks are read at its ends.
The HF run is another run of another loop (a fused AdamW, the Trainer's default, against the
module's foreach AdamW; gradient clipping; logs every ``--window`` steps, not every step; no
synchronisation each step), so its steps take their own time: its MFU differs from
ThroughputMonitor's by that too (on an H100 its steps were 13% shorter).

The issue's check, "on the same run where both apply": the Lightning run's callback MFU (or
FLOP/s where the peak table lacks the device: Lightning's knows no plain "NVIDIA H200") within
5% of ThroughputMonitor's. The HF run, where ThroughputMonitor does not apply, is checked for
what it shares with it: its counted FLOPs per step within 5% of ``measure_flops``'s (the same
model and batch); its MFU is printed beside the others with its step time against the Lightning
run's. Also the Trainer's own FLOP estimate (``floating_point_ops``: 6 x parameters without
embeddings x tokens), which leaves out attention and the tied LM head. On a CPU it runs at
example 08's CPU sizes (FLOP/s only: no peak; bf16 autocast on the CPU, as on the GPU), to check
that it still works.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("PROFILED_WITH_FLOPS", "1")
os.environ.setdefault("PROFILED_EXPORTERS", "json")
os.environ.setdefault("PROFILED_JSON_PATH", os.path.join(tempfile.gettempdir(), "mfu.jsonl"))

import torch

REPO = Path(__file__).resolve().parent.parent


def _example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ex08 = _example("08_trainer")

import lightning.pytorch as L  # noqa: E402 - after the settings above
from lightning.fabric.utilities.throughput import measure_flops  # noqa: E402
from lightning.pytorch.callbacks import ThroughputMonitor  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import instrument  # noqa: E402
from instrument.integrations._core import COUNTED  # noqa: E402
from instrument.integrations.lightning import ProfiledCallback  # noqa: E402

ex09 = _example("09_lightning")  # (its Collect logger)


FLUSH_AT = 5
"""At this step each run waits for its first window's report (``instrument.flush()``): the FLOPs
it counted rate every step of the compared window (which starts later), however long the
report's analysis takes."""


class WaitForFirstReport(L.Callback):
    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == FLUSH_AT:
            instrument.flush()


class WaitForFirstReportHF(TrainerCallback):
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == FLUSH_AT:
            instrument.flush()


class LitGPT2(L.LightningModule):
    def __init__(self, sizes: dict) -> None:
        super().__init__()
        self.model = ex08.build_model(sizes)
        self.flops_per_batch = gpt2_batch_flops(sizes)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def gpt2_batch_flops(sizes: dict) -> int:
    """Forward + backward FLOPs of a batch, by torch's FlopCounterMode on a meta-device copy."""
    with torch.device("meta"):
        model = ex08.build_model(sizes)
        x = torch.zeros(sizes["batch"], sizes["seq"], dtype=torch.long)
    return int(measure_flops(model, lambda: model(input_ids=x, labels=x).loss, lambda y: y))


def lightning_run(sizes: dict, steps: int, window: int, cuda: bool) -> dict:
    data = torch.utils.data.DataLoader(
        ex08.RuleTokens(sizes["vocab"], sizes["seq"], steps * sizes["batch"]),
        batch_size=sizes["batch"],
        num_workers=2 if cuda else 0,
    )
    logger = ex09.Collect()
    module = LitGPT2(sizes)
    monitor = ThroughputMonitor(lambda b: b["input_ids"].shape[0], window_size=window)
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            max_steps=steps, accelerator="gpu" if cuda else "cpu", devices=1,
            precision="bf16-mixed", logger=logger,
            callbacks=[ProfiledCallback(), monitor, WaitForFirstReport()], log_every_n_steps=1,
            enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=root,
        )  # fmt: skip
        trainer.fit(module, data)
    rows = logger.rows
    last = max(s for s, m in rows.items() if any(k.endswith("device/flops_per_sec") for k in m))
    tm = rows[last]
    # ThroughputMonitor's rate spans the window's last window-1 batches (time from the end
    # of its first batch): the same batches here
    ours = [rows[s] for s in range(last - window + 2, last + 1)]
    counted = ours[-1]["profiled/flops_per_step"]
    step_time = sum(m["profiled/step_time_s"] for m in ours) / len(ours)
    rate = counted / step_time
    peak = ours[-1]["profiled/flops_per_s"] / ours[-1]["profiled/mfu"] if cuda else None
    return {
        "steps": [last - window + 2, last],
        "monitor_mfu": next((v for k, v in tm.items() if k.endswith("device/mfu")), None),
        "monitor_flops_per_s": next(v for k, v in tm.items() if k.endswith("flops_per_sec")),
        "flops_per_batch": module.flops_per_batch,
        "counted_flops_per_step": counted,
        "step_time_s": step_time,
        "callback_flops_per_s": rate,
        "callback_mfu": rate / peak if peak else None,
    }


def hf_run(sizes: dict, steps: int, window: int, cuda: bool) -> dict:
    with tempfile.TemporaryDirectory() as out:
        trainer = ex08.build_trainer(dict(sizes, log=window), steps, out, cuda, bf16=True)
        ex08.profile_trainer(trainer)
        trainer.add_callback(WaitForFirstReportHF())
        trainer.train()
    last = [h for h in trainer.state.log_history if "profiled/step_time_s" in h][-1]
    return {
        "step": last["step"],
        "counted_flops_per_step": last.get("profiled/flops_per_step"),
        "step_time_s": last["profiled/step_time_s"],
        "mfu": last.get("profiled/mfu"),
        "flops_per_s": last.get("profiled/flops_per_s"),
        "declared_mfu": last.get("profiled/declared_mfu"),
        "declared_flops_per_s": last.get("profiled/declared_flops_per_s"),
    }


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def _within(a: float | None, b: float | None, rel: float) -> bool:
    return bool(a and b and abs(a / b - 1) <= rel)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--window", type=int, default=100, help="ThroughputMonitor's window")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.window < 2 or args.steps - args.window + 1 <= FLUSH_AT:
        parser.error(f"the window (at least 2 steps) must start after step {FLUSH_AT}")
    warnings.filterwarnings("ignore", module="lightning")
    cuda = torch.cuda.is_available()
    sizes = ex08.GPU if cuda else ex08.CPU
    print(f"device: {torch.cuda.get_device_name() if cuda else 'cpu'}", flush=True)
    pl_result = lightning_run(sizes, args.steps, args.window, cuda)
    # the HF run: a fresh ambient session (its steps from 0, its own window counts FLOPs)
    instrument.configure()
    COUNTED.latest = None
    hf_result = hf_run(sizes, args.steps, args.window, cuda)
    print(json.dumps({"lightning": pl_result, "hf": hf_result}, indent=2))
    pl, hf = pl_result, hf_result
    tm_mfu, tm_rate = pl["monitor_mfu"], pl["monitor_flops_per_s"]
    declared = pl["flops_per_batch"]
    print(
        f"FLOPs per batch: measure_flops {declared / 1e9:.2f} G, counted by the window "
        f"{pl['counted_flops_per_step'] / 1e9:.2f} G (Lightning run, x"
        f"{_ratio(pl['counted_flops_per_step'], declared)}), "
        f"{(hf['counted_flops_per_step'] or 0) / 1e9:.2f} G (HF run, x"
        f"{_ratio(hf['counted_flops_per_step'], declared)})"
    )
    print(
        f"step time: Lightning run {pl['step_time_s'] * 1e3:.2f} ms, HF run "
        f"{hf['step_time_s'] * 1e3:.2f} ms (x{_ratio(hf['step_time_s'], pl['step_time_s'])})"
    )
    rows = (
        ("ThroughputMonitor (Lightning run)", tm_mfu, tm_rate),
        ("ProfiledCallback (Lightning run)", pl["callback_mfu"], pl["callback_flops_per_s"]),
        ("ProfiledCallback (HF Trainer run)", hf["mfu"], hf["flops_per_s"]),
        ("Trainer's own estimate (HF run)", hf["declared_mfu"], hf["declared_flops_per_s"]),
    )
    for label, mfu, rate in rows:
        shown = f"{mfu * 100:.2f}%" if mfu is not None else "-"
        print(
            f"{label:36s} MFU {shown:>7}  {rate / 1e12:9.3f} TFLOP/s  "
            f"vs ThroughputMonitor: MFU x{_ratio(mfu, tm_mfu)}, FLOP/s x{_ratio(rate, tm_rate)}"
        )
    a, b = (pl["callback_mfu"], tm_mfu) if tm_mfu else (pl["callback_flops_per_s"], tm_rate)
    same_run = _within(a, b, 0.05)
    what = "MFU" if tm_mfu else "FLOP/s (ThroughputMonitor has no peak for this device)"
    print(
        f"check: the callback's {what} within 5% of ThroughputMonitor's in the same "
        f"(Lightning) run: {'PASS' if same_run else 'FAIL'}"
    )
    hf_flops = _within(hf["counted_flops_per_step"], declared, 0.05)
    print(
        "check: the HF run's counted FLOPs per step within 5% of measure_flops: "
        f"{'PASS' if hf_flops else 'FAIL'}"
    )
    ok = same_run and hf_flops
    if args.json:
        args.json.write_text(json.dumps({"lightning": pl_result, "hf": hf_result, "ok": ok}))
    return 0 if ok or not cuda else 1


if __name__ == "__main__":
    sys.exit(main())
