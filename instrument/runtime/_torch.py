"""The only module that touches private torch APIs or checks torch versions.

- ``PROFILER_FLAG._is_profiler_enabled``: a plain Python bool that every torch profiler
  (``torch.profiler.profile``, ``torch.autograd.profiler.profile``, ours) sets while it records;
  ours then replaces torch's ``True`` with ``OURS`` (1), so that the flag says whose profiler
  it is (``orphaned_profiler``). The program's own starts and stops are seen through torch's
  ``_run_on_profiler_start/_stop``, wrapped here (``overtaken``, the range epoch).
  It is global, so threads the program starts see it too (``_profiler_enabled()`` in C++ reads
  False there even when ``profile_all_threads`` records them).
- ``FastRange``: ``torch._C._profiler._RecordFunctionFast`` (~0.2 µs idle, ~0.5 µs recording),
  falling back to ``record_function``.
- ``is_compiling()``: Dynamo is tracing; ranges are skipped there because
  ``_RecordFunctionFast`` graph-breaks and ``record_function`` is dropped.
- ``range_enter``/``range_exit``/``ranged_call``: every range of the SDK; a range never ends
  in another profiler than the one it began in.
- ``ProfilerWindow``: one torch profiler for one window (prepare, start, stop, export), which
  only the thread that started it can stop unless it records every thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.profiler

from ..analysis.events import (
    DEVICE_CATEGORIES,
    UNFINISHED,
    USER_ANNOTATION,
    Event,
    count_flops_once,
    kineto_flops,
    range_annotation,
)

__all__ = [
    "FastRange",
    "PROFILER_FLAG",
    "ProfilerWindow",
    "TORCH_VERSION",
    "cuda_present",
    "default_activities",
    "device_name",
    "distributed_info",
    "is_compiling",
    "is_dynamo_compiling",
    "on_switch",
    "OURS",
    "profiler_on",
    "run_after_graph",
    "safe_name",
]

TORCH_VERSION = torch.__version__


class _AlwaysCheck:
    """Stand-in when torch has no Python-level flag: always take the checked path."""

    _is_profiler_enabled = True


try:
    import torch.autograd.profiler as _autograd_profiler

    _autograd_profiler._is_profiler_enabled  # noqa: B018  (present since torch 2.1)
    PROFILER_FLAG: Any = _autograd_profiler
except (ImportError, AttributeError):  # pragma: no cover - old torch
    PROFILER_FLAG = _AlwaysCheck()


OURS = 1
"""What ``PROFILER_FLAG._is_profiler_enabled`` holds while a window of ours records: truthy like
the ``True`` torch's own start writes there (every reader tests its truth), yet not ``True``,
so that a profiler of ours left on with no window to end it can be told (``orphaned_profiler``)."""


def profiler_on() -> bool:
    """True while any torch profiler is recording in this process."""
    if isinstance(PROFILER_FLAG, _AlwaysCheck):  # pragma: no cover - old torch
        return bool(torch.autograd._profiler_enabled())
    return bool(PROFILER_FLAG._is_profiler_enabled)


try:
    from torch._C._profiler import _RecordFunctionFast as FastRange
except ImportError:  # pragma: no cover - old torch
    FastRange = torch.autograd.profiler.record_function  # type: ignore[assignment,misc]

# True while Dynamo traces the calling code. Torch's own function, not a wrapper around it:
# one Python frame less on the hot path, and Dynamo recognises it by identity.
try:
    from torch.compiler import is_compiling
except ImportError:  # pragma: no cover - old torch
    from torch._dynamo import is_compiling  # type: ignore[no-redef, unused-ignore]

# True only while Dynamo traces (``is_compiling`` is also true in non-strict export, which runs
# the Python code): ``return False`` in eager, a fifth of ``is_compiling``'s cost, which checks
# ``torch.jit.is_scripting()`` first. The metrics-only path uses it: a call timed during a
# non-strict export trace only adds one count.
try:
    from torch.compiler import is_dynamo_compiling
except ImportError:  # pragma: no cover - old torch
    is_dynamo_compiling = is_compiling


# ---------------------------------------------------------------- range names

MAX_NAME = 1024
"""Longest range name torch is given, in characters: a longer one is cut, with a hash of the
whole (``safe_name``). Every event of a range carries its name: a 1 MB name called 1000 times
in a window is a 1 GB trace."""

_UNSAFE = re.compile("[\x00\ud800-\udfff]")


def safe_name(name: str) -> str:
    """``name`` as torch can record it, the same for the same name; ``name`` itself when it is
    safe already (almost always, told by one ``isascii``/``in`` test for ASCII names).

    torch hands a range's name to C++ as UTF-8: a name holding a surrogate (a file name from
    ``os.listdir`` with ``surrogateescape``, a lone half of a pair) makes the range's start
    raise ``RuntimeError: error unpacking string as utf-8``, and a NUL cuts the recorded name
    short there. So each becomes a percent escape of what it stands for (URL style): the byte
    ``%FF`` for ``os.fsdecode(b"\\xff")``'s ``\\udcff``, ``%uD800`` for a lone half, ``%00``
    for NUL. Not a backslash escape: torch's trace writer turns every backslash into ``/``,
    and the name in the trace would no longer be the range's. A name over ``MAX_NAME``
    characters keeps its head and ends with ``...#`` and 12 hex digits of a BLAKE2 hash of the
    whole. Called where a name is given (decoration, the context form's construction, module
    paths), never per call."""
    if len(name) <= MAX_NAME and (
        ("\x00" not in name) if name.isascii() else _UNSAFE.search(name) is None
    ):
        return name
    safe = _UNSAFE.sub(_escape, name)
    if len(safe) > MAX_NAME:
        digest = hashlib.blake2b(safe.encode("utf-8"), digest_size=6).hexdigest()
        safe = f"{safe[: MAX_NAME - 16]}...#{digest}"
    return safe


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the byte code - 0xDC00
        return f"%{code - 0xDC00:02X}"
    return f"%{code:02X}" if code < 0x100 else f"%u{code:04X}"


# ---------------------------------------------------------------- ranges across windows
#
# A ``_RecordFunctionFast`` keeps, from its ``__enter__``, a pointer into the state of the
# profiler that was on then. Ended (``__exit__``) or freed while another profiler is on, it
# writes into the first one's freed memory: a segfault, also in plain torch. Ranges may
# legally stay open across any number of windows (a ``with profiled(...)`` around a loop that
# steps, a thread or an asyncio task holding one), so every range of ours goes through
# ``range_enter``/``range_exit``: a range whose profiler is no longer the one on is never
# ended, and is kept (``_orphans``) until no profiler is on, when freeing it touches nothing.
# Torch marks its event in the window it began in ``"finished": false``, and the report counts
# it (``RangeStats.open_calls``).
#
# A range's end takes ``_range_lock``: the epoch's check and ``rf.__exit__()`` run under it.
# Our profiler's start and stop move the epoch and change torch's state under it
# (``_profiler_changes``), and the program's own start moves the epoch under it before torch
# enables its profiler (``_foreign_change`` from ``_run_on_profiler_start``), so an end either
# runs wholly before the change, in the profiler it began in, or sees the new epoch and keeps
# the range. A tracing or profiling hook that runs Python code inside an end (coverage, a
# debugger) holds the lock meanwhile, and the next start waits for it. (The program's own stop
# moves the epoch after torch's: an end held past it ends with no profiler on, a no-op.)
# An end without the lock (issue 31: ~1.08x a bare ``_RecordFunctionFast`` closure, where the
# lock costs ~1.45x on the 2-core VM; off by default after its first failure) was removed:
# tests/test_range_ends.py's race segfaulted with it on a GPU host (Kineto with CUPTI, 3 runs
# of 4) and passed with the lock (BENCHMARKS.md).

_range_lock = threading.RLock()
"""Held by every range's end, by our profiler's start and stop and by the epoch's move at the
program's own: a range never ends (in C++) while a profiler changes underneath it."""
_epoch = 0
"""Bumped (under ``_range_lock``) at each start and stop of any torch profiler: ours
(``_profiler_changes``) and the program's (``_foreign_change``)."""
_orphans: list[Any] = []
"""Ranges whose profiler ended before they did: freed once no profiler is on."""


