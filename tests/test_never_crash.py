"""Telemetry never breaks the program: ranges held across windows, threads, asyncio tasks and
signal handlers that raise anywhere, each in a real process that must exit normally.

Before the fix a range entered under one window and exited under the next crashed the
process (torch writes into the first profiler's freed state: rc -11/-6), and an interrupt
landing in a window's stop left the profiler on for good.
"""

from __future__ import annotations

import json

import pytest

from instrument import Schedule, profiled
from instrument import _torch
from instrument.testing import capture


def _reports(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run(run_python, tmp_path, code: str, every: int, runs: int = 1, timeout: float = 180,
         extra: dict[str, str] | None = None) -> list[dict]:
    out = tmp_path / "reports.jsonl"
    for attempt in range(runs):
        if out.exists():
            out.unlink()
        env = {"PROFILED_EVERY": str(every), "PROFILED_EXPORTERS": "json",
               "PROFILED_JSON_PATH": str(out), "PROFILED_ACTIVITIES": "cpu", **(extra or {})}
        result = run_python(code, env=env, timeout=timeout)
        assert result.returncode == 0, (attempt, result.returncode, result.stderr[-3000:])
        assert "done" in result.stdout, result.stdout
    return _reports(out)


HELD_ACROSS_STEPS = """
import torch
from instrument import profiled, step
x = torch.zeros(8)
for i in range(150):
    with profiled("chunk"):
        for j in range(3):
            x = x + 1
            step()
print("done")
"""


def test_a_range_held_across_windows_never_crashes(run_python, tmp_path):
    """The issue's reproduction: every window ends inside an open ``chunk``."""
    reports = _run(run_python, tmp_path, HELD_ACROSS_STEPS, every=4, runs=3)
    assert len(reports) >= 5
    # a chunk that began in a window and outlived it is counted, and said to be open
    opened = [r["ranges"]["chunk"] for r in reports if "chunk" in r["ranges"]]
    assert opened and all(c["open_calls"] >= 1 for c in opened)


ASYNC_TASKS = """
import asyncio, torch
from instrument import profiled, step

async def holder(n):
    x = torch.zeros(4)
    for i in range(n):
        async with profiled("held"):
            for j in range(5):
                x = x + 1
                await asyncio.sleep(0)

async def stepper(n):
    for i in range(n):
        with profiled("tick"):
            torch.ones(2) * 2
        step()
        await asyncio.sleep(0)

async def main():
    await asyncio.gather(holder(300), holder(200), stepper(1200))

asyncio.run(main())
print("done")
"""


@pytest.mark.parametrize("every", [4, 40])
def test_asyncio_tasks_hold_ranges_while_another_steps(run_python, tmp_path, every):
    reports = _run(run_python, tmp_path, ASYNC_TASKS, every=every)
    assert len(reports) >= 3
    assert any("held" in r["ranges"] for r in reports)


THREADS = """
import threading, time, torch
import instrument
from instrument import profiled

@profiled("work")
def work(x):
    return x + 1

def run():
    x = torch.zeros(4)
    for i in range(2000):
        x = work(x)

def meddle():
    for i in range(15):
        time.sleep(0.05)
        instrument.flush(0.2)
        if i % 5 == 4:
            instrument.configure(exporters=["json"], activities=["cpu"], every=5)

threads = [threading.Thread(target=run) for _ in range(8)] + [threading.Thread(target=meddle)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("done")
"""


def test_free_running_threads_with_configure_and_flush(run_python, tmp_path):
    """8 threads x 2000 root calls (each ends a step), windows every 5 steps, while another
    thread flushes and reconfigures: ranges of every thread cross window boundaries."""
    reports = _run(run_python, tmp_path, THREADS, every=5, runs=2)
    assert len(reports) >= 3


STORM = """
import os, signal, sys, torch
import instrument
from instrument import profiled, step, _torch

class Tick(Exception):
    pass

def on_alarm(signum, frame):
    # raise anywhere below the loop (decorated calls, steps, the SDK, torch): a raise in the
    # loop's own frame could land between its try blocks, where no program could catch it
    if frame is None or frame.f_code is storm.__code__:
        return
    caller = frame.f_back
    while caller is not None and caller.f_code is not storm.__code__:
        caller = caller.f_back
    if caller is not None:
        raise Tick()

@profiled("work")
def work(x):
    return x @ x + 1

def storm(x):
    interrupts = steps = 0
    while interrupts < 400:
        try:
            x = work(x) / 17
            step()
            steps += 1
        except Tick as exc:  # the program's own exception, unchanged
            assert type(exc) is Tick, type(exc)
            interrupts += 1
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    return x, interrupts, steps

signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)  # an exception every 0.3 ms
x, interrupts, steps = storm(torch.ones(16, 16))
assert not _torch.orphaned_profiler(), "a profiler of ours is on with no window to end it"
instrument.flush(30)
before = len(open(os.environ["PROFILED_JSON_PATH"]).readlines())
for i in range(200):  # sampling goes on after the storm
    x = work(x) / 17
    step()
instrument.flush(30)
after = len(open(os.environ["PROFILED_JSON_PATH"]).readlines())
assert after > before, (before, after)
instrument.shutdown()
assert not _torch.profiler_on(), "the profiler is still on after shutdown()"
print("done", interrupts, steps, before, after)
"""


def test_an_interrupt_storm_never_leaves_the_profiler_on(run_python, tmp_path):
    """A signal handler that raises every 0.3 ms lands anywhere, windows' starts and stops
    included: the program's exception comes through unchanged, no profiler is left on,
    sampling goes on afterwards and the process exits normally."""
    _run(run_python, tmp_path, STORM, every=3, runs=2)


def test_a_range_that_outlives_its_window_is_counted_and_never_ended_in_the_next():
    """In process: a range entered in window 0 and exited while window 1 records is not
    ended in window 1's profiler (that is the crash); window 0's report says it was open."""
    with capture(schedule=Schedule(wait=0, warmup=0, active=2, repeat=2),
                 activities=["cpu"]) as cap:
        held = profiled("held")
        held.__enter__()  # step 0: window 0 records
        cap.step()
        cap.step()  # window 0 ends with step 1, window 1 starts with step 2
        assert cap.session._window is not None and cap.session._window.recording
        epoch = _torch._epoch
        held.__exit__(None, None, None)  # under window 1: kept, not ended
        assert _torch._epoch == epoch and len(_torch._orphans) == 1
        cap.step()
        cap.step()
    assert not _torch._orphans  # freed once no profiler was on
    opened = [r.ranges["held"] for r in cap.reports if "held" in r.ranges]
    assert [(s.calls, s.open_calls) for s in opened] == [(1, 1)]
