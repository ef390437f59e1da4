"""Saved traces for the ``torch-profiled`` commands, and what the commands share.

Finding traces in a path, reading one within a size bound (``load_checked``: a gzip bomb costs
at most the bound, see ``instrument.cli``), a ``WindowReport`` from a trace
(``report_from_trace``), the reports of several paths (``_reports``), one side of a diff
(``_side``), ranks side by side (``rank_summary``, with who arrived last at the collectives and
where its time went: ``collective_skew``); the exit statuses, ``InputError`` (bad
input, printed as one line), the argument helpers every command uses, names made safe to print
(``printable``) and the commands' output files (``check_output``, ``write_output_file``).
``instrument.cli`` (``summarize``, ``diff``) and ``instrument.cli.html_command`` (``report``) build
on it; it imports neither. Importing it is cheap: the analysis is imported when a trace is read.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import gzip
import json
import math
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from instrument.base.files import Output

    from ..base.report import RangeCalls, WindowReport
    from .diff import Side

T = TypeVar("T")  # what _reports_with makes of each trace beside its report

PROG = "torch-profiled"
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

EXPECT_PATH = "expected a trace file (.json or .json.gz) or a directory of them"
EXPECT_TRACE = (
    "expected a Chrome/Kineto trace (torch.profiler's export_chrome_trace or "
    "tensorboard_trace_handler, or torch-profiled's trace files)"
)
PREFERRED_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
TRACE_SUFFIXES = (".json", ".json.gz")
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
STEP_PREFIX = "ProfilerStep#"
_ALL = sys.maxsize  # analysis "top": every operator and kernel (diff sums before cutting)

MB = 1 << 20
# Real windows write up to ~100-200 MB of JSON; 1024 MB leaves five times that while keeping a
# bomb's cost bounded (a trace in memory takes ~5x its text: 1 GB of JSON is ~5 GB of RAM).
DEFAULT_MAX_MB = 1024
_CHUNK = 4 * MB  # read/decompress step: the most read past the limit before stopping
# deflate never grows data by more than 5 bytes per 64 KiB block (plus a header): a .gz larger
# than this cannot hold a trace within the limit (or is padded with junk)
_GZIP_SLACK = 64 * 1024
METRICS = ("cpu", "device", "flops")  # diff --metric (instrument.cli.gate.METRICS)
RANGES_LISTED = 20  # names a "--range names no range" message lists before "... (N in all)"
EXPECT_OUTPUT = (  # after "expected -o to name"
    "a file in an existing directory (replaced atomically), a symbolic link to one, "
    "a character device or a named pipe (written in place)"
)

# What a name read from a file must not print raw: C0 and C1 controls (a terminal's escape
# sequences: ESC, CSI), line and paragraph separators, bidirectional overrides (text shown in
# another order than it is), lone surrogates (not encodable: a file name's undecodable bytes)
# and the non-characters XML 1.0 forbids.
_UNPRINTABLE = "\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
_UNPRINTABLE += "\ud800-\udfff\ufffe\uffff"
_UNPRINTABLE_NAME = re.compile(f"[\n{_UNPRINTABLE}]")
_UNPRINTABLE_TEXT = re.compile(f"[{_UNPRINTABLE}]")  # text of several lines: newlines kept
_NAMED_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


class InputError(Exception):
    """Bad input: printed as one line, ``torch-profiled: error: PATH: WHAT; EXPECTED``."""

    def __init__(self, path: str, what: str, expected: str = EXPECT_TRACE) -> None:
        super().__init__(f"{path}: {what}; {expected}")
        self.path = path
        self.what = what
        self.expected = expected


class _UsageError(Exception):
    """A well-formed command that cannot be answered (``--range`` names no range)."""


# ---------------------------------------------------------------- printing what files hold


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str, newlines: bool = False) -> str:
    """``text`` with every character that must not reach a terminal or an XML file raw shown
    as its escape (``\\x1b``, ``\\n``, ``\\udcff``); ``newlines`` keeps line breaks (a whole
    table). Names and paths come from files anybody can write: printed raw, an ESC sequence
    would drive the reader's terminal, a newline would forge a line, a lone surrogate would
    stop the output (``UnicodeEncodeError``)."""
    return (_UNPRINTABLE_TEXT if newlines else _UNPRINTABLE_NAME).sub(_escape, text)


def printable_data(obj: Any) -> Any:
    """A copy of ``obj`` (reports, dicts, lists, dataclasses) with every string in it, keys
    included, made ``printable``: what a text table is formatted from, so that names keep
    their columns. JSON output needs none of it (``json.dumps`` escapes them)."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {printable_data(k): printable_data(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(printable_data(v) for v in obj)
    if isinstance(obj, Mapping):  # the reports' FrozenMap
        items = {printable_data(k): printable_data(v) for k, v in obj.items()}
        return type(obj)(items)  # type: ignore[call-arg]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = dataclasses.fields(obj)
        return dataclasses.replace(
            obj, **{f.name: printable_data(getattr(obj, f.name)) for f in fields if f.init}
        )
    return obj


