"""``torch-profiled diff``, per call, and its regression gate (``--fail-over``), on real traces.

The traces come from a real program (``tests/_gate_program.py``) run with the SDK in two
processes, one after the other (at once, on two cores, a window's calls wait for the other's):
one window against three, the same program twice, a slower variant, a spread of per-window
times, other matrix sizes, no shapes recorded. Its range's time is a sleep plus a small matmul,
so the figures compared are known within a few percent, while the code under test reads them
as it reads any trace. A call the machine delays now and then is what the spread rule is for;
the tests leave it margins where one window stands alone.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest

from instrument import cli
from tests import _proc

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "_gate_program.py")
JUNIT_XSDS = tuple(  # Jenkins' schema and a stricter one (tests/data/junit/README.md)
    os.path.join(HERE, "data", "junit", name) for name in ("junit-10.xsd", "strict.xsd")
)

# name -> (windows, sleep ms per window, matrix size, record shapes); two processes' worth
RUNS_A = {
    "one": (1, "2", 64, 1),
    "three": (3, "2", 64, 1),
    "slow": (3, "20", 64, 1),
    "spread_before": (3, "2/20/38", 64, 1),
    "big": (1, "2", 128, 1),
}
RUNS_B = {
    "again": (3, "2", 64, 1),
    "spread_after": (3, "8/26/44", 64, 1),
    "no_shapes": (1, "2", 64, 0),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Trace directories of real runs, by name (see ``RUNS_A``/``RUNS_B``)."""
    root = tmp_path_factory.mktemp("gate")
    dirs = {}
    for group in (RUNS_A, RUNS_B):
        specs = []
        for name, (windows, sleep_ms, size, shapes) in group.items():
            dirs[name] = str(root / name)
            specs.append(f"{dirs[name]}:{windows}:{sleep_ms}:{size}:{shapes}")
        proc = _proc.run(PROGRAM, *specs, timeout=240)
        assert proc.returncode == 0, proc.stderr
    for name, (windows, *_rest) in {**RUNS_A, **RUNS_B}.items():
        assert len(os.listdir(dirs[name])) == windows, name
    return dirs


def _main(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _gate(capsys, before: str, after: str, *more: str) -> tuple[int, dict]:
    rc, out, err = _main(capsys, "diff", before, after, "--json", *more)
    assert rc in (0, 1), err
    doc = json.loads(out)
    assert doc["exit_status"] == rc
    return rc, doc


def _verdict(doc: dict, name: str = "train_step") -> dict:
    (v,) = [v for v in doc["verdicts"] if v["name"] == name]
    return v


def _one_line_error(rc: int, out: str, err: str) -> None:
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith("torch-profiled: error: ") and err.count("\n") == 1, err
    assert "; expected " in err and "Traceback" not in err, err


# ---------------------------------------------------------------- per call, not summed


def test_one_window_against_three_compares_per_call(runs, capsys):
    """The bug: a directory of one window against one of three read as 3x slower (summed)."""
    rc, out, err = _main(capsys, "diff", runs["one"], runs["three"])
    assert rc == 0, err
    assert "(1 trace, 1 window)" in out and "(3 traces, 3 windows)" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("train_step ")]
    cells = line.split()
    assert cells[-1] == "5"  # calls per window, the same on both sides
    # per call about the same (a margin for a call the machine delayed), not ~3x
    assert 0.5 < float(cells[-2].rstrip("x")) < 1.6
    assert all(len(ln) <= 100 for ln in out.splitlines())
    doc = json.loads(_main(capsys, "diff", "--json", runs["one"], runs["three"])[1])
    (row,) = [r for r in doc["ranges"] if r["name"] == "train_step"]
    assert (row["calls_before"], row["calls_after"]) == (5, 15)
    assert row["calls_per_window_before"] == row["calls_per_window_after"] == 5
    assert 0.5 < row["ratio"] < 1.6
    # the per-call figure is all time over all calls: 15 calls of ~2 ms, never ~6 ms
    assert 1800 < row["after_us"] < 4000
    total = doc["totals"]["self_cpu_time_total_us"]  # per window, not the sum of three
    assert 0.5 < total["ratio"] < 1.6


def test_different_window_counts_pass_the_gate_and_a_regression_still_fails(runs, capsys):
    rc, doc = _gate(capsys, runs["one"], runs["three"], "--fail-over", "10%")
    assert rc == 0 and _verdict(doc)["status"] == "pass"
    rc, doc = _gate(capsys, runs["one"], runs["slow"], "--fail-over", "10%")
    v = _verdict(doc)
    assert rc == 1 and v["status"] == "regression"
    assert v["before"]["calls"] == 5 and v["after"]["calls"] == 15
    # per step too: one recorded step a window (ProfilerStep#N), five calls in it
    assert v["before"]["calls_per_step"] == v["after"]["calls_per_step"] == 5
    assert v["after"]["per_step"] == pytest.approx(5 * v["after"]["value"])


