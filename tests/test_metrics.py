"""Always-on metrics (issue 17): every decorated call's wall time in a per-range histogram,
exported as ``torch-profiled/metrics/1`` records by the json exporter. Real programs in
subprocesses; the histogram arithmetic on known durations."""

from __future__ import annotations

import bisect
import dataclasses
import json
import threading

import pytest

from instrument.base.report import RangeHistogram
from instrument.runtime import metrics
from instrument.testing import process_status
from tests import _proc
from tests._records import metrics_records, window_records

# the batch fold fed its edge cases directly (durations at float32 bucket edges, NaN, past
# float32, batches shaped to each of its ways of splitting): through decorated calls each would
# need the decorator's private clock scripted, batch by batch
fold = metrics._fold

# ---------------------------------------------------------------- the histograms themselves


@pytest.fixture
def fresh_metrics():
    metrics.reset()
    yield
    metrics.reset()


def _bucket_of(ns: float) -> int:
    """The bucket a duration belongs in, by the bounds (bisect), not by the fold's arithmetic."""
    return bisect.bisect_right(metrics.BOUNDS_NS, ns)


def test_durations_land_in_their_sub_bucket_of_a_power_of_two(fresh_metrics):
    rec = metrics.recorder
    durations = (500, 1500, 1500, 3000, 10**9, 200 * 10**9, 1024, 1055, 1056, 2**30 - 2**24)
    for ns in durations:
        metrics.record(rec, "r", ns)
    (h,) = metrics.snapshot().ranges
    assert (h.name, h.count, h.sum_ns) == ("r", len(durations), sum(durations))
    assert (h.min_ns, h.max_ns) == (500, 200 * 10**9)
    bounds = metrics.BOUNDS_NS
    # a report's histogram is compact (the first bound, then its span of non-empty buckets)
    assert len(h.bucket_counts) == len(h.bounds_ns) + 1 <= metrics.BUCKETS  # (spans them all)
    assert len(bounds) + 1 == metrics.BUCKETS == 27 * 32 + 2
    assert bounds[0] == 1024 and bounds[-1] == 2**37  # 1.02 us .. 137 s
    assert bounds[1] == 1056 and bounds[32] == 2048 and bounds[33] == 2112  # 32 a power of two
    assert max((b - a) / a for a, b in zip(bounds, bounds[1:])) == metrics.QUANTILE_ERROR
    counts = dict(enumerate(metrics.full_counts(h)))
    assert counts[0] == 1  # 500 ns: under the first bound
    assert counts[1] == 2  # 1024 and 1055 ns: [1024, 1056)
    assert counts[2] == 1  # 1056 ns: [1056, 1088)
    assert counts[_bucket_of(1500)] == 2 and bounds[_bucket_of(1500) - 1] == 1472  # [1472, 1504)
    assert counts[_bucket_of(3000)] == 1 and bounds[_bucket_of(3000) - 1] == 2944
    assert counts[bounds.index(2**30)] == 1  # just under 1.07 s: the last of [2**29, 2**30)
    assert counts[bounds.index(2**30) + 1] == 0  # 1 s: [2**29 + 2**24 * 29, ...)
    assert counts[_bucket_of(10**9)] == 1
    assert counts[len(bounds)] == 1  # 200 s: past the last bound
    assert sum(h.bucket_counts) == sum(counts.values()) == len(durations)


def test_quantiles_stay_within_the_bucket_and_the_exact_extremes(fresh_metrics):
    rec = metrics.recorder
    for _ in range(98):
        metrics.record(rec, "q", 10_000)  # [9984, 10240)
    metrics.record(rec, "q", 5_000_000)
    metrics.record(rec, "q", 6_000_000)
    (h,) = metrics.snapshot().ranges
    assert 10_000 <= h.quantile(0.5) <= 10_240  # clamped to the min from below
    assert h.quantile(0.0) == 10_000
    assert 4_980_736 <= h.quantile(0.99) <= 6_000_000
    assert h.quantile(1.0) == 6_000_000
    empty = RangeHistogram("e", 0, 0, 0, 0, (0,) * metrics.BUCKETS, metrics.BOUNDS_NS)
    assert empty.quantile(0.5) == 0.0


