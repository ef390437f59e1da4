"""``atomic()``: a block of SDK state changes that no signal handler's exception cuts short.

Python runs signal handlers on the main thread, between any two bytecodes; a handler that
raises (``KeyboardInterrupt`` from Ctrl-C's, a program's ``SIGALRM`` timeout) raises wherever
that thread is. Inside the SDK's start or stop of a window that can leave torch's profiler on
with nothing left to stop it. So those blocks run with every Python-level handler replaced
by one that only notes the signal; when the block is over the handlers are put back and the
noted signals are handed to them, in order, so the program's exception is raised (unchanged,
by its own handler) as the block returns.

- Only the main thread changes anything: elsewhere no handler can run, and ``signal.signal``
  may only be called there.
- Handlers set to ``SIG_DFL``/``SIG_IGN`` or by C code are untouched (they raise nothing in
  Python), also where C code (``faulthandler.register``) put its handler over a Python one:
  ``signal.getsignal`` still reports the Python one there, ``triggers.held_by_c_code`` asks the
  operating system.
- If putting a handler back is itself cut short by a signal the program's restored handler
  raised, the stand-in left in place passes every signal straight to the handler it replaced,
  and the next block puts it back.
- Costs ~30-50 µs (a look at every signal's handler, two ``sigaction`` per Python handler):
  used around profiler starts and stops, never per call or per step.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["atomic"]

_SIGNALS = tuple(sorted(signal.valid_signals())) if hasattr(signal, "valid_signals") else ()
_MAIN = threading.main_thread().ident

_depth = 0  # > 0 while the main thread is inside an atomic block
_noted: list[int] = []  # signals that arrived meanwhile, in order


class _StandIn:
    """The handler of ``signum`` during a block: notes the signal; outside a block (left in
    place by a cut-short restore) passes it to the program's handler."""

    __slots__ = ("original",)

    def __init__(self, original: Any) -> None:
        self.original = original

    def __call__(self, signum: int, frame: Any) -> Any:
        if _depth:
            _noted.append(signum)
            return None
        return self.original(signum, frame)


_stand_ins: dict[int, _StandIn] = {}  # signum -> the stand-in installed there


def _install() -> None:
    from .triggers import held_by_c_code  # loaded by then: the package imports it

    for signum in _SIGNALS:
        handler = signal.getsignal(signum)
        if isinstance(handler, _StandIn) or not callable(handler):
            continue
        if held_by_c_code(signum):  # faulthandler.register over a Python handler: replacing
            continue  # it would drop the C handler for good (getsignal cannot see it)
        stand_in = _StandIn(handler)
        _stand_ins[signum] = stand_in  # listed first: always put back, even if cut short here
        signal.signal(signum, stand_in)


def _restore() -> None:
    for signum, stand_in in list(_stand_ins.items()):
        original = stand_in.original
        if signal.getsignal(signum) is stand_in:
            signal.signal(signum, original)  # may run a noted handler: see above
        del _stand_ins[signum]


def _deliver() -> None:
    """Hand each noted signal to its handler, once however often it came (as Python itself
    runs a pending handler once). If one raises, the others are sent again, to be handled as
    soon as the exception lets Python check."""
    noted = list(dict.fromkeys(_noted))
    _noted.clear()
    for i, signum in enumerate(noted):
        handler = signal.getsignal(signum)
        if isinstance(handler, _StandIn):
            handler = handler.original
        if not callable(handler):
            continue
        try:
            handler(signum, sys._getframe(1))
        except BaseException:
            for later in noted[i + 1 :]:
                signal.raise_signal(later)
            raise


@contextmanager
def atomic() -> Iterator[None]:
    """Run the block with signal handlers' exceptions held back until it has finished."""
    global _depth
    if _depth or threading.get_ident() != _MAIN or not _SIGNALS:
        yield
        return
    _depth = 1
    try:
        _install()
        yield
    finally:
        _depth = 0
        try:
            _restore()
        finally:
            _deliver()
