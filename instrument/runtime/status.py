"""What a session and the process are doing now, as plain frozen data.

``Session.status()`` answers for one session, ``instrument.testing.process_status()`` for the
process and the calling thread. Both are snapshots taken under no lock: meant for tests,
debugging and health checks, not for the hot path (a call builds a new object). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProcessStatus", "SessionStatus"]


@dataclass(frozen=True)
class SessionStatus:
    """One session's state (``Session.status()``)."""

    step: int
    """The step in progress: how many steps ended so far."""
    root_calls_end_steps: bool
    """A root decorated call (outermost on its thread or task) ends a step: only in the ambient
    session of a program with no ``step=True`` function that has not called ``step()``."""
    window_open: bool
    """A window is open: its warm-up or recorded steps run."""
    window_recording: bool
    """... and its torch profiler records."""
    window_thread: int | None
    """The thread (``threading.get_ident()``) that started the open window's profiler, or
    opened the window where none started yet; None where no window is open. A profiler that
    records only its own thread can be stopped only there."""
    windows_opened: int
    windows_ended: int
    stop_deferred: bool
    """An ended window's profiler still records, its stop waiting until the device work of
    the window has run (a CUDA window's deferred stop)."""
    stop_paused_thread: int | None
    """The thread whose CPU operators that deferred stop pauses meanwhile, if any."""
    stop_pending: bool
    """An ended window's stop waits for the thread that started its profiler."""
    deferred_stops: tuple[tuple[int, bool], ...]
    """The last deferred stops, oldest first: (steps the stop waited, whether the window's
    device work had completed by then rather than being waited for); ``(0, True)``: the work
    completed within ``stops.DRAIN_SPIN_S`` of the window's end, which stopped at once."""
    finished: bool
    """The schedule can open no more windows (decorated calls may go idle)."""
    closed: bool


@dataclass(frozen=True)
class ProcessStatus:
    """The process's and the calling thread's state (``process_status()``)."""

    calls_idle: bool
    """Decorated calls take the idle path: one flag check, nothing counted, timed or recorded
    (no session counts steps, metrics are off)."""
    calls_metrics_only: bool
    """Decorated calls only time themselves into the metrics histograms (metrics on, no session
    needs the calls, no torch profiler records)."""
    session: object | None
    """The started session decorated calls report to now (the ``Session`` object, to compare
    by identity; typed ``object`` here, as the session's module imports this one), or None."""
    profiler_on: bool
    """A torch profiler records in this process: one of ours or the program's own."""
    windows_recording: int
    """Windows of ours whose torch profiler records now (a deferred stop's included)."""
    depth: int
    """Decorated calls open on the calling thread or asyncio task (0: the next is a root call)."""
    open_blocks: int
    """``with profiled(...)`` blocks open there."""
    open_modules: int
    """Module forwards (``instrument_module``) open there."""
