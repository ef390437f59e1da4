"""A window's events -> the numbers and verdicts in a ``WindowReport``. No torch imports.

Events come from one of two front ends, both producing the same named tuples (``Event``, in
``events.py``): ``events.events_from_trace`` reads Chrome/Kineto trace JSON (a saved file, any
torch.profiler user's), and ``instrument.runtime._torch.kineto_events`` reads the profiler's raw
Kineto results directly (no JSON, no ``key_averages()``: ~30 µs per event there, a few µs here).

How the numbers are made:
- Per thread, CPU events are nested by time; an event's self time is its duration minus its
  direct children's (runtime calls such as ``cudaLaunchKernel`` are children of the operator
  that made them), as in torch's table.
- A *range* is a ``@profiled`` name (``range_names``) or any ``user_annotation`` event (a
  ``record_function`` range in a plain torch.profiler trace). Calls count every occurrence;
  inclusive CPU time counts only the outermost occurrence of a name (recursion is not counted
  twice).
- Device work (kernels, memcpys, memsets) belongs to the CPU operator whose id it is linked to
  (``External id`` in a trace, ``linked_correlation_id`` in Kineto results), hence to every
  range open around that operator. Device busy time is the union of those intervals (no
  idle gaps, unlike ``gpu_user_annotation``); wall time runs from a range's start to the later
  of its end and the end of its last kernel.
- Profiler bookkeeping (``ProfilerStep#N``, "Activity Buffer Request", our step markers) is
  never user time. It nests like other events and its *self* time is reported as
  ``profiler_overhead_us``, so user total + overhead = torch's "Self CPU time total".
- The profiler's own work (``PROFILER_WORK_NAMES``: CUPTI's "Activity Buffer Request", ~2.6 ms
  at the first launch after a start on an H200) is also taken out of the CPU time and wall time
  of the ranges it falls in, and of the window's wall time: otherwise one buffer request turns
  a compute-bound 4096x4096 matmul into "overhead-bound". Kineto's JSON puts it on a row of its
  own; it is nested into the CPU thread whose operator encloses it, as ``key_averages`` does.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from ..base.report import (
    FrozenMap,
    Health,
    HealthReason,
    KernelStats,
    OccurrenceBudget,
    Occurrences,
    OpStats,
    PageTimeline,
    RangeStats,
)
from ..base.verdict import CPU_ONLY, Verdict, judge
from .events import (
    DEVICE_IN_USE,
    DROPPED_RECORDS,
    LAUNCH_NAMES,
    PROFILER_WORK_NAMES,
    UNFINISHED,
    USER_ANNOTATION,
    Event,
    _order,
    _union_ns,
    events_from_trace,
    flops_dtype,
    is_bookkeeping,
    no_gc,
)
from .kineto_json import STEP_MARKER, STEP_PREFIX, WINDOW_END

__all__ = [
    "drop_warmup",
    "Analysis",
    "Event",
    "analyze",
    "analyze_events",
    "analyze_trace",
    "events_from_trace",
    "is_bookkeeping",
    "window_health",
]


# ---------------------------------------------------------------- the analysis


@dataclass
class _Range:
    calls: int = 0
    self_ns: int = 0
    incl_ns: int = 0
    device_ns: int = 0
    launches: int = 0
    flops: int = 0
    nbytes: int = 0
    dtype_flops: dict[str, int] = field(default_factory=dict)  # FLOPs per dtype
    open_calls: int = 0  # still open when the profiler stopped
    # [start, end, last device end, profiler work inside]
    occurrences: list[list[int]] = field(default_factory=list)
    intervals: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Analysis:
    ranges: FrozenMap[RangeStats] = field(default_factory=FrozenMap)
    top_ops: tuple[OpStats, ...] = ()
    top_kernels: tuple[KernelStats, ...] = ()
    self_cpu_time_total_us: float = 0.0
    self_device_time_total_us: float = 0.0
    profiler_overhead_us: float = 0.0
    device_busy_us: float = 0.0
    wall_time_us: float = 0.0
    flops: int = 0
    bytes_moved: int = 0
    flops_dtype: str = ""
    verdict: Verdict = field(default_factory=lambda: Verdict(CPU_ONLY, "no events"))
    event_count: int = 0
    occurrences: Occurrences | None = None  # when asked for (``analyze(occurrences=...)``)
    timeline: PageTimeline | None = None  # when asked for (``OccurrenceBudget.timeline_events``)
    health: Health = field(default_factory=Health)  # lost events (``window_health``)

    def report_fields(self, **overrides: Any) -> dict[str, Any]:
        """The ``WindowReport`` fields this analysis fills (the session and the CLI add who,
        when and where)."""
        fields = {
            "ranges": self.ranges,
            "top_ops": self.top_ops,
            "top_kernels": self.top_kernels,
            "self_cpu_time_total_us": self.self_cpu_time_total_us,
            "self_device_time_total_us": self.self_device_time_total_us,
            "profiler_overhead_us": self.profiler_overhead_us,
            "device_busy_us": self.device_busy_us,
            "wall_time_us": self.wall_time_us,
            "flops": self.flops,
            "bytes_moved": self.bytes_moved,
            "flops_dtype": self.flops_dtype,
            "verdict": self.verdict,
            "event_count": self.event_count,
            "occurrences": self.occurrences,
            "timeline": self.timeline,
            "health": self.health,
        }
        fields.update(overrides)
        return fields


def drop_warmup(events: list[Event]) -> list[Event]:
    """Events of the recorded steps only: drop those that began before the first
    ``profiled::step#N`` marker (the warm-up, where the profiler's start-up costs land) or at
    or after the ``profiled::window_end`` marker (a CUDA window whose stop was deferred records
    a few steps more), and the device work they launched. Events without such markers are
    returned as they are."""
    cut = end = None
    for ev in events:
        if ev.kind == "overhead":
            name = ev.name
            if name.startswith(STEP_MARKER):
                if cut is None or ev.start < cut:
                    cut = ev.start
            elif name == WINDOW_END and (end is None or ev.start < end):
                end = ev.start
    if cut is None and end is None:
        return events
    lo = cut if cut is not None else -(1 << 62)
    hi = end if end is not None else 1 << 62

    def recorded(ev: Event) -> bool:  # a host event of the recorded steps (the markers too)
        return lo <= ev.start and (ev.start < hi or ev.name == WINDOW_END)

    dropped = {
        ev.ext or ev.link
        for ev in events
        if (ev.kind == "cpu" or ev.kind == "overhead") and not recorded(ev)
    }
    dropped.discard(0)
    return [
        ev
        for ev in events
        if (
            recorded(ev)
            if ev.kind == "cpu" or ev.kind == "overhead"
            else ev.start >= lo and ev.link not in dropped
        )
    ]


def _take_out_of_ranges(work_ns: int, open_ranges: tuple[tuple[_Range, list[int]], ...]) -> int:
    """The profiler's own work inside ranges is not theirs: it leaves their CPU time and (via
    the occurrence's 4th slot) their wall time. Returns ``work_ns``."""
    for rng, occ in open_ranges:
        rng.incl_ns -= work_ns
        occ[3] += work_ns
    return work_ns


