"""Hugging Face accelerate: profile a training loop around an ``Accelerator``.

accelerate has no callbacks; the loop is yours. ``ProfiledLoop`` wraps its batches:

    from instrument.integrations.accelerate import ProfiledLoop

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loop = ProfiledLoop(accelerator, optimizer)
    for batch in loop(loader):                 # a profiler step per batch
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

Steps: each batch is a profiler step, from the batch's arrival to the request for the next
one, so ``PROFILED_*`` open windows at the loop's batches. Phases, as ranges:
``accelerate.data_wait`` (fetching the batch: the DataLoader's ``next()``),
``accelerate.forward_backward`` (the batch's arrival .. the optimizer's step, or the batch's end
where no step runs: gradient accumulation), ``accelerate.optimizer`` (the wrapped torch
optimizer's step, from torch's optimizer step hooks: nothing of accelerate's is patched), and
``accelerate.step``. Every ``log_every`` steps the means (``profiled/step_time_s``,
``profiled/data_wait_s``; FLOP/s and MFU as the other integrations give them, counted with
``PROFILED_WITH_FLOPS=1`` and declared with ``flops_per_step=``) go to ``accelerator.log``
where trackers were started (``init_trackers``), and to ``loop.last_metrics``.

Without this helper, one line does the steps: decorate the body of the loop, ``@profiled(
"train_step", step=True)``, and call it per batch (no phases, no metrics of the loop).

accelerate's ``ProfileKwargs`` + ``accelerator.profile()`` run one torch.profiler with one
schedule for the block it wraps, and hand you the profiler. torch-profiled instead keeps
profiling on for the whole run and opens its windows from ``PROFILED_*`` (sampling, slow
steps, triggers), with reports and exporters. Use one or the other: while a profiler of yours
runs (``accelerator.profile()``'s), the SDK starts none and its ranges appear in yours.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

try:
    import accelerate  # noqa: F401 - the extra this helper belongs to
except ImportError as exc:  # pragma: no cover - accelerate is not installed
    raise ImportError(
        "instrument.integrations.accelerate needs accelerate: pip install 'torch-profiled[hf]'"
    ) from exc

from ._core import Phases, StepMetrics, device_name, guarded, listen_for_counted_flops

__all__ = ["ProfiledLoop"]

_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}


class ProfiledLoop:
    """Profiler steps, phase ranges and metrics for a loop over batches (see the module)."""

    def __init__(
        self,
        accelerator: Any = None,
        optimizer: Any = None,
        *,
        log_every: int = 10,
        flops_per_step: float | None = None,
    ) -> None:
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
            raise ValueError(f"log_every must be an integer >= 1, got {log_every!r}")
        self.accelerator = accelerator
        self.log_every = log_every
        self.flops_per_step = flops_per_step
        self.last_metrics: dict[str, float] = {}
        self._phases = Phases("accelerate")
        self._metrics = StepMetrics()
        self._broken = False
        self._hooks: list[Any] = []
        if optimizer is not None:
            self.watch(optimizer)

    def watch(self, optimizer: Any) -> None:
        """Time ``optimizer``'s steps as the ``optimizer`` phase (torch's step hooks on the
        optimizer that accelerate wraps)."""
        inner = getattr(optimizer, "optimizer", optimizer)
        self._hooks.append(inner.register_step_pre_hook(self._before_optimizer))
        self._hooks.append(inner.register_step_post_hook(self._after_optimizer))

    def remove(self) -> None:
        """Remove the optimizer hooks."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        """The batches of ``batches``, each one a profiler step."""
        self._begin()
        it = iter(batches)  # (a DataLoader's workers start here: the first data wait)
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    return
                self._step_begins()
                yield batch
                self._step_ends()
        finally:
            self._close()

    # ---------------------------------------------------------------- hooks

    @guarded
    def _begin(self) -> None:
        listen_for_counted_flops()
        self._phases.start()
        self._phases.begin_wait()

    @guarded
    def _step_begins(self) -> None:
        self._phases.begin_step()
        self._phases.enter("forward_backward")

    @guarded
    def _before_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._phases.is_open("step"):
            self._phases.leave("forward_backward")
            self._phases.enter("optimizer")

    @guarded
    def _after_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._phases.leave("optimizer")

    @guarded
    def _step_ends(self) -> None:
        ended = self._phases.end_step()
        if ended is not None:
            self._metrics.add(*ended)
            if self._metrics.steps >= self.log_every:
                self._log()
        self._phases.begin_wait()

    @guarded
    def _close(self) -> None:
        self._phases.close_all()

    def _log(self) -> None:
        acc = self.accelerator
        metrics = self._metrics.take(
            declared_flops_per_step=self.flops_per_step,
            declared_dtype=_DTYPES.get(str(getattr(acc, "mixed_precision", "")), "fp32"),
            device=device_name(getattr(acc, "device", "cpu")),
        )
        if not metrics:
            return
        self.last_metrics = metrics
        if acc is not None and getattr(acc, "trackers", None):
            acc.log(metrics, step=self._phases.steps)