def test_the_sync_wrappers_inline_update_is_metrics_record(fresh_metrics, monkeypatch):
    """The metrics-only path of a decorated function inlines ``metrics.record``: same buckets,
    sum, min and max for the same durations (the clock is scripted, the update is real)."""
    import instrument
    from instrument import Schedule, profiled
    from instrument.runtime import decorator, state

    instrument.configure(  # a one-window schedule run to its end: no session needs calls
        schedule=Schedule(wait=0, warmup=1, active=1, repeat=1), exporters=[], activities=("cpu",)
    )
    warm = profiled("warm")(lambda: None)
    for _ in range(4):
        warm()
    assert process_status().calls_idle
    # more than a batch: the wrapper folds once itself, the snapshot folds the rest
    durations = [1500, 500, 3000, 1500, 10**9, 700] * (metrics.BATCH // 6 + 2)
    ticks = iter([t for d in durations for t in (1000.0, 1000.0 + d / 1e9)])
    monkeypatch.setattr(decorator, "_now", lambda: next(ticks))
    inline = profiled("inline")(lambda: None)
    state.set_metrics(True)
    try:
        assert process_status().calls_metrics_only  # the inline path is the one taken
        for _ in durations:
            inline()
    finally:
        state.set_metrics(False)
    for ns in durations:
        metrics.record(metrics.recorder, "record", ((1000.0 + ns / 1e9) - 1000.0) * 1e9)
    a, b = metrics.snapshot().ranges
    assert (a.name, b.name) == ("inline", "record")
    assert (a.count, a.sum_ns, a.min_ns, a.max_ns) == (len(durations), sum(durations), 500, 10**9)
    assert dataclasses.replace(a, name="record") == b


def test_a_step_functions_calls_on_the_metrics_only_path_are_steps_too(fresh_metrics, monkeypatch):
    """A ``step=True`` function on the metrics-only path adds each call to its range and to
    the step histogram, exactly (scripted clock, more than a batch of calls)."""
    import instrument
    from instrument import Schedule, profiled
    from instrument.runtime import decorator, state

    instrument.configure(
        schedule=Schedule(wait=0, warmup=1, active=1, repeat=1), exporters=[], activities=("cpu",)
    )
    warm = profiled("warm")(lambda: None)
    for _ in range(4):
        warm()
    durations = [2500, 40_000, 900, 7_000_000] * (metrics.BATCH // 4 + 3)
    ticks = iter([t for d in durations for t in (5.0, 5.0 + d / 1e9)])
    monkeypatch.setattr(decorator, "_now", lambda: next(ticks))
    step = profiled("train_step", step=True)(lambda: None)
    state.set_metrics(True)
    try:
        assert process_status().calls_metrics_only
        for _ in durations:
            step()
    finally:
        state.set_metrics(False)
    snap = metrics.snapshot()
    (h,) = [r for r in snap.ranges if r.name == "train_step"]
    assert (h.count, h.sum_ns, h.min_ns, h.max_ns) == (
        len(durations),
        sum(durations),
        900,
        7_000_000,
    )
    assert snap.steps is not None
    assert dataclasses.replace(snap.steps, name="train_step") == h


def test_a_profiler_the_program_starts_takes_calls_off_the_metrics_only_path(fresh_metrics):
    """The metrics-only path checks no profiler flag: any torch profiler's start clears
    ``_COUNT_ONLY``. Calls made while the program's own profiler records are ranges there and
    still counted; after its stop they take the path again."""
    import torch

    import instrument
    from instrument import Schedule, profiled
    from instrument.runtime import state

    instrument.configure(
        schedule=Schedule(wait=0, warmup=1, active=1, repeat=1), exporters=[], activities=("cpu",)
    )
    warm = profiled("warm")(lambda: None)
    for _ in range(4):
        warm()
    inside = profiled("inside")(lambda x: x + 1)
    profilers = [
        lambda: torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]),
        lambda: torch.autograd.profiler.profile(),
    ]
    state.set_metrics(True)
    try:
        for make in profilers:
            assert process_status().calls_metrics_only
            with make() as prof:
                assert not process_status().calls_metrics_only
                for _ in range(3):
                    inside(1)
            assert process_status().calls_metrics_only
            events = prof.events() if hasattr(prof, "events") else prof.function_events
            assert [e.name for e in events].count("inside") == 3
        inside(1)
    finally:
        state.set_metrics(False)
    (h,) = [r for r in metrics.snapshot().ranges if r.name == "inside"]
    assert h.count == 7