def switches() -> int:
    """How many times any torch profiler (ours or the program's) started or stopped so far (a
    count that moves at each; only its changes mean anything): a step in which it moved
    holds a profiler's start-up or stop, kept out of the step statistics."""
    return _epoch


def range_enter(name: str) -> list[Any]:
    """Begin a range in the profiler that is on; pass the result to ``range_exit``, in a
    ``finally`` entered right after this returns (a dropped holder would free a live range
    wherever its last reference goes; a finalizer guarding that cost ~300 ns a range)."""
    epoch = _epoch  # read first: a start or stop from here on makes the range an orphan
    rf = FastRange(name)
    try:
        rf.__enter__()
    except BaseException:
        # an interrupt (a signal handler's exception) right as it began: end it now, in the
        # profiler it began in, so that no frame a traceback keeps holds a live range
        try:
            rf.__exit__(None, None, None)
        except RuntimeError:  # it had not begun
            pass
        raise
    return [rf, epoch]


def ranged_call(f: Any, name: str, args: Any, kwargs: Any) -> Any:
    """``f(*args, **kwargs)`` inside a range: ``range_enter`` and ``range_exit`` written out in
    one frame on purpose (the hot path of a decorated call while a profiler records: two more
    Python calls cost ~100 ns there; see ``range_exit`` for the rule)."""
    epoch = _epoch
    rf: Any = FastRange(name)
    try:
        rf.__enter__()
        return f(*args, **kwargs)
    finally:
        with _range_lock:  # (see the section's comment)
            if epoch == _epoch:
                try:
                    rf.__exit__()
                except RuntimeError:  # not begun, or torch's own check failed: keep it
                    _orphans.append(rf)
            else:
                _orphans.append(rf)
            rf = None  # a traceback that keeps this frame must not keep the range


