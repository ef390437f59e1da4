"""A window's trace events -> the compact timeline the HTML report draws. No torch imports.

One *lane* per CPU thread (ranges, operators, runtime calls) and per device stream (kernels,
memcpys, memsets), each split into *rows* by nesting depth: within a row events are sorted by
start, so the page finds the events in view by binary search instead of scanning them all.
Events are embedded as numbers, not one object each: per row the start as a delta from the
previous start and the duration (integer nanoseconds from the timeline's zero), and an index
into one table of ``(name, category)`` pairs. 140k events take ~2 MB of page.

Past ``max_events`` only the longest events are kept (ranges and steps before the shortest
operators), and the timeline says how many it shows of how many.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

__all__ = ["DEFAULT_MAX_EVENTS", "DEVICE_CATEGORIES", "timeline_from_trace"]

DEFAULT_MAX_EVENTS = 500_000
"""Events one window's timeline embeds at most (~15 bytes of page each)."""

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})
# the profiler's own span over the whole trace: not a user event
_SKIPPED_CATEGORIES = frozenset({"Trace"})

# a child may end this much after its parent (rounding of Kineto's fractional microseconds)
_NEST_SLACK_US = 0.002
# one event as collected: (start us, duration us, name, category)
_Event = tuple[float, float, str, str]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _names(events: Iterable[Any]) -> tuple[dict[Any, str], dict[tuple[Any, Any], str]]:
    """``process_name`` per pid and ``thread_name`` per (pid, tid) from metadata events."""
    processes: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "M":
            continue
        args = ev.get("args")
        label = args.get("name") if isinstance(args, dict) else None
        if not isinstance(label, str):
            continue
        if ev.get("name") == "process_name":
            processes[ev.get("pid")] = label
        elif ev.get("name") == "thread_name":
            threads[(ev.get("pid"), ev.get("tid"))] = label
    return processes, threads


def _collect(
    events: Iterable[Any], range_names: frozenset[str]
) -> dict[tuple[bool, str, str], list[_Event]]:
    """The complete (``X``) events by lane ``(is device, pid, tid)``; an event named like a
    range is shown as one whatever its category (an ``@profiled`` call in a raw trace)."""
    lanes: dict[tuple[bool, str, str], list[_Event]] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        ts = _number(ev.get("ts"))
        cat = ev.get("cat")
        cat = cat if isinstance(cat, str) else ""
        if ts is None or cat in _SKIPPED_CATEGORIES:
            continue
        dur = max(_number(ev.get("dur")) or 0.0, 0.0)
        name = ev.get("name")
        name = name if isinstance(name, str) else str(name)
        if name in range_names and cat == "cpu_op":
            cat = "user_annotation"
        key = (cat in DEVICE_CATEGORIES, str(ev.get("pid")), str(ev.get("tid")))
        lanes.setdefault(key, []).append((ts, dur, name, cat))
    return lanes


def _keep_longest(
    lanes: dict[tuple[bool, str, str], list[_Event]], max_events: int
) -> dict[tuple[bool, str, str], list[_Event]]:
    """At most ``max_events`` events in all: the longest (ties: the earliest)."""
    total = sum(len(v) for v in lanes.values())
    if total <= max_events:
        return lanes
    if max_events <= 0:
        return {}
    cutoff = heapq.nlargest(max_events, (e[1] for v in lanes.values() for e in v))[-1]
    room = max_events - sum(1 for v in lanes.values() for e in v if e[1] > cutoff)
    out: dict[tuple[bool, str, str], list[_Event]] = {}
    for key, evs in lanes.items():
        kept = []
        for e in sorted(evs):
            if e[1] > cutoff:
                kept.append(e)
            elif e[1] == cutoff and room > 0:
                kept.append(e)
                room -= 1
        if kept:
            out[key] = kept
    return out


def _rows(evs: list[_Event]) -> list[list[_Event]]:
    """A lane's events nested by time into rows by depth (a child below its parent)."""
    evs.sort(key=lambda e: (e[0], -e[1]))
    rows: list[list[_Event]] = []
    ends: list[float] = []  # the end of each open event, outermost first
    for e in evs:
        end = e[0] + e[1]
        # close what ended before it began, and what it does not fit inside (a partial
        # overlap is drawn beside, not below: a chain of them must not staircase down)
        while ends and (ends[-1] <= e[0] or end > ends[-1] + _NEST_SLACK_US):
            ends.pop()
        depth = len(ends)
        if depth == len(rows):
            rows.append([])
        rows[depth].append(e)
        ends.append(end)
    return rows


def _label(key: tuple[bool, str, str], processes: dict[Any, str], threads: dict) -> str:
    device, pid, tid = key
    found = next((v for (p, t), v in threads.items() if str(p) == pid and str(t) == tid), None)
    if device:
        proc = next((v for p, v in processes.items() if str(p) == pid), f"device {pid}")
        return f"{proc} {found or 'stream ' + tid}"
    return found or f"thread {tid}"


def _encode(
    rows: list[list[_Event]], t0: float, table: dict[tuple[str, str], int]
) -> list[dict[str, list[int]]]:
    """Rows as integer ns: start deltas (``s``), durations (``d``), name indices (``n``)."""
    out = []
    for row in rows:
        starts, durs, names = [], [], []
        prev = 0
        for ts, dur, name, cat in row:
            start = round((ts - t0) * 1000)
            starts.append(start - prev)
            prev = start
            durs.append(round(dur * 1000))
            names.append(table.setdefault((name, cat), len(table)))
        out.append({"s": starts, "d": durs, "n": names})
    return out


def timeline_from_trace(
    trace: dict[str, Any],
    *,
    range_names: Iterable[str] = (),
    max_events: int = DEFAULT_MAX_EVENTS,
) -> dict[str, Any]:
    """The timeline of a loaded Chrome/Kineto trace, JSON-ready (see the module docstring):
    ``lanes`` (``label``, ``device``, ``rows``), ``names`` (``[name, category]`` pairs),
    ``end_ns`` (its length), ``t0_ns`` (epoch ns of its zero, or None), ``events`` (embedded)
    and ``total`` (recorded)."""
    events = trace.get("traceEvents")
    events = events if isinstance(events, list) else []
    processes, threads = _names(events)
    lanes = _collect(events, frozenset(range_names))
    total = sum(len(v) for v in lanes.values())
    lanes = _keep_longest(lanes, max(max_events, 0))
    t0 = min((e[0] for v in lanes.values() for e in v), default=0.0)
    end = max((e[0] + e[1] for v in lanes.values() for e in v), default=t0)
    order = sorted(lanes, key=lambda k: (k[0], min(e[0] for e in lanes[k]), k[1], k[2]))
    table: dict[tuple[str, str], int] = {}
    out_lanes = [
        {
            "label": _label(key, processes, threads),
            "device": key[0],
            "rows": _encode(_rows(lanes[key]), t0, table),
        }
        for key in order
    ]
    base = trace.get("baseTimeNanoseconds")
    t0_ns = None
    if isinstance(base, int) and not isinstance(base, bool):
        t0_ns = base + round(t0 * 1000)
    elif t0 >= 1e15:  # older torch: absolute epoch microseconds
        t0_ns = round(t0 * 1000)
    return {
        "lanes": out_lanes,
        "names": [list(k) for k in table],
        "end_ns": round((end - t0) * 1000),
        "t0_ns": t0_ns,
        "events": sum(len(v) for v in lanes.values()),
        "total": total,
    }
