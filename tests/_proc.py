"""The one way tests start a real Python process (a program, a module, the CLI, an example).

Every child gets the same environment unless a test says otherwise: this process's, without
any ``PROFILED_*`` variable (the suite's own settings must not leak into a program under test),
with the repository first on ``PYTHONPATH`` (the checkout's SDK, whatever is installed).
``run`` waits for the child; ``start`` returns it running (signals, pipes, kills).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

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