def _nest_orphan_bookkeeping(by_thread: dict[Any, list[Event]]) -> None:
    """Move bookkeeping events that sit on a row of their own (Kineto's JSON gives "Activity
    Buffer Request" its own row) onto the CPU thread with an event that encloses them, so they
    nest there: the enclosing operator's self time then excludes them, as in ``key_averages``.
    Such events are few (one or two a window): a linear scan is fine."""
    orphans = [t for t, evs in by_thread.items() if all(ev.kind == "overhead" for ev in evs)]
    if not orphans or len(orphans) == len(by_thread):
        return
    for thread in orphans:
        keep = []
        for ev in by_thread[thread]:
            start, end = ev.start, ev.start + ev.dur
            home = None
            for other, evs in by_thread.items():
                if other in orphans:
                    continue
                if any(
                    o.kind == "cpu" and o.start <= start and o.start + o.dur >= end for o in evs
                ):
                    home = other
                    break
            if home is None:
                keep.append(ev)
            else:
                by_thread[home].append(ev._replace(thread=home))
        if keep:
            by_thread[thread] = keep
        else:
            del by_thread[thread]


def analyze(
    events: Iterable[Event],
    range_names: Iterable[str] = (),
    *,
    top: int = 20,
    occurrences: OccurrenceBudget | None = None,
    base_ns: int = 0,
    device_in_use: bool = False,
) -> Analysis:
    """Aggregate one window's normalised events (see module docstring).

    With ``occurrences`` (the span budget of the exporters that want per-call data) the
    analysis also carries the window's range occurrences, fitted to it (``occurrences.py``);
    ``base_ns`` turns the events' times into epoch ns (a trace's ``baseTimeNanoseconds``).
    ``device_in_use``: the profiled process had initialized CUDA (a trace says so itself with
    a ``DEVICE_IN_USE`` event): a window of operators without any device event is then
    ``device-missing`` (``window_health``)."""
    with no_gc():
        events = events if isinstance(events, list) else list(events)
        analysis = _analyze(events, frozenset(range_names), top)
        analysis.health = window_health(events, device_in_use=device_in_use)
        if occurrences is not None and occurrences.max_spans:
            from .occurrences import window_occurrences

            analysis.occurrences = window_occurrences(
                events, range_names, occurrences, base_ns=base_ns
            )
        return analysis


