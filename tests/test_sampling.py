"""Sampling: the pure policy on its own, then real sessions and processes driven by it."""

from __future__ import annotations

import json

import pytest
import torch

from exporters import InMemoryExporter
from instrument import Schedule, configure, flush, profiled, session
from instrument.runtime.config import Config, ConfigWarning
from instrument.runtime.sampling import Sampling, draw
from instrument.testing import process_status
from tests import _early, _proc

X = torch.randn(8, 8)


@profiled("train_step", step=True)
def train_step() -> torch.Tensor:
    return X @ X


# ------------------------------------------------------------------ the pure policy


def test_draw_is_a_pure_uniform_function_of_seed_and_step():
    values = [draw(7, n) for n in range(100_000)]
    assert values == [draw(7, n) for n in range(100_000)]  # same inputs, same outputs
    assert all(0.0 <= v < 1.0 for v in values)
    for p in (0.01, 0.1, 0.5):
        share = sum(v < p for v in values) / len(values)
        assert share == pytest.approx(p, rel=0.08)
    assert values[:50] != [draw(8, n) for n in range(50)]  # the seed matters
    # neighbouring steps are not correlated (a plain LCG would fail this)
    pairs = sum((a < 0.5) == (b < 0.5) for a, b in zip(values, values[1:])) / len(values)
    assert pairs == pytest.approx(0.5, abs=0.02)


def test_opens_every_n_and_next_open_agrees_with_a_scan():
    every = Sampling(every=10)
    assert [n for n in range(45) if every.opens(n)] == [0, 10, 20, 30, 40]
    sampled = Sampling(every=4, sample_rate=0.3, seed=3)
    brute = [n for n in range(4000) if sampled.opens(n)]
    assert brute and all(n % 4 == 0 for n in brute)
    assert len(brute) == pytest.approx(1000 * 0.3, rel=0.2)
    for start in (0, 1, 5, 17, 400, 3999):
        expected = next((n for n in brute if n >= start), None)
        if expected is not None:
            assert sampled.next_open(start) == expected
    assert Sampling(sample_rate=0.0).next_open(0) is None
    assert not Sampling().enabled and Sampling(every=3).enabled
    assert Sampling(sample_rate=0.5).enabled


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"every": 0}, ValueError),
        ({"every": 2.5}, TypeError),
        ({"sample_rate": 1.5}, ValueError),
        ({"sample_rate": -0.1}, ValueError),
        ({"seed": "x"}, TypeError),
    ],
)
def test_sampling_rejects_bad_values(kwargs, error):
    with pytest.raises(error):
        Sampling(**kwargs)


def _expected_windows(sampling: Sampling, steps: int, window: int, skip_first: int = 0):
    """Cycle starts a session must pick: the first opening step, then the next one after each
    window has ended (windows do not overlap)."""
    starts, n = [], 0
    while n < steps:
        if n >= skip_first and sampling.opens(n - skip_first):
            starts.append(n)
            n += window
        else:
            n += 1
    return starts


# ------------------------------------------------------------------ sessions


def test_every_n_steps_opens_windows_forever_until_max_windows():
    mem = InMemoryExporter()
    with session(schedule=Schedule(warmup=1, active=2), every=5, max_windows=3, exporters=[mem]):
        for _ in range(40):
            train_step()
    assert [r.steps for r in mem.reports] == [(1, 2), (6, 7), (11, 12)]
    assert [r.ranges["train_step"].calls for r in mem.reports] == [2, 2, 2]


def test_sample_rate_windows_are_the_ones_the_pure_function_names():
    mem = InMemoryExporter()
    sched = Schedule(warmup=1, active=2, skip_first=3)
    with session(schedule=sched, sample_rate=0.05, seed=11, exporters=[mem]) as s:
        for i in range(600):
            train_step()
            if i % 10 == 0:
                s.flush()  # windows this close together would overflow the export queue
    starts = _expected_windows(Sampling(sample_rate=0.05, seed=11), 600, 3, skip_first=3)
    starts = [s for s in starts if s + 2 < 600]  # windows that finished inside the run
    assert len(starts) >= 10
    assert [r.steps for r in mem.reports] == [(s + 1, s + 2) for s in starts]


def test_rate_zero_opens_nothing_and_leaves_calls_idle():

    mem = InMemoryExporter()
    with session(sample_rate=0.0, exporters=[mem]):
        train_step()
        assert process_status().calls_idle  # no window can ever open: calls skip all bookkeeping
        for _ in range(20):
            train_step()
    assert mem.reports == []


def test_min_interval_spaces_windows_in_time():
    mem = InMemoryExporter()
    with session(
        schedule=Schedule(warmup=0, active=1), every=1, min_interval_s=3600, exporters=[mem]
    ):
        for _ in range(30):
            train_step()
    assert [r.steps for r in mem.reports] == [(0,)]


