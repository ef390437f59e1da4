"""One declaration per setting: the table in docs/configuration.md, ``Config``, the environment and
``configure()`` all come from ``SETTINGS``, and the OTel exporter's settings are read without
``instrument``."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import instrument
from exporters import otel_settings
from instrument import Config, ConfigWarning
from instrument.base.settings import STRICT, Setting, integer
from instrument.cli import settings_table
from instrument.runtime import config as config_mod
from instrument.runtime.config import ENV_VARS, FIELDS, SETTINGS
from instrument.testing import forget_warnings

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _forget_config_warnings():
    forget_warnings()
    yield
    forget_warnings()


def _from_env(env: dict[str, str]) -> tuple[Config, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = Config.from_env(env)
    return config, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


# ---------------------------------------------------------------- the table in docs/


def test_the_documented_table_is_the_declarations():
    """Fails when a declaration and the table in docs/configuration.md differ: run
    ``python -m instrument.cli.settings_table --write``."""
    assert settings_table.DOC == REPO / "docs" / "configuration.md"
    assert settings_table.check(), (
        "docs/configuration.md's table of PROFILED_* variables differs from "
        "instrument/runtime/config.py's SETTINGS; run: "
        "python -m instrument.cli.settings_table --write"
    )
    text = settings_table.DOC.read_text(encoding="utf-8")
    block = text.split(settings_table.START)[1].split(settings_table.END)[0]
    for var in ENV_VARS:
        assert block.count(f"| `{var}` |") == 1, var


def test_the_check_fails_on_a_drifted_page_and_write_repairs_only_the_table(tmp_path, capsys):
    page = tmp_path / "configuration.md"
    original = settings_table.DOC.read_text(encoding="utf-8")
    row = "| `PROFILED_TRACE_KEEP` | `20` |"
    assert row in original
    page.write_text(original.replace(row, "| `PROFILED_TRACE_KEEP` | `10` |"), encoding="utf-8")
    assert settings_table.main(["--check", "--doc", str(page)]) == 1
    assert "--write" in capsys.readouterr().err
    assert settings_table.main(["--write", "--doc", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == original
    assert settings_table.main(["--check", "--doc", str(page)]) == 0
    # a page without the markers is an error, not a silent pass
    page.write_text("# no table here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="settings:start"):
        settings_table.check(page)


def test_the_table_shows_each_declaration_as_declared():
    extra = Setting("answer", "PROFILED_ANSWER", 42, doc="a | b", **integer(0))
    table = settings_table.render((*SETTINGS, extra))
    assert table.endswith("| `PROFILED_ANSWER` | `42` | a \\| b |\n")  # a pipe cannot split it
    lines = settings_table.render().splitlines()
    assert lines[:2] == ["| variable | default | meaning |", "| --- | --- | --- |"]
    assert len(lines) == 2 + len(SETTINGS)
    assert "| `PROFILED_EVERY` | unset |" in table and "| `PROFILED_ACTIVITIES` | `auto` |" in table
    assert "| `PROFILED_PARENT_PID` | set by the SDK |" in table


def test_the_module_runs_as_a_program():
    out = subprocess.run(
        [sys.executable, "-m", "instrument.cli.settings_table", "--check"],
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------- Config from the declarations


def test_the_otel_detail_setting_accepts_exactly_the_reports_detail_levels():
    from instrument.base.report import DETAILS

    assert otel_settings.OTEL_DETAILS == DETAILS
    assert otel_settings.DETAIL.doc.count("`") >= 2 * len(DETAILS)
    for level in DETAILS:
        assert f"`{level}`" in otel_settings.DETAIL.doc


def test_every_config_field_is_declared_with_its_default():
    by_name = {s.name: s for s in SETTINGS}
    default = Config()
    assert FIELDS == tuple(f.name for f in dataclasses.fields(Config))
    for name in FIELDS:
        assert getattr(default, name) == by_name[name].default, name
    assert len(set(ENV_VARS)) == len(ENV_VARS) == len(SETTINGS)
    assert set(otel_settings.SETTINGS) <= set(SETTINGS) and STRICT in SETTINGS
    assert config_mod.PROFILED_TRACE_DIR == "PROFILED_TRACE_DIR"  # the old constants' names
    with pytest.raises(AttributeError):
        config_mod.PROFILED_NO_SUCH_THING  # noqa: B018


@pytest.mark.parametrize(
    "setting",
    [s for s in SETTINGS if s.parse is not None and s.name != "trigger"],
    ids=lambda s: s.env,
)
def test_each_default_as_written_reads_back_as_the_default(setting):
    """The default a warning names (``using the default PROFILED_X=...``) is a value the
    variable takes. Not ``PROFILED_TRIGGER``: its default is written ``unset``, which is no
    trigger to set (leave the variable out)."""
    assert setting.value(setting.default_text) == setting.default


# (field, a value in code, the same value as environment text)
REFUSED = [
    ("trace_keep", -1, "-1"),
    ("every", 0, "0"),
    ("max_windows", 0, "0"),
    ("sample_rate", 1.5, "1.5"),
    ("min_interval_s", 604801, "604801"),
    ("min_interval_s", float("inf"), "inf"),
    ("export_timeout_s", 0, "0"),
    ("export_timeout_s", float("nan"), "nan"),
    ("trace_max_mb", 1048577, "1048577"),
    ("activities", ["gpu"], "gpu"),
    ("trigger", "SIGTERM", "SIGTERM"),
    ("ranks", "4-2", "4-2"),
]


@pytest.mark.parametrize(("field", "value", "text"), REFUSED)
def test_a_value_configure_refuses_is_refused_from_the_environment(field, value, text):
    setting = next(s for s in SETTINGS if s.name == field)
    with pytest.raises(ValueError):
        instrument.configure(**{field: value})
    config, messages = _from_env({setting.env: text})
    assert getattr(config, field) == setting.default
    assert len(messages) == 1 and f"{setting.env}={text!r} is invalid" in messages[0]
    assert f"using the default {setting.env}={setting.default_text}" in messages[0]
    with pytest.raises(ValueError, match="PROFILED_STRICT=1"):
        Config.from_env({setting.env: text, "PROFILED_STRICT": "1"})


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("trace_keep", 0, "0"),
        ("every", 4, "4"),
        ("sample_rate", 0.25, "0.25"),
        ("min_interval_s", 604800.0, "604800"),
        ("export_timeout_s", 3600.0, "3600"),
        ("trace_max_mb", 0.5, "0.5"),
        ("activities", ("cuda", "cpu"), "cuda,cpu"),
        ("trigger", "SIGUSR1", "usr1"),
    ],
)
def test_a_value_configure_takes_is_taken_from_the_environment(field, value, text):
    setting = next(s for s in SETTINGS if s.name == field)
    config, messages = _from_env({setting.env: text})
    assert messages == [] and getattr(config, field) == value
    assert getattr(Config(**{field: value}), field) == value


def test_the_every_rule_is_one_rule_for_code_and_environment():
    schedule = instrument.Schedule(warmup=2, active=3)
    with pytest.raises(ValueError, match="every=4 is shorter than one window"):
        Config(schedule=schedule, every=4)
    assert Config(schedule=schedule, every=5).every == 5
    config, messages = _from_env({"PROFILED_SCHEDULE": schedule.to_env(), "PROFILED_EVERY": "4"})
    assert config.every == 5 and len(messages) == 1
    assert "PROFILED_EVERY=4 is shorter than one window" in messages[0]
    assert "using PROFILED_EVERY=5" in messages[0]


# ---------------------------------------------------------------- the OTel exporter's settings


def _instrument_and_torch_modules_after(code: str) -> list[str]:
    code += "print(sorted(m for m in sys.modules if m.split('.')[0] in ('instrument', 'torch')))\n"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_otel_settings_are_read_with_no_more_of_instrument_than_its_lazy_face():
    """The settings live in ``instrument.base``, whose package face loads no torch and no
    runtime beyond the trigger's handler and the settings it reads."""
    face = _instrument_and_torch_modules_after("import sys, instrument\n")
    assert "torch" not in face and "instrument.runtime.decorator" not in face, face
    code = (
        "import sys, warnings\n"
        "from exporters.otel_settings import otel_settings_from_env\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    got = otel_settings_from_env({'PROFILED_OTEL_DETAIL': 'OPS',\n"
        "                                  'PROFILED_OTEL_MAX_SPANS': 'many'})\n"
        "assert got == ('ops', 1000), got\n"
        "assert [w.category.__name__ for w in caught] == ['ConfigWarning'], caught\n"
    )
    used = _instrument_and_torch_modules_after(code)
    assert set(used) <= set(face) | {m for m in used if m.startswith("instrument.base.")}, used


