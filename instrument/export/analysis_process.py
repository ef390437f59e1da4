"""A window's trace work in a helper process, off the program's GIL.

Once a window stops, its report needs the trace JSON read, shaped (``kineto_json.shape_trace``),
written back and analyzed: ~80 ms of pure-Python and ``json`` work per window of a GPU training
step (bench/stop_cost.py). Done on a thread of the profiled program, that work holds the GIL
while the training thread wants it at every operator launch, and the training step slows by
about twice the work (a GIL convoy; BENCHMARKS.md). So the export worker only has torch write
its trace (``export_chrome_trace``, which needs the profiler's results in this process) and
hands the file's path to this helper; the helper sends back the ``Analysis`` (with the
window's per-call occurrences when an exporter asked for them: ``report.OccurrenceBudget``).
When an exporter wants the trace gzip-compressed (``Exporter.wants_gzip_trace``: the trace
exporter), the helper also writes the shaped trace compressed to a scratch file, with the
program's current umask: the exporter links it into place, and the program's process never
reads or compresses the trace.

The helper is one ``python -I -S`` process per profiled process (the program's own
interpreter), started at the first window that needs it and shared by every session. It
imports the interpreter's standard library and this SDK's pure-Python modules, found by their
directories, and nothing else: not the program's current directory (a ``pickle.py`` there
once ran in the helper), ``PYTHONPATH``, ``PYTHONSTARTUP``, the user site, ``.pth`` files or
``sitecustomize``; its environment keeps only ``ENV_KEPT`` (and ``PYTHONHOME``, where the
program's interpreter found its standard library through it); it runs in ``/``. Never torch:
it imports ``instrument.analysis`` as is (the package face is lazy). It runs in its
own session (a Ctrl-C at the terminal reaches the program, not the helper) and leaves when its
input closes, when asked to, or when its parent is gone. If it cannot start, fails or times
out, the caller gets ``AnalysisProcessError`` and does the work in-process, as with
``PROFILED_ANALYSIS_PROCESS=0``. ``close(timeout)`` never takes longer than ``timeout`` in
all: a helper still busy then is killed.

Frames both ways: an 8-byte big-endian length, then a pickle.
"""

from __future__ import annotations

import os
import pickle
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from typing import Any

__all__ = ["SUPPORTED", "AnalysisProcess", "AnalysisProcessError", "shape_and_analyze", "shared"]

START_TIMEOUT_S = 30.0
"""How long the helper may take to start (a Python interpreter on a loaded machine)."""

WINDOW_TIMEOUT_S = 300.0
"""How long one window's trace work may take before the helper is given up as hung."""

KILL_WAIT_S = 1.0
"""How long a helper given up (a failed window) may take to be reaped once killed."""

_HEADER = struct.Struct(">Q")

SUPPORTED = os.name == "posix"
"""The helper needs POSIX pipes and sessions; elsewhere windows are analyzed in-process."""


class AnalysisProcessError(RuntimeError):
    """The helper could not do a window's work; the caller does it in-process."""


def shape_and_analyze(
    raw: str,
    names: Any,
    dist: dict[str, Any],
    occurrences: Any = None,
    gzip_to: str | None = None,
) -> Any:
    """Shape the raw trace at ``raw`` in place and analyze it: the helper's work, and the
    in-process fallback's when torch's events cannot be read directly. With ``occurrences``
    (a ``report.OccurrenceBudget``) the analysis carries the window's per-call occurrences,
    and with its ``timeline_events`` the ``html`` exporter's page timeline, made here from the
    trace already read (an exporter never parses a trace on the program's threads). With
    ``gzip_to`` the shaped trace is also written there gzip-compressed (``shape_file``)."""
    from ..analysis.analyze import analyze, events_from_trace
    from ..analysis.kineto_json import shape_file

    trace = shape_file(raw, names, dist, gzip_to=gzip_to)
    analysis = analyze(
        events_from_trace(trace),
        names,
        occurrences=occurrences,
        base_ns=int(trace.get("baseTimeNanoseconds") or 0),
    )
    events = getattr(occurrences, "timeline_events", None)
    if events is not None:
        try:
            analysis.timeline = page_timeline(trace, names, events)
        except Exception as exc:  # noqa: BLE001 - the page's timeline only, never the report
            warnings.warn(
                f"torch-profiled: the HTML page's timeline of this window could not be made "
                f"({exc!r}); the page comes without it, the report is complete",
                UserWarning,
                stacklevel=2,
            )
    return analysis


