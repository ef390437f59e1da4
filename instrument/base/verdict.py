"""Verdicts: is a range (or a window) overhead-bound, compute-bound, or CPU-only?

Every threshold lives here. The words are the seed's ("Profiling in PyTorch"):

- **cpu-only**: no device work was launched (a CPU-only run, or a range that only runs
  Python and CPU operators).
- **overhead-bound**: the device idles while the CPU dispatches. The device was busy for less
  than ``OVERHEAD_BOUND_BELOW`` (50%) of the range's wall time, where the wall time runs from
  the range's start to the later of its end and the end of the last kernel it launched.
  matmul+bias at 64x64 on a GPU: a few µs of kernels in ~20 µs of dispatch.
- **compute-bound**: the device was busy for at least that share: the CPU runs ahead and the
  device is the bottleneck (matmul+bias at 4096x4096). When FLOPs are known
  (``with_flops=True``) the verdict also says **compute-heavy** or **memory-heavy**: FLOPs per
  byte of operator inputs at or above the device's ridge point for the FLOPs' dtype (peak
  FLOP/s over memory bandwidth, ``instrument.analysis.peaks``: ~206 for bf16 on an H200) count as
  compute-heavy; below, the kernels mostly move memory. For a device not in that table the
  line is ``COMPUTE_HEAVY_FLOP_PER_BYTE`` (100, between the bf16 ridge points of an A100,
  ~150, and the fp32 ones of current GPUs, ~15).

No torch imports: the CLI applies the same verdicts to saved traces. Times in the reasons
are formatted as in the tables (``instrument.base.formatting``).
"""

from __future__ import annotations

from dataclasses import dataclass

from instrument.base.formatting import format_time_us

__all__ = [
    "COMPUTE_BOUND",
    "COMPUTE_HEAVY_FLOP_PER_BYTE",
    "CPU_ONLY",
    "OVERHEAD_BOUND",
    "OVERHEAD_BOUND_BELOW",
    "Verdict",
    "judge",
]

OVERHEAD_BOUND_BELOW = 0.5
COMPUTE_HEAVY_FLOP_PER_BYTE = 100.0

CPU_ONLY = "cpu-only"
OVERHEAD_BOUND = "overhead-bound"
COMPUTE_BOUND = "compute-bound"


@dataclass(frozen=True)
class Verdict:
    """``kind`` is one of ``cpu-only``, ``overhead-bound``, ``compute-bound``; ``detail`` is
    ``compute-heavy``/``memory-heavy`` when FLOPs are known, else empty; ``reason`` gives the
    numbers behind it."""

    kind: str
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} ({self.detail})" if self.detail else self.kind

    @property
    def short(self) -> str:
        """For narrow table columns: ``overhead``, ``compute``, ``compute/mem``, ``cpu-only``."""
        if self.kind == CPU_ONLY:
            return CPU_ONLY
        base = self.kind.split("-")[0]
        if self.detail == "memory-heavy":
            return base + "/mem"
        if self.detail == "compute-heavy":
            return base + "/flops"
        return base


def judge(
    *,
    device_us: float,
    busy_us: float,
    wall_us: float,
    cpu_us: float,
    flops: int = 0,
    input_bytes: int = 0,
    ridge: float | None = None,
) -> Verdict:
    """The verdict for a range or a window from its numbers (µs, FLOPs, bytes). ``ridge``:
    the device's ridge point for the FLOPs' dtype (FLOP/byte, ``instrument.analysis.peaks``), which
    splits compute-heavy from memory-heavy; None: ``COMPUTE_HEAVY_FLOP_PER_BYTE``."""
    if device_us <= 0.0:
        return Verdict(CPU_ONLY, f"no device work in {format_time_us(cpu_us)} of CPU time")
    share = busy_us / wall_us if wall_us > 0 else 1.0
    numbers = (
        f"device busy {format_time_us(busy_us)} of {format_time_us(wall_us)} wall "
        f"({100 * share:.0f}%), CPU {format_time_us(cpu_us)}"
    )
    detail = ""
    if flops > 0 and input_bytes > 0:
        intensity = flops / input_bytes
        line = COMPUTE_HEAVY_FLOP_PER_BYTE if ridge is None else ridge
        detail = "compute-heavy" if intensity >= line else "memory-heavy"
        numbers += f", {intensity:.0f} FLOP/byte"
        if ridge is not None:
            numbers += f" (the device's ridge: {ridge:.0f})"
    if share < OVERHEAD_BOUND_BELOW:
        return Verdict(
            OVERHEAD_BOUND, numbers + ": the device idles while the CPU dispatches", detail
        )
    return Verdict(COMPUTE_BOUND, numbers + ": the device is the bottleneck", detail)
