"""A request handler whose sampled ``@profiled("generate")`` windows land under each request's span.

The application sets up OpenTelemetry tracing as it would anyway (here from the standard
``OTEL_*`` variables, the way ``opentelemetry-instrument`` does) and opens a span per request.
torch-profiled profiles one request in every four (``PROFILED_SCHEDULE`` below) and sends
each window to the same backend, as a ``profiled.window`` span inside that request's trace,
with a span per ``generate`` and ``decode_step`` call under it.

It needs an OTLP/HTTP collector to send to: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default
``http://localhost:4318``; ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` for the spans alone). Any
OTLP receiver will do, for example an OpenTelemetry Collector
(``docker run --rm -p 4318:4318 otel/opentelemetry-collector``, which prints what it receives)
or Jaeger (``docker run --rm -p 4318:4318 -p 16686:16686 jaegertracing/jaeger``, then open
http://localhost:16686; it takes no metrics, so add ``OTEL_METRICS_EXPORTER=none``):

    OTEL_SERVICE_NAME=inference OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 \\
        python examples/05_inference_otel.py

Without a collector (nothing answers at the endpoint; checked once at the start, one TCP
connect of at most a second) it says so in one line, keeps the spans and metrics in memory
instead and prints where each profiled window landed, rather than retrying a dead address.

Needs the ``otel`` extra (``pip install -c constraints.txt -e '.[otel]'``).
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.parse

import torch
from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from instrument import Schedule, configure, profiled, shutdown

REQUESTS = int(os.environ.get("REQUESTS", "12"))


def collector_endpoint() -> str:
    """Where the OTLP/HTTP span exporter sends (the variables it reads, its default)."""
    return (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "http://localhost:4318"
    )


def answers(endpoint: str, timeout_s: float = 1.0) -> str | None:
    """None when something accepts a TCP connection at ``endpoint``, else why not."""
    try:
        url = urllib.parse.urlsplit(endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
        socket.create_connection((url.hostname or "localhost", port), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        return getattr(exc, "strerror", None) or str(exc) or "timed out"
    return None


# The application's own tracing: its request spans and ours go to the same place.
provider = TracerProvider(resource=Resource.create())
endpoint = collector_endpoint()
why = answers(endpoint)
memory = None
if why is None:
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
else:  # no collector: keep everything here rather than retrying a dead address at exit
    print(
        f"no OTLP collector answers at {endpoint} ({why}): spans and metrics are kept in "
        "memory; start one or set OTEL_EXPORTER_OTLP_ENDPOINT (see this file's header)"
    )
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("inference-server")

# Profile one request in four: 2 skipped, 1 warm-up, 1 recorded, again and again.
configure(exporters=["otel"], schedule=Schedule(wait=2, warmup=1, active=1, repeat=0))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(256, 64), torch.nn.Linear(64, 256))


@profiled("decode_step")
def decode_step(tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, -1:])[:, -1]
    return torch.argmax(logits, dim=-1, keepdim=True)


@profiled("generate")
def generate(prompt: torch.Tensor, new_tokens: int = 8) -> torch.Tensor:
    tokens = prompt
    with torch.no_grad():
        for _ in range(new_tokens):
            tokens = torch.cat([tokens, decode_step(tokens)], dim=1)
    return tokens


def handle(request_id: int) -> list[int]:
    """One request: the server's span, and the model call inside it (one step each)."""
    with tracer.start_as_current_span("POST /generate") as span:
        span.set_attribute("app.request_id", request_id)
        prompt = torch.randint(0, 256, (1, 4))
        return generate(prompt)[0].tolist()


def where_windows_landed(spans) -> None:
    """Without a collector: each profiled window, the request it is under, what is inside."""
    by_id = {s.context.span_id: s for s in spans}
    windows = [s for s in spans if s.name == "profiled.window"]
    print(f"kept in memory: {len(spans)} spans, {len(windows)} profiled windows")
    for window in windows:
        request = by_id.get(window.parent.span_id) if window.parent else None
        inside = [s.name for s in spans if s.parent and s.parent.span_id == window.context.span_id]
        calls = sum(
            s.name == "decode_step" for s in spans if s.context.trace_id == window.context.trace_id
        )
        under = (
            f"request {request.attributes['app.request_id']}"
            if request is not None
            else "no request"
        )
        print(
            f"  profiled.window under {under}: {', '.join(inside)} with {calls} decode_step spans"
        )


def main() -> int:
    for i in range(REQUESTS):
        tokens = handle(i)
        print(f"request {i}: {len(tokens)} tokens")
    shutdown()  # export the open window before the application's tracer flushes
    provider.shutdown()
    if memory is not None:
        where_windows_landed(memory.get_finished_spans())
    return 0


if __name__ == "__main__":
    sys.exit(main())
