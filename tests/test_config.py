"""Configuration: every PROFILED_* variable, configure(), and Schedule against torch's own table."""

from __future__ import annotations

import itertools
import pickle
import tracemalloc
import warnings

import pytest
import torch.profiler

import instrument
import instrument.testing
from instrument import Config, ConfigWarning, Schedule
from instrument.runtime.ranks import MAX_TERMS, RankSet
from instrument.runtime.sampling import Action
from instrument.testing import forget_warnings
from tests import _early, _proc

DEFAULT_SCHEDULE_ENV = "wait=0,warmup=1,active=3,repeat=1,skip_first=0"

BOOL_VARS = {
    "PROFILED_ENABLED": "enabled",
    "PROFILED_RECORD_SHAPES": "record_shapes",
    "PROFILED_PROFILE_MEMORY": "profile_memory",
    "PROFILED_WITH_STACK": "with_stack",
    "PROFILED_WITH_FLOPS": "with_flops",
    "PROFILED_TRACE_GZIP": "trace_gzip",
    "PROFILED_STRICT": "strict",
}
TRUE_SPELLINGS = ["1", "true", "TRUE", "True", "yes", "YES", "Yes", "on", "ON", "oN", " on "]
FALSE_SPELLINGS = ["0", "false", "FALSE", "False", "no", "NO", "No", "off", "OFF", "Off", " 0 "]

