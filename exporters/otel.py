"""``OTelExporter`` (name ``otel``): each window as OpenTelemetry spans and metrics.

Spans. Per window one span ``profiled.window``; under it one span per recorded occurrence of
each ``@profiled`` range (span name: the range name), with its real start and end (the trace's
``baseTimeNanoseconds`` + ``ts``), nested as the ranges nested on their thread. The session's
analysis makes those occurrences (``report.occurrences``, asked for with this exporter's
``occurrence_budget``), off the program's GIL: this exporter reads no trace.
``PROFILED_OTEL_DETAIL=ops|kernels`` adds operator and device-work spans. The top kernels of
an occurrence are span events. Every attribute is under ``profiled.`` (plus the semantic
convention ``thread.id``); ``ATTRIBUTES`` lists them.

Budget. At most ``PROFILED_OTEL_MAX_SPANS`` spans per window, never more: detail spans go
first, then the occurrences of the most frequent ranges are folded into one aggregate span per
name (``profiled.range.folded``, with counts); the window span counts what was folded and
dropped. The analysis fits the occurrences to the widest budget of the session's exporters
(``instrument.base.spans``); an exporter with a smaller one fits them again.

Parent. ``window_started`` (called by the session on the thread, and in the context, of the
first ``@profiled`` call of a window) keeps the OpenTelemetry context current then; the window
span is its child, so a sampled request's profile lands inside the request's own trace.
Without it the window span is a root span (never a child of whatever the exporting thread
happens to run).

Metrics. Histograms ``profiled.range.cpu_time`` and ``profiled.range.device_time`` (seconds,
one value per call, attribute ``profiled.range.name``) and a counter ``profiled.windows``.

Providers. The application's global tracer/meter providers when it set them (their own
processors deliver). Otherwise this exporter builds its own from the standard variables
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_EXPORTER``,
``OTEL_METRICS_EXPORTER``, ``OTEL_EXPORTER_OTLP_*``), never installs them globally, and
delivers each window synchronously inside ``export()``, bounded by the OTLP timeout
(``OTEL_EXPORTER_OTLP_TIMEOUT``, else ``DEFAULT_TIMEOUT_S`` per signal). A backend that is
down, slow or refusing costs one warning saying what was lost (repeated only after a
delivery to it succeeded again); nothing raises into the program. ``OTEL_SDK_DISABLED=true``
makes the exporter do nothing. OTLP needs the ``otel`` extra (``opentelemetry-exporter-otlp``);
without it one warning says what to install.

Dead collector. The OTLP exporters retry a refused connection until their timeout, so a
collector that is not running would cost every window the whole timeout per signal, the
export lane would fall behind, and the program's exit would wait ``PROFILED_EXPORT_TIMEOUT_S``
for windows that can never be delivered. So before sending to an OTLP endpoint that has not
answered yet (first delivery, or the last one there failed) this exporter opens one TCP
connection to it (``PROBE_TIMEOUT_S``): when nothing answers, the window is lost at once,
without retries, and the next window checks again. A collector that accepts but hangs still
costs the OTLP timeout. No check is made where a proxy is configured (the collector may be
reachable only through it) nor for a unix socket.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.sdk.trace import SpanProcessor

from instrument.base.warn import warn

from ._base import Exporter, ExporterWarning, ExportResult
from .otel_metrics import metrics_data

if TYPE_CHECKING:
    from instrument.base.report import (
        MetricsReport,
        Occurrence,
        OccurrenceBudget,
        Occurrences,
        WindowReport,
    )

# SpanPlan and plan_spans still import from here (see __getattr__), but live in
# instrument.base.spans
__all__ = ["ATTRIBUTES", "DEFAULT_TIMEOUT_S", "PROBE_TIMEOUT_S", "OTelExporter"]

DEFAULT_TIMEOUT_S = 4.0  # per signal: traces + metrics stay under the export deadline (10 s)
PROBE_TIMEOUT_S = 1.0  # the TCP connect to an OTLP endpoint that has not answered yet
TOP_KERNEL_EVENTS = 5  # span events per range occurrence (its heaviest kernels)
_MAX_PENDING_PARENTS = 64  # contexts kept for windows not exported yet
_SCOPE = "torch-profiled"
# Histogram buckets for per-call times: 1 µs .. 100 s, three per decade (seconds).
_BUCKETS = tuple(m * 10.0**e for e in range(-6, 2) for m in (1.0, 2.5, 5.0)) + (100.0,)

ATTRIBUTES: dict[str, str] = {
    "profiled.kind": "window, range, range.folded, op, kernel, memcpy or memset",
    "profiled.window.index": "the window's index in its session (report.window)",
    "profiled.window.steps": "the recorded steps (int array)",
    "profiled.window.partial": "the window ended early (shutdown, session exit)",
    "profiled.window.range_occurrences": "range occurrences recorded in the window",
    "profiled.window.reason": "why the window opened: schedule, every, sample, trigger, slow_step",
    "profiled.window.reason_detail": "the same in a sentence (slow_step: the step's time, median)",
    "profiled.health": "complete, partial or device-missing: whether the window lost events",
    "profiled.health.reasons": "why it is not complete: one sentence with numbers each (array)",
    "profiled.health.reason_kinds": "the same as stable keys (launch-without-device, ...)",
    "profiled.health.lost": "launches, steps or records the reasons concern, summed",
    "profiled.rank": "torch.distributed rank (0 without it)",
    "profiled.world_size": "torch.distributed world size (1 without it)",
    "profiled.device": "'cpu' or the accelerator's name",
    "profiled.activities": "profiled activities (string array)",
    "profiled.range.name": "the @profiled range name",
    "profiled.range.folded": "an aggregate of folded occurrences (true) or absent",
    "profiled.range.calls": "occurrences an aggregate span stands for",
    "profiled.cpu_time_us": "CPU time in µs: an occurrence's duration; the window's self CPU total",
    "profiled.device_time_us": "device time in µs of the kernels/memcpys/memsets launched inside",
    "profiled.device_busy_us": "union of those intervals in µs (no idle gaps)",
    "profiled.kernel_launches": "device work launched inside",
    "profiled.flops": "estimated FLOPs (with_flops)",
    "profiled.flops_per_s": "achieved FLOP/s over the device time (with_flops)",
    "profiled.flops_dtype": "the dtype most of those FLOPs ran in (bf16, fp32, ...)",
    "profiled.mfu": "achieved FLOP/s over the device's dense peak for that dtype (0..1)",
    "profiled.peak_tflops": "that peak, TFLOP/s (the built-in table or PROFILED_PEAK_TFLOPS)",
    "profiled.verdict": "cpu-only, overhead-bound or compute-bound (+ compute/memory-heavy)",
    "profiled.verdict_reason": "the numbers behind the verdict",
    "profiled.profiler_overhead_us": "the profiler's own bookkeeping in the window, µs",
    "profiled.event_count": "events in the window's trace",
    "profiled.trace_file": "the trace file a trace exporter wrote for the window",
    "profiled.cost.*": "the window's ledger (WindowReport.cost): total_us, steps_excess_us, "
    "start_stall_us, stop_stall_us, export_cpu_s, analysis_cpu_s, helper_cpu_s, bytes_written, "
    "share_pct, budget_pct, backed_off, ...",
    "profiled.otel.detail": "PROFILED_OTEL_DETAIL in force",
    "profiled.otel.max_spans": "PROFILED_OTEL_MAX_SPANS in force",
    "profiled.otel.folded_occurrences": "range occurrences folded into aggregate spans",
    "profiled.otel.folded_ranges": "names of the folded ranges (string array)",
    "profiled.otel.dropped_spans": "detail spans and ranges left out to stay in the budget",
    "profiled.kernel.name": "span event profiled.kernel: the kernel's name",
    "profiled.kernel.kind": "span event profiled.kernel: kernel, memcpy or memset",
    "profiled.kernel.calls": "span event profiled.kernel: launches inside the occurrence",
}


# ---------------------------------------------------------------- the span budget


def __getattr__(name: str) -> Any:
    """``SpanPlan`` and ``plan_spans`` live in ``instrument.base.spans`` (the analysis fits each
    window there, in the helper process); imported on first use, so that importing this
    module imports nothing of ``instrument``."""
    if name in ("SpanPlan", "plan_spans"):
        from instrument.base import spans

        return getattr(spans, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- providers from the environment


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value.strip() if value and value.strip() else None


def sdk_disabled() -> bool:
    """``OTEL_SDK_DISABLED=true`` (the OpenTelemetry spelling: only ``true`` disables)."""
    return (_env("OTEL_SDK_DISABLED") or "").lower() == "true"


class _Collect(SpanProcessor):
    """Span processor of this exporter's own tracer provider: keeps ended spans until
    ``export()`` delivers them itself, so it knows what was delivered and what was lost."""

    def __init__(self) -> None:
        self._spans: list[Any] = []

    def on_end(self, span: Any) -> None:
        self._spans.append(span)

    def take(self) -> list[Any]:
        spans, self._spans = self._spans, []
        return spans

    def shutdown(self) -> None:
        self._spans = []


@dataclass
class _Sink:
    """One configured destination: an SDK span or metric exporter and where it sends."""

    exporter: Any
    label: str  # "OTLP http/protobuf to http://127.0.0.1:4318/v1/traces", "console"
    signal: str  # "traces" or "metrics"
    reader: Any = None  # metrics: the InMemoryMetricReader collected before each delivery
    address: tuple[str, int] | None = None  # OTLP: (host, port) to check when not answering


class _OwnPipeline:
    """The tracer/meter providers this exporter builds when the application set none.

    Never installed as the global providers: the application's own spans are none of ours.
    """

    def __init__(self, resource: Any, span_sinks: list[_Sink], metric_sinks: list[_Sink]):
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider

        self.resource = resource
        self.span_sinks = span_sinks
        self.metric_sinks = metric_sinks
        self.collector = _Collect()
        self.tracer_provider = None
        self.meter_provider = None
        if span_sinks:
            self.tracer_provider = TracerProvider(resource=resource)
            self.tracer_provider.add_span_processor(self.collector)
        if metric_sinks:
            for sink in metric_sinks:
                sink.reader = InMemoryMetricReader(
                    preferred_temporality=sink.exporter._preferred_temporality,
                    preferred_aggregation=sink.exporter._preferred_aggregation,
                )
            self.meter_provider = MeterProvider(
                resource=resource, metric_readers=[s.reader for s in metric_sinks]
            )

    def shutdown(self, timeout_s: float) -> None:
        for sink in self.span_sinks + self.metric_sinks:
            try:
                sink.exporter.shutdown(timeout_millis=timeout_s * 1000)
            except TypeError:  # the HTTP span exporter takes no timeout
                sink.exporter.shutdown()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown(timeout_millis=timeout_s * 1000)


_SIGNALS = {"traces": "OTEL_TRACES_EXPORTER", "metrics": "OTEL_METRICS_EXPORTER"}
_PROTOCOLS = ("http/protobuf", "grpc")


def _protocol(signal: str, warn) -> str:
    var = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
    raw = _env(var) or _env("OTEL_EXPORTER_OTLP_PROTOCOL")
    if raw is None:
        return "http/protobuf"  # the specification's default
    if raw.lower() in _PROTOCOLS:
        return raw.lower()
    warn(
        f"protocol:{raw}",
        f"OTLP protocol {raw!r} is not supported here (expected "
        f"{' or '.join(_PROTOCOLS)}); the otel exporter uses http/protobuf",
    )
    return "http/protobuf"


def _otlp_sink(signal: str, warn) -> _Sink | None:
    protocol = _protocol(signal, warn)
    kind = "grpc" if protocol == "grpc" else "http"
    module = (
        f"opentelemetry.exporter.otlp.proto.{kind}."
        f"{'trace' if signal == 'traces' else 'metric'}_exporter"
    )
    cls_name = "OTLPSpanExporter" if signal == "traces" else "OTLPMetricExporter"
    try:
        import importlib

        cls = getattr(importlib.import_module(module), cls_name)
    except ImportError as exc:
        warn(
            "missing-otlp",
            f"OTLP export was asked for ({_SIGNALS[signal]}="
            f"{_env(_SIGNALS[signal]) or 'otlp'}, protocol {protocol}) but the OTLP exporter "
            f"is not installed ({exc.name or module} cannot be imported); install it with "
            f"pip install 'torch-profiled[otel]' (or opentelemetry-exporter-otlp). Until then "
            f"no window spans or metrics are sent over OTLP",
        )
        return None
    timeout_set = _env(f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT") or _env(
        "OTEL_EXPORTER_OTLP_TIMEOUT"
    )
    exporter = cls() if timeout_set else cls(timeout=DEFAULT_TIMEOUT_S)
    where = getattr(exporter, "_endpoint", None) or "the default endpoint"
    return _Sink(
        exporter,
        f"OTLP {protocol} to {where}",
        signal,
        address=_address(getattr(exporter, "_endpoint", None)),
    )


def _address(endpoint: str | None) -> tuple[str, int] | None:
    """(host, port) that an OTLP ``endpoint`` connects to, or None where a direct TCP connect
    says nothing about it: a unix socket, a proxy in between, a value that does not parse.
    HTTP endpoints are URLs; gRPC ones are ``host:port`` (the exporter strips the scheme)."""
    if not endpoint:
        return None
    try:
        parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else "//" + endpoint)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    port = port or {"http": 80, "https": 443}.get(parts.scheme)
    if not host or port is None or parts.scheme not in ("", "http", "https"):
        return None
    return None if _proxied(host) else (host, port)


def _proxied(host: str) -> bool:
    """A proxy is configured for ``host`` (``requests`` and gRPC honour the variables)."""
    try:
        proxies = urllib.request.getproxies()
        if not proxies and not (_env("grpc_proxy") or _env("GRPC_PROXY")):
            return False
        # not in typeshed's stubs, in urllib.request since Python 3.0
        bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
        return not bypass(host)
    except Exception:  # noqa: BLE001 - in doubt, no check: the exporter's own retries apply
        return True


def _unanswered(address: tuple[str, int]) -> str | None:
    """Why nothing answers at ``address`` (one TCP connect, ``PROBE_TIMEOUT_S``), or None."""
    try:
        socket.create_connection(address, timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        why = exc.strerror or str(exc) or "timed out"
        return (
            f"nothing answers at {address[0]}:{address[1]} ({why}), so they were not "
            "sent and not retried; the next window checks again"
        )
    return None


def _sinks(signal: str, warn) -> list[_Sink]:
    """The destinations ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` name
    (``otlp`` by default; ``console``; ``none``)."""
    var = _SIGNALS[signal]
    names = [n.strip().lower() for n in (_env(var) or "otlp").split(",") if n.strip()]
    out: list[_Sink] = []
    for name in names:
        if name == "none":
            continue
        if name == "otlp":
            sink = _otlp_sink(signal, warn)
            if sink is not None:
                out.append(sink)
        elif name == "console":
            console: Any
            if signal == "traces":
                from opentelemetry.sdk.trace.export import ConsoleSpanExporter

                console = ConsoleSpanExporter()
            else:
                from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

                console = ConsoleMetricExporter()
            out.append(_Sink(console, "the console (standard output)", signal))
        else:
            warn(
                f"{var}:{name}",
                f"{var}={_env(var)!r}: {name!r} is not supported by the "
                f"otel exporter (expected otlp, console or none); it is ignored",
            )
    return out


def _resource(report: WindowReport | MetricsReport) -> Any:
    """``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (read by ``Resource.create``),
    plus who recorded the window."""
    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, Any] = {
        "host.name": report.host or socket.gethostname(),
        "process.pid": report.pid,
        "profiled.rank": report.rank,
        "profiled.world_size": report.world_size,
    }
    device = getattr(report, "device", None)  # a MetricsReport has none
    if device is not None:
        attributes["profiled.device"] = device
    return Resource.create(attributes)


def _global_tracer_provider() -> Any:
    provider = trace.get_tracer_provider()
    return None if isinstance(provider, trace.ProxyTracerProvider) else provider


def _global_meter_provider() -> Any:
    provider = metrics.get_meter_provider()
    return None if type(provider).__name__ == "_ProxyMeterProvider" else provider


# ---------------------------------------------------------------- the exporter


class OTelExporter(Exporter):
    """Window reports as OpenTelemetry spans and metrics (see the module docstring).

    ``tracer_provider``/``meter_provider`` given here win over the global ones and over the
    environment; ``detail`` and ``max_spans`` default to ``PROFILED_OTEL_DETAIL`` and
    ``PROFILED_OTEL_MAX_SPANS``. ``lost`` counts what could not be delivered.
    """

    occurrence_budget: OccurrenceBudget  # always set: this exporter sends per-call spans

    def __init__(
        self,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        detail: str | None = None,
        max_spans: int | None = None,
    ) -> None:
        from .otel_settings import OTEL_DETAILS, otel_settings_from_env

        if detail is not None and detail not in OTEL_DETAILS:
            raise ValueError(f"detail must be one of {', '.join(OTEL_DETAILS)}, got {detail!r}")
        if max_spans is not None and (
            isinstance(max_spans, bool) or not isinstance(max_spans, int) or max_spans < 1
        ):
            raise ValueError(f"max_spans must be an int >= 1, got {max_spans!r}")
        if detail is None or max_spans is None:
            env_detail, env_max = otel_settings_from_env()
            detail, max_spans = detail or env_detail, max_spans or env_max
        self.detail: str = detail
        self.max_spans: int = max_spans
        # what the session's analysis makes for each window: the spans this exporter sends
        self.occurrence_budget = _budget(max_spans, detail)
        self.disabled = sdk_disabled()
        self._delivery = _Delivery()
        self.lost = self._delivery.lost
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._own: _OwnPipeline | None = None
        self._metrics = _Metrics()
        self._parents: dict[int, Any] = {}
        self._parents_lock = threading.Lock()
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    # ------------------------------------------------------------ hooks

    def window_started(self, window: int) -> None:
        """Keep the OpenTelemetry context current now: the window span's parent."""
        if self.disabled:
            return
        ctx = otel_context.get_current()
        with self._parents_lock:
            self._parents[window] = ctx
            while len(self._parents) > _MAX_PENDING_PARENTS:
                del self._parents[next(iter(self._parents))]

    def export(self, report: WindowReport) -> ExportResult:
        if self.disabled:
            return ExportResult.SUCCESS
        with self._parents_lock:
            parent = self._parents.pop(report.window, None)
        occurrences = self._occurrences(report)
        if not self._lock.acquire(timeout=4 * DEFAULT_TIMEOUT_S):
            self._warn(
                "busy",
                f"window {report.window} was not exported: the previous "
                "window's export is still waiting on its backend; it is lost",
            )
            self.lost["windows"] += 1
            return ExportResult.FAILURE
        try:
            ok = self._export_locked(report, occurrences, parent)
        finally:
            self._lock.release()
        return ExportResult.SUCCESS if ok else ExportResult.FAILURE

    @property
    def takes_metrics(self) -> bool:  # type: ignore[override]  # computed here
        """The always-on histograms go only through this exporter's own metric exporters: not
        when disabled, nor with a meter provider of the application's (the metrics API cannot
        take histograms already aggregated), so they turn no metrics on then."""
        return not self.disabled and self._meter_source() is None

    def export_metrics(self, report: MetricsReport) -> None:
        """The always-on histograms (``exporters.otel_metrics``), through this exporter's own
        metric exporters (see ``takes_metrics``)."""
        if not self.takes_metrics:
            return
        if not self._lock.acquire(timeout=4 * DEFAULT_TIMEOUT_S):
            self.lost["metric_exports"] += 1
            return
        try:
            own = self._pipeline(report)
            data = metrics_data(report, own.resource, _SCOPE, _version())
            for sink in own.metric_sinks:
                self._delivery.deliver(
                    sink,
                    None,
                    "the always-on histograms",
                    lambda s=sink: s.exporter.export(data, timeout_millis=DEFAULT_TIMEOUT_S * 1000),
                    0,
                )
        finally:
            self._lock.release()

    def shutdown(self) -> None:
        if not self._lock.acquire(timeout=4 * DEFAULT_TIMEOUT_S):
            return  # an export is stuck on its backend: its own timeout will end it
        try:
            own, self._own = self._own, None
            if own is not None:
                own.shutdown(DEFAULT_TIMEOUT_S)
        finally:
            self._lock.release()

    # ------------------------------------------------------------ internals

    def _occurrences(self, report: WindowReport) -> Occurrences | None:
        """The report's occurrences, fitted to this exporter's budget where they were made
        for a wider one (another exporter's in the same session)."""
        occurrences = report.occurrences
        if occurrences is None:
            self._warn(
                "no occurrences",
                f"window {report.window}'s report carries no per-call "
                "occurrences (it was not made by a session this exporter belongs to, or "
                "its analysis made none): only the window span is sent, without range "
                "spans or per-call metrics",
            )
            return None
        if occurrences.budget == self.occurrence_budget:
            return occurrences
        from instrument.base.spans import fit

        return fit(occurrences, self.occurrence_budget)

    def _pipeline(self, report: WindowReport | MetricsReport) -> _OwnPipeline:
        if self._own is None:
            self._own = _OwnPipeline(
                _resource(report),
                _sinks("traces", self._warn) if self._tracer_source() is None else [],
                _sinks("metrics", self._warn) if self._meter_source() is None else [],
            )
        return self._own

    def _tracer_source(self) -> Any:
        return self._tracer_provider or _global_tracer_provider()

    def _meter_source(self) -> Any:
        return self._meter_provider or _global_meter_provider()

    def _export_locked(
        self, report: WindowReport, occurrences: Occurrences | None, parent: Any
    ) -> bool:
        tracer_provider = self._tracer_source()
        meter_provider = self._meter_source()
        own = None
        if tracer_provider is None or meter_provider is None:
            own = self._pipeline(report)
            tracer_provider = tracer_provider or own.tracer_provider
            meter_provider = meter_provider or own.meter_provider
        ok = True
        deliver = self._delivery.deliver
        if tracer_provider is not None:
            tracer = tracer_provider.get_tracer(_SCOPE, _version())
            count = _emit_spans(tracer, report, occurrences, parent, self.occurrence_budget)
            if own is not None and tracer_provider is own.tracer_provider:
                spans = own.collector.take()
                for sink in own.span_sinks:
                    ok &= deliver(
                        sink,
                        report,
                        f"{count} spans",
                        lambda s=sink: s.exporter.export(spans),
                        len(spans),
                    )
        if meter_provider is not None:
            self._metrics.record(meter_provider, report, occurrences)
            if own is not None and meter_provider is own.meter_provider:
                for sink in own.metric_sinks:
                    data = sink.reader.get_metrics_data()
                    if data is None:
                        continue
                    ok &= deliver(
                        sink,
                        report,
                        "its metrics",
                        lambda s=sink, d=data: s.exporter.export(
                            d, timeout_millis=DEFAULT_TIMEOUT_S * 1000
                        ),
                        0,
                    )
        return ok

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn("otel exporter: " + message, ExporterWarning)


# ---------------------------------------------------------------- delivery to its own sinks


class _Delivery:
    """Sends a window's spans or metrics to one of the exporter's own sinks: counts what was
    lost (``lost``), warns once per failing destination until a delivery there succeeds, and
    checks an OTLP endpoint that has not answered yet before sending (``_send``)."""

    def __init__(self) -> None:
        self.lost = {"windows": 0, "spans": 0, "metric_exports": 0}
        self._failing: set[str] = set()  # destinations whose last delivery failed
        self._answering: set[tuple[str, int]] = set()  # OTLP addresses: last delivery succeeded

    def deliver(
        self, sink: _Sink, report: WindowReport | None, what: str, send, spans: int
    ) -> bool:
        began = time.monotonic()
        good, why = self._send(sink, send)
        key = f"{sink.signal} via {sink.label}"
        if sink.address is not None and good:
            self._answering.add(sink.address)
        elif sink.address is not None:
            self._answering.discard(sink.address)  # checked again before the next delivery
        if good:
            self._failing.discard(key)
            return True
        self.lost["windows" if spans else "metric_exports"] += 1
        self.lost["spans"] += spans
        if key not in self._failing:
            self._failing.add(key)
            warn(
                f"otel exporter: {f'window {report.window}: ' if report else ''}"
                f"{what} were not delivered via "
                f"{sink.label} ({why}; gave up after {time.monotonic() - began:.1f} s) and are "
                "lost; the program goes on. Further failures there are counted in "
                "OTelExporter.lost and not repeated until a delivery succeeds",
                ExporterWarning,
            )
        return False

    def _send(self, sink: _Sink, send) -> tuple[bool, str]:
        """Run ``send``; (delivered, why not). An OTLP endpoint that has not answered yet is
        first checked with one TCP connect: when nothing answers, ``send`` (and the OTLP
        exporter's retries until its timeout) is skipped."""
        if sink.address is not None and sink.address not in self._answering:
            silent = _unanswered(sink.address)
            if silent is not None:
                return False, silent
        try:
            result = send()
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks the program
            return False, f"the exporter raised {exc!r}"
        return (
            getattr(result, "name", "") == "SUCCESS",
            "the backend is down, slow or refused them",
        )


def _budget(max_spans: int, detail: str) -> OccurrenceBudget:
    from instrument.base.report import OccurrenceBudget

    return OccurrenceBudget(max_spans, detail, TOP_KERNEL_EVENTS)


def _version() -> str:
    try:
        from importlib import metadata

        return metadata.version("torch-profiled")
    except Exception:  # noqa: BLE001
        return "unknown"


# ---------------------------------------------------------------- spans


def _emit_spans(
    tracer: Any,
    report: WindowReport,
    occurrences: Occurrences | None,
    parent: Any,
    budget: OccurrenceBudget,
) -> int:
    """The window span and, under it, one span per occurrence (parents come first); returns
    how many spans were made."""
    items = occurrences.items if occurrences is not None else ()
    start, end = report.start_ns, report.end_ns
    if occurrences is not None and occurrences.first_ns is not None:
        first = occurrences.first_ns
        # The profiler starts at the end of the step before: with a parent (the request
        # of the window's first call) the span starts at that call, inside the parent.
        start = first if parent is not None else min(start, first)
        end = max(end, occurrences.last_ns or end)
    attrs = _window_attributes(report)
    attrs.update(
        {
            "profiled.window.range_occurrences": occurrences.range_count if occurrences else 0,
            "profiled.otel.detail": budget.detail,
            "profiled.otel.max_spans": budget.max_spans,
            "profiled.otel.folded_occurrences": occurrences.folded_occurrences
            if occurrences
            else 0,
            "profiled.otel.folded_ranges": list(occurrences.folded_ranges) if occurrences else [],
            "profiled.otel.dropped_spans": occurrences.dropped if occurrences else 0,
        }
    )
    window = tracer.start_span(
        "profiled.window",
        context=parent if parent is not None else otel_context.Context(),
        attributes=attrs,
        start_time=start,
    )
    root = trace.set_span_in_context(window, otel_context.Context())
    ctxs: list[Any] = []
    for occ in items:
        span = tracer.start_span(
            occ.name,
            context=ctxs[occ.parent] if occ.parent >= 0 else root,
            attributes=_occurrence_attributes(occ, report),
            start_time=occ.start_ns,
        )
        _kernel_events(span, occ)
        span.end(end_time=occ.end_ns)
        ctxs.append(trace.set_span_in_context(span, otel_context.Context()))
    window.end(end_time=end)
    return 1 + len(items)


def _window_attributes(report: WindowReport) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "profiled.kind": "window",
        "profiled.window.index": report.window,
        "profiled.window.steps": list(report.steps),
        "profiled.window.partial": report.partial,
        "profiled.rank": report.rank,
        "profiled.world_size": report.world_size,
        "profiled.device": report.device,
        "profiled.activities": list(report.activities),
        "profiled.cpu_time_us": report.self_cpu_time_total_us,
        "profiled.device_time_us": report.self_device_time_total_us,
        "profiled.device_busy_us": report.device_busy_us,
        "profiled.profiler_overhead_us": report.profiler_overhead_us,
        "profiled.verdict": str(report.verdict),
        "profiled.verdict_reason": report.verdict.reason,
        "profiled.event_count": report.event_count,
    }
    if report.flops:
        attrs["profiled.flops"] = report.flops
        _rate_attributes(
            attrs, report, report.flops, report.self_device_time_total_us, report.flops_dtype
        )
    health = getattr(report, "health", None)
    if health is not None:
        attrs["profiled.health"] = health.status
        if health.reasons:
            attrs["profiled.health.reasons"] = [r.detail for r in health.reasons]
            attrs["profiled.health.reason_kinds"] = [r.kind for r in health.reasons]
            attrs["profiled.health.lost"] = sum(r.count for r in health.reasons)
    cost = getattr(report, "cost", None)
    if cost is not None:
        attrs.update(cost_attributes(cost))
    reason = getattr(report, "reason", None)
    if reason is not None:
        attrs["profiled.window.reason"] = reason.kind
        attrs["profiled.window.reason_detail"] = reason.detail
    if report.trace_file:
        attrs["profiled.trace_file"] = report.trace_file
    return attrs


def cost_attributes(cost: Any) -> dict[str, Any]:
    """The window's ledger as ``profiled.cost.*`` span attributes (a value that is unknown,
    such as the steps' excess without a step histogram, is left out: OTel has no null)."""
    attrs: dict[str, Any] = {}
    for key, value in cost.to_dict().items():
        if value is None or (key == "backed_off" and not value):
            continue
        attrs[f"profiled.cost.{key}"] = value
    return attrs


def _rate_attributes(
    attrs: dict[str, Any], report: WindowReport, flops: int, device_us: float, dtype: str
) -> None:
    """FLOP/s over ``device_us``, the dtype, and MFU where the device's peak is known."""
    if dtype:
        attrs["profiled.flops_dtype"] = dtype
    if not device_us:
        return
    rate = flops / (device_us * 1e-6)
    attrs["profiled.flops_per_s"] = rate
    peak = report.peak_flops_per_s(dtype)
    if peak:
        attrs["profiled.mfu"] = rate / peak
        attrs["profiled.peak_tflops"] = peak / 1e12


def _occurrence_attributes(occ: Occurrence, report: WindowReport) -> dict[str, Any]:
    if occ.kind == "range.folded":
        return _folded_attributes(occ, report)
    if occ.kind == "op":
        return {"profiled.kind": "op", "profiled.cpu_time_us": occ.cpu_time_us}
    if occ.kind != "range":
        return {"profiled.kind": occ.kind, "profiled.device_time_us": occ.device_time_us}
    attrs: dict[str, Any] = {
        "profiled.kind": "range",
        "profiled.range.name": occ.name,
        "profiled.cpu_time_us": occ.cpu_time_us,
        "profiled.device_time_us": occ.device_time_us,
        "profiled.device_busy_us": occ.device_busy_us,
        "profiled.kernel_launches": occ.kernel_launches,
    }
    if occ.verdict is not None:
        attrs["profiled.verdict"] = str(occ.verdict)
        attrs["profiled.verdict_reason"] = occ.verdict.reason
    if occ.flops:
        attrs["profiled.flops"] = occ.flops
        stats = report.ranges.get(occ.name)
        dtype = stats.flops_dtype if stats is not None else ""
        _rate_attributes(attrs, report, occ.flops, occ.device_time_us, dtype)
    if occ.thread_id is not None:
        attrs["thread.id"] = occ.thread_id
    return attrs


def _folded_attributes(occ: Occurrence, report: WindowReport) -> dict[str, Any]:
    stats = report.ranges.get(occ.name)
    attrs: dict[str, Any] = {
        "profiled.kind": "range.folded",
        "profiled.range.name": occ.name,
        "profiled.range.folded": True,
        "profiled.range.calls": occ.calls,
    }
    if stats is not None:  # the report's per-name numbers cover exactly these occurrences
        attrs.update(
            {
                "profiled.cpu_time_us": stats.cpu_time_us,
                "profiled.device_time_us": stats.device_time_us,
                "profiled.device_busy_us": stats.device_busy_us,
                "profiled.kernel_launches": stats.kernel_launches,
                "profiled.verdict": str(stats.verdict),
                "profiled.verdict_reason": stats.verdict.reason,
            }
        )
    else:
        attrs["profiled.cpu_time_us"] = occ.cpu_time_us
    return attrs


def _kernel_events(span: Any, occ: Occurrence) -> None:
    for kernel in occ.top_kernels:
        span.add_event(
            "profiled.kernel",
            {
                "profiled.kernel.name": kernel.name,
                "profiled.kernel.kind": kernel.kind,
                "profiled.kernel.calls": kernel.calls,
                "profiled.device_time_us": kernel.device_time_us,
            },
            timestamp=kernel.first_ns,
        )


# ---------------------------------------------------------------- metrics


class _Metrics:
    """The exporter's histograms and counter, per meter provider."""

    def __init__(self) -> None:
        self._instruments: dict[int, tuple[Any, Any, Any]] = {}

    def _for(self, provider: Any) -> tuple[Any, Any, Any]:
        instruments = self._instruments.get(id(provider))
        if instruments is None:
            meter = provider.get_meter(_SCOPE, _version())
            instruments = (
                meter.create_histogram(
                    "profiled.range.cpu_time",
                    unit="s",
                    description="CPU time of one call of a @profiled range",
                    explicit_bucket_boundaries_advisory=_BUCKETS,
                ),
                meter.create_histogram(
                    "profiled.range.device_time",
                    unit="s",
                    description="Device time of the work one call of a @profiled range launched",
                    explicit_bucket_boundaries_advisory=_BUCKETS,
                ),
                meter.create_counter(
                    "profiled.windows", unit="{window}", description="Profiler windows exported"
                ),
            )
            self._instruments[id(provider)] = instruments
        return instruments

    def record(self, provider: Any, report: WindowReport, occurrences: Occurrences | None) -> None:
        """One value per range call (every call, whatever the span budget), and the window."""
        cpu, device, windows = self._for(provider)
        with_device = any(a != "cpu" for a in report.activities)
        if occurrences is not None:
            for name, calls in occurrences.calls.items():
                attrs = {"profiled.range.name": name, "profiled.device": report.device}
                for ns in calls.cpu_ns:
                    cpu.record(ns / 1e9, attrs)
                if with_device:
                    for ns in calls.device_ns:
                        device.record(ns / 1e9, attrs)
        windows.add(
            1, {"profiled.device": report.device, "profiled.window.partial": report.partial}
        )
