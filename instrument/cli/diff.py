"""``torch-profiled diff A B``: two sides of windows compared per call, never as sums.

A *side* is what one path names: its traces, one window each (``Side``, ``Window``). Every
figure compared is per call (a range's CPU or device time over its calls, a kernel's device
time over its launches, an operator's self CPU time over its calls) or per window (the
totals), pooled over the side's windows: a side of one window and a side of three compare
fairly (summing would make the second look three times slower). ``instrument.cli.gate`` judges
the same figures against a threshold.

No torch imports, nothing from ``instrument.cli`` (the CLI reads the traces and hands the
reports over): the data path runs one way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from instrument.base.formatting import WIDTH, format_delta_us, format_time_us, row

if TYPE_CHECKING:
    from ..base.report import RangeCalls, WindowReport

__all__ = [
    "MEAN",
    "MEDIAN_CALL",
    "Side",
    "Window",
    "diff_sides",
    "format_diff",
    "per_call",
    "per_window",
    "range_shapes",
    "side_doc",
]

Shapes = dict[str, None]  # an ordered set of "op [dims]" signatures
_CPU_CATEGORIES = ("cpu_op", "user_annotation")
MEDIAN_CALL, MEAN = "median call", "mean"  # a window's per-call value (``per_window``)


@dataclass(frozen=True)
class Window:
    """One trace: its report (every operator and kernel kept), per range the input shapes of
    the operators inside it (None: the trace recorded no shapes) and, where read, each call's
    CPU and device time (``calls``: what the gate takes each window's median call from; None:
    not read)."""

    report: WindowReport
    shapes: dict[str, Shapes] | None = None
    calls: Mapping[str, RangeCalls] | None = None


@dataclass(frozen=True)
class Side:
    """What one path of ``diff`` names: its trace files and their windows, in order."""

    path: str
    traces: tuple[str, ...]
    windows: tuple[Window, ...]

    @property
    def devices(self) -> list[str]:
        return sorted({w.report.device for w in self.windows})

    @property
    def world_sizes(self) -> list[int]:
        return sorted({w.report.world_size for w in self.windows})

    @property
    def shapes_recorded(self) -> bool:
        return any(w.shapes is not None for w in self.windows)

    def range_names(self) -> set[str]:
        return {n for w in self.windows for n in w.report.ranges}

    def shapes_of(self, name: str) -> Shapes | None:
        """The input-shape signatures of ``name`` over every window, in order of first
        appearance; None when no window recorded shapes."""
        if not self.shapes_recorded:
            return None
        out: Shapes = {}
        for w in self.windows:
            if w.shapes is not None:
                out.update(w.shapes.get(name, {}))
        return out


# ---------------------------------------------------------------- input shapes


def range_shapes(trace: dict[str, Any], names: Iterable[str]) -> dict[str, Shapes] | None:
    """Per range in ``names``, the signatures (``aten::mm [[64, 64], [64, 64]]``) of the
    operators that ran inside its calls, in order of first appearance; None when no operator
    of the trace carries ``Input Dims`` (recorded without ``record_shapes``)."""
    wanted = frozenset(names)
    by_thread: dict[Any, list[tuple[float, float, str, Any]]] = {}
    recorded = False
    for ev in trace.get("traceEvents", ()):
        if ev.get("ph") != "X" or ev.get("cat") not in _CPU_CATEGORIES:
            continue
        ts, dur = ev.get("ts"), ev.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        dims = (ev.get("args") or {}).get("Input Dims")
        recorded = recorded or dims is not None
        name = ev.get("name")
        if name in wanted or dims is not None:
            key = (ev.get("pid"), ev.get("tid"))
            by_thread.setdefault(key, []).append((ts, -dur, str(name), dims))
    if not recorded:
        return None
    out: dict[str, Shapes] = {n: {} for n in wanted}
    for evs in by_thread.values():
        _nest_shapes(sorted(evs, key=lambda e: (e[0], e[1])), wanted, out)
    return out


def _nest_shapes(
    evs: list[tuple[float, float, str, Any]], wanted: frozenset[str], out: dict[str, Shapes]
) -> None:
    """One thread's events by start: each operator's signature goes to every range open
    around it (a range's own shapes, if any, are not its inside)."""
    open_ranges: list[tuple[float, str]] = []  # (end, name)
    for ts, neg_dur, name, dims in evs:
        while open_ranges and open_ranges[-1][0] <= ts:
            open_ranges.pop()
        if dims is not None and open_ranges:
            sig = f"{name} {json.dumps(dims, separators=(', ', ': '))}"
            for _end, rng in open_ranges:
                out[rng][sig] = None
        if name in wanted:
            open_ranges.append((ts - neg_dur, name))


# ---------------------------------------------------------------- per-call figures


def per_call(
    side: Side, name: str, metric: str, rule: str = MEAN
) -> tuple[list[float], int, float]:
    """A range's per-window per-call values (µs) of ``metric`` (``cpu`` or ``device``),
    its calls over the side, and the pooled per-call value (all time over all calls). A
    window's value is its time over its calls (``MEAN``) or, with ``MEDIAN_CALL``
    (``per_window``), the median of its calls' durations."""
    values: list[float] = []
    calls = 0
    total = 0.0
    for w in side.windows:
        r = w.report.ranges.get(name)
        if r is None or not r.calls:
            continue
        t = r.cpu_time_us if metric == "cpu" else r.device_time_us
        ns = _durations(w, name, metric) if rule == MEDIAN_CALL else None
        values.append(_median(ns) / 1000.0 if ns else t / r.calls)
        calls += r.calls
        total += t
    return values, calls, (total / calls if calls else 0.0)


def per_window(sides: Iterable[Side], name: str, metric: str) -> str:
    """How the gate takes a window's per-call value of ``name`` (``cpu`` or ``device``) on
    every side it compares: ``MEDIAN_CALL`` where every window holding the range carries each
    of its calls' durations, else ``MEAN`` (its time over its calls) for all of them, so two
    sides are never compared by different rules. Why the median call: a late wake-up on a
    busy machine slows single calls, and a window's mean carries every one of them (a
    baseline whose every window had one slowed call passed a 1.2x regression); the median of
    a window's calls does not move for a minority of slowed calls."""
    for side in sides:
        for w in side.windows:
            r = w.report.ranges.get(name)
            if r is None or not r.calls:
                continue
            if _durations(w, name, metric) is None:
                return MEAN
    return MEDIAN_CALL


def _durations(w: Window, name: str, metric: str) -> tuple[int, ...] | None:
    """A window's per-call durations (ns) of ``name``, when it carries every call's."""
    c = w.calls.get(name) if w.calls is not None else None
    r = w.report.ranges.get(name)
    if c is None or r is None:
        return None
    ns = c.cpu_ns if metric == "cpu" else c.device_ns
    # every call, nothing nested or unfinished counted apart: the same calls as the report's
    return ns if ns and len(ns) == r.calls else None


def _median(values: Iterable[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _pool(items: Iterator[tuple[str, int, float, str]]) -> dict[str, list[Any]]:
    """name -> [calls, time, kind, windows seen] summed over windows."""
    acc: dict[str, list[Any]] = {}
    for name, calls, us, kind in items:
        a = acc.setdefault(name, [0, 0.0, kind, 0])
        a[0] += calls
        a[1] += us
        a[3] += 1
    return acc


def _side_tables(side: Side) -> dict[str, Any]:
    reps = [w.report for w in side.windows]
    return {
        "ranges": _pool((n, r.calls, r.cpu_time_us, "") for p in reps for n, r in p.ranges.items()),
        "range_device": _pool(
            (n, r.calls, r.device_time_us, "")
            for p in reps
            for n, r in p.ranges.items()
            if r.device_time_us
        ),
        "kernels": _pool(
            (k.name, k.calls, k.device_time_us, k.kind) for p in reps for k in p.top_kernels
        ),
        "ops": _pool((o.name, o.calls, o.self_cpu_time_us, "") for p in reps for o in p.top_ops),
    }


def _ratio(after: float | None, before: float | None) -> float | None:
    if after is None or before is None or before <= 0:
        return None
    return after / before


def _compare(
    before: dict[str, list[Any]],
    after: dict[str, list[Any]],
    n_before: int,
    n_after: int,
    rows: int,
    names: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """Rows for names on either side: per-call before/after, delta, ratio and calls per
    window, largest absolute per-call change first."""
    out = []
    keep = set(before) | set(after) if names is None else set(names)
    for name in keep & (set(before) | set(after)):
        b, a = before.get(name), after.get(name)
        bv = b[1] / b[0] if b and b[0] else None
        av = a[1] / a[0] if a and a[0] else None
        item: dict[str, Any] = {
            "name": name,
            "before_us": bv,
            "after_us": av,
            "delta_us": (av or 0.0) - (bv or 0.0),
            "ratio": _ratio(av, bv),
            "calls_before": b[0] if b else None,
            "calls_after": a[0] if a else None,
            "calls_per_window_before": b[0] / n_before if b else None,
            "calls_per_window_after": a[0] / n_after if a else None,
        }
        if (a or b)[2]:  # type: ignore[index]
            item["kind"] = (a or b)[2]  # type: ignore[index]
        out.append(item)
    out.sort(key=lambda r: (-abs(r["delta_us"]), r["name"]))
    return out[:rows]


def _totals(before: Side, after: Side) -> dict[str, Any]:
    """Torch's two totals per window (the mean over a side's windows)."""
    out = {}
    for key in ("self_cpu_time_total_us", "self_device_time_total_us"):
        bv = _mean(getattr(w.report, key) for w in before.windows)
        av = _mean(getattr(w.report, key) for w in after.windows)
        out[key] = {"before_us": bv, "after_us": av, "delta_us": av - bv, "ratio": _ratio(av, bv)}
    return out


def _mean(values: Iterable[float]) -> float:
    vals = list(values)
    return sum(vals) / len(vals) if vals else 0.0


def side_doc(side: Side) -> dict[str, Any]:
    """A side as the comparison names it: path, traces, windows, devices, world sizes."""
    return {
        "path": side.path,
        "traces": list(side.traces),
        "windows": len(side.windows),
        "devices": side.devices,
        "world_sizes": side.world_sizes,
    }


def diff_sides(
    before: Side, after: Side, rows: int, names: Iterable[str] | None = None
) -> dict[str, Any]:
    """The comparison: per range (CPU and device time per call), per device kernel (device
    time per launch), per operator (self CPU time per call), and the totals per window.
    ``names`` keeps only those ranges (``--range``)."""
    b, a = _side_tables(before), _side_tables(after)
    nb, na = max(len(before.windows), 1), max(len(after.windows), 1)
    wanted = None if names is None else list(names)
    return {
        "per": "call",
        "before": side_doc(before),
        "after": side_doc(after),
        "ranges": _compare(b["ranges"], a["ranges"], nb, na, rows, wanted),
        "range_device_time": _compare(b["range_device"], a["range_device"], nb, na, rows, wanted),
        "kernels": _compare(b["kernels"], a["kernels"], nb, na, rows),
        "operators": _compare(b["ops"], a["ops"], nb, na, rows),
        "totals": _totals(before, after),
    }


# ---------------------------------------------------------------- the table


def _t(us: float | None) -> str:
    return "-" if us is None else format_time_us(us)


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _per_window(n: float | None) -> str:
    if n is None:  # not on that side: no call there
        return "0"
    return str(int(n)) if float(n).is_integer() else f"{n:.1f}"


def _calls(item: dict[str, Any]) -> str:
    b = _per_window(item["calls_per_window_before"])
    a = _per_window(item["calls_per_window_after"])
    return a if a == b else f"{b}->{a}"


def _change(item: dict[str, Any]) -> str:
    return (
        f"{_t(item['before_us']):>12}{_t(item['after_us']):>12}"
        f"{format_delta_us(item['delta_us']):>13}{_ratio_text(item['ratio']):>9}"
    )


def _side_line(label: str, doc: dict[str, Any]) -> str:
    n_t, n_w = len(doc["traces"]), doc["windows"]
    traces = f"{n_t} trace{'s' if n_t != 1 else ''}"
    return f"{label} {doc['path']} ({traces}, {n_w} window{'s' if n_w != 1 else ''})"


def format_diff(d: dict[str, Any]) -> str:
    """The comparison as the console table (lines within ``WIDTH``)."""
    rule = "-" * WIDTH
    lines = [
        "torch-profiled diff | per call, pooled over each side's windows | delta = after - before",
        _side_line("before:", d["before"]),
        _side_line("after: ", d["after"]),
    ]

    def section(title: str, items: list[dict[str, Any]], empty: str) -> None:
        lines.append(rule)
        head = f"{'before':>12}{'after':>12}{'delta':>13}{'ratio':>9}{'calls/window':>14}"
        lines.append(row(title, head))
        if not items:
            lines.append(empty)
        for it in items:
            kind = it.get("kind")
            name = it["name"] if kind in (None, "kernel") else f"{it['name']} [{kind}]"
            lines.append(row(name, _change(it) + f"{_calls(it):>14}"))

    section("range (CPU per call)", d["ranges"], "(no range on either side)")
    if d["range_device_time"]:
        section("range (device per call)", d["range_device_time"], "")
    if d["kernels"]:
        section("device kernel (per launch)", d["kernels"], "")
    section("operator (self CPU per call)", d["operators"], "(no operator on either side)")
    lines.append(rule)
    labels = [("self_cpu_time_total_us", "Self CPU time total per window")]
    dev = d["totals"]["self_device_time_total_us"]
    if dev["before_us"] or dev["after_us"]:
        labels.append(("self_device_time_total_us", "Self CUDA time total per window"))
    for key, label in labels:
        lines.append(row(label, _change(d["totals"][key]) + f"{'':>14}"))
    return "\n".join(line.rstrip() for line in lines) + "\n"