# (variable, bad value, field, the README default as it must appear in the message)
BAD_VALUES = [
    ("PROFILED_RECORD_SHAPES", "y", "record_shapes", "0"),
    ("PROFILED_PROFILE_MEMORY", "enable", "profile_memory", "0"),
    ("PROFILED_WITH_STACK", "-1", "with_stack", "0"),
    ("PROFILED_WITH_FLOPS", "t", "with_flops", "0"),
    ("PROFILED_PEAK_TFLOPS", "0", "peak_tflops", "unset"),
    ("PROFILED_PEAK_TFLOPS", "-3", "peak_tflops", "unset"),
    ("PROFILED_PEAK_TFLOPS", "fast", "peak_tflops", "unset"),
    ("PROFILED_PEAK_TFLOPS", "inf", "peak_tflops", "unset"),
    ("PROFILED_TRACE_GZIP", "gz", "trace_gzip", "1"),
    ("PROFILED_TRACE_KEEP", "-1", "trace_keep", "20"),
    ("PROFILED_TRACE_KEEP", "ten", "trace_keep", "20"),
    ("PROFILED_TRACE_KEEP", "2.5", "trace_keep", "20"),
    ("PROFILED_TRACE_DIR", "   ", "trace_dir", "./profiled_traces"),
    ("PROFILED_SCHEDULE", "active=0", "schedule", DEFAULT_SCHEDULE_ENV),
    ("PROFILED_ACTIVITIES", "bogus", "activities", "auto"),
    # absurd values (issue 15, item 5): past a documented bound, inf, nan
    ("PROFILED_TRACE_MAX_MB", "1e303", "trace_max_mb", "1024"),
    ("PROFILED_TRACE_MAX_MB", "1048577", "trace_max_mb", "1024"),
    ("PROFILED_TRACE_MAX_MB", "inf", "trace_max_mb", "1024"),
    ("PROFILED_TRACE_MAX_MB", "nan", "trace_max_mb", "1024"),
    ("PROFILED_EXPORT_TIMEOUT_S", "1e300", "export_timeout_s", "10"),
    ("PROFILED_EXPORT_TIMEOUT_S", "3601", "export_timeout_s", "10"),
    ("PROFILED_EXPORT_TIMEOUT_S", "inf", "export_timeout_s", "10"),
    ("PROFILED_EXPORT_TIMEOUT_S", "nan", "export_timeout_s", "10"),
    ("PROFILED_MIN_INTERVAL_S", "1e300", "min_interval_s", "0"),
    ("PROFILED_MIN_INTERVAL_S", "604801", "min_interval_s", "0"),
    ("PROFILED_MIN_INTERVAL_S", "inf", "min_interval_s", "0"),
    # a factor of the median step time (issue 17, item 4): more than 1, at most 1000
    ("PROFILED_SLOW_STEP", "1", "slow_step", "unset"),
    ("PROFILED_SLOW_STEP", "0.5", "slow_step", "unset"),
    ("PROFILED_SLOW_STEP", "fast", "slow_step", "unset"),
    ("PROFILED_SLOW_STEP", "1001", "slow_step", "unset"),
    ("PROFILED_SLOW_STEP", "inf", "slow_step", "unset"),
    ("PROFILED_SLOW_STEP", "nan", "slow_step", "unset"),
    ("PROFILED_RANKS", "0-4000000000", "ranks", "all"),
    ("PROFILED_RANKS", "2147483648", "ranks", "all"),
    ("PROFILED_RANKS", "1-99999999999999999999999", "ranks", "all"),
    # signals a trigger must never take over (item 14)
    ("PROFILED_TRIGGER", "SIGTERM", "trigger", "unset"),
    ("PROFILED_TRIGGER", "SIGINT", "trigger", "unset"),
    ("PROFILED_TRIGGER", "SIGKILL", "trigger", "unset"),
    ("PROFILED_TRIGGER", "segv", "trigger", "unset"),
    ("PROFILED_TRIGGER", "SIGCHLD", "trigger", "unset"),
    ("PROFILED_TRIGGER", "HUP", "trigger", "unset"),
    ("PROFILED_TRIGGER", "SIGQUIT", "trigger", "unset"),
    ("PROFILED_TRIGGER", "SIGPIPE", "trigger", "unset"),
    ("PROFILED_TRIGGER", "SIGALRM", "trigger", "unset"),
    # always-on metrics (issue 17)
    ("PROFILED_METRICS", "maybe", "metrics", "auto"),
    ("PROFILED_METRICS", "2", "metrics", "auto"),
    ("PROFILED_METRICS_INTERVAL_S", "0", "metrics_interval_s", "60"),
    ("PROFILED_METRICS_INTERVAL_S", "-5", "metrics_interval_s", "60"),
    ("PROFILED_METRICS_INTERVAL_S", "86401", "metrics_interval_s", "60"),
    ("PROFILED_METRICS_INTERVAL_S", "inf", "metrics_interval_s", "60"),
    ("PROFILED_METRICS_INTERVAL_S", "soon", "metrics_interval_s", "60"),
    ("PROFILED_METRICS_MODULES", "all", "metrics_modules", "0"),
    ("PROFILED_METRICS_DEVICE_EVERY", "-1", "metrics_device_every", "100"),
    ("PROFILED_METRICS_DEVICE_EVERY", "often", "metrics_device_every", "100"),
    ("PROFILED_METRICS_DEVICE_EVERY", "2.5", "metrics_device_every", "100"),
    ("PROFILED_PROMETHEUS_ADDR", "9464", "prometheus_addr", "127.0.0.1:9464"),
    ("PROFILED_PROMETHEUS_ADDR", "localhost:99999", "prometheus_addr", "127.0.0.1:9464"),
]


@pytest.fixture(autouse=True)
def _forget_config_warnings():
    """The once-per-(variable, value) memory is process-wide; each test starts without it."""
    forget_warnings()
    yield
    forget_warnings()


