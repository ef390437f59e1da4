"""Telemetry never breaks the program: ranges held across windows, threads, asyncio tasks and
signal handlers that raise anywhere, each in a real process that must exit normally.

Before the fix a range entered under one window and exited under the next crashed the
process (torch writes into the first profiler's freed state: rc -11/-6), and an interrupt
landing in a window's stop left the profiler on for good.
"""

from __future__ import annotations

import queue
import threading
import time

import pytest
import torch

from instrument import Schedule, profiled
from instrument.runtime import _torch
from instrument.testing import capture, process_status
from tests import _proc
from tests._records import window_records


def _reports(path) -> list[dict]:
    return window_records(path.read_text())


def _sampled(every: int | None, **extra: str):
    """The environment of a program whose windows go to ``reports.jsonl`` in its directory."""
    return lambda cwd: _proc.sdk_env(
        {
            **({"PROFILED_EVERY": str(every)} if every is not None else {}),
            "PROFILED_EXPORTERS": "json",
            "PROFILED_JSON_PATH": str(cwd / "reports.jsonl"),
            "PROFILED_ACTIVITIES": "cpu",
            **extra,
        }
    )


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """Every program of this module, run two at a time as the module starts (each in its own
    process, as before: they share nothing); a test reads its own. A hang fails anyway; a busy
    machine must not (runs took 74 s): 600 s each."""
    cpu_memory = {"PROFILED_EXPORTERS": "memory", "PROFILED_ACTIVITIES": "cpu"}
    programs = [
        # key, program, environment, runs
        ("test_a_range_held_across_windows_never_crashes", HELD_ACROSS_STEPS, _sampled(4), 3),
        ("test_asyncio_tasks_hold_ranges_while_another_steps[4]", ASYNC_TASKS, _sampled(4), 1),
        ("test_asyncio_tasks_hold_ranges_while_another_steps[40]", ASYNC_TASKS, _sampled(40), 1),
        ("test_free_running_threads_with_configure_and_flush", THREADS, _sampled(5), 2),
        ("test_an_interrupt_storm_never_leaves_the_profiler_on", STORM, _sampled(3), 2),
        (
            "test_a_window_whose_thread_ends_is_stopped_there_and_windows_go_on",
            OWNER_ENDS,
            _sampled(None, PROFILED_SCHEDULE="wait=1,warmup=0,active=2,repeat=2"),
            1,
        ),
        (
            "test_a_range_held_across_the_programs_own_profiler_restart",
            RESTARTED,
            {"PROFILED_EXPORTERS": "memory"},
            1,
        ),
        (
            "test_the_programs_profiler_on_another_thread_while_a_window_records",
            OTHER_THREAD_PROFILER,
            _sampled(4),
            1,
        ),
        (
            "test_children_forked_while_another_thread_runs_windows_never_hang",
            FORKS,
            {"PROFILED_EVERY": "3", **cpu_memory},
            1,
        ),
        (
            "test_a_child_forked_while_another_thread_owns_a_window_never_touches_it",
            FORK_WHILE_OWNER_HOLDS_LOCK,
            {"PROFILED_ACTIVITIES": "cpu"},
            1,
        ),
        (
            "test_tracebacks_kept_across_windows_never_free_a_live_range",
            KEPT_TRACEBACKS,
            {"PROFILED_EVERY": "4", **cpu_memory},
            1,
        ),
    ]
    with _proc.Ahead(request, tmp_path_factory) as ahead:
        for key, code, env, runs in programs:
            env = env if callable(env) else _proc.sdk_env(env)
            for n in range(runs):
                ahead.add(f"{key}#{n}" if runs > 1 else key, "-c", code, env=env, timeout=600)
        yield ahead


def _run(ahead, request, runs: int = 1) -> list[dict]:
    """The test's program ran ``runs`` times (each exits normally, having said it is done): the
    reports of each run."""
    reports = []
    for attempt in range(runs):
        key = request.node.name + (f"#{attempt}" if runs > 1 else "")
        result, cwd = ahead[key]
        assert result.returncode == 0, (attempt, result.returncode, result.stderr[-3000:])
        assert "done" in result.stdout, result.stdout
        reports.append(_reports(cwd / "reports.jsonl"))
    return reports


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


@pytest.mark.timeout(900)  # three runs of up to ~75 s each on the busy box, and a hang's 600 s
def test_a_range_held_across_windows_never_crashes(ahead, request):
    """The issue's reproduction: every window ends inside an open ``chunk``."""
    for reports in _run(ahead, request, runs=3):
        assert len(reports) >= 5
        # a chunk that began in a window and outlived it is counted, and said to be open
        opened = [r["ranges"]["chunk"] for r in reports if "chunk" in r["ranges"]]
        assert opened and all(c["open_calls"] >= 1 for c in opened)


