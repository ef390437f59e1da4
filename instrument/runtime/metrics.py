"""Always-on metrics: every decorated call's wall time in a per-range histogram, windows or not.

Recording is the hot path and takes no lock: a call appends its duration (nanoseconds as a
float, from ``time.perf_counter()``: float arithmetic allocates nothing, an int of nanoseconds
from ``perf_counter_ns()`` does) to its range's *pending* list (``list.append`` is atomic, with
the GIL and without it), and when a range has ``BATCH`` durations waiting, the call that saw
it folds them into the range's histogram under the recorder's lock, with the per-duration
work in C: each duration's bucket is read from its float32 form (the exponent field and the
top ``SUB_BITS`` mantissa bits), for the whole batch at once (``struct.pack``, then shifts
on one big integer and a byte a duration), counted per bucket with ``bytes.count`` or a
``Counter`` (``_count_buckets``); ``sum``; ``max`` (``min``) only where a duration's float32
reaches the maximum's (minimum's), tested on the same big integer for the whole batch.
Amortized, the fold costs a call about 27 ns where its range's calls take under 1 µs (no
sub-buckets to split), 41 ns where they stay within 10% of one duration, 60-86 ns where they
spread over several powers of two (25-35 ns with whole powers of two; CPU time on the 2-core
box, ``bench/metrics_pieces.py --fold-of``). ``snapshot()`` folds what is pending and copies
the histograms; a scrape of ``/metrics`` runs it at any moment (``LiveMetrics``).

Memory is bounded whatever the number of calls and of names (issue 31: 10k names made with
f-strings once cost 364 MB, a dense histogram of 869 numbers and up to 1023 pending durations
each, kept for good):

- a histogram is *sparse*: a dict of its non-empty buckets (and sum, min, max), not a list of
  every bucket: a range whose calls span a factor of four holds ~70 entries, most far fewer;
- a range's pending durations are given back when folded (an emptied list frees its array),
  and while metrics are on the feed's thread folds every range holding ``TIDY_MIN`` or more of
  them each ``TIDY_S`` (``Recorder.tidy``): a range called less than ``BATCH`` times a second no
  longer keeps up to ``BATCH`` durations until the next export;
- at most ``max_ranges`` names get a histogram of their own (``PROFILED_METRICS_MAX_RANGES``,
  default ``MAX_RANGES``): the calls of every name past it are counted under one range, ``other``
  (``OTHER``), with one warning naming the cap. So run-time names (``profiled(f"req{id}")``)
  cost at most the cap's histograms, never one per name ever seen.

Measured (``tests/test_cardinality.py``, tracemalloc, 10k names): about 1 KB a name at rest,
its histogram, its name and its entry in the report a scrape is served from (it was ~15 KB;
prometheus_client: ~4.3 KB a label value); a pending duration costs 32 B until folded.

Buckets are HdrHistogram's: each power of two of nanoseconds is split into ``SUB`` (32)
buckets of equal width, so a bucket is at most 1/32 (3.1%) of any duration in it wide, and a
quantile read from them (interpolated within its bucket, clamped to the exact min and max) is
within 3.1% of the exact one (``QUANTILE_ERROR``); buckets of a whole power of two (before
issue 30) put it within a factor of two. The bounds run from 2**10 ns (1.02 µs) to 2**37 ns
(137 s): durations under 1 µs share the first bucket, those over 137 s the last (their
quantiles are clamped, not bounded). A duration within 6e-8 of a bucket's upper bound,
relatively, may count in the next (float32 keeps 24 bits).

A forked child starts with empty histograms (``reset`` at fork): it never exports what its
parent counted.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from instrument.base.warn import warn

from ..base.report import LiveMetrics, MetricsReport, RangeHistogram
from . import _torch
from .config import max_ranges_from_env
from .device_time import DeviceTimes

__all__ = [
    "BATCH",
    "BOUNDS_NS",
    "MAX_RANGES",
    "OTHER",
    "QUANTILE_ERROR",
    "STEP",
    "Collector",
    "Feed",
    "Recorder",
    "add",
    "dense",
    "full_counts",
    "record",
    "reset",
    "sample_device",
    "snapshot",
    "wanted",
]

LOW_BIT = 10  # durations under 2**10 ns (1.02 µs) share the first bucket
HIGH_BIT = 37  # durations of at least 2**37 ns (137 s) share the last
SUB_BITS = 5  # each power of two is split in 2**SUB_BITS buckets of equal width
SUB = 1 << SUB_BITS
BOUNDS_NS: tuple[int, ...] = tuple(
    (1 << b) + s * (1 << (b - SUB_BITS)) for b in range(LOW_BIT, HIGH_BIT) for s in range(SUB)
) + (1 << HIGH_BIT,)
"""The buckets' bounds (OpenTelemetry's explicit bucket boundaries): bucket ``i`` holds
``BOUNDS_NS[i-1] <= d < BOUNDS_NS[i]``; one more bucket holds what is past the last bound.
``SUB`` per power of two, each ``1/SUB`` of its power wide: a bucket's width is at most
``1/SUB`` (3.1%) of any duration in it."""
QUANTILE_ERROR = 1 / SUB
"""The most a quantile read from these buckets can be off, relatively, for durations within
the bounds (it is interpolated within its bucket and clamped to the exact min and max)."""

BUCKETS = len(BOUNDS_NS) + 1
SUM, MIN, MAX = BUCKETS, BUCKETS + 1, BUCKETS + 2  # a histogram: the bucket counts, then these
_SHARD = BUCKETS + 3
_KEY_SHIFT = 23 - SUB_BITS  # a float32's exponent field and top SUB_BITS mantissa bits
_KEY_MASK = (1 << (8 + SUB_BITS)) - 1
_BLOCK = 8 - SUB_BITS  # a key's low byte holds its field's low _BLOCK bits
_SLOTS = (1 << _BLOCK) - 1
_FIRST_FIELD = 127 + LOW_BIT  # the float32 exponent field of 2**LOW_BIT ns (1.0 has 127)
_PAST_FIELD = 127 + HIGH_BIT
_FIRST_KEY = _FIRST_FIELD << SUB_BITS
_COUNTED = 48  # keys a batch may hold to be counted one by one (more: a Counter's one pass)
_SPAN = 224 >> SUB_BITS  # fields of a band (_band): its keys less the first fit a byte, 255 spare
_LONGEST = 2.0**64  # ns (585 years): a batch summing to more is cleaned before it is folded
BATCH = 1024
"""A range's pending durations are folded into its histogram once this many wait."""
SETTLE_S = 0.5
"""At exit, how long the last sampled calls' device events may take to complete."""
STEP = "\x00step"
"""The key of the step-time histogram (``step=True`` calls), apart from the range of the same
function."""
OTHER = "\x00other"
"""The key of the one range every name past ``max_ranges`` is counted under (exported as
``other``; apart from a range the program itself names ``other``)."""
OTHER_NAME = "other"
MAX_RANGES = 1000
"""``PROFILED_METRICS_MAX_RANGES``'s default: distinct range names with a histogram of their own
(prometheus_client's advice: keep a metric's label values in the hundreds, at most a few
thousand). Past it, at most about ``MAX_RANGES`` times a few KB: a few MB."""
TIDY_S = 1.0
"""How often, while metrics are on, ranges holding ``TIDY_MIN`` pending durations are folded."""
TIDY_MIN = 64
"""Pending durations (2 KB) a range may keep between tidies; fewer are not worth a fold."""