# ---------------------------------------------------------------- the commands' output files


def check_output(path: str, option: str) -> Output:
    """How ``path`` (the value of ``option``) will be written
    (``instrument.base.files.output_target``), or an ``InputError`` that says why it cannot be:
    checked before any trace is read."""
    from instrument.base.files import UnwritableOutput, output_target

    try:
        return output_target(path)
    except UnwritableOutput as exc:
        raise InputError(path, exc.what, f"expected {option} to name {EXPECT_OUTPUT}") from None


def write_output_file(path: str, data: bytes, option: str) -> Output:
    """Write ``data`` to ``path``: a file replaced atomically, a device or FIFO written in place
    (never replaced), a link's regular target (the link kept); an ``InputError`` when it cannot
    be. A ``BrokenPipeError`` on this process's own standard output goes to the caller (the
    reader left, as with ``| head``)."""
    from instrument.base.files import UnwritableOutput, write_output

    out = check_output(path, option)

    def write(f: Any) -> None:
        f.write(data)

    def waiting(_out: Any) -> None:
        _note(f"{path}: a named pipe nobody reads yet; waiting for a reader (Ctrl-C to stop)")

    try:
        return write_output(out, write, waiting=waiting)
    except UnwritableOutput as exc:
        raise InputError(path, exc.what, f"expected {option} to name {EXPECT_OUTPUT}") from None
    except BrokenPipeError:
        if out.fd == 1:
            raise
        raise InputError(
            path,
            f"its reader closed {out.kind} before the end (broken pipe); the output is incomplete",
            f"expected the reader of {option} to read to the end",
        ) from None
    except OSError as exc:
        what = f"cannot be written ({exc.strerror or exc}; {out.kind})"
        raise InputError(path, what, f"expected {option} to name {EXPECT_OUTPUT}") from None


# ---------------------------------------------------------------- finding and loading traces


def _median(values: list[float]) -> float:
    import statistics  # here, not at import: it pulls decimal and fractions (cheap start-up)

    return statistics.median(values)


def find_traces(path: str) -> list[str]:
    """The trace files ``path`` names: itself, or the traces directly inside a directory."""
    if os.path.isdir(path):
        try:
            entries = [e for e in os.scandir(path) if not e.name.startswith(".")]
            files = sorted(e.name for e in entries if e.is_file())
        except OSError as exc:
            raise InputError(
                path, f"cannot list the directory ({exc.strerror or exc})", EXPECT_PATH
            ) from None
        chosen = [n for n in files if n.endswith(PREFERRED_SUFFIXES)]
        if not chosen:
            chosen = [n for n in files if n.endswith(TRACE_SUFFIXES)]
        if not chosen:
            raise InputError(
                path,
                "directory holds no trace files (*.pt.trace.json[.gz], *.json, *.json.gz)",
                EXPECT_PATH,
            )
        return [os.path.join(path, n) for n in chosen]
    if os.path.isfile(path):
        return [path]
    if not os.path.lexists(path):
        raise InputError(path, "no such file or directory", EXPECT_PATH)
    if os.path.islink(path):
        raise InputError(path, "broken symbolic link", EXPECT_PATH)
    raise InputError(path, "neither a regular file nor a directory", EXPECT_PATH)


