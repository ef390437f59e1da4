"""Range names torch cannot record as given (issue 29, item 8).

torch hands a range's name to C++ as UTF-8: a name with a surrogate (``os.fsdecode`` of a file
name that is not UTF-8, a lone half of a pair) made every recorded call raise
``RuntimeError: error unpacking string as utf-8`` before its body ran, and a NUL cut the
recorded name short. Names are made safe once, where they are given: every call form, with
no profiler, the program's own torch.profiler and the SDK's window, in a real program.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest

from instrument import profiled
from instrument.runtime import _torch
from instrument.runtime.decorator import range_name
from tests import _early, _proc

SURROGATE = os.fsdecode(b"load-\xff.bin")
NAMES = {
    "surrogate_escape": SURROGATE,
    "lone_high": "hi-\ud800-x",
    "lone_low": "lo-\udc00-x",
    "nul": "nul-\x00-x",
    "long": "L" * (1 << 20),
}


def test_names_become_escapes_of_what_they_stand_for():
    assert _torch.safe_name(SURROGATE) == "load-%FF.bin"
    assert _torch.safe_name("hi-\ud800-x") == "hi-%uD800-x"
    assert _torch.safe_name("lo-\udc00-x") == "lo-%uDC00-x"
    assert _torch.safe_name("nul-\x00-x") == "nul-%00-x"
    long = _torch.safe_name("L" * (1 << 20))
    assert len(long) == _torch.MAX_NAME and long.startswith("L" * 1000)
    assert long != _torch.safe_name("L" * (1 << 20) + "M")  # cut names stay apart
    for plain in ("matmul", "é😀 ü", "a\tb", "x" * _torch.MAX_NAME):
        assert _torch.safe_name(plain) is plain  # safe names pass through, same object
    for name in NAMES.values():
        safe = _torch.safe_name(name)
        safe.encode("utf-8")  # would raise for a surrogate
        assert "\x00" not in safe
        assert _torch.safe_name(safe) == safe


def test_the_name_is_made_safe_where_it_is_given():
    with warnings.catch_warnings():  # said once per process (the programs below check it)
        warnings.simplefilter("ignore")
        assert profiled(SURROGATE).name == "load-%FF.bin"
        assert range_name("nul-\x00") == "nul-%00"


PROGRAM = r"""
import asyncio, json, os, warnings
import torch
from torch import nn
import instrument
from instrument import Schedule, instrument_module, profiled
from instrument.runtime._torch import safe_name
from instrument.testing import capture

NAMES = {
    "surrogate_escape": os.fsdecode(b"load-\xff.bin"),
    "lone_high": "hi-\ud800-x",
    "lone_low": "lo-\udc00-x",
    "nul": "nul-\x00-x",
    "long": "L" * (1 << 20),
}
ran = []


def forms(name):
    '''Every call form, decorated (or built) with ``name``: each returns 7 when called.'''

    def plain(x):
        ran.append("function")
        return x + 1

    class Thing:
        def method(self, x):
            ran.append("method")
            return x + 1

    class Callable:
        def __call__(self, x):
            ran.append("callable")
            return x + 1

    async def coro(x):
        ran.append("async")
        return x + 1

    def gen(x):
        ran.append("generator")
        yield x + 1

    async def agen(x):
        ran.append("async generator")
        yield x + 1

    def nameless(x):
        ran.append("qualname")
        return x + 1

    nameless.__qualname__ = name

    class Block(nn.Module):
        def forward(self, x):
            ran.append("module class")
            return x + 1

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module(name.replace(".", "_"), nn.Identity())

        def forward(self, x):
            ran.append("instrument_module")
            for m in self.children():
                x = m(x)
            return x + 1

    Thing.method = profiled(name)(Thing.method)
    fn, obj = profiled(name)(plain), profiled(name)(Callable())
    co, ge, ag = profiled(name)(coro), profiled(name)(gen), profiled(name)(agen)
    nl = profiled(nameless)
    block = profiled(name)(Block)()
    model = Model()
    instrument_module(model, prefix=name)

    def context(x):
        with profiled(name):  # a run-time name: made safe where it is constructed
            ran.append("context")
            return x + 1

    async def acontext(x):
        async with profiled(name):
            ran.append("async context")
            return x + 1

    async def collect(x):
        return [v async for v in ag(x)]

    return {
        "function": lambda: fn(6),
        "method": lambda: Thing().method(6),
        "callable": lambda: obj(6),
        "async": lambda: asyncio.run(co(6)),
        "generator": lambda: next(ge(6)),
        "async generator": lambda: asyncio.run(collect(6))[0],
        "qualname": lambda: nl(6),
        "module class": lambda: block(torch.tensor(6)).item(),
        "instrument_module": lambda: model(torch.tensor(6)).item(),
        "context": lambda: context(6),
        "async context": lambda: asyncio.run(acontext(6)),
    }


with warnings.catch_warnings(record=True) as told:
    warnings.simplefilter("always")
    built = {key: forms(name) for key, name in NAMES.items()}
told = [str(w.message) for w in told if "cannot be recorded as given" in str(w.message)]

out = {"told": len(told), "results": {}, "user": {}, "sdk": {}}


def call_all(state):
    for key, calls in built.items():
        for form, call in calls.items():
            del ran[:]
            try:
                result = call()
            except Exception as exc:
                result = repr(exc)[:200]
            out["results"][f"{state} {key} {form}"] = [result, list(ran)]


call_all("idle")
with torch.profiler.profile() as prof:
    call_all("user")
events = {e.name for e in prof.events()}
every_step = Schedule(wait=0, warmup=0, active=1, repeat=0)
with capture(schedule=every_step) as cap:
    call_all("sdk")
    cap.step()
    cap.session.flush(120)
ranges = set(cap.reports[0].ranges) if cap.reports else set()
for key, name in NAMES.items():
    safe = safe_name(name)
    out["user"][key] = safe in events
    out["sdk"][key] = safe in ranges
print("RESULT " + json.dumps(out))
"""


_early.add(
    __name__,
    "test_every_call_form_runs_and_records_names_torch_cannot_take_as_given",
    *("-c", PROGRAM),
    env=_proc.sdk_env(),
    timeout=300,
)


def test_every_call_form_runs_and_records_names_torch_cannot_take_as_given(request):
    proc, _cwd = _early.result(request)  # PROGRAM
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    forms = {
        "function",
        "method",
        "callable",
        "async",
        "generator",
        "async generator",
        "qualname",
        "module class",
        "instrument_module",
        "context",
        "async context",
    }
    results = out["results"]
    assert len(results) == 3 * len(NAMES) * len(forms)
    for what, (result, ran) in results.items():
        form = what.split(" ", 2)[2]
        assert result == 7, what  # the body ran and its value came back: no exception
        assert ran == [form], what
    assert out["user"] == dict.fromkeys(NAMES, True)  # in the program's own profile
    assert out["sdk"] == dict.fromkeys(NAMES, True)  # in the SDK's window report
    assert out["told"] == 1  # one warning for the process, not one per name or call


@pytest.mark.parametrize("name", list(NAMES))
def test_a_safe_name_is_recorded_by_torch(name):
    import torch

    safe = _torch.safe_name(NAMES[name])
    with torch.profiler.profile() as prof:
        profiled(NAMES[name])(lambda: None)()
    assert safe in {e.name for e in prof.events()}
