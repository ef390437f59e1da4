"""What the integrations share (``instrument.integrations._core``), through the smallest of
them, ``accelerate.ProfiledLoop``, in this process: a plain loop over a list of batches with
a torch optimizer (the loop needs no ``Accelerator``), into ``instrument.testing.capture()``."""

from __future__ import annotations

import warnings

import pytest
import torch

import instrument
from exporters import InMemoryExporter
from instrument import Schedule
from instrument.testing import capture

pytest.importorskip("accelerate")

from instrument.integrations.accelerate import ProfiledLoop  # noqa: E402


def train(loop, batches, model, opt, every=1):
    seen = []
    for i, (x, y) in enumerate(loop(batches)):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if i % every == every - 1:
            opt.step()
            opt.zero_grad()
        seen.append(i)
    return seen


def setup(n=6):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(n)]


def test_a_step_per_batch_in_the_current_session_with_its_phases():
    model, opt, batches = setup()
    with capture(schedule=Schedule(wait=1, warmup=0, active=3), activities=["cpu"]) as cap:
        loop = ProfiledLoop(None, opt, log_every=2)
        assert train(loop, batches, model, opt, every=2) == list(range(6))
    (report,) = cap.reports
    assert report.steps == (1, 2, 3)
    calls = {n: r.calls for n, r in report.ranges.items() if n.startswith("accelerate.")}
    assert calls == {
        "accelerate.step": 3,
        "accelerate.data_wait": 3,
        "accelerate.forward_backward": 3,
        "accelerate.optimizer": 2,  # the optimizer steps in batches 1, 3 and 5: steps 1 and 3
    }
    assert set(loop.last_metrics) >= {"profiled/step_time_s", "profiled/data_wait_s"}
    loop.remove()


def test_a_loop_left_early_closes_its_ranges_and_ends_the_step_it_was_in():
    model, opt, batches = setup()
    with capture(schedule=Schedule(wait=0, warmup=0, active=2), activities=["cpu"]) as cap:
        for i, _ in enumerate(ProfiledLoop()(batches)):
            if i == 1:
                break
    (report,) = cap.reports
    assert report.steps == (0, 1)
    assert report.ranges["accelerate.step"].calls == 2
    assert report.ranges["accelerate.step"].open_calls == 0


@pytest.mark.parametrize("off", ["env", "configure"])
def test_profiling_off_means_the_loop_only_yields(monkeypatch, off):
    if off == "env":
        monkeypatch.setenv("PROFILED_ENABLED", "0")
    else:
        instrument.configure(enabled=False)
    model, opt, batches = setup()
    loop = ProfiledLoop(None, opt, log_every=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert train(loop, batches, model, opt) == list(range(6))
    assert loop.last_metrics == {}


def test_log_every_must_be_a_positive_integer():
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="log_every must be an integer >= 1"):
            ProfiledLoop(log_every=bad)


def test_the_settings_and_peaks_an_integration_reads_are_public(monkeypatch):
    """``instrument.get_config()``: the environment, then ``configure()``; ``peak_tflops()``:
    the reports' peak table, ``PROFILED_PEAK_TFLOPS`` first (the integrations' MFU)."""
    assert instrument.peak_tflops("NVIDIA H200")["bf16"] == 989.4
    assert instrument.peak_tflops("cpu") == {}
    monkeypatch.setenv("PROFILED_PEAK_TFLOPS", "0.05")
    monkeypatch.setenv("PROFILED_WITH_FLOPS", "1")
    config = instrument.get_config()
    assert isinstance(config, instrument.Config)
    assert (config.peak_tflops, config.with_flops) == (0.05, True)
    assert set(instrument.peak_tflops("cpu").values()) == {0.05}
    assert instrument.peak_tflops("NVIDIA H200")["bf16"] == 0.05
    instrument.configure(with_flops=False, peak_tflops=2.0)
    assert (instrument.get_config().with_flops, instrument.get_config().peak_tflops) == (False, 2.0)
    assert instrument.peak_tflops("cpu")["fp32"] == 2.0


def test_a_new_run_forgets_the_counted_flops_of_the_last_one():
    """Two loops in one process (another model, a notebook's next cell): the second is not
    rated by the FLOPs the first one's window counted."""
    memory = InMemoryExporter()
    instrument.configure(
        exporters=[memory], every=1000, schedule=Schedule(wait=0, warmup=0, active=2),
        with_flops=True, activities=["cpu"],
    )  # fmt: skip
    model, opt, batches = setup(n=4)
    train(ProfiledLoop(None, opt, log_every=4), batches, model, opt)
    assert instrument.flush(timeout_s=60)
    assert [r.flops > 0 for r in memory.reports] == [True]  # the first run's window counted
    second = ProfiledLoop(None, None, log_every=1)
    for _ in second(batches[:1]):
        pass
    assert "profiled/step_time_s" in second.last_metrics
    assert "profiled/flops_per_step" not in second.last_metrics