def _is_gzip(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"\x1f\x8b"
    except OSError:
        return False


def _mb(n: int) -> str:
    return f"{n / MB:,.1f} MB"


def _too_large(path: str, what: str, limit_mb: int, suggest: int) -> InputError:
    """The one line for a trace past ``--max-mb``: which file, the limit, how to raise it."""
    return InputError(
        path,
        what,
        f"expected at most {limit_mb} MB of JSON text (--max-mb); "
        f"to read it, raise the limit, e.g. --max-mb {suggest}",
    )


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


def _read_capped(f: _Readable, limit: int) -> bytearray | None:
    """All of ``f`` if it holds at most ``limit`` bytes, else None, having read (and, for a
    gzip stream, decompressed) at most one chunk past the limit: a bomb stops there."""
    buf = bytearray()
    while True:
        chunk = f.read(min(_CHUNK, limit + 1 - len(buf)))
        if not chunk:
            return buf
        buf += chunk
        if len(buf) > limit:
            return None


def _read_text(path: str, max_bytes: int) -> str:
    """The JSON text of a ``.json`` or ``.json.gz`` trace, refusing one past ``max_bytes``.

    Holds at most the limit (plus one chunk) of bytes, and those only until they are decoded:
    the caller parses a ``str`` with nothing else of the file alive."""
    size = os.stat(path).st_size
    limit_mb = max_bytes // MB
    gz = path.endswith(".gz")
    if gz and size > max_bytes + max_bytes // 1000 + _GZIP_SLACK:
        raise _too_large(
            path,
            f"the compressed file alone is {_mb(size)}: its JSON is past the "
            f"{limit_mb} MB limit (not read)",
            limit_mb,
            2 * limit_mb,
        )
    if not gz and size > max_bytes:
        raise _too_large(
            path,
            f"{_mb(size)} of JSON, past the {limit_mb} MB limit (not read)",
            limit_mb,
            -(-size // MB),
        )
    with gzip.open(path, "rb") if gz else open(path, "rb") as f:
        buf = _read_capped(f, max_bytes)
    if buf is None:
        what = (
            f"decompresses to more than {limit_mb} MB (the .gz is {_mb(size)}; stopped "
            "reading at the limit)"
            if gz
            else f"more than {limit_mb} MB of JSON (it grew while read; stopped at the limit)"
        )
        raise _too_large(path, what, limit_mb, 2 * limit_mb)
    if not buf:
        raise InputError(
            path, "empty file" if size == 0 else "decompresses to nothing", EXPECT_TRACE
        )
    if buf.isspace():  # ASCII whitespace; stops at the first other byte
        raise InputError(path, f"only whitespace ({len(buf):,} bytes), no JSON", EXPECT_TRACE)
    return buf.decode("utf-8")


def load_checked(path: str, max_bytes: int = DEFAULT_MAX_MB * MB) -> dict[str, Any]:
    """Load a ``.json`` or ``.json.gz`` trace of at most ``max_bytes`` of JSON text (see
    ``_read_text``) with every failure turned into an ``InputError``."""
    return _checked_shape(path, _parsed(path, max_bytes))


def _parsed(path: str, max_bytes: int) -> Any:
    """The file's JSON document, every read or parse failure turned into an ``InputError``."""
    gz = path.endswith(".gz")
    try:
        return _loads(_read_text(path, max_bytes), path)
    except _NonFinite as exc:
        raise InputError(
            path,
            f"holds {exc.args[0]}, which is not a JSON number (torch never writes it)",
            "expected a trace of finite numbers",
        ) from None
    except gzip.BadGzipFile as exc:
        if _is_gzip(path):  # a gzip header, then damage (a CRC or length mismatch)
            raise InputError(
                path, f"corrupt gzip data ({exc})", "expected a complete .json.gz trace"
            ) from None
        raise InputError(
            path,
            f"not gzip data ({exc})",
            "expected a gzip-compressed trace (.json.gz) or plain .json",
        ) from None
    except EOFError:
        raise InputError(
            path,
            "truncated gzip file (the compressed data ends early)",
            "expected a complete .json.gz trace",
        ) from None
    except zlib.error as exc:
        raise InputError(
            path, f"corrupt gzip data ({exc})", "expected a complete .json.gz trace"
        ) from None
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})", EXPECT_PATH) from None
    except UnicodeDecodeError:
        if not gz and _is_gzip(path):
            raise InputError(
                path,
                "gzip-compressed data in a file not named .gz",
                "expected plain JSON here (name a compressed trace .json.gz)",
            ) from None
        raise InputError(path, "not JSON (not UTF-8 text)", EXPECT_TRACE) from None
    except json.JSONDecodeError as exc:
        what = f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        text = exc.doc.strip()
        opened = text.startswith(("{", "[")) and not text.endswith(("}", "]"))
        if opened or exc.pos >= len(text) > 0:
            what = f"truncated JSON (the document stops before its end; {exc.msg})"
        raise InputError(path, what, EXPECT_TRACE) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise InputError(
            path, f"unreadable JSON ({type(exc).__name__}: {exc})", EXPECT_TRACE
        ) from None


def _loads(text: str, path: str) -> Any:
    """The document; where it is not valid JSON, what the lenient reader makes of it (torch
    writes names unescaped: a ``"`` in a range name breaks the JSON of a whole trace), else the
    first error."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        from ..analysis.kineto_json import loads_trace

        try:
            return loads_trace(text, path)
        except (ValueError, RecursionError):
            raise exc from None


class _NonFinite(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a JSON document (Python's extension)."""


def _no_constant(name: str) -> Any:
    raise _NonFinite(name)


def _checked_shape(path: str, trace: Any) -> dict[str, Any]:
    """A trace object with a list of event objects, or an ``InputError`` saying what it is."""
    if isinstance(trace, list):  # Chrome's "JSON array format": the events alone
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict):
        raise InputError(
            path, f'JSON {type(trace).__name__}, not an object with "traceEvents"', EXPECT_TRACE
        )
    events = trace.get("traceEvents")
    if events is None:
        raise InputError(path, 'JSON without "traceEvents"', EXPECT_TRACE)
    if not isinstance(events, list):
        raise InputError(
            path, f'"traceEvents" is a JSON {type(events).__name__}, not a list', EXPECT_TRACE
        )
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise InputError(path, f'"traceEvents"[{i}] is not an object', EXPECT_TRACE)
    return trace