Shard = dict[int, Any]
"""A histogram: bucket index -> count for its non-empty buckets, and ``SUM``, ``MIN``, ``MAX``."""


def _new_shard() -> Shard:
    shard: Shard = defaultdict(int)
    shard[SUM], shard[MIN], shard[MAX] = 0.0, float("inf"), 0.0
    return shard


def dense(shard: Shard | list[Any]) -> list[Any]:
    """``shard`` as a list of every bucket's count, then sum, min and max (how histograms
    were kept before issue 31; the device times' still are)."""
    if isinstance(shard, list):
        return shard[:]
    out: list[Any] = [0] * _SHARD
    for i, n in shard.items():
        out[i] = n
    return out


class Recorder:
    """Per-range histograms of one process. There is one, for the life of the process
    (``reset`` empties it): decorated functions keep their range's pending list."""

    # the device-time sampler (CUDA events) while it samples, else None; calls then go through
    # ``decorator._timed``
    device: DeviceTimes | None = None

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # name -> durations not yet folded: the names admitted (at most max_ranges, besides
        # STEP and OTHER); every other name's calls go to OTHER's list
        self.pending: dict[str, list[float]] = {STEP: [], OTHER: []}
        self.folded: dict[str, Shard] = {}  # name -> histogram (under the lock)
        self.since_ns = time.time_ns()
        # PROFILED_METRICS_MAX_RANGES: read at the first name (decorations come before the
        # feed), set again by the feed from the session's config
        self.max_ranges: int | None = None
        self.overflowed = False  # a name was refused (told once a process)

    def pending_list(self, name: str) -> list[float]:
        """``name``'s pending durations: append one, and ``fold(name)`` once ``BATCH`` wait.
        A name past ``max_ranges`` gets ``OTHER``'s list (the first such name warns once)."""
        pending = self.pending.get(name)
        if pending is None:
            if self.overflowed and len(self.pending) - 2 >= (self.max_ranges or 0):
                return self.pending[OTHER]  # a refused name's call (no lock: no new name)
            with self.lock:  # once per name admitted
                pending = self.pending.get(name)
                if pending is None:
                    if self.max_ranges is None:
                        self.max_ranges = max_ranges_from_env()
                    if len(self.pending) - 2 < self.max_ranges:
                        pending = self.pending[name] = []
                    else:
                        pending = self.pending[OTHER]
                        told, self.overflowed = self.overflowed, True
                        if not told:
                            self._tell_overflow(name)
        return pending

    def _tell_overflow(self, name: str) -> None:
        shown = name if len(name) <= 60 else name[:57] + "..."
        warn(
            f"torch-profiled: more than {self.max_ranges} distinct range names reached the "
            f"metrics (PROFILED_METRICS_MAX_RANGES={self.max_ranges}); the calls of {shown!r} "
            f"and of every new name after it are counted under one range named "
            f"{OTHER_NAME!r} from now on (each name's own histogram would cost memory and "
            "series without bound). Raise PROFILED_METRICS_MAX_RANGES to keep more names "
            "apart, or give ranges fixed names; this is told once",
            UserWarning,
        )

    def fold(self, name: str) -> None:
        """Move ``name``'s pending durations into its histogram (``OTHER``'s for a name past
        the cap)."""
        pending = self.pending.get(name)
        if pending is None:
            name, pending = OTHER, self.pending[OTHER]
        with self.lock:
            _fold(self.folded, name, pending)

    def tidy(self) -> None:
        """Fold every range holding ``TIDY_MIN`` or more pending durations (``TIDY_S``, on the
        feed's thread): its list's memory is given back, whatever its call rate."""
        for name, pending in list(self.pending.items()):
            if len(pending) >= TIDY_MIN:
                with self.lock:
                    _fold(self.folded, name, pending)

    def histograms(self) -> dict[str, Shard]:
        """Every range's histogram, with what was pending folded in (copies). The lock is
        taken once per range (a user's call that folds its batch meanwhile waits for one
        range's fold at most, not for all of them): a scrape may run this at any moment."""
        for name, pending in list(self.pending.items()):
            if pending:
                with self.lock:
                    _fold(self.folded, name, pending)
        with self.lock:
            return {name: dict(shard) for name, shard in self.folded.items()}

    def clear(self) -> None:
        """Forget every count; the pending lists of names still in use stay, emptied
        (decorated functions hold them), the others go (their names are admitted again at
        their next call); a new lock (a forked child's copy may have been held by a thread it
        does not have)."""
        self.lock = threading.Lock()
        for name, pending in list(self.pending.items()):
            pending.clear()
            # held by this dict, the loop's tuple and ``pending`` (and getrefcount's argument)
            if name not in (STEP, OTHER) and sys.getrefcount(pending) <= 4:
                del self.pending[name]
        self.folded = {}
        self.since_ns = time.time_ns()
        self.device = None
        self.overflowed = False


