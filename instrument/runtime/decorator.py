"""``profiled``: decorator and (async) context manager that records a named range.

Every call form follows one rule, the call mode ``state`` computes (``state.IDLE``,
``COUNT_ONLY``, ``RANGE``, ``SESSION``) and this module keeps as ``_MODE``:

- ``IDLE``: the call is the function's (one global on top of a plain closure: no
  allocation, lock or import);
- ``COUNT_ONLY``: metrics on and nothing else needs the call: the Dynamo check, two clock
  reads and an append to the range's pending list (``metrics``), written inline in each form;
- ``RANGE``: only a range, if a torch profiler records (the program's own);
- ``SESSION``: the slow path, written once: ``_call`` for the forms that wrap a call
  (functions, methods, callable objects), ``Entry`` for the forms that open and close
  (the context form, async functions, generators' resumes, ``instrument_module``'s hooks).
  Both ask the session, keep the nesting depth for root calls, run the first-call hook,
  record the range if a profiler records, time the call for the metrics and end steps.

Plain functions get a plain closure rather than a ``wrapt.FunctionWrapper``: a pass-through
``wrapt`` wrapper measured ~450 ns per call on the CI box, a closure ~100 ns. Descriptors
(instance methods, ``classmethod``, ``staticmethod``) are handled by wrapping the underlying
function; other callables (objects with ``__call__``) get a ``wrapt.FunctionWrapper`` around
the same wrapper as the function form of their kind, so they keep their attributes and type
checks (an object whose ``__call__`` is ``async def`` or a generator gets the same range as an
async function or a generator).

The context form keeps its open entries in one module-level context variable, never one per
``profiled(...)`` instance: ``with profiled("x"):`` in a loop must leave nothing behind, and
must not create a ``ContextVar`` inside ``torch.compile``'d code (Dynamo cannot trace that).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

import torch
import wrapt

from instrument.base.warn import warn as _warn

from . import _torch, state
from . import config as _config
from . import metrics as _metrics
from .config import enabled_from_env
from .metrics import BATCH as _BATCH
from .metrics import STEP
from .metrics import record as _record

__all__ = ["RANGE_NAMES", "Entry", "profiled", "range_name"]

F = TypeVar("F", bound=Callable[..., Any])

_FLAG = _torch.PROFILER_FLAG  # _FLAG._is_profiler_enabled: any torch profiler recording
_range_enter = _torch.range_enter  # never a bare _RecordFunctionFast: see _torch's ranges
_range_exit = _torch.range_exit
_ranged_call = _torch.ranged_call
_is_compiling = _torch.is_compiling
_is_dynamo_compiling = _torch.is_dynamo_compiling

# Nesting depth of decorated calls in this thread / asyncio task (0 = a root call).
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("profiled_depth", default=0)

# Open context-form entries of this thread / asyncio task, innermost last: (instance, Entry
# or None). One variable for every ``profiled`` instance: a variable per instance would leave
# one key in the thread's context per ``with profiled(...)`` ever run (a leak in a loop), and
# creating a ContextVar inside torch.compile'd code is unsupported by Dynamo (fullgraph fails).
_CM_STACK: contextvars.ContextVar[tuple[tuple[Any, Any], ...]] = contextvars.ContextVar(
    "profiled_cm_stack", default=()
)

RANGE_NAMES = state.RANGE_NAMES  # every range name a decoration created (``state``)

# The call mode and what the slow path needs, copies of ``state``'s, written only by it
# (through ``_mirror``, under ``state.mirror_lock``). _MODE: ``state.IDLE``, ``COUNT_ONLY``,
# ``RANGE`` or ``SESSION`` (see the module's docstring). _SESSION: the started session calls
# report to while it counts steps, else None (then the slow path asks
# ``state.session_for_calls``, which builds the ambient session on first use).
# _ON_FIRST_CALL: called at the next decorated call, on its thread and in its context: the
# ambient session starts a window's profiler there, and exporters capture what was current
# (the OpenTelemetry span of the request being profiled); None almost always. _METRICS: the
# recorder calls time themselves into while metrics are on, else None.
_COUNT_MODE = state.COUNT_ONLY
_RANGE_MODE = state.RANGE
_MODE: int | None = state.IDLE  # (None: compared by identity, as the other modes)
_SESSION: Any = None
_ON_FIRST_CALL: Any = None
_METRICS: Any = None
_now = time.perf_counter  # metrics' clock, seconds: a float difference allocates nothing
_SWITCHED_AT = 0.0
"""``_now()`` at the end of the last start or stop of any torch profiler (``_profiler_switched``):
a timed call begun before it held one, the only calls that look further (``_timed``)."""


def _mirror(mode: int | None, session: Any, hook: Any, recorder: Any = None) -> None:
    """``state``'s writer of the copies above (under ``state.mirror_lock``)."""
    global _MODE, _SESSION, _ON_FIRST_CALL, _METRICS
    _MODE, _SESSION, _ON_FIRST_CALL, _METRICS = mode, session, hook, recorder


def _profiler_switched() -> None:
    """After every start and stop of a torch profiler (``_torch.on_switch``)."""
    global _SWITCHED_AT
    _SWITCHED_AT = _now()


