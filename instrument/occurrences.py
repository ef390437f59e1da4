"""A window trace's range occurrences, one by one, nested as they ran. No torch imports.

The report aggregates ranges by name; a span per call needs each occurrence on its own: its
wall-clock start and end (epoch ns: the trace's ``baseTimeNanoseconds`` plus the event's
``ts``, never estimated from "now"), its parent on its thread, and the device work it
launched. This reads the same normalised events as the analysis
(``analysis.events_from_trace``), so a range here is what it is in the report: a
``@profiled`` name or any ``user_annotation`` event.

With ``detail="ops"`` the CPU operators that ran inside a range become nodes too, and with
``detail="kernels"`` also the device work (kernels, memcpys, memsets) they launched. Nodes
come parents first; a node's ``parent`` is the index of the innermost node around it on its
thread (-1: none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporters.otel_settings import OTEL_DETAILS as DETAILS

from .analysis import (DUR, KIND, LINK, NAME, START, THREAD, _order, _union_ns,
                       events_from_trace, no_gc)

__all__ = ["DETAILS", "Node", "Walk", "walk_trace"]

RANGE = "range"
OP = "op"


@dataclass(slots=True)
class Node:
    """A range occurrence, an operator inside one, or device work launched inside one."""

    kind: str  # "range", "op", or the device kind: "kernel", "memcpy", "memset"
    name: str
    start_ns: int  # epoch nanoseconds
    end_ns: int
    thread: Any  # (pid, tid) as the trace names them
    parent: int  # index in Walk.nodes, -1 when nothing encloses it
    depth: int  # 0 at the top of its thread
    # ranges only: what ran inside (device work counts for every range open around it)
    device_ns: int = 0
    launches: int = 0
    last_device_end_ns: int = 0
    flops: int = 0
    nbytes: int = 0
    intervals: list[tuple[int, int]] = field(default_factory=list)
    kernels: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # [calls, ns, first]

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def busy_ns(self) -> int:
        """Union of the intervals of the device work launched inside (no idle gaps)."""
        return _union_ns(list(self.intervals))

    @property
    def wall_ns(self) -> int:
        """From the start to the later of the end and the end of the last device work."""
        return max(self.end_ns, self.last_device_end_ns) - self.start_ns


@dataclass
class Walk:
    nodes: list[Node]
    range_count: int


def walk_trace(trace: Mapping[str, Any], range_names: Iterable[str] = (), *,
               detail: str = "ranges") -> Walk:
    """The occurrences in a loaded trace (``tracefile.load_trace``); see the module docstring."""
    if detail not in DETAILS:
        raise ValueError(f"detail must be one of {', '.join(DETAILS)}, got {detail!r}")
    with no_gc():
        return _walk(trace, frozenset(range_names), DETAILS.index(detail))


def _walk(trace: Mapping[str, Any], names: frozenset[str], level: int) -> Walk:
    base = int(trace.get("baseTimeNanoseconds") or 0)
    by_thread: dict[Any, list[tuple]] = {}
    device: list[tuple] = []
    for ev in events_from_trace(trace):
        if ev[KIND] in ("cpu", "overhead"):
            by_thread.setdefault(ev[THREAD], []).append(ev)
        else:
            device.append(ev)

    nodes: list[Node] = []
    ranges = 0
    # link id -> (innermost range, innermost node) open around the CPU event that carries it
    links: dict[int, tuple[int, int]] = {}
    want_ops = level >= 1
    for thread, evs in by_thread.items():
        evs.sort(key=_order)
        # entries: [end, innermost open range index, innermost open node index]
        stack: list[list[int]] = []
        for kind, name, start, dur, _t, ext, link, flops, nbytes, annotation in evs:
            while stack and stack[-1][0] <= start:
                stack.pop()
            end = start + dur
            rng, node = (stack[-1][1], stack[-1][2]) if stack else (-1, -1)
            if kind == "overhead":  # profiler bookkeeping: encloses, never a parent
                stack.append([end, rng, node])
                continue
            depth = nodes[node].depth + 1 if node >= 0 else 0
            if annotation or name in names:
                idx = len(nodes)
                nodes.append(Node(RANGE, name, base + start, base + end, thread, node, depth))
                ranges += 1
                rng = node = idx
            elif want_ops and rng >= 0:
                idx = len(nodes)
                nodes.append(Node(OP, name, base + start, base + end, thread, node, depth))
                node = idx
            if rng >= 0:
                if flops:
                    _each_range(nodes, rng, _add_flops, flops, nbytes)
                key = ext or link
                if key:
                    links[key] = (rng, node)
            stack.append([end, rng, node])

    want_device = level >= 2
    for ev in device:
        owner = links.get(ev[LINK])
        if owner is None:
            continue
        start, end = base + ev[START], base + ev[START] + ev[DUR]
        _each_range(nodes, owner[0], _add_device, ev[KIND], ev[NAME], start, end)
        if want_device:
            parent = nodes[owner[1]]
            nodes.append(Node(ev[KIND], ev[NAME], start, end, ev[THREAD], owner[1],
                              parent.depth + 1))
    return Walk(nodes=nodes, range_count=ranges)


def _each_range(nodes: list[Node], idx: int, fn, *args: Any) -> None:
    """Apply ``fn`` to the range ``idx`` and every range around it on its thread."""
    while idx >= 0:
        node = nodes[idx]
        if node.kind == RANGE:
            fn(node, *args)
        idx = node.parent


def _add_flops(node: Node, flops: int, nbytes: int) -> None:
    node.flops += flops
    node.nbytes += nbytes


def _add_device(node: Node, kind: str, name: str, start: int, end: int) -> None:
    node.device_ns += end - start
    node.launches += 1
    node.intervals.append((start, end))
    if end > node.last_device_end_ns:
        node.last_device_end_ns = end
    entry = node.kernels.get((name, kind))
    if entry is None:
        node.kernels[(name, kind)] = [1, end - start, start]
    else:
        entry[0] += 1
        entry[1] += end - start
