"""Issue 31, item 4: memory per range name bounded, a cap on distinct metric ranges, and no
per-window work that grows with every name ever seen.

Each test runs a real program in a subprocess: names made at run time with f-strings (what
users write: ``with profiled(f"request-{i}")``), in the call forms that reach the metrics.
Bounds stated here: with 10k distinct names a range's histogram and pending durations cost at
most ``PER_NAME_BYTES`` a name (prometheus_client: ~4.3 KB a label value, 43 MB for 10k;
before the fix ~7 KB a name at rest, a dense histogram of 869 numbers, and up to 32 KB more
while its pending durations waited for the next export).
"""

from __future__ import annotations

import json
import os

import pytest

from tests import _proc

PER_NAME_BYTES = 3000  # measured ~0.6-1.5 KB at rest; prometheus_client ~4.3 KB
PENDING_PER_NAME_BYTES = 4000  # a name called 500 times, after the feed's tidy (was 16 KB)

MEMORY = r"""
import gc, json, sys, time, tracemalloc
from instrument import profiled
from instrument.runtime import metrics, state

names, calls, settle = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
with profiled("warm"):  # the ambient session starts, metrics on
    pass
assert state.metrics_on
gc.collect()
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
for i in range(names):
    name = f"request-{i}"
    for _ in range(calls):
        with profiled(name):
            pass
time.sleep(settle)  # the feed's thread tidies what waits
gc.collect()
held = tracemalloc.get_traced_memory()[0] - base
report = metrics.snapshot()  # folds every pending duration: what stays is the histograms
gc.collect()
rest = tracemalloc.get_traced_memory()[0] - base
counted = {h.name: h.count for h in report.ranges}
print(json.dumps({"held": held, "rest": rest, "ranges": len(counted),
                  "other": counted.get("other", 0), "total": sum(counted.values())}))
"""


def _memory_env(cap: int) -> dict[str, str]:
    return _proc.sdk_env(
        {
            "PROFILED_EXPORTERS": "prometheus",  # metrics only: no window opens
            "PROFILED_PROMETHEUS_ADDR": "127.0.0.1:0",
            "PROFILED_METRICS_MAX_RANGES": str(cap),
        }
    )


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """Every program of this module (each its own process, as before), run two at a time as
    the module starts; a test reads its own."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:
        for key, names, calls, settle, cap in (
            ("test_ten_thousand_names_stay_within_the_cap", 10_000, 2, 0.0, 1000),
            (
                "test_a_range_name_costs_a_few_kb_like_a_prometheus_label_value",
                3000,
                5,
                0.0,
                20_000,
            ),
            ("test_pending_durations_are_given_back_between_exports", 50, 500, 1.6, 1000),
        ):
            args = ("memory.py", str(names), str(calls), str(settle))
            ahead.add(key, *args, env=_memory_env(cap), files={"memory.py": MEMORY})
        overflow = {
            "PROFILED_EXPORTERS": "prometheus",
            "PROFILED_PROMETHEUS_ADDR": "127.0.0.1:0",
            "PROFILED_METRICS": "1",
            "PROFILED_METRICS_MAX_RANGES": "50",
        }
        ahead.add(
            "test_names_past_the_cap_are_counted_under_other_with_one_warning",
            "overflow.py",
            env=_proc.sdk_env(overflow),
            files={"overflow.py": OVERFLOW},
        )

        def windows_env(cwd):
            return _proc.sdk_env(
                {
                    "PROFILED_EXPORTERS": "json",
                    "PROFILED_JSON_PATH": str(cwd / "r.jsonl"),
                    "PROFILED_EVERY": "10",
                    "PROFILED_METRICS": "0",
                    "PROFILED_ANALYSIS_PROCESS": "0",
                }
            )

        ahead.add(
            "test_a_window_copies_no_names_when_none_were_added_and_at_most_the_bound",
            "windows.py",
            env=windows_env,
            files={"windows.py": WINDOWS},
            timeout=300,
        )
        yield ahead


def _memory(ahead, request):
    """What MEMORY printed in the test's run (names, calls each, settle seconds, cap)."""
    out, _cwd = ahead[request.node.name]
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1]), out.stderr


def test_ten_thousand_names_stay_within_the_cap(ahead, request):
    """The issue's case: 10k names made with f-strings, the default cap (1000): the names past
    it share one range, `other`, told once; memory is the names themselves (``RANGE_NAMES``,
    ~100 B each) and 1000 histograms (it was 364 MB at up to 1023 calls a name; ~86 MB at 20)."""
    got, err = _memory(ahead, request)  # 10k names, 2 calls each, the cap 1000
    assert got["ranges"] == 1001  # warm + 999 request names + other
    assert got["other"] == (10_000 - 999) * 2 and got["total"] == 10_000 * 2 + 1
    assert got["rest"] < 10_000 * 200 + 1000 * PER_NAME_BYTES, got
    assert err.count("distinct range names reached the metrics") == 1, err[-3000:]


