"""The otel exporter against real OTLP receivers (oteltest's, on 127.0.0.1), real profiler
windows and real failing endpoints."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import warnings

import pytest
import torch
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from exporters import ExporterWarning, ExportResult, InMemoryExporter, resolve_exporters
from exporters.otel import OTelExporter, plan_spans
from exporters.otel_settings import otel_settings_from_env
from instrument import Schedule, profiled, session
from instrument.base.report import Occurrence
from instrument.runtime.config import ConfigWarning
from tests.otlp_receiver import (
    GrpcReceiver,
    HangingServer,
    HttpReceiver,
    Received,
    attributes,
    closed_endpoint,
)

PROTOCOLS = {"http/protobuf": HttpReceiver, "grpc": GrpcReceiver}


@profiled("outer")
def outer(x):
    return inner(x) + inner(x)


@profiled("inner")
def inner(x):
    return x @ x


@profiled("tiny")
def tiny(x):
    return x + 1


def _request_context(trace_id: int, span_id: int):
    """The context of an incoming request that carried a W3C traceparent header."""
    header = f"00-{trace_id:032x}-{span_id:016x}-01"
    return TraceContextTextMapPropagator().extract({"traceparent": header})


@pytest.fixture
def otlp_env(monkeypatch):
    for var in list(os.environ):  # proxies too: the receivers are on 127.0.0.1, reached directly
        if var.startswith("OTEL_") or var.lower().endswith("_proxy"):
            monkeypatch.delenv(var)

    def setup(endpoint: str, protocol: str = "http/protobuf", **extra: str) -> None:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        for key, val in extra.items():
            monkeypatch.setenv(key, val)

    return setup


@pytest.fixture(params=list(PROTOCOLS))
def receiver(request):
    received = Received()
    server = PROTOCOLS[request.param](received)
    server.start()
    yield request.param, server, received
    server.stop()


def _requests_in_a_window(exporter, requests=2, sleep=0.002):
    """Request i is step i + 1 and runs in the context of a propagated request span; step 0
    (warm-up) is empty, steps 1-2 are recorded. Returns the memory exporter and each
    request's (t0, t1, trace id, span id)."""
    mem = InMemoryExporter()
    spans = []
    with session(exporters=[exporter, mem], schedule=Schedule(wait=0, warmup=1, active=2)) as s:
        s.step()  # the warm-up step (in a session only s.step() ends steps)
        for i in range(requests):
            trace_id, span_id = 0xA000 + i, 0xB000 + i
            token = otel_context.attach(_request_context(trace_id, span_id))
            try:
                t0 = time.time_ns()
                time.sleep(sleep)
                outer(torch.ones(16, 16))
                outer(torch.ones(16, 16))
                time.sleep(sleep)
                t1 = time.time_ns()
                s.step()  # the window's export runs here, inside request i's context
            finally:
                otel_context.detach(token)
            spans.append((t0, t1, f"{trace_id:032x}", f"{span_id:016x}"))
    return mem, spans