def test_batches_fold_into_what_the_buckets_are_defined_to_hold(fresh_metrics):
    """Whatever the batches (sizes, order, outliers, 0, a bucket's edges, past the last
    bucket, spans of one power of two to 50), the histogram holds per bucket ``i`` the
    durations ``d`` with ``BOUNDS_NS[i-1] <= d < BOUNDS_NS[i]`` once rounded to float32 (the
    first: all shorter, the last: all longer), their sum and the exact min and max, as
    documented in ``instrument.runtime.metrics``."""
    import math
    import random
    import struct
    from collections import Counter

    def as_float32(d: float) -> float:
        return struct.unpack("<f", struct.pack("<f", d))[0]

    rng = random.Random(7)
    edges = [0, 0.4, 1, 255, 255.9, 256, 1023.9, 1024, 1055.99, 1056, 2**30 - 1, 2**30]
    edges += [2**37 - 1, 2**37, 2**62, 2**63, 1e6, 1e6 + 31.25, 1e6 + 31.26]
    for _ in range(150):
        folded: dict = {}
        durations: list[float] = []
        for _batch in range(rng.randint(1, 6)):
            top = rng.choice((12, 20, 30, 50))  # a batch spans 1 to 40 powers of two
            batch = [
                float(rng.choice(edges + [rng.randint(2**11, 2 ** rng.randint(12, top))] * 4))
                for _ in range(rng.choice((1, 40, metrics.BATCH)))
            ]
            fold(folded, "x", batch[:])
            durations += batch
        shard = folded["x"]
        expected = Counter(bisect.bisect_right(metrics.BOUNDS_NS, as_float32(d)) for d in durations)
        assert {b: c for b, c in enumerate(metrics.dense(shard)[: metrics.SUM]) if c} == dict(
            expected
        )
        assert math.isclose(shard[metrics.SUM], sum(durations), rel_tol=1e-12)
        assert (shard[metrics.MIN], shard[metrics.MAX]) == (min(durations), max(durations))
    assert int(as_float32(2**30 - 1)).bit_length() == 31  # the rounding the rule allows
    up = math.nextafter(300.0, math.inf)  # one float32 with 300.0: only the exact scan tells
    pairs = [(300.0, 400.0), (400.0, 300.0), (300.0, 300.5), (300.0, up), (up, 300.0)]
    for first, second in pairs:  # one bucket
        folded = {}
        fold(folded, "x", [first])
        fold(folded, "x", [second, 5000.0])  # max of the batch: another bucket
        fold(folded, "x", [second, 3.0])  # min of the batch: another bucket
        fold(folded, "x", [second])
        assert folded["x"][metrics.MIN] == 3.0 and folded["x"][metrics.MAX] == 5000.0
        folded = {}
        fold(folded, "x", [first])
        fold(folded, "x", [second])  # the extremes' bucket: both scanned
        assert (folded["x"][metrics.MIN], folded["x"][metrics.MAX]) == (
            min(first, second),
            max(first, second),
        )


def test_full_batches_of_the_shapes_ranges_have_fold_exactly(fresh_metrics):
    """Batches of ``BATCH`` durations of the shapes a range's calls take, each through the
    fold's own way of splitting powers of two (the key's low byte as it is, one count per
    key or a ``Counter``; bands of fields where two fields 8 apart share that byte): every
    bucket holds what the bounds say it does."""
    import random
    import struct
    from collections import Counter

    def as_float32(d: float) -> float:
        return struct.unpack("<f", struct.pack("<f", d))[0]

    rng = random.Random(3)
    shapes = {
        "within 10%": lambda: rng.uniform(11e6, 13e6),  # one field, a few keys
        "log-normal": lambda: rng.lognormvariate(16, 0.3),  # a few fields: a Counter
        "hit or miss": lambda: rng.choice((rng.uniform(4e3, 6e3), rng.uniform(4e6, 6e6))),
        "under 1 us, one late": lambda: rng.uniform(150, 400) if rng.random() > 1e-3 else 5e6,
        "every decade": lambda: 10 ** rng.uniform(2, 12),  # bands of fields
    }
    for name, draw in shapes.items():
        folded: dict = {}
        durations = [draw() for _ in range(3 * metrics.BATCH)]
        durations[1500] = 5e6  # (one late call for certain)
        for i in range(0, len(durations), metrics.BATCH):
            fold(folded, name, durations[i : i + metrics.BATCH])
        expected = Counter(bisect.bisect_right(metrics.BOUNDS_NS, as_float32(d)) for d in durations)
        got = {b: c for b, c in enumerate(metrics.dense(folded[name])[: metrics.SUM]) if c}
        assert got == dict(expected), name


