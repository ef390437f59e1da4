"""Issue 29, second round, SIGTERM: real programs, real signals.

- A program's handler installed over ours that chains to it (PyTorch Lightning's signal
  connector, submitit) keeps its graceful shutdown: ours, called from it, does nothing (it
  used to end the process at once, exit status -15).
- A main thread stuck in native code (a hung collective: here a mutex locked twice, with the
  GIL released) still ends by SIGTERM (it used to hang until the launcher's SIGKILL).
- A SIGTERM that lands while the SDK starts or stops a window (sent from inside torch's
  start or stop) exports every window and ends by the signal at once (it used to deadlock on
  the session's lock until the export deadline, the window lost).
- Ctrl-C while our handler exports, a ``shutdown()`` running on another thread, Ctrl-C during
  an exit export run from ``atexit``.
- A forked child SIGTERMed at any moment after the fork ends by it, as it would without us
  (one that came before CPython's fork handling in the child used to be lost: the child lived
  on), and never wakes the parent's watchdog (forked on a thread, it used to end the parent).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests import _proc
from tests._records import window_records

PROGRAM = r"""
import atexit, ctypes, functools, os, signal, sys, threading, time

MODE, ARG = sys.argv[1], sys.argv[2]
VARIANT = ""  # fork-child: how the child forked next gets its SIGTERM


def term_self(when):  # a program's fork hook that ends its child at once
    if VARIANT == when:
        os.kill(os.getpid(), signal.SIGTERM)


os.register_at_fork(after_in_child=lambda: term_self("hook-first"))  # runs before the SDK's

import torch
import instrument
from exporters import Exporter, ExportResult
from instrument import Schedule, profiled


class Slow(Exporter):
    # a backend that takes its time (and says so), then prints what it exported
    def export(self, report):
        if MODE in ("ctrl-c-in-handler", "shutdown-elsewhere", "atexit-ctrl-c"):
            print("in export", flush=True)
            threading.Event().wait(float(ARG))
        print(f"slow exported window {report.window}", flush=True)
        return ExportResult.SUCCESS


exporters = ["json"] + ([Slow()] if MODE != "in-sdk" else [])
instrument.configure(
    exporters=exporters,
    schedule=Schedule(warmup=0, active=1000) if MODE != "in-sdk" else Schedule(warmup=0, active=2),
    **({"every": 5} if MODE == "in-sdk" else {}),
    activities=["cpu"],
    export_timeout_s=20,
)
x = torch.randn(8, 8)

if MODE == "in-sdk":  # the SIGTERM comes from inside torch's profiler start or stop
    from instrument.runtime import _torch

    real = getattr(_torch.ProfilerWindow, ARG)
    calls = [0]

    def patched(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:  # the second window's
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *args, **kwargs)

    setattr(_torch.ProfilerWindow, ARG, patched)


@profiled("train_step", step=True)
def train_step():
    if MODE == "in-sdk":
        time.sleep(0.002)  # a step's work lets the GIL go (a tight pure-Python loop holds it)
    return x @ x


train_step()  # the ambient session starts: our SIGTERM handler is armed

stop = False
if MODE.startswith("chain"):
    prev = signal.getsignal(signal.SIGTERM)

    def graceful(signum, frame):  # Lightning's connector: note it, call the previous one
        global stop
        stop = True
        if callable(prev):
            prev(signum, frame)
        if MODE == "chain-exit":
            sys.exit(3)

    signal.signal(signal.SIGTERM, graceful)
elif MODE == "wakeup-fd":
    print("kept", signal.set_wakeup_fd(-1) == int(ARG), flush=True)
    sys.exit(0)
elif MODE == "atexit-ctrl-c":  # a training thread still runs at exit: the export runs in atexit
    atexit.register(lambda: print("the program's atexit ran", flush=True))

    def late():  # registered after ours (the exit waits for this thread): runs before ours
        time.sleep(0.5)
        atexit.register(lambda: print("the late atexit ran", flush=True))

    threading.Thread(target=late).start()

