"""Always-on metrics: every decorated call's wall time in a per-range histogram, windows or not.

Recording is the hot path and takes no lock: a call appends its duration (nanoseconds as a
float, from ``time.perf_counter()``: float arithmetic allocates nothing, an int of nanoseconds
from ``perf_counter_ns()`` does) to its range's *pending* list (``list.append`` is atomic, with
the GIL and without it), and when a range has ``BATCH`` durations waiting, the call that saw
it folds them into the range's histogram under the recorder's lock, with the per-duration
work in C: each duration's bucket is the exponent of its float32 form, read for the whole
batch at once (``struct.pack``, then shifts and masks on one big integer), counted per bucket
with ``bytes.count``; ``sum``; ``max`` (``min``) only where a duration's float32 reaches
the maximum's (minimum's), tested on the same big integer for the whole batch. Memory is
bounded whatever the number of calls: a range holds at most about ``BATCH`` pending durations
and one histogram of 67 numbers. ``snapshot()``
folds what is pending and copies the histograms.

Buckets are powers of two of nanoseconds: a duration of ``d`` ns goes to bucket
``int(d).bit_length()`` (a duration within 6e-8 of its bucket's upper bound, relatively, may
count in the next: float32 keeps 24 bits). The report's bounds run from 2**10 ns (1.02 µs)
to 2**37 ns (137 s), each twice the last: durations under 1 µs share the first bucket, those
over 137 s the last. Quantiles read from them are interpolated within a bucket and clamped to
the exact min and max.

A forked child starts with empty histograms (``reset`` at fork): it never exports what its
parent counted.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import _torch
from .device_time import DeviceTimes
from .report import MetricsReport, RangeHistogram

__all__ = [
    "BATCH",
    "BOUNDS_NS",
    "STEP",
    "Collector",
    "Feed",
    "Recorder",
    "add",
    "record",
    "reset",
    "sample_device",
    "snapshot",
    "wanted",
]

LOW_BIT = 10  # durations of at most this bit length (< 1.02 µs) share the first bucket
HIGH_BIT = 37  # durations longer than this bit length (>= 137 s) share the last
BOUNDS_NS: tuple[int, ...] = tuple(1 << b for b in range(LOW_BIT, HIGH_BIT + 1))
"""The buckets' bounds (OpenTelemetry's explicit bucket boundaries): bucket ``i`` holds
``BOUNDS_NS[i-1] <= d < BOUNDS_NS[i]``; one more bucket holds what is past the last bound."""

SUM, MIN, MAX = 64, 65, 66  # a histogram: 64 bucket counts, then these (ns, floats)
_ONE_NS = 127  # the float32 exponent field of 1.0: a duration's bucket is its field - 126
_LONGEST = 2.0**64  # ns (585 years): a batch summing to more is cleaned before it is folded
BATCH = 1024
"""A range's pending durations are folded into its histogram once this many wait."""
SETTLE_S = 0.5
"""At exit, how long the last sampled calls' device events may take to complete."""
STEP = "\x00step"
"""The key of the step-time histogram (``step=True`` calls), apart from the range of the same
function."""


def _new_shard() -> list[Any]:
    shard: list[Any] = [0] * 67
    shard[SUM], shard[MIN], shard[MAX] = 0.0, float("inf"), 0.0
    return shard


class Recorder:
    """Per-range histograms of one process. There is one, for the life of the process
    (``reset`` empties it): decorated functions keep their range's pending list."""

    # the device-time sampler (CUDA events) while it samples, else None; calls then go through
    # ``decorator._timed``
    device: DeviceTimes | None = None

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[str, list[float]] = {}  # name -> durations not yet folded
        self.folded: dict[str, list[Any]] = {}  # name -> histogram (under the lock)
        self.since_ns = time.time_ns()

    def pending_list(self, name: str) -> list[float]:
        """``name``'s pending durations: append one, and ``fold(name)`` once ``BATCH`` wait."""
        pending = self.pending.get(name)
        if pending is None:
            pending = self.pending.setdefault(name, [])  # (atomic: one list per name)
        return pending

    def fold(self, name: str) -> None:
        """Move ``name``'s pending durations into its histogram."""
        with self.lock:
            _fold(self.folded, name, self.pending[name])

    def histograms(self) -> dict[str, list[Any]]:
        """Every range's histogram, with what was pending folded in (copies)."""
        with self.lock:
            for name, pending in list(self.pending.items()):
                _fold(self.folded, name, pending)
            return {name: shard[:] for name, shard in self.folded.items()}

    def clear(self) -> None:
        """Forget every count (the pending lists stay, emptied: decorated functions hold them);
        a new lock (a forked child's copy may have been held by a thread it does not have)."""
        self.lock = threading.Lock()
        for pending in list(self.pending.values()):
            pending.clear()
        self.folded = {}
        self.since_ns = time.time_ns()
        self.device = None