def test_configure_fields_reach_the_ambient_session():
    mem = InMemoryExporter()
    configure(exporters=[mem], schedule=Schedule(warmup=1, active=1), every=4, max_windows=2)
    for _ in range(20):
        train_step()
    flush()
    assert [r.steps for r in mem.reports] == [(1,), (5,)]


def test_every_shorter_than_a_window_raises_in_code_and_warns_from_the_environment():
    with pytest.raises(ValueError, match="shorter than one window"):
        Config(schedule=Schedule(warmup=1, active=3), every=2)
    with pytest.warns(ConfigWarning, match="PROFILED_EVERY=2 is shorter than one window"):
        config = Config.from_env({"PROFILED_EVERY": "2"})
    assert config.every == 4
    with pytest.raises(ValueError, match="PROFILED_STRICT"):
        Config.from_env({"PROFILED_EVERY": "2", "PROFILED_STRICT": "1"})


@pytest.mark.parametrize(
    "var, raw, field, default",
    [
        ("PROFILED_EVERY", "0", "every", None),
        ("PROFILED_EVERY", "ten", "every", None),
        ("PROFILED_SAMPLE_RATE", "2", "sample_rate", 1.0),
        ("PROFILED_SAMPLE_RATE", "nan", "sample_rate", 1.0),
        ("PROFILED_MAX_WINDOWS", "-1", "max_windows", None),
        ("PROFILED_MIN_INTERVAL_S", "-5", "min_interval_s", 0.0),
        ("PROFILED_SEED", "1.5", "seed", 0),
        ("PROFILED_TRIGGER", "SIGNOPE", "trigger", None),
        ("PROFILED_EXPORT_TIMEOUT_S", "0", "export_timeout_s", 10.0),
    ],
)
def test_bad_sampling_environment_values_warn_and_use_the_default(var, raw, field, default):
    with pytest.warns(ConfigWarning, match=var):
        config = Config.from_env({var: raw})
    assert getattr(config, field) == default


def test_good_sampling_environment_values():
    config = Config.from_env(
        {
            "PROFILED_EVERY": "100",
            "PROFILED_SAMPLE_RATE": "0.25",
            "PROFILED_MAX_WINDOWS": "7",
            "PROFILED_MIN_INTERVAL_S": "1.5",
            "PROFILED_SEED": "-3",
            "PROFILED_TRIGGER": "usr2",
            "PROFILED_EXPORT_TIMEOUT_S": "2.5",
        }
    )
    assert (
        config.every,
        config.sample_rate,
        config.max_windows,
        config.min_interval_s,
        config.seed,
        config.trigger,
        config.export_timeout_s,
    ) == (100, 0.25, 7, 1.5, -3, "SIGUSR2", 2.5)
    assert (
        Config.from_env({"PROFILED_TRIGGER": "/tmp/x/profile-now"}).trigger == "/tmp/x/profile-now"
    )


PROGRAM = """
import json, sys
import torch
from instrument import profiled, shutdown
from exporters import InMemoryExporter
import instrument

mem = InMemoryExporter()
instrument.configure(exporters=[mem])

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

x = torch.randn(4, 4)
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 400):
    train_step(x)
shutdown()
print(json.dumps([list(r.steps) for r in mem.reports]))
"""


SEEDED = {
    "PROFILED_SAMPLE_RATE": "0.05",
    "PROFILED_EVERY": "5",
    "PROFILED_SCHEDULE": "warmup=1,active=2",
    "PROFILED_SEED": "42",
}
_SEEDS = ("42", "42", "43")  # twice the same seed, then another: three processes, run early
for _n, _seed in enumerate(_SEEDS):
    _early.add(
        __name__,
        f"test_processes_with_the_same_seed_open_the_same_windows#{_n}",
        *("-c", PROGRAM),
        env=_proc.sdk_env(SEEDED, PROFILED_SEED=_seed),
    )


def test_processes_with_the_same_seed_open_the_same_windows(request):
    """What makes ranks agree without talking: same seed, same steps, in separate processes."""
    runs = [_early.result(request, f"#{n}")[0] for n in range(2)]  # PROGRAM, seed 42 twice
    other = _early.result(request, "#2")[0]  # seed 43
    for out in (*runs, other):
        assert out.returncode == 0, out.stderr
    steps = [json.loads(out.stdout) for out in runs]
    assert steps[0] == steps[1] and len(steps[0]) >= 2
    assert json.loads(other.stdout) != steps[0]
    starts = _expected_windows(Sampling(every=5, sample_rate=0.05, seed=42), 400, 3)
    assert steps[0] == [[s + 1, s + 2] for s in starts if s + 2 < 400]
