"""Settings read from ``PROFILED_*`` variables: the ``Setting`` declaration, the tolerant read
and how a bad value is reported.

Both packages declare settings (``instrument.runtime.config`` the SDK's, ``exporters.otel_settings``
the OTel exporter's beside it), and an exporter must not import ``instrument``; so this lives
in the lower package and imports nothing but ``_warn``: a leaf, like ``_warn``.

One ``Setting`` says everything about one variable: the name of its field, the variable, the
default, a ``parse`` of environment text and a strict ``check`` of a value (the same check for a
value given in code and for a parsed environment value, so both accept the same values), and
the line the README's table shows. Environment values are read tolerantly: a bad one warns once
per (variable, value), naming the variable, the value (cut to ``QUOTE_CHARS`` characters) and
the default used, and the default applies (or a declared ``fallback``: a switch fails
closed); ``PROFILED_STRICT=1`` raises ``ValueError`` instead. A ``PROFILED_*`` name that is no
setting warns the same way (``refuse_unknown_names``). Values in code raise
``TypeError``/``ValueError`` at once.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
import socket
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from .warn import warn

__all__ = [
    "DEFAULT",
    "INT64_MAX",
    "PREFIX",
    "QUOTE_CHARS",
    "STRICT",
    "TRUE_SPELLINGS",
    "ConfigWarning",
    "Refused",
    "Setting",
    "addr_family",
    "boolean",
    "integer",
    "number",
    "one_of",
    "parse_addr",
    "quote",
    "reason",
    "refuse",
    "refuse_unknown_names",
    "reset_warnings",
    "spell",
]

QUOTE_CHARS = 60
"""Messages quote at most this many characters of a value, then ``...(N chars)``."""

_TRUE = TRUE_SPELLINGS = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigWarning(UserWarning):
    """A ``PROFILED_*`` environment value was invalid; the default was used instead."""


class Refused(ValueError):
    """A value of the right type outside what a setting accepts. ``expected`` says what it
    accepts, so that one check phrases both refusals: in code ``trace_keep must be an integer
    >= 0, got -1``, from the environment ``expected an integer >= 0``."""

    def __init__(self, name: str, expected: str, value: Any) -> None:
        super().__init__(f"{name} must be {expected}, got {value!r}")
        self.expected = expected


Parse = Callable[[str], Any]
Check = Callable[[str, Any], Any]


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()
"""``Setting.fallback``'s mark for "the default" (a bad value gets the default)."""


@dataclass(frozen=True)
class Setting:
    """One setting, declared once: everything else (the ``Config`` field's default and check,
    the environment's parsing, ``ENV_VARS``, the README's table) is read from here."""

    name: str
    """The ``Config`` field (for a variable that is no field, its name in messages)."""
    env: str
    """The environment variable."""
    default: Any
    """The value when the variable is unset or bad."""
    parse: Parse | None
    """Environment text -> a value for ``check``; raises ``ValueError``. None: a variable the
    SDK sets for itself, never parsed as a setting."""
    check: Check
    """``check(name, value)`` -> the value kept (normalised); ``TypeError``/``ValueError``
    (``Refused``) for a value it does not accept."""
    doc: str
    """One line for the README's table: what the variable does and the values it takes."""
    shown: str | None = None
    """The default as messages and the README spell it, where ``default_text`` would not."""
    fallback: Any = DEFAULT
    """What a bad environment value gives: the default (``DEFAULT``), or this value, for a
    switch whose default is on: ``PROFILED_ENABLED=flase`` was meant to turn profiling off,
    and a switch that cannot be read fails closed."""
    fallback_note: str = ""
    """Why the fallback is not the default, said after it in the warning."""

    @property
    def default_text(self) -> str:
        """The default spelled as the variable's value (``1``, ``console,trace``, ``unset``)."""
        if self.shown is not None:
            return self.shown
        return spell(self.default)

    @property
    def fallback_text(self) -> str:
        """What a bad environment value gives, as a warning says it."""
        if self.fallback is DEFAULT:
            return f"the default {self.env}={self.default_text}"
        note = f" ({self.fallback_note})" if self.fallback_note else ""
        return f"{self.env}={spell(self.fallback)}{note}"

    def value(self, text: str) -> Any:
        """An environment value: parsed, then checked like a value given in code."""
        if self.parse is None:
            raise ValueError(f"{self.env} is set by torch-profiled, not read as a setting")
        return self.check(self.name, self.parse(text))

    def read(self, env: Mapping[str, str], strict: bool) -> Any:
        """The variable's value in ``env``; unset: the default; bad: the fallback (the default
        unless declared), after one warning per (variable, value) (``strict``:
        ``ValueError``)."""
        raw = env.get(self.env)
        if raw is None:
            return self.default
        try:
            return self.value(raw)
        except (TypeError, ValueError, OverflowError) as exc:
            why = f"expected {exc.expected}" if isinstance(exc, Refused) else reason(exc)
        # outside the handler: PROFILED_STRICT's error is the one to read, not a chained parse
        refuse(
            self.env, raw, f"{self.env}={quote(raw)} is invalid ({why})", self.fallback_text, strict
        )
        return self.default if self.fallback is DEFAULT else self.fallback


