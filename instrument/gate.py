"""``torch-profiled diff A B --fail-over 10%``: a regression gate over two sides of windows.

Per range, one figure per call (``--metric``): ``cpu`` (inclusive CPU time per call), ``device``
(device time per call) or ``flops`` (achieved FLOP/s: the range's FLOPs over its device time,
or over its CPU time where a side ran none on a device). Each window gives one value (its time
over its calls); a side's figure is the median of its windows' values, so one window compares
fairly with three and one descheduled window does not decide.

The rule, three outcomes. The windows are the samples: every pair (a window before, a window
after) gives a ratio after/before, and the rank (Mann-Whitney) confidence bounds on the change
are order statistics of those ratios (Hodges-Lehmann; exact for up to 40 windows a side, the
normal approximation above): at 95% confidence, one-sided each, the change is at least ``low``
and at most ``high``. Then a range is a *regression* when even ``low`` is worse than the
threshold, a *pass* when even ``high`` is within it, and *inconclusive* otherwise: the windows
cannot tell, and the verdict says about how many windows a side would settle it (from the
spread of the windows' values and the change's distance to the threshold). A bound must also
leave out at least as many extreme pairs as one window forms (``max(n, m)``), so one outlier
window cannot move it; with fewer windows than that (one a side: always) the range is
inconclusive. Why not pooled means against a max-min spread, as before: on a shared runner one
descheduled window (75x slower) decided both ways, failing identical runs and passing a 4x
regression.

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
from functools import lru_cache
from statistics import NormalDist
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from exporters._format import WIDTH, fit, format_time_us

from .diff import Side, per_call, side_doc
from .traces import printable

__all__ = [
    "CONFIDENCE",
    "EXIT_INCONCLUSIVE",
    "METRICS",
    "GateError",
    "GateOptions",
    "format_gate",
    "gate",
    "interval",
    "junit_xml",
    "parse_threshold",
    "fewest_windows",
    "windows_to_settle",
]

METRICS = ("cpu", "device", "flops")
PASS, REGRESSION, NOT_COMPARABLE, SKIPPED = "pass", "regression", "not comparable", "skipped"
INCONCLUSIVE = "inconclusive"
EXIT_INCONCLUSIVE = 3  # 0 pass, 1 regression or not comparable, 2 bad input (the CLI's)
CONFIDENCE = 0.95  # each bound, one-sided: a 90% interval
EXACT_UP_TO = 40  # windows a side: the rank statistic's exact distribution; above, the normal
SETTLE_MAX = 100  # windows a side: beyond this the change sits at the threshold
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


def _figure(side: Side, name: str, metric: str, basis: str) -> dict[str, Any] | None:
    """A side's figure for one range: the median of its windows' values (what is compared),
    each window's value, the pooled value (all time over all calls) and the spread."""
    if metric == "flops":
        values, calls, pooled = _flops(side, name, basis)
    else:
        values, calls, pooled = per_call(side, name, metric)
    if not calls:
        return None
    mid = _median(values)
    spread = (max(values) - min(values)) / mid if len(values) > 1 and mid > 0 else 0.0
    # per step (ProfilerStep#N spans; none in a trace without a schedule): calls and time
    steps = sum(len(w.report.steps) for w in side.windows if name in w.report.ranges)
    return {
        "value": mid,
        "windows": values,
        "pooled": pooled,
        "calls": calls,
        "spread": spread,
        "steps": steps,
        "calls_per_step": calls / steps if steps else None,
        "per_step": mid * calls / steps if steps and metric != "flops" else None,
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

_Z = NormalDist().inv_cdf(CONFIDENCE)


def _u_counts(n: int, m: int) -> list[int]:
    """How many of the C(n+m, n) orders of n windows before and m after give each value
    0..n*m of the Mann-Whitney U: the coefficients of the Gaussian binomial [n+m, n]_q,
    prod_{i=1..n} (1 - q^(m+i)) / (1 - q^i), computed as power series cut at degree n*m."""
    size = n * m + 1
    poly = [1] + [0] * (size - 1)
    for i in range(1, n + 1):
        for u in range(size - 1, m + i - 1, -1):  # times (1 - q^(m+i))
            poly[u] -= poly[u - m - i]
        for u in range(i, size):  # over (1 - q^i)
            poly[u] += poly[u - i]
    return poly


@lru_cache(maxsize=256)
def _excluded(n: int, m: int) -> int | None:
    """How many of the n*m pairwise ratios a one-sided bound at ``CONFIDENCE`` leaves out at
    each end: the largest c with P(U <= c) <= 1 - CONFIDENCE (exact up to ``EXACT_UP_TO``
    windows a side, then the normal approximation); None when no bound is that sure."""
    alpha = 1.0 - CONFIDENCE
    if max(n, m) > EXACT_UP_TO:
        sd = math.sqrt(n * m * (n + m + 1) / 12)
        c = math.floor(n * m / 2 - _Z * sd - 0.5)
        return c if c >= 0 else None
    counts = _u_counts(min(n, m), max(n, m))
    total = math.comb(n + m, n)
    found, cum = None, 0
    for u, k in enumerate(counts):
        cum += k
        if cum > alpha * total:
            break
        found = u
    return found


def _pair_ratio(after: float, before: float) -> float:
    if before > 0:
        return after / before
    return math.inf if after > 0 else 1.0


def interval(before: Sequence[float], after: Sequence[float]) -> tuple[float, float] | None:
    """The bounds on after/before from the windows' values: each holds with ``CONFIDENCE``
    (Mann-Whitney/Hodges-Lehmann: order statistics of the pairwise ratios). None when the
    windows are too few for bounds that one window cannot move: a bound must leave out at
    least the ``max(n, m)`` pairs one window forms (one window a side: never)."""
    n, m = len(before), len(after)
    c = _excluded(n, m) if n and m else None
    if c is None or c < max(n, m):
        return None
    ratios = sorted(_pair_ratio(a, b) for b in before for a in after)
    return ratios[c], ratios[n * m - 1 - c]


@lru_cache(maxsize=1)
def fewest_windows() -> int:
    """The fewest windows a side (equal sides) that give bounds one window cannot move."""
    n = 1
    while interval([1.0] * n, [1.0] * n) is None:
        n += 1
    return n


def _log_sd(values: Sequence[float]) -> float | None:
    """A robust standard deviation of log(values): 1.4826 x the median absolute deviation."""
    logs = [math.log(v) for v in values if v > 0]
    if len(logs) < 2:
        return None
    mid = _median(logs)
    return 1.4826 * _median([abs(x - mid) for x in logs])


def windows_to_settle(before: Sequence[float], after: Sequence[float], bar: float) -> int | None:
    """About how many windows a side would put both bounds on one side of ``bar`` (the ratio
    after/before at the threshold), judged from the windows' spread (robust, on the log
    scale) and how far the change (ratio of medians) is from ``bar``; at least
    ``fewest_windows()`` and more than the shorter side has (only that where no side has two
    windows to judge the spread from). None: more than ``SETTLE_MAX`` (the change sits about
    at the threshold)."""
    sds = [sd for sd in (_log_sd(before), _log_sd(after)) if sd is not None]
    floor = max(fewest_windows(), min(len(before), len(after)) + 1)
    mb, ma = _median(before), _median(after)
    if not sds or mb <= 0 or ma <= 0 or bar <= 0:
        return floor
    sigma = math.sqrt(sum(sd * sd for sd in sds) / len(sds))
    delta = abs(math.log(ma / mb) - math.log(bar))
    if delta == 0:
        return None
    # two samples of n: the difference's standard error is sigma * sqrt(2 / n); Hodges-
    # Lehmann is ~95% as efficient as the mean on normal data
    need = math.ceil(2 * (_Z * sigma / delta) ** 2 / 0.95)
    return max(floor, need) if need <= SETTLE_MAX else None


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
    b = _figure(before, name, opts.metric, basis)
    a = _figure(after, name, opts.metric, basis)
    out: dict[str, Any] = {"name": name, "metric": opts.metric, "before": b, "after": a}
    out["basis"] = basis
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
    """Regression, pass or inconclusive, from the bounds on the change (after/before - 1).
    Worse is up for time, down for FLOP/s: the threshold's bar is 1 + PCT or 1 - PCT."""
    bv, av = b["value"], a["value"]
    change = (av - bv) / bv if bv > 0 else (math.inf if av > 0 else 0.0)
    flops = opts.metric == "flops"
    worse = -change if flops else change
    bar = 1.0 - opts.threshold if flops else 1.0 + opts.threshold
    bounds = interval(b["windows"], a["windows"])
    low, high = (None, None) if bounds is None else (bounds[0] - 1.0, bounds[1] - 1.0)
    out.update(
        change=_finite(change),
        worse_by=_finite(worse),
        low=_finite(low) if low is not None else None,
        high=_finite(high) if high is not None else None,
        confidence=CONFIDENCE,
    )
    n, m = len(b["windows"]), len(a["windows"])
    what = "FLOP/s" if flops else f"{opts.metric} time per call"
    told = (
        f"{what} {_fmt(bv, opts.metric)} -> {_fmt(av, opts.metric)} ({_pct(change)}; medians"
        f" of {n} and {m} window{'s' if m != 1 else ''})"
    )
    pct = _pct(-opts.threshold if flops else opts.threshold)
    sure = f"{CONFIDENCE * 100:g}% bound"
    if low is None or high is None:
        why = (
            f"too few windows for bounds that one window cannot move (the "
            f"fewest: {fewest_windows()} a side)"
        )
    elif (high < -opts.threshold) if flops else (low > opts.threshold):
        edge = high if flops else low
        side = "at most" if flops else "at least"
        why = f"{side} {_pct(edge)} ({sure}), past the {pct} threshold"
        return dict(out, status=REGRESSION, reason=f"{told}: {why}")
    elif (low >= -opts.threshold) if flops else (high <= opts.threshold):
        edge = low if flops else high
        side = "at least" if flops else "at most"
        why = f"{side} {_pct(edge)} ({sure}), within the {pct} threshold"
        return dict(out, status=PASS, reason=f"{told}: {why}")
    else:
        interval_pct = round(100 - 2 * (100 - CONFIDENCE * 100))
        why = (
            f"between {_pct(low)} and {_pct(high)} ({interval_pct}% interval), "
            f"the {pct} threshold inside"
        )
    settle = windows_to_settle(b["windows"], a["windows"], bar)
    out["settle_windows"] = settle
    if settle is None:
        why += (
            f"; the change sits about at the threshold: over {SETTLE_MAX} windows a side "
            "would settle it"
        )
    elif max(n, m) < 2:
        why += f"; at least {settle} windows a side would settle it (one shows no spread)"
    else:
        why += f"; about {settle} windows a side would settle it"
    return dict(out, status=INCONCLUSIVE, reason=f"{told}: {why}")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _pct(x: float, sign: bool = True) -> str:
    if not math.isfinite(x):
        return "new"
    return f"{x * 100:+.1f}%" if sign else f"{x * 100:.1f}%"


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
        "confidence": CONFIDENCE,
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
    "per window, the range's figure per call; per pair of windows (before, after) the ratio; "
    f"the change's {CONFIDENCE * 100:g}% rank bounds (Mann-Whitney/Hodges-Lehmann, leaving out "
    "at least the pairs one window forms): regression when even the lower bound is past the "
    "threshold, pass when even the upper bound is within it, inconclusive otherwise"
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
        f"| per call: medians of windows, {g['confidence'] * 100:g}% rank bounds"
    )
    lines = [fit(head, WIDTH)]
    for label in ("before", "after"):
        s = g[label]
        lines.append(
            f"{label + ':':<8}{s['path']} ({s['windows']} window{'s' if s['windows'] != 1 else ''}"
            f", {', '.join(s['devices'])})"
        )
    lines += [f"note: {n}" for n in g["notes"]]
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
        "confidence": f"{g['confidence']:g}",
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
