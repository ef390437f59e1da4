"""Where window reports go: the ``Exporter`` interface, the built-ins and the registry.

Exporters receive a ``WindowReport`` (plain data; ``report.raw_trace_path`` names the window's
trace JSON while exporters run) and never import torch or see a profiler object. Of
``instrument`` they import only its torch-free base, ``instrument.base``: ``report`` (the
contract), ``spans`` (span budgets), settings, warnings, atomic files and time formatting; what
they need per call comes in the report (``report.occurrences``, when an exporter asks for it
with ``occurrence_budget``).

Names resolve through built-ins (``console``, ``trace``, ``memory``, ``json``, ``otel``,
``prometheus``, ``html``) and the
entry-point group ``torch_profiled.exporters`` (an entry point names a class or a
zero-argument factory). An unknown name warns and lists the names that are known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

from instrument.base import warn as _warn

from ._base import Exporter, ExporterWarning, ExportResult
from .console import ConsoleExporter
from .json_lines import JsonLinesExporter
from .memory import InMemoryExporter
from .trace_file import TraceFileExporter

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


def _otel(**kwargs: Any) -> Exporter:
    """``OTelExporter``, imported only when asked for (OpenTelemetry's SDK is not free to
    import)."""
    from .otel import OTelExporter

    return OTelExporter(**kwargs)


def _html(**kwargs: Any) -> Exporter:
    """``HtmlExporter``: imported only when asked for (it brings the page's builder)."""
    from .html import HtmlExporter

    return HtmlExporter(**kwargs)


def _prometheus(**kwargs: Any) -> Exporter:
    """``PrometheusExporter``: binds its address when made, so only when asked for."""
    from .prometheus import PrometheusExporter

    return PrometheusExporter(**kwargs)


_BUILTINS: dict[str, Callable[..., Exporter]] = {
    "console": ConsoleExporter,
    "trace": TraceFileExporter,
    "memory": InMemoryExporter,
    "json": JsonLinesExporter,
    "otel": _otel,
    "prometheus": _prometheus,
    "html": _html,
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