def spell(value: Any) -> str:
    """A value spelled as a variable's value (``1``, ``console,trace``, ``unset``)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return "unset"
    if hasattr(value, "to_env"):  # Schedule, RankSet
        return str(value.to_env())
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


# ---------------------------------------------------------------- reporting a bad value

_warned: set[tuple[str, str]] = set()  # (variable, raw value) pairs already warned about
_warned_lock = threading.Lock()


def reset_warnings() -> None:
    """Forget which bad values were warned about (``instrument.testing.reset()``)."""
    with _warned_lock:
        _warned.clear()


def quote(raw: str) -> str:
    """``repr(raw)``, cut to its first ``QUOTE_CHARS`` characters when longer: a message names
    the value without repeating a huge one."""
    if len(raw) <= QUOTE_CHARS:
        return repr(raw)
    return f"{raw[:QUOTE_CHARS]!r}...({len(raw)} chars)"


def reason(exc: BaseException) -> str:
    """Why a value was refused, bounded like the value itself (a parser may quote a part)."""
    text = str(exc)
    limit = 4 * QUOTE_CHARS
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def refuse(var: str, raw: str, problem: str, fallback: str, strict: bool) -> None:
    """Report a bad environment value: ``problem``, then what is used instead (``fallback``).
    Warns once per ``(var, raw)``; ``strict`` (``PROFILED_STRICT=1``): raises ``ValueError``."""
    _report(var, raw, problem, f"using {fallback}", f"{fallback} would be used", strict)


def _report(var: str, raw: str, problem: str, now: str, instead: str, strict: bool) -> None:
    """``problem``; then what happens now (``now``), or with ``strict`` a ``ValueError`` that
    says what would have happened without it (``instead``). Once per ``(var, raw)``."""
    if strict:
        raise ValueError(f"{problem}; PROFILED_STRICT=1 makes this an error (without it {instead})")
    with _warned_lock:
        first = (var, raw) not in _warned
        _warned.add((var, raw))
    if first:
        warn(f"{problem}; {now}", ConfigWarning)


PREFIX = "PROFILED_"
"""Every setting's variable starts with this; any other name that does is a mistake."""

_SUGGEST_CHARS = 100  # names longer than this get no suggestion (difflib's cost grows with it)


