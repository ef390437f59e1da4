"""Reading, shaping and atomically writing Chrome/Kineto trace JSON. No torch imports.

Shaping a window's raw trace (``shape_trace``):
- ``@profiled`` ranges are recorded with ``_RecordFunctionFast`` (a ``cpu_op`` event); they are
  re-labelled ``user_annotation``, the category torch gives ``record_function`` ranges, so
  trace viewers and Holistic Trace Analysis treat them as user ranges.
- Step markers (zero-length ``profiled::step#N`` events the session emits when a recorded
  step begins, and ``profiled::window_end``) become ``ProfilerStep#N`` spans from one boundary
  to the next, as torch's own schedule writes them; HTA finds iterations from these.
- The warm-up (what was recorded before the first step marker: the profiler's start-up costs)
  is dropped, with the device work it launched.
- ``distributedInfo`` is always present and carries rank and world size, written with
  ``"rank": N`` spacing (HTA finds ranks with the regex ``"rank":\\s+(\\d+)``).
- ``profiledWindow`` (``{"device_in_use": true}``) says the profiled process had initialized
  CUDA (``distributed["device_in_use"]``): the window's health needs it where a window lost
  every device event (``analysis.window_health``).
- Range names come back as they were given: torch writes names into its JSON as they are (a
  ``"`` or ``\\`` unescaped) or changed (Kineto turns ``\\`` into ``/``, drops newlines and
  writes ``unknown`` for a name with any character it cannot print); where a name read from the
  trace is what torch makes of exactly one range name, the event gets that name back
  (``_restored``); only ``cpu_op`` events (our ranges, ``_RecordFunctionFast``), never a
  ``record_function`` range of the user's, whose name may read the same.

Reading (``load_trace``, ``loads_trace``): ``json.loads`` first (the normal path costs nothing
more). Only when that fails -- torch wrote a name with a ``"``, a lone ``\\`` or a control
character into its JSON unescaped, which loses the whole window -- is the text read again by a
lenient reader (``_Lenient``): every valid part still goes through ``json``'s C decoder (each
event of ``traceEvents`` on its own), and only a part that fails is read by hand, where a string
ends at the first ``"`` that is followed by what may follow a string at that place (a ``:``
after a key; ``}`` or ``, "key":`` after a value; ``,`` or ``]`` in an array). An event that
cannot be read even so is left out (one warning says how many).
The shaped trace we write is always valid JSON (``json.dumps``), so the trace file and every
reader after us get the names escaped.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
from collections.abc import Iterable
from typing import Any, BinaryIO

from instrument.base.files import write_atomic  # the one atomic-write helper

__all__ = [
    "MARKER_PREFIX",
    "STEP_MARKER",
    "STEP_PREFIX",
    "WINDOW_END",
    "load_trace",
    "loads_trace",
    "shape_file",
    "shape_trace",
    "write_json_atomic",
]

STEP_PREFIX = "ProfilerStep#"
MARKER_PREFIX = "profiled::"
STEP_MARKER = "profiled::step#"  # + step index, emitted when a recorded step begins
WINDOW_END = "profiled::window_end"


def load_trace(path: str) -> dict[str, Any]:
    """Load a ``.json`` or ``.json.gz`` trace (repaired where torch wrote invalid JSON: see
    the module docstring)."""
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    return loads_trace(data, path)


def loads_trace(data: bytes | str, where: str = "the trace") -> Any:
    """``json.loads(data)``; where that fails, the lenient reader's result (one warning when
    it had to leave events out), or the original ``ValueError`` when even that fails."""
    error: Exception
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        error = exc
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    reader = _Lenient(text)
    try:
        trace = reader.read()
    except (ValueError, IndexError, RecursionError):
        if isinstance(error, RecursionError):
            raise ValueError(f"{where} is JSON nested too deeply to read") from None
        raise error from None
    if reader.lost:
        warnings.warn(
            f"torch-profiled: {reader.lost} event(s) of {where} could not be read (torch wrote "
            "them as invalid JSON) and were left out; the rest of the window is reported",
            UserWarning,
            stacklevel=2,
        )
    return trace


# ---------------------------------------------------------------- the lenient reader

_DECODER = json.JSONDecoder(strict=False)  # raw control characters in strings are kept
_S = r"[ \t\n\r]*"
_WS = re.compile(_S)
# where a string torch wrote unescaped ends: the first '"' followed by what may follow it
_KEY_END = re.compile(rf'"(?={_S}:)')
_VALUE_END = re.compile(rf'"(?={_S}(?:\}}{_S}(?:[,\]}}]|\Z)|,{_S}"[^"\n]*"{_S}:))')
_ITEM_END = re.compile(rf'"(?={_S}(?:\]|,{_S}["\[{{0-9tfnNI-]))')
# the end of an event that cannot be read at all: its '}' before the next event or the ']'
_EVENT_END = re.compile(rf"\}}(?={_S}(?:,{_S}\{{|\]))")
_SCALAR = 400  # characters a number (or true, false, null) may take
_ESCAPE = re.compile(r'\\(?:u[0-9a-fA-F]{4}|["\\/bfnrt])')


def _skip(s: str, i: int) -> int:
    """The first position at or after ``i`` that is not JSON whitespace."""
    m = _WS.match(s, i)
    return m.end() if m is not None else i


def _unescape(match: re.Match[str]) -> str:
    return json.loads('"' + match.group() + '"')


def read_string(raw: str) -> str:
    """What the trace reader makes of a string written as ``"raw"``: ``json``'s reading where
    that is valid JSON, else its valid escapes decoded and everything else kept as it is."""
    try:
        value = _DECODER.decode('"' + raw + '"')
    except ValueError:
        return _ESCAPE.sub(_unescape, raw)
    return value if isinstance(value, str) else raw


class _Lenient:
    """Reads JSON that torch wrote with unescaped strings (see the module docstring)."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.lost = 0

    def read(self) -> Any:
        s = self.s
        i = _skip(s, 0)
        if s[i : i + 1] == "{":
            value, _ = self._object(i)  # the whole document is known to fail json
        else:
            value, _ = self._value(i, _ITEM_END)
        return value

    def _value(self, i: int, ends: re.Pattern[str]) -> tuple[Any, int]:
        s = self.s
        c = s[i : i + 1]
        if c == "{":
            if ends is _ITEM_END:  # an event: read by json's C decoder where it is valid
                m = _EVENT_END.search(s, i + 1)
                if m is not None:
                    # on its own: a failed parse counts the lines before it (quadratic in a
                    # big trace), and a name like 'a"}b' makes '{..."name": "a"}' look whole
                    event = s[i : m.end()]
                    try:
                        value, j = _DECODER.raw_decode(event)
                    except ValueError:
                        pass
                    else:
                        if j == len(event):
                            return value, m.end()
            return self._object(i)
        if c == "[":
            return self._array(i)
        if c == '"':
            return self._string(i, ends)
        value, j = _DECODER.raw_decode(s[i : i + _SCALAR])  # a number, true, false, null
        return value, i + j

    def _string(self, i: int, ends: re.Pattern[str]) -> tuple[str, int]:
        # never past the end of the event it is in: a broken event costs itself only
        stop = _EVENT_END.search(self.s, i + 1)
        m = ends.search(self.s, i + 1, stop.end() if stop is not None else len(self.s))
        if m is None:
            raise ValueError(f"a string at {i} never ends")
        return read_string(self.s[i + 1 : m.start()]), m.end()

    def _object(self, i: int) -> tuple[dict[str, Any], int]:
        s = self.s
        out: dict[str, Any] = {}
        i = _skip(s, i + 1)
        if s[i : i + 1] == "}":
            return out, i + 1
        while True:
            if s[i : i + 1] != '"':
                raise ValueError(f"a key expected at {i}")
            key, i = self._string(i, _KEY_END)
            i = _skip(s, i)
            if s[i : i + 1] != ":":
                raise ValueError(f"':' expected at {i}")
            i = _skip(s, i + 1)
            out[key], i = self._value(i, _VALUE_END)
            i = _skip(s, i)
            c = s[i : i + 1]
            if c == ",":
                i = _skip(s, i + 1)
            elif c == "}":
                return out, i + 1
            else:
                raise ValueError(f"',' or '}}' expected at {i}")

    def _array(self, i: int) -> tuple[list[Any], int]:
        s = self.s
        out: list[Any] = []
        i = _skip(s, i + 1)
        if s[i : i + 1] == "]":
            return out, i + 1
        while True:
            try:
                value, j = self._value(i, _ITEM_END)
            except (ValueError, IndexError):
                m = _EVENT_END.search(s, i + 1) if s[i : i + 1] == "{" else None
                if m is None:
                    raise
                self.lost += 1  # this event only
                j = m.end()
            else:
                out.append(value)
            i = _skip(s, j)
            c = s[i : i + 1]
            if c == ",":
                i = _skip(s, i + 1)
            elif c == "]":
                return out, i + 1
            else:
                raise ValueError(f"',' or ']' expected at {i}")