def test_spans_and_metrics_arrive_over_the_wire_nested_in_the_request(otlp_env, receiver):
    protocol, server, received = receiver
    otlp_env(
        server.endpoint,
        protocol,
        OTEL_SERVICE_NAME="wire-test",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=ci",
    )
    exporter = OTelExporter()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExporterWarning)  # delivery must not fail
        mem, requests = _requests_in_a_window(exporter)
    (report,) = mem.reports
    assert received.wait(lambda r: r.spans() and "profiled.windows" in r.metrics())
    spans = received.spans()
    (window,) = [s for s in spans if s["name"] == "profiled.window"]

    # the parent: the request whose @profiled call began the window (request 0), not the
    # request during which the window was exported (request 1)
    _, _, trace_id, span_id = requests[0]
    assert window["trace_id"] == trace_id and window["parent_id"] == span_id
    wa = window["attributes"]
    assert wa["profiled.kind"] == "window" and wa["profiled.window.index"] == 0
    assert wa["profiled.window.steps"] == [1, 2] and wa["profiled.window.partial"] is False
    assert (wa["profiled.rank"], wa["profiled.world_size"], wa["profiled.device"]) == (0, 1, "cpu")
    assert wa["profiled.verdict"] == "cpu-only"
    assert wa["profiled.cpu_time_us"] == pytest.approx(report.self_cpu_time_total_us)
    assert wa["profiled.otel.folded_occurrences"] == 0 and wa["profiled.otel.dropped_spans"] == 0

    ranges = [s for s in spans if s["name"] in ("outer", "inner")]
    by_id = {s["span_id"]: s for s in spans}
    outers = [s for s in ranges if s["name"] == "outer"]
    inners = [s for s in ranges if s["name"] == "inner"]
    assert len(outers) == report.ranges["outer"].calls == 4  # two calls in each request
    assert len(inners) == report.ranges["inner"].calls == 8
    assert len(spans) == 1 + len(ranges)
    for s in outers:
        assert s["parent_id"] == window["span_id"]
    for s in inners:
        assert by_id[s["parent_id"]]["name"] == "outer"
    for s in ranges:
        parent = by_id[s["parent_id"]]
        assert s["trace_id"] == trace_id
        assert parent["start"] <= s["start"] <= s["end"] <= parent["end"]
        # real times from the trace: each call ran inside one of the requests
        middle = (s["start"] + s["end"]) // 2
        assert sum(t0 < middle < t1 for t0, t1, _, _ in requests) == 1
        a = s["attributes"]
        assert a["profiled.kind"] == "range" and a["profiled.range.name"] == s["name"]
        assert a["profiled.cpu_time_us"] == pytest.approx((s["end"] - s["start"]) / 1000)
        assert a["profiled.kernel_launches"] == 0 and a["profiled.verdict"] == "cpu-only"
        assert a["thread.id"] > 0
    assert sum(s["attributes"]["profiled.cpu_time_us"] for s in outers) == pytest.approx(
        report.ranges["outer"].cpu_time_us, rel=1e-6
    )

    resource = window["resource"]
    assert resource["service.name"] == "wire-test"
    assert resource["deployment.environment"] == "ci"
    assert resource["process.pid"] == os.getpid() and resource["host.name"] == report.host
    assert (resource["profiled.rank"], resource["profiled.world_size"]) == (0, 1)
    assert resource["profiled.device"] == "cpu"
    assert window["scope"] == "torch-profiled"

    metrics = received.metrics()
    (cpu,) = metrics["profiled.range.cpu_time"]
    assert cpu.unit == "s"
    points = {p.attributes[0].value.string_value: p for p in cpu.histogram.data_points}
    assert points["outer"].count == 4 and points["inner"].count == 8
    assert points["inner"].sum == pytest.approx(
        sum(s["end"] - s["start"] for s in inners) / 1e9, rel=1e-6
    )
    assert "profiled.range.device_time" not in metrics  # a CPU-only window
    (count,) = metrics["profiled.windows"]
    assert sum(p.as_int for p in count.sum.data_points) == 1


def test_without_a_window_started_call_the_window_span_is_a_root(otlp_env):
    """A window in which no @profiled call begins (steps from s.step() alone) gets no parent,
    even though it is exported inside a request span."""
    received = Received()
    server = HttpReceiver(received)
    server.start()
    try:
        otlp_env(server.endpoint)
        with session(
            exporters=[OTelExporter()], schedule=Schedule(wait=0, warmup=1, active=1)
        ) as s:
            token = otel_context.attach(_request_context(0xC0FFEE, 0xBEEF))
            try:
                for _ in range(2):
                    torch.ones(8, 8) @ torch.ones(8, 8)
                    s.step()
            finally:
                otel_context.detach(token)
        assert received.wait(lambda r: r.spans())
        (window,) = [s for s in received.spans() if s["name"] == "profiled.window"]
        assert window["parent_id"] is None and window["trace_id"] != f"{0xC0FFEE:032x}"
    finally:
        server.stop()