def refuse_unknown_names(env: Mapping[str, str], known: Collection[str], strict: bool) -> None:
    """Every variable in ``env`` named like a setting (``PROFILED_...`` in any case) that is
    none of ``known``: a misspelt name (``PROFILED_ENABLED`` without its ``D``, ``EXPORTER``
    for ``PROFILED_EXPORTERS``) would otherwise change nothing, silently. Warns once per
    (name, value), naming the closest setting; ``strict`` (``PROFILED_STRICT=1``): raises
    ``ValueError``."""
    for var in sorted(v for v in env if v.upper().startswith(PREFIX) and v not in known):
        raw = env.get(var)
        if raw is None:  # removed by another thread meanwhile: nothing to say
            continue
        close = []
        if len(var) <= _SUGGEST_CHARS:  # likeness of what follows the prefix all share
            tails = {name[len(PREFIX) :]: name for name in known if name.startswith(PREFIX)}
            tail = var[len(PREFIX) :].upper()
            close = [tails[t] for t in difflib.get_close_matches(tail, tails, n=1)]
        hint = f"did you mean {close[0]}?" if close else "no setting has a name like it"
        name = var if len(var) <= QUOTE_CHARS and var.isprintable() else quote(var)
        problem = f"{name}={quote(raw)} is not a torch-profiled setting ({hint})"
        _report(var, raw, problem, "it is ignored", "the variable would be ignored", strict)


# ---------------------------------------------------------------- kinds: parse and check


def _num(value: float) -> str:
    """A bound as people write it: ``3600``, ``1048576``, ``0.5``."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected one of 1/true/yes/on or 0/false/no/off")


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def boolean(*, auto: bool = False) -> dict[str, Any]:
    """``1/true/yes/on`` or ``0/false/no/off`` in any case; in code a ``bool``, nothing else.
    ``auto``: also ``auto`` (or an empty value), None in code: the SDK decides."""
    if not auto:
        return {"parse": _parse_bool, "check": _check_bool}

    def parse(text: str) -> bool | None:
        if text.strip().lower() in ("", "auto"):
            return None
        try:
            return _parse_bool(text)
        except ValueError:
            raise ValueError("expected auto, 1/true/yes/on or 0/false/no/off") from None

    def check(name: str, value: Any) -> bool | None:
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool or None, got {type(value).__name__} {value!r}")
        return value

    return {"parse": parse, "check": check}


INT64_MAX = 2**63 - 1
"""The largest count or seed a setting takes: what a 64-bit integer holds (OTLP attributes,
JSON readers, Prometheus), so that no count can overflow a reader; and the environment's
``99999999999999999999`` is refused like ``1e300``, not kept as a 67-bit number."""


def integer(
    minimum: int | None = None, *, optional: bool = False, note: str = ""
) -> dict[str, Any]:
    """Integers ``>= minimum`` and ``<= INT64_MAX`` (when ``minimum`` is None: any 64-bit
    signed integer); ``optional``: None too (in the environment an empty value, ``none`` or
    ``unset``). ``note`` explains the bound."""
    low = -INT64_MAX - 1 if minimum is None else minimum
    expected = (
        "a 64-bit integer" if minimum is None else f"an integer >= {minimum} and <= {INT64_MAX}"
    )
    expected += f" ({note})" if note else ""

    def parse(text: str) -> int | None:
        low = text.strip().lower()
        if optional and low in ("", "none", "unset"):
            return None
        try:
            return int(low)
        except ValueError:  # also past int()'s limit on digits
            raise ValueError(f"expected {expected}") from None

    def check(name: str, value: Any) -> int | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"{name} must be an int{' or None' if optional else ''}, got "
                f"{type(value).__name__} {value!r}"
            )
        if not low <= value <= INT64_MAX:
            raise Refused(name, expected, value)
        return value

    return {"parse": parse, "check": check}


def number(
    low: float, high: float, *, low_open: bool = False, unit: str = "", note: str = ""
) -> dict[str, Any]:
    """Finite numbers in ``low..high`` (``> low`` when ``low_open``): inf, nan and anything
    past the bound are refused, so no value can make a wait or a size absurd. ``unit`` follows
    "a number" (``" of MiB"``), ``note`` explains the bound (``"seconds, at most one hour"``)."""
    bound = (f"> {_num(low)}" if low_open else f">= {_num(low)}") + f" and <= {_num(high)}"
    expected = f"a number{unit} {bound}" + (f" ({note})" if note else "")

    def parse(text: str) -> float:
        try:
            return float(text.strip())
        except ValueError:
            return math.nan  # refused by check, which says what was expected

    def check(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number{unit}, got {type(value).__name__} {value!r}")
        try:
            value = float(value)
        except OverflowError:  # an int too large for a float
            raise ValueError(
                f"{name} is out of range, got an integer of {value.bit_length()} bits"
            ) from None
        # nan fails every comparison, inf fails <= high
        if not ((value > low if low_open else value >= low) and value <= high):
            raise Refused(name, expected, value)
        return value

    return {"parse": parse, "check": check}


def one_of(choices: tuple[str, ...]) -> dict[str, Any]:
    """One of ``choices`` (the environment's in any case)."""
    expected = "one of " + ", ".join(choices)

    def check(name: str, value: Any) -> str:
        if value not in choices:
            raise Refused(name, expected, value)
        return value

    return {"parse": lambda text: text.strip().lower(), "check": check}


STRICT = Setting(
    "strict",
    "PROFILED_STRICT",
    False,
    doc="bad values, and `PROFILED_*` names that are no setting (each warns naming the "
    "closest one), raise `ValueError` instead of warning",
    **boolean(),
)
"""Declared here, not with the SDK's other settings: every reader of settings (the OTel
exporter's too) needs it, and reads it tolerantly (a bad value of it is never strict)."""


DEFAULT_PROMETHEUS_ADDR = "127.0.0.1:9464"


_EXPECTED_ADDR = (
    f"expected host:port (port 0-65535), like {DEFAULT_PROMETHEUS_ADDR}, localhost:9464, "
    "[::1]:9464 (an IPv6 address in brackets), 0.0.0.0:9464 or [::]:9464 (every interface)"
)
_HOST_NAME = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?)*\.?"
)


