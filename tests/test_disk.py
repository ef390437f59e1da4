"""Disk: the trace directory stays bounded (PROFILED_TRACE_KEEP, PROFILED_TRACE_MAX_MB) and a
directory that cannot be written costs one warning, no partial files and nothing else.

Failures are real: a trace directory under a regular file, a read-only directory (for root,
whom permissions do not stop, in a child process that dropped CAP_DAC_OVERRIDE), and a full
disk as the kernel reports it to a process over its file-size limit (RLIMIT_FSIZE).
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
import warnings

import pytest

from exporters import Exporter, ExporterWarning, ExportResult, InMemoryExporter, TraceFileExporter
from instrument import Schedule, profiled
from instrument.testing import capture
from tests import _proc
from tests._records import window_records

MIB = 1 << 20


@profiled("disk.work")
def work(n: int = 48) -> float:
    import torch

    x = torch.ones(n, n)
    return float((x @ x).sum())


class TraceSizes(Exporter):
    """Runs after the trace exporter (the pipeline puts trace writers first): the size of
    each window's file when it was written, before later windows pruned it."""

    def __init__(self) -> None:
        self.sizes: list[tuple[str, int]] = []

    def export(self, report) -> ExportResult:
        if report.trace_file:
            self.sizes.append(
                (os.path.basename(report.trace_file), os.path.getsize(report.trace_file))
            )
        return ExportResult.SUCCESS


