"""Issue 29, item 19 (a window owned by another thread at exit): a daemon thread still
training when the main thread exits owns its window's profiler (only it can stop it). Its next
decorated call stops it now and the window is exported; where that thread makes no call
within the deadline's share, one warning says the truth (which thread, the window lost) and
the process still exits cleanly. Before: no window, no true word, and the process aborted in
torch's teardown (exit 134).
"""

from __future__ import annotations

from tests._records import window_records

PROGRAM = r"""
import sys, threading, time, torch
from instrument import profiled

BLOCKS = sys.argv[1] == "blocks"
x = torch.randn(8, 8)


@profiled("train_step", step=True)
def train_step():
    return x @ x


def loop():
    n = 0
    while True:
        train_step()
        n += 1
        if n == 5:
            ready.set()
        if n >= 6 and BLOCKS:
            threading.Event().wait()  # stuck in the program's own code: no call comes
        time.sleep(0.005)


ready = threading.Event()
threading.Thread(target=loop, daemon=True, name="trainer").start()
ready.wait(120)
time.sleep(0.2)
print("main exits", flush=True)
"""


def _run(tmp_path, how: str):
    from tests import _proc

    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    path = tmp_path / "r.jsonl"
    env = _proc.sdk_env(
        PROFILED_EXPORTERS="json",
        PROFILED_JSON_PATH=str(path),
        PROFILED_SCHEDULE="warmup=0,active=100000",
        PROFILED_ACTIVITIES="cpu",
        PROFILED_EXPORT_TIMEOUT_S="4",
    )
    out = _proc.run(str(script), how, env=env, cwd=tmp_path, timeout=180)
    return out, (window_records(path.read_text()) if path.exists() else [])


def test_a_daemon_threads_window_open_at_exit_is_exported(tmp_path):
    out, windows = _run(tmp_path, "steps")
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(windows) == 1 and windows[0]["partial"] and windows[0]["steps"], windows
    assert "is lost" not in out.stderr


def test_a_daemon_thread_that_never_comes_back_gets_the_truth_and_a_clean_exit(tmp_path):
    out, windows = _run(tmp_path, "blocks")
    assert out.returncode == 0, out.stderr[-3000:]
    assert windows == []
    said = [line for line in out.stderr.splitlines() if "that window is lost" in line]
    assert said and "(trainer, a daemon thread)" in said[0], out.stderr[-3000:]
