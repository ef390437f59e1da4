"""The CPU name the benches print in their machine line: no torch, no instrument, nothing decorated
(a bench that imports another bench's module for it would run that module's decorations, and
a ``step=True`` one changes how every session counts steps)."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU's model name as ``/proc/cpuinfo`` gives it, else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
