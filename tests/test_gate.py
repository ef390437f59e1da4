"""``torch-profiled diff``, per call, and its regression gate (``--fail-over``), on real traces.

The traces come from a real program (``tests/_gate_program.py``) run with the SDK in two
processes, one after the other (at once, on two cores, a window's calls wait for the other's),
beside a busy-loop neighbour started here (a shared CI runner: issue 30 item 2). The first
process records the same program twice with the README's eight windows a side (A/A) and 1.2x
per call, its runs taking turns window by window as the README's recipe records a baseline
and a candidate; the second 2x per call. Other matrix sizes and no shapes recorded: a window
each; a window and three are the first traces of the eight. A range's time is a 20 ms sleep
plus a small matmul, so the figures compared are known but for what the box's load adds (late
wake-ups: only ever more time), while the code under test reads them as it reads any trace.
The statistic itself, on hand-made windows: ``tests/test_gate_floor.py``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys

import pytest

from instrument import cli
from instrument.cli import gate
from tests import _early, _proc

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "_gate_program.py")
JUNIT_XSDS = tuple(  # Jenkins' schema and a stricter one (tests/data/junit/README.md)
    os.path.join(HERE, "data", "junit", name) for name in ("junit-10.xsd", "strict.xsd")
)
WINDOWS = gate.RECOMMENDED_WINDOWS  # the README's CI recipe: 8 windows a side
RECIPE = ("--fail-over", "10%")  # and its threshold

# name -> (windows, sleep ms per call, matrix size, record shapes); one process per group, the
# runs of a group taking turns window by window (as the README's recipe records a baseline and
# a candidate: a burst of load then slows windows of both, not every window of one)
RUNS_A = {
    "base": (WINDOWS, "20", 64, 1),
    "again": (WINDOWS, "20", 64, 1),  # the same program again: A/A
    "slow12": (WINDOWS, "24", 64, 1),  # 1.2x per call
    "big": (1, "20", 128, 1),
}
RUNS_B = {
    "slow": (WINDOWS, "40", 64, 1),  # 2x per call, in a process of its own
    "no_shapes": (1, "20", 64, 0),
}
FIRST = {"one": ("base", 1), "three": ("base", 3), "one_slow12": ("slow12", 1)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Trace directories of real runs beside a busy neighbour, by name (``RUNS_A``/``RUNS_B``,
    and ``FIRST``: the first traces of a run)."""
    root = tmp_path_factory.mktemp("gate")
    dirs = {}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for group in (RUNS_A, RUNS_B):
            specs = []
            for name, (windows, sleep_ms, size, shapes) in group.items():
                dirs[name] = str(root / name)
                specs.append(f"{dirs[name]}:{windows}:{sleep_ms}:{size}:{shapes}")
            proc = _proc.run(PROGRAM, *specs, timeout=240)
            assert proc.returncode == 0, proc.stderr
    finally:
        busy.kill()
        busy.wait()
    for name, (windows, *_rest) in {**RUNS_A, **RUNS_B}.items():
        assert len(os.listdir(dirs[name])) == windows, name
    for name, (run, n) in FIRST.items():
        dirs[name] = str(root / name)
        os.mkdir(dirs[name])
        for f in sorted(os.listdir(dirs[run]))[:n]:
            shutil.copy(os.path.join(dirs[run], f), dirs[name])
    return dirs


