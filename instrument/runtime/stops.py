"""Stopping a window's profiler: now, deferred, or by the thread that owns it.

A window's profiler records the thread that started it, and only that thread can stop it: a
stop due on another thread waits for the owner (``PendingStop``). A CUDA window whose steps
were short is not stopped at its end but once the event recorded there has completed
(``DeferredStop``): torch's own stop would synchronise the device and leave it idle while
Kineto processes its buffers. A stopped window goes to the session's pipeline (``hand_over``).
A window the program's own torch.profiler overtook is abandoned, never stopped (that would end
the program's). Every method runs under the session's lock.

``Stops`` holds no session: what it needs comes in as arguments (the session's lock, pipeline,
``Handed`` count, who steps), and what happens goes back through the session's own methods it
was given (``lost``: why a window is lost; ``counted``: a window handed over, its index) or
the values its methods return.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..base.report import WindowReason
from ..export import builder as reporting
from ..export.builder import EndedWindow
from . import _torch, ledger, state
from ._atomic import atomic

TORCH_FAILURES: tuple[type[BaseException], ...] = (
    RuntimeError,  # torch's C++ errors (and their subclasses)
    ValueError,
    TypeError,
    AssertionError,
    AttributeError,
    ImportError,
)
"""What a failing profiler start, prepare or stop of torch's raises: the window is lost with a
warning. Anything else landing there is the program's own (a timeout library's exception
injected into the thread with ``PyThreadState_SetAsyncExc``: func_timeout, stopit) and goes
on to the program, as it would have without the SDK (``ProfilerWindow`` leaves no profiler
on either way)."""

MAX_DRAIN_STEPS = 4
"""A CUDA window's deferred stop waits at most this many step boundaries for the window's
kernels to have run, then waits for them (not for the whole device) and stops; 0 stops at the
window's end the way torch does (synchronising the device first)."""
DRAIN_SPIN_S = 0.001
"""At a CUDA window's end the caller first polls the event recorded there for at most this
long: where the device keeps up with the program (an overhead-bound loop, its queue holding
less than this), the window's kernels have run by then and the profiler stops at once,
without a device synchronisation and without recording a drained step (a step's kernels,
runtime calls and their flows, cut from the report anyway, yet processed by torch's stop and
written by its trace export: on an H100 the warm-up and the drained step together were 7,200
of a small LM window's 38,814 events). Where the queue is deeper the stop is deferred as before. The
poll's wait is the caller's, counted in the window's stop stall. 0: always defer."""
DRAIN_MAX_S = 2.0
"""... and at most this long, should the program stop ending steps (a timer stops it; the
stop itself waits for the window's thread, ``PendingStop``)."""
DEFER_MAX_STEP_NS = 250_000_000
"""Deferred only where the window's steps took less than this on average: a longer step hides
a synchronising stop's ~20-30 ms, and would keep the profiler on for long after the window."""
DRAIN_PAUSES_CPU_OPS = True
"""During a deferred stop the thread that steps records no CPU operators or ranges
(``state.cpu_ops``): what the profiler records after the window's end is cut anyway, and
recording it cost each drained step and the stop's processing (H200: the stop 49 -> 34 ms on
the caller; sampled 97.1-99.0% -> 98.5-99.6% over BENCHMARKS.md's runs). Not once a second
thread has stepped in the session (a thread's switch can only be turned back on by itself)."""


@dataclass(frozen=True)
class Recorded:
    """What an ended window recorded: its steps, whether the session ended it early, and its
    wall-clock span (``time.time_ns()``)."""

    steps: tuple[int, ...]
    partial: bool
    start_ns: int
    end_ns: int
    reason: WindowReason | None = None  # why the window opened
    cost: ledger.Entry | None = None  # its ledger figures, measured by the caller


