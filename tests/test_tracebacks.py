"""A decorated function's traceback reads as the undecorated one's (issue 29, item 6).

Every traceback through a decorated call used to gain up to five library frames (wrapper,
``_call``, ``_timed``, ``_call``, ``ranged_call``). The wrappers now leave the call path's
frames out as the exception leaves the SDK: the same exception object, its cause and context
untouched, the program's own frames all kept. Every call form, in every state a call can be in.
"""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn

import instrument
from instrument import Schedule, instrument_module, profiled
from instrument.testing import capture
from tests.conftest import counting_ambient

SDK = os.path.dirname(os.path.abspath(instrument.__file__)) + os.sep


class Boom(Exception):
    pass


def _deep(n: int) -> None:
    """Two frames of the program's own below the decorated body."""
    if n:
        _deep(n - 1)
        return
    try:
        {}["missing"]
    except KeyError as cause:
        raise Boom("bad batch") from cause


def _forms() -> dict[str, Callable[[], object]]:
    @profiled("function")
    def function():
        _deep(1)

    class Thing:
        @profiled("method")
        def method(self):
            _deep(1)

        @profiled("static")
        @staticmethod
        def static():
            _deep(1)

    class Obj:
        def __call__(self):
            _deep(1)

    class AsyncObj:
        async def __call__(self):
            _deep(1)

    obj, aobj = profiled("callable")(Obj()), profiled("async callable")(AsyncObj())

    @profiled("async")
    async def coro():
        _deep(1)

    @profiled("generator")
    def gen():
        yield 1
        _deep(1)

    @profiled("async generator")
    async def agen():
        yield 1
        _deep(1)

    async def drain():
        return [v async for v in agen()]

    def context():
        with profiled("context"):
            _deep(1)

    async def acontext():
        async with profiled("async context"):
            _deep(1)

    @profiled("module class")
    class Block(nn.Module):
        def forward(self, x):
            _deep(1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = nn.Identity()

        def forward(self, x):
            _deep(1)

    net = Net()
    instrument_module(net)
    block = Block()

    return {
        "function": function,
        "method": lambda: Thing().method(),
        "staticmethod": Thing.static,
        "callable": obj,
        "async callable": lambda: asyncio.run(aobj()),
        "async": lambda: asyncio.run(coro()),
        "generator": lambda: list(gen()),
        "async generator": lambda: asyncio.run(drain()),
        "context": context,
        "async context": lambda: asyncio.run(acontext()),
        "module class": lambda: block(torch.ones(1)),
        "instrument_module": lambda: net(torch.ones(1)),
    }


@contextmanager
def _state(name: str) -> Iterator[Callable[[], None]]:
    """Calls made in ``name``'s state; yields what ends a step there."""
    if name == "idle":
        yield lambda: None
    elif name == "counting":  # root calls end steps: the depth-tracking path
        with counting_ambient() as sess:
            yield sess.step
    elif name == "metrics":
        instrument.configure(metrics=True, schedule=Schedule(skip_first=10**6))
        yield instrument.step
    elif name == "own profiler":
        with torch.profiler.profile():
            yield lambda: None
    else:  # the SDK's window records
        with capture(schedule=Schedule(wait=0, warmup=0, active=100)) as cap:
            yield cap.step


def _sdk_frames(exc: BaseException) -> list[str]:
    return [
        f"{os.path.basename(fs.filename)}:{fs.name}"
        for fs in traceback.extract_tb(exc.__traceback__)
        if os.path.abspath(fs.filename).startswith(SDK)
    ]


@pytest.mark.parametrize("state", ["idle", "counting", "metrics", "own profiler", "sdk window"])
def test_no_sdk_frame_in_a_decorated_calls_traceback(state):
    forms = _forms()
    with _state(state) as step:
        for _ in range(2):  # the first call of a process takes the session's first-call path
            for form, call in forms.items():
                with pytest.raises(Boom) as info:
                    call()
                exc = info.value
                assert _sdk_frames(exc) == [], (state, form)
                # the program's own frames are all there, innermost last
                names = [fs.name for fs in traceback.extract_tb(exc.__traceback__)]
                assert names[-2:] == ["_deep", "_deep"], (state, form, names)
                assert isinstance(exc.__cause__, KeyError) and exc.__context__ is exc.__cause__
                assert "instrument" + os.sep not in "".join(traceback.format_exception(exc))
            step()


def test_the_same_exception_object_with_its_chain_comes_out():
    err = Boom("mine")
    err.__cause__ = ValueError("cause")

    @profiled("raises")
    def raises():
        raise err

    with pytest.raises(Boom) as info:
        raises()
    assert info.value is err and info.value.__cause__ is err.__cause__


def test_an_error_of_the_call_itself_keeps_the_frames_that_raised_it():
    """A call the function cannot take raises in our frame: nothing of the program's is below
    it, so nothing is hidden (the frame that raised stays)."""

    @profiled("takes_none")
    def takes_none():
        return 1

    with pytest.raises(TypeError) as info:
        takes_none(1)  # type: ignore[call-arg]
    assert _sdk_frames(info.value)
