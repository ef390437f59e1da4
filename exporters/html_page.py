"""The HTML report: window reports (and their timelines) -> one self-contained page.

No torch, nothing of ``instrument`` but the report: the ``html`` exporter and the
``torch-profiled report`` command both build their page here. The page loads nothing: its
style and script are inline (``html_report.css`` / ``html_report.js`` beside this module), its
data is one JSON block, and a Content-Security-Policy forbids any request. Per window it shows
the header and verdict, a table of ranges with CPU vs device bars, verdict badges, FLOP/s and
MFU (when a range or the report carries it), the top operators and kernels, and a canvas
timeline (``exporters.html_timeline``). A page may add ranks side by side
(``instrument.cli.rank_summary``'s dict) and a diff (``instrument.cli.diff_sides``'s dict).

Times are formatted as in the console table (``23.104us``, ``2.314ms``), so a number read
here can be looked up there.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from instrument.base.formatting import format_delta_us, format_time_us

if TYPE_CHECKING:
    from instrument.base.report import PageTimeline, RangeStats, WindowReport

__all__ = ["PageWindow", "build_page", "range_mfu", "script_json"]

_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "img-src data:; connect-src 'none'"
)


@dataclass(frozen=True)
class PageWindow:
    """One window on the page: its report, its timeline (``timeline_from_trace``'s dict, or
    the ``report.PageTimeline`` the analysis made of it; None: no trace to draw it from) and,
    then, a line saying why there is none."""

    report: WindowReport
    timeline: dict[str, Any] | PageTimeline | None = None
    note: str = ""


def _asset(name: str) -> str:
    return resources.files("exporters").joinpath(name).read_text(encoding="utf-8")


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _t(us: float | None) -> str:
    return "-" if us is None else format_time_us(us)


def _rate(flops_per_s: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.2f} {unit}FLOP/s"
    return f"{flops_per_s:.0f} FLOP/s"


def range_mfu(report: WindowReport, stats: RangeStats) -> float | None:
    """Model FLOPs utilisation of a range (0..1), where known: its achieved FLOP/s over the
    device's dense peak for its FLOPs' dtype (``WindowReport.mfu``), else None."""
    return report.mfu(stats)


def _badge(verdict: Any) -> str:
    kind = str(getattr(verdict, "kind", "") or "unknown")
    return (
        f'<span class="badge v-{_e(kind)}" title="{_e(getattr(verdict, "reason", ""))}">'
        f"{_e(str(verdict))}</span>"
    )


def _bar(value: float, most: float, cls: str) -> str:
    width = 100.0 * value / most if most > 0 else 0.0
    if width <= 0:
        return f'<span class="bar zero {cls}"></span>'
    return f'<span class="bar {cls}" style="width:{width:.2f}%"></span>'


def _steps(steps: Sequence[int]) -> str:
    if not steps:
        return "no steps"
    if list(steps) == list(range(steps[0], steps[-1] + 1)) and len(steps) > 1:
        return f"steps {steps[0]}-{steps[-1]}"
    return "steps " + ",".join(str(s) for s in steps)


def _health(report: WindowReport) -> str:
    """The window's health: a quiet line when complete, a loud one with the reasons (and their
    numbers) when it lost events (``report.Health``)."""
    health = getattr(report, "health", None)
    if health is None or health.complete:
        return '<p class="health h-complete">health: complete</p>'
    items = "".join(f"<li>{_e(r.detail)}</li>" for r in health.reasons)
    return (
        f'<div class="health h-{_e(health.status)}" role="alert" style="border: 2px solid '
        f'#c0392b; background: #fdecea; padding: 4px 8px; margin: 6px 0"><b>health: '
        f"{_e(health.status)}</b>: device numbers marked ({_e(health.status)}) are incomplete"
        f"<ul>{items}</ul></div>"
    )


def _unsure(report: WindowReport) -> str:
    health = getattr(report, "health", None)
    return "" if health is None or health.complete else f" ({health.status})"


def _header(index: int, report: WindowReport) -> str:
    title = (
        f"window {report.window} | rank {report.rank}/{report.world_size} | {report.device} | "
        f"{_steps(report.steps)} | recorded {format_time_us(report.duration_us)} | "
        f"{report.event_count:,} events" + (" | partial" if report.partial else "")
    )
    where = f"{report.host} pid {report.pid}" if report.host else f"pid {report.pid}"
    parts = [
        f'<h2 id="w{index}-title">{_e(title)}</h2>',
        f'<p class="meta">{_e(where)}'
        + (f" | trace: <code>{_e(report.trace_file)}</code>" if report.trace_file else "")
        + (f" | opened by {_e(report.reason)}" if report.reason else "")
        + "</p>",
        _health(report),
        *([f'<p class="cost">{_e(report.cost.line())}</p>'] if report.cost is not None else []),
        f'<p class="verdict">{_badge(report.verdict)} '
        f'<span class="reason">{_e(report.verdict.reason)}{_e(_unsure(report))}</span></p>',
        '<p class="totals">'
        f"Self CPU time total: <b>{format_time_us(report.self_cpu_time_total_us)}</b>",
    ]
    if report.self_device_time_total_us or "cuda" in report.activities:
        unsure = _e(_unsure(report))
        parts[-1] += (
            f" | Self CUDA time total: <b>{format_time_us(report.self_device_time_total_us)}</b>"
            f"{unsure} | device busy: <b>{format_time_us(report.device_busy_us)}</b>{unsure}"
        )
    parts[-1] += f" | profiler overhead: {format_time_us(report.profiler_overhead_us)}</p>"
    return "\n".join(parts)


def _range_row(report: WindowReport, stats: RangeStats, most: float, mfu_col: bool) -> str:
    mfu = range_mfu(report, stats)
    cells = [
        f'<td class="name">{_e(stats.name)}</td>',
        f'<td class="num">{stats.calls}</td>',
        f'<td class="num">{format_time_us(stats.cpu_time_us)}</td>',
        f'<td class="num">{format_time_us(stats.self_cpu_time_us)}</td>',
        f'<td class="num">{format_time_us(stats.device_time_us)}</td>',
        f'<td class="num">{100 * stats.device_busy_share:.0f}%</td>',
        '<td class="bars">'
        + _bar(stats.cpu_time_us, most, "cpu")
        + _bar(stats.device_time_us, most, "dev")
        + "</td>",
        f'<td class="num">{_rate(stats.flops_per_s) if stats.flops_per_s else "-"}</td>',
    ]
    if mfu_col:
        shown = "-" if mfu is None else f"{100 * mfu:.1f}%{_e(_unsure(report))}"
        cells.append(f'<td class="num">{shown}</td>')
    cells.append(
        f"<td>{_badge(stats.verdict)}"
        f'<div class="reason small">{_e(stats.verdict.reason)}</div></td>'
    )
    return "<tr>" + "".join(cells) + "</tr>"


def _ranges_table(report: WindowReport) -> str:
    ranges = sorted(report.ranges.values(), key=lambda r: (-r.cpu_time_us, r.name))
    if not ranges:
        return '<p class="empty">No range ran in this window.</p>'
    most = max(max(r.cpu_time_us, r.device_time_us) for r in ranges)
    mfu_col = any(range_mfu(report, r) is not None for r in ranges)
    head = [
        "range",
        "calls",
        "CPU total",
        "self CPU",
        "device",
        "busy",
        '<span class="key cpu"></span>CPU vs <span class="key dev"></span>device',
        "FLOP/s",
    ]
    head += ["MFU"] if mfu_col else []
    head += ["verdict"]
    return (
        '<table class="ranges"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(_range_row(report, r, most, mfu_col) for r in ranges)
        + "</tbody></table>"
    )


def _top_tables(report: WindowReport) -> str:
    ops = "".join(
        f'<tr><td class="name">{_e(o.name)}</td><td class="num">{o.calls}</td>'
        f'<td class="num">{format_time_us(o.self_cpu_time_us)}</td>'
        f'<td class="num">{format_time_us(o.cpu_time_us)}</td></tr>'
        for o in report.top_ops
    )
    kernels = "".join(
        f'<tr><td class="name">{_e(k.name)}</td><td>{_e(k.kind)}</td>'
        f'<td class="num">{k.calls}</td><td class="num">{format_time_us(k.device_time_us)}</td>'
        "</tr>"
        for k in report.top_kernels
    )
    out = (
        "<details><summary>top operators by self CPU time</summary>"
        '<table class="ops"><thead><tr><th>operator</th><th>calls</th><th>self CPU</th>'
        f"<th>CPU total</th></tr></thead><tbody>{ops}</tbody></table></details>"
    )
    if kernels:
        out += (
            "<details><summary>top device kernels</summary>"
            '<table class="kernels"><thead><tr><th>kernel</th><th>kind</th><th>calls</th>'
            f"<th>device time</th></tr></thead><tbody>{kernels}</tbody></table></details>"
        )
    return out


def _timeline_block(index: int, window: PageWindow) -> str:
    tl = window.timeline
    if tl is None:
        note = window.note or "No timeline: it is drawn from the window's trace file."
        return f'<p class="note timeline-note">{_e(note)}</p>'
    events, total = (tl["events"], tl["total"]) if isinstance(tl, dict) else (tl.events, tl.total)
    shown = (
        f"{events:,} events" if events == total else f"the {events:,} longest of {total:,} events"
    )
    return (
        f'<div class="timeline" data-window="{index}">'
        '<div class="toolbar"><button data-act="in" title="zoom in">+</button>'
        '<button data-act="out" title="zoom out">&minus;</button>'
        '<button data-act="left" title="pan left">&larr;</button>'
        '<button data-act="right" title="pan right">&rarr;</button>'
        '<button data-act="reset" title="whole window">reset</button>'
        f'<span class="span"></span><span class="hint">timeline: {shown}; wheel zooms, '
        "drag pans, double-click an event to zoom to it</span></div>"
        '<div class="scroll"><canvas></canvas></div><div class="tip" hidden></div></div>'
    )


def _window_section(index: int, window: PageWindow) -> str:
    report = window.report
    return (
        f'<section class="window" id="w{index}">'
        + _header(index, report)
        + "<h3>ranges</h3>"
        + _ranges_table(report)
        + "<h3>timeline</h3>"
        + _timeline_block(index, window)
        + _top_tables(report)
        + "</section>"
    )


def _ranks_section(summary: dict[str, Any]) -> str:
    ranks: list[int] = summary["ranks"]
    head = "".join(f"<th>rank {r}</th>" for r in ranks)
    rows = []
    items = list(summary["ranges"].items()) + [
        ("Self CPU time total", summary["self_cpu_time_total"])
    ]
    for name, s in items:
        by_rank = s["by_rank_us"]
        cells = []
        for r in ranks:
            us = by_rank.get(str(r))
            slow = ' class="num slowest"' if r == s["slowest_rank"] else ' class="num"'
            bar = _bar(us, s["max_us"], "cpu") if us is not None else ""
            cells.append(f"<td{slow}>{_t(us)}{bar}</td>")
        ratio = "-" if s["ratio"] is None else f"{s['ratio']:.2f}x"
        rows.append(
            f'<tr><td class="name">{_e(name)}</td>{"".join(cells)}'
            f'<td class="num">rank {s["slowest_rank"]}</td>'
            f'<td class="num">{_t(s["spread_us"])}</td><td class="num">{ratio}</td></tr>'
        )
    note = ""
    if not summary["same_steps"]:
        listed = "; ".join(
            f"rank {r}: {','.join(map(str, v)) or 'none'}"
            for r, v in summary["steps_per_rank"].items()
        )
        note = (
            '<p class="note">The ranks recorded different steps; their times do not compare '
            f"like with like ({_e(listed)}).</p>"
        )
    return (
        '<section class="ranks" id="ranks"><h2>ranks side by side</h2>'
        f"<p>CPU time per range (inclusive), each rank's traces summed; {len(ranks)} ranks."
        f"</p>{note}"
        f'<table class="ranks"><thead><tr><th>range</th>{head}<th>slowest</th><th>spread</th>'
        f"<th>max/min</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


def _calls(item: dict[str, Any]) -> str:
    b, a = item.get("calls_before"), item.get("calls_after")
    if b is None or a is None or b == a:
        return str(a if a is not None else b)
    return f"{b}&rarr;{a}"


def _diff_rows(items: Iterable[dict[str, Any]], most: float) -> str:
    out = []
    for it in items:
        delta = it["delta_us"]
        side = "slower" if delta > 0 else "faster"
        width = 50.0 * abs(delta) / most if most > 0 else 0.0
        kind = it.get("kind", "kernel")
        name = it["name"] if kind == "kernel" else f"{it['name']} [{kind}]"
        ratio = "-" if it["ratio"] is None else f"{it['ratio']:.2f}x"
        out.append(
            f'<tr><td class="name">{_e(name)}</td><td class="num">{_t(it["before_us"])}</td>'
            f'<td class="num">{_t(it["after_us"])}</td>'
            f'<td class="num {side}">{format_delta_us(delta)}</td><td class="num">{ratio}</td>'
            f'<td class="num">{_calls(it)}</td><td class="delta"><span class="dbar {side}" '
            f'style="width:{width:.2f}%"></span></td></tr>'
        )
    return "".join(out)


def _diff_section(d: dict[str, Any]) -> str:
    parts = [
        '<section class="diff" id="diff"><h2>diff: before &rarr; after</h2>',
        f"<p>before: <code>{_e(d['before']['path'])}</code> ({len(d['before']['traces'])} "
        f"traces) | after: <code>{_e(d['after']['path'])}</code> "
        f"({len(d['after']['traces'])} traces) | delta = after - before, ratio = after/before"
        "</p>",
    ]
    sections = [
        ("range (CPU total)", d["ranges"]),
        ("range (device time)", d["range_device_time"]),
        ("device kernel (device time)", d["kernels"]),
        ("operator (self CPU)", d["operators"]),
    ]
    head = (
        "<th>before</th><th>after</th><th>delta</th><th>ratio</th><th>calls</th>"
        "<th>faster | slower</th>"
    )
    for title, items in sections:
        if not items:
            continue
        most = max(abs(it["delta_us"]) for it in items)
        parts.append(
            f'<table class="diff"><thead><tr><th>{_e(title)}</th>{head}</tr></thead>'
            f"<tbody>{_diff_rows(items, most)}</tbody></table>"
        )
    totals = [
        dict(t, name=label, calls_before=None, calls_after=None)
        for key, label in (
            ("self_cpu_time_total_us", "Self CPU time total"),
            ("self_device_time_total_us", "Self CUDA time total"),
        )
        for t in [d["totals"][key]]
        if t["before_us"] or t["after_us"]
    ]
    if totals:
        most = max(abs(t["delta_us"]) for t in totals)
        parts.append(
            f'<table class="diff"><thead><tr><th>totals</th>{head}</tr></thead>'
            f"<tbody>{_diff_rows(totals, most)}</tbody></table>"
        )
    return "".join(parts) + "</section>"


# Characters that may change the HTML parser's state inside <script> ("</script", "<!--" then
# "<script" enters the "double escaped" state where the element never ends) or that older
# JavaScript reads as line ends: in JSON they occur only inside strings, where the \u escape is
# the same string.
_SCRIPT_UNSAFE = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_SCRIPT_UNSAFE_RE = re.compile("[<>&\u2028\u2029]")


def script_json(obj: Any) -> str:
    """``obj`` as compact JSON that can stand inside ``<script>`` whatever its strings hold
    (no ``<``, ``>``, ``&``, U+2028 or U+2029 left as they are: no name can end the element
    or change how the HTML parser reads it)."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return _SCRIPT_UNSAFE_RE.sub(lambda m: _SCRIPT_UNSAFE[m.group()], text)