def test_otel_settings_warn_with_the_sdks_config_warning():
    assert issubclass(ConfigWarning, UserWarning)
    with pytest.warns(ConfigWarning, match="PROFILED_OTEL_MAX_SPANS='0' is invalid"):
        assert otel_settings.otel_settings_from_env({"PROFILED_OTEL_MAX_SPANS": "0"}) == (
            "ranges",
            1000,
        )


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, lazily or not: ``from pkg import mod`` counts as
    ``pkg.mod`` where that module exists (relative imports resolved in the file's package)."""
    package = ".".join(path.parent.relative_to(REPO).parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(p for p in ((package if node.level else ""), node.module or "") if p)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if (REPO / (sub.replace(".", "/") + ".py")).exists() else base)
    return found


def test_the_settings_leaves_import_nothing_from_instrument_but_its_base():
    for path in (
        REPO / "instrument" / "base" / "settings.py",
        REPO / "exporters" / "otel_settings.py",
    ):
        imported = _imported_modules(path)
        ours = {m for m in imported if m.split(".")[0] == "instrument"}
        assert all(m.startswith("instrument.base.") for m in ours), (path.name, imported)
    # and config takes from exporters only the OTel exporter's settings (the registry is the
    # callers')
    from_exporters = {
        m
        for m in _imported_modules(REPO / "instrument" / "runtime" / "config.py")
        if m.split(".")[0] == "exporters"
    }
    assert from_exporters == {"exporters.otel_settings"}, from_exporters