def _fold(folded: dict[str, list[Any]], name: str, pending: list[float]) -> None:
    """``pending``'s durations into ``folded[name]`` (caller holds the lock). Appends that land
    meanwhile stay: only the copied ones are deleted, from the front."""
    items = pending[:]
    if not items:
        return
    del pending[: len(items)]
    shard = folded.get(name)
    if shard is None:
        shard = folded[name] = _new_shard()
    total = sum(items)
    if not total < _LONGEST:  # a NaN, an infinity or centuries: no clock gives them, and the
        # fold runs inside a user's call, so it counts them (as 0 and the longest) and goes on
        items = [min(d, _LONGEST) if d == d else 0.0 for d in items]
        total = sum(items)
    n = len(items)
    packed = int.from_bytes(struct.pack(f"<{n}f", *items), "little")
    low, high = _count_buckets(shard, _exponent_fields(packed, n))
    shard[SUM] += total
    signs, ones = (_SIGNS, _ONES) if n == BATCH else (_lanes(b"\0\0\0\x80", n), _lanes(b"\1", n))
    if packed & signs:  # a negative duration (no clock gives one): both scans
        shard[MAX], shard[MIN] = max(shard[MAX], max(items)), min(shard[MIN], min(items))
        return
    # Each extreme is scanned for only where the batch may pass it: a float32 rounds
    # monotonically, so when no duration's float32 bit pattern reaches the extreme's, no
    # duration passes it. The test runs on every 32-bit lane at once: with each lane's top
    # (sign) bit set, subtracting the extreme's pattern from every lane borrows no further
    # than that bit, which stays set exactly where the lane is at least the extreme.
    top = shard[MAX]
    if high >= _exponent_field(top) and ((packed | signs) - _float32_bits(top) * ones) & signs:
        shard[MAX] = max(top, max(items))
    bottom = shard[MIN]
    if (
        low <= _exponent_field(bottom)
        and (((_float32_bits(bottom) * ones) | signs) - packed) & signs
    ):
        shard[MIN] = min(bottom, min(items))


def _lanes(lane: bytes, n: int) -> int:
    """``n`` copies of a 32-bit little-endian ``lane`` (padded with zeros) in one integer."""
    return int.from_bytes(lane.ljust(4, b"\0") * n, "little")


_MASK = _lanes(b"\xff", BATCH)
_SIGNS = _lanes(b"\0\0\0\x80", BATCH)
_ONES = _lanes(b"\1", BATCH)


def _exponent_fields(packed: int, n: int) -> bytes:
    """Each duration's float32 exponent field (bits 23-30), one byte each, in order, from
    ``n`` float32 bit patterns in one integer (``struct.pack`` little-endian): 0 for 0 and
    durations under 2**-126 ns, else ``126 + int(d).bit_length()`` from 1 ns up."""
    mask = _MASK if n == BATCH else _lanes(b"\xff", n)
    return ((packed >> 23) & mask).to_bytes(4 * n, "little")[::4]


def _float32_bits(d: float) -> int:
    """``d``'s float32 bit pattern (an infinity for a minimum not yet set)."""
    return int.from_bytes(struct.pack("<f", d), "little")


def _exponent_field(d: float) -> int:
    """One duration's float32 exponent field (255 for infinity: a minimum not yet set)."""
    return (_float32_bits(d) >> 23) & 0xFF


def _count_buckets(shard: list[Any], fields: bytes) -> tuple[int, int]:
    """Add each bucket's count in ``fields`` (the durations' exponent fields) to ``shard``,
    looking outwards from the first duration's field until all are placed (``in``, a memchr,
    before each ``count``: most fields nearby hold none); the lowest and highest field
    holding any."""
    lowest = highest = low = high = fields[0]
    placed = fields.count(low)
    shard[_bucket(low)] += placed
    total = len(fields)
    while placed < total:
        if high < 255:
            high += 1
            if high in fields:
                n = fields.count(high)
                shard[_bucket(high)] += n
                placed += n
                highest = high
        if low > 0:
            low -= 1
            if low in fields:
                n = fields.count(low)
                shard[_bucket(low)] += n
                placed += n
                lowest = low
    return lowest, highest


def _bucket(field: int) -> int:
    """The bucket of a float32 exponent field: the bit length of the duration's whole ns."""
    return min(max(field - _ONE_NS + 1, 0), SUM - 1)


recorder = Recorder()
"""The process's recorder; decorated calls use it while metrics are on (``state``)."""


def add(shards: dict[str, list[Any]], name: str, ns: float) -> None:
    """One duration of ``ns`` nanoseconds into ``name``'s histogram in ``shards`` (made on
    first use): the device times' update, under their own lock."""
    _fold(shards, name, [ns])


