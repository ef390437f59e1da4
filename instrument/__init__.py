"""torch-profiled: ``@profiled`` ranges, managed torch.profiler windows, pluggable exports.

from instrument import profiled

@profiled("matmul_bias")
def matmul_bias(x, w, b):
    return x @ w + b
"""

from . import lifetime
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


# PROFILED_TRIGGER=SIGUSR2: the handler goes on the signal as the SDK is imported (lifetime)
lifetime.install_trigger_signal()