# ---------------------------------------------------------------- a trace -> WindowReport


def _number(value: Any) -> float | None:
    """A finite number, else None (a huge integer or ``1e999`` is no time)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # "x", NaN, inf
        return default


def report_from_trace(
    path: str,
    trace: dict[str, Any],
    *,
    rows: int = 15,
    range_names: Iterable[str] = (),
    window: int = 0,
    only_named: bool = True,
) -> WindowReport:
    """The ``WindowReport`` the console table shows for one loaded trace.

    ``range_names`` are ranges even when recorded as plain operators (``cpu_op``); the report
    keeps only those ranges unless ``only_named`` is False (all ranges: what a "no such range"
    message lists)."""
    from ..analysis.analyze import analyze_trace
    from ..analysis.throughput import with_peaks
    from ..base.report import FrozenMap, WindowReport
    from ..runtime.config import peak_tflops_from_env

    names = frozenset(range_names)
    try:
        analysis = analyze_trace(trace, names, top=rows)
    except Exception as exc:  # noqa: BLE001 - a malformed event: bad input, not a crash
        raise InputError(
            path, f"events could not be analyzed ({type(exc).__name__}: {exc})", EXPECT_TRACE
        ) from None
    facts = _scan_events(trace["traceEvents"])
    start_ns, end_ns = _wall_clock_ns(trace, facts.first_us, facts.last_us)
    rank, world_size = _rank_of(trace)
    ranges = analysis.ranges
    if names and only_named:
        ranges = FrozenMap({n: r for n, r in ranges.items() if n in names})
    host = trace.get("host_name")
    # a window that lost its device events still ran on the device (the SDK's shaped trace
    # says its process used CUDA): its title names the device, its health says what is missing
    info = trace.get("profiledWindow")
    on_device = (
        facts.device
        or (isinstance(info, dict) and info.get("device_in_use") is True)
        or analysis.health.status == "device-missing"  # its launches say it used one
    )
    report = WindowReport(
        window=window,
        steps=tuple(sorted(facts.steps)),
        partial=False,
        start_ns=start_ns,
        end_ns=end_ns,
        rank=rank,
        world_size=world_size,
        host=host if isinstance(host, str) else "",
        pid=facts.pid,
        device=_device_name(trace) if on_device else "cpu",
        activities=("cpu", "cuda") if on_device else ("cpu",),
        trace_file=path,
        **analysis.report_fields(ranges=ranges),
    )
    # the device's peaks (MFU) and ridge points; PROFILED_PEAK_TFLOPS applies here too
    return with_peaks(report, peak_tflops_from_env())


# ---------------------------------------------------------------- collectives in a trace

# Per trace file of a distributed job read by the last ``_reports_with``: its collectives and
# its ranges' time outside them (``_collective_facts``), for ``rank_summary``, which gets only
# reports (what it is given, not a trace: the commands' callers stay as they are).
_COLLECTIVE_FACTS: dict[str, dict[str, Any]] = {}
# a backend's collective as the process group records it (``gloo:all_reduce``, on its worker
# thread, for as long as the rank is in it: waiting included)
_COLLECTIVE_NAME = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):[a-z_]+$")
_RANGE_CATEGORIES = frozenset({"user_annotation", "cpu_op"})
LATE_SHARE = 0.5
"""A rank is named late when it arrived last at enough collectives to account for at least
this share of the job's summed arrival skew."""
LATE_FLOOR_US = 100.0
"""...and the median of its leads is at least this (below it, skews are scheduling noise)."""


def _collective_facts(trace: dict[str, Any], ranges: set[str]) -> dict[str, Any]:
    """The trace's collectives ``(name, start_us, dur_us)`` in start order (NCCL's device
    kernels where the trace has them: a kernel lasts as long as its rank waits; else the
    backend's host events), and per range its time outside the host's collectives: each
    call's duration less its overlap with the union of their intervals (a host waits in
    gloo's; NCCL's host events are launches, and the host's ranges do not wait on kernels)."""
    host: list[tuple[str, float, float]] = []
    device: list[tuple[str, float, float]] = []
    calls: list[tuple[str, float, float]] = []
    for ev in trace["traceEvents"]:
        if ev.get("ph") != "X":
            continue
        name, ts, dur = ev.get("name"), _number(ev.get("ts")), _number(ev.get("dur"))
        if not isinstance(name, str) or ts is None or dur is None:
            continue
        cat = ev.get("cat")
        if cat == "kernel" and name.lower().startswith("nccl"):
            device.append((name, ts, dur))
        elif _COLLECTIVE_NAME.match(name):
            host.append((name, ts, dur))
        elif name in ranges and cat in _RANGE_CATEGORIES:
            calls.append((name, ts, dur))
    colls = sorted(device or host, key=lambda c: c[1])
    merged: list[list[float]] = []
    for _, ts, dur in sorted(host, key=lambda c: c[1]):
        if merged and ts <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], ts + dur)
        else:
            merged.append([ts, ts + dur])
    starts = [m[0] for m in merged]
    outside: dict[str, float] = {}
    for name, ts, dur in calls:
        end, inside = ts + dur, 0.0
        i = max(bisect.bisect_right(starts, ts) - 1, 0)
        while i < len(merged) and merged[i][0] < end:
            inside += max(0.0, min(end, merged[i][1]) - max(ts, merged[i][0]))
            i += 1
        outside[name] = outside.get(name, 0.0) + dur - inside
    return {"collectives": colls, "outside_us": outside, "base": trace.get("baseTimeNanoseconds")}