def _analyze(events: list[Event], names: frozenset[str], top: int) -> Analysis:
    """The analysis in its steps: group by thread, nest each thread's host events, hand the
    device work to the operators (and ranges) that launched it, sum up."""
    by_thread, device = _split(events)
    _nest_orphan_bookkeeping(by_thread)
    host = _Host(names)
    for evs in by_thread.values():
        _walk_thread(host, evs)
    dev = _attribute_device(device, host)
    # the trace's facts (``events.trace_facts``, appended last) are no recorded events
    facts = sum(1 for ev in events[-2:] if ev.name == DEVICE_IN_USE or ev.name == DROPPED_RECORDS)
    return _summarize(host, dev, top, len(events) - facts)


def _split(events: list[Event]) -> tuple[dict[Any, list[Event]], list[Event]]:
    """Host events by thread (bookkeeping nests too: only its self time is overhead, and
    ``ProfilerStep#N`` encloses a step), and the device work."""
    by_thread: dict[Any, list[Event]] = {}
    device: list[Event] = []
    for ev in events:
        kind = ev.kind
        if kind == "cpu" or kind == "overhead":
            lst = by_thread.get(ev.thread)
            if lst is None:
                lst = by_thread[ev.thread] = []
            lst.append(ev)
        else:
            device.append(ev)
    return by_thread, device


