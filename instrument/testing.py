"""Helpers for tests, ours and users': capture reports without touching the environment.

from instrument import Schedule
from instrument.testing import capture

def test_my_model_is_profiled():
    with capture(schedule=Schedule(wait=0, warmup=0, active=2)) as cap:
        for _ in range(2):
            model_step()
            cap.step()  # capture() is an explicit session: steps end at step() only
    assert cap.reports[0].ranges["model_step"].calls == 2
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from exporters import InMemoryExporter

from .runtime import lifetime
from .runtime.profiling_session import Session

__all__ = ["Capture", "capture", "reset"]


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
