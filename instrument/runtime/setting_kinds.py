"""What the SDK's own kinds of setting accept: for each, a ``parse`` of environment text and a
strict ``check`` of a value, as a ``Setting`` takes them (``Setting(..., **path())``).

The generic kinds (booleans, bounded integers and numbers, choices) are in
``instrument.base.settings``; these know the SDK's types (``Schedule``, ``RankSet``, activities,
exporters, trigger signals). The environment's parse only turns text into a value; the check
then decides, the same one that judges a value given in code.
"""

from __future__ import annotations

import os
from typing import Any

from instrument.base.settings import INT64_MAX, Refused, parse_addr, quote

from .ranks import RankSet
from .sampling import Schedule
from .triggers import TRIGGER_SIGNALS

__all__ = [
    "KNOWN_ACTIVITIES",
    "activities",
    "exporters",
    "optional",
    "path",
    "ranks",
    "schedule",
    "trigger",
]

KNOWN_ACTIVITIES: tuple[str, ...] = ("cpu", "cuda", "xpu", "mtia", "hpu", "privateuse1")


def _parse_path(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a path")
    return text


def _check_path(name: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path, got {type(value).__name__} {value!r}")
    text = os.fspath(value)
    if not text:
        raise ValueError(f"{name} must not be empty")
    return text


def path() -> dict[str, Any]:
    """A file or directory path (``str`` or ``os.PathLike``), never empty or blank."""
    return {"parse": _parse_path, "check": _check_path}


def _parse_names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip().lower() for n in text.split(",") if n.strip())
    return () if names == ("none",) else names


def _check_exporters(name: str, value: Any) -> tuple[Any, ...]:
    """Names or ``Exporter`` instances. Whether a name is known is the caller's question
    (``exporters.check_exporter_names``): the registry is above this layer."""
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        value = (value,)
    items = tuple(value)
    for item in items:
        if isinstance(item, str):
            if not item.strip():
                raise ValueError(f"{name}: exporter names must not be empty")
        elif not (hasattr(item, "export") and hasattr(item, "shutdown")):
            raise TypeError(
                f"{name} must be names or Exporter instances, got {type(item).__name__}"
            )
    return items


def exporters() -> dict[str, Any]:
    """Comma-separated exporter names (empty or ``none``: none); in code names or instances."""
    return {"parse": _parse_names, "check": _check_exporters}


_SCHEDULE_KEYS = ("wait", "warmup", "active", "repeat", "skip_first")


def _check_schedule(name: str, value: Any) -> Schedule:
    if not isinstance(value, Schedule):
        raise TypeError(f"{name} must be a Schedule, got {type(value).__name__} {value!r}")
    for key in _SCHEDULE_KEYS:  # a step count past 64 bits is no count (like every integer)
        if getattr(value, key) > INT64_MAX:
            raise Refused(f"{name}.{key}", f"a step count <= {INT64_MAX}", getattr(value, key))
    return value


def schedule() -> dict[str, Any]:
    """``Schedule.parse`` text (missing keys keep their defaults); in code a ``Schedule``."""
    return {"parse": Schedule.parse, "check": _check_schedule}


def _parse_activities(text: str) -> tuple[str, ...] | None:
    low = text.strip().lower()
    return None if low in ("", "auto") else _parse_names(low)


def _check_activities(name: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return None
        value = (value,)
    if not hasattr(value, "__iter__"):
        raise TypeError(
            f"{name} must be 'auto', None or a sequence of names, got "
            f"{type(value).__name__} {value!r}"
        )
    out: list[str] = []
    for item in value:
        text = str(getattr(item, "name", item)).lower()  # accepts ProfilerActivity too
        if text not in KNOWN_ACTIVITIES:
            raise ValueError(
                f"{name}: unknown activity {item!r}; expected 'auto' or some of "
                f"{', '.join(KNOWN_ACTIVITIES)}"
            )
        if text not in out:
            out.append(text)
    if not out:
        raise ValueError(f"{name} must name at least one of " + ", ".join(KNOWN_ACTIVITIES))
    return tuple(out)


def activities() -> dict[str, Any]:
    """``auto`` (None) or some of ``KNOWN_ACTIVITIES`` (``ProfilerActivity`` values too)."""
    return {"parse": _parse_activities, "check": _check_activities}


def _signal_or_path(text: str) -> str:
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
        f"trigger {quote(text)} is neither a signal a trigger may use ({allowed}) nor a file "
        "path (a path contains '/' or '.')"
    )


def _parse_trigger(text: str) -> str | None:
    return text.strip() or None


def _check_trigger(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a signal name or a path, got {value!r}")
    text = os.fspath(value).strip()
    if not text:
        raise ValueError(f"{name} must not be empty (None: no trigger)")
    return _signal_or_path(text)


def trigger() -> dict[str, Any]:
    """``SIGUSR2``/``SIGUSR1`` (``USR2`` too) or a file path; empty: none."""
    return {"parse": _parse_trigger, "check": _check_trigger}


def _check_ranks(name: str, value: Any) -> RankSet:
    return RankSet.of(value)


def ranks() -> dict[str, Any]:
    """``RankSet.parse`` text; in code what ``RankSet.of`` takes."""
    return {"parse": RankSet.parse, "check": _check_ranks}


_UNSET = ("", "none", "unset")


def optional(kind: dict[str, Any]) -> dict[str, Any]:
    """``kind`` (a ``parse``/``check`` pair, e.g. ``number(...)``) or None: in the environment
    an empty value, ``none`` or ``unset``; in code ``None``."""
    parse, check = kind["parse"], kind["check"]

    def parse_optional(text: str) -> Any:
        return None if text.strip().lower() in _UNSET else parse(text)

    def check_optional(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return {"parse": parse_optional, "check": check_optional}


def _parse_address(text: str) -> str:
    parse_addr(text)  # ValueError says what was expected
    return text.strip()


def _check_address(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str host:port, got {type(value).__name__} {value!r}")
    return _parse_address(value)


def address() -> dict[str, Any]:
    """``host:port`` (``[::1]:9464`` for IPv6), port 0-65535."""
    return {"parse": _parse_address, "check": _check_address}