class _Host:
    """What the host (CPU) events of all threads add up to."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.ranges: dict[str, _Range] = {}
        self.ops: dict[str, list[int]] = {}  # name -> [calls, self_ns, incl_ns]
        # an operator's id -> the ranges (and their outermost occurrences) open around it
        self.op_ranges: dict[int, tuple[tuple[_Range, list[int]], ...]] = {}
        self.self_ns = 0
        self.flops = 0
        self.nbytes = 0
        self.dtype_flops: dict[str, int] = {}
        self.overhead_ns = 0
        self.work_ns = 0  # the profiler's own work (PROFILER_WORK_NAMES), self time
        self.first: int | None = None
        self.last: int | None = None

    def add(self, self_ns: int, overhead_ns: int, work_ns: int, flops: int) -> None:
        self.self_ns += self_ns
        self.overhead_ns += overhead_ns
        self.work_ns += work_ns
        self.flops += flops

    def span(self, first: int, last: int) -> None:
        if self.first is None or first < self.first:
            self.first = first
        if self.last is None or last > self.last:
            self.last = last


_LAST = object()
_CLOSE_ALL = Event("end", "", 1 << 62, 0, _LAST, 0, 0, 0, 0, 0)  # pops every open frame


def _walk_thread(host: _Host, evs: list[Event]) -> None:
    """Nest one thread's host events by time; self times, inclusive times, ranges open
    around each operator. The hot loop (a window can hold 100k+ events): locals only, closing
    inlined; ``_CLOSE_ALL`` ends the thread by closing what is still open, in the same code.
    Stack entries: [end, name, child_ns, dur, agg], agg a _Range, an op list or None."""
    evs.sort(key=_order)
    names, ops, op_ranges = host.names, host.ops, host.op_ranges
    self_total = overhead_ns = work_ns = total_flops = last = 0
    stack: list[list[Any]] = []
    depth: dict[str, int] = {}
    outer: dict[str, tuple[_Range, list[int]]] = {}  # outermost open occurrence per name
    open_ranges: tuple[tuple[_Range, list[int]], ...] = ()  # tuple(outer.values())
    for kind, name, start, dur, thread, ext, link, flops, nbytes, annotation in chain(
        evs, (_CLOSE_ALL,)
    ):
        while stack and stack[-1][0] <= start:
            end, cname, child, cdur, agg = stack.pop()
            self_ns = cdur - child if cdur > child else 0
            if agg is None:  # profiler bookkeeping
                overhead_ns += self_ns
                if cname in PROFILER_WORK_NAMES:
                    work_ns += _take_out_of_ranges(self_ns, open_ranges)
                continue
            self_total += self_ns
            d = depth[cname] = depth[cname] - 1
            if agg.__class__ is list:  # an operator: [calls, self_ns, incl_ns]
                agg[0] += 1
                agg[1] += self_ns
                if d == 0:
                    agg[2] += cdur
            else:
                agg.self_ns += self_ns
                if d == 0:
                    agg.incl_ns += cdur
                    del outer[cname]
                    open_ranges = tuple(outer.values())
        if thread is _LAST:
            break
        end = start + dur
        if end > last:
            last = end
        if stack:
            parent = stack[-1]
            overlap = parent[0] - start
            parent[2] += dur if dur < overlap else overlap
        if kind == "overhead":
            stack.append([end, name, 0, dur, None])
            continue
        d = depth.get(name, 0)
        depth[name] = d + 1
        if annotation & USER_ANNOTATION or name in names:
            agg = _open_range(host, outer, name, start, end, d == 0, annotation)
            if d == 0:
                open_ranges = tuple(outer.values())
        else:
            agg = ops.get(name)
            if agg is None:
                agg = ops[name] = [0, 0, 0]
        if flops:
            total_flops += flops
            _add_flops(host, open_ranges, flops, nbytes, annotation)
        if open_ranges and (ext or link):
            op_ranges[ext or link] = open_ranges
        stack.append([end, name, 0, dur, agg])
    host.add(self_total, overhead_ns, work_ns, total_flops)
    if evs:
        host.span(evs[0].start, last)


def _open_range(
    host: _Host,
    outer: dict[str, tuple[_Range, list[int]]],
    name: str,
    start: int,
    end: int,
    outermost: bool,
    annotation: int,
) -> _Range:
    """A range call begins: count it; an outermost one (no call of the name open around it)
    opens an occurrence, [start, end, last device end, profiler work inside], in ``outer``."""
    agg = host.ranges.get(name)
    if agg is None:
        agg = host.ranges[name] = _Range()
    agg.calls += 1
    if annotation & UNFINISHED:
        agg.open_calls += 1
    if outermost:
        occ = [start, end, 0, 0]
        agg.occurrences.append(occ)
        outer[name] = (agg, occ)
    return agg


def _add_flops(
    host: _Host,
    open_ranges: tuple[tuple[_Range, list[int]], ...],
    flops: int,
    nbytes: int,
    annotation: int,
) -> None:
    """An operator's FLOPs (and the bytes of its inputs) go to every range open around it and
    to the window, by the dtype they ran in."""
    dtype = flops_dtype(annotation)
    host.nbytes += nbytes
    host.dtype_flops[dtype] = host.dtype_flops.get(dtype, 0) + flops
    for rng, _occ in open_ranges:
        rng.flops += flops
        rng.nbytes += nbytes
        rng.dtype_flops[dtype] = rng.dtype_flops.get(dtype, 0) + flops


def _main_dtype(dtype_flops: dict[str, int]) -> str:
    """The dtype most FLOPs ran in ("" when none is known)."""
    known = {d: f for d, f in dtype_flops.items() if d}
    return max(known, key=lambda d: known[d]) if known else ""


@dataclass
class _Device:
    """The device work of a window, aggregated."""

    kernels: dict[tuple[str, str], list[int]]  # (name, kind) -> [calls, ns]
    total_ns: int
    busy_ns: int  # union of the intervals


def _attribute_device(device: list[Event], host: _Host) -> _Device:
    """Sum the device work by kernel, and give each to the ranges open around the operator
    that launched it."""
    kernels: dict[tuple[str, str], list[int]] = {}
    total = 0
    intervals: list[tuple[int, int]] = []
    op_ranges = host.op_ranges
    for kind, name, start, dur, _thread, _ext, link, _flops, _nbytes, _ann in device:
        end = start + dur
        host.span(start, end)
        total += dur
        intervals.append((start, end))
        entry = kernels.get((name, kind))
        if entry is None:
            entry = kernels[(name, kind)] = [0, 0]
        entry[0] += 1
        entry[1] += dur
        for agg, occ in op_ranges.get(link, ()):
            agg.device_ns += dur
            agg.launches += 1
            agg.intervals.append((start, end))
            if end > occ[2]:
                occ[2] = end
    return _Device(kernels, total, _union_ns(intervals))


def _range_stats(ranges: dict[str, _Range]) -> dict[str, RangeStats]:
    """Each range's numbers and verdict, the longest (inclusive CPU time) first."""
    out = {}
    for name, agg in sorted(ranges.items(), key=lambda kv: -kv[1].incl_ns):
        busy = _union_ns(agg.intervals)
        wall = _union_ns([(o[0], max(o[1], o[2])) for o in agg.occurrences])
        wall = max(0, wall - sum(o[3] for o in agg.occurrences))
        cpu_us = agg.incl_ns / 1000.0
        out[name] = RangeStats(
            name=name,
            calls=agg.calls,
            cpu_time_us=cpu_us,
            self_cpu_time_us=agg.self_ns / 1000.0,
            device_time_us=agg.device_ns / 1000.0,
            kernel_launches=agg.launches,
            device_busy_us=busy / 1000.0,
            wall_time_us=wall / 1000.0,
            flops=agg.flops,
            open_calls=agg.open_calls,
            bytes_moved=agg.nbytes,
            flops_dtype=_main_dtype(agg.dtype_flops),
            verdict=judge(
                device_us=agg.device_ns / 1000.0,
                busy_us=busy / 1000.0,
                wall_us=wall / 1000.0,
                cpu_us=cpu_us,
                flops=agg.flops,
                input_bytes=agg.nbytes,
            ),
        )
    return out


