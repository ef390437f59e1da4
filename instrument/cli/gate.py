"""``torch-profiled diff A B --fail-over 10%``: a regression gate over two sides of windows.

Per range, one figure per call (``--metric``): ``cpu`` (inclusive CPU time per call), ``device``
(device time per call) or ``flops`` (achieved FLOP/s: the range's FLOPs over its device time,
or over its CPU time where a side ran none on a device). Each window gives one value, per call,
so one window compares fairly with three: for ``cpu`` and ``device`` the median of its calls'
durations (``per_window: "median call"``; the trace holds each call), for ``flops`` and where
a window's calls are not all known its time over its calls (``"mean"``, then on both sides).
Why the median call: a late wake-up on a busy runner slows single calls, and a window's mean
carries each of them; with one or two slowed calls in every baseline window (load average 6
on two cores) the means raised the baseline's floor by over 2 ms a call of 20 and passed a 1.2x
regression.

The rule, three outcomes, on the noise floor. A shared runner only ever adds time (a
descheduled thread, a neighbour's burst): its windows spread upward, never below what the code
costs. So each side's floor lies between its best and its second-best window (for FLOP/s, the
highest), and the change lies between best after / second-best before (``low``) and second-best
after / best before (``high``). A range is a *regression* when even ``low`` is worse than the
threshold, a *pass* when even ``high`` is within it, and *inconclusive* otherwise, or with
fewer than ``MIN_WINDOWS`` windows a side (one a side: always); an inconclusive verdict says
about how many windows a side would settle it. One slow window (descheduled, 75x) never
touches a floor; one window alone never sets it (a lone fast one widens the bounds, so it can
turn a verdict inconclusive, never into its opposite). Why not pooled means against a max-min
spread, as before: on a shared runner one descheduled window decided both ways, failing
identical runs and passing a 4x regression. What this cannot see: a side whose every window
ran slowed (the whole baseline on a busier runner) has a floor too high; record both sides in
one job where that matters.

Not comparable (a failure unless ``allow_mismatch``, then skipped): the sides ran on
different devices or world sizes, or a range's operators saw different input shapes (only
checked where both sides recorded shapes; otherwise the verdict says so), or a range named
with ``--range`` exists on one side only, or a side has no window whose ``report.health`` is
complete (a window that lost events is left out, with a note naming it, unless
``allow_partial``). A range on one side only, not named, is listed as skipped. Bad input
(``GateError``): a bad threshold, a ``--range`` on neither side, no range on both sides, no
device time (``device``) or no FLOPs (``flops``) in either.

Exit status: 0 pass, 1 a regression or a range not comparable, 3 inconclusive (no regression,
nothing not comparable, and at least one range the windows cannot settle); the CLI's 2 is bad
input.

No torch imports and nothing from ``instrument.cli``.
"""

from __future__ import annotations

import math
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from instrument.base.formatting import WIDTH, fit, format_time_us

from .diff import MEAN, MEDIAN_CALL, Side, per_call, per_window, side_doc
from .inputs import printable

__all__ = [
    "EXIT_INCONCLUSIVE",
    "METRICS",
    "MIN_WINDOWS",
    "GateError",
    "GateOptions",
    "format_gate",
    "gate",
    "floor_bounds",
    "junit_xml",
    "parse_threshold",
    "windows_to_settle",
]

METRICS = ("cpu", "device", "flops")
PASS, REGRESSION, NOT_COMPARABLE, SKIPPED = "pass", "regression", "not comparable", "skipped"
INCONCLUSIVE = "inconclusive"
EXIT_INCONCLUSIVE = 3  # 0 pass, 1 regression or not comparable, 2 bad input (the CLI's)
# a side: with fewer, the two best windows of a side are too likely to have been slowed too
# (under load on the 2-core box, a run of eight had one undisturbed window): inconclusive
MIN_WINDOWS = 5
RECOMMENDED_WINDOWS = 8  # a side: the README's CI recipe (baseline and candidate taking turns)
SETTLE_MAX = 100  # windows a side: more than this is no advice
SUITE = "torch-profiled diff"
_PCT = re.compile(r"\s*(-?)([0-9]+(?:\.[0-9]+)?)\s*%?\s*")


