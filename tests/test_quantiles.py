"""Quantiles you can quote (issue 30 item 3): the metrics' p50/p90/p99 against the exact
quantiles of 100k seeded random durations of several shapes, recorded through the real
recording path (``metrics.record``, which the decorator inlines), and as read back from each
export: the JSON-lines record and ``summarize`` of it (a real program and the real command),
the Prometheus page, and OTLP decoded by a real receiver. The power-of-two buckets before
this put them within a factor of two (a step p50 of ``134.218ms`` = 2**27 ns)."""

from __future__ import annotations

import json
import math
import random

import pytest

from instrument.base.report import RangeHistogram
from instrument.runtime import metrics
from tests import _proc

N = 100_000
QS = (0.5, 0.9, 0.99)
WITHIN = 0.05  # the issue's bound; the buckets' own is 1/32 (metrics.QUANTILE_ERROR)


def _lognormal(rng: random.Random) -> float:
    return rng.lognormvariate(math.log(2e6), 1.0)  # around 2 ms, spread over decades


def _uniform(rng: random.Random) -> float:
    return rng.uniform(1e5, 3e8)  # 0.1 .. 300 ms


def _bimodal(rng: random.Random) -> float:  # a fast path (70%) and a slow one
    return abs(rng.gauss(5e6, 5e5)) if rng.random() < 0.7 else abs(rng.gauss(1.2e8, 1e7))


def _exponential(rng: random.Random) -> float:
    return rng.expovariate(1 / 2e7)  # mean 20 ms; a few under a microsecond


def _steps(rng: random.Random) -> float:  # the case: steps of 100-200 ms
    return rng.uniform(1.0e8, 2.0e8)


SHAPES = {
    "lognormal": _lognormal,
    "uniform": _uniform,
    "bimodal": _bimodal,
    "exponential": _exponential,
    "steps": _steps,
}


def _exact(durations: list[float], q: float) -> float:
    """The order statistic the histogram's rank ``q * n`` falls on."""
    ordered = sorted(durations)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def _recorded(name: str, seed: int) -> tuple[RangeHistogram, list[float]]:
    rng = random.Random(seed)
    durations = [SHAPES[name](rng) for _ in range(N)]
    metrics.reset()
    try:
        rec = metrics.recorder
        for ns in durations:
            metrics.record(rec, name, ns)
        (h,) = metrics.snapshot().ranges
    finally:
        metrics.reset()
    return h, durations


@pytest.fixture(scope="module")
def recorded() -> dict[str, tuple[RangeHistogram, list[float]]]:
    return {name: _recorded(name, seed) for seed, name in enumerate(SHAPES)}


def _off(estimate: float, exact: float) -> float:
    return abs(estimate - exact) / exact


@pytest.mark.parametrize("name", list(SHAPES))
def test_quantiles_of_100k_durations_are_within_5_percent(recorded, name):
    h, durations = recorded[name]
    assert h.count == N and (h.min_ns, h.max_ns) == (round(min(durations)), round(max(durations)))
    for q in QS:
        exact = _exact(durations, q)
        assert _off(h.quantile(q), exact) < WITHIN, (name, q, h.quantile(q), exact)


def test_the_bound_stated_is_the_one_that_holds(recorded):
    """Not just under 5%: under the bound the records state (1/32, the widest bucket's
    width over its lower bound), at every percentile, for every shape."""
    bound = metrics.QUANTILE_ERROR
    assert bound == 1 / 32
    worst = 0.0
    for h, durations in recorded.values():
        ordered = sorted(durations)
        for q in [i / 100 for i in range(1, 100)] + [0.999]:
            exact = ordered[max(math.ceil(q * N) - 1, 0)]
            if exact >= metrics.BOUNDS_NS[0]:  # (below the first bound: clamped only)
                worst = max(worst, _off(h.quantile(q), exact))
    assert 0 < worst <= bound + 1e-6  # float32 keeps 24 bits: a bound's neighbour may cross