def _new_dense_shard() -> list[Any]:
    shard: list[Any] = [0] * _SHARD
    shard[SUM], shard[MIN], shard[MAX] = 0.0, float("inf"), 0.0
    return shard


def _fold(
    folded: dict[str, Any],
    name: str,
    pending: list[float],
    new: Callable[[], Any] = _new_shard,
) -> None:
    """``pending``'s durations into ``folded[name]`` (caller holds the lock). Appends that land
    meanwhile stay: only the copied ones are deleted, from the front."""
    items = pending[:]
    if not items:
        return
    del pending[: len(items)]
    shard = folded.get(name)
    if shard is None:
        shard = folded[name] = new()
    total = sum(items)
    if not total < _LONGEST:  # a NaN, an infinity or centuries: no clock gives them, and the
        # fold runs inside a user's call, so it counts them (as 0 and the longest) and goes on
        items = [min(d, _LONGEST) if d == d else 0.0 for d in items]
        total = sum(items)
    n = len(items)
    packed = int.from_bytes(struct.pack(f"<{n}f", *items), "little")
    low, high = _count_buckets(shard, packed, n)
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


_SIGNS = _lanes(b"\0\0\0\x80", BATCH)
_ONES = _lanes(b"\1", BATCH)
_KEY_BYTES = _KEY_MASK.to_bytes(2, "little")
_KEYS = _lanes(_KEY_BYTES, BATCH)
_GUARD = 1 << (8 + SUB_BITS)  # above every key (13 bits)
_GUARDS = _GUARD * _ONES
_SIXES = 0x3F * _ONES  # a lane's bits 8-13 (past its low byte, with the guard)
_TWOS = (_GUARD >> 8) * _ONES
_BYTES = 0xFF * _ONES