def range_exit(opened: list[Any]) -> None:
    """End a range begun by ``range_enter`` if the profiler it began in is still the one on
    (told by the epoch, which every start and stop of any torch profiler moves), else keep it
    unended until it can be freed safely; under ``_range_lock``. The holder lets go of it
    either way: a frame kept alive by a traceback must never free a range later, under
    another profiler."""
    rf = opened[0]
    if rf is None:
        return
    with _range_lock:  # (see the section's comment)
        if opened[1] == _epoch:
            try:
                rf.__exit__()
            except RuntimeError:  # torch's own check failed: keep it, never crash (not
                _orphans.append(rf)  # wider: a signal handler's exception must reach the program)
        else:
            _orphans.append(rf)
        opened[0] = None


# ---------------------------------------------------------------- the program's own profilers
#
# Every torch.profiler start and stop (torch.profiler.profile, torch.autograd.profiler.profile,
# emit_nvtx, ...) ends in ``torch.autograd.profiler._run_on_profiler_start/_stop``; ours too.
# Wrapped, they tell the program's own starts and stops from ours: each moves the epoch (a
# range must not end across them either: two of the program's profilers in a row look alike
# to the flag) and is counted. One that starts while a window of ours records overtakes it
# (``ProfilerWindow.overtaken``), on any thread: an all-threads window's state is replaced,
# and stopping a thread-local window after another thread's profiler started and stopped
# crashes in torch (2.13, plain torch.profiler: a segfault in the first one's stop).

_foreign_total = 0  # the program's profiler starts and stops so far
_changing_thread: int | None = None  # the thread inside one of our starts or stops


def _foreign_change() -> None:
    global _epoch, _foreign_total
    with _range_lock:
        if _changing_thread == threading.get_ident():
            return  # our own start or stop
        _epoch += 1
        _foreign_total += 1


SWITCHES_SEEN = False
"""Every start and stop of a torch profiler (the program's and ours) is seen here and told to
``on_switch`` listeners: the flag changes only in ``_run_on_profiler_start/_stop`` (wrapped)
and in this module (``_flag_off``)."""
_switch_listeners: list[Any] = []


def on_switch(listener: Any) -> None:
    """Call ``listener()`` after every start and stop of any torch profiler (it must not
    raise: it runs inside the program's profiler start)."""
    _switch_listeners.append(listener)


def _switched() -> None:
    for listener in _switch_listeners:
        listener()


def _flag_off() -> None:
    """Clear the flag by hand (a start or stop of ours cut short), and say so."""
    if not isinstance(PROFILER_FLAG, _AlwaysCheck):
        PROFILER_FLAG._is_profiler_enabled = False
    _switched()


def _watch_program_profilers() -> None:
    global SWITCHES_SEEN
    try:
        import torch.autograd.profiler as autograd_profiler

        start = autograd_profiler._run_on_profiler_start
        stop = autograd_profiler._run_on_profiler_stop
    except (ImportError, AttributeError):  # pragma: no cover - not in the torch we support
        return

    def on_start() -> None:
        start()
        _foreign_change()
        _switched()

    def on_stop() -> None:
        stop()
        _foreign_change()
        _switched()

    autograd_profiler._run_on_profiler_start = on_start
    autograd_profiler._run_on_profiler_stop = on_stop
    SWITCHES_SEEN = not isinstance(PROFILER_FLAG, _AlwaysCheck)


_watch_program_profilers()


def _profiler_changes() -> None:
    """Under ``_range_lock``, right before our profiler starts or stops: ranges begun so far
    must not end in C++ from now on (and none is ending now: ends take the lock)."""
    global _epoch
    _epoch += 1


def _free_orphans() -> None:
    """Under ``_range_lock``: free the ranges kept unended, if no profiler is on (freeing one
    then runs no profiler callback on freed state)."""
    if _orphans and not profiler_on() and not torch.autograd._profiler_enabled():
        _orphans.clear()


