"""``/metrics`` answers with the histograms as of the scrape (issue 30 item 5): a real program
with the default interval (60 s: the first snapshot would come a minute in) serves the calls
made so far on its first scrape, and the calls made since on a later one, over real HTTP on
127.0.0.1. Before, the page was empty (200, no body) until the first interval."""

from __future__ import annotations

import time
import warnings

import pytest

from exporters import ExporterWarning
from exporters.prometheus import LIVE_EVERY_S, PrometheusExporter
from instrument.runtime import metrics
from tests import _proc
from tests.test_prometheus import _counts, _free_port, _get

PROGRAM = r"""
import sys
from instrument import profiled

@profiled("work")
def work(x):
    return x + 1

@profiled("train_step", step=True)
def train_step(x):
    return work(x)

for _ in range(300):
    train_step(1)
print("ready", flush=True)
sys.stdin.readline()
for _ in range(200):
    train_step(1)
print("ready", flush=True)
sys.stdin.read()
print("done")
"""


def test_the_first_scrape_before_any_interval_has_the_calls_so_far(tmp_path):
    port = _free_port()
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = _proc.sdk_env(
        PROFILED_EXPORTERS="prometheus", PROFILED_PROMETHEUS_ADDR=f"127.0.0.1:{port}"
    )  # PROFILED_METRICS_INTERVAL_S: the default, 60 s
    proc = _proc.start(str(script), env=env, cwd=tmp_path, stdin=-1)
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        page = _get(f"http://127.0.0.1:{port}/metrics")  # one scrape, no waiting for a snapshot
        duration = "profiled_range_duration_seconds_count"
        assert _counts(page, duration) == {"work": 300, "train_step": 300}, page[:2000]
        assert _counts(page, "profiled_step_duration_seconds_count") == {"": 300}
        proc.stdin.write("more\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        time.sleep(LIVE_EVERY_S * 1.5)  # past the page a flood of scrapes would share
        page = _get(f"http://127.0.0.1:{port}/metrics")
        assert _counts(page, duration) == {"work": 500, "train_step": 500}
        out, err = proc.communicate("", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and out.endswith("done\n"), err
    assert "Warning" not in err, err


@pytest.fixture
def served():
    """An exporter on a free port of 127.0.0.1, and the live source restored after."""
    from instrument.base.report import LiveMetrics

    before = LiveMetrics.source
    exporter = PrometheusExporter("127.0.0.1:0")
    metrics.reset()
    try:
        yield exporter, f"http://127.0.0.1:{exporter.port}/metrics"
    finally:
        exporter.shutdown()
        LiveMetrics.source = before
        metrics.reset()


def test_a_flood_of_scrapes_reads_the_histograms_at_most_once_a_second(served):
    from instrument.base.report import LiveMetrics

    exporter, url = served
    reads = []

    def source():
        reads.append(time.monotonic())
        return metrics.snapshot()

    LiveMetrics.source = source
    for ns in (2000.0, 3000.0, 5000.0):
        metrics.record(metrics.recorder, "r", ns)
    t0 = time.monotonic()
    pages = [_get(url) for _ in range(30)]
    took = time.monotonic() - t0
    assert all(_counts(p, "profiled_range_duration_seconds_count") == {"r": 3} for p in pages)
    assert 1 <= len(reads) <= 1 + took / LIVE_EVERY_S, (len(reads), took)


def test_a_live_read_that_fails_warns_once_and_serves_the_last_snapshot(served):
    from instrument.base.report import LiveMetrics

    exporter, url = served
    metrics.record(metrics.recorder, "r", 2000.0)
    exporter.export_metrics(metrics.snapshot())  # the last interval's snapshot

    def broken():
        raise RuntimeError("histograms unreadable")

    LiveMetrics.source = broken
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _get(url)
        time.sleep(LIVE_EVERY_S * 1.5)
        second = _get(url)
    assert _counts(first, "profiled_range_duration_seconds_count") == {"r": 1} and first == second
    said = [str(w.message) for w in caught if w.category is ExporterWarning]
    assert len(said) == 1 and "histograms unreadable" in said[0] and "goes on" in said[0]
    assert exporter.port is not None  # still served