def test_the_device_times_update_is_the_fold_of_one_duration(fresh_metrics):
    one: dict = {}
    metrics.add(one, "y", 3000.0)
    assert one["y"][bisect.bisect_right(metrics.BOUNDS_NS, 3000)] == 1
    assert sum(metrics.dense(one["y"])[: metrics.SUM]) == 1
    assert one["y"][metrics.SUM] == one["y"][metrics.MIN] == one["y"][metrics.MAX] == 3000.0


def test_a_duration_past_float32_or_not_a_number_is_counted_not_raised(fresh_metrics):
    """No clock gives them; if one came, the fold (inside a user's call) must not raise."""
    folded: dict = {}
    fold(folded, "z", [1e39, float("nan"), float("inf"), 2.0**70, 5000.0])
    fold(folded, "z", [float("nan")])
    shard = folded["z"]
    assert (
        sum(metrics.dense(shard)[: metrics.SUM]) == 6 and shard[metrics.SUM - 1] == 3
    )  # past 2**62 ns
    assert shard[0] == 2 and shard[bisect.bisect_right(metrics.BOUNDS_NS, 5000)] == 1  # NaN: 0
    assert shard[metrics.MAX] == 2.0**64 and shard[metrics.MIN] == 0.0
    assert shard[metrics.SUM] == 3 * 2.0**64 + 5000.0  # a number still
    fold(folded, "z", [-7.0, 6.0])  # negative: counted by its size, the exact extremes
    assert shard[metrics.MIN] == -7.0 and sum(metrics.dense(shard)[: metrics.SUM]) == 8


def test_threads_count_exactly_while_snapshots_fold_and_memory_stays_bounded(fresh_metrics):
    """8 threads x 2000 calls into one range while another thread takes snapshots (each folds
    what is pending, racing the appends): nothing is lost or counted twice, and no range ever
    holds more than a batch of pending durations."""
    stop = threading.Event()
    longest = []

    def work():
        rec = metrics.recorder
        for i in range(2000):
            metrics.record(rec, "t", 1000 + i)

    def snapshots():
        while not stop.is_set():
            metrics.snapshot()
            longest.append(max(map(len, list(metrics.recorder.pending.values())), default=0))

    watcher = threading.Thread(target=snapshots)
    watcher.start()
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    (h,) = metrics.snapshot().ranges
    assert (h.name, h.count) == ("t", 16000)
    assert h.sum_ns == 8 * sum(range(1000, 3000))
    assert (h.min_ns, h.max_ns) == (1000, 2999)
    assert longest and max(longest) <= metrics.BATCH


# ---------------------------------------------------------------- real programs

PROGRAM = r"""
import os, sys, threading, time, torch
from instrument import profiled

@profiled("work")
def work(x):
    return x + 1

@profiled("train_step", step=True)
def train_step(x):
    with profiled("data"):
        pass
    return work(x)

x = torch.zeros(4)
for _ in range(300):
    train_step(x)

def thread_work():
    for _ in range(2000):
        work(x)

threads = [threading.Thread(target=thread_work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
print("done")
"""


SAYS_SWITCH = PROGRAM + (
    "from instrument.runtime import state\nprint('metrics on:', state.metrics_on)\nprint('done')\n"
)