ASYNC_TASKS = """
import asyncio, torch
from instrument import profiled, step

async def holder(n, inner):
    x = torch.zeros(4)
    for i in range(n):
        async with profiled("held"):
            for j in range(inner):
                x = x + 1
                await asyncio.sleep(0)

async def stepper(n):
    for i in range(n):
        with profiled("tick"):
            torch.ones(2) * 2
        step()
        await asyncio.sleep(0)

async def main():
    # (blocks of 5 and 3 loop rounds: the 3-round one enters at a moving phase of the windows'
    # 40-step spacing, so some window sees a block begin whatever step its first one is)
    await asyncio.gather(holder(300, 5), holder(500, 3), stepper(1200))

asyncio.run(main())
print("done")
"""


@pytest.mark.parametrize("every", [4, 40])
def test_asyncio_tasks_hold_ranges_while_another_steps(ahead, request, every):
    (reports,) = _run(ahead, request)
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


@pytest.mark.timeout(900)  # two runs, and a hang's 600 s
def test_free_running_threads_with_configure_and_flush(ahead, request):
    """8 threads x 2000 root calls (each ends a step), windows every 5 steps, while another
    thread flushes and reconfigures: ranges of every thread cross window boundaries."""
    for reports in _run(ahead, request, runs=2):
        assert len(reports) >= 3


STORM = """
import os, signal, sys, time, torch
import instrument
from instrument import profiled, step; from instrument.runtime import _torch

class Tick(Exception):
    pass

calls = 0

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

def on_alarm(signum, frame):
    # raise anywhere below the loop (decorated calls, steps, the SDK, torch): a raise in the
    # loop's own frame could land between its try blocks, where no program could catch it
    global calls
    calls += 1
    if frame is None or frame.f_code is storm.__code__:
        # as a busy machine does (the program descheduled in here): the next signal
        # arrives while this handler runs, and must not raise through it into that frame
        spin(0.001)
        return
    caller = frame
    while caller is not None and caller.f_code is not storm.__code__:
        if caller.f_code is on_alarm.__code__:
            return  # in this handler's own call: its raise would leave through that one
        caller = caller.f_back
    if caller is not None:
        if calls % 16 == 0:
            spin(0.001)  # the same, where this call raises
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


@pytest.mark.timeout(900)  # two runs of up to ~75 s each on the busy box, and a hang's 600 s
def test_an_interrupt_storm_never_leaves_the_profiler_on(ahead, request):
    """A signal handler that raises every 0.3 ms lands anywhere, windows' starts and stops
    included: the program's exception comes through unchanged, no profiler is left on,
    sampling goes on afterwards and the process exits normally.

    Signals also arrive while the handler runs, as they do when a busy machine deschedules
    the program there (the handler spins 1 ms at times): a nested call never raises, or its
    exception would leave through the outer one into the loop's own frame, outside its try
    (the test's own defect: 1 run in 50 died that way on the busy 2-core box, rc -14, and
    every run once the handler spins)."""
    _run(ahead, request, runs=2)


def test_a_range_that_outlives_its_window_is_counted_and_never_ended_in_the_next():
    """In process: a range entered in window 0 and exited while window 1 records is not
    ended in window 1's profiler (that is the crash); window 0's report says it was open."""
    with capture(
        schedule=Schedule(wait=0, warmup=0, active=2, repeat=2), activities=["cpu"]
    ) as cap:
        held = profiled("held")
        held.__enter__()  # step 0: window 0 records
        cap.step()
        cap.step()  # window 0 ends with step 1, window 1 starts with step 2
        assert cap.session.status().window_recording
        switches = _torch.switches()
        held.__exit__(None, None, None)  # under window 1: kept, not ended
        # no profiler switch, and the range is kept, never ended in C++ (only its count shows it)
        assert _torch.switches() == switches and len(_torch._orphans) == 1
        cap.step()
        cap.step()
    assert not _torch._orphans  # freed once no profiler was on (only its count shows it)
    opened = [r.ranges["held"] for r in cap.reports if "held" in r.ranges]
    assert [(s.calls, s.open_calls) for s in opened] == [(1, 1)]


class _Worker(threading.Thread):
    """One thread that runs what it is given, when asked (a window's owner must stay the
    same thread)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.asks: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()
        self.start()

    def run(self) -> None:
        while (fn := self.asks.get()) is not None:
            try:
                self.done.put((fn(), None))
            except BaseException as exc:  # noqa: BLE001 - re-raised on the asking thread
                self.done.put((None, exc))

    def call(self, fn):
        self.asks.put(fn)
        result, exc = self.done.get(timeout=60)
        if exc is not None:
            raise exc
        return result

    def stop(self) -> None:
        self.asks.put(None)
        self.join()


