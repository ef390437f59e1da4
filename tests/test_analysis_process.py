"""The analysis helper process (instrument/analysis_process.py): real windows, a real child
process, and faults injected into it with real signals."""

from __future__ import annotations

import os
import shutil
import signal
import time
import warnings

import pytest
import torch

import instrument
from exporters import InMemoryExporter
from instrument import ProfilerWarning, analysis_process, profiled, session
from instrument.analysis_process import AnalysisProcess, AnalysisProcessError, shape_and_analyse
from instrument.tracefile import load_trace

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the helper runs on POSIX only")


@profiled("mm")
def mm(a):
    return a @ a


def _run_window(**kwargs) -> InMemoryExporter:
    mem = InMemoryExporter()
    a = torch.randn(32, 32)
    with session(exporters=[mem], **kwargs):
        for _ in range(6):
            mm(a)  # a root call: one step each
    return mem


def _gone(pid: int, within: float = 5.0) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaps counts as exited)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def raw_trace(tmp_path):
    """A real window's raw trace, as torch writes it, with the SDK's step markers."""
    from instrument import _torch
    from instrument.tracefile import STEP_MARKER

    win = _torch.ProfilerWindow(("cpu",), record_shapes=False, profile_memory=False,
                                with_stack=False, with_flops=False)
    win.start()
    a = torch.randn(32, 32)
    mm(a)  # warm-up: dropped
    for s in range(3):
        with _torch.FastRange(STEP_MARKER + str(s)):
            pass
        mm(a)
    win.stop()
    path = tmp_path / "raw.pt.trace.json"
    win.export_chrome_trace(str(path))
    return path


def test_helper_gives_the_in_process_analysis_and_shaped_trace(raw_trace, tmp_path):
    here, there = tmp_path / "here.json", tmp_path / "there.json"
    shutil.copy(raw_trace, here)
    shutil.copy(raw_trace, there)
    dist = {"rank": 0, "world_size": 1}
    expected = shape_and_analyse(str(here), frozenset({"mm"}), dist)
    helper = AnalysisProcess()
    try:
        got, said = helper.analyse(str(there), {"mm"}, dist)
        assert helper.torch_in_child is False  # the helper never imports torch
        pid = helper.pid
        assert pid and pid != os.getpid()
        # its own session: a Ctrl-C at the terminal goes to the program, not to the helper
        assert os.getpgid(pid) != os.getpgid(0)
    finally:
        helper.close()
    assert said == []
    assert got == expected
    assert got.ranges["mm"].calls == 3
    assert load_trace(str(there)) == load_trace(str(here))
    assert _gone(pid)


def test_a_bad_trace_loses_that_window_only(tmp_path, raw_trace):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    helper = AnalysisProcess()
    try:
        with pytest.raises(AnalysisProcessError, match="could not be analysed"):
            helper.analyse(str(bad), (), {"rank": 0, "world_size": 1})
        assert helper.failed is None
        got, _ = helper.analyse(str(raw_trace), {"mm"}, {"rank": 0, "world_size": 1})
        assert got.ranges["mm"].calls == 3
    finally:
        helper.close()


def test_a_hung_helper_times_out_and_is_killed(raw_trace):
    helper = AnalysisProcess()
    try:
        helper.analyse(str(raw_trace), {"mm"}, {"rank": 0, "world_size": 1})
        pid = helper.pid
        os.kill(pid, signal.SIGSTOP)  # hung
        t0 = time.monotonic()
        with pytest.raises(AnalysisProcessError, match="failed"):
            helper.analyse(str(raw_trace), {"mm"}, {"rank": 0, "world_size": 1}, timeout=0.5)
        assert time.monotonic() - t0 < 5
        assert helper.failed and _gone(pid)
        with pytest.raises(AnalysisProcessError):  # given up for good, no new start
            helper.analyse(str(raw_trace), {"mm"}, {"rank": 0, "world_size": 1})
    finally:
        helper.close()


def test_sessions_use_the_helper_and_agree_with_in_process():
    mem = _run_window()
    helper = analysis_process.shared()
    assert helper.pid is not None and helper.failed is None
    inproc = _run_window(analysis_process=False)
    a, b = mem.reports[0], inproc.reports[0]
    assert a.ranges["mm"].calls == b.ranges["mm"].calls == 3
    assert a.steps == b.steps
    assert set(a.ranges) == set(b.ranges)
    assert [op.name for op in a.top_ops] and {op.name for op in a.top_ops} == \
        {op.name for op in b.top_ops}


def test_a_killed_helper_costs_no_report():
    """SIGKILL the helper between windows: the next window's report is built in-process,
    with one warning, and so are the ones after it."""
    _run_window()
    helper = analysis_process.shared()
    pid = helper.pid
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _run_window()
        second = _run_window()
    assert first.reports[0].ranges["mm"].calls == 3
    assert second.reports[0].ranges["mm"].calls == 3
    said = [str(w.message) for w in caught if issubclass(w.category, ProfilerWarning)
            and "helper" in str(w.message)]
    assert len(said) == 1 and "in this process from now on" in said[0], said
    helper.failed = None  # for the tests after this one: a fresh handle next time
    analysis_process._shared = None


def test_shutdown_ends_the_helper():
    _run_window()
    pid = analysis_process.shared().pid
    assert pid is not None
    instrument.shutdown()
    assert _gone(pid)