# ---------------------------------------------------------------- names torch changed


def _renderings(name: str) -> tuple[str, ...]:
    """What torch may write between the quotes for ``name``: the name as it is (torch
    builds that escape nothing), and Kineto's (``\\`` -> ``/``, newlines dropped, ``unknown``
    where a character is not printable ASCII)."""
    kineto = name.replace("\\", "/").replace("\n", "")
    if any(not " " <= c <= "~" for c in kineto):
        kineto = UNKNOWN
    return (name, kineto)


UNKNOWN = "unknown"


def _restored(names: frozenset[str]) -> dict[str, str]:
    """A name as read from a trace -> the range name torch wrote it for, where exactly one
    range name comes out as it and no range has that name itself."""
    found: dict[str, set[str]] = {}
    for name in names:
        for raw in _renderings(name):
            read = read_string(raw)
            if read != name and read not in names:
                found.setdefault(read, set()).add(name)
    return {read: next(iter(given)) for read, given in found.items() if len(given) == 1}


def shape_trace(
    trace: dict[str, Any],
    range_names: Iterable[str],
    distributed: dict[str, Any],
) -> dict[str, Any]:
    """Shape a raw window trace in place (see module docstring); returns it."""
    names = frozenset(range_names)
    restore = _restored(names)  # usually empty
    events = trace.get("traceEvents", [])
    markers: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    for ev in events:
        name = ev.get("name")
        cat = ev.get("cat")
        if ev.get("ph") == "X" and cat in ("cpu_op", "user_annotation"):
            if restore and cat == "cpu_op" and name in restore:
                name = ev["name"] = restore[name]
            if isinstance(name, str) and name.startswith(MARKER_PREFIX):
                markers.append(ev)
                continue
            if name in names:
                ev["cat"] = "user_annotation"
        kept.append(ev)
    if markers:
        markers.sort(key=lambda e: float(e.get("ts", 0.0)))
        first_step = next((m for m in markers if m.get("name") != WINDOW_END), None)
        end = next((m for m in markers if m.get("name") == WINDOW_END), None)
        if first_step is not None or end is not None:
            kept = _keep_recorded(
                kept,
                float(first_step.get("ts", 0.0)) if first_step is not None else None,
                float(end.get("ts", 0.0)) if end is not None else None,
            )
        tid = markers[0].get("tid")
        for here, nxt in zip(markers, markers[1:]):
            if here.get("name") == WINDOW_END:
                continue
            span = dict(here)
            span["name"] = STEP_PREFIX + here["name"][len(STEP_MARKER) :]
            span["cat"] = "user_annotation"
            span["tid"] = tid
            span["dur"] = round(float(nxt["ts"]) - float(here["ts"]), 3)
            kept.append(span)
    trace["traceEvents"] = kept
    info = dict(trace.get("distributedInfo") or {})
    info.setdefault("backend", distributed.get("backend"))
    info["rank"] = int(distributed.get("rank", 0))
    info["world_size"] = int(distributed.get("world_size", 1))
    trace["distributedInfo"] = info
    if distributed.get("device_in_use"):
        # the window's health reads it back (``events.trace_facts``): a window of operators
        # with no device event at all is then device-missing, not a CPU-only window
        trace["profiledWindow"] = {"device_in_use": True}
    return trace