@profiled("owned", step=True)
def _owned_step() -> torch.Tensor:
    return torch.ones(4) + 1


def test_a_window_is_stopped_only_by_the_thread_that_started_it():
    """Torch keeps a window's profiler in the locals of the thread that started it: another
    thread that ends the window leaves the stop to that thread's next decorated call."""
    a = _Worker()
    try:
        with capture(
            schedule=Schedule(wait=1, warmup=0, active=2, repeat=1), activities=["cpu"]
        ) as cap:
            sess = cap.session
            a.call(_owned_step)  # A ends step 0: the window starts on A
            assert sess.status().window_open and sess.status().window_thread == a.ident
            _owned_step()
            _owned_step()  # this thread ends the window: it cannot stop A's profiler
            assert sess.status().stop_pending and _torch.profiler_on()
            _owned_step()  # nor at its own later steps
            assert sess.status().stop_pending
            a.call(lambda: profiled("later")(lambda: None)())  # A's next decorated call
            assert not sess.status().stop_pending and not _torch.profiler_on()
        (report,) = cap.reports
        assert report.steps == (1, 2)
        assert "owned" not in report.ranges  # the calls of a thread the window does not record
    finally:
        a.stop()


OWNER_ENDS = """
import threading, torch, instrument
from instrument import profiled, Schedule
from instrument.testing import process_status

@profiled("w", step=True)
def w():
    return torch.ones(4) + 1

t = threading.Thread(target=w)  # ends step 0: the first window starts on that thread...
t.start()
t.join()  # ...which ends with the window still on: stopped there, as it ends
assert not process_status().windows_recording and not torch.autograd._profiler_enabled()
for i in range(12):
    w()
instrument.flush(30)
print("done")
"""


def test_a_window_whose_thread_ends_is_stopped_there_and_windows_go_on(ahead, request):
    """Only that thread can stop its profiler: it is stopped as the thread ends (else torch
    2.13 crashed at exit, and on torch 2.11 with CUDA no profiler could start again), and the
    next window records."""
    (reports,) = _run(ahead, request)
    result, _cwd = ahead[request.node.name]
    assert "ended before it could stop its profiler" not in result.stderr
    last = reports[-1]
    assert last["steps"] == [4, 5] and last["ranges"]["w"]["calls"] == 2


RESTARTED = """
import torch
from torch.profiler import profile, ProfilerActivity
from instrument import profiled
x = torch.zeros(8)
p = profile(activities=[ProfilerActivity.CPU])
p.start()
for i in range(300):
    with profiled("chunk"):  # begun under the program's profiler p...
        x = x + 1
        p.stop()
        p = profile(activities=[ProfilerActivity.CPU])
        p.start()  # ...and ended under its next one: never in C++
p.stop()
print("done")
"""


def test_a_range_held_across_the_programs_own_profiler_restart(ahead, request):
    """The program's two profilers in a row look alike to torch's flag: their starts and
    stops move the epoch too (this crashed 2 runs of 2 before)."""
    result, _cwd = ahead[request.node.name]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done" in result.stdout


OTHER_THREAD_PROFILER = """
import threading, torch, instrument
from torch.profiler import profile, ProfilerActivity
from instrument import profiled
from instrument.testing import process_status

@profiled("work")
def work(x):
    return x + 1

x = torch.zeros(4)
for i in range(3):
    x = work(x)
assert process_status().windows_recording, "a window records"

def theirs():
    with profile(activities=[ProfilerActivity.CPU]):
        torch.ones(3) * 2

t = threading.Thread(target=theirs)
t.start()
t.join()
for i in range(40):
    x = work(x)
instrument.shutdown()
assert not process_status().profiler_on and not torch.autograd._profiler_enabled()
print("done")
"""


def test_the_programs_profiler_on_another_thread_while_a_window_records(ahead, request):
    """Stopping a thread-local window after another thread's profiler started and stopped
    crashes in torch: the window is dropped, not stopped, and windows go on."""
    (reports,) = _run(ahead, request)
    assert len(reports) >= 3  # windows after the program's profiler


FORKS = """
import os, sys, threading, time, torch, instrument
from instrument import profiled

@profiled("train_step", step=True)
def train_step(x):
    for _ in range(300):
        x = x + 1
    return x

@profiled("load")
def load():
    return torch.ones(2)

stop = False
def trainer():
    x = torch.zeros(4)
    while not stop:
        x = train_step(x)

t = threading.Thread(target=trainer)
t.start()
time.sleep(0.3)
hung = 0
for i in range(25):
    pid = os.fork()
    if pid == 0:
        for _ in range(10):
            load()
        os._exit(0)
    for _ in range(1500):  # 30 s: a child of a big process is slow to start on a busy machine
        if os.waitpid(pid, os.WNOHANG)[0]:
            break
        time.sleep(0.02)
    else:
        hung += 1
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        break  # one hung child says it: the others would take 30 s each
stop = True
t.join()
print("hung", hung)
"""


