"""``PrometheusExporter``: the always-on histograms on ``/metrics`` for a Prometheus server.

It serves the latest ``MetricsReport`` it was given (every ``PROFILED_METRICS_INTERVAL_S`` and
at exit) in Prometheus's text exposition format, from a daemon thread of its own:

- ``profiled_range_duration_seconds`` (histogram, label ``range``): wall time of every call;
- ``profiled_step_duration_seconds`` (histogram): wall time of every ``step=True`` call;

both with labels ``rank`` and ``host``, cumulative since the process started counting, with the
report's own bucket bounds (``le`` is the upper bound of each; a Prometheus bucket counts what
is at most its bound, ours what is below it: the same but for a duration of exactly a power of
two nanoseconds). Window reports are not served (``export`` does nothing with them), so with
no other exporter no profiler window opens at all (``takes_windows``).

Written here rather than with ``opentelemetry-exporter-prometheus``: that reader collects from
a meter provider, whose API takes single values, not histograms already aggregated. No new
dependency.

The address (``PROFILED_PROMETHEUS_ADDR``, ``host:port``, default ``127.0.0.1:9464``; port 0:
any free one, see ``port``) is bound when the exporter is made. An address in use (another
rank on the same host) costs one warning and nothing is served; the program goes on.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from ._base import Exporter, ExporterWarning, ExportResult
from ._settings import DEFAULT_PROMETHEUS_ADDR as DEFAULT_ADDR
from ._settings import parse_addr
from ._warn import warn

if TYPE_CHECKING:
    from instrument.report import MetricsReport, RangeHistogram, WindowReport

__all__ = ["DEFAULT_ADDR", "PrometheusExporter", "exposition", "parse_addr"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: Any) -> str:
    text = str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return f'"{text}"'


def _histogram(name: str, h: RangeHistogram, labels: str, bounds: tuple[int, ...]) -> list[str]:
    out = []
    seen = 0
    for bound, n in zip(bounds, h.bucket_counts):
        seen += n
        out.append(f'{name}_bucket{{{labels},le="{bound / 1e9:.9g}"}} {seen}')
    out.append(f'{name}_bucket{{{labels},le="+Inf"}} {h.count}')
    out.append(f"{name}_sum{{{labels}}} {h.sum_ns / 1e9:.9g}")
    out.append(f"{name}_count{{{labels}}} {h.count}")
    return out


def exposition(report: MetricsReport) -> str:
    """The report in Prometheus's text format (version 0.0.4)."""
    who = f"rank={_label(report.rank)},host={_label(report.host)}"
    lines = [
        "# HELP profiled_range_duration_seconds Wall time of every call of a @profiled range.",
        "# TYPE profiled_range_duration_seconds histogram",
    ]
    for h in report.ranges:
        labels = f"range={_label(h.name)},{who}"
        lines += _histogram("profiled_range_duration_seconds", h, labels, report.bounds_ns)
    if report.device_ranges:
        lines += [
            "# HELP profiled_range_device_duration_seconds Device time of sampled calls of a "
            "@profiled range (CUDA events).",
            "# TYPE profiled_range_device_duration_seconds histogram",
        ]
    for h in report.device_ranges:
        labels = f"range={_label(h.name)},device={_label(h.device)},{who}"
        lines += _histogram("profiled_range_device_duration_seconds", h, labels, report.bounds_ns)
    lines += [
        "# HELP profiled_step_duration_seconds Wall time of every step=True call.",
        "# TYPE profiled_step_duration_seconds histogram",
    ]
    if report.steps is not None:
        lines += _histogram("profiled_step_duration_seconds", report.steps, who, report.bounds_ns)
    return "\n".join(lines) + "\n"


class PrometheusExporter(Exporter):
    """Serves the always-on histograms on ``http://addr/metrics``."""

    takes_windows = False  # alone, it opens no profiler window

    def __init__(self, addr: str = DEFAULT_ADDR) -> None:
        host, port = parse_addr(addr)
        self.addr = addr
        self._page = b""
        self._server: ThreadingHTTPServer | None = None
        try:
            self._server = ThreadingHTTPServer((host, port), self._handler())
        except OSError as exc:
            warn(
                f"prometheus exporter: cannot serve /metrics on {addr} "
                f"({exc.strerror or exc}); nothing is served from this process, the program "
                "goes on (give each process its own PROFILED_PROMETHEUS_ADDR, or port 0)",
                ExporterWarning,
            )
            return
        self._server.daemon_threads = True
        thread = threading.Thread(
            target=self._server.serve_forever, name="torch-profiled-prometheus", daemon=True
        )
        thread.start()

    @property
    def port(self) -> int | None:
        """The port served on (the one picked for port 0); None when nothing is served."""
        return self._server.server_address[1] if self._server is not None else None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                body = exporter._page
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # no line on the program's stderr per scrape

        return Handler

    def export(self, report: WindowReport) -> ExportResult:
        return ExportResult.SUCCESS  # windows are for the other exporters

    def export_metrics(self, report: MetricsReport) -> None:
        self._page = exposition(report).encode("utf-8")

    @property
    def takes_metrics(self) -> bool:  # type: ignore[override]  # computed here
        return self._server is not None

    def shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
