"""Interrupts inside an instrumented model's forward while a profiler records (issue 29, item 2).

torch runs ``always_call`` forward hooks only for ``Exception``: a ``KeyboardInterrupt`` (or a
timeout library's ``BaseException``) leaves the interrupted modules' ranges open, and the next
forward closes them (``module._close_stale``). Those ranges began in a profiler that may have
ended since: they must be ended through ``_torch.range_exit`` like every range of the SDK.
Real programs: a real SIGINT sent by a timer thread, and a signal handler that raises, at four
places (a leaf's forward three modules deep, the model's own forward, a user's forward
pre-hook, a user's forward hook), with the SDK's windows recording and with the program's own
torch.profiler recording; then more forwards, whose ranges must be whole in the next window.
"""

from __future__ import annotations

import json

import pytest

from tests import _early, _proc

PROGRAM = r"""
import json, os, signal, sys, threading, time
import torch
from torch import nn
from instrument import Schedule, instrument_module
from instrument.runtime import decorator as _decorator
from instrument.runtime import module as _module
from instrument.testing import capture

MODE = sys.argv[1]


class Deadline(BaseException):
    '''What a timeout library raises from its signal handler (not an Exception).'''


def _deadline(signum, frame):
    raise Deadline()


signal.signal(signal.SIGUSR1, _deadline)
HOW = {"sigint": (signal.SIGINT, KeyboardInterrupt), "handler": (signal.SIGUSR1, Deadline)}
ARMED = {"where": None, "sig": None}


def interrupt_here(where):
    '''Block until a timer thread's signal interrupts the main thread, here.'''
    if ARMED["where"] != where:
        return
    ARMED["where"] = None
    threading.Timer(0.01, os.kill, (os.getpid(), ARMED["sig"])).start()
    end = time.monotonic() + 60
    while time.monotonic() < end:
        time.sleep(0.001)
    raise SystemExit("the signal never came")


class Leaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        interrupt_here("leaf.forward")
        return self.fc(x)


class Mid(nn.Module):
    def __init__(self):
        super().__init__()
        self.leaf = Leaf()

    def forward(self, x):
        return self.leaf(x)


class Top(nn.Module):
    def __init__(self):
        super().__init__()
        self.mid = Mid()
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        x = self.mid(x)
        interrupt_here("top.forward")
        return self.head(x)


model = Top()
instrument_module(model)
model.mid.register_forward_pre_hook(lambda m, a: interrupt_here("mid.pre_hook"))
model.mid.leaf.register_forward_hook(lambda m, a, o: interrupt_here("leaf.hook"))
NAMES = ("Top", "mid", "mid.leaf", "mid.leaf.fc", "head")
CASES = [
    (where, how)
    for where in ("leaf.forward", "top.forward", "mid.pre_hook", "leaf.hook")
    for how in HOW
]
x = torch.randn(2, 4)


def interrupted(where, how):
    sig, exc = HOW[how]
    ARMED["where"], ARMED["sig"] = where, sig
    try:
        model(x)
    except exc:
        return True
    return False


def clean():
    return _module._STACK.get() == () and _decorator._DEPTH.get() == 0


out = {"cases": []}
if MODE == "sdk":
    every_step = Schedule(wait=0, warmup=0, active=1, repeat=0)
    with capture(schedule=every_step) as cap:
        for where, how in CASES:
            ok = interrupted(where, how)
            model(x)  # closes the interrupted ranges in the window they began in
            tidy = clean()
            ok = interrupted(where, how) and ok
            cap.step()  # that window ends with ranges open; the next one starts
            model(x)  # closes them: begun under the last window's profiler, never ended
            tidy = clean() and tidy
            model(x)
            cap.step()
            cap.session.flush(60)  # (the analysis queue holds 8 windows)
            out["cases"].append([where, how, ok, tidy])
        reports = list(cap.reports)
    out["windows"] = len(reports)
    out["dropped"] = cap.session.dropped
    out["calls"] = [
        {n: (r.ranges[n].calls if n in r.ranges else 0) for n in NAMES} for r in reports[1::2]
    ]
else:
    out["calls"] = []
    for where, how in CASES:
        with torch.profiler.profile() as first:
            ok = interrupted(where, how)
        with torch.profiler.profile() as second:
            model(x)  # closes ranges begun under the first profiler: never ended in this one
            tidy = clean()
            model(x)
        names = [e.name for e in second.events()]
        out["calls"].append({n: names.count(n) for n in NAMES})
        out["cases"].append([where, how, ok, tidy])
print("RESULT " + json.dumps(out))
"""


MODES = ["sdk", "user"]
for _mode in MODES:  # each its own program, run early (tests/_early.py)
    _early.add(
        __name__,
        f"test_interrupted_forwards_under_a_recording_profiler_leave_later_forwards_whole[{_mode}]",
        *("-c", PROGRAM, _mode),
        env=_proc.sdk_env(),
        timeout=300,
    )


def _run(request) -> dict:
    proc, _cwd = _early.result(request)  # PROGRAM in the test's mode
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.parametrize("mode", MODES)
def test_interrupted_forwards_under_a_recording_profiler_leave_later_forwards_whole(request, mode):
    out = _run(request)
    cases = out["cases"]
    assert len(cases) == 8
    for where, how, interrupted, tidy in cases:
        assert interrupted, (where, how)  # the program's own exception reached it
        assert tidy, (where, how)  # the next forward closed every stale range and depth
    whole = {n: 2 for n in ("Top", "mid", "mid.leaf", "mid.leaf.fc", "head")}
    if mode == "sdk":
        assert out["windows"] == 16  # no window lost: the interrupted ones are exported too
    assert out["calls"] == [whole] * 8
