"""Issue 29, items 1, 10 and 15: a trigger never ends the program and never loses its data.

Real programs, real signals (``os.kill``): a process started with ``PROFILED_TRIGGER=SIGxxx``
survives the signal whenever it comes (before the first decorated call, with profiling off,
after ``shutdown()``), a handler the program or C code (``faulthandler``) put there keeps
working, and a file trigger never removes what was at its path before it was armed, nor a file
with content.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import time
import warnings

import pytest
import torch

from exporters import InMemoryExporter
from instrument import Schedule, profiled, session
from instrument.runtime import triggers
from instrument.runtime._atomic import atomic
from tests import _proc

X = torch.randn(4, 4)


@profiled("train_step", step=True)
def train_step() -> torch.Tensor:
    return X @ X


# The signal three times: before the first decorated call (a job still loading its
# checkpoint), between steps, and (twice) after shutdown(). Sampling never opens a window
# here (rate 0): only the trigger does, one recorded step each.
NEVER_KILLS = r"""
import json, os, signal
sig = getattr(signal, os.environ["SIG"])
own = []
if os.environ.get("OWN_HANDLER"):  # the program's own handler, installed before the import
    signal.signal(sig, lambda signum, frame: own.append(signum))
import torch
import instrument
from instrument import profiled
from exporters import InMemoryExporter

mem = InMemoryExporter()
instrument.configure(exporters=[mem])
os.kill(os.getpid(), sig)  # still loading: no decorated call yet

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

x = torch.randn(4, 4)
for _ in range(4):
    train_step(x)
instrument.flush()
first = [r.reason.kind for r in mem.reports]
os.kill(os.getpid(), sig)  # between steps
for _ in range(4):
    train_step(x)
instrument.shutdown()
os.kill(os.getpid(), sig)  # after shutdown(), twice
os.kill(os.getpid(), sig)
print(json.dumps({"first": first, "reasons": [r.reason.kind for r in mem.reports],
                  "own": len(own)}), flush=True)
"""


def _said(stderr: str, text: str) -> list[str]:
    return [line for line in stderr.splitlines() if text in line]


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """The programs of the tests that read what one run printed (signalled while loading, as
    before, where a test did), run two at a time as the module starts, each its own process;
    a test reads its own. (Not the file triggers' in this process, nor the program run after
    them: their polls keep pace.)"""
    with _proc.Ahead(request, tmp_path_factory) as ahead:

        def add(key: str, code: str, **env: str) -> None:
            ahead.add(key, "-c", code, env=_proc.sdk_env(env))

        trigger_only = {"PROFILED_SAMPLE_RATE": "0", "PROFILED_SCHEDULE": "warmup=0,active=1"}
        for name, enabled, own in NEVER_KILLS_CASES:
            key = f"test_the_trigger_signal_never_ends_the_process[{name}-{enabled}-{own}]"
            more = {"OWN_HANDLER": "1"} if own else {}
            add(key, NEVER_KILLS, SIG=name, PROFILED_TRIGGER=name, PROFILED_ENABLED=enabled,
                **trigger_only, **more)  # fmt: skip
        for name in LOADING_SIGNALS:
            env = _proc.sdk_env(PROFILED_TRIGGER=name, **trigger_only)
            key = f"test_a_signal_sent_while_the_job_loads_opens_a_window_later[{name}]"
            ahead.call(key, _signalled_while_loading(name, env))
        add(
            "test_configure_cycles_keep_one_handler_and_shutdown_leaves_it_idle",
            CONFIGURE_CYCLES,
            PROFILED_EXPORTERS="memory",
        )
        add(
            "test_a_session_started_in_another_thread_takes_the_handler_installed_at_import",
            IN_ANOTHER_THREAD,
            **TRIGGER_ONLY,
        )
        add(
            "test_after_an_explicit_session_the_ambient_one_still_takes_the_signal",
            AFTER_EXPLICIT,
            **TRIGGER_ONLY,
        )
        add(
            "test_imported_outside_the_main_thread_it_says_so_and_the_session_installs_it",
            IMPORTED_IN_A_THREAD,
            PROFILED_TRIGGER="usr1",
            PROFILED_EXPORTERS="memory",
        )
        for name, where in C_HANDLER_CASES:
            key = f"test_a_handler_installed_by_c_code_is_never_dropped[{name}-{where}]"
            add(key, C_HANDLER, SIG=name, WHERE=where, PROFILED_TRIGGER=name, **trigger_only)
        yield ahead


NEVER_KILLS_CASES = [
    ("SIGUSR2", "1", False),
    ("SIGUSR1", "1", True),
    ("SIGUSR2", "0", True),
    ("SIGUSR1", "0", False),
]


@pytest.mark.parametrize("name, enabled, own_handler", NEVER_KILLS_CASES)
def test_the_trigger_signal_never_ends_the_process(ahead, request, name, enabled, own_handler):
    result, _cwd = ahead[request.node.name]  # NEVER_KILLS with these settings
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["own"] == (4 if own_handler else 0)  # chained every time, ours never replaced it
    if enabled == "1":
        # the request that came before the first decorated call opened the first window
        assert out["first"] == ["trigger"]
        assert out["reasons"] == ["trigger", "trigger"]
        (line,) = _said(result.stderr, "arrived while profiling has ended")  # once, not twice
        assert f"the trigger signal {name}" in line and "the program goes on" in line
    else:
        assert out == {"first": [], "reasons": [], "own": out["own"]}
        (line,) = _said(result.stderr, "arrived while profiling is off")  # once for all four
        assert "PROFILED_ENABLED=0" in line


# An operator signals a job that is still loading (a sleep here), before its first decorated
# call; the program goes on to its steps and the request opens a window there.
LOADING = r"""
import json, os, sys, time
import torch
import instrument
from instrument import profiled
from exporters import InMemoryExporter

