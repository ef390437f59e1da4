"""Odd names in traces (issue 29, item 12): torch writes range names into its trace JSON as it
got them, without escaping (a ``"`` makes the JSON invalid; older torch also leaves ``\\`` and
control characters raw) or changed (Kineto turns ``\\`` into ``/``, drops newlines, writes
``unknown`` for unprintable characters). Such a window used to be lost for every exporter. Now
the trace is repaired when read (only when ``json.loads`` fails), names torch changed get their
range's name back, and the window's record, spans and trace file all come with names intact.

End to end: a real program (CPU torch.profiler windows) with decorated and ``record_function``
names of that class, the json and trace exporters and an in-memory exporter that asks for
per-call occurrences (what the otel exporter's spans are built from), with the analysis in the
helper process and in this process. The reader itself is tested on text in the shape Kineto
writes, for names torch 2.13 no longer writes raw (older torch does).
"""

from __future__ import annotations

import json
import os

import pytest

from instrument.analysis.kineto_json import loads_trace, shape_trace
from tests import _proc
from tests._records import window_records

# decorated names: the class of the finding (quote, backslash, trailing backslash, newline,
# a control character, a \u sequence, an escaped quote, JSON-looking and HTML-looking text).
# Kineto writes "unknown" for every name with a character it cannot print: only one such name
# here, so that it can be given back (two are ambiguous: tested on the reader below)
RANGES = [
    'say "hi"',
    "C:\\data\\load",
    "ends with\\",
    "two\nlines",
    "tab\there",
    "uni\\u0041",
    'q\\"q',
    'x", "y',
    'a"}b',
    "<!--<script>",
]
# the user's own record_function names: the SDK cannot sanitize these; torch keeps them as they
# are here (a quote), so they must come through as they are
USER = ['user "quoted"', 'end"', '"']

