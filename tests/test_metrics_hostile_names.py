"""Any range name makes valid metrics in every output (issue 29, item 14).

One name that is not valid Unicode (a lone surrogate: ``os.fsdecode`` of a file name that is
not UTF-8) froze the Prometheus page (its encoding raised every interval); in JSON lines it was
written as a ``\\udcff`` escape that strict readers refuse and that no UTF-8 text can hold; in
OTLP the attribute was dropped with a traceback. The same hostile set goes through each: lone
surrogates, control characters, quotes, backslashes, newlines, non-BMP, and a name that becomes
the same text as another one's.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from exporters import JsonLinesExporter
from exporters.prometheus import exposition
from instrument.runtime import metrics
from tests import _proc

PROMETHEUS = shutil.which("prometheus")

SURROGATE = os.fsdecode(b"load-\xff.bin")  # 'load-\udcff.bin'

# each hostile name, and how the Prometheus page shows it (as a scraper reads it back)
PAGE_SHOWS = {
    SURROGATE: "load-\\udcff.bin",
    "lone-\ud800-high": "lone-\\ud800-high",
    'quote"d': 'quote"d',
    "back\\slash": "back\\slash",
    "new\nline": "new\nline",
    "cr\rreturn": "cr\\x0dreturn",
    "bell\x07esc\x1b[31mred": "bell\\x07esc\\x1b[31mred",
    "nul\x00tab\t": "nul\\x00tab\\x09",
    "nel\x85sep\u2028": "nel\\x85sep\\u2028",
    "emoji-\U0001f600-é": "emoji-\U0001f600-é",
    "}{=,# HELP": "}{=,# HELP",
    "plain": "plain",
}
# how JSON lines and OTLP show it: only lone surrogates need a change there
TEXT_SHOWS = {name: name.encode("utf-8", "backslashreplace").decode() for name in PAGE_SHOWS}
LITERAL = "load-\\udcff.bin"  # a name that is already the surrogate's text: both are kept


def _names() -> list[str]:
    return [*PAGE_SHOWS, LITERAL]


# In a real program the decorator makes a name torch cannot record safe where it is given
# (surrogates and NUL become percent escapes): those names reach the metrics changed.
GIVEN_AS = {SURROGATE: "load-%FF.bin", "lone-\ud800-high": "lone-%uD800-high"}
GIVEN_AS["nul\x00tab\t"] = "nul%00tab\t"
PROGRAM_PAGE_SHOWS = {**PAGE_SHOWS, **GIVEN_AS, "nul\x00tab\t": "nul%00tab\\x09"}
PROGRAM_TEXT_SHOWS = {**TEXT_SHOWS, **GIVEN_AS}


def _program_expected(shows: dict[str, str]) -> dict[str, int]:
    """Name as a real program's metrics show it -> its call count (no two collide there)."""
    return {**{shows[name]: i + 1 for i, name in enumerate(PAGE_SHOWS)}, LITERAL: 50}


def _no_surrogates(value) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_no_surrogates(k) and _no_surrogates(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_no_surrogates(v) for v in value)
    return True


def _expected(shows: dict[str, str]) -> dict[str, int]:
    """Name as shown -> its call count (the i-th name is called i+1 times; the literal name,
    called 50 times, and the surrogate's one share a text: one of them gets ``#2``)."""
    return {shows[name]: i + 1 for i, name in enumerate(PAGE_SHOWS)}


def _check_pair(found: dict[str, float], shows: dict[str, str]) -> None:
    expected = _expected(shows)
    text = shows[SURROGATE]
    pair = {found.pop(text), found.pop(text + "#2")}
    assert pair == {expected.pop(text), 50}
    assert found == expected


def _snapshot():
    metrics.reset()
    try:
        rec = metrics.recorder
        for i, name in enumerate(PAGE_SHOWS):
            for _ in range(i + 1):
                metrics.record(rec, name, 1000)
        for _ in range(50):
            metrics.record(rec, LITERAL, 1000)
        return metrics.snapshot()
    finally:
        metrics.reset()


# ---------------------------------------------------------------- Prometheus


