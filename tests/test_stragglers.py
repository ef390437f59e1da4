"""Stragglers named by cause: a real gloo job of 4 processes (2: the torchrun job of
tests/test_distributed.py, ``test_summaries_name_the_late_rank_*``) where one rank sleeps in
``work`` before its all_reduce. The collective equalises the step times (every rank's step
ends together) and the waiting ranks spend the longest in the collective; both summaries must
name the late rank, not a waiting one, and ``work`` as where its time went."""

from __future__ import annotations

import json

from instrument import cli
from instrument.cli import inputs as traces
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
    text, doc = summarize(capsys, path)
    skew = doc["ranks"]["collectives"]
    assert skew["late_rank"] == slow, skew
    assert skew["matched"] >= 2
    assert skew["by_rank"][str(slow)]["arrived_last"] == skew["matched"]
    assert skew["clock"].startswith("shared")
    assert skew["extra_time_in"]["range"] == "work"
    ranges = doc["ranks"]["ranges"]
    for name in ("work", "allreduce", "gloo:all_reduce", "train_step"):
        assert ranges[name]["slowest_rank"] == slow, (name, ranges[name])
    late, extra = traces.format_collective_skew(skew)  # (the text table's lines)
    assert late.startswith(f"late rank: rank {slow}, last at {skew['matched']} of ")
    assert extra.startswith("  its extra time: range 'work', +")
    assert late in text and extra in text, text  # under "ranks side by side"


def test_both_summaries_name_the_late_rank_of_four_and_its_range(tmp_path, capsys):
    world, slow = 4, 2
    _run_job(tmp_path, world, slow)
    check_metrics(capsys, tmp_path / "reports.jsonl", world, slow)
    check_traces(capsys, tmp_path / "traces", slow)


# ---------------------------------------------------------------- the collectives' wrapper

WRAPPER = """
import json, os, sys
import torch, torch.distributed as dist
from instrument.runtime import collectives, metrics, state

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


# ---------------------------------------------------------------- hand-made traces

STEP_US = 100_000.0


def _trace(
    rank: int, late_us: list[float], host: str, shift_us: float = 0.0, nccl: bool = False
) -> dict:
    """A rank's trace of ``len(late_us)`` steps: ``train_step`` = ``work`` (1 ms, plus this
    rank's lateness at that step) then ``allreduce``, inside which ``gloo:all_reduce`` (on the
    backend's thread) lasts until the latest rank of that step has arrived. ``nccl``: a
    20 us ``nccl:all_reduce`` launch on the host, and the device kernel that waits."""
    events = []

    def x(name, ts, dur, tid=1, cat="user_annotation"):
        events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 10 + rank,
                "tid": tid,
                "ts": ts + shift_us,
                "dur": dur,
            }
        )

    for k, lates in enumerate(late_us):
        mine, latest = lates[rank], max(lates)
        s = k * STEP_US + 1000.0 - rank * 1_000_000.0  # the same instant as the others
        end = s + 1000.0 + latest + 300.0
        x(f"ProfilerStep#{k}", s, end - s)
        x("train_step", s, end - s)
        x("work", s, 1000.0 + mine)
        x("allreduce", s + 1000.0 + mine, end - (s + 1000.0 + mine))
        if nccl:
            x("nccl:all_reduce", s + 1010.0 + mine, 20.0)
            kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
            x(kernel, s + 1030.0 + mine, latest - mine + 230.0, tid=7, cat="kernel")
        else:
            x("gloo:all_reduce", s + 1010.0 + mine, latest - mine + 250.0, tid=2)
    return {
        "traceEvents": events,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": len(late_us[0])},
        "host_name": host,
        # each process's base is its own (rounded): ts counts from it
        "baseTimeNanoseconds": 1_000_000_000 * (rank + 1),
    }


def _write(tmp_path, traces) -> str:
    out = tmp_path / "traces"
    out.mkdir()
    for rank, trace in enumerate(traces):
        (out / f"job_rank{rank}.pt.trace.json").write_text(json.dumps(trace))
    return str(out)


def test_across_hosts_arrival_is_read_from_durations(tmp_path, capsys):
    """Rank 1's clock is 5 s ahead (another host): by start times rank 1 would be last at
    every collective; by durations (the ranks leave together) rank 2, 30 ms late, is."""
    lates = [[0.0, 200.0, 30_000.0]] * 4
    traces = [_trace(r, lates, f"host{r}", 5e6 if r == 1 else 0.0) for r in range(3)]
    _, doc = summarize(capsys, _write(tmp_path, traces))
    skew = doc["ranks"]["collectives"]
    assert skew["clock"].startswith("not shared")
    assert (skew["late_rank"], skew["matched"]) == (2, 4)
    assert skew["by_rank"]["2"]["arrived_last"] == 4
    assert abs(skew["by_rank"]["2"]["late_by_us_median"] - 29_800.0) < 1.0
    assert skew["extra_time_in"]["range"] == "work"
    assert doc["ranks"]["ranges"]["gloo:all_reduce"]["slowest_rank"] == 2


def test_ranks_late_by_turns_name_no_late_rank(tmp_path, capsys):
    """Each rank is last at one collective, by 50 to 150 us: noise, no late rank; the
    collective's row keeps the longest (not "late") rank."""
    lates = [[150.0, 0.0, 0.0], [0.0, 120.0, 0.0], [0.0, 0.0, 50.0]]
    text, doc = summarize(capsys, _write(tmp_path, [_trace(r, lates, "h") for r in range(3)]))
    skew = doc["ranks"]["collectives"]
    assert skew["clock"].startswith("shared") and skew["matched"] == 3
    assert skew["late_rank"] is None and skew["extra_time_in"] is None
    assert [skew["by_rank"][str(r)]["arrived_last"] for r in range(3)] == [1, 1, 1]
    assert "slowest_by" not in doc["ranks"]["ranges"]["gloo:all_reduce"]


