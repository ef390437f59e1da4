"""Always-on histograms (``MetricsReport``) as OpenTelemetry metrics data.

``profiled.range.duration`` (one data point per range, attribute ``profiled.range.name``) and
``profiled.step.duration``: wall time in seconds of every call since the process started
counting (cumulative temporality, ``start_time`` = when counting began), with the report's own
bucket bounds (32 a power of two, so a quantile read from them is within 3.1%), count, sum,
min and max. A point's explicit bounds are the first one and those from its first non-empty
bucket to its last (``RangeHistogram.kept``: its empty buckets outside merged, which costs no
accuracy): a range whose calls span a factor of four sends about 70 buckets, not 866, and
since the counts only grow, a bound sent once is sent again. Explicit buckets rather than an
exponential histogram: ours split each power of two evenly (HdrHistogram's), which an
exponential histogram's log-spaced buckets would split again at a cost in accuracy. Names
apart from the window-derived metrics
(``profiled.range.cpu_time``, ``profiled.range.device_time``, ``profiled.windows``), so nothing
is counted twice.

The OpenTelemetry metrics API takes single values, not histograms already aggregated, so these
are built as SDK ``MetricsData`` and handed to the otel exporter's own metric exporters (OTLP
or console): they are sent when the otel exporter owns its pipeline (no meter provider of the
application's).

Any range name makes valid data points: a lone surrogate (``os.fsdecode`` of a file name that
is not UTF-8) cannot be encoded in OTLP's UTF-8 strings (the attribute was dropped, with a
traceback on the program's stderr, and the point merged with every other such range), so it is
written out as its escape text (``valid_text``, as in JSON lines and on the Prometheus page);
two names that end up the same text get ``#2``, ``#3``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .json_lines import valid_text

if TYPE_CHECKING:
    from instrument.base.report import MetricsReport, RangeHistogram

__all__ = ["RANGE_DEVICE_DURATION", "RANGE_DURATION", "STEP_DURATION", "metrics_data"]

RANGE_DURATION = "profiled.range.duration"
RANGE_DEVICE_DURATION = "profiled.range.device_duration"
STEP_DURATION = "profiled.step.duration"


def _point(report: MetricsReport, h: RangeHistogram, attributes: dict[str, Any]) -> Any:
    from opentelemetry.sdk.metrics.export import HistogramDataPoint

    bounds, counts = h.kept()
    return HistogramDataPoint(
        attributes=attributes,
        start_time_unix_nano=report.since_ns,
        time_unix_nano=report.time_ns,
        count=h.count,
        sum=h.sum_ns / 1e9,
        bucket_counts=counts,
        explicit_bounds=[b / 1e9 for b in bounds],
        min=h.min_ns / 1e9,
        max=h.max_ns / 1e9,
    )


def _names(histograms: tuple[RangeHistogram, ...]) -> list[str]:
    """Each histogram's range name as valid text, distinct (per device) as the names are."""
    taken: set[tuple[str, str | None]] = set()
    out = []
    for h in histograms:
        text = valid_text(h.name)
        name, n = text, 1
        while (name, h.device) in taken:
            n += 1
            name = f"{text}#{n}"
        taken.add((name, h.device))
        out.append(name)
    return out


def _metric(name: str, description: str, points: list[Any]) -> Any:
    from opentelemetry.sdk.metrics.export import AggregationTemporality, Histogram, Metric

    data = Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
    return Metric(name=name, description=description, unit="s", data=data)


def metrics_data(report: MetricsReport, resource: Any, scope: str, version: str) -> Any:
    """The report as one ``MetricsData`` of ``resource``."""
    from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    who = {"profiled.rank": report.rank, "profiled.world_size": report.world_size}
    metrics = []
    if report.ranges:
        points = [
            _point(report, h, {"profiled.range.name": name, **who})
            for h, name in zip(report.ranges, _names(report.ranges))
        ]
        metrics.append(
            _metric(RANGE_DURATION, "Wall time of every call of a @profiled range", points)
        )
    if report.device_ranges:
        points = [
            _point(report, h, {"profiled.range.name": name, "profiled.device": h.device, **who})
            for h, name in zip(report.device_ranges, _names(report.device_ranges))
        ]
        metrics.append(
            _metric(
                RANGE_DEVICE_DURATION,
                "Device time of one call in PROFILED_METRICS_DEVICE_EVERY of a @profiled range "
                "(CUDA events)",
                points,
            )
        )
    if report.steps is not None and report.steps.count:
        metrics.append(
            _metric(
                STEP_DURATION,
                "Wall time of every step=True call",
                [_point(report, report.steps, who)],
            )
        )
    scope_metrics = ScopeMetrics(
        scope=InstrumentationScope(scope, version), metrics=metrics, schema_url=""
    )
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(resource=resource, scope_metrics=[scope_metrics], schema_url="")
        ]
    )
