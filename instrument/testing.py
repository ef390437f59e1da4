"""Helpers for tests, ours and users': capture reports without touching the environment.

from instrument import Schedule
from instrument.testing import capture

def test_my_model_is_profiled():
    with capture(schedule=Schedule(wait=0, warmup=0, active=2)) as cap:
        for _ in range(2):
            model_step()
            cap.step()  # capture() is an explicit session: steps end at step() only
    assert cap.reports[0].ranges["model_step"].calls == 2
    assert not cap.session.status().window_open  # the window ended with the second step

``process_status()`` says what decorated calls do now (idle, metrics only, reporting to a
session) and whether a torch profiler records; ``forget_warnings()`` lets a test see the
once-per-process configuration warnings again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from exporters import InMemoryExporter

from .runtime import lifetime
from .runtime.config import _reset_warnings
from .runtime.profiling_session import Session
from .runtime.status import ProcessStatus, SessionStatus

__all__ = [
    "Capture",
    "ProcessStatus",
    "SessionStatus",
    "capture",
    "forget_warnings",
    "process_status",
    "reset",
]


class Capture:
    """What ``capture()`` yields: the session and the in-memory exporter behind it."""

    def __init__(self, sess: Session, exporter: InMemoryExporter) -> None:
        self.session = sess
        self.exporter = exporter

    @property
    def reports(self) -> list[Any]:
        return self.exporter.reports

    def step(self) -> None:
        self.session.step()


@contextmanager
def capture(**session_fields: Any) -> Iterator[Capture]:
    """An explicit session whose reports land in memory (plus any ``exporters`` given)."""
    mem = InMemoryExporter()
    extra = list(session_fields.pop("exporters", ()))
    with lifetime.session(exporters=[mem, *extra], **session_fields) as sess:
        yield Capture(sess, mem)


def reset() -> None:
    """End every session and forget ``configure()``: as if the process had just started, except
    that ``step=True`` decorations applied so far no longer count as declaring steps (those of
    every test module imported would otherwise stop root calls from ending steps in all)."""
    lifetime.reset()


def forget_warnings() -> None:
    """Forget which bad settings (environment values, variable names) were warned about: each
    warns once per process, and warns again after this (``reset()`` does it too)."""
    _reset_warnings()


def process_status() -> ProcessStatus:
    """What decorated calls do now, whether a torch profiler records, and what the calling
    thread or asyncio task has open."""
    from .runtime import _torch, decorator, module

    return ProcessStatus(
        calls_idle=bool(decorator._IDLE),
        calls_metrics_only=decorator._COUNT_ONLY is not None,
        session=decorator._SESSION,
        profiler_on=_torch.profiler_on(),
        windows_recording=len(_torch._LIVE),
        depth=decorator._DEPTH.get(),
        open_blocks=len(decorator._CM_STACK.get()),
        open_modules=len(module._STACK.get()),
    )