def run_after_graph(fn: Any) -> None:
    """Let ``fn()`` be called inside ``torch.compile``d code without a graph break: Dynamo
    moves the call to after the graph runs (``reorderable_logging_functions``, torch >= 2.5;
    elsewhere the call breaks the graph).

    Registered when ``torch._dynamo`` is imported, not before: importing it costs ~1 s (it is
    most of what ``import instrument`` cost), and nothing is compiled until it is loaded."""
    import wrapt

    def register(_dynamo: Any) -> None:
        try:
            import torch._dynamo.config as dynamo_config

            dynamo_config.reorderable_logging_functions.add(fn)
        except Exception:  # noqa: BLE001 - old torch or a broken Dynamo: graph breaks
            pass

    wrapt.register_post_import_hook(register, "torch._dynamo")


_ACTIVITY = {
    "cpu": "CPU",
    "cuda": "CUDA",
    "xpu": "XPU",
    "mtia": "MTIA",
    "hpu": "HPU",
    "privateuse1": "PrivateUse1",
}


def cuda_present() -> bool:
    """Whether torch sees a GPU (CUDA or ROCm), asked so that a child this process forks later
    can still use it: ``torch.cuda.is_available()`` would forbid that (torch marks every later
    fork unusable for CUDA once it has asked the driver), where ``device_count()`` asks NVML
    (amdsmi on ROCm) and the driver only where NVML cannot answer (no NVML library, MIG
    devices named in ``CUDA_VISIBLE_DEVICES``). Never initializes CUDA; NVML's own warning
    when it cannot start is not shown (the driver's answer is what counts)."""
    try:
        if torch.cuda.is_initialized():
            return True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001 - a broken driver must not break profiling
        return False


def _accelerator() -> str | None:
    if cuda_present():
        return "cuda"
    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        return None  # a CUDA or ROCm build without a GPU: no other accelerator to ask for
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "current_accelerator"):
        try:
            dev = acc.current_accelerator() if acc.is_available() else None
        except Exception:  # noqa: BLE001 - a broken driver must not break profiling
            dev = None
        return None if dev is None else dev.type
    return None


def default_activities() -> tuple[str, ...]:
    """CPU plus the accelerator torch sees, when it has a profiler activity."""
    acc = _accelerator()
    if acc in _ACTIVITY and acc != "cpu":
        return ("cpu", acc)
    return ("cpu",)


def _torch_activities(names: tuple[str, ...]) -> list[Any]:
    out = []
    for name in names:
        member = getattr(torch.profiler.ProfilerActivity, _ACTIVITY[name], None)
        if member is None:
            raise ValueError(f"this torch ({TORCH_VERSION}) has no profiler activity {name!r}")
        out.append(member)
    return out


def device_name(activities: tuple[str, ...]) -> str:
    """A human name of the device a window profiles: the GPU's name, else ``cpu``. Where this
    process has not initialized CUDA, no torch work ran on a GPU: ``cpu``, never asking the GPU's
    name (that would initialize CUDA in a program that does not use it: a context's device
    memory, and a forked child that uses CUDA then fails)."""
    for name in activities:
        if name == "cuda":
            if not torch.cuda.is_initialized():
                return "cpu"
            try:
                return torch.cuda.get_device_name()
            except Exception:  # noqa: BLE001
                return "cuda"
        if name != "cpu":
            return name
    return "cpu"


_last_distributed: dict[str, Any] | None = None


def distributed_info() -> dict[str, Any]:
    """rank, world_size and backend: from torch.distributed when initialised, else from the
    launcher's variables (``RANK``/``WORLD_SIZE``, else ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``;
    backend None).

    Once torch.distributed has been seen initialised, its answer is kept: a window exported
    after ``destroy_process_group()`` (at exit) still names the rank that recorded it, also
    where no launcher variable says it (``mp.spawn`` with ``init_process_group(rank=...)``).
    """
    global _last_distributed
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            _last_distributed = {
                "rank": int(dist.get_rank()),
                "world_size": int(dist.get_world_size()),
                "backend": str(dist.get_backend()),
            }
            return dict(_last_distributed)
    except Exception:  # noqa: BLE001 - a broken process group must not break profiling
        pass
    if _last_distributed is not None:
        return dict(_last_distributed)
    from .ranks import launcher_ranks_from_env

    rank, world_size = launcher_ranks_from_env()
    return {"rank": rank, "world_size": world_size, "backend": None}


def host_name() -> str:
    return socket.gethostname()


def _experimental_config(all_threads: bool, profile_memory: bool) -> Any:
    """``all_threads``: record ranges and operators from every thread, not only the one that
    started the profiler (torch's default, and ours).

    Off by default because torch's all-threads profiling is not safe while other threads run
    operators: its start and stop swap a process-wide profiler state that those threads'
    operator callbacks read without a lock. Plain torch.profiler windows started and stopped
    while 4 threads ran ``x + 1`` crashed the process in 4 of 4 runs of 100 windows (also with
    20 ms between windows), torch's default in 0 of 4. Not with ``profile_memory`` either:
    with ``profile_all_threads=True`` torch 2.13 records no ``[memory]`` events at all.
    """
    if not all_threads or profile_memory:
        return None
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):  # pragma: no cover - torch without the option
        return None