def record(recorder: Recorder, name: str, ns: float, is_step: bool = False) -> None:
    """Add one call of ``ns`` nanoseconds to ``name``'s histogram, and to the step histogram
    too for a ``step=True`` call (the decorated functions' metrics-only path inlines this)."""
    pending = recorder.pending_list(name)
    pending.append(ns)
    if len(pending) >= BATCH:
        recorder.fold(name)
    if is_step:
        record(recorder, STEP, ns)


def _histogram(name: str, shard: list[Any], device: str | None = None) -> RangeHistogram:
    counts = [sum(shard[: LOW_BIT + 1])]
    counts.extend(shard[LOW_BIT + 1 : HIGH_BIT + 1])
    counts.append(sum(shard[HIGH_BIT + 1 : SUM]))
    count = sum(counts)
    return RangeHistogram(
        name=name,
        count=count,
        sum_ns=round(shard[SUM]),
        min_ns=round(shard[MIN]) if count else 0,
        max_ns=round(shard[MAX]),
        bucket_counts=tuple(counts),
        bounds_ns=BOUNDS_NS,
        device=device,
    )


def snapshot(
    rank: int = 0, world_size: int = 1, sampler: DeviceTimes | None = None
) -> MetricsReport:
    """Everything counted since metrics started in this process (cumulative); device times
    from ``sampler`` (default: the recorder's, while it samples)."""
    total = recorder.histograms()
    step = total.pop(STEP, None)
    sampler = sampler or recorder.device
    device = sampler.histograms() if sampler is not None else {}
    return MetricsReport(
        time_ns=time.time_ns(),
        since_ns=recorder.since_ns,
        pid=os.getpid(),
        host=socket.gethostname(),
        rank=rank,
        world_size=world_size,
        bounds_ns=BOUNDS_NS,
        ranges=tuple(_histogram(n, s) for n, s in sorted(total.items()) if any(s[:SUM])),
        steps=_histogram("step", step) if step is not None else None,
        device_ranges=tuple(
            _histogram(n, s, sampler.devices.get(n)) for n, s in sorted(device.items())
        )
        if sampler is not None
        else (),
    )


def sample_device(every: int) -> None:
    """Device time by CUDA events for one call in ``every`` of each range (0: none), where
    CUDA is available; the calls then go through ``decorator._timed`` (``state`` mirrors
    ``recorder.device``)."""
    recorder.device = DeviceTimes(every, add) if every > 0 and _torch.cuda_present() else None


def reset() -> None:
    """Forget every count (``Recorder.clear``); a forked child gets here through ``state``'s
    fork hook, so it never exports what its parent counted."""
    recorder.clear()


class Collector:
    """Calls ``deliver()`` every ``interval_s`` seconds on a daemon thread until ``stop()``."""

    def __init__(self, interval_s: float, deliver: Callable[[], None]) -> None:
        self._stop = threading.Event()
        self._deliver = deliver
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, name="torch-profiled-metrics")
        self._thread.daemon = True
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._deliver()

    def stop(self) -> None:
        """No more periodic deliveries (the caller makes the last one)."""
        self._stop.set()


def wanted(setting: bool | None, exporters: Iterable[Any]) -> bool:
    """``PROFILED_METRICS``: forced on or off, or (None: auto) on when an exporter takes them."""
    if setting is not None:
        return setting
    return any(takes_metrics(e) for e in exporters)


def takes_metrics(exporter: Any) -> bool:
    """It defines ``export_metrics`` and does not say no (``takes_metrics = False``)."""
    return callable(getattr(exporter, "export_metrics", None)) and bool(
        getattr(exporter, "takes_metrics", True)
    )


class Feed:
    """The ambient session's metrics: a snapshot to ``submit`` every ``interval_s`` seconds
    and a last one at ``close()``, which first calls ``switch_off`` (``state`` turns timing
    off: this module is below it)."""

    def __init__(
        self,
        interval_s: float,
        submit: Callable[[MetricsReport], None],
        switch_off: Callable[[], None],
    ) -> None:
        self._submit = submit
        self._switch_off = switch_off
        self._collector = Collector(interval_s, self.deliver)

    def deliver(self, sampler: DeviceTimes | None = None) -> None:
        dist = _torch.distributed_info()  # at each snapshot: a program may set up ranks late
        self._submit(snapshot(dist["rank"], dist["world_size"], sampler))

    def close(self) -> None:
        """Calls stop timing themselves (``switch_off``); the last snapshot is delivered."""
        device = recorder.device  # (switching off lets the sampler go)
        self._switch_off()
        self._collector.stop()
        if device is not None:
            device.settle(SETTLE_S)
        self.deliver(device)
