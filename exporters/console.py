"""``ConsoleExporter``: the window table a person reads first.

First why the window opened, then its health (``complete``, or loud: what was lost, with its
numbers; device numbers it cannot stand behind say ``(partial)`` / ``(device-missing)``), what
it cost (the ledger), then its verdict with the numbers behind it, then one line per
``@profiled`` range: calls, inclusive CPU time, device time of the kernels it launched, device
time over CPU time, the share of the range's wall time the device was busy, and the verdict
(overhead-bound, compute-bound, cpu-only; see ``instrument.base.verdict``). Then the top operators
and device kernels, then the two totals the way torch's own table prints them, then the trace
file's path (relative to the working directory when that is shorter). At most 100 columns, no
colour; a trace path too long for that gets a line of its own and is never cut.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, TextIO

from instrument.base.formatting import WIDTH, fit, format_time_us, row

from ._base import Exporter, ExportResult

if TYPE_CHECKING:
    from instrument.base.report import RangeStats, WindowReport

__all__ = ["ConsoleExporter", "format_report", "format_time_us"]


def _pct(share: float) -> str:
    if share >= 0.0995 or share == 0.0:
        return f"{100.0 * share:.0f}%"
    return f"{100.0 * share:.1f}%"


def _si(value: float) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.2f} {prefix}"
    return f"{value:.0f} "


def _wrap(text: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False) or [""]


def _steps(steps: tuple[int, ...]) -> str:
    if not steps:
        return "no steps"
    if len(steps) == 1:
        return f"step {steps[0]}"
    if list(steps) == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}-{steps[-1]}"
    return "steps " + ",".join(map(str, steps))


def format_report(report: WindowReport, rows: int = 15) -> str:
    """The window's table as text (at most ``WIDTH`` columns but for a long trace path), in
    the order a person reads it: title, verdict, ranges, top operators and kernels, totals."""
    rule = "-" * WIDTH
    lines = [_title(report)]
    reason = getattr(report, "reason", None)
    if reason is not None:  # why the window opened
        lines.extend(
            _wrap(f"opened by {reason.kind}" + (f": {reason.detail}" if reason.detail else ""))
        )
    lines.extend(_health_lines(report))
    cost = getattr(report, "cost", None)
    if cost is not None:  # what the window cost the program (its ledger)
        lines.extend(_wrap(cost.line()))
    lines.append(rule)
    verdict = getattr(report, "verdict", None)
    if verdict is not None and verdict.reason:
        lines.extend(_wrap(f"window: {verdict}: {verdict.reason}{_unsure(report)}"))
        lines.append(rule)
    lines.extend(_range_lines(report, rows))
    if report.top_ops:
        lines.append(rule)
        lines.extend(_operator_lines(report, rows))
    if report.top_kernels:
        lines.append(rule)
        lines.extend(_kernel_lines(report, rows))
    lines.append(rule)
    lines.extend(_total_lines(report))
    if report.trace_file:
        lines.extend(_trace_lines(report.trace_file))
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _title(report: WindowReport) -> str:
    """One line saying which window this is: its steps, device, rank and how long the profiler
    recorded (host clock; the verdict line's wall time runs to the last kernel's end)."""
    title = (
        f"torch-profiled | window {report.window} | {_steps(report.steps)}"
        f"{' (partial)' if report.partial else ''} | {report.device} | "
        f"rank {report.rank}/{report.world_size} | recorded {format_time_us(report.duration_us)}"
    )
    return fit(title, WIDTH)


def _health_lines(report: WindowReport) -> list[str]:
    """Whether the window's numbers can be stood behind: one quiet line when nothing was found
    missing, a loud one (wrapped) with the reasons and their numbers when events were lost."""
    health = getattr(report, "health", None)
    if health is None or health.complete:
        return ["health: complete"]
    reasons = "; ".join(r.detail for r in health.reasons) or "no reason recorded"
    return _wrap(
        f"!! HEALTH: {health.status.upper()} (numbers marked so are incomplete): {reasons}"
    )


def _unsure(report: WindowReport) -> str:
    """The mark after a device number this window cannot stand behind."""
    health = getattr(report, "health", None)
    return "" if health is None or health.complete else f" ({health.status})"


def _range_lines(report: WindowReport, rows: int) -> list[str]:
    """The ``@profiled`` ranges: a header, one row per range (the first ``rows``), then their
    FLOPs and the calls still running when the window ended."""
    shown = list(report.ranges.values())[:rows]
    # module paths (instrument_module) run long: the column grows as far as 100 columns allow
    name_w = max(24, min(max((len(r.name) for r in shown), default=0), WIDTH - 68))
    header = (
        f"{'@profiled range':<{name_w}} {'calls':>6} {'CPU total':>9} {'CPU/call':>9} "
        f"{'device':>9} {'dev/call':>9} {'busy':>5}  {'verdict':<13}"
    )
    lines = [header]
    if not shown:
        lines.append("(no @profiled or record_function range ran in this window)")
        return lines
    for r in shown:
        lines.append(
            row(
                r.name,
                f" {r.calls:>6} {format_time_us(r.cpu_time_us):>9} "
                f"{format_time_us(r.cpu_time_per_call_us):>9} "
                f"{format_time_us(r.device_time_us):>9} "
                f"{format_time_us(r.device_time_per_call_us):>9} "
                f"{_pct(r.device_busy_share) if r.device_time_us else '-':>5}  "
                f"{r.verdict.short if r.verdict.reason else '':<13}",
                name_w,
                middle=True,
            )
        )
    for r in shown:
        if r.flops:
            lines.extend(_wrap(f"  {r.name}: " + flops_line(report, r)))
    for r in shown:
        if r.open_calls:
            lines.extend(
                _wrap(
                    f"  {r.name}: {r.open_calls} of {r.calls} call(s) still running when the "
                    "window ended, counted up to its end"
                )
            )
    return lines


def flops_line(report: WindowReport, r: RangeStats) -> str:
    """A range's FLOPs per call, achieved FLOP/s, MFU and FLOP/byte in words."""
    per_call = r.flops / r.calls if r.calls else 0.0
    text = f"{_si(per_call)}FLOP per call"
    if not r.flops_per_s:
        if r.cpu_time_us:
            text += f", {_si(r.flops / (r.cpu_time_us * 1e-6))}FLOP/s over its CPU time"
        return text + " (no device work: no MFU)" + _unsure(report)
    text += f", {_si(r.flops_per_s)}FLOP/s on the device"
    dtype = r.flops_dtype or "dtype unknown"
    peak = report.peak_flops_per_s(r.flops_dtype)
    mfu = report.mfu(r)
    if mfu is not None and peak is not None:
        text += f", MFU {100 * mfu:.1f}% of {_si(peak)}FLOP/s ({dtype}, {report.peak_source})"
    else:
        text += f", MFU: peak unknown for {report.device} ({dtype}; set PROFILED_PEAK_TFLOPS)"
    if r.arithmetic_intensity:
        text += f", {r.arithmetic_intensity:.0f} FLOP/byte"
    return text + _unsure(report)