class GateError(Exception):
    """Bad input for the gate: ``what`` was wrong, ``expected`` what would do."""

    def __init__(self, what: str, expected: str) -> None:
        super().__init__(f"{what}; {expected}")
        self.what = what
        self.expected = expected


def parse_threshold(text: str) -> float:
    """``10%`` (or ``10``) -> 0.10; anything else (``ten%``, ``-5%``, ``nan``) raises."""
    m = _PCT.fullmatch(text)
    expected = "expected a number >= 0 with an optional %, e.g. --fail-over 10%"
    if not m:
        raise GateError(f"--fail-over {text!r} is not a percentage", expected)
    if m.group(1):
        raise GateError(f"--fail-over {text!r} is negative", expected)
    return float(m.group(2)) / 100.0


@dataclass(frozen=True)
class GateOptions:
    threshold: float
    metric: str = "cpu"
    names: tuple[str, ...] = ()  # --range: only these (all ranges on both sides when empty)
    allow_mismatch: bool = False
    allow_partial: bool = False  # --allow-partial: gate windows whose health is not complete


# ---------------------------------------------------------------- figures


def _figure(side: Side, name: str, metric: str, basis: str, rule: str) -> dict[str, Any] | None:
    """A side's figure for one range: its floor (the second-best window's value, what is
    compared; the only one's with one window), the best, the median, each window's value
    (``rule``: its median call or its mean, ``diff.per_window``), the pooled value (all time
    over all calls) and the spread ((max - min) / median)."""
    if metric == "flops":
        values, calls, pooled = _flops(side, name, basis)
    else:
        values, calls, pooled = per_call(side, name, metric, rule)
    if not calls:
        return None
    mid = _median(values)
    spread = (max(values) - min(values)) / mid if len(values) > 1 and mid > 0 else 0.0
    best_first = sorted(values, reverse=metric == "flops")
    floor = best_first[1] if len(values) > 1 else best_first[0]
    # per step (ProfilerStep#N spans; none in a trace without a schedule): calls and time
    steps = sum(len(w.report.steps) for w in side.windows if name in w.report.ranges)
    return {
        "value": floor,
        "best": best_first[0],
        "median": mid,
        "windows": values,
        "pooled": pooled,
        "calls": calls,
        "spread": spread,
        "steps": steps,
        "calls_per_step": calls / steps if steps else None,
        "per_step": floor * calls / steps if steps and metric != "flops" else None,
    }


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _flops(side: Side, name: str, basis: str) -> tuple[list[float], int, float]:
    """Achieved FLOP/s per window and pooled (all FLOPs over all the time, ``basis`` time)."""
    values: list[float] = []
    calls, flops, secs = 0, 0, 0.0
    for w in side.windows:
        r = w.report.ranges.get(name)
        if r is None or not r.calls:
            continue
        t = (r.device_time_us if basis == "device" else r.cpu_time_us) * 1e-6
        values.append(r.flops / t if t > 0 else 0.0)
        calls += r.calls
        flops += r.flops
        secs += t
    return values, calls, (flops / secs if secs > 0 else 0.0)


def _flops_basis(before: Side, after: Side, name: str) -> str:
    """Device time where every window of both sides ran the range's work on a device."""
    stats = [w.report.ranges.get(name) for s in (before, after) for w in s.windows]
    ran = [r for r in stats if r is not None]
    return "device" if ran and all(r.device_time_us > 0 for r in ran) else "cpu"


# ---------------------------------------------------------------- the statistic


def _ratio(after: float, before: float) -> float:
    if before > 0:
        return after / before
    return math.inf if after > 0 else 1.0


def floor_bounds(before: Sequence[float], after: Sequence[float]) -> tuple[float, float, float]:
    """(estimate, low, high) of the change of the noise floor, as the ratio after/before of
    costs (per-call times; lower is better). Each side's floor lies between its best and its
    second-best window: a shared runner only adds time, so the best windows are the least
    disturbed, and the second-best means no window alone sets the floor. The estimate is
    the ratio of the second-best windows; ``low`` = best after / second-best before, ``high``
    = second-best after / best before. Needs two windows a side."""
    b, a = sorted(before)[:2], sorted(after)[:2]
    return _ratio(a[1], b[1]), _ratio(a[0], b[1]), _ratio(a[1], b[0])


