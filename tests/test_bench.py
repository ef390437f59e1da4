"""The ladder's benchmarks still run: each in a fresh interpreter at its smallest settings.

They check themselves before they measure (the plain loop computes what 06's loop computes,
idle is idle, every sampled run exports its windows, hooks are installed); these tests run them
so an API change cannot leave a benchmark broken until the next GPU run. No timing is asserted.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import tempfile

import pytest

from tests import _proc
from tests._proc import REPO


def bench_env(tmp_path) -> dict[str, str]:
    env = _proc.sdk_env()
    env["TMPDIR"] = str(tmp_path / "tmp")  # what a bench leaves in the temporary directory
    # torch's compile cache, which importing torch._dynamo creates under TMPDIR unless this is
    # set (it sets it in its own process, so children of a process that imported it inherit it)
    env.setdefault(
        "TORCHINDUCTOR_CACHE_DIR",
        os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"),
    )
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return env


def run_bench(name, tmp_path, *args, timeout=300):
    """Run ``bench/<name>`` now, in its own process (the benches not run ahead)."""
    return _proc.run(
        os.path.join(REPO, "bench", name),
        *args,
        env=bench_env(tmp_path),
        cwd=tmp_path,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """Every bench run of this module (each a fresh interpreter, as before; no timing is
    asserted), two at a time as the module starts; a test reads its own (in its directory)."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:

        def add(key, name, *args):
            path = os.path.join(REPO, "bench", name)
            ahead.add(key, path, *args, env=bench_env, timeout=300)

        # windows every 5 steps (a window is 4), two a sampled run
        add(
            "test_e2e_overhead_runs_every_variant_and_writes_its_json",
            "e2e_overhead.py",
            *("--rounds", "1", "--every", "5", "--run-steps", "10", "--json", "e2e.json"),
        )
        add(
            "test_stop_cost_times_every_phase",
            "stop_cost.py",
            *("--windows", "2", "--idle", "2", "--json", "sc.json"),
        )
        add(
            "test_e2e_overhead_rejects_a_run_that_is_not_whole_windows",
            "e2e_overhead.py",
            *("--every", "8", "--run-steps", "12"),
        )
        add(
            "test_module_hooks_bench_runs",
            "module_hooks.py",
            *("--repeats", "1", "--forwards", "3", "--json", "mh.json"),
        )
        add("test_ladder_tables_prints_both_tables_per_rung#0", "ladder_tables.py", "linear")
        add("test_ladder_tables_prints_both_tables_per_rung#1", "ladder_tables.py", "ladder")
        yield ahead


def test_e2e_overhead_runs_every_variant_and_writes_its_json(ahead, request):
    out, tmp_path = ahead[request.node.name]  # one round, windows every 5 steps, 10 a run
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "e2e.json").read_text())
    variants = {
        "unprofiled",
        "idle",
        "metrics",
        "idle_modules",
        "counting",
        "sampled",
        "sampled_in_thread",
        "sampled_drain_cpu",
        "torch_profiler",
        "torch_profiler_export",
    }
    assert set(doc["steps_per_s"]) == variants
    assert set(doc["window_costs_s"]) == {
        "sampled",
        "sampled_in_thread",
        "sampled_drain_cpu",
        "torch_profiler",
        "torch_profiler_export",
    }
    assert all(len(runs) == 1 and runs[0] > 0 for runs in doc["steps_per_s"].values())
    assert set(doc["targets"]) == {"idle", "metrics", "sampled"}
    assert "windows timed" in out.stdout and "(2 windows timed per sampled variant)" in out.stdout
    assert sorted(os.listdir(tmp_path)) == ["e2e.json", "tmp"]
    assert os.listdir(tmp_path / "tmp") == []  # its trace directory is removed at the end


def test_stop_cost_times_every_phase(ahead, request):
    out, tmp_path = ahead[request.node.name]  # two windows, two idle
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "sc.json").read_text())
    assert len(doc["windows"]) == 2
    phases = {
        "start",
        "drain",
        "stop",
        "export",
        "load",
        "shape",
        "write",
        "events",
        "analyze",
        "after",
        "events_n",
    }
    assert phases <= set(doc["windows"][0])
    assert all(w["events_n"] > 0 for w in doc["windows"])


