"""Time spent in torch.distributed's collectives, in the always-on metrics.

A collective equalises the ranks' step times: the rank that arrives last waits least, the
others wait for it, and every rank's step ends at the same moment. A step's wall time then
cannot name the late rank; its time *outside* the collectives can. So while metrics are on in
a process that has torch.distributed, the module's Python collectives (``COLLECTIVES``:
``torch.distributed.all_reduce`` and its kin) are wrapped: each blocking call records its wall
time into the metrics as a range named ``torch.distributed.<collective>`` (``PREFIX``: a name
reserved for this), through ``metrics.record``. ``metrics_summary`` subtracts those from the
step time.

What is not seen, and why:

- ``async_op=True`` calls are not timed: the wait happens later, at ``work.wait()`` or in
  C++, and the time between overlaps the program's own work, so it is not time outside it.
- DDP's gradient all-reduce runs in its C++ reducer, which calls the process group directly,
  never these Python functions (a registered ``register_comm_hook`` runs in Python, but issues
  ``async_op=True`` and leaves the wait to the reducer). Its waiting stays inside the step
  (``backward``): the traces' arrival skew (``cli.inputs.collective_skew``) sees it.
- A name bound before metrics started (``from torch.distributed import all_reduce``) keeps
  the unwrapped function; ``dist.all_reduce(...)`` is wrapped.

The wrap costs nothing in a process that never calls a collective, and is not installed
where torch.distributed is unavailable. A wrapped collective checks one flag
(``state.metrics_on``) before timing; ``uninstall`` puts the originals back. Importing this
module imports no torch (``metrics_summary`` reads ``PREFIX``).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["COLLECTIVES", "PREFIX", "collective_of", "install", "installed", "uninstall"]

PREFIX = "torch.distributed."
"""The metrics range of a collective is this prefix and its function's name (reserved)."""

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "barrier",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
)
"""The functions of ``torch.distributed`` that are timed."""

_MARK = "_torch_profiled_collective"  # on a wrapper: the original is its __wrapped__
_originals: dict[str, Callable[..., Any]] = {}


def collective_of(range_name: str) -> str | None:
    """The collective a metrics range times (``all_reduce``), or None for a user's range."""
    if range_name.startswith(PREFIX) and range_name[len(PREFIX) :] in COLLECTIVES:
        return range_name[len(PREFIX) :]
    return None


def _async_index(fn: Callable[..., Any]) -> int | None:
    """The position of ``async_op`` in ``fn``'s parameters (None without one)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params.index("async_op") if "async_op" in params else None


def _wrap(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    from . import _torch, metrics, state

    recorder = metrics.recorder  # one for the life of the process
    record = metrics.record
    where = _async_index(fn)
    now = time.perf_counter
    compiling = _torch.is_compiling  # Dynamo traces the original, untouched (no graph break)

    @functools.wraps(fn)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if (
            not state.metrics_on
            or compiling()
            or kwargs.get("async_op")
            or (where is not None and len(args) > where and args[where])
        ):
            return fn(*args, **kwargs)
        t0 = now()
        result = fn(*args, **kwargs)  # an exception goes to the caller untimed
        record(recorder, name, (now() - t0) * 1e9)
        return result

    setattr(collective, _MARK, True)
    return collective


def install() -> bool:
    """Wrap ``torch.distributed``'s collectives (once; again after ``uninstall``). Only where
    the program has imported torch.distributed and it is available: this module never
    imports it. Returns whether they are wrapped now. Never raises (a torch without the
    names, or with other ones, leaves those unwrapped)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        if not dist.is_available():
            return False
        for fn_name in COLLECTIVES:
            fn = getattr(dist, fn_name, None)
            if fn is None or getattr(fn, _MARK, False):
                continue
            _originals[fn_name] = fn
            setattr(dist, fn_name, _wrap(fn, PREFIX + fn_name))
    except Exception:  # noqa: BLE001 - telemetry never breaks the program
        return bool(_originals)
    return bool(_originals)


def installed() -> bool:
    return bool(_originals)


def uninstall() -> None:
    """Put the original functions back (where a wrapper of ours is still in place)."""
    dist = sys.modules.get("torch.distributed")
    for fn_name, fn in list(_originals.items()):
        if dist is not None and getattr(getattr(dist, fn_name, None), _MARK, False):
            setattr(dist, fn_name, fn)
        del _originals[fn_name]
