"""A window's range occurrences, one by one, nested as they ran. No torch imports.

The report aggregates ranges by name; a span per call needs each occurrence on its own: its
wall-clock start and end (epoch ns: the trace's ``baseTimeNanoseconds`` plus the event's
``ts``, or Kineto's own epoch times, never estimated from "now"), its parent on its thread,
and the device work it launched. This reads the same normalised events as the analysis
(``events.Event``), so a range here is what it is in the report: a ``@profiled`` name or
any ``user_annotation`` event. The analysis calls ``window_occurrences`` (in the helper
process) when an exporter asked for occurrences; the result rides in the report.

With ``detail="ops"`` the CPU operators that ran inside a range become nodes too, and with
``detail="kernels"`` also the device work (kernels, memcpys, memsets) they launched. Nodes
come parents first; a node's ``parent`` is the index of the innermost node around it on its
thread (-1: none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..base.report import (
    DETAILS,
    FrozenMap,
    KernelCall,
    Occurrence,
    OccurrenceBudget,
    Occurrences,
    RangeCalls,
)
from ..base.spans import RANGE, assemble, plan_spans
from ..base.verdict import judge
from .events import USER_ANNOTATION, Event, _order, _union_ns, events_from_trace, no_gc

__all__ = ["DETAILS", "Node", "Walk", "walk_trace", "window_occurrences"]

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

    calls = 1  # one call (``spans.plan_spans`` reads it)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def cpu_time_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1000.0

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


def walk_trace(
    trace: Mapping[str, Any], range_names: Iterable[str] = (), *, detail: str = "ranges"
) -> Walk:
    """The occurrences in a loaded trace (``kineto_json.load_trace``); see the module docstring."""
    if detail not in DETAILS:
        raise ValueError(f"detail must be one of {', '.join(DETAILS)}, got {detail!r}")
    with no_gc():
        base = int(trace.get("baseTimeNanoseconds") or 0)
        return walk_events(
            events_from_trace(trace), frozenset(range_names), DETAILS.index(detail), base
        )


def window_occurrences(
    events: list[Event], range_names: Iterable[str], budget: OccurrenceBudget, *, base_ns: int = 0
) -> Occurrences:
    """A window's occurrences fitted to ``budget`` (``spans.plan_spans``), and every range
    call's CPU and device time (for per-call histograms, whatever the budget)."""
    walk = walk_events(events, frozenset(range_names), budget.level, base_ns)
    nodes = walk.nodes
    plan = plan_spans(nodes, budget.max_spans)
    top = budget.top_kernels
    calls: dict[str, tuple[list[int], list[int]]] = {}
    for node in nodes:
        if node.kind == RANGE:
            cpu, device = calls.setdefault(node.name, ([], []))
            cpu.append(node.end_ns - node.start_ns)
            device.append(node.device_ns)
    return Occurrences(
        budget=budget,
        items=assemble(nodes, plan, lambda node, parent: _occurrence(node, parent, top)),
        range_count=walk.range_count,
        folded_occurrences=plan.folded_occurrences,
        dropped=plan.dropped,
        first_ns=min((n.start_ns for n in nodes), default=None),
        last_ns=max((n.end_ns for n in nodes), default=None),
        calls=FrozenMap({name: RangeCalls(tuple(c), tuple(d)) for name, (c, d) in calls.items()}),
    )


def _occurrence(node: Node, parent: int, top: int) -> Occurrence:
    """What a span needs of a kept node: its numbers, its verdict and top kernels (ranges)."""
    if node.kind != RANGE:
        cpu = node.duration_ns / 1000.0 if node.kind == OP else 0.0
        device = 0.0 if node.kind == OP else node.duration_ns / 1000.0
        return Occurrence(
            node.kind,
            node.name,
            node.start_ns,
            node.end_ns,
            parent,
            node.depth,
            cpu_time_us=cpu,
            device_time_us=device,
        )
    cpu_us, device_us = node.duration_ns / 1000.0, node.device_ns / 1000.0
    busy_us = node.busy_ns / 1000.0
    tid = node.thread[1] if isinstance(node.thread, tuple) and len(node.thread) > 1 else None
    kernels = sorted(node.kernels.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]
    return Occurrence(
        RANGE,
        node.name,
        node.start_ns,
        node.end_ns,
        parent,
        node.depth,
        thread_id=tid if isinstance(tid, int) and not isinstance(tid, bool) else None,
        cpu_time_us=cpu_us,
        device_time_us=device_us,
        device_busy_us=busy_us,
        kernel_launches=node.launches,
        flops=node.flops,
        verdict=judge(
            device_us=device_us,
            busy_us=busy_us,
            wall_us=node.wall_ns / 1000.0,
            cpu_us=cpu_us,
            flops=node.flops,
            input_bytes=node.nbytes,
        ),
        top_kernels=tuple(
            KernelCall(name, kind, calls, ns / 1000.0, first)
            for (name, kind), (calls, ns, first) in kernels
        ),
    )


def walk_events(events: Iterable[Event], names: frozenset[str], level: int, base: int) -> Walk:
    """The nodes of normalised ``events`` at detail ``level`` (an index in ``DETAILS``);
    ``base`` turns their times into epoch ns."""
    by_thread: dict[Any, list[Event]] = {}
    device: list[Event] = []
    for ev in events:
        if ev.kind == "cpu" or ev.kind == "overhead":
            by_thread.setdefault(ev.thread, []).append(ev)
        else:
            device.append(ev)
    nodes: list[Node] = []
    # link id -> (innermost range, innermost node) open around the CPU event that carries it
    links: dict[int, tuple[int, int]] = {}
    ranges = 0
    for thread, evs in by_thread.items():
        ranges += _walk_thread(
            nodes, links, thread, sorted(evs, key=_order), names, level >= 1, base
        )
    want_device = level >= 2
    for ev in device:
        owner = links.get(ev.link)
        if owner is None:
            continue
        start, end = base + ev.start, base + ev.start + ev.dur
        _each_range(nodes, owner[0], _add_device, ev.kind, ev.name, start, end)
        if want_device:
            parent = nodes[owner[1]]
            nodes.append(Node(ev.kind, ev.name, start, end, ev.thread, owner[1], parent.depth + 1))
    return Walk(nodes=nodes, range_count=ranges)


def _walk_thread(
    nodes: list[Node],
    links: dict[int, tuple[int, int]],
    thread: Any,
    evs: list[Event],
    names: frozenset[str],
    want_ops: bool,
    base: int,
) -> int:
    """Add one thread's ranges (and operators inside them, ``want_ops``) to ``nodes``;
    returns how many ranges it had."""
    ranges = 0
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
        if annotation & USER_ANNOTATION or name in names:  # not UNFINISHED: an operator
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
    return ranges


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
