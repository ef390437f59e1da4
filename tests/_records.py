"""What the json exporter wrote, read back: window reports apart from metrics records (both
go to one file, each line naming its ``schema``)."""

from __future__ import annotations

import json
from typing import Any

from exporters.json_lines import METRICS_SCHEMA, SCHEMA


def window_records(text: str) -> list[dict[str, Any]]:
    """The window reports among ``text``'s JSON lines, in order."""
    return [r for r in map(json.loads, text.splitlines()) if r["schema"] == SCHEMA]


def metrics_records(text: str) -> list[dict[str, Any]]:
    """The metrics records among ``text``'s JSON lines, in order."""
    return [r for r in map(json.loads, text.splitlines()) if r["schema"] == METRICS_SCHEMA]
