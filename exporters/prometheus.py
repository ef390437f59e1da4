"""``PrometheusExporter``: the always-on histograms on ``/metrics`` for a Prometheus server.

It serves the latest ``MetricsReport`` it was given (every ``PROFILED_METRICS_INTERVAL_S`` and
at exit) in Prometheus's text exposition format, from a daemon thread of its own:

- ``profiled_range_duration_seconds`` (histogram, label ``range``): wall time of every call;
- ``profiled_step_duration_seconds`` (histogram): wall time of every ``step=True`` call;

both with labels ``rank`` and ``host``, cumulative since the process started counting, with the
report's own bucket bounds (32 a power of two: ``histogram_quantile`` reads quantiles within
3.1%), of which a series lists the first and those from its first non-empty bucket to its last
(``RangeHistogram.kept``: counts only grow, so a bound listed once stays listed, and a range
whose calls span a factor of four costs about 70 lines, not 866). ``le`` is the upper bound of
each; a Prometheus bucket counts what is at most its bound, ours what is below it: the same but
for a duration of exactly a bound. Window reports are not served (``export`` does nothing with
them), so with no other exporter no profiler window opens at all (``takes_windows``).

The page's size is bounded whatever names the program makes: at most
``PROFILED_METRICS_MAX_RANGES`` ranges (default 1000) have a series of their own, the calls of
every name past it are one series, ``range="other"`` (10k run-time names once made a 28.5 MB
page); and a report's histograms arrive compact (``metrics._histogram``: the kept span only).

A scrape reads the histograms as they are at that moment (``LiveMetrics``, set by the metrics
feed): the calls made so far, not the last ``PROFILED_METRICS_INTERVAL_S`` snapshot (before the
first one, 60 s by default, the page used to be empty). The page is built on the serving
thread, at most once per ``LIVE_EVERY_S`` (a flood of scrapes reads the same page), and
building it takes the recorder's lock once per range (a user's call waits for one range's fold
at most). Once the feed closes, the last snapshot it delivered is served.

Written here rather than with ``opentelemetry-exporter-prometheus``: that reader collects from
a meter provider, whose API takes single values, not histograms already aggregated. No new
dependency.

The address (``PROFILED_PROMETHEUS_ADDR``, ``host:port``, default ``127.0.0.1:9464``; a host
with a ``:`` is IPv6, ``[::1]:9464``; port 0: any free one, see ``port`` and ``address``) is
bound when the exporter is made. An address in use (another rank on the same host) costs one
warning and nothing is served; the program goes on.

Any range name makes a valid page (one lone surrogate from ``os.fsdecode`` used to fail the
page's encoding every interval, so it kept its old content): label values are escaped as the
text format says (backslash, double quote, newline), a lone surrogate is written out as its
escape text (``valid_text``) and another control character as ``\\xNN`` (a carriage return
or U+2028 ends a line for many readers); two names that end up the same text get ``#2``, ``#3``.

The endpoint lives inside the program it observes, so whatever connects to it must never cost
the program its threads or file descriptors (see ``_Endpoint``).
"""

from __future__ import annotations

import errno
import os
import re
import selectors
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from instrument.base.settings import DEFAULT_PROMETHEUS_ADDR as DEFAULT_ADDR
from instrument.base.settings import addr_family, parse_addr
from instrument.base.warn import warn

from ._base import Exporter, ExporterWarning, ExportResult
from .json_lines import valid_text

if TYPE_CHECKING:
    from instrument.base.report import MetricsReport, RangeHistogram, WindowReport

