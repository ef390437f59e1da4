"""One owner per piece of state: a ``Session``'s fields are written only by ``Session``
(``runtime/profiling_session.py``). Its parts (the window room, the stops, the lifetime
functions, the process-wide ``state``) get what they need as arguments and give back what
happened, or ask the session through one of its methods; none assigns to a session's
attribute. Read from the source (AST): an assignment, augmented assignment, ``del`` or
``setattr`` whose object is a session (named ``sess``/``session``/``cur``/...,
``self.session``, ``state.current``...) or whose attribute is one of ``Session``'s own
fields on anything but ``self``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests._proc import REPO

PACKAGES = ("instrument", "exporters", "bench", "examples")
SESSION_LIKE = re.compile(r"(^|\.)(sess|session|_session|ambient|explicit|current|cur)$")

ALLOWED: dict[tuple[str, str], str] = {}
"""(file name, ``object.attribute`` as written) -> why that write must stay outside
the session's module. Empty: every session field is written by ``Session`` itself."""


def _sessions_file() -> Path:
    """The module that defines ``Session`` (``instrument/runtime/profiling_session.py``), found
    by its class so that the test follows the module wherever it moves (``state.Session`` is a
    protocol naming it, not a session)."""
    found = [
        p
        for p in (Path(REPO) / "instrument").rglob("*.py")
        if re.search(r"^class Session\b(?!\(Protocol\))", p.read_text(encoding="utf-8"), re.M)
    ]
    assert len(found) == 1, found
    return found[0]


def _session_fields() -> set[str]:
    """The attributes ``Session`` assigns to ``self`` (its fields)."""
    tree = ast.parse(_sessions_file().read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")
    fields = set()
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    fields.add(sub.attr)
    return fields


def _writes(source: str, fields: set[str]) -> list[tuple[int, str]]:
    """``(line, "object.attribute")`` of each write to a session's attribute in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
        ):
            obj = ast.unparse(node.args[0])
            if SESSION_LIKE.search(obj):
                found.append((node.lineno, f"{obj}.<{node.func.id}>"))
            continue
        for target in targets:
            for sub in ast.walk(target):
                if not isinstance(sub, ast.Attribute) or not isinstance(
                    sub.ctx, (ast.Store, ast.Del)
                ):
                    continue
                obj = ast.unparse(sub.value)
                if SESSION_LIKE.search(obj) or (
                    obj not in ("self", "state") and sub.attr in fields
                ):  # (``state``: the process-wide module, ``state.ambient = ...``)
                    found.append((node.lineno, f"{obj}.{sub.attr}"))
    return found


def test_the_check_sees_writes_through_a_back_reference():
    """The check itself: the shapes of write it must catch, and a part's own fields it must
    leave alone."""
    fields = {"_skip_reason", "windows_ended", "finished"}
    caught = _writes(
        "sess._skip_reason = 'x'\n"
        "self.session.windows_ended += 1\n"
        "state.current.finished = True\n"
        "window_owner.finished = True\n"
        "setattr(sess, 'closed', True)\n"
        "self.finished = True\n"
        "self.window = None\n",
        fields,
    )
    assert [line for line, _ in caught] == [1, 2, 3, 4, 5]


def test_only_sessions_py_writes_a_sessions_fields():
    fields = _session_fields()
    assert {"_skip_reason", "finished", "windows_ended", "_steps_declared"} <= fields
    sessions = _sessions_file()
    found = []
    for package in PACKAGES:
        for path in sorted((Path(REPO) / package).rglob("*.py")):
            if path == sessions:
                continue
            for line, what in _writes(path.read_text(encoding="utf-8"), fields):
                if (path.name, what) not in ALLOWED:
                    found.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert not found, (
        "a Session's fields are written only in its own module (give the part an argument, "
        "return what happened, or call a Session method):\n" + "\n".join(found)
    )


PARTS = ("window.py", "stops.py")
"""A session's parts: they hold no session (what they need comes in as arguments)."""


def test_a_sessions_parts_hold_no_session():
    """Neither imports the session module (not even for a type) nor keeps a ``session`` field:
    a back-reference is what a part would write through."""
    for name in PARTS:
        found = [p for p in (Path(REPO) / "instrument").rglob(name)]
        assert len(found) == 1, (name, found)
        tree = ast.parse(found[0].read_text(encoding="utf-8"))
        session_module = _sessions_file().stem
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert session_module not in (node.module or "").split("."), (name, node.module)
                assert session_module not in [a.name for a in node.names], name
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        assert item.target.id not in ("session", "sess"), (name, node.name)