def _float32_bits(d: float) -> int:
    """``d``'s float32 bit pattern (an infinity for a minimum not yet set)."""
    return int.from_bytes(struct.pack("<f", d), "little")


def _exponent_field(d: float) -> int:
    """One duration's float32 exponent field (255 for infinity: a minimum not yet set)."""
    return (_float32_bits(d) >> 23) & 0xFF


def _count_buckets(shard: Shard, packed: int, n: int) -> tuple[int, int]:
    """Add the batch's bucket counts to ``shard``; the lowest and highest exponent field
    holding any duration.

    A duration's *key* is its float32 bit pattern's exponent field and top ``SUB_BITS``
    mantissa bits (``_KEY_SHIFT`` on): the keys run in the durations' order, ``SUB`` to a
    power of two, and a bucket is a key. First each exponent field is counted on one byte a
    duration (``_fields``): a field below the first bound or past the last is one bucket,
    done. The others are split into their keys from one byte a duration: the key's low byte
    as it is (its field's low ``_BLOCK`` bits, then the sub-bucket) where no two fields of
    the batch share those low bits (nearly every batch of one range: fields 8 apart are
    durations 256 times apart); else a *band* of at most ``_SPAN`` fields at a time
    (``_band``). Then ``_count_band``."""
    per_field, low, high = _fields((packed >> 23).to_bytes(4 * n, "little")[::4])
    split = []
    for field, placed in sorted(per_field):
        if field < _FIRST_FIELD:
            shard[0] += placed
        elif field >= _PAST_FIELD:
            shard[BUCKETS - 1] += placed
        else:
            split.append((field, placed))
    if not split:
        return low, high
    if len({field & _SLOTS for field, _ in per_field}) == len(per_field):
        small = (packed >> _KEY_SHIFT).to_bytes(4 * n, "little")[::4]
        slots = [(field, placed, field & _SLOTS, field & ~_SLOTS) for field, placed in split]
        _count_band(shard, small, slots)
        return low, high
    full = n == BATCH
    keys = (packed >> _KEY_SHIFT) & (_KEYS if full else _lanes(_KEY_BYTES, n))
    ones = _ONES if full else _lanes(b"\1", n)
    i = 0
    while i < len(split):
        first = split[i][0]
        band = []
        while i < len(split) and split[i][0] < first + _SPAN:
            field, placed = split[i]
            band.append((field, placed, field - first, first))
            i += 1
        _count_band(shard, _band(keys, first << SUB_BITS, ones, n), band)
    return low, high


def _count_band(shard: Shard, small: bytes, band: list[tuple[int, int, int, int]]) -> None:
    """Add the counts of ``band``'s fields to ``shard`` from ``small``, a byte a duration:
    ``slot << SUB_BITS`` plus the sub-bucket for a duration of the field in ``slot``, each
    field of the band given as (field, its count of durations, slot, the field whose first
    key is byte 0). Where the band's fields can hold at most ``_COUNTED`` keys (a batch
    within 20% of its median: most), each key is counted with ``bytes.count`` (``in``, a
    memchr, before each: many hold none; a field's keys until all its durations are
    placed), else all at once by a ``Counter`` of the bytes (one pass, about the cost of
    48 counts)."""
    if sum(min(placed, SUB) for _, placed, _, _ in band) > _COUNTED:
        at: list[int | None] = [None] * (256 >> SUB_BITS)  # each slot's bucket of byte 0
        for _, _, slot, zero in band:
            at[slot] = (zero << SUB_BITS) - _FIRST_KEY + 1
        for key, placed in Counter(small).items():
            bucket = at[key >> SUB_BITS]
            if bucket is not None:
                shard[bucket + key] += placed
        return
    for _, left, slot, zero in band:
        bucket = (zero << SUB_BITS) - _FIRST_KEY + 1
        start = slot << SUB_BITS
        for key in range(start, start + SUB):
            if key in small:
                placed = small.count(key)
                shard[bucket + key] += placed
                left -= placed
                if not left:
                    break