def test_the_json_record_and_summarize_print_the_accurate_step_quantiles(tmp_path):
    """A real program records 20k step durations of 100-200 ms through the metrics and the
    json exporter writes its record at exit; ``torch-profiled summarize`` of that file (a real
    command) prints p50 and p99 within 5% of the exact ones (was: 134.218ms = 2**27 ns)."""
    program = tmp_path / "prog.py"
    program.write_text(
        "import random, sys\n"
        "from instrument import profiled; from instrument.runtime import metrics\n"
        "@profiled('train_step', step=True)\n"
        "def train_step():\n"
        "    return 1\n"
        "train_step()  # the SDK starts; its own call is one more\n"
        "rng = random.Random(11)\n"
        "for _ in range(20000):\n"
        "    metrics.record(metrics.recorder, 'train_step', rng.uniform(1e8, 2e8), True)\n"
        "print('done')\n"
    )
    out = tmp_path / "m.jsonl"
    env = _proc.sdk_env(PROFILED_EXPORTERS="json", PROFILED_JSON_PATH=str(out))
    done = _proc.run(str(program), env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr[-3000:]
    rng = random.Random(11)
    durations = [rng.uniform(1e8, 2e8) for _ in range(20000)]
    record = [json.loads(x) for x in out.read_text().splitlines() if "metrics/1" in x][-1]
    assert record["quantile_max_error"] == 1 / 32
    step = record["steps"]
    assert step["count"] == 20001
    for key, q in (("p50_s", 0.5), ("p90_s", 0.9), ("p99_s", 0.99)):
        assert _off(step[key] * 1e9, _exact(durations, q)) < WITHIN, (key, step[key])

    table = _proc.run("-m", "instrument", "summarize", str(out), cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    p50_ms = _exact(durations, 0.5) / 1e6
    row = next(line for line in table.stdout.splitlines() if line.split()[:1] == ["0"])
    printed = [float(f[:-2]) for f in row.split() if f.endswith("ms")]
    assert printed and _off(printed[0], p50_ms) < WITHIN, (row, p50_ms)


def _prometheus_quantile(page: str, q: float) -> float:
    """Prometheus's ``histogram_quantile`` (promql/quantile.go, classic buckets) over the
    page's one ``profiled_range_duration_seconds`` series, in ns."""
    buckets = []
    for line in page.splitlines():
        if line.startswith("profiled_range_duration_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((math.inf if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank:
            if upper == math.inf:
                return lower * 1e9
            return (lower + (upper - lower) * (rank - below) / (cumulative - below)) * 1e9
        lower, below = upper, cumulative
    raise AssertionError("no bucket reaches the rank")


def test_the_prometheus_buckets_keep_the_accuracy_in_a_sane_page(recorded):
    from exporters.prometheus import exposition

    for name, (h, durations) in recorded.items():
        report = metrics.snapshot()  # (empty: only its who-and-when)
        page = exposition(
            type(report)(**{**report.__dict__, "ranges": (h,), "bounds_ns": metrics.BOUNDS_NS})
        )
        lines = [ln for ln in page.splitlines() if ln.startswith("profiled_range_duration")]
        # the first bound, the span the durations cover, +Inf, sum, count: not all 866
        spanned = math.log2(max(durations) / max(min(durations), metrics.BOUNDS_NS[0]))
        assert len(lines) <= 32 * (spanned + 2) + 4, (name, len(lines))
        for q in QS:
            exact = _exact(durations, q)
            assert _off(_prometheus_quantile(page, q), exact) < WITHIN, (name, q)


def test_the_otlp_points_decode_at_the_new_resolution(recorded):
    """The OTel export through the real OTLP/HTTP exporter to a real receiver: the decoded
    explicit buckets give the same quantiles (within 5% of exact)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.resources import Resource

    from exporters.otel_metrics import RANGE_DURATION, metrics_data
    from tests.otlp_receiver import HttpReceiver, Received, attributes

    report = metrics.snapshot()
    ranges = tuple(h for h, _ in recorded.values())
    report = type(report)(**{**report.__dict__, "ranges": ranges, "bounds_ns": metrics.BOUNDS_NS})
    received = Received()
    server = HttpReceiver(received)
    server.start()
    try:
        exporter = OTLPMetricExporter(endpoint=f"{server.endpoint}/v1/metrics", timeout=10)
        exporter.export(metrics_data(report, Resource.create({}), "test", "1"))
        assert received.wait(lambda r: RANGE_DURATION in r.metrics())
        (metric,) = received.metrics()[RANGE_DURATION]
    finally:
        server.stop()
    points = {
        attributes(p.attributes)["profiled.range.name"]: p for p in metric.histogram.data_points
    }
    assert set(points) == set(SHAPES)
    for name, (h, durations) in recorded.items():
        p = points[name]
        bounds = tuple(round(b * 1e9) for b in p.explicit_bounds)
        assert bounds[0] == metrics.BOUNDS_NS[0] and set(bounds) <= set(metrics.BOUNDS_NS)
        assert len(p.bucket_counts) == len(bounds) + 1 < metrics.BUCKETS
        assert sum(p.bucket_counts) == p.count == N
        decoded = RangeHistogram(
            name, p.count, round(p.sum * 1e9), round(p.min * 1e9), round(p.max * 1e9),
            tuple(p.bucket_counts), bounds,
        )  # fmt: skip
        for q in QS:
            assert _off(decoded.quantile(q), _exact(durations, q)) < WITHIN, (name, q)
            assert decoded.quantile(q) == pytest.approx(h.quantile(q), rel=1e-6)