state.bind(mirror=_mirror)
_torch.on_switch(_profiler_switched)


def __getattr__(name: str) -> Any:
    """The flags this module kept before the call mode, derived from it for the tests and
    benches that read them (no call path does): ``_IDLE`` (nothing needs calls, metrics off),
    ``_QUIET`` (no session needs calls), ``_COUNT_ONLY`` (the recorder in the metrics-only
    mode, else None), ``_OFF`` (the idle mode)."""
    if name == "_IDLE":
        return state.idle() and _METRICS is None
    if name == "_QUIET":
        return state.idle()
    if name == "_COUNT_ONLY":
        return _METRICS if _MODE is _COUNT_MODE else None
    if name == "_OFF":
        return _MODE is None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- the slow path


class Entry:
    """One open range of the forms that open and close (the context form, an async call,
    a generator's resume, ``instrument_module``'s hooks): ``open`` begins it, ``close`` ends
    it, ``abandon`` lets go of one whose close never came (an interrupt past a module's
    forward hook). The slow path of those forms, as ``_call`` is of the others."""

    __slots__ = ("opened", "token", "depth", "session", "name", "t0", "sampled", "switches")
    opened: list[Any] | None
    """``_torch.range_enter``'s holder while a profiler records, else None."""
    token: Any
    """``_DEPTH``'s token: the nesting depth goes back to ``depth`` at the close."""
    depth: int
    session: Any
    name: str
    t0: float
    """Start for the metrics (``_now()``), 0 when not timed."""
    sampled: Any
    """The device-time sample, or None."""
    switches: int
    """``_torch.switches()`` at the open: a close that sees it moved held a profiler's start
    or stop."""

    @staticmethod
    def open(name: str, timed: bool = True) -> Entry:
        """Begin the range ``name``; ``timed``: counted in the metrics while they are on. The
        session is the mirrored one, else (none started yet, or idle: metrics or a hook
        brought the call here) ``state.session_for_calls``'s where one may want it."""
        self = _new(Entry)
        sess = _SESSION
        if sess is None and not state.idle():
            sess = state.session_for_calls()
        self.session = sess
        self.name = name
        self.depth = depth = _DEPTH.get()
        self.token = _DEPTH.set(depth + 1)
        self.switches = _torch.switches()  # before the first-call hook, which may start a window
        if _ON_FIRST_CALL is not None:
            _ON_FIRST_CALL()
        m = _METRICS if timed else None
        sampler = m.device if m is not None else None
        self.sampled = sampler.start(name) if sampler is not None else None
        self.t0 = _now() if m is not None else 0
        self.opened = None
        if _FLAG._is_profiler_enabled:
            # last, and straight into the entry: nothing between the range's start and its
            # holder's safe keeping can raise and leave it live in a traceback's frame
            self.opened = _range_enter(name)
        return self

    def close(self, is_step: bool, root_ends_step: bool = True) -> None:
        """End the range; ``is_step``: its end ends a step; ``root_ends_step``: a root entry
        (nothing decorated encloses it) ends a step in a session whose steps are not declared."""
        _DEPTH.reset(self.token)
        opened = self.opened
        if opened is not None:
            _range_exit(opened)
        m = _METRICS  # (read once: another thread may switch metrics off meanwhile)
        t0 = self.t0
        if t0 and m is not None:
            # a step in which a profiler started or stopped is no step time (``_timed``)
            took = _now() - t0
            if self.switches != _torch.switches():
                took, is_step = _without_own_switches(took, t0), False
            _record(m, self.name, took * 1e9, is_step)
        sampled = self.sampled
        if sampled is not None:
            sampled[0].end(sampled)
        sess = self.session
        if sess is not None:
            if is_step:
                sess._step_function_returned()
            elif self.depth == 0 and root_ends_step:
                sess._root_call_returned()

    def abandon(self) -> None:
        """Let go of an entry whose close never came: end its range (through
        ``_torch.range_exit``: its profiler may have ended meanwhile, and ending it there is a
        segfault) and put the nesting depth back; no step ends and nothing is timed."""
        opened = self.opened
        if opened is not None:
            _range_exit(opened)
        try:
            _DEPTH.reset(self.token)
        except (RuntimeError, ValueError):  # another context (a new notebook cell): let go
            pass


_new = object.__new__
_enter = Entry.open  # (plain functions: a call less than the attribute; ``module`` uses both)
_exit = Entry.close


# The step=True function running in this thread / asyncio task, if any: a ``step()`` inside
# it ends a second step per call (``Session.step`` says so, once).
IN_STEP_FUNCTION: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "profiled_in_step_function", default=None
)


