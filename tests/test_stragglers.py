"""Stragglers named by cause: a real gloo job of 4 processes (2: the torchrun job of
tests/test_distributed.py, ``test_summaries_name_the_late_rank_*``) where one rank sleeps in
``work`` before its all_reduce. The collective equalises the step times (every rank's step
ends together) and the waiting ranks spend the longest in the collective; both summaries must
name the late rank, not a waiting one, and ``work`` as where its time went."""

from __future__ import annotations

import json

from instrument import cli
from tests import _proc
from tests.test_distributed import JOB, _no_launcher_variables, free_port, job_env

__all__ = ["_no_launcher_variables"]  # the fixture: no launcher variables from outside

STEPS = "6"


def _run_job(tmp_path, world: int, slow: int) -> None:
    env = job_env(
        tmp_path,
        PROFILED_EXPORTERS="trace,json",
        PROFILED_SCHEDULE="wait=1,warmup=1,active=3,repeat=1",
    )
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [
        _proc.start(
            JOB,
            STEPS,
            "--init",
            init,
            "--rank",
            str(r),
            "--world-size",
            str(world),
            "--slow-rank",
            str(slow),
            env=env,
            cwd=tmp_path,
        )
        for r in range(world)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * world, outs


def summarize(capsys, path) -> tuple[str, dict]:
    """``torch-profiled summarize PATH``, as text and ``--json`` (in this process: no start-up
    cost twice)."""
    assert cli.main(["summarize", str(path)]) == 0
    text = capsys.readouterr().out
    assert cli.main(["summarize", str(path), "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def check_metrics(capsys, path, world: int, slow: int) -> None:
    """The metrics name ``slow`` by its time outside collectives, and ``work``."""
    text, doc = summarize(capsys, path)
    assert doc["straggler_figure"] == "outside_collectives_per_step"
    assert doc["step_range"] == "train_step"
    assert doc["stragglers"] == [slow], text
    late = doc["ranks"][str(slow)]
    assert late["extra_time_in"]["range"] == "work"
    assert late["collectives"]["calls"]["all_reduce"] >= 4
    for key, r in doc["ranks"].items():  # every waiting rank spent longer in all_reduce
        if int(key) != slow:
            waited = r["collectives"]["in_collectives_per_step_s"]
            assert waited > late["collectives"]["in_collectives_per_step_s"], (key, doc)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("stragglers")]
    assert f"rank {slow} (" in line and "its extra time: range 'work'" in line, line
    assert not any(f"rank {r} (" in line for r in range(world) if r != slow), line
    assert "torch.distributed.all_reduce" not in doc["ranges"]  # in its own section


def check_traces(capsys, path, slow: int) -> None:
    """The traces name ``slow`` as the rank that arrived last, and ``work``."""
    _, doc = summarize(capsys, path)
    skew = doc["ranks"]["collectives"]
    assert skew["late_rank"] == slow, skew
    assert skew["matched"] >= 2
    assert skew["by_rank"][str(slow)]["arrived_last"] == skew["matched"]
    assert skew["clock"].startswith("shared")
    assert skew["extra_time_in"]["range"] == "work"
    ranges = doc["ranks"]["ranges"]
    for name in ("work", "allreduce", "gloo:all_reduce", "train_step"):
        assert ranges[name]["slowest_rank"] == slow, (name, ranges[name])


def test_both_summaries_name_the_late_rank_of_four_and_its_range(tmp_path, capsys):
    world, slow = 4, 2
    _run_job(tmp_path, world, slow)
    check_metrics(capsys, tmp_path / "reports.jsonl", world, slow)
    check_traces(capsys, tmp_path / "traces", slow)


# ---------------------------------------------------------------- the collectives' wrapper

WRAPPER = """
import json, os, sys
import torch, torch.distributed as dist
from instrument import collectives, metrics, state

dist.init_process_group("gloo", init_method="file://" + os.path.abspath("store"), rank=0,
                        world_size=1)
original = {n: getattr(dist, n) for n in collectives.COLLECTIVES}
state.set_metrics(True)
assert collectives.install()
assert all(getattr(dist, n) is not f for n, f in original.items())
assert dist.all_reduce.__wrapped__ is original["all_reduce"]
t = torch.ones(2)
dist.all_reduce(t)
dist.barrier()
dist.broadcast(t, 0)
dist.all_reduce(t, async_op=True).wait()  # async: the wait is elsewhere, not timed
dist.all_reduce(t, dist.ReduceOp.SUM, None, True).wait()  # async_op given by position
raised = []
for fn in (original["all_reduce"], dist.all_reduce):  # the same exception, untimed
    try:
        fn("not a tensor")
    except Exception as exc:
        raised.append((type(exc).__name__, str(exc)))
state.set_metrics(False)
dist.all_reduce(t)  # metrics off: not timed
state.set_metrics(True)
assert collectives.install()  # again: no second wrapper
assert dist.all_reduce.__wrapped__ is original["all_reduce"]
dist.all_reduce(t)
counts = {r.name: r.count for r in metrics.snapshot().ranges}
collectives.uninstall()
assert all(getattr(dist, n) is f for n, f in original.items())
dist.all_reduce(t)  # put back: not timed
assert {r.name: r.count for r in metrics.snapshot().ranges} == counts
dist.destroy_process_group()
print(json.dumps({"counts": counts, "same": raised[0] == raised[1], "sum": t.tolist()}))
"""


def test_blocking_collectives_are_timed_async_and_switched_off_ones_are_not(run_python):
    result = run_python(WRAPPER)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["counts"] == {
        "torch.distributed.all_reduce": 2,
        "torch.distributed.barrier": 1,
        "torch.distributed.broadcast": 1,
    }
    assert out["same"] is True
    assert out["sum"] == [1.0, 1.0]  # a world of one: every collective left t as it was


def test_metrics_start_wraps_the_collectives_and_a_process_without_metrics_keeps_them(
    run_python,
):
    """Where metrics start (the ambient session, ``lifetime``), the collectives are wrapped;
    with metrics off nothing of torch.distributed is touched."""
    code = """
import torch.distributed as dist
from instrument import profiled
original = dist.all_reduce
@profiled("f")
def f():
    return 1
f()
print(dist.all_reduce is original, getattr(dist.all_reduce, "__wrapped__", None) is original)
"""
    on = run_python(code, env={"PROFILED_EXPORTERS": "json", "PROFILED_METRICS": "1"})
    off = run_python(code, env={"PROFILED_EXPORTERS": "json", "PROFILED_METRICS": "0"})
    assert (on.returncode, off.returncode) == (0, 0), on.stderr + off.stderr
    assert on.stdout.split() == ["False", "True"]
    assert off.stdout.split() == ["True", "False"]
