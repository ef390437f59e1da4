"""The raw window traces' directory (instrument/export/scratch.py): real directories, real
processes (a child killed with SIGKILL leaves its directory behind), real links."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import tempfile
import warnings

import pytest

from exporters import ExporterWarning
from instrument.export import scratch as rawtraces
from tests import _proc

pytestmark = pytest.mark.skipif(
    os.name != "posix", reason="stale directories are cleaned on POSIX only"
)

NAME = re.compile(r"torch-profiled-(\d+)-(\d+)-([0-9a-f]{8})-([0-9a-f]{16})\Z")


@pytest.fixture
def tmp_base(tmp_path, monkeypatch):
    """This process's raw-trace state starts empty, under a temporary directory of its own."""
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    monkeypatch.setattr(rawtraces, "_dir", None)
    monkeypatch.setattr(rawtraces, "_live", set())
    monkeypatch.setattr(rawtraces, "_cleaned", set())
    monkeypatch.setattr(rawtraces, "_warned", False)
    monkeypatch.setattr(rawtraces, "_owner", os.getpid())
    yield base
    rawtraces.release()


CHILD = """
import time
from instrument.export import scratch as rawtraces
path = rawtraces.new_path(3)
with open(path, "w") as fh:
    fh.write("{}")
print(path, flush=True)
time.sleep(120)
"""


def _child_directory(base) -> tuple[subprocess.Popen, str]:
    """A real process that made its directory under ``base`` and wrote a raw trace there;
    it waits until killed."""
    proc = _proc.start("-c", CHILD, env=_proc.sdk_env(TMPDIR=str(base)), stderr=None)
    trace = proc.stdout.readline().strip()
    assert trace, "the child made no raw trace"
    return proc, os.path.dirname(trace)


def _killed(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)  # reaped: its PID names no process now
    proc.stdout.close()


def _renamed(
    path: str,
    *,
    pid: int | None = None,
    start: int | None = None,
    scope: str | None = None,
    rand: str | None = None,
) -> str:
    """``path``'s name with some of its parts replaced."""
    m = NAME.match(os.path.basename(path))
    assert m, path
    parts = [
        str(pid) if pid is not None else m.group(1),
        str(start) if start is not None else m.group(2),
        scope or m.group(3),
        rand or m.group(4),
    ]
    return os.path.join(os.path.dirname(path), "torch-profiled-" + "-".join(parts))


def test_the_directory_is_private_and_names_this_process(tmp_base):
    old = os.umask(0o277)  # a umask that would leave it unwritable
    try:
        folder = rawtraces.directory()
    finally:
        os.umask(old)
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.geteuid()
    assert os.path.dirname(folder) == str(tmp_base)
    m = NAME.match(os.path.basename(folder))
    assert m and int(m.group(1)) == os.getpid()
    path = rawtraces.new_path(0)
    assert os.path.dirname(path) == folder and path.endswith("window0.pt.trace.json")
    assert rawtraces.clean_stale(str(tmp_base)) == [] and os.path.isdir(folder)  # alive: us


def test_a_killed_processs_directory_goes_at_the_next_first_window(tmp_base):
    proc, folder = _child_directory(tmp_base)
    try:
        # its maker is alive: kept, trace and all
        assert rawtraces.clean_stale(str(tmp_base)) == []
        assert len(os.listdir(folder)) == 1
    finally:
        _killed(proc)
    mine = rawtraces.directory()  # this process's first window: the dead one's goes
    assert not os.path.lexists(folder)
    assert [n for n in os.listdir(tmp_base) if n.startswith("torch-profiled-")] == [
        os.path.basename(mine)
    ]


def test_a_reused_pid_does_not_keep_a_directory(tmp_base):
    """A directory named for our PID but made by an earlier process on it (a container that
    restarted: same PID, later start) is stale; one with our PID and our start is ours."""
    mine = rawtraces.directory()
    m = NAME.match(os.path.basename(mine))
    earlier = _renamed(mine, start=int(m.group(2)) - 1, rand="0" * 16)
    ours_too = _renamed(mine, rand="1" * 16)  # same process (a directory made before)
    for path in (earlier, ours_too):
        os.mkdir(path, 0o700)
        open(os.path.join(path, "00000000-window0.pt.trace.json"), "w").close()
    assert rawtraces.clean_stale(str(tmp_base)) == [earlier]
    assert not os.path.lexists(earlier) and os.path.isdir(ours_too) and os.path.isdir(mine)