@pytest.mark.timeout(900)
def test_children_forked_while_another_thread_runs_windows_never_hang(ahead, request):
    """The parent's lock may be held by its training thread at the fork: the child makes its
    own (14 children of 40 hung before)."""
    result, _cwd = ahead[request.node.name]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hung 0" in result.stdout, result.stdout


FORK_WHILE_OWNER_HOLDS_LOCK = """
import os, threading, time, torch
from exporters import InMemoryExporter
from instrument import Schedule, profiled, session; from instrument.runtime import _torch
from instrument.testing import process_status

@profiled("work")
def work():
    return torch.ones(2) + 1

ready, done = threading.Event(), threading.Event()

def owner():
    with session(schedule=Schedule(warmup=0, active=1000), exporters=[InMemoryExporter()]) as s:
        work(); s.step(); work()
        assert process_status().windows_recording, "the window records on this thread"
        # the lock a window's start or stop holds: held here as by one in progress
        with _torch._range_lock:
            ready.set()
            done.wait()

t = threading.Thread(target=owner)
t.start()
ready.wait()
pid = os.fork()
if pid == 0:
    os._exit(0)
for _ in range(3000):  # 60 s, for a busy machine: a hung child never exits
    if os.waitpid(pid, os.WNOHANG)[0]:
        print("child exited")
        break
    time.sleep(0.02)
else:
    print("child hung")
    os.kill(pid, 9)
    os.waitpid(pid, 0)
done.set()
t.join()
"""


@pytest.mark.timeout(900)
def test_a_child_forked_while_another_thread_owns_a_window_never_touches_it(ahead, request):
    """A forked child clears the parent's other threads' locals as it starts: the window a
    thread of the parent owns is the parent's, never stopped from the child (which hung on its
    copy of a lock that thread held at the fork: 3 runs in 16 of the test above)."""
    result, _cwd = ahead[request.node.name]
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "child exited", result.stdout


KEPT_TRACEBACKS = """
import torch, instrument
from instrument import profiled, step

@profiled("fails")
def fails(x):
    step()  # the window changes inside the call: its range must not end in the new one
    raise ValueError(x)

kept = []
for i in range(60):
    try:
        fails(i)
    except ValueError as exc:
        kept.append(exc)  # tracebacks keep the decorated call's frames alive across windows
    if i % 7 == 6:
        kept.clear()  # ...and let them go under other windows
print("done")
"""


def test_tracebacks_kept_across_windows_never_free_a_live_range(ahead, request):
    """A decorated call that raises after its window changed leaves its frame in the
    traceback: the range is orphaned and the frame lets go of it, so freeing the traceback
    later, under another window, touches no profiler state."""
    result, _cwd = ahead[request.node.name]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done" in result.stdout


def _run_on_a_thread_not_started_by_threading(fn) -> None:
    import _thread

    done = threading.Event()

    def run():
        try:
            fn()
        finally:
            done.set()

    _thread.start_new_thread(run, ())
    assert done.wait(60)
    # the thread's own teardown comes after run() returned, when the machine lets it run (a
    # fixed 0.2 s was a guess): wait for its window's profiler to stop, 60 s at most
    deadline = time.monotonic() + 60
    while process_status().windows_recording and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_window_of_a_thread_threading_did_not_start_is_stopped_as_it_ends():
    """A ``_DummyThread`` says it is alive for ever: its end is told by its local storage,
    which goes on that thread as it ends: the window's profiler is stopped there."""
    with capture(
        schedule=Schedule(wait=1, warmup=0, active=2, repeat=2), activities=["cpu"]
    ) as cap:
        _run_on_a_thread_not_started_by_threading(_owned_step)  # starts window 0 there
        assert cap.session.status().window_open and not process_status().windows_recording
        for _ in range(6):
            _owned_step()
    assert cap.reports[-1].steps == (4, 5)
    assert not _torch.profiler_on()


def test_close_on_the_windows_own_thread_stops_a_window_another_thread_ended():
    a = _Worker()
    try:
        with capture(
            schedule=Schedule(wait=0, warmup=0, active=2, repeat=1), activities=["cpu"]
        ) as cap:
            sess = cap.session
            assert sess.status().window_thread == threading.main_thread().ident
            a.call(_owned_step)
            a.call(_owned_step)  # A ends the window: only this thread can stop it
            assert sess.status().stop_pending
        assert not sess.status().stop_pending and not _torch.profiler_on()
        (report,) = cap.reports
        assert report.steps == (0, 1)
    finally:
        a.stop()