def windows_to_settle(before: Sequence[float], after: Sequence[float], bar: float) -> int | None:
    """About how many windows a side would settle a range the windows left inconclusive
    (``bar``: the cost ratio at the threshold). With fewer than ``MIN_WINDOWS``, that many.
    Else a side whose second-best window is not near its best (within half the threshold)
    had too few undisturbed windows: enough windows that about three of them would be
    (``3 / share``, the share of its windows near its best so far). None when both sides
    already have their floor pinned: the change sits about at the threshold, and more windows
    would not move it off (nor past ``SETTLE_MAX``)."""
    n = min(len(before), len(after))
    if n < MIN_WINDOWS:
        return MIN_WINDOWS
    near = 1.0 + (bar - 1.0) / 2 if math.isfinite(bar) else 2.0
    need = 0
    for side in (before, after):
        best = min(side)
        k = sum(v <= best * near for v in side)
        if k < 2:
            need = max(need, math.ceil(3 * len(side) / k))
    if not need or need > SETTLE_MAX:
        return None
    return max(need, n + 1)


# ---------------------------------------------------------------- comparability


def _side_problems(before: Side, after: Side) -> list[str]:
    problems = []
    if before.devices != after.devices:
        problems.append(
            f"device differs: {', '.join(before.devices)} before, {', '.join(after.devices)} after"
        )
    if before.world_sizes != after.world_sizes:
        ws_b = ", ".join(map(str, before.world_sizes))
        ws_a = ", ".join(map(str, after.world_sizes))
        problems.append(f"world size differs: {ws_b} before, {ws_a} after")
    return problems


def _shape_problem(before: Side, after: Side, name: str) -> str | None:
    b, a = before.shapes_of(name), after.shapes_of(name)
    if b is None or a is None or b.keys() == a.keys():
        return None
    gone = [s for s in b if s not in a]
    new = [s for s in a if s not in b]
    parts = []
    if gone:
        parts.append(f"before only: {gone[0]}" + (f" (+{len(gone) - 1} more)" if gone[1:] else ""))
    if new:
        parts.append(f"after only: {new[0]}" + (f" (+{len(new) - 1} more)" if new[1:] else ""))
    return "input shapes differ (" + "; ".join(parts) + ")"


def _shape_notes(before: Side, after: Side) -> list[str]:
    missing = [
        label for label, s in (("before", before), ("after", after)) if not s.shapes_recorded
    ]
    if not missing:
        return []
    return [
        f"input shapes not recorded {' and '.join(missing)} (record_shapes): shapes not "
        "compared, not a mismatch"
    ]


# ---------------------------------------------------------------- verdicts


def _check_input(before: Side, after: Side, opts: GateOptions) -> list[str]:
    """The ranges to gate; ``GateError`` for what the traces cannot answer."""
    both = before.range_names() & after.range_names()
    either = before.range_names() | after.range_names()
    if opts.names:
        gone = [n for n in opts.names if n not in either]
        if gone:
            there = ", ".join(repr(n) for n in sorted(either)[:20]) or "none"
            raise GateError(
                f"--range {', '.join(map(repr, gone))}: no such range on either side "
                f"(ranges there: {there})",
                "expected a range of the traces",
            )
        names = list(opts.names)
    else:
        names = sorted(either)
        if not both:
            raise GateError(
                "no range is on both sides, nothing to gate",
                "expected traces of the same program, with record_function or @profiled ranges",
            )
    stats = [r for s in (before, after) for w in s.windows for r in w.report.ranges.values()]
    if opts.metric == "device" and not any(r.device_time_us for r in stats):
        raise GateError(
            "--metric device: no device time on either side (CPU-only traces)",
            "expected traces with device activity (CUDA), or --metric cpu",
        )
    if opts.metric == "flops" and not any(r.flops for r in stats):
        raise GateError(
            "--metric flops: no FLOPs on either side",
            "expected traces recorded with record_shapes=True or with_flops=True "
            "(PROFILED_RECORD_SHAPES=1), or --metric cpu",
        )
    return names


