"""``torch-profiled report PATH... -o FILE``: traces -> one self-contained HTML page.

    torch-profiled report profiled_traces/ -o report.html     # every window of a directory
    torch-profiled report before/ after/ -o diff.html         # two inputs: the diff view too
    python -m instrument.cli.html_command PATH... -o FILE          # the same, stand-alone

PATHs are what ``summarize`` reads (a trace file, or a directory of them; see
``instrument.cli``), read the same way (``report_from_trace``, ``--max-mb``). The page
(``exporters.html_page``) has a section per trace: header and verdict, the ranges with CPU vs
device bars and verdict badges, a zoomable timeline of the trace's ranges, operators and
kernels per thread and stream, the top operators and kernels. Traces of several ranks add
ranks side by side (``traces.rank_summary``); exactly two PATHs add the diff (``traces.diff_sides``,
as ``torch-profiled diff A B``). The file is written atomically; ``-o`` may also name a
character device or a named pipe (``/dev/stdout``, a FIFO), written in place and never
replaced, or a symbolic link to a file (its target is replaced, the link kept); a directory,
block device, socket or dangling link is refused before any trace is read
(``traces.write_output_file``). Names the page cannot encode (lone surrogates, from file names
that are not UTF-8) are written as their escapes (``\\udcff``). Bad input: one line on
standard error and exit status 2, as for every command.

Each trace is read once for its report and its timeline (``traces._reports_with``), and let
go before the next is read; the two inputs of a diff are read again by ``traces._side``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from exporters.html_page import PageWindow, build_page
from exporters.html_timeline import DEFAULT_MAX_EVENTS, timeline_from_trace

from . import inputs as traces
from .diff import diff_sides

__all__ = ["add_report_parser", "main", "report_html", "run_report"]


def report_html(
    paths: Sequence[str],
    *,
    rows: int = 15,
    max_bytes: int = traces.DEFAULT_MAX_MB * traces.MB,
    max_events: int = DEFAULT_MAX_EVENTS,
    title: str | None = None,
) -> str:
    """The page for ``paths`` (see the module docstring); ``traces.InputError`` for bad input."""
    pairs = traces._reports_with(  # each trace read once: its report and its timeline
        paths,
        lambda report, trace: timeline_from_trace(
            trace, range_names=report.ranges, max_events=max_events
        ),
        rows=rows,
        max_bytes=max_bytes,
    )
    windows = [PageWindow(report, timeline) for report, timeline in pairs]
    reports = [report for report, _ in pairs]
    diff = None
    if len(paths) == 2:
        before, after = (traces._side(p, max_bytes, shapes=False) for p in paths)
        diff = diff_sides(before, after, rows)
    made = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    subtitle = (
        f"{len(reports)} trace{'s' if len(reports) != 1 else ''} from "
        f"{', '.join(paths)} | made {made} by torch-profiled report"
    )
    return build_page(
        windows,
        title=title or "torch-profiled report",
        subtitle=subtitle,
        ranks=traces.rank_summary(reports),
        diff=diff,
    )


def run_report(args: argparse.Namespace) -> str:
    """The ``report`` command (``args.func``): writes the page, returns the line to print
    (on standard error when the page went to standard output: ``args.stdout_taken``)."""
    traces.check_output(args.output, "-o")  # before any trace is read
    page = report_html(
        args.paths,
        rows=args.rows,
        max_bytes=args.max_mb * traces.MB,
        max_events=args.max_events,
        title=args.title,
    )
    data = page.encode("utf-8", "backslashreplace")  # a lone surrogate: its escape, no error
    out = traces.write_output_file(args.output, data, "-o")
    args.stdout_taken = out.fd == 1
    return f"wrote {args.output} ({len(data) / traces.MB:.1f} MB)\n"


def add_report_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``report`` command to ``sub`` (``build_parser``'s subparsers); its
    ``func`` is ``run_report``."""
    r = sub.add_parser(
        "report",
        help="write one self-contained HTML page for traces (timeline, bars, ranks, diff)",
        description="Write one HTML file (no network: its script and style are inline) with, "
        "per trace, the header and verdict, the ranges with CPU vs device bars and verdicts, "
        "a zoomable timeline of ranges, operators and kernels per thread and stream, and the "
        "top operators and kernels. Traces of several ranks add ranks side by side; two "
        "PATHs add the diff view (as 'torch-profiled diff A B').",
    )
    r.add_argument(
        "paths", nargs="+", metavar="PATH", help="a trace file (.json, .json.gz) or a directory"
    )
    r.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    r.add_argument(
        "--rows",
        type=traces._positive_int,
        default=15,
        metavar="N",
        help="rows of operators, kernels and diff sections (default 15)",
    )
    r.add_argument(
        "--max-events",
        type=traces._positive_int,
        default=DEFAULT_MAX_EVENTS,
        metavar="N",
        help="events per trace on its timeline; past N the longest N are drawn "
        f"(default {DEFAULT_MAX_EVENTS:,}, ~15 bytes of page each)",
    )
    r.add_argument("--title", metavar="TEXT", help="the page's title")
    traces._max_mb_option(r)
    r.set_defaults(func=run_report)
    return r


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m instrument.cli.html_command PATH... -o FILE``: the ``report`` command alone."""
    parser = argparse.ArgumentParser(prog=traces.PROG)
    add_report_parser(parser.add_subparsers(dest="command"))
    try:
        args = parser.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as exc:  # usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else 0
    try:
        text = traces.printable(run_report(args), newlines=True)
        if getattr(args, "stdout_taken", False):
            traces._stderr(text)
        else:
            sys.stdout.write(traces.encodable(text, sys.stdout))
            sys.stdout.flush()
    except traces.InputError as exc:
        traces._error(str(exc))
        return traces.EXIT_USAGE
    except BrokenPipeError:  # the page went to a pipe whose reader left
        traces._silence_stdout()
        return traces.EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug or an input nobody foresaw: one line
        traces._error(
            f"unexpected {type(exc).__name__}: {exc} (a bug: please report it); expected no "
            "error here, nothing more was done"
        )
        return traces.EXIT_USAGE  # never 1: that status means a regression
    return traces.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