def _summarize(host: _Host, dev: _Device, top: int, count: int) -> Analysis:
    """The window's ``Analysis`` from its host and device sums."""
    op_stats = sorted(
        (OpStats(name, o[0], o[1] / 1000.0, o[2] / 1000.0) for name, o in host.ops.items()),
        key=lambda o: (-o.self_cpu_time_us, o.name),
    )
    kernel_stats = sorted(
        (KernelStats(name, kind, n, t / 1000.0) for (name, kind), (n, t) in dev.kernels.items()),
        key=lambda k: (-k.device_time_us, k.name),
    )
    first, last = host.first, host.last
    wall_all = max(0, last - first - host.work_ns) if first is not None and last is not None else 0
    window_bytes = host.nbytes
    self_us, device_us = host.self_ns / 1000.0, dev.total_ns / 1000.0
    return Analysis(
        ranges=FrozenMap(_range_stats(host.ranges)),
        top_ops=tuple(op_stats[:top]),
        top_kernels=tuple(kernel_stats[:top]),
        self_cpu_time_total_us=self_us,
        self_device_time_total_us=device_us,
        profiler_overhead_us=host.overhead_ns / 1000.0,
        device_busy_us=dev.busy_ns / 1000.0,
        wall_time_us=wall_all / 1000.0,
        flops=host.flops,
        bytes_moved=host.nbytes,
        flops_dtype=_main_dtype(host.dtype_flops),
        verdict=judge(
            device_us=device_us,
            busy_us=dev.busy_ns / 1000.0,
            wall_us=wall_all / 1000.0,
            cpu_us=self_us,
            flops=host.flops,
            input_bytes=window_bytes,
        ),
        event_count=count,
    )


def analyze_trace(
    trace: Mapping[str, Any], range_names: Iterable[str] = (), *, top: int = 20
) -> Analysis:
    """Analyse a loaded Chrome/Kineto trace (``kineto_json.load_trace``)."""
    return analyze(events_from_trace(trace), range_names, top=top)


def analyze_events(
    events: Iterable[Mapping[str, Any]], range_names: Iterable[str], *, top: int = 20
) -> Analysis:
    """Analyse raw Chrome trace event dicts (``trace["traceEvents"]``)."""
    return analyze(events_from_trace({"traceEvents": events}), range_names, top=top)


# ---------------------------------------------------------------- window health

TAIL_LAUNCHES = 2
"""Launches without their device work tolerated at a window's very end (after the last launch
whose device work was recorded). Kineto keeps only device work that ran before the profiler
stopped (later records are "out of range", pytorch/kineto#996); torch's stop synchronizes the
device first and the SDK's deferred stop waits for the window's end event, so nothing should
be missing there. Two launches cover a stop that raced the very last kernel (a deferred stop
that gave up waiting); more than that is reported."""