class ProfilerWindow:
    """One torch.profiler for one window: ``prepare()`` (warmup), ``start()``, ``stop()``, export.

    The window never uses torch's own schedule: the session decides every transition.
    """

    def __init__(
        self,
        activities: tuple[str, ...],
        *,
        record_shapes: bool,
        profile_memory: bool,
        with_stack: bool,
        with_flops: bool,
        all_threads: bool = False,
    ) -> None:
        kwargs: dict[str, Any] = dict(
            activities=_torch_activities(activities),
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
        )
        config = _experimental_config(all_threads, profile_memory)
        if config is not None:
            kwargs["experimental_config"] = config
        self.all_threads = config is not None  # a stop from any thread finds its session
        self._prof = torch.profiler.profile(**kwargs)
        self.activities = tuple(activities)
        # the thread that started the profiler: only it can stop one that records only it
        # (torch keeps such a profiler's state and callbacks in that thread's locals)
        self.owner: threading.Thread = threading.current_thread()
        self._owner_life: _LifeRef | None = None  # set by start()
        self._foreign_mark = 0
        self.with_flops = with_flops
        self.prepared = False
        self.recording = False

    def prepare(self) -> None:
        import warnings

        with warnings.catch_warnings():
            # torch 2.11 warns that a new cycle clears the last one's events: each of our
            # windows is its own profiler, so there is nothing to keep
            warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
            with _inductor_left_alone():
                self._prof.prepare_trace()
        self.prepared = True

    def start(self) -> bool:
        """Start recording; False (nothing done) where a profiler is on already: torch
        profilers do not overlap, and two sessions' windows (one closing on another thread)
        can both find none on just before. Checked and started under one lock."""
        global _changing_thread
        with _range_lock:
            if _LIVE or profiler_on():
                return False
            if not self.prepared:
                self.prepare()
            _profiler_changes()
            _changing_thread = threading.get_ident()
            try:
                self._prof.start_trace()
            except BaseException:
                self.prepared = False  # never started: nothing for stop() to end
                if profiler_on():  # torch's start got as far as its flag: undo it
                    _force_off()
                raise
            finally:
                _changing_thread = None
            self.recording = True
            self.owner = threading.current_thread()
            self._owner_life = _thread_life()
            self._foreign_mark = _foreign_total
            _LIVE.add(self)
            if not isinstance(PROFILER_FLAG, _AlwaysCheck):
                PROFILER_FLAG._is_profiler_enabled = OURS
            return True

    def stoppable_here(self) -> bool:
        """The calling thread may stop this window: any thread for an all-threads profiler,
        else only the thread that started it."""
        return self.all_threads or not self.recording or threading.current_thread() is self.owner

    def owner_gone(self) -> bool:
        """The thread that started this thread-local window has ended: its profiler state
        went with the thread's locals, nothing is left to stop."""
        life = self._owner_life
        return (
            self.recording
            and not self.all_threads
            and not (self.owner.is_alive() and life is not None and life.alive)
        )

    def forget(self) -> None:
        """Drop a window whose owner thread ended (``owner_gone``): its profiler state went
        with that thread, but torch is left half-on (a process that then exits without
        another profiler start and stop crashes in torch's static teardown: seen on 2.13 with
        plain torch.profiler, 3 runs of 3), so one empty start and stop here clears it."""
        global _changing_thread
        with _range_lock:
            _profiler_changes()
            self.abandon()
            if (
                not _LIVE
                and not isinstance(PROFILER_FLAG, _AlwaysCheck)
                and (PROFILER_FLAG._is_profiler_enabled is OURS)
            ):
                _flag_off()
            if not _LIVE and not profiler_on():
                _changing_thread = threading.get_ident()
                try:
                    clear = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                    with _inductor_left_alone():
                        clear.start()
                    clear.stop()
                except Exception:  # noqa: BLE001 - nothing better to do: windows go on
                    pass
                finally:
                    _changing_thread = None
                    _flag_off()
            _free_orphans()

    def overtaken(self) -> bool:
        """A torch profiler of the program's started while this window recorded. torch's
        start replaced this window's profiling state with its own, so stopping this window
        would end the program's profiler (and its trace export would then crash), and if it
        has stopped already it ended this one too: either way the window must be abandoned,
        not stopped. Also on another thread, for a window that records only its own: torch
        crashes in a thread-local profiler's stop once another thread's has started and
        stopped. Told by ``_foreign_change``'s count of the program's starts and stops."""
        return self.recording and _foreign_total != self._foreign_mark

    def end_marker_event(self) -> Any:
        """A CUDA event recorded now on the current stream, for a deferred stop: once it has
        completed, the window's kernels on this stream have run and Kineto has their
        records, so ``stop(sync=False)`` loses none of them. None where the window records no
        CUDA work, records only its own thread and this is another (only that thread can end
        the deferred stop), or torch cannot stop without synchronising (then stop at once).
        A thread-local window's drain ends at that thread's steps, its next decorated call,
        or flush()/shutdown()/exit there: the drain's timer cannot stop it."""
        if not (
            self.recording
            and "cuda" in self.activities
            and (self.all_threads or threading.current_thread() is self.owner)
            and hasattr(getattr(self._prof, "profiler", None), "use_device")
            and torch.cuda.is_initialized()  # else no kernel of torch's ran: nothing to wait for
        ):
            return None
        try:
            event = torch.cuda.Event()
            event.record()
        except Exception:  # noqa: BLE001 - e.g. inside a CUDA graph capture: stop at once
            return None
        return event

    def stop(self, *, sync: bool = True) -> None:
        """Stop recording; with ``sync`` (torch's way) after synchronising the device. Safe to
        call twice. Where torch's stop fails part-way (a device error; an interrupt cannot
        reach it: the session stops windows in ``atomic`` blocks), the profiler is switched
        off all the same (``_force_off``) and the error raised: never a profiler left on."""
        global _changing_thread
        with _range_lock:
            _profiler_changes()
            _changing_thread = threading.get_ident()
            try:
                if self.recording:
                    inner = self._prof.profiler
                    if inner is not None and (not sync or not _cuda_in_use(inner.use_device)):
                        # torch.autograd.profiler.profile.__exit__ synchronises its device
                        # when use_device is set: without ``sync`` the caller made sure the
                        # window's kernels have run; where this process never initialized
                        # CUDA none ran, and torch's synchronize would initialize it
                        inner.use_device = None
                    self._prof.stop_trace()
            except BaseException:
                _force_off()
                raise
            finally:
                _changing_thread = None
                self.recording = False
                self.prepared = False
                _LIVE.discard(self)
                _free_orphans()

    def abandon(self) -> None:
        """Forget a prepared window without touching torch: used when the user's own profiler
        started meanwhile (its own prepare replaced ours; starting or stopping ours would
        disable theirs)."""
        self.prepared = False
        self.recording = False
        _LIVE.discard(self)

    def events(self) -> list[tuple] | None:
        """The stopped window's events as ``events.Event`` tuples, read straight from
        Kineto's results (no trace JSON, no ``key_averages()``); None where this torch's
        events lack what that needs (then analyze the exported trace)."""
        from ..analysis.events import no_gc

        inner = self._prof.profiler
        if inner is None:
            return None
        try:
            with no_gc():
                return kineto_events(inner.kineto_results, self.with_flops)
        except NotImplementedError:
            return None

    def export_chrome_trace(self, path: str) -> None:
        self._prof.export_chrome_trace(path)


