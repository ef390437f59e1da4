"""Which ranks of a distributed job profile: ``PROFILED_RANKS``. Pure, no torch.

A job of 64 ranks that all write traces of the same steps mostly repeats itself and fills
disks; ``PROFILED_RANKS=0,8-15`` profiles the ranks worth looking at. A rank that is not
selected starts no profiler at all, so its decorated calls cost what idle calls cost.

A selection is held as sorted, disjoint runs ``(first, last)``, never as one entry per rank:
``0-2147483647`` costs what ``0-7`` costs to parse, test, print and compare (a set of every
rank took seconds and gigabytes for ``0-20000000``). Both the ranks and the number of runs are
bounded (``MAX_RANK``, ``MAX_TERMS``) so that no value, however written, makes a long message
or a slow parse.

The launcher's own variables (``RANK``, ``WORLD_SIZE`` and their ``LOCAL_`` forms) are read
here too (``launcher_ranks_from_env``): a rank comes from them when torch.distributed is not
initialised.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

from instrument.base.settings import Setting, integer, refuse

__all__ = ["LAUNCHER_VARS", "MAX_RANK", "MAX_TERMS", "RankSet", "launcher_ranks_from_env"]

MAX_RANK = 2**31 - 1
"""The largest rank accepted (torch.distributed ranks are 32-bit signed integers)."""

MAX_TERMS = 1024
"""At most this many comma-separated terms in ``PROFILED_RANKS``, and runs in a ``RankSet``:
enough for any real selection, small enough that the value prints in a readable line."""

_EXPECTED = f"expected 'all' or ranks like 0,3 or 0-7 (integers >= 0 and <= {MAX_RANK})"

Span = tuple[int, int]


def _clip(text: str, limit: int = 40) -> str:
    """``repr(text)``, cut short when long: a bad part of a huge value must not make a huge
    message."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}...({len(text)} chars)"


def _check_rank(rank: Any) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK:
        if isinstance(rank, int) and not isinstance(rank, bool) and rank.bit_length() > 64:
            shown = f"an integer of {rank.bit_length()} bits"  # str() of it may itself fail
        else:
            text = repr(rank)
            shown = text if len(text) <= 40 else f"{text[:40]}...({len(text)} chars)"
        raise ValueError(f"ranks must be integers >= 0 and <= {MAX_RANK}, got {shown}")
    return rank


def _merge(spans: list[Span]) -> tuple[Span, ...]:
    """Sorted, disjoint, non-adjacent runs covering exactly what ``spans`` cover."""
    spans.sort()
    merged: list[Span] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1] + 1:
            if hi > merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _too_many(count: int) -> ValueError:
    return ValueError(f"at most {MAX_TERMS} ranks or runs of ranks (a-b), got {count}")


def _spans_of(ranks: Iterable[int]) -> tuple[Span, ...]:
    """Runs of an iterable of ranks; a ``range`` of step 1 is one run, never expanded."""
    if isinstance(ranks, range) and ranks.step == 1:
        if not ranks:
            return ()
        return ((_check_rank(ranks.start), _check_rank(ranks[-1])),)
    if isinstance(ranks, range) and len(ranks) > MAX_TERMS:
        raise _too_many(len(ranks))  # a stepped range: one run per rank
    spans = [(r, r) for r in map(_check_rank, ranks)]
    merged = _merge(spans)
    if len(merged) > MAX_TERMS:
        raise _too_many(len(merged))
    return merged


