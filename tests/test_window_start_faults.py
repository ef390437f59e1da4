"""Issue 29, item 19 (a window's start and stop): an exception injected into the program's
thread (``PyThreadState_SetAsyncExc``: func_timeout, stopit) that lands in a window's profiler
start reaches the program's code, never swallowed as a failed start; a warning torch gives in
its start (``PROFILED_ACTIVITIES=cpu,cuda`` on a host without a GPU) under ``python -W error``
no longer loses every window; a window ended between steps (the exit) says it recorded until
its last recorded step ended, not until the stop.
"""

from __future__ import annotations

import json

from tests import _early, _proc
from tests._records import window_records

INJECT = r"""
import ctypes, sys, threading, time
import torch
import instrument
from instrument import Schedule, profiled


class StopitTimeout(Exception):  # stopit's TimeoutException is an Exception
    pass


class FunctionTimedOut(BaseException):  # func_timeout's is a BaseException
    pass


# (not an OSError such as TimeoutError: Python's own import machinery, which torch's first
# start runs, swallows those wherever they land)
KINDS = [StopitTimeout, FunctionTimedOut]
instrument.configure(
    schedule=Schedule(warmup=0, active=1, repeat=0), activities=["cpu"], exporters=["json"]
)
x = torch.randn(8, 8)


@profiled("train_step", step=True)
def train_step():
    return x @ x


main = threading.main_thread().ident
caught = threading.Event()
injected, in_start = [], [0]


def in_profiler_start(frame):
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith("_torch.py") and code.co_name in ("start", "prepare"):
            return True
        frame = frame.f_back
    return False


def watchdog():
    # aim each injection at a window's profiler start (the first is slow: torch imports
    # much there); one that misses the start must reach the program all the same
    for i in range(6):
        kind = KINDS[i % len(KINDS)]
        end = time.monotonic() + 20
        while time.monotonic() < end:
            frame = sys._current_frames().get(main)
            if frame is not None and in_profiler_start(frame):
                in_start[0] += 1
                break
            time.sleep(0)
        injected.append(kind.__name__)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.py_object(kind))
        if not caught.wait(10):
            print("SWALLOWED", kind.__name__, flush=True)
            return
        caught.clear()


threading.Thread(target=watchdog, daemon=True).start()
got = []
deadline = time.monotonic() + 120
while len(got) < 6 and time.monotonic() < deadline:
    try:
        train_step()
    except (StopitTimeout, FunctionTimedOut) as exc:
        got.append(type(exc).__name__)
        caught.set()
print("RESULT", json.dumps({"injected": injected, "got": got, "in_start": in_start[0]}),
      flush=True)
for _ in range(4):  # windows go on afterwards
    train_step()
instrument.flush()
print("OK", flush=True)
""".replace("import ctypes,", "import json, ctypes,")


def test_an_exception_injected_into_a_windows_start_reaches_the_program(run_python, tmp_path):
    out = run_python(INJECT, env={"PROFILED_JSON_PATH": str(tmp_path / "r.jsonl")}, timeout=300)
    assert "SWALLOWED" not in out.stdout, out.stdout + out.stderr[-3000:]
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["got"] == result["injected"] and len(result["got"]) == 6, result
    assert result["in_start"] >= 1, result  # at least one landed in a start (the first)
    assert "OK" in out.stdout
    assert window_records((tmp_path / "r.jsonl").read_text())  # windows went on


W_ERROR = r"""
import torch, instrument
from instrument import profiled

@profiled("train_step", step=True)
def train_step():
    return torch.ones(3) + 1

for _ in range(12):
    train_step()
instrument.flush()
print("done", flush=True)
"""


_early.add(
    __name__,
    "test_a_warning_from_torchs_start_under_w_error_loses_no_window",
    *("-W", "error", "-c", W_ERROR),
    env=lambda cwd: _proc.sdk_env(
        PROFILED_ACTIVITIES="cpu,cuda",
        PROFILED_EXPORTERS="json",
        PROFILED_JSON_PATH=str(cwd / "r.jsonl"),
        PROFILED_SCHEDULE="warmup=1,active=2,repeat=3",
    ),
)


def test_a_warning_from_torchs_start_under_w_error_loses_no_window(request):
    """This host has no GPU: torch warns "CUDA is not available, disabling CUDA profiling" in
    every start; under -W error that warning used to be raised there and every window was
    skipped. Now the CPU windows are recorded and torch's warning is told once."""
    out, tmp_path = _early.result(request)  # W_ERROR under -W error, CPU and CUDA asked for
    path = tmp_path / "r.jsonl"
    assert out.returncode == 0, out.stderr[-3000:]
    assert "window skipped" not in out.stderr, out.stderr[-3000:]
    assert [r["window"] for r in window_records(path.read_text())] == [0, 1, 2]
    assert out.stderr.count("CUDA is not available") == 1, out.stderr[-3000:]


RECORDED = r"""
import time, torch, instrument
from instrument import Schedule, profiled

instrument.configure(
    schedule=Schedule(warmup=0, active=1000), activities=["cpu"], exporters=["json"]
)

@profiled("train_step", step=True)
def train_step():
    return torch.ones(3) + 1

start = time.time_ns()
for _ in range(5):
    train_step()
last_step_end = time.time_ns()
time.sleep(IDLE)  # idle after the last step, until the exit stops the window
print(start, last_step_end, flush=True)
"""


def test_a_window_ended_at_exit_recorded_until_its_last_step_not_the_stop(run_python, tmp_path):
    path = tmp_path / "r.jsonl"
    out = run_python(RECORDED.replace("IDLE", "1.5"), env={"PROFILED_JSON_PATH": str(path)})
    assert out.returncode == 0, out.stderr[-3000:]
    start, last_step_end = map(int, out.stdout.split())
    (window,) = window_records(path.read_text())
    assert window["partial"] and window["steps"]
    # the recorded span ends where the last recorded step did: before the program's own
    # timestamp after that step, never after the 1.5 s of idle time that followed
    assert window["end_ns"] <= last_step_end, (window["end_ns"], last_step_end)
    assert window["start_ns"] >= start