_DEVICE_CATS = frozenset(
    {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "mtia_ccp_events"}
)


def _keep_recorded(
    events: list[dict[str, Any]], cut: float | None, end: float | None
) -> list[dict[str, Any]]:
    """Keep what the recorded steps did: drop host events that began before the first
    recorded step (``cut``: the warm-up) or at or after the window's end marker (``end``: a
    CUDA window whose stop was deferred records a few more steps), the device work they
    launched, and their flow arrows. Device work the kept steps launched stays, also where it
    ran after ``end``. The whole-trace span (category ``Trace``) and metadata events stay."""
    lo = float("-inf") if cut is None else cut
    hi = float("inf") if end is None else end
    dropped_ids: set[Any] = set()
    dropped_corr: set[Any] = set()
    kept: list[dict[str, Any]] = []
    later: list[dict[str, Any]] = []
    for ev in events:
        ph = ev.get("ph")
        if ph == "X" and ev.get("cat") != "Trace":
            if ev.get("cat") in _DEVICE_CATS:
                later.append(ev)
                continue
            ts = float(ev.get("ts", 0.0))
            if ts < lo or ts >= hi:
                args = ev.get("args") or {}
                if "correlation" in args:  # a runtime call: its own launches only
                    dropped_corr.add(args["correlation"])
                elif "External id" in args:  # an operator: everything it launched
                    dropped_ids.add(args["External id"])
                continue
        elif ph in ("s", "f", "t"):
            later.append(ev)
            continue
        kept.append(ev)
    dropped_ids.discard(0)
    dropped_ids.discard(None)
    dropped_corr.discard(0)
    dropped_corr.discard(None)
    for ev in later:
        args = ev.get("args") or {}
        ts = float(ev.get("ts", 0.0))
        if ev.get("ph") == "X":
            if (
                ts < lo
                or args.get("External id") in dropped_ids
                or args.get("correlation") in dropped_corr
            ):
                continue
        elif ts < lo or (ev.get("id") in dropped_corr if ev.get("cat") == "ac2g" else ts >= hi):
            continue  # a launch -> kernel arrow of a dropped launch; other arrows by time
        kept.append(ev)
    return kept