if MODE == "shutdown-elsewhere":
    for _ in range(3):
        train_step()
    threading.Thread(target=instrument.shutdown).start()  # exports on that thread
    while True:  # its next decorated call stops the window, as shutdown() asks
        train_step()
        time.sleep(0.01)

for i in range(4 if MODE == "atexit-ctrl-c" else (30 if MODE == "in-sdk" else 2)):
    train_step()
if MODE == "in-sdk":
    print("not ended by the signal", flush=True)
    sys.exit(0)
if MODE == "atexit-ctrl-c":
    sys.exit(0)
print("ready", flush=True)

if MODE == "stuck":  # a hung collective: native code that no signal interrupts, GIL released
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # PTHREAD_MUTEX_INITIALIZER: all zero
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # never returns
elif MODE == "fork-child":  # children SIGTERMed right after the fork, at every moment
    os.register_at_fork(after_in_child=lambda: term_self("hook-last"))  # after the SDK's
    # inside libc's fork(), before any of Python's own fork handling in the child: libc's
    # raise() from a pthread_atfork handler (PyDLL: no Python code runs, so no Python handler
    # meets the signal there), as when the child is signalled before it first runs
    in_fork = ctypes.c_int(0)  # raise(0) sends nothing
    at_fork = ctypes.CFUNCTYPE(None)(functools.partial(ctypes.PyDLL(None)["raise"], in_fork))
    libc = ctypes.CDLL(None)
    try:  # glibc's pthread_atfork is a static stub over its exported __register_atfork
        libc.pthread_atfork(None, None, at_fork)
    except AttributeError:
        libc["__register_atfork"](None, None, at_fork, None)

    def fork(variant, delay=None):
        global VARIANT
        VARIANT = variant
        in_fork.value = signal.SIGTERM if variant.endswith("in-fork") else 0
        pid = os.fork()
        if pid == 0:
            if variant == "child-first":
                os.kill(os.getpid(), signal.SIGTERM)
            devnull = os.open(os.devnull, os.O_WRONLY)  # the test's pipes: not held open
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            time.sleep(20)
            os._exit(0)
        VARIANT, in_fork.value = "", 0
        if delay is not None:
            time.sleep(delay)
            os.kill(pid, signal.SIGTERM)
        children.append((variant, pid))

    def reap(within):  # each child's end, SIGKILLed if it outlived its SIGTERM
        deadline = time.monotonic() + within
        for variant, pid in children:
            while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
            if done[0] == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                print(variant, "outlived SIGTERM", flush=True)
            elif os.WIFSIGNALED(done[1]):
                print(variant, "ended by", signal.Signals(os.WTERMSIG(done[1])).name, flush=True)
            else:
                print(variant, "exited", os.WEXITSTATUS(done[1]), flush=True)
        children.clear()

    children = []
    for delay in (0, 0.0002, 0.001, 0.005):
        fork(f"parent+{delay:g}", delay)
    for variant in ("in-fork", "hook-first", "hook-last", "child-first"):
        fork(variant)
    fork("child")
    print("child", children[-1][1], flush=True)  # the test sends it SIGTERM
    reap(5)
    for args in (("thread+0", 0), ("thread-in-fork",)):  # forked with our wakeup fd set
        worker = threading.Thread(target=fork, args=args)
        worker.start()
        worker.join()
    reap(5)
    time.sleep(3)  # past the watchdog's grace: the children's SIGTERMs must not end us
    print("parent alive", flush=True)
    sys.exit(0)

try:
    while not stop:
        train_step()
        time.sleep(0.01)
except KeyboardInterrupt:
    print("the program caught KeyboardInterrupt and goes on", flush=True)
    while True:
        time.sleep(0.01)