def _band(keys: int, base: int, ones: int, n: int) -> bytes:
    """Each duration's key less ``base``, one byte each, from the keys' 32-bit lanes, and 255
    for a key outside ``base`` .. ``base + 255`` (a band has fewer than 8 fields: 255 is
    none of its keys). A guard bit (``_GUARD``) above every key keeps each lane's
    subtraction in its lane, and a lane is in the band where what is left above its low
    byte is the guard alone."""
    if n == BATCH:
        guards, sixes, twos, bytes_ = _GUARDS, _SIXES, _TWOS, _BYTES
    else:
        guards, sixes, twos = _GUARD * ones, 0x3F * ones, (_GUARD >> 8) * ones
        bytes_ = 0xFF * ones
    lanes = (keys | guards) - base * ones  # the guard plus key - base: 1 .. 2**14 - 1
    away = ((((lanes >> 8) & sixes) ^ twos) + sixes) >> 6 & ones  # 1 where not the guard alone
    return ((lanes & bytes_) | (away * 0xFF)).to_bytes(4 * n, "little")[::4]


def _fields(fields: bytes) -> tuple[list[tuple[int, int]], int, int]:
    """Each exponent field in ``fields`` with its count, looking outwards from the first
    duration's until all are placed (``in``, a memchr, before each ``count``: most fields
    nearby hold none); the lowest and highest."""
    lowest = highest = low = high = fields[0]
    placed = fields.count(low)
    found = [(low, placed)]
    total = len(fields)
    while placed < total:
        if high < 255:
            high += 1
            if high in fields:
                n = fields.count(high)
                found.append((high, n))
                placed += n
                highest = high
        if low > 0:
            low -= 1
            if low in fields:
                n = fields.count(low)
                found.append((low, n))
                placed += n
                lowest = low
    return found, lowest, highest


def _bucket(key: int) -> int:
    """The bucket of a key (a float32's exponent field and top ``SUB_BITS`` mantissa bits)."""
    return min(max(key - _FIRST_KEY + 1, 0), BUCKETS - 1)


recorder = Recorder()
"""The process's recorder; decorated calls use it while metrics are on (``state``)."""


def add(shards: dict[str, list[Any]], name: str, ns: float) -> None:
    """One duration of ``ns`` nanoseconds into ``name``'s histogram in ``shards`` (made on
    first use, dense: ``device_time`` copies them as lists): the device times' update, under
    their own lock. A name past the cap (not admitted by ``recorder``) is counted under
    ``OTHER`` there too."""
    if recorder.overflowed and name not in recorder.pending:
        name = OTHER
    _fold(shards, name, [ns], _new_dense_shard)


def record(recorder: Recorder, name: str, ns: float, is_step: bool = False) -> None:
    """Add one call of ``ns`` nanoseconds to ``name``'s histogram, and to the step histogram
    too for a ``step=True`` call (the decorated functions' metrics-only path inlines this)."""
    pending = recorder.pending_list(name)
    pending.append(ns)
    if len(pending) >= BATCH:
        recorder.fold(name)
    if is_step:
        record(recorder, STEP, ns)


def _histogram(name: str, shard: Shard | list[Any], device: str | None = None) -> RangeHistogram:
    """``shard`` as a report's histogram, *compact*: its bounds are the first bound, then those
    from its first non-empty bucket to its last (``RangeHistogram.kept``, what the exports
    send), not all 866. A report is held between exports (a ``/metrics`` page is served from
    the last one): dense, 10k ranges held 70 MB there. Quantiles read the same."""
    pairs = shard.items() if isinstance(shard, dict) else enumerate(shard)
    counts = {i: n for i, n in pairs if i < BUCKETS and n}
    count = sum(counts.values())
    bounds, kept = _compact(counts)
    return RangeHistogram(
        name=OTHER_NAME if name == OTHER else name,
        count=count,
        sum_ns=round(shard[SUM]),
        min_ns=round(shard[MIN]) if count else 0,
        max_ns=round(shard[MAX]),
        bucket_counts=kept,
        bounds_ns=bounds,
        device=device,
    )