__all__ = ["DEFAULT_ADDR", "PrometheusExporter", "exposition", "parse_addr"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# ---------------------------------------------------------------- the page

# control characters the text format has no escape for ("\n" has one): a carriage return or a
# form feed ends a line for many readers, an escape sequence reaches a terminal
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _escape_text(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _label_text(value: Any) -> str:
    text = _CONTROL.sub(_escape_text, valid_text(str(value)))
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label(value: Any) -> str:
    return f'"{_label_text(value)}"'


def _unique(name: str, taken: set[tuple[str, Any]], device: Any = None) -> str:
    """``name`` as a label value not in ``taken`` for ``device`` (then added): ``#2``, ``#3``
    after a name that became the same text as another one's (Prometheus drops a series seen
    twice)."""
    label = _label_text(name)
    n = 1
    candidate = label
    while (candidate, device) in taken:
        n += 1
        candidate = f"{label}#{n}"
    taken.add((candidate, device))
    return f'"{candidate}"'


def _histogram(name: str, h: RangeHistogram, labels: str) -> list[str]:
    """One series' lines: ``le`` from the first bound and from the first non-empty bucket's
    lower bound to the last one's upper bound (``RangeHistogram.kept``), cumulative."""
    out = []
    seen = 0
    bounds, counts = h.kept()
    for bound, n in zip(bounds, counts):
        seen += n
        out.append(f'{name}_bucket{{{labels},le="{bound / 1e9:.9g}"}} {seen}')
    out.append(f'{name}_bucket{{{labels},le="+Inf"}} {h.count}')
    out.append(f"{name}_sum{{{labels}}} {h.sum_ns / 1e9:.9g}")
    out.append(f"{name}_count{{{labels}}} {h.count}")
    return out


def exposition(report: MetricsReport) -> str:
    """The report in Prometheus's text format (version 0.0.4); any names make a valid page."""
    who = f"rank={_label(report.rank)},host={_label(report.host)}"
    lines = [
        "# HELP profiled_range_duration_seconds Wall time of every call of a @profiled range.",
        "# TYPE profiled_range_duration_seconds histogram",
    ]
    taken: set[tuple[str, Any]] = set()
    for h in report.ranges:
        labels = f"range={_unique(h.name, taken)},{who}"
        lines += _histogram("profiled_range_duration_seconds", h, labels)
    if report.device_ranges:
        lines += [
            "# HELP profiled_range_device_duration_seconds Device time of sampled calls of a "
            "@profiled range (CUDA events).",
            "# TYPE profiled_range_device_duration_seconds histogram",
        ]
    taken = set()
    for h in report.device_ranges:
        labels = f"range={_unique(h.name, taken, h.device)},device={_label(h.device)},{who}"
        lines += _histogram("profiled_range_device_duration_seconds", h, labels)
    lines += [
        "# HELP profiled_step_duration_seconds Wall time of every step=True call.",
        "# TYPE profiled_step_duration_seconds histogram",
    ]
    if report.steps is not None:
        lines += _histogram("profiled_step_duration_seconds", report.steps, who)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the endpoint

MAX_CONNECTIONS = 16  # open at once; the file descriptors the endpoint may hold besides its own
BACKLOG = 128  # connections the kernel queues (no descriptor of the program's) until accepted
READ_TIMEOUT_S = 5.0  # from accepting a connection to its whole request
WRITE_TIMEOUT_S = 10.0  # for the answer to be taken (Prometheus's default scrape timeout)
MAX_REQUEST_BYTES = 16 * 1024  # request line and headers; a scrape sends well under 1 KiB
LINGER_S = 2.0  # after the answer, for the peer to close its side (see _drain)
_POLL_S = 0.5  # the serving thread looks at least this often whether it should stop
_RETRY_ACCEPT_S = 0.5  # after the process ran out of descriptors (EMFILE): no busy loop

LIVE_EVERY_S = 1.0  # a scrape this soon after the last live page gets that page again

_OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def _reply(status: str, body: bytes, head_only: bool = False, extra: str = "") -> bytes:
    kind = CONTENT_TYPE if status.startswith("200") else "text/plain; charset=utf-8"
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else body)


def _response(request: bytes, page: bytes) -> bytes:
    """The whole answer to one request (its line and headers, ``request``)."""
    parts = request.split(b"\n", 1)[0].split()
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return _reply("400 Bad Request", b"expected: GET /metrics HTTP/1.1\n")
    method, target = parts[0], parts[1]
    if method not in (b"GET", b"HEAD"):
        return _reply(
            "405 Method Not Allowed", b"only GET /metrics\n", extra="Allow: GET, HEAD\r\n"
        )
    if target.split(b"?", 1)[0] != b"/metrics":
        return _reply("404 Not Found", b"only /metrics is served here\n", method == b"HEAD")
    return _reply("200 OK", page, method == b"HEAD")


class _Connection:
    __slots__ = ("answer", "deadline", "done", "request", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.request = b""
        self.answer: memoryview | None = None  # None: still reading the request
        self.done = False  # the answer is sent: waiting for the peer to close (see _drain)


_LIVE: weakref.WeakSet[_Endpoint] = weakref.WeakSet()  # closed in a forked child


class _Endpoint:
    """``/metrics`` on one listening socket, served by one thread, whatever connects.

    Every connection costs a file descriptor and nothing else (no thread of its own: 300
    idle connections once held 300 threads and descriptors, and the program's own next
    ``open()`` failed with EMFILE). At most ``MAX_CONNECTIONS`` are open: a new one pushes out
    the oldest that has not sent its whole request yet, so a scrape gets in past idle or
    half-sent ones; when all are busy answering, new ones wait in the kernel's backlog. A
    request must arrive whole within ``READ_TIMEOUT_S`` of its accept (however slowly it
    trickles in) and be at most ``MAX_REQUEST_BYTES``; its answer must be taken within
    ``WRITE_TIMEOUT_S``; then the connection is closed (one request each), once the peer
    has closed its side too (at most ``LINGER_S`` later).

    The listening socket is ``SO_REUSEADDR`` (a restarted program binds at once, whatever
    connections of the last one linger), close-on-exec (Python's default) and closed in a
    forked child, which serves nothing (``_after_fork_in_child``): the port is free once the
    process that bound it ends, whatever children it left running.
    """

    def __init__(self, host: str, port: int, page: Callable[[], bytes]) -> None:
        sock = socket.socket(addr_family(host), socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.address = sock.getsockname()
        self._page = page
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)
        self._listening = True
        self._accept_again_at = 0.0
        self._open: dict[socket.socket, _Connection] = {}  # in the order accepted
        self.serving = True
        _LIVE.add(self)
        self._thread = threading.Thread(
            target=self._serve, name="torch-profiled-prometheus", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------ the serving thread

    def _serve(self) -> None:
        try:
            while self.serving:
                self._listen_again()
                for key, _ in self._selector.select(self._wait_s()):
                    if not self.serving:
                        break
                    if key.data is None:
                        self._accept()
                    else:
                        self._step(key.data)
                self._expire()
        except Exception as exc:  # noqa: BLE001 - never into the program; say it if not closing
            if self.serving:
                self.serving = False
                warn(
                    f"prometheus exporter: /metrics is no longer served ({type(exc).__name__}: "
                    f"{exc}); the program goes on",
                    ExporterWarning,
                )
        finally:
            self._close_all()

    def _wait_s(self) -> float:
        now = time.monotonic()
        soonest = min((c.deadline for c in self._open.values()), default=now + _POLL_S)
        if not self._listening and self._accept_again_at > now:  # out of descriptors
            soonest = min(soonest, self._accept_again_at)
        return max(0.0, min(soonest - now, _POLL_S))

    def _listen_again(self) -> None:
        if not self._listening and time.monotonic() >= self._accept_again_at and self._has_room():
            self._selector.register(self.sock, selectors.EVENT_READ)
            self._listening = True

    def _pause_listening(self, for_s: float) -> None:
        if self._listening:
            self._selector.unregister(self.sock)
            self._listening = False
        self._accept_again_at = time.monotonic() + for_s

    def _has_room(self) -> bool:
        """Under the bound, or one connection is still sending its request: the oldest such
        is pushed out for a new one (so a scrape gets in past idle connections)."""
        return len(self._open) < MAX_CONNECTIONS or any(
            c.answer is None for c in self._open.values()
        )

    def _accept(self) -> None:
        while self._has_room():
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:  # the program's own need comes first
                    self._pause_listening(_RETRY_ACCEPT_S)
                    return
                if exc.errno == errno.ECONNABORTED:
                    continue
                # Linux hands pending network errors of the new connection to accept()
                # (EPROTO, ENETDOWN, EHOSTUNREACH, EPERM from a firewall...), to be retried
                # like EAGAIN: one of them must never end /metrics for good. Retried after a
                # pause, so a listening socket that keeps failing costs no busy loop.
                self._pause_listening(_RETRY_ACCEPT_S)
                return
            if len(self._open) >= MAX_CONNECTIONS:
                self._close(next(c for c in self._open.values() if c.answer is None))
            sock.setblocking(False)
            conn = _Connection(sock, time.monotonic() + READ_TIMEOUT_S)
            self._open[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
        self._pause_listening(0.0)  # all busy answering: new ones wait in the backlog

    def _step(self, conn: _Connection) -> None:
        try:
            if conn.answer is None:
                self._read(conn)
            elif conn.done:
                self._drain(conn)
            else:
                self._write(conn)
        except OSError:  # reset by the peer, or the like: that connection only
            self._close(conn)

    def _read(self, conn: _Connection) -> None:
        data = conn.sock.recv(4096)
        if not data:
            self._close(conn)
            return
        conn.request += data
        end = max(conn.request.find(b"\r\n\r\n"), conn.request.find(b"\n\n"))
        if end < 0:
            if len(conn.request) > MAX_REQUEST_BYTES:
                self._answer(conn, _reply("431 Request Header Fields Too Large", b""))
            return
        self._answer(conn, _response(conn.request[:end], self._page()))

    def _answer(self, conn: _Connection, answer: bytes) -> None:
        conn.answer = memoryview(answer)
        conn.request = b""
        conn.deadline = time.monotonic() + WRITE_TIMEOUT_S
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Connection) -> None:
        assert conn.answer is not None
        try:
            sent = conn.sock.send(conn.answer)
        except (BlockingIOError, InterruptedError):
            return
        conn.answer = conn.answer[sent:]
        if not conn.answer:  # sent: half-close, and read what the peer still sends
            conn.done = True
            conn.deadline = time.monotonic() + LINGER_S
            conn.sock.shutdown(socket.SHUT_WR)
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)

    def _drain(self, conn: _Connection) -> None:
        """Closing a socket with unread data in it resets the connection, and the peer may
        lose the answer with it (an endless request answered 431): wait for its end first."""
        if not conn.sock.recv(65536):
            self._close(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._open.values() if c.deadline <= now]:
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if self._open.pop(conn.sock, None) is None:
            return
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        conn.sock.close()

    def _close_all(self) -> None:
        for conn in list(self._open.values()):
            self._close(conn)
        self._selector.close()
        self.sock.close()

    # ------------------------------------------------------------ the program's side

    def close(self, wait_s: float = 2 * _POLL_S) -> None:
        """Stop serving: the port is free when this returns (the thread wakes at once on
        Linux, within ``_POLL_S`` elsewhere)."""
        if not self.serving:
            return
        self.serving = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's select
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(wait_s)
        self.sock.close()  # whether or not the thread got there first

    def forget_in_child(self) -> None:
        """In a forked child: the serving thread is not there; close this process's copies of
        the sockets, without telling the selector (its epoll set is the parent's too)."""
        self.serving = False
        for sock in list(self._open):
            sock.close()
        self._open.clear()
        self.sock.close()
        self._selector.close()  # its descriptor only: no epoll_ctl, the parent's set stays


def _after_fork_in_child() -> None:
    for endpoint in list(_LIVE):
        endpoint.forget_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------- the exporter


class PrometheusExporter(Exporter):
    """Serves the always-on histograms on ``http://addr/metrics``."""

    takes_windows = False  # alone, it opens no profiler window

    def __init__(self, addr: str = DEFAULT_ADDR) -> None:
        host, port = parse_addr(addr)
        self.addr = addr
        self._page = b""
        self._live_page = b""
        self._live_until = 0.0  # time.monotonic() until which _live_page is served
        self._live_failed = False
        self._server: _Endpoint | None = None
        try:
            self._server = _Endpoint(host, port, self._page_now)
        except OSError as exc:
            warn(
                f"prometheus exporter: cannot serve /metrics on {addr} "
                f"({exc.strerror or exc}); nothing is served from this process, the program "
                "goes on (give each process its own PROFILED_PROMETHEUS_ADDR, or port 0)",
                ExporterWarning,
            )

    def _serving(self) -> _Endpoint | None:
        server = self._server
        return server if server is not None and server.serving else None

    @property
    def port(self) -> int | None:
        """The port served on (the one picked for port 0); None when nothing is served."""
        server = self._serving()
        return server.address[1] if server is not None else None

    @property
    def address(self) -> str | None:
        """``host:port`` served on, as bound (``[::1]:40021`` for IPv6, the port picked for
        port 0); None when nothing is served."""
        server = self._serving()
        if server is None:
            return None
        host, port = server.address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def export(self, report: WindowReport) -> ExportResult:
        return ExportResult.SUCCESS  # windows are for the other exporters

    def export_metrics(self, report: MetricsReport) -> None:
        self._page = exposition(report).encode("utf-8")
        self._live_until = 0.0  # a later scrape reads the histograms again

    def _page_now(self) -> bytes:
        """The page for a scrape (on the serving thread): the histograms as of now while the
        metrics feed runs (rebuilt at most every ``LIVE_EVERY_S``), else the last snapshot
        delivered. A live read that fails warns once and serves the last snapshot."""
        from instrument.base.report import LiveMetrics

        source = LiveMetrics.source
        if source is None or self._live_failed:
            return self._page
        now = time.monotonic()
        if now < self._live_until:
            return self._live_page
        try:
            page = exposition(source()).encode("utf-8")
        except Exception as exc:  # noqa: BLE001 - never into the program, nor the endpoint
            self._live_failed = True
            warn(
                f"prometheus exporter: reading the histograms at a scrape failed "
                f"({type(exc).__name__}: {exc}); /metrics serves the snapshot of each "
                "PROFILED_METRICS_INTERVAL_S from now on, the program goes on",
                ExporterWarning,
            )
            return self._page
        self._live_page, self._live_until = page, time.monotonic() + LIVE_EVERY_S
        return page

    @property
    def takes_metrics(self) -> bool:  # type: ignore[override]  # computed here
        return self._serving() is not None

    def shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