def _data_json(windows: Sequence[PageWindow]) -> str:
    parts = []
    for w in windows:
        tl = w.timeline
        # a timeline the analysis made (``report.PageTimeline``) is embedded as it came
        parts.append(script_json(tl) if tl is None or isinstance(tl, dict) else tl.data)
    return '{"windows":[' + ",".join(parts) + "]}"


def build_page(
    windows: Sequence[PageWindow],
    *,
    title: str = "torch-profiled report",
    subtitle: str = "",
    ranks: dict[str, Any] | None = None,
    diff: dict[str, Any] | None = None,
) -> str:
    """The page: a header, the diff (if any), ranks side by side (if any), then a section per
    window. One string of HTML that needs nothing else."""
    body = [f"<header><h1>{_e(title)}</h1>"]
    if subtitle:
        body.append(f'<p class="meta">{_e(subtitle)}</p>')
    body.append("</header>")
    if diff is not None:
        body.append(_diff_section(diff))
    if ranks is not None:
        body.append(_ranks_section(ranks))
    body.extend(_window_section(i, w) for i, w in enumerate(windows))
    if not windows:
        body.append('<p class="empty">No window to show.</p>')
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{_e(title)}</title><style>{_asset('html_report.css')}</style></head>"
        f"<body>{''.join(body)}"
        f'<script id="profiled-data" type="application/json">{_data_json(windows)}</script>'
        f"<script>{_asset('html_report.js')}</script></body></html>\n"
    )
