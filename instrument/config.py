"""Configuration: one frozen ``Config``, every ``PROFILED_*`` variable parsed and validated here.

Environment values are parsed tolerantly: a bad value warns once (naming the variable, the
value and the default used) and the default applies; ``PROFILED_STRICT=1`` turns that into a
``ValueError``. Absurd values are bad values too: every number that feeds a wait or a size has a
documented maximum (``MAX_*`` below; inf and nan are refused), so no value can crash a decorated
call or the exit, and a message quotes at most ``QUOTE_CHARS`` characters of a value (a 1 MB
environment value makes a one-line warning). Values given in code (``configure()``,
``session()``) are checked strictly and raise ``TypeError``/``ValueError`` at once.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporters._warn import warn

from .ranks import RankSet
from .sampling import Sampling, Schedule
from .triggers import TRIGGER_SIGNALS

__all__ = [
    "Config",
    "ConfigWarning",
    "ENV_VARS",
    "KNOWN_ACTIVITIES",
    "PROFILED_ACTIVITIES",
    "PROFILED_ENABLED",
    "PROFILED_EXPORTERS",
    "PROFILED_PROFILE_MEMORY",
    "PROFILED_ALL_THREADS",
    "PROFILED_RECORD_SHAPES",
    "PROFILED_SCHEDULE",
    "PROFILED_STRICT",
    "PROFILED_TRACE_DIR",
    "PROFILED_TRACE_GZIP",
    "PROFILED_ANALYSIS_PROCESS",
    "PROFILED_TRACE_KEEP",
    "PROFILED_JSON_PATH",
    "PROFILED_OTEL_DETAIL",
    "PROFILED_OTEL_MAX_SPANS",
    "OTEL_DETAILS",
    "PROFILED_WITH_FLOPS",
    "PROFILED_WITH_STACK",
    "otel_settings_from_env",
    # distributed and disk
    "PROFILED_RANKS",
    "PROFILED_TRACE_MAX_MB",
    "launcher_ranks_from_env",
    # bounds
    "MAX_EXPORT_TIMEOUT_S",
    "MAX_MIN_INTERVAL_S",
    "MAX_TRACE_MAX_MB",
    "QUOTE_CHARS",
]

MAX_EXPORT_TIMEOUT_S = 3600.0
"""The longest ``PROFILED_EXPORT_TIMEOUT_S``: one hour (a longer wait at exit is a hang)."""

MAX_MIN_INTERVAL_S = 7 * 86400.0
"""The longest ``PROFILED_MIN_INTERVAL_S``: one week."""

MAX_TRACE_MAX_MB = 1048576.0
"""The largest ``PROFILED_TRACE_MAX_MB``: 1 TiB (0 means no limit at all)."""

QUOTE_CHARS = 60
"""Messages quote at most this many characters of a value, then ``...(N chars)``."""

PROFILED_ENABLED = "PROFILED_ENABLED"
"""``PROFILED_ENABLED`` [1]: ``0`` makes ``@profiled`` return the function itself (read when the
decorator is applied), context forms do nothing and no profiler is ever started."""

PROFILED_EXPORTERS = "PROFILED_EXPORTERS"
"""``PROFILED_EXPORTERS`` [console,trace]: comma-separated exporter names (built-ins ``console``,
``trace``, ``memory``, ``json``, ``otel``, plus entry points in group ``torch_profiled.exporters``); empty or ``none``
exports nothing."""

PROFILED_SCHEDULE = "PROFILED_SCHEDULE"
"""``PROFILED_SCHEDULE`` [wait=0,warmup=1,active=3,repeat=1,skip_first=0]: the ambient session's
window schedule, as in ``torch.profiler.schedule``; missing keys keep their defaults."""

PROFILED_ACTIVITIES = "PROFILED_ACTIVITIES"
"""``PROFILED_ACTIVITIES`` [auto]: ``auto`` (CPU plus the accelerator torch sees) or a
comma-separated subset of cpu, cuda, xpu, mtia, hpu, privateuse1."""

PROFILED_RECORD_SHAPES = "PROFILED_RECORD_SHAPES"
"""``PROFILED_RECORD_SHAPES`` [0]: record operator input shapes."""

PROFILED_PROFILE_MEMORY = "PROFILED_PROFILE_MEMORY"
"""``PROFILED_PROFILE_MEMORY`` [0]: record tensor allocations."""
PROFILED_ALL_THREADS = "PROFILED_ALL_THREADS"
"""``PROFILED_ALL_THREADS`` [0]: windows record every thread of the program, not only the one
that opened the window. Unsafe where other threads run torch operators while a window starts
or stops: torch's all-threads profiling can then crash the process (a torch limitation,
reproduced with plain torch.profiler); not with ``PROFILED_PROFILE_MEMORY``."""

PROFILED_WITH_STACK = "PROFILED_WITH_STACK"
"""``PROFILED_WITH_STACK`` [0]: record Python stacks (costly)."""

PROFILED_WITH_FLOPS = "PROFILED_WITH_FLOPS"
"""``PROFILED_WITH_FLOPS`` [0]: estimate FLOPs of matrix multiplications and convolutions."""

PROFILED_TRACE_DIR = "PROFILED_TRACE_DIR"
"""``PROFILED_TRACE_DIR`` [./profiled_traces]: where the ``trace`` exporter writes trace files."""

PROFILED_TRACE_GZIP = "PROFILED_TRACE_GZIP"
"""``PROFILED_TRACE_GZIP`` [1]: write ``.pt.trace.json.gz`` (1) or ``.pt.trace.json`` (0)."""

PROFILED_ANALYSIS_PROCESS = "PROFILED_ANALYSIS_PROCESS"
"""``PROFILED_ANALYSIS_PROCESS`` [1]: read, shape and analyze each window's trace in a helper
process (1), off the program's GIL, or on the export thread (0). See
``instrument.analysis_process``."""

PROFILED_TRACE_KEEP = "PROFILED_TRACE_KEEP"
"""``PROFILED_TRACE_KEEP`` [20]: keep only the newest N trace files of this worker (0 = keep all)."""

PROFILED_JSON_PATH = "PROFILED_JSON_PATH"
"""``PROFILED_JSON_PATH`` [./profiled_reports.jsonl]: where the ``json`` exporter appends one
line per window report (``-``: standard output)."""

PROFILED_OTEL_DETAIL = "PROFILED_OTEL_DETAIL"
"""``PROFILED_OTEL_DETAIL`` [ranges]: what the ``otel`` exporter sends per window besides the
window span: ``ranges`` (a span per ``@profiled`` range occurrence), ``ops`` (also a span per
CPU operator inside a range) or ``kernels`` (also a span per device kernel, memcpy, memset)."""

PROFILED_OTEL_MAX_SPANS = "PROFILED_OTEL_MAX_SPANS"
"""``PROFILED_OTEL_MAX_SPANS`` [1000]: at most this many spans per window (at least 1, the
window span). Past it, detail spans are dropped first, then the occurrences of the most
frequent ranges are folded into one aggregate span per name; the window span counts both."""

# ---- sampling, triggers and export (production use)

PROFILED_EVERY = "PROFILED_EVERY"
"""``PROFILED_EVERY`` [unset]: open a window (the schedule's warm-up + active steps) every N
steps, forever (``PROFILED_MAX_WINDOWS`` caps it); the schedule's ``wait`` and ``repeat`` then do
not apply. N must be at least warm-up + active."""

PROFILED_SAMPLE_RATE = "PROFILED_SAMPLE_RATE"
"""``PROFILED_SAMPLE_RATE`` [1.0]: the probability that a step which may open a window (every
``PROFILED_EVERY``-th step, or any idle step when that is unset) does. The draw is a pure
function of ``(PROFILED_SEED, step)``: every rank of a job opens the same windows."""

PROFILED_MAX_WINDOWS = "PROFILED_MAX_WINDOWS"
"""``PROFILED_MAX_WINDOWS`` [unset]: at most this many windows per process (triggers too)."""

PROFILED_MIN_INTERVAL_S = "PROFILED_MIN_INTERVAL_S"
"""``PROFILED_MIN_INTERVAL_S`` [0]: at least this many seconds from the end of a window to the
start of the next sampled one (per process clock: ranks may then diverge); at most 604800
(one week)."""

PROFILED_SEED = "PROFILED_SEED"
"""``PROFILED_SEED`` [0]: seed of the sampling draw; give every rank of a job the same one."""

PROFILED_TRIGGER = "PROFILED_TRIGGER"
"""``PROFILED_TRIGGER`` [unset]: open a window on demand at the next step: a signal name
(``SIGUSR2`` or ``SIGUSR1``, no other: the handler is installed from the main thread and chains
any handler already there) or a file path (a regular file owned by the program's user, created
at that path, opens a window and is removed when taken; anything else there is left alone)."""

PROFILED_EXPORT_TIMEOUT_S = "PROFILED_EXPORT_TIMEOUT_S"
"""``PROFILED_EXPORT_TIMEOUT_S`` [10]: at exit (and when a session ends), how long to wait for
queued reports to be exported; past it the program goes on and says what was not exported.
More than 0, at most 3600 (one hour)."""

# ---- distributed and disk (issue 5, parts 3 and 6)

PROFILED_RANKS = "PROFILED_RANKS"
"""``PROFILED_RANKS`` [all]: which ranks of a distributed job profile: ``all``, ``0,3``, ``0-7``
or a mix (``0,4-7``); ranks up to 2147483647, at most 1024 terms (held as runs, never one entry
per rank). The rank comes from ``torch.distributed`` when it is initialised at the first
decorated call, else from ``RANK`` (``LOCAL_RANK``; 0 without either). A rank not listed starts
no profiler: its decorated calls cost what idle calls cost, and it says so in one line."""

PROFILED_TRACE_MAX_MB = "PROFILED_TRACE_MAX_MB"
"""``PROFILED_TRACE_MAX_MB`` [1024]: at most this many megabytes (MiB; fractions allowed) of
torch-profiled trace files in the trace directory, every worker's together; after each write
the oldest go first. Other files there are never touched. 0 = no limit; at most 1048576
(1 TiB)."""

PROFILED_STRICT = "PROFILED_STRICT"
"""``PROFILED_STRICT`` [0]: raise ``ValueError`` on a bad ``PROFILED_*`` value instead of warning."""

PROFILED_CHILDREN = "PROFILED_CHILDREN"
"""``PROFILED_CHILDREN`` [0]: ``1``: processes a profiled process starts (DataLoader workers,
``multiprocessing`` spawn, ``subprocess``) profile themselves too. By default they stay silent:
there ``@profiled`` returns the function itself, as with ``PROFILED_ENABLED=0``."""

PROFILED_PARENT_PID = "PROFILED_PARENT_PID"
"""``PROFILED_PARENT_PID``: set by torch-profiled, not by you: the process id of a process
whose profiling started, inherited by the processes it starts (``PROFILED_CHILDREN``)."""

ENV_VARS: tuple[str, ...] = (
    PROFILED_ENABLED,
    PROFILED_EXPORTERS,
    PROFILED_SCHEDULE,
    PROFILED_ACTIVITIES,
    PROFILED_RECORD_SHAPES,
    PROFILED_PROFILE_MEMORY,
    PROFILED_ALL_THREADS,
    PROFILED_WITH_STACK,
    PROFILED_WITH_FLOPS,
    PROFILED_TRACE_DIR,
    PROFILED_TRACE_GZIP,
    PROFILED_TRACE_KEEP,
    PROFILED_JSON_PATH,
    PROFILED_OTEL_DETAIL,
    PROFILED_OTEL_MAX_SPANS,
    PROFILED_EVERY,
    PROFILED_SAMPLE_RATE,
    PROFILED_MAX_WINDOWS,
    PROFILED_MIN_INTERVAL_S,
    PROFILED_SEED,
    PROFILED_TRIGGER,
    PROFILED_EXPORT_TIMEOUT_S,
    PROFILED_ANALYSIS_PROCESS,
    PROFILED_RANKS,
    PROFILED_TRACE_MAX_MB,
    PROFILED_STRICT,
    PROFILED_CHILDREN,
    PROFILED_PARENT_PID,
)

OTEL_DETAILS: tuple[str, ...] = ("ranges", "ops", "kernels")  # each level adds to the last

KNOWN_ACTIVITIES: tuple[str, ...] = ("cpu", "cuda", "xpu", "mtia", "hpu", "privateuse1")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigWarning(UserWarning):
    """A ``PROFILED_*`` environment value was invalid; the default was used instead."""


@dataclass(frozen=True)
class Config:
    """Everything the SDK can be told. Build with ``Config.from_env()`` or ``Config(**fields)``."""

    enabled: bool = True
    exporters: tuple[Any, ...] = ("console", "trace")
    schedule: Schedule = field(default_factory=Schedule)
    activities: tuple[str, ...] | None = None  # None: auto
    record_shapes: bool = False
    profile_memory: bool = False
    all_threads: bool = False
    with_stack: bool = False
    with_flops: bool = False
    trace_dir: str = "./profiled_traces"
    trace_gzip: bool = True
    trace_keep: int = 20
    json_path: str = "./profiled_reports.jsonl"
    every: int | None = None
    sample_rate: float = 1.0
    max_windows: int | None = None
    min_interval_s: float = 0.0
    seed: int = 0
    trigger: str | None = None
    export_timeout_s: float = 10.0
    analysis_process: bool = True
    # distributed and disk
    ranks: RankSet = field(default_factory=RankSet)
    trace_max_mb: float = 1024.0
    strict: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            checked = _check_field(f.name, value)
            if checked is not value:
                object.__setattr__(self, f.name, checked)
        window = self.schedule.warmup + self.schedule.active
        if self.every is not None and self.every < window:
            raise ValueError(
                f"every={self.every} is shorter than one window (warm-up {self.schedule.warmup} "
                f"+ active {self.schedule.active} = {window} steps); use every >= {window}"
            )

    @property
    def sampling(self) -> Sampling:
        return Sampling(every=self.every, sample_rate=self.sample_rate, seed=self.seed)

    def replace(self, **fields: Any) -> "Config":
        """A copy with ``fields`` changed; unknown names raise ``TypeError``."""
        _reject_unknown(fields)
        return dataclasses.replace(self, **fields)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Config":
        """Read every ``PROFILED_*`` variable; bad values warn once and use the default."""
        env = os.environ if environ is None else environ
        default = cls()
        strict = _env_value(env, PROFILED_STRICT, _parse_bool, False, strict=False)
        values: dict[str, Any] = {"strict": strict}
        for name, var in _FIELD_ENV.items():
            if name == "strict":
                continue
            values[name] = _env_value(env, var, _ENV_PARSERS[name], getattr(default, name), strict)
        window = values["schedule"].warmup + values["schedule"].active
        if values["every"] is not None and values["every"] < window:
            message = (
                f"{PROFILED_EVERY}={values['every']} is shorter than one window (warm-up + active "
                f"= {window} steps of {PROFILED_SCHEDULE}); using {PROFILED_EVERY}={window}"
            )
            if strict:
                raise ValueError(message.replace("; using", "; PROFILED_STRICT=1 makes this an "
                                                 "error instead of using"))
            _warn_once(PROFILED_EVERY, str(values["every"]), message)
            values["every"] = window
        if values["enabled"] and child_of_profiled(env):
            values["enabled"] = False  # a child of a profiled process: silent (see the variable)
        if strict:
            # a bad RANK/WORLD_SIZE raises here, when the session is built, and never later at
            # a window's end inside a decorated call (distributed_info() reads them tolerantly)
            launcher_ranks_from_env(env, strict=True)
        if strict and values["exporters"]:
            # Without strict, unknown names warn (ExporterWarning) when the exporters are
            # resolved; strict turns them into an error here, with the other bad values.
            from exporters import check_exporter_names

            try:
                check_exporter_names(values["exporters"])
            except ValueError as exc:
                raise ValueError(
                    f"{PROFILED_EXPORTERS}={_quote(env.get(PROFILED_EXPORTERS, ''))} is invalid "
                    f"({_reason(exc)}); "
                    f"PROFILED_STRICT=1 makes this an error"
                ) from None
        return cls(**values)


# ---------------------------------------------------------------- field checks (code)


def _num(value: float) -> str:
    """A bound as people write it: ``3600``, ``1048576``, ``0.5``."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def _to_float(value: float, name: str) -> float:
    """``float(value)``; an int too large for a float is a ValueError like any value out of
    range (``float(10**400)`` raises OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} is out of range, got an integer of {value.bit_length()} "
                         "bits") from None


def _reject_unknown(fields: Mapping[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(Config)}
    for name in fields:
        if name not in known:
            raise TypeError(
                f"unknown configuration field {name!r}; known fields: {', '.join(sorted(known))}"
            )


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _check_field(name: str, value: Any) -> Any:
    if name in ("enabled", "record_shapes", "profile_memory", "all_threads", "with_stack",
                "with_flops",
                "trace_gzip", "analysis_process", "strict"):
        return _check_bool(name, value)
    if name == "schedule":
        if not isinstance(value, Schedule):
            raise TypeError(f"schedule must be a Schedule, got {type(value).__name__} {value!r}")
        return value
    if name == "trace_keep":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"trace_keep must be an int, got {type(value).__name__} {value!r}")
        if value < 0:
            raise ValueError(f"trace_keep must be >= 0 (0 keeps all), got {value}")
        return value
    if name in ("trace_dir", "json_path"):
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a path, got {type(value).__name__} {value!r}")
        text = os.fspath(value)
        if not text:
            raise ValueError(f"{name} must not be empty")
        return text
    if name in ("every", "max_windows"):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int or None, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1 (None: unset), got {value}")
        return value
    if name == "seed":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"seed must be an int, got {type(value).__name__} {value!r}")
        return value
    if name in ("sample_rate", "min_interval_s", "export_timeout_s"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
        value = _to_float(value, name)
        if name == "sample_rate" and not 0.0 <= value <= 1.0:
            raise ValueError(f"sample_rate must be between 0 and 1, got {value}")
        if name == "min_interval_s" and not 0.0 <= value <= MAX_MIN_INTERVAL_S:
            raise ValueError(
                f"min_interval_s must be >= 0 and <= {_num(MAX_MIN_INTERVAL_S)} (one week), "
                f"got {value}"
            )
        if name == "export_timeout_s" and not 0.0 < value <= MAX_EXPORT_TIMEOUT_S:
            raise ValueError(
                f"export_timeout_s must be > 0 and <= {_num(MAX_EXPORT_TIMEOUT_S)} (one hour), "
                f"got {value}"
            )
        return value
    if name == "trigger":
        if value is None:
            return None
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"trigger must be a signal name or a path, got {value!r}")
        text = os.fspath(value).strip()
        if not text:
            raise ValueError("trigger must not be empty (None: no trigger)")
        return _check_trigger(text)
    if name == "activities":
        if value is None:
            return None
        if isinstance(value, str):
            if value.strip().lower() == "auto":
                return None
            value = (value,)
        if not hasattr(value, "__iter__"):
            raise TypeError(
                f"activities must be 'auto', None or a sequence of names, got "
                f"{type(value).__name__} {value!r}"
            )
        out = []
        for item in value:
            text = str(getattr(item, "name", item)).lower()  # accepts ProfilerActivity too
            if text not in KNOWN_ACTIVITIES:
                raise ValueError(
                    f"activities: unknown activity {item!r}; expected 'auto' or some of "
                    f"{', '.join(KNOWN_ACTIVITIES)}"
                )
            if text not in out:
                out.append(text)
        if not out:
            raise ValueError("activities must name at least one of " + ", ".join(KNOWN_ACTIVITIES))
        return tuple(out)
    if name == "ranks":
        return RankSet.of(value)
    if name == "trace_max_mb":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"trace_max_mb must be a number of MiB, got {type(value).__name__} {value!r}"
            )
        value = _to_float(value, name)
        if not 0.0 <= value <= MAX_TRACE_MAX_MB:
            raise ValueError(
                f"trace_max_mb must be >= 0 and <= {_num(MAX_TRACE_MAX_MB)} MiB (1 TiB; "
                f"0: no limit), got {value}"
            )
        return value
    if name == "exporters":
        if isinstance(value, str) or not hasattr(value, "__iter__"):
            value = (value,)
        items = tuple(value)
        for item in items:
            if isinstance(item, str):
                if not item.strip():
                    raise ValueError("exporters: exporter names must not be empty")
            elif not (hasattr(item, "export") and hasattr(item, "shutdown")):
                raise TypeError(
                    f"exporters must be names or Exporter instances, got {type(item).__name__}"
                )
        return items
    raise TypeError(f"unknown configuration field {name!r}")  # pragma: no cover


# ---------------------------------------------------------------- environment parsing

_warned: set[tuple[str, str]] = set()  # (variable, raw value) pairs already warned about
_warned_lock = threading.Lock()


def _reset_warnings() -> None:
    """Forget which bad values were warned about (``instrument.testing.reset()``)."""
    with _warned_lock:
        _warned.clear()


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected one of 1/true/yes/on or 0/false/no/off")


def _int_parser(minimum: int | None, *, optional: bool = False):
    """A parser of integers ``>= minimum`` (any integer when None); ``optional``: an empty
    value, ``none`` or ``unset`` reads as None."""
    expected = "expected an integer" + (f" >= {minimum}" if minimum is not None else "")

    def parse(text: str) -> int | None:
        low = text.strip().lower()
        if optional and low in ("", "none", "unset"):
            return None
        try:
            value = int(low)
        except ValueError:
            raise ValueError(expected) from None
        if minimum is not None and value < minimum:
            raise ValueError(expected)
        return value
    return parse


def _parse_names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip().lower() for n in text.split(",") if n.strip())
    if names == ("none",):
        return ()
    return names


def _parse_activities(text: str) -> tuple[str, ...] | None:
    low = text.strip().lower()
    if low in ("", "auto"):
        return None
    return _check_field("activities", _parse_names(low))


def _parse_dir(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a directory path")
    return text


def _check_trigger(text: str) -> str:
    """A signal name (``SIGUSR2`` or ``USR2``) is normalised to ``SIGUSR2`` and must be one of
    ``TRIGGER_SIGNALS``: every other signal belongs to the program, the terminal, the launcher
    or the kernel (SIGTERM, SIGINT, SIGSEGV, SIGCHLD...), and a trigger that took one over
    would change what the program does when it arrives. Anything with a path separator or a
    dot is a file path."""
    import signal

    if "\0" in text:
        raise ValueError("trigger must not contain a NUL character")
    if os.sep in text or "/" in text or "." in text:
        return text
    name = text.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    allowed = ", ".join(TRIGGER_SIGNALS)
    if name in TRIGGER_SIGNALS and isinstance(getattr(signal, name, None), signal.Signals):
        return name
    if isinstance(getattr(signal, name, None), signal.Signals):
        raise ValueError(
            f"trigger signal {name} is not one a trigger may take over (it belongs to the "
            f"program, its launcher or the system); expected one of {allowed}, or a file path"
        )
    raise ValueError(
        f"trigger {_quote(text)} is neither a signal a trigger may use ({allowed}) nor a file "
        "path (a path contains '/' or '.')"
    )


def _float_parser(low: float, high: float, *, low_open: bool = False, what: str = ""):
    """A parser of finite numbers in ``low..high`` (``> low`` when ``low_open``); ``what``
    names the bound in the message (``"one hour"``)."""
    bound = (f"> {_num(low)}" if low_open else f">= {_num(low)}") + f" and <= {_num(high)}"
    expected = f"expected a number {bound}" + (f" ({what})" if what else "")

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            value = float("nan")
        # nan fails every comparison, inf fails <= high
        ok = (value > low if low_open else value >= low) and value <= high
        if not ok:
            raise ValueError(expected)
        return value
    return parse


def _parse_trigger(text: str) -> str | None:
    if not text.strip():
        return None
    return _check_trigger(text.strip())


def _parse_max_mb(text: str) -> float:
    expected = (f"expected a number of MiB >= 0 and <= {_num(MAX_TRACE_MAX_MB)} (1 TiB; "
                "0: no limit)")
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(expected) from None
    if not 0.0 <= value <= MAX_TRACE_MAX_MB:  # nan and inf too
        raise ValueError(expected)
    return value


_ENV_PARSERS = {
    "enabled": _parse_bool,
    "exporters": _parse_names,
    "schedule": Schedule.parse,
    "activities": _parse_activities,
    "record_shapes": _parse_bool,
    "profile_memory": _parse_bool,
    "all_threads": _parse_bool,
    "with_stack": _parse_bool,
    "with_flops": _parse_bool,
    "trace_dir": _parse_dir,
    "trace_gzip": _parse_bool,
    "analysis_process": _parse_bool,
    "trace_keep": _int_parser(0),
    "json_path": _parse_dir,
    "every": _int_parser(1, optional=True),
    "sample_rate": _float_parser(0.0, 1.0),
    "max_windows": _int_parser(1, optional=True),
    "min_interval_s": _float_parser(0.0, MAX_MIN_INTERVAL_S, what="seconds, at most one week"),
    "seed": _int_parser(None),
    "trigger": _parse_trigger,
    "export_timeout_s": _float_parser(0.0, MAX_EXPORT_TIMEOUT_S, low_open=True,
                                      what="seconds, at most one hour"),
    "ranks": RankSet.parse,
    "trace_max_mb": _parse_max_mb,
    "strict": _parse_bool,
}
_FIELD_ENV = {
    "enabled": PROFILED_ENABLED,
    "exporters": PROFILED_EXPORTERS,
    "schedule": PROFILED_SCHEDULE,
    "activities": PROFILED_ACTIVITIES,
    "record_shapes": PROFILED_RECORD_SHAPES,
    "profile_memory": PROFILED_PROFILE_MEMORY,
    "all_threads": PROFILED_ALL_THREADS,
    "with_stack": PROFILED_WITH_STACK,
    "with_flops": PROFILED_WITH_FLOPS,
    "trace_dir": PROFILED_TRACE_DIR,
    "trace_gzip": PROFILED_TRACE_GZIP,
    "trace_keep": PROFILED_TRACE_KEEP,
    "json_path": PROFILED_JSON_PATH,
    "every": PROFILED_EVERY,
    "sample_rate": PROFILED_SAMPLE_RATE,
    "max_windows": PROFILED_MAX_WINDOWS,
    "min_interval_s": PROFILED_MIN_INTERVAL_S,
    "seed": PROFILED_SEED,
    "trigger": PROFILED_TRIGGER,
    "export_timeout_s": PROFILED_EXPORT_TIMEOUT_S,
    "analysis_process": PROFILED_ANALYSIS_PROCESS,
    "ranks": PROFILED_RANKS,
    "trace_max_mb": PROFILED_TRACE_MAX_MB,
    "strict": PROFILED_STRICT,
}


def _describe_default(value: Any, var: str = "") -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, Schedule):
        return value.to_env()
    if value is None:
        return "auto" if var == PROFILED_ACTIVITIES else "unset"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


def _quote(raw: str) -> str:
    """``repr(raw)``, cut to its first ``QUOTE_CHARS`` characters when longer: a message names
    the value without repeating a huge one."""
    if len(raw) <= QUOTE_CHARS:
        return repr(raw)
    return f"{raw[:QUOTE_CHARS]!r}...({len(raw)} chars)"


def _reason(exc: BaseException) -> str:
    """Why a value was refused, bounded like the value itself (a parser may quote a part)."""
    text = str(exc)
    limit = 4 * QUOTE_CHARS
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def _env_value(env: Mapping[str, str], var: str, parse, default: Any, strict: bool) -> Any:
    raw = env.get(var)
    if raw is None:
        return default
    try:
        return parse(raw)
    except (TypeError, ValueError, OverflowError) as exc:
        if strict:
            raise ValueError(
                f"{var}={_quote(raw)} is invalid ({_reason(exc)}); PROFILED_STRICT=1 makes this "
                f"an error (without it the default {var}={_describe_default(default, var)} "
                "would be used)"
            ) from None
        message = (
            f"{var}={_quote(raw)} is invalid ({_reason(exc)}); using the default "
            f"{var}={_describe_default(default, var)}"
        )
        _warn_once(var, raw, message)
        return default


def _warn_once(var: str, raw: str, message: str) -> None:
    with _warned_lock:
        first = (var, raw) not in _warned
        _warned.add((var, raw))
    if first:
        warn(message, ConfigWarning)


_PID = str(os.getpid())  # this process's (kept, not asked for: Dynamo traces callers of this)


def _forked() -> None:
    global _PID
    _PID = str(os.getpid())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def child_of_profiled(environ: Mapping[str, str] | None = None) -> bool:
    """This process was started by a profiled one (``PROFILED_PARENT_PID`` names another
    process) and ``PROFILED_CHILDREN`` does not ask it to profile itself."""
    env = os.environ if environ is None else environ
    parent = env.get(PROFILED_PARENT_PID)
    if not parent or parent == _PID:
        return False
    return not _env_value(env, PROFILED_CHILDREN, _parse_bool, False, strict=False)


def mark_profiled_process() -> None:
    """Tell the processes this one starts from now on that it profiles
    (``PROFILED_PARENT_PID``); once per process, when its profiling starts."""
    if os.environ.get(PROFILED_PARENT_PID) != _PID:
        os.environ[PROFILED_PARENT_PID] = _PID


def enabled_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """``PROFILED_ENABLED`` alone (and ``child_of_profiled``), read cheaply when a decorator is
    applied."""
    env = os.environ if environ is None else environ
    if child_of_profiled(env):
        return False
    raw = env.get(PROFILED_ENABLED)
    if raw is None:
        return True
    strict = _env_value(env, PROFILED_STRICT, _parse_bool, False, strict=False)
    return _env_value(env, PROFILED_ENABLED, _parse_bool, True, strict)


def _parse_otel_detail(text: str) -> str:
    low = text.strip().lower()
    if low not in OTEL_DETAILS:
        raise ValueError("expected one of " + ", ".join(OTEL_DETAILS))
    return low


def otel_settings_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """``(PROFILED_OTEL_DETAIL, PROFILED_OTEL_MAX_SPANS)``, read when an ``otel`` exporter is
    built (tolerant like every ``PROFILED_*`` value; ``PROFILED_STRICT=1`` raises)."""
    env = os.environ if environ is None else environ
    strict = _env_value(env, PROFILED_STRICT, _parse_bool, False, strict=False)
    detail = _env_value(env, PROFILED_OTEL_DETAIL, _parse_otel_detail, "ranges", strict)
    max_spans = _env_value(env, PROFILED_OTEL_MAX_SPANS, _int_parser(1), 1000, strict)
    return detail, max_spans


# ---------------------------------------------------------------- launcher variables (ranks)

LAUNCHER_VARS: tuple[str, ...] = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
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
    rank = _env_value(env, rank_var, _int_parser(0), 0, strict)
    world = _env_value(env, world_var, _int_parser(1), max(rank + 1, 1), strict)
    if rank >= world:
        what = f"{rank_var}={rank} is not below {world_var}={world}"
        if strict:
            raise ValueError(f"{what}; PROFILED_STRICT=1 makes this an error (without it "
                             f"the world size {rank + 1} would be used)")
        _warn_once(f"{rank_var}/{world_var}", f"{rank}/{world}",
                   f"{what}; using the world size {rank + 1}")
        world = rank + 1
    return rank, world
