"""A small training loop for the diff gate's tests (``tests/test_gate.py``), run as a real
program: ``python tests/_gate_program.py OUT:WINDOWS:SLEEP_MS:SIZE:SHAPES[:DEVICE[:REPEAT]]
...``, one run (one directory of traces, OUT) per argument, a window of each in turn; DEVICE is
``cpu`` (the default) or ``cuda``, REPEAT the matmuls per call (1).

The recorded step calls the ``train_step`` range five times (the warm-up step before it once):
a ``SIZE x SIZE`` matmul, then a sleep of the window's SLEEP_MS (``20`` or, window by window
and cycled, ``2/6/10``). The sleep makes a call's time predictable on a busy machine (a
regression is a longer sleep: ``24`` against ``20`` is 1.2x per call, ``40`` 2x); what the
machine's load adds is late wake-ups, which only ever add time. The matmul's shapes (and
FLOPs) are what SHAPES=1 records (``record_shapes``). Each window is a session of its own
(``Schedule(wait=0, warmup=1, active=1)``: two steps) that writes one trace into OUT; the
program waits for that export before the next window records.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator

import torch

from exporters import TraceFileExporter
from instrument import Schedule, flush, profiled, session

CALLS = 5  # train_step calls per step


def run(
    out: str,
    windows: int,
    sleeps: list[float],
    size: int,
    shapes: bool,
    device: str = "cpu",
    repeat: int = 1,
) -> Iterator[None]:
    """``windows`` sessions of one window each (one trace each into ``out``), window ``w``
    sleeping ``sleeps[w % len(sleeps)]`` per call: which sleep a window recorded never depends
    on how a schedule lines up with the steps. On ``cuda`` the matmul runs ``repeat`` times a
    call (the same shapes, that much more device time) and the window records the device.
    Yields after each window, so that ``main`` can take turns between runs."""
    x = torch.randn(size, size, device=device)

    @profiled("train_step")
    def train_step(sleep_s: float) -> torch.Tensor:
        for _ in range(repeat):
            y = x @ x
        time.sleep(sleep_s)
        return y

    schedule = Schedule(wait=0, warmup=1, active=1, repeat=1)
    for w in range(windows):
        sleep_s = sleeps[w % len(sleeps)]
        exporters = [TraceFileExporter(out, gzip=False)]
        activities = ["cpu", "cuda"] if device == "cuda" else ["cpu"]
        with session(
            exporters=exporters, schedule=schedule, record_shapes=shapes, activities=activities
        ) as s:
            for step in range(2):  # warm-up (not recorded: one call will do), then recorded
                for _ in range(CALLS if step else 1):
                    train_step(sleep_s)
                s.step()
        if device == "cuda":
            torch.cuda.synchronize()
        flush()  # the export done (JSON on a thread holding the GIL) before the next window
        yield


def main(specs: list[str]) -> None:
    torch.set_num_threads(1)  # no BLAS threads spinning against the analysis helper
    # the process's first profiler window pays one-off start-up costs: into a scratch directory
    for _ in run(tempfile.mkdtemp(prefix="gate-warmup-"), 1, [0.002], 64, True):
        pass
    if any(spec.split(":")[5:6] == ["cuda"] for spec in specs):
        for _ in run(tempfile.mkdtemp(prefix="gate-warmup-"), 1, [0.002], 64, True, "cuda"):
            pass
    runs = []
    for spec in specs:
        out, windows, sleep_ms, size, shapes, *more = spec.split(":")
        sleeps = [float(ms) / 1000 for ms in sleep_ms.split("/")]
        device, repeat = (more + ["cpu", "1"][len(more) :])[:2]
        runs.append(run(out, int(windows), sleeps, int(size), shapes == "1", device, int(repeat)))
    # a window of each run in turn: a burst of the machine's load slows windows of every run,
    # never all of one (a baseline recorded in a burst would pass a slower candidate)
    done = object()
    while runs:
        runs = [r for r in runs if next(r, done) is not done]


if __name__ == "__main__":
    main(sys.argv[1:])