def test_e2e_overhead_rejects_a_run_that_is_not_whole_windows(ahead, request):
    out, _tmp_path = ahead[request.node.name]  # --every 8 --run-steps 12
    assert out.returncode == 2
    assert "--run-steps (12) must be a multiple of --every (8)" in out.stderr


def test_module_hooks_bench_runs(ahead, request):
    out, tmp_path = ahead[request.node.name]  # one repeat of three forwards
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "mh.json").read_text())
    assert doc["modules"] == 101 and len(doc["ns"]) == 6


def test_ladder_tables_prints_both_tables_per_rung(ahead, request):
    out, _tmp_path = ahead[request.node.name + "#0"]  # the linear rung
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(": plain torch.profiler ===") == 2
    assert out.stdout.count(": torch-profiled ===") == 2
    assert out.stdout.count("Self CPU time total:") == 4  # torch's table and ours, two sizes
    bad, _tmp_path = ahead[request.node.name + "#1"]  # a rung that is not one
    assert bad.returncode == 2 and "unknown rung(s) ladder" in bad.stderr


def test_e2e_lm_quick_runs_every_variant_and_writes_its_json(tmp_path):
    out = run_bench(
        "e2e_lm.py",
        tmp_path,
        "--device",
        "cpu",
        "--quick",
        "--extra",
        "sdk_lean",
        "--json",
        str(tmp_path / "lm.json"),
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "lm.json").read_text())
    assert set(doc["sizes"]) == {"small", "larger"}
    for name, size in doc["sizes"].items():
        assert set(size["variants"]) == {"sdk", "torch", "metrics", "sdk_lean"}, name
        for variant, res in size["variants"].items():
            ratio = res["ratio"]["median"]
            assert ratio > 0 and math.isfinite(ratio), (name, variant, ratio)
            assert math.isfinite(res["window_cost_ms"]["median"]), (name, variant)
            assert set(res["excess_ms"]) == {"step 0", "steps 1-3", "steps 4-8", "steps 9+"}
        sdk, hand = size["variants"]["sdk"], size["variants"]["torch"]
        assert sdk["windows_per_block"] == 1 and hand["windows_per_block"] == 1
        # every stage of one SDK window was seen, on the thread it belongs to
        assert sdk["stages"]["profiler start"]["caller_ms"] > 0
        assert sdk["stages"]["profiler stop"]["caller_ms"] > 0
        assert sdk["stages"]["export_chrome_trace"]["background_ms"] > 0
        assert sdk["stages"]["helper round trip"]["background_ms"] > 0
        assert sdk["stages"]["exporter trace"]["calls"] == 1
        assert sdk["stages"]["exporter json"]["calls"] == 1
        assert sdk["ledger"]["stop_stall_us"] > 0
        # the window-free steps of the SDK blocks before (instrument.step() calls, no
        # step=True function in the process) gave the ledger its baseline
        assert math.isfinite(sdk["ledger"]["steps_excess_us"]), sdk["ledger"]
        for stage in ("torch prepare_trace", "torch start_trace", "torch stop_trace"):
            assert hand["stages"][stage]["calls"] == 1, stage
        assert hand["stages"]["torch export_chrome_trace"]["caller_ms"] > 0
        assert size["replay"]["raw_events"] > 0 and size["torch_trace_events"] > 0
    for heading in ("per window ms", "where the extra program time lands", "one window's stages"):
        assert out.stdout.count(heading) == 2, heading
    assert sorted(os.listdir(tmp_path)) == ["lm.json", "tmp"]
    assert os.listdir(tmp_path / "tmp") == []  # its temporary directory is removed


def test_warmup_ops_quick_runs_and_the_paused_warmup_records_fewer_events(tmp_path):
    out = run_bench(
        "warmup_ops.py", tmp_path, "--device", "cpu", "--quick", "--windows", "2",
        "--json", str(tmp_path / "w.json"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "w.json").read_text())
    assert 0 < doc["paused"]["events"] < doc["recorded"]["events"]
    for setting in ("paused", "recorded"):
        assert doc[setting]["stop_cpu_ms"] > 0 and doc[setting]["export_cpu_ms"] > 0


def test_e2e_lm_refuses_an_unknown_variant(tmp_path):
    out = run_bench("e2e_lm.py", tmp_path, "--device", "cpu", "--extra", "sdk_fast")
    assert out.returncode == 2
    assert "--extra: no variant sdk_fast" in out.stderr
