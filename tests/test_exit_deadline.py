"""Issue 29, item 18: a window still open at exit with many events. torch's stop of it is
synchronous C++ that grows with the window's events (tens of µs per event on the 2-core box)
and no deadline can cut it short; what PROFILED_EXPORT_TIMEOUT_S bounds is everything after
it. A window stopped past the deadline is no longer analysed: before, its analysis began
anyway and held the interpreter's lock reading the events (2.2 s after a 7.2 s stop at a 1 s
deadline), so the exit took that much longer than torch's stop.

Time is compared only within the program: its exit's time past torch's stop of the window
(measured there, around the SDK's stop) against that stop's own duration.
"""

from __future__ import annotations

import json

PROGRAM = r"""
import json, time, torch, instrument
from instrument import profiled
from instrument.runtime import _torch

stops = []
_stop = _torch.ProfilerWindow.stop


def timed_stop(self, **kwargs):  # a stopwatch around torch's stop, nothing else
    start = time.monotonic()
    try:
        return _stop(self, **kwargs)
    finally:
        stops.append(time.monotonic() - start)


_torch.ProfilerWindow.stop = timed_stop
x = torch.randn(2)


@profiled("train_step", step=True)
def train_step():
    for _ in range(20000):  # many operator events in one open window
        x.add(1)


for _ in range(3):
    train_step()
start = time.monotonic()
instrument.shutdown()
print(json.dumps({"shutdown": time.monotonic() - start, "stops": stops}), flush=True)
"""


def test_past_torchs_stop_of_a_big_window_the_exit_keeps_its_deadline(run_python, tmp_path):
    path = tmp_path / "r.jsonl"
    out = run_python(
        PROGRAM,
        env={
            "PROFILED_EXPORT_TIMEOUT_S": "0.2",
            "PROFILED_EXPORTERS": "json",
            "PROFILED_JSON_PATH": str(path),
            "PROFILED_SCHEDULE": "warmup=0,active=1000",
            "PROFILED_ACTIVITIES": "cpu",
        },
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    took = json.loads(out.stdout.splitlines()[-1])
    (stop,) = took["stops"]
    assert stop > 0.2, took  # the case under test: torch's stop alone outlasts the deadline
    past_stop = took["shutdown"] - stop
    # within the deadline plus a twentieth of the stop (the analysis of these events, which
    # no longer starts, held the lock for about a third of the stop)
    assert past_stop < 0.2 + 0.05 * stop, took
    assert "its report was dropped, not analysed" in out.stderr, out.stderr[-3000:]
