"""Step health per rank: ``torch-profiled summarize`` of the json exporter's metrics records.

A JSON-lines file written by the json exporter holds window reports
(``torch-profiled/window-report/1``) and metrics records (``torch-profiled/metrics/1``), one
JSON object a line, each naming its ``schema``. A metrics record is cumulative since its process
started counting, so only the *last* record of each process (``host``, ``pid``; the largest
``time_ns``) counts. Processes are grouped by ``rank``; where several processes recorded one
rank (a restart) the newest is kept, and a note says so.

The summary: per rank, the step count, p50 and p99 of the step time (``step=True`` calls; where
no record has steps, the range with the largest total time stands in, and a note says so), and
p50 and p99 of each range (the ``rows`` with the largest total time over the ranks). A
*straggler* is a rank whose step p50 is more than ``margin`` (0.2: 20%) above the median over
the ranks of the step p50.

A collective equalises step times (the rank that arrives last waits least), so where the
records hold torch.distributed's collectives (ranges named ``torch.distributed.<collective>``,
``instrument.runtime.collectives``), the figure is each rank's time *outside* collectives per step
instead: the step function's range (the range whose p50 is closest to the step p50 on every
rank) per call, less the rank's collective time per call of it (collectives called fewer
times than that range, a barrier at start-up or at a checkpoint, are outside the steps and
left out, with a note); a straggler is a rank whose
figure leads the median of the *other* ranks' by more than ``margin`` of their step time (a
late rank waits least: among two ranks the median of both would hide half of its lead; and
measured against the step, a lead of 0.3 ms over 0.5 ms outside is noise, not 60%). Each
straggler is named with the range where its extra time went: the range (not a collective,
not the step) whose time per step on that rank exceeds the others' median by the most; among
ranges within 80% of that excess, the one of least time (nested ranges share the excess: the
innermost names the cause). Collective ranges are listed in their own section, not among the ranges.

Reading streams the lines (memory holds one record per process), so a file that grew over a
long run costs its reading time, not its size in memory; a line is read with a bound (the
commands' ``--max-mb``), and one past it is refused with its file and line number before it is
parsed (a 131 MB line took 1.16 GB to parse). A line that is not UTF-8 is decoded with
replacement characters; a record with ``NaN`` or ``Infinity`` (the json exporter never writes
them) or a number too large to be finite is refused. Plain Python: no torch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from exporters.json_lines import METRICS_SCHEMA, SCHEMA
from instrument.base.formatting import WIDTH, fit, format_time_us

from ..runtime.collectives import collective_of
from .inputs import DEFAULT_MAX_MB, MB, InputError

__all__ = [
    "DEFAULT_MARGIN",
    "EXPECT_METRICS",
    "RecordsError",
    "format_summary",
    "is_records_file",
    "load",
    "records_in_dir",
    "summarize",
]

DEFAULT_MARGIN = 0.2
EXPECT_METRICS = (
    f"expected JSON lines with {METRICS_SCHEMA} records (the json exporter writes them while "
    "metrics are on: PROFILED_EXPORTERS=json, PROFILED_METRICS auto or 1)"
)
RECORDS_SUFFIX = ".jsonl"
_FIRST_LINE_CAP = 1 << 20  # content detection reads at most this much of a first line
_STAT_KEYS = ("count", "sum_s", "min_s", "p50_s", "p90_s", "p99_s", "max_s")


class RecordsError(InputError):
    """Bad metrics input: the commands' ``InputError`` (``PATH: WHAT; EXPECTED``, printed as
    one error line), expecting metrics records."""

    def __init__(self, path: str, what: str, expected: str = EXPECT_METRICS) -> None:
        super().__init__(path, what, expected)


# ---------------------------------------------------------------- finding record files


def _first_line(path: str) -> bytes:
    """The first non-empty line of ``path`` (at most ``_FIRST_LINE_CAP`` bytes of it)."""
    with open(path, "rb") as f:
        while True:
            line = f.readline(_FIRST_LINE_CAP)
            if not line or line.strip():
                return line.strip()


def is_records_file(path: str) -> bool:
    """A ``.jsonl`` file, or one whose first non-empty line is a JSON object with ``schema``
    (not a trace: traces have ``traceEvents``)."""
    if not os.path.isfile(path):
        return False
    if path.endswith(RECORDS_SUFFIX):
        return True
    try:
        line = _first_line(path)
    except OSError:
        return False
    if not line.startswith(b"{") or not line.endswith(b"}"):
        return False
    try:
        first = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, or nested past the stack
        return False
    return isinstance(first, dict) and "schema" in first and "traceEvents" not in first


def records_in_dir(path: str) -> list[str]:
    """The record files directly inside the directory ``path``, sorted by name."""
    try:
        names = sorted(e.name for e in os.scandir(path) if not e.name.startswith("."))
    except OSError:
        return []
    return [os.path.join(path, n) for n in names if is_records_file(os.path.join(path, n))]


# ---------------------------------------------------------------- reading the records


def _problem(rec: dict[str, Any]) -> str | None:
    """What makes ``rec`` an unusable metrics record, or None."""
    for key, kind in (("rank", int), ("pid", int), ("time_ns", int), ("host", str)):
        value = rec.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            return f'"{key}" missing or not {"an integer" if kind is int else "a string"}'
    ranges = rec.get("ranges")
    if not isinstance(ranges, dict):
        return '"ranges" missing or not an object'
    stats = list(ranges.items()) + ([("steps", rec["steps"])] if rec.get("steps") else [])
    for name, s in stats:
        if not isinstance(s, dict) or not all(_is_number(s.get(k)) for k in _STAT_KEYS):
            return f"range {name!r} without finite numbers {', '.join(_STAT_KEYS)}"
    if rec.get("steps") is not None and not isinstance(rec.get("steps"), dict):
        return '"steps" neither an object nor null'
    return None


def _is_number(value: Any) -> bool:
    """A finite number: an integer too large for a float is none either."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class _NonFinite(ValueError):
    """``NaN`` or ``Infinity`` in a line (Python's JSON extension)."""


