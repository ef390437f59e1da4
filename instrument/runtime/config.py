"""Configuration: one frozen ``Config``, and one ``Setting`` per ``PROFILED_*`` variable.

``SETTINGS`` declares every variable once (field, variable, default, parse, check, README
line); ``Config``'s defaults and checks, ``Config.from_env``, ``configure()``'s validation,
``ENV_VARS`` and the README's table (``instrument.cli.settings_table``) are all read from it.

Environment values are parsed tolerantly: a bad value warns once (naming the variable, the
value and the default used) and the default applies; ``PROFILED_STRICT=1`` turns that into a
``ValueError``. Absurd values are bad values too: every number that feeds a wait or a size has a
documented maximum (``MAX_*`` below; inf and nan are refused), so no value can crash a decorated
call or the exit, and a message quotes at most ``QUOTE_CHARS`` characters of a value (a 1 MB
environment value makes a one-line warning). A ``PROFILED_*`` name that no ``Setting``
declares is a mistake too (``check_names``: one warning naming the closest setting, or
``ValueError`` under ``PROFILED_STRICT=1``), and a ``PROFILED_ENABLED`` that cannot be read
turns profiling off: a switch fails closed. Values given in code (``configure()``,
``session()``) go through the same checks, strictly: ``TypeError``/``ValueError`` at once.
Whether an exporter name is known is checked by the callers (``instrument.runtime.lifetime``): the
exporter registry is a layer above this module.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporters import otel_settings
from instrument.base.settings import (
    QUOTE_CHARS,
    STRICT,
    TRUE_SPELLINGS,
    ConfigWarning,
    Setting,
    boolean,
    integer,
    number,
    refuse,
    refuse_unknown_names,
    reset_warnings,
)

from . import setting_kinds as kinds
from .ranks import RankSet, launcher_ranks_from_env
from .sampling import Sampling, Schedule
from .setting_kinds import KNOWN_ACTIVITIES

__all__ = [
    "ENV_VARS",
    "FIELDS",
    "KNOWN_ACTIVITIES",
    "MAX_EXPORT_TIMEOUT_S",
    "MAX_METRICS_INTERVAL_S",
    "MAX_MIN_INTERVAL_S",
    "MAX_SLOW_STEP",
    "MAX_TRACE_MAX_MB",
    "MIN_METRICS_INTERVAL_S",
    "QUOTE_CHARS",
    "SETTINGS",
    "Config",
    "ConfigWarning",
    "Setting",
]

MAX_EXPORT_TIMEOUT_S = 3600.0
"""The longest ``PROFILED_EXPORT_TIMEOUT_S``: one hour (a longer wait at exit is a hang)."""

MAX_MIN_INTERVAL_S = 7 * 86400.0
"""The longest ``PROFILED_MIN_INTERVAL_S``: one week."""

MAX_METRICS_INTERVAL_S = 86400.0
"""The longest ``PROFILED_METRICS_INTERVAL_S``: one day."""

MIN_METRICS_INTERVAL_S = 0.1
"""The shortest ``PROFILED_METRICS_INTERVAL_S``: a tenth of a second. Each interval wakes a
thread that takes the program's GIL to snapshot every range's histogram and queues a record
for every metrics exporter (a JSON line, an OTel export, a new Prometheus page); at ``1e-9``
that thread never slept, and the program ran beside a busy loop of exports."""

MAX_SLOW_STEP = 1000.0
"""The largest ``PROFILED_SLOW_STEP`` factor."""

MAX_TRACE_MAX_MB = 1048576.0
"""The largest ``PROFILED_TRACE_MAX_MB``: 1 TiB (0 means no limit at all)."""

# ---------------------------------------------------------------- the declarations

CHILDREN = Setting(
    "children",
    "PROFILED_CHILDREN",
    False,
    **boolean(),
    doc="`1`: processes a profiled process starts (DataLoader workers, `multiprocessing` spawn, "
    "`subprocess`) profile themselves too; by default they open no window, print no table "
    "and write no trace (`@profiled` returns the function itself there, or its calls run "
    "idle). A DataLoader worker is one whatever its start method and whether the loader "
    "starts before or after the first decorated call",
)

PARENT_PID = Setting(
    "parent_pid",
    "PROFILED_PARENT_PID",
    None,
    parse=None,
    check=lambda name, value: value,
    shown="set by the SDK",
    doc="the process id of a process whose profiling started, inherited by the processes it "
    "starts; do not set it",
)

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "enabled",
        "PROFILED_ENABLED",
        True,
        **boolean(),
        fallback=False,
        fallback_note="profiling off: a switch that cannot be read fails closed",
        doc="`0`: `@profiled` returns the function itself (read when the decorator is "
        "applied), context forms do nothing, no profiler starts; a value that is not one of "
        "the boolean spellings turns profiling off too, with one warning",
    ),
    Setting(
        "exporters",
        "PROFILED_EXPORTERS",
        ("console", "trace"),
        **kinds.exporters(),
        doc="comma-separated exporter names; empty or `none`: no exporters, and no "
        "profiler window opens (nor when every name is unknown: one warning)",
    ),
    Setting(
        "schedule",
        "PROFILED_SCHEDULE",
        Schedule(),
        **kinds.schedule(),
        doc="the ambient session's schedule; missing keys keep their defaults",
    ),
    Setting(
        "activities",
        "PROFILED_ACTIVITIES",
        None,
        **kinds.activities(),
        shown="auto",
        doc="`auto` (CPU plus the accelerator torch sees) or a subset of "
        f"`{','.join(KNOWN_ACTIVITIES)}`",
    ),
    Setting(
        "record_shapes",
        "PROFILED_RECORD_SHAPES",
        False,
        **boolean(),
        doc="record operator input shapes",
    ),
    Setting(
        "profile_memory",
        "PROFILED_PROFILE_MEMORY",
        False,
        **boolean(),
        doc="record tensor allocations",
    ),
    Setting(
        "all_threads",
        "PROFILED_ALL_THREADS",
        False,
        **boolean(),
        doc="`1`: windows record every thread, not only the one that started the window. "
        "Unsafe where other threads run torch operators while a window starts or "
        "stops (torch's all-threads profiling can then crash the process; see known "
        "limits); `PROFILED_PROFILE_MEMORY=1` windows still record one thread",
    ),
    Setting("with_stack", "PROFILED_WITH_STACK", False, **boolean(), doc="record Python stacks"),
    Setting(
        "with_flops",
        "PROFILED_WITH_FLOPS",
        False,
        **boolean(),
        doc="count FLOPs (matrix products, convolutions, scaled-dot-product attention; "
        "records input shapes too): per range FLOPs, achieved FLOP/s over device time, MFU "
        "against the device's dense peak, FLOP/byte against its ridge point",
    ),
    Setting(
        "peak_tflops",
        "PROFILED_PEAK_TFLOPS",
        None,
        **kinds.optional(number(0.0, 1e6, low_open=True, note="TFLOP/s")),
        doc="the device's dense peak in TFLOP/s for MFU, for every dtype (unset: the "
        "built-in table of data-centre GPUs; a device not in it says `peak unknown`)",
    ),
    Setting(
        "trace_dir",
        "PROFILED_TRACE_DIR",
        "./profiled_traces",
        **kinds.path(),
        doc="where the `trace` exporter writes",
    ),
    Setting(
        "trace_gzip",
        "PROFILED_TRACE_GZIP",
        True,
        **boolean(),
        doc="`.pt.trace.json.gz` (1) or `.pt.trace.json` (0)",
    ),
    Setting(
        "trace_keep",
        "PROFILED_TRACE_KEEP",
        20,
        **integer(0, note="0 keeps all"),
        doc="newest trace files kept per worker (0: all)",
    ),
    Setting(
        "trace_max_mb",
        "PROFILED_TRACE_MAX_MB",
        1024.0,
        **number(0.0, MAX_TRACE_MAX_MB, unit=" of MiB", note="1 TiB; 0: no limit"),
        doc="MiB of trace files kept in the trace directory, all workers together, oldest "
        "removed first; other files there are never touched (fractions allowed; 0: no "
        "limit; at most 1048576)",
    ),
    Setting(
        "ranks",
        "PROFILED_RANKS",
        RankSet(),
        **kinds.ranks(),
        doc="ranks that profile: `all`, `0,3`, `0-7` or a mix (ranks up to 2147483647, at "
        "most 1024 terms); other ranks start no profiler. A rank is torch.distributed's "
        "when it is initialised at the first decorated call, else `RANK` (`LOCAL_RANK`; "
        "0 without either)",
    ),
    Setting(
        "json_path",
        "PROFILED_JSON_PATH",
        "./profiled_reports.jsonl",
        **kinds.path(),
        doc="where the `json` exporter appends one line per window (`-`: standard "
        "output); must be a regular file: a link, FIFO or directory there is refused "
        "with one warning",
    ),
    Setting(
        "prometheus_addr",
        "PROFILED_PROMETHEUS_ADDR",
        "127.0.0.1:9464",
        **kinds.address(),
        doc="where the `prometheus` exporter serves `/metrics` (`host:port`; an IPv6 address "
        "in brackets, `[::1]:9464`; every interface only by name, `0.0.0.0:9464` or "
        "`[::]:9464`; port 0: any free one); an address in use costs one warning",
    ),
    *otel_settings.SETTINGS,
    Setting(
        "every",
        "PROFILED_EVERY",
        None,
        **integer(1, optional=True),
        doc="open a window (the schedule's warm-up + active steps) every N steps, forever "
        "(`PROFILED_MAX_WINDOWS` caps them); N >= warm-up + active; the schedule's "
        "`wait`/`repeat` then do not apply",
    ),
    Setting(
        "sample_rate",
        "PROFILED_SAMPLE_RATE",
        1.0,
        **number(0.0, 1.0),
        shown="1.0",
        doc="probability that a step which may open a window (every N-th, or any idle "
        "step without `PROFILED_EVERY`) does",
    ),
    Setting(
        "max_windows",
        "PROFILED_MAX_WINDOWS",
        None,
        **integer(1, optional=True),
        doc="at most this many windows per process (triggered ones too)",
    ),
    Setting(
        "min_interval_s",
        "PROFILED_MIN_INTERVAL_S",
        0.0,
        **number(0.0, MAX_MIN_INTERVAL_S, note="seconds, at most one week"),
        doc="seconds from the end of a window to the next sampled one (per-process clock: "
        "ranks may diverge; at most 604800)",
    ),
    Setting(
        "seed",
        "PROFILED_SEED",
        0,
        **integer(),
        doc="seed of the sampling draw: the same seed opens the same windows on every rank",
    ),
    Setting(
        "trigger",
        "PROFILED_TRIGGER",
        None,
        **kinds.trigger(),
        doc="on-demand windows: `SIGUSR2` or `SIGUSR1` (no other signal; its handler is "
        "installed at import, and the signal never ends the process), or a file path "
        "holding a `/` or `.` (`./profile-now`, not `profile-now`; create an empty file of "
        "your own there to open a window at the next step; it is "
        "removed when taken; what was there at start, files with content and anything else "
        "are left alone)",
    ),
    Setting(
        "slow_step",
        "PROFILED_SLOW_STEP",
        None,
        **kinds.optional(
            number(1.0, MAX_SLOW_STEP, low_open=True, note="a factor of the median step time")
        ),
        doc="a factor, e.g. `3`: a step slower than that many times the median of the last "
        "100 steps opens a window at the next step (after a warm-up of 10 steps; a window's "
        "steps, the next 5 and those while its report is exported are not judged; a slow "
        "step recurring at a regular period, 3 in a row of similar times, is learned as "
        "normal; `PROFILED_MAX_WINDOWS` and `PROFILED_MIN_INTERVAL_S` apply, and a notice "
        "says when one holds a slow step back); unset: off (more than 1, at most 1000)",
    ),
    Setting(
        "overhead_budget",
        "PROFILED_OVERHEAD_BUDGET",
        5.0,
        **number(0.0, 100.0, note="a percentage of wall time"),
        shown="5",
        doc="the most the windows may cost the program, as a percentage of wall time over a "
        "rolling 60 s (each window's cost is its report's ledger: step time over the median "
        "window-free step, start and stop stalls, trace export and analysis CPU); over it, "
        "the next window records no stacks, shapes or memory, then each further window "
        "over it halves how often windows open, and the next report says so; 0: no budget",
    ),
    Setting(
        "export_timeout_s",
        "PROFILED_EXPORT_TIMEOUT_S",
        10.0,
        **number(0.0, MAX_EXPORT_TIMEOUT_S, low_open=True, note="seconds, at most one hour"),
        doc="how long the end of the sessions and the analysis helper together (and "
        "interpreter exit, and a SIGTERM's export) wait for queued reports before they go on "
        "and say what was not exported; torch's own stop of a window still open is not "
        "included (more than 0, at most 3600)",
    ),
    Setting(
        "analysis_process",
        "PROFILED_ANALYSIS_PROCESS",
        True,
        **boolean(),
        doc="`1`: each window's trace is read, shaped and analyzed in a helper process "
        "(one per profiled process, no torch, started at the first window), off the "
        "program's GIL; `0`: on the SDK's export thread (on an H200 training step a "
        "sampled window then costs ~160 ms instead of ~47 ms, see BENCHMARKS.md). A "
        "helper that fails or hangs is replaced by the export thread, with one "
        "warning; on systems other than POSIX the export thread does the work",
    ),
    Setting(
        "metrics",
        "PROFILED_METRICS",
        None,
        **boolean(auto=True),
        shown="auto",
        doc="always-on metrics: every decorated call's wall time in a per-range histogram, "
        "between windows too, exported every `PROFILED_METRICS_INTERVAL_S` and at exit; "
        "`auto`: on when an exporter takes metrics (`json`, `otel`, `prometheus`), `1`/`0` "
        "force it",
    ),
    Setting(
        "metrics_interval_s",
        "PROFILED_METRICS_INTERVAL_S",
        60.0,
        **number(
            MIN_METRICS_INTERVAL_S,
            MAX_METRICS_INTERVAL_S,
            note="seconds; more often, the export thread would hardly sleep",
        ),
        doc="how often the metrics are exported (and once more at exit), in seconds: at least "
        "0.1 (each export takes the program's GIL), at most 86400",
    ),
    Setting(
        "metrics_device_every",
        "PROFILED_METRICS_DEVICE_EVERY",
        100,
        **integer(0, note="0 turns it off"),
        doc="with metrics on and CUDA in use: one call in this many of each range also gets "
        "its device time, from CUDA events read back once complete (never a synchronize); "
        "`0`: none",
    ),
    Setting(
        "metrics_max_ranges",
        "PROFILED_METRICS_MAX_RANGES",
        1000,
        **integer(1, note="distinct range names with a histogram of their own"),
        doc="at most this many distinct range names get metrics of their own; the calls of "
        "every name past it are counted under one range, `other` (one warning names the "
        'cap): names made at run time (`profiled(f"req{id}")`) cost bounded memory and '
        "series. Each name costs about 1-3 KB",
    ),
    Setting(
        "metrics_modules",
        "PROFILED_METRICS_MODULES",
        False,
        **boolean(),
        doc="`1`: ranges from `instrument_module` are counted in the metrics too (there "
        "can be many per step)",
    ),
    STRICT,
    CHILDREN,
    PARENT_PID,
)
"""Every ``PROFILED_*`` variable, in the README's order (the OTel exporter's are declared in
``exporters.otel_settings``, beside it)."""

ENV_VARS: tuple[str, ...] = tuple(s.env for s in SETTINGS)

_KNOWN_VARS = frozenset(ENV_VARS)  # every other PROFILED_* name is a mistake (warned about)

_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def _default(name: str) -> Any:
    return _BY_NAME[name].default


# ---------------------------------------------------------------- the one cross-field rule


def _window_if_every_too_short(every: int | None, schedule: Schedule) -> int | None:
    """``every`` opens a window every N steps, so N must hold one window (warm-up + active
    steps). Returns that window length when ``every`` is shorter, else None."""
    window = schedule.warmup + schedule.active
    return window if every is not None and every < window else None


@dataclass(frozen=True)
class Config:
    """Everything the SDK can be told. Build with ``Config.from_env()`` or ``Config(**fields)``.

    Each field's default and check come from its ``Setting`` in ``SETTINGS``."""

    enabled: bool = _default("enabled")
    exporters: tuple[Any, ...] = _default("exporters")
    schedule: Schedule = _default("schedule")  # noqa: RUF009 - immutable: shared safely
    activities: tuple[str, ...] | None = _default("activities")  # None: auto
    record_shapes: bool = _default("record_shapes")
    profile_memory: bool = _default("profile_memory")
    all_threads: bool = _default("all_threads")
    with_stack: bool = _default("with_stack")
    with_flops: bool = _default("with_flops")
    peak_tflops: float | None = _default("peak_tflops")
    trace_dir: str = _default("trace_dir")
    trace_gzip: bool = _default("trace_gzip")
    trace_keep: int = _default("trace_keep")
    json_path: str = _default("json_path")
    prometheus_addr: str = _default("prometheus_addr")
    every: int | None = _default("every")
    sample_rate: float = _default("sample_rate")
    max_windows: int | None = _default("max_windows")
    min_interval_s: float = _default("min_interval_s")
    seed: int = _default("seed")
    trigger: str | None = _default("trigger")
    slow_step: float | None = _default("slow_step")
    overhead_budget: float = _default("overhead_budget")
    export_timeout_s: float = _default("export_timeout_s")
    analysis_process: bool = _default("analysis_process")
    metrics: bool | None = _default("metrics")  # None: auto
    metrics_interval_s: float = _default("metrics_interval_s")
    metrics_device_every: int = _default("metrics_device_every")
    metrics_max_ranges: int = _default("metrics_max_ranges")
    metrics_modules: bool = _default("metrics_modules")
    # distributed and disk
    ranks: RankSet = _default("ranks")  # noqa: RUF009 - immutable: shared safely
    trace_max_mb: float = _default("trace_max_mb")
    strict: bool = _default("strict")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            checked = _BY_NAME[f.name].check(f.name, value)
            if checked is not value:
                object.__setattr__(self, f.name, checked)
        window = _window_if_every_too_short(self.every, self.schedule)
        if window is not None:
            raise ValueError(
                f"every={self.every} is shorter than one window (warm-up {self.schedule.warmup} "
                f"+ active {self.schedule.active} = {window} steps); use every >= {window}"
            )

    @property
    def sampling(self) -> Sampling:
        return Sampling(every=self.every, sample_rate=self.sample_rate, seed=self.seed)

    def replace(self, **fields: Any) -> Config:
        """A copy with ``fields`` changed; unknown names raise ``TypeError``."""
        _reject_unknown(fields)
        return dataclasses.replace(self, **fields)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Read every ``PROFILED_*`` variable; bad values warn once and use the default."""
        env = os.environ if environ is None else environ
        strict = STRICT.read(env, strict=False)
        check_names(environ, strict)
        values = {name: _BY_NAME[name].read(env, strict) for name in FIELDS if name != "strict"}
        values["strict"] = strict
        window = _window_if_every_too_short(values["every"], values["schedule"])
        if window is not None:
            refuse(
                "PROFILED_EVERY",
                str(values["every"]),
                f"PROFILED_EVERY={values['every']} is shorter than one window (warm-up + "
                f"active = {window} steps of PROFILED_SCHEDULE)",
                f"PROFILED_EVERY={window}",
                strict,
            )
            values["every"] = window
        if values["enabled"] and child_of_profiled(env):
            values["enabled"] = False  # a child of a profiled process: silent (see CHILDREN)
        if strict:
            # a bad RANK/WORLD_SIZE raises here, when the session is built, and never later at
            # a window's end inside a decorated call (distributed_info() reads them tolerantly)
            launcher_ranks_from_env(env, strict=True)
        return cls(**values)


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config))
"""``Config``'s fields, in order; each is the name of a ``Setting``."""

