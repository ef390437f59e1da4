"""Times and table columns, formatted one way for every text the SDK prints.

The console exporter's window table, the CLI's ``summarize``/``diff``/ranks tables and the
verdict's reasons all show times the way torch's own ``key_averages().table()`` does
(``23.104us``, ``2.314ms``, ``1.250s``), so that a number read in one can be looked up in the
others. They also share one rule for a table row within ``WIDTH`` columns: the numbers are
never cut, the name column gives way (its end dropped, or its middle for module paths).

Plain Python, no torch and nothing from ``instrument``: exporters import it (they never import
torch or instrument internals), and so do ``instrument.cli`` and ``instrument.base.verdict``.
"""

from __future__ import annotations

import math

__all__ = ["WIDTH", "fit", "format_delta_us", "format_time_us", "row"]

WIDTH = 100  # the widest line any table prints (no terminal query: logs and pipes too)
ELLIPSIS = "..."
MIN_NAME_WIDTH = 8  # a name column never shrinks below this, even if the line then runs long


def format_time_us(us: float) -> str:
    """``us`` microseconds in torch's table units: ``23.104us``, ``2.314ms``, ``1.250s``.

    Three decimals in the largest unit (us, ms, s) whose value, once rounded, is at least 1;
    a value that rounds up to 1000 of a unit moves to the next one (``1.000ms``, never
    ``1000.000us``). Below a microsecond it stays in us (``0.250us``: nanosecond resolution),
    and seconds are the largest unit however large the value. A negative time carries a minus
    sign before the same digits (``-2.314ms``); ``-0.0`` prints as ``0.000us``; ``nan`` and
    ``inf`` print as themselves.
    """
    if not math.isfinite(us):
        return str(us)
    if us < 0:
        return "-" + format_time_us(-us)
    us = us + 0.0  # -0.0 -> 0.0
    text = f"{us:.3f}"
    if float(text) < 1e3:
        return text + "us"
    text = f"{us / 1e3:.3f}"
    if float(text) < 1e3:
        return text + "ms"
    return f"{us / 1e6:.3f}s"


def format_delta_us(us: float) -> str:
    """A signed change of ``us`` microseconds: ``+1.250ms``, ``-23.000us``; no change is
    ``+0.000us`` (the sign column is always there, so deltas line up)."""
    return ("-" if us < 0 else "+") + format_time_us(abs(us))


def fit(name: str, width: int, middle: bool = False) -> str:
    """``name`` cut to at most ``width`` characters, an ellipsis marking the cut.

    By default the end is dropped (``aten::conv...``); ``middle=True`` drops the middle, so that
    module paths such as ``model.layers.1.post_attention_layernorm`` keep both their layer
    index and their leaf. A width too small for the ellipsis cuts without one."""
    if len(name) <= width:
        return name
    if width <= len(ELLIPSIS):
        return name[: max(width, 0)]
    keep = width - len(ELLIPSIS)
    if middle:
        head = keep // 2
        return name[:head] + ELLIPSIS + name[len(name) - (keep - head) :]
    return name[:keep] + ELLIPSIS


def row(name: str, rest: str, name_width: int = WIDTH, middle: bool = False) -> str:
    """A table row: ``name`` left-aligned in a column of ``name_width``, then ``rest``.

    ``rest`` (the numbers, already aligned by the caller) is never cut; the name column
    shrinks when the two would pass ``WIDTH``, down to ``MIN_NAME_WIDTH``. With the default
    ``name_width`` the column takes whatever ``rest`` leaves of ``WIDTH``."""
    width = max(min(name_width, WIDTH - len(rest)), MIN_NAME_WIDTH)
    return f"{fit(name, width, middle):<{width}}{rest}"