_DEVICE_KINDS = frozenset({"kernel", "memcpy", "memset"})


def window_health(events: list[Event], *, device_in_use: bool = False) -> Health:
    """Whether a window lost events (``report.Health``), from its events alone (so a trace read
    back by the CLI gets the same answer as the live window). Signs, each with its numbers:

    - ``no-device-events``: launches (``events.LAUNCH_NAMES``) but not one device event, or,
      where the process had initialized CUDA (``device_in_use``), ``aten::`` operators and no
      runtime or device event at all (CUPTI's runtime and kernel records come in the same
      buffers and are lost together): ``device-missing``;
    - ``launch-without-device``: launches whose device work is not in the window (matched per
      operator: each launch makes one kernel, memcpy or memset linked to the same operator),
      beyond ``TAIL_LAUNCHES`` at the window's end: ``partial``;
    - ``step-without-device``: steps (``ProfilerStep#N``, the SDK's step markers) whose
      operators launch device work in the window's other steps, with no recorded device work
      of their own: ``partial``;
    - ``profiler-dropped``: records the profiler said it dropped (``DROPPED_RECORDS``)."""
    t = _tally(events, device_in_use)
    _drop_captured(t)
    reasons: list[HealthReason] = []
    if t.dropped:
        reasons.append(
            HealthReason(
                "profiler-dropped",
                f"the profiler reported {t.dropped} dropped record(s) in this window's trace",
                t.dropped,
            )
        )
    if not t.device_count:
        missing = _no_device_events(t)
        if missing is not None:
            return Health("device-missing", (*reasons, missing))
        return Health("partial", tuple(reasons)) if reasons else Health()
    matched = _matched_launches(t.launches, t.device_by_link, t.device_count)
    reasons.extend(_launch_reasons(t.launches, matched))
    steps = t.steps
    if not steps and len(t.markers) > 1:
        markers = sorted(t.markers)
        steps = list(zip(markers, markers[1:]))
    lost = _steps_without_device(steps, t.launches, matched, t.ops, t.op_names)
    if lost:
        reasons.append(
            HealthReason(
                "step-without-device",
                f"{lost} of {len(steps)} step(s) ran operators that launch device work in the "
                "other steps, but recorded no device work",
                lost,
            )
        )
    return Health("partial", tuple(reasons)) if reasons else Health()


@dataclass
class _Tally:
    """What ``window_health`` reads from a window's events."""

    device_in_use: bool
    launches: list[Event] = field(default_factory=list)
    device_by_link: dict[int, int] = field(default_factory=dict)  # operator id -> device events
    device_count: int = 0
    aten_ops: int = 0
    dropped: int = 0
    op_names: dict[int, str] = field(default_factory=dict)  # operator id -> name
    ops: list[Event] = field(default_factory=list)
    steps: list[tuple[int, int]] = field(default_factory=list)  # ProfilerStep#N spans
    markers: list[int] = field(default_factory=list)  # the SDK's step and window-end markers
    captures: list[tuple[Any, int, bool]] = field(default_factory=list)  # (thread, at, begins)


def _tally(events: list[Event], device_in_use: bool) -> _Tally:
    t = _Tally(device_in_use)
    for ev in events:
        kind = ev.kind
        if kind == "cpu":
            if ev.name in LAUNCH_NAMES:
                t.launches.append(ev)
            elif ev.name in _CAPTURE_BEGIN or ev.name in _CAPTURE_END:
                t.captures.append((ev.thread, ev.start, ev.name in _CAPTURE_BEGIN))
            elif ev.ext:
                t.op_names[ev.ext] = ev.name
                t.ops.append(ev)
                if ev.name.startswith("aten::"):
                    t.aten_ops += 1
        elif kind == "overhead":
            name = ev.name
            if name.startswith(STEP_PREFIX) and ev.dur > 0:
                t.steps.append((ev.start, ev.start + ev.dur))
            elif name.startswith(STEP_MARKER) or name == WINDOW_END:
                t.markers.append(ev.start)
            elif name == DEVICE_IN_USE:
                t.device_in_use = True
            elif name == DROPPED_RECORDS:
                t.dropped += ev.flops
        elif kind in _DEVICE_KINDS:
            t.device_count += 1
            t.device_by_link[ev.link] = t.device_by_link.get(ev.link, 0) + 1
    return t


