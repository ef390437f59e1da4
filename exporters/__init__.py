"""Where window reports go: the ``Exporter`` interface, the built-ins and the registry.

Exporters receive a ``WindowReport`` (plain data; ``report.raw_trace_path`` names the window's
trace JSON while exporters run) and never import torch or see a profiler object. Of
``instrument`` they import only ``instrument.report`` (the contract) and ``instrument.spans``
(torch-free helpers for span budgets); what they need per call comes in the report
(``report.occurrences``, when an exporter asks for it with ``occurrence_budget``).

Names resolve through built-ins (``console``, ``trace``, ``memory``, ``json``, ``otel``) and the
entry-point group ``torch_profiled.exporters`` (an entry point names a class or a
zero-argument factory). An unknown name warns and lists the names that are known.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import TYPE_CHECKING, Any

from . import _warn

if TYPE_CHECKING:
    from instrument.report import OccurrenceBudget, WindowReport

__all__ = [
    "ConsoleExporter",
    "ENTRY_POINT_GROUP",
    "ExportResult",
    "Exporter",
    "ExporterWarning",
    "InMemoryExporter",
    "JsonLinesExporter",
    "TraceFileExporter",
    "check_exporter_names",
    "known_exporter_names",
    "resolve_exporters",
]

ENTRY_POINT_GROUP = "torch_profiled.exporters"


class ExportResult(enum.Enum):
    SUCCESS = 0
    FAILURE = 1


class ExporterWarning(UserWarning):
    """An exporter could not be found, built, or failed to export a report."""


class Exporter(abc.ABC):
    """Receives each finished window's report, once.

    ``export`` runs off the program's hot path after a window ends; it should return
    ``ExportResult.FAILURE`` rather than raise, but an exception is caught, reported as a
    warning, and never reaches the program. ``shutdown`` is called once when the session ends.
    """

    #: exporters that write the window's trace file run first, so that the others can name it
    #: (``last_path``)
    writes_trace_file: bool = False

    #: The file the last successful ``export`` of a trace writer (``writes_trace_file``)
    #: wrote; the other exporters' reports carry it as ``trace_file``. None: no file (an
    #: instance attribute or a property in a subclass overrides it).
    last_path: str | None = None

    #: The per-call occurrences this exporter needs in each report (``report.occurrences``),
    #: as a span budget; None (the default): none. The session's analysis makes them once per
    #: window, off the program's GIL, fitted to the widest budget its exporters ask for.
    occurrence_budget: "OccurrenceBudget | None" = None

    #: Optional hook ``window_started(window: int) -> None``. When an exporter defines it, the
    #: session calls it once per window at the first ``@profiled`` call (or ``with profiled``
    #: entry) that begins while the window records: on that call's thread and in its
    #: ``contextvars`` context, so the exporter can capture what is current there (the
    #: OpenTelemetry span of the request being profiled). ``window`` is the ``report.window`` the
    #: window's report will carry. It runs on the program's hot path: keep it to a dictionary
    #: store. Not called for a window in which no decorated call begins.
    window_started: Callable[[int], None] | None = None

    @abc.abstractmethod
    def export(self, report: "WindowReport") -> ExportResult:
        """Handle one window's report."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called once at the end of the session."""

    def notice(self, message: str) -> None:  # noqa: B027 - optional hook
        """A human-readable line about the session (for example why no report was made)."""


from .console import ConsoleExporter  # noqa: E402
from .json_lines import JsonLinesExporter  # noqa: E402
from .memory import InMemoryExporter  # noqa: E402
from .trace_file import TraceFileExporter  # noqa: E402


def _otel(**kwargs: Any) -> Exporter:
    """``OTelExporter``, imported only when asked for (OpenTelemetry's SDK is not free to
    import)."""
    from .otel import OTelExporter

    return OTelExporter(**kwargs)


_BUILTINS: dict[str, Callable[..., Exporter]] = {
    "console": ConsoleExporter,
    "trace": TraceFileExporter,
    "memory": InMemoryExporter,
    "json": JsonLinesExporter,
    "otel": _otel,
}


def _entry_points() -> dict[str, Any]:
    """Entry points of the group by lower-cased name (names are matched case-insensitively,
    like ``PROFILED_EXPORTERS``, which is lower-cased when parsed)."""
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # noqa: BLE001 - broken metadata must not break the program
        return {}
    return {ep.name.strip().lower(): ep for ep in eps}


def known_exporter_names() -> list[str]:
    """Built-in names and entry-point names (lower case), sorted."""
    return sorted(set(_BUILTINS) | set(_entry_points()))


def check_exporter_names(items: Iterable[Any]) -> None:
    """Raise ``ValueError`` for a name that is neither built in nor an entry point (for
    names given in code, which are checked strictly)."""
    known: list[str] | None = None
    for item in items:
        if not isinstance(item, str):
            continue
        name = item.strip().lower()
        if name in _BUILTINS:
            continue
        if known is None:
            known = known_exporter_names()
        if name not in known:
            raise ValueError(f"unknown exporter {item!r}; known exporters: {', '.join(known)}")


def resolve_exporters(
    items: Iterable[Any],
    *,
    builtin_kwargs: dict[str, dict[str, Any]] | None = None,
    warn: Callable[[str, type[Warning]], None] = _warn.warn,
) -> list[Exporter]:
    """Turn names and instances into exporter instances.

    A name that is not known warns (listing the known names) and is skipped; an entry point
    that fails to load or build warns and is skipped. Instances pass through. Warnings go
    through ``warn(message, category)`` (the SDK's, which never raises, by default).
    """
    out: list[Exporter] = []
    eps: dict[str, Any] | None = None
    kwargs = builtin_kwargs or {}
    for item in items:
        if not isinstance(item, str):
            out.append(item)
            continue
        name = item.strip().lower()
        if name in _BUILTINS:
            out.append(_BUILTINS[name](**kwargs.get(name, {})))
            continue
        if eps is None:
            eps = _entry_points()
        ep = eps.get(name)
        if ep is None:
            warn(
                f"unknown exporter {name!r}; known exporters: "
                f"{', '.join(known_exporter_names())}; it is skipped",
                ExporterWarning,
            )
            continue
        try:
            factory = ep.load()
            exporter = factory()
        except Exception as exc:  # noqa: BLE001
            warn(
                f"exporter {name!r} (entry point {ep.value}) could not be built: {exc!r}; "
                "it is skipped",
                ExporterWarning,
            )
            continue
        if not isinstance(exporter, Exporter) and not (
            hasattr(exporter, "export") and hasattr(exporter, "shutdown")
        ):
            warn(
                f"exporter {name!r} (entry point {ep.value}) built a "
                f"{type(exporter).__name__}, which has no export()/shutdown(); it is skipped",
                ExporterWarning,
            )
            continue
        out.append(exporter)
    return out
