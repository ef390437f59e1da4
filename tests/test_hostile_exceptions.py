"""Issue 29, item 11: whatever an exporter's exception does when it is described (its
``repr()`` or ``str()`` raises, returns no string or megabytes, its class hides attributes,
its ``__del__`` raises), its lane lives on, ``flush()`` with no timeout returns, the exporter's
later windows are exported and exit does not wait for the deadline.

Each case is a real program: before the fix the lane's thread died on the warning's
formatting, ``flush()`` never returned (the child says "flush hung" after 60 s) and exit
waited the whole export deadline.
"""

from __future__ import annotations

import json

from tests import _early, _proc

PROGRAM = r"""
import sys, threading, time, warnings
import torch
import instrument
from exporters import Exporter, ExportResult, InMemoryExporter
from instrument import Schedule, profiled

CASE = ""


class Boom(Exception):
    pass


class ReprRaises(Exception):
    def __repr__(self):
        raise Boom("no repr")


class StrRaises(Exception):
    def __str__(self):
        raise Boom("no str")

    def __repr__(self):
        raise Boom("no repr either")


class ReprNotStr(Exception):
    def __repr__(self):
        return 42


class HugeRepr(Exception):
    def __repr__(self):
        return "x" * 20_000_000


class Opaque(Exception):
    def __getattribute__(self, name):
        raise Boom("no attribute " + name)

    def __repr__(self):
        raise Boom("no repr")


class BadArg:
    def __repr__(self):
        raise Boom("an argument's repr")


class ClassRaises(BaseException):
    # a BaseException that is no Exception: isinstance() would ask __class__
    @property
    def __class__(self):
        raise Boom("no __class__")

    def __repr__(self):
        raise Boom("no repr")


class DelRaises(Exception):
    def __repr__(self):
        raise Boom("no repr")

    def __del__(self):
        raise Boom("no del")


class ReprRaisesHostile(Exception):
    # its repr raises an exception whose own repr raises: nothing may describe the second
    def __repr__(self):
        raise ReprRaises()


def make():
    return {
        "repr": lambda: ReprRaises(),
        "str": lambda: StrRaises(),
        "repr-not-str": lambda: ReprNotStr(),
        "huge-repr": lambda: HugeRepr(),
        "opaque": lambda: Opaque(),
        "arg-repr": lambda: Exception(BadArg()),
        "base-class-raises": lambda: ClassRaises(),
        "del-raises": lambda: DelRaises(),
        "repr-raises-hostile": lambda: ReprRaisesHostile(),
    }[CASE]()


class Hostile(Exporter):
    def __init__(self):
        self.seen = []

    def export(self, report):
        if report.window == 0:
            raise make()
        self.seen.append(report.window)
        return ExportResult.SUCCESS

    def export_metrics(self, report):
        raise make()

    def shutdown(self):
        raise make()


x = torch.randn(4, 4)


@profiled("train_step", step=True)
def train_step():
    return x @ x


for CASE in sys.argv[1:]:
    hostile, memory = Hostile(), InMemoryExporter()
    instrument.configure(
        exporters=[hostile, memory],
        schedule=Schedule(warmup=0, active=1, repeat=3),
        activities=["cpu"],
        export_timeout_s=30,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(4):
            train_step()
        done = threading.Event()
        flusher = threading.Thread(target=lambda: (instrument.flush(), done.set()), daemon=True)
        flusher.start()
        if not done.wait(30):
            print(CASE, "flush hung", flush=True)
            import os
            os._exit(3)
        print(CASE, "SEEN", hostile.seen, [r.window for r in memory.reports], flush=True)
        start = time.monotonic()
        instrument.shutdown()
        print(CASE, "SHUTDOWN", round(time.monotonic() - start, 3), flush=True)
"""

CASES = [
    "repr",
    "str",
    "repr-not-str",
    "huge-repr",
    "opaque",
    "arg-repr",
    "base-class-raises",
    "del-raises",
    "repr-raises-hostile",
]


def test_no_exception_an_exporter_raises_kills_its_lane_or_hangs_flush(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = _proc.run(str(script), *CASES, cwd=tmp_path, timeout=300)
    assert "flush hung" not in out.stdout, out.stdout + out.stderr[-3000:]
    assert out.returncode == 0, out.stderr[-3000:]
    said = {}
    for line in out.stdout.splitlines():
        case, what, rest = line.split(" ", 2)
        said[case, what] = rest
    for case in CASES:
        # the hostile exporter's own lane lived on to export windows 1 and 2; the other got all
        assert said[case, "SEEN"] == "[1, 2] [0, 1, 2]", (case, out.stdout)
        # shutdown did not sit out the 30 s deadline (the lane answered its shutdown job); a
        # bound 3x below the deadline, far above what a busy box needs
        assert float(said[case, "SHUTDOWN"]) < 10, (case, out.stdout)
    # the warnings stayed bounded in size, whatever the exceptions' repr returned
    assert len(out.stderr) < 200_000


HOSTILE_REPRS = r"""
import warnings, time
from exporters import Exporter
from instrument.export.pipeline import export_report
from instrument.base.report import WindowReport

class ReprRaises(Exception):
    def __repr__(self):
        raise ValueError("no repr")

class Huge(Exception):
    def __repr__(self):
        return "y" * 5_000_000

class Bad(Exporter):
    def __init__(self, exc):
        self.exc = exc
    def export(self, report):
        raise self.exc

now = time.time_ns()
report = WindowReport(window=0, steps=(0,), partial=False, start_ns=now - 1, end_ns=now,
    rank=0, world_size=1, host="h", pid=1, device="cpu", activities=("cpu",))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    export_report(report, [Bad(ReprRaises()), Bad(Huge())])
import json
print(json.dumps([str(w.message) for w in caught]))
"""
_early.add(
    __name__,
    "test_the_warning_names_a_hostile_exception_by_its_class",
    *("-c", HOSTILE_REPRS),
    env=_proc.sdk_env(),
)


def test_the_warning_names_a_hostile_exception_by_its_class(request):
    """Through ``export_report`` on the caller's thread: the hostile exception costs one
    warning that names its class, never an exception into the caller."""
    out, _cwd = _early.result(request)  # HOSTILE_REPRS
    assert out.returncode == 0, out.stderr
    messages = json.loads(out.stdout)
    assert len(messages) == 2, messages
    assert "raised ReprRaises (its repr() raised) on window 0" in messages[0]
    assert "(5000000 characters)" in messages[1] and len(messages[1]) < 1000