def _call(
    f: Callable[..., Any], name: str, is_step: bool, args: Any, kwargs: Any, timed: bool = False
) -> Any:
    """The slow path of the forms that wrap a call (functions, methods, callable objects) in
    ``state.SESSION`` mode, outside compiled code; the rule is written once here: the
    first-call hook, then a range if a profiler records, else the call. A session's call
    keeps the nesting depth (root calls end steps until steps are declared) and a
    ``step=True`` function's return ends a step. ``timed``: ``_timed`` called it (never hand
    the call back there: the mirror of the session may lag behind ``session_for_calls``,
    after a start an exception cut short)."""
    if not timed:
        m = _METRICS
        if m is not None:
            return _timed(m, f, name, is_step, args, kwargs)
    sess = _SESSION
    if sess is None and not state.idle():
        sess = state.session_for_calls()
        m = _METRICS
        if m is not None and not timed:  # this call made the session that turned them on
            return _timed(m, f, name, is_step, args, kwargs)
    if sess is None or (sess._steps_declared and not is_step):
        # nothing of the session's to keep (no session, or root calls end no steps): the
        # rule alone, without the bookkeeping's try (the common call of a training loop)
        if _ON_FIRST_CALL is not None:
            _ON_FIRST_CALL()
        if _FLAG._is_profiler_enabled:
            return _ranged_call(f, name, args, kwargs)
        return f(*args, **kwargs)
    depth = -1  # the nesting depth, where it is kept (root calls end steps), else -1
    if not sess._steps_declared:
        depth = _DEPTH.get()
        depth_token = _DEPTH.set(depth + 1)
    if is_step:
        step_token = IN_STEP_FUNCTION.set(name)
    try:
        if _ON_FIRST_CALL is not None:
            _ON_FIRST_CALL()
        if _FLAG._is_profiler_enabled:
            return _ranged_call(f, name, args, kwargs)
        return f(*args, **kwargs)
    finally:
        if depth >= 0:
            _DEPTH.reset(depth_token)
        if is_step:
            IN_STEP_FUNCTION.reset(step_token)
            sess._step_function_returned()
        elif depth == 0:
            sess._root_call_returned()


def _timed(
    recorder: Any, f: Callable[..., Any], name: str, is_step: bool, args: Any, kwargs: Any
) -> Any:
    """A sync call while metrics are on and more than its duration is needed: its wall time
    goes to ``name``'s histogram (and, for one call in ``PROFILED_METRICS_DEVICE_EVERY``, its
    device time) around ``_call``. ``recorder``: the ``_METRICS`` the caller saw (read once:
    another thread may switch metrics off)."""
    sampler = recorder.device  # (read once: metrics may be switched off meanwhile)
    sampled = sampler.start(name) if sampler is not None else None
    t0 = _now()
    try:
        return _call(f, name, is_step, args, kwargs, True)
    finally:
        # A call in which a profiler started or stopped (a window's start at its first call,
        # its stop at a step's end) holds the SDK's start or stop: the range's histogram gets
        # the call without it, and a step stays out of the step histogram (and so out of the
        # slow-step median's view of the metrics) as before.
        took = _now() - t0
        if _SWITCHED_AT > t0:  # one comparison on every other call
            took, is_step = _without_own_switches(took, t0), False
        _record(recorder, name, took * 1e9, is_step)
        if sampled is not None:
            sampled[0].end(sampled)


def _without_own_switches(took: float, t0: float) -> float:
    """``took`` seconds of a call begun at ``t0`` during which a profiler started or stopped,
    less the SDK's own starts and stops on this thread meanwhile (``state.own_switch_s``):
    the program's own time. Only such calls come here."""
    return max(took - state.own_switch_s(t0), 0.0)


def _timed_end(name: str, t0: float, is_step: bool) -> None:
    """The end of a call, resume or block that took the metrics-only path (``COUNT_ONLY``
    when it began) at ``t0``: its duration into ``name``'s histogram (and the step
    histogram for a step), without the SDK's own profiler starts and stops meanwhile. No
    lock and no state written (``metrics.record`` appends); nothing if metrics went off."""
    m = _METRICS
    if m is None:
        return
    took = _now() - t0
    if _SWITCHED_AT > t0:
        took, is_step = _without_own_switches(took, t0), False
    _record(m, name, took * 1e9, is_step)


# ---------------------------------------------------------------- tracebacks

_OWN_MODULES = frozenset({__name__, _torch.__name__})
"""The modules of a decorated call's path: their frames are left out of the program's
tracebacks (``_hide_own_frames``)."""


def _hide_own_frames(exc: BaseException) -> None:
    """Leave the call path's frames (wrapper, ``_call``, ``_timed``, ``ranged_call``...) out of
    ``exc``'s traceback as it leaves the SDK, so that a decorated function's traceback reads
    as the undecorated one's: the same exception object, its ``__cause__`` and
    ``__context__`` untouched; the traceback's entries relinked (``tb_next`` is writable).
    Only for an exception raised in the program's code: one raised by the SDK itself (its
    innermost frame is ours: a bug, a signal handler's exception landing in our code, a
    call with arguments the function does not take) keeps every frame. Runs only when
    something raised: the ``try`` around a call costs nothing in Python 3.11+."""
    try:
        tb = exc.__traceback__
        kept = []
        last = tb
        while tb is not None:
            if tb.tb_frame.f_globals.get("__name__") not in _OWN_MODULES:
                kept.append(tb)
            last, tb = tb, tb.tb_next
        if not kept or kept[-1] is not last:
            return
        for outer, inner in zip(kept, kept[1:]):
            if outer.tb_next is not inner:
                outer.tb_next = inner
        exc.__traceback__ = kept[0]
    except Exception:  # noqa: BLE001 - never lose the program's exception over a traceback
        pass