def _sdk_exporter(**kwargs):
    """An exporter on providers of the test's own (the OpenTelemetry SDK's in-memory ones)."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return OTelExporter(tracer_provider=provider, meter_provider=meters, **kwargs), spans


def test_ops_detail_adds_operator_spans_inside_their_ranges():
    exporter, spans = _sdk_exporter(detail="ops")
    with session(exporters=[exporter], schedule=Schedule(wait=0, warmup=1, active=1)) as s:
        for _ in range(2):  # one step per call: call 0 warms up, call 1 is recorded
            outer(torch.ones(8, 8))
            s.step()
    finished = spans.get_finished_spans()
    by_id = {sp.context.span_id: sp for sp in finished}
    ops = [sp for sp in finished if sp.attributes["profiled.kind"] == "op"]
    assert {"aten::matmul", "aten::mm", "aten::add"} <= {sp.name for sp in ops}
    for sp in ops:
        parent = by_id[sp.parent.span_id]
        assert parent.attributes["profiled.kind"] in ("range", "op")
        assert parent.start_time <= sp.start_time <= sp.end_time <= parent.end_time
    mms = [sp for sp in ops if sp.name == "aten::matmul"]
    assert all(by_id[sp.parent.span_id].name == "inner" for sp in mms)


def test_span_budget_folds_the_most_frequent_ranges_and_is_never_exceeded():
    exporter, spans = _sdk_exporter(max_spans=40)
    mem = InMemoryExporter()
    with session(exporters=[exporter, mem], schedule=Schedule(wait=0, warmup=1, active=1)) as s:
        s.step()  # the warm-up step (in a session only s.step() ends steps)
        for _ in range(1):
            x = torch.ones(4, 4)
            for _ in range(30):
                outer(x)  # 30 outer + 60 inner
            for _ in range(5):
                tiny(x)
            s.step()
    (report,) = mem.reports
    finished = spans.get_finished_spans()
    assert len(finished) <= 40
    (window,) = [sp for sp in finished if sp.name == "profiled.window"]
    folded = [sp for sp in finished if sp.attributes["profiled.kind"] == "range.folded"]
    kept = [sp for sp in finished if sp.attributes["profiled.kind"] == "range"]
    wa = window.attributes
    assert list(wa["profiled.otel.folded_ranges"]) == sorted(sp.name for sp in folded)
    assert "inner" in wa["profiled.otel.folded_ranges"]  # the most frequent goes first
    assert {sp.name for sp in kept} >= {"tiny"}
    total = sum(r.calls for r in report.ranges.values())
    assert wa["profiled.window.range_occurrences"] == total == 95
    assert (
        wa["profiled.otel.folded_occurrences"] + len(kept) + wa["profiled.otel.dropped_spans"]
        == total
    )
    for sp in folded:
        assert sp.attributes["profiled.range.calls"] == report.ranges[sp.name].calls
        assert sp.attributes["profiled.cpu_time_us"] == report.ranges[sp.name].cpu_time_us
        assert sp.parent.span_id == window.context.span_id
    for sp in finished:
        if sp is not window:
            assert window.start_time <= sp.start_time <= sp.end_time <= window.end_time


def _synthetic(rng: random.Random, n: int) -> list[Occurrence]:
    """Random forests of ranges, ops and kernels, parents first, as the analysis walks them."""
    nodes: list[Occurrence] = []
    for i in range(n):
        parent = rng.randrange(-1, i) if i and rng.random() < 0.7 else -1
        kind = "range" if parent < 0 or rng.random() < 0.4 else rng.choice(["op", "kernel"])
        depth = nodes[parent].depth + 1 if parent >= 0 else 0
        nodes.append(
            Occurrence(
                kind,
                f"r{rng.randrange(12)}" if kind == "range" else "op",
                i,
                i + 1,
                parent,
                depth,
                cpu_time_us=0.001,
            )
        )
    return nodes


@pytest.mark.parametrize("seed", range(40))
def test_plan_spans_stays_in_budget_and_keeps_every_kept_span_parented(seed):
    rng = random.Random(seed)
    nodes = _synthetic(rng, rng.randrange(0, 300))
    max_spans = rng.choice([1, 2, 5, 13, 50, 400])
    plan = plan_spans(nodes, max_spans)
    assert plan.span_count <= max_spans
    ranges = sum(n.kind == "range" for n in nodes)
    kept_ranges = sum(k for k, n in zip(plan.kept, nodes) if n.kind == "range")
    kept_details = sum(plan.kept) - kept_ranges
    assert (
        kept_ranges + plan.folded_occurrences + plan.dropped - (len(nodes) - ranges - kept_details)
        == ranges
    )
    for k, n in zip(plan.kept, nodes):
        if k and n.kind != "range":
            assert plan.kept[n.parent]
    if 1 + ranges <= max_spans:
        assert not plan.folded and kept_ranges == ranges


def _fail_once(otlp_env, endpoint, protocol):
    otlp_env(endpoint, protocol, OTEL_EXPORTER_OTLP_TIMEOUT="1")
    exporter = OTelExporter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with session(
            exporters=[exporter], schedule=Schedule(wait=0, warmup=1, active=1, repeat=2)
        ) as s:
            for _ in range(4):  # one step per call: two windows of one call each
                tiny(torch.ones(2))
                s.step()
    lost = [str(w.message) for w in caught if issubclass(w.category, ExporterWarning)]
    return exporter, lost


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_closed_endpoint_costs_one_warning_saying_what_was_lost(otlp_env, protocol):
    exporter, lost = _fail_once(otlp_env, closed_endpoint(), protocol)
    spans = [m for m in lost if "spans were not delivered" in m]
    metrics = [m for m in lost if "its metrics were not delivered" in m]
    assert len(spans) == 1 and len(metrics) == 1, lost  # two windows failed, one warning each
    assert "window 0: 2 spans" in spans[0] and "127.0.0.1" in spans[0] and protocol in spans[0]
    assert exporter.lost == {"windows": 2, "spans": 4, "metric_exports": 2}


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_hanging_endpoint_is_given_up_on_at_the_timeout(otlp_env, protocol):
    server = HangingServer()
    try:
        exporter, lost = _fail_once(otlp_env, server.endpoint, protocol)
        assert server.accepted.is_set()
        # export() returned on its own while the backend still held every connection open
        assert not server.released.is_set()
        assert any("window 0: 2 spans were not delivered" in m for m in lost), lost
        assert exporter.lost["spans"] == 4
    finally:
        server.release()


class _Posts(threading.Thread):
    """A bare OTLP/HTTP endpoint on one given port of 127.0.0.1: answers 200 to every POST and
    records its path (a collector that starts where one was expected)."""

    def __init__(self, port: int) -> None:
        from http.server import BaseHTTPRequestHandler, HTTPServer

        paths = self.paths = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers["Content-Length"]))
                paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = HTTPServer(("127.0.0.1", port), Handler)
        super().__init__(target=self.httpd.serve_forever, daemon=True)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _two_reports():
    mem = InMemoryExporter()
    with session(exporters=[mem], schedule=Schedule(wait=0, warmup=1, active=1, repeat=2)) as s:
        for _ in range(4):  # one step per call: two windows of one call each
            tiny(torch.ones(2))
            s.step()
    return mem.reports


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_a_collector_that_is_not_running_costs_no_retries(otlp_env, protocol, caplog):
    """Nothing listens: each window is lost at once (one refused connect), not after the OTLP
    exporter's retries for its whole timeout per signal, which made the export lane fall
    behind and the program's exit wait for windows that could never be delivered."""
    otlp_env(closed_endpoint(), protocol, OTEL_EXPORTER_OTLP_TIMEOUT="5")
    caplog.set_level(logging.INFO)
    exporter = OTelExporter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with session(
            exporters=[exporter], schedule=Schedule(wait=0, warmup=1, active=1, repeat=3)
        ) as s:
            for _ in range(6):
                tiny(torch.ones(2))
                s.step()
    assert exporter.lost == {"windows": 3, "spans": 6, "metric_exports": 3}
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert retries == []
    lost = [str(w.message) for w in caught if issubclass(w.category, ExporterWarning)]
    assert len(lost) == 2, lost  # spans and metrics, once each
    assert all("nothing answers at 127.0.0.1:" in m and "Connection refused" in m for m in lost), (
        lost
    )


