"""Examples 08 (Hugging Face Trainer) and 09 (Lightning) run as real programs at their CPU
sizes, from an empty working directory, with the console exporter."""

from __future__ import annotations

import re

import pytest

from tests._integrations import needs
from tests.test_examples import calls, run_example, table_rows

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def summary(stdout, header):
    """The rows under the example's closing summary: {step: columns}."""
    lines = stdout[stdout.index(header) :].splitlines()[1:]
    return {int(line.split()[0]): line.split() for line in lines if line.strip()}


@needs("transformers", "accelerate")
def test_08_trainer_profiles_the_trainers_loop_with_one_callback(tmp_path):
    out = run_example("08_trainer.py", tmp_path, env={"PROFILED_EXPORTERS": "console", **OFFLINE})
    assert out.returncode == 0, out.stderr[-5000:]
    (ranges,) = table_rows(out.stderr, "@profiled range")  # the default schedule: steps 1-3
    for name in ("hf.step", "hf.forward_backward", "hf.optimizer", "hf.data_wait"):
        assert calls(ranges[name]) == 3, name
    assert re.search(r"^  hf\.forward_backward: [\d.]+ MFLOP per call", out.stderr, re.M)
    rows = summary(out.stdout, "step   loss")
    assert sorted(rows) == [10, 20, 30, 40, 50, 60]
    for cols in rows.values():
        assert float(cols[2]) > float(cols[3]) > 0  # step ms > data wait ms
        assert float(cols[6]) > 0  # the Trainer's own FLOP estimate, rated
    losses = [float(rows[s][1]) for s in sorted(rows)]
    assert losses[-1] < losses[0]  # it learns


@needs("lightning")
def test_09_lightning_counts_what_throughput_monitor_is_told(tmp_path):
    out = run_example("09_lightning.py", tmp_path, env={"PROFILED_EXPORTERS": "console", **OFFLINE})
    assert out.returncode == 0, out.stderr[-5000:]
    (ranges,) = table_rows(out.stderr, "@profiled range")
    for name in ("step", "forward_backward", "backward", "optimizer", "data_wait"):
        assert calls(ranges[f"lightning.{name}"]) == 3, name
    # the window counted per step what measure_flops counted per batch: the same formulas
    declared = re.search(r"flops_per_batch .*: ([\d.]+) MFLOP", out.stdout)
    counted = re.search(r"^  lightning\.step: ([\d.]+) MFLOP per call", out.stderr, re.M)
    assert float(counted[1]) == pytest.approx(float(declared[1]), rel=0.005)
    rows = summary(out.stdout, "step  step ms")
    assert sorted(rows) == [9, 19, 29, 39, 49, 59]
    for cols in rows.values():
        assert float(cols[1]) > float(cols[2]) > 0  # step ms > data wait ms
        declared_rate, monitor_rate = cols[-2].rstrip(","), cols[-1]
        assert float(declared_rate) > 0 and float(monitor_rate) > 0