@contextlib.contextmanager
def _inductor_left_alone() -> Iterator[None]:
    """torch's ``prepare_trace`` asks ``hasattr(torch, "_inductor")`` to read one setting
    (``triton.cudagraphs``, for a CUPTI workaround): torch's lazy ``__getattr__`` imports
    Inductor for that (sympy, mpmath...: 822 modules, 2.2-4.5 s on the busy 2-core box, in the
    step that starts the first window). Where Inductor is not imported yet, nothing can have
    set that setting but its environment variable, so the question gets torch's answer for a
    missing module here, on this thread only (others see torch's ``__getattr__`` as ever),
    and the program pays nothing: the first start costs ~10 ms, not seconds. Where Inductor
    is loaded, or ``TORCHINDUCTOR_CUDAGRAPHS=1``, torch asks as it always does."""
    lazy = torch.__dict__.get("__getattr__")
    if (
        lazy is None
        or "torch._inductor" in sys.modules
        or os.environ.get("TORCHINDUCTOR_CUDAGRAPHS") == "1"
    ):
        yield
        return
    me = threading.get_ident()

    def without_inductor(name: str) -> Any:
        if name == "_inductor" and threading.get_ident() == me:
            raise AttributeError(f"module 'torch' has no attribute {name!r}")
        return lazy(name)

    global _inductor_patch
    _inductor_patch = (without_inductor, lazy)
    setattr(torch, "__getattr__", without_inductor)  # noqa: B010 - torch's module __getattr__
    try:
        yield
    finally:
        _put_back_torch_getattr()


_inductor_patch: tuple[Any, Any] | None = None  # (ours, torch's) while the question is ours


def _put_back_torch_getattr() -> None:
    """torch's lazy ``__getattr__`` back where ours stands (also in a child forked from
    another thread meanwhile, where a thread of the same id would be told forever that
    ``torch._inductor`` does not exist)."""
    global _inductor_patch
    patch, _inductor_patch = _inductor_patch, None
    if patch is not None and torch.__dict__.get("__getattr__") is patch[0]:
        setattr(torch, "__getattr__", patch[1])  # noqa: B010