_missing = set(FIELDS) - set(_BY_NAME)
if _missing:  # a field without a declaration: Config and SETTINGS must say the same
    raise ImportError(f"Config fields without a Setting in SETTINGS: {sorted(_missing)}")


def _reject_unknown(fields: Mapping[str, Any]) -> None:
    for name in fields:
        if name not in FIELDS:
            raise TypeError(
                f"unknown configuration field {name!r}; known fields: {', '.join(sorted(FIELDS))}"
            )


def check_names(environ: Mapping[str, str] | None = None, strict: bool | None = None) -> None:
    """Every ``PROFILED_*`` name in the environment that is no setting (``SETTINGS``, the one
    list of names: the SDK's, the exporters' and the one it sets itself): one warning each,
    naming the closest setting (``PROFILED_ENABLED`` spelt without its ``D`` would otherwise
    leave profiling on, silently); ``PROFILED_STRICT=1`` raises ``ValueError``. A process
    that ``multiprocessing`` started (DataLoader workers, pools) says nothing about its own
    environment: it is its parent's, which has said it (eight workers, eight copies)."""
    if environ is None and _multiprocessing_child():
        return
    env = os.environ if environ is None else environ
    if strict is None:
        strict = STRICT.read(env, strict=False)
    refuse_unknown_names(env, _KNOWN_VARS, strict)