# ---------------------------------------------------------------- wrappers per kind


def _sink(name: str, is_step: bool) -> tuple[Callable[[float], None], list[float], Any]:
    """(append, pending, fold) of ``name``'s metrics, bound when a function is decorated:
    the range's pending durations (one list per range name for the life of the process),
    which the metrics-only path appends to without a lock (``metrics.record`` inlined); a
    ``step=True`` function's append feeds the step histogram too."""
    recorder = _metrics.recorder  # (one for the life of the process)
    pending = recorder.pending_list(name)
    append = pending.append
    if is_step:  # a step=True function's calls are steps too

        def append(ns: float, _append: Callable[[float], None] = pending.append) -> None:
            _append(ns)
            _record(recorder, STEP, ns)

    return append, pending, recorder.fold


def _wrap_sync(f: Callable[..., Any], name: str, is_step: bool) -> Callable[..., Any]:
    append, pending, fold = _sink(name, is_step)

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            if _MODE is None:  # state.IDLE: nothing to do (one global, first)
                return f(*args, **kwargs)
            if _MODE is _COUNT_MODE and not _is_dynamo_compiling():
                t0 = _now()  # metrics only (nothing else needs the call): timed inline
                try:
                    return f(*args, **kwargs)
                finally:
                    # metrics.record inlined (tests/test_metrics.py checks both give the same
                    # histograms)
                    append((_now() - t0) * 1e9)
                    if len(pending) >= _BATCH:
                        fold(name)
            if _MODE is _RANGE_MODE:  # only a range, if a profiler records (not in compiled code)
                if not _FLAG._is_profiler_enabled or _is_compiling():
                    return f(*args, **kwargs)
                return _ranged_call(f, name, args, kwargs)
            if _is_compiling():
                if is_step:  # in compiled code the step still ends, right after the graph runs
                    result = f(*args, **kwargs)
                    _compiled_step_returned()  # (in this frame: Dynamo reorders it only here)
                    return result
                return f(*args, **kwargs)
            return _call(f, name, is_step, args, kwargs)  # state.SESSION: the slow path

        except BaseException as exc:  # the one place it leaves the SDK: without our frames
            _hide_own_frames(exc)
            raise

    return wrapper


def _wrap_async(f: Callable[..., Any], name: str, is_step: bool) -> Callable[..., Any]:
    append, pending, fold = _sink(name, is_step)

    @functools.wraps(f)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            if _MODE is _COUNT_MODE and not _is_dynamo_compiling():
                # metrics only (nothing else needs the call), as the sync wrapper: the
                # awaited time is the call's, as ``Entry`` times it
                t0 = _now()
                try:
                    return await f(*args, **kwargs)
                finally:
                    append((_now() - t0) * 1e9)
                    if len(pending) >= _BATCH:
                        fold(name)
            if (_MODE is None or _MODE is _RANGE_MODE) and not _FLAG._is_profiler_enabled:
                return await f(*args, **kwargs)  # nothing needs the call
            entry = _enter(name)
            try:
                return await f(*args, **kwargs)
            finally:
                entry.close(is_step)
        except BaseException as exc:
            _hide_own_frames(exc)
            raise

    return wrapper


def _wrap_generator(f: Callable[..., Any], name: str, is_step: bool) -> Callable[..., Any]:
    """Each resume of the generator is one range: time spent in the caller between
    ``next()`` calls is not counted. Resumes are not calls that return, so they never end a
    step as root calls; with ``step=True`` a step ends when the generator finishes. A plain
    resume of a body that returns None is ``next(gen, _DONE)`` (see ``_DONE``)."""

    append, pending, fold = _sink(name, False)  # (a resume is no step: see below)
    quiet_end = _returns_none(f)

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        gen = f(*args, **kwargs)
        compiling = _is_dynamo_compiling()  # (once: see ``_DONE``)
        method: Any = None  # None: a plain resume; else ``gen.send`` or a thrower
        value = None
        while True:
            t0 = 0.0
            if _MODE is _COUNT_MODE and not compiling:
                entry = None  # metrics only: the resume is timed here
                t0 = _now()
            elif (_MODE is None or _MODE is _RANGE_MODE) and not _FLAG._is_profiler_enabled:
                entry = None  # nothing needs the resume
            else:
                entry = _enter(name)
            try:
                if method is None:
                    item = _next(gen, _DONE) if quiet_end else gen.send(None)
                else:
                    item = method(value)
            except StopIteration as stop:
                _generator_ended(entry, t0, name, is_step)
                return stop.value
            except BaseException as exc:
                _generator_ended(entry, t0, name, False)
                _hide_own_frames(exc)
                raise
            if item is _DONE:  # the body returned None
                if t0 and not is_step and _SWITCHED_AT <= t0:  # (as a yield below)
                    append((_now() - t0) * 1e9)
                    if len(pending) >= _BATCH:
                        fold(name)
                else:
                    _generator_ended(entry, t0, name, is_step)
                return None
            if entry is not None:
                entry.close(False, False)
            elif t0:  # (``_timed_end`` inlined: a resume that yields, the common one)
                append((_now() - t0) * 1e9)
                if len(pending) >= _BATCH:
                    fold(name)
            try:
                value = yield item
                method = None if value is None else gen.send
            except GeneratorExit:
                gen.close()
                raise
            except BaseException as exc:  # thrown in by the caller: pass it into the body
                method, value = _thrower(gen, exc), None

    return wrapper