@dataclasses.dataclass
class _EventFacts:
    """What a trace's events say about its window beyond the analysis: the first process id,
    the recorded steps, whether any device work ran, and the span of its complete events."""

    pid: int = 0
    steps: set[int] = dataclasses.field(default_factory=set)
    device: bool = False
    first_us: float | None = None  # earliest start of an "X" event (trace microseconds)
    last_us: float | None = None  # latest end of one


def _scan_events(events: list[dict[str, Any]]) -> _EventFacts:
    """One pass over the events for ``_EventFacts``; malformed fields are skipped."""
    facts = _EventFacts()
    lo = hi = None
    for ev in events:
        if not facts.pid:
            p = ev.get("pid")
            if isinstance(p, int) and not isinstance(p, bool):
                facts.pid = p
        name = ev.get("name")
        if isinstance(name, str) and name.startswith(STEP_PREFIX):
            try:
                facts.steps.add(int(name[len(STEP_PREFIX) :]))
            except ValueError:
                pass
        if ev.get("cat") in DEVICE_CATEGORIES:
            facts.device = True
        if ev.get("ph") == "X":
            ts = _number(ev.get("ts"))
            if ts is None:
                continue
            end = ts + (_number(ev.get("dur")) or 0.0)
            lo = ts if lo is None or ts < lo else lo
            hi = end if hi is None or end > hi else hi
    facts.first_us, facts.last_us = lo, hi
    return facts


def _wall_clock_ns(trace: dict[str, Any], lo: float | None, hi: float | None) -> tuple[int, int]:
    """The window's start and end in epoch nanoseconds, or ``(0, 0)`` when the trace cannot
    tell: ``baseTimeNanoseconds + ts * 1000``, or, from older torch, absolute ``ts``."""
    if lo is None or hi is None:
        return 0, 0
    base = trace.get("baseTimeNanoseconds")
    if isinstance(base, int) and not isinstance(base, bool):
        return base + round(lo * 1000), base + round(hi * 1000)
    if lo >= 1e15:  # older torch: absolute epoch microseconds, no baseTimeNanoseconds
        return round(lo * 1000), round(hi * 1000)
    return 0, 0


def _rank_of(trace: dict[str, Any]) -> tuple[int, int]:
    """``(rank, world_size)`` from ``distributedInfo``; ``(0, 1)`` without it."""
    dist = trace.get("distributedInfo")
    if not isinstance(dist, dict):
        return 0, 1
    rank = _int(dist.get("rank"), 0)
    return rank, _int(dist.get("world_size"), max(1, rank + 1))


def _device_name(trace: dict[str, Any]) -> str:
    """The first device's name from ``deviceProperties``, for a trace with device work only
    (torch lists the GPUs even in CPU-only traces); ``cpu`` when it names none."""
    props = trace.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict) and props[0].get("name"):
        return str(props[0]["name"])
    return "cpu"


def _collect(paths: Sequence[str]) -> list[str]:
    """Every trace file the paths name, each once, in the order given."""
    files: list[str] = []
    seen: set[str] = set()
    for path in paths:
        for f in find_traces(path):
            key = os.path.realpath(f)
            if key not in seen:
                seen.add(key)
                files.append(f)
    return files


def _reports(
    paths: Sequence[str],
    *,
    rows: int,
    range_names: Iterable[str] = (),
    max_bytes: int = DEFAULT_MAX_MB * MB,
    only_named: bool = True,
) -> list[WindowReport]:
    """One report per trace; a directory's traces ordered by rank, then time."""
    pairs = _reports_with(
        paths,
        lambda report, trace: None,
        rows=rows,
        range_names=range_names,
        max_bytes=max_bytes,
        only_named=only_named,
    )
    return [report for report, _ in pairs]


