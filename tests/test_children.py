"""Processes a profiled process starts (DataLoader workers with a spawn context,
``multiprocessing`` spawn, ``subprocess``) stay silent unless ``PROFILED_CHILDREN=1``: before,
each profiled itself as "rank 0/1" and printed its own tables."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from tests import _proc
from tests._records import metrics_records, window_records

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


def _main(script: str, *argv: str) -> str:
    """Code that runs ``script`` (in the working directory) as ``__main__``: what spawned
    children import again."""
    return (
        f"import runpy, sys; sys.argv = [{script!r}, *{list(argv)!r}]; "
        f"runpy.run_path({script!r}, run_name='__main__')"
    )


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """Every program of this module (each its own process, its children spawned, forked or
    served as before), run two at a time as the module starts; a test reads its own."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:
        for children in (None, "1"):

            def env(cwd, children=children):
                return _proc.sdk_env(
                    PROFILED_EVERY="4",
                    PROFILED_EXPORTERS="json,console",
                    PROFILED_JSON_PATH=str(cwd / "reports.jsonl"),
                    PROFILED_ACTIVITIES="cpu",
                    **({"PROFILED_CHILDREN": children} if children else {}),
                )

            key = f"test_a_spawned_child_is_silent_unless_asked[{children}]"
            ahead.add(key, "-c", _main("prog.py"), env=env, files={"prog.py": PROGRAM},
                      timeout=240)  # fmt: skip
        for context in ("spawn", "forkserver", "fork"):
            if context not in multiprocessing.get_all_start_methods():
                continue

            def env(cwd):
                return _proc.sdk_env(
                    PROFILED_EVERY="4",
                    PROFILED_EXPORTERS="json,console,trace",
                    PROFILED_JSON_PATH=str(cwd / "reports.jsonl"),
                    PROFILED_TRACE_DIR=str(cwd / "traces"),
                    PROFILED_ACTIVITIES="cpu",
                    PROFILED_ANALYSIS_PROCESS="0",  # fewer processes on a busy box
                )

            key = f"test_dataloader_workers_never_profile_themselves_whatever_the_order[{context}]"
            ahead.add(key, "-c", _main("loader.py", context), env=env,
                      files={"loader.py": LOADER_PROGRAM}, timeout=400)  # fmt: skip
        for children in (None, "1"):
            env = {"PROFILED_CHILDREN": children} if children else {}
            env["PROFILED_EXPORTR"] = "json"  # misspelt: said once, by the parent, not by each
            key = f"test_a_dataloader_worker_is_a_child_unless_children_are_asked_for[{children}]"
            ahead.add(key, "-c", _main("decisions.py", "spawn"), env=_proc.sdk_env(env),
                      files={"decisions.py": DECISION_PROGRAM}, timeout=240)  # fmt: skip
        yield ahead


@pytest.mark.parametrize("children", [None, "1"])
def test_a_spawned_child_is_silent_unless_asked(ahead, request, children):
    result, tmp_path = ahead[request.node.name]  # PROGRAM, windows every 4 steps
    out = tmp_path / "reports.jsonl"
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


# ---------------------------------------------------------------- DataLoader workers (issue 29, 3)

LOADER_PROGRAM = """
import os, sys, torch
from torch.utils.data import DataLoader, Dataset
from instrument import profiled, step

class Squares(Dataset):
    def __len__(self):
        return 16

    @profiled("getitem")  # the worker calls it 16 times an epoch: windows, unless it is silent
    def __getitem__(self, i):
        return torch.full((4,), float(i)) ** 2

@profiled("train_step")
def train_step(batch):
    return (batch @ batch.T).sum()

def epoch(context):
    loader = DataLoader(Squares(), batch_size=2, num_workers=1, multiprocessing_context=context)
    got = []
    for batch in loader:  # starts the workers, then the parent's decorated calls
        got += [int(v) for v in batch[:, 0]]
        train_step(batch)
        step()
    assert sorted(got) == [i * i for i in range(16)], got  # the workers' calls did their work

if __name__ == "__main__":
    context = sys.argv[1]
    epoch(context)  # the loader starts its workers before the first decorated call here
    epoch(context)  # and after the parent's profiling started
    print("parent", os.getpid(), "done")
"""


def _loader_run(ahead, request):
    """The test's run of LOADER_PROGRAM; its result, the parent's pid, the pid of each window
    report, and the pids that wrote traces or metrics records."""
    result, tmp_path = ahead[request.node.name]
    out = tmp_path / "reports.jsonl"
    assert result.returncode == 0, result.stderr[-3000:]
    parent = int(result.stdout.split("parent ")[1].split()[0])
    traces = sorted(p.name for p in (tmp_path / "traces").iterdir())
    trace_pids = {int(name.split("_")[1]) for name in traces}  # host_PID_rankN.*.pt.trace.json
    # the json exporter also takes metrics (on by default with it): a record per process
    text = out.read_text() if out.exists() else ""
    metrics_pids = {r["pid"] for r in metrics_records(text)}
    return result, parent, _pids(out) if text else [], trace_pids | metrics_pids


@pytest.mark.parametrize("context", ["spawn", "forkserver", "fork"])
def test_dataloader_workers_never_profile_themselves_whatever_the_order(ahead, request, context):
    """Before: workers that a loader started before the parent's first decorated call (the
    usual ``for batch in loader:`` first) each opened windows, printed tables and wrote
    traces (three tables, three trace files for one program): ``PROFILED_PARENT_PID`` is set
    only once the parent's profiling starts. Every start method, both orders."""
    if context not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {context} start method here")
    result, parent, pids, writers = _loader_run(ahead, request)
    assert pids and set(pids) == {parent}, pids  # one process reported windows: the parent
    assert writers == {parent}  # traces and metrics records: the parent's alone
    tables = (result.stdout + result.stderr).count("torch-profiled | window")
    assert tables == len(pids)  # one table per window of the parent's, none of a worker's
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


DECISION_PROGRAM = """
import sys, torch
from torch.utils.data import DataLoader, Dataset
from instrument.runtime.config import Config, child_of_profiled

class Decisions(Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, i):  # in the worker: is it a child, is profiling on there?
        return torch.tensor([child_of_profiled(), Config.from_env().enabled])

if __name__ == "__main__":
    print("parent", child_of_profiled(), Config.from_env().enabled)
    loader = DataLoader(Decisions(), num_workers=1, multiprocessing_context=sys.argv[1])
    child, enabled = next(iter(loader))[0].tolist()
    print("worker", bool(child), bool(enabled))
"""


@pytest.mark.parametrize("children", [None, "1"])
def test_a_dataloader_worker_is_a_child_unless_children_are_asked_for(ahead, request, children):
    """The decision itself, in a real spawned worker started before any decorated call: a
    child (profiling off there) by default; ``PROFILED_CHILDREN=1`` lets it profile itself.
    A misspelt name is warned about by the parent alone (the worker's environment is its)."""
    result, _cwd = ahead[request.node.name]  # DECISION_PROGRAM, PROFILED_EXPORTR=json
    assert result.returncode == 0, result.stderr[-3000:]
    assert "parent False True" in result.stdout
    expected = "worker False True" if children else "worker True False"
    assert expected in result.stdout, result.stdout
    assert result.stderr.count("PROFILED_EXPORTR='json' is not a torch-profiled setting") == 1
