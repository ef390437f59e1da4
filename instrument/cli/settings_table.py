"""The table of ``PROFILED_*`` variables in ``docs/configuration.md``, written from the
declarations (``instrument.runtime.config.SETTINGS``), so that the two cannot drift apart.

    python -m instrument.cli.settings_table --write   # rewrite the table
    python -m instrument.cli.settings_table --check   # exit 1 when the table differs

The table lies between ``<!-- settings:start -->`` and ``<!-- settings:end -->`` in that page;
nothing outside those markers is touched. ``tests/test_settings.py`` runs the check.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..runtime.config import SETTINGS, Setting

__all__ = ["DOC", "END", "START", "check", "render", "replace_block", "write"]

START = "<!-- settings:start -->"
END = "<!-- settings:end -->"
# the page that holds the table (it moved there from the README)
DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _default_cell(setting: Setting) -> str:
    """The default as a value to type (in backticks), or words: ``unset``, ``set by the SDK``."""
    text = setting.default_text
    if setting.parse is None or text == "unset":
        return text
    return f"`{text}`"


def render(settings: Sequence[Setting] = SETTINGS) -> str:
    """The Markdown table, one row per setting, in declaration order."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for s in settings:
        doc = s.doc.replace("|", "\\|")
        rows.append(f"| `{s.env}` | {_default_cell(s)} | {doc} |")
    return "\n".join(rows) + "\n"


def replace_block(text: str, table: str) -> str:
    """``text`` with what lies between the markers replaced by ``table``."""
    head, start, rest = text.partition(START)
    _block, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"the page has no {START} ... {END} block")
    return f"{head}{START}\n{table}{END}{tail}"


def check(page: Path = DOC) -> bool:
    """True when the page's table is the one the declarations make."""
    text = page.read_text(encoding="utf-8")
    return replace_block(text, render()) == text


def write(page: Path = DOC) -> bool:
    """Rewrite the page's table from the declarations; True when it changed."""
    text = page.read_text(encoding="utf-8")
    new = replace_block(text, render())
    if new != text:
        page.write_text(new, encoding="utf-8")
    return new != text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m instrument.cli.settings_table", description=__doc__.split("\n\n")[0]
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the table")
    action.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the table differs from the declarations",
    )
    parser.add_argument("--doc", type=Path, default=DOC, help="the page (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.write:
        changed = write(args.doc)
        print(f"{args.doc}: {'table rewritten' if changed else 'table already current'}")
        return 0
    if check(args.doc):
        return 0
    print(
        f"{args.doc}: the table of PROFILED_* variables differs from the declarations "
        "in instrument/runtime/config.py; run python -m instrument.cli.settings_table --write",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