def _compact(counts: dict[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The non-empty buckets ``counts`` as ``RangeHistogram.kept`` keeps them (the first
    bound, then the bounds from the first non-empty bucket's lower bound to the last one's
    upper bound), without the 866 dense buckets: a snapshot of 10k ranges took seconds."""
    if not counts:
        return (BOUNDS_NS[0],), (0, 0)
    used = sorted(counts)
    first = max(used[0] - 1, 1)
    last = min(used[-1], len(BOUNDS_NS) - 1)
    keep = [0, *range(first, last + 1)]
    out = [counts.get(0, 0), sum(counts.get(i, 0) for i in range(1, first + 1))]
    if len(keep) == 1:
        out.pop()
    out += [counts.get(i, 0) for i in keep[2:]]
    out.append(sum(n for i, n in counts.items() if i > keep[-1]))
    return tuple(BOUNDS_NS[i] for i in keep), tuple(out)


def full_counts(h: RangeHistogram) -> list[int]:
    """A report's (compact) histogram's counts on every bucket of ``BOUNDS_NS`` (the
    merged empty buckets stay empty)."""
    out = [0] * BUCKETS
    index = {b: i for i, b in enumerate(BOUNDS_NS)}
    for i, n in enumerate(h.bucket_counts):
        out[index[h.bounds_ns[i - 1]] + 1 if i else 0] += n
    return out


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
        ranges=tuple(
            _histogram(n, s) for n, s in sorted(total.items()) if len(s) > 3 and _counted(s)
        ),
        steps=_histogram("step", step) if step is not None else None,
        device_ranges=tuple(
            _histogram(n, s, sampler.devices.get(n)) for n, s in sorted(device.items())
        )
        if sampler is not None
        else (),
    )


def _counted(shard: Shard) -> bool:
    return any(n for i, n in shard.items() if i < BUCKETS)


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
    """Calls ``deliver()`` every ``interval_s`` seconds on a daemon thread until ``stop()``;
    ``tidy()`` (when given) every ``TIDY_S`` between them."""

    def __init__(
        self,
        interval_s: float,
        deliver: Callable[[], None],
        tidy: Callable[[], None] | None = None,
    ) -> None:
        self._stop = threading.Event()
        self._deliver = deliver
        self._tidy = tidy
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, name="torch-profiled-metrics")
        self._thread.daemon = True
        self._thread.start()

    def _run(self) -> None:
        due = time.monotonic() + self._interval_s
        while True:
            left = due - time.monotonic()
            if self._tidy is not None:
                left = min(left, TIDY_S)
            if self._stop.wait(max(left, 0.0)):
                return
            if time.monotonic() >= due:
                due = time.monotonic() + self._interval_s
                self._deliver()
            elif self._tidy is not None:
                self._tidy()

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
        max_ranges: int | None = None,
    ) -> None:
        self._submit = submit
        self._switch_off = switch_off
        # PROFILED_METRICS_MAX_RANGES: given by the session's config, else read here
        recorder.max_ranges = max_ranges if max_ranges is not None else max_ranges_from_env()
        self._collector = Collector(interval_s, self.deliver, recorder.tidy)
        LiveMetrics.source = self.now  # a scrape reads the calls so far, not the last interval

    def now(self, sampler: DeviceTimes | None = None) -> MetricsReport:
        """A snapshot of this moment (what ``deliver`` submits)."""
        dist = _torch.distributed_info()  # at each snapshot: a program may set up ranks late
        return snapshot(dist["rank"], dist["world_size"], sampler)

    def deliver(self, sampler: DeviceTimes | None = None) -> None:
        self._submit(self.now(sampler))

    def close(self) -> None:
        """Calls stop timing themselves (``switch_off``); the last snapshot is delivered (and
        stays what a scrape reads)."""
        if LiveMetrics.source == self.now:
            LiveMetrics.source = None
        device = recorder.device  # (switching off lets the sampler go)
        self._switch_off()
        self._collector.stop()
        if device is not None:
            device.settle(SETTLE_S)
        self.deliver(device)
