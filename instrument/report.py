"""``WindowReport``: the one contract between ``instrument`` and ``exporters``.

Plain frozen data, no torch objects: exporters read it without importing torch. Times are
microseconds (``*_us``) except wall-clock instants, which are epoch nanoseconds (``*_ns``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from .verdict import CPU_ONLY, Verdict

__all__ = ["FrozenMap", "KernelStats", "OpStats", "RangeStats", "Verdict", "WindowReport"]

V = TypeVar("V")


class FrozenMap(Mapping[str, V]):
    """A read-only, picklable mapping (``report.ranges["matmul_bias"]``)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, V] | None = None) -> None:
        object.__setattr__(self, "_data", dict(data or {}))

    def __getitem__(self, key: str) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenMap is read-only")

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._data.items()))

    def __reduce__(self):
        return (FrozenMap, (self._data,))


@dataclass(frozen=True)
class RangeStats:
    """One ``@profiled`` range name within a window."""

    name: str
    calls: int
    cpu_time_us: float  # inclusive: sum of the durations of outermost occurrences
    self_cpu_time_us: float  # minus the time of operators and ranges nested inside
    device_time_us: float  # device kernels/memcpy/memset launched inside the range
    kernel_launches: int
    device_busy_us: float = 0.0  # union of those kernels' intervals (no idle gaps)
    wall_time_us: float = 0.0  # range start -> later of range end and its last kernel's end
    flops: int = 0  # with_flops: FLOPs of the operators inside the range
    verdict: Verdict = field(default_factory=lambda: Verdict(CPU_ONLY, ""))
    # calls that began in the window and were still running when its profiler stopped (a
    # range held across steps): counted in ``calls``, their time cut at the stop
    open_calls: int = 0

    @property
    def cpu_time_per_call_us(self) -> float:
        return self.cpu_time_us / self.calls if self.calls else 0.0

    @property
    def device_to_cpu_ratio(self) -> float:
        """Device time over CPU time: << 1 means the device idles while the CPU dispatches."""
        return self.device_time_us / self.cpu_time_us if self.cpu_time_us else 0.0

    @property
    def device_busy_share(self) -> float:
        """Share of the range's wall time during which its kernels kept the device busy."""
        return self.device_busy_us / self.wall_time_us if self.wall_time_us else 0.0

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s over device time (0 when FLOPs or device time are unknown)."""
        return self.flops / (self.device_time_us * 1e-6) if self.flops and self.device_time_us else 0.0


@dataclass(frozen=True)
class OpStats:
    """A CPU-side operator (``aten::mm``, ``cudaLaunchKernel``) aggregated by name."""

    name: str
    calls: int
    self_cpu_time_us: float
    cpu_time_us: float


@dataclass(frozen=True)
class KernelStats:
    """Device work aggregated by name; ``kind`` is ``kernel``, ``memcpy`` or ``memset``."""

    name: str
    kind: str
    calls: int
    device_time_us: float


@dataclass(frozen=True)
class WindowReport:
    """What one profiler window measured."""

    window: int  # 0-based index of the window in its session
    steps: tuple[int, ...]  # the recorded steps (session step indices)
    partial: bool  # ended early (shutdown, session exit) before its schedule finished
    start_ns: int  # wall-clock, epoch nanoseconds
    end_ns: int
    rank: int
    world_size: int
    host: str
    pid: int
    device: str  # "cpu" or the accelerator's name
    activities: tuple[str, ...]
    ranges: FrozenMap[RangeStats] = field(default_factory=FrozenMap)
    top_ops: tuple[OpStats, ...] = ()
    top_kernels: tuple[KernelStats, ...] = ()
    self_cpu_time_total_us: float = 0.0  # torch's "Self CPU time total", bookkeeping excluded
    self_device_time_total_us: float = 0.0  # torch's "Self CUDA time total"
    profiler_overhead_us: float = 0.0  # the profiler's own bookkeeping, not user time
    device_busy_us: float = 0.0  # union of all device work in the window
    flops: int = 0
    verdict: Verdict = field(default_factory=lambda: Verdict(CPU_ONLY, ""))
    event_count: int = 0
    raw_trace_path: str | None = None  # the window's trace JSON; valid while exporters run
    trace_file: str | None = None  # the file a trace exporter wrote, when one did

    @property
    def duration_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1000.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain data."""
        out = asdict(self)  # FrozenMap is a Mapping but not a dict: convert it by hand
        out["ranges"] = {name: asdict(r) for name, r in self.ranges.items()}
        return out