@dataclass
class DeferredStop:
    """A CUDA window whose stop waits until the event recorded at its end has completed (at a
    later step boundary), or at most ``MAX_DRAIN_STEPS`` steps or ``DRAIN_MAX_S`` seconds."""

    window: _torch.ProfilerWindow
    event: Any
    recorded: Recorded
    timer: threading.Timer
    waited: int = 0
    paused_thread: int | None = None  # the thread whose CPU ops it paused


@dataclass
class PendingStop:
    """A window's stop waiting for the thread that started its profiler."""

    window: _torch.ProfilerWindow
    sync: bool = True
    lost: str = "; window lost"
    then: Callable[[], None] | None = None


class Handed:
    """The windows a session handed to its pipeline (``Stops.hand_over`` counts them) and
    those the pipeline is done with: no report came of it, or every exporter is done with
    its report (``build`` and ``cleanup`` wrap the pipeline's own)."""

    def __init__(self, build: Callable[[Any], Any], cleanup: Callable[[Any], None]) -> None:
        self._build = build
        self._cleanup = cleanup
        self.handed = 0
        self.done = 0
        self._lock = threading.Lock()  # done moves on the pipeline's threads

    def busy(self, pipeline: Any) -> bool:
        """One is still analysed or exported (one the analysis queue dropped is done)."""
        return self.handed > self.done and self.handed > self.done + pipeline.dropped["analysis"]

    def build(self, window: Any) -> Any:
        report = None
        try:
            report = self._build(window)
        finally:
            if report is None:  # nothing more comes of this window
                self._done()
        return report

    def cleanup(self, report: Any) -> None:
        try:
            self._cleanup(report)
        finally:
            self._done()

    def _done(self) -> None:
        with self._lock:
            self.done += 1