# ---------------------------------------------------------------- the gate


def test_regression_fails_with_exit_1(runs, capsys):
    rc, out, err = _main(capsys, "diff", runs["three"], runs["slow"], "--fail-over", "10%")
    assert rc == 1 and err == ""
    assert "REGRESSION      train_step" in out
    assert out.rstrip().splitlines()[-1].startswith("FAILED: 1 regression(s)")
    assert all(len(ln) <= 100 for ln in out.splitlines())
    rc, doc = _gate(capsys, runs["three"], runs["slow"], "--fail-over", "10%")
    v = _verdict(doc)
    assert rc == 1 and v["status"] == "regression" and not doc["passed"]
    assert 5 < v["change"] < 12  # a 2 ms sleep became 20 ms: about +900% per call
    assert v["worse_by"] > max(v["noise"], 0.10)
    assert len(v["before"]["windows"]) == len(v["after"]["windows"]) == 3
    # a threshold above the change lets it through; faster is never a regression
    rc, doc = _gate(capsys, runs["three"], runs["slow"], "--fail-over", "2000%")
    assert rc == 0 and _verdict(doc)["status"] == "pass"
    rc, doc = _gate(capsys, runs["slow"], runs["three"], "--fail-over", "10")
    assert rc == 0 and _verdict(doc)["change"] < -0.3


def test_same_program_twice_is_noise_only(runs, capsys):
    rc, out, err = _main(capsys, "diff", runs["three"], runs["again"], "--fail-over", "10%")
    assert rc == 0, out + err
    assert "PASS            train_step" in out and out.rstrip().endswith("0 skipped")
    rc, doc = _gate(capsys, runs["three"], runs["again"], "--fail-over", "10%")
    v = _verdict(doc)
    assert rc == 0 and doc["passed"] and v["status"] == "pass"
    assert abs(v["change"]) < 0.10 or abs(v["change"]) < v["noise"]


def test_a_change_within_the_windows_spread_is_noise(runs, capsys, tmp_path):
    """Windows of 2/20/38 ms against 8/26/44 ms: +30% per call, past a 10% threshold, but the
    sides spread over ~140% each: noise. One window of each (2 ms against 8 ms, +300%): only
    the threshold applies, and it fails."""
    rc, doc = _gate(capsys, runs["spread_before"], runs["spread_after"], "--fail-over", "10%")
    v = _verdict(doc)
    assert rc == 0 and v["status"] == "pass", v
    assert v["worse_by"] > 0.10 and v["noise"] > v["worse_by"]
    assert "spread" in v["reason"] and "noise" in v["reason"]
    assert v["before"]["spread"] > 1.0 and v["after"]["spread"] > 1.0
    first = {}
    for side in ("spread_before", "spread_after"):
        d = tmp_path / side
        d.mkdir()
        name = sorted(os.listdir(runs[side]))[0]  # the first window: 2 ms and 8 ms
        shutil.copy(os.path.join(runs[side], name), d / name)
        first[side] = str(d)
    rc, doc = _gate(capsys, first["spread_before"], first["spread_after"], "--fail-over", "10%")
    v = _verdict(doc)
    assert rc == 1 and v["status"] == "regression" and v["noise"] == 0
    assert 1.0 < v["change"] < 4.0


def test_mismatched_shapes_are_not_comparable(runs, capsys):
    rc, out, err = _main(capsys, "diff", runs["one"], runs["big"], "--fail-over", "10%")
    assert rc == 1 and err == ""
    assert "NOT COMPARABLE  train_step" in out
    rc, doc = _gate(capsys, runs["one"], runs["big"], "--fail-over", "10%")
    v = _verdict(doc)
    assert rc == 1 and v["status"] == "not comparable"
    assert "input shapes differ" in v["reason"]
    assert "[[64, 64], [64, 64]]" in v["reason"] and "[[128, 128], [128, 128]]" in v["reason"]
    rc, doc = _gate(capsys, runs["one"], runs["big"], "--fail-over", "10%", "--allow-mismatch")
    v = _verdict(doc)
    assert rc == 0 and v["status"] == "skipped" and v["mismatch"]
    assert doc["counts"]["skipped"] == 1