_CAPTURE_BEGIN = frozenset({"cudaStreamBeginCapture", "cudaStreamBeginCapture_v2"})
_CAPTURE_END = frozenset({"cudaStreamEndCapture"})


def _drop_captured(t: _Tally) -> None:
    """Launches made while a stream was being captured into a CUDA graph (torch.compile's
    ``reduce-overhead``, ``torch.cuda.graph``) run nothing then: no device event is due."""
    if not t.captures:
        return
    spans: list[tuple[Any, int, int]] = []
    open_at: dict[Any, int] = {}
    for thread, start, begins in sorted(t.captures, key=lambda c: c[1]):
        if begins:
            open_at.setdefault(thread, start)
        elif thread in open_at:
            spans.append((thread, open_at.pop(thread), start))
    spans.extend((thread, at, 1 << 62) for thread, at in open_at.items())
    t.launches = [
        ev
        for ev in t.launches
        if not any(th == ev.thread and lo <= ev.start <= hi for th, lo, hi in spans)
    ]


def _no_device_events(t: _Tally) -> HealthReason | None:
    """A window without one device event that should have had some: launches on the host, or
    operators in a process using CUDA (None: a CPU window)."""
    if t.launches:
        return HealthReason(
            "no-device-events",
            f"{len(t.launches)} launch(es) on the host but no device event at all: "
            "device time, busy share and MFU are missing",
            len(t.launches),
        )
    if t.device_in_use and t.aten_ops:
        return HealthReason(
            "no-device-events",
            f"{t.aten_ops} aten operator(s) ran in a process using CUDA, yet the window "
            "holds no runtime call and no device event: device time, busy share and "
            "MFU are missing",
            t.aten_ops,
        )
    return None


def _matched_launches(
    launches: list[Event], device_by_link: dict[int, int], device_count: int
) -> list[bool]:
    """Per launch (in ``launches``' order): whether its device work is in the window. Per
    operator, its first launches in time get its device events. Where no launch matches at
    all although device work is there, the trace links them some other way: every launch
    counts as matched (never a false alarm from links we cannot read)."""
    order = sorted(range(len(launches)), key=lambda i: launches[i].start)
    left = dict(device_by_link)
    matched = [False] * len(launches)
    for i in order:
        link = launches[i].link
        if left.get(link, 0) > 0:
            left[link] -= 1
            matched[i] = True
    if launches and not any(matched) and device_count:
        return [True] * len(launches)
    return matched


def _launch_reasons(launches: list[Event], matched: list[bool]) -> list[HealthReason]:
    """``launch-without-device``: launches whose device work is missing, the tail at the
    window's end (after the last matched launch) tolerated up to ``TAIL_LAUNCHES``."""
    missing = [ev.start for ev, ok in zip(launches, matched) if not ok]
    if not missing:
        return []
    last_ok = max((ev.start for ev, ok in zip(launches, matched) if ok), default=None)
    tail = sum(1 for t in missing if last_ok is not None and t > last_ok)
    count = len(missing) - (tail if tail <= TAIL_LAUNCHES else 0)
    if not count:
        return []
    return [
        HealthReason(
            "launch-without-device",
            f"{count} of {len(launches)} launch(es) have no device event: device time and "
            "kernel counts are short by their work",
            count,
        )
    ]


def _steps_without_device(
    steps: list[tuple[int, int]],
    launches: list[Event],
    matched: list[bool],
    ops: list[Event],
    op_names: dict[int, str],
) -> int:
    """Steps that ran operators which launch device work in the window's other steps (named
    by the launches' operators) but have no launch with its device work: their device events
    were lost (0 where no step has device work, or there are fewer than two steps)."""
    if len(steps) < 2:
        return 0
    steps = sorted(steps)
    starts = [s for s, _e in steps]

    def step_of(t: int) -> int:
        i = bisect_right(starts, t) - 1
        return i if i >= 0 and t < steps[i][1] else -1

    device_ops = {
        op_names[ev.link] for ev, ok in zip(launches, matched) if ok and ev.link in op_names
    }
    with_device = [False] * len(steps)
    for ev, ok in zip(launches, matched):
        i = step_of(ev.start)
        if ok and i >= 0:
            with_device[i] = True
    if not any(with_device):
        return 0
    wants = [False] * len(steps)
    for ev in ops:
        if ev.name in device_ops:
            i = step_of(ev.start)
            if i >= 0:
                wants[i] = True
    return sum(1 for want, has in zip(wants, with_device) if want and not has)
