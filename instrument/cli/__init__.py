"""The ``torch-profiled`` command: ``summarize``, ``diff`` and ``report`` saved traces.

    torch-profiled summarize PATH... [--json] [--range NAME]... [--rows N]
    torch-profiled diff A B [--json] [--rows N] [--fail-over P% ...]
    torch-profiled report PATH... -o report.html   (instrument.cli.html_command)
    python -m instrument ...          (the same command)

A PATH is a Chrome/Kineto trace file (``.json`` or ``.json.gz``) or a directory of them: the
files directly inside it named ``*.pt.trace.json[.gz]`` (what ``TraceFileExporter`` and
``torch.profiler.tensorboard_trace_handler`` write) or, when there are none of those,
``*.json[.gz]``. Traces may come from this SDK or from any ``torch.profiler`` user
(``prof.export_chrome_trace(path)``): ``record_function`` ranges (``user_annotation`` events)
are the ranges; ``--range NAME`` also finds a range recorded as a plain operator (an
``@profiled`` call inside someone else's profiler).

``summarize`` prints the console table for each trace (``--json``: ``WindowReport.to_dict()``,
an object for one trace and a list for several). When the traces come from several ranks
(``distributedInfo``) it adds "ranks side by side": each range's CPU time per rank (summed over
a rank's traces), the slowest rank and the spread (``--json``: ``{"reports": [...], "ranks":
{...}}``), and a note when the ranks recorded different steps (``ProfilerStep#N``), whose
times then do not compare like with like.

``summarize`` of the json exporter's JSON-lines files (``.jsonl``, or any file whose first
line is a JSON object with a ``schema``; a directory of them that holds no traces) reads the
``torch-profiled/metrics/1`` records instead: per rank the step count and step p50/p99, each
range's p50/p99, and the stragglers, ranks whose step p50 is more than ``--straggler-margin``
over the ranks' median (``instrument.cli.metrics_summary``). Traces and record files do not mix in
one command.

``diff A B`` sums each side over its traces and lists, per range, per device kernel and per
operator (self CPU time), before, after, delta and after/before, largest change first.

Bad input (a missing file, a file that is not a trace, a directory with no traces, a file
of only whitespace, a trace larger than ``--max-mb``, a metrics record line larger than it,
``NaN`` in a trace) ends with one line on standard error,
``torch-profiled: error: PATH: what was wrong; expected ...``, and exit status 2, as do usage
errors, an output path that cannot take a file, and a ``--range`` that names no range in the
traces (that line lists the ranges there and the closest name). Exit status 1 means a
regression or a range not comparable (``diff --fail-over``) and nothing else, 3 that the gate
is inconclusive (its windows cannot tell; more would settle it): an error nobody foresaw
also ends with one line and status 2, and after a broken pipe (``| head``) the status is the
command's own.

Names and paths read from files are printed with control characters, bidirectional overrides
and lone surrogates escaped (``\\x1b``, ``\\n``, ``\\udcff``; ``traces.printable``): an ESC
sequence in a trace never reaches the terminal raw, and a newline in a name never forges a
line. ``--json`` output is JSON (``json.dumps`` escapes them).

Output files (``report -o``, ``diff --junit``): a regular file is replaced atomically; a
symbolic link to one has its target replaced, the link kept; a character device or a named
pipe (``/dev/null``, ``/dev/stdout``, a FIFO a reader waits on) is written in place, never
replaced; a directory, a block device, a socket or a dangling link is refused (exit status 2),
before any trace is read (``instrument.base.files.output_target``). When the output is this
command's own standard output, the text it would print there goes to standard error.

Importing this module is cheap: the analysis and the console table are
imported when a command runs (times and columns come from the small ``instrument.base.formatting``,
shared with the console table).

Size bound: ``--max-mb`` (default ``DEFAULT_MAX_MB``) caps a trace's JSON text, for ``.json.gz``
its decompressed size. A plain file is refused from its size on disk before it is read; a
compressed one is decompressed in chunks and refused as soon as the text passes the limit, so a
small gzip that expands to gigabytes (a "gzip bomb") costs at most the limit in memory and the
time to decompress that much, never the whole expansion. Memory while reading a trace: the text
once as bytes, then once as ``str`` (the bytes are freed before parsing), then the parsed
events (~5x the text: a 100 MB trace peaks ~540 MB above the interpreter's own).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from instrument.base.formatting import WIDTH, fit, format_time_us, row

from .inputs import (  # noqa: F401 - the readers' names stay importable from here
    DEFAULT_MAX_MB,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    MB,
    METRICS,
    PROG,
    RANGES_LISTED,
    InputError,
    _collect,
    _error,
    _max_mb_option,
    _positive_int,
    _reports,
    _side,
    _silence_stdout,
    _stderr,
    _UsageError,
    check_output,
    encodable,
    find_traces,
    format_collective_skew,
    load_checked,
    printable,
    printable_data,
    rank_summary,
    report_from_trace,
    write_output_file,
)

if TYPE_CHECKING:
    from ..base.report import WindowReport

__all__ = [
    "DEFAULT_MAX_MB",
    "InputError",
    "build_parser",
    "find_traces",
    "format_rank_summary",
    "load_checked",
    "main",
    "rank_summary",
    "report_from_trace",
]


def _t(us: float | None) -> str:
    """A time, or ``-`` for a name missing on one side (diff) or on one rank."""
    return "-" if us is None else format_time_us(us)


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


# ---------------------------------------------------------------- ranks side by side


def format_rank_summary(summary: dict[str, Any], rows: int) -> str:
    ranks: list[int] = summary["ranks"]
    tail_w = 10 + 12 + 9  # slowest, spread, max/min
    each = len(ranks) * 12 <= WIDTH - 24 - tail_w
    title = f"ranks side by side | CPU time per range (inclusive) | {len(ranks)} ranks"
    counts = set(summary["traces_per_rank"].values())
    if counts != {1}:
        title += (
            f" | {counts.pop()} traces each, summed"
            if len(counts) == 1
            else " | each rank's traces summed"
        )
    lines = [fit(title, WIDTH)]
    if not summary["same_steps"]:
        # the failure this section exists to catch: ranks that profiled different steps
        listed = "; ".join(
            f"rank {r}: {_runs(v) or 'none'}" for r, v in summary["steps_per_rank"].items()
        )
        lines.append(
            "note: the ranks recorded different steps; their times do not compare like with like"
        )
        lines.append(fit(f"  steps: {listed}", WIDTH))
    lines.append("-" * WIDTH)
    if each:
        cols = "".join(f"{'rank ' + str(r):>12}" for r in ranks)
        extra = ""
    else:
        cols = f"{'min':>12}{'median':>12}{'max':>12}"
        extra = f"{'ranks':>8}"
    tail = f"{'slowest':>10}{'spread':>12}{'max/min':>9}"
    lines.append(row("range", cols + tail + extra))

    def line(name: str, s: dict[str, Any]) -> str:
        by_rank = s["by_rank_us"]
        if each:
            vals = "".join(f"{_t(by_rank.get(str(r))):>12}" for r in ranks)
            more = ""
        else:
            vals = f"{_t(s['min_us']):>12}{_t(s['median_us']):>12}{_t(s['max_us']):>12}"
            more = f"{str(len(by_rank)) + '/' + str(len(ranks)):>8}"
        rest = (
            f"{'rank ' + str(s['slowest_rank']):>10}{_t(s['spread_us']):>12}"
            f"{_ratio_text(s['ratio']):>9}"
        )
        return row(name, vals + rest + more)

    if summary["ranges"]:
        for name, s in list(summary["ranges"].items())[:rows]:
            lines.append(line(name, s))
    else:
        lines.append("(no range ran on any rank)")
    lines.append(line("Self CPU time total", summary["self_cpu_time_total"]))
    lines.extend(fit(text, WIDTH) for text in format_collective_skew(summary.get("collectives")))
    return "\n".join(lines) + "\n"


def _runs(values: Sequence[int]) -> str:
    """``[3, 4, 5, 8]`` -> ``3-5,8``."""
    parts: list[list[int]] = []
    for v in sorted(values):
        if parts and parts[-1][1] == v - 1:
            parts[-1][1] = v
        else:
            parts.append([v, v])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


# ---------------------------------------------------------------- diff


# ---------------------------------------------------------------- commands


def _only(report: WindowReport, names: Sequence[str]) -> WindowReport:
    """``report`` with only the ranges ``names`` (``--range``)."""
    from ..base.report import FrozenMap

    kept = FrozenMap({n: r for n, r in report.ranges.items() if n in names})
    return dataclasses.replace(report, ranges=kept)


def _missing_range_message(
    missing: Sequence[str],
    present: Iterable[str],
    traces: int,
    what: str = "trace",
    as_operators: Iterable[str] = (),
) -> str:
    """The one line for ``--range`` names in no trace: the ranges that are there (sorted, the
    first ``RANGES_LISTED``) and, per missing name, the closest one present. With no range
    there, ``as_operators``: operators named like ``@profiled`` ranges (no ``::``), which is
    how a range recorded inside another profiler looks."""
    there = sorted(set(present))
    read = f"{traces} {what}{'s' if traces != 1 else ''} read"
    head = f"--range {', '.join(repr(m) for m in missing)}: no such range in the {read}"
    kind = "ranges there"
    if not there:
        there = sorted(set(as_operators))
        kind = (
            "they hold no record_function ranges; operators named like @profiled ranges "
            "there (recorded inside another profiler)"
        )
    if not there:
        return (
            f"{head}: they hold no ranges (no record_function or @profiled range ran); "
            "expected an operator's name then (nothing printed)"
        )
    lowered = {n.lower(): n for n in reversed(there)}  # "MB" finds "mb"
    hints = []
    for name in missing:
        close = difflib.get_close_matches(name.lower(), lowered, n=1, cutoff=0.6)
        if close:
            found = lowered[close[0]]
            hints.append(repr(found) + (f" for {name!r}" if len(missing) > 1 else ""))
    hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
    listed = ", ".join(repr(n) for n in there[:RANGES_LISTED])
    if len(there) > RANGES_LISTED:
        listed += f", ... ({len(there)} in all)"
    return (
        f"{head}{hint}; {kind}: {listed}; expected one of them or an operator's "
        "name (nothing printed)"
    )


def _range_like_operators(paths: Sequence[str], max_bytes: int) -> set[str]:
    """CPU operators whose names have no ``::`` (``aten::mm`` has): a ``@profiled`` range
    recorded inside someone else's profiler is such an operator. Read again, on the error
    path only."""
    from ..analysis.events import is_bookkeeping

    names = set()
    for f in _collect(paths):
        for ev in load_checked(f, max_bytes)["traceEvents"]:
            name = ev.get("name")
            if ev.get("cat") == "cpu_op" and isinstance(name, str) and "::" not in name:
                if not is_bookkeeping(name):
                    names.add(name)
    return names


def _record_paths(paths: Sequence[str]) -> list[tuple[str, list[str]]] | None:
    """``(path, record files)`` for each path when they all name JSON-lines record files (a
    directory: one with record files and no traces), None when none does; a mix of the two
    kinds is a usage error."""
    from . import metrics_summary

    found: list[tuple[str, list[str]]] = []
    for path in paths:
        if os.path.isdir(path):
            files = metrics_summary.records_in_dir(path)
            if files and not _has_traces(path, files):
                found.append((path, files))
        elif metrics_summary.is_records_file(path):
            found.append((path, [path]))
    if found and len(found) != len(paths):
        traces = [p for p in paths if p not in {f for f, _ in found}]
        raise _UsageError(
            f"{', '.join(traces)}: traces beside JSON-lines record files "
            f"({', '.join(f for f, _ in found)}); expected one kind per command"
        )
    return found or None


def _has_traces(path: str, records: list[str]) -> bool:
    try:
        return bool(set(find_traces(path)) - set(records))
    except InputError:
        return False


def _summarize_metrics(args: argparse.Namespace, found: list[tuple[str, list[str]]]) -> str:
    from . import metrics_summary

    try:
        margin = metrics_summary.parse_margin(
            str(metrics_summary.DEFAULT_MARGIN)
            if args.straggler_margin is None
            else args.straggler_margin
        )
    except ValueError as exc:
        raise _UsageError(
            f"--straggler-margin: {exc}; expected a number >= 0 (0.2: 20% over the ranks' "
            "median step p50)"
        ) from None
    records, notes = metrics_summary.load(found, args.max_mb * MB)  # bad records: InputError
    wanted = list(dict.fromkeys(args.range or ()))
    present = {n for rec in records for n in rec["ranges"]}
    missing = [n for n in wanted if n not in present]
    if missing:
        raise _UsageError(_missing_range_message(missing, present, len(records), "process record"))
    doc = metrics_summary.summarize(
        records, margin=margin, rows=args.rows, names=wanted, notes=notes
    )
    if args.json:
        return json.dumps(doc, indent=2) + "\n"
    return metrics_summary.format_summary(printable_data(doc))


def _summarize(args: argparse.Namespace) -> str:
    from exporters.console import format_report

    record_paths = _record_paths(args.paths)
    if record_paths is not None:
        return _summarize_metrics(args, record_paths)
    if args.straggler_margin is not None:
        raise _UsageError(
            "--straggler-margin: applies to metrics records (JSON-lines files), not to traces"
        )
    wanted = list(dict.fromkeys(args.range or ()))
    # every range kept at first: a name missing everywhere is told apart from the ranges there
    reports = _reports(
        args.paths, rows=args.rows, range_names=wanted, max_bytes=args.max_mb * MB, only_named=False
    )
    if wanted:
        found = {name for r in reports for name in r.ranges}
        missing = [n for n in wanted if n not in found]
        if missing:
            ops = () if found else _range_like_operators(args.paths, args.max_mb * MB)
            raise _UsageError(_missing_range_message(missing, found, len(reports), "trace", ops))
        reports = [_only(r, wanted) for r in reports]
    summary = rank_summary(reports)
    if args.json:
        docs = [r.to_dict() for r in reports]
        doc: Any = docs[0] if len(docs) == 1 else docs
        if summary is not None:
            doc = {"reports": docs, "ranks": summary}
        return json.dumps(doc, indent=2) + "\n"
    shown = printable_data(reports)  # names from the traces: escaped before columns are cut
    text = "\n".join(format_report(r, args.rows) for r in shown)
    if summary is not None:
        text += "\n" + format_rank_summary(printable_data(summary), args.rows)
    return text


def _diff(args: argparse.Namespace) -> str | tuple[str, int]:
    """``diff``: the per-call table, or with ``--fail-over`` the gate (exit status 1 on a
    regression or a range not comparable, 3 when inconclusive)."""
    from . import diff, gate

    if args.fail_over is None:
        for flag, given in (
            ("--junit", args.junit),
            ("--allow-mismatch", args.allow_mismatch),
            ("--allow-partial", args.allow_partial),
            ("--metric", args.metric),
        ):
            if given:
                raise _UsageError(f"{flag}: applies to the gate; expected --fail-over PCT with it")
    try:
        threshold = None if args.fail_over is None else gate.parse_threshold(args.fail_over)
    except gate.GateError as exc:
        raise _UsageError(str(exc)) from None
    if args.junit:  # before any trace is read: a path that cannot take the file stops here
        check_output(args.junit, "--junit")
    limit = args.max_mb * MB
    gating = threshold is not None
    before, after = _side(args.before, limit, gating), _side(args.after, limit, gating)
    names = list(dict.fromkeys(args.range or ()))
    present = before.range_names() | after.range_names()
    missing = [n for n in names if n not in present]
    if missing:
        n = len(before.windows) + len(after.windows)
        raise _UsageError(_missing_range_message(missing, present, n))
    if threshold is None:
        d = diff.diff_sides(before, after, args.rows, names or None)
        return json.dumps(d, indent=2) + "\n" if args.json else diff.format_diff(printable_data(d))
    opts = gate.GateOptions(
        threshold, args.metric or "cpu", tuple(names), args.allow_mismatch, args.allow_partial
    )
    try:
        g = gate.gate(before, after, opts)
    except gate.GateError as exc:
        raise _UsageError(str(exc)) from None
    shown = printable_data(g)
    text = gate.format_gate(shown)
    if args.junit:
        out = write_output_file(args.junit, gate.junit_xml(shown, text), "--junit")
        args.stdout_taken = out.fd == 1
    return (json.dumps(g, indent=2) + "\n" if args.json else text), g["exit_status"]


def _summarize_parser(sub: Any) -> None:
    """The ``summarize`` command's arguments."""
    s = sub.add_parser(
        "summarize",
        help="print the table for each trace (and the spread between ranks)",
        description="Print the torch-profiled table for each trace: ranges (record_function / "
        "@profiled), top operators and kernels, totals and verdicts. Traces from "
        "several ranks also get a 'ranks side by side' section.",
        epilog="With --json: one object for one trace, a list for several, and "
        '{"reports": [...], "ranks": {...}} for traces of several ranks. Metrics records '
        "(JSON lines): a row per rank (step count, step and range p50/p99) and the stragglers.",
    )
    s.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a trace file (.json, .json.gz) or a directory of them; or the json exporter's "
        "JSON-lines file (.jsonl) or a directory of them (one per rank): step health per rank",
    )
    s.add_argument("--json", action="store_true", help="print the report(s) as JSON")
    s.add_argument(
        "--range",
        action="append",
        metavar="NAME",
        help="keep only this range (repeatable); also finds a range recorded as an operator",
    )
    s.add_argument(
        "--rows",
        type=_positive_int,
        default=15,
        metavar="N",
        help="rows per table section (default 15)",
    )
    s.add_argument(
        "--straggler-margin",
        metavar="M",
        help="metrics files: name the ranks whose step p50 is more than M over the ranks' "
        "median step p50 (default 0.2: 20%%)",
    )
    _max_mb_option(s)
    s.set_defaults(func=_summarize)


