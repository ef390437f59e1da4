"""bench/frameworks_mfu.py (the GPU check of issue 33) still runs: on the CPU, at example 08's
CPU sizes and a few steps. In the Lightning run the callback and ThroughputMonitor rate the
same batches by the same FLOPs (the window's count is measure_flops's), so their FLOP/s agree;
no timing is asserted."""

from __future__ import annotations

import json

import pytest

from tests.test_bench import run_bench

pytest.importorskip("transformers")
pytest.importorskip("lightning")


def test_frameworks_mfu_prints_both_figures(tmp_path):
    out = run_bench(
        "frameworks_mfu.py", tmp_path, "--steps", "24", "--window", "8", "--json", "r.json"
    )
    assert out.returncode == 0, out.stderr[-5000:]
    result = json.loads((tmp_path / "r.json").read_text())
    pl = result["lightning"]
    assert pl["counted_flops_per_step"] == pytest.approx(pl["flops_per_batch"], rel=0.005)
    assert pl["callback_flops_per_s"] == pytest.approx(pl["monitor_flops_per_s"], rel=0.01)
    assert result["hf"]["flops_per_s"] > 0
    assert "check: the HF run's" in out.stdout