print("graceful path: checkpoint saved", flush=True)
"""


def _start(tmp_path, mode: str, arg: str = "0") -> tuple[subprocess.Popen, object]:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    path = tmp_path / "r.jsonl"
    env = _proc.sdk_env(PROFILED_JSON_PATH=str(path))
    child = _proc.start(str(script), mode, arg, env=env, cwd=tmp_path)
    return child, path


def _wait_for(child: subprocess.Popen, line: str) -> list[str]:
    assert child.stdout is not None
    seen = []
    while (got := child.stdout.readline()) and got != line + "\n":
        seen.append(got)
    assert got == line + "\n", (seen, child.communicate(timeout=120))
    return seen


def _end(child: subprocess.Popen, timeout: float = 90) -> tuple[str, str]:
    try:
        return child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        raise AssertionError(f"hung after SIGTERM: {out[-2000:]} {err[-3000:]}") from None


@pytest.mark.parametrize("mode, status", [("chain-flag", 0), ("chain-exit", 3)])
def test_a_handler_that_chains_to_ours_keeps_its_graceful_shutdown(tmp_path, mode, status):
    child, path = _start(tmp_path, mode)
    _wait_for(child, "ready")
    child.send_signal(signal.SIGTERM)
    out, err = _end(child)
    assert child.returncode == status, (child.returncode, err[-3000:])
    if mode == "chain-flag":
        assert "graceful path: checkpoint saved" in out
    assert "Traceback" not in err, err[-3000:]
    assert len(window_records(path.read_text())) == 1, err[-3000:]  # the exit hook exported


def test_sigterm_ends_a_main_thread_stuck_in_native_code(tmp_path):
    child, _ = _start(tmp_path, "stuck")
    _wait_for(child, "ready")
    time.sleep(0.3)  # into the second lock
    child.send_signal(signal.SIGTERM)
    out, err = _end(child, timeout=60)
    assert child.returncode == -signal.SIGTERM, err[-3000:]
    assert "did not reach Python code" in err, err[-3000:]


@pytest.fixture(scope="module")
def forked(tmp_path_factory) -> tuple[int | None, str, str]:
    """One run of the fork-child program: children SIGTERMed at once from the parent, from
    inside libc's fork, from the program's fork hooks, by themselves, forked on a thread, and
    one the test sends SIGTERM as soon as it reads its pid. Each child would sleep 20 s; the
    program waits 5 s for them all, SIGKILLs the rest and says which outlived the signal."""
    child, _ = _start(tmp_path_factory.mktemp("fork"), "fork-child")
    seen = _wait_for(child, "ready")
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("child "), (seen, line, child.communicate(timeout=60))
    os.kill(int(line.split()[1]), signal.SIGTERM)
    # line by line (the program ends within seconds, or dies): readline() may have buffered
    # lines that communicate() would not see
    lines = []
    while (got := child.stdout.readline()) and got != "parent alive\n":
        lines.append(got)
    out, err = _end(child)
    return child.returncode, "".join(lines) + got + out, err


def test_a_forked_childs_sigterm_does_not_wake_the_parents_watchdog(forked):
    status, out, err = forked
    assert "child ended by SIGTERM" in out, (out, err[-3000:])
    assert status == 0, (out, err[-3000:])
    assert "parent alive" in out, err[-3000:]


@pytest.mark.parametrize(
    "variant",
    [
        *(f"parent+{d:g}" for d in (0, 0.0002, 0.001, 0.005)),
        "in-fork",  # before CPython's fork handling in the child: ours used to lose it
        "hook-first",
        "hook-last",
        "child-first",
        "thread+0",  # forked on a thread: it also woke the parent's watchdog
        "thread-in-fork",
    ],
)
def test_a_sigterm_at_any_moment_after_fork_ends_the_child(forked, variant):
    """Ours is the parent's handler: the child still ends by SIGTERM's default action,
    whenever it comes (it used to outlive one that came before Python's fork hooks ran)."""
    _, out, err = forked
    assert f"{variant} ended by SIGTERM" in out, (out, err[-3000:])


def test_the_programs_signal_wakeup_fd_is_kept(tmp_path):
    """asyncio's event loop uses the one wakeup fd: the watchdog does not take it."""
    script = tmp_path / "w.py"
    script.write_text(
        "import socket, signal, subprocess, sys\n"
        "a, b = socket.socketpair(); a.setblocking(False)\n"
        "signal.set_wakeup_fd(a.fileno())\n"
        "sys.argv = ['prog.py', 'wakeup-fd', str(a.fileno())]\n"
        f"exec(compile(open({str(tmp_path / 'prog.py')!r}).read(), 'prog.py', 'exec'))\n"
    )
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = _proc.sdk_env(PROFILED_JSON_PATH=str(tmp_path / "r.jsonl"))
    done = _proc.run(str(script), env=env, cwd=tmp_path)
    assert "kept True" in done.stdout, (done.stdout, done.stderr[-3000:])


@pytest.mark.parametrize("where", ["stop", "start"])
def test_sigterm_inside_a_window_start_or_stop_exports_every_window(tmp_path, where):
    """Sent from inside torch's start or stop (the SDK holds the session's lock there): the
    signal waits for the block and the lock; every window that recorded a step is exported,
    and the process ends by the signal without waiting for the export deadline (20 s)."""
    child, path = _start(tmp_path, "in-sdk", where)
    out, err = _end(child)
    assert child.returncode == -signal.SIGTERM, (out, err[-3000:])
    assert "not ended by the signal" not in out
    assert "torch-profiled: SIGTERM" not in err, err[-3000:]  # nothing lost, no deadline
    windows = window_records(path.read_text())
    # the second window: ended by its stop, or, its start interrupted, ended with no step
    # recorded (nothing to export: one line says so); the signal is met once the main
    # thread lets the SDK's lock go, and another thread sends it again: a step may pass
    got = [w["window"] for w in windows]
    assert got == list(range(len(got))) and len(got) >= (2 if where == "stop" else 1), got
    assert all(w["steps"] for w in windows), windows


def test_ctrl_c_while_our_handler_exports_still_ends_by_sigterm(tmp_path):
    child, _ = _start(tmp_path, "ctrl-c-in-handler", "60")
    _wait_for(child, "ready")
    child.send_signal(signal.SIGTERM)
    _wait_for(child, "in export")
    time.sleep(0.2)
    child.send_signal(signal.SIGINT)
    out, err = _end(child)
    assert child.returncode == -signal.SIGTERM, (out, err[-3000:])
    assert "caught KeyboardInterrupt" not in out
    assert "interrupted (KeyboardInterrupt)" in err or "interrupted (Ctrl-C)" in err, err[-3000:]


def test_sigterm_while_another_thread_runs_shutdown_waits_for_its_export(tmp_path):
    child, _ = _start(tmp_path, "shutdown-elsewhere", "2")
    _wait_for(child, "in export")
    child.send_signal(signal.SIGTERM)
    out, err = _end(child)
    assert child.returncode == -signal.SIGTERM, (out, err[-3000:])
    assert "slow exported window 0" in out, err[-3000:]


def test_ctrl_c_during_an_exit_export_run_from_atexit_runs_each_function_once(tmp_path):
    """A thread still ran at exit, so the export runs from atexit: Ctrl-C there says what was
    abandoned once, and the program's atexit functions run once (atexit's own run goes on),
    never again from inside it."""
    child, _ = _start(tmp_path, "atexit-ctrl-c", "60")
    seen = _wait_for(child, "in export")
    time.sleep(0.2)
    child.send_signal(signal.SIGINT)
    out, err = _end(child)
    out = "".join(seen) + out
    assert out.count("the program's atexit ran") == 1, (out, err[-3000:])
    assert out.count("the late atexit ran") == 1, (out, err[-3000:])
    assert err.count("interrupted (Ctrl-C) while exporting at exit") == 1, err[-3000:]
    assert "RecursionError" not in err and "Traceback" not in err, err[-3000:]