def test_a_collector_that_starts_later_gets_the_next_window(otlp_env):
    """The check is made again before each delivery while the endpoint has not answered: the
    window after the collector came up is delivered."""
    endpoint = closed_endpoint()
    otlp_env(endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="5")
    first, second = _two_reports()
    exporter = OTelExporter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert exporter.export(first) is ExportResult.FAILURE
        collector = _Posts(int(endpoint.rsplit(":", 1)[1]))
        collector.start()
        try:
            assert exporter.export(second) is ExportResult.SUCCESS
        finally:
            collector.stop()
    assert collector.paths == ["/v1/traces", "/v1/metrics"]
    assert exporter.lost == {"windows": 1, "spans": 1, "metric_exports": 1}
    assert any("nothing answers" in str(w.message) for w in caught)


def test_at_exit_a_dead_collector_holds_up_nothing(run_python, otlp_env):
    """The program's exit waits for the otel lane at most PROFILED_EXPORT_TIMEOUT_S; with
    nothing listening every window is given up at once, so none is left waiting for it (the
    OTLP exporters would retry each for OTEL_EXPORTER_OTLP_TIMEOUT=30 s per signal)."""
    code = """
import time
import torch
from exporters.otel import OTelExporter
from instrument import Schedule, configure, profiled, shutdown

@profiled("f")
def f(x):
    return x + 1

otel = OTelExporter()
configure(exporters=[otel], schedule=Schedule(wait=0, warmup=1, active=1, repeat=4))
for _ in range(8):
    f(torch.ones(2))
began = time.monotonic()
shutdown()
print("shutdown", round(time.monotonic() - began, 1), "lost", otel.lost["windows"])
"""
    otlp_env(closed_endpoint(), OTEL_EXPORTER_OTLP_TIMEOUT="30")  # the child inherits these
    out = run_python(code, env={"PROFILED_EXPORT_TIMEOUT_S": "20"})
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("shutdown")]
    _, seconds, _, lost = line.split()
    assert lost == "4" and "were dropped" not in out.stderr, out.stderr
    # a bound, the point of the item: far under the 20 s exit deadline (the windows'
    # analysis is all that is left to wait for), which the retries used to fill
    assert float(seconds) < 15, out.stdout
    assert "retrying" not in out.stderr


