"""``instrument.integrations.accelerate.ProfiledLoop`` around a real ``Accelerator`` loop on the
CPU with gradient accumulation over 2 batches, logging to a tracker of the test's own."""

from __future__ import annotations

import pytest

from tests._integrations import phase_calls, run_job

pytest.importorskip("accelerate")


def test_a_step_per_batch_the_optimizer_phase_where_it_steps_and_metrics_to_the_trackers(
    tmp_path,
):
    result, windows = run_job("accelerate", tmp_path)
    assert [w["steps"] for w in windows] == [[1, 2], [21, 22]]  # 30 batches
    for w in windows:
        assert phase_calls(w, "accelerate") == {
            "accelerate.step": 2,
            "accelerate.forward_backward": 2,
            "accelerate.data_wait": 2,
            "accelerate.optimizer": 1,  # accumulation: one optimizer step per 2 batches
        }
    logged = result["logged"]
    assert [m["step"] for m in logged] == [5, 10, 15, 20, 25, 30]  # log_every=5
    for m in logged:
        assert m["profiled/step_time_s"] > m["profiled/data_wait_s"] > 0
    per_step = windows[0]["flops"] / 2
    assert [m.get("profiled/flops_per_step") for m in logged[2:]] == [per_step] * 4
    assert all(m["profiled/mfu"] > 0 for m in logged[2:])
