"""Training runs in the real frameworks, profiled by ``instrument.integrations``, for
tests/test_integrations_*.py: ``python tests/_frameworks_job.py hf|lightning|lightning_ddp``
(the accelerate loop runs in the test's own process: accelerate has no loop of its own).

Each runs on the CPU with tiny models (a 2-layer GPT-2 built from a config, no download; a
small MLP), takes its ``PROFILED_*`` settings from the environment the test gives it, and
prints one JSON object as its last line: what the framework's loggers got, graph breaks, RSS.
At a step the test names (``FLUSH_AT``; HF ``HF_FLUSH_AT``) a callback of the test's own
waits for the first window's report (``instrument.flush()``), so that the steps after it are
rated by the FLOPs that window counted whatever the machine's load (without it the report
may come after training ends).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import warnings

import torch

from tests._integrations import (
    ACCUMULATE,
    DDP_STEPS,
    FETCH_SIZE,
    FLUSH_AT,
    HF_FLUSH_AT,
    HF_LOG,
    HF_STEPS,
    LIGHTNING_STEPS,
    READINGS,
)

warnings.filterwarnings("ignore")  # the frameworks' own chatter about CPU runs
torch.set_num_threads(1)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def graph_breaks() -> dict:
    from torch._dynamo.utils import counters

    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "graphs": counters["stats"].get("unique_graphs", 0),
    }


# ---------------------------------------------------------------- Hugging Face Trainer


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # (else a warning inside forward breaks the graph)
    return model


class Tokens(torch.utils.data.Dataset):
    """Token sequences; fetching one does a small matrix product, so that the FLOPs inside a
    data wait count the samples fetched in it."""

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> dict:
        torch.ones(FETCH_SIZE, FETCH_SIZE) @ torch.ones(FETCH_SIZE, FETCH_SIZE)
        x = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x}


def hf() -> dict:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import instrument
    from instrument.integrations.hf import profile_trainer

    class WaitForFirstReport(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == HF_FLUSH_AT:
                instrument.flush()

    args = TrainingArguments(
        output_dir="out", max_steps=HF_STEPS, per_device_train_batch_size=1, logging_steps=HF_LOG,
        gradient_accumulation_steps=ACCUMULATE,
        report_to="tensorboard", save_strategy="no", use_cpu=True, disable_tqdm=True,
        torch_compile=True, torch_compile_backend="eager",
    )  # fmt: skip
    trainer = Trainer(
        model=gpt2(), args=args, train_dataset=Tokens(), callbacks=[WaitForFirstReport()]
    )
    profile_trainer(trainer)
    trainer.train()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: dict[str, int] = {}
    for path in glob.glob("**/events.out.tfevents.*", recursive=True):
        acc = EventAccumulator(path)
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            tags[tag] = tags.get(tag, 0) + len(acc.Scalars(tag))
    return {
        "log_history": trainer.state.log_history,
        # the Trainer's own FLOPs of one micro-batch (6 x parameters x tokens)
        "declared_per_micro_batch": trainer.floating_point_ops({"input_ids": torch.zeros(1, 32)}),
        "tensorboard": tags,
        "callbacks": [type(c).__name__ for c in trainer.callback_handler.callbacks],
        **graph_breaks(),
    }


# ---------------------------------------------------------------- Lightning


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def lightning_module(compile_net: bool):
    import lightning.pytorch as pl

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()
            self.run_net = torch.compile(self.net, backend="eager") if compile_net else self.net
            # what ThroughputMonitor reads: forward + backward of the two matrix products
            self.flops_per_batch = 3 * 2 * 4 * (32 * 64 + 64 * 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.run_net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Regression()


def lightning_trainer(steps: int, callbacks: list, **kwargs):
    import lightning.pytorch as pl

    return pl.Trainer(
        max_steps=steps, callbacks=callbacks, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", **kwargs,
    )  # fmt: skip


def regression_data(n: int = 4096):
    g = torch.Generator().manual_seed(1)
    ds = torch.utils.data.TensorDataset(torch.randn(n, 32, generator=g), torch.randn(n, 1))
    return torch.utils.data.DataLoader(ds, batch_size=4)


def rank_from_strategy() -> dict:
    """What ``ProfiledCallback.setup`` sets where neither torch.distributed nor a launcher
    variable says the rank: a Trainer of 2 nodes x 2 processes, as node 1's first process
    (``NODE_RANK=1``); the variables are removed again."""
    from instrument.integrations.lightning import ProfiledCallback

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(var, None)
    os.environ["NODE_RANK"] = "1"
    trainer = lightning_trainer(1, [], strategy="ddp", devices=2, num_nodes=2, logger=False)
    ProfiledCallback().setup(trainer, None, "fit")
    del os.environ["NODE_RANK"]
    return {var: os.environ.pop(var, None) for var in ("RANK", "WORLD_SIZE")}


def lightning() -> dict:
    """800 steps (the first 50 are what the other frameworks' runs do) with a CSV logger;
    RSS and the number of Python objects the collector tracks after steps 200 and 800; then
    the rank a strategy of several processes gives where nothing else does."""
    import csv
    import gc

    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    import instrument
    from instrument.integrations.lightning import ProfiledCallback

    seen: dict[int, tuple[int, int]] = {}

    class Watch(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == FLUSH_AT:
                instrument.flush()
            if trainer.global_step in READINGS:
                gc.collect()
                seen[trainer.global_step] = (rss_bytes(), len(gc.get_objects()))

    trainer = lightning_trainer(
        LIGHTNING_STEPS,
        [ProfiledCallback(), Watch()],
        logger=CSVLogger("logs"),
        log_every_n_steps=50,
    )
    trainer.fit(lightning_module(compile_net=True), regression_data(4 * LIGHTNING_STEPS))
    with open(glob.glob("logs/**/metrics.csv", recursive=True)[0]) as f:
        rows = [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    result = {"csv": rows, "memory": seen, **graph_breaks()}
    # last: the Trainer made there sets Lightning's process-wide rank (rank 2: no logging)
    return {**result, "rank_from_strategy": rank_from_strategy()}


def lightning_ddp() -> dict:
    """Lightning's DDP on the CPU: 2 processes (gloo), a few steps; rank 0 answers (rank 1, a
    copy of this program that Lightning starts, prints nothing; it shares rank 0's output
    pipes, so the test's run ends once both have exited, their reports written)."""
    from instrument.integrations.lightning import ProfiledCallback

    trainer = lightning_trainer(
        DDP_STEPS, [ProfiledCallback()], strategy="ddp", devices=2, logger=False
    )
    trainer.fit(lightning_module(compile_net=False), regression_data(4 * 2 * DDP_STEPS))
    if trainer.global_rank != 0:
        sys.exit(0)
    return {"world_size": trainer.world_size, "steps": trainer.global_step}


if __name__ == "__main__":
    result = {"hf": hf, "lightning": lightning, "lightning_ddp": lightning_ddp}[sys.argv[1]]()
    print(json.dumps(result, default=str), flush=True)