def from_env(env: dict[str, str]) -> tuple[Config, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = Config.from_env(env)
    return config, [w for w in caught if issubclass(w.category, ConfigWarning)]


# ---------------------------------------------------------------- environment: good values


def test_defaults_are_the_readme_table():
    config, caught = from_env({})
    assert caught == []
    assert config == Config()
    assert config.enabled is True
    assert config.exporters == ("console", "trace")
    assert config.schedule == Schedule(wait=0, warmup=1, active=3, repeat=1, skip_first=0)
    assert config.schedule.to_env() == DEFAULT_SCHEDULE_ENV
    assert config.activities is None  # auto
    assert (config.record_shapes, config.profile_memory, config.with_stack, config.with_flops) == (
        False,
        False,
        False,
        False,
    )
    assert config.trace_dir == "./profiled_traces"
    assert config.trace_gzip is True
    assert config.trace_keep == 20
    assert config.strict is False


@pytest.mark.parametrize("var", sorted(BOOL_VARS))
def test_boolean_variables_accept_every_documented_spelling(var):
    field = BOOL_VARS[var]
    for text in TRUE_SPELLINGS:
        config, caught = from_env({var: text})
        assert caught == [], (var, text)
        assert getattr(config, field) is True, (var, text)
    for text in FALSE_SPELLINGS:
        config, caught = from_env({var: text})
        assert caught == [], (var, text)
        assert getattr(config, field) is False, (var, text)


def test_valued_variables_parse():
    config, caught = from_env(
        {
            "PROFILED_EXPORTERS": " Console , MEMORY,trace ",
            "PROFILED_SCHEDULE": "wait=2, warmup=0, active=5, repeat=0, skip_first=7",
            "PROFILED_ACTIVITIES": "CPU, cuda",
            "PROFILED_TRACE_DIR": "/data/my traces",
            "PROFILED_TRACE_KEEP": "0",
        }
    )
    assert caught == []
    assert config.exporters == ("console", "memory", "trace")
    assert config.schedule == Schedule(wait=2, warmup=0, active=5, repeat=0, skip_first=7)
    assert config.activities == ("cpu", "cuda")
    assert config.trace_dir == "/data/my traces"
    assert config.trace_keep == 0
    assert from_env({"PROFILED_TRACE_KEEP": "5"})[0].trace_keep == 5


@pytest.mark.parametrize("text", ["", "none", "NONE", " None ", " , "])
def test_exporters_empty_or_none_means_no_exporters(text, monkeypatch):
    config, caught = from_env({"PROFILED_EXPORTERS": text})
    assert caught == []
    assert config.exporters == ()
    monkeypatch.setenv("PROFILED_EXPORTERS", text)
    sess = instrument.session()
    assert sess.config.exporters == ()
    assert sess.exporters == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("auto", None),
        ("AUTO", None),
        ("", None),
        ("cpu", ("cpu",)),
        ("cpu,cuda", ("cpu", "cuda")),
        ("cuda,cpu,cuda", ("cuda", "cpu")),
        ("xpu,mtia,hpu,privateuse1", ("xpu", "mtia", "hpu", "privateuse1")),
    ],
)
def test_activities_values(text, expected):
    config, caught = from_env({"PROFILED_ACTIVITIES": text})
    assert caught == []
    assert config.activities == expected


@pytest.mark.parametrize("text", ["bogus", "cpu,bogus", "gpu", ","])
def test_activities_bogus_warns_and_uses_auto(text):
    config, caught = from_env({"PROFILED_ACTIVITIES": text})
    assert config.activities is None
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "PROFILED_ACTIVITIES" in message and repr(text) in message
    assert "PROFILED_ACTIVITIES=auto" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("active=5", Schedule(active=5)),
        ("wait=2", Schedule(wait=2, warmup=1, active=3, repeat=1, skip_first=0)),
        ("repeat=0,skip_first=4", Schedule(repeat=0, skip_first=4)),
        (" warmup = 0 , ", Schedule(warmup=0)),
        ("", Schedule()),
        (DEFAULT_SCHEDULE_ENV, Schedule()),
    ],
)
def test_schedule_partial_keys_keep_defaults(text, expected):
    config, caught = from_env({"PROFILED_SCHEDULE": text})
    assert caught == []
    assert config.schedule == expected
    assert Schedule.parse(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "active=0",
        "foo=1",
        "wait=x",
        "wait=-1",
        "skip_first=-3",
        "repeat=-1",
        "active=1.5",
        "warmup",
        "=3",
        "wait=1,wait=2",
        "wait=",
        "active=3;wait=1",
    ],
)
def test_bad_schedules_are_invalid(text):
    with pytest.raises(ValueError):
        Schedule.parse(text)
    config, caught = from_env({"PROFILED_SCHEDULE": text})
    assert config.schedule == Schedule()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "PROFILED_SCHEDULE" in message and repr(text) in message
    assert f"PROFILED_SCHEDULE={DEFAULT_SCHEDULE_ENV}" in message


