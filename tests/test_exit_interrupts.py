"""Issue 29, item 19 (the exit's parts): Ctrl-C while the exit waits for a slow exporter is
honoured (no SDK traceback, one line of what was abandoned, the program's atexit functions
run, the process ends as an interrupted one: -2 / 130), where it used to print an SDK
traceback and exit 0. A SIGTERM that comes while the exit's export runs lets it finish,
then ends the process by the signal.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests import _proc
from tests._records import window_records

PROGRAM = r"""
import atexit, sys, threading
import torch
import instrument
from exporters import Exporter, ExportResult
from instrument import Schedule, profiled

WHERE, WAIT = sys.argv[1], float(sys.argv[2])


class Slow(Exporter):
    # a backend that takes its time: the exit waits for it (up to the deadline)
    def export(self, report):
        if WHERE == "export":
            print("in export", flush=True)
            threading.Event().wait(WAIT)
        return ExportResult.SUCCESS

    def shutdown(self):
        if WHERE == "shutdown":
            print("in export", flush=True)
            threading.Event().wait(WAIT)


instrument.configure(
    exporters=[Slow(), "json"],
    schedule=Schedule(warmup=0, active=2, repeat=3),
    activities=["cpu"],
    export_timeout_s=120,
)
atexit.register(lambda: print("the program's atexit ran", flush=True))
x = torch.randn(8, 8)


@profiled("train_step", step=True)
def train_step():
    return x @ x


for _ in range(7):
    train_step()
print("main done", flush=True)
"""


def _run_until_export(tmp_path, where: str, wait: float = 60) -> tuple[subprocess.Popen, object]:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    path = tmp_path / "r.jsonl"
    child = _proc.start(
        str(script), where, str(wait), env=_proc.sdk_env(PROFILED_JSON_PATH=str(path)), cwd=tmp_path
    )
    assert child.stdout is not None
    seen = []
    while (line := child.stdout.readline()) and line != "in export\n":
        seen.append(line)
    assert line == "in export\n", (seen, child.communicate(timeout=120))
    return child, path


def _signal(child: subprocess.Popen, signum: int) -> tuple[str, str]:
    child.send_signal(signum)
    try:
        return child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        raise AssertionError("hung after the signal: " + child.communicate()[1][-3000:]) from None


@pytest.mark.parametrize("where", ["export", "shutdown"])
def test_ctrl_c_while_exit_waits_for_a_slow_exporter_is_honoured(tmp_path, where):
    child, _ = _run_until_export(tmp_path, where)
    out, err = _signal(child, signal.SIGINT)
    assert child.returncode in (-signal.SIGINT, 130), (child.returncode, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "interrupted (Ctrl-C) while exporting" in line]
    assert len(lines) == 1, err[-3000:]
    assert "the program's atexit ran" in out


def test_sigterm_while_exit_exports_ends_by_the_signal(tmp_path):
    """Where the window reports are already out (the slow part is the exporter's shutdown),
    SIGTERM during the exit lets the export end within its deadline, then ends by SIGTERM."""
    child, path = _run_until_export(tmp_path, "shutdown", wait=2)
    out, err = _signal(child, signal.SIGTERM)
    assert child.returncode == -signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert [r["window"] for r in window_records(path.read_text())] == [0, 1, 2]
