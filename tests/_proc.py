"""The one way tests start a real Python process (a program, a module, the CLI, an example).

Every child gets the same environment unless a test says otherwise: this process's, without
any ``PROFILED_*`` variable (the suite's own settings must not leak into a program under test),
with the repository first on ``PYTHONPATH`` (the checkout's SDK, whatever is installed).
``run`` waits for the child; ``start`` returns it running (signals, pipes, kills).

Each child imports torch (~2-3 s of one core on the 2-core runner) while this process waits:
``Ahead`` runs a module's independent children two at a time, on both cores (and
``tests._early`` children in the background, on the core the run leaves idle). Only for
children whose assertions hold on a loaded machine (nothing timed, no deadline near a
child's pace), as every test's must beside a busy neighbour anyway.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

PARALLEL = 2  # children side by side in ``Ahead``: the cores of the CI runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sdk_env(extra: dict[str, str] | None = None, **more: str) -> dict[str, str]:
    """This process's environment minus ``PROFILED_*``, the repository on ``PYTHONPATH``,
    then ``extra`` and ``more`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFILED_")}
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    env.update(more)
    return env


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Any = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` (e.g. ``"-c", code`` or ``"-m", "instrument", "summarize", path``) to
    its end; text output captured. ``env`` replaces :func:`sdk_env` when given."""
    return subprocess.run(
        [sys.executable, *args],
        env=sdk_env() if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(
    *args: str, env: dict[str, str] | None = None, cwd: Any = None, **popen: Any
) -> subprocess.Popen:
    """``python ARGS`` running, stdout and stderr piped as text unless ``popen`` says
    otherwise; the caller waits for it (or kills it)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("text", True)
    return subprocess.Popen(
        [sys.executable, *args], env=sdk_env() if env is None else env, cwd=cwd, **popen
    )


class Ahead:
    """A module's children run ahead of its tests, ``parallel`` at a time, each in a directory
    of its own (its working directory), each under a key naming the test that reads it
    (``request.node.name``, then ``#N`` where a test reads several): only those of the tests
    selected to run are started. In a module-scoped fixture::

        with _proc.Ahead(request, tmp_path_factory) as ahead:
            ahead.add("test_x[a]", "-c", CODE, env=lambda cwd: _proc.sdk_env(...))
            yield ahead

    and in ``test_x``: ``result, cwd = ahead[request.node.name]``. ``env`` is a mapping, or a
    function of the child's directory. Leaving the ``with`` waits for the children still
    running (cancels those not started)."""

    def __init__(self, request: Any, tmp_path_factory: Any, parallel: int = PARALLEL) -> None:
        module = request.module
        self._selected = {
            item.name for item in request.session.items if getattr(item, "module", None) is module
        }
        self._tmp = tmp_path_factory
        self._pool = ThreadPoolExecutor(parallel)
        self._jobs: dict[str, tuple[Future[Any], Path]] = {}
        self._dirs: dict[str, Path] = {}

    def add(
        self,
        key: str,
        *args: str,
        env: dict[str, str] | Callable[[Path], dict[str, str]] | None = None,
        timeout: float = 120,
        files: dict[str, str] | None = None,
    ) -> None:
        """Start ``python ARGS`` for the test ``key`` names, if that test runs, in a new
        directory holding ``files`` (name -> text)."""
        cwd = self.directory(key)
        if cwd is None:
            return
        for name, text in (files or {}).items():
            (cwd / name).write_text(text)
        child_env = sdk_env() if env is None else env(cwd) if callable(env) else env
        self._submit(key, lambda: run(*args, env=child_env, cwd=cwd, timeout=timeout))

    def call(self, key: str, fn: Callable[[Path], Any]) -> None:
        """Run ``fn(directory)`` for the test ``key`` names, if that test runs: a child the
        test talks to (signals, pipes), started and answered there. ``fn`` runs on a thread of
        its own: it must not read ``os.environ``, which the tests' fixtures change (pass it an
        environment made before, with ``directory(key)`` where it names the directory)."""
        cwd = self.directory(key)
        if cwd is not None:
            self._submit(key, lambda: fn(cwd))

    def directory(self, key: str) -> Path | None:
        """The directory of the child for ``key`` (made now), or None where its test does not
        run."""
        if key.split("#")[0] not in self._selected:
            return None
        if key not in self._dirs:
            self._dirs[key] = self._tmp.mktemp(key.split("[")[0][:40])
        return self._dirs[key]

    def _submit(self, key: str, job: Callable[[], Any]) -> None:
        if key in self._jobs:
            raise ValueError(f"two children under {key}")
        self._jobs[key] = (self._pool.submit(job), self._dirs[key])

    def __getitem__(self, key: str) -> tuple[Any, Path]:
        """The child's result (once it ended: a ``CompletedProcess`` where ``add`` started it)
        and its directory."""
        future, cwd = self._jobs[key]
        return future.result(), cwd

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