def _compiling() -> bool:
    """torch.compile traces this call (``torch.compiler.is_compiling``, which Dynamo answers
    while it traces); asked of ``sys.modules``, never imported."""
    compiler = sys.modules.get("torch.compiler")
    return compiler is not None and compiler.is_compiling()


def _multiprocessing_child() -> bool:
    """Started by ``multiprocessing`` (any start method): asked of ``sys.modules``, never
    imported (a process that has not imported it is none)."""
    process = sys.modules.get("multiprocessing.process")
    parent = getattr(process, "parent_process", None)
    return parent is not None and parent() is not None


_names_checked = False  # enabled_from_env checks os.environ's names once per process


def _reset_warnings() -> None:
    """Forget which bad values were warned about (``instrument.testing.reset()``)."""
    global _names_checked
    _names_checked = False
    reset_warnings()


# ---------------------------------------------------------------- process-level variables

_PID = str(os.getpid())  # this process's (kept, not asked for: Dynamo traces callers of this)


def _forked() -> None:
    global _PID
    _PID = str(os.getpid())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def child_of_profiled(environ: Mapping[str, str] | None = None, *, workers: bool = True) -> bool:
    """This process was started by a profiled one and ``PROFILED_CHILDREN`` does not ask it
    to profile itself: ``PROFILED_PARENT_PID`` names another process, or (``workers``) this
    is a DataLoader worker, which a loader may start before the parent's first decorated call,
    so before the parent could set ``PROFILED_PARENT_PID`` (the usual order:
    ``for batch in loader:`` comes first)."""
    env = os.environ if environ is None else environ
    parent = env.get(PARENT_PID.env)
    if (not parent or parent == _PID) and not (workers and dataloader_worker()):
        return False
    return not CHILDREN.read(env, strict=False)