def _verdict(
    before: Side, after: Side, name: str, opts: GateOptions, problems: list[str], lost: str | None
) -> dict[str, Any]:
    """One range's verdict over the windows gated (``lost``: why its windows on a side were all
    left out, their health not complete)."""
    basis = _flops_basis(before, after, name) if opts.metric == "flops" else opts.metric
    # a window's value: its median call where both sides hold every call's time (FLOP/s: the
    # window's FLOPs over its time, as ever)
    rule = MEAN if opts.metric == "flops" else per_window((before, after), name, opts.metric)
    b = _figure(before, name, opts.metric, basis, rule)
    a = _figure(after, name, opts.metric, basis, rule)
    out: dict[str, Any] = {"name": name, "metric": opts.metric, "before": b, "after": a}
    out["basis"] = basis
    out["per_window"] = rule
    if lost:
        return _mismatch(out, [lost], opts)
    if b is None or a is None:
        where = "after" if b is None else "before"
        reason = f"only {where}: not on the other side"
        if opts.names:
            return _mismatch(out, [reason], opts)
        return dict(out, status=SKIPPED, reason=reason)
    shape = _shape_problem(before, after, name)
    found = problems + ([shape] if shape else [])
    if found:
        return _mismatch(out, found, opts)
    if not (b["value"] or a["value"]):
        what = "FLOPs" if opts.metric == "flops" else f"{opts.metric} time"
        return dict(out, status=SKIPPED, reason=f"no {what} on either side")
    verdict = _judge(out, b, a, opts)
    if b["calls_per_step"] and a["calls_per_step"] and b["calls_per_step"] != a["calls_per_step"]:
        verdict["reason"] += (
            f"; calls per step {b['calls_per_step']:g} -> {a['calls_per_step']:g}"
            + _per_step_text(b, a, opts.metric)
        )
    return verdict


def _per_step_text(b: dict[str, Any], a: dict[str, Any], metric: str) -> str:
    if b["per_step"] is None or a["per_step"] is None:
        return ""
    return f" (per step {_fmt(b['per_step'], metric)} -> {_fmt(a['per_step'], metric)})"


def _mismatch(out: dict[str, Any], reasons: list[str], opts: GateOptions) -> dict[str, Any]:
    reason = "not comparable: " + "; ".join(reasons)
    if opts.allow_mismatch:
        return dict(out, status=SKIPPED, reason=reason + " (--allow-mismatch)", mismatch=True)
    return dict(out, status=NOT_COMPARABLE, reason=reason, mismatch=True)


