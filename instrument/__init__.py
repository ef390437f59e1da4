"""torch-profiled: ``@profiled`` ranges, managed torch.profiler windows, pluggable exports.

from instrument import profiled

@profiled("matmul_bias")
def matmul_bias(x, w, b):
    return x @ w + b
"""

from .config import Config, ConfigWarning
from .decorator import profiled
from .lifetime import configure, flush, session, shutdown, step
from .module import ModuleHandle, instrument_module
from .report import KernelStats, OpStats, RangeStats, WindowReport
from .sampling import Schedule
from .sessions import ProfilerWarning, Session

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
    "instrument_module",
    "profiled",
    "session",
    "shutdown",
    "step",
]

__version__ = "0.1.0.dev0"


def _trigger_idle_reason(name: str) -> str | None:
    """Why the trigger signal ``name``, arriving while no session has armed the trigger, opens
    no window (None: the next session that arms it opens one at its first step). Runs inside
    the signal handler: reads, never blocks."""
    from . import state
    from .config import enabled_from_env

    enabled = state.overrides.get("enabled")
    if not (enabled_from_env() if enabled is None else enabled):
        return (
            "profiling is off in this process (PROFILED_ENABLED=0, configure(enabled=False), "
            "or a child of a profiled process)"
        )
    if state.shut_down:
        return (
            "profiling has ended in this process (after shutdown(), at exit, or in a forked child)"
        )
    cur = state.current
    if cur is not None and cur._started:
        if cur.config.trigger != name:
            return f"the profiling session's trigger is {cur.config.trigger or 'unset'}"
        if cur.finished:
            return "the profiling session opens no windows"
    return None


def _install_trigger_signal() -> None:
    """``PROFILED_TRIGGER=SIGUSR2``: our handler goes on the signal as the SDK is imported, so
    that the signal never ends the process, profiling on or off (``triggers``)."""
    import os

    from . import triggers

    triggers.install_from_env(os.environ, _trigger_idle_reason)


_install_trigger_signal()