def test_shapes_not_recorded_is_said_and_not_a_mismatch(runs, capsys):
    rc, out, err = _main(capsys, "diff", runs["one"], runs["no_shapes"], "--fail-over", "10%")
    assert "note: input shapes not recorded after (record_shapes)" in out
    # one window each: the times decide (a delayed call may fail it), the shapes never do
    rc, doc = _gate(capsys, runs["one"], runs["no_shapes"], "--fail-over", "10%")
    v = _verdict(doc)
    assert v["status"] in ("pass", "regression") and "mismatch" not in v
    assert doc["before"]["shapes_recorded"] and not doc["after"]["shapes_recorded"]
    assert doc["problems"] == []


def _edited(runs, tmp_path, name: str, edit) -> str:
    """A copy of the run ``name`` whose every trace went through ``edit(trace)``."""
    d = tmp_path / f"{name}_edited"
    d.mkdir()
    for f in os.listdir(runs[name]):
        with open(os.path.join(runs[name], f)) as src:
            trace = json.load(src)
        edit(trace)
        with open(d / f, "w") as dst:
            json.dump(trace, dst)
    return str(d)


def test_world_size_and_device_mismatch(runs, capsys, tmp_path):
    def two_ranks(trace):
        trace["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 2}

    def on_a_gpu(trace):  # the same events, plus a kernel: the trace names its device
        trace["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
        x = copy.deepcopy(next(e for e in trace["traceEvents"] if e.get("ph") == "X"))
        trace["traceEvents"].append(dict(x, cat="kernel", name="gemm", tid=7, args={}))

    for edit, words in ((two_ranks, "world size differs: 1 before, 2 after"), (on_a_gpu, "H100")):
        after = _edited(runs, tmp_path, "again", edit) if edit is two_ranks else None
        after = after or _edited(runs, tmp_path, "three", edit)
        rc, doc = _gate(capsys, runs["three"], after, "--fail-over", "10%")
        v = _verdict(doc)
        assert rc == 1 and v["status"] == "not comparable" and words in v["reason"], v
        rc, doc = _gate(capsys, runs["three"], after, "--fail-over", "10%", "--allow-mismatch")
        assert rc == 0 and _verdict(doc)["status"] == "skipped"


def test_metric_flops_judges_achieved_flops_a_drop_regresses(runs, capsys):
    rc, doc = _gate(capsys, runs["three"], runs["slow"], "--fail-over", "10%", "--metric", "flops")
    v = _verdict(doc)
    assert rc == 1 and v["status"] == "regression" and v["basis"] == "cpu"
    assert v["before"]["value"] > v["after"]["value"] > 0  # FLOP/s fell: same FLOPs, more time
    assert v["change"] < -0.3 and v["worse_by"] == pytest.approx(-v["change"])
    rc, doc = _gate(capsys, runs["slow"], runs["three"], "--fail-over", "10%", "--metric", "flops")
    assert rc == 0 and _verdict(doc)["change"] > 0.3  # faster: more FLOP/s
    rc, out, err = _main(
        capsys,
        "diff",
        runs["no_shapes"],
        runs["no_shapes"],
        "--fail-over",
        "10%",
        "--metric",
        "flops",
    )
    _one_line_error(rc, out, err)
    assert "no FLOPs on either side" in err and "record_shapes" in err


def test_range_picks_what_is_gated(runs, capsys, tmp_path):
    def with_eval(trace):  # one more range, after the window's events
        steps = [e for e in trace["traceEvents"] if e.get("name") == "train_step"]
        trace["traceEvents"] += [dict(e, name="eval_step", ts=e["ts"] + 1e6) for e in steps]

    def renamed(trace):
        for ev in trace["traceEvents"]:
            if ev.get("name") == "train_step":
                ev["name"] = "eval_step"

    more = _edited(runs, tmp_path, "slow", with_eval)
    rc, doc = _gate(capsys, runs["three"], more, "--fail-over", "10%", "--range", "train_step")
    assert rc == 1 and [v["name"] for v in doc["verdicts"]] == ["train_step"]
    # on one side only: skipped when not asked for, not comparable when named
    rc, doc = _gate(capsys, runs["three"], more, "--fail-over", "10%")
    assert rc == 1 and _verdict(doc, "eval_step")["status"] == "skipped"
    assert "only after" in _verdict(doc, "eval_step")["reason"]
    rc, doc = _gate(capsys, runs["three"], more, "--fail-over", "10%", "--range", "eval_step")
    assert rc == 1 and _verdict(doc, "eval_step")["status"] == "not comparable"
    rc, out, err = _main(
        capsys, "diff", runs["three"], more, "--fail-over", "10%", "--range", "trian_step"
    )
    _one_line_error(rc, out, err)
    assert "did you mean 'train_step'?" in err and "'eval_step', 'train_step'" in err
    # no range on both sides: nothing to gate is bad input, not a pass
    other = _edited(runs, tmp_path, "again", renamed)
    rc, out, err = _main(capsys, "diff", runs["three"], other, "--fail-over", "10%")
    _one_line_error(rc, out, err)
    assert "no range is on both sides" in err


# ---------------------------------------------------------------- on a GPU (device machine)

# name -> spec after OUT: windows, sleep ms, size, shapes, device, matmuls per call
CUDA_RUNS = (
    {"base": "3:2:2048:1:cuda:1", "heavier": "3:2:2048:1:cuda:4"},
    {"again": "3:2:2048:1:cuda:1"},
)


@pytest.fixture(scope="module")
def cuda_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate_cuda")
    dirs = {}
    for group in CUDA_RUNS:
        specs = []
        for name, spec in group.items():
            dirs[name] = str(root / name)
            specs.append(f"{dirs[name]}:{spec}")
        proc = _proc.run(PROGRAM, *specs, timeout=300)
        assert proc.returncode == 0, proc.stderr
    return dirs


H100 = os.path.join(HERE, "data", "gate_h100")  # recorded on an H100 (see its README.md)


def test_metric_device_on_h100_traces(capsys):
    _device_gate(capsys, *(os.path.join(H100, n) for n in ("base", "heavier", "again")))


@pytest.mark.cuda
def test_metric_device_on_a_gpu(cuda_runs, capsys):
    _device_gate(capsys, cuda_runs["base"], cuda_runs["heavier"], cuda_runs["again"])


def _device_gate(capsys, base: str, heavier: str, again: str) -> None:
    """Four matmuls a call instead of one: the device time per call regresses, the achieved
    FLOP/s does not (four times the FLOPs in four times the time), the same run twice passes."""
    rc, doc = _gate(capsys, base, heavier, "--fail-over", "10%", "--metric", "device")
    v = _verdict(doc)
    assert rc == 1 and v["status"] == "regression", v
    assert 2.0 < v["change"] < 5.0  # about +300% device time per call
    assert doc["before"]["devices"] == doc["after"]["devices"] != ["cpu"]
    rc, doc = _gate(capsys, base, again, "--fail-over", "10%", "--metric", "device")
    assert rc == 0 and _verdict(doc)["status"] == "pass", _verdict(doc)
    rc, doc = _gate(capsys, base, heavier, "--fail-over", "10%", "--metric", "flops")
    v = _verdict(doc)
    assert v["basis"] == "device" and v["before"]["value"] > 1e9
    assert rc == 0 and v["status"] == "pass" and abs(v["change"]) < 0.3, v
    rc, out, err = _main(capsys, "diff", base, heavier)
    assert rc == 0 and "range (device per call)" in out and "device kernel (per launch)" in out


# ---------------------------------------------------------------- JUnit


def test_junit_file_validates_against_the_junit_schema(runs, capsys, tmp_path):
    from lxml import etree  # the dev extra's XML Schema validator

    schemas = [etree.XMLSchema(etree.parse(xsd)) for xsd in JUNIT_XSDS]
    cases = {
        "regression": (runs["three"], runs["slow"], ()),
        "pass": (runs["three"], runs["again"], ()),
        "error": (runs["one"], runs["big"], ()),
        "skipped": (runs["one"], runs["big"], ("--allow-mismatch",)),
    }
    for case, (before, after, more) in cases.items():
        path = tmp_path / f"{case}.xml"
        rc, out, err = _main(
            capsys, "diff", before, after, "--fail-over", "10%", "--junit", str(path), *more
        )
        assert rc == (1 if case in ("regression", "error") else 0), err
        doc = etree.parse(str(path))
        for xsd, schema in zip(JUNIT_XSDS, schemas):
            assert schema.validate(doc), (case, xsd, schema.error_log)
        (suite,) = doc.getroot().findall("testsuite")
        assert suite.get("name") == "torch-profiled diff"
        (case_el,) = suite.findall("testcase")
        assert case_el.get("name") == "train_step"
        assert case_el.get("classname") == "torch-profiled.diff.cpu"
        children = [c.tag for c in case_el]
        assert children == ([] if case == "pass" else [{"regression": "failure"}.get(case, case)])
        counts = {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}
        assert counts == {
            "tests": 1,
            "failures": int(case == "regression"),
            "errors": int(case == "error"),
            "skipped": int(case == "skipped"),
        }
        if children:
            assert case_el[0].get("message")
        assert suite.find("system-out").text == out  # the same text as on the terminal
    assert sorted(os.listdir(tmp_path)) == sorted(f"{c}.xml" for c in cases)  # no temp files
    # the schemas are no rubber stamps: a testcase with no name; a count that is not a number
    nameless = etree.fromstring(
        b'<testsuite name="x" tests="1" failures="0" errors="0"><testcase/></testsuite>'
    )
    assert not any(schema.validate(nameless) for schema in schemas)
    wordy = etree.fromstring(b'<testsuite name="x" tests="one" failures="0" errors="0"/>')
    assert not schemas[1].validate(wordy)


# ---------------------------------------------------------------- bad input


def test_bad_input_is_one_line_and_exit_2(runs, capsys, tmp_path):
    not_a_trace = tmp_path / "notes.json"
    not_a_trace.write_text('{"hello": 1}')
    one, three = runs["one"], runs["three"]
    cases = [
        (["diff", str(tmp_path / "missing"), three, "--fail-over", "10%"], "no such file"),
        (["diff", one, str(not_a_trace), "--fail-over", "10%"], 'without "traceEvents"'),
        (["diff", one, three, "--fail-over", "ten%"], "'ten%' is not a percentage"),
        (["diff", one, three, "--fail-over", "-5%"], "'-5%' is negative"),
        (["diff", one, three, "--fail-over=-5%"], "'-5%' is negative"),
        (["diff", one, three, "--fail-over", "10%", "--metric", "device"], "no device time"),
        (["diff", one, three, "--junit", str(tmp_path / "j.xml")], "--fail-over PCT"),
        (["diff", one, three, "--fail-over", "10%", "--range", "nope"], "'nope'"),
    ]
    for argv, words in cases:
        rc, out, err = _main(capsys, *argv)
        _one_line_error(rc, out, err)
        assert words in err, (argv, err)
    assert not (tmp_path / "j.xml").exists()
    bad_junit = str(tmp_path / "no" / "such" / "dir" / "j.xml")
    rc, out, err = _main(capsys, "diff", one, three, "--fail-over", "10%", "--junit", bad_junit)
    _one_line_error(rc, out, err)
    assert "does not exist" in err and "expected --junit to name a file" in err
    # a real process, as CI runs it
    proc = _proc.run("-m", "instrument", "diff", one, three, "--fail-over", "ten%")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    proc = _proc.run("-m", "instrument", "diff", three, runs["slow"], "--fail-over", "10%")
    assert proc.returncode == 1 and "REGRESSION" in proc.stdout and proc.stderr == ""


def test_help_documents_the_gate(capsys):
    rc, out, _ = _main(capsys, "diff", "--help")
    assert rc == 0
    text = " ".join(out.split())
    for words in (
        "--fail-over PCT",
        "--metric {cpu,device,flops}",
        "--junit PATH",
        "--allow-mismatch",
        "(max - min) / median of its per-window per-call values",
        "Exit status: 0 no regression, 1 a regression or a range not comparable, 2 bad input",
    ):
        assert words in text, words


# ---------------------------------------------------------------- summarize --range (item 5)


def test_summarize_missing_range_lists_the_ranges_of_sdk_traces(runs, capsys):
    rc, out, err = _main(capsys, "summarize", "--range", "train", runs["three"])
    _one_line_error(rc, out, err)
    assert "hold no ranges" not in err
    assert "no such range in the 3 traces read (did you mean 'train_step'?)" in err
    assert "ranges there: 'train_step';" in err


OWN_PROFILER = """
import sys, torch
from instrument import profiled

@profiled("my_block")
def work(x):
    return x @ x

x = torch.randn(32, 32)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
    for _ in range(3):
        work(x)
p.export_chrome_trace(sys.argv[1])
"""


def test_summarize_missing_range_lists_ranges_recorded_as_operators(tmp_path, capsys):
    """An @profiled range inside the program's own profiler is recorded as an operator: the
    message said the trace held no ranges, with ``my_block`` right there."""
    path = str(tmp_path / "own.json")
    proc = _proc.run("-c", OWN_PROFILER, path)
    assert proc.returncode == 0, proc.stderr
    rc, out, err = _main(capsys, "summarize", "--range", "my_blok", path)
    _one_line_error(rc, out, err)
    assert "hold no ranges" not in err
    assert "(did you mean 'my_block'?)" in err
    assert "operators named like @profiled ranges there" in err and ": 'my_block';" in err
    assert "aten::" not in err
    rc, out, err = _main(capsys, "summarize", "--json", "--range", "my_block", path)
    assert rc == 0 and json.loads(out)["ranges"]["my_block"]["calls"] == 3
