#!/usr/bin/env python
"""What ``instrument_module`` costs per module call, next to a module without hooks.

    python bench/module_hooks.py             # about 15 s
    python bench/module_hooks.py --json out.json

The model is ``nn.Sequential`` of 100 ``nn.Identity`` modules (no tensor work, so what is
measured is the call path); one forward is 101 module calls. Variants, one repeat measuring each
once in a rotated order, median and minimum over 15 repeats, in ns per module call:

- no hooks: torch's fast path (``_call_impl`` skips all hook logic for modules without hooks);
- a no-op forward pre-hook and forward hook of the user's own: what any hook costs in torch;
- ``instrument_module``, idle: no session counts steps, no profiler records;
- ``instrument_module``, counting, steps declared: a session counts steps (``step()`` called),
  no window records; the hooks return after their flag checks;
- ``instrument_module``, counting, root calls end steps: the ambient session of a program that
  declares no steps (no ``step=True``, no ``step()``; an explicit session steps by ``step()``
  only) counts every forward as a step; the hooks keep the nesting depth;
- ``instrument_module`` in the SDK's own recording window: every module call is a range.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import instrument  # noqa: E402
from exporters import InMemoryExporter  # noqa: E402
from instrument import Schedule, instrument_module, session  # noqa: E402
from instrument.runtime import decorator  # noqa: E402

_sessions = instrument.runtime.lifetime

MODULES = 100


def per_call_ns(model: nn.Module, x: Any, forwards: int) -> float:
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(forwards):
            model(x)
        return (time.perf_counter_ns() - t0) / (forwards * (MODULES + 1))
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--forwards", type=int, default=300, help="forwards per sample")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    x = torch.zeros(1)
    plain = nn.Sequential(*(nn.Identity() for _ in range(MODULES)))
    user = nn.Sequential(*(nn.Identity() for _ in range(MODULES)))
    for m in user.modules():
        m.register_forward_pre_hook(lambda mod, a: None)
        m.register_forward_hook(lambda mod, a, out: None)
    hooked = nn.Sequential(*(nn.Identity() for _ in range(MODULES)))
    handle = instrument_module(hooked)
    assert len(handle) == MODULES + 1
    instrument.shutdown()

    def idle() -> float:
        assert decorator._IDLE
        return per_call_ns(hooked, x, args.forwards)

    def counting(declared: bool):
        def run() -> float:
            if declared:
                with session(schedule=Schedule(skip_first=10**9), exporters=[]) as s:
                    s.step()
                    took = per_call_ns(hooked, x, args.forwards)
                    assert s.step_index == 1
                return took
            # root calls end steps only in the ambient session of a program with no step=True
            # function that has not called step(); one with no exporter would not count them
            instrument.configure(
                schedule=Schedule(skip_first=10**9), exporters=[InMemoryExporter()]
            )
            try:
                s = _sessions.session_for_calls()  # built and started before the timing
                assert s is not None and s.ambient
                took = per_call_ns(hooked, x, args.forwards)
                assert s.step_index == args.forwards
            finally:
                instrument.shutdown()  # decorated calls idle again
            return took

        return run

    def recording() -> float:
        with session(schedule=Schedule(wait=0, warmup=0, active=1), exporters=[]) as s:
            took = per_call_ns(hooked, x, max(1, args.forwards // 10))
            s.step()  # ends the window: its report is built after the timing
        return took

    variants = {
        "no hooks": lambda: per_call_ns(plain, x, args.forwards),
        "user's own no-op pre-hook + hook": lambda: per_call_ns(user, x, args.forwards),
        "instrument_module, idle": idle,
        "instrument_module, counting, steps declared": counting(True),
        "instrument_module, counting, root calls end steps": counting(False),
        "instrument_module, in an SDK window": recording,
    }
    recording()  # the first profiler start of the process, untimed
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(variants[name]())
    base = statistics.median(samples["no hooks"])
    print(
        f"instrument_module per module call ({MODULES + 1} module calls per forward, "
        f"torch {torch.__version__}, median/min of {args.repeats} repeats)"
    )
    print(f"  {'variant':<52} {'median ns':>10} {'min ns':>8} {'+ns vs none':>12}")
    for name in names:
        med = statistics.median(samples[name])
        print(f"  {name:<52} {med:>10.0f} {min(samples[name]):>8.0f} {med - base:>+12.0f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {"torch": torch.__version__, "modules": MODULES + 1, "ns": samples}, f, indent=2
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
