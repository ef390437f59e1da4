"""The README's table of ``PROFILED_*`` variables, written from the declarations
(``instrument.config.SETTINGS``), so that the two cannot drift apart.

    python -m instrument.settings_table --write   # rewrite the README's table
    python -m instrument.settings_table --check   # exit 1 when the README's table differs

The table lies between ``<!-- settings:start -->`` and ``<!-- settings:end -->`` in the
README; nothing outside those markers is touched. ``tests/test_settings_table.py`` runs the
check.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .config import SETTINGS, Setting

__all__ = ["END", "README", "START", "check", "render", "replace_block", "write"]

START = "<!-- settings:start -->"
END = "<!-- settings:end -->"
README = Path(__file__).resolve().parent.parent / "README.md"


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
        raise ValueError(f"the README has no {START} ... {END} block")
    return f"{head}{START}\n{table}{END}{tail}"


def check(readme: Path = README) -> bool:
    """True when the README's table is the one the declarations make."""
    text = readme.read_text(encoding="utf-8")
    return replace_block(text, render()) == text


def write(readme: Path = README) -> bool:
    """Rewrite the README's table from the declarations; True when it changed."""
    text = readme.read_text(encoding="utf-8")
    new = replace_block(text, render())
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m instrument.settings_table", description=__doc__.split("\n\n")[0]
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the README's table")
    action.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the README's table differs from the declarations",
    )
    parser.add_argument("--readme", type=Path, default=README, help="default: %(default)s")
    args = parser.parse_args(argv)
    if args.write:
        changed = write(args.readme)
        print(f"{args.readme}: {'table rewritten' if changed else 'table already current'}")
        return 0
    if check(args.readme):
        return 0
    print(
        f"{args.readme}: the table of PROFILED_* variables differs from the declarations "
        "in instrument/config.py; run python -m instrument.settings_table --write",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