def page_timeline(trace: dict[str, Any], names: Any, max_events: int) -> Any:
    """The window's ``report.PageTimeline``: its timeline as the page embeds it."""
    from exporters.html_page import script_json
    from exporters.html_timeline import timeline_from_trace

    from ..base.report import PageTimeline

    timeline = timeline_from_trace(trace, range_names=names, max_events=max_events)
    return PageTimeline(script_json(timeline), timeline["events"], timeline["total"])


# ---------------------------------------------------------------- the parent's side


class AnalysisProcess:
    """The parent's handle on one helper process; ``analyze`` may be called from any thread
    (calls are serialised)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._requests: socket.socket | None = None  # our end of the helper's standard input
        self._owner = os.getpid()
        self.failed: str | None = None  # why the helper is no longer used, once it failed
        self.torch_in_child: bool | None = None  # what the helper said when it started

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def analyze(
        self,
        raw: str,
        names: Any,
        dist: dict[str, Any],
        timeout: float = WINDOW_TIMEOUT_S,
        *,
        occurrences: Any = None,
        gzip_to: str | None = None,
        umask: int | None = None,
    ) -> tuple[Any, list[str]]:
        """``shape_and_analyze`` in the helper: (the Analysis, warnings it gave). ``umask``:
        the mode the helper's files get (``gzip_to``'s, linked into the trace directory), the
        program's current one (None: the helper's own, inherited at its start)."""
        with self._lock:
            if self.failed is not None:
                raise AnalysisProcessError(self.failed)
            try:
                if self._proc is None:
                    self._start()
                assert self._proc is not None and self._requests is not None
                # the helper runs in "/": a relative path would name another file there
                _send_frame(
                    self._requests,
                    (
                        "analyze",
                        os.path.abspath(raw),
                        tuple(names),
                        dict(dist),
                        occurrences,
                        os.path.abspath(gzip_to) if gzip_to else None,
                        umask,
                    ),
                )
                reply = _read_frame(self._proc.stdout, time.monotonic() + timeout)
                if not (
                    isinstance(reply, tuple)
                    and len(reply) in (2, 3)
                    and reply[0] in ("ok", "error")
                ):
                    raise ValueError(f"unexpected reply {type(reply).__name__}")
            except Exception as exc:  # noqa: BLE001 - whatever broke, the helper is given up
                self._fail(f"the analysis helper process failed ({exc!r})")
                raise AnalysisProcessError(self.failed) from exc
            if reply[0] == "ok":
                return reply[1], list(reply[2])
            # the work itself raised there (a malformed trace): this window only
            raise AnalysisProcessError(reply[1])

    def _start(self) -> None:
        argv, env = _command()
        # requests go through a socket, not a pipe: sent with MSG_NOSIGNAL, a dead helper is
        # an error here, never a SIGPIPE (which kills a program that restored its default)
        ours, theirs = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=theirs.fileno(),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                cwd="/",
                env=env,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._requests = ours
        hello = _read_frame(self._proc.stdout, time.monotonic() + START_TIMEOUT_S)
        if not (isinstance(hello, tuple) and hello and hello[0] == "ready"):
            raise ValueError(f"unexpected first message {hello!r:.80}")
        self.torch_in_child = bool(hello[2])

    def _fail(self, why: str) -> None:
        self.failed = why
        self._kill(KILL_WAIT_S)

    def _kill(self, wait: float) -> None:
        """End the helper now; reap it within ``wait`` seconds (0: never block; a helper not
        reaped yet is reaped by ``subprocess`` later)."""
        proc, self._proc = self._proc, None
        requests, self._requests = self._requests, None
        if requests is not None:
            requests.close()
        if proc is None:
            return
        try:
            if proc.stdout is not None:
                proc.stdout.close()
        except OSError:
            pass
        try:
            proc.kill()
            proc.wait(max(0.0, wait))
        except (OSError, subprocess.TimeoutExpired):
            pass

    def close(self, timeout: float = 2.0) -> None:
        """Ask the helper to leave, taking at most ``timeout`` seconds in all (waiting for a
        window being analyzed, for the helper's exit and for its end once killed): past it,
        or while it still works on a window then, the helper is killed. ``timeout <= 0``
        never blocks. A forked child never touches its parent's helper."""
        if os.getpid() != self._owner:
            return
        deadline = time.monotonic() + max(0.0, timeout)
        if not _acquire(self._lock, deadline):
            # analyze() holds the lock while the helper works: end it; analyze() then gets
            # end-of-file, gives the helper up and reaps it (on its own thread, not ours)
            proc = self._proc
            if proc is not None:
                try:
                    proc.kill()
                except OSError:
                    pass
            return
        try:
            proc, requests = self._proc, self._requests
            if proc is None:
                return
            try:
                if requests is not None:
                    requests.settimeout(_left(deadline))  # 0: non-blocking
                    _send_frame(requests, ("exit",))
                    requests.shutdown(socket.SHUT_WR)
                proc.wait(_left(deadline))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
            self._kill(_left(deadline))
        finally:
            self._lock.release()


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _acquire(lock: threading.Lock, deadline: float) -> bool:
    """``lock`` by ``deadline`` (a deadline already past: only if it is free now)."""
    left = _left(deadline)
    return lock.acquire(timeout=left) if left > 0 else lock.acquire(blocking=False)


# ---------------------------------------------------------------- the helper's command line

ENV_KEPT = frozenset(
    {
        "LD_LIBRARY_PATH",
        "DYLD_LIBRARY_PATH",
        "DYLD_FALLBACK_LIBRARY_PATH",
        "LANG",
        "LANGUAGE",
        "TMPDIR",
        "TZ",
    }
)
"""What the helper keeps of the program's environment (and ``LC_*``): where a relocated
interpreter's shared library is, the locale (the encoding of the paths it is sent) and the
temporary directory. Nothing of Python's (``PYTHONPATH``, ``PYTHONSTARTUP``,
``PYTHONINSPECT``, ...) and nothing preloaded (``LD_PRELOAD``)."""


def _command() -> tuple[list[str], dict[str, str]]:
    """The helper's command line and environment: the program's own interpreter, which
    imports its own standard library and, of everything else, this SDK's two packages only
    (by their directories: never the directory above them, a site-packages or a checkout
    that may hold a ``json.py`` of its own). Never the current directory, ``PYTHONPATH``,
    the user's site directory, ``.pth`` files or ``sitecustomize`` (``-S``)."""
    env = {k: v for k, v in os.environ.items() if k in ENV_KEPT or k.startswith("LC_")}
    flags = ["-S", "-X", f"utf8={sys.flags.utf8_mode}"]  # utf8: paths encode as here
    if sys.flags.dont_write_bytecode:
        flags.append("-B")
    if not sys.flags.ignore_environment and os.environ.get("PYTHONHOME"):
        # this interpreter found its standard library through PYTHONHOME, which -I would
        # ignore: the helper gets the same home, in an environment without the rest
        prefix, exec_prefix = sys.base_prefix, sys.base_exec_prefix
        env["PYTHONHOME"] = prefix if prefix == exec_prefix else prefix + os.pathsep + exec_prefix
        flags += ["-s"] + (["-P"] if sys.version_info >= (3, 11) else [])
    else:
        flags.append("-I")  # isolated: no PYTHON* variables, no user site, no current dir
    return [sys.executable, *flags, "-c", _boot()], env


def _boot() -> str:
    """The helper's first code: the SDK's two packages found by their directories (a finder
    for those two names only, nothing else of their parent directories), then ``child_main``.
    ``instrument``'s own ``__init__`` runs (it imports no torch), as in the program."""
    import exporters

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # instrument/
    exporters_dir = os.path.dirname(os.path.abspath(exporters.__file__))
    return (
        "import sys\n"
        "if sys.path and not sys.path[0]:\n"
        "    del sys.path[0]\n"  # '' (the current directory) where no -P kept it out
        "import importlib.util\n"
        f"SDK = {{'instrument': {package!r}, 'exporters': {exporters_dir!r}}}\n"
        "class SDKFinder:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        where = SDK.get(name)\n"
        "        if where is None:\n"
        "            return None\n"
        "        return importlib.util.spec_from_file_location(\n"
        "            name, where + '/__init__.py', submodule_search_locations=[where])\n"
        "sys.meta_path.insert(0, SDKFinder)\n"
        "from instrument.export.analysis_process import child_main\n"
        "child_main()\n"
    )


_shared: AnalysisProcess | None = None
_shared_lock = threading.Lock()
_inherited: list[AnalysisProcess] = []


def shared() -> AnalysisProcess:
    """The process's one helper handle (a forked child gets a new one)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._owner != os.getpid():
            if _shared is not None:
                # a forked child: the parent's handle (and its pipes) is left alone, never
                # closed from here (that would write into the parent's helper)
                _inherited.append(_shared)
            _shared = AnalysisProcess()
        return _shared


def close_shared(timeout: float = 2.0) -> None:
    """End the process's helper within ``timeout`` seconds in all (see ``close``)."""
    helper = _shared
    if helper is not None:
        helper.close(timeout)


# ---------------------------------------------------------------- frames


MAX_FRAME = 1 << 30
"""Frames are small (a request, an ``Analysis``): a longer length means a corrupt stream."""


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _send_frame(sock: socket.socket, obj: Any) -> None:
    sock.sendall(_frame(obj), getattr(socket, "MSG_NOSIGNAL", 0))


def _write_frame(pipe: Any, obj: Any) -> None:
    pipe.write(_frame(obj))
    pipe.flush()


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks = []
    sel = None
    if deadline is not None:
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
    try:
        while n:
            if sel is not None and deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError("no answer from the analysis helper process in time")
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                raise EOFError("the analysis helper process closed its output")
            chunks.append(chunk)
            n -= len(chunk)
    finally:
        if sel is not None:
            sel.close()
    return b"".join(chunks)


def _read_frame(pipe: Any, deadline: float | None) -> Any:
    fd = pipe.fileno()
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if n > MAX_FRAME:
        raise ValueError(f"a frame of {n} bytes: the stream is corrupt")
    return pickle.loads(_read_exact(fd, n, deadline))


# ---------------------------------------------------------------- the helper's side


def child_main() -> None:
    """The helper's loop: answer ``analyze`` frames until ``exit``, end of input, or the
    parent's death (it may be gone while a forked child of it still holds our input open)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch_parent() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch_parent, daemon=True, name="parent-watch").start()
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the frame stream
    _write_frame(stdout, ("ready", os.getpid(), "torch" in sys.modules))
    while True:
        try:
            request = _read_frame(stdin, None)
        except EOFError:
            return
        if request[0] != "analyze":
            return
        _, raw, names, dist, occurrences, gzip_to, umask = request
        if umask is not None:
            os.umask(umask)  # the program's: the compressed trace becomes its trace file
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                analysis = shape_and_analyze(raw, frozenset(names), dist, occurrences, gzip_to)
                reply: tuple = ("ok", analysis, [str(w.message) for w in caught])
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which goes on
                reply = ("error", f"the trace of this window could not be analyzed ({exc!r})")
        _write_frame(stdout, reply)