def _no_constant(name: str) -> Any:
    raise _NonFinite(name)


def _lines(f: Any, path: str, max_bytes: int) -> Any:
    """``(number, text)`` of each line of the binary file ``f``, none longer than
    ``max_bytes``: a longer one is a ``RecordsError`` naming it, having read at most the bound."""
    n = 0
    while True:
        raw = f.readline(max_bytes + 1)
        if not raw:
            return
        n += 1
        if len(raw) > max_bytes:
            raise RecordsError(
                path,
                f"line {n} is longer than {max_bytes / MB:g} MB (--max-mb; not read further)",
                "expected JSON lines of metrics records (a few KB each); to read it, raise "
                f"the limit, e.g. --max-mb {2 * -(-max_bytes // MB)}",
            )
        yield n, raw.decode("utf-8", "replace")


def _read_file(
    path: str, last: dict[tuple[str, int], dict[str, Any]], max_bytes: int = DEFAULT_MAX_MB * MB
) -> dict[str, int]:
    """Each process's newest metrics record of ``path`` into ``last``; returns the counts of
    what the file held (``metrics``, ``windows``, ``other`` schemas, ``bad`` lines)."""
    counts = {"metrics": 0, "windows": 0, "other": 0, "bad": 0}
    try:
        with open(path, "rb") as f:
            for n, text in _lines(f, path, max_bytes):
                if not text.strip():
                    continue
                try:
                    rec = json.loads(text, parse_constant=_no_constant)
                except _NonFinite as exc:
                    raise RecordsError(
                        path,
                        f"line {n}: {exc.args[0]}, which is not a JSON number (the json "
                        "exporter never writes it)",
                    ) from None
                except (ValueError, RecursionError):  # not JSON, or nested past the stack
                    counts["bad"] += 1
                    continue
                schema = rec.get("schema") if isinstance(rec, dict) else None
                if schema == METRICS_SCHEMA:
                    problem = _problem(rec)
                    if problem:
                        raise RecordsError(path, f"line {n}: a metrics record with {problem}")
                    counts["metrics"] += 1
                    key = (rec["host"], rec["pid"])
                    if key not in last or rec["time_ns"] >= last[key]["time_ns"]:
                        last[key] = dict(rec, file=path)
                elif schema == SCHEMA:
                    counts["windows"] += 1
                elif schema is None:
                    counts["bad"] += 1
                else:
                    counts["other"] += 1
    except OSError as exc:
        raise RecordsError(path, f"cannot read ({exc.strerror or exc})") from None
    return counts


