"""On-demand windows, driven from outside a real process: signals and trigger files."""

from __future__ import annotations

import json
import os
import signal
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


def _exchange(code: str, env: dict[str, str], poke) -> dict:
    """Run ``code`` in ``env`` (made on the test's thread) until it says it is ready, then
    ``poke(proc)`` it (a signal, a file) and let it end: what it said, and how it ended. On a
    thread of ``Ahead``'s: the test asserts."""

    def exchange(cwd) -> dict:
        proc = _proc.start("-c", code, env=env, cwd=cwd)
        ready = proc.stdout.readline()
        poked = poke(proc, cwd) if ready == "ready\n" else None
        try:
            out, err = proc.communicate(timeout=90)
        finally:
            proc.kill()
            proc.wait()
        return {"ready": ready, "poked": poked, "out": out, "err": err, "rc": proc.returncode}

    return exchange


def _triggered(env: dict[str, str]) -> dict[str, str]:
    """PROGRAM's environment: only the trigger opens a window (warm-up 1, 2 recorded)."""
    return _proc.sdk_env(
        {"PROFILED_SAMPLE_RATE": "0", "PROFILED_SCHEDULE": "warmup=1,active=2", **env}
    )


def _signal(sig: int, after_s: float = 0.0):
    """A poke: steps run for ``after_s`` (no window opens, sampling rate 0), then ``sig``."""

    def poke(proc, cwd) -> None:
        time.sleep(after_s)
        os.kill(proc.pid, sig)

    return poke


def _write_trigger_file(proc, cwd) -> bool:
    time.sleep(0.3)
    running = proc.poll() is None
    (cwd / "profile-now").write_text("")
    return running


@pytest.fixture(scope="module")
def ahead_triggered(request, tmp_path_factory):
    """The programs of the tests before this module's in-process ones, each its own process as
    before, run (and signalled) two at a time as the first of them starts."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:
        for own in (False, True):
            env = {"PROFILED_TRIGGER": "SIGUSR2", **({"OWN_HANDLER": "1"} if own else {})}
            key = f"test_signal_opens_one_window_and_chains_the_handler_already_there[{own}]"
            ahead.call(key, _exchange(PROGRAM, _triggered(env), _signal(signal.SIGUSR2, 0.3)))
        ahead.call(
            "test_without_a_trigger_the_signal_keeps_its_default_action",
            _exchange(PROGRAM, _triggered({}), _signal(signal.SIGUSR2)),
        )
        key = "test_trigger_file_opens_a_window_and_is_removed"
        cwd = ahead.directory(key)
        if cwd is not None:
            env = _triggered({"PROFILED_TRIGGER": str(cwd / "profile-now")})
            ahead.call(key, _exchange(PROGRAM, env, _write_trigger_file))
        yield ahead


def _result(ran: dict) -> dict:
    assert ran["ready"] == "ready\n", ran["err"]
    assert ran["rc"] == 0, ran["err"]
    return json.loads(ran["out"].strip().splitlines()[-1])


@pytest.mark.parametrize("own_handler", [False, True])
def test_signal_opens_one_window_and_chains_the_handler_already_there(
    ahead_triggered, request, own_handler
):
    # PROGRAM with PROFILED_TRIGGER=SIGUSR2 (and its own handler): steps run 0.3 s, no window
    # opens (sampling rate 0), then SIGUSR2
    ran, _cwd = ahead_triggered[request.node.name]
    result = _result(ran)
    assert len(result["steps"]) == 1 and len(result["steps"][0]) == 2
    assert result["chained"] == (1 if own_handler else 0)


def test_without_a_trigger_the_signal_keeps_its_default_action(ahead_triggered, request):
    ran, _cwd = ahead_triggered[request.node.name]  # PROGRAM, SIGUSR2 once it is ready
    assert ran["ready"] == "ready\n", ran["err"]
    assert ran["rc"] == -signal.SIGUSR2  # nothing of ours was installed


def test_trigger_file_opens_a_window_and_is_removed(ahead_triggered, request):
    # PROGRAM with PROFILED_TRIGGER=<its directory>/profile-now, written 0.3 s after ready
    ran, cwd = ahead_triggered[request.node.name]
    result = _result(ran)
    assert ran["poked"] is True  # it was still running when the file came
    assert len(result["steps"]) == 1
    assert not (cwd / "profile-now").exists()


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


REFUSED_SIGNALS = ["SIGTERM", "SIGINT", "SIGHUP"]


@pytest.fixture(scope="module")
def ahead_refused(request, tmp_path_factory):
    """The programs of the tests after this module's in-process ones, each its own process as
    before, run (and signalled) two at a time as the first of them starts."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:
        for name in REFUSED_SIGNALS:
            env = _proc.sdk_env(
                PROFILED_SAMPLE_RATE="0",
                THE_SIGNAL=name,
                PROFILED_SCHEDULE="warmup=0,active=1",
                PROFILED_TRIGGER=name,
            )
            key = f"test_a_signal_that_is_not_ours_to_take_is_refused[{name}]"
            ahead.call(key, _exchange(REFUSED, env, _signal(getattr(signal, name))))
        ahead.call(
            "test_sigusr1_opens_a_window_too",
            _exchange(
                PROGRAM, _triggered({"PROFILED_TRIGGER": "USR1"}), _signal(signal.SIGUSR1, 0.3)
            ),
        )
        yield ahead


@pytest.mark.parametrize("name", REFUSED_SIGNALS)
def test_a_signal_that_is_not_ours_to_take_is_refused(ahead_refused, request, name):
    # REFUSED, its own handler on {name}, PROFILED_TRIGGER={name}: {name} once it is ready
    ran, _cwd = ahead_refused[request.node.name]
    result = _result(ran)
    err = ran["err"]
    assert result == {"steps": [], "got": 1, "untouched": True}  # only the program's handler
    warned = [line for line in err.splitlines() if "ConfigWarning" in line]
    assert len(warned) == 1, err
    assert f"PROFILED_TRIGGER={name!r} is invalid" in warned[0]
    assert "expected one of SIGUSR2, SIGUSR1" in warned[0]
    assert "using the default PROFILED_TRIGGER=unset" in warned[0]


def test_sigusr1_opens_a_window_too(ahead_refused, request):
    ran, _cwd = ahead_refused[request.node.name]  # PROFILED_TRIGGER=USR1; SIGUSR1 after 0.3 s
    result = _result(ran)
    assert len(result["steps"]) == 1 and len(result["steps"][0]) == 2


def test_arming_a_refused_signal_directly_warns_and_leaves_its_handler():
    from instrument.runtime import triggers

    before = signal.getsignal(signal.SIGTERM)
    with pytest.warns(UserWarning, match="SIGUSR2, SIGUSR1; the trigger is off"):
        assert triggers.arm("SIGTERM", lambda: None) is None
    assert signal.getsignal(signal.SIGTERM) is before