def _judge(
    out: dict[str, Any], b: dict[str, Any], a: dict[str, Any], opts: GateOptions
) -> dict[str, Any]:
    """Regression, pass or inconclusive, from the bounds on the change of the noise floor.
    Judged on costs (time per call; for FLOP/s, its inverse, time per FLOP), so worse is up
    and the threshold's bar is 1 + PCT (for FLOP/s a drop past PCT: 1 / (1 - PCT))."""
    flops = opts.metric == "flops"
    bv, av = b["value"], a["value"]
    change = (av - bv) / bv if bv > 0 else (math.inf if av > 0 else 0.0)
    t = opts.threshold
    bar = (1.0 / (1.0 - t) if t < 1.0 else math.inf) if flops else 1.0 + t
    n, m = len(b["windows"]), len(a["windows"])
    what = "FLOP/s" if flops else f"{opts.metric} time per call"
    told = (
        f"{what} {_fmt(bv, opts.metric)} -> {_fmt(av, opts.metric)} ({_pct(change)}; the "
        f"floors of {n} and {m} window{'s' if m != 1 else ''}{_rule_text(out)})"
    )
    out.update(change=_finite(change), worse_by=_finite(-change if flops else change))
    out.update(low=None, high=None, settle_windows=None)
    pct = _pct(-t if flops else t)
    status = INCONCLUSIVE
    if min(n, m) < MIN_WINDOWS:
        why = f"too few windows to claim anything (the gate needs {MIN_WINDOWS} a side)"
    else:
        _est, lo, hi = floor_bounds(_costs(b["windows"], flops), _costs(a["windows"], flops))
        # the same bounds in the metric's own terms (FLOP/s: the inverse of the cost ratio)
        low, high = (_inv(hi) - 1.0, _inv(lo) - 1.0) if flops else (lo - 1.0, hi - 1.0)
        out.update(low=_finite(low), high=_finite(high))
        span = f"between {_pct(low)} and {_pct(high)} (the floors' bounds)"
        if lo > bar:
            status, why = REGRESSION, f"{span}, past the {pct} threshold"
        elif hi <= bar:
            status, why = PASS, f"{span}, within the {pct} threshold"
        else:
            why = f"{span}, the {pct} threshold inside"
    if status != INCONCLUSIVE:
        return dict(out, status=status, reason=f"{told}: {why}")
    b_costs, a_costs = _costs(b["windows"], flops), _costs(a["windows"], flops)
    settle = windows_to_settle(b_costs, a_costs, bar)
    out["settle_windows"] = settle
    if settle is None:
        why += (
            "; the change sits about at the threshold: more windows would not settle it, "
            "a threshold further from it would"
        )
    elif min(n, m) < MIN_WINDOWS:
        why += (
            f"; at least {settle} windows a side would settle it ({RECOMMENDED_WINDOWS} "
            "recommended)"
        )
    else:
        why += f"; about {settle} windows a side would settle it"
    return dict(out, status=INCONCLUSIVE, reason=f"{told}: {why}")


def _rule_text(out: dict[str, Any]) -> str:
    return ", each its median call" if out.get("per_window") == MEDIAN_CALL else ""


def _costs(values: Sequence[float], flops: bool) -> list[float]:
    """Lower is better: times as they are, FLOP/s inverted (0 FLOP/s costs infinity)."""
    return [_inv(v) for v in values] if flops else list(values)


def _inv(x: float) -> float:
    return 1.0 / x if x > 0 else math.inf


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _pct(x: float, sign: bool = True) -> str:
    if not math.isfinite(x):
        return "new"
    pct = round(x * 100, 1) + 0.0  # never "-0.0%"
    return f"{pct:+.1f}%" if sign else f"{pct:.1f}%"


def _fmt(value: float, metric: str) -> str:
    if metric == "flops":
        for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if value >= scale:
                return f"{value / scale:.2f} {unit}FLOP/s"
        return f"{value:.0f} FLOP/s"
    return format_time_us(value)


def _health_split(side: Side, allow: bool) -> tuple[Side, list[dict[str, Any]]]:
    """The windows to gate and those whose health is not complete (left out unless
    ``allow``): each as its trace, status and reasons."""
    traces = side.traces if len(side.traces) == len(side.windows) else ()
    named = [(traces[i] if traces else f"window {i}", w) for i, w in enumerate(side.windows)]
    sick = [
        {"trace": t, "health": w.report.health.status, "why": str(w.report.health)}
        for t, w in named
        if not w.report.health.complete
    ]
    if not sick or allow:
        return side, sick
    keep = [(t, w) for t, w in named if w.report.health.complete]
    kept = replace(
        side,
        traces=tuple(t for t, _ in keep) if traces else side.traces,
        windows=tuple(w for _, w in keep),
    )
    return kept, sick


def _health_notes(label: str, sick: list[dict[str, Any]], allow: bool) -> list[str]:
    if not sick:
        return []
    what = "gated anyway (--allow-partial)" if allow else "left out, not comparable"
    n = len(sick)
    items = "; ".join(f"{s['trace']} ({s['why']})" for s in sick)
    return [f"{label}: {n} window{'s' if n != 1 else ''} not complete, {what}: {items}"]


