"""A request handler whose sampled ``@profiled("generate")`` windows land under each request's span.

The application sets up OpenTelemetry tracing as it would anyway (here from the standard
``OTEL_*`` variables, the way ``opentelemetry-instrument`` does) and opens a span per request.
torch-profiled profiles one request in every four (``PROFILED_SCHEDULE`` below) and sends
each window to the same backend, as a ``profiled.window`` span inside that request's trace,
with a span per ``generate`` and ``decode_step`` call under it.

    OTEL_SERVICE_NAME=inference OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 \\
        python examples/05_inference_otel.py

Needs the ``otel`` extra (``pip install -c constraints.txt -e '.[otel]'``).
"""

from __future__ import annotations

import os
import sys

import torch
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from instrument import configure, profiled, shutdown
from instrument.sampling import Schedule

REQUESTS = int(os.environ.get("REQUESTS", "12"))

# The application's own tracing: its request spans and ours go to the same place.
provider = TracerProvider(resource=Resource.create())
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
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


def main() -> int:
    for i in range(REQUESTS):
        tokens = handle(i)
        print(f"request {i}: {len(tokens)} tokens")
    shutdown()  # export the open window before the application's tracer flushes
    provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
