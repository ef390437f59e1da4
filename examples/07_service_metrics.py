"""A small inference service, always observed: every request counted, the slow one profiled.

Between profiler windows torch-profiled still counts: with metrics on, each ``@profiled``
call's wall time goes into a per-range histogram, served to Prometheus on ``/metrics``,
appended to a JSON-lines file and (when an OTLP collector is configured) sent as OpenTelemetry
histograms. No window opens on a schedule here (``sample_rate=0``); one opens when a request is
more than ``slow_step`` times slower than the median of the recent ones (``PROFILED_SLOW_STEP``),
and its report says so.

    python examples/07_service_metrics.py
    curl -s http://127.0.0.1:9464/metrics | grep generate     # while it serves (a few seconds)

``PROFILED_PROMETHEUS_ADDR`` moves the endpoint (``127.0.0.1:0``: any free port, printed);
``OTEL_EXPORTER_OTLP_ENDPOINT`` set adds the ``otel`` exporter (``profiled.range.duration`` and
``profiled.step.duration`` histograms; needs the ``otel`` extra). Runs on the CPU, or on a GPU
when torch sees one.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request

import torch

import instrument
from exporters import ConsoleExporter, JsonLinesExporter
from exporters.prometheus import PrometheusExporter
from instrument import profiled

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REQUESTS = 300
SLOW_REQUEST = 200  # this one waits on a cold cache (a sleep): the window opens after it
JSON_PATH = os.environ.get("PROFILED_JSON_PATH", "./service_metrics.jsonl")

model = torch.nn.Sequential(
    torch.nn.Linear(256, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 256)
).to(DEVICE)


@profiled("tokenize")
def tokenize(i: int) -> torch.Tensor:
    return torch.full((32, 256), float(i % 7), device=DEVICE)


@profiled("generate")
def generate(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        for _ in range(4):
            x = model(x)
    return x


@profiled("request", step=True)  # each request is a step: the unit slow steps are judged in
def handle(i: int) -> float:
    if i == SLOW_REQUEST:
        time.sleep(2.0)
    out = generate(tokenize(i))
    return float(out.sum().item())


def main() -> None:
    prometheus = PrometheusExporter(os.environ.get("PROFILED_PROMETHEUS_ADDR", "127.0.0.1:9464"))
    exporters = [ConsoleExporter(), JsonLinesExporter(JSON_PATH), prometheus]
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        exporters.append("otel")
    instrument.configure(
        exporters=exporters,
        sample_rate=0.0,  # no window on a schedule: only slow requests open one
        # 100x the median, for a demo that must also run on a busy shared CPU, where being
        # descheduled alone makes a request of a few milliseconds 20x slower; a service on
        # its own machine takes a factor of 3 to 5
        slow_step=100.0,
        min_interval_s=10.0,  # at most one window per 10 s, as a service would
        metrics_interval_s=0.5,
    )
    if prometheus.port is not None:
        print(f"metrics on http://127.0.0.1:{prometheus.port}/metrics")
    for i in range(REQUESTS):
        handle(i)
    time.sleep(0.6)  # one more interval: /metrics holds every request
    if prometheus.port is not None:
        url = f"http://127.0.0.1:{prometheus.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as page:  # noqa: S310 - our own endpoint
            for line in page.read().decode().splitlines():
                if line.startswith('profiled_range_duration_seconds_count{range="generate"'):
                    print("scraped:", line)
    instrument.shutdown()  # the last metrics record, and the window's report
    with open(JSON_PATH, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    for r in records:
        if r["schema"] == "torch-profiled/window-report/1" and r.get("reason"):
            print(f"window {r['window']}: {r['reason']['detail']}")
    last = [r for r in records if r["schema"] == "torch-profiled/metrics/1"][-1]
    for name, h in sorted(last["ranges"].items()):
        print(
            f"{name:>9}: {h['count']} calls, p50 {h['p50_s'] * 1e3:.3f} ms, "
            f"p99 {h['p99_s'] * 1e3:.3f} ms, max {h['max_s'] * 1e3:.3f} ms"
        )


if __name__ == "__main__":
    main()
