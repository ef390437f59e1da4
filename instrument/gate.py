"""``torch-profiled diff A B --fail-over 10%``: a regression gate over two sides of windows.

Per range, one figure per call (``--metric``): ``cpu`` (inclusive CPU time per call), ``device``
(device time per call) or ``flops`` (achieved FLOP/s: the range's FLOPs over its device time,
or over its CPU time where a side ran none on a device). A side's value is pooled over its
windows (all time over all calls), so one window compares fairly with three.

The rule: a range regresses when its figure got worse (time up; for ``flops`` FLOP/s down)
by more than the threshold AND by more than the windows' spread. A side's spread is
(max - min) / median of its per-window per-call values (0 with one window); the larger of the
two sides' spreads is the noise. With one window per side only the threshold applies.

Not comparable (a failure unless ``allow_mismatch``, then skipped): the sides ran on
different devices or world sizes, or a range's operators saw different input shapes (only
checked where both sides recorded shapes; otherwise the verdict says so), or a range named
with ``--range`` exists on one side only. A range on one side only, not named, is listed as
skipped. Bad input (``GateError``): a bad threshold, a ``--range`` on neither side, no range on
both sides, no device time (``device``) or no FLOPs (``flops``) in either.

No torch imports and nothing from ``instrument.cli``.
"""

from __future__ import annotations

import math
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from exporters._format import WIDTH, fit, format_time_us

from .diff import Side, per_call, side_doc
from .traces import printable

__all__ = [
    "METRICS",
    "GateError",
    "GateOptions",
    "format_gate",
    "gate",
    "junit_xml",
    "parse_threshold",
]

METRICS = ("cpu", "device", "flops")
PASS, REGRESSION, NOT_COMPARABLE, SKIPPED = "pass", "regression", "not comparable", "skipped"
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


# ---------------------------------------------------------------- figures


def _figure(side: Side, name: str, metric: str, basis: str) -> dict[str, Any] | None:
    """A side's figure for one range: the pooled value, each window's value and the spread."""
    if metric == "flops":
        values, calls, pooled = _flops(side, name, basis)
    else:
        values, calls, pooled = per_call(side, name, metric)
    if not calls:
        return None
    spread = 0.0
    if len(values) > 1:
        mid = _median(values)
        spread = (max(values) - min(values)) / mid if mid > 0 else 0.0
    # per step (ProfilerStep#N spans; none in a trace without a schedule): calls and time
    steps = sum(len(w.report.steps) for w in side.windows if name in w.report.ranges)
    return {
        "value": pooled,
        "windows": values,
        "calls": calls,
        "spread": spread,
        "steps": steps,
        "calls_per_step": calls / steps if steps else None,
        "per_step": pooled * calls / steps if steps and metric != "flops" else None,
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
    before: Side, after: Side, name: str, opts: GateOptions, problems: list[str]
) -> dict[str, Any]:
    basis = _flops_basis(before, after, name) if opts.metric == "flops" else opts.metric
    b = _figure(before, name, opts.metric, basis)
    a = _figure(after, name, opts.metric, basis)
    out: dict[str, Any] = {"name": name, "metric": opts.metric, "before": b, "after": a}
    out["basis"] = basis
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
    bv, av = b["value"], a["value"]
    if bv > 0:
        change = (av - bv) / bv
    else:
        change = math.inf if av > 0 else 0.0
    worse = -change if opts.metric == "flops" else change
    noise = max(b["spread"], a["spread"])
    bar = max(opts.threshold, noise)
    regressed = worse > opts.threshold and worse > noise
    out.update(change=_finite(change), worse_by=_finite(worse), noise=noise, bar=bar)
    what = "FLOP/s" if opts.metric == "flops" else f"{opts.metric} time per call"
    told = f"{what} {_fmt(bv, opts.metric)} -> {_fmt(av, opts.metric)} ({_pct(change)})"
    if regressed:
        why = f"worse by {_pct(worse, sign=False)}, over the "
        why += f"{_pct(opts.threshold, sign=False)} threshold"
        why += f" and the windows' spread {_pct(noise, sign=False)}" if noise else ""
        return dict(out, status=REGRESSION, reason=f"{told}: {why}")
    if worse > opts.threshold:
        why = f"within the windows' spread {_pct(noise, sign=False)} (noise)"
    else:
        why = f"within the {_pct(opts.threshold, sign=False)} threshold"
    return dict(out, status=PASS, reason=f"{told}: {why}")


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


def gate(before: Side, after: Side, opts: GateOptions) -> dict[str, Any]:
    """The verdicts: one per range, and whether the gate passes (``exit_status`` 0 or 1)."""
    names = _check_input(before, after, opts)
    problems = _side_problems(before, after)
    verdicts = [_verdict(before, after, n, opts, problems) for n in names]
    order = {REGRESSION: 0, NOT_COMPARABLE: 1, PASS: 2, SKIPPED: 3}
    verdicts.sort(key=lambda v: (order[v["status"]], -(v.get("worse_by") or 0.0), v["name"]))
    counts = {s: sum(v["status"] == s for v in verdicts) for s in order}
    failed = counts[REGRESSION] + counts[NOT_COMPARABLE]
    return {
        "metric": opts.metric,
        "fail_over": opts.threshold,
        "allow_mismatch": opts.allow_mismatch,
        "rule": "regression: worse by more than fail_over and than the larger side's spread "
        "((max - min) / median of per-window per-call values)",
        "before": _side_summary(before),
        "after": _side_summary(after),
        "problems": problems,
        "notes": _shape_notes(before, after),
        "verdicts": verdicts,
        "counts": {k.replace(" ", "_"): n for k, n in counts.items()},
        "passed": not failed,
        "exit_status": 1 if failed else 0,
    }


def _side_summary(side: Side) -> dict[str, Any]:
    """What ``diff`` says of a side, and whether its shapes were recorded."""
    return {**side_doc(side), "shapes_recorded": side.shapes_recorded}


# ---------------------------------------------------------------- text and JUnit


def format_gate(g: dict[str, Any]) -> str:
    """The verdicts, a line each, then the outcome (lines within ``WIDTH``, reasons wrapped)."""
    c = g["counts"]
    head = (
        f"torch-profiled diff --fail-over {g['fail_over'] * 100:g}% | metric {g['metric']} "
        f"| per call, pooled over windows"
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
    outcome = "FAILED" if g["exit_status"] else "passed"
    lines.append(
        f"{outcome}: {c['regression']} regression(s), {c['not_comparable']} not comparable, "
        f"{c['pass']} passed, {c['skipped']} skipped"
    )
    return "\n".join(lines) + "\n"


def _wrap(text: str, indent: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def junit_xml(g: dict[str, Any], text: str = "") -> bytes:
    """The verdicts as JUnit XML (Jenkins, GitLab, GitHub test reporters): one testsuite
    ``torch-profiled diff``, one testcase per gated range; a regression is a ``failure``, a
    range not comparable an ``error`` (``skipped`` with ``allow_mismatch``).

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
    out.append(
        f'  <testsuite {attrs} skipped="{c["skipped"]}" timestamp="{stamp}" hostname={host}>'
    )
    out.append("    <properties>")
    props = {
        "metric": g["metric"],
        "fail_over": f"{g['fail_over'] * 100:g}%",
        "allow_mismatch": str(g["allow_mismatch"]).lower(),
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
    else:
        return head + "/>"
    return f"{head}>{body}</testcase>"