PROGRAM = r"""
import json, sys
import torch
from torch.profiler import record_function
from exporters import InMemoryExporter, JsonLinesExporter, TraceFileExporter
from instrument import Schedule, profiled, session
from instrument.base.report import OccurrenceBudget

ranges, user, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
funcs = [profiled(name)(lambda x: x + 1) for name in ranges]
mem = InMemoryExporter()
mem.occurrence_budget = OccurrenceBudget(1000)
exporters = [JsonLinesExporter(out + "/r.jsonl"), TraceFileExporter(out + "/t", gzip=False), mem]
with session(schedule=Schedule(wait=0, warmup=1, active=2), exporters=exporters) as s:
    for _ in range(3):
        x = torch.ones(4)
        for f in funcs:
            x = f(x)
        for name in user:
            with record_function(name):
                x = x * 2
        s.step()
(report,) = mem.reports
print(json.dumps(sorted(o.name for o in report.occurrences.items if o.kind == "range")))
"""


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """The module's three programs (each its own process, as before), run two at a time as
    the module starts; a test reads its own, from its directory."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:
        for helper in ("1", "0"):
            key = f"test_a_window_with_odd_names_reaches_every_exporter_with_names_intact[{helper}]"
            ahead.add(key, "-c", PROGRAM, json.dumps(RANGES), json.dumps(USER), ".",
                      env=_proc.sdk_env(PROFILED_ANALYSIS_PROCESS=helper), timeout=180)  # fmt: skip
        ahead.add(
            "test_the_cli_reads_a_plain_profilers_trace_with_quotes_in_names",
            *("-c", PLAIN_PROFILER, "plain.pt.trace.json"),
            env=_proc.sdk_env(),
        )
        yield ahead


@pytest.mark.parametrize("helper", ["1", "0"])
def test_a_window_with_odd_names_reaches_every_exporter_with_names_intact(ahead, request, helper):
    run, tmp_path = ahead[request.node.name]  # PROGRAM, writing into its directory
    assert run.returncode == 0, run.stderr
    assert "could not be analyzed" not in run.stderr and "Traceback" not in run.stderr
    # the JSON line: one record, every range and the user's ranges by their own names
    (record,) = window_records((tmp_path / "r.jsonl").read_text(encoding="utf-8"))
    ranges = record["ranges"]
    for name in RANGES + USER:
        assert name in ranges, (name, sorted(ranges))
        assert ranges[name]["calls"] == 2  # two recorded steps
    # the spans' occurrences: each range call by its name
    spans = json.loads(run.stdout.splitlines()[-1])
    for name in RANGES + USER:
        assert spans.count(name) == 2, (name, spans)
    # the trace file: valid JSON, the names as given
    (trace_name,) = os.listdir(tmp_path / "t")
    trace = json.loads((tmp_path / "t" / trace_name).read_text(encoding="utf-8"))
    annotated = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    for name in RANGES + USER:
        assert annotated.count(name) == 2, (name, sorted(set(annotated)))


# ---------------------------------------------------------------- the reader, on Kineto's shape

EVENT = """  {
    "ph": "X", "cat": "%s", "name": "%s", "pid": 1, "tid": 1,
    "ts": %d.000, "dur": 1.000,
    "args": {
      "External id": %d, "Record function id": 0
    }
  }"""
RAW_NAMES = RANGES + [
    "bell\x07",
    "naïve",
    "\\",
    '""',
    'a":1',
    "\\u00",
    "\\ud800",
    '\\\\"',
    "é",
    "x\\",
]


def _raw_trace(names: list[str], cat: str = "cpu_op") -> str:
    """A trace the way torch without escaping writes it: names between quotes as they are."""
    events = [EVENT % (cat, n, i * 10, i + 1) for i, n in enumerate(names)]
    return '{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + ",\n".join(events) + "\n  ]\n}\n"


def _kineto(name: str) -> str:
    """What Kineto in torch 2.13 writes for a name (libkineto output_json.cpp)."""
    name = name.replace("\\", "/").replace("\n", "")
    return name if all(" " <= c <= "~" for c in name) else "unknown"


def test_raw_names_are_read_back_and_given_back_to_their_ranges():
    text = _raw_trace(RAW_NAMES)
    with pytest.raises(ValueError):
        json.loads(text)
    trace = loads_trace(text)
    assert len(trace["traceEvents"]) == len(RAW_NAMES)
    shape_trace(trace, RAW_NAMES, {"rank": 0, "world_size": 1})
    assert [e["name"] for e in trace["traceEvents"]] == RAW_NAMES
    assert {e["cat"] for e in trace["traceEvents"]} == {"user_annotation"}
    assert json.loads(json.dumps(trace)) == trace  # what we write is valid JSON


def test_names_kineto_changed_are_given_back_when_unambiguous():
    names = ["C:\\data\\load", "two\nlines", "naïve", 'q\\"q', "x\\"]
    trace = loads_trace(_raw_trace([_kineto(n) for n in names]))
    shape_trace(trace, names, {"rank": 0, "world_size": 1})
    assert [e["name"] for e in trace["traceEvents"]] == names
    # two names Kineto writes alike ("unknown"), or a range that has the written name itself:
    # nothing is given back (a wrong name would be worse than torch's)
    both = ["naïve", "日本"]
    trace = loads_trace(_raw_trace([_kineto(n) for n in both]))
    shape_trace(trace, both, {"rank": 0, "world_size": 1})
    assert [e["name"] for e in trace["traceEvents"]] == ["unknown", "unknown"]
    trace = loads_trace(_raw_trace(["a/b"]))
    shape_trace(trace, ["a\\b", "a/b"], {"rank": 0, "world_size": 1})
    assert [e["name"] for e in trace["traceEvents"]] == ["a/b"]


def test_names_are_given_back_only_to_our_ranges_not_to_the_users_record_function():
    for written, name in (("unknown", "naïve"), ("a/b", "a\\b"), ("two", "t\nwo")):
        trace = loads_trace(_raw_trace([written], cat="user_annotation"))
        shape_trace(trace, [name], {"rank": 0, "world_size": 1})
        assert trace["traceEvents"][0]["name"] == written


def test_an_event_that_cannot_be_read_is_left_out_with_a_warning_not_the_window():
    events = [EVENT % ("cpu_op", n, i, i + 1) for i, n in enumerate(["ok", "fine"])]
    broken = '  {\n    "ph": "X", "name": "bad" "x": }'
    text = '{"traceEvents": [\n' + ",\n".join([events[0], broken, events[1]]) + "\n]}"
    with pytest.warns(UserWarning, match="1 event"):
        trace = loads_trace(text)
    assert [e["name"] for e in trace["traceEvents"]] == ["ok", "fine"]


def test_what_is_not_a_trace_still_fails_with_jsons_own_error():
    for text in ("{not json", "", '{"traceEvents": [1, 2', "[[[[" * 10000):
        with pytest.raises(ValueError):
            loads_trace(text)


PLAIN_PROFILER = r"""
import sys, torch
from torch.profiler import profile, record_function
with profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for name in ('say "hi"', 'x", "y', "q}q"):
        with record_function(name):
            torch.ones(8, 8).sum()
prof.export_chrome_trace(sys.argv[1])
"""


def test_the_cli_reads_a_plain_profilers_trace_with_quotes_in_names(ahead, request):
    """``torch-profiled summarize`` of a trace the user's own torch.profiler wrote: torch
    leaves ``"`` in names unescaped (invalid JSON); the CLI reads it as the SDK's windows do."""
    made, tmp_path = ahead[request.node.name]  # PLAIN_PROFILER
    trace = tmp_path / "plain.pt.trace.json"
    assert made.returncode == 0, made.stderr[-2000:]
    with pytest.raises(ValueError):
        json.loads(trace.read_text())  # what torch wrote is not JSON: the case under test
    out = _proc.run("-m", "instrument", "summarize", str(trace), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    for name in ('say \\"hi\\"', 'x\\", \\"y', "q}q"):
        assert name in text, (name, text[:2000])
