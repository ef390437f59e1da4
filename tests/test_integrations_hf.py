"""``instrument.integrations.hf`` in a real ``transformers.Trainer``: a 2-layer GPT-2 built from
a config (no download) trained for 12 optimizer steps on the CPU with gradient accumulation
(4 micro-batches of one sequence a step), compiled (``torch_compile``, Dynamo's eager
backend), with the callback placed by ``profile_trainer`` ahead of the TensorBoard logger.
One run; each test reads a part of it. (Without accumulation, example 08's test.)"""

from __future__ import annotations

import pytest

from tests._integrations import (
    ACCUMULATE,
    FETCH_FLOPS,
    HF_EVERY,
    HF_FLUSH_AT,
    HF_LOG,
    HF_STEPS,
    needs,
    phase_calls,
    run_job,
)

pytestmark = needs("transformers", "accelerate", "tensorboard")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_job("hf", tmp_path_factory.mktemp("hf"), PROFILED_EVERY=str(HF_EVERY))


def test_windows_open_at_the_configured_optimizer_steps_with_a_forward_backward_per_micro_batch(
    run,
):
    _, windows = run
    # PROFILED_EVERY=4, warm-up 1, active 2: the Trainer's optimizer steps are the SDK's
    assert [w["steps"] for w in windows] == [[1, 2], [5, 6], [9, 10]]
    assert {w["reason"]["kind"] for w in windows} == {"every"}
    for w in windows:
        assert phase_calls(w, "hf") == {
            "hf.step": 2,
            "hf.forward_backward": 2 * ACCUMULATE,  # each micro-batch's
            "hf.optimizer": 2,
            "hf.data_wait": 2,
        }
        ranges = w["ranges"]
        # the model's FLOPs are inside forward_backward, none in the optimizer; a step's data
        # wait holds the fetch of all its micro-batches (the Trainer fetches them up front)
        assert ranges["hf.forward_backward"]["flops"] > 0
        assert ranges["hf.optimizer"]["flops"] == 0
        assert ranges["hf.data_wait"]["flops"] == 2 * ACCUMULATE * FETCH_FLOPS


def test_the_per_step_figures_describe_an_optimizer_step_of_every_micro_batch(run):
    result, windows = run
    fb = windows[0]["ranges"]["hf.forward_backward"]
    micro_batch = fb["flops"] / fb["calls"]  # counted: the model's forward and backward
    train_logs = [h for h in result["log_history"] if "loss" in h]
    counted = [h for h in train_logs if "profiled/flops_per_step" in h]
    assert counted
    for h in counted:
        assert h["profiled/flops_per_step"] == ACCUMULATE * (micro_batch + FETCH_FLOPS)
    # declared: the Trainer's floating_point_ops of every micro-batch since the last log,
    # per optimizer step (rated by the step time: rate x time gives the step's FLOPs back)
    for h in train_logs:
        declared = h["profiled/declared_flops_per_s"] * h["profiled/step_time_s"]
        assert declared == pytest.approx(ACCUMULATE * result["declared_per_micro_batch"])


def test_per_step_metrics_reach_the_trainers_logs_and_its_tensorboard_logger(run):
    result, windows = run
    assert result["callbacks"][:3] == [
        "DefaultFlowCallback",
        "ProfiledCallback",
        "TensorBoardCallback",
    ]
    train_logs = [h for h in result["log_history"] if "loss" in h]
    assert [h["step"] for h in train_logs] == list(range(HF_LOG, HF_STEPS + 1, HF_LOG))
    for h in train_logs:
        assert h["profiled/step_time_s"] > h["profiled/data_wait_s"] > 0
        assert h["profiled/declared_flops_per_s"] > 0  # the Trainer's floating_point_ops
    # once the first window's report is in (after its end at step 3; by the step where the
    # test waited for it), every log: the counted FLOPs of the last window per recorded step,
    # over each step's time, against the 0.05 TFLOP/s peak
    counted = [h for h in train_logs if "profiled/mfu" in h]
    first = counted[0]["step"]
    assert 4 <= first <= HF_FLUSH_AT
    assert [h["step"] for h in counted] == list(range(first, HF_STEPS + 1, HF_LOG))
    per_step = windows[0]["flops"] / len(windows[0]["steps"])
    for h in counted:
        assert h["profiled/flops_per_step"] == per_step
        rate = per_step / h["profiled/step_time_s"]
        assert h["profiled/flops_per_s"] == pytest.approx(rate)
        assert h["profiled/mfu"] == pytest.approx(rate / 0.05e12)
        # the Trainer's 6 x parameters x tokens leaves out attention and the (tied) LM head
        assert h["profiled/declared_flops_per_s"] < h["profiled/flops_per_s"]
    tags = result["tensorboard"]
    for name in ("step_time_s", "data_wait_s", "declared_mfu"):
        assert tags[f"train/profiled/{name}"] == len(train_logs)
    assert tags["train/profiled/mfu"] == len(counted)


def test_no_graph_break_in_the_compiled_model(run):
    result, _ = run
    assert result["graphs"] >= 1  # the Trainer did compile the model
    assert result["graph_breaks"] == 0
