"""What every framework integration shares: the phase ranges of a step, the step clock, the
per-step metrics and the FLOPs they are rated by. No framework is imported here.

A framework's hooks drive one ``Phases``: ``begin_step()`` where the framework starts a step,
``enter``/``leave`` of a phase between its hooks, ``end_step()`` where the step ends, and
``begin_wait()`` once the framework's own work between steps is done (the data wait, up to
the next ``begin_step()``). Each is a ``profiled(...)`` block entered in one hook and left in
a later one, on the same thread, innermost first:

    <fw>.data_wait   <fw>.step (step=True) > <fw>.forward_backward, <fw>.optimizer

so the step block's end is the profiler step's end (windows, sampling, slow steps, triggers
as ``PROFILED_*`` say) and each phase is a range in the window's report and a histogram in
the always-on metrics. The step time the integrations log runs from one step's end to the
next one's (data wait included: what throughput counts); the SDK's own step histogram times
the step block (data wait excluded).

FLOPs come from two places. *Counted*: with ``PROFILED_WITH_FLOPS=1`` each window's report
holds the FLOPs of the matrix products and attention it recorded; ``CountedFlops`` (an
exporter the integrations add to the ambient session) keeps the latest window's FLOPs per
step, and every later step is rated by them: FLOP/s over the step's time, MFU over the
device's dense peak for the FLOPs' dtype (``instrument.peak_tflops``: the reports' table).
*Declared*: what the framework says (the Trainer's ``floating_point_ops``, a LightningModule's
``flops_per_batch``), rated against the same peak.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from exporters import Exporter, ExportResult
from instrument import ProfilerWarning, WindowReport, configure, get_config, peak_tflops, profiled
from instrument.base.warn import warn

__all__ = [
    "COUNTED",
    "PHASES",
    "CountedFlops",
    "Phases",
    "StepMetrics",
    "guarded",
    "listen_for_counted_flops",
    "peak_flops_per_s",
]

PHASES = ("data_wait", "forward_backward", "optimizer")
PREFIX = "profiled/"  # the metrics' names in the frameworks' loggers

F = TypeVar("F", bound=Callable[..., Any])


def guarded(hook: F) -> F:
    """A framework hook of an integration: whatever goes wrong in it costs one warning and
    switches the integration off (its open ranges closed); it never raises into the loop.
    With profiling off when the integration was made (``PROFILED_ENABLED=0``,
    ``configure(enabled=False)``) it does nothing: no ranges, no steps, no metrics."""

    @functools.wraps(hook)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_broken", False) or not self._phases.enabled:
            return None
        try:
            return hook(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - profiling never breaks the training loop
            self._broken = True
            try:
                self._phases.close_all()
            except Exception:  # noqa: BLE001
                pass
            warn(
                f"torch-profiled: {type(self).__name__}.{hook.__name__} failed ({exc!r}); "
                "the integration is off for the rest of this run (training goes on)",
                ProfilerWarning,
            )
            return None

    return wrapper  # type: ignore[return-value]


class Phases:
    """The ranges and the clock of one loop's steps (one thread: the one running the loop)."""

    def __init__(self, framework: str, phases: tuple[str, ...] = PHASES) -> None:
        self.framework = framework
        self._step = profiled(f"{framework}.step", step=True)  # declares steps (no root steps)
        self.enabled: bool = get_config().enabled  # PROFILED_ENABLED, configure(enabled=)
        self._blocks = {p: profiled(f"{framework}.{p}") for p in phases}
        self._open: list[tuple[str, Any]] = []  # open blocks, innermost last
        self._now = time.perf_counter
        self.last_end: float | None = None  # the last step's end (or the loop's start)
        self.wait_from: float | None = None  # where the data wait of the next step began
        self.wait_s = 0.0  # the data wait before the step in progress
        self.steps = 0  # steps ended

    # ---------------------------------------------------------------- blocks

    def is_open(self, name: str) -> bool:
        return any(n == name for n, _ in self._open)

    def enter(self, name: str) -> None:
        """Open the phase ``name`` (once: a phase already open stays as it is)."""
        if self.is_open(name):
            return
        block = self._step if name == "step" else self._blocks[name]
        block.__enter__()
        self._open.append((name, block))

    def leave(self, name: str) -> bool:
        """Close ``name`` and whatever was opened inside it; False where it was not open."""
        if not self.is_open(name):
            return False
        while self._open:
            top, block = self._open.pop()
            block.__exit__(None, None, None)
            if top == name:
                return True
        return True

    def close_all(self) -> None:
        """Close every open block, innermost first (the step's, if open, ends a step)."""
        while self._open:
            _, block = self._open.pop()
            block.__exit__(None, None, None)

    # ---------------------------------------------------------------- steps

    def start(self) -> None:
        """The loop starts: the first step's time and data wait count from here."""
        self.last_end = self.wait_from = self._now()

    def begin_step(self) -> None:
        """A step begins: the data wait before it ends."""
        now = self._now()
        self.wait_s = now - self.wait_from if self.wait_from is not None else 0.0
        self.wait_from = None
        if self.last_end is None:
            self.last_end = now
        self.leave("data_wait")
        self.enter("step")

    def end_step(self) -> tuple[float, float] | None:
        """The step ends (its block closes: a profiler step ends): ``(step time from the last
        step's end, data wait)``, or None where no step was open."""
        if not self.leave("step"):
            return None
        now = self._now()
        took = now - self.last_end if self.last_end is not None else 0.0
        self.last_end = now
        self.steps += 1
        return took, self.wait_s

    def begin_wait(self) -> None:
        """The framework's work between steps is done: the data wait begins now."""
        self.wait_from = self._now()
        if "data_wait" in self._blocks:
            self.enter("data_wait")

    def mark_wait(self) -> None:
        """The data wait starts again from now (work inside the gap that is not data: a
        validation run), the range left as it is."""
        self.wait_from = self._now()