DIFF_EPILOG = """\
The gate (--fail-over PCT): per range, the figure --metric picks, per call: each window gives
one value (its time over its calls). A shared runner only adds time, so each side's noise
floor lies between its best and its second-best window (flops: the highest FLOP/s), and the
change between best after / second-best before and second-best after / best before. A range
REGRESSES when even the lower bound is worse than PCT (time up; for flops, FLOP/s down), PASSES
when even the upper bound is within PCT, and is INCONCLUSIVE otherwise or with fewer than 5
windows a side (one a side: always); its line says about how many windows a side would settle
it (record 8). One slow window never moves a floor. Not comparable: different devices or
world sizes, a range's operators saw different input shapes (checked where both sides
recorded shapes), or no window left on a side whose health is complete (windows that lost
events are left out, named in a note, unless --allow-partial); it fails the gate unless
--allow-mismatch (then skipped). A range on one side only is skipped (not comparable if named
with --range).
Exit status: 0 pass, 1 a regression or a range not comparable, 2 bad input or usage, 3
inconclusive (no regression, nothing not comparable, at least one range inconclusive: record
more windows). --junit PATH: a file (replaced atomically), a link to one (its target
replaced), or a device or named pipe written in place (/dev/stdout: the verdicts then print on
standard error); an inconclusive range is a <skipped> testcase whose message starts
'inconclusive:', and the suite's 'outcome' property names the run's outcome.
"""


