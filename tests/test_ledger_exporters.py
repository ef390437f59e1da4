"""Each exporter shows a window's ledger (``WindowReport.cost``): the console header's one line,
JSON lines' ``cost`` object, the OTel window span's ``profiled.cost.*`` attributes and the HTML
page's line; all from one real session's windows, whose profiler stop is slowed by a known
amount so that the figures exporters show can be told apart from zeros."""

from __future__ import annotations

import io
import json
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from exporters import InMemoryExporter
from exporters.console import ConsoleExporter
from exporters.html import HtmlExporter
from exporters.json_lines import JsonLinesExporter
from exporters.otel import OTelExporter
from instrument import Schedule, profiled, session
from instrument.runtime import _torch

STOP_S = 0.15


@pytest.fixture
def slow_stop(monkeypatch):
    stop = _torch.ProfilerWindow.stop

    def slowed(self, *args, **kwargs):
        time.sleep(STOP_S)
        return stop(self, *args, **kwargs)

    monkeypatch.setattr(_torch.ProfilerWindow, "stop", slowed)


@profiled("ledger_step")
def _step(x: int) -> int:
    return x + 1


def test_every_exporter_shows_the_windows_cost(slow_stop, tmp_path) -> None:
    console = io.StringIO()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    memory = InMemoryExporter()
    exporters = [
        memory,
        ConsoleExporter(stream=console),
        JsonLinesExporter(tmp_path / "reports.jsonl"),
        OTelExporter(
            tracer_provider=provider,
            meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
        ),
        HtmlExporter(tmp_path / "pages"),
    ]
    with session(
        exporters=exporters,
        schedule=Schedule(wait=1, warmup=1, active=2, repeat=2),
        overhead_budget=3.0,
    ) as s:
        for i in range(8):
            _step(i)
            s.step()
    assert len(memory.reports) == 2, memory.reports
    costs = [r.cost for r in memory.reports]
    for cost in costs:
        assert cost is not None and cost.stop_stall_us >= STOP_S * 1e6, cost
        assert cost.budget_pct == 3.0 and cost.total_us >= cost.stop_stall_us

    # console: one line in the header, before the table, with the stop's stall in ms
    text = console.getvalue()
    lines = [line for line in text.splitlines() if line.startswith("cost ")]
    assert len(lines) == 2, text
    for line, cost in zip(lines, costs):
        assert len(line) <= 100, line
        assert f"stop {cost.stop_stall_us / 1e3:.1f}," in line and "budget 3%" in line, line
    assert text.index(lines[0]) < text.index("@profiled range")

    # JSON lines: the ledger's fields and what follows from them
    records = [json.loads(x) for x in (tmp_path / "reports.jsonl").read_text().splitlines()]
    windows = [r for r in records if "cost" in r]
    assert [w["cost"]["stop_stall_us"] for w in windows] == [c.stop_stall_us for c in costs]
    for w, cost in zip(windows, costs):
        assert w["cost"]["total_us"] == pytest.approx(cost.total_us)
        assert w["cost"]["steps_excess_us"] is None  # no step histogram in this session

    # OTel: the window span carries profiled.cost.*, unknown values left out
    window_spans = [x for x in spans.get_finished_spans() if x.name == "profiled.window"]
    assert len(window_spans) == 2
    for span, cost in zip(window_spans, costs):
        attrs = span.attributes
        assert attrs["profiled.cost.stop_stall_us"] == cost.stop_stall_us
        assert attrs["profiled.cost.total_us"] == pytest.approx(cost.total_us)
        assert attrs["profiled.cost.budget_pct"] == 3.0
        assert "profiled.cost.baseline_step_us" not in attrs  # None: no OTel value

    # HTML: the same line on each window's page
    pages = sorted((tmp_path / "pages").glob("*.html"))
    assert len(pages) == 2, pages
    shown = "".join(p.read_text() for p in pages)
    for cost in costs:
        assert f"stop {cost.stop_stall_us / 1e3:.1f}," in shown
    assert shown.count('<p class="cost">') == 2