_next = next
_DONE: Any = object()
"""What ``next(gen, _DONE)`` gives for a generator whose body has returned. A plain resume
(``next()``, or ``send(None)``) of a body whose every ``return`` returns None
(``_returns_none``: nearly all) is ``next(gen, _DONE)``: its end is then no StopIteration
raised and caught in Python (a third of a one-item generator's cost with metrics on); any
other resume is ``send``/``throw`` as the caller asked, and a body that may return a value
ends by StopIteration, which carries it. Dynamo's check is made once per generator: Dynamo
never traces a generator's frame that began in eager code (it inlines one made in compiled
code from its start, where the check reads True)."""


def _generator_ended(entry: Entry | None, t0: float, name: str, is_step: bool) -> None:
    """A decorated generator's or async generator's body returned (or raised: ``is_step``
    False): its last resume's range or duration, and the step it ends (``step=True``)."""
    if entry is not None:
        entry.close(is_step, False)
        return
    if t0:
        _timed_end(name, t0, is_step)
    if is_step:
        _step_if_counting()


def _returns_none(f: Any) -> bool:
    """Every ``return`` in the body of the generator ``f(...)`` makes returns None, read from
    its bytecode where it is given (a ``return`` at the end of a path with ``None`` loaded
    right before it and no jump landing on it; ``RETURN_CONST None``); False where unsure
    (a callable object, a ``functools.partial``, a jump to a return, any other value)."""
    import dis

    code = getattr(getattr(f, "__func__", f), "__code__", None)
    if code is None:
        return False
    last = None
    for ins in dis.get_instructions(code):
        if ins.opname == "RETURN_CONST":
            if ins.argval is not None:
                return False
        elif ins.opname == "RETURN_VALUE" and (
            ins.is_jump_target
            or last is None
            or last.opname != "LOAD_CONST"
            or last.argval is not None
        ):
            return False
        last = ins
    return True


def _thrower(gen: Any, exc: BaseException) -> Callable[[Any], Any]:
    return lambda _ignored: gen.throw(exc)


def _wrap_async_generator(f: Callable[..., Any], name: str, is_step: bool) -> Callable[..., Any]:
    append, pending, fold = _sink(name, False)  # (a resume is no step)

    @functools.wraps(f)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        agen = f(*args, **kwargs)
        method, value = agen.asend, None
        try:
            while True:
                t0 = 0.0
                if _MODE is _COUNT_MODE and not _is_dynamo_compiling():
                    entry = None  # metrics only, as the generator form
                    t0 = _now()
                elif (_MODE is None or _MODE is _RANGE_MODE) and not _FLAG._is_profiler_enabled:
                    entry = None  # nothing needs the resume
                else:
                    entry = _enter(name)
                try:
                    item = await method(value)
                except StopAsyncIteration:
                    _generator_ended(entry, t0, name, is_step)
                    return
                except BaseException as exc:
                    _generator_ended(entry, t0, name, False)
                    _hide_own_frames(exc)
                    raise
                if entry is not None:
                    entry.close(False, False)
                elif t0:  # (``_timed_end`` inlined: a resume that yields, the common one)
                    append((_now() - t0) * 1e9)
                    if len(pending) >= _BATCH:
                        fold(name)
                try:
                    value = yield item
                    method = agen.asend
                except GeneratorExit:
                    raise
                except BaseException as exc:
                    method, value = _athrower(agen, exc), None
        finally:
            await agen.aclose()

    return wrapper


def _athrower(agen: Any, exc: BaseException) -> Callable[[Any], Any]:
    return lambda _ignored: agen.athrow(exc)


def _compiled_step_returned() -> None:
    """A ``step=True`` function returned inside ``torch.compile``d code.

    Registered with Dynamo as a reorderable logging function (``_torch.run_after_graph``):
    Dynamo does not trace it, and the compiled code calls it after the graph has run, so
    steps are counted even when the whole step is compiled (``fullgraph=True`` included).
    """
    _step_if_counting()


_torch.run_after_graph(_compiled_step_returned)


def _step_if_counting() -> None:
    sess = state.session_for_calls()
    if sess is not None:
        sess._step_function_returned()


def _kind_wrapper(target: Any) -> Callable[..., Any] | None:
    """The wrapper maker for an async, generator or async generator callable, else None."""
    if inspect.isasyncgenfunction(target):
        return _wrap_async_generator
    if inspect.iscoroutinefunction(target):
        return _wrap_async
    if inspect.isgeneratorfunction(target):
        return _wrap_generator
    return None