def run_windows(windows: int, *exporters, steps_per_window: int = 1):
    """A real session: ``windows`` windows of one warm-up step and ``steps_per_window``
    recorded steps (CPU), every report to ``exporters`` and memory."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(
            schedule=Schedule(wait=0, warmup=1, active=steps_per_window, repeat=windows),
            activities=["cpu"],
            exporters=list(exporters),
        ) as cap:
            for _ in range(windows * (1 + steps_per_window)):
                work()
                cap.step()
    return cap.reports, [str(w.message) for w in caught if issubclass(w.category, ExporterWarning)]


def tree(path) -> list[str]:
    """Every file under ``path`` (hidden ones too), relative."""
    out = []
    for root, _dirs, files in os.walk(path):
        out += [os.path.relpath(os.path.join(root, f), path) for f in files]
    return sorted(out)


# ---------------------------------------------------------------- PROFILED_TRACE_MAX_MB


def test_max_mb_drops_the_oldest_traces_of_any_worker_and_nothing_else(tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    old = [
        f"otherhost_7_rank{r}.{stamp}.pt.trace.json.gz"  # older windows, other workers
        for r, stamp in ((1, 100), (0, 200), (1, 300))
    ]
    foreign = [
        "otherhost_7.100.pt.trace.json",  # tensorboard_trace_handler's name: not ours
        "notes.txt",
        "otherhost_7_rank1.100.pt.trace.json.gz.bak",
        ".tmp-0123.partial",  # another process's write in flight
    ]
    for name in old:
        (out / name).write_bytes(os.urandom(100 * 1024))
    for name in foreign:
        (out / name).write_bytes(os.urandom(400 * 1024))  # big, yet never ours to remove
    sizes = TraceSizes()
    reports, warned = run_windows(4, TraceFileExporter(out, keep=0, max_mb=0.25), sizes)
    assert warned == []
    new = [name for name, _ in sizes.sizes]
    assert len(new) == 4 and all(r.trace_file for r in reports)
    # 300 KiB of old traces + the first window is over 256 KiB: the oldest (stamp 100) goes,
    # and the remaining 200 KiB + four small windows fit
    assert sum(size for _, size in sizes.sizes) < 56 * 1024
    assert sorted(os.listdir(out)) == sorted(old[1:] + foreign + new)


def test_a_killed_writers_old_temporary_file_is_removed_a_live_one_is_not(tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    stale, fresh = out / ".tmp-00112233445566aa.partial", out / ".tmp-00112233445566bb.partial"
    unlike = out / ".tmp-notours.partial"
    for path in (stale, fresh, unlike):
        path.write_bytes(b'{"traceEvents": [')  # what a writer killed mid-file leaves
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    os.utime(unlike, (two_hours_ago, two_hours_ago))
    reports, warned = run_windows(1, TraceFileExporter(out, max_mb=1))
    assert warned == []
    assert sorted(os.listdir(out)) == sorted(
        [fresh.name, unlike.name, os.path.basename(reports[0].trace_file)]
    )


def test_max_mb_keeps_the_newest_windows_that_fit(tmp_path):
    out = tmp_path / "traces"
    sizes = TraceSizes()
    probe, _ = run_windows(1, TraceFileExporter(tmp_path / "probe", keep=0), TraceSizes())
    one = os.path.getsize(probe[0].trace_file)
    cap_bytes = int(2.5 * one)  # room for about two windows' files
    reports, warned = run_windows(6, TraceFileExporter(out, keep=0, max_mb=cap_bytes / MIB), sizes)
    assert warned == [] and len(reports) == 6
    # what must remain: the longest run of newest files whose sizes fit under the cap
    expected, total = [], 0
    for name, size in reversed(sizes.sizes):
        if total + size > cap_bytes:
            break
        expected.append(name)
        total += size
    assert len(expected) >= 2
    assert sorted(os.listdir(out)) == sorted(expected)
    assert sum(os.path.getsize(out / n) for n in os.listdir(out)) <= cap_bytes


def test_a_window_alone_over_max_mb_is_not_kept_and_warns_once(tmp_path):
    out = tmp_path / "traces"
    exporter = TraceFileExporter(out, keep=0, max_mb=200 / MIB)  # 200 bytes: no trace fits
    memory = InMemoryExporter()
    reports, warned = run_windows(3, exporter, memory)
    assert len(memory.reports) == 3  # the other exporters got every window
    assert all(r.trace_file is None for r in memory.reports)
    assert len(warned) == 1, warned
    assert "was not kept" in warned[0] and "PROFILED_TRACE_MAX_MB" in warned[0]
    assert "limit of 0.000190735 MiB" in warned[0]
    assert exporter.lost == 3 and exporter.last_path is None
    assert tree(out) == []


def test_max_mb_from_the_environment_reaches_the_trace_exporter(run_python, tmp_path):
    code = textwrap.dedent("""
        from instrument import profiled
        @profiled("f")
        def f():
            return sum(range(1000))
        for _ in range(12):
            f()
    """)
    result = run_python(
        code,
        env={
            "PROFILED_EXPORTERS": "trace",
            "PROFILED_TRACE_DIR": str(tmp_path / "t"),
            "PROFILED_SCHEDULE": "wait=0,warmup=1,active=1,repeat=6",
            "PROFILED_TRACE_KEEP": "0",
            "PROFILED_TRACE_MAX_MB": str(200 / MIB),
            "PROFILED_ACTIVITIES": "cpu",
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("was not kept") == 1, result.stderr
    assert tree(tmp_path / "t") == []


@pytest.mark.parametrize("text", ["-1", "lots", "inf", "nan", ""])
def test_bad_max_mb_in_the_environment_warns_once_and_keeps_1024(text):
    from instrument import Config, ConfigWarning
    from instrument.testing import forget_warnings

    forget_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert Config.from_env({"PROFILED_TRACE_MAX_MB": text}).trace_max_mb == 1024
        assert Config.from_env({"PROFILED_TRACE_MAX_MB": text}).trace_max_mb == 1024
    messages = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(messages) == 1, messages
    assert f"PROFILED_TRACE_MAX_MB={text!r} is invalid" in messages[0]
    assert "using the default PROFILED_TRACE_MAX_MB=1024" in messages[0]
    with pytest.raises(ValueError, match="PROFILED_STRICT=1"):
        Config.from_env({"PROFILED_TRACE_MAX_MB": text, "PROFILED_STRICT": "1"})
    assert Config.from_env({"PROFILED_TRACE_MAX_MB": "0.5"}).trace_max_mb == 0.5
    assert Config.from_env({"PROFILED_TRACE_MAX_MB": "0"}).trace_max_mb == 0


def test_bad_max_mb_in_code_raises():
    import instrument

    for bad, error in (
        (-1, ValueError),
        (float("inf"), ValueError),
        ("1", TypeError),
        (True, TypeError),
    ):
        with pytest.raises(error, match="trace_max_mb"):
            instrument.configure(trace_max_mb=bad)
        with pytest.raises(ValueError, match="max_mb"):
            TraceFileExporter("x", max_mb=bad)


def _worker() -> str:
    """The worker part of this process's trace file names."""
    from instrument.runtime import _torch

    return f"{_torch.host_name()}_{os.getpid()}_rank0"