# -------------------------------------------------------------------- FLOPs


@dataclass(frozen=True)
class Counted:
    """The latest window's FLOPs per recorded step and what to rate them by."""

    flops_per_step: float
    dtype: str  # "bf16", ... ("" unknown)
    peak_flops_per_s: float | None  # the window's device's dense peak for ``dtype``
    window: int


class CountedFlops(Exporter):
    """An exporter that keeps the FLOPs per step of the latest window that counted some
    (``PROFILED_WITH_FLOPS=1``): the window's FLOPs (every thread, backward included) over
    its recorded steps."""

    def __init__(self) -> None:
        self.latest: Counted | None = None

    def export(self, report: WindowReport) -> ExportResult:
        if report.flops and report.steps:
            dtype = report.flops_dtype
            self.latest = Counted(
                report.flops / len(report.steps),
                dtype,
                report.peak_flops_per_s(dtype),
                report.window,
            )
        return ExportResult.SUCCESS

    def __repr__(self) -> str:
        return "CountedFlops()"


COUNTED = CountedFlops()
_listen_lock = threading.Lock()


def listen_for_counted_flops() -> None:
    """With FLOP counting on in the ambient configuration, add ``COUNTED`` to its exporters
    (``configure()``: an ambient window open now ends there, as ``configure()`` says). Not
    where profiling is off, no exporter takes windows (none would open), or it is there.
    A run starts here: an earlier run's count (another model's, in this process) is
    forgotten."""
    with _listen_lock:
        COUNTED.latest = None
        config = get_config()
        if not (config.enabled and config.with_flops):
            return
        names = list(config.exporters)
        if any(e is COUNTED for e in names) or not any(_takes_windows(e) for e in names):
            return
        configure(exporters=[*names, COUNTED])


def _takes_windows(exporter: Any) -> bool:
    if isinstance(exporter, str):
        return exporter.strip().lower() not in ("prometheus", "none", "")
    return bool(getattr(exporter, "takes_windows", True))


def peak_flops_per_s(device: str, dtype: str) -> float | None:
    """The dense peak of the device named ``device`` for ``dtype`` (``PROFILED_PEAK_TFLOPS``
    first, as in the reports); None: unknown."""
    tflops = peak_tflops(device).get(dtype) if dtype else None
    return tflops * 1e12 if tflops else None


def device_name(device: Any) -> str:
    """torch's name for ``device`` (a CUDA device the framework already uses), else its
    type ("cpu")."""
    kind = getattr(device, "type", str(device))
    if kind == "cuda":
        import torch

        try:
            return str(torch.cuda.get_device_name(device))
        except Exception:  # noqa: BLE001
            return kind
    return str(kind)


# -------------------------------------------------------------------- metrics


class StepMetrics:
    """Step times and data waits since the last ``take()``, rated by the FLOPs known then."""

    def __init__(self) -> None:
        self.steps = 0
        self.time_s = 0.0
        self.wait_s = 0.0
        self._peaks: dict[tuple[str, str], float | None] = {}  # (device, dtype) -> peak

    def _peak(self, device: str, dtype: str) -> float | None:
        key = (device, dtype)
        if key not in self._peaks:  # (reading the configuration each step would cost)
            self._peaks[key] = peak_flops_per_s(device, dtype)
        return self._peaks[key]

    def add(self, took: float, wait: float) -> None:
        self.steps += 1
        self.time_s += took
        self.wait_s += wait

    def take(
        self,
        *,
        declared_flops_per_step: float | None = None,
        declared_dtype: str = "",
        device: str = "",
    ) -> dict[str, float]:
        """The means since the last call (then reset); {} when no step ended meanwhile.

        ``profiled/step_time_s``, ``profiled/data_wait_s``; with counted FLOPs
        ``profiled/flops_per_step``, ``profiled/flops_per_s`` and, where the peak is known,
        ``profiled/mfu``; with the framework's own FLOPs ``profiled/declared_flops_per_s`` and
        ``profiled/declared_mfu``."""
        steps, time_s, wait_s = self.steps, self.time_s, self.wait_s
        self.steps, self.time_s, self.wait_s = 0, 0.0, 0.0
        if not steps:
            return {}
        out = {f"{PREFIX}step_time_s": time_s / steps, f"{PREFIX}data_wait_s": wait_s / steps}
        if time_s <= 0:
            return out
        counted = COUNTED.latest
        if counted is not None:
            rate = counted.flops_per_step * steps / time_s
            out[f"{PREFIX}flops_per_step"] = counted.flops_per_step
            out[f"{PREFIX}flops_per_s"] = rate
            peak = counted.peak_flops_per_s or self._peak(device, counted.dtype)
            if peak:
                out[f"{PREFIX}mfu"] = rate / peak
        if declared_flops_per_step:
            rate = declared_flops_per_step * steps / time_s
            out[f"{PREFIX}declared_flops_per_s"] = rate
            dtype = counted.dtype if counted is not None and counted.dtype else declared_dtype
            peak = self._peak(device, dtype)
            if peak:
                out[f"{PREFIX}declared_mfu"] = rate / peak
        return out