def _wrap_callable_object(obj: Any, name: str, is_step: bool) -> Any:
    """An object with ``__call__``: a ``wrapt.FunctionWrapper`` (the object's attributes and
    type checks kept) around the wrapper of its kind, the same as a function's: an object
    whose ``__call__`` is ``async def`` or a generator gets the range of an async function or
    a generator (inspect does not see through instances: the class's ``__call__`` tells)."""
    make = _kind_wrapper(getattr(type(obj), "__call__", None)) or _wrap_sync  # noqa: B004
    inner = make(obj, name, is_step)
    sync = make is _wrap_sync

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        try:
            if sync and _MODE is None:  # the sync wrapper's first check, a call less
                return wrapped(*args, **kwargs)
            if wrapped is obj:
                return inner(*args, **kwargs)
            return make(wrapped, name, is_step)(*args, **kwargs)  # bound by a descriptor
        except BaseException as exc:
            _hide_own_frames(exc)
            raise

    return wrapt.FunctionWrapper(obj, wrapper)


def _wrap_module_class(cls: type, name: str | None, is_step: bool) -> type:
    """``@profiled`` on an ``nn.Module`` subclass: its ``forward`` gets the range (named after
    the class unless a name is given) and the class itself is returned, so ``isinstance``,
    subclassing, ``state_dict`` and pickling are unchanged. A subclass that overrides
    ``forward`` without calling ``super().forward`` has no range of its own."""
    safe = range_name(name or cls.__qualname__)
    RANGE_NAMES.add(safe)
    cls.forward = _wrap(cls.forward, safe, is_step)  # type: ignore[attr-defined]
    return cls


def _wrap(target: Any, name: str | None, is_step: bool) -> Any:
    if is_step:
        state.declare_steps()
    if isinstance(target, (classmethod, staticmethod)):
        inner = _wrap(target.__func__, name, is_step)
        return type(target)(inner)
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        return _wrap_module_class(target, name, is_step)
    _check_target(target)
    safe = range_name(
        name
        or getattr(target, "__qualname__", None)
        or getattr(target, "__name__", None)
        or type(target).__qualname__
    )
    RANGE_NAMES.add(safe)
    if inspect.isasyncgenfunction(target):
        return _wrap_async_generator(target, safe, is_step)
    if inspect.iscoroutinefunction(target):
        return _wrap_async(target, safe, is_step)
    if inspect.isgeneratorfunction(target):
        return _wrap_generator(target, safe, is_step)
    if inspect.isfunction(target) or inspect.ismethod(target):
        return _wrap_sync(target, safe, is_step)
    return _wrap_callable_object(target, safe, is_step)


# ---------------------------------------------------------------- range names

_renamed_told = False


def range_name(name: str) -> str:
    """``name`` as ranges record it (``_torch.safe_name``: surrogates and NUL escaped, a name
    over ``_torch.MAX_NAME`` characters cut), where the name is given, never per call. The
    first name changed in this process is told, once: torch would have raised from the
    decorated call (surrogates) or recorded a name cut short (NUL)."""
    global _renamed_told
    safe = _torch.safe_name(name)
    if safe is not name and not _renamed_told:
        _renamed_told = True
        why = (
            f"it is longer than {_torch.MAX_NAME} characters"
            if len(name) > _torch.MAX_NAME
            else "it is not valid UTF-8 (a surrogate: a file name from os.listdir, say) or "
            "holds a NUL"
        )
        shown = safe if len(safe) <= 80 else safe[:77] + "..."
        _warn(
            f"torch-profiled: a range name cannot be recorded as given ({why}): it is "
            f"recorded as {shown!r}; names like it are changed the same way from now on "
            "(surrogates and NUL become percent escapes like %FF, long names are cut and end "
            "with a hash), and this is told once",
            UserWarning,
        )
    return safe


# ---------------------------------------------------------------- the public object

_MAX_NAME = _torch.MAX_NAME

_COMPILED_NAME = "(compiled)"
"""The name of every context-form range made inside ``torch.compile``d code (``profiled``):
none records there, and a run-time name must not become a guard."""


# ``PROFILED_ENABLED`` as ``enabled_from_env`` reads it, kept until the environment changes:
# ``profiled("name")`` made per block must not read and parse the environment every time
# (two ``os.environ`` lookups and the parse were ~1.1 us of its ~1.8 us). The raw values of
# every variable that function reads are compared by identity in ``os.environ``'s own dict
# (a set of any of them stores a new object there; the kept one cannot be freed and its
# address reused while it is kept), with the "names checked" flag (``testing.reset()``
# asks for the check again); a forked child reads again (its process id changed).
_ENV_DATA: Any = getattr(os.environ, "_data", None)
if not isinstance(_ENV_DATA, dict):  # pragma: no cover - no dict behind os.environ: read it
    _ENV_DATA = None
_env_get: Any = _ENV_DATA.get if _ENV_DATA is not None else None
_K1, _K2, _K3, _K4 = (
    os.environ.encodekey(v)
    for v in (
        _config._ENABLED.env,
        _config.STRICT.env,
        _config.PARENT_PID.env,
        _config.CHILDREN.env,
    )
)
_SEEN_NOTHING = object()
_s1: Any = _SEEN_NOTHING
_s2: Any = _SEEN_NOTHING
_s3: Any = _SEEN_NOTHING
_s4: Any = _SEEN_NOTHING
_enabled_was = True


