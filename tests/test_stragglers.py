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