def parse_addr(text: str) -> tuple[str, int]:
    """``host:port`` -> ``(host, port)``, the pair a socket binds: ``127.0.0.1:9464`` ->
    ``("127.0.0.1", 9464)``, ``localhost:9464`` -> ``("localhost", 9464)``, ``[::1]:0`` ->
    ``("::1", 0)`` (an IPv6 address comes in brackets and leaves without them: a host with a
    ``:`` is an IPv6 address, bound with ``AF_INET6``, see ``addr_family``), ``[::]:9464`` ->
    ``("::", 9464)``. ``ValueError`` says what was expected: no host (``:9464`` would be every
    interface, which must be asked for by name: ``0.0.0.0`` or ``[::]``), an IPv6 address
    without brackets (``::1:9464``: where does the port start?), brackets around anything but
    an IPv6 address, a host that is no name or address, a port that is not 0-65535 in ASCII
    digits. Here, not in ``exporters.prometheus``: checking a setting must not import a web
    server."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError(_EXPECTED_ADDR)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{_EXPECTED_ADDR}; [{host}] is no IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"{_EXPECTED_ADDR}; an IPv6 address goes in brackets")
    elif not host:
        raise ValueError(f"{_EXPECTED_ADDR}; the host is missing")
    elif not (host.isascii() and _HOST_NAME.fullmatch(host)):
        raise ValueError(f"{_EXPECTED_ADDR}; the host is no name or address")
    return host, int(port)


def addr_family(host: str) -> socket.AddressFamily:
    """The family to bind ``host`` (from ``parse_addr``) with: ``AF_INET6`` for an IPv6
    address (it holds a ``:``), else ``AF_INET`` (a name binds the IPv4 address it resolves
    to, as a plain ``socketserver`` does)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET
