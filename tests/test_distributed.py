"""Distributed jobs: rank and world size, PROFILED_RANKS, per-rank trace files, and a real
2-process torchrun job on gloo (CPU) read back by Holistic Trace Analysis and by
``torch-profiled summarize``."""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import warnings

import pytest

import instrument
from exporters import InMemoryExporter
from instrument import Config, ConfigWarning, Schedule, profiled
from instrument.runtime import _torch, state
from instrument.runtime.ranks import LAUNCHER_VARS, RankSet, launcher_ranks_from_env
from instrument.runtime.sampling import Sampling
from instrument.testing import capture, forget_warnings, process_status
from tests import _proc
from tests._records import window_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(REPO, "tests", "_dist_job.py")

HTA_RANK = re.compile(r'"rank":\s+(\d+)')
JOB_SCHEDULE = Schedule(wait=2, warmup=1, active=2, repeat=3)
# the torchrun job samples: a window (1 warm-up + 2 recorded steps) may open every 4th step,
# each with probability 1/2, decided by the pure function of (seed, step) on every rank
STEPS = 24
SAMPLED_WINDOW = Schedule(warmup=1, active=2)
SAMPLING = Sampling(every=4, sample_rate=0.5, seed=4)


@pytest.fixture(autouse=True)
def _no_launcher_variables(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    forget_warnings()
    yield
    forget_warnings()


@profiled("dist.work")
def work() -> bool:
    return _torch.profiler_on()


# ---------------------------------------------------------------- PROFILED_RANKS


@pytest.mark.parametrize(
    "text, ranks, spelled",
    [
        ("all", None, "all"),
        ("", None, "all"),
        (" ALL ", None, "all"),
        ("0", {0}, "0"),
        ("0,3", {0, 3}, "0,3"),
        ("0-7", set(range(8)), "0-7"),
        ("3, 0-1 ,5-6,7", {0, 1, 3, 5, 6, 7}, "0-1,3,5-7"),
        ("2-2,2", {2}, "2"),
    ],
)
def test_rank_sets_parse_and_spell_back(text, ranks, spelled):
    parsed = RankSet.parse(text)
    # runs of ranks (ranges), never one entry per rank: expanded here, the sets are small
    held = None if parsed.ranks is None else {r for run in parsed.ranks for r in run}
    assert held == (None if ranks is None else set(ranks))
    assert parsed.to_env() == spelled and RankSet.parse(spelled) == parsed
    assert all(parsed.selects(r) == (ranks is None or r in ranks) for r in range(10))


@pytest.mark.parametrize(
    "text, why",
    [
        ("x", "'x'"),
        ("-1", "'-1'"),
        ("1.5", "'1.5'"),
        ("3-1", "ends before it starts"),
        ("0-", "'0-'"),
        (",", "no rank"),
        ("0;1", "'0;1'"),
    ],
)
def test_bad_ranks_in_the_environment_warn_once_and_profile_every_rank(text, why):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = Config.from_env({"PROFILED_RANKS": text})
        again = Config.from_env({"PROFILED_RANKS": text})
    messages = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert first.ranks == again.ranks == RankSet()
    assert len(messages) == 1, messages
    assert f"PROFILED_RANKS={text!r} is invalid" in messages[0] and why in messages[0]
    assert "using the default PROFILED_RANKS=all" in messages[0]
    with pytest.raises(ValueError, match="PROFILED_RANKS.*PROFILED_STRICT=1"):
        Config.from_env({"PROFILED_RANKS": text, "PROFILED_STRICT": "1"})


def test_ranks_in_code_are_checked_at_once():
    assert Config(ranks="0-3").ranks == RankSet(frozenset(range(4)))
    assert Config(ranks=[1, 5]).ranks.to_env() == "1,5"
    assert Config(ranks=range(2, 4)).ranks.to_env() == "2-3"
    assert Config(ranks=2).ranks.to_env() == "2"
    assert Config(ranks=None).ranks == Config().ranks == RankSet()
    with pytest.raises(ValueError, match="ends before it starts"):
        instrument.configure(ranks="4-2")
    with pytest.raises(ValueError, match="integers >= 0"):
        instrument.configure(ranks=[0, -1])
    with pytest.raises(ValueError, match="at least one rank"):
        instrument.configure(ranks=[])
    with pytest.raises(TypeError, match="ranks must be"):
        instrument.configure(ranks=1.0)


def test_a_rank_not_selected_starts_no_profiler_and_says_so_once(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    memory = InMemoryExporter()
    with capture(
        schedule=Schedule(wait=0, warmup=0, active=2, repeat=0),
        ranks="0-1",
        activities=["cpu"],
        exporters=[memory],
    ) as cap:
        seen = [work() for _ in range(6)]
        assert process_status().calls_idle  # decorated calls take the idle path: nothing is counted
        assert cap.session.finished
    assert seen == [False] * 6
    assert cap.reports == []
    (line,) = memory.notices
    assert "rank 3 (of 4) is not among the ranks that profile (PROFILED_RANKS=0-1)" in line
    assert "started no profiler" in line


def test_the_ambient_session_of_a_rank_not_selected_goes_idle(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("PROFILED_RANKS", "0")
    monkeypatch.setenv("PROFILED_SCHEDULE", "wait=0,warmup=0,active=1,repeat=0")
    assert not process_status().calls_idle
    assert [work() for _ in range(3)] == [False] * 3
    assert process_status().calls_idle and process_status().session is None
    (memory,) = state.ambient.exporters  # PROFILED_EXPORTERS=memory (conftest)
    instrument.shutdown()
    assert memory.reports == []
    (line,) = memory.notices
    assert "rank 1 (of 2) is not among the ranks that profile (PROFILED_RANKS=0)" in line


def test_the_trigger_signal_does_not_kill_a_rank_not_selected(run_python):
    """Every rank gets the same PROFILED_TRIGGER=SIGUSR2; an operator signals them all. A rank
    that does not profile must survive it (SIGUSR2's default action terminates)."""
    code = """
import os, signal
from instrument import profiled
@profiled("f")
def f():
    return 1
f()
os.kill(os.getpid(), signal.SIGUSR2)
f()
print("alive")
"""
    result = run_python(
        code,
        env={
            "RANK": "1",
            "WORLD_SIZE": "2",
            "PROFILED_RANKS": "0",
            "PROFILED_TRIGGER": "SIGUSR2",
            "PROFILED_EXPORTERS": "console",
        },
    )
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert result.stdout == "alive\n"
    assert "rank 1 (of 2) is not among the ranks that profile" in result.stderr


def test_a_selected_rank_profiles(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with capture(
        schedule=Schedule(wait=0, warmup=0, active=2), ranks="1,3", activities=["cpu"]
    ) as cap:
        seen = []
        for _ in range(2):
            seen.append(work())
            cap.step()
    assert seen == [True, True]
    (r,) = cap.reports
    assert (r.rank, r.world_size, r.ranges["dist.work"].calls) == (1, 4, 2)


# ---------------------------------------------------------------- rank and world size


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, (0, 1)),
        ({"RANK": "2", "WORLD_SIZE": "4"}, (2, 4)),
        ({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, (2, 4)),
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, (1, 2)),
        ({"RANK": "3"}, (3, 4)),
    ],
)
def test_rank_and_world_size_from_launcher_variables(env, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert launcher_ranks_from_env(env) == expected


@pytest.mark.parametrize(
    "env, expected, said",
    [
        ({"RANK": "one", "WORLD_SIZE": "4"}, (0, 4), "RANK='one' is invalid"),
        ({"RANK": "1", "WORLD_SIZE": "0"}, (1, 2), "WORLD_SIZE='0' is invalid"),
        ({"RANK": "5", "WORLD_SIZE": "2"}, (5, 6), "RANK=5 is not below WORLD_SIZE=2"),
        ({"LOCAL_RANK": "-2"}, (0, 1), "LOCAL_RANK='-2' is invalid"),
    ],
)
def test_bad_launcher_variables_warn_once(env, expected, said):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert launcher_ranks_from_env(env) == expected
        assert launcher_ranks_from_env(env) == expected
    messages = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(messages) == 1 and said in messages[0], messages
    with pytest.raises(ValueError, match="PROFILED_STRICT=1"):  # at the session's start
        Config.from_env({**env, "PROFILED_STRICT": "1"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert launcher_ranks_from_env({**env, "PROFILED_STRICT": "1"}) == expected


def test_strict_never_raises_from_a_window_end(monkeypatch):
    """PROFILED_STRICT=1 rejects a bad RANK when the session is built; if RANK changes later,
    window ends (inside decorated calls) read it tolerantly and never raise."""
    monkeypatch.setenv("PROFILED_STRICT", "1")

    @profiled("dist.step", step=True)  # its return ends the step, and so the window
    def step() -> bool:
        return work()

    with capture(
        schedule=Schedule(wait=0, warmup=0, active=1, repeat=2), activities=["cpu"]
    ) as cap:
        step()
        monkeypatch.setenv("RANK", "bad")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    assert [r.rank for r in cap.reports] == [0, 0]
    assert any("RANK='bad' is invalid" in str(w.message) for w in caught)


# ---------------------------------------------------------------- real jobs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(base, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in _proc.sdk_env().items() if k not in LAUNCHER_VARS}
    env.update(
        OMP_NUM_THREADS="1",
        PROFILED_ACTIVITIES="cpu",
        PROFILED_TRACE_DIR=str(base / "traces"),
        PROFILED_JSON_PATH=str(base / "reports.jsonl"),
    )
    if os.path.isdir("/sys/class/net/lo"):
        # gloo otherwise binds to the address the host name resolves to, which a fresh
        # machine's /etc/hosts may not have
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.update(extra)
    return env


def read_reports(path) -> dict[int, list[dict]]:
    by_rank: dict[int, list[dict]] = {}
    with open(path, encoding="utf-8") as f:
        for doc in window_records(f.read()):  # the metrics records aside
            by_rank.setdefault(doc["rank"], []).append(doc)
    for docs in by_rank.values():
        docs.sort(key=lambda d: d["window"])
    return by_rank


def load(path) -> tuple[dict, str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        text = f.read()
    return json.loads(text), text


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory):
    """``torchrun --nproc-per-node 2`` on gloo with sampling on; every report to a JSON lines
    file, each rank's newest trace file kept (``PROFILED_TRACE_KEEP=1``: one per rank, the
    layout Holistic Trace Analysis reads)."""
    base = tmp_path_factory.mktemp("torchrun")
    env = job_env(
        base,
        PROFILED_EXPORTERS="trace,json",
        PROFILED_TRACE_KEEP="1",
        PROFILED_SCHEDULE=SAMPLED_WINDOW.to_env(),
        PROFILED_EVERY=str(SAMPLING.every),
        PROFILED_SAMPLE_RATE=str(SAMPLING.sample_rate),
        PROFILED_SEED=str(SAMPLING.seed),
    )
    result = _proc.run(
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        JOB,
        str(STEPS),
        env=env,
        cwd=base,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return base


def test_both_ranks_profiled_the_same_steps(torchrun_job):
    by_rank = read_reports(torchrun_job / "reports.jsonl")
    assert sorted(by_rank) == [0, 1]
    starts = [n for n in range(STEPS) if SAMPLING.opens(n)]
    assert 2 <= len(starts) < STEPS // SAMPLING.every  # some windows open, some are skipped
    warmup, active = SAMPLED_WINDOW.warmup, SAMPLED_WINDOW.active
    expected = [list(range(n + warmup, n + warmup + active)) for n in starts]
    assert expected[-1][-1] < STEPS
    for rank, docs in by_rank.items():
        assert [d["steps"] for d in docs] == expected, rank
        assert {d["world_size"] for d in docs} == {2}
        assert all(d["ranges"]["work"]["calls"] == 2 for d in docs)
    assert {d["pid"] for d in by_rank[0]}.isdisjoint({d["pid"] for d in by_rank[1]})


def test_each_rank_has_its_trace_file_with_distributed_info(torchrun_job):
    names = sorted(os.listdir(torchrun_job / "traces"))
    assert len(names) == 2, names
    by_rank = read_reports(torchrun_job / "reports.jsonl")
    last_steps = by_rank[0][-1]["steps"]
    for rank, name in enumerate(names if "_rank0." in names[0] else names[::-1]):
        assert re.fullmatch(rf".+_\d+_rank{rank}\.\d+\.pt\.trace\.json\.gz", name)
        trace, text = load(torchrun_job / "traces" / name)
        info = trace["distributedInfo"]
        assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", rank, 2)
        assert HTA_RANK.findall(text)[:1] == [str(rank)]
        steps = sorted(
            int(e["name"].split("#")[1])
            for e in trace["traceEvents"]
            if e.get("name", "").startswith("ProfilerStep#")
        )
        assert steps == last_steps


def test_holistic_trace_analysis_loads_the_directory_and_finds_both_ranks(torchrun_job):
    from hta.trace_analysis import TraceAnalysis  # holistictraceanalysis, in the dev extra

    analysis = TraceAnalysis(
        trace_dir=str(torchrun_job / "traces"), include_last_profiler_step=True
    )
    assert analysis.t.get_ranks() == [0, 1]
    last_steps = read_reports(torchrun_job / "reports.jsonl")[0][-1]["steps"]
    for rank in (0, 1):
        df = analysis.t.get_trace(rank)
        names = set(analysis.t.symbol_table.sym_table[i] for i in df["name"].unique())
        assert {"work", "allreduce", "train_step"} <= names
        assert sorted(int(i) for i in df["iteration"].unique() if i >= 0) == last_steps
        assert analysis.t.meta_data[rank]["distributedInfo"]["rank"] == rank


def test_summarize_shows_ranks_side_by_side_and_the_slowest_rank(torchrun_job):
    traces = str(torchrun_job / "traces")
    run = ["-m", "instrument", "summarize", traces]
    env = job_env(torchrun_job)
    text = _proc.run(*run, env=env)
    assert text.returncode == 0, text.stderr
    assert "rank 0/2" in text.stdout and "rank 1/2" in text.stdout
    side = text.stdout.split("ranks side by side")[1].splitlines()
    header = next(line for line in side if line.startswith("range"))
    assert header.split()[1:5] == ["rank", "0", "rank", "1"]
    row = next(line for line in side if line.startswith("work "))
    assert row.split()[-4:-2] == ["rank", "1"]  # rank 1 waits 50 ms in each call
    row = next(line for line in side if line.startswith("allreduce "))
    # rank 0 spends longer there, waiting for rank 1: the one it waits for is the slow one
    assert row.split()[-4:-2] == ["rank", "1"]
    doc = json.loads(_proc.run(*run, "--json", env=env).stdout)
    assert doc["ranks"]["ranks"] == [0, 1]
    assert doc["ranks"]["ranges"]["work"]["slowest_rank"] == 1
    assert doc["ranks"]["ranges"]["allreduce"]["slowest_rank"] == 1
    assert doc["ranks"]["ranges"]["gloo:all_reduce"]["slowest_rank"] == 1
    assert doc["ranks"]["collectives"]["late_rank"] == 1
    assert doc["ranks"]["collectives"]["extra_time_in"]["range"] == "work"
    assert [r["rank"] for r in doc["reports"]] == [0, 1]
    assert doc["ranks"]["same_steps"] is True
    assert "recorded different steps" not in text.stdout


def test_summaries_name_the_late_rank_of_two_and_its_range(torchrun_job, capsys):
    """Rank 1 sleeps in ``work`` before its all_reduce; rank 0 waits for it there. Both
    summaries (the metrics records, the traces) name rank 1 and ``work``
    (tests/test_stragglers.py: the same with 4 ranks)."""
    from tests.test_stragglers import check_metrics, check_traces

    check_metrics(capsys, torchrun_job / "reports.jsonl", 2, 1)
    check_traces(capsys, torchrun_job / "traces", 1)


def test_summarize_flags_ranks_that_recorded_different_steps(torchrun_job, tmp_path):
    """The failure a side-by-side view exists to catch: rank 1's trace, renumbered as if that
    rank had profiled later steps, next to rank 0's."""
    out = tmp_path / "mixed"
    out.mkdir()
    steps = read_reports(torchrun_job / "reports.jsonl")[0][-1]["steps"]
    for name in os.listdir(torchrun_job / "traces"):
        trace, _ = load(torchrun_job / "traces" / name)
        if "_rank1." in name:
            for ev in trace["traceEvents"]:
                if ev.get("name", "").startswith("ProfilerStep#"):
                    ev["name"] = f"ProfilerStep#{int(ev['name'].split('#')[1]) + 10}"
        with gzip.open(out / name, "wt", encoding="utf-8") as f:
            json.dump(trace, f)
    run = ["-m", "instrument", "summarize", str(out)]
    result = _proc.run(*run, env=job_env(tmp_path))
    assert result.returncode == 0, result.stderr
    a, b = steps[0], steps[-1]
    side = result.stdout.split("ranks side by side")[1].splitlines()
    assert side[1:3] == [
        "note: the ranks recorded different steps; their times do not compare like with like",
        f"  steps: rank 0: {a}-{b}; rank 1: {a + 10}-{b + 10}",
    ]
    doc = json.loads(_proc.run(*run, "--json", env=job_env(tmp_path)).stdout)
    assert doc["ranks"]["same_steps"] is False
    assert doc["ranks"]["steps_per_rank"] == {"0": steps, "1": [s + 10 for s in steps]}


def test_ranks_from_torch_distributed_select_who_profiles(tmp_path):
    """No launcher variables (as with mp.spawn): the rank comes from the process group, and
    PROFILED_RANKS=1 leaves rank 0 without a profiler and with one line saying why. The job
    ends inside its second window: that partial window is exported at exit, after
    destroy_process_group(), and still carries rank 1 of 2."""
    env = job_env(
        tmp_path,
        PROFILED_EXPORTERS="console,trace,json",
        PROFILED_RANKS="1",
        PROFILED_SCHEDULE=JOB_SCHEDULE.to_env(),
    )
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [
        _proc.start(
            JOB, "9", "--init", init, "--rank", str(r), "--world-size", "2", env=env, cwd=tmp_path
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    err0, err1 = outs[0][1], outs[1][1]
    said = [line for line in err0.splitlines() if line.startswith("torch-profiled:")]
    assert said == [
        "torch-profiled: no table: rank 0 (of 2) is not among the ranks that "
        "profile (PROFILED_RANKS=1), so this process started no profiler."
    ]
    assert "torch-profiled | window 0 | steps 3-4 | cpu | rank 1/2" in err1
    reports = read_reports(tmp_path / "reports.jsonl")
    assert list(reports) == [1]
    assert [(d["steps"], d["partial"], d["world_size"]) for d in reports[1]] == [
        ([3, 4], False, 2),
        ([8], True, 2),
    ]
    names = os.listdir(tmp_path / "traces")
    assert len(names) == 2 and all("_rank1." in name for name in names)
    for name in names:
        info = load(tmp_path / "traces" / name)[0]["distributedInfo"]
        assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", 1, 2)