def shape_file(
    path: str,
    range_names: Iterable[str],
    distributed: dict[str, Any],
    *,
    gzip_to: str | None = None,
) -> dict[str, Any]:
    """Shape the raw window trace at ``path`` in place (a scratch file: no ``fsync``) and
    return the shaped trace. With ``gzip_to``, the same bytes are also written there
    gzip-compressed (a scratch file too: the trace exporter links it into place), unless that
    write fails (``OSError``: the file is then absent, and the exporter compresses ``path``)."""
    trace = shape_trace(load_trace(path), range_names, distributed)
    data = _encode(trace)

    def write(f: BinaryIO) -> None:
        f.write(data)

    write_atomic(path, write, durable=False)
    if gzip_to:
        try:
            write_atomic(gzip_to, write, compress=True, durable=False)
        except OSError:
            pass  # (write_atomic left no file there)
    return trace


def write_json_atomic(obj: Any, path: str, *, compress: bool, durable: bool = True) -> None:
    """Write JSON so that ``path`` either does not exist or is complete
    (``instrument.base.files.write_atomic``; ``durable=False`` for a scratch file: no ``fsync``)."""
    write_atomic(path, lambda f: _dump(obj, f), compress=compress, durable=durable)


def _dump(obj: Any, binary) -> None:
    binary.write(_encode(obj))


def _encode(obj: Any) -> bytes:
    # json.dumps, not json.dump: dump streams through the pure-Python encoder, dumps uses the C
    # one (5x faster on a training step's window: 6.7 vs 32 ms for 2,400 events). Default
    # separators: '"rank": 0', as HTA's regex needs.
    return json.dumps(obj).encode("utf-8")