def _none_found(path: str, counts: dict[str, int]) -> RecordsError:
    held = []
    if counts["windows"]:
        held.append(f"{counts['windows']} window report(s) ({SCHEMA})")
    if counts["other"]:
        held.append(f"{counts['other']} record(s) of other schemas")
    if counts["bad"]:
        held.append(f"{counts['bad']} line(s) that are not torch-profiled records")
    found = ", ".join(held) if held else "nothing but blank lines"
    return RecordsError(path, f"no metrics records: found {found}")


def load(
    paths: Sequence[tuple[str, list[str]]], max_bytes: int = DEFAULT_MAX_MB * MB
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every process's last metrics record from ``(path, files)`` pairs (a file: itself; a
    directory: its record files), and notes (lines skipped). A path whose files hold no
    metrics record, or a line longer than ``max_bytes``, is a ``RecordsError``."""
    last: dict[tuple[str, int], dict[str, Any]] = {}
    bad = 0
    for path, files in paths:
        total = {"metrics": 0, "windows": 0, "other": 0, "bad": 0}
        for f in files:
            for k, v in _read_file(f, last, max_bytes).items():
                total[k] += v
        if not total["metrics"]:
            raise _none_found(path, total)
        bad += total["bad"]
    notes = [f"{bad} line(s) that are not JSON records skipped"] if bad else []
    return list(last.values()), notes


# ---------------------------------------------------------------- the summary


def _by_rank(records: list[dict[str, Any]], notes: list[str]) -> dict[int, dict[str, Any]]:
    """One record per rank: the newest process's (a note names ranks that had several)."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault(rec["rank"], []).append(rec)
    chosen = {}
    several = []
    for rank in sorted(groups):
        group = sorted(groups[rank], key=lambda r: (r["time_ns"], r["pid"]))
        chosen[rank] = dict(group[-1], processes=len(group))
        if len(group) > 1:
            several.append(f"rank {rank}: {len(group)} (kept pid {group[-1]['pid']})")
    if several:
        notes.append(
            "several processes recorded one rank (restarts?); each rank's newest is kept: "
            + "; ".join(several)
        )
    return chosen


def _totals(ranks: dict[int, dict[str, Any]]) -> dict[str, float]:
    """Each range's total time over the ranks (seconds); collectives aside."""
    totals: dict[str, float] = {}
    for rec in ranks.values():
        for name, s in rec["ranges"].items():
            if collective_of(name) is None:
                totals[name] = totals.get(name, 0.0) + s["sum_s"]
    return totals


