"""A report's FLOP/s against what its device could do: peaks, MFU and the device's ridge.

``with_peaks`` fills a ``WindowReport``'s ``peak_tflops``/``peak_source`` from
``instrument.peaks`` (or ``PROFILED_PEAK_TFLOPS``) and re-judges the compute-heavy /
memory-heavy part of each verdict against the device's own ridge point for the FLOPs' dtype.
The session calls it when it builds a report, the CLI for a report read from a trace: the
analysis itself (in the helper process) knows events, not devices. No torch imports.
"""

from __future__ import annotations

import dataclasses

from . import peaks
from .report import FrozenMap, RangeStats, WindowReport
from .verdict import Verdict, judge

__all__ = ["with_peaks"]


def with_peaks(report: WindowReport, override_tflops: float | None = None) -> WindowReport:
    """``report`` with its device's peaks and verdicts judged against its ridge points
    (unchanged where the device is not known and no override is given)."""
    peak = peaks.lookup(report.device, override_tflops)
    if peak is None:
        return report
    ranges = {name: _rejudged(r, peak.ridge(r.flops_dtype)) for name, r in report.ranges.items()}
    verdict = report.verdict
    ridge = peak.ridge(report.flops_dtype)
    if ridge is not None and report.flops and report.bytes_moved and verdict.detail:
        verdict = _with_ridge(verdict, report.flops / report.bytes_moved, ridge)
    return dataclasses.replace(
        report,
        ranges=FrozenMap(ranges),
        verdict=verdict,
        peak_tflops=FrozenMap(peak.tflops),
        peak_source=peak.name,
    )


def _rejudged(r: RangeStats, ridge: float | None) -> RangeStats:
    if ridge is None or not (r.flops and r.bytes_moved and r.device_time_us):
        return r
    verdict = judge(
        device_us=r.device_time_us,
        busy_us=r.device_busy_us,
        wall_us=r.wall_time_us,
        cpu_us=r.cpu_time_us,
        flops=r.flops,
        input_bytes=r.bytes_moved,
        ridge=ridge,
    )
    return dataclasses.replace(r, verdict=verdict)


def _with_ridge(verdict: Verdict, intensity: float, ridge: float) -> Verdict:
    """The window's verdict (whose busy and wall times the report does not keep) with its
    compute-heavy / memory-heavy part judged against ``ridge``."""
    detail = "compute-heavy" if intensity >= ridge else "memory-heavy"
    mark = f", {intensity:.0f} FLOP/byte"
    reason = verdict.reason.replace(mark, f"{mark} (the device's ridge: {ridge:.0f})", 1)
    return dataclasses.replace(verdict, detail=detail, reason=reason)
