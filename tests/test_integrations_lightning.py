"""``instrument.integrations.lightning`` in a real Lightning ``Trainer.fit``: a small MLP (its
network compiled with Dynamo's eager backend) for 800 steps on the CPU with a CSV logger and
windows every 100 steps (one run; each test reads a part of it); a DDP run of 2 processes; the
rank taken from the strategy where nothing else says it."""

from __future__ import annotations

import pytest

from tests._integrations import (
    DDP_STEPS,
    LIGHTNING_STEPS,
    READINGS,
    needs,
    phase_calls,
    run_job,
)

pytestmark = needs("lightning")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_job("lightning", tmp_path_factory.mktemp("lightning"), PROFILED_EVERY="100")


def test_windows_open_at_the_configured_batches_with_each_phase_once_a_step(run):
    _, windows = run
    assert [w["steps"] for w in windows] == [[n + 1, n + 2] for n in range(0, LIGHTNING_STEPS, 100)]
    for w in windows:
        assert phase_calls(w, "lightning") == {
            "lightning.step": 2,
            "lightning.forward_backward": 2,
            "lightning.backward": 2,
            "lightning.optimizer": 2,
            "lightning.data_wait": 2,
        }
        ranges = w["ranges"]
        fb, bw = ranges["lightning.forward_backward"], ranges["lightning.backward"]
        assert fb["flops"] > bw["flops"] > 0  # the backward's FLOPs are inside the phase's
        assert ranges["lightning.optimizer"]["flops"] == 0


def test_per_step_metrics_reach_lightnings_logger(run):
    result, windows = run
    rows = [r for r in result["csv"] if "profiled/step_time_s" in r]
    assert [int(r["step"]) for r in rows] == list(range(49, LIGHTNING_STEPS, 50))  # every 50
    per_step = windows[0]["flops"] / len(windows[0]["steps"])
    for r in rows:
        took = float(r["profiled/step_time_s"])
        assert took > float(r["profiled/data_wait_s"]) > 0
        # counted: the window's FLOPs per step over this step's time, against 0.05 TFLOP/s
        assert float(r["profiled/flops_per_step"]) == per_step
        assert float(r["profiled/mfu"]) == pytest.approx(per_step / took / 0.05e12, rel=1e-5)
        # declared: the module's flops_per_batch (what ThroughputMonitor reads), same peak
        declared = 3 * 2 * 4 * (32 * 64 + 64 * 1)
        assert float(r["profiled/declared_mfu"]) == pytest.approx(
            declared / took / 0.05e12, rel=1e-5
        )


def test_memory_stays_flat_over_a_long_run_with_windows(run):
    result, windows = run
    first, last = READINGS
    (rss_first, objects_first), (rss_last, objects_last) = (
        result["memory"][str(first)],
        result["memory"][str(last)],
    )
    assert len(windows) == 8  # six of them between the two readings
    # a Python object kept per step would be 600 more; each window keeps a few of torch's
    assert objects_last - objects_first < (last - first) / 2
    assert rss_last - rss_first < 6 * 2**20


def test_no_graph_break_in_the_compiled_network(run):
    result, _ = run
    assert result["graphs"] >= 1 and result["graph_breaks"] == 0


def test_each_process_of_a_ddp_run_reports_its_own_rank(tmp_path):
    """``strategy="ddp"`` on the CPU, 2 processes (gloo): both profile the same steps, each
    report names its process's rank (Lightning starts the process group before the
    callback's first hook: the ranks come from torch.distributed)."""
    result, windows = run_job("lightning_ddp", tmp_path, timeout=180)
    assert result == {"world_size": 2, "steps": DDP_STEPS}
    assert sorted((w["rank"], w["world_size"]) for w in windows) == [(0, 2), (1, 2)]
    for w in windows:
        assert w["steps"] == [1, 2]
        assert phase_calls(w, "lightning")["lightning.step"] == 2


def test_a_strategy_of_several_processes_names_the_rank_where_nothing_else_does(run):
    """No process group at ``setup`` and no launcher variable: ``RANK``/``WORLD_SIZE`` come
    from the strategy (a real Trainer of 2 nodes x 2 processes, as node 1's first process)."""
    result, _ = run
    assert result["rank_from_strategy"] == {"RANK": "2", "WORLD_SIZE": "4"}
