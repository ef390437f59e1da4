"""The ``/metrics`` endpoint never costs the program it lives in (issue 29, item 9; 19: IPv6).

Real programs, real sockets on the loopback: a flood of idle and half-sent connections under a
low descriptor limit (the program still opens its own files, a scrape still answers, the
endpoint holds a bounded number of descriptors and threads), connections that never finish
their request are closed by the endpoint however slowly they trickle, a forked child does not
keep the port after its parent exits, ``[::1]`` is served, and scrapes while the program's
threads keep counting always read a whole, valid page.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings

import pytest

from exporters.prometheus import MAX_CONNECTIONS, READ_TIMEOUT_S, PrometheusExporter
from tests import _proc

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc, Linux sockets")


def _free_port(family: int = socket.AF_INET, host: str = "127.0.0.1") -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 30) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return r.status, r.read().decode()


def _count(page: str, name: str) -> float | None:
    prefix = f'profiled_range_duration_seconds_count{{range="{name}",'
    for line in page.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


def _start(tmp_path, program: str, **env: str) -> subprocess.Popen:
    script = tmp_path / "prog.py"
    script.write_text(program)
    return _proc.start(
        str(script),
        env=_proc.sdk_env(
            {"PROFILED_EXPORTERS": "prometheus", "PROFILED_METRICS_INTERVAL_S": "0.1"}, **env
        ),
        cwd=tmp_path,
        stdin=subprocess.PIPE,
    )


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


# ---------------------------------------------------------------- a flood of idle connections

FLOOD_PROGRAM = r"""
import os, resource, sys, torch
from instrument import profiled

@profiled("work")
def work(x):
    return x + 1

x = torch.zeros(2)
for _ in range(100):
    work(x)
# the program's own budget of descriptors: what it holds now and 40 more
held = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (held + 40, held + 40))
print("ready", flush=True)
sys.stdin.readline()  # the test floods the endpoint meanwhile
files = [open(os.devnull) for _ in range(15)]  # the program's own next opens
print("opened", len(files), flush=True)
for f in files:
    f.close()
for _ in range(100):
    work(x)
sys.stdin.readline()
print("done", flush=True)
"""


def _half_requests(port: int, n: int, request: bytes) -> list[socket.socket]:
    """``n`` connections that each send ``request`` and then nothing (connected without
    blocking: a listener that stopped accepting must not stall the test)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    deadline = time.monotonic() + 20
    pending = list(socks)
    while pending and time.monotonic() < deadline:
        _, ready, _ = select.select([], pending, [], 1.0)
        for s in ready:
            pending.remove(s)
            try:
                s.send(request)
            except OSError:
                pass  # already pushed out by the endpoint: it holds only the newest
    return socks