def test_sdk_disabled_sends_nothing_and_builds_nothing(otlp_env):
    received = Received()
    server = HttpReceiver(received)
    server.start()
    try:
        otlp_env(server.endpoint, OTEL_SDK_DISABLED="true")
        exporter = OTelExporter()
        mem = InMemoryExporter()
        with session(exporters=[exporter, mem], schedule=Schedule(wait=0, warmup=1, active=1)) as s:
            for _ in range(2):
                tiny(torch.ones(2))
                s.step()
        assert len(mem.reports) == 1 and exporter.disabled and exporter._own is None
        # delivery is synchronous in export(): had anything been sent, it would be here now
        assert received.trace_requests == [] and received.metric_requests == []
    finally:
        server.stop()


def test_missing_otlp_extra_warns_once_with_what_to_install(run_python):
    code = """
import sys, warnings
for mod in ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
            "opentelemetry.exporter.otlp.proto.http.metric_exporter"):
    sys.modules[mod] = None  # as if opentelemetry-exporter-otlp were not installed
warnings.simplefilter("always")
import torch
from instrument import profiled, step

@profiled("f")
def f(x):
    return x + 1

for _ in range(5):
    f(torch.ones(2))
print("program finished")
"""
    out = run_python(
        code,
        env={
            "PROFILED_EXPORTERS": "otel",
            "PROFILED_SCHEDULE": "wait=0,warmup=1,active=1,repeat=2",
            "OTEL_EXPORTER_OTLP_ENDPOINT": closed_endpoint(),
        },
    )
    assert out.returncode == 0, out.stderr
    assert "program finished" in out.stdout
    assert out.stderr.count("pip install 'torch-profiled[otel]'") == 1, out.stderr
    assert "OTLP export was asked for" in out.stderr