mem = InMemoryExporter()
instrument.configure(exporters=[mem])
print("loading", flush=True)
while not os.path.exists("sent"):  # the parent signals, then creates the file
    time.sleep(0.01)

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

x = torch.randn(4, 4)
deadline = time.monotonic() + 60
while not mem.reports and time.monotonic() < deadline:
    train_step(x)
    instrument.flush(0.01)
instrument.shutdown()
print(json.dumps([r.reason.kind for r in mem.reports]), flush=True)
"""


def _signalled_while_loading(name: str, env: dict[str, str]):
    """LOADING in ``env`` (made on the test's thread), sent ``name`` once it says it is
    loading, then told it was sent: what it said and how it ended (on a thread of
    ``Ahead``'s; the test asserts)."""

    def run(cwd) -> dict:
        proc = _proc.start("-c", LOADING, env=env, cwd=cwd)
        try:
            line = proc.stdout.readline()
            if line == "loading\n":
                os.kill(proc.pid, getattr(signal, name))
                (cwd / "sent").write_text("")
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
            proc.wait()
        return {"line": line, "out": out, "err": err, "rc": proc.returncode}

    return run


LOADING_SIGNALS = ["SIGUSR2", "SIGUSR1"]


@pytest.mark.parametrize("name", LOADING_SIGNALS)
def test_a_signal_sent_while_the_job_loads_opens_a_window_later(ahead, request, name):
    ran, _cwd = ahead[request.node.name]  # LOADING, sent {name} while it loads
    assert ran["line"] == "loading\n", ran["err"]
    assert ran["rc"] == 0, (ran["rc"], ran["err"][-3000:])  # was -10/-12: killed
    assert json.loads(ran["out"].strip().splitlines()[-1]) == ["trigger"]


CONFIGURE_CYCLES = (
    "import os, signal, torch, instrument\n"
    "from instrument import profiled\n"
    "@profiled('work')\n"
    "def work():\n"
    "    return torch.ones(2) + 1\n"
    "seen = []\n"
    "for n in range(3):\n"
    "    instrument.configure(trigger='SIGUSR2', activities=['cpu'])\n"
    "    work()\n"
    "    seen.append(signal.getsignal(signal.SIGUSR2))\n"
    "assert callable(seen[0]) and all(h is seen[0] for h in seen), seen\n"
    "instrument.shutdown()\n"
    "assert signal.getsignal(signal.SIGUSR2) is seen[0]\n"
    "for _ in range(3):\n"
    "    os.kill(os.getpid(), signal.SIGUSR2)\n"
    "print('still alive', flush=True)\n"
)


def test_configure_cycles_keep_one_handler_and_shutdown_leaves_it_idle(ahead, request):
    """A trigger set in code (no variable): configure() cycles never stack handlers, and after
    shutdown() the signal is ignored (said once) instead of ending the program."""
    result, _cwd = ahead[request.node.name]  # CONFIGURE_CYCLES
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert result.stdout == "still alive\n"
    assert len(_said(result.stderr, "SIGUSR2 arrived while profiling has ended")) == 1


IN_ANOTHER_THREAD = (
    "import os, signal, threading, time, torch, instrument\n"
    "from instrument import profiled\n"
    "from exporters import InMemoryExporter\n"
    "mem = InMemoryExporter()\n"
    "instrument.configure(exporters=[mem])\n"
    "@profiled('step', step=True)\n"
    "def step():\n"
    "    return torch.ones(2) + 1\n"
    "started = threading.Event()\n"
    "def train():\n"
    "    step()\n"
    "    started.set()\n"
    "    deadline = time.monotonic() + 60\n"
    "    while not mem.reports and time.monotonic() < deadline:\n"
    "        step()\n"
    "        instrument.flush(0.01)\n"
    "t = threading.Thread(target=train)\n"
    "t.start()\n"
    "started.wait(60)\n"
    "os.kill(os.getpid(), signal.SIGUSR2)\n"
    "t.join()\n"
    "instrument.shutdown()\n"
    "print([r.reason.kind for r in mem.reports], flush=True)\n"
)

# a trigger on SIGUSR2 that only it opens windows of, one step each
TRIGGER_ONLY = {
    "PROFILED_TRIGGER": "SIGUSR2",
    "PROFILED_SAMPLE_RATE": "0",
    "PROFILED_SCHEDULE": "warmup=0,active=1",
}


def test_a_session_started_in_another_thread_takes_the_handler_installed_at_import(ahead, request):
    """Python installs handlers only from the main thread: the one put there at import lets a
    session that starts in a worker thread use the signal trigger all the same."""
    result, _cwd = ahead[request.node.name]  # IN_ANOTHER_THREAD, with TRIGGER_ONLY
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert result.stdout == "['trigger']\n"
    assert "outside the main thread" not in result.stderr


AFTER_EXPLICIT = (
    "import os, signal, time, torch, instrument\n"
    "from instrument import Schedule, profiled, session\n"
    "from exporters import InMemoryExporter\n"
    "ambient, explicit = InMemoryExporter(), InMemoryExporter()\n"
    "instrument.configure(exporters=[ambient])\n"
    "@profiled('step', step=True)\n"
    "def step():\n"
    "    return torch.ones(2) + 1\n"
    "step()\n"
    "with session(exporters=[explicit], sample_rate=0.0, trigger='SIGUSR2',\n"
    "             schedule=Schedule(warmup=0, active=1)) as s:\n"
    "    os.kill(os.getpid(), signal.SIGUSR2)\n"
    "    for _ in range(3):\n"
    "        s.step()\n"
    "for _ in range(3):\n"
    "    step()\n"
    "instrument.flush()\n"
    "before = len(ambient.reports)\n"
    "os.kill(os.getpid(), signal.SIGUSR2)\n"
    "for _ in range(3):\n"
    "    step()\n"
    "instrument.shutdown()\n"
    "print(len(explicit.reports), len(ambient.reports) - before, flush=True)\n"
)


def test_after_an_explicit_session_the_ambient_one_still_takes_the_signal(ahead, request):
    """Both sessions arm the same handler; the explicit one's end takes only its callback."""
    result, _cwd = ahead[request.node.name]  # AFTER_EXPLICIT, with TRIGGER_ONLY
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert result.stdout == "1 1\n"


IMPORTED_IN_A_THREAD = (
    "import os, signal, threading\n"
    "t = threading.Thread(target=lambda: __import__('instrument'))\n"
    "t.start(); t.join()\n"
    "import instrument\n"
    "from instrument import profiled\n"
    "@profiled('step', step=True)\n"
    "def step():\n"
    "    return 1\n"
    "step()\n"
    "instrument.shutdown()\n"
    "os.kill(os.getpid(), signal.SIGUSR1)\n"
    "print('alive', flush=True)\n"
)


def test_imported_outside_the_main_thread_it_says_so_and_the_session_installs_it(ahead, request):
    """Python installs handlers only from the main thread: an import elsewhere says until when
    the signal keeps its default action; the session's start on the main thread installs it."""
    result, _cwd = ahead[request.node.name]  # IMPORTED_IN_A_THREAD
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert result.stdout == "alive\n"
    (line,) = _said(result.stderr, "first imported outside the main thread")
    assert "PROFILED_TRIGGER=SIGUSR1" in line and "keeps the action it had" in line


# ---------------------------------------------------------------- a handler installed by C code

# faulthandler.register() puts a C handler on the signal, which signal.getsignal() cannot see
# (it reports SIG_DFL, or the Python handler it replaced). Each SIGUSRx must dump the stacks
# while the session runs and after shutdown(), and never end the program.
C_HANDLER = r"""
import faulthandler, json, os, signal, sys
sig = getattr(signal, os.environ["SIG"])
where = os.environ["WHERE"]
if where == "over a Python handler":
    signal.signal(sig, lambda signum, frame: None)
if where != "after the import":
    faulthandler.register(sig)
import torch
import instrument
from instrument import profiled
from exporters import InMemoryExporter
mem = InMemoryExporter()
instrument.configure(exporters=[mem])
if where == "after the import":
    faulthandler.register(sig)

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

x = torch.randn(4, 4)
for _ in range(3):
    train_step(x)
os.kill(os.getpid(), sig)  # the session runs
for _ in range(3):
    train_step(x)
instrument.shutdown()
os.kill(os.getpid(), sig)  # after shutdown()
print(json.dumps(len(mem.reports)), flush=True)
"""


def test_atomic_blocks_leave_a_c_handler_put_over_a_python_one():
    """``atomic()`` (around every window's start and stop) swaps Python handlers for stand-ins;
    where ``faulthandler.register`` sits over a Python handler, ``signal.getsignal`` still
    reports the Python one: swapping it would drop faulthandler's for good."""
    sig = signal.SIGUSR1
    before = signal.getsignal(sig)
    signal.signal(sig, lambda signum, frame: None)
    try:
        faulthandler.register(sig)
        try:
            c_handler = triggers._system_handler(sig)
            with atomic():
                assert triggers._system_handler(sig) == c_handler
            assert triggers._system_handler(sig) == c_handler
        finally:
            faulthandler.unregister(sig)
    finally:
        signal.signal(sig, before)


C_HANDLER_CASES = [
    ("SIGUSR1", "before the import"),
    ("SIGUSR2", "over a Python handler"),
    ("SIGUSR1", "after the import"),
]


@pytest.mark.parametrize("name, where", C_HANDLER_CASES)
def test_a_handler_installed_by_c_code_is_never_dropped(ahead, request, name, where):
    result, _cwd = ahead[request.node.name]  # C_HANDLER with SIG={name}, WHERE={where}
    dumps = result.stderr.count("Current thread")  # one per dump, whatever the threads
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert dumps == 2, result.stderr[-3000:]  # the stack dump, as the session runs and after
    assert result.stdout.strip() == "0"  # the signal never opened a window
    (line,) = _said(result.stderr, "already has a handler installed by C code")
    assert f"{name}: {name} already has" in line and "the trigger leaves it in place" in line
    assert "faulthandler.register()" in line and "at 0x" in line  # where it is, what it may be


# ---------------------------------------------------------------- file triggers: nothing is lost

OTHER_UID = 65534  # nobody


def _plant_before(kind: str, path, tmp_path) -> None:
    if kind == "a file with content":
        path.write_bytes(b"epoch=3\nlr=0.1\n")
    elif kind == "an empty file":
        path.write_bytes(b"")  # a request left from an earlier run, or someone's marker
    elif kind == "a file of another user":
        path.write_bytes(b"theirs")
        os.chown(path, OTHER_UID, OTHER_UID)
    elif kind == "a symlink to a file":
        (tmp_path / "target").write_bytes(b"keep me")
        path.symlink_to(tmp_path / "target")
    elif kind == "a directory":
        path.mkdir()
        (path / "inside").write_bytes(b"keep me too")


def _snapshot(path, tmp_path) -> tuple:
    st = os.lstat(path)
    if path.is_symlink():
        return (st.st_ino, os.readlink(path), (tmp_path / "target").read_bytes())
    if path.is_dir():
        return (st.st_ino, sorted(os.listdir(path)), (path / "inside").read_bytes())
    return (st.st_ino, st.st_uid, path.read_bytes())


def _remove(path) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    else:
        path.unlink()


def _wait_gone(path) -> None:
    deadline = time.monotonic() + 10  # generous: the poll takes it within POLL_S
    while os.path.lexists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.parametrize(
    "kind",
    [
        "a file with content",
        "an empty file",
        "a file of another user",
        "a symlink to a file",
        "a directory",
    ],
)
def test_what_is_at_the_trigger_path_when_armed_is_never_taken(tmp_path, kind):
    if kind == "a file of another user" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    path = tmp_path / "profile-now"
    _plant_before(kind, path, tmp_path)
    before = _snapshot(path, tmp_path)
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
            time.sleep(6 * triggers.POLL_S)  # several polls see it
            for _ in range(3):
                train_step()
            s.flush()
            assert mem.reports == []  # it did not fire
            assert _snapshot(path, tmp_path) == before  # nor was it touched
            # once it is gone, a request works
            _remove(path)
            _wait_for_a_poll()
            path.write_bytes(b"")
            _wait_gone(path)
            for _ in range(3):
                train_step()
    assert not os.path.lexists(path)
    assert len(mem.reports) == 1 and mem.reports[0].reason.kind == "trigger"
    said = [str(w.message) for w in caught if str(path) in str(w.message)]
    assert len(said) == 1, said  # once, as the trigger was armed
    assert "already holds something as the trigger is armed" in said[0]
    assert "never removed" in said[0] and "keeps watching" in said[0]


def _wait_for_a_poll() -> None:
    time.sleep(3 * triggers.POLL_S)  # the poll sees the path free (any later file is new)


def test_a_file_with_content_created_after_arming_is_never_removed(tmp_path):
    """The program itself may write a file at the path (a misconfigured PROFILED_TRIGGER
    naming an output): a request is empty, and data is never removed."""
    path = tmp_path / "metrics.json"
    mem = InMemoryExporter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with session(
            schedule=Schedule(warmup=0, active=1),
            sample_rate=0.0,
            trigger=str(path),
            exporters=[mem],
        ) as s:
            train_step()
            path.write_bytes(b'{"loss": 0.25}\n')
            time.sleep(6 * triggers.POLL_S)
            for _ in range(3):
                train_step()
            s.flush()
            assert mem.reports == [] and path.read_bytes() == b'{"loss": 0.25}\n'
            path.unlink()
            _wait_for_a_poll()
            path.touch()
            _wait_gone(path)
            for _ in range(3):
                train_step()
    assert len(mem.reports) == 1
    (line,) = [str(w.message) for w in caught if str(path) in str(w.message)]
    assert "is a file of 15 bytes" in line and "a request is empty" in line


# The finding as a program saw it: PROFILED_TRIGGER naming one of its own files.
OWN_FILE = r"""
import torch, instrument
from instrument import profiled

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

x = torch.randn(4, 4)
for _ in range(3):
    train_step(x)
import time
time.sleep(1.0)  # ten polls
for _ in range(3):
    train_step(x)
instrument.shutdown()
print(open("config.yaml").read(), end="", flush=True)
"""


def test_a_trigger_naming_an_existing_file_leaves_it_alone(tmp_path):
    (tmp_path / "config.yaml").write_text("lr: 0.1\n")
    env = _proc.sdk_env(PROFILED_TRIGGER="config.yaml", PROFILED_EXPORTERS="memory")
    result = _proc.run("-c", OWN_FILE, env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "lr: 0.1\n"  # was: FileNotFoundError, the file removed
    assert len(_said(result.stderr, "already holds something as the trigger is armed")) == 1
