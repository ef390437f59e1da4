"""Children that tests only read, run early in the background while the machine is idle.

The suite runs one test at a time, and most tests wait on one child (each imports torch: ~2-3
s of one core), so one core of a 2-core runner is mostly idle. A module registers, as it is
imported, the children whose results its tests read (``add``); when collection is done
(``tests/conftest.py``) one background thread runs those of the selected tests, one at a time
and in the order the tests will run. It starts a child only while at least one core has been
idle for the last half second (``/proc/stat``; on a machine without it, nothing runs early),
and at a lower priority (nice 5): beside a busy neighbour, or while the tests use both cores,
nothing starts, and a child already running is one light neighbour more. A test asks for its
child's result (``result``):

- done in the background: the result, at once;
- running: its priority goes back to normal (where the system allows) and the test waits for
  it, within the job's timeout from then;
- not started yet: the test runs it itself, as it always did.

A child is the same program, in the same environment, with the same timeout as before; only
when it runs changes. Only for children whose assertions do not depend on when they run or on
the machine's load (nothing timed against the clock), as every test's must beside a busy
neighbour anyway. Each child has a directory of its own (its working directory), removed at the
end of the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests import _proc

NICE = 5  # the children's nice value in the background: they yield to the tests' own
IDLE_CPUS = 0.8  # start one only while this much of the machine's CPUs was idle...
IDLE_OVER_S = 0.5  # ...over this long


class Job:
    def __init__(
        self,
        key: str,
        args: tuple[str, ...],
        env: dict[str, str] | Callable[[Path], dict[str, str]] | None,
        timeout: float,
        files: dict[str, str] | None,
        cwd: str | None,
    ) -> None:
        self.key, self.args, self.timeout = key, args, timeout
        self._env, self._files, self._cwd = env, files, cwd
        self.env: dict[str, str] | None = None
        self.dir: Path | None = None
        self.state = "registered"  # -> queued -> running/claimed -> done
        self.proc: subprocess.Popen | None = None
        self.outcome: subprocess.CompletedProcess[str] | BaseException | None = None
        self.done = threading.Event()

    def prepare(self) -> None:
        """Its directory, files and environment (on the main thread: ``os.environ`` is read
        here, never on the background thread)."""
        self.dir = Path(tempfile.mkdtemp(prefix="early-"))
        for name, text in (self._files or {}).items():
            (self.dir / name).write_text(text)
        env = self._env
        self.env = _proc.sdk_env() if env is None else env(self.dir) if callable(env) else env
        self.state = "queued"

    @property
    def cwd(self) -> str:
        return self._cwd or str(self.dir)


_LOCK = threading.Lock()
_JOBS: dict[str, Job] = {}
_ORDER: list[Job] = []
_STOP = threading.Event()
_WORKER: threading.Thread | None = None


def add(
    module: str,
    key: str,
    *args: str,
    env: dict[str, str] | Callable[[Path], dict[str, str]] | None = None,
    timeout: float = 120,
    files: dict[str, str] | None = None,
    cwd: str | None = None,
) -> None:
    """Register ``python ARGS`` for the test ``key`` names (``request.node.name``, then
    ``#N`` where a test reads several) in ``module`` (its ``__name__``): ``env`` a mapping or a
    function of the child's directory, ``files`` (name -> text) written there first, ``cwd``
    another working directory."""
    full = f"{module}::{key}"
    if full in _JOBS:
        raise ValueError(f"two children under {full}")
    _JOBS[full] = Job(full, args, env, timeout, files, cwd)


def start(items: list[Any]) -> None:
    """At the end of collection: prepare the selected tests' children and start the
    background thread, which runs them in the order of ``items``."""
    global _WORKER
    rank = {f"{item.module.__name__}::{item.name}": i for i, item in enumerate(items)
            if getattr(item, "module", None) is not None}  # fmt: skip
    chosen = [job for job in _JOBS.values() if job.key.split("#")[0] in rank]
    chosen.sort(key=lambda job: rank[job.key.split("#")[0]])
    for job in chosen:
        job.prepare()
    _ORDER[:] = chosen
    if chosen and os.path.exists("/proc/stat"):
        _STOP.clear()
        _WORKER = threading.Thread(target=_work, name="tests-early", daemon=True)
        _WORKER.start()


def _idle_cpus() -> float:
    """CPUs idle since the last call (``/proc/stat``'s first line: jiffies by state)."""
    global _LAST
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle, total = fields[3] + fields[4], sum(fields[:8])  # idle + iowait; no guest time
    last, _LAST = _LAST, (idle, total)
    if last is None or total == last[1]:
        return 0.0
    return (idle - last[0]) / (total - last[1]) * (os.cpu_count() or 1)


_LAST: tuple[int, int] | None = None


def _wait_for_idle() -> bool:
    """Until a core was idle over the last ``IDLE_OVER_S``; False once the run ends."""
    _idle_cpus()
    while not _STOP.wait(IDLE_OVER_S):
        if _idle_cpus() >= IDLE_CPUS:
            return True
    return False


def _work() -> None:
    if hasattr(os, "setpriority"):  # this thread's children inherit its priority (Linux)
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except OSError:
            pass
    for job in _ORDER:
        if job.state != "queued":
            continue
        if not _wait_for_idle():
            return
        with _LOCK:
            if _STOP.is_set():
                return
            if job.state != "queued":
                continue
            job.state = "running"
            try:
                job.proc = subprocess.Popen(
                    [sys.executable, *job.args],
                    env=job.env,
                    cwd=job.cwd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                _finish(job, exc)
                continue
        try:
            out, err = job.proc.communicate()
            _finish(job, subprocess.CompletedProcess(job.proc.args, job.proc.returncode, out, err))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            _finish(job, exc)


def _finish(job: Job, outcome: Any) -> None:
    job.outcome = outcome
    job.state = "done"
    job.done.set()


def result(request: Any, suffix: str = "") -> tuple[subprocess.CompletedProcess[str], Path]:
    """The child of the requesting test (``suffix``: ``#N``), as ``_proc.run`` gives it, and
    its directory."""
    job = _JOBS[f"{request.module.__name__}::{request.node.name}{suffix}"]
    with _LOCK:
        if job.state == "registered":  # not selected at collection (run on its own): prepare
            job.prepare()
        if job.state == "queued":
            job.state = "claimed"
    if job.state == "claimed":
        try:
            _finish(job, _proc.run(*job.args, env=job.env, cwd=job.cwd, timeout=job.timeout))
        except BaseException as exc:  # noqa: BLE001 - raised below, as run() raised it
            _finish(job, exc)
    elif not job.done.is_set():
        _hurry(job)
        if not job.done.wait(job.timeout):
            job.proc.kill()
            job.done.wait()
            raise subprocess.TimeoutExpired(job.proc.args, job.timeout)
    if isinstance(job.outcome, BaseException):
        raise job.outcome
    assert job.dir is not None
    return job.outcome, job.dir


def _hurry(job: Job) -> None:
    """A test waits for it: its normal priority back (where the system lets us)."""
    if job.proc is not None and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, job.proc.pid, 0)
        except OSError:
            pass


def stop() -> None:
    """At the end of the run: no more children; the one running is ended; the directories go."""
    _STOP.set()
    with _LOCK:
        running = [job for job in _ORDER if job.state == "running" and job.proc is not None]
    for job in running:
        job.proc.kill()
    if _WORKER is not None:
        _WORKER.join(60)
    for job in _JOBS.values():
        if job.dir is not None:
            shutil.rmtree(job.dir, ignore_errors=True)
