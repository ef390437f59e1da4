"""When does a profiler window open: pure policies, no torch, no clocks.

``Schedule`` means exactly what ``torch.profiler.schedule`` means. Step ``n`` is the
n-th step of a session, counted from 0. A window is ``warmup`` steps of preparation
followed by ``active`` recorded steps; ``wait`` idle steps come before each window and
``skip_first`` idle steps before the first wait. ``repeat=0`` repeats forever.

``Sampling`` replaces the schedule's fixed cycles for long-running programs: a window (the
schedule's ``warmup`` + ``active`` steps) may open at every ``every``-th step, each such step
taken with probability ``sample_rate``. Whether step ``n`` opens is a pure function of
``(seed, n)`` (``draw``), so every rank of a job opens its windows at the same steps without
talking to the others. Caps that need a clock or a count (``max_windows``,
``min_interval_s``) are applied by the session.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Action", "Sampling", "Schedule", "draw"]

_MASK64 = (1 << 64) - 1


def draw(seed: int, step: int) -> float:
    """A uniform number in [0, 1) that depends only on ``(seed, step)`` (splitmix64)."""
    z = (seed * 0x9E3779B97F4A7C15 + step * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return (z >> 11) / 9007199254740992.0  # 2**53


class Action(enum.Enum):
    """What the profiler does during a step (the states of torch's ``ProfilerAction``)."""

    NONE = "none"
    WARMUP = "warmup"
    RECORD = "record"
    RECORD_AND_SAVE = "record_and_save"  # the last recorded step of a window


@dataclass(frozen=True)
class Schedule:
    """Which steps a session profiles.

    ``Schedule(wait=0, warmup=1, active=3, repeat=1, skip_first=0)`` (the default) prepares
    the profiler during step 0 and records steps 1, 2 and 3 as one window.
    """

    wait: int = 0
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    skip_first: int = 0

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "active", "repeat", "skip_first"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(
                    f"Schedule.{name} must be an int, got {type(value).__name__} {value!r}"
                )
            minimum = 1 if name == "active" else 0
            if value < minimum:
                raise ValueError(f"Schedule.{name} must be >= {minimum}, got {value}")

    @property
    def cycle(self) -> int:
        """Steps in one wait+warmup+active cycle."""
        return self.wait + self.warmup + self.active

    @property
    def last_step(self) -> int | None:
        """Index of the last step that can do anything, or None when ``repeat=0``."""
        if self.repeat == 0:
            return None
        return self.skip_first + self.repeat * self.cycle - 1

    def action(self, step: int) -> Action:
        """The action for ``step`` (0-based); the same table as ``torch.profiler.schedule``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if step < self.skip_first:
            return Action.NONE
        step -= self.skip_first
        if self.repeat and step >= self.repeat * self.cycle:
            return Action.NONE
        pos = step % self.cycle
        if pos < self.wait:
            return Action.NONE
        if pos < self.wait + self.warmup:
            return Action.WARMUP
        if pos < self.cycle - 1:
            return Action.RECORD
        return Action.RECORD_AND_SAVE

    def next_active(self, step: int) -> int | None:
        """The first step at or after ``step`` whose action is not NONE; None if there is none.

        Lets a session skip idle steps with one comparison instead of ``action()`` per step.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        rel = max(step - self.skip_first, 0)
        cycle, pos = divmod(rel, self.cycle)
        if self.repeat and cycle >= self.repeat:
            return None
        if pos < self.wait:
            return self.skip_first + cycle * self.cycle + self.wait
        return self.skip_first + rel

    def finished(self, step: int) -> bool:
        """True once no step from ``step`` on can open a window."""
        last = self.last_step
        return last is not None and step > last

    def to_env(self) -> str:
        """The ``PROFILED_SCHEDULE`` spelling of this schedule."""
        return (
            f"wait={self.wait},warmup={self.warmup},active={self.active},"
            f"repeat={self.repeat},skip_first={self.skip_first}"
        )

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """Parse ``"wait=0,warmup=1,active=3,repeat=1,skip_first=0"``; missing keys keep defaults.

        Raises ``ValueError`` naming the bad part.
        """
        fields: dict[str, int] = {}
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in cls.__dataclass_fields__:
                raise ValueError(
                    f"expected key=value with keys wait, warmup, active, repeat, skip_first; "
                    f"got {part!r}"
                )
            if key in fields:
                raise ValueError(f"{key} given twice")
            try:
                fields[key] = int(value.strip())
            except ValueError:
                raise ValueError(f"{key} must be an integer, got {value.strip()!r}") from None
        return cls(**fields)


@dataclass(frozen=True)
class Sampling:
    """Which steps may open a window, in sampling mode (``every`` set or ``sample_rate < 1``).

    ``opens(n)``: step ``n`` (counted after ``skip_first``) is a multiple of ``every`` (any step
    when ``every`` is None) and ``draw(seed, n) < sample_rate``.
    """

    every: int | None = None
    sample_rate: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.every is not None:
            if isinstance(self.every, bool) or not isinstance(self.every, int):
                raise TypeError(f"every must be an int or None, got {self.every!r}")
            if self.every < 1:
                raise ValueError(f"every must be >= 1, got {self.every}")
        rate = self.sample_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)):
            raise TypeError(f"sample_rate must be a number, got {rate!r}")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"sample_rate must be between 0 and 1, got {rate}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {self.seed!r}")

    @property
    def enabled(self) -> bool:
        return self.every is not None or self.sample_rate < 1.0

    def opens(self, step: int) -> bool:
        """Whether a window may open at ``step`` (counted after ``skip_first``)."""
        if step < 0:
            return False
        if self.every is not None and step % self.every:
            return False
        return self.sample_rate >= 1.0 or draw(self.seed, step) < self.sample_rate

    def next_open(self, step: int, horizon: int = 1 << 20) -> int | None:
        """The first step at or after ``step`` that ``opens``, looking at most ``horizon``
        steps ahead; None if there is none in that range."""
        if self.sample_rate <= 0.0:
            return None
        every = self.every or 1
        first = max(step, 0)
        first += (-first) % every
        for n in range(first, first + horizon, every):
            if self.opens(n):
                return n
        return None