def _lost(full: Side, kept: Side, label: str, name: str) -> str | None:
    """Why ``name`` has no window left on a side: every window holding it lost events."""
    if name not in full.range_names() or name in kept.range_names():
        return None
    return (
        f"every window {label} holding it is not complete (health), left out; "
        "--allow-partial gates them anyway"
    )


def gate(before: Side, after: Side, opts: GateOptions) -> dict[str, Any]:
    """The verdicts: one per range, and the outcome (``exit_status`` 0 pass, 1 a regression
    or a range not comparable, ``EXIT_INCONCLUSIVE`` when the rest is pass and at least one
    range is inconclusive)."""
    names = _check_input(before, after, opts)
    problems = _side_problems(before, after)
    b_kept, b_sick = _health_split(before, opts.allow_partial)
    a_kept, a_sick = _health_split(after, opts.allow_partial)
    verdicts = []
    for n in names:
        lost = _lost(before, b_kept, "before", n) or _lost(after, a_kept, "after", n)
        verdicts.append(_verdict(b_kept, a_kept, n, opts, problems, lost))
    order = {REGRESSION: 0, NOT_COMPARABLE: 1, INCONCLUSIVE: 2, PASS: 3, SKIPPED: 4}
    verdicts.sort(key=lambda v: (order[v["status"]], -(v.get("worse_by") or 0.0), v["name"]))
    counts = {s: sum(v["status"] == s for v in verdicts) for s in order}
    if counts[REGRESSION] or counts[NOT_COMPARABLE]:
        status = 1
        outcome = REGRESSION if counts[REGRESSION] else NOT_COMPARABLE
    elif counts[INCONCLUSIVE]:
        status, outcome = EXIT_INCONCLUSIVE, INCONCLUSIVE
    else:
        status, outcome = 0, PASS
    notes = _shape_notes(before, after)
    notes += _health_notes("before", b_sick, opts.allow_partial)
    notes += _health_notes("after", a_sick, opts.allow_partial)
    return {
        "metric": opts.metric,
        "fail_over": opts.threshold,
        "allow_mismatch": opts.allow_mismatch,
        "allow_partial": opts.allow_partial,
        "min_windows": MIN_WINDOWS,
        "rule": RULE,
        "before": dict(_side_summary(before), not_complete=b_sick),
        "after": dict(_side_summary(after), not_complete=a_sick),
        "problems": problems,
        "notes": notes,
        "verdicts": verdicts,
        "counts": {k.replace(" ", "_"): n for k, n in counts.items()},
        "outcome": outcome,
        "passed": status == 0,
        "exit_status": status,
    }


RULE = (
    "per window, the range's figure per call (cpu and device: its median call, where the "
    "traces hold every call's time, else its time over its calls: per_window says which); "
    "per side, the floor between its best and its "
    "second-best window; regression when even the lowest ratio of floors (best after over "
    "second-best before) is worse than fail_over, pass when even the highest (second-best "
    "after over best before) is within it, inconclusive otherwise or with fewer than "
    f"{MIN_WINDOWS} windows a side"
)


def _side_summary(side: Side) -> dict[str, Any]:
    """What ``diff`` says of a side, and whether its shapes were recorded."""
    return {**side_doc(side), "shapes_recorded": side.shapes_recorded}


# ---------------------------------------------------------------- text and JUnit


def format_gate(g: dict[str, Any]) -> str:
    """The verdicts, a line each, then the outcome (lines within ``WIDTH``, reasons wrapped)."""
    c = g["counts"]
    head = (
        f"torch-profiled diff --fail-over {g['fail_over'] * 100:g}% | metric {g['metric']} "
        "| per call: each side's floor (its best windows)"
    )
    lines = [fit(head, WIDTH)]
    for label in ("before", "after"):
        s = g[label]
        lines.append(
            f"{label + ':':<8}{s['path']} ({s['windows']} window{'s' if s['windows'] != 1 else ''}"
            f", {', '.join(s['devices'])})"
        )
    for note in g["notes"]:
        lines += _wrap(f"note: {note}", "")
    lines.append("-" * WIDTH)
    for v in g["verdicts"]:
        lines.append(f"{v['status'].upper():<15} {v['name']}")
        lines += _wrap(v["reason"], "    ")
    lines.append("-" * WIDTH)
    outcome = {0: "passed", EXIT_INCONCLUSIVE: "INCONCLUSIVE"}.get(g["exit_status"], "FAILED")
    lines.append(
        f"{outcome}: {c['regression']} regression(s), {c['not_comparable']} not comparable, "
        f"{c['inconclusive']} inconclusive, {c['pass']} passed, {c['skipped']} skipped"
    )
    return "\n".join(lines) + "\n"


