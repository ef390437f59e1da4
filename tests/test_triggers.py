"""On-demand windows, driven from outside a real process: signals and trigger files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import warnings

import pytest
import torch

from exporters import InMemoryExporter
from instrument import Schedule, profiled, session
from tests import _proc

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
    full = _proc.sdk_env(
        {"PROFILED_SAMPLE_RATE": "0", "PROFILED_SCHEDULE": "warmup=1,active=2", **env}
    )
    proc = _proc.start("-c", PROGRAM, env=full, cwd=tmp_path)
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
    with session(schedule=Schedule(warmup=1, active=1), trigger=str(path), exporters=[mem]) as s:
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
    with session(
        schedule=Schedule(warmup=0, active=1), trigger=str(path), max_windows=1, exporters=[mem]
    ):
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
            with session(schedule=Schedule(warmup=0, active=1), trigger="SIGUSR2", exporters=[mem]):
                train_step()
        caught.extend(str(x.message) for x in w)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert any("outside the main thread" in m for m in caught), caught
    assert len(mem.reports) == 1
    assert signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None)


# ---------------------------------------------------------------- hardening (issue 15, item 14)

OTHER_UID = 54321  # a user that owns nothing here


def _plant(kind: str, path, tmp_path) -> None:
    """Put something that is not a request at ``path``, as another user of /tmp could."""
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        target = tmp_path / "target"
        target.write_text("keep me")
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)  # opening it for reading would block the poll thread for good
    elif kind == "another user's file":
        path.write_text("")
        os.chown(path, OTHER_UID, OTHER_UID)


def _remove(path) -> None:
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    else:
        path.unlink()


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo", "another user's file"])
def test_something_planted_at_the_trigger_path_neither_fires_nor_disables_it(tmp_path, kind):
    if kind == "another user's file" and os.geteuid() != 0:
        pytest.skip("planting a file of another user at the path needs root")
    path = tmp_path / "profile-now"
    _plant(kind, path, tmp_path)
    mem = InMemoryExporter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with session(
            schedule=Schedule(warmup=0, active=1),
            sample_rate=0.0,
            trigger=str(path),
            exporters=[mem],
        ) as s:
            for _ in range(3):
                train_step()
            time.sleep(0.6)  # several polls see it (POLL_S = 0.1)
            for _ in range(3):
                train_step()
            s.flush()
            assert mem.reports == []  # it did not fire
            assert os.path.lexists(path)  # nor was it removed
            if kind == "symlink":
                assert (tmp_path / "target").read_text() == "keep me"
            # gone, and a file of ours takes its place: the trigger still works
            _remove(path)
            path.write_text("")
            deadline = time.monotonic() + 10  # generous: the poll takes it within 0.1 s
            while path.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            for _ in range(3):
                train_step()
    assert not path.exists()
    assert len(mem.reports) == 1
    said = [str(w.message) for w in caught if str(path) in str(w.message)]
    assert len(said) == 1, said  # once, not once per poll
    assert "cannot fire the trigger" in said[0] and "keeps watching" in said[0]


REFUSED = r"""
import json, os, signal, time
import torch
import instrument
from instrument import profiled
from exporters import InMemoryExporter

sig = getattr(signal, os.environ["THE_SIGNAL"])
got = []
def own(signum, frame):
    got.append(signum)
signal.signal(sig, own)
sigint_before = signal.getsignal(signal.SIGINT)

mem = InMemoryExporter()
instrument.configure(exporters=[mem])

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

x = torch.randn(4, 4)
train_step(x)
untouched = signal.getsignal(sig) is own and signal.getsignal(signal.SIGINT) is sigint_before
print("ready", flush=True)
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    train_step(x)
    time.sleep(0.001)
for _ in range(5):
    train_step(x)
instrument.shutdown()  # exports whatever a window recorded
steps = [list(r.steps) for r in mem.reports]
print(json.dumps({"steps": steps, "got": len(got), "untouched": untouched}), flush=True)
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_that_is_not_ours_to_take_is_refused(tmp_path, name):
    full = _proc.sdk_env(
        PROFILED_SAMPLE_RATE="0",
        THE_SIGNAL=name,
        PROFILED_SCHEDULE="warmup=0,active=1",
        PROFILED_TRIGGER=name,
    )
    proc = _proc.start("-c", REFUSED, env=full, cwd=tmp_path)
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    os.kill(proc.pid, getattr(signal, name))
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"steps": [], "got": 1, "untouched": True}  # only the program's handler
    warned = [line for line in err.splitlines() if "ConfigWarning" in line]
    assert len(warned) == 1, err
    assert f"PROFILED_TRIGGER={name!r} is invalid" in warned[0]
    assert "expected one of SIGUSR2, SIGUSR1" in warned[0]
    assert "using the default PROFILED_TRIGGER=unset" in warned[0]


def test_sigusr1_opens_a_window_too(tmp_path):
    proc = _start({"PROFILED_TRIGGER": "USR1"}, tmp_path)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGUSR1)
    result = _result(proc)
    assert len(result["steps"]) == 1 and len(result["steps"][0]) == 2


def test_arming_a_refused_signal_directly_warns_and_leaves_its_handler():
    from instrument import triggers

    before = signal.getsignal(signal.SIGTERM)
    with pytest.warns(UserWarning, match="SIGUSR2, SIGUSR1; the trigger is off"):
        assert triggers.arm("SIGTERM", lambda: None) is None
    assert signal.getsignal(signal.SIGTERM) is before