def _cuda_in_use(use_device: Any) -> bool:
    """Whether a profiler's ``use_device`` has device work to wait for at its stop: anything
    but CUDA is left to torch; CUDA only where this process initialized it (asking for a
    synchronize would initialize CUDA in a program that never used it: a context's device
    memory, and a forked child that uses CUDA would fail)."""
    return use_device != "cuda" or torch.cuda.is_initialized()


class _ThreadLife:
    """Kept in a thread's local storage from its first window; goes when the thread ends,
    also for threads ``threading`` did not start (whose ``_DummyThread`` says it is alive for
    ever). Python clears a thread's locals on that thread, as it ends: the last moment its
    thread-local profiler can be stopped. A window still recording there is stopped then,
    so its session reports it as usual at the window's end (torch 2.11 with CUDA: after a
    thread ended with its profiler on, no profiler could start again in the process, plain
    torch.profiler included; torch 2.13: the process crashed at exit).

    A forked child clears the parent's other threads' locals as it starts, before any at-fork
    hook runs: their windows are the parent's (a copy here), never stopped from the child,
    whose copies of the parent's locks may be held for good (children hung there)."""

    __slots__ = ("alive", "pid", "__weakref__")

    def __init__(self) -> None:
        self.alive = True
        self.pid = os.getpid()

    def __del__(self) -> None:
        self.alive = False
        if os.getpid() != self.pid:
            return
        try:
            for window in list(_LIVE):
                life = window._owner_life
                if not window.all_threads and life is not None and life.is_of(self):
                    window.stop()
        except Exception:  # noqa: BLE001 - a thread's end must never fail because of us
            pass


_LIFE = threading.local()


def _thread_life() -> _LifeRef:
    """The calling thread's ``_ThreadLife``, weakly (a window must not keep it alive)."""
    life = getattr(_LIFE, "life", None)
    if life is None:
        life = _LIFE.life = _ThreadLife()
    return _LifeRef(life)


class _LifeRef:
    """A window's view of its owner's ``_ThreadLife``: alive while that thread is."""

    __slots__ = ("_ref",)

    def __init__(self, life: _ThreadLife) -> None:
        self._ref = weakref.ref(life)

    @property
    def alive(self) -> bool:
        life = self._ref()
        return life is not None and life.alive

    def is_of(self, life: _ThreadLife) -> bool:
        return self._ref() is life


_LIVE: set[ProfilerWindow] = set()
"""Our windows whose profiler records now."""


def orphaned_profiler() -> bool:
    """The flag says a profiler of ours records, yet no window of ours does: an earlier
    window's start or stop was cut short where nothing could finish it. ``_force_off`` ends
    it, so that sampling goes on."""
    if isinstance(PROFILER_FLAG, _AlwaysCheck):  # pragma: no cover - old torch
        return False
    return PROFILER_FLAG._is_profiler_enabled is OURS and not _LIVE


def _force_off() -> None:
    """End whatever profiler of ours may still be on after a start or stop that did not
    finish, and clear torch's flag: its results are dropped. Under ``_range_lock``."""
    with _range_lock:
        _profiler_changes()
        try:
            from torch.autograd.profiler import _disable_profiler

            _disable_profiler()  # prints a C++ warning (not raised) when none is running
        except Exception:  # noqa: BLE001 - none was running
            pass
        _flag_off()
        _free_orphans()


def after_fork_in_child() -> None:
    """A forked child: the parent's profiler is not its own (its state is a copy), another of
    the parent's threads may have held ``_range_lock``, and the parent's orphan ranges must
    never be freed here (their profiler's callbacks would run on copied state)."""
    global _range_lock, _orphans, _changing_thread
    _range_lock = threading.RLock()
    _inherited_orphans.extend(_orphans)  # kept for good
    _orphans = []
    _LIVE.clear()
    _changing_thread = None
    _put_back_torch_getattr()
    if not isinstance(PROFILER_FLAG, _AlwaysCheck) and PROFILER_FLAG._is_profiler_enabled is OURS:
        _flag_off()


_inherited_orphans: list[Any] = []

if hasattr(os, "register_at_fork"):  # torch's __getattr__ back in a child also where this
    # module is loaded without ``state`` (whose hook calls ``after_fork_in_child``): the package
    # face is lazy, and ``from instrument import _torch`` loads no runtime
    os.register_at_fork(after_in_child=_put_back_torch_getattr)


def end_orphaned_profiler() -> bool:
    """``_force_off`` when ``orphaned_profiler()``; True if it did."""
    with _range_lock:
        if not orphaned_profiler():
            return False
        _force_off()
        return True