@dataclass(eq=False)  # (compared by identity: ``state.PENDING`` holds them)
class Stops:
    """A session's deferred and pending stops.

    ``lock``: the session's (the drain's timer and a pending stop's owner take it);
    ``pipeline`` and ``handed``: where stopped windows go, and their count; ``stepping()``:
    the thread of the session's last step and whether steps came from more than one;
    ``warn(message)``: the session's warning; ``lost(why)``: a window is lost, ``why`` is the
    session's reason for no report; ``counted()``: a window was handed over, its index;
    ``first_call``: the window room's first-call hook (a pending stop runs there)."""

    lock: Any
    pipeline: Any
    handed: Handed
    stepping: Callable[[], tuple[int | None, bool]]
    warn: Callable[[str], None]
    lost: Callable[[str], None]
    counted: Callable[[], int]
    first_call: Callable[[], None]
    draining: DeferredStop | None = None
    pending: PendingStop | None = None
    # the last deferred stops, (steps waited, kernels had run): for the benches
    drain_log: collections.deque[tuple[int, bool]] = field(
        default_factory=lambda: collections.deque(maxlen=64)
    )
    stop_stall_ns: int = 0  # the caller's wait in the ending window's stop (its ledger)

    def busy(self) -> bool:
        """The last window is still stopping (a deferred stop), or being analysed or exported:
        the steps meanwhile are slowed by it (``SlowSteps.ended``'s ``busy``)."""
        return self.draining is not None or self.handed.busy(self.pipeline)

    def defer(self, window: _torch.ProfilerWindow, event: Any, recorded: Recorded) -> None:
        """Let the profiler run on until ``event`` has completed (``finish_drain``, at a later
        step boundary, or the timer), then stop it without synchronising the device while it
        works through the steps queued meanwhile; stopped here at once where the event
        completes within ``DRAIN_SPIN_S`` (drain log: 0 steps waited). What it records after
        the window's end marker is cut from the report and the trace. The stepping thread's
        CPU ops pause meanwhile (``DRAIN_PAUSES_CPU_OPS``)."""
        if DRAIN_SPIN_S > 0 and self._ran_within(event, DRAIN_SPIN_S):
            self.drain_log.append((0, True))
            self.stop_then(
                window,
                sync=False,
                then=lambda: self.hand_over(window, recorded, deferred=True),
            )
            return
        timer = threading.Timer(DRAIN_MAX_S, self._timed_out, (window,))
        timer.daemon = True
        timer.name = "torch-profiled-drain"
        drain = DeferredStop(window, event, recorded, timer)
        step_thread, mixed = self.stepping()
        if (
            DRAIN_PAUSES_CPU_OPS
            and not mixed
            and step_thread == threading.get_ident()
            and state.cpu_ops.pause()
        ):
            drain.paused_thread = step_thread
        self.draining = drain
        timer.start()

    def _ran_within(self, event: Any, seconds: float) -> bool:
        """Whether ``event`` completes within ``seconds`` (polled, a short sleep between
        polls, so other threads run meanwhile); the wait is the caller's stop stall."""
        began = time.perf_counter_ns()
        deadline = began + int(seconds * 1e9)
        try:
            while not event.query():
                if time.perf_counter_ns() >= deadline:
                    return False
                time.sleep(0.00005)
            return True
        except Exception:  # noqa: BLE001 - a device error: the deferred path handles it
            return False
        finally:
            self.stop_stall_ns += time.perf_counter_ns() - began

    def _timed_out(self, window: _torch.ProfilerWindow) -> None:
        """DRAIN_MAX_S after a deferred stop began and no step ended it (the program stopped
        stepping): stop it from this timer thread (or leave the stop to the window's thread)."""
        with self.lock:
            if self.draining is not None and self.draining.window is window:
                self.finish_drain(force=True)

    def finish_drain(self, *, force: bool) -> None:
        """Stop a window whose stop was deferred, once its end event has completed, or now
        (``force``, or after MAX_DRAIN_STEPS) after waiting for that event; either way without
        synchronising the whole device."""
        drain = self.draining
        if drain is None:
            return
        window = drain.window
        try:
            done = drain.event.query()
        except Exception:  # noqa: BLE001 - a device error: take torch's own way out
            done = False
            force = True
        if window.overtaken():
            force = True  # nothing of ours to wait for: the program's profiler took over
        if not (done or force or drain.waited + 1 >= MAX_DRAIN_STEPS):
            drain.waited += 1
            return
        self.draining = None
        drain.timer.cancel()
        self.resume_cpu_ops()  # a pause on another thread ends at that thread's next step
        self.drain_log.append((drain.waited + 1, done))
        synced = done
        if not done and not window.overtaken():
            # wait for the window's own kernels only: the steps queued after them keep the
            # device busy while Kineto processes its buffers (a device-wide synchronisation
            # would empty the queue first and leave the device idle meanwhile)
            began = time.perf_counter_ns()
            try:
                with state.own_switch():  # (part of the stop: see ``state.OWN_SWITCHES``)
                    drain.event.synchronize()
                synced = True
            except Exception:  # noqa: BLE001 - a device error: take torch's own way out
                synced = False
            self.stop_stall_ns += time.perf_counter_ns() - began
        self.stop_then(
            window,
            sync=not synced,
            then=lambda: self.hand_over(window, drain.recorded, deferred=True),
        )

    def resume_cpu_ops(self) -> None:
        """The calling thread records CPU ops again, unless this session's deferred stop runs
        and paused them there."""
        if not state.cpu_ops:
            return
        drain = self.draining
        if drain is not None and drain.paused_thread == threading.get_ident():
            return
        state.cpu_ops.resume_here()

    def stop_then(
        self,
        window: _torch.ProfilerWindow,
        *,
        sync: bool = True,
        lost: str = "; window lost",
        then: Callable[[], None] | None = None,
    ) -> None:
        """Stop ``window``'s profiler, then ``then()`` (its hand-over to the pipeline).

        Torch keeps a thread-local profiler in the locals of the thread that started it: only
        that thread can stop it. When another thread ends the window (its step, ``close()``,
        ``flush()``, the drain's timer), the stop waits for the owner (``state.PENDING``): its
        next step or decorated call, ``flush()``/``shutdown()``/``close()`` there, or its end
        (``_torch._ThreadLife`` stops the profiler as the thread ends; ``forget`` where even
        that could not run). No window opens meanwhile."""
        if window.stoppable_here():
            if self.stop(window, sync=sync, lost=lost) and then is not None:
                then()
            return
        self.pending = PendingStop(window, sync, lost, then)
        if self not in state.PENDING:
            state.PENDING.append(self)
        state.set_first_call_hook(self.first_call)
        state.refresh_idle()  # a closed session's calls must still come to stop it

    def pending_is_here(self) -> bool:
        """The pending stop is this thread's to do (or its thread has ended). Lock-free."""
        pending = self.pending
        return pending is not None and (
            pending.window.stoppable_here() or pending.window.owner_gone()
        )

    def run_pending_here(self) -> None:
        """``run_pending`` under the session's lock (``state.run_pending_stops``)."""
        with atomic(), self.lock:
            self.run_pending()

    def run_pending(self) -> None:
        """Do the stop ``stop_then`` left for the window's owner thread, if this is that
        thread; forget the window if that thread has ended."""
        pending = self.pending
        if pending is None:
            return
        window = pending.window
        if window.owner_gone():
            self.pending = None
            window.forget()
            self.warn(
                f"the thread that recorded a window ({window.owner.name}) ended "
                "before it could stop its profiler; that window is lost"
            )
        elif window.stoppable_here():
            self.pending = None
            self.stop_then(window, sync=pending.sync, lost=pending.lost, then=pending.then)
        else:
            return
        if self in state.PENDING:
            state.PENDING.remove(self)
        if not state.PENDING:
            state.refresh_idle()  # calls may go idle again

    def stop(
        self, window: _torch.ProfilerWindow, *, sync: bool = True, lost: str = "; window lost"
    ) -> bool:
        """Stop ``window``'s profiler; False where it was not stopped cleanly. A torch profiler
        the program started while the window recorded took torch's profiling state over:
        stopping ours would end the program's (and crash its trace export), so the window is
        abandoned instead, with a warning, and the program's profiler runs on."""
        if window.overtaken():
            why = (
                "your own torch.profiler started while a torch-profiled window recorded; torch "
                "profilers do not nest, so torch-profiled dropped its window and left yours "
                "alone"
            )
            self.lost(why)
            self.warn(why)
            window.abandon()
            return False
        began = time.perf_counter_ns()
        try:
            with state.own_switch():  # the metrics take it out of the call it lands in
                window.stop(sync=sync)
        except TORCH_FAILURES as exc:  # anything else is the program's own (see above)
            self.warn(f"the profiler could not be stopped cleanly ({exc!r}){lost}")
            return False
        finally:
            self.stop_stall_ns += time.perf_counter_ns() - began
        return True

    def hand_over(
        self, window: _torch.ProfilerWindow, recorded: Recorded, *, deferred: bool = False
    ) -> None:
        """A stopped window goes to the pipeline (its report is built on the worker)."""
        index = self.counted()
        ended = EndedWindow(
            window,
            index,
            recorded.steps,
            recorded.partial,
            recorded.start_ns,
            recorded.end_ns,
            state.window_names(),  # copied only when names were added, bounded
            _torch.distributed_info(),
            time.monotonic() if deferred else None,
            recorded.reason,
        )
        if recorded.cost is not None:  # the stop's stall is known now: the stop is done
            recorded.cost.stop_stall_ns = self.stop_stall_ns
            ended.cost = recorded.cost
        self.stop_stall_ns = 0
        reporting.pending(ended)  # its trace is written before the next window starts
        taken = self.pipeline.submit(ended, lambda: reporting.forget(ended))
        if taken:
            self.handed.handed += 1
        else:
            reporting.forget(ended)
            self.warn(
                f"window {index} was still open at the session's end, and torch's stop of it "
                "(synchronous, no deadline can cut it short: it grows with the window's "
                "events) took past PROFILED_EXPORT_TIMEOUT_S; its report was dropped, not "
                "analysed"
            )