def _enabled_now() -> bool:
    """``enabled_from_env()``, read again only when one of its variables changed (or the
    process forked, or ``testing.reset()`` asked for the names to be checked again)."""
    global _s1, _s2, _s3, _s4, _enabled_was
    get = _env_get
    if get is None:  # pragma: no cover
        return enabled_from_env()
    v1, v3 = get(_K1), get(_K3)
    if (
        v1 is _s1
        and v3 is _s3
        and _config._names_checked
        # PROFILED_STRICT matters only to a PROFILED_ENABLED that is set, PROFILED_CHILDREN
        # only to a PROFILED_PARENT_PID that is
        and (v1 is None or get(_K2) is _s2)
        and (v3 is None or get(_K4) is _s4)
    ):
        return _enabled_was
    v2, v4 = get(_K2), get(_K4)
    enabled = enabled_from_env()  # (may warn, or raise under PROFILED_STRICT=1: not kept)
    _s1, _s2, _s3, _s4, _enabled_was = v1, v2, v3, v4, enabled
    return enabled


def _forget_enabled() -> None:
    """A forked child has another process id: ``PROFILED_PARENT_PID`` may name its parent."""
    global _s1
    _s1 = _SEEN_NOTHING


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_enabled)


class _Profiled:
    """What ``profiled("name", step=...)`` returns: a decorator and a context manager.

    One instance may be entered many times at once (recursion, threads, asyncio tasks): each
    entry's state lives in a context variable, so threads and tasks never see each other's.

    The metrics-only path (``state.COUNT_ONLY``: metrics on, nothing else needs the block) keeps
    its start time on the instance instead (``_t0``): no context variable set, no session
    asked, no lock, nothing allocated. Only an instance that is not open already takes it
    (``with profiled("x"):`` makes one per block); an entry while it is open (recursion,
    another thread or task in the same instance) takes the context-variable path, and an
    exit looks there first. ``_t0`` is None when the path is free, 0.0 where it never
    applies (disabled, no name, made in compiled code), else the open entry's start. Two
    threads that enter one free object at the same instant may both take the path (the
    check and the set are two bytecodes): then one of their durations is measured from the
    other's start and the other is not counted; nothing raises and no range is involved.
    """

    __slots__ = ("name", "step", "enabled", "_t0")
    name: str | None

    def __init__(self, name: str | None, step: bool) -> None:
        if name is not None:
            if not name or name.isspace():  # (``not name.strip()``, without a new string)
                raise ValueError("the range name must not be empty")
            name = range_name(name)
            RANGE_NAMES.add(name)
        self.name = name
        self.step = step
        self.enabled = enabled = _enabled_now()
        self._t0 = None if enabled and name is not None else 0.0
        if step and enabled:
            state.declare_steps()

    @classmethod
    def _compiled(cls, step: bool) -> _Profiled:
        """Made inside ``torch.compile``d code: nothing global read or written there (Dynamo
        would guard on it: on RANGE_NAMES's contents, every compiled block recompiled at each
        new name anywhere); a step=True block's step still ends, which declares steps."""
        self = cls.__new__(cls)
        self.name, self.step, self.enabled, self._t0 = _COMPILED_NAME, step, True, 0.0
        return self

    def __repr__(self) -> str:
        return f"profiled({self.name!r}, step={self.step})"

    def __call__(self, target: F) -> F:
        if not self.enabled:
            _check_target(target)
            return target
        return _wrap(target, self.name, self.step)

    def __enter__(self) -> _Profiled:
        if self._t0 is None and _MODE is _COUNT_MODE and not _is_dynamo_compiling():
            self._t0 = _now()  # metrics only (see the class): ended in __exit__
            return self
        if _is_compiling():
            # no range in compiled code (see _torch.is_compiling); no state kept; and the
            # name is not read: a run-time name would be a guard, a recompile per name
            return self
        if self.name is None:
            raise TypeError('the context form needs a name: use `with profiled("name"):`')
        if not self.enabled:
            return self
        if (_MODE is None or _MODE is _RANGE_MODE) and not _FLAG._is_profiler_enabled:
            if not self.step:
                # nothing records and no step can end: keep no entry (setting the context
                # variable twice per block was most of an idle block's cost in a training step)
                return self
            entry = None
        else:
            entry = _enter(self.name)
        _CM_STACK.set(_CM_STACK.get() + ((self, entry),))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        t0 = self._t0
        if t0 and not _CM_STACK.get():  # the metrics-only entry, and no other is open here
            took = _now() - t0
            self._t0 = None
            m = _METRICS
            if m is None or self.step or _SWITCHED_AT > t0:
                self._timed_exit(m, took, t0)  # the rare cases, out of line
                return None
            # ``metrics.record`` inlined, as the sync wrapper does
            pending = m.pending.get(self.name)
            if pending is None:  # (a name's first block, or one past the cap)
                pending = m.pending_list(self.name)
            pending.append(took * 1e9)
            if len(pending) >= _BATCH:
                m.fold(self.name)
            return None
        if not self.enabled:
            return None
        if _is_compiling():
            if self.step:
                _compiled_step_returned()
            return None
        stack = _CM_STACK.get()
        # innermost entry of this instance (always the last one unless exits were misnested)
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is self:
                break
        else:
            if t0:  # the metrics-only entry, inside blocks of other instances
                took = _now() - t0
                self._t0 = None
                self._timed_exit(_METRICS, took, t0)
            return None
        entry = stack[i][1]
        _CM_STACK.set(stack[:i] + stack[i + 1 :])
        if entry is not None:
            entry.close(self.step)
        elif self.step:
            _step_if_counting()
        return None

    def _timed_exit(self, m: Any, took: float, t0: float) -> None:
        """The end of a metrics-only entry begun at ``t0`` that took ``took`` seconds: a step
        block's step, metrics switched off meanwhile, a profiler start or stop in between."""
        is_step = self.step
        if m is not None:
            if _SWITCHED_AT > t0:
                took, is_step = _without_own_switches(took, t0), False
            _record(m, self.name, took * 1e9, is_step)  # type: ignore[arg-type]
        if self.step:
            _step_if_counting()

    async def __aenter__(self) -> _Profiled:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        return self.__exit__(exc_type, exc, tb)