def _page_counts(page: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "profiled_range_duration_seconds_count":
                assert sample.labels["range"] not in found
                found[sample.labels["range"]] = sample.value
    return found


def test_the_exposition_of_hostile_names_is_one_valid_page():
    page = exposition(_snapshot())
    data = page.encode("utf-8")  # raised UnicodeEncodeError: the page was never replaced
    assert data.decode("utf-8") == page
    for line in page.split("\n")[:-1]:  # one sample or comment per line, whatever splits lines
        assert line.splitlines() == [line]
        assert line.startswith(("# HELP ", "# TYPE ", "profiled_"))
    _check_pair(_page_counts(page), PAGE_SHOWS)


PROGRAM = r"""
import sys, torch
from instrument import profiled

NAMES = {names!r}
x = torch.zeros(2)
for i, name in enumerate(NAMES[:-1]):
    f = profiled(name)(lambda x: x + 1)
    for _ in range(i + 1):
        f(x)
f = profiled(NAMES[-1])(lambda x: x + 1)
for _ in range(50):
    f(x)
print("ready", flush=True)
sys.stdin.read()
print("done", flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 - loopback only
        return r.read().decode("utf-8")


@pytest.fixture
def program(tmp_path):
    """A real program with the hostile names, serving /metrics and appending JSON lines."""
    port = _free_port()
    (tmp_path / "prog.py").write_text(PROGRAM.format(names=_names()))
    env = _proc.sdk_env(
        PROFILED_EXPORTERS="prometheus,json",
        PROFILED_JSON_PATH=str(tmp_path / "m.jsonl"),
        PROFILED_SAMPLE_RATE="0",  # metrics only: names in windows are another finding's
        PROFILED_PROMETHEUS_ADDR=f"127.0.0.1:{port}",
        PROFILED_METRICS_INTERVAL_S="0.1",
    )
    proc = _proc.start(str(tmp_path / "prog.py"), env=env, cwd=tmp_path, stdin=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        yield port, tmp_path / "m.jsonl"
    finally:
        out, err = proc.communicate("", timeout=120)
    assert proc.returncode == 0 and out == "done\n", err
    assert "Traceback" not in err, err
    warned = [line for line in err.splitlines() if "Warning" in line]
    assert len(warned) == 1 and "cannot be recorded as given" in warned[0], err


def test_a_program_with_hostile_names_serves_and_appends_them_all(program):
    port, jsonl = program
    deadline = time.monotonic() + 60
    while True:  # the live page, and the first interval's record
        found = _page_counts(_get(f"http://127.0.0.1:{port}/metrics"))
        written = jsonl.exists() and b"metrics/1" in jsonl.read_bytes()  # (the page is live)
        if (len(found) == len(PAGE_SHOWS) + 1 and written) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert found == _program_expected(PROGRAM_PAGE_SHOWS)
    # the JSON lines of the same program: valid UTF-8, every record's names as text
    lines = jsonl.read_bytes().decode("utf-8").splitlines()  # strict: no surrogate bytes
    assert lines
    last = json.loads(lines[-1])
    assert _no_surrogates(last)
    ranges = {k: v["count"] for k, v in last["ranges"].items()}
    assert ranges == _program_expected(PROGRAM_TEXT_SHOWS)


@pytest.mark.skipif(
    PROMETHEUS is None, reason="needs the prometheus server (Debian package prometheus)"
)
def test_a_real_prometheus_server_ingests_every_hostile_name(program, tmp_path):
    port, _ = program
    web = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: profiled\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    server = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        query = urllib.parse.quote("profiled_range_duration_seconds_count")
        deadline = time.monotonic() + 60
        found: dict[str, float] = {}
        while time.monotonic() < deadline and len(found) < len(PAGE_SHOWS) + 1:
            time.sleep(0.5)
            try:
                doc = json.loads(_get(f"http://127.0.0.1:{web}/api/v1/query?query={query}"))
            except OSError:
                continue  # not listening yet
            found = {r["metric"]["range"]: float(r["value"][1]) for r in doc["data"]["result"]}
        assert found == _program_expected(PROGRAM_PAGE_SHOWS)
        up = json.loads(_get(f"http://127.0.0.1:{web}/api/v1/query?query=up"))
        assert [r["value"][1] for r in up["data"]["result"]] == ["1"]
    finally:
        server.terminate()
        server.wait(30)


# ---------------------------------------------------------------- JSON lines


def test_json_lines_metrics_records_of_hostile_names_are_valid_utf8(tmp_path):
    path = tmp_path / "m.jsonl"
    JsonLinesExporter(path).export_metrics(_snapshot())
    (line,) = path.read_bytes().decode("utf-8").splitlines()
    record = json.loads(line)
    assert _no_surrogates(record)  # a "\udcff" JSON escape read back as a lone surrogate
    _check_pair({k: v["count"] for k, v in record["ranges"].items()}, TEXT_SHOWS)


def test_json_lines_window_records_of_hostile_names_are_valid_utf8(tmp_path):
    from instrument.base.report import FrozenMap, RangeStats, WindowReport

    names = _names()
    ranges = FrozenMap({n: RangeStats(n, i + 1, 1.0, 1.0, 0.0, 0) for i, n in enumerate(names)})
    report = WindowReport(
        window=0,
        steps=(0,),
        partial=False,
        start_ns=0,
        end_ns=1,
        rank=0,
        world_size=1,
        host=SURROGATE,
        pid=0,
        device="cpu",
        activities=("cpu",),
        ranges=ranges,
    )
    path = tmp_path / "w.jsonl"
    JsonLinesExporter(path).export(report)
    (line,) = path.read_bytes().decode("utf-8").splitlines()
    record = json.loads(line)
    assert _no_surrogates(record) and record["host"] == "load-\\udcff.bin"
    assert len(record["ranges"]) == len(names)
    calls = {k: v["calls"] for k, v in record["ranges"].items()}
    text = TEXT_SHOWS[SURROGATE]
    assert {calls.pop(text), calls.pop(text + "#2")} == {1, len(names)}
    assert calls == {TEXT_SHOWS[n]: i + 1 for i, n in enumerate(PAGE_SHOWS) if n != SURROGATE}


# ---------------------------------------------------------------- OpenTelemetry (OTLP)


def test_otlp_metrics_of_hostile_names_keep_every_name(caplog):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.common")
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.sdk.resources import Resource

    from exporters.otel_metrics import metrics_data

    data = metrics_data(_snapshot(), Resource.create({}), "torch-profiled", "0")
    with caplog.at_level("ERROR"):
        wire = encode_metrics(data).SerializeToString()  # the OTLP exporters' own encoding
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text  # dropped
    request = ExportMetricsServiceRequest.FromString(wire)
    (metric,) = request.resource_metrics[0].scope_metrics[0].metrics
    found = {}
    for point in metric.histogram.data_points:
        attrs = {kv.key: kv.value.string_value for kv in point.attributes}
        found[attrs["profiled.range.name"]] = point.count
    _check_pair(found, TEXT_SHOWS)
