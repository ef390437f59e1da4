"""Chrome/Kineto trace events -> the numbers in a ``WindowReport``. No torch imports.

Works on the trace JSON (``traceEvents``) that ``export_chrome_trace`` writes, never through
``key_averages()`` (~30 µs per event). Per thread, complete (``ph == "X"``) CPU events are
nested by time; an event's self time is its duration minus its direct children's. Device
time of a range is the duration of the kernels, memcpys and memsets whose launch (a runtime
event carrying ``args.correlation``) happened inside the range on the same thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .report import FrozenMap, KernelStats, OpStats, RangeStats

__all__ = ["Analysis", "analyze_events", "is_bookkeeping"]

CPU_CATEGORIES = frozenset(
    {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "privateuse1_runtime",
     "xpu_runtime", "mtia_runtime", "python_function"}
)
DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
# The profiler's own work: never user time.
BOOKKEEPING_NAMES = frozenset({"Activity Buffer Request", "Iteration Start: PyTorch Profiler"})
BOOKKEEPING_PREFIXES = ("ProfilerStep#", "PyTorch Profiler", "profiled::", "## ")

_EPS_US = 1e-3  # timestamps carry nanoseconds as 3 decimals of a microsecond


def is_bookkeeping(name: str) -> bool:
    return name in BOOKKEEPING_NAMES or name.startswith(BOOKKEEPING_PREFIXES)


@dataclass
class _Agg:
    calls: int = 0
    self_us: float = 0.0
    incl_us: float = 0.0
    device_us: float = 0.0
    launches: int = 0


@dataclass
class Analysis:
    ranges: FrozenMap[RangeStats] = field(default_factory=FrozenMap)
    top_ops: tuple[OpStats, ...] = ()
    top_kernels: tuple[KernelStats, ...] = ()
    self_cpu_time_total_us: float = 0.0
    self_device_time_total_us: float = 0.0
    profiler_overhead_us: float = 0.0
    event_count: int = 0


def analyze_events(
    events: Iterable[Mapping[str, Any]],
    range_names: Iterable[str],
    *,
    top: int = 20,
) -> Analysis:
    """Aggregate one window's trace events. ``range_names`` are the ``@profiled`` names."""
    names = frozenset(range_names)
    cpu_by_thread: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    device_by_corr: dict[Any, list[tuple[str, str, float]]] = {}
    device_events: list[tuple[str, str, float]] = []
    overhead = 0.0
    count = 0

    for ev in events:
        count += 1
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        if cat in CPU_CATEGORIES:
            name = ev.get("name", "")
            if is_bookkeeping(name):
                if not name.startswith("ProfilerStep#"):
                    overhead += float(ev.get("dur", 0.0))
                continue
            cpu_by_thread.setdefault((ev.get("pid"), ev.get("tid")), []).append(ev)
        elif cat in DEVICE_CATEGORIES:
            item = (ev.get("name", ""), DEVICE_CATEGORIES[cat], float(ev.get("dur", 0.0)))
            device_events.append(item)
            corr = (ev.get("args") or {}).get("correlation")
            if corr is not None:
                device_by_corr.setdefault(corr, []).append(item)
        elif cat == "Trace" or is_bookkeeping(ev.get("name", "")):
            continue

    ranges: dict[str, _Agg] = {}
    ops: dict[str, _Agg] = {}
    self_total = 0.0

    for evs in cpu_by_thread.values():
        evs.sort(key=lambda e: (float(e.get("ts", 0.0)), -float(e.get("dur", 0.0))))
        # stack entries: [end_us, name, child_us, agg_key_is_range, event]
        stack: list[list[Any]] = []
        open_names: dict[str, int] = {}  # name -> how many occurrences are on the stack

        def close(entry: list[Any]) -> None:
            nonlocal self_total
            end, name, child, dur = entry
            self_us = max(dur - child, 0.0)
            self_total += self_us
            open_names[name] -= 1
            target = ranges if name in names else ops
            agg = target.get(name)
            if agg is None:
                agg = target[name] = _Agg()
            agg.calls += 1
            agg.self_us += self_us
            if open_names[name] == 0:  # outermost occurrence: count inclusive time once
                agg.incl_us += dur

        for ev in evs:
            ts = float(ev.get("ts", 0.0))
            dur = float(ev.get("dur", 0.0))
            while stack and stack[-1][0] <= ts + _EPS_US:
                close(stack.pop())
            if stack:
                parent = stack[-1]
                parent[2] += min(dur, max(parent[0] - ts, 0.0))
            name = ev.get("name", "")
            corr = (ev.get("args") or {}).get("correlation")
            if corr is not None and corr in device_by_corr and open_names:
                launched = device_by_corr[corr]
                dev_us = sum(item[2] for item in launched)
                for rname, depth in open_names.items():
                    if depth > 0 and rname in names:
                        agg = ranges.get(rname)
                        if agg is None:
                            agg = ranges[rname] = _Agg()
                        agg.device_us += dev_us
                        agg.launches += 1
            open_names[name] = open_names.get(name, 0) + 1
            stack.append([ts + dur, name, 0.0, dur])
        while stack:
            close(stack.pop())

    range_stats = {
        name: RangeStats(
            name=name,
            calls=agg.calls,
            cpu_time_us=agg.incl_us,
            self_cpu_time_us=agg.self_us,
            device_time_us=agg.device_us,
            kernel_launches=agg.launches,
        )
        for name, agg in sorted(ranges.items(), key=lambda kv: -kv[1].incl_us)
        if agg.calls
    }
    op_stats = sorted(
        (OpStats(name, a.calls, a.self_us, a.incl_us) for name, a in ops.items()),
        key=lambda o: (-o.self_cpu_time_us, o.name),
    )
    kernels: dict[tuple[str, str], list[float]] = {}
    for name, kind, dur in device_events:
        entry = kernels.setdefault((name, kind), [0, 0.0])
        entry[0] += 1
        entry[1] += dur
    kernel_stats = sorted(
        (KernelStats(name, kind, int(n), t) for (name, kind), (n, t) in kernels.items()),
        key=lambda k: (-k.device_time_us, k.name),
    )
    return Analysis(
        ranges=FrozenMap(range_stats),
        top_ops=tuple(op_stats[:top]),
        top_kernels=tuple(kernel_stats[:top]),
        self_cpu_time_total_us=self_total,
        self_device_time_total_us=sum(d for _, _, d in device_events),
        profiler_overhead_us=overhead,
        event_count=count,
    )