FORKED = (
    PROGRAM
    + r"""
from instrument.runtime import metrics
pid = os.fork()
if pid == 0:
    work(x)
    counts = {h.name: h.count for h in metrics.snapshot().ranges}
    os.write(1, ("child counts %s\n" % counts).encode())
    os._exit(0)
os.waitpid(pid, 0)
print("done")
"""
)


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """This module's programs, each its own process as before, run two at a time as the
    programs' tests start; a test reads its own (``_run``)."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:

        def add(key, env, *argv, program=PROGRAM, json=True):
            def child_env(cwd):
                full = {"PROFILED_EXPORTERS": "json", "PROFILED_JSON_PATH": str(cwd / "r.jsonl")}
                return _proc.sdk_env({**(full if json else {}), **env})

            ahead.add(key, "prog.py", *argv, env=child_env, files={"prog.py": program},
                      timeout=180)  # fmt: skip

        add(
            "test_the_json_exporter_gets_exact_counts_for_every_call",
            {"PROFILED_METRICS_INTERVAL_S": "0.2"},
            "0.7",
        )
        key = "test_metrics_can_be_switched_off_and_are_off_without_a_metrics_exporter"
        add(key + "#0", {"PROFILED_METRICS": "0"})
        add(key + "#1", {"PROFILED_EXPORTERS": "console"}, program=SAYS_SWITCH)
        add("test_a_forked_child_starts_empty_and_exports_nothing", {}, program=FORKED)
        add(
            "test_a_child_forked_while_the_flags_were_being_written_does_not_hang",
            {},
            program=FLAGS_FORK,
            json=False,
        )
        add("test_module_ranges_only_when_asked#0", {}, program=MODULES)
        add("test_module_ranges_only_when_asked#1", {"PROFILED_METRICS_MODULES": "1"},
            program=MODULES)  # fmt: skip
        add(
            "test_memory_stays_flat_over_200k_calls",
            {"PROFILED_SCHEDULE": "wait=1000000"},
            program=TINY_CALLS,
        )
        add(
            "test_an_exporter_failing_in_export_metrics_costs_a_warning_only",
            {},
            program=BROKEN_EXPORTER,
        )
        add("test_the_records_are_json_with_the_documented_keys", {})
        add("test_async_functions_and_generators_are_counted_too", {},
            program=ASYNC_AND_GENERATORS)  # fmt: skip
        add(
            "test_device_sampling_on_a_machine_without_cuda_changes_nothing",
            {"PROFILED_METRICS_DEVICE_EVERY": "1"},
        )
        add(
            "test_switching_metrics_on_and_off_under_running_calls_never_breaks_them",
            {},
            program=TOGGLE_PROGRAM,
            json=False,
        )
        yield ahead


def _run(ahead, key, done=True):
    """The program run under ``key`` (a test's name): its result, and what it wrote to its
    JSON lines file; it ended normally, its last line ``done``."""
    out, cwd = ahead[key]
    assert out.returncode == 0, out.stderr[-3000:]
    if done:
        assert out.stdout.splitlines()[-1] == "done"
    path = cwd / "r.jsonl"
    return out, (path.read_text() if path.exists() else "")


def test_the_json_exporter_gets_exact_counts_for_every_call(ahead, request):
    out, text = _run(ahead, request.node.name)  # metrics every 0.2 s, 0.7 s asleep at the end
    records = metrics_records(text)
    assert len(records) >= 3, text[-2000:]  # a few periodic ones, then the last at exit
    last = records[-1]
    assert last["schema"] == "torch-profiled/metrics/1"
    ranges = last["ranges"]
    # every call, inside the window or not: 300 steps + 8 threads x 2000 calls
    assert ranges["work"]["count"] == 300 + 8 * 2000
    assert ranges["train_step"]["count"] == 300
    assert ranges["data"]["count"] == 300
    # the step histogram leaves out the steps whose call started or stopped the window's
    # profiler (the default window: its first and last recorded steps), their time is torch's
    assert last["steps"]["count"] == 300 - 2
    for r in ranges.values():
        assert 0 < r["min_s"] <= r["p50_s"] <= r["p90_s"] <= r["p99_s"] <= r["max_s"]
        assert r["sum_s"] >= r["count"] * r["min_s"]
    assert last["pid"] > 0 and last["rank"] == 0 and last["world_size"] == 1 and last["host"]
    # cumulative: counts never go down from one record to the next
    works = [r["ranges"].get("work", {"count": 0})["count"] for r in records]
    assert works == sorted(works)
    assert window_records(text), "the window report is still written beside them"


def test_metrics_can_be_switched_off_and_are_off_without_a_metrics_exporter(ahead, request):
    _out, text = _run(ahead, request.node.name + "#0")  # PROFILED_METRICS=0
    assert metrics_records(text) == [] and window_records(text)
    out, _text = _run(ahead, request.node.name + "#1")  # SAYS_SWITCH, the console only
    assert "metrics on: False" in out.stdout


def test_a_forked_child_starts_empty_and_exports_nothing(ahead, request):
    out, text = _run(ahead, request.node.name)  # FORKED
    # none of the parent's counts; and nothing of its own (a forked child exports nothing)
    assert "child counts {}" in out.stdout
    records = metrics_records(text)
    assert {r["pid"] for r in records} == {records[-1]["pid"]}  # the parent's only
    assert records[-1]["ranges"]["work"]["count"] == 300 + 8 * 2000


FLAGS_FORK = r"""
import os, threading, time, torch
from instrument import profiled; from instrument.runtime import state

f = profiled("f")(lambda x: x + 1)
held, release = threading.Event(), threading.Event()

def hold():
    with state.mirror_lock:
        held.set()
        release.wait()

t = threading.Thread(target=hold)
t.start()
held.wait()
pid = os.fork()
if pid == 0:
    state.set_metrics(True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        f(1)
    state.set_metrics(False)
    f(1)
    os.write(1, b"child done\n")
    os._exit(0)
release.set()
t.join()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child exit", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    print("child hung")
"""


def test_a_child_forked_while_the_flags_were_being_written_does_not_hang(ahead, request):
    """A thread of the parent holds the lock the decorator's flags are written under when
    another forks (a DataLoader starting its workers while a profiler starts): the child gets
    a new lock, and its profiler starts, metrics switches and decorated calls go on."""
    out, _text = _run(ahead, request.node.name, done=False)  # FLAGS_FORK
    assert "child done" in out.stdout and "child exit 0" in out.stdout, out.stdout


MODULES = r"""
import torch
from instrument import instrument_module, profiled
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
instrument_module(model, depth=2)

@profiled("fwd")
def fwd(x):
    return model(x)

for _ in range(50):
    fwd(torch.zeros(2, 4))
print("done")
"""


def test_module_ranges_only_when_asked(ahead, request):
    _out, text = _run(ahead, request.node.name + "#0")  # MODULES
    assert set(metrics_records(text)[-1]["ranges"]) == {"fwd"}
    _out, text = _run(ahead, request.node.name + "#1")  # and PROFILED_METRICS_MODULES=1
    ranges = metrics_records(text)[-1]["ranges"]
    assert ranges["fwd"]["count"] == 50
    assert {k: v["count"] for k, v in ranges.items() if k != "fwd"} == {
        "Sequential": 50,
        "0": 50,
        "1": 50,
    }


TINY_CALLS = r"""
import resource, torch
from instrument import profiled

@profiled("tiny")
def tiny():
    return None

def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024

for _ in range(20_000):
    tiny()
before = rss_kb()
for _ in range(200_000):
    tiny()
print("grew_kb", rss_kb() - before)
print("done")
"""


def test_memory_stays_flat_over_200k_calls(ahead, request):
    out, text = _run(ahead, request.node.name)  # TINY_CALLS, no window
    grew = int(out.stdout.split("grew_kb")[1].split()[0])
    assert grew < 2048, out.stdout  # no memory per call: a few pages of noise at most
    assert metrics_records(text)[-1]["ranges"]["tiny"]["count"] == 220_000


BROKEN_EXPORTER = r"""
import instrument, warnings
from exporters import Exporter, ExportResult
from instrument import profiled

class Broken(Exporter):
    def export(self, report):
        return ExportResult.SUCCESS
    def export_metrics(self, report):
        raise RuntimeError("backend down")

instrument.configure(exporters=[Broken()])

@profiled("f")
def f():
    return 1

assert sum(f() for _ in range(10)) == 10
instrument.shutdown()
print("done")
"""


def test_an_exporter_failing_in_export_metrics_costs_a_warning_only(ahead, request):
    out, _text = _run(ahead, request.node.name)  # BROKEN_EXPORTER
    assert "raised RuntimeError" in out.stderr and "export_metrics()" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_records_are_json_with_the_documented_keys(ahead, request):
    _out, text = _run(ahead, request.node.name)
    last = metrics_records(text)[-1]  # the one made at exit
    assert json.loads(json.dumps(last)) == last
    assert set(last) == {
        "schema",
        "time_ns",
        "since_ns",
        "rank",
        "world_size",
        "host",
        "pid",
        "quantile_max_error",
        "ranges",
        "steps",
        "device_ranges",
    }
    assert last["quantile_max_error"] == metrics.QUANTILE_ERROR == 1 / 32  # the bound, stated
    assert set(last["ranges"]["work"]) == {
        "count",
        "sum_s",
        "min_s",
        "p50_s",
        "p90_s",
        "p99_s",
        "max_s",
    }


ASYNC_AND_GENERATORS = r"""
import asyncio
from instrument import profiled

@profiled("fetch")
async def fetch(i):
    await asyncio.sleep(0)
    return i

@profiled("rows")
def rows():
    yield 1
    yield 2

async def main():
    return sum(await asyncio.gather(*(fetch(i) for i in range(100))))

assert asyncio.run(main()) == 4950
assert [r for _ in range(10) for r in rows()] == [1, 2] * 10
print("done")
"""


def test_async_functions_and_generators_are_counted_too(ahead, request):
    _out, text = _run(ahead, request.node.name)  # ASYNC_AND_GENERATORS
    ranges = metrics_records(text)[-1]["ranges"]
    assert ranges["fetch"]["count"] == 100  # one per call, covering the awaited time
    assert ranges["rows"]["count"] == 30  # one per resume: 2 items + the finishing resume


def test_device_sampling_on_a_machine_without_cuda_changes_nothing(ahead, request):
    """PROFILED_METRICS_DEVICE_EVERY=1 where CUDA is not in use: every call still counted
    exactly, no device histograms, nothing said on stderr."""
    out, text = _run(ahead, request.node.name)  # PROFILED_METRICS_DEVICE_EVERY=1
    last = metrics_records(text)[-1]
    assert last["ranges"]["work"]["count"] == 300 + 8 * 2000
    assert last["device_ranges"] == {}
    assert "Warning" not in out.stderr, out.stderr[-2000:]


TOGGLE_PROGRAM = r"""
import sys, threading
import instrument
from exporters import InMemoryExporter
from instrument import Schedule, profiled; from instrument.runtime import state

# a session that counts every step and never opens a window: calls take the general path
instrument.configure(schedule=Schedule(skip_first=10**9), exporters=[InMemoryExporter()])
sys.setswitchinterval(1e-6)  # thread switches between any two bytecodes, as often as can be

@profiled("sync")
def work(x):
    return x + 1

@profiled("step", step=True)
def train(x):
    return work(x)

errors = []

def calls():
    try:
        for i in range(20000):
            train(i)
            with profiled("ctx"):
                work(i)
    except BaseException as exc:
        errors.append(repr(exc))

def toggle(callers):
    i = 0
    while any(t.is_alive() for t in callers):
        state.set_metrics(i % 2 == 0, device_every=1)
        i += 1
    state.set_metrics(False)
    print("toggles", i)

callers = [threading.Thread(target=calls) for _ in range(3)]
toggler = threading.Thread(target=toggle, args=(callers,))
for t in callers + [toggler]:
    t.start()
for t in callers + [toggler]:
    t.join()
print("errors", errors)
"""


def test_switching_metrics_on_and_off_under_running_calls_never_breaks_them(ahead, request):
    """Another thread turns metrics on and off for as long as three threads call decorated
    functions (sync, step, context form): no call raises (each reads the switch once)."""
    out, _text = _run(ahead, request.node.name, done=False)  # TOGGLE_PROGRAM
    assert out.stdout.strip().splitlines()[-1] == "errors []", out.stdout[-3000:]
    assert int(out.stdout.split("toggles ")[1].split()[0]) > 100  # it did run alongside


def test_with_metrics_on_a_decorated_call_still_compiles_fullgraph(fresh_metrics):
    """The metrics-only path checks Dynamo before timing: inside torch.compile(fullgraph=True)
    the call compiles (no graph break on the clock) and is not counted; eager calls are."""
    import torch

    import instrument
    from instrument import Schedule, profiled
    from instrument.runtime import state

    instrument.configure(
        schedule=Schedule(wait=0, warmup=1, active=1, repeat=1), exporters=[], activities=("cpu",)
    )
    inner = profiled("inner")(lambda x: x * 2)
    for _ in range(4):
        inner(torch.ones(2))  # the one window's steps: the session is done, calls are quiet
    state.set_metrics(True)
    try:
        assert process_status().calls_metrics_only
        compiled = torch.compile(lambda x: inner(x) + 1, fullgraph=True, backend="eager")
        assert compiled(torch.ones(3)).tolist() == [3.0, 3.0, 3.0]
        inner(torch.ones(2))
    finally:
        state.set_metrics(False)
    assert [(h.name, h.count) for h in metrics.snapshot().ranges] == [("inner", 1)]
