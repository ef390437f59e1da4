"""Names and switches (issue 29, item 4): a ``PROFILED_*`` name that is no setting warns (it
used to be ignored silently, even with ``PROFILED_STRICT=1``: ``PROFILED_ENABLE=0`` left
profiling on, ``PROFILED_EXPORTER=json`` wrote nothing), and a ``PROFILED_ENABLED`` that
cannot be read turns profiling off (it used to warn and stay on: the switch failed open)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from instrument import Config, ConfigWarning
from instrument.runtime import config as config_mod
from instrument.runtime.config import ENV_VARS, SETTINGS
from instrument.testing import forget_warnings
from tests import _proc

REPO = Path(__file__).resolve().parent.parent

# a program that says what its decorator returned, and how many windows it opened
PROGRAM = r"""
import sys
from exporters import InMemoryExporter
from instrument import profiled, step
import instrument

def work(x):
    return x + 1

wrapped = profiled("work")(work)
print("decorator returned the function itself:", wrapped is work, flush=True)

@profiled("more")  # a second decorator: no second warning
def more():
    return 2

for i in range(6):
    wrapped(1)
    more()
    step()
instrument.shutdown()
print("done", flush=True)
"""

BASE_ENV = {"PROFILED_EXPORTERS": "console", "PROFILED_EVERY": "4", "PROFILED_ACTIVITIES": "cpu"}

# a misspelt name -> the setting it was meant to be
MISSPELT = {
    "PROFILED_ENABLE": "PROFILED_ENABLED",
    "PROFILED_EXPORTER": "PROFILED_EXPORTERS",
    "profiled_every": "PROFILED_EVERY",  # lower case: a setting's name still
    "PROFILED_TRACEDIR": "PROFILED_TRACE_DIR",
    "PROFILED_OTEL_MAXSPANS": "PROFILED_OTEL_MAX_SPANS",  # an exporter's setting too
    "PROFILED_PARENTPID": "PROFILED_PARENT_PID",  # the one the SDK sets itself
}


STRICT_WRONG = ["PROFILED_ENABLE", "PROFILED_EXPORTER", "PROFILED_XYZZY"]
UNREADABLE = ["flase", "2", ""]
COMPILE_CASES = {
    "bad-name": (
        "PROFILED_EXPORTR",
        "json",
        "PROFILED_EXPORTR='json' is not a torch-profiled setting",
    ),
    "bad-switch": ("PROFILED_ENABLED", "flase", "PROFILED_ENABLED='flase' is invalid"),
}


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """This module's programs, each in its own process as before (its settings are read as it
    starts), run two at a time as the module starts; a test reads its own."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:

        def add(key: str, code: str, **env: str) -> None:
            ahead.add(key, "-c", code, env=_proc.sdk_env({**BASE_ENV, **env}))

        misspelt = {**dict.fromkeys(MISSPELT, "0"), "PROFILED_XYZZY": "1"}
        misspelt["PROFILED_EXPORTER"] = "json"
        add("test_misspelt_names_warn_once_each_naming_the_setting_meant", PROGRAM, **misspelt)
        for wrong in STRICT_WRONG:
            key = f"test_strict_makes_a_misspelt_name_an_error[{wrong}]"
            add(key, PROGRAM, **{wrong: "0", "PROFILED_STRICT": "1"})
        for bad in UNREADABLE:
            key = f"test_an_unreadable_enabled_switch_turns_profiling_off[{bad}]"
            add(key + "#0", PROGRAM, PROFILED_ENABLED=bad)
            add(key + "#1", PROGRAM, PROFILED_ENABLED=bad, PROFILED_STRICT="1")
        for case, (var, value, _said) in COMPILE_CASES.items():
            key = f"test_a_bad_name_or_switch_does_not_break_a_fullgraph_compile[{case}]"
            add(key, COMPILED_FIRST, **{var: value})
        yield ahead


def _config_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "ConfigWarning" in line]


def test_misspelt_names_warn_once_each_naming_the_setting_meant(ahead, request):
    result, _cwd = ahead[request.node.name]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done" in result.stdout
    warned = _config_warnings(result.stderr)
    assert len(warned) == len(MISSPELT) + 1, warned  # once each, for two decorators and calls
    for wrong, meant in MISSPELT.items():
        line = next(w for w in warned if f"{wrong}=" in w)
        assert "is not a torch-profiled setting" in line and f"did you mean {meant}?" in line
        assert line.endswith("it is ignored")
    assert any("PROFILED_XYZZY='1' is not a torch-profiled setting" in w for w in warned)
    # the misspelt ones changed nothing: still on, still the console (no json file)
    assert "decorator returned the function itself: False" in result.stdout
    assert "torch-profiled | window" in result.stdout + result.stderr