def _diff_parser(sub: Any) -> None:
    """The ``diff`` command's arguments."""
    d = sub.add_parser(
        "diff",
        help="compare two traces (or directories) per call; --fail-over gates regressions",
        description="Per range, device kernel and operator (self CPU time): before, after, delta\n"
        "and ratio (after/before) per call, pooled over each side's windows (a directory holds\n"
        "a window per trace), largest change first; totals per window. '-' marks a name\n"
        "missing on a side. With --fail-over: a regression gate for CI.",
        epilog=DIFF_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("before", metavar="A", help="the trace (or directory) before the change")
    d.add_argument("after", metavar="B", help="the trace (or directory) after the change")
    d.add_argument("--json", action="store_true", help="print the comparison (or the verdicts)")
    d.add_argument(
        "--rows", type=_positive_int, default=15, metavar="N", help="rows per section (default 15)"
    )
    d.add_argument(
        "--range",
        action="append",
        metavar="NAME",
        help="only this range (repeatable); the gate fails if it is on one side only",
    )
    d.add_argument(
        "--fail-over",
        metavar="PCT",
        help="gate: exit 1 when a range got worse by more than PCT (10%% or 10) beyond the "
        "windows' noise, 3 when the windows cannot tell",
    )
    d.add_argument(
        "--metric",
        choices=METRICS,
        help="what the gate judges per call: cpu (CPU time, default), device (device time) "
        "or flops (achieved FLOP/s, a drop regresses; needs record_shapes or with_flops)",
    )
    d.add_argument("--junit", metavar="PATH", help="gate: also write the verdicts as JUnit XML")
    d.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="gate: skip ranges that are not comparable (device, world size, input shapes) "
        "instead of failing",
    )
    d.add_argument(
        "--allow-partial",
        action="store_true",
        help="gate: also judge windows whose health is not complete (they lost events: "
        "partial, device-missing), which are otherwise left out",
    )
    _max_mb_option(d)
    d.set_defaults(func=_diff)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Summarize and compare torch.profiler traces (Chrome/Kineto JSON, "
        ".json or .json.gz), from torch-profiled or from any torch.profiler user.",
        epilog="Exit status: 0 ok, 1 a regression or a range not comparable (diff --fail-over) "
        "and nothing else, 2 bad input, usage, or an error nobody foresaw, 3 the gate is "
        "inconclusive (more windows would settle it). See 'torch-profiled COMMAND -h'.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    _summarize_parser(sub)
    _diff_parser(sub)
    from .html_command import add_report_parser  # (here: importing cli stays cheap)

    add_report_parser(sub)
    return parser


def _joined(argv: Sequence[str]) -> list[str]:
    """``--fail-over -5%`` as ``--fail-over=-5%``: argparse would take ``-5%`` for an option
    and answer with usage; this way the value is checked and refused in one line."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--fail-over" and out[i + 1].startswith("-"):
            out[i : i + 2] = [f"--fail-over={out[i + 1]}"]
            break
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (the console script exits with it)."""
    status = EXIT_OK
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(_joined(sys.argv[1:] if argv is None else argv))
        except SystemExit as exc:  # usage errors (2), --help and --version (0)
            sys.stdout.flush()
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        try:
            text = args.func(args)
            if isinstance(text, tuple):
                text, status = text
        except InputError as exc:
            _error(str(exc))
            return EXIT_USAGE
        except _UsageError as exc:
            _error(str(exc))
            return EXIT_USAGE
        # names were escaped before the tables were made; this catches whatever else came
        # from a file or the command line (paths, notes) and never lets a line be forged
        text = printable(text, newlines=True)
        if getattr(args, "stdout_taken", False):  # the output file was our stdout
            _stderr(text)
        else:
            sys.stdout.write(encodable(text, sys.stdout))
            sys.stdout.flush()
        return status
    except BrokenPipeError:  # `torch-profiled summarize ... | head`: the reader left
        _silence_stdout()
        return status  # the command's answer stands: a passed gate is not a regression
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug or an input nobody foresaw: one line
        # exit 2, never 1: 1 is the gate's "regression", and this is not one
        _error(
            f"unexpected {type(exc).__name__}: {exc} (a bug: please report it with the "
            "command and its input); expected no error here, nothing more was done"
        )
        return EXIT_USAGE