def _operator_lines(report: WindowReport, rows: int) -> list[str]:
    """The top operators by self CPU time, each with its share of the window's total."""
    name_w = 56
    header = (
        f"{'top operators by self CPU time':<{name_w}} {'calls':>7} {'self CPU':>11} "
        f"{'CPU total':>11} {'self %':>10}"
    )
    lines = [header]
    total = report.self_cpu_time_total_us or 1.0
    for op in report.top_ops[:rows]:
        lines.append(
            row(
                op.name,
                f" {op.calls:>7} "
                f"{format_time_us(op.self_cpu_time_us):>11} {format_time_us(op.cpu_time_us):>11} "
                f"{100.0 * op.self_cpu_time_us / total:>9.1f}%",
                name_w,
            )
        )
    return lines


def _kernel_lines(report: WindowReport, rows: int) -> list[str]:
    """The top device kernels (and memcpy/memset) by device time, with their share."""
    name_w = 60
    header = (
        f"{'top device kernels':<{name_w}} {'kind':>7} {'calls':>7} {'device':>11} {'share':>10}"
    )
    lines = [header]
    total = report.self_device_time_total_us or 1.0
    for k in report.top_kernels[:rows]:
        lines.append(
            row(
                k.name,
                f" {k.kind:>7} {k.calls:>7} "
                f"{format_time_us(k.device_time_us):>11} {100.0 * k.device_time_us / total:>9.1f}%",
                name_w,
            )
        )
    return lines


def _total_lines(report: WindowReport) -> list[str]:
    """The totals the way torch's own table ends, then the profiler's own cost if known."""
    lines = [f"Self CPU time total: {format_time_us(report.self_cpu_time_total_us)}"]
    accelerators = [a for a in report.activities if a != "cpu"]
    if accelerators:
        label = accelerators[0].upper()  # torch's table: "Self CUDA time total", "Self XPU ..."
        lines.append(
            f"Self {label} time total: {format_time_us(report.self_device_time_total_us)}"
            + _unsure(report)
        )
    if report.profiler_overhead_us:
        lines.append(
            f"Profiler bookkeeping (not in the totals): "
            f"{format_time_us(report.profiler_overhead_us)}"
        )
    return lines


def _trace_lines(trace_file: str) -> list[str]:
    """Where the trace file is. A path is never cut (it must stay usable): one too long for
    the ``Trace:`` line gets a line of its own."""
    shown = _display_path(trace_file)
    if len("Trace: ") + len(shown) <= WIDTH:
        return [f"Trace: {shown}"]
    return ["Trace:", shown]


def _display_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it and that is shorter
    (``./profiled_traces/host_1_rank0.1.pt.trace.json.gz``), else as given."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return path
    rel = os.curdir + os.sep + rel
    return rel if len(rel) < len(path) else path


class ConsoleExporter(Exporter):
    """Prints each window's table to ``stream`` (standard error by default)."""

    def __init__(self, stream: TextIO | None = None, rows: int = 15) -> None:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be a positive int, got {rows!r}")
        self._stream = stream
        self.rows = rows
        self._lock = threading.Lock()

    @property
    def stream(self) -> TextIO:
        # resolved at write time so that redirecting sys.stderr (pytest's capsys) is honoured
        return self._stream if self._stream is not None else sys.stderr

    def export(self, report: WindowReport) -> ExportResult:
        text = format_report(report, self.rows)
        with self._lock:
            self.stream.write("\n" + text)
            self.stream.flush()
        return ExportResult.SUCCESS

    def notice(self, message: str) -> None:
        with self._lock:
            self.stream.write(f"torch-profiled: {message}\n")
            self.stream.flush()
