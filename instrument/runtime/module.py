"""``instrument_module``: a range for every submodule's forward, named by its module path.

No model code changes: each selected module gets a forward pre-hook that enters the
decorator's fast range (``decorator.Entry``) and a forward hook registered with
``always_call=True`` that leaves it, so a forward that raises still closes its range. Open
entries live in one context variable (per thread / asyncio task), innermost last, like the
context form of ``profiled``. torch runs ``always_call`` hooks only for ``Exception``s; the
entries a ``KeyboardInterrupt`` leaves behind are closed by the next hook that finds them
(``_close_stale``), so no range and no nesting depth stays open.

Steps: the module passed in is instrumented like a decorated function. Its forward is a root
call when nothing decorated encloses it (it ends a step until the program declares steps) and
``step=True`` makes every return of it end a step. Submodule ranges never end steps: with
``include`` selecting only some blocks, each of them would otherwise be a root call and one
forward would count as many steps.

Cost: hooks take ``nn.Module``'s slower call path (torch skips it only for modules without
hooks). While no profiler records and no session needs nesting depth, both hooks return after
two flag checks. Inside ``torch.compile``d code they do nothing (no graph break, no range),
exactly like ``@profiled`` calls there.
"""

from __future__ import annotations

import contextvars
import fnmatch
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from . import _torch, decorator, state
from .config import enabled_from_env
from .decorator import _compiled_step_returned, _enter, _exit, _step_if_counting, range_name

__all__ = ["ModuleHandle", "instrument_module"]

_FLAG = _torch.PROFILER_FLAG
_is_compiling = _torch.is_compiling
_SESSION_MODE = state.SESSION

# Open module ranges of this thread / asyncio task, innermost last: (hooks, decorator.Entry).
_STACK: contextvars.ContextVar[tuple[tuple[Any, Any], ...]] = contextvars.ContextVar(
    "profiled_module_stack", default=()
)

# module -> the _Hooks instrumenting it; instrumenting a module twice adds nothing
_INSTRUMENTED: weakref.WeakKeyDictionary[torch.nn.Module, _Hooks] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class _Hooks:
    """The pre-hook and forward hook of one module: one range name, root or not."""

    __slots__ = ("name", "root", "step", "handles")

    def __init__(self, name: str, root: bool, step: bool) -> None:
        self.name = name
        self.root = root
        self.step = step
        self.handles: list[Any] = []

    def pre(self, module: Any, args: Any) -> None:
        if _is_compiling():
            return None
        counted = decorator._METRICS is not None and state.metrics_modules
        if not _FLAG._is_profiler_enabled and not counted:
            if decorator._MODE is not _SESSION_MODE:
                return None  # no session needs the call
            sess = decorator._SESSION
            if sess is not None and sess._steps_declared:
                return None  # nothing records and nothing needs the nesting depth
        stack = _STACK.get()
        for i, entry in enumerate(stack):
            if entry[0] is self:  # left open by a forward interrupted past its hooks
                _close_stale(stack[i:])
                stack = stack[:i]
                break
        _STACK.set(stack + ((self, _enter(self.name, counted)),))
        return None

    def post(self, module: Any, args: Any, output: Any) -> None:
        if _is_compiling():
            if self.step:
                _compiled_step_returned()
            return None
        stack = _STACK.get()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is self:
                _close_stale(stack[i + 1 :])  # forwards that never reached their hook
                _STACK.set(stack[:i])
                _exit(stack[i][1], self.step, self.root)  # (Entry.close)
                return None
        if self.step and decorator._MODE is _SESSION_MODE:
            _step_if_counting()  # the pre-hook had nothing to record; the step still ends
        return None

    def __repr__(self) -> str:
        return f"<module range {self.name!r}{' root' if self.root else ''}>"


def _close_stale(entries: tuple[tuple[_Hooks, decorator.Entry], ...]) -> None:
    """Close ranges whose forward hook never ran, innermost first.

    torch runs ``always_call`` hooks only for ``Exception``: a ``KeyboardInterrupt`` in a
    forward leaves every enclosing module's entry here. They are closed the next time one of
    their modules runs (or an enclosing module's hook does). A module that calls itself
    recursively is therefore one range, from its innermost call.
    """
    for _, entry in reversed(entries):
        entry.abandon()


class ModuleHandle:
    """What ``instrument_module`` returns: the range names it added and ``remove()``."""

    def __init__(self, hooks: list[tuple[Any, _Hooks]], skipped: list[str]) -> None:
        self._hooks = hooks  # (weak reference to the module, its hooks): keeps no model alive
        #: range names this handle added, in ``named_modules()`` order
        self.names: tuple[str, ...] = tuple(h.name for _, h in hooks)
        #: range names this call would have added to modules an earlier call instrumented
        self.already_instrumented: tuple[str, ...] = tuple(skipped)

    def remove(self) -> None:
        """Remove every hook this handle added; the modules' hook dicts are as before.
        Safe to call twice."""
        with _LOCK:
            hooks, self._hooks = self._hooks, []
            for ref, h in hooks:
                for handle in h.handles:
                    handle.remove()
                h.handles = []
                module = ref()
                if module is not None and _INSTRUMENTED.get(module) is h:
                    del _INSTRUMENTED[module]

    def __enter__(self) -> ModuleHandle:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.remove()

    def __len__(self) -> int:
        return len(self._hooks)

    def __repr__(self) -> str:
        return f"<ModuleHandle {len(self._hooks)} module(s)>"


