"""The ``@profiled`` contracts, checked against real torch.profiler windows (no mocks).

Every decorated target here is defined inside a test (after ``conftest`` has cleaned the
``PROFILED_*`` environment), except the module-level ones in ``tests/_targets.py`` that pickling
and spawned workers need.

Windows: ``recording()`` opens an explicit session whose single window records exactly the
code inside its ``with`` block (it declares steps itself, so root calls inside it end none).
``counting_ambient()`` is the ambient session of a program that declares no steps, the only
session where root calls end steps; it counts them and never opens a window.
The ``mode`` fixture runs a test four ways: ``idle`` (no session, no profiler: the wrapper's
fast path), ``counting`` (``counting_ambient()``: root calls end steps), ``declared`` (an
explicit session counts steps, no window ever opens: calls only report to it) and
``recording`` (inside a window, so every range is really recorded).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import multiprocessing
import pickle
import threading
import time
import warnings
from contextlib import contextmanager

import pytest
import torch

import instrument
from exporters import InMemoryExporter, TraceFileExporter
from instrument import ProfilerWarning, Schedule, profiled
from instrument.runtime import decorator as _decorator
from instrument.testing import capture
from tests import _targets
from tests.conftest import counting_ambient

# A ProfilerWarning means a window could not open/start/stop: in these tests that is a bug.
pytestmark = pytest.mark.filterwarnings("error::instrument.ProfilerWarning")

NEVER = Schedule(skip_first=10**6)  # a session that counts steps and never opens a window


def profiler_on() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled)


@contextmanager
def recording(**fields):
    """A session whose one window records exactly the block (steps are declared by hand)."""
    with capture(schedule=Schedule(wait=0, warmup=1, active=1), **fields) as cap:
        cap.step()  # step 0 (warm-up) ends: the window records step 1
        assert profiler_on()
        yield cap
        cap.step()  # step 1 ends: the window is saved
    assert len(cap.reports) == 1, cap.exporter.notices
    assert cap.reports[0].steps == (1,)


def trace_events(report, name=None):
    """Complete events of the trace file a TraceFileExporter wrote for ``report``."""
    assert report.trace_file, "no trace file was written"
    with open(report.trace_file, encoding="utf-8") as f:
        trace = json.load(f)
    return [
        ev
        for ev in trace["traceEvents"]
        if ev.get("ph") == "X" and (name is None or ev.get("name") == name)
    ]


@pytest.fixture(params=["idle", "counting", "declared", "recording"])
def mode(request):
    if request.param == "idle":
        instrument.shutdown()  # no session: decorated calls take the one-flag fast path
        assert _decorator._IDLE and not profiler_on()
        yield "idle"
        assert not profiler_on()
    elif request.param == "counting":
        with counting_ambient():  # root calls end steps: decorated calls keep their depth
            assert not _decorator._IDLE and not profiler_on()
            yield "counting"
            assert not profiler_on()
    elif request.param == "declared":
        with capture(schedule=NEVER):  # an explicit session: root calls end no step
            assert not _decorator._IDLE and not profiler_on()
            yield "declared"
            assert not profiler_on()
    else:
        with recording():
            yield "recording"
            assert profiler_on()


class Doubler:
    """Doubles numbers (a callable object)."""

    factor = 2

    def __call__(self, x):
        return x * self.factor


# ------------------------------------------------------------------------ forms and names


def test_every_form_records_its_range_under_its_name():
    q = "test_every_form_records_its_range_under_its_name.<locals>"

    @profiled
    def bare():
        return 1

    @profiled()
    def parens():
        return 2

    @profiled("given.name")
    def named():
        return 3

    class C:
        @profiled
        def method(self):
            return 4

        @profiled
        @classmethod
        def cm_above(cls):
            return 5

        @classmethod
        @profiled
        def cm_below(cls):
            return 6

        @profiled
        @staticmethod
        def sm_above():
            return 7

        @staticmethod
        @profiled("static.named")
        def sm_below():
            return 8

    @profiled
    async def coro():
        return 9

    @profiled
    def gen():
        yield 10

    @profiled
    async def agen():
        yield 11

    class Obj:
        def __call__(self):
            return 12

    obj = profiled(Obj())

    async def async_block():
        async with profiled("async.block"):
            pass
        return [x async for x in agen()]

    with recording() as cap:
        assert [bare(), parens(), named()] == [1, 2, 3]
        c = C()
        assert [c.method(), C.cm_above(), c.cm_below(), C.sm_above(), c.sm_below()] == [
            4,
            5,
            6,
            7,
            8,
        ]
        assert asyncio.run(coro()) == 9
        assert list(gen()) == [10]
        assert asyncio.run(async_block()) == [11]
        assert obj() == 12
        with profiled("sync.block"):
            pass

    ranges = cap.reports[0].ranges
    expected = {
        f"{q}.bare": 1,
        f"{q}.parens": 1,
        "given.name": 1,
        f"{q}.C.method": 1,
        f"{q}.C.cm_above": 1,
        f"{q}.C.cm_below": 1,
        f"{q}.C.sm_above": 1,
        "static.named": 1,
        f"{q}.coro": 1,
        f"{q}.gen": 2,  # one yield + the resume that finishes it
        f"{q}.agen": 2,
        f"{q}.Obj": 1,  # a callable object: its class's __qualname__
        "sync.block": 1,
        "async.block": 1,
    }
    assert {name: ranges[name].calls for name in expected if name in ranges} == expected


def test_ranges_are_user_annotations_in_the_trace_file(tmp_path):
    @profiled("outer")
    def outer():
        inner()
        with profiled("block"):
            inner()
        return torch.ones(8, 8) @ torch.ones(8, 8)

    @profiled("inner")
    def inner():
        return torch.ones(16).sum()

    with recording(exporters=[TraceFileExporter(tmp_path, gzip=False)]) as cap:
        outer()
        outer()

    report = cap.reports[0]
    assert report.trace_file and report.trace_file.startswith(str(tmp_path))
    events = trace_events(report)
    by_name = {n: [e for e in events if e["name"] == n] for n in ("outer", "inner", "block")}
    assert {n: len(evs) for n, evs in by_name.items()} == {"outer": 2, "inner": 4, "block": 2}
    assert {e["cat"] for evs in by_name.values() for e in evs} == {"user_annotation"}
    # each inner range lies inside an outer one, and its operator inside it
    for ev in by_name["inner"] + by_name["block"]:
        assert any(
            o["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= o["ts"] + o["dur"]
            for o in by_name["outer"]
        )
    assert report.ranges["outer"].calls == 2 and report.ranges["inner"].calls == 4
    assert report.ranges["outer"].self_cpu_time_us < report.ranges["outer"].cpu_time_us


def test_context_form_in_a_loop_leaves_nothing_behind():
    """Each ``with profiled(...)`` is a new instance: none may leave state in the context."""
    with capture(schedule=NEVER):
        with profiled("warm"):
            pass
        before = len(contextvars.copy_context())
        for i in range(200):
            with profiled(f"loop{i % 3}"):
                pass
        assert len(contextvars.copy_context()) == before


def test_idle_context_blocks_keep_no_entry_and_counting_ones_still_end_steps():
    """Idle (no session counts, no profiler records) a block keeps nothing in the context; in a
    counting session the same object keeps its entry again and ends steps."""
    instrument.shutdown()
    assert _decorator._IDLE
    block, stepper = profiled("idle.block"), profiled("idle.step", step=True)
    with block:
        assert _decorator._CM_STACK.get() == ()
    instrument.testing.reset()  # forgets that ``stepper`` declared steps
    with counting_ambient() as sess:
        with block:
            assert len(_decorator._CM_STACK.get()) == 1  # counting: root blocks end steps
        assert sess.step_index == 1
        with stepper:
            pass
        assert sess.step_index == 2
    assert _decorator._CM_STACK.get() == ()


# ------------------------------------------------------------------------ metadata


def _plain(a, b=2, *args, c, **kwargs):
    """Plain docstring."""
    return a


async def _coro(a, *, b=1):
    """Coroutine docstring."""
    return a


def _gen(n: int):
    """Generator docstring."""
    yield n


async def _agen(n: int) -> None:
    """Async generator docstring."""
    yield n


KINDS = {"function": _plain, "coroutine": _coro, "generator": _gen, "async_generator": _agen}
FORMS = {
    "bare": lambda f: profiled(f),
    "parens": lambda f: profiled()(f),
    "named": lambda f: profiled("named")(f),
    "step": lambda f: profiled("named", step=True)(f),
}
PREDICATES = (
    inspect.isfunction,
    inspect.iscoroutinefunction,
    inspect.isgeneratorfunction,
    inspect.isasyncgenfunction,
)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_metadata_is_preserved(kind, form):
    original = KINDS[kind]
    wrapped = FORMS[form](original)
    assert wrapped is not original
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        assert getattr(wrapped, attr) == getattr(original, attr), attr
    assert wrapped.__wrapped__ is original
    assert inspect.signature(wrapped) == inspect.signature(original)
    assert [p(wrapped) for p in PREDICATES] == [p(original) for p in PREDICATES]


def test_method_and_object_metadata_is_preserved():
    def method(self, x, *, y=1):
        """Method doc."""

    def cm(cls, x):
        """Classmethod doc."""

    def sm(x, y):
        """Staticmethod doc."""

    class C:
        m = profiled(method)
        cm_above = profiled(classmethod(cm))
        cm_below = classmethod(profiled(cm))
        sm_above = profiled(staticmethod(sm))
        sm_below = staticmethod(profiled(sm))

    assert isinstance(C.__dict__["cm_above"], classmethod)
    assert isinstance(C.__dict__["sm_above"], staticmethod)
    c = C()
    assert C.m.__wrapped__ is method and C.m.__doc__ == "Method doc."
    assert inspect.signature(c.m) == inspect.signature(method.__get__(c))
    for name in ("cm_above", "cm_below"):
        bound = getattr(C, name)
        assert bound.__self__ is C and bound.__wrapped__ is cm and bound.__doc__ == cm.__doc__
        assert inspect.signature(bound) == inspect.signature(cm.__get__(C))
    for name in ("sm_above", "sm_below"):
        assert getattr(c, name).__wrapped__ is sm
        assert inspect.signature(getattr(c, name)) == inspect.signature(sm)

    obj = Doubler()
    proxy = profiled(obj)
    assert isinstance(proxy, Doubler) and proxy.__wrapped__ is obj
    assert proxy.factor == 2 and proxy.__doc__ == Doubler.__doc__
    assert inspect.signature(proxy) == inspect.signature(obj)


# ------------------------------------------------------------------------ pass-through


class Halt(BaseException):
    """Not an Exception: must pass through untouched too."""


def test_sync_targets_return_and_raise_the_same_objects(mode):
    sentinel = object()

    @profiled
    def ident(x):
        return x

    @profiled("raiser")
    def raiser(exc):
        raise exc

    class C:
        @profiled
        def m(self, x):
            return self, x

        @profiled
        @classmethod
        def cm_above(cls, x):
            return cls, x

        @classmethod
        @profiled
        def cm_below(cls, x):
            return cls, x

        @profiled
        @staticmethod
        def sm_above(x):
            return x

        @staticmethod
        @profiled
        def sm_below(x):
            return x

    class D(C):
        pass

    assert ident(sentinel) is sentinel
    for exc in (ValueError("boom"), Halt()):
        with pytest.raises(type(exc)) as info:
            raiser(exc)
        assert info.value is exc
    c = C()
    got = c.m(sentinel)
    assert got[0] is c and got[1] is sentinel
    for name in ("cm_above", "cm_below"):
        for owner, expect in ((C, C), (c, C), (D, D)):
            got = getattr(owner, name)(sentinel)
            assert got[0] is expect and got[1] is sentinel
    for name in ("sm_above", "sm_below"):
        assert getattr(C, name)(sentinel) is getattr(c, name)(sentinel) is sentinel

    proxy = profiled(Doubler())
    assert proxy(21) == 42
    failing = profiled(lambda: raiser.__wrapped__(KeyError("k")))
    with pytest.raises(KeyError):
        failing()

    # context forms: the block's exception is neither swallowed nor replaced
    boom = RuntimeError("in block")
    with pytest.raises(RuntimeError) as info:
        with profiled("block"):
            raise boom
    assert info.value is boom

    async def in_async_block():
        async with profiled("async.block") as p:
            assert p is not None
            raise boom

    with pytest.raises(RuntimeError) as info:
        asyncio.run(in_async_block())
    assert info.value is boom


def test_async_function_returns_and_raises_the_same_objects(mode):
    sentinel = object()
    boom = LookupError("async boom")

    @profiled
    async def ident(x):
        await asyncio.sleep(0)
        return x

    @profiled("async.raiser")
    async def raiser():
        await asyncio.sleep(0)
        raise boom

    class Obj:
        async def __call__(self, x):
            await asyncio.sleep(0)
            return x

    aobj = profiled(Obj())

    async def main():
        assert await ident(sentinel) is sentinel
        assert await aobj(sentinel) is sentinel
        with pytest.raises(LookupError) as info:
            await raiser()
        assert info.value is boom
        return await asyncio.gather(ident(1), ident(2))

    assert asyncio.run(main()) == [1, 2]


def test_generator_protocol_passes_through(mode):
    cleanup = []
    thrown = ValueError("handled inside")
    fatal = KeyError("not handled")
    sentinel = object()

    @profiled
    def echo(first):
        received = []
        value = first
        try:
            while True:
                try:
                    got = yield value
                except ValueError as exc:
                    got = ("caught", exc)
                if got == "stop":
                    return received  # becomes StopIteration.value
                received.append(got)
                value = got
        finally:
            cleanup.append("finally")

    g = echo(sentinel)
    assert next(g) is sentinel
    assert g.send(sentinel) is sentinel
    caught = g.throw(thrown)
    assert caught[0] == "caught" and caught[1] is thrown
    with pytest.raises(StopIteration) as stop:
        g.send("stop")
    assert stop.value.value == [sentinel, caught]
    assert cleanup == ["finally"]

    g = echo(1)
    next(g)
    with pytest.raises(KeyError) as info:
        g.throw(fatal)
    assert info.value is fatal and cleanup == ["finally"] * 2

    g = echo(1)
    next(g)
    g.close()  # the body's finally runs now, not at garbage collection
    assert cleanup == ["finally"] * 3
    with pytest.raises(StopIteration):
        next(g)

    @profiled
    def returns_object():
        yield 1
        return sentinel

    def delegate():
        result = yield from returns_object()
        return result

    with pytest.raises(StopIteration) as stop:
        d = delegate()
        assert next(d) == 1
        next(d)
    assert stop.value.value is sentinel

    @profiled
    def raising():
        yield 1
        raise fatal

    with pytest.raises(KeyError) as info:
        list(raising())
    assert info.value is fatal

    assert list(_targets.countdown(3)) == [3, 2, 1]

    class Obj:
        def __call__(self, n):
            yield from range(n)
            return "obj done"

    gen_obj = profiled(Obj())
    with pytest.raises(StopIteration) as stop:
        g = gen_obj(2)
        assert [next(g), next(g)] == [0, 1]
        next(g)
    assert stop.value.value == "obj done"


def test_async_generator_protocol_passes_through(mode):
    cleanup = []
    thrown = ValueError("handled inside")
    fatal = KeyError("not handled")
    sentinel = object()

    @profiled
    async def aecho(first):
        value = first
        try:
            while True:
                try:
                    got = yield value
                except ValueError as exc:
                    got = ("caught", exc)
                await asyncio.sleep(0)
                if got == "stop":
                    return
                value = got
        finally:
            await asyncio.sleep(0)
            cleanup.append("finally")

    @profiled
    async def araising():
        yield 1
        raise fatal

    async def main():
        ag = aecho(sentinel)
        assert await ag.asend(None) is sentinel
        assert await ag.asend(sentinel) is sentinel
        caught = await ag.athrow(thrown)
        assert caught[0] == "caught" and caught[1] is thrown
        with pytest.raises(StopAsyncIteration):
            await ag.asend("stop")
        assert cleanup == ["finally"]

        ag = aecho(1)
        await ag.asend(None)
        with pytest.raises(KeyError) as info:
            await ag.athrow(fatal)
        assert info.value is fatal and cleanup == ["finally"] * 2

        ag = aecho(1)
        await ag.asend(None)
        await ag.aclose()
        assert cleanup == ["finally"] * 3
        with pytest.raises(StopAsyncIteration):
            await ag.asend(None)

        with pytest.raises(KeyError) as info:
            async for _ in araising():
                pass
        assert info.value is fatal
        return [x async for x in aecho_n(3)]

    @profiled
    async def aecho_n(n):
        for i in range(n):
            yield i

    assert asyncio.run(main()) == [0, 1, 2]


# ------------------------------------------------------------------------ pickling


def test_module_level_functions_pickle():
    for fn in (_targets.square, _targets.cube, _targets.countdown, _targets.add_async):
        assert hasattr(fn, "__wrapped__")
        assert pickle.loads(pickle.dumps(fn)) is fn
    loaded = pickle.loads(pickle.dumps(_targets.square))
    assert loaded(7) == 49
    assert list(pickle.loads(pickle.dumps(_targets.countdown))(2)) == [2, 1]
    assert asyncio.run(pickle.loads(pickle.dumps(_targets.add_async))(2, 3)) == 5


def test_decorated_function_runs_in_a_spawned_worker(monkeypatch):
    # workers inherit the environment: count steps but never start a profiler there
    monkeypatch.setenv("PROFILED_SCHEDULE", NEVER.to_env())
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.map(_targets.square, [1, 2, 3]) == [1, 4, 9]
        # the function itself travels as an argument and is the decorated one over there
        assert pool.apply(_targets.apply, (_targets.cube, 3)) == (27, "cube", True)


# -------------------------------------------------------------------- recursion, nesting, threads


def test_recursion_counts_every_call_and_times_the_outermost(tmp_path):
    @profiled
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    shared = profiled("shared.block")  # one context-manager instance entered recursively

    def nest(n):
        with shared:
            if n:
                nest(n - 1)

    name = fact.__qualname__
    with recording(exporters=[TraceFileExporter(tmp_path, gzip=False)]) as cap:
        assert fact(10) == 3628800
        nest(4)

    report = cap.reports[0]
    stats = report.ranges[name]
    assert stats.calls == 10
    assert report.ranges["shared.block"].calls == 5
    events = trace_events(report, name)
    assert len(events) == 10 and {e["cat"] for e in events} == {"user_annotation"}
    outermost = max(e["dur"] for e in events)
    assert stats.cpu_time_us == pytest.approx(outermost, abs=0.01)
    assert sum(e["dur"] for e in events) > stats.cpu_time_us
    assert len(trace_events(report, "shared.block")) == 5


def test_only_root_calls_end_steps_and_depth_survives_exceptions():
    @profiled
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    @profiled
    def fails_deep(n):
        if n == 0:
            raise ValueError("deep")
        return fails_deep(n - 1)

    with counting_ambient() as sess:
        fact(10)
        assert sess.step_index == 1
        with pytest.raises(ValueError):
            fails_deep(5)  # a root call that raises still ends its step
        assert sess.step_index == 2
        fact(3)  # depth went back to 0: this is a root call again
        assert sess.step_index == 3
        with profiled("block"):
            fact(3)  # nested in a root block: ends no step of its own
        assert sess.step_index == 4


def test_nested_ranges_of_different_names():
    @profiled("outer")
    def outer():
        for _ in range(3):
            middle()
        return torch.ones(32, 32) @ torch.ones(32, 32)

    @profiled("middle")
    def middle():
        with profiled("inner"):
            return torch.ones(8).sum()

    with recording() as cap:
        outer()

    ranges = cap.reports[0].ranges
    assert (ranges["outer"].calls, ranges["middle"].calls, ranges["inner"].calls) == (1, 3, 3)
    assert (
        ranges["outer"].cpu_time_us >= ranges["middle"].cpu_time_us >= ranges["inner"].cpu_time_us
    )
    assert ranges["middle"].self_cpu_time_us < ranges["middle"].cpu_time_us


def test_by_default_a_window_records_only_the_thread_that_started_it(tmp_path):
    """Torch's all-threads profiling crashes while other threads run operators as a window
    starts or stops, so windows record their own thread (torch's default): other threads'
    ranges run, unrecorded and unharmed."""

    @profiled("threaded.work")
    def work(i):
        return torch.ones(4).sum().item() + i

    results = []
    with recording() as cap:
        work(0)
        t = threading.Thread(target=lambda: results.extend(work(i) for i in range(5)))
        t.start()
        t.join()
    assert results == [4.0 + i for i in range(5)]
    assert cap.reports[0].ranges["threaded.work"].calls == 1  # this thread's only


def test_with_all_threads_ranges_from_eight_threads_are_all_recorded(tmp_path):
    k = 5

    @profiled("threaded.work")
    def work(i):
        with profiled("threaded.block"):
            return torch.ones(4).sum().item() + i

    barrier = threading.Barrier(8)
    results = [None] * 8

    def run(t):
        barrier.wait()
        results[t] = [work(i) for i in range(k)]

    with recording(exporters=[TraceFileExporter(tmp_path, gzip=False)], all_threads=True) as cap:
        threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    assert results == [[4.0 + i for i in range(k)]] * 8
    report = cap.reports[0]
    assert report.ranges["threaded.work"].calls == 8 * k
    assert report.ranges["threaded.block"].calls == 8 * k
    assert len({e["tid"] for e in trace_events(report, "threaded.work")}) == 8


def test_root_calls_from_many_threads_each_end_one_step():
    k = 25

    @profiled("threaded.root")
    def root():
        return inner()

    @profiled("threaded.inner")
    def inner():
        return 1

    barrier = threading.Barrier(8)

    def run():
        barrier.wait()
        for _ in range(k):
            root()

    with counting_ambient() as sess:
        threads = [threading.Thread(target=run) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sess.step_index == 8 * k


# ------------------------------------------------------------------------ async and generator time


def test_async_range_covers_the_awaited_time():
    @profiled("async.slow")
    async def slow(tag):
        await asyncio.sleep(0.05)
        return tag

    class SlowObject:
        async def __call__(self, tag):
            await asyncio.sleep(0.05)
            return tag

    slow_object = profiled("async.object")(SlowObject())

    async def main():
        first = await slow("a")
        return [first, *await asyncio.gather(slow("b"), slow("c")), await slow_object("d")]

    with recording() as cap:
        assert asyncio.run(main()) == ["a", "b", "c", "d"]

    stats = cap.reports[0].ranges["async.slow"]
    assert stats.calls == 3
    # the first call alone awaited 50 ms; the two concurrent ones overlap (another 50 ms)
    assert stats.cpu_time_us >= 2 * 45_000
    # an object whose __call__ is ``async def`` gets the same range as an async function
    assert cap.reports[0].ranges["async.object"].calls == 1
    assert cap.reports[0].ranges["async.object"].cpu_time_us >= 45_000


def test_concurrent_tasks_are_separate_root_calls():
    @profiled("task.root")
    async def root():
        await asyncio.sleep(0.01)
        return await child()  # nested: ends no step

    @profiled("task.child")
    async def child():
        await asyncio.sleep(0)
        return 1

    async def main():
        return await asyncio.gather(*(root() for _ in range(4)))

    with counting_ambient() as sess:
        assert asyncio.run(main()) == [1] * 4
        assert sess.step_index == 4


def test_generator_range_covers_only_time_inside_the_body():
    @profiled("gen.body")
    def produce():
        time.sleep(0.005)  # body time: counted
        yield from range(3)

    with recording() as cap:
        got = []
        for item in produce():
            got.append(item)
            time.sleep(0.05)  # consumer time: not counted

    assert got == [0, 1, 2]
    stats = cap.reports[0].ranges["gen.body"]
    assert stats.calls == 4  # three yields and the resume that finishes it
    assert 4_500 <= stats.cpu_time_us < 50_000


def test_async_generator_range_covers_only_time_inside_the_body():
    @profiled("agen.body")
    async def produce():
        await asyncio.sleep(0.005)  # awaited inside the body: counted
        for i in range(3):
            yield i

    async def main():
        got = []
        async for item in produce():
            got.append(item)
            await asyncio.sleep(0.05)  # consumer time: not counted
        return got

    with recording() as cap:
        assert asyncio.run(main()) == [0, 1, 2]

    stats = cap.reports[0].ranges["agen.body"]
    assert stats.calls == 4
    assert 4_500 <= stats.cpu_time_us < 50_000


# ------------------------------------------------------------------------ torch.compile


def _compiled_case(backend):
    @profiled("compiled.helper")
    def helper(x):
        return x * 2 + 1

    def fn(x):
        y = helper(x)
        with profiled("compiled.block"):
            y = y.sin()
        return y

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True)


@pytest.mark.parametrize("state", ["idle", "counting", "recording"])
def test_decorated_call_compiles_fullgraph(state):
    x = torch.randn(16)
    expected = (x * 2 + 1).sin()
    compiled = _compiled_case("eager")
    if state == "idle":
        instrument.shutdown()
        torch.testing.assert_close(compiled(x), expected)
    elif state == "counting":
        with counting_ambient():
            torch.testing.assert_close(compiled(x), expected)
    else:
        with recording():
            torch.testing.assert_close(compiled(x), expected)
            torch.testing.assert_close(compiled(x + 1), ((x + 1) * 2 + 1).sin())


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_decorated_call_compiles_fullgraph_with_inductor():
    x = torch.randn(16)
    compiled = _compiled_case("inductor")
    with recording():
        torch.testing.assert_close(compiled(x), (x * 2 + 1).sin())


# ------------------------------------------------------------------------ the user's own profiler


def _user_profile_checks(prof, leaf_calls):
    events = prof.events()
    leaves = [e for e in events if e.name == "user.leaf"]
    assert len(leaves) == leaf_calls
    # recorded after the decorated calls: the SDK did not stop the user's profiler
    after = [e for e in events if e.name == "aten::mul"]
    assert after
    assert max(e.time_range.start for e in after) > max(e.time_range.start for e in leaves)


def test_user_profiler_is_left_alone_by_the_ambient_session():
    @profiled("user.leaf")
    def leaf(x):
        return x + 1

    mem = InMemoryExporter()
    instrument.configure(schedule=Schedule(wait=0, warmup=1, active=2), exporters=[mem])
    with torch.profiler.profile() as prof:
        for _ in range(6):  # six root calls: enough steps for the schedule's window
            leaf(torch.ones(2))
        assert profiler_on()
        torch.ones(3).mul(2)
    assert not profiler_on()
    _user_profile_checks(prof, 6)
    instrument.shutdown()
    assert mem.reports == []
    assert any("your own torch.profiler" in n for n in mem.notices), mem.notices


def test_user_profiler_is_left_alone_by_an_explicit_session(tmp_path):
    @profiled("user.leaf")
    def leaf(x):
        return x + 1

    with torch.profiler.profile() as prof:
        with capture(schedule=Schedule(wait=0, warmup=1, active=2)) as cap:
            for _ in range(6):
                leaf(torch.ones(2))
                cap.step()
            cap.step()
        assert profiler_on()
        torch.ones(3).mul(2)
    _user_profile_checks(prof, 6)
    assert cap.reports == []
    # the user's own export holds the SDK's ranges too
    path = tmp_path / "user.json"
    prof.export_chrome_trace(str(path))
    names = [e.get("name") for e in json.loads(path.read_text())["traceEvents"]]
    assert names.count("user.leaf") == 6


def test_user_profiler_started_after_the_session_warmed_up():
    """The session prepared a window before the user's profiler started: it must neither
    start it over theirs nor stop theirs, and says why there is no report (no warning)."""

    @profiled("user.leaf")
    def leaf(x):
        return x + 1

    mem = InMemoryExporter()
    instrument.configure(
        schedule=Schedule(wait=0, warmup=2, active=2), exporters=[mem], activities=["cpu"]
    )  # CPU windows start at the first recorded step
    leaf(torch.ones(2))  # step 0 (warm-up) ends: a window is due (opened, not yet prepared)
    assert not profiler_on()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.profiler.profile() as prof:
            for _ in range(6):
                leaf(torch.ones(2))
            assert profiler_on()
            torch.ones(3).mul(2)
        instrument.shutdown()
    _user_profile_checks(prof, 6)
    assert [str(w.message) for w in caught if issubclass(w.category, ProfilerWarning)] == []
    assert mem.reports == []
    assert any("your own torch.profiler" in n for n in mem.notices), mem.notices


# ------------------------------------------------------------------------ disabled


def test_disabled_returns_the_function_itself(monkeypatch):
    monkeypatch.setenv("PROFILED_ENABLED", "0")

    def f(x):
        return x

    async def af():
        return 1

    def g():
        yield 1

    cm = classmethod(f)
    sm = staticmethod(f)
    obj = Doubler()
    for target in (f, af, g, cm, sm, obj):
        assert profiled(target) is target
        assert profiled()(target) is target
        assert profiled("x")(target) is target
        assert profiled("x", step=True)(target) is target
    monkeypatch.setenv("PROFILED_ENABLED", "1")
    assert profiled(f) is not f  # read when applied, not at import


def test_disabled_context_forms_do_nothing_and_no_profiler_starts(monkeypatch):
    monkeypatch.setenv("PROFILED_ENABLED", "0")
    seen = []

    def body():
        seen.append(profiler_on())
        return len(seen)

    root = profiled("root")(body)
    assert root is body

    async def async_blocks():
        async with profiled("a.block"):
            body()
        async with profiled("a.step", step=True):
            body()

    def run_steps():
        for _ in range(6):
            assert root() == len(seen)
            with profiled("block"):
                body()
            with profiled("block.step", step=True):
                body()
            asyncio.run(async_blocks())
            instrument.step()

    mem = InMemoryExporter()
    instrument.configure(schedule=Schedule(wait=0, warmup=1, active=1), exporters=[mem])
    run_steps()
    with capture(schedule=Schedule(wait=0, warmup=1, active=1)) as cap:
        run_steps()
        cap.step()
    instrument.shutdown()
    assert len(seen) == 2 * 6 * 5 and not any(seen)
    assert not profiler_on()
    assert mem.reports == [] and cap.reports == []


# ------------------------------------------------------------------------ steps


def _marked(name, step=False):
    """A decorated function that opens a range named ``{name}{i}`` for call ``i``."""

    @profiled(name, step=step)
    def fn(i):
        with profiled(f"{name}{i}"):
            return i

    return fn


def test_root_calls_end_steps_when_no_step_is_declared():
    # the ambient session of a program with no step function and no step() call
    root = _marked("root")
    mem = InMemoryExporter()
    instrument.configure(schedule=Schedule(wait=1, warmup=1, active=2), exporters=[mem])
    for i in range(6):
        assert root(i) == i
    instrument.flush()

    (report,) = mem.reports
    assert report.steps == (2, 3)
    assert set(report.ranges) == {"root", "root2", "root3"}
    assert report.ranges["root"].calls == 2


def test_a_step_function_takes_over_step_counting():
    # the ambient session, where root calls end steps until a step=True function is applied
    helper = _marked("helper")
    mem = InMemoryExporter()
    instrument.configure(schedule=Schedule(wait=0, warmup=1, active=1, repeat=2), exporters=[mem])
    helper(0)  # no step declared yet: this root call ends step 0 (warm-up)
    train_step = _marked("train", step=True)  # declares steps when applied
    train_step(1)  # recorded in step 1; ends it (window 0 saved)
    for i in range(2, 7):
        helper(i)  # root calls end no step any more: still step 2 (warm-up)
    train_step(7)  # ends step 2
    for i in range(8, 11):
        helper(i)  # recorded in step 3
    train_step(11)  # ends step 3: window 1 saved
    instrument.flush()

    first, second = mem.reports
    assert first.steps == (1,) and set(first.ranges) == {"train", "train1"}
    assert second.steps == (3,)
    assert set(second.ranges) == {"helper", "helper8", "helper9", "helper10", "train", "train11"}
    assert second.ranges["helper"].calls == 3 and second.ranges["train"].calls == 1


@pytest.mark.parametrize("where", ["explicit", "ambient"])
def test_instrument_step_declares_steps(where):
    root = _marked("root")
    schedule = Schedule(wait=0, warmup=1, active=2)

    def run():
        instrument.step()  # ends step 0 (warm-up)
        for i in range(3):
            root(i)  # end no steps: step() was called
        instrument.step()  # ends step 1
        root(3)
        instrument.step()  # ends step 2: window saved

    if where == "explicit":
        with capture(schedule=schedule) as cap:
            run()
        reports = cap.reports
    else:
        mem = InMemoryExporter()
        instrument.configure(schedule=schedule, exporters=[mem])
        run()
        instrument.flush()  # reports are built and exported in the background
        reports = mem.reports
    (report,) = reports
    assert report.steps == (1, 2)
    assert report.ranges["root"].calls == 4
    assert {f"root{i}" for i in range(4)} <= set(report.ranges)


def test_generator_async_and_block_step_functions():
    @profiled("batches", step=True)
    def batches(n):
        yield from range(n)

    @profiled("astep", step=True)
    async def astep(i):
        await asyncio.sleep(0)
        return i

    async def two_steps():
        return [await astep(1), await astep(2)]

    sched = Schedule(wait=0, warmup=1, active=1)
    with capture(schedule=sched) as cap:
        assert list(batches(2)) == [0, 1]  # finishing the generator ends step 0
        g = batches(5)
        assert next(g) == 0
        g.close()  # abandoned early: ends no step
        assert list(batches(3)) == [0, 1, 2]  # ends step 1: window saved
    (report,) = cap.reports
    assert report.steps == (1,) and report.ranges["batches"].calls == 1 + 4

    with capture(schedule=sched) as cap:
        assert asyncio.run(two_steps()) == [1, 2]  # ends steps 0 and 1
    (report,) = cap.reports
    assert report.steps == (1,) and report.ranges["astep"].calls == 1

    with capture(schedule=sched) as cap:
        with profiled("cstep", step=True):
            pass  # ends step 0
        with profiled("cstep", step=True):
            with profiled("cstep.inner"):
                pass  # recorded; the outer block ends step 1
    (report,) = cap.reports
    assert report.steps == (1,)
    assert report.ranges["cstep"].calls == 1 and report.ranges["cstep.inner"].calls == 1


# ------------------------------------------------------------------------ bad arguments


BAD = [
    pytest.param(lambda: profiled(123), TypeError, "int", id="non-callable"),
    pytest.param(lambda: profiled()(123), TypeError, "int", id="parens-non-callable"),
    pytest.param(lambda: profiled("x")(None), TypeError, "NoneType", id="named-non-callable"),
    pytest.param(lambda: profiled(b"name"), TypeError, "bytes", id="bytes-name"),
    pytest.param(lambda: profiled(""), ValueError, "empty", id="empty-name"),
    pytest.param(lambda: profiled("   "), ValueError, "empty", id="blank-name"),
    pytest.param(lambda: profiled("x", step="yes"), TypeError, "step", id="step-str"),
    pytest.param(lambda: profiled(step=1), TypeError, "step", id="step-int"),
    pytest.param(lambda: profiled(len, step=None), TypeError, "step", id="step-none"),
]


@pytest.mark.parametrize("enabled", ["1", "0"])
@pytest.mark.parametrize("make, exc, words", BAD)
def test_bad_arguments_raise_at_once(monkeypatch, enabled, make, exc, words):
    monkeypatch.setenv("PROFILED_ENABLED", enabled)
    with pytest.raises(exc, match=words):
        make()


@pytest.mark.parametrize("enabled", ["1", "0"])
def test_context_form_needs_a_name(monkeypatch, enabled):
    monkeypatch.setenv("PROFILED_ENABLED", enabled)
    with pytest.raises(TypeError, match="name"):
        with profiled():
            pass

    async def main():
        async with profiled():
            pass

    with pytest.raises(TypeError, match="name"):
        asyncio.run(main())