def test_the_helper_leaves_with_its_program(run_python, tmp_path):
    """A program killed outright (no exit hooks) leaves no helper behind."""
    code = (
        "import os, signal, sys, torch, instrument\n"
        "from instrument import profiled, analysis_process\n"
        "@profiled('mm')\n"
        "def mm(a): return a @ a\n"
        "a = torch.randn(16, 16)\n"
        "with instrument.session(exporters=[]):\n"
        "    for _ in range(6):\n"
        "        mm(a); instrument.step()\n"
        "print(analysis_process.shared().pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = run_python(code)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid = int(proc.stdout.split()[-1])
    assert _gone(pid, within=10.0)


def test_a_forked_child_never_uses_its_parents_helper():
    _run_window()
    parent_helper = analysis_process.shared()
    pid = parent_helper.pid
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            mine = analysis_process.shared()
            instrument.shutdown()  # must not close the parent's helper
            code = 0 if (mine is not parent_helper and mine.pid is None) else 2
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    os.waitpid(child, 0)
    assert os.read(r, 1) == b"\x00"
    os.close(r)
    assert parent_helper.pid == pid  # still there, still ours
    assert _run_window().reports[0].ranges["mm"].calls == 3


def test_analysis_process_from_the_environment(monkeypatch):
    from instrument.config import Config

    assert Config.from_env().analysis_process is True
    monkeypatch.setenv("PROFILED_ANALYSIS_PROCESS", "0")
    assert Config.from_env().analysis_process is False
    monkeypatch.setenv("PROFILED_ANALYSIS_PROCESS", "1")
    assert Config.from_env().analysis_process is True


def test_no_torch_in_the_helpers_imports():
    """The helper boots with this package replaced by an empty one: its modules must not
    need torch (checked in a real interpreter, like the helper's)."""
    helper = AnalysisProcess()
    try:
        helper._start()
        assert helper.torch_in_child is False
    finally:
        helper.close()


def test_subprocess_output_is_not_held_by_the_helper(run_python):
    """A program whose output is captured ends when it ends: the helper holds none of its
    standard streams (else the reader would wait for the helper too)."""
    code = (
        "import torch, instrument\n"
        "from instrument import profiled, analysis_process\n"
        "@profiled('mm')\n"
        "def mm(a): return a @ a\n"
        "a = torch.randn(16, 16)\n"
        "s = instrument.session(exporters=[])\n"
        "with s:\n"
        "    for _ in range(6):\n"
        "        mm(a); instrument.step()\n"
        "print(analysis_process.shared().pid, s.windows_ended, flush=True)\n"
    )
    t0 = time.monotonic()
    proc = run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pid, ended = map(int, proc.stdout.split()[-2:])
    assert ended == 1
    assert _gone(pid)
    assert time.monotonic() - t0 < 60


def test_a_dead_helper_never_kills_a_program_that_restored_sigpipe(run_python):
    """A program that restored SIGPIPE's default action (as command-line tools do) loses
    nothing when the helper dies: the next window's request fails as an error, not a signal,
    and its report is built in the program's process."""
    code = (
        "import os, signal, time, warnings, torch, instrument\n"
        "from instrument import profiled, analysis_process\n"
        "from exporters import InMemoryExporter\n"
        "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
        "warnings.simplefilter('ignore')\n"
        "@profiled('mm')\n"
        "def mm(a): return a @ a\n"
        "a = torch.randn(16, 16)\n"
        "def window():\n"
        "    mem = InMemoryExporter()\n"
        "    with instrument.session(exporters=[mem]):\n"
        "        for _ in range(6): mm(a)\n"
        "    return mem.reports[0].ranges['mm'].calls\n"
        "first = window()\n"
        "pid = analysis_process.shared().pid\n"
        "os.kill(pid, signal.SIGKILL)\n"
        "time.sleep(0.5)\n"
        "print(first, window(), analysis_process.shared().failed is not None, flush=True)\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split()[-3:] == ["3", "3", "True"]


def test_exit_never_waits_for_a_busy_helper(raw_trace):
    """close() while a window is being analysed (here: a helper stopped mid-work) ends the
    helper within its timeout instead of waiting for the window's own deadline."""
    import threading

    helper = AnalysisProcess()
    helper.analyse(str(raw_trace), {"mm"}, {"rank": 0, "world_size": 1})
    pid = helper.pid
    os.kill(pid, signal.SIGSTOP)
    errors = []

    def busy():
        try:
            helper.analyse(str(raw_trace), {"mm"}, {"rank": 0, "world_size": 1}, timeout=120)
        except AnalysisProcessError as exc:
            errors.append(exc)

    t = threading.Thread(target=busy)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    helper.close(timeout=0.5)
    assert time.monotonic() - t0 < 5
    t.join(10)
    assert not t.is_alive() and len(errors) == 1
    assert _gone(pid)
    assert helper.failed is not None


def test_junk_from_the_helper_gives_it_up_and_the_window_is_kept(raw_trace, tmp_path):
    """Bytes that are no frame on the helper's output (written into its real pipe) make the
    parent give the helper up at once, not wait for a frame that never ends; the session
    then analyses in-process."""
    helper = AnalysisProcess()
    try:
        helper.analyse(str(raw_trace), {"mm"}, {"rank": 0, "world_size": 1})
        pid = helper.pid
        os.kill(pid, signal.SIGSTOP)  # it must not answer before our junk is read
        with open(f"/proc/{pid}/fd/1", "wb") as out:  # the helper's end of the reply pipe
            out.write(b"\xff" * 8 + b"junk")
        t0 = time.monotonic()
        with pytest.raises(AnalysisProcessError, match="corrupt"):
            helper.analyse(str(raw_trace), {"mm"}, {"rank": 0, "world_size": 1}, timeout=30)
        assert time.monotonic() - t0 < 5
        assert helper.failed and _gone(pid)
    finally:
        helper.close()
