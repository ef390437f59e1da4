"""The prometheus exporter: a real program serves ``/metrics``; a real Prometheus server
(Debian's ``prometheus``, which ``.ci/run`` installs) started here on 127.0.0.1 scrapes it,
and its query API returns the per-range counts."""

from __future__ import annotations

import json
import math
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import warnings

import pytest

from exporters import ExporterWarning
from exporters.prometheus import PrometheusExporter, exposition, parse_addr
from instrument.runtime import metrics
from tests import _proc

PROMETHEUS = shutil.which("prometheus")

PROGRAM = r"""
import sys, torch
from instrument import profiled

@profiled("work")
def work(x):
    return x + 1

@profiled("train_step", step=True)
def train_step(x):
    return work(x) + work(x)

x = torch.zeros(4)
for _ in range(250):
    train_step(x)
import math, random
from instrument.runtime import metrics, state
rng = random.Random(5)  # known durations, through the recording path the decorator inlines
for _ in range(3000):
    metrics.record(metrics.recorder, "known", rng.lognormvariate(math.log(3e6), 0.8))
print("windows opened:", state.current.windows_opened, file=sys.stderr)  # alone: none
print("ready", flush=True)
sys.stdin.read()  # served until the test closes stdin
print("done")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - 127.0.0.1 only
        return r.read().decode()


def _counts(page: str, metric: str) -> dict[str, float]:
    out = {}
    for line in page.splitlines():
        if line.startswith(metric + "{"):
            labels, value = line[len(metric) + 1 :].rsplit("} ", 1)
            name = labels.split('range="', 1)[1].split('"', 1)[0] if "range=" in labels else ""
            out[name] = float(value)
    return out


@pytest.fixture
def program(tmp_path):
    port = _free_port()
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = _proc.sdk_env(
        PROFILED_EXPORTERS="prometheus",
        PROFILED_PROMETHEUS_ADDR=f"127.0.0.1:{port}",
        PROFILED_METRICS_INTERVAL_S="0.2",
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    yield port
    out, err = proc.communicate("", timeout=60)
    assert proc.returncode == 0, err
    assert out.endswith("done\n")
    assert "windows opened: 0" in err  # the prometheus exporter alone records no window


KNOWN = 3000


def _known(q: float) -> float:
    """The exact ``q`` quantile of the program's known durations, in seconds."""
    rng = random.Random(5)
    ordered = sorted(rng.lognormvariate(math.log(3e6), 0.8) for _ in range(KNOWN))
    return ordered[math.ceil(q * KNOWN) - 1] / 1e9


def test_the_program_serves_exact_counts_on_metrics(program):
    expected = {"work": 500, "train_step": 250, "known": KNOWN}
    deadline = time.monotonic() + 30
    while True:  # served as of the last snapshot: one comes every interval
        page = _get(f"http://127.0.0.1:{program}/metrics")
        counts = _counts(page, "profiled_range_duration_seconds_count")
        if counts == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert counts == expected
    assert _counts(page, "profiled_step_duration_seconds_count") == {"": 250}
    assert "# TYPE profiled_range_duration_seconds histogram" in page
    assert 'le="+Inf"' in page and 'rank="0"' in page


@pytest.mark.skipif(
    PROMETHEUS is None, reason="needs the prometheus server (Debian package prometheus)"
)
def test_a_real_prometheus_server_scrapes_the_counts(program, tmp_path):
    web = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: profiled\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{program}']\n"
    )
    server = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        query = urllib.parse.quote("profiled_range_duration_seconds_count")
        deadline = time.monotonic() + 60
        found: dict[str, float] = {}
        expected = {"work": 500.0, "train_step": 250.0, "known": float(KNOWN)}
        while time.monotonic() < deadline and found != expected:
            time.sleep(0.5)
            try:
                doc = json.loads(_get(f"http://127.0.0.1:{web}/api/v1/query?query={query}"))
            except OSError:
                continue  # not listening yet
            found = {r["metric"]["range"]: float(r["value"][1]) for r in doc["data"]["result"]}
        assert found == expected
        (result,) = [r for r in doc["data"]["result"] if r["metric"]["range"] == "work"]
        assert result["metric"]["job"] == "profiled" and result["metric"]["rank"] == "0"
        for q in (0.5, 0.9, 0.99):  # Prometheus's own quantile from the buckets: within 5%
            series = 'profiled_range_duration_seconds_bucket{range="known"}'
            expr = f"histogram_quantile({q}, {series})"
            url = f"http://127.0.0.1:{web}/api/v1/query?query={urllib.parse.quote(expr)}"
            (value,) = json.loads(_get(url))["data"]["result"]
            assert abs(float(value["value"][1]) - _known(q)) / _known(q) < 0.05, (q, value)
    finally:
        server.terminate()
        server.wait(30)


def test_an_address_in_use_costs_one_warning_and_nothing_else():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exp = PrometheusExporter(f"127.0.0.1:{port}")
        assert [str(w.message) for w in caught if w.category is ExporterWarning] and (
            exp.port is None and not exp.takes_metrics
        )
        assert "cannot serve /metrics on" in str(caught[-1].message)
        exp.shutdown()


def test_the_exposition_of_known_durations():
    metrics.reset()
    try:
        rec = metrics.recorder
        for ns in (1500, 3000, 3000):
            metrics.record(rec, 'a "quoted" name', ns)
        page = exposition(metrics.snapshot())
    finally:
        metrics.reset()
    lines = [ln for ln in page.splitlines() if "_bucket" in ln]
    assert lines[0].endswith(" 0") and 'le="1.024e-06"' in lines[0]  # under 1.024 us: none
    # then from the first non-empty bucket's lower bound (1472 ns) to the last one's upper
    # (3008 ns), every bound of 32 a power of two, cumulative
    assert 'le="1.472e-06"} 0' in lines[1] and 'le="1.504e-06"} 1' in lines[2]
    assert 'le="2.944e-06"} 1' in lines[-3] and 'le="3.008e-06"} 3' in lines[-2]
    assert 'le="+Inf"} 3' in lines[-1] and len(lines) == 1 + 19 + 15 + 1  # 1472..2048, ..3008
    assert 'range="a \\"quoted\\" name"' in lines[0]
    assert 'profiled_range_duration_seconds_sum{range="a \\"quoted\\" name",' in page
    assert page.rstrip().splitlines()[-1].startswith("# TYPE profiled_step_duration_seconds")


@pytest.mark.parametrize("bad", ["9464", "localhost", "host:port", ":9464", "h:70000", ""])
def test_bad_addresses_are_refused(bad):
    with pytest.raises(ValueError, match="expected host:port"):
        parse_addr(bad)
    assert parse_addr("[::1]:9464") == ("::1", 9464)


def test_reading_the_settings_imports_no_web_server(run_python):
    # the address is checked with every Config: importing http.server there made the first
    # decorated call slow enough for a program's 0.3 ms timer storm to cut every attempt short
    out = run_python(
        "import sys\nfrom instrument.runtime.config import Config\n"
        "Config.from_env({'PROFILED_PROMETHEUS_ADDR': '127.0.0.1:9999'})\n"
        "print('http.server' in sys.modules)"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