def _reports_with(
    paths: Sequence[str],
    also: Callable[[WindowReport, dict[str, Any]], T],
    *,
    rows: int,
    range_names: Iterable[str] = (),
    max_bytes: int = DEFAULT_MAX_MB * MB,
    only_named: bool = True,
) -> list[tuple[WindowReport, T]]:
    """``_reports``, each with what ``also(report, trace)`` made of its trace while it was
    loaded (each trace is read once, and let go before the next)."""
    names = tuple(range_names)
    out: list[tuple[WindowReport, T]] = []
    _COLLECTIVE_FACTS.clear()  # the traces of one command at a time (a long-lived caller)
    for path in paths:
        group = []
        for f in _collect([path]):
            trace = load_checked(f, max_bytes)
            rep = report_from_trace(f, trace, rows=rows, range_names=names, only_named=only_named)
            if rep.world_size > 1:  # for rank_summary: a distributed job's collectives
                _COLLECTIVE_FACTS[f] = _collective_facts(trace, set(rep.ranges))
            group.append((rep, also(rep, trace)))
            del trace
        if os.path.isdir(path):
            group.sort(key=lambda pair: (pair[0].rank, pair[0].start_ns, pair[0].trace_file or ""))
        out.extend(group)
    # window index: the report's place among this command's reports of the same rank
    count: dict[int, int] = {}
    numbered = []
    for r, extra in out:
        numbered.append((dataclasses.replace(r, window=count.get(r.rank, 0)), extra))
        count[r.rank] = count.get(r.rank, 0) + 1
    return numbered


# ---------------------------------------------------------------- formatting helpers


def _ratio(after: float | None, before: float | None) -> float | None:
    if after is None or before is None or before <= 0:
        return None
    return after / before


def rank_summary(reports: Sequence[WindowReport]) -> dict[str, Any] | None:
    """Per range, its CPU time on every rank (summed over a rank's traces), the slowest rank
    and the spread; None when the reports come from fewer than two ranks."""
    ranks = sorted({r.rank for r in reports})
    if len(ranks) < 2:
        return None
    per_rank: dict[str, dict[int, float]] = {}
    totals: dict[int, float] = {}
    traces: dict[int, int] = {}
    steps: dict[int, set[int]] = {r: set() for r in ranks}
    for rep in reports:
        traces[rep.rank] = traces.get(rep.rank, 0) + 1
        steps[rep.rank].update(rep.steps)
        totals[rep.rank] = totals.get(rep.rank, 0.0) + rep.self_cpu_time_total_us
        for name, stats in rep.ranges.items():
            by_rank = per_rank.setdefault(name, {})
            by_rank[rep.rank] = by_rank.get(rep.rank, 0.0) + stats.cpu_time_us

    def spread(by_rank: dict[int, float]) -> dict[str, Any]:
        values = [by_rank[r] for r in ranks if r in by_rank]
        lo, hi = min(values), max(values)
        slowest = max((r for r in ranks if r in by_rank), key=lambda r: (by_rank[r], -r))
        return {
            "by_rank_us": {str(r): by_rank[r] for r in ranks if r in by_rank},
            "min_us": lo,
            "median_us": _median(values),
            "max_us": hi,
            "slowest_rank": slowest,
            "spread_us": hi - lo,
            "ratio": _ratio(hi, lo),
            "missing_ranks": [r for r in ranks if r not in by_rank],
        }

    order = sorted(per_rank, key=lambda n: (-max(per_rank[n].values()), n))
    skew = collective_skew(reports)
    out_ranges = {name: spread(per_rank[name]) for name in order}
    if skew is not None:
        for name, s in out_ranges.items():
            _by_outside(s, skew, name)
    return {
        "ranks": ranks,
        "traces_per_rank": {str(r): traces[r] for r in ranks},
        # sums compare like with like only when every rank recorded the same steps
        "steps_per_rank": {str(r): sorted(steps[r]) for r in ranks},
        "same_steps": len({frozenset(v) for v in steps.values()}) == 1,
        "ranges": out_ranges,
        "self_cpu_time_total": spread(totals),
        "collectives": skew,
    }


def _by_outside(s: dict[str, Any], skew: dict[str, Any], name: str) -> None:
    """A range's slowest rank, by time outside collectives: a range whose ranks differ mostly
    by waiting in collectives (the inclusive spread more than twice the spread outside them)
    names the late rank, the one the others waited for, never the one that waited longest."""
    late = skew["late_rank"]
    if _COLLECTIVE_NAME.match(name):  # the collective itself: all waiting
        if late is not None and late in {int(r) for r in s["by_rank_us"]}:
            s["slowest_rank"] = late
            s["slowest_by"] = "arrived last at the collectives (the others waited)"
        return
    outside = {int(r): v[name] for r, v in skew["outside_us"].items() if name in v}
    if len(outside) < 2:
        return
    s["outside_collectives_us"] = {str(r): outside[r] for r in sorted(outside)}
    spread_out = max(outside.values()) - min(outside.values())
    if late is not None and s["spread_us"] > 2 * spread_out and late in outside:
        s["slowest_rank"] = late
        s["slowest_by"] = "arrived last at the collectives (the others waited)"
    else:
        s["slowest_rank"] = max(outside, key=lambda r: (outside[r], -r))
        s["slowest_by"] = "time outside collectives"


