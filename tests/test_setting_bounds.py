"""Numbers and counts at their edges (issue 29, item 19): ``PROFILED_METRICS_INTERVAL_S=1e-9``
was accepted, and its export thread never slept. The class: every numeric setting is probed
with zero, negatives, nan, infinities, ``1e-9``, ``1e300`` and an integer too large for 64
bits; each probe is either refused (one warning naming the variable, the value and the value
used; ``PROFILED_STRICT=1`` raises) or accepted as a finite value that this table says is
meant."""

from __future__ import annotations

import math
import warnings

import pytest

from instrument import ConfigWarning
from instrument.base.settings import INT64_MAX
from instrument.runtime import config as config_mod
from instrument.runtime.config import MIN_METRICS_INTERVAL_S, SETTINGS
from instrument.testing import forget_warnings
from tests._records import metrics_records

PROBES = ("0", "-1", "nan", "inf", "-inf", "1e-9", "1e300", "9" * 30, str(INT64_MAX + 1))

# the probes each numeric setting accepts, on purpose (everything else is refused)
ACCEPTED = {
    "PROFILED_PEAK_TFLOPS": {"1e-9"},  # a silly MFU, nothing waits or grows on it
    "PROFILED_TRACE_KEEP": {"0"},  # 0 keeps all
    "PROFILED_TRACE_MAX_MB": {"0", "1e-9"},  # 0: no limit; tiny: every trace removed, warned
    "PROFILED_OTEL_MAX_SPANS": set(),
    "PROFILED_EVERY": set(),
    "PROFILED_SAMPLE_RATE": {"0", "1e-9"},
    "PROFILED_MAX_WINDOWS": set(),
    "PROFILED_MIN_INTERVAL_S": {"0", "1e-9"},  # no spacing between windows
    "PROFILED_SEED": {"0", "-1"},
    "PROFILED_SLOW_STEP": set(),
    "PROFILED_EXPORT_TIMEOUT_S": {"1e-9"},  # the exit waits for nothing, and says what it lost
    "PROFILED_METRICS_INTERVAL_S": set(),  # at least 0.1: each export takes the GIL
    "PROFILED_METRICS_DEVICE_EVERY": {"0"},  # 0: off
    "PROFILED_OVERHEAD_BUDGET": {"0", "1e-9"},  # 0: no budget; tiny: every window backs off
    "PROFILED_METRICS_MAX_RANGES": set(),
}


def _numeric(setting) -> bool:
    for text in ("2", "0.5"):
        try:
            value = setting.value(text)
        except (TypeError, ValueError):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
    return False


def test_the_table_covers_every_numeric_setting():
    numeric = {s.env for s in SETTINGS if s.parse is not None and _numeric(s)}
    assert numeric == set(ACCEPTED)


@pytest.mark.parametrize("var", sorted(ACCEPTED))
def test_every_edge_value_is_refused_or_meant(var):
    setting = next(s for s in SETTINGS if s.env == var)
    for probe in PROBES:
        forget_warnings()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = setting.read({var: probe}, strict=False)
        ours = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
        if probe in ACCEPTED[var]:
            assert ours == [], (var, probe, ours)
            assert value is not None and math.isfinite(value), (var, probe, value)
            assert setting.value(probe) == value
        else:
            assert len(ours) == 1, (var, probe, value)
            assert f"{var}={probe!r} is invalid" in ours[0]
            assert f"using the default {var}={setting.default_text}" in ours[0]
            assert value == setting.default
            with pytest.raises(ValueError, match="PROFILED_STRICT=1 makes this an error"):
                setting.read({var: probe}, strict=True)


def test_values_in_code_have_the_same_bounds():
    for fields in (
        {"metrics_interval_s": 1e-9},
        {"metrics_interval_s": MIN_METRICS_INTERVAL_S / 2},
        {"trace_keep": INT64_MAX + 1},
        {"seed": -INT64_MAX - 2},
        {"max_windows": 10**30},
    ):
        with pytest.raises(ValueError, match=next(iter(fields))):
            config_mod.Config(**fields)
    config = config_mod.Config(metrics_interval_s=MIN_METRICS_INTERVAL_S, seed=-INT64_MAX - 1)
    assert config.metrics_interval_s == 0.1


PROGRAM = r"""
import time
from instrument import profiled
import instrument

@profiled("tick")
def tick():
    time.sleep(0.002)

for _ in range(200):  # about half a second of calls: with 1e-9 the exports never slept
    tick()
instrument.shutdown()
print("done", flush=True)
"""


def test_a_metrics_interval_below_the_floor_exports_at_the_default_interval(run_python, tmp_path):
    out = tmp_path / "metrics.jsonl"
    env = {
        "PROFILED_EXPORTERS": "json",
        "PROFILED_JSON_PATH": str(out),
        "PROFILED_METRICS": "1",
        "PROFILED_SAMPLE_RATE": "0",  # metrics only, no window
        "PROFILED_METRICS_INTERVAL_S": "1e-9",
    }
    result = run_python(PROGRAM, env=env)
    assert result.returncode == 0 and "done" in result.stdout, result.stderr[-3000:]
    warned = [line for line in result.stderr.splitlines() if "ConfigWarning" in line]
    assert len(warned) == 1 and "PROFILED_METRICS_INTERVAL_S='1e-9' is invalid" in warned[0]
    assert "using the default PROFILED_METRICS_INTERVAL_S=60" in warned[0]
    records = metrics_records(out.read_text())
    # the default interval (60 s) never passes here: the exit's record alone (was: hundreds)
    assert len(records) == 1, len(records)
    assert sum(r["ranges"]["tick"]["count"] for r in records) == 200


@pytest.mark.parametrize("key", ["wait", "warmup", "active", "repeat", "skip_first"])
def test_schedule_step_counts_fit_64_bits(key):
    """``PROFILED_SCHEDULE``'s keys are counts too: ``active=99999999999999999999999`` was
    kept (a window that never ends); past 64 bits is refused like every integer setting."""
    from instrument import Schedule

    forget_warnings()
    for text in (str(INT64_MAX + 1), "9" * 30):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            config = config_mod.Config.from_env({"PROFILED_SCHEDULE": f"{key}={text}"})
        ours = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
        assert config.schedule == Schedule() and len(ours) == 1, ours
        assert f"<= {INT64_MAX}" in ours[0]
    with pytest.raises(ValueError, match=key):
        config_mod.Config(schedule=Schedule(**{key: INT64_MAX + 1}))
    fine = Schedule(**{key: INT64_MAX})
    assert config_mod.Config(schedule=fine).schedule == fine
