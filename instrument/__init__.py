"""torch-profiled: ``@profiled`` ranges, managed torch.profiler windows, pluggable exports.

from instrument import profiled

@profiled("matmul_bias")
def matmul_bias(x, w, b):
    return x @ w + b

The package face is lazy (PEP 562): ``import instrument`` loads no torch. It installs the
trigger signal's handler (``PROFILED_TRIGGER=SIGUSR2``; ``triggers``: the signal never ends the
process, from the import on) and nothing else; the runtime (decorator, sessions, torch) loads
at the first use of a public name (``from instrument import profiled``, ``instrument.session``),
all of it at once, as an eager face would have loaded it. So the ``torch-profiled`` command
(``instrument.cli``, ``python -m instrument``), whose modules are torch-free, starts without
torch's ~1-3 s, and a program that imports the SDK sees the same names and the same trigger.
A submodule is also reachable as an attribute (``instrument.testing`` after ``import
instrument``), imported at first use.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from .runtime import triggers
from .runtime.config import enabled_from_env

if TYPE_CHECKING:
    from .base.report import KernelStats, OpStats, RangeStats, WindowReport
    from .runtime.config import Config, ConfigWarning
    from .runtime.decorator import profiled
    from .runtime.lifetime import configure, flush, get_config, peak_tflops, session, shutdown, step
    from .runtime.module import ModuleHandle, instrument_module
    from .runtime.profiling_session import ProfilerWarning, Session
    from .runtime.sampling import Schedule

__all__ = [
    "Config",
    "ConfigWarning",
    "KernelStats",
    "ModuleHandle",
    "OpStats",
    "ProfilerWarning",
    "RangeStats",
    "Schedule",
    "Session",
    "WindowReport",
    "configure",
    "flush",
    "get_config",
    "instrument_module",
    "peak_tflops",
    "profiled",
    "session",
    "shutdown",
    "step",
]

__version__ = "0.1.0.dev0"


def _load_runtime() -> None:
    """Bind every public name here, from the modules that define them (torch comes with the
    decorator): what the face imported eagerly before it was lazy, in the same order."""
    from .base.report import KernelStats, OpStats, RangeStats, WindowReport
    from .runtime.config import Config, ConfigWarning
    from .runtime.decorator import profiled
    from .runtime.lifetime import configure, flush, get_config, peak_tflops, session, shutdown, step
    from .runtime.module import ModuleHandle, instrument_module
    from .runtime.profiling_session import ProfilerWarning, Session
    from .runtime.sampling import Schedule

    globals().update(
        Config=Config,
        ConfigWarning=ConfigWarning,
        profiled=profiled,
        configure=configure,
        flush=flush,
        get_config=get_config,
        peak_tflops=peak_tflops,
        session=session,
        shutdown=shutdown,
        step=step,
        ModuleHandle=ModuleHandle,
        instrument_module=instrument_module,
        KernelStats=KernelStats,
        OpStats=OpStats,
        RangeStats=RangeStats,
        WindowReport=WindowReport,
        Schedule=Schedule,
        ProfilerWarning=ProfilerWarning,
        Session=Session,
    )


def __getattr__(name: str) -> Any:
    """A public name: the runtime, loaded once (later lookups find the name bound here). Any
    other name: the submodule of that name, imported now (``instrument.testing``)."""
    if name in __all__:
        _load_runtime()
        return globals()[name]
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # the submodule is there; something it imports is not
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _trigger_idle_reason(name: str) -> str | None:
    """Why the trigger signal ``name``, arriving while no session has armed the trigger, opens
    no window (None: the next session opens one at its first step). Runs inside the signal
    handler: reads, never imports. Once the runtime is loaded, the runtime's answer
    (``lifetime``: ``configure(enabled=...)``, after ``shutdown()``, another session's
    trigger); before, no session exists yet and only the environment can say no."""
    lifetime = sys.modules.get(f"{__name__}.runtime.lifetime")
    runtime = getattr(lifetime, "_trigger_idle_reason", None)
    if runtime is not None:
        result: str | None = runtime(name)
        return result
    if not enabled_from_env():
        return (
            "profiling is off in this process (PROFILED_ENABLED=0, configure(enabled=False), "
            "or a child of a profiled process)"
        )
    return None


# PROFILED_TRIGGER=SIGUSR2: the handler goes on the signal as the SDK is imported (issue 29),
# before any of the runtime (and torch) loads
triggers.install_from_env(os.environ, _trigger_idle_reason)
