"""Real OTLP receivers for the tests, on 127.0.0.1 only, and endpoints that fail.

The receivers are the ``oteltest`` package's: its OTLP/gRPC services and its OTLP/HTTP sink
(protobuf and JSON bodies). oteltest binds every interface on the fixed ports 4317/4318; here
they listen on 127.0.0.1 and a free port, so tests can run side by side.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from oteltest.sink import HttpSink
from oteltest.sink.handler import RequestHandler
from oteltest.sink.private import (
    _LogsServiceServicer,
    _MetricsServiceServicer,
    _TraceServiceServicer,
)

_log = logging.getLogger("tests.otlp_receiver")


class Received(RequestHandler):
    """What arrived, decoded: spans with their resource, metrics by name."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.trace_requests: list[Any] = []
        self.metric_requests: list[Any] = []

    def handle_trace(self, request, headers):
        with self._cond:
            self.trace_requests.append(request)
            self._cond.notify_all()

    def handle_metrics(self, request, headers):
        with self._cond:
            self.metric_requests.append(request)
            self._cond.notify_all()

    def handle_logs(self, request, headers):
        pass

    def wait(self, predicate, timeout: float = 30.0) -> bool:
        """Wait until ``predicate(self)`` holds (bounded: a test never hangs on a receiver)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def spans(self) -> list[dict[str, Any]]:
        out = []
        for req in list(self.trace_requests):
            for rs in req.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        out.append(
                            {
                                "name": sp.name,
                                "trace_id": sp.trace_id.hex(),
                                "span_id": sp.span_id.hex(),
                                "parent_id": sp.parent_span_id.hex() or None,
                                "start": sp.start_time_unix_nano,
                                "end": sp.end_time_unix_nano,
                                "attributes": attributes(sp.attributes),
                                "events": [
                                    (e.name, e.time_unix_nano, attributes(e.attributes))
                                    for e in sp.events
                                ],
                                "resource": resource,
                                "scope": ss.scope.name,
                            }
                        )
        return out

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name -> the metric protos received (latest request last)."""
        out: dict[str, list[Any]] = {}
        for req in list(self.metric_requests):
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out.setdefault(m.name, []).append(m)
        return out


def value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


class HttpReceiver(HttpSink):
    """oteltest's OTLP/HTTP sink (``/v1/traces``, ``/v1/metrics``, ``/v1/logs``) on
    127.0.0.1 and a free port."""

    def __init__(self, handler: RequestHandler) -> None:
        super().__init__(handler, _log, port=0)
        self._ready = threading.Event()

    def run_server(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - as in oteltest.sink.HttpSink
                body = self.rfile.read(int(self.headers["Content-Length"]))
                handle = outer.handlers.get(self.path)
                if handle:
                    handle(body, dict(self.headers.items()))
                self.send_response(200 if handle else 404)
                self.send_header("Content-type", "text/plain")
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, *args):
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self._ready.set()
        self.httpd.serve_forever()

    def start(self):
        super().start()
        self._ready.wait(10)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class GrpcReceiver:
    """oteltest's OTLP/gRPC services on 127.0.0.1 and a free port."""

    def __init__(self, handler: RequestHandler) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            _TraceServiceServicer(handler.handle_trace), self.server
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            _MetricsServiceServicer(handler.handle_metrics), self.server
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(
            _LogsServiceServicer(handler.handle_logs), self.server
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class HangingServer:
    """Accepts connections on 127.0.0.1, reads what comes, never answers until ``release()``:
    a backend that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.released = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.2)
        while not self.released.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(0.2)
            self._conns.append(conn)
            self.accepted.set()

    def release(self) -> None:
        self.released.set()
        self._thread.join(5)
        for conn in self._conns:
            conn.close()
        self.sock.close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def closed_endpoint() -> str:
    """An address on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
