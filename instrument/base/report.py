"""``WindowReport``: the one contract between ``instrument`` and ``exporters``.

Plain frozen data, no torch objects: exporters read it without importing torch (this module
imports nothing of ``instrument`` but ``verdict``, which is torch-free too). Times are
microseconds (``*_us``) except wall-clock instants, which are epoch nanoseconds (``*_ns``).

Besides the per-name numbers a report can carry its window's *occurrences*, one per call: what
an exporter needs for a span per call (``Occurrences``). They are made by the analysis (in
the helper process, from the events it already has) when an exporter asks for them with an
``OccurrenceBudget``, and fitted to that budget there, so no exporter parses a trace. So is
the ``html`` exporter's page timeline (``PageTimeline``).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, TypeVar

from .verdict import CPU_ONLY, Verdict

__all__ = [
    "DETAILS",
    "FrozenMap",
    "HEALTH_STATUSES",
    "Cost",
    "Health",
    "HealthReason",
    "KernelCall",
    "KernelStats",
    "MetricsReport",
    "Occurrence",
    "OccurrenceBudget",
    "Occurrences",
    "OpStats",
    "PageTimeline",
    "REASON_KINDS",
    "RangeCalls",
    "RangeHistogram",
    "RangeStats",
    "Verdict",
    "WindowReason",
    "WindowReport",
]

V = TypeVar("V")


class FrozenMap(Mapping[str, V]):
    """A read-only, picklable mapping (``report.ranges["matmul_bias"]``)."""

    __slots__ = ("_data",)
    _data: dict[str, V]

    def __init__(self, data: Mapping[str, V] | None = None) -> None:
        object.__setattr__(self, "_data", dict(data or {}))

    def __getitem__(self, key: str) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenMap is read-only")

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._data.items()))

    def __reduce__(self):
        return (FrozenMap, (self._data,))


@dataclass(frozen=True)
class RangeStats:
    """One ``@profiled`` range name within a window."""

    name: str
    calls: int
    cpu_time_us: float  # inclusive: sum of the durations of outermost occurrences
    self_cpu_time_us: float  # minus the time of operators and ranges nested inside
    device_time_us: float  # device kernels/memcpy/memset launched inside the range
    kernel_launches: int
    device_busy_us: float = 0.0  # union of those kernels' intervals (no idle gaps)
    wall_time_us: float = 0.0  # range start -> later of range end and its last kernel's end
    flops: int = 0  # with_flops: FLOPs of the operators inside the range
    verdict: Verdict = field(default_factory=lambda: Verdict(CPU_ONLY, ""))
    # calls that began in the window and were still running when its profiler stopped (a
    # range held across steps): counted in ``calls``, their time cut at the stop
    open_calls: int = 0
    bytes_moved: int = 0  # with_flops: input bytes of the operators that did those FLOPs
    flops_dtype: str = ""  # the dtype most of those FLOPs ran in ("bf16"; "" unknown)

    @property
    def cpu_time_per_call_us(self) -> float:
        return self.cpu_time_us / self.calls if self.calls else 0.0

    @property
    def device_time_per_call_us(self) -> float:
        return self.device_time_us / self.calls if self.calls else 0.0

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of operator inputs (0 when either is unknown)."""
        return self.flops / self.bytes_moved if self.flops and self.bytes_moved else 0.0

    @property
    def device_to_cpu_ratio(self) -> float:
        """Device time over CPU time: << 1 means the device idles while the CPU dispatches."""
        return self.device_time_us / self.cpu_time_us if self.cpu_time_us else 0.0

    @property
    def device_busy_share(self) -> float:
        """Share of the range's wall time during which its kernels kept the device busy."""
        return self.device_busy_us / self.wall_time_us if self.wall_time_us else 0.0

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s over device time (0 when FLOPs or device time are unknown)."""
        if not (self.flops and self.device_time_us):
            return 0.0
        return self.flops / (self.device_time_us * 1e-6)


@dataclass(frozen=True)
class OpStats:
    """A CPU-side operator (``aten::mm``, ``cudaLaunchKernel``) aggregated by name."""

    name: str
    calls: int
    self_cpu_time_us: float
    cpu_time_us: float


@dataclass(frozen=True)
class KernelStats:
    """Device work aggregated by name; ``kind`` is ``kernel``, ``memcpy`` or ``memset``."""

    name: str
    kind: str
    calls: int
    device_time_us: float


DETAILS: tuple[str, ...] = ("ranges", "ops", "kernels")
"""What occurrences cover, each level adding to the last: range calls; the CPU operators run
inside them; the device work (kernels, memcpys, memsets) those launched."""


@dataclass(frozen=True)
class OccurrenceBudget:
    """What an exporter asks the analysis to carry: per call, at most ``max_spans`` spans
    (the window's own span included) at ``detail``, each range call with its
    ``top_kernels`` heaviest kernels (``max_spans=0``: no occurrences); with
    ``timeline_events`` (an int), the window's page timeline of at most that many events
    (``PageTimeline``: the ``html`` exporter's), made where the trace is read. Budgets compare
    by their occurrences only: a timeline asked for beside them does not change how they are
    fitted."""

    max_spans: int
    detail: str = "ranges"
    top_kernels: int = 5
    timeline_events: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.detail not in DETAILS:
            raise ValueError(f"detail must be one of {', '.join(DETAILS)}, got {self.detail!r}")
        if (
            isinstance(self.max_spans, bool)
            or not isinstance(self.max_spans, int)
            or self.max_spans < (0 if self.timeline_events is not None else 1)
        ):
            raise ValueError(
                f"max_spans must be an int >= 1 (0 only beside timeline_events), "
                f"got {self.max_spans!r}"
            )
        events = self.timeline_events
        if events is not None and (
            isinstance(events, bool) or not isinstance(events, int) or events < 0
        ):
            raise ValueError(f"timeline_events must be None or an int >= 0, got {events!r}")

    @property
    def level(self) -> int:
        return DETAILS.index(self.detail)

    @staticmethod
    def widest(budgets: Iterable[OccurrenceBudget | None]) -> OccurrenceBudget | None:
        """One budget that covers every given one (None when none is given): the analysis
        fits the occurrences once, to it; an exporter with a smaller one fits them again."""
        given = [b for b in budgets if b is not None]
        if not given:
            return None
        timelines = [b.timeline_events for b in given if b.timeline_events is not None]
        return OccurrenceBudget(
            max(b.max_spans for b in given),
            DETAILS[max(b.level for b in given)],
            max(b.top_kernels for b in given),
            max(timelines) if timelines else None,
        )


@dataclass(frozen=True)
class PageTimeline:
    """A window's timeline for its HTML page (``exporters.html_timeline``), made by the
    analysis where it read the trace (the helper process, off the program's GIL) when an
    exporter asked for one (``OccurrenceBudget.timeline_events``): ``data`` is the timeline as
    JSON ready to stand inside the page's ``<script>`` (``exporters.html_page.script_json``),
    ``events`` the events it draws of ``total`` recorded."""

    data: str
    events: int
    total: int


@dataclass(frozen=True)
class KernelCall:
    """Device work of one name that one range call launched (a span event per name)."""

    name: str
    kind: str  # "kernel", "memcpy" or "memset"
    calls: int
    device_time_us: float
    first_ns: int  # epoch ns: the start of the first one


@dataclass(frozen=True)
class Occurrence:
    """One span's worth of a window: a range call (``range``), the calls of one range folded
    into one aggregate to stay in the budget (``range.folded``), an operator (``op``) or
    device work (``kernel``, ``memcpy``, ``memset``). Parents come before their children."""

    kind: str
    name: str
    start_ns: int  # epoch ns, from the trace (never estimated); range.folded: the first start
    end_ns: int  # range.folded: the last end
    parent: int  # index in ``Occurrences.items`` of the innermost one around it; -1: none
    depth: int  # 0 at the top of its thread
    thread_id: int | None = None  # the trace's thread id (ranges)
    calls: int = 1  # range.folded: the calls it stands for
    cpu_time_us: float = 0.0  # range, op: its duration; range.folded: their sum
    device_time_us: float = 0.0  # range: device work launched inside; device work: its own
    device_busy_us: float = 0.0  # range: union of those intervals (no idle gaps)
    kernel_launches: int = 0
    flops: int = 0
    verdict: Verdict | None = None  # range: this call's verdict
    top_kernels: tuple[KernelCall, ...] = ()  # range: the heaviest device work inside

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class RangeCalls:
    """Every call of one range in a window, whatever the span budget (per-call histograms):
    CPU time and device time in ns, call by call."""

    cpu_ns: tuple[int, ...] = ()
    device_ns: tuple[int, ...] = ()


@dataclass(frozen=True)
class Occurrences:
    """A window's occurrences fitted to ``budget`` (see ``instrument.analysis.occurrences``)."""

    budget: OccurrenceBudget
    items: tuple[Occurrence, ...] = ()
    range_count: int = 0  # range calls recorded in the window
    folded_occurrences: int = 0  # range calls folded into range.folded aggregates
    dropped: int = 0  # detail occurrences and (past every fold) range calls left out
    first_ns: int | None = None  # the earliest start and latest end of all occurrences
    last_ns: int | None = None
    calls: FrozenMap[RangeCalls] = field(default_factory=FrozenMap)

    @property
    def folded_ranges(self) -> tuple[str, ...]:
        return tuple(sorted(o.name for o in self.items if o.kind == "range.folded"))


REASON_KINDS: tuple[str, ...] = ("schedule", "every", "sample", "trigger", "slow_step")
"""Why a window opens (``WindowReason.kind``): the session's schedule (``PROFILED_SCHEDULE`` or
an explicit ``Schedule``), ``PROFILED_EVERY``, ``PROFILED_SAMPLE_RATE``'s draw, a fired
``PROFILED_TRIGGER``, or a step slower than ``PROFILED_SLOW_STEP`` times the median."""


@dataclass(frozen=True)
class WindowReason:
    """Why a window opened: ``kind`` (one of ``REASON_KINDS``) and ``detail``, one sentence
    for people. A ``slow_step`` window also names the slow step, its time and the rolling
    median step time it was compared with (µs)."""

    kind: str
    detail: str = ""
    step: int | None = None  # slow_step: the step that was slow (the window opens after it)
    step_time_us: float | None = None
    median_step_us: float | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


HEALTH_STATUSES: tuple[str, ...] = ("complete", "partial", "device-missing")
"""A window's ``Health.status``: ``complete`` (nothing found missing), ``partial`` (device
events recorded for some of its work but not all of it), ``device-missing`` (its ranges ran
device operators and the window holds no device work at all)."""


@dataclass(frozen=True)
class HealthReason:
    """One sign that a window lost events: ``kind`` (a short stable key, e.g.
    ``launch-without-kernel``), ``detail`` (one sentence for people, with the numbers) and
    ``count`` (how many events, launches or steps it concerns; 0 where not countable)."""

    kind: str
    detail: str
    count: int = 0


@dataclass(frozen=True)
class Health:
    """Whether a window's numbers can be stood behind: ``status`` (one of
    ``HEALTH_STATUSES``) and the reasons found (empty when complete)."""

    status: str = "complete"
    reasons: tuple[HealthReason, ...] = ()

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    def __str__(self) -> str:
        if self.complete:
            return self.status
        return f"{self.status}: " + "; ".join(r.detail for r in self.reasons)


@dataclass(frozen=True)
class Cost:
    """What a window cost the program (its ledger), measured where it happened.

    ``steps_time_us``: the wall time of its recorded steps; ``baseline_step_us``: the median
    of the window-free steps between the previous window and this one (the metrics' step
    histogram: None without it), so ``steps_excess_us`` (None where the baseline is unknown)
    is what recording added to the steps. ``start_stall_us`` / ``stop_stall_us``: the caller's
    wait in the profiler's start (the previous window's trace written first included) and
    stop. ``export_cpu_s`` / ``analysis_cpu_s``: thread CPU time on the export worker for
    torch's trace export and for reading, shaping and analysing it; ``helper_cpu_s``: the
    helper process's CPU for it (None where it did not run there). ``bytes_written``: the
    window's trace file. ``exporters_s``/``exporters_bytes`` are the *previous* window's
    (``exporters_window``; None: none finished yet): a report cannot wait for its own
    exporters. ``budget_pct``/``share_pct``: ``PROFILED_OVERHEAD_BUDGET`` and the measured
    cost, as a percentage of wall time over the rolling interval, with this window counted;
    ``backed_off``: what the budget turned down before this window, and why ("" nothing)."""

    steps: int = 0
    steps_time_us: float = 0.0
    baseline_step_us: float | None = None
    baseline_steps: int = 0  # the window-free steps the baseline is the median of
    start_stall_us: float = 0.0
    stop_stall_us: float = 0.0
    export_cpu_s: float = 0.0
    analysis_cpu_s: float = 0.0
    helper_cpu_s: float | None = None
    bytes_written: int = 0
    exporters_window: int | None = None
    exporters_s: float = 0.0
    exporters_bytes: int = 0
    budget_pct: float = 0.0
    share_pct: float = 0.0
    interval_s: float = 0.0
    backed_off: str = ""

    @property
    def steps_excess_us(self) -> float | None:
        if self.baseline_step_us is None:
            return None
        return self.steps_time_us - self.steps * self.baseline_step_us

    @property
    def total_us(self) -> float:
        """The program's cost: the steps' excess (never below 0), both stalls, and the CPU
        the window's trace and analysis took (its own thread's and the helper's)."""
        excess = max(self.steps_excess_us or 0.0, 0.0)
        cpu_s = self.export_cpu_s + self.analysis_cpu_s + (self.helper_cpu_s or 0.0)
        return excess + self.start_stall_us + self.stop_stall_us + cpu_s * 1e6

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps_excess_us"] = self.steps_excess_us
        out["total_us"] = self.total_us
        return out

    def line(self) -> str:
        """One short line for people: ``cost 41.2 ms: steps +12.0 ms (3), start 8.1, stop 5.0,
        cpu 16.1 ms, 120 kB; 0.8% of 60 s, budget 5%``, then what was backed off."""
        excess = self.steps_excess_us
        steps = f"steps {excess / 1e3:+.1f} ms ({self.steps})" if excess is not None else "steps ?"
        cpu_s = self.export_cpu_s + self.analysis_cpu_s + (self.helper_cpu_s or 0.0)
        size = self.bytes_written
        written = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
        text = (
            f"cost {self.total_us / 1e3:.1f} ms: {steps}, start {self.start_stall_us / 1e3:.1f}"
            f", stop {self.stop_stall_us / 1e3:.1f}, cpu {cpu_s * 1e3:.1f} ms, {written}"
        )
        if self.budget_pct:
            text += f"; {self.share_pct:.2g}% of {self.interval_s:g} s, budget {self.budget_pct:g}%"
        if self.backed_off:
            text += f"; backed off: {self.backed_off}"
        return text


@dataclass(frozen=True)
class WindowReport:
    """What one profiler window measured."""

    window: int  # 0-based index of the window in its session
    steps: tuple[int, ...]  # the recorded steps (session step indices)
    partial: bool  # ended early (shutdown, session exit) before its schedule finished
    start_ns: int  # wall-clock, epoch nanoseconds
    end_ns: int
    rank: int
    world_size: int
    host: str
    pid: int
    device: str  # "cpu" or the accelerator's name
    activities: tuple[str, ...]
    ranges: FrozenMap[RangeStats] = field(default_factory=FrozenMap)
    top_ops: tuple[OpStats, ...] = ()
    top_kernels: tuple[KernelStats, ...] = ()
    self_cpu_time_total_us: float = 0.0  # torch's "Self CPU time total", bookkeeping excluded
    self_device_time_total_us: float = 0.0  # torch's "Self CUDA time total"
    profiler_overhead_us: float = 0.0  # the profiler's own bookkeeping, not user time
    device_busy_us: float = 0.0  # union of all device work in the window
    flops: int = 0
    verdict: Verdict = field(default_factory=lambda: Verdict(CPU_ONLY, ""))
    event_count: int = 0
    raw_trace_path: str | None = None  # the window's trace JSON; valid while exporters run
    # the same trace gzip-compressed, where an exporter asked (``Exporter.wants_gzip_trace``)
    # and the analysis helper made it; None otherwise; valid while exporters run
    raw_trace_gz_path: str | None = None
    trace_file: str | None = None  # the file a trace exporter wrote, when one did
    # per-call occurrences, when an exporter asked for them (left out of ``to_dict``)
    occurrences: Occurrences | None = None
    # the page timeline, when an exporter asked for it (left out of ``to_dict``)
    timeline: PageTimeline | None = None
    # why the window opened; None where unknown (a report read back from a trace file)
    reason: WindowReason | None = None
    bytes_moved: int = 0  # with_flops: input bytes of the operators that did the FLOPs
    flops_dtype: str = ""  # the dtype most FLOPs ran in
    # the device's dense peaks (TFLOP/s per dtype, ``instrument.analysis.peaks``) and where they
    # come from ("NVIDIA H200", "PROFILED_PEAK_TFLOPS=500"; "" unknown)
    peak_tflops: FrozenMap[float] = field(default_factory=FrozenMap)
    peak_source: str = ""
    # the verdict's wall time: first recorded event to the later of the last one's end and the
    # last kernel's end, the profiler's own work taken out (``duration_us`` is the recording's)
    wall_time_us: float = 0.0
    # whether the window recorded all it should have (lost device events, ``Health``)
    health: Health = field(default_factory=Health)
    # what the window cost the program (None: a report read back from a trace file)
    cost: Cost | None = None

    @property
    def duration_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1000.0

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s over the window's device time (0 when unknown)."""
        if not (self.flops and self.self_device_time_total_us):
            return 0.0
        return self.flops / (self.self_device_time_total_us * 1e-6)

    def peak_flops_per_s(self, dtype: str) -> float | None:
        """The device's dense peak for ``dtype`` (None: peak unknown)."""
        tflops = self.peak_tflops.get(dtype)
        return tflops * 1e12 if tflops else None

    def mfu(self, r: RangeStats | None = None) -> float | None:
        """Achieved FLOP/s over the device's dense peak for the FLOPs' dtype, of range ``r``
        or (None) the whole window; None when FLOPs, device time or the peak are unknown."""
        rate, dtype = (
            (self.flops_per_s, self.flops_dtype) if r is None else (r.flops_per_s, r.flops_dtype)
        )
        peak = self.peak_flops_per_s(dtype)
        return rate / peak if rate and peak else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain data: the window's numbers. Per-call ``occurrences`` are left out
        (they are for span exporters, and one window can hold thousands)."""
        out = asdict(dataclasses.replace(self, occurrences=None, timeline=None))
        del out["occurrences"], out["timeline"]
        # FrozenMap is a Mapping but not a dict: convert it by hand
        out["ranges"] = {name: self._range_dict(r) for name, r in self.ranges.items()}
        out["peak_tflops"] = dict(self.peak_tflops)
        out["cost"] = self.cost.to_dict() if self.cost is not None else None
        out["flops_per_s"] = self.flops_per_s
        out["mfu"] = self.mfu()
        return out

    def _range_dict(self, r: RangeStats) -> dict[str, Any]:
        """A range's fields, then what follows from them: per-call averages, FLOP/s, MFU."""
        out = asdict(r)
        out["cpu_time_per_call_us"] = r.cpu_time_per_call_us
        out["device_time_per_call_us"] = r.device_time_per_call_us
        out["flops_per_s"] = r.flops_per_s
        out["mfu"] = self.mfu(r)
        out["arithmetic_intensity"] = r.arithmetic_intensity
        return out


# ---------------------------------------------------------------- always-on metrics


@dataclass(frozen=True)
class RangeHistogram:
    """Every call of one range since metrics started: wall time in nanoseconds, bucketed.

    ``bucket_counts[i]`` counts durations ``d`` with ``bounds_ns[i-1] <= d < bounds_ns[i]``
    (the first: below ``bounds_ns[0]``; the last: from ``bounds_ns[-1]`` on)."""

    name: str
    count: int
    sum_ns: int
    min_ns: int
    max_ns: int
    bucket_counts: tuple[int, ...]
    bounds_ns: tuple[int, ...] = ()
    device: str | None = None  # device times: the device its calls ran on ("cuda:0")

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) in nanoseconds: interpolated within its bucket, clamped
        to the exact min and max, so it is off by at most its bucket's width where it lies
        within the bounds (relatively: ``quantile_max_error`` in ``MetricsReport.summary``,
        3.1% for the metrics' buckets); below the first bound or past the last, it is only
        clamped."""
        if self.count == 0:
            return 0.0
        rank = q * self.count
        if rank <= 0:
            return float(self.min_ns)
        cumulative = self._cumulative
        i = bisect.bisect_left(cumulative, rank)  # the first bucket whose count reaches it
        if i >= len(cumulative):
            return float(self.max_ns)
        seen = cumulative[i - 1] if i > 0 else 0
        low = self.bounds_ns[i - 1] if i > 0 else 0
        high = self.bounds_ns[i] if i < len(self.bounds_ns) else self.max_ns
        low, high = max(low, self.min_ns), min(high, self.max_ns)
        return low + (high - low) * ((rank - seen) / (cumulative[i] - seen))

    @functools.cached_property
    def _cumulative(self) -> list[int]:
        """The counts up to and with each bucket (in C: hundreds of buckets, few quantiles)."""
        return list(itertools.accumulate(self.bucket_counts))

    def kept(self) -> tuple[list[int], list[int]]:
        """The bounds worth exporting and the counts of the buckets between them (one more
        than the bounds): the first bound, then from the first non-empty bucket's lower bound
        to the last non-empty one's upper bound; the empty buckets outside are merged with
        their neighbours. Quantiles read from what is kept (Prometheus's
        ``histogram_quantile``) are as close as from every bucket. The counts are cumulative
        over the process's life, so what was kept once stays kept: a series exported under a
        bound is not dropped from a later export."""
        counts, bounds = self.bucket_counts, self.bounds_ns
        used = [i for i, n in enumerate(counts) if n]
        if not used or not bounds:
            return list(bounds[:1]), [sum(counts)] + [0] * min(len(bounds), 1)
        first = max(used[0] - 1, 0)
        last = min(used[-1], len(bounds) - 1)
        keep = [0] + list(range(max(first, 1), last + 1))
        out = [sum(counts[: keep[0] + 1])]
        out += [sum(counts[a + 1 : b + 1]) for a, b in zip(keep, keep[1:])]
        out.append(sum(counts[keep[-1] + 1 :]))
        return [bounds[i] for i in keep], out

    def summary(self) -> dict[str, Any]:
        """count, sum and the quantiles dashboards show, in seconds."""
        return {
            "count": self.count,
            "sum_s": self.sum_ns / 1e9,
            "min_s": self.min_ns / 1e9,
            "p50_s": self.quantile(0.5) / 1e9,
            "p90_s": self.quantile(0.9) / 1e9,
            "p99_s": self.quantile(0.99) / 1e9,
            "max_s": self.max_ns / 1e9,
        }


@dataclass(frozen=True)
class MetricsReport:
    """The process's histograms at one moment: cumulative since ``since_ns`` (epoch ns), the
    moment metrics started in this process (or in this forked child). ``steps``: the wall time
    of each ``step=True`` call, apart from the ranges."""

    time_ns: int
    since_ns: int
    pid: int
    host: str
    rank: int
    world_size: int
    bounds_ns: tuple[int, ...]
    ranges: tuple[RangeHistogram, ...]
    steps: RangeHistogram | None = None
    # device time of one call in PROFILED_METRICS_DEVICE_EVERY per range (CUDA events)
    device_ranges: tuple[RangeHistogram, ...] = ()

    def summary(self) -> dict[str, Any]:
        """JSON-ready: who and when, then per range (and for steps) count, sum, quantiles."""
        return {
            "time_ns": self.time_ns,
            "since_ns": self.since_ns,
            "rank": self.rank,
            "world_size": self.world_size,
            "host": self.host,
            "pid": self.pid,
            "quantile_max_error": _max_error(self.bounds_ns),
            "ranges": {h.name: h.summary() for h in self.ranges},
            "steps": self.steps.summary() if self.steps is not None else None,
            "device_ranges": {
                h.name: {**h.summary(), "device": h.device} for h in self.device_ranges
            },
        }


def _max_error(bounds_ns: tuple[int, ...]) -> float:
    """The most a quantile read from buckets of these bounds can be off, relatively, within
    them: the widest bucket's width over its lower bound (0 without two bounds)."""
    return max(((b - a) / a for a, b in zip(bounds_ns, bounds_ns[1:]) if a > 0), default=0.0)


class LiveMetrics:
    """Where an exporter asked between snapshots (a scrape of ``/metrics``) reads the
    process's metrics as of that moment: ``source`` is set by the metrics feed
    (``instrument.runtime.metrics.Feed``) while metrics count, and cleared when it closes (its last
    snapshot is then delivered as usual). Kept in the contract module because exporters
    import nothing else of the SDK. ``source()`` folds what is pending and copies the
    histograms: it takes the recorder's lock once per range, never for long."""

    source: ClassVar[Callable[[], MetricsReport] | None] = None