def _collectives(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The record's collective ranges, by collective (``all_reduce``)."""
    found = {}
    for name, s in rec["ranges"].items():
        kind = collective_of(name)
        if kind is not None:
            found[kind] = s
    return found


def _step_range(
    ranks: dict[int, dict[str, Any]], step_of: dict[int, dict[str, Any] | None], source: str | None
) -> str | None:
    """The range of the step function: the stand-in when there is one, else the range on
    every rank, called at least as often as the steps counted, whose p50 is closest to the
    step p50 over the ranks (the step histogram leaves out steps that started or stopped a
    profiler; the range keeps every call, as the collectives do)."""
    if source is not None:
        return source or None
    names = set.intersection(*(set(rec["ranges"]) for rec in ranks.values()))
    best: tuple[float, str] | None = None
    for name in sorted(names):
        if collective_of(name) is not None:
            continue
        cost = 0.0
        for r, rec in ranks.items():
            step, s = step_of[r], rec["ranges"][name]
            if not step or not step["count"] or s["count"] < step["count"]:
                break
            if s["p50_s"] <= 0 or step["p50_s"] <= 0:
                break
            cost += abs(math.log(s["p50_s"] / step["p50_s"]))
        else:
            if best is None or cost < best[0]:
                best = (cost, name)
    return best[1] if best else None


def _others_median(values: dict[int, float], rank: int) -> float | None:
    others = [v for r, v in values.items() if r != rank]
    return _median(others) if others else None


def _extra_range(
    ranks: dict[int, dict[str, Any]], rank: int, per_step: dict[int, float], skip: str | None
) -> dict[str, Any] | None:
    """Where ``rank``'s extra time went: the range whose time per step (``per_step[r]``: the
    rank's step count) on ``rank`` exceeds the other ranks' median the most; among those
    within 80% of that, the least time (the innermost of nested ranges). None: no range is
    slower there."""
    found = []
    for name, s in ranks[rank]["ranges"].items():
        if name == skip or collective_of(name) is not None or not per_step.get(rank):
            continue
        others = [
            rec["ranges"][name]["sum_s"] / per_step[r] if name in rec["ranges"] else 0.0
            for r, rec in ranks.items()
            if r != rank and per_step.get(r)
        ]
        if not others:
            continue
        mine = s["sum_s"] / per_step[rank]
        found.append((mine - _median(others), mine, name))
    top = max((f[0] for f in found), default=0.0)
    if top <= 0:
        return None
    extra, mine, name = min((f for f in found if f[0] >= 0.8 * top), key=lambda f: (f[1], f[2]))
    return {"range": name, "extra_per_step_s": extra, "per_step_s": mine}


def _step_source(ranks: dict[int, dict[str, Any]], notes: list[str]) -> str | None:
    """None: the records' ``steps``; else the name of the range standing in for the step."""
    if any(rec.get("steps") for rec in ranks.values()):
        return None
    totals = _totals(ranks)
    if not totals:
        notes.append("no step=True function and no range ran: no step time")
        return ""
    name = min(totals, key=lambda n: (-totals[n], n))
    notes.append(
        f"no step=True function recorded steps; the range {name!r} (largest total time) "
        "stands in for the step"
    )
    return name


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def summarize(
    records: list[dict[str, Any]],
    *,
    margin: float = DEFAULT_MARGIN,
    rows: int = 15,
    names: Sequence[str] = (),
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The JSON document: per rank its step and range stats, the stragglers, the margin."""
    notes = list(notes)
    ranks = _by_rank(records, notes)
    source = _step_source(ranks, notes)
    totals = _totals(ranks)
    shown = [n for n in names if n in totals] if names else sorted(totals, key=lambda n: -totals[n])
    shown = shown[:rows]
    step_of: dict[int, dict[str, Any] | None] = {
        r: (rec.get("steps") if source is None else rec["ranges"].get(source or ""))
        for r, rec in ranks.items()
    }
    p50s = [s["p50_s"] for s in step_of.values() if s and s["count"]]
    median = _median(p50s) if p50s else None
    outside = _outside(ranks, step_of, source, notes, margin)
    out_ranks = {}
    stragglers = []
    for r, rec in ranks.items():
        step = step_of[r]
        step = step if step and step["count"] else None
        ratio = step["p50_s"] / median if step and median else None
        if outside is not None:
            slow = bool(outside["ranks"][r]["straggler"])
        else:
            slow = ratio is not None and ratio > 1.0 + margin and len(ranks) > 1
        late = _late_range(ranks, r, step_of, outside, source) if slow else None
        if slow:
            stragglers.append(r)
        out_ranks[str(r)] = {
            **{k: rec.get(k) for k in ("rank", "world_size", "host", "pid", "time_ns")},
            **{k: rec.get(k) for k in ("since_ns", "file", "processes")},
            "step": step,
            "step_p50_vs_median": ratio,
            "straggler": slow,
            "extra_time_in": late,
            "collectives": outside["ranks"][r] if outside else None,
            "ranges": {n: rec["ranges"][n] for n in shown if n in rec["ranges"]},
        }
    return {
        "schema": "torch-profiled/metrics-summary/1",
        "margin": margin,
        "step_source": "steps" if source is None else {"range": source or None},
        "median_step_p50_s": median,
        "straggler_figure": "outside_collectives_per_step" if outside else "step_p50",
        "step_range": outside["step_range"] if outside else None,
        "stragglers": stragglers,
        "ranges": shown,
        "ranks": out_ranks,
        "notes": notes,
    }


def _late_range(
    ranks: dict[int, dict[str, Any]],
    rank: int,
    step_of: dict[int, dict[str, Any] | None],
    outside: dict[str, Any] | None,
    source: str | None,
) -> dict[str, Any] | None:
    """Where straggler ``rank``'s extra time went, per step of each rank (``_extra_range``)."""
    per_step: dict[int, float] = {}
    for q in ranks:
        count = outside["ranks"][q]["step_calls"] if outside else (step_of[q] or {}).get("count")
        if count:
            per_step[q] = float(count)
    return _extra_range(ranks, rank, per_step, outside["step_range"] if outside else source)


def _figures(
    ranks: dict[int, dict[str, Any]], found: dict[int, dict[str, dict[str, Any]]], name: str
) -> tuple[dict[int, dict[str, Any]], set[str]]:
    """Per rank, per call of the step range ``name``: its time, in collectives, outside them;
    and the collectives left out (called fewer times than there are steps: a barrier at
    start-up or at a checkpoint is outside the steps, its wait no step's)."""
    figures: dict[int, dict[str, Any]] = {}
    rare: set[str] = set()
    for r, rec in ranks.items():
        step = rec["ranges"][name]
        calls = step["count"]
        rare.update(k for k, s in found[r].items() if s["count"] < calls)
        in_coll = sum(s["sum_s"] for s in found[r].values() if s["count"] >= calls) / calls
        figures[r] = {
            "step_calls": calls,
            "step_per_call_s": step["sum_s"] / calls,
            "in_collectives_per_step_s": in_coll,
            "outside_per_step_s": step["sum_s"] / calls - in_coll,
            "calls": {k: s["count"] for k, s in sorted(found[r].items())},
        }
    return figures, rare


def _outside(
    ranks: dict[int, dict[str, Any]],
    step_of: dict[int, dict[str, Any] | None],
    source: str | None,
    notes: list[str],
    margin: float,
) -> dict[str, Any] | None:
    """Each rank's time outside collectives per step, and whether it straggles by it (a lead
    over the other ranks' median of more than ``margin`` of their step); None for one rank,
    and, with a note saying why, where no rank recorded a collective or no range stands for
    the step on every rank."""
    found = {r: _collectives(rec) for r, rec in ranks.items()}
    if len(ranks) < 2:
        return None
    if not any(found.values()):
        # (DDP's gradient all-reduce runs in its C++ reducer; async_op=True calls are untimed)
        notes.append(
            "no collective timed (DDP's runs in C++), so step times are equal: see the "
            "traces' late rank"
        )
        return None
    name = _step_range(ranks, step_of, source)
    if name is not None and not all(
        rec["ranges"].get(name, {}).get("count") for rec in ranks.values()
    ):
        name = None  # the stand-in range did not run on every rank
    if name is None:
        notes.append(
            "collectives timed, but no range stands for the step on every rank: stragglers "
            "by step p50"
        )
        return None
    figures, rare = _figures(ranks, found, name)
    values = {r: f["outside_per_step_s"] for r, f in figures.items()}
    coll = {q: f["in_collectives_per_step_s"] for q, f in figures.items()}
    steps = {q: f["step_per_call_s"] for q, f in figures.items()}
    for r, fig in figures.items():
        others = _others_median(values, r)
        fig["vs_others"] = values[r] / others if others and others > 0 else None
        fig["others_waited_per_step_s"] = (_others_median(coll, r) or 0.0) - coll[r]
        # the lead is measured against the step, not against the others' time outside
        # collectives: where that is a fraction of a millisecond, noise would double it
        lead = values[r] - (others or 0.0)
        fig["lead_per_step_s"] = lead
        fig["straggler"] = others is not None and lead > margin * (_others_median(steps, r) or 0)
    if rare:
        notes.append(
            f"left out of the steps' collectives, called fewer times than steps: "
            f"{', '.join(sorted(rare))}"
        )
    if any(v < 0 for v in values.values()):
        notes.append("time outside collectives below zero on a rank: collectives outside its steps")
    return {"step_range": name, "ranks": figures}


# ---------------------------------------------------------------- the table

_RANK_W, _COUNT_W, _TIME_W = 6, 9, 11


def _t(stats: dict[str, Any] | None, key: str) -> str:
    return "-" if not stats else format_time_us(stats[key] * 1e6)


def _range_blocks(names: list[str], first_room: int, room: int) -> list[list[str]]:
    """The range columns cut into tables that fit ``WIDTH`` (the first beside the step's)."""
    pair = 2 * _TIME_W
    blocks: list[list[str]] = []
    per = max(first_room // pair, 0)
    rest = list(names)
    while rest or not blocks:
        blocks.append(rest[:per])
        rest = rest[per:]
        per = max(room // pair, 1)
    return blocks


def _table(doc: dict[str, Any], names: list[str], with_step: bool) -> list[str]:
    pair = 2 * _TIME_W
    head1 = f"{'':<{_RANK_W}}" + (f"{'':>{_COUNT_W + 2 * _TIME_W}}" if with_step else "")
    head2 = f"{'rank':<{_RANK_W}}"
    if with_step:
        head2 += f"{'steps':>{_COUNT_W}}{'step p50':>{_TIME_W}}{'step p99':>{_TIME_W}}"
    for n in names:
        head1 += f"{fit(n, pair - 2, middle=True):>{pair}}"
        head2 += f"{'p50':>{_TIME_W}}{'p99':>{_TIME_W}}"
    lines = ["-" * WIDTH, head1.rstrip(), head2]
    for key, r in doc["ranks"].items():
        line = f"{key:<{_RANK_W}}"
        if with_step:
            step = r["step"]
            count = str(step["count"]) if step else "-"
            line += (
                f"{count:>{_COUNT_W}}{_t(step, 'p50_s'):>{_TIME_W}}{_t(step, 'p99_s'):>{_TIME_W}}"
            )
        for n in names:
            s = r["ranges"].get(n)
            line += f"{_t(s, 'p50_s'):>{_TIME_W}}{_t(s, 'p99_s'):>{_TIME_W}}"
        lines.append(line + (" *" if with_step and r["straggler"] else ""))
    return lines


def _outside_lines(doc: dict[str, Any]) -> list[str]:
    """Per rank: its step range's time per call, in collectives and outside them."""
    lines = [
        "-" * WIDTH,
        fit(
            f"outside collectives per step: range {doc['step_range']!r} per call, less the "
            "rank's torch.distributed collectives per call",
            WIDTH,
        ),
        f"{'rank':<{_RANK_W}}{'step':>{_TIME_W}}{'in coll.':>{_TIME_W}}{'outside':>{_TIME_W}}"
        f"{'vs others':>{_TIME_W}}  collective calls",
    ]
    for key, r in doc["ranks"].items():
        c = r["collectives"]
        vs = "-" if c["vs_others"] is None else f"{c['vs_others']:.2f}x"
        calls = ", ".join(f"{k} {n}" for k, n in c["calls"].items()) or "none"
        lines.append(
            fit(
                f"{key:<{_RANK_W}}{format_time_us(c['step_per_call_s'] * 1e6):>{_TIME_W}}"
                f"{format_time_us(c['in_collectives_per_step_s'] * 1e6):>{_TIME_W}}"
                f"{format_time_us(c['outside_per_step_s'] * 1e6):>{_TIME_W}}{vs:>{_TIME_W}}"
                f"  {calls}",
                WIDTH,
            )
        )
    return lines


def _extra_text(r: dict[str, Any]) -> str:
    extra = r.get("extra_time_in")
    if not extra:
        return "no range of it is slower than on the others"
    return (
        f"its extra time: range {extra['range']!r}, "
        f"+{format_time_us(extra['extra_per_step_s'] * 1e6)}/step"
    )


def _stragglers_line(doc: dict[str, Any]) -> str:
    if doc.get("straggler_figure") == "outside_collectives_per_step":
        rule = (
            f"time outside collectives per step over the other ranks' median by more than "
            f"{doc['margin']:.0%} of their step"
        )
        if not doc["stragglers"]:
            return f"stragglers: none ({rule})"
        named = []
        for rank in doc["stragglers"]:
            r = doc["ranks"][str(rank)]
            c = r["collectives"]
            vs = "" if c["vs_others"] is None else f", {c['vs_others']:.2f}x"
            named.append(
                f"rank {rank} ({format_time_us(c['outside_per_step_s'] * 1e6)}/step{vs}; "
                f"the others waited {format_time_us(c['others_waited_per_step_s'] * 1e6)}/step "
                f"for it; {_extra_text(r)})"
            )
        return f"stragglers ({rule}): {'; '.join(named)}"
    median = doc["median_step_p50_s"]
    if median is None:
        return "stragglers: none named (no rank has a step time)"
    rule = (
        f"step p50 more than {doc['margin']:.0%} over the ranks' median of "
        f"{format_time_us(median * 1e6)}"
    )
    if not doc["stragglers"]:
        return f"stragglers: none ({rule})"
    listed = ", ".join(
        f"rank {r} ({_t(doc['ranks'][str(r)]['step'], 'p50_s')}, "
        f"{doc['ranks'][str(r)]['step_p50_vs_median']:.2f}x; {_extra_text(doc['ranks'][str(r)])})"
        for r in doc["stragglers"]
    )
    return f"stragglers ({rule}): {listed}"


def format_summary(doc: dict[str, Any]) -> str:
    """The table: a row per rank (step count, p50, p99; each range's p50, p99), then the
    stragglers."""
    n = len(doc["ranks"])
    source = doc["step_source"]
    if source == "steps":
        step = "step=True calls"
    elif source["range"]:
        step = f"range {source['range']!r} as the step"
    else:
        step = "no step time"
    lines = [
        fit(
            f"torch-profiled metrics | per rank: {step}, ranges p50/p99 (wall time, cumulative) "
            f"| {n} rank{'s' if n != 1 else ''}",
            WIDTH,
        )
    ]
    lines.extend(fit(f"note: {note}", WIDTH) for note in doc["notes"])
    first = WIDTH - _RANK_W - _COUNT_W - 2 * _TIME_W
    for i, names in enumerate(_range_blocks(doc["ranges"], first, WIDTH - _RANK_W)):
        if i == 0 or names:
            lines.extend(_table(doc, names, with_step=i == 0))
    if doc.get("straggler_figure") == "outside_collectives_per_step":
        lines.extend(_outside_lines(doc))
    lines.append("-" * WIDTH)
    lines.append(_stragglers_line(doc))
    return "\n".join(lines) + "\n"


def parse_margin(text: str) -> float:
    """``--straggler-margin``: a number >= 0, else ``ValueError`` with the reason."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} is not a finite number >= 0")
    return value
