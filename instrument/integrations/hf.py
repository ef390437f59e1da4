"""Hugging Face ``transformers.Trainer``: a callback that profiles the Trainer's own loop.

    from instrument.integrations.hf import profile_trainer

    trainer = Trainer(model=model, args=args, train_dataset=train)
    profile_trainer(trainer)          # or Trainer(..., callbacks=[ProfiledCallback()])
    trainer.train()

Steps: each optimizer step of the Trainer (``on_step_begin`` .. ``on_step_end``) is a profiler
step, so ``PROFILED_*`` (schedule, every, sampling, slow step, trigger) open windows at the
Trainer's steps: the SDK's step 0 is the first step this ``train()`` runs. Phases, as ranges:

- ``hf.forward_backward``: one per micro-batch: ``on_step_begin`` or the last
  ``on_substep_end`` .. the next ``on_substep_end`` or ``on_pre_optimizer_step`` (with
  gradient accumulation, N of them a step; the last one holds gradient clipping);
- ``hf.optimizer``: ``on_pre_optimizer_step`` .. ``on_optimizer_step``;
- ``hf.data_wait``: from the end of the Trainer's work after a step (its ``on_step_end``, or
  the ``on_log``/``on_evaluate``/``on_save`` that logging, evaluation and checkpointing end
  with) to the next ``on_step_begin``: the DataLoader fetch of the next step's batches;
- ``hf.step``: ``on_step_begin`` .. ``on_step_end``.

Metrics go into the Trainer's logs at each ``on_log`` (means over the steps since the last
log): ``profiled/step_time_s`` (end of one step to the end of the next, data wait included),
``profiled/data_wait_s``; with ``PROFILED_WITH_FLOPS=1``, once a window has counted FLOPs,
``profiled/flops_per_step``, ``profiled/flops_per_s`` and ``profiled/mfu``; and from the
Trainer's own estimate (``floating_point_ops``: 6 x parameters without embeddings x input
tokens) ``profiled/declared_flops_per_s`` and ``profiled/declared_mfu``. The Trainer's loggers
(``report_to``) run before callbacks passed in ``callbacks=``: ``profile_trainer(trainer)``
places the callback right after ``DefaultFlowCallback``, ahead of them.
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import DefaultFlowCallback, TrainerCallback
except ImportError as exc:  # pragma: no cover - the hf extra is not installed
    raise ImportError(
        "instrument.integrations.hf needs transformers (and accelerate, which its Trainer "
        "uses): pip install 'torch-profiled[hf]'"
    ) from exc

from instrument import ProfilerWarning
from instrument.base.warn import warn

from ._core import Phases, StepMetrics, device_name, guarded, listen_for_counted_flops

__all__ = ["ProfiledCallback", "profile_trainer"]


class ProfiledCallback(TrainerCallback):
    """Profiler steps, phase ranges and per-step metrics for ``transformers.Trainer``."""

    def __init__(self) -> None:
        self._phases = Phases("hf")
        self._metrics = StepMetrics()
        self._broken = False
        self._placed = False  # put ahead of the loggers by profile_trainer
        self._device = "cpu"
        self._dtype = "fp32"
        self._world = 1
        self._flos_at = 0.0  # the Trainer's total_flos at the last log

    @guarded
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        listen_for_counted_flops()
        self._device = device_name(args.device)
        self._dtype = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
        self._world = max(1, int(args.world_size))
        self._flos_at = float(state.total_flos)
        self._metrics = StepMetrics()
        if args.report_to and not self._placed:
            warn(
                "torch-profiled: ProfiledCallback was passed in callbacks=, after the "
                f"Trainer's loggers (report_to={args.report_to}), which so do not get its "
                "metrics (trainer.state.log_history does); call "
                "instrument.integrations.hf.profile_trainer(trainer) instead",
                ProfilerWarning,
            )
        self._phases.start()

    @guarded
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.begin_wait()  # the epoch's first batches (and the DataLoader's start)

    @guarded
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.begin_step()
        self._phases.enter("forward_backward")

    @guarded
    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A micro-batch of a gradient-accumulation step ends (not the last: that one ends at
        ``on_pre_optimizer_step``): the next one's ``forward_backward`` begins."""
        if self._phases.leave("forward_backward"):
            self._phases.enter("forward_backward")

    @guarded
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.leave("forward_backward")
        self._phases.enter("optimizer")

    @guarded
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.leave("optimizer")

    @guarded
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ended = self._phases.end_step()
        if ended is not None:
            self._metrics.add(*ended)
        self._wait_if_done(control)

    @guarded
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if isinstance(logs, dict) and not any(k.startswith(("eval_", "test_")) for k in logs):
            self._log_into(logs, state)
        self._after_gap_work(control)

    @guarded
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._after_gap_work(control)

    @guarded
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._after_gap_work(control)

    @guarded
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.close_all()  # the epoch's data ran out: no step follows

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.close_all()

    # ---------------------------------------------------------------- helpers

    def _wait_if_done(self, control: Any) -> None:
        """The data wait begins once the Trainer has done what this step asked of it
        (``DefaultFlowCallback`` set the flags; each is cleared as its work ends)."""
        if control.should_training_stop or control.should_epoch_stop:
            return  # no next step in this epoch
        if control.should_log or control.should_evaluate or control.should_save:
            return  # on_log / on_evaluate / on_save come first
        self._phases.begin_wait()

    def _after_gap_work(self, control: Any) -> None:
        if self._phases.is_open("step") or self._phases.is_open("data_wait"):
            return  # (evaluate() called from inside a step, or the wait already began)
        if self._phases.last_end is not None:
            self._wait_if_done(control)

    def _log_into(self, logs: dict[str, Any], state: Any) -> None:
        steps = self._metrics.steps
        flos = float(state.total_flos)  # summed over processes, up to this log
        declared = (flos - self._flos_at) / self._world / steps if steps else None
        metrics = self._metrics.take(
            declared_flops_per_step=declared if declared and declared > 0 else None,
            declared_dtype=self._dtype,
            device=self._device,
        )
        if not metrics:
            return
        self._flos_at = flos
        logs.update(metrics)
        history = getattr(state, "log_history", None)
        if history and isinstance(history[-1], dict):
            history[-1].update(metrics)  # (the Trainer stored a copy of logs before on_log)


def profile_trainer(trainer: Any, callback: ProfiledCallback | None = None) -> ProfiledCallback:
    """Add ``callback`` (a new ``ProfiledCallback`` by default) to ``trainer`` right after its
    ``DefaultFlowCallback`` (whose step flags it reads), ahead of the loggers ``report_to``
    added, so that they get its metrics; returns it. An instance already there is moved."""
    cb = callback if callback is not None else ProfiledCallback()
    handler = trainer.callback_handler
    callbacks = [c for c in handler.callbacks if c is not cb]
    flow = [i for i, c in enumerate(callbacks) if isinstance(c, DefaultFlowCallback)]
    callbacks.insert(flow[-1] + 1 if flow else 0, cb)
    handler.callbacks[:] = callbacks
    cb._placed = True
    return cb