def collective_skew(reports: Sequence[WindowReport]) -> dict[str, Any] | None:
    """Arrival skew at the collectives of a distributed job's traces (``report_from_trace``
    of each was read by this command): the ranks' collectives are matched by their order
    (each rank's in start order over its traces); at each, the rank that arrived last and
    by how much after the one before it. On one host (the traces' host and clock base
    agree) arrival is the start time; otherwise the clocks are not comparable and arrival
    is read from durations (the ranks leave a collective together, so the one that arrived
    last waited least). The late rank, if any, and the range where its extra time went
    (``_extra_range``). None without collectives on two ranks."""
    per, outside, shared = _gathered(reports)
    ranks = sorted(r for r in per if per[r])
    if len(ranks) < 2:
        return None
    last, notes = _leads(per, ranks, shared)
    matched = sum(len(v) for v in last.values())
    total = sum(sum(v) for v in last.values())
    top = max(ranks, key=lambda r: (sum(last[r]), -r))
    named = (
        bool(last[top])
        and total > 0
        and sum(last[top]) >= LATE_SHARE * total
        and _median(last[top]) >= LATE_FLOOR_US
    )
    by_rank = {
        str(r): {
            "arrived_last": len(last[r]),
            "late_by_us_total": sum(last[r]),
            "late_by_us_median": _median(last[r]) if last[r] else 0.0,
        }
        for r in ranks
    }
    return {
        "matched": matched,
        "clock": "shared (one host): arrival is the start"
        if shared
        else ("not shared (several hosts): arrival read from durations"),
        "by_rank": by_rank,
        "late_rank": top if named else None,
        "extra_time_in": _extra_range(outside, top) if named else None,
        "outside_us": {str(r): outside.get(r, {}) for r in ranks},
        "notes": notes,
    }


_Call = tuple[str, float, float]  # a collective: name, start (us), duration (us)


def _gathered(
    reports: Sequence[WindowReport],
) -> tuple[dict[int, list[_Call]], dict[int, dict[str, float]], bool]:
    """Per rank its collectives (over its traces, in start order; starts on the epoch clock:
    each process's ``ts`` counts from its own ``baseTimeNanoseconds``, rounded per process)
    and its ranges' time outside them; whether the traces share a clock (one host, and every
    trace gives its base, or none: older torch writes epoch times)."""
    per: dict[int, list[_Call]] = {}
    outside: dict[int, dict[str, float]] = {}
    hosts, based = set(), set()
    for rep in sorted(reports, key=lambda r: (r.rank, r.start_ns)):
        facts = _COLLECTIVE_FACTS.get(rep.trace_file or "")
        if facts is None:
            continue
        base = facts["base"]
        known = isinstance(base, int) and not isinstance(base, bool)
        shift = base / 1000 if known else 0.0
        per.setdefault(rep.rank, []).extend(
            (name, ts + shift, dur) for name, ts, dur in facts["collectives"]
        )
        mine = outside.setdefault(rep.rank, {})
        for name, us in facts["outside_us"].items():
            mine[name] = mine.get(name, 0.0) + us
        hosts.add(rep.host)
        based.add(known)
    shared = len(hosts) == 1 and "" not in hosts and len(based) == 1
    return per, outside, shared


def _leads(
    per: dict[int, list[_Call]], ranks: list[int], shared: bool
) -> tuple[dict[int, list[float]], list[str]]:
    """Per rank, by how much it arrived after the one before it at each collective where it
    arrived last (matched by position); notes on what could not be matched."""
    n = min(len(per[r]) for r in ranks)
    notes = []
    if any(len(per[r]) != n for r in ranks):
        counts = ", ".join(f"rank {r}: {len(per[r])}" for r in ranks)
        notes.append(
            f"the ranks recorded different numbers of collectives ({counts}); the "
            f"first {n} of each are matched by order"
        )
    last: dict[int, list[float]] = {r: [] for r in ranks}
    mismatched = 0
    for i in range(n):
        calls = {r: per[r][i] for r in ranks}
        if len({c[0] for c in calls.values()}) != 1:
            mismatched += 1
            continue
        arrival = {r: (c[1] if shared else -c[2]) for r, c in calls.items()}
        order = sorted(ranks, key=lambda r: (arrival[r], r))
        late = order[-1]
        last[late].append(arrival[late] - arrival[order[-2]])
    if mismatched:
        notes.append(f"{mismatched} matched position(s) name different collectives; skipped")
    return last, notes


def _extra_range(outside: dict[int, dict[str, float]], rank: int) -> dict[str, Any] | None:
    """The range whose time outside collectives on ``rank`` exceeds the other ranks' median
    the most; among those within 80% of that, the one of least time (nested ranges share the
    excess: the innermost names the cause)."""
    found = []
    for name, mine in outside.get(rank, {}).items():
        others = [v.get(name, 0.0) for r, v in outside.items() if r != rank]
        if others:
            found.append((mine - _median(others), mine, name))
    top = max((f[0] for f in found), default=0.0)
    if top <= 0:
        return None
    extra, mine, name = min((f for f in found if f[0] >= 0.8 * top), key=lambda f: (f[1], f[2]))
    return {"range": name, "extra_us": extra, "outside_collectives_us": mine}