_BLOCK_NAMES: dict[str, str] = {}
"""Names given to ``profiled(name)``, each as ranges record it (``_block_name``): a block's
object is made without checking its name again (that was a quarter of its cost). At most
``_BLOCK_NAMES_MAX`` (run-time names, ``profiled(f"req{i}")``): past it, it starts again."""
_BLOCK_NAMES_MAX = 10_000


def _block_name(given: str) -> str:
    """``given`` checked (not blank) and made safe (``range_name``), added to ``RANGE_NAMES``
    and kept in ``_BLOCK_NAMES``."""
    if not given or given.isspace():  # (``not name.strip()``, without a new string)
        raise ValueError("the range name must not be empty")
    name = given
    if not name.isascii() or len(name) > _MAX_NAME or "\x00" in name:
        name = range_name(name)  # (a safe ASCII name is itself: no call for it)
    RANGE_NAMES.add(name)
    if len(_BLOCK_NAMES) >= _BLOCK_NAMES_MAX:
        _BLOCK_NAMES.clear()
    _BLOCK_NAMES[given] = name
    return name


def _check_target(target: Any) -> None:
    if isinstance(target, (classmethod, staticmethod)):
        target = target.__func__
    if not callable(target):
        raise TypeError(
            f"@profiled can decorate functions, methods and callables, not "
            f"{type(target).__name__} {target!r}"
        )


@overload
def profiled(target: F, /) -> F: ...
@overload
def profiled(name: str | None = None, /, *, step: bool = False) -> _Profiled: ...


def profiled(name_or_target: Any = None, /, *, step: bool = False) -> Any:
    """Record a named range around a function or a block.

    Forms: ``@profiled``, ``@profiled()``, ``@profiled("name")``, ``@profiled("name", step=True)``,
    ``with profiled("name"):`` and ``async with profiled("name"):``. The range name is the
    given name, else the function's ``__qualname__``. With ``step=True``, each return ends a
    profiler step. With ``PROFILED_ENABLED=0`` (read when applied) the function is returned
    unchanged and the context forms do nothing.
    """
    if step is not False and step is not True:  # (``isinstance(step, bool)``: no subclass)
        raise TypeError(f"step must be a bool, got {type(step).__name__} {step!r}")
    if isinstance(name_or_target, str):
        if _is_dynamo_compiling():
            # ``with profiled(f"step{i}")`` in compiled code: no range there, and the name
            # must stay out of the graph: read (checked, kept), each new name would be a
            # guard, and the function would recompile per name until Dynamo's limit sends it
            # back to eager. A new object all the same: Dynamo enters only context managers
            # made in the graph. (Dynamo's check, not ``is_compiling``'s, a fifth of its
            # cost: a non-strict export runs this code as eager code, and ``__enter__``
            # makes no range there.)
            return _Profiled._compiled(step)
        # ``_Profiled(name, step)`` inlined: ``with profiled("x"):`` makes one per block
        name = _BLOCK_NAMES.get(name_or_target)
        if name is None:
            name = _block_name(name_or_target)
        made = _new(_Profiled)
        made.name, made.step = name, step
        get = _env_get  # ``_enabled_now()`` inlined (a call less): unchanged environment
        if (
            get is not None
            and get(_K1) is _s1
            and get(_K3) is _s3
            and _config._names_checked
            and (_s1 is None or get(_K2) is _s2)
            and (_s3 is None or get(_K4) is _s4)
        ):
            enabled = _enabled_was
        else:
            enabled = _enabled_now()
        made.enabled = enabled
        made._t0 = None if enabled else 0.0
        if step and enabled:
            state.declare_steps()
        return made
    if name_or_target is None:
        if _is_compiling():
            return _Profiled._compiled(step)
        return _Profiled(None, step)
    if not enabled_from_env():
        _check_target(name_or_target)
        return name_or_target
    return _wrap(name_or_target, None, step)