def _wrap(text: str, indent: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def junit_xml(g: dict[str, Any], text: str = "") -> bytes:
    """The verdicts as JUnit XML (Jenkins, GitLab, GitHub test reporters): one testsuite
    ``torch-profiled diff``, one testcase per gated range; a regression is a ``failure``, a
    range not comparable an ``error`` (``skipped`` with ``allow_mismatch``), an inconclusive
    range ``skipped`` with a message that starts ``inconclusive:`` (JUnit has no third
    outcome; the suite's ``outcome`` and ``exit_status`` properties say it for the run).

    Valid XML 1.0 whatever the names hold: characters XML cannot carry at all (controls such
    as ESC, lone surrogates) are written as their escapes (``\\x1b``, ``\\udcff``;
    ``traces.printable``), as the text table shows them, and the rest is XML-escaped."""
    c = g["counts"]
    tests = len(g["verdicts"])
    attrs = (
        f'name="{SUITE}" tests="{tests}" failures="{c["regression"]}" '
        f'errors="{c["not_comparable"]}" time="0"'
    )
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    host = quoteattr(socket.gethostname() or "localhost")
    out = ['<?xml version="1.0" encoding="UTF-8"?>', f"<testsuites {attrs}>"]
    skipped = c["skipped"] + c["inconclusive"]  # JUnit's nearest: neither passed nor failed
    out.append(f'  <testsuite {attrs} skipped="{skipped}" timestamp="{stamp}" hostname={host}>')
    out.append("    <properties>")
    props = {
        "metric": g["metric"],
        "fail_over": f"{g['fail_over'] * 100:g}%",
        "allow_mismatch": str(g["allow_mismatch"]).lower(),
        "allow_partial": str(g["allow_partial"]).lower(),
        "min_windows": str(g["min_windows"]),
        "outcome": g["outcome"],
        "exit_status": str(g["exit_status"]),
        "inconclusive": str(c["inconclusive"]),
    }
    for key, value in props.items():
        out.append(f"      <property name={quoteattr(key)} value={quoteattr(value)}/>")
    for label in ("before", "after"):
        out.append(f"      <property name={quoteattr(label)} value={_attr(g[label]['path'])}/>")
    out.append("    </properties>")
    for v in g["verdicts"]:
        out.append(_testcase(v, g["metric"]))
    out.append(f"    <system-out>{escape(printable(text, newlines=True))}</system-out>")
    out.append("    <system-err></system-err>")
    out.append("  </testsuite>")
    out.append("</testsuites>")
    return ("\n".join(out) + "\n").encode("utf-8")


def _attr(text: str) -> str:
    """An XML attribute value (quoted) for text from the traces."""
    return quoteattr(printable(text))


def _testcase(v: dict[str, Any], metric: str) -> str:
    classname = quoteattr(f"torch-profiled.diff.{metric}")
    head = f'    <testcase name={_attr(v["name"])} classname={classname} time="0"'
    reason = _attr(v["reason"])
    body_text = escape(printable(v["reason"]))
    if v["status"] == REGRESSION:
        body = f'<failure message={reason} type="regression">{body_text}</failure>'
    elif v["status"] == NOT_COMPARABLE:
        body = f'<error message={reason} type="not comparable">{body_text}</error>'
    elif v["status"] == SKIPPED:
        body = f"<skipped message={reason}/>"
    elif v["status"] == INCONCLUSIVE:
        said = "inconclusive: " + v["reason"]
        body = f"<skipped message={_attr(said)}>{escape(printable(said))}</skipped>"
    else:
        return head + "/>"
    return f"{head}>{body}</testcase>"
