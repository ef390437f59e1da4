"""On-demand windows, driven from outside a real process: signals and trigger files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from exporters import InMemoryExporter
from instrument import Schedule, profiled, session

from .conftest import REPO

X = torch.randn(8, 8)


@profiled("train_step", step=True)
def train_step() -> torch.Tensor:
    return X @ X


# A program that runs steps until it has one report (or 60 s pass), printing "ready" once its
# session is running. Sampling alone never opens a window here (rate 0): only the trigger does.
PROGRAM = r"""
import json, os, signal, sys, time
import torch
import instrument
from instrument import profiled
from exporters import InMemoryExporter

chained = []
if os.environ.get("OWN_HANDLER"):
    signal.signal(signal.SIGUSR2, lambda sig, frame: chained.append(sig))

mem = InMemoryExporter()
instrument.configure(exporters=[mem])

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

x = torch.randn(4, 4)
train_step(x)
print("ready", flush=True)
deadline = time.monotonic() + 60
while not mem.reports and time.monotonic() < deadline:
    train_step(x)
    time.sleep(0.001)
steps = [list(r.steps) for r in mem.reports]
instrument.shutdown()
print(json.dumps({"steps": steps, "chained": len(chained)}), flush=True)
"""


def _start(env: dict[str, str], tmp_path) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith("PROFILED_")}
    full.update({"PYTHONPATH": REPO, "PROFILED_SAMPLE_RATE": "0",
                 "PROFILED_SCHEDULE": "warmup=1,active=2"}, **env)
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], env=full, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    return proc


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("own_handler", [False, True])
def test_signal_opens_one_window_and_chains_the_handler_already_there(tmp_path, own_handler):
    env = {"PROFILED_TRIGGER": "SIGUSR2"}
    if own_handler:
        env["OWN_HANDLER"] = "1"
    proc = _start(env, tmp_path)
    time.sleep(0.3)  # steps run, no window opens (sampling rate 0)
    os.kill(proc.pid, signal.SIGUSR2)
    result = _result(proc)
    assert len(result["steps"]) == 1 and len(result["steps"][0]) == 2
    assert result["chained"] == (1 if own_handler else 0)


def test_without_a_trigger_the_signal_keeps_its_default_action(tmp_path):
    proc = _start({}, tmp_path)
    os.kill(proc.pid, signal.SIGUSR2)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGUSR2  # nothing of ours was installed


def test_trigger_file_opens_a_window_and_is_removed(tmp_path):
    path = tmp_path / "profile-now"
    proc = _start({"PROFILED_TRIGGER": str(path)}, tmp_path)
    time.sleep(0.3)
    assert proc.poll() is None
    path.write_text("")
    result = _result(proc)
    assert len(result["steps"]) == 1
    assert not path.exists()


def test_trigger_opens_a_window_after_the_schedule_has_finished(tmp_path):
    path = tmp_path / "again"
    mem = InMemoryExporter()
    with session(schedule=Schedule(warmup=1, active=1), trigger=str(path),
                 exporters=[mem]) as s:
        for _ in range(5):  # steps 0-4
            train_step()
        s.flush()
        assert [r.steps for r in mem.reports] == [(1,)]  # the schedule's one window
        path.write_text("")
        deadline = time.monotonic() + 10
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        for _ in range(3):
            train_step()
    # taken during step 5: step 6 warms up, step 7 is recorded
    assert s.step_index == 8
    assert [r.steps for r in mem.reports] == [(1,), (7,)]


def test_max_windows_caps_triggered_windows_too(tmp_path):
    path = tmp_path / "again"
    mem = InMemoryExporter()
    with session(schedule=Schedule(warmup=0, active=1), trigger=str(path), max_windows=1,
                 exporters=[mem]):
        for _ in range(3):
            train_step()
        path.write_text("")
        time.sleep(0.5)
        for _ in range(3):
            train_step()
    assert len(mem.reports) == 1


def test_signal_trigger_from_another_thread_warns_and_the_program_goes_on():
    mem = InMemoryExporter()
    caught = []

    def worker():
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with session(schedule=Schedule(warmup=0, active=1), trigger="SIGUSR2",
                         exporters=[mem]):
                train_step()
        caught.extend(str(x.message) for x in w)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert any("outside the main thread" in m for m in caught), caught
    assert len(mem.reports) == 1
    assert signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None)
