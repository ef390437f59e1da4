"""bench/frameworks_mfu.py (the GPU check of issue 33) still runs: on the CPU, at example 08's
CPU sizes and a few steps, under bf16 autocast as on the GPU. Both runs' windows count
measure_flops's FLOPs per step (autocast's operators, which torch records twice, once each),
and in the Lightning run the callback and ThroughputMonitor rate the same batches by them, so
their FLOP/s agree (to what the two callbacks' clocks differ by); no timing is asserted."""

from __future__ import annotations

import json

import pytest

from tests import _proc
from tests._integrations import needs
from tests._proc import REPO

pytestmark = needs("transformers", "accelerate", "lightning")


def test_frameworks_mfu_prints_both_figures(tmp_path):
    out = _proc.run(
        f"{REPO}/bench/frameworks_mfu.py",
        *("--steps", "16", "--window", "6", "--json", "r.json"),
        env=_proc.sdk_env(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path)),
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-5000:]
    result = json.loads((tmp_path / "r.json").read_text())
    pl = result["lightning"]
    assert pl["counted_flops_per_step"] == pytest.approx(pl["flops_per_batch"], rel=0.005)
    hf = result["hf"]
    assert hf["counted_flops_per_step"] == pytest.approx(pl["flops_per_batch"], rel=0.005)
    # the same batches' times, stamped by two callbacks one after the other: on a busy 2-core
    # box a few ms apart at a window's ends, of ~150 ms here (on a GPU, seconds)
    assert pl["callback_flops_per_s"] == pytest.approx(pl["monitor_flops_per_s"], rel=0.1)
    assert hf["flops_per_s"] > 0 and hf["step_time_s"] > 0
    assert "check: the callback's FLOP/s" in out.stdout
    assert "check: the HF run's counted FLOPs per step" in out.stdout