def dataloader_worker() -> bool:
    """This process is a torch DataLoader worker, whatever its start method (fork, spawn,
    forkserver): torch sets the worker's info before the worker's first fetch, so every
    ``__getitem__`` a worker runs sees it. Looked up in ``sys.modules``, never imported: a
    worker has imported ``torch.utils.data`` already, and a process that has not is no worker
    (importing it here would put torch into every decorator's first use)."""
    data = sys.modules.get("torch.utils.data")
    info = getattr(data, "get_worker_info", None)
    return info is not None and info() is not None


def mark_profiled_process() -> None:
    """Tell the processes this one starts from now on that it profiles
    (``PROFILED_PARENT_PID``); once per process, when its profiling starts."""
    if os.environ.get(PARENT_PID.env) != _PID:
        os.environ[PARENT_PID.env] = _PID


_ENABLED = _BY_NAME["enabled"]


def enabled_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """``PROFILED_ENABLED`` alone (and ``child_of_profiled``), read cheaply when a decorator is
    applied. A DataLoader worker is not asked about here: at decoration time (its imports) a
    worker has not started fetching, so torch does not say yet that it is one (its ambient
    session, built at its first decorated call, is off: ``Config.from_env``); and
    ``torch.compile`` refuses to trace ``get_worker_info`` (a ``with profiled(...)`` in
    compiled code builds its object here)."""
    global _names_checked
    env = os.environ if environ is None else environ
    # the first decorator says it (at import, usually), unless torch.compile traces this (a
    # `with profiled(...)` in compiled code): a warning cannot be traced; the next one says it
    if (not _names_checked or environ is not None) and not _compiling():
        check_names(environ)
        _names_checked = environ is None
    if child_of_profiled(env, workers=False):
        return False
    raw = env.get(_ENABLED.env)
    if raw is None:
        return True
    if _compiling():  # traced: a warning cannot be; a bad value is off, said by eager code
        return raw.strip().lower() in TRUE_SPELLINGS
    return _ENABLED.read(env, STRICT.read(env, strict=False))


def peak_tflops_from_env(environ: Mapping[str, str] | None = None) -> float | None:
    """``PROFILED_PEAK_TFLOPS`` alone (the CLI's reports of saved traces use it for MFU)."""
    env = os.environ if environ is None else environ
    return _BY_NAME["peak_tflops"].read(env, STRICT.read(env, strict=False))


def max_ranges_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``PROFILED_METRICS_MAX_RANGES`` alone (the metrics feed, where no config is given)."""
    env = os.environ if environ is None else environ
    return int(_BY_NAME["metrics_max_ranges"].read(env, STRICT.read(env, strict=False)))


def __getattr__(name: str) -> str:
    """``config.PROFILED_ENABLED`` and the like still name their variable (each was a constant
    here before the declarations; ``SETTINGS`` is where they are documented now)."""
    if name in ENV_VARS:
        return name
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