def test_ranks_with_different_numbers_of_collectives_say_so(tmp_path, capsys):
    one, two = _trace(0, [[0.0, 20_000.0]] * 3, "h"), _trace(1, [[0.0, 20_000.0]] * 3, "h")
    first = min(e["ts"] for e in two["traceEvents"])
    two["traceEvents"] = [e for e in two["traceEvents"] if e["ts"] < first + 2 * STEP_US]
    _, doc = summarize(capsys, _write(tmp_path, [one, two]))
    skew = doc["ranks"]["collectives"]
    assert skew["matched"] == 2 and skew["late_rank"] == 1
    (note,) = skew["notes"]
    assert "different numbers of collectives (rank 0: 3, rank 1: 2)" in note


# ---------------------------------------------------------------- hand-made metrics records


def _stats(count: int, per_call_s: float) -> dict:
    return {
        "count": count,
        "sum_s": count * per_call_s,
        **{k: per_call_s for k in ("min_s", "p50_s", "p90_s", "p99_s", "max_s")},
    }


def _record(rank: int, world: int, load_s: float, wait_s: float, compute_s: float = 0.010) -> dict:
    """A rank's last metrics record of 100 steps: ``train_step`` = ``load`` + ``compute`` +
    an all_reduce that waited ``wait_s``; the step histogram left two steps out (a window's
    start and stop), the ranges and the collective kept every call."""
    steps = 100
    step = load_s + compute_s + wait_s
    return {
        "schema": "torch-profiled/metrics/1",
        "time_ns": 2_000_000_000,
        "since_ns": 1_000_000_000,
        "rank": rank,
        "world_size": world,
        "host": "h",
        "pid": 100 + rank,
        "steps": _stats(steps - 2, step),
        "ranges": {
            "train_step": _stats(steps, step),
            "load": _stats(steps, load_s),
            "compute": _stats(steps, compute_s),
            "torch.distributed.all_reduce": _stats(steps, wait_s),
            # a start-up barrier: rank 0 waited 20 s for the others to load (outside steps)
            "torch.distributed.barrier": _stats(1, 20.0 if rank == 0 else 0.001),
        },
        "device_ranges": [],
    }