def _main(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _gate(capsys, before: str, after: str, *more: str) -> tuple[int, dict]:
    rc, out, err = _main(capsys, "diff", before, after, "--json", *more)
    assert rc in (0, 1, 3), err
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
    # the per-call figure is all time over all calls: 15 calls of ~20 ms, never ~60 ms
    assert 18000 < row["after_us"] < 40000
    total = doc["totals"]["self_cpu_time_total_us"]  # per window, not the sum of three
    assert 0.5 < total["ratio"] < 1.6


def test_a_a_passes_with_the_recommended_windows_beside_a_busy_neighbour(runs, capsys):
    """The issue: the same script twice on the 2-core box under load failed 4 of 7 ranges
    with five windows a side (pooled means against a max-min spread). The README's recipe
    (eight windows a side, taking turns, 10%) passes it: beside the neighbour and the box's
    other work, half a run's windows or more were 5-25% slow, each side kept two at the floor
    (measured: the upper bound within +2%)."""
    rc, out, err = _main(capsys, "diff", runs["base"], runs["again"], *RECIPE)
    assert rc == 0, out + err
    assert "PASS            train_step" in out and out.rstrip().endswith("0 skipped")
    assert "(8 windows, cpu)" in out
    rc, doc = _gate(capsys, runs["base"], runs["again"], *RECIPE)
    v = _verdict(doc)
    assert rc == 0 and doc["passed"] and v["status"] == "pass" and doc["outcome"] == "pass"
    assert v["low"] <= v["change"] <= v["high"] <= 0.10
    assert len(v["before"]["windows"]) == len(v["after"]["windows"]) == WINDOWS


def test_a_2x_regression_fails_with_exit_1(runs, capsys):
    rc, out, err = _main(capsys, "diff", runs["base"], runs["slow"], "--fail-over", "10%")
    assert rc == 1 and err == ""
    assert "REGRESSION      train_step" in out
    assert out.rstrip().splitlines()[-1].startswith("FAILED: 1 regression(s)")
    assert all(len(ln) <= 100 for ln in out.splitlines())
    rc, doc = _gate(capsys, runs["base"], runs["slow"], "--fail-over", "10%")
    v = _verdict(doc)
    assert rc == 1 and v["status"] == "regression" and not doc["passed"]
    # 20 ms became 40 ms: about +100% (a margin for the windows the neighbour slowed)
    assert 0.5 < v["change"] < 1.6 and v["low"] > 0.5
    # per step too: one recorded step a window (ProfilerStep#N), five calls in it
    assert v["before"]["calls_per_step"] == v["after"]["calls_per_step"] == 5
    assert v["after"]["per_step"] == pytest.approx(5 * v["after"]["value"])
    # a threshold above the change lets it through; faster is never a regression
    rc, doc = _gate(capsys, runs["base"], runs["slow"], "--fail-over", "300%")
    assert rc == 0 and _verdict(doc)["status"] == "pass"
    rc, doc = _gate(capsys, runs["slow"], runs["base"], "--fail-over", "10")
    assert rc == 0 and _verdict(doc)["change"] < -0.3


def test_a_1_2x_regression_is_caught_or_inconclusive_never_passed(runs, capsys):
    for threshold in ("10%", "15%"):
        rc, doc = _gate(capsys, runs["base"], runs["slow12"], "--fail-over", threshold)
        v = _verdict(doc)
        windows = (sorted(v["before"]["windows"]), sorted(v["after"]["windows"]))
        assert (rc, v["status"]) in ((1, "regression"), (3, "inconclusive")), (v, windows)
        assert v["high"] > 0.15, windows
        assert v["per_window"] == "median call"


def test_a_window_s_value_is_the_median_of_its_calls_in_the_trace(runs, capsys):
    """What the gate compares per window is the median of the range's calls as the trace
    holds them (late wake-ups slow single calls; a window's mean carries them)."""
    rc, doc = _gate(capsys, runs["base"], runs["again"], *RECIPE)
    v = _verdict(doc)
    assert v["per_window"] == "median call" and "each its median call" in v["reason"]
    medians = []
    for f in doc["before"]["traces"]:
        with open(f, encoding="utf-8") as fh:
            events = json.load(fh)["traceEvents"]
        durs = sorted(
            e["dur"]
            for e in events
            if e.get("name") == "train_step" and e.get("cat") == "user_annotation"
        )
        assert len(durs) == 5, f
        medians.append(durs[2])
    assert v["before"]["windows"] == pytest.approx(medians, abs=0.01)


def _nested_trace(path: str, nested: bool) -> None:
    """A window of five ``work`` calls of 10 ms; with ``nested``, one of them inside another
    (recursion: the report counts six calls over five calls' time)."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "work", "ts": 1000 + i * 20_000,
         "dur": 10_000, "pid": 1, "tid": 1}
        for i in range(5)
    ]  # fmt: skip
    if nested:
        events.append(dict(events[0], ts=1500, dur=2_000))
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": events}, f)


def test_a_call_inside_a_call_of_its_name_gates_by_the_windows_means(capsys, tmp_path):
    """Recursion: a window's calls do not all have a duration of their own (the report counts
    the nested call, its time is its caller's): the windows are judged by their means, both
    sides, and the JSON says so."""
    for nested_side in ("before", "after", None):
        for side in ("before", "after"):
            d = tmp_path / f"{nested_side}-{side}"
            d.mkdir()
            for i in range(gate.MIN_WINDOWS):
                _nested_trace(str(d / f"w{i}.pt.trace.json"), nested_side == side)
        base = str(tmp_path / f"{nested_side}-")
        rc, doc = _gate(capsys, base + "before", base + "after", *RECIPE)
        v = _verdict(doc, "work")
        if nested_side is None:
            assert v["per_window"] == "median call" and v["before"]["value"] == 10_000
            assert rc == 0 and v["status"] == "pass", v
        else:  # a window's time over its calls, as the report has it (six calls)
            assert v["per_window"] == "mean", v
            means = {s: 50_000 / 6 if nested_side == s else 10_000 for s in ("before", "after")}
            assert v["before"]["value"] == pytest.approx(means["before"])
            assert v["after"]["value"] == pytest.approx(means["after"])


def test_one_window_a_side_is_inconclusive_exit_3(runs, capsys):
    """One window a side cannot tell a 1.2x regression from a neighbour's load: it says so,
    with exit status 3 and how many windows would settle it, and claims nothing."""
    for after in ("one_slow12", "one"):
        rc, out, err = _main(capsys, "diff", runs["one"], runs[after], "--fail-over", "10%")
        assert rc == 3 and err == "", out + err
        assert "INCONCLUSIVE    train_step" in out
        assert out.rstrip().splitlines()[-1] == (
            "INCONCLUSIVE: 0 regression(s), 0 not comparable, 1 inconclusive, 0 passed, 0 skipped"
        )
        text = " ".join(out.split())
        assert "at least 5 windows a side would settle it (8 recommended)" in text
    rc, doc = _gate(capsys, runs["one"], runs["one_slow12"], "--fail-over", "10%")
    v = _verdict(doc)
    assert rc == 3 and doc["outcome"] == "inconclusive" and not doc["passed"]
    assert v["settle_windows"] == 5 and v["low"] is None and v["high"] is None
    # three against eight: still fewer than five a side
    rc, doc = _gate(capsys, runs["three"], runs["slow"], "--fail-over", "10%")
    assert rc == 3 and _verdict(doc)["status"] == "inconclusive"
    # as CI runs it: a real process exits 3
    proc = _proc.run(
        "-m", "instrument", "diff", runs["one"], runs["one_slow12"], "--fail-over", "10%"
    )
    assert proc.returncode == 3 and "INCONCLUSIVE" in proc.stdout and proc.stderr == ""


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
    # one window each: inconclusive on the times, the shapes never decide
    rc, doc = _gate(capsys, runs["one"], runs["no_shapes"], "--fail-over", "10%")
    v = _verdict(doc)
    assert v["status"] == "inconclusive" and "mismatch" not in v
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
    rc, doc = _gate(capsys, runs["base"], runs["slow"], "--fail-over", "10%", "--metric", "flops")
    v = _verdict(doc)
    assert rc == 1 and v["status"] == "regression" and v["basis"] == "cpu"
    assert v["before"]["value"] > v["after"]["value"] > 0  # FLOP/s fell: same FLOPs, more time
    assert v["change"] < -0.3 and v["worse_by"] == pytest.approx(-v["change"])
    rc, doc = _gate(capsys, runs["slow"], runs["base"], "--fail-over", "10%", "--metric", "flops")
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
    rc, doc = _gate(capsys, runs["base"], more, "--fail-over", "10%", "--range", "train_step")
    assert rc == 1 and [v["name"] for v in doc["verdicts"]] == ["train_step"]
    # on one side only: skipped when not asked for, not comparable when named
    rc, doc = _gate(capsys, runs["base"], more, "--fail-over", "10%")
    assert rc == 1 and _verdict(doc, "eval_step")["status"] == "skipped"
    assert "only after" in _verdict(doc, "eval_step")["reason"]
    rc, doc = _gate(capsys, runs["base"], more, "--fail-over", "10%", "--range", "eval_step")
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
    {"base": "8:2:2048:1:cuda:1", "heavier": "8:2:2048:1:cuda:4"},
    {"again": "8:2:2048:1:cuda:1"},
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


def test_metric_device_on_h100_traces(capsys, tmp_path):
    """Three windows a side were recorded: too few for a verdict, and so it says. Each
    window's traces twice over (six a side) then show the device figures judged: the copies
    only repeat values, which the floor's bounds take as they come."""
    sides = [os.path.join(H100, n) for n in ("base", "heavier", "again")]
    rc, doc = _gate(capsys, sides[0], sides[1], "--fail-over", "10%", "--metric", "device")
    assert rc == 3 and _verdict(doc)["status"] == "inconclusive"
    doubled = []
    for side in sides:
        d = tmp_path / os.path.basename(side)
        d.mkdir()
        for f in os.listdir(side):
            for copy_ in ("a", "b"):
                shutil.copy(os.path.join(side, f), d / f"{copy_}{f}")
        doubled.append(str(d))
    _device_gate(capsys, *doubled)


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
        "regression": (runs["base"], runs["slow"], ()),
        "pass": (runs["base"], runs["again"], ()),  # A/A
        "error": (runs["one"], runs["big"], ()),
        "skipped": (runs["one"], runs["big"], ("--allow-mismatch",)),
        "inconclusive": (runs["one"], runs["one_slow12"], ()),
    }
    status = {"regression": 1, "error": 1, "inconclusive": 3}
    for case, (before, after, more) in cases.items():
        path = tmp_path / f"{case}.xml"
        rc, out, err = _main(capsys, "diff", before, after, *RECIPE, "--junit", str(path), *more)
        assert rc == status.get(case, 0), err
        doc = etree.parse(str(path))
        for xsd, schema in zip(JUNIT_XSDS, schemas):
            assert schema.validate(doc), (case, xsd, schema.error_log)
        (suite,) = doc.getroot().findall("testsuite")
        assert suite.get("name") == "torch-profiled diff"
        (case_el,) = suite.findall("testcase")
        assert case_el.get("name") == "train_step"
        assert case_el.get("classname") == "torch-profiled.diff.cpu"
        children = [c.tag for c in case_el]
        tag = {"regression": "failure", "inconclusive": "skipped"}.get(case, case)
        assert children == ([] if case == "pass" else [tag])
        counts = {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}
        assert counts == {
            "tests": 1,
            "failures": int(case == "regression"),
            "errors": int(case == "error"),
            "skipped": int(case in ("skipped", "inconclusive")),
        }
        props = {p.get("name"): p.get("value") for p in suite.find("properties")}
        outcome = {"error": "not comparable", "skipped": "pass"}.get(case, case)
        assert props["outcome"] == outcome and props["exit_status"] == str(rc)
        assert props["inconclusive"] == str(int(case == "inconclusive"))
        if case == "inconclusive":  # JUnit has no third outcome: a skip that says so
            assert case_el[0].get("message").startswith("inconclusive: cpu time per call")
            assert "windows a side would settle it" in case_el[0].text
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
    proc = _proc.run("-m", "instrument", "diff", runs["base"], runs["slow"], "--fail-over", "10%")
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
        "--allow-partial",
        "each side's noise floor lies between its best and its second-best window",
        "INCONCLUSIVE otherwise or with fewer than 5 windows a side",
        "would settle it (record 8)",
        "Exit status: 0 pass, 1 a regression or a range not comparable, 2 bad input or usage, "
        "3 inconclusive",
        "an inconclusive range is a <skipped> testcase whose message starts 'inconclusive:'",
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


_early.add(
    __name__,
    "test_summarize_missing_range_lists_ranges_recorded_as_operators",
    *("-c", OWN_PROFILER, "own.json"),
    env=_proc.sdk_env(),
)


def test_summarize_missing_range_lists_ranges_recorded_as_operators(request, capsys):
    """An @profiled range inside the program's own profiler is recorded as an operator: the
    message said the trace held no ranges, with ``my_block`` right there."""
    proc, cwd = _early.result(request)  # OWN_PROFILER, its trace written to own.json
    path = str(cwd / "own.json")
    assert proc.returncode == 0, proc.stderr
    rc, out, err = _main(capsys, "summarize", "--range", "my_blok", path)
    _one_line_error(rc, out, err)
    assert "hold no ranges" not in err
    assert "(did you mean 'my_block'?)" in err
    assert "operators named like @profiled ranges there" in err and ": 'my_block';" in err
    assert "aten::" not in err
    rc, out, err = _main(capsys, "summarize", "--json", "--range", "my_block", path)
    assert rc == 0 and json.loads(out)["ranges"]["my_block"]["calls"] == 3
