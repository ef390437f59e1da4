"""Lightning: a callback that profiles ``Trainer.fit``'s own loop.

    from instrument.integrations.lightning import ProfiledCallback

    trainer = L.Trainer(max_steps=1000, callbacks=[ProfiledCallback()])
    trainer.fit(model, train_loader)

Steps: each training batch (``on_train_batch_start`` .. ``on_train_batch_end``) is a profiler
step, so ``PROFILED_*`` (schedule, every, sampling, slow step, trigger) open windows at
Lightning's batches: the SDK's step 0 is the first batch this ``fit()`` runs (with
``accumulate_grad_batches=N``, N steps per optimizer step). Phases, as ranges:

- ``lightning.forward_backward``: ``on_train_batch_start`` .. ``on_before_optimizer_step``
  (or the batch's end where no optimizer step runs: gradient accumulation);
- ``lightning.backward`` inside it: ``on_before_backward`` .. ``on_after_backward``;
- ``lightning.optimizer``: ``on_before_optimizer_step`` .. ``on_train_batch_end``;
- ``lightning.data_wait``: ``on_train_batch_end`` .. the next ``on_train_batch_start``: the
  DataLoader fetch and what Lightning does between batches (loggers, the batch-end hooks of
  callbacks after this one); a validation run in between is left out (its gap holds two
  ``data_wait`` ranges, and the metric counts only the part after it);
- ``lightning.step``: ``on_train_batch_start`` .. ``on_train_batch_end``.

Metrics, logged with ``pl_module.log_dict`` at the batches the Trainer's loggers write (its
``log_every_n_steps``), as means over the batches since the last of them:
``profiled/step_time_s`` (end of one batch to the end of the next, data wait included),
``profiled/data_wait_s``; with ``PROFILED_WITH_FLOPS=1``, once a window has counted FLOPs,
``profiled/flops_per_step``, ``profiled/flops_per_s`` and ``profiled/mfu``; where the
LightningModule has ``flops_per_batch`` (what ``ThroughputMonitor`` reads),
``profiled/declared_flops_per_s`` and ``profiled/declared_mfu``.

Ranks: the SDK reads the rank from torch.distributed, which Lightning's DDP strategies start
before any hook runs. A strategy of several processes that does not (so no launcher variable
says it either) gets ``RANK``/``WORLD_SIZE`` set from the strategy's global rank and world
size at ``setup``, for the reports and trace file names.
"""

from __future__ import annotations

import os
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - the standalone package instead
    try:
        import pytorch_lightning as pl
    except ImportError as exc:
        raise ImportError(
            "instrument.integrations.lightning needs lightning: "
            "pip install 'torch-profiled[lightning]'"
        ) from exc

from ._core import Phases, StepMetrics, device_name, guarded, listen_for_counted_flops

__all__ = ["ProfiledCallback"]

_DTYPES = {"bf16": "bf16", "16": "fp16", "64": "fp64", "32": "fp32"}


def _dtype(precision: Any) -> str:
    """Lightning's precision setting ("bf16-mixed", "16-mixed", "32-true", ...) as a dtype
    name of the peak table."""
    return _DTYPES.get(str(precision).split("-")[0], "fp32")


class ProfiledCallback(pl.Callback):
    """Profiler steps, phase ranges and per-step metrics for Lightning's ``Trainer.fit``."""

    def __init__(self) -> None:
        super().__init__()
        self._phases = Phases(
            "lightning", ("data_wait", "forward_backward", "backward", "optimizer")
        )
        self._metrics = StepMetrics()
        self._broken = False
        self._device = "cpu"
        self._dtype = "fp32"

    @guarded
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        world = int(getattr(trainer, "world_size", 1) or 1)
        if world > 1 and "RANK" not in os.environ and not _distributed():
            os.environ["RANK"] = str(int(trainer.global_rank))
            os.environ.setdefault("WORLD_SIZE", str(world))

    @guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        listen_for_counted_flops()
        self._device = device_name(trainer.strategy.root_device)
        self._dtype = _dtype(trainer.precision)
        self._metrics = StepMetrics()
        self._phases.start()

    @guarded
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._phases.begin_wait()

    @guarded
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._phases.begin_step()
        self._phases.enter("forward_backward")

    @guarded
    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._phases.is_open("forward_backward"):
            self._phases.enter("backward")

    @guarded
    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._phases.leave("backward")

    @guarded
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._phases.is_open("step"):
            self._phases.leave("forward_backward")
            self._phases.enter("optimizer")

    @guarded
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        ended = self._phases.end_step()
        if ended is not None:
            self._metrics.add(*ended)
            if _logs_now(trainer):
                self._log(pl_module)
        self._phases.begin_wait()

    def _log(self, pl_module: Any) -> None:
        declared = getattr(pl_module, "flops_per_batch", None)
        metrics = self._metrics.take(
            declared_flops_per_step=declared if isinstance(declared, (int, float)) else None,
            declared_dtype=self._dtype,
            device=self._device,
        )
        if metrics:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, logger=True, batch_size=1)

    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._phases.leave("data_wait")

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking and self._phases.last_end is not None:
            if not self._phases.is_open("step"):
                self._phases.begin_wait()

    @guarded
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._phases.close_all()  # no batch follows in this epoch (nor a step left open by
        # a module whose on_train_batch_start returned -1)

    @guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._phases.close_all()

    @guarded
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._phases.close_all()


def _logs_now(trainer: Any) -> bool:
    """Lightning's loggers write at this batch (its ``log_every_n_steps``, or the last batch):
    ``self.log`` costs ~0.3 ms a value, so the metrics are logged only then, as means over the
    batches since the last time. ``ThroughputMonitor`` asks the same private property."""
    connector = getattr(trainer, "_logger_connector", None)
    return bool(getattr(connector, "should_update_logs", True))


def _distributed() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())