def test_cleaning_touches_nothing_else(tmp_base, tmp_path):
    """Links, look-alike names, files and other scopes survive, even with the identity of a
    dead process (other users' directories: the next test)."""
    proc, dead = _child_directory(tmp_base)
    _killed(proc)
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious.txt").write_text("x")
    (keep / "00000000-window0.pt.trace.json").write_text("{}")
    link = _renamed(dead, rand="a" * 16)
    os.symlink(keep, link)  # a stale-looking name pointing at files that must survive
    newline = dead + "\n"  # '$' would match it; '\Z' does not
    os.mkdir(newline)
    suffixed = dead + "x"
    os.mkdir(suffixed)
    old_style = os.path.join(tmp_base, "torch-profiled-abcd1234")  # mkdtemp's: no maker
    os.mkdir(old_style)
    a_file = _renamed(dead, rand="b" * 16)
    open(a_file, "w").close()
    scope = NAME.match(os.path.basename(dead)).group(3)
    elsewhere = _renamed(dead, scope="0" * 8 if scope != "0" * 8 else "1" * 8)
    os.mkdir(elsewhere)  # another boot, host or PID namespace: its PIDs mean nothing here
    removed = rawtraces.clean_stale(str(tmp_base))
    assert removed == [dead]
    assert os.path.islink(link) and os.readlink(link) == str(keep)
    assert sorted(os.listdir(keep)) == ["00000000-window0.pt.trace.json", "precious.txt"]
    for path in (newline, suffixed, old_style, elsewhere):
        assert os.path.isdir(path) and not os.path.islink(path), repr(path)
    assert os.path.isfile(a_file)


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's directory needs root")
def test_another_users_stale_directory_survives(tmp_base):
    proc, dead = _child_directory(tmp_base)
    _killed(proc)
    os.chown(dead, 65534, 65534)
    for name in os.listdir(dead):
        os.chown(os.path.join(dead, name), 65534, 65534)
    assert rawtraces.clean_stale(str(tmp_base)) == []
    assert len(os.listdir(dead)) == 1


def test_at_most_max_waiting_raw_traces_wait_the_oldest_go(tmp_base):
    """Exporters past their deadline keep their traces: the directory still holds at most
    MAX_WAITING (the new one included); the oldest are removed, with one warning."""
    paths = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for window in range(rawtraces.MAX_WAITING + 3):
            path = rawtraces.new_path(window)
            with open(path, "w") as fh:
                fh.write("{}")
            paths.append(path)
            assert len(os.listdir(os.path.dirname(path))) <= rawtraces.MAX_WAITING
    folder = os.path.dirname(paths[0])
    assert sorted(os.path.join(folder, n) for n in os.listdir(folder)) == sorted(
        paths[-rawtraces.MAX_WAITING :]
    )
    said = [str(w.message) for w in caught if issubclass(w.category, ExporterWarning)]
    assert len(said) == 1 and "oldest" in said[0] and str(rawtraces.MAX_WAITING) in said[0]
    for path in paths:  # exporters finishing late: nothing to do for the removed ones
        rawtraces.remove(path)
    assert os.listdir(folder) == []


def test_a_raw_traces_compressed_copy_goes_with_it(tmp_base):
    """The helper's compressed copy of a raw trace (``gz_path``) is removed with it: by
    ``remove``, and by the bound when the trace is among the oldest."""
    paths = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExporterWarning)  # (the bound's, tested above)
        for window in range(rawtraces.MAX_WAITING + 1):
            path = rawtraces.new_path(window)
            for name in (path, rawtraces.gz_path(path)):
                with open(name, "w") as fh:
                    fh.write("{}")
            paths.append(path)
    folder = os.path.dirname(paths[0])
    kept = paths[-rawtraces.MAX_WAITING :]
    assert sorted(os.listdir(folder)) == sorted(
        name for path in kept for name in (os.path.basename(path), os.path.basename(path) + ".gz")
    )
    for path in paths:
        rawtraces.remove(path)
    assert os.listdir(folder) == []


def test_remove_and_release(tmp_base):
    path = rawtraces.new_path(0)
    folder = os.path.dirname(path)
    with open(path, "w") as fh:
        fh.write("{}")
    stray = os.path.join(folder, ".tmp-0123456789abcdef.partial")  # a helper killed mid-write
    open(stray, "w").close()
    outside = tmp_base / "user.json"
    outside.write_text("{}")
    rawtraces.remove(str(outside))  # not handed out: never removed
    rawtraces.remove(stray)
    assert outside.exists() and os.path.exists(stray)
    assert rawtraces.release() is False  # an exporter still has the trace: the directory stays
    assert os.path.exists(path)
    rawtraces.remove(path)
    assert not os.path.exists(path)
    assert rawtraces.release() is True
    assert not os.path.lexists(folder)
    again = rawtraces.new_path(1)  # a later window: a new directory
    assert os.path.isdir(os.path.dirname(again)) and os.path.dirname(again) != folder


def test_a_removed_directory_is_made_again(tmp_base):
    """A cleaner of old temporary files removed it while the program ran: the next window
    gets a new one."""
    first = rawtraces.new_path(0)
    rawtraces.remove(first)
    os.rmdir(os.path.dirname(first))
    second = rawtraces.new_path(1)
    assert os.path.isdir(os.path.dirname(second))
    with open(second, "w") as fh:
        fh.write("{}")


def test_a_forked_child_never_removes_its_parents_traces(tmp_base):
    path = rawtraces.new_path(0)
    with open(path, "w") as fh:
        fh.write("{}")
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            rawtraces.remove(path)
            released = rawtraces.release()
            mine = rawtraces.new_path(0)
            code = 0 if (released and os.path.dirname(mine) != os.path.dirname(path)) else 2
            rawtraces.remove(mine)
            rawtraces.release()
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    os.waitpid(child, 0)
    assert os.read(r, 1) == b"\x00"
    os.close(r)
    assert os.path.exists(path)
    assert [n for n in os.listdir(tmp_base) if n.startswith("torch-profiled-")] == [
        os.path.basename(os.path.dirname(path))
    ]
