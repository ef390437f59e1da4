"""``instrument.integrations.accelerate.ProfiledLoop`` around a real ``Accelerator`` loop on the
CPU with gradient accumulation over 2 batches, logging to a tracker of the test's own, in this
process: the ambient session as ``configure()`` sets it (a window, warm-up step then two
recorded steps, every 20 steps, counting FLOPs; a peak of 0.05 TFLOP/s stands in for the CPU),
its reports kept in memory."""

from __future__ import annotations

import pytest
import torch

import instrument
from exporters import InMemoryExporter
from instrument import Schedule

pytest.importorskip("accelerate")

FLUSH_AT = 10  # the loop waits here for the first window's report (its FLOPs rate the rest)


def train(logged):
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker

    from instrument.integrations.accelerate import ProfiledLoop

    class Memory(GeneralTracker):
        name = "memory"
        requires_logging_directory = False

        def __init__(self) -> None:
            super().__init__()

        @property
        def tracker(self):
            return logged

        def store_init_configuration(self, values) -> None:
            pass

        def log(self, values, step=None, **kwargs) -> None:
            logged.append({"step": step, **values})

    acc = Accelerator(cpu=True, gradient_accumulation_steps=2, log_with=[Memory()])
    acc.init_trackers("test")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(120, 32, generator=g), torch.randn(120, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)  # 30 batches
    model, opt, loader = acc.prepare(model, opt, loader)
    loop = ProfiledLoop(acc, opt, log_every=5)
    for i, (x, y) in enumerate(loop(loader)):
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        if i == FLUSH_AT:
            instrument.flush()
    loop.remove()
    acc.end_training()


@pytest.fixture
def fresh_accelerate():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)  # (its state is process-wide)


def test_a_step_per_batch_the_optimizer_phase_where_it_steps_and_metrics_to_the_trackers(
    fresh_accelerate,
):
    memory = InMemoryExporter()
    instrument.configure(
        exporters=[memory],
        every=20,
        schedule=Schedule(wait=0, warmup=1, active=2),
        with_flops=True,
        peak_tflops=0.05,
    )
    logged: list[dict] = []
    train(logged)
    assert instrument.flush(timeout_s=60)
    windows = memory.reports
    assert [w.steps for w in windows] == [(1, 2), (21, 22)]  # 30 batches
    for w in windows:
        calls = {n: r.calls for n, r in w.ranges.items() if n.startswith("accelerate.")}
        assert calls == {
            "accelerate.step": 2,
            "accelerate.forward_backward": 2,
            "accelerate.data_wait": 2,
            "accelerate.optimizer": 1,  # accumulation: one optimizer step per 2 batches
        }
    assert [m["step"] for m in logged] == [5, 10, 15, 20, 25, 30]  # log_every=5
    for m in logged:
        assert m["profiled/step_time_s"] > m["profiled/data_wait_s"] > 0
    per_step = windows[0].flops / 2
    assert [m.get("profiled/flops_per_step") for m in logged[2:]] == [per_step] * 4
    assert all(m["profiled/mfu"] > 0 for m in logged[2:])