def _records(tmp_path, records) -> str:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_equal_step_times_and_noise_outside_collectives_name_no_straggler(tmp_path, capsys):
    """Four ranks of 3 ms steps that spend under a millisecond outside collectives, rank 2
    0.4 ms more than the others (1.8x their time outside collectives, 14% of their step):
    noise, measured against the step, not against the small time outside collectives."""
    loads = [0.0005, 0.0006, 0.0009, 0.0005]
    latest = max(loads)
    recs = [_record(r, 4, load, latest - load + 0.002, 0.0) for r, load in enumerate(loads)]
    text, doc = summarize(capsys, _records(tmp_path, recs))
    assert doc["straggler_figure"] == "outside_collectives_per_step"
    assert doc["step_range"] == "train_step"
    assert doc["stragglers"] == []
    assert "stragglers: none (time outside collectives per step over the other" in text
    assert doc["ranks"]["2"]["collectives"]["vs_others"] > 1.7


def test_a_late_rank_is_named_with_the_range_of_its_extra_time(tmp_path, capsys):
    loads = [0.001, 0.001, 0.001, 0.031]  # rank 3 loads 30 ms longer; the others wait for it
    recs = [_record(r, 4, load, 0.031 - load + 0.002) for r, load in enumerate(loads)]
    text, doc = summarize(capsys, _records(tmp_path, recs))
    assert doc["stragglers"] == [3]
    late = doc["ranks"]["3"]
    assert late["extra_time_in"]["range"] == "load"
    assert abs(late["extra_time_in"]["extra_per_step_s"] - 0.030) < 1e-6
    c = late["collectives"]
    # per call of train_step; the barrier's one call is outside the steps
    assert abs(c["in_collectives_per_step_s"] - 0.002) < 1e-9
    assert (
        "note: left out of the steps' collectives, called fewer times than steps: barrier" in text
    )
    assert abs(c["others_waited_per_step_s"] - 0.030) < 1e-9
    assert doc["ranks"]["0"]["straggler"] is False
    (line,) = [ln for ln in text.splitlines() if ln.startswith("stragglers")]
    assert line.endswith("its extra time: range 'load', +30.000ms/step)"), line


def test_nccl_arrival_is_read_from_the_device_kernels(tmp_path, capsys):
    """NCCL's host events are launches (20 us each on every rank: by their durations no
    rank is late); its kernels last as long as their rank waits: they name rank 1, 40 ms
    late, and ``work`` (two hosts: arrival from durations)."""
    lates = [[0.0, 40_000.0]] * 3
    traces = [_trace(r, lates, f"h{r}", nccl=True) for r in range(2)]
    _, doc = summarize(capsys, _write(tmp_path, traces))
    skew = doc["ranks"]["collectives"]
    assert (skew["late_rank"], skew["matched"]) == (1, 3)
    assert abs(skew["by_rank"]["1"]["late_by_us_median"] - 40_000.0) < 1.0
    assert skew["extra_time_in"]["range"] == "work"


def test_records_of_ranks_without_timed_collectives_say_what_cannot_be_named(tmp_path, capsys):
    """DDP's all-reduce is not seen from Python: equal step times, a note that says why no
    rank is named and where to look, and the step p50 rule as before."""
    recs = [_record(r, 2, load, 0.031 - load) for r, load in enumerate([0.001, 0.031])]
    for rec in recs:
        rec["ranges"] = {k: v for k, v in rec["ranges"].items() if "distributed" not in k}
    text, doc = summarize(capsys, _records(tmp_path, recs))
    assert doc["straggler_figure"] == "step_p50" and doc["stragglers"] == []
    assert "note: no collective timed (DDP's runs in C++), so step times are equal" in text


def test_a_stand_in_step_missing_on_a_rank_is_said_not_guessed(tmp_path, capsys):
    """No step=True function: the range of largest total stands in for the step; where one
    rank never ran it, no time outside collectives per step is made up for that rank."""
    recs = [_record(r, 2, load, 0.031 - load) for r, load in enumerate([0.001, 0.031])]
    for rec in recs:
        rec["steps"] = None
    del recs[1]["ranges"]["train_step"]
    text, doc = summarize(capsys, _records(tmp_path, recs))
    assert doc["step_source"] == {"range": "train_step"}
    assert doc["straggler_figure"] == "step_p50"
    assert "note: collectives timed, but no range stands for the step on every rank: " in text
    assert "stragglers by step p50\n" in text