def kineto_events(results: Any, with_flops: bool = True) -> list[Any]:
    """Normalise ``_ProfilerResult.events()`` into ``events.Event`` tuples.

    Mirrors ``torch.autograd.profiler.profile._parse_kineto_results``: a CPU operator's id is
    its ``correlation_id()``; runtime calls and device work point at it through
    ``linked_correlation_id()``; runtime calls take the thread of the operator they belong to
    (Kineto reports them with the OS thread id, operators with torch's own).

    One loop over every event of a window (~140k in a big one): the classes stay integer
    literals and the per-event work inline; only a new (name, category) pair calls out.
    """
    raw = _kineto_raw_events(results)
    op_thread: dict[int, Any] = {}
    out: list[Event] = []
    runtime: list[tuple] = []
    carrying: list[int] = []  # the operators with FLOPs (``count_flops_once``)
    append = out.append
    new = tuple.__new__  # Event(...) costs ~300 ns, this ~120 (see events.Event)
    # per (name, category): 0 skip, 1 operator, 2 bookkeeping, 3 runtime, 4 device
    classes: dict[tuple[str, str], int] = {}
    threads: dict[int, tuple[str, int]] = {}
    for e in raw:
        name = e.name()
        cat = e.activity_type()
        cls = classes.get((name, cat))
        if cls is None:
            cls = classes[(name, cat)] = _kineto_class(name, cat)
        if cls == 1:
            if e.is_hidden_event():
                continue
            tid = e.start_thread_id()
            thread = threads.get(tid)
            if thread is None:
                thread = threads[tid] = ("cpu", tid)
            ext = e.correlation_id()
            op_thread[ext] = thread
            flops = nbytes = flags = 0
            if with_flops:
                flops, nbytes, flags = kineto_flops(name, e.flops(), e.shapes, e.dtypes)
                if flops:
                    carrying.append(len(out))
            if cat == "user_annotation" and range_annotation(name):
                flags |= USER_ANNOTATION
            if e.end_thread_id() == 0:  # cut short by the stop (torch's ids start at 1)
                flags |= UNFINISHED
            start, dur = e.start_ns(), e.duration_ns()
            append(new(Event, ("cpu", name, start, dur, thread, ext, 0, flops, nbytes, flags)))
        elif cls == 3:
            start, dur = e.start_ns(), e.duration_ns()
            runtime.append((name, start, dur, e.start_thread_id(), e.linked_correlation_id()))
        elif cls == 4:
            lane = ("dev", e.device_index(), e.device_resource_id())
            start, dur, link = e.start_ns(), e.duration_ns(), e.linked_correlation_id()
            append(new(Event, (DEVICE_CATEGORIES[cat], name, start, dur, lane, 0, link, 0, 0, 0)))
        elif cls == 2:
            start, dur, os_thread = e.start_ns(), e.duration_ns(), ("os", e.start_thread_id())
            append(new(Event, ("overhead", name, start, dur, os_thread, 0, 0, 0, 0, 0)))
    _append_runtime_calls(out, runtime, op_thread)
    count_flops_once(out, carrying)
    return out


def _kineto_raw_events(results: Any) -> list[Any]:
    """``results.events()``, refusing a torch whose events carry no category."""
    raw = results.events() if results is not None else []
    if raw and not hasattr(raw[0], "activity_type"):
        # torch < 2.13 (2.11 on the H200 host): no category per event; the caller reads the
        # trace JSON instead (slower, same numbers)
        raise NotImplementedError("this torch's Kineto events carry no activity_type()")
    return raw


def _kineto_class(name: str, cat: str) -> int:
    """How ``kineto_events`` handles events of this name and category: 0 skip, 1 operator,
    2 bookkeeping (the profiler's own), 3 runtime call, 4 device work."""
    from ..analysis.events import (
        CPU_OP_CATEGORIES,
        DEVICE_CATEGORIES,
        FILTERED_NAMES,
        RUNTIME_CATEGORIES,
        is_bookkeeping,
    )

    if name in FILTERED_NAMES:
        return 0
    if cat in CPU_OP_CATEGORIES or cat in RUNTIME_CATEGORIES:
        return 2 if is_bookkeeping(name) else (1 if cat in CPU_OP_CATEGORIES else 3)
    if cat in DEVICE_CATEGORIES:
        return 4
    if cat == "overhead" or is_bookkeeping(name):
        return 2
    return 0


def _append_runtime_calls(out: list[Any], runtime: list[tuple], op_thread: dict[int, Any]) -> None:
    """Runtime calls, each on the thread of the operator that made it (its OS thread when
    that operator is not in the window), after every operator has been seen."""
    from ..analysis.events import Event

    append = out.append
    new = tuple.__new__
    for name, start, dur, tid, link in runtime:
        thread = op_thread.get(link, ("os", tid))
        append(new(Event, ("cpu", name, start, dur, thread, 0, link, 0, 0, 0)))