def test_registry_and_environment_settings(monkeypatch):
    (exporter,) = resolve_exporters(["otel"])
    assert isinstance(exporter, OTelExporter)
    assert (exporter.detail, exporter.max_spans) == ("ranges", 1000)
    monkeypatch.setenv("PROFILED_OTEL_DETAIL", "Kernels")
    monkeypatch.setenv("PROFILED_OTEL_MAX_SPANS", "25")
    assert otel_settings_from_env() == ("kernels", 25)
    monkeypatch.setenv("PROFILED_OTEL_DETAIL", "everything")
    monkeypatch.setenv("PROFILED_OTEL_MAX_SPANS", "0")
    with pytest.warns(ConfigWarning) as caught:
        assert otel_settings_from_env() == ("ranges", 1000)
    text = " ".join(str(w.message) for w in caught)
    assert "PROFILED_OTEL_DETAIL='everything'" in text and "ranges, ops, kernels" in text
    assert "PROFILED_OTEL_MAX_SPANS='0'" in text and "default PROFILED_OTEL_MAX_SPANS=1000" in text
    monkeypatch.setenv("PROFILED_STRICT", "1")
    with pytest.raises(ValueError, match="PROFILED_OTEL_DETAIL"):
        otel_settings_from_env()
    with pytest.raises(ValueError, match="detail must be one of"):
        OTelExporter(detail="all")
    with pytest.raises(ValueError, match="max_spans"):
        OTelExporter(detail="ops", max_spans=0)


def test_export_runs_on_any_thread_and_never_raises_into_the_caller():
    """export() from a worker thread, with the caller's context irrelevant; a report without
    occurrences (made by a session the exporter is not part of) still gets its window span
    (no range spans, one warning), and no trace is read for it."""
    import dataclasses
    import threading

    exporter, spans = _sdk_exporter()
    mem = InMemoryExporter()
    with session(exporters=[mem], schedule=Schedule(wait=0, warmup=1, active=1)) as s:
        for _ in range(2):
            tiny(torch.ones(2))
            s.step()
    assert mem.reports[0].occurrences is None  # no exporter of that session asked for them
    report = dataclasses.replace(mem.reports[0], raw_trace_path="/nonexistent/trace.json")
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = threading.Thread(target=lambda: results.append(exporter.export(report)))
        t.start()
        t.join(30)
    assert results == [ExportResult.SUCCESS]
    (window,) = spans.get_finished_spans()
    assert window.name == "profiled.window" and window.parent is None
    assert any("carries no per-call occurrences" in str(w.message) for w in caught)
    assert get_current_span().get_span_context().is_valid is False


def _spans_by_id(spans):
    return {s["span_id"]: s for s in spans}


def check_sampled_requests(spans, requests: int) -> None:
    """examples/05_inference_otel.py: one request in four is profiled; its window span is a
    child of that request's own span, with generate -> decode_step spans inside it."""
    by_id = _spans_by_id(spans)
    windows = [s for s in spans if s["name"] == "profiled.window"]
    assert len(windows) == requests // 4
    for window in windows:
        request = by_id[window["parent_id"]]
        assert request["name"] == "POST /generate"
        (step,) = window["attributes"]["profiled.window.steps"]
        assert request["attributes"]["app.request_id"] == step  # one request per step
        assert window["trace_id"] == request["trace_id"]
        assert request["start"] <= window["start"] <= window["end"] <= request["end"]
        (generate,) = [s for s in spans if s["parent_id"] == window["span_id"]]
        assert generate["name"] == "generate"
        decode = [s for s in spans if s["parent_id"] == generate["span_id"]]
        assert [s["name"] for s in decode] == ["decode_step"] * 8
        for s in decode:
            assert generate["start"] <= s["start"] <= s["end"] <= generate["end"]


def test_inference_example_puts_each_sampled_profile_under_its_request(run_python):
    received = Received()
    server = HttpReceiver(received)
    server.start()
    try:
        example = os.path.join(os.path.dirname(__file__), "..", "examples", "05_inference_otel.py")
        out = run_python(
            open(example).read(),
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": server.endpoint,
                "OTEL_SERVICE_NAME": "inference",
                "REQUESTS": "8",
            },
        )
        assert out.returncode == 0, out.stderr
        assert "request 7: 12 tokens" in out.stdout
        spans = received.spans()  # the program has exited: everything it sent is here
        assert {s["resource"]["service.name"] for s in spans} == {"inference"}
        check_sampled_requests(spans, 8)
        assert "profiled.range.cpu_time" in received.metrics()
    finally:
        server.stop()


