"""A range's end never ends in a profiler other than the one it began in: threads racing
profiler starts and stops, ranges recursive and re-entrant, and a range end held up right
before its C call (Python code a profiling hook runs there) while another thread stops the
profiler and starts the next. Each in a real process: the failure is a segfault. (An end
without the lock was removed after this race segfaulted with it on a GPU host, where Kineto
has CUPTI: BENCHMARKS.md.)"""

from __future__ import annotations

import pytest

from tests import _proc

RACE = """
import threading, torch, torch.profiler as tp
from exporters import InMemoryExporter
from instrument import Schedule, profiled, session

@profiled("leaf")
def leaf(x):
    return x + 1

@profiled("outer")
def outer(x, depth):  # recursive: a range inside a range of the same name
    return leaf(x) if depth == 0 else outer(x, depth - 1)

class Block:
    def __init__(self):
        self.cm = profiled("block")  # one object entered again and again, also nested

    def run(self, x):
        with self.cm:
            with self.cm:
                return outer(x, 2)

stop = threading.Event()
calls = []

def worker(block):
    n = 0
    while not stop.is_set():
        block.run(torch.ones(2))
        n += 1
    calls.append(n)

shared = Block()
threads = [threading.Thread(target=worker, args=(shared if i % 2 else Block(),)) for i in range(4)]
for t in threads:
    t.start()
leaves = []
CPU = [tp.ProfilerActivity.CPU]
for i in range(16):  # the program's own profilers, thread-local and all-threads
    cfg = torch._C._profiler._ExperimentalConfig(profile_all_threads=True) if i % 2 else None
    with tp.profile(activities=CPU, experimental_config=cfg) as prof:
        for _ in range(5):
            shared.run(torch.ones(2))
    leaves.append(sum(1 for e in prof.events() if e.name == "leaf"))
exporter = InMemoryExporter()
with session(schedule=Schedule(wait=0, warmup=0, active=1, repeat=6), exporters=[exporter],
             activities=("cpu",), all_threads=True) as s:  # the SDK's own windows
    for _ in range(14):
        shared.run(torch.ones(2))
        s.step()
stop.set()
for t in threads:
    t.join()
assert all(n >= 5 for n in leaves), leaves  # the program's profiler sees our ranges
assert len(calls) == 4 and all(calls), calls
assert exporter.reports and all("leaf" in r.ranges for r in exporter.reports)
print("ok", leaves, calls, len(exporter.reports))
"""


@pytest.mark.timeout(600)
def test_threads_calling_while_profilers_start_and_stop_never_crash(tmp_path):
    """Four threads call decorated functions (recursive, a context-form object shared and
    nested) while the program starts and stops 16 profilers and the SDK runs 6 windows:
    the process exits normally and every profile holds the main thread's ranges."""
    env = _proc.sdk_env({"PROFILED_ACTIVITIES": "cpu"})
    result = _proc.run("-c", RACE, env=env, cwd=tmp_path, timeout=540)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok" in result.stdout, result.stdout


HELD_END = """
import linecache, os, sys, threading, time, torch, torch.profiler as tp
from instrument.runtime import _torch
from instrument import profiled

MODE = sys.argv[1]

@profiled("held")
def held():
    return torch.ones(2) + 1

order = []
in_gap, release, done = threading.Event(), threading.Event(), threading.Event()
profiler_ready = threading.Event()

ENDS = {_torch.ranged_call.__code__, _torch.range_exit.__code__}  # a range's two ends

def at_c_exit(frame, fn):  # about to call the range's C ``__exit__``
    return (
        frame.f_code in ENDS
        and getattr(fn, "__name__", "") == "__exit__"
        and isinstance(getattr(fn, "__self__", None), _torch.FastRange)
    )

def at_exit_line(frame):  # on the line of that call, its epoch checked already
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    return frame.f_code in ENDS and line.strip() == "rf.__exit__()"

def hold():
    # Python code run between a range's epoch check and its C ``__exit__``, as a hook runs it
    sys.setprofile(None)
    sys.settrace(None)
    in_gap.set()
    release.wait()
    order.append("range ends")

def profile_hook(frame, event, arg):  # sys.setprofile: right before the C call
    if event == "c_call" and at_c_exit(frame, arg):
        hold()

def trace_hook(frame, event, arg):  # sys.settrace (coverage, debuggers): its line events
    if frame.f_code not in ENDS:
        return None

    def local(frame, event, arg):
        if event == "line" and at_exit_line(frame):
            hold()
            return None
        return local

    return local

def worker():
    if MODE == "profile":
        sys.setprofile(profile_hook)
    else:
        sys.settrace(trace_hook)
    held()
    sys.setprofile(None)
    sys.settrace(None)

def all_threads():
    cfg = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    return tp.profile(activities=[tp.ProfilerActivity.CPU], experimental_config=cfg)

def profiler_thread():
    first = all_threads()
    first.start()
    profiler_ready.set()
    in_gap.wait()
    first.stop()  # the range's profiler ends while its end is held up
    second = all_threads()
    second.start()  # must wait until the held end is over
    order.append("next profiler started")
    done.wait()
    second.stop()

p = threading.Thread(target=profiler_thread)
p.start()
profiler_ready.wait()
w = threading.Thread(target=worker)
w.start()
if not in_gap.wait(60):  # the hook must have held the end: nothing was tested otherwise
    print("no range end was held up", flush=True)
    os._exit(3)
time.sleep(1.0)  # time enough for a start that does not wait to finish
release.set()
w.join()
done.set()
p.join()
print(order)
assert order == ["range ends", "next profiler started"], order
print("ok")
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hook", ["profile", "trace"])
def test_a_range_end_held_up_by_a_hook_never_ends_under_the_next_profiler(tmp_path, hook):
    """A ``sys.setprofile`` hook (before the C call) or a ``sys.settrace`` hook (its line
    events) runs Python code between a range's epoch check and its C ``__exit__``; meanwhile
    another thread stops the profiler and starts the next one. The start waits until the
    held end is over (the end holds the range lock), so the range never ends under the next
    profiler (there it writes into the first one's freed state)."""
    script = tmp_path / "held_end.py"
    script.write_text(HELD_END)
    result = _proc.run(
        str(script), hook, env=_proc.sdk_env({"PROFILED_ACTIVITIES": "cpu"}), timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok" in result.stdout, result.stdout
