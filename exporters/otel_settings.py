"""The ``otel`` exporter's settings, declared and read beside it: ``PROFILED_OTEL_DETAIL`` and
``PROFILED_OTEL_MAX_SPANS``.

Imports nothing from ``instrument`` (nor OpenTelemetry): an exporter reads its own settings
(``instrument.runtime.config`` lists these declarations with the SDK's, for ``ENV_VARS`` and the
README's table). Read tolerantly like every ``PROFILED_*`` value: a bad value warns once
(``ConfigWarning``) and the default applies; ``PROFILED_STRICT=1`` raises ``ValueError``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from instrument.base.settings import STRICT, Setting, integer, one_of

__all__ = ["DETAIL", "MAX_SPANS", "OTEL_DETAILS", "SETTINGS", "otel_settings_from_env"]

# each level adds to the last; the levels of ``instrument.base.report.DETAILS`` (a test keeps them
# equal), written out because ``instrument`` imports this module while it initialises
OTEL_DETAILS: tuple[str, ...] = ("ranges", "ops", "kernels")

DETAIL = Setting(
    "otel_detail",
    "PROFILED_OTEL_DETAIL",
    "ranges",
    **one_of(OTEL_DETAILS),
    doc="spans the `otel` exporter sends under each window: `ranges` (a span per range call), "
    "`ops` (+ CPU operators inside ranges), `kernels` (+ device work)",
)

MAX_SPANS = Setting(
    "otel_max_spans",
    "PROFILED_OTEL_MAX_SPANS",
    1000,
    **integer(1),
    doc="at most this many spans per window (at least 1); past it detail is dropped, then "
    "frequent ranges are folded",
)

SETTINGS: tuple[Setting, ...] = (DETAIL, MAX_SPANS)


def otel_settings_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """``(PROFILED_OTEL_DETAIL, PROFILED_OTEL_MAX_SPANS)``, read when an ``otel`` exporter is
    built (tolerant like every ``PROFILED_*`` value; ``PROFILED_STRICT=1`` raises)."""
    env = os.environ if environ is None else environ
    strict = STRICT.read(env, strict=False)
    return DETAIL.read(env, strict), MAX_SPANS.read(env, strict)
