"""``torch-profiled summarize`` of metrics records (issue 17 item 5): step health per rank.

The records are real: one program per rank runs in a subprocess with the launcher's ``RANK`` and
``WORLD_SIZE`` (no torch.distributed), the json exporter writing a file per rank; rank 2 sleeps
five times longer per step, so it is the straggler."""

from __future__ import annotations

import json

import pytest

from instrument import cli
from tests import _proc
from tests._records import metrics_records, window_records

STEPS = 30
# the default window's first and last recorded steps (a profiler started or stopped in them)
# are left out of the step histogram; the ranges count every call
COUNTED_STEPS = STEPS - 2
WORLD = 3
SLOW_RANK = 2

PROGRAM = r"""
import sys, time
from instrument import profiled

@profiled("data")
def data():
    time.sleep(0.001)

@profiled("train_step", step=True)
def train_step(pause):
    data()
    time.sleep(pause)

for _ in range(int(sys.argv[2])):
    train_step(float(sys.argv[1]))
print("done")
"""


@pytest.fixture(scope="module")
def ranks_dir(tmp_path_factory):
    """A directory of ``rank{r}.jsonl``, one real process per rank."""
    d = tmp_path_factory.mktemp("metrics")
    script = d / "prog.py"
    script.write_text(PROGRAM)
    out = d / "ranks"
    out.mkdir()
    for rank in range(WORLD):
        pause = "0.010" if rank == SLOW_RANK else "0.002"
        env = _proc.sdk_env(
            {
                "PROFILED_EXPORTERS": "json",
                "PROFILED_JSON_PATH": str(out / f"rank{rank}.jsonl"),
                "PROFILED_METRICS_INTERVAL_S": "0.2",
                "RANK": str(rank),
                "WORLD_SIZE": str(WORLD),
            }
        )
        done = _proc.run(str(script), pause, str(STEPS), env=env, cwd=d, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
    return out


def _main(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(rc: int, out: str, err: str, *phrases: str) -> None:
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith("torch-profiled: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for phrase in phrases:
        assert phrase in err, (phrase, err)


def _rank_rows(out: str) -> dict[str, list[str]]:
    """The table's rank rows: rank -> its columns."""
    rows = {}
    for line in out.splitlines():
        cols = line.split()
        if cols and cols[0].isdigit():
            rows[cols[0]] = cols[1:]
    return rows


def test_the_files_are_what_the_sdk_wrote(ranks_dir):
    for rank in range(WORLD):
        text = (ranks_dir / f"rank{rank}.jsonl").read_text()
        last = metrics_records(text)[-1]
        assert (last["rank"], last["world_size"]) == (rank, WORLD)
        assert last["steps"]["count"] == COUNTED_STEPS
        assert window_records(text), "window reports beside the metrics: a mixed file"


def test_a_directory_per_rank_names_the_straggler(ranks_dir, capsys):
    rc, out, err = _main(capsys, "summarize", str(ranks_dir))
    assert rc == 0, err
    rows = _rank_rows(out)
    assert sorted(rows) == ["0", "1", "2"]
    for cols in rows.values():
        assert cols[0] == str(COUNTED_STEPS)  # the step count
        assert len(cols) >= 3 + 4  # step p50, p99; train_step and data p50, p99
    assert rows[str(SLOW_RANK)][-1] == "*" and rows["0"][-1] != "*"
    (line,) = [ln for ln in out.splitlines() if ln.startswith("stragglers")]
    assert "20% over the ranks' median" in line
    assert f"rank {SLOW_RANK} (" in line and "rank 0" not in line and "rank 1" not in line
    assert "train_step" in out and "data" in out


def test_json_has_the_ranks_the_stragglers_and_the_margin(ranks_dir, capsys):
    rc, out, err = _main(capsys, "summarize", str(ranks_dir), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["margin"] == 0.2 and doc["stragglers"] == [SLOW_RANK]
    assert doc["step_source"] == "steps" and doc["ranges"][:2] == ["train_step", "data"]
    assert sorted(doc["ranks"]) == ["0", "1", "2"]
    for key, r in doc["ranks"].items():
        assert r["rank"] == int(key) and r["world_size"] == WORLD and r["processes"] == 1
        assert r["step"]["count"] == COUNTED_STEPS
        assert r["ranges"]["train_step"]["count"] == STEPS
        assert r["ranges"]["data"]["count"] == STEPS
        assert r["step"]["p50_s"] <= r["step"]["p99_s"]
        assert r["straggler"] is (int(key) == SLOW_RANK)
    slow = doc["ranks"][str(SLOW_RANK)]
    assert slow["step_p50_vs_median"] > 1.2
    assert doc["median_step_p50_s"] < slow["step"]["p50_s"]


def test_one_file_of_all_ranks_and_the_margin(ranks_dir, tmp_path, capsys):
    every = tmp_path / "all.log"  # not .jsonl: found by its first line
    every.write_text("".join((ranks_dir / f"rank{r}.jsonl").read_text() for r in range(WORLD)))
    rc, out, err = _main(capsys, "summarize", str(every), "--json")
    assert rc == 0, err
    assert json.loads(out)["stragglers"] == [SLOW_RANK]
    rc, out, err = _main(capsys, "summarize", str(every), "--straggler-margin", "100")
    assert rc == 0, err
    assert "stragglers: none (step p50 more than 10000% over" in out
    rc, out, _ = _main(capsys, "summarize", str(every), "--straggler-margin", "0", "--json")
    assert rc == 0 and SLOW_RANK in json.loads(out)["stragglers"]


@pytest.mark.parametrize("bad", ["abc", "-0.1", "nan", "inf", ""])
def test_a_bad_margin_is_one_line_and_exit_2(ranks_dir, capsys, bad):
    rc, out, err = _main(capsys, "summarize", str(ranks_dir), "--straggler-margin", bad)
    _one_error_line(rc, out, err, "--straggler-margin", "expected a number >= 0")


def test_window_reports_only_are_refused(ranks_dir, tmp_path, capsys):
    text = (ranks_dir / "rank0.jsonl").read_text()
    windows = [ln for ln in text.splitlines(keepends=True) if "window-report" in ln]
    assert windows
    only = tmp_path / "windows.jsonl"
    only.write_text("".join(windows))
    rc, out, err = _main(capsys, "summarize", str(only))
    _one_error_line(
        rc,
        out,
        err,
        f"{only}: no metrics records: found {len(windows)} window report(s)",
        "expected JSON lines with torch-profiled/metrics/1 records",
    )


def _rewritten(src, dst, **changes) -> None:
    """``src``'s metrics records with ``changes`` (a key -> a function of the record)."""
    lines = []
    for rec in metrics_records(src.read_text()):
        for key, change in changes.items():
            rec[key] = change(rec)
        lines.append(json.dumps(rec) + "\n")
    dst.write_text("".join(lines))


def test_a_restarted_rank_keeps_its_newest_process(ranks_dir, tmp_path, capsys):
    d = tmp_path / "restart"
    d.mkdir()
    for r in range(WORLD):
        (d / f"rank{r}.jsonl").write_text((ranks_dir / f"rank{r}.jsonl").read_text())
    # an older process of rank 1 (before a restart): another pid, earlier, other counts
    _rewritten(
        ranks_dir / "rank1.jsonl",
        d / "rank1-old.jsonl",
        pid=lambda rec: rec["pid"] + 100_000,
        time_ns=lambda rec: rec["time_ns"] - 10**12,
        steps=lambda rec: dict(rec["steps"], count=7),
    )
    rc, out, err = _main(capsys, "summarize", str(d), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    one = doc["ranks"]["1"]
    assert one["processes"] == 2 and one["step"]["count"] == COUNTED_STEPS
    (note,) = [n for n in doc["notes"] if "several processes" in n]
    assert "rank 1: 2" in note
    rc, out, _ = _main(capsys, "summarize", str(d))
    assert sum("several processes recorded one rank" in ln for ln in out.splitlines()) == 1


def test_without_steps_the_largest_range_stands_in(ranks_dir, tmp_path, capsys):
    d = tmp_path / "nosteps"
    d.mkdir()
    for r in range(WORLD):
        _rewritten(ranks_dir / f"rank{r}.jsonl", d / f"rank{r}.jsonl", steps=lambda rec: None)
    rc, out, err = _main(capsys, "summarize", str(d), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["step_source"] == {"range": "train_step"}
    assert doc["stragglers"] == [SLOW_RANK]
    assert any("stands in for the step" in n for n in doc["notes"])
    rc, out, _ = _main(capsys, "summarize", str(d))
    assert "range 'train_step' as the step" in out and f"rank {SLOW_RANK} (" in out


def test_range_filter_and_rows(ranks_dir, capsys):
    rc, out, _ = _main(capsys, "summarize", str(ranks_dir), "--json", "--range", "data")
    assert rc == 0 and json.loads(out)["ranges"] == ["data"]
    rc, out, _ = _main(capsys, "summarize", str(ranks_dir), "--json", "--rows", "1")
    assert rc == 0 and json.loads(out)["ranges"] == ["train_step"]
    rc, out, err = _main(capsys, "summarize", str(ranks_dir), "--range", "dta")
    _one_error_line(rc, out, err, "did you mean 'data'", f"in the {WORLD} process records read")


def test_traces_and_records_do_not_mix(ranks_dir, tmp_path, capsys):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    rc, out, err = _main(capsys, "summarize", str(trace), str(ranks_dir))
    _one_error_line(rc, out, err, "expected one kind per command")
    rc, out, err = _main(capsys, "summarize", str(trace), "--straggler-margin", "0.5")
    _one_error_line(rc, out, err, "--straggler-margin: applies to metrics records")


def test_in_a_real_process(ranks_dir):
    out = _proc.run("-m", "instrument", "summarize", str(ranks_dir))
    assert out.returncode == 0, out.stderr
    assert f"rank {SLOW_RANK} (" in out.stdout.splitlines()[-1]
