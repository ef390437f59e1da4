"""Processes a profiled process starts (DataLoader workers with a spawn context,
``multiprocessing`` spawn, ``subprocess``) stay silent unless ``PROFILED_CHILDREN=1``: before,
each profiled itself as "rank 0/1" and printed its own tables."""

from __future__ import annotations

import os

import pytest

from tests._records import window_records

PROGRAM = """
import multiprocessing as mp, os, sys, torch
from instrument import profiled, step

def work(x):
    return x @ x

wrapped = profiled("work")(work)

def child(q):
    q.put(wrapped is work)  # silent: @profiled gives the function itself
    x = torch.ones(8, 8)
    for i in range(12):
        wrapped(x)
        step()

if __name__ == "__main__":
    x = torch.ones(8, 8)
    for i in range(12):  # the parent profiles
        wrapped(x)
        step()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    print("child's decorator is the function itself:", q.get(timeout=120))
    p.join(120)
    print("child exit", p.exitcode)
"""


def _pids(path) -> list[int]:
    """The process of each window report (the metrics records aside)."""
    return [r["pid"] for r in window_records(path.read_text())]


@pytest.mark.parametrize("children", [None, "1"])
def test_a_spawned_child_is_silent_unless_asked(run_python, tmp_path, children):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = tmp_path / "reports.jsonl"
    env = {
        "PROFILED_EVERY": "4",
        "PROFILED_EXPORTERS": "json,console",
        "PROFILED_JSON_PATH": str(out),
        "PROFILED_ACTIVITIES": "cpu",
    }
    if children:
        env["PROFILED_CHILDREN"] = children
    result = run_python(
        f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", env=env, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "child exit 0" in result.stdout
    pids = _pids(out)
    parent = {p for p in pids}
    assert pids and os.getpid() not in parent
    if children:
        assert "decorator is the function itself: False" in result.stdout
        assert len(parent) == 2  # both profiled themselves
    else:
        assert "decorator is the function itself: True" in result.stdout
        assert len(parent) == 1  # the parent only
        assert (result.stdout + result.stderr).count("torch-profiled | window") == len(pids)