def test_a_flood_of_half_sent_requests_costs_the_program_nothing(tmp_path):
    port = _free_port()
    proc = _start(tmp_path, FLOOD_PROGRAM, PROFILED_PROMETHEUS_ADDR=f"127.0.0.1:{port}")
    socks: list[socket.socket] = []
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        fds, threads = _fds(proc.pid), _threads(proc.pid)
        for request in (b"GET /metr", b"", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"):
            socks += _half_requests(port, 100, request)
        time.sleep(0.5)  # let the endpoint take what it takes
        # a bounded number of descriptors and no thread per connection
        assert _fds(proc.pid) <= fds + MAX_CONNECTIONS + 4
        assert _threads(proc.pid) <= threads + 4  # (the SDK's own lanes may start)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "opened 15\n", proc.stderr.read()
        # a real scrape answers while the 300 connections are still open
        status, page = _get(f"http://127.0.0.1:{port}/metrics")
        # (a live snapshot: the program makes its next 100 calls meanwhile)
        assert status == 200 and 100 <= _count(page, "work") <= 200, page[-2000:]
        proc.stdin.write("end\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        for s in socks:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out == "done\n" and "Traceback" not in err


# ---------------------------------------------------------------- requests that never end

SERVE_PROGRAM = r"""
import sys, torch
from instrument import profiled

@profiled("work")
def work(x):
    return x + 1

for _ in range(10):
    work(torch.zeros(2))
print("ready", flush=True)
sys.stdin.read()
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One program for the tests below (each starts its own connections)."""
    port = _free_port()
    proc = _start(
        tmp_path_factory.mktemp("served"),
        SERVE_PROGRAM,
        PROFILED_PROMETHEUS_ADDR=f"127.0.0.1:{port}",
    )
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    yield port, proc
    out, err = proc.communicate("", timeout=120)
    assert proc.returncode == 0 and out == "done\n", err


def _closed_by_peer(s: socket.socket, within_s: float) -> bytes | None:
    """What the endpoint sent before closing ``s`` within ``within_s``; None: still open."""
    s.settimeout(within_s)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        return None
    return got


def test_connections_that_never_finish_their_request_are_closed(served):
    port, _ = served
    idle = socket.create_connection(("127.0.0.1", port))
    half = socket.create_connection(("127.0.0.1", port))
    half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    drip = socket.create_connection(("127.0.0.1", port))  # a byte at a time, never done
    huge = socket.create_connection(("127.0.0.1", port))  # headers without end
    started = time.monotonic()
    try:
        huge.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 40_000)
        while time.monotonic() - started < 3 * READ_TIMEOUT_S:
            try:
                drip.send(b"G")
            except OSError:
                break  # closed by the endpoint
            time.sleep(0.2)
        assert (_closed_by_peer(huge, 30) or b"").startswith(b"HTTP/1.1 431 ")
        # closed, with nothing sent: generous bounds (a busy box), far under "never"
        for s in (idle, half, drip):
            assert _closed_by_peer(s, 60) == b""
        # and the endpoint still answers
        assert _get(f"http://127.0.0.1:{port}/metrics")[0] == 200
    finally:
        for s in (idle, half, drip, huge):
            s.close()


@pytest.mark.parametrize(
    "request_, status",
    [
        (b"GET /metrics HTTP/1.0\r\n\r\n", b"200"),
        (b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", b"200"),
        (b"HEAD /metrics HTTP/1.1\r\n\r\n", b"200"),
        (b"GET / HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"400"),  # a TLS hello
        (b"GET\r\n\r\n", b"400"),
    ],
)
def test_every_request_gets_an_answer_and_a_close(served, request_, status):
    port, _ = served
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request_)
        answer = _closed_by_peer(s, 30)
    assert answer is not None and answer.split(b" ", 2)[1] == status, answer
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"Connection: close" in head
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    assert len(body) == (0 if request_.startswith(b"HEAD") else length)


# ---------------------------------------------------------------- forked children

FORK_PROGRAM = r"""
import multiprocessing, os, sys, time, torch
from instrument import profiled

@profiled("work")
def work(x):
    return x + 1

work(torch.zeros(2))  # the endpoint is up from here on

def linger():
    time.sleep(120)

children = []
pid = os.fork()
if pid == 0:
    linger()
    os._exit(0)
children.append(pid)
p = multiprocessing.get_context("fork").Process(target=linger, daemon=False)
p.start()
children.append(p.pid)
print(*children, flush=True)
os._exit(0)  # the parent ends; its children stay
"""


def test_a_forked_child_does_not_keep_the_port(tmp_path):
    port = _free_port()
    proc = _start(tmp_path, FORK_PROGRAM, PROFILED_PROMETHEUS_ADDR=f"127.0.0.1:{port}")
    line = proc.stdout.readline()
    children = [int(pid) for pid in line.split()]
    try:
        assert len(children) == 2, proc.stderr.read()
        assert proc.wait(timeout=60) == 0
        for pid in children:  # alive, and not listening on the port
            assert os.path.exists(f"/proc/{pid}")
        # the port is free for a restarted program: a new exporter binds and serves it
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exp = PrometheusExporter(f"127.0.0.1:{port}")
        try:
            assert [str(w.message) for w in caught] == [] and exp.port == port
            assert _get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        finally:
            exp.shutdown()
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.stdout.close()
        proc.stderr.close()


def test_the_port_is_free_again_once_the_exporter_shuts_down():
    exp = PrometheusExporter("127.0.0.1:0")
    port = exp.port
    assert port is not None and _get(f"http://127.0.0.1:{port}/metrics")[0] == 200
    exp.shutdown()
    assert exp.port is None and not exp.takes_metrics
    again = PrometheusExporter(f"127.0.0.1:{port}")  # SO_REUSEADDR, the listener closed
    try:
        assert again.port == port
    finally:
        again.shutdown()


# ---------------------------------------------------------------- IPv6


def _has_ipv6_loopback() -> bool:
    try:
        _free_port(socket.AF_INET6, "::1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_address_is_served(tmp_path):
    exp = PrometheusExporter("[::1]:0")
    try:
        assert exp.port is not None and exp.address == f"[::1]:{exp.port}"
        assert _get(f"http://[::1]:{exp.port}/metrics")[0] == 200
    finally:
        exp.shutdown()
    # and in a program, from PROFILED_PROMETHEUS_ADDR
    port = _free_port(socket.AF_INET6, "::1")
    proc = _start(tmp_path, SERVE_PROGRAM, PROFILED_PROMETHEUS_ADDR=f"[::1]:{port}")
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        deadline = time.monotonic() + 60
        while (count := _count(_get(f"http://[::1]:{port}/metrics")[1], "work")) is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert count == 10
    finally:
        out, err = proc.communicate("", timeout=120)
    assert proc.returncode == 0 and "cannot serve" not in err, err


# ---------------------------------------------------------------- scrapes while counting

COUNTING_PROGRAM = r"""
import sys, threading, torch
from instrument import profiled

@profiled("busy")
def busy(x):
    return x + 1

busy(torch.zeros(2))  # the endpoint is up from the first call on
stop = threading.Event()

def loop():
    x = torch.zeros(2)
    while not stop.is_set():
        busy(x)

threads = [threading.Thread(target=loop) for _ in range(2)]
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.readline()
stop.set()
for t in threads:
    t.join()
print("done", flush=True)
"""


def test_scrapes_while_threads_count_read_whole_growing_pages(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    port = _free_port()
    proc = _start(
        tmp_path,
        COUNTING_PROGRAM,
        PROFILED_PROMETHEUS_ADDR=f"127.0.0.1:{port}",
        PROFILED_METRICS_INTERVAL_S="0.1",  # the floor
    )
    counts: list[float] = []
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        deadline = time.monotonic() + 120
        while len(counts) < 40 and time.monotonic() < deadline:
            status, page = _get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            families = list(text_string_to_metric_families(page))  # raises on a torn page
            if _count(page, "busy") is not None:
                assert {f.name for f in families} >= {"profiled_range_duration_seconds"}
                counts.append(_count(page, "busy") or 0.0)
            time.sleep(0.01)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(counts) == 40 and counts == sorted(counts) and counts[-1] > counts[0]
    assert proc.returncode == 0 and out == "done\n", err
    assert "Warning" not in err and "Traceback" not in err


class _FailingOnce:
    """The listening socket, whose next ``accept`` fails as Linux's does when a connection's
    network error is pending (accept(2): to be retried like EAGAIN)."""

    def __init__(self, sock: socket.socket, errno_: int) -> None:
        self._sock, self._errno, self.failed = sock, errno_, False

    def accept(self):
        if not self.failed:
            self.failed = True
            raise OSError(self._errno, os.strerror(self._errno))
        return self._sock.accept()

    def __getattr__(self, name):
        return getattr(self._sock, name)


@pytest.mark.parametrize("errno_name", ["EPROTO", "ENETDOWN", "EHOSTUNREACH", "EPERM"])
def test_a_network_error_handed_to_accept_never_ends_the_endpoint(errno_name):
    import errno

    exporter = PrometheusExporter("127.0.0.1:0")
    try:
        server = exporter._server
        assert server is not None
        failing = _FailingOnce(server.sock, getattr(errno, errno_name))
        server.sock = failing
        url = f"http://127.0.0.1:{exporter.port}/metrics"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            status = None
            for _ in range(3):  # the first connection may be the one whose accept failed
                try:
                    status, _ = _get(url, timeout=10)
                    break
                except OSError:
                    time.sleep(0.2)
        assert failing.failed
        assert status == 200  # still served (was: the serving thread ended, one warning)
        assert not [w for w in caught if "prometheus" in str(w.message)], caught
    finally:
        exporter.shutdown()