@pytest.mark.cuda
def test_kernels_detail_and_device_time_on_a_gpu():
    """On a CUDA GPU: kernel spans under the operators that launched them, device time and
    top kernels on the range spans, the device-time histogram."""
    exporter, spans = _sdk_exporter(detail="kernels")
    reader = InMemoryMetricReader()
    exporter._meter_provider = MeterProvider(metric_readers=[reader])
    x = torch.ones(256, 256, device="cuda")
    with session(exporters=[exporter], schedule=Schedule(wait=0, warmup=1, active=1)) as s:
        for _ in range(2):
            outer(x)
            s.step()
            torch.cuda.synchronize()
    finished = spans.get_finished_spans()
    by_id = {sp.context.span_id: sp for sp in finished}
    kernels = [sp for sp in finished if sp.attributes["profiled.kind"] == "kernel"]
    assert kernels
    for sp in kernels:
        assert by_id[sp.parent.span_id].attributes["profiled.kind"] == "op"
        assert sp.attributes["profiled.device_time_us"] > 0
    inners = [sp for sp in finished if sp.name == "inner"]
    assert all(sp.attributes["profiled.device_time_us"] > 0 for sp in inners)
    assert all(sp.attributes["profiled.kernel_launches"] >= 1 for sp in inners)
    assert all(any(e.name == "profiled.kernel" for e in sp.events) for sp in inners)
    names = [
        m.name
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    ]
    assert "profiled.range.device_time" in names


def test_the_always_on_histograms_arrive_with_a_count_per_call(otlp_env, receiver):
    import instrument

    protocol, server, received = receiver
    otlp_env(server.endpoint, protocol, OTEL_SERVICE_NAME="metrics-test")
    instrument.configure(exporters=[OTelExporter()], schedule=Schedule(wait=10**6))

    @profiled("serve", step=True)
    def serve(x):
        return tiny(x)

    for _ in range(40):
        serve(torch.ones(2))
    for _ in range(7):
        tiny(torch.ones(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExporterWarning)  # delivery must not fail
        instrument.shutdown()  # the last snapshot, sent before the exporter shuts down
    assert received.wait(lambda r: "profiled.range.duration" in r.metrics())
    (duration,) = received.metrics()["profiled.range.duration"][-1:]
    assert duration.unit == "s"
    points = {
        attributes(p.attributes)["profiled.range.name"]: p for p in duration.histogram.data_points
    }
    assert {name: p.count for name, p in points.items()} == {"serve": 40, "tiny": 47}
    tiny_point = points["tiny"]
    assert sum(tiny_point.bucket_counts) == 47
    assert len(tiny_point.bucket_counts) == len(tiny_point.explicit_bounds) + 1
    assert tiny_point.explicit_bounds[0] == pytest.approx(1.024e-6)
    assert 0 < tiny_point.min <= tiny_point.sum / 47 <= tiny_point.max
    assert attributes(tiny_point.attributes)["profiled.rank"] == 0
    (steps,) = received.metrics()["profiled.step.duration"][-1:]
    assert steps.histogram.data_points[0].count == 40


def test_with_the_applications_meter_provider_the_histograms_turn_nothing_on(otlp_env):
    from opentelemetry.sdk.metrics import MeterProvider

    from instrument.runtime import metrics

    otlp_env("http://127.0.0.1:9")
    own = OTelExporter()
    theirs = OTelExporter(meter_provider=MeterProvider())
    assert own.takes_metrics and metrics.wanted(None, [own])
    # the metrics API takes no histograms already aggregated: nothing to send them through
    assert not theirs.takes_metrics and not metrics.wanted(None, [theirs])
    assert metrics.wanted(True, [theirs])  # PROFILED_METRICS=1 still records (for json)
