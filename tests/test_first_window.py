"""The first window's start costs the program nothing it can see (issue 29, item 5).

torch's ``prepare_trace`` asked ``hasattr(torch, "_inductor")``, which imports Inductor (822
modules, 2.2-4.5 s on the busy 2-core box) in the step that started the first window; that
step then went into the step histogram. Now the import is left alone where Inductor is not
loaded (``_torch._inductor_left_alone``), and a step in which a torch profiler started or
stopped stays out of the step histogram and the slow-step median. Real programs; steps that
started or stopped a profiler are told by torch's own flag before and after each step.
"""

from __future__ import annotations

import json

from tests import _proc

WINDOWS = r"""
import json, statistics, sys, time
import torch
import torch.autograd.profiler as torch_profiler
import instrument
from instrument import Schedule, profiled
from instrument.runtime import metrics

@profiled("train_step", step=True)
def train_step(x):
    time.sleep(0.01)
    return x @ x

instrument.configure(
    schedule=Schedule(wait=5, warmup=1, active=3, repeat=2), metrics=True, exporters=["memory"]
)
x = torch.randn(32, 32)
times, switched = [], []
for i in range(30):
    before = bool(torch_profiler._is_profiler_enabled)
    t0 = time.perf_counter()
    train_step(x)
    times.append(time.perf_counter() - t0)
    if bool(torch_profiler._is_profiler_enabled) != before:
        switched.append(i)
steps = metrics.snapshot().steps
quiet = [t for i, t in enumerate(times) if i not in switched]
print("RESULT " + json.dumps({
    "switched": switched,
    "histogram_steps": steps.count,
    "first_start_ratio": times[switched[0]] / statistics.median(quiet),
    "inductor": "torch._inductor" in sys.modules,
}))
"""


def _result(code: str) -> dict:
    proc = _proc.run("-c", code, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_the_window_start_and_stop_steps_stay_out_of_the_step_histogram():
    out = _result(WINDOWS)
    # two windows of three recorded steps: started in the first, stopped in the last of each
    # (with CUDA, torch 2.11 on an H100: the flag turns on at the warm-up step's prepare)
    assert out["switched"] in ([6, 8, 15, 17], [5, 8, 14, 17]), out
    assert out["histogram_steps"] == 30 - len(out["switched"])  # was 30
    # torch's first start no longer imports Inductor (was 2.2-4.5 s here, in step 6)...
    assert out["inductor"] is False
    # ...so the step that starts the first window is an ordinary step, give or take the box
    assert out["first_start_ratio"] < 25


OWN_PROFILER = r"""
import json, time
import torch
import instrument
from instrument import Schedule, profiled
from instrument.runtime import lifetime
from instrument.runtime import metrics

@profiled("train_step", step=True)
def train_step(x, i):
    time.sleep(0.005)
    if i == 14:  # the program's own profiler, started and stopped inside one step
        with torch.profiler.profile():
            x = x + 1
    return x @ x

instrument.configure(
    # a factor no noise of the busy box reaches (steps of 5 ms: torch's first start took
    # 0.7-4.5 s, 140x and more); the rule under test is the same at any factor
    schedule=Schedule(skip_first=10**6), slow_step=50.0, metrics=True, exporters=["memory"]
)
x = torch.randn(32, 32)
for i in range(30):
    train_step(x, i)
sess = lifetime.state.current
slow = sess._planner.slow
print("RESULT " + json.dumps({
    "judged": len(slow.times),
    "switched_steps": getattr(slow, "switched_steps", None),
    "windows": sess.windows_opened,
    "histogram_steps": metrics.snapshot().steps.count,
}))
"""


def test_a_step_that_starts_a_profiler_is_not_judged_slow_nor_counted():
    """torch's own first start (Inductor's import, the program's profiler) in one step: it
    neither opens a slow-step window nor enters the median."""
    out = _result(OWN_PROFILER)
    assert out["windows"] == 0  # was 1: a slow_step window opened by the profiler's start
    assert out["judged"] == 30 - 2  # the first boundary has no start, step 14 is left out
    assert out["switched_steps"] == 1
    assert out["histogram_steps"] == 29


FORK_WHILE_ASKING = r"""
import os, sys, torch
import instrument
from instrument.runtime import _torch
before = torch.__dict__.get("__getattr__")
assert before is not None and "torch._inductor" not in sys.modules
with _torch._inductor_left_alone():
    assert torch.__dict__["__getattr__"] is not before  # the question is ours here
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only where torch's own is back
        os._exit(0 if torch.__dict__.get("__getattr__") is before else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), torch.__dict__.get("__getattr__") is before)
"""


def test_a_child_forked_while_the_first_start_asks_gets_torchs_getattr_back(tmp_path):
    """A child forked (from any thread) while a window's first start answers torch's
    ``hasattr(torch, "_inductor")`` itself gets torch's own lazy ``__getattr__`` back: a
    thread of the same id there would otherwise be told forever that Inductor is missing."""
    done = _proc.run("-c", FORK_WHILE_ASKING, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "True"]