@pytest.mark.parametrize("wrong", STRICT_WRONG)
def test_strict_makes_a_misspelt_name_an_error(ahead, request, wrong):
    result, _cwd = ahead[request.node.name]  # PROGRAM with {wrong}=0 and PROFILED_STRICT=1
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ValueError: {wrong}='0' is not a torch-profiled setting")
    assert "PROFILED_STRICT=1 makes this an error" in last
    assert "decorator returned" not in result.stdout  # raised when the decorator was applied


@pytest.mark.parametrize("bad", UNREADABLE)
def test_an_unreadable_enabled_switch_turns_profiling_off(ahead, request, bad):
    result, _cwd = ahead[request.node.name + "#0"]  # PROGRAM with PROFILED_ENABLED={bad}
    assert result.returncode == 0, result.stderr[-3000:]
    assert "decorator returned the function itself: True" in result.stdout  # off, and free
    assert "torch-profiled | window" not in result.stdout + result.stderr
    warned = _config_warnings(result.stderr)
    assert len(warned) == 1, warned
    assert f"PROFILED_ENABLED={bad!r} is invalid" in warned[0]
    assert "using PROFILED_ENABLED=0 (profiling off" in warned[0]
    strict, _cwd = ahead[request.node.name + "#1"]  # and PROFILED_STRICT=1
    assert strict.returncode == 1
    last = strict.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ValueError: PROFILED_ENABLED={bad!r} is invalid")
    assert "During handling" not in strict.stderr  # the one error, not a chained parse


def test_every_setting_is_a_known_name_and_no_second_list_exists():
    """The names come from ``SETTINGS`` alone: every declared variable (the exporters' and the
    one the SDK sets itself included) is quiet, and every ``PROFILED_*`` name the README,
    the docs, examples and the SDK's code mention is a declared one."""
    env = {s.env: s.default_text for s in SETTINGS if s.parse is not None}
    env["PROFILED_PARENT_PID"] = "1"
    env["PROFILED_ENABLED"] = "1"
    forget_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config_mod.check_names(env, strict=True)  # raises on any unknown name
        Config.from_env(env)
    assert not [w for w in caught if "not a torch-profiled setting" in str(w.message)]
    mentioned: set[str] = set()
    files = [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("examples/*.py")]
    files += [*REPO.glob("instrument/**/*.py"), *REPO.glob("exporters/**/*.py")]
    for path in files:
        mentioned.update(re.findall(r"\bPROFILED_[A-Z][A-Z0-9_]*", path.read_text("utf-8")))
    assert mentioned and mentioned <= set(ENV_VARS), sorted(mentioned - set(ENV_VARS))


def test_names_warn_once_per_name_and_value_in_process():
    forget_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            Config.from_env({"PROFILED_SAMPLE": "0.5"})
        Config.from_env({"PROFILED_SAMPLE": "0.25"})  # another value: said again
        Config.from_env({"PROFILED_" + "Q" * 100_000: "1"})  # a huge name: a short message
    messages = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(messages) == 3, messages
    assert "did you mean PROFILED_SAMPLE_RATE?" in messages[0]
    assert len(messages[2]) < 400 and "no setting has a name like it" in messages[2]


COMPILED_FIRST = r"""
import torch
from instrument import profiled

def fn(x):
    with profiled("compiled.block"):  # the first use of the SDK: inside compiled code
        return x.sin()

compiled = torch.compile(fn, backend="eager", fullgraph=True)
x = torch.randn(4)
assert torch.allclose(compiled(x), x.sin())
assert torch.allclose(fn(x), x.sin())  # eager: says it now
print("both ran", flush=True)
"""


@pytest.mark.parametrize("case", COMPILE_CASES)
def test_a_bad_name_or_switch_does_not_break_a_fullgraph_compile(ahead, request, case):
    """The checks run where the first decorator is applied; a ``with profiled(...)`` inside
    ``torch.compile(fullgraph=True)`` code is such a place, and a warning cannot be traced
    there: the first eager use says it instead."""
    result, _cwd = ahead[request.node.name]  # COMPILED_FIRST with {var}={value}
    _var, _value, said = COMPILE_CASES[case]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "both ran" in result.stdout
    assert result.stderr.count(said) == 1, result.stderr[-3000:]