Pattern = Any  # a glob string (``"layers.*.mlp"``) or an ``nn.Module`` subclass


def _patterns(arg: Any, what: str) -> tuple[Any, ...] | None:
    if arg is None:
        return None
    items = (arg,) if isinstance(arg, (str, type)) else arg
    try:
        items = tuple(items)
    except TypeError:
        items = (arg,)
    for p in items:
        ok = (isinstance(p, str) and p) or (isinstance(p, type) and issubclass(p, torch.nn.Module))
        if not ok:
            raise TypeError(
                f"instrument_module({what}=...) takes glob patterns over module paths "
                f"(like 'layers.*.mlp') or nn.Module subclasses, or a list of them; "
                f"got {type(p).__name__} {p!r}"
            )
    return items


def _matches(path: str, module: torch.nn.Module, patterns: tuple[Any, ...]) -> bool:
    for p in patterns:
        if isinstance(p, str):
            if fnmatch.fnmatchcase(path, p):
                return True
        elif isinstance(module, p):
            return True
    return False


def instrument_module(
    model: torch.nn.Module,
    *,
    prefix: str | None = None,
    depth: int | None = None,
    include: Pattern | Iterable[Pattern] | None = None,
    exclude: Pattern | Iterable[Pattern] | None = None,
    step: bool = False,
) -> ModuleHandle:
    """Record a range around ``model``'s forward and each selected submodule's forward.

    Range names: ``model`` itself is ``prefix`` (default: its class name); a submodule is
    its ``named_modules()`` path (``model.layers.0.mlp``), after ``prefix + "."`` when a prefix
    is given. ``depth`` keeps submodules at most that many levels below ``model`` (1: its
    children). ``include`` keeps only submodules whose path matches one of the glob patterns
    or is an instance of one of the given module classes; ``exclude`` drops matches. The
    model's own range is always kept: its forward ends steps like a decorated call (a root
    call, or every return with ``step=True``); submodule ranges never end steps.

    Modules instrumented already (by an earlier call) are left as they are, so calling this
    twice adds nothing. ``remove()`` on the returned handle restores the hooks as they were.
    With ``PROFILED_ENABLED=0`` (read here) no hook is added.
    Instrument before ``torch.compile``: inside compiled code the hooks add no graph break and
    record nothing, like ``@profiled`` calls.
    """
    _check_arguments(model, prefix, depth, step)
    inc = _patterns(include, "include")
    exc = _patterns(exclude, "exclude")
    if not enabled_from_env():
        return ModuleHandle([], [])  # PROFILED_ENABLED=0: no hooks, torch's fast path stays
    selected = _select(model, prefix, depth, inc, exc)
    if step:
        state.declare_steps()
    return _add_hooks(selected, step)


def _check_arguments(model: Any, prefix: Any, depth: Any, step: Any) -> None:
    """Bad arguments raise at once (``include``/``exclude`` are checked by ``_patterns``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"instrument_module() takes an nn.Module, got {type(model).__name__} {model!r}; "
            "for a function use @profiled"
        )
    if prefix is not None and (not isinstance(prefix, str) or not prefix.strip()):
        raise ValueError(f"prefix must be a non-empty string or None, got {prefix!r}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise ValueError(f"depth must be an int >= 0 or None (all levels), got {depth!r}")
    if not isinstance(step, bool):
        raise TypeError(f"step must be a bool, got {type(step).__name__} {step!r}")


def _select(
    model: torch.nn.Module,
    prefix: str | None,
    depth: int | None,
    inc: tuple[Any, ...] | None,
    exc: tuple[Any, ...] | None,
) -> list[tuple[torch.nn.Module, str, bool]]:
    """``(module, range name, is the model itself)`` for the model and every submodule that
    ``depth``, ``include`` and ``exclude`` keep, in ``named_modules()`` order."""
    selected: list[tuple[torch.nn.Module, str, bool]] = []
    for path, module in model.named_modules():
        if not path:
            selected.append((module, range_name(prefix or type(model).__name__), True))
            continue
        if depth is not None and path.count(".") + 1 > depth:
            continue
        if inc is not None and not _matches(path, module, inc):
            continue
        if exc is not None and _matches(path, module, exc):
            continue
        selected.append((module, range_name(f"{prefix}.{path}" if prefix else path), False))
    return selected


def _add_hooks(selected: list[tuple[torch.nn.Module, str, bool]], step: bool) -> ModuleHandle:
    """Hooks on each selected module not instrumented already (those are named in the handle's
    skipped list), under the lock so that two threads cannot instrument one module twice."""
    added: list[tuple[Any, _Hooks]] = []
    skipped: list[str] = []
    with _LOCK:
        for module, name, root in selected:
            if module in _INSTRUMENTED:
                skipped.append(name)
                continue
            h = _Hooks(name, root, step and root)
            decorator.RANGE_NAMES.add(name)
            # prepended / appended: the range also covers the user's own hooks
            h.handles.append(module.register_forward_pre_hook(h.pre, prepend=True))
            h.handles.append(module.register_forward_hook(h.post, always_call=True))
            _INSTRUMENTED[module] = h
            added.append((weakref.ref(module), h))
    return ModuleHandle(added, skipped)