# ---------------------------------------------------------------- environment: bad values


@pytest.mark.parametrize(("var", "bad", "field", "default_text"), BAD_VALUES)
def test_bad_value_warns_once_and_uses_the_default(var, bad, field, default_text):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = Config.from_env({var: bad})
        second = Config.from_env({var: bad})  # same (variable, value): no second warning
    ours = [w for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    message = str(ours[0].message)
    assert var in message
    assert repr(bad) in message  # the value, quoted so that blanks show
    assert "default" in message and f"{var}={default_text}" in message
    assert getattr(first, field) == getattr(Config(), field)
    assert first == second == Config()


def test_once_per_variable_and_value_not_per_variable():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            Config.from_env({"PROFILED_TRACE_KEEP": "-1", "PROFILED_ENABLED": "maybe"})
        Config.from_env({"PROFILED_TRACE_KEEP": "-2"})  # another value of the same variable
    messages = sorted(str(w.message) for w in caught if issubclass(w.category, ConfigWarning))
    assert len(messages) == 3, messages
    assert sum("PROFILED_TRACE_KEEP='-1'" in m for m in messages) == 1
    assert sum("PROFILED_TRACE_KEEP='-2'" in m for m in messages) == 1
    assert sum("PROFILED_ENABLED='maybe'" in m for m in messages) == 1


def test_bad_value_in_os_environ_warns_once_across_from_env_calls(monkeypatch):
    monkeypatch.setenv("PROFILED_WITH_STACK", "sometimes")
    with pytest.warns(ConfigWarning, match="PROFILED_WITH_STACK='sometimes'") as record:
        assert Config.from_env().with_stack is False
        assert Config.from_env().with_stack is False
    assert len([w for w in record if issubclass(w.category, ConfigWarning)]) == 1


@pytest.mark.parametrize(("var", "bad", "field", "default_text"), BAD_VALUES)
@pytest.mark.parametrize("strict_text", ["1", "yes", "ON"])
def test_strict_raises_value_error_instead(var, bad, field, default_text, strict_text):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        with pytest.raises(ValueError) as info:
            Config.from_env({var: bad, "PROFILED_STRICT": strict_text})
    assert var in str(info.value) and repr(bad) in str(info.value)


def test_strict_with_good_values_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = Config.from_env(
            {"PROFILED_STRICT": "1", "PROFILED_TRACE_KEEP": "3", "PROFILED_SCHEDULE": "active=2"}
        )
    assert config.strict is True and config.trace_keep == 3
    assert config.schedule == Schedule(active=2)


def test_strict_rejects_unknown_exporter_names(monkeypatch):
    """The name check is the session's (the exporter registry is above ``Config``): the ambient
    configuration, which every session and decorated call starts from, raises."""
    monkeypatch.setenv("PROFILED_STRICT", "1")
    monkeypatch.setenv("PROFILED_EXPORTERS", "console,bogus")
    with pytest.raises(ValueError) as info:
        instrument.session()
    message = str(info.value)
    assert "PROFILED_EXPORTERS='console,bogus' is invalid" in message
    assert "PROFILED_EXPORTERS" in message and "bogus" in message
    assert all(name in message for name in ("console", "memory", "trace"))
    # without strict the name is kept: resolving the exporters warns and skips it
    config, caught = from_env({"PROFILED_EXPORTERS": "console,bogus"})
    assert config.exporters == ("console", "bogus") and caught == []


def test_bad_strict_value_warns_and_is_not_strict():
    config, caught = from_env({"PROFILED_STRICT": "please", "PROFILED_TRACE_KEEP": "x"})
    assert config.strict is False and config.trace_keep == 20
    assert len(caught) == 2


# ---------------------------------------------------------------- configure() in code


def test_configure_unknown_field_raises_type_error_naming_it():
    with pytest.raises(TypeError, match="trace_kep"):
        instrument.configure(trace_kep=3)
    with pytest.raises(TypeError, match="colour"):
        instrument.session(colour=True)
    with pytest.raises(TypeError, match="bogus"):
        Config().replace(bogus=1)


@pytest.mark.parametrize(
    ("fields", "error", "name"),
    [
        ({"enabled": "yes"}, TypeError, "enabled"),
        ({"record_shapes": 1}, TypeError, "record_shapes"),
        ({"profile_memory": None}, TypeError, "profile_memory"),
        ({"with_stack": "0"}, TypeError, "with_stack"),
        ({"with_flops": 1.0}, TypeError, "with_flops"),
        ({"trace_gzip": "no"}, TypeError, "trace_gzip"),
        ({"strict": 0}, TypeError, "strict"),
        ({"trace_keep": -1}, ValueError, "trace_keep"),
        ({"trace_keep": "3"}, TypeError, "trace_keep"),
        ({"trace_keep": True}, TypeError, "trace_keep"),
        ({"trace_dir": ""}, ValueError, "trace_dir"),
        ({"trace_dir": 3}, TypeError, "trace_dir"),
        ({"schedule": "wait=1"}, TypeError, "schedule"),
        ({"activities": ["cpu", "bogus"]}, ValueError, "activities"),
        ({"activities": []}, ValueError, "activities"),
        ({"exporters": [object()]}, TypeError, "exporters"),
        ({"exporters": [""]}, ValueError, "exporters"),
    ],
)
def test_configure_bad_value_raises_naming_the_field(fields, error, name):
    with pytest.raises(error, match=name):
        instrument.configure(**fields)
    # nothing was applied: the ambient configuration is still the environment's
    assert instrument.session().config == Config.from_env()


def test_schedule_values_are_checked_in_code():
    for bad in ({"active": 0}, {"wait": -1}, {"repeat": -2}, {"skip_first": -1}, {"warmup": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Schedule(**bad)
    for bad in ({"wait": 1.0}, {"active": "3"}, {"repeat": True}):
        with pytest.raises(TypeError, match=next(iter(bad))):
            Schedule(**bad)


def test_configure_unknown_exporter_name_lists_known_names():
    with pytest.raises(ValueError) as info:
        instrument.configure(exporters=["console", "bogus"])
    message = str(info.value)
    assert "bogus" in message
    assert all(name in message for name in ("console", "memory", "trace"))
    with pytest.raises(ValueError, match="bogus"):
        instrument.session(exporters=["bogus"])


def test_configure_overrides_the_environment(monkeypatch):
    monkeypatch.setenv("PROFILED_SCHEDULE", "active=2")
    monkeypatch.setenv("PROFILED_RECORD_SHAPES", "0")
    monkeypatch.setenv("PROFILED_TRACE_KEEP", "7")
    assert instrument.session().config.schedule == Schedule(active=2)

    instrument.configure(
        schedule=Schedule(wait=1, warmup=0, active=5),
        record_shapes=True,
        activities="cpu",
        exporters=["memory"],
    )
    sess = instrument.session()
    assert sess.config.schedule == Schedule(wait=1, warmup=0, active=5)
    assert sess.schedule == Schedule(wait=1, warmup=0, active=5)
    assert sess.config.record_shapes is True
    assert sess.config.activities == ("cpu",)
    assert sess.config.exporters == ("memory",)
    assert sess.config.trace_keep == 7  # not configured: still the environment's
    assert [type(e).__name__ for e in sess.exporters] == ["InMemoryExporter"]

    # arguments given to session() win over both
    explicit = instrument.session(record_shapes=False, with_stack=True)
    assert explicit.config.record_shapes is False and explicit.config.with_stack is True
    assert explicit.config.schedule == Schedule(wait=1, warmup=0, active=5)

    # reset() forgets configure(): back to the environment
    instrument.testing.reset()
    assert instrument.session().config.schedule == Schedule(active=2)
    assert instrument.session().config.record_shapes is False


def test_configure_accepts_auto_activities():
    instrument.configure(activities="auto")
    assert instrument.session().config.activities is None
    assert Config(activities=["CPU"]).activities == ("cpu",)
    assert Config(activities=torch.profiler.ProfilerActivity.CPU.name).activities == ("cpu",)
    assert Config(activities=[torch.profiler.ProfilerActivity.CPU]).activities == ("cpu",)


# ---------------------------------------------------------------- Schedule


def _torch_action_name(fn, step: int) -> str:
    return fn(step).name


def test_schedule_matches_torch_profiler_schedule():
    checked = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about warmup=0
        for wait, warmup, active, repeat, skip_first in itertools.product(
            range(3), range(3), range(1, 4), range(3), (0, 1, 4)
        ):
            ours = Schedule(
                wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first
            )
            theirs = torch.profiler.schedule(
                wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first
            )
            for step in range(61):
                assert ours.action(step).name == _torch_action_name(theirs, step), (ours, step)
                checked += 1
    assert checked == 3 * 3 * 3 * 3 * 3 * 61
    # every state of ours is one of torch's (torch also has DEVICE_STOPPED, which no
    # schedule returns)
    assert {a.name for a in Action} <= {a.name for a in torch.profiler.ProfilerAction}


def test_default_schedule_is_one_window_of_steps_1_to_3():
    s = Schedule()
    actions = [s.action(i) for i in range(8)]
    assert actions == [
        Action.WARMUP,
        Action.RECORD,
        Action.RECORD,
        Action.RECORD_AND_SAVE,
        Action.NONE,
        Action.NONE,
        Action.NONE,
        Action.NONE,
    ]
    assert s.last_step == 3
    assert not s.finished(3) and s.finished(4)


def test_repeat_zero_is_unlimited():
    s = Schedule(wait=1, warmup=1, active=2, repeat=0, skip_first=2)
    cycle = [Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE]
    for start in (2, 2 + 4 * 10, 2 + 4 * 250_000):
        assert [s.action(start + i) for i in range(4)] == cycle
    assert s.last_step is None
    assert not s.finished(0) and not s.finished(10**9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=0, skip_first=2)
    assert all(s.action(i).name == theirs(i).name for i in range(1000, 1100))


def test_finished_exactly_when_no_later_step_does_anything():
    for wait, warmup, active, repeat, skip_first in itertools.product(
        range(3), range(2), range(1, 3), range(1, 3), (0, 3)
    ):
        s = Schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
        assert s.last_step == skip_first + repeat * (wait + warmup + active) - 1
        assert s.action(s.last_step) is Action.RECORD_AND_SAVE
        for step in range(40):
            idle_from_here = all(s.action(t) is Action.NONE for t in range(step, 60))
            assert s.finished(step) == idle_from_here, (s, step)


def test_schedule_env_round_trip_and_negative_step():
    s = Schedule(wait=3, warmup=2, active=4, repeat=0, skip_first=9)
    assert Schedule.parse(s.to_env()) == s
    with pytest.raises(ValueError, match="step"):
        s.action(-1)


def test_next_active_agrees_with_action_everywhere():
    import itertools

    from instrument.runtime.sampling import Action

    for wait, warmup, active, repeat, skip in itertools.product(
        (0, 1, 3), (0, 1, 2), (1, 2), (0, 1, 2), (0, 2)
    ):
        sched = Schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip)
        for step in range(40):
            expected = next(
                (s for s in range(step, 80) if sched.action(s) is not Action.NONE), None
            )
            assert sched.next_active(step) == expected, (sched, step)


# ---------------------------------------------------------------- absurd values (issue 15, 5)


@pytest.mark.parametrize(
    ("var", "bad", "bound"),
    [
        ("PROFILED_TRACE_MAX_MB", "1e303", "<= 1048576 (1 TiB"),
        ("PROFILED_EXPORT_TIMEOUT_S", "1e300", "<= 3600 (seconds, at most one hour)"),
        ("PROFILED_MIN_INTERVAL_S", "1e300", "<= 604800 (seconds, at most one week)"),
        ("PROFILED_RANKS", "0-4000000000", "rank above 2147483647"),
        ("PROFILED_TRIGGER", "SIGTERM", "expected one of SIGUSR2, SIGUSR1"),
    ],
)
def test_absurd_values_say_what_was_expected(var, bad, bound):
    _, caught = from_env({var: bad})
    assert len(caught) == 1
    assert bound in str(caught[0].message)


def test_values_in_code_past_their_bounds_raise_at_once():
    for fields in (
        {"export_timeout_s": 1e300},
        {"export_timeout_s": float("inf")},
        {"export_timeout_s": 3601},
        {"min_interval_s": float("nan")},
        {"min_interval_s": 604801},
        {"trace_max_mb": 1e303},
        {"trace_max_mb": float("nan")},
        {"trace_max_mb": 10**400},
        {"ranks": range(4_000_000_000)},
        {"ranks": [2**31]},
        {"ranks": range(0, 2 * MAX_TERMS + 2, 2)},
        {"trigger": "SIGTERM"},
        {"trigger": "SIGSEGV"},
    ):
        with pytest.raises(ValueError, match=next(iter(fields))):
            Config(**fields)
    # the bounds themselves are fine
    config = Config(
        export_timeout_s=3600,
        min_interval_s=604800,
        trace_max_mb=1048576,
        ranks=range(2**31),
        trigger="USR1",
    )
    assert config.ranks.to_env() == "0-2147483647" and config.trigger == "SIGUSR1"


def test_rank_ranges_are_held_as_runs_never_one_entry_per_rank():
    """0-20000000 used to build a set of every rank (4.4 s, 2.5 GB at the first call)."""
    Config.from_env({})  # imports and first-use caches out of the measurement
    tracemalloc.start()
    try:
        config, caught = from_env({"PROFILED_RANKS": "0-2147483647"})
        ranks = config.ranks
        checks = [
            ranks.selects(0),
            ranks.selects(123_456_789),
            ranks.selects(2**31 - 1),
            not ranks.selects(2**31),
            2**31 - 1 in ranks,
        ]
        spelled = str(ranks)
        same = ranks == RankSet(range(2**31)) == pickle.loads(pickle.dumps(ranks))
        mixed = RankSet.parse("5-2000000000, 0, 3,2000000001-2147483647")
        refused, caught_refused = from_env({"PROFILED_RANKS": "0-4000000000"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak  # one int per rank would be gigabytes
    assert caught == [] and all(checks) and same
    assert spelled == "0-2147483647" and ranks.spans == ((0, 2**31 - 1),)
    assert str(mixed) == "0,3,5-2147483647" and not mixed.selects(4) and mixed.selects(3)
    assert refused.ranks == RankSet() and len(caught_refused) == 1


def test_too_many_rank_terms_is_a_bad_value():
    enough = ",".join(str(r) for r in range(0, 2 * MAX_TERMS, 2))  # MAX_TERMS terms
    config, caught = from_env({"PROFILED_RANKS": enough})
    assert caught == [] and len(config.ranks.spans) == MAX_TERMS
    assert RankSet.parse(str(config.ranks)) == config.ranks
    too_many = enough + f",{2 * MAX_TERMS}"
    config, caught = from_env({"PROFILED_RANKS": too_many})
    assert config.ranks == RankSet() and len(caught) == 1
    message = str(caught[0].message)
    assert f"at most {MAX_TERMS}" in message and "using the default PROFILED_RANKS=all" in message
    with pytest.raises(ValueError, match=f"at most {MAX_TERMS}"):
        Config.from_env({"PROFILED_RANKS": too_many, "PROFILED_STRICT": "1"})


HUGE = 1_000_000


@pytest.mark.parametrize(
    ("var", "bad"),
    [
        ("PROFILED_RANKS", "x" * HUGE),
        ("PROFILED_RANKS", "0-" + "9" * (HUGE - 2)),
        ("PROFILED_TRACE_MAX_MB", "9" * HUGE),
        ("PROFILED_EXPORT_TIMEOUT_S", "1" * HUGE),
        ("PROFILED_TRACE_KEEP", "7" * HUGE),
        ("PROFILED_TRIGGER", "Q" * HUGE),
    ],
)
def test_a_huge_value_makes_a_short_message(var, bad):
    config, caught = from_env({var: bad})
    assert config == Config() and len(caught) == 1
    message = str(caught[0].message)
    assert len(message) < 600, len(message)
    assert f"{var}={bad[:60]!r}...({HUGE} chars) is invalid" in message
    assert "using the default" in message
    with pytest.raises(ValueError) as info:
        Config.from_env({var: bad, "PROFILED_STRICT": "1"})
    assert len(str(info.value)) < 600 and f"...({HUGE} chars)" in str(info.value)


CRASH_PROGRAM = r"""
import os, resource, torch, instrument
from instrument import profiled

@profiled("step", step=True)
def step(x):
    return x @ x

x = torch.randn(4, 4)
step(x)
print("first call returned", flush=True)
for _ in range(5):
    step(x)
instrument.shutdown()
print("shutdown complete", sorted(os.listdir("traces")), flush=True)
print("peak MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, flush=True)
"""


ABSURD = [
    ("PROFILED_TRACE_MAX_MB", "1e303", True),  # was: OverflowError from the first decorated call
    ("PROFILED_EXPORT_TIMEOUT_S", "1e300", True),  # was: shutdown failed (OverflowError)
    ("PROFILED_RANKS", "0-4000000000", True),  # was: out of memory at the first call
    ("PROFILED_RANKS", "0-20000000", False),  # valid: was 4.4 s and 2.5 GB at the first call
]
for _var, _bad, _warns in ABSURD:  # each its own program, run early (tests/_early.py)
    _early.add(
        __name__,
        f"test_an_absurd_value_costs_one_warning_in_a_real_program[{_var}-{_bad}-{_warns}]",
        *("-c", CRASH_PROGRAM),
        env=_proc.sdk_env(
            {_var: _bad, "PROFILED_EXPORTERS": "trace", "PROFILED_TRACE_DIR": "traces"}
        ),
    )


@pytest.mark.parametrize(("var", "bad", "warns"), ABSURD)
def test_an_absurd_value_costs_one_warning_in_a_real_program(request, var, bad, warns):
    result, _cwd = _early.result(request)  # CRASH_PROGRAM with {var}={bad}
    assert result.returncode == 0, result.stderr
    assert "first call returned" in result.stdout
    assert "shutdown complete" in result.stdout and ".pt.trace.json" in result.stdout
    warned = [line for line in result.stderr.splitlines() if "ConfigWarning" in line]
    assert len(warned) == (1 if warns else 0), result.stderr
    if warns:
        assert f"{var}={bad!r} is invalid" in warned[0]
    for sign in ("Traceback", "OverflowError", "shutdown failed"):
        assert sign not in result.stderr, result.stderr
    # a bound on memory, not time: torch alone takes a few hundred MiB; one int per rank of
    # 0-20000000 took 2.5 GB
    peak = int(result.stdout.split("peak MiB")[1])
    assert peak < 1500, peak
