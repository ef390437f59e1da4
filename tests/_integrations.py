"""Running tests/_frameworks_job.py for the integration tests: a real training run in a fresh
interpreter, profiled as the environment says, its window reports read back."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests import _proc
from tests._proc import REPO

JOB = os.path.join(REPO, "tests", "_frameworks_job.py")

# what the jobs run (they import these; the tests read them here, without the job's torch)
FLUSH_AT = 10  # each job waits for its first window's report at this step
HF_STEPS = 12  # the HF run's optimizer steps, of ACCUMULATE micro-batches each, windows
HF_EVERY = 4  # every 4 steps (steps 1-2, 5-6, 9-10), logs every HF_LOG steps; it waits for
HF_LOG = 2  # the first report at HF_FLUSH_AT (the window ended at step 3: the logs before
HF_FLUSH_AT = 8  # step 4 have no counted FLOPs; from HF_FLUSH_AT on, every log has)
ACCUMULATE = 4  # the HF run's gradient accumulation: micro-batches per optimizer step
FETCH_SIZE = 8  # a sample's fetch in the HF run does one FETCH_SIZE-square matrix product
FETCH_FLOPS = 2 * FETCH_SIZE**3
LIGHTNING_STEPS = 800
DDP_STEPS = 4  # the Lightning DDP run's steps (2 processes)
READINGS = (200, 800)  # RSS and live objects read after these steps: 600 steps, 6 windows apart

# a window (warm-up step, then two recorded steps) every 20 steps, counting FLOPs; a peak of
# 0.05 TFLOP/s stands in for the CPU, which has none in the table, so MFU is given
SETTINGS = {
    "PROFILED_EXPORTERS": "json",
    "PROFILED_EVERY": "20",
    "PROFILED_SCHEDULE": "wait=0,warmup=1,active=2",
    "PROFILED_WITH_FLOPS": "1",
    "PROFILED_PEAK_TFLOPS": "0.05",
    # no download, ever: the models are built from configs
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
}


def needs(*modules):
    """A skip mark for tests whose programs need ``modules`` installed: looked up, not
    imported (importing Lightning here would cost this process seconds it never uses)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")


def run_job(name, tmp_path, timeout=300, **env):
    """``(the job's JSON result, its window reports)``; fails with the job's output if it
    failed."""
    reports = tmp_path / "reports.jsonl"
    settings = {**SETTINGS, "PROFILED_JSON_PATH": str(reports), **env}
    out = _proc.run(JOB, name, env=_proc.sdk_env(settings), cwd=tmp_path, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    windows = [
        r
        for r in map(json.loads, reports.read_text().splitlines())
        if r.get("schema", "").startswith("torch-profiled/window-report")
    ]
    return result, windows


def phase_calls(window, prefix):
    """{range name: calls} of the ranges of ``prefix`` (``hf.``) in a window's report."""
    return {
        name: r["calls"] for name, r in window["ranges"].items() if name.startswith(prefix + ".")
    }