class RankSet:
    """A set of ranks, or every rank (``RankSet()``, the default). Immutable and hashable.

    Spelled like ``PROFILED_RANKS``: ``all``, ``0,3``, ``0-7``, or a mix (``0,4-7,12``).
    ``RankSet(iterable_of_ranks)`` builds one in code (``range(a, b)`` stays one run).
    """

    __slots__ = ("_spans", "_starts")
    _spans: tuple[Span, ...] | None  # None: every rank
    _starts: list[int] | None  # each run's first rank, for bisect

    def __init__(self, ranks: Iterable[int] | None = None) -> None:
        spans = None if ranks is None else _spans_of(ranks)
        if spans is not None and not spans:
            raise ValueError("ranks must name at least one rank (use 'all' for every rank)")
        object.__setattr__(self, "_spans", spans)
        object.__setattr__(self, "_starts", None if spans is None else [s[0] for s in spans])

    @classmethod
    def _from_spans(cls, spans: tuple[Span, ...] | None) -> RankSet:
        """From runs already checked and merged (``parse``, unpickling)."""
        made = cls.__new__(cls)
        object.__setattr__(made, "_spans", spans)
        object.__setattr__(made, "_starts", None if spans is None else [s[0] for s in spans])
        return made

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("RankSet is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (RankSet.parse, (self.to_env(),))

    # ------------------------------------------------------------ reading

    @property
    def spans(self) -> tuple[Span, ...] | None:
        """None for every rank, else the sorted disjoint runs ``(first, last)``, inclusive."""
        return self._spans

    @property
    def ranks(self) -> tuple[range, ...] | None:
        """None for every rank, else one ``range`` per run (symbolic: nothing is expanded)."""
        if self._spans is None:
            return None
        return tuple(range(lo, hi + 1) for lo, hi in self._spans)

    def selects(self, rank: int) -> bool:
        """True when ``rank`` profiles (a binary search over the runs)."""
        if self._spans is None or self._starts is None:
            return True
        i = bisect.bisect_right(self._starts, rank) - 1
        return i >= 0 and rank <= self._spans[i][1]

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, int) and self.selects(rank)

    def to_env(self) -> str:
        """The ``PROFILED_RANKS`` spelling, runs of consecutive ranks as ``a-b``."""
        if self._spans is None:
            return "all"
        return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self._spans)

    def __str__(self) -> str:
        return self.to_env()

    def __repr__(self) -> str:
        return f"RankSet.parse({self.to_env()!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RankSet):
            return NotImplemented
        return self._spans == other._spans

    def __hash__(self) -> int:
        return hash(self._spans)

    # ------------------------------------------------------------ building

    @classmethod
    def parse(cls, text: str) -> RankSet:
        """Parse ``all``, ``0,3``, ``0-7`` or a mix; raises ``ValueError`` naming the bad part.
        Ranks above ``MAX_RANK`` and more than ``MAX_TERMS`` terms are bad values too."""
        stripped = text.strip().lower()
        if stripped in ("", "all"):
            return cls()
        if stripped.count(",") >= MAX_TERMS:  # counted before anything is split or parsed
            raise _too_many(stripped.count(",") + 1)
        spans = [_parse_term(part.strip()) for part in stripped.split(",") if part.strip()]
        if not spans:
            raise ValueError("expected 'all' or ranks like 0,3 or 0-7; got no rank")
        return cls._from_spans(_merge(spans))

    @classmethod
    def of(cls, value: RankSet | str | int | Iterable[int] | None) -> RankSet:
        """A ``RankSet`` from what ``configure(ranks=...)`` accepts: a RankSet, None (all), a
        ``PROFILED_RANKS`` string, one rank, or an iterable of ranks. Raises on anything else."""
        if value is None:
            return cls()
        if isinstance(value, RankSet):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return cls((value,))
        if isinstance(value, (bool, float, bytes)) or not hasattr(value, "__iter__"):
            raise TypeError(
                f"ranks must be 'all', None, a rank, an iterable of ranks or a string like "
                f"'0,3' or '0-7', got {type(value).__name__} {value!r}"
            )
        return cls(value)


def _digits(text: str) -> bool:
    text = text.strip()
    return text.isascii() and text.isdigit()


def _parse_term(part: str) -> Span:
    """``a`` or ``a-b``, both within ``0..MAX_RANK``."""
    lo_text, sep, hi_text = part.partition("-")
    try:
        # digits only: int() would also take '+3', '1_000' and, for a long run of digits,
        # spend time before its own length limit refuses it
        if not (_digits(lo_text) and (not sep or _digits(hi_text))):
            raise ValueError
        if len(lo_text.strip()) > 10 or len(hi_text.strip()) > 10:
            raise OverflowError
        lo = int(lo_text)
        hi = int(hi_text) if sep else lo
        if hi > MAX_RANK or lo > MAX_RANK:
            raise OverflowError
    except OverflowError:
        raise ValueError(f"rank above {MAX_RANK} in {_clip(part)}") from None
    except ValueError:
        raise ValueError(f"{_EXPECTED}; got {_clip(part)}") from None
    if hi < lo:
        raise ValueError(f"range {_clip(part)} ends before it starts")
    return (lo, hi)


# ---------------------------------------------------------------- launcher variables

_LAUNCHER = {
    var: Setting(
        var.lower(),
        var,
        default,
        doc=f"set by the launcher: {what}",
        **integer(0 if "RANK" in var else 1),
    )
    for var, default, what in (
        ("RANK", 0, "this process's rank"),
        ("WORLD_SIZE", 1, "the job's number of processes"),
        ("LOCAL_RANK", 0, "this process's rank on its host"),
        ("LOCAL_WORLD_SIZE", 1, "the number of processes on this host"),
    )
}

LAUNCHER_VARS: tuple[str, ...] = tuple(_LAUNCHER)
"""What ``torchrun`` (and most launchers) set for each process; read when torch.distributed
is not initialised."""


def launcher_ranks_from_env(
    environ: Mapping[str, str] | None = None, *, strict: bool = False
) -> tuple[int, int]:
    """``(rank, world_size)`` from the launcher's variables: ``RANK`` and ``WORLD_SIZE``, else
    ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, else ``(0, 1)``. A bad value warns once (as for
    ``PROFILED_*`` values) and its default applies; so does a rank outside the world size.
    ``strict=True`` raises ``ValueError`` instead (``Config.from_env`` with
    ``PROFILED_STRICT=1``)."""
    env = os.environ if environ is None else environ
    if "RANK" in env or "LOCAL_RANK" not in env:
        rank_var, world_var = "RANK", "WORLD_SIZE"
    else:
        rank_var, world_var = "LOCAL_RANK", "LOCAL_WORLD_SIZE"
    rank = _LAUNCHER[rank_var].read(env, strict)
    # an unset world size is one more than the rank: a lone RANK=3 is the last of 4
    world_size = dataclasses.replace(_LAUNCHER[world_var], default=rank + 1)
    world = world_size.read(env, strict)
    if rank >= world:
        refuse(
            f"{rank_var}/{world_var}",
            f"{rank}/{world}",
            f"{rank_var}={rank} is not below {world_var}={world}",
            f"the world size {rank + 1}",
            strict,
        )
        world = rank + 1
    return rank, world
