"""No SDK warning ever raises into the program, not even with ``python -W error``; warnings
point at the program's own line, not into the library."""

from __future__ import annotations

import os
import warnings

import instrument
from exporters import ExporterWarning, InMemoryExporter
from instrument import ConfigWarning, Schedule, profiled
from instrument.base.warn import warn
from tests import _early, _proc

BAD_VALUE = (
    "from instrument import profiled\n"
    "@profiled('f')\n"
    "def f():\n"
    "    return 41 + 1\n"
    "print('result', f())\n"
)
_early.add(
    __name__,
    "test_bad_environment_value_under_warnings_as_errors",
    *("-c", BAD_VALUE),
    env=_proc.sdk_env(PROFILED_EVERY="abc", PROFILED_EXPORTERS="memory", PYTHONWARNINGS="error"),
)


def test_bad_environment_value_under_warnings_as_errors(request):
    """A bad ``PROFILED_*`` value is one plain stderr line; the first decorated call returns."""
    result, _cwd = _early.result(request)  # BAD_VALUE, PROFILED_EVERY=abc, -W error
    assert result.returncode == 0, result.stderr
    assert "result 42" in result.stdout
    lines = [ln for ln in result.stderr.splitlines() if "PROFILED_EVERY" in ln]
    assert len(lines) == 1 and lines[0].startswith("torch-profiled: ConfigWarning: "), lines
    assert "Traceback" not in result.stderr


USER_ERROR = (
    "import time, instrument\n"
    "from exporters import Exporter, ExportResult\n"
    "class Slow(Exporter):\n"
    "    def export(self, report):\n"
    "        time.sleep(1.5)\n"
    "        return ExportResult.SUCCESS\n"
    "    def shutdown(self):\n"
    "        pass\n"
    "@instrument.profiled('work')\n"
    "def work():\n"
    "    return 1\n"
    "try:\n"
    "    with instrument.session(exporters=[Slow()], export_timeout_s=0.2,\n"
    "                            schedule=instrument.Schedule(active=1),\n"
    "                            activities=['cpu']) as s:\n"
    "        work(); s.step(); work(); s.step()\n"
    "        raise ValueError('the user error')\n"
    "except BaseException as exc:\n"
    "    print('caught', type(exc).__name__, exc, type(exc.__context__).__name__)\n"
)
_early.add(
    __name__,
    "test_the_users_exception_is_not_replaced_by_an_sdk_warning",
    *("-c", USER_ERROR),
    env=_proc.sdk_env(PYTHONWARNINGS="error"),
)


def test_the_users_exception_is_not_replaced_by_an_sdk_warning(request):
    """A session that ends while the user's ValueError propagates, and whose export misses its
    deadline (a warning), still lets that ValueError through, unchanged, under ``-W error``."""
    result, _cwd = _early.result(request)  # USER_ERROR: a 1.5 s export against 0.2 s
    assert result.returncode == 0, result.stderr
    assert "caught ValueError the user error NoneType" in result.stdout
    assert "torch-profiled: ExporterWarning: " in result.stderr


def test_config_warning_points_at_the_programs_line(monkeypatch):
    monkeypatch.setenv("PROFILED_EVERY", "not-a-number")

    @profiled("f")
    def f():
        return 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f()
    config_warnings = [w for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(config_warnings) == 1
    assert config_warnings[0].filename == __file__  # the line that called f(), not the SDK


def test_a_warning_from_an_export_lane_names_the_sdk_line_that_warned():
    """No frame of the program's on an export lane's stack: the warning names the SDK's own
    file and line (a real one, which ``-W ignore:::MODULE`` filters can match)."""
    from instrument.testing import capture

    class Broken(InMemoryExporter):
        def export(self, report):
            raise RuntimeError("backend down")

    @profiled("k")
    def k():
        return 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(exporters=[Broken()], schedule=Schedule(active=1), activities=["cpu"]) as cap:
            for _ in range(2):  # step 0 warms up, step 1 is recorded
                k()
                cap.step()
        instrument.flush()
    lane = [w for w in caught if "backend down" in str(w.message)]
    assert [(w.category, os.path.basename(w.filename)) for w in lane] == [
        (ExporterWarning, "pipeline.py")
    ]
    assert lane[0].lineno > 0 and os.path.isfile(lane[0].filename)


def test_warn_never_raises_and_says_it_once(capfd):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            warn("exporting failed", ExporterWarning)  # would raise with warnings.warn
    err = capfd.readouterr().err
    assert err.count("torch-profiled: ExporterWarning: exporting failed\n") == 1