def format_collective_skew(skew: dict[str, Any] | None) -> list[str]:
    """The lines under "ranks side by side" that name the late rank (``collective_skew``)."""
    if skew is None:
        return []
    from instrument.base.formatting import format_time_us

    lines = [f"note: {n}" for n in skew["notes"]]
    late = skew["late_rank"]
    if late is None:
        lines.append(
            f"collectives: {skew['matched']} matched across ranks; no rank arrives last "
            "consistently (no late rank)"
        )
        return lines
    r = skew["by_rank"][str(late)]
    lines.append(
        f"late rank: rank {late}, last at {r['arrived_last']} of {skew['matched']} collectives "
        f"by {format_time_us(r['late_by_us_median'])} (median); the others waited for it"
    )
    extra = skew["extra_time_in"]
    if extra:
        lines.append(
            f"  its extra time: range {extra['range']!r}, "
            f"+{format_time_us(extra['extra_us'])} outside collectives (its traces, summed)"
        )
    return lines


def _side(path: str, max_bytes: int = DEFAULT_MAX_MB * MB, shapes: bool = True) -> Side:
    """One side of a diff: a window per trace, every operator and kernel kept, with what the
    gate needs when ``shapes``: the input shapes of each range's operators (it compares them)
    and each range call's CPU and device time (a window's value is its median call)."""
    from .diff import Side, Window, range_shapes

    files = _collect([path])
    windows = []
    for f in files:
        trace = load_checked(f, max_bytes)
        rep = report_from_trace(f, trace, rows=_ALL)
        if shapes:
            windows.append(Window(rep, range_shapes(trace, rep.ranges), _range_calls(f, trace)))
        else:
            windows.append(Window(rep))
    return Side(path, tuple(files), tuple(windows))


def _range_calls(path: str, trace: dict[str, Any]) -> dict[str, RangeCalls]:
    """Per range, each outermost call's CPU and device time (ns), as the analysis reads the
    trace (``report_from_trace``: its ``user_annotation`` ranges). A call inside a call of the
    same name is not one of them, so a window with such calls has fewer durations than calls
    and the gate takes its mean (``diff.per_window``)."""
    from ..analysis.occurrences import walk_trace
    from ..base.report import RangeCalls
    from ..base.spans import RANGE

    try:
        nodes = walk_trace(trace).nodes
    except Exception as exc:  # noqa: BLE001 - a malformed event: bad input, not a crash
        raise InputError(
            path, f"events could not be analyzed ({type(exc).__name__}: {exc})", EXPECT_TRACE
        ) from None
    calls: dict[str, tuple[list[int], list[int]]] = {}
    for node in nodes:
        if node.kind != RANGE or _inside_itself(nodes, node):
            continue
        cpu, device = calls.setdefault(node.name, ([], []))
        cpu.append(node.end_ns - node.start_ns)
        device.append(node.device_ns)
    return {name: RangeCalls(tuple(c), tuple(d)) for name, (c, d) in calls.items()}


def _inside_itself(nodes: Sequence[Any], node: Any) -> bool:
    """Whether a call of the same name is open around ``node`` (recursion)."""
    idx = node.parent
    while idx >= 0:
        if nodes[idx].name == node.name:
            return True
        idx = nodes[idx].parent
    return False


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _max_mb_option(parser: argparse.ArgumentParser) -> None:
    """``--max-mb``: on every command that reads traces (the bound on a gzip bomb's cost)."""
    parser.add_argument(
        "--max-mb",
        type=_positive_int,
        default=DEFAULT_MAX_MB,
        metavar="MB",
        help=f"refuse a trace with more than MB megabytes (2^20 bytes) of JSON, for .json.gz "
        f"once decompressed, checked while reading, and a metrics record (a JSON line) longer "
        f"than that (default {DEFAULT_MAX_MB}: real windows write up to ~200 MB, and a trace "
        f"takes ~5x its size in memory to analyze)",
    )


def _error(message: str) -> None:
    """``torch-profiled: error: MESSAGE``, one line whatever the message holds (``printable``)."""
    _stderr(f"{PROG}: error: {printable(message)}\n")


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the exit flush cannot fail again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:
        pass


def _note(message: str) -> None:
    """``torch-profiled: MESSAGE`` on standard error (what the command is doing)."""
    _stderr(f"{PROG}: {printable(message)}\n")


def _stderr(text: str) -> None:
    try:
        sys.stderr.write(encodable(text, sys.stderr))
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


def encodable(text: str, stream: Any) -> str:
    """``text`` as ``stream``'s encoding can write it (``backslashreplace`` for the rest): a
    name in Chinese printed to an ASCII or Latin-1 terminal is escaped, not an error."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding, "replace")
    except LookupError:
        pass
    return text
