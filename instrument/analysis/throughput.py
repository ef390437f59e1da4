"""A report's FLOP/s against what its device could do: peaks, MFU and the device's ridge.

``with_peaks`` fills a ``WindowReport``'s ``peak_tflops``/``peak_source`` from
``instrument.analysis.peaks`` (or ``PROFILED_PEAK_TFLOPS``) and re-judges the compute-heavy /
memory-heavy part of each verdict against the device's own ridge point for the FLOPs' dtype.
The session calls it when it builds a report, the CLI for a report read from a trace: the
analysis itself (in the helper process) knows events, not devices. No torch imports.
"""

from __future__ import annotations

import dataclasses

from ..base.report import FrozenMap, WindowReport
from ..base.verdict import Verdict, judge
from . import peaks

__all__ = ["with_peaks"]


def with_peaks(report: WindowReport, override_tflops: float | None = None) -> WindowReport:
    """``report`` with its device's peaks (none where the device is not known and no override
    is given) and the compute-heavy / memory-heavy part of its verdicts judged against the
    device's ridge points (``COMPUTE_HEAVY_FLOP_PER_BYTE`` where unknown)."""
    peak = peaks.lookup(report.device, override_tflops)

    def ridge(dtype: str) -> float | None:
        return peak.ridge(dtype) if peak is not None else None

    ranges = {
        name: dataclasses.replace(
            r,
            verdict=_judged(
                r.verdict,
                ridge(r.flops_dtype),
                device_us=r.device_time_us,
                busy_us=r.device_busy_us,
                wall_us=r.wall_time_us,
                cpu_us=r.cpu_time_us,
                flops=r.flops,
                input_bytes=r.bytes_moved,
            ),
        )
        for name, r in report.ranges.items()
    }
    verdict = _judged(
        report.verdict,
        ridge(report.flops_dtype),
        device_us=report.self_device_time_total_us,
        busy_us=report.device_busy_us,
        wall_us=report.wall_time_us,
        cpu_us=report.self_cpu_time_total_us,
        flops=report.flops,
        input_bytes=report.bytes_moved,
    )
    return dataclasses.replace(
        report,
        ranges=FrozenMap(ranges),
        verdict=verdict,
        peak_tflops=FrozenMap(peak.tflops if peak is not None else {}),
        peak_source=peak.name if peak is not None else "",
    )


def _judged(
    verdict: Verdict,
    ridge: float | None,
    *,
    device_us: float,
    busy_us: float,
    wall_us: float,
    cpu_us: float,
    flops: int,
    input_bytes: int,
) -> Verdict:
    """A range's or the window's ``verdict`` judged again with the device's ``ridge``, where
    its FLOPs, their input bytes and device work are known (the analysis judged it without
    the device); else ``verdict`` as it was."""
    if not (flops and input_bytes and device_us):
        return verdict
    return judge(
        device_us=device_us,
        busy_us=busy_us,
        wall_us=wall_us,
        cpu_us=cpu_us,
        flops=flops,
        input_bytes=input_bytes,
        ridge=ridge,
    )
