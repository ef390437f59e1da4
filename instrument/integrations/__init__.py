"""torch-profiled inside the training loops people do not write themselves.

- ``instrument.integrations.hf``: ``ProfiledCallback`` for Hugging Face ``transformers.Trainer``
  (``profile_trainer(trainer)`` puts it where the Trainer's loggers see its metrics).
- ``instrument.integrations.lightning``: ``ProfiledCallback`` for Lightning's ``Trainer``.
- ``instrument.integrations.accelerate``: ``ProfiledLoop`` for a loop around an ``Accelerator``.

Each declares a profiler step per training step (so ``PROFILED_*`` windows, sampling, slow
steps and triggers work as in a decorated loop), records the phases of a step as ranges
(``data_wait``, ``forward_backward``, ``optimizer``; Lightning also ``backward``) without
touching the model, and sends per-step metrics (step time, data wait, FLOP/s and MFU where
FLOPs are known) to the framework's own loggers. The phases and the step clock live in
``_core``; only the framework's module imports the framework, so ``import instrument`` (and
this package) never imports transformers, lightning or accelerate.
"""

from __future__ import annotations

__all__: list[str] = []