def test_names_like_ours_with_a_trailing_newline_or_a_link_are_never_removed(tmp_path):
    """Only a regular file whose whole name is ours is ours: ``$`` also matched a name with a
    trailing newline, and a symbolic link is neither followed nor removed."""
    out = tmp_path / "traces"
    out.mkdir()
    outside = tmp_path / "precious.json.gz"
    outside.write_bytes(b"not a trace of ours")
    two_hours_ago = time.time() - 7200
    newline = [
        f"{_worker()}.1.pt.trace.json.gz\n",  # this worker's oldest, but for the newline
        "otherhost_7_rank1.2.pt.trace.json\n",  # oldest of all and big (under max_mb)
        ".tmp-0011223344556677.partial\n",  # an old temporary file, but for the newline
    ]
    for name in newline:
        (out / name).write_bytes(os.urandom(300 * 1024))
        os.utime(out / name, (two_hours_ago, two_hours_ago))
    links = [
        f"{_worker()}.3.pt.trace.json.gz",
        "otherhost_7_rank1.4.pt.trace.json",
        ".tmp-8899aabbccddeeff.partial",
    ]
    for name in links:
        os.symlink(outside, out / name)
        os.utime(out / name, (two_hours_ago, two_hours_ago), follow_symlinks=False)
    reports, warned = run_windows(3, TraceFileExporter(out, keep=1, max_mb=0.25))
    assert warned == []
    newest = os.path.basename(reports[-1].trace_file)
    assert sorted(os.listdir(out)) == sorted(newline + links + [newest])
    assert outside.read_bytes() == b"not a trace of ours"
    assert all((out / name).is_symlink() for name in links)


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from instrument.base.files import open_temp

    fd, tmp = open_temp(sys.argv[1])
    os.write(fd, b'{"traceEvents": [')  # half a trace, then the OOM killer
    print(tmp, flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()  # a live writer, mid-file until told to go
""")


def _writer(out, how: str) -> tuple[subprocess.Popen, str]:
    """A real process that opened one of our temporary files in ``out``."""
    proc = _proc.start("-c", KILLED_WRITER, str(out), how, stdin=subprocess.PIPE, stderr=None)
    return proc, proc.stdout.readline().strip()


def test_with_no_size_bound_a_killed_writers_old_partial_still_goes(tmp_path):
    """PROFILED_TRACE_MAX_MB=0 (no bound) and keep=0 still remove what a writer killed
    mid-file left an hour ago, and never the temporary file of a writer still at work."""
    out = tmp_path / "traces"
    out.mkdir()
    killed, stale = _writer(out, "kill")
    assert killed.wait(timeout=60) == -signal.SIGKILL
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    live, fresh = _writer(out, "live")
    try:
        reports, warned = run_windows(2, TraceFileExporter(out, keep=0, max_mb=0))
        assert warned == []
        assert not os.path.exists(stale)
        assert os.path.exists(fresh) and live.poll() is None  # still writing: kept
        assert sorted(os.listdir(out)) == sorted(
            [os.path.basename(fresh)] + [os.path.basename(r.trace_file) for r in reports]
        )
    finally:
        live.communicate("", timeout=60)


# ---------------------------------------------------------------- directories that fail


def test_trace_dir_under_a_regular_file_warns_once_and_the_rest_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    exporter = TraceFileExporter(blocker / "traces")
    memory = InMemoryExporter()
    reports, warned = run_windows(3, exporter, memory)
    assert len(memory.reports) == 3
    assert len(warned) == 1, warned
    assert f"{str(blocker)!r} on its path is a file, not a directory" in warned[0]
    assert "no trace files are written" in warned[0]
    assert exporter.lost == 3
    assert tree(tmp_path) == ["file"] and blocker.read_text() == "not a directory"


def test_after_a_trace_is_written_again_the_next_failure_warns_again(tmp_path):
    target = tmp_path / "traces"
    target.write_text("in the way")
    exporter = TraceFileExporter(target)
    _, warned = run_windows(2, exporter)
    assert len(warned) == 1
    target.unlink()  # fixed: the next window writes
    reports, warned = run_windows(1, exporter)
    assert warned == [] and reports[0].trace_file is not None
    assert os.path.isfile(reports[0].trace_file)
    for name in os.listdir(target):
        os.unlink(target / name)
    target.rmdir()
    target.write_text("in the way again")
    _, warned = run_windows(2, exporter)
    assert len(warned) == 1


DROP_DAC = textwrap.dedent("""
    import ctypes, os

    def drop_dac_override():
        # root is not stopped by file permissions: drop the capabilities that let it through
        # (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), before any thread exists
        libc = ctypes.CDLL(None, use_errno=True)
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]
        header, data = Header(0x20080522, 0), (Data * 2)()
        if libc.capget(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capget")
        for bit in (1, 2):
            data[0].effective &= ~(1 << bit)
            data[0].permitted &= ~(1 << bit)
        if libc.capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capset")

    if os.geteuid() == 0:
        drop_dac_override()
""")

WINDOWS_CHILD = textwrap.dedent("""
    from instrument import profiled

    @profiled("f")
    def f():
        import torch
        return float(torch.ones(32, 32).sum())

    for _ in range(6):  # three windows of one warm-up and one recorded step
        f()
""")

WINDOW_ENV = {
    "PROFILED_EXPORTERS": "trace,json",
    "PROFILED_SCHEDULE": "wait=0,warmup=1,active=1,repeat=3",
    "PROFILED_ACTIVITIES": "cpu",
}


def test_read_only_trace_dir_warns_once_and_leaves_no_partial_file(run_python, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        probe = run_python(DROP_DAC + f"open(os.path.join({str(ro)!r}, 'x'), 'w')")
        assert probe.returncode != 0 and "Permission denied" in probe.stderr, probe.stderr
        result = run_python(
            DROP_DAC + WINDOWS_CHILD,
            env={
                **WINDOW_ENV,
                "PROFILED_TRACE_DIR": str(ro),
                "PROFILED_JSON_PATH": str(tmp_path / "reports.jsonl"),
            },
        )
    finally:
        ro.chmod(0o755)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("was not written") == 1, result.stderr
    assert "Permission denied" in result.stderr
    assert os.listdir(ro) == []
    records = window_records((tmp_path / "reports.jsonl").read_text())
    assert [r["window"] for r in records] == [0, 1, 2]


def test_full_disk_warns_once_and_leaves_no_partial_file(run_python, tmp_path):
    """The kernel refuses writes past RLIMIT_FSIZE (EFBIG) exactly as a full disk refuses them
    (ENOSPC): in the middle of the file, after the temporary file exists."""
    child = textwrap.dedent("""
        import resource, signal, sys
        from exporters import ExportResult, TraceFileExporter
        from instrument import Schedule, profiled
        from instrument.testing import capture

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

        class FullDisk(TraceFileExporter):
            # the window's raw trace is written before exporters run; only this write is
            # limited (to 64 bytes: the file is created, then the disk is full)
            def export(self, report):
                resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
                try:
                    return super().export(report)
                finally:
                    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))

        @profiled("f")
        def f():
            import torch
            return float(torch.ones(32, 32).sum())

        trace = FullDisk(sys.argv[1], gzip=False)
        with capture(schedule=Schedule(wait=0, warmup=1, active=1, repeat=3),
                     activities=["cpu"], exporters=[trace]) as cap:
            for _ in range(6):
                f()
                cap.step()
        print(len(cap.reports), trace.lost, trace.last_path)
    """)
    out = tmp_path / "traces"
    result = _proc.run("-c", child, str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "3", "None"]
    assert result.stderr.count("was not written") == 1, result.stderr
    assert "File too large" in result.stderr
    assert tree(out) == []  # no partial file, no trace


@pytest.mark.parametrize("under", [False, True])
def test_trace_dir_that_names_a_file_says_so(run_python, tmp_path, under):
    """PROFILED_TRACE_DIR naming a file (or a path under one): one warning with the path, that
    it is a file, and what happens; not the bare "File exists" / "Not a directory"."""
    blocker = tmp_path / "traces.txt"
    blocker.write_text("my notes")
    trace_dir = blocker / "sub" if under else blocker
    result = run_python(
        WINDOWS_CHILD,
        env={
            **WINDOW_ENV,
            "PROFILED_TRACE_DIR": str(trace_dir),
            "PROFILED_JSON_PATH": str(tmp_path / "reports.jsonl"),
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("ExporterWarning: ") == 1, result.stderr
    found = (
        f"{str(blocker)!r} on its path is a file, not a directory"
        if under
        else f"trace directory {str(blocker)!r} (PROFILED_TRACE_DIR, or TraceFileExporter's "
        "dir) is a file, not a directory"
    )
    assert found in result.stderr
    assert "no trace files are written" in result.stderr
    assert "File exists" not in result.stderr and "Not a directory" not in result.stderr
    assert blocker.read_text() == "my notes"
    records = window_records((tmp_path / "reports.jsonl").read_text())
    assert [r["window"] for r in records] == [0, 1, 2]  # the rest goes on


def test_write_atomic_never_replaces_a_device_a_fifo_or_a_directory(tmp_path):
    """The one atomic-write helper (trace files, HTML pages, the commands' outputs) renames
    over what is at the name only when it is a regular file or a link (the link itself, never
    what it points to); a FIFO, a device node (root: a copy of /dev/null), a directory or a
    socket is left as it is, with ``NotAFileError`` and no temporary file left behind."""
    import socket
    import stat

    from instrument.base.files import TEMP_NAME, NotAFileError, write_atomic

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    sock.close()
    nodes = ["fifo", "dir", "sock"]
    try:
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        nodes.append("null")
    except PermissionError:
        pass
    for name in nodes:
        path = tmp_path / name
        before = os.lstat(path)
        with pytest.raises(NotAFileError) as caught:
            write_atomic(str(path), lambda f: f.write(b"data"))
        assert "left as it is" in str(caught.value), name
        after = os.lstat(path)
        assert (after.st_ino, after.st_mode, after.st_rdev) == (
            before.st_ino,
            before.st_mode,
            before.st_rdev,
        ), name
    (tmp_path / "victim").write_text("precious\n")
    os.symlink(tmp_path / "victim", tmp_path / "link")
    write_atomic(str(tmp_path / "link"), lambda f: f.write(b"new"))  # the link is replaced
    assert (tmp_path / "link").read_bytes() == b"new" and not (tmp_path / "link").is_symlink()
    assert (tmp_path / "victim").read_text() == "precious\n"
    assert [n for n in os.listdir(tmp_path) if TEMP_NAME.fullmatch(n)] == []
