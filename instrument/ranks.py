"""Which ranks of a distributed job profile: ``PROFILED_RANKS``. Pure, no torch.

A job of 64 ranks that all write traces of the same steps mostly repeats itself and fills
disks; ``PROFILED_RANKS=0,8-15`` profiles the ranks worth looking at. A rank that is not
selected starts no profiler at all, so its decorated calls cost what idle calls cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["RankSet"]


@dataclass(frozen=True)
class RankSet:
    """A set of ranks, or every rank (``ranks=None``, the default).

    Spelled like ``PROFILED_RANKS``: ``all``, ``0,3``, ``0-7``, or a mix (``0,4-7,12``).
    """

    ranks: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if self.ranks is None:
            return
        if not isinstance(self.ranks, frozenset):
            object.__setattr__(self, "ranks", frozenset(self.ranks))
        for rank in self.ranks:
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise ValueError(f"ranks must be integers >= 0, got {rank!r}")
        if not self.ranks:
            raise ValueError("ranks must name at least one rank (use 'all' for every rank)")

    def selects(self, rank: int) -> bool:
        """True when ``rank`` profiles."""
        return self.ranks is None or rank in self.ranks

    def to_env(self) -> str:
        """The ``PROFILED_RANKS`` spelling, runs of consecutive ranks as ``a-b``."""
        if self.ranks is None:
            return "all"
        parts: list[str] = []
        ordered = sorted(self.ranks)
        start = prev = ordered[0]
        for rank in ordered[1:] + [None]:  # type: ignore[list-item]
            if rank is not None and rank == prev + 1:
                prev = rank
                continue
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            if rank is not None:
                start = prev = rank
        return ",".join(parts)

    def __str__(self) -> str:
        return self.to_env()

    def __repr__(self) -> str:
        return f"RankSet.parse({self.to_env()!r})"

    @classmethod
    def parse(cls, text: str) -> "RankSet":
        """Parse ``all``, ``0,3``, ``0-7`` or a mix; raises ``ValueError`` naming the bad part."""
        stripped = text.strip().lower()
        if stripped in ("", "all"):
            return cls()
        ranks: set[int] = set()
        for part in stripped.split(","):
            part = part.strip()
            if not part:
                continue
            lo_text, sep, hi_text = part.partition("-")
            try:
                lo = int(lo_text.strip())
                hi = int(hi_text.strip()) if sep else lo
            except ValueError:
                raise ValueError(
                    f"expected 'all' or ranks like 0,3 or 0-7 (integers >= 0); got {part!r}"
                ) from None
            if hi < lo:
                raise ValueError(f"range {part!r} ends before it starts")
            ranks.update(range(lo, hi + 1))
        if not ranks:
            raise ValueError("expected 'all' or ranks like 0,3 or 0-7; got no rank")
        return cls(frozenset(ranks))

    @classmethod
    def of(cls, value: "RankSet | str | int | Iterable[int] | None") -> "RankSet":
        """A ``RankSet`` from what ``configure(ranks=...)`` accepts: a RankSet, None (all), a
        ``PROFILED_RANKS`` string, one rank, or an iterable of ranks. Raises on anything else."""
        if value is None:
            return cls()
        if isinstance(value, RankSet):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(frozenset({value}))
        if isinstance(value, (bool, float, bytes)) or not hasattr(value, "__iter__"):
            raise TypeError(
                f"ranks must be 'all', None, a rank, an iterable of ranks or a string like "
                f"'0,3' or '0-7', got {type(value).__name__} {value!r}"
            )
        return cls(frozenset(value))