def test_a_range_name_costs_a_few_kb_like_a_prometheus_label_value(ahead, request):
    """3000 names each its own range (the cap above them): at rest (folded, the report that a
    scrape is served from held too) and with 5 calls each pending."""
    got, _ = _memory(ahead, request)  # 3000 names, 5 calls each, the cap 20k
    assert got["ranges"] == 3001 and got["total"] == 3000 * 5 + 1
    assert got["rest"] < 3000 * PER_NAME_BYTES, got
    assert got["held"] < 3000 * PER_NAME_BYTES, got


def test_pending_durations_are_given_back_between_exports(ahead, request):
    """50 names called 500 times each (under ``BATCH``: no call folds them), then the
    program idles: the feed's thread folds them within ``TIDY_S`` (the export is a minute
    away), so a name holds its histogram, not 500 floats (16 KB)."""
    got, _ = _memory(ahead, request)  # 50 names, 500 calls each, then 1.6 s idle
    assert got["total"] == 50 * 500 + 1
    assert got["held"] < 50 * PENDING_PER_NAME_BYTES, got


OVERFLOW = r"""
import asyncio, sys, warnings
warnings.simplefilter("always")
from instrument import profiled
from instrument.runtime import metrics
from exporters.prometheus import exposition

fns = [profiled(f"fn-{i}")(lambda: None) for i in range(60)]  # decorated: admitted at once
for _ in range(40):  # 60 x 40 calls: past the cap, they fold through one shared list
    for f in fns:
        f()
for i in range(100):
    with profiled(f"block-{i}"):
        pass

async def main():
    for i in range(30):
        await profiled(f"task-{i}")(asyncio.sleep)(0)

asyncio.run(main())
report = metrics.snapshot()
counted = {h.name: h.count for h in report.ranges}
page = exposition(report)
print("RANGES", len(counted), "OTHER", counted.get("other"), "TOTAL", sum(counted.values()))
print("SERIES", page.count("profiled_range_duration_seconds_count{"))
print("OTHER_SERIES", page.count('profiled_range_duration_seconds_count{range="other"'))
"""


def test_names_past_the_cap_are_counted_under_other_with_one_warning(ahead, request):
    out, _cwd = ahead[request.node.name]  # OVERFLOW, the cap 50
    assert out.returncode == 0, out.stderr[-3000:]
    words = out.stdout.split()
    got = dict(zip(words[::2], words[1::2]))
    total = 60 * 40 + 100 + 30
    assert got["TOTAL"] == str(total)  # nothing lost
    assert got["RANGES"] == "51"  # 50 names of their own, then `other`
    # the first 50 decorated functions kept their names: the rest is `other`
    assert got["OTHER"] == str(total - 50 * 40)
    assert got["SERIES"] == "51" and got["OTHER_SERIES"] == "1"
    assert out.stderr.count("distinct range names reached the metrics") == 1, out.stderr
    assert "PROFILED_METRICS_MAX_RANGES=50" in out.stderr


WINDOWS = r"""
import sys
from instrument import profiled
from instrument.export import builder as reporting
from instrument.runtime import state

handed, kept = [], []
_pending = reporting.pending

def spy(ended):  # what each window's analysis is given (the original still runs)
    handed.append((len(ended.names), id(ended.names)))
    kept.append(ended.names)  # (alive: an id is not reused)
    _pending(ended)

reporting.pending = spy

@profiled("train_step", step=True)
def train_step(i):
    if i == 12:  # run-time names, past the window's bound
        for j in range(12_000):
            profiled(f"made-{j}")
    return i

for i in range(60):
    train_step(i)
instrument_names = len(state.RANGE_NAMES)
import instrument
instrument.shutdown()
print("HANDED", handed)
print("NAMES", instrument_names, "MAX", getattr(state, "WINDOW_NAMES_MAX", 10_000))
"""


def test_a_window_copies_no_names_when_none_were_added_and_at_most_the_bound(ahead, request):
    """Windows before and after 12k run-time names: each is handed at most
    ``WINDOW_NAMES_MAX`` names (it was every name ever made), and a window after which no
    name was added is handed the very same set (no copy: it was a new copy of every name at
    every window)."""
    out, tmp_path = ahead[request.node.name]  # WINDOWS, a window every 10 steps
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    handed = eval(lines["HANDED"])  # noqa: S307 - our own program's printed list
    names = lines["NAMES"].split()
    made, bound = int(names[0]), int(names[2])
    assert made > bound
    assert len(handed) >= 4, out.stderr[-3000:]
    assert all(n <= bound for n, _ in handed)
    after = [h for h in handed if h[0] > 2]  # the windows after the run-time names
    assert len(after) >= 3 and all(n == bound for n, _ in after)
    assert len({i for _, i in after}) == 1  # one set, copied once
    assert out.stderr.count(f"more than {bound} distinct range names were made") == 1
    assert os.path.exists(tmp_path / "r.jsonl")
