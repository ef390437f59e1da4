"""Device time between windows: CUDA events around one call in ``every`` of each range.

With metrics on and CUDA in use, a sampled call records a timing event on the current stream
before and after it (``torch.cuda.Event``, public API). The pair waits in a bounded queue until
its end event has completed, found by ``query()`` at later sampled calls and at each snapshot:
the program is never synchronized. ``elapsed_time`` of the pair then goes into the range's
device-time histogram (``report.MetricsReport.device_ranges``). That time is what the current
stream spent from the call's start to its end as the device ran it (queueing before the call's
first kernel is not in it; work the call put on other streams is in it only where the current
stream waited for it).

Nothing is recorded where it would cost the program: in a process that has not initialized
CUDA itself (a forked data-loader worker, a CPU-only program), while the current stream is
being captured into a CUDA graph, or past ``MAX_PENDING`` unread pairs (the oldest are dropped
and counted). A pair whose events cannot be read (a device reset, another device) is dropped.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Any

import torch

__all__ = ["MAX_PENDING", "DeviceTimes"]

MAX_PENDING = 1024
"""Unread event pairs kept at most; past it the oldest are dropped (``dropped`` counts them)."""


class DeviceTimes:
    """Samples one call in ``every`` per range name; holds their device-time histograms.

    ``add`` is ``metrics``' histogram update (``add(shards, name, ns)``): passed in, so the
    rule stays there."""

    def __init__(self, every: int, add: Any) -> None:
        self.every = every
        self._add = add
        self._counters: dict[str, itertools.count[int]] = {}
        self._pending: collections.deque[tuple[str, Any, Any, int]] = collections.deque()
        self._lock = threading.Lock()
        self.shards: dict[str, list[Any]] = {}  # name -> histogram shard (under the lock)
        self.devices: dict[str, str] = {}  # name -> "cuda:N" of its last sample
        self.dropped = 0

    def start(self, name: str) -> tuple[DeviceTimes, str, Any, int] | None:
        """Before a call of ``name``: (this sampler, the name, its start event, the device's
        index) when this call is sampled, else None; hand it to ``end`` after the call. Never
        raises: a call that cannot be sampled goes unsampled."""
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters.setdefault(name, itertools.count())
        if next(counter) % self.every:
            return None
        try:
            if not torch.cuda.is_initialized() or torch.cuda.is_current_stream_capturing():
                return None
            self.poll()
            device = torch.cuda.current_device()
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
        except Exception:  # noqa: BLE001 - no usable device now: this call goes unsampled
            return None
        return self, name, begin, device

    @staticmethod
    def end(started: tuple[DeviceTimes, str, Any, int]) -> None:
        """After the sampled call: its end event, on the sampler that started it (metrics may
        have been switched meanwhile); the pair waits to be read. Never raises."""
        self, name, begin, device = started
        try:
            if torch.cuda.is_current_stream_capturing():
                return
            finish = torch.cuda.Event(enable_timing=True)
            finish.record()
        except Exception:  # noqa: BLE001 - telemetry never breaks the call it measured
            return
        with self._lock:
            self._pending.append((name, begin, finish, device))
            while len(self._pending) > MAX_PENDING:
                self._pending.popleft()
                self.dropped += 1

    def poll(self) -> None:
        """Read every pair whose end event has completed (``query()``: never waits)."""
        with self._lock:
            waiting: collections.deque[tuple[str, Any, Any, int]] = collections.deque()
            while self._pending:
                name, begin, finish, device = item = self._pending.popleft()
                try:
                    if not finish.query():
                        waiting.append(item)
                        continue
                    ms = begin.elapsed_time(finish)
                except Exception:  # noqa: BLE001 - unreadable now and later: dropped
                    self.dropped += 1
                    continue
                self._add(self.shards, name, max(0.0, ms * 1e6))
                self.devices[name] = f"cuda:{device}"
            self._pending = waiting

    def settle(self, timeout_s: float) -> None:
        """Poll until nothing waits or ``timeout_s`` has passed (at exit: the last calls'
        pairs complete within it; still no synchronize)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            if not self._pending or time.monotonic() >= deadline:
                return
            time.sleep(0.005)

    def histograms(self) -> dict[str, list[Any]]:
        """A copy of the shards, after a poll."""
        self.poll()
        with self._lock:
            return {name: shard[:] for name, shard in self.shards.items()}
