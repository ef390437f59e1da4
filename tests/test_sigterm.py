"""Issue 29, item 16: SIGTERM (how torchrun, Kubernetes and Slurm end a job) exports the open
window and the last metrics interval within the export deadline, and the process still ends
BY the signal (the status a launcher sees); a program's own handler, Python or C, keeps its
behaviour; a SIGTERM that lands while the main thread holds an SDK lock never hangs.

Real programs, real signals: each child says "ready" once its window records, the test sends
SIGTERM and reads what the child's json exporter wrote. Before the fix every case here lost
the window and the metrics (SIGTERM's default action ends the process at once).
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from tests import _proc
from tests._records import metrics_records, window_records

PROGRAM = r"""
import os, signal, sys, threading, time
import torch
import instrument
from instrument import profiled

WHERE = sys.argv[1]
x = torch.randn(16, 16)

if WHERE == "own-handler":
    def handler(signum, frame):
        print("own handler ran", flush=True)
        raise SystemExit(7)
    signal.signal(signal.SIGTERM, handler)
elif WHERE == "c-handler":
    import faulthandler
    faulthandler.register(signal.SIGTERM, chain=False)  # a C handler: dumps the stacks


@profiled("inner")
def inner():
    if WHERE == "inside-call":
        time.sleep(0.01)  # the signal lands inside a decorated call
    return x @ x


@profiled("train_step", step=True)
def train_step():
    return inner() + 1


steps = 0
deadline = time.monotonic() + (4 if WHERE == "c-handler" else 300)
while time.monotonic() < deadline:
    train_step()
    steps += 1
    if steps == 5:
        print("ready", flush=True)
        if WHERE == "holding-lock":
            with instrument.runtime.state.lock:  # interrupted holding an SDK lock: must not hang
                time.sleep(300)
    if WHERE in ("between-steps", "c-handler"):
        time.sleep(0.01)  # lands between steps, outside the SDK
    elif WHERE == "busy":
        sum(range(20000))  # lands in plain Python code
print("ended on its own", flush=True)
"""


def _settings(cwd, **env: str) -> dict[str, str]:
    settings = {
        "PROFILED_EXPORTERS": "json",
        "PROFILED_JSON_PATH": str(cwd / "r.jsonl"),
        "PROFILED_SCHEDULE": "warmup=0,active=100000",
        "PROFILED_EXPORT_TIMEOUT_S": "30",
        "PROFILED_ACTIVITIES": "cpu",
    }
    settings.update(env)
    return _proc.sdk_env(settings)


def _terminated(where: str, env: dict[str, str], pause_s: float = 0.0):
    """PROGRAM at ``where``, sent SIGTERM ``pause_s`` after it said it is ready (its window
    recording): what it printed and how it ended, on a thread of ``Ahead``'s (the test
    asserts)."""

    def run(cwd) -> dict:
        (cwd / "prog.py").write_text(PROGRAM)
        child = _proc.start("prog.py", where, env=env, cwd=cwd)
        assert child.stdout is not None
        line = child.stdout.readline()
        if line != "ready\n":
            child.kill()
            out, err = child.communicate(timeout=120)
            return {"ready": line, "out": out, "err": err, "rc": child.returncode}
        time.sleep(pause_s)
        child.send_signal(signal.SIGTERM)
        try:
            out, err = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            return {"ready": line, "hung": True, "out": out, "err": err, "rc": child.returncode}
        return {"ready": line, "out": out, "err": err, "rc": child.returncode}

    return run


WHERE = ["inside-call", "between-steps", "busy"]


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """Every program of this module (each its own process, started, signalled and read as
    before), run two at a time as the module starts; a test reads its own."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:

        def add(key, where, pause_s=0.0, **env):
            cwd = ahead.directory(key)
            if cwd is not None:
                ahead.call(key, _terminated(where, _settings(cwd, **env), pause_s))

        for where in WHERE:
            add(
                f"test_sigterm_exports_the_open_window_and_metrics_then_ends_by_the_signal[{where}]",
                where,
            )
        add(
            "test_sigterm_with_metrics_only_writes_the_last_interval",
            "busy",
            PROFILED_SCHEDULE="skip_first=1000000",
        )
        add("test_a_programs_own_sigterm_handler_keeps_its_behaviour", "own-handler")
        add("test_a_c_level_sigterm_handler_is_kept", "c-handler", 0.2)
        # 0.2 s: into the sleep under the lock
        add(
            "test_sigterm_while_the_main_thread_holds_an_sdk_lock_never_hangs",
            "holding-lock",
            0.2,
            PROFILED_EXPORT_TIMEOUT_S="2",
        )
        yield ahead


def _term(ahead, request) -> tuple[dict, object]:
    """The test's run: it said it was ready, then ended after its SIGTERM; and its JSON lines
    file."""
    ran, cwd = ahead[request.node.name]
    assert ran["ready"] == "ready\n", ran
    assert not ran.get("hung"), f"hung after SIGTERM: {ran['err'][-3000:]}"
    return ran, cwd / "r.jsonl"


@pytest.mark.parametrize("where", WHERE)
def test_sigterm_exports_the_open_window_and_metrics_then_ends_by_the_signal(ahead, request, where):
    ran, path = _term(ahead, request)
    out, err = ran["out"], ran["err"]
    assert ran["rc"] == -signal.SIGTERM, err[-3000:]
    assert "ended on its own" not in out
    text = path.read_text()
    windows = window_records(text)
    assert len(windows) == 1 and windows[0]["partial"], text[:2000]
    assert windows[0]["steps"], windows[0]
    assert metrics_records(text), "the last metrics interval was not written"
    assert "Traceback" not in err, err[-3000:]


def test_sigterm_with_metrics_only_writes_the_last_interval(ahead, request):
    """No window ever opens (the schedule skips them all): the metrics interval still goes."""
    ran, path = _term(ahead, request)
    assert ran["rc"] == -signal.SIGTERM
    text = path.read_text()
    assert not window_records(text) and metrics_records(text)


def test_a_programs_own_sigterm_handler_keeps_its_behaviour(ahead, request):
    """Its graceful exit (SystemExit(7) here) runs the exit hook: the window is exported."""
    ran, path = _term(ahead, request)
    assert "own handler ran" in ran["out"]
    assert ran["rc"] == 7, ran["err"][-3000:]
    windows = window_records(path.read_text())
    assert len(windows) == 1 and windows[0]["partial"]


def test_a_c_level_sigterm_handler_is_kept(ahead, request):
    """``faulthandler.register(SIGTERM)`` (a handler Python's getsignal reports as the
    default): ours would have replaced it and ended the process; it dumps the stacks and
    the program goes on to end on its own (SIGTERM 0.2 s after it is ready)."""
    ran, path = _term(ahead, request)
    out, err = ran["out"], ran["err"]
    assert ran["rc"] == 0, err[-3000:]
    assert "ended on its own" in out
    assert "Most recent call first" in err or "most recent call first" in err
    assert len(window_records(path.read_text())) == 1, err[-3000:]  # exported at its exit


def test_sigterm_while_the_main_thread_holds_an_sdk_lock_never_hangs(ahead, request):
    """The export runs on another thread bounded by the deadline: it cannot take the lock the
    interrupted main thread holds, so the process ends by the signal when the deadline
    passes, saying what was lost."""
    ran, _path = _term(ahead, request)  # SIGTERM 0.2 s into the sleep under the lock
    err = ran["err"]
    assert ran["rc"] == -signal.SIGTERM, err[-3000:]
    assert "torch-profiled: SIGTERM:" in err, err[-3000:]
