#!/usr/bin/env python
"""End to end: can the decorator stay in a training loop? Throughput of examples/06's loop.

    python bench/e2e_overhead.py                        # CUDA: 06's GPU sizes; CPU: its CPU sizes
    python bench/e2e_overhead.py --quick                # smoke run (seconds, noisy)
    python bench/e2e_overhead.py --json out.json        # also write every run as JSON

Variants, all in one process on one model, optimizer and pool of batches:

- *unprofiled*: ``plain_step`` below, the body of 06's ``train_step`` with no ``@profiled`` and
  no ``with profiled(...)`` (the bench checks it computes the same losses).
- *decorated, idle*: 06's ``train_step`` (the decorator and its three phases) while the SDK
  is idle: no session counts steps and no profiler records, the state of a program after its
  windows, or between them once sampling skips idle steps.
- *decorated, idle, metrics on*: the same with always-on metrics (each call timed into its
  range's histogram; on a GPU one call in ``PROFILED_METRICS_DEVICE_EVERY`` (100) per range
  also gets CUDA events; issue 17's target: >= 99.5%).
- *decorated, idle + modules*: the same with ``instrument_module(model, depth=2)`` hooks.
- *decorated, counting*: a session counts every step but never opens a window.
- *plain torch.profiler, same windows*: no SDK; ``torch.profiler.profile`` with
  ``schedule(wait=every-4, warmup=1, active=3)`` around the plain loop, no export: the floor
  for any tool built on torch.profiler (its synchronising stop and the recorded steps' cost).
  *+ export_chrome_trace*: the same with each window written as a trace on the caller's thread,
  what a torch.profiler user pays.
- *sampled*: ``PROFILED_EVERY=100`` (``session(every=100)``): a window (the default schedule's
  1 warm-up + 3 recorded steps) opens at steps 0, 100, ...; the windows are written as trace
  files to a temporary directory by the background export. Its runs are timed from before the
  session opens to after it closes (closing waits for exports still in flight), so they pay
  every window in full.
- *sampled, analysis on the export thread*: ``sampled`` with ``PROFILED_ANALYSIS_PROCESS=0``
  (the trace is read, shaped and analyzed on the SDK's export thread, not in its helper
  process).
- *sampled, CPU ops recorded during the deferred stop*: ``sampled`` with the stepping thread's
  CPU operators recorded while a CUDA window's stop waits for its kernels (the SDK before
  ``DRAIN_PAUSES_CPU_OPS``; the same as *sampled* where windows are not deferred, as on a CPU).

One *round* runs every variant once, for ``--run-steps`` steps each (a multiple of ``--every``,
so every sampled run holds the same number of whole windows), in a rotated order; each run is
timed from a device synchronisation to the next. A variant's ratio is its throughput over the
unprofiled run *of the same round*; the tables give the median over rounds. Before the rounds
each variant runs once untimed (the first profiler start of a process costs ~1 s on a CPU and
~5 s with CUDA; the cost of that one start is reported on its own).

Targets (issue 6): decorated-but-idle >= 99.5% and sampled >= 99% of unprofiled throughput.
The exit code is 0 whether or not they are met: this is a benchmark, not a test.

``bench/e2e_lm.py`` is the sibling for issue 31: a transformer LM at two sizes, blocks of 100
steps alternating plain / profiled in one process (order flipped every pair), the SDK's
windows against hand-written torch.profiler windows, and where one window's time goes.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import instrument  # noqa: E402
from exporters import InMemoryExporter, TraceFileExporter  # noqa: E402
from instrument import Schedule, instrument_module, session  # noqa: E402
from instrument.runtime import decorator  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "bench"))
from machine import cpu_name  # noqa: E402

WINDOW = 4  # warm-up + active steps of one sampled window


def load_example() -> Any:
    path = os.path.join(REPO, "examples", "06_training_loop.py")
    spec = importlib.util.spec_from_file_location("training_loop_06", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EX = load_example()


def plain_step(model, opt, x, y):
    """examples/06_training_loop.py's ``train_step`` without any instrumentation."""
    with EX.autocast(x.device.type):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Bench:
    def __init__(self, device: str, sizes: dict, every: int, run_steps: int) -> None:
        self.device = device
        self.model, self.opt, self.task = EX.build(device, sizes)
        self.every, self.run_steps = every, run_steps
        self.i = 0
        self.trace_dir = tempfile.mkdtemp(prefix="e2e-traces-")
        self.windows = 0
        self.handle = None

    def _loop(self, step) -> None:
        model, opt, task = self.model, self.opt, self.task
        for _ in range(self.run_steps):
            x, y = task.batch_at(self.i)
            self.i += 1
            step(model, opt, x, y)

    def timed(self, step) -> float:
        sync(self.device)
        t0 = time.perf_counter()
        self._loop(step)
        sync(self.device)
        return time.perf_counter() - t0

    # ---------------------------------------------------------- variants: () -> seconds

    def unprofiled(self) -> float:
        return self.timed(plain_step)

    def idle(self) -> float:
        assert decorator._IDLE and not decorator._FLAG._is_profiler_enabled
        return self.timed(EX.train_step)

    def metrics(self) -> float:
        """Decorated and idle, with always-on metrics (every call timed into its histogram)
        and device-time sampling at its default (CUDA events on one call in 100 per range)."""
        from instrument.runtime import state
        from instrument.runtime.config import Config

        state.set_metrics(True, device_every=Config().metrics_device_every)
        try:
            assert not decorator._IDLE and decorator._QUIET
            return self.timed(EX.train_step)
        finally:
            state.set_metrics(False)

    def idle_modules(self) -> float:
        with instrument_module(self.model, prefix="model", depth=2):
            return self.idle()

    def counting(self) -> float:
        with session(schedule=Schedule(skip_first=10**9), exporters=[]) as s:
            took = self.timed(EX.train_step)
            assert s.step_index == self.run_steps and s.windows_opened == 0
        return took

    def sampled(self, analysis_process: bool = True) -> float:
        mem = InMemoryExporter()
        sync(self.device)
        t0 = time.perf_counter()
        with session(
            every=self.every,
            schedule=Schedule(warmup=1, active=WINDOW - 1),
            exporters=[TraceFileExporter(self.trace_dir, keep=4), mem],
            analysis_process=analysis_process,
        ):
            self._loop(EX.train_step)
            sync(self.device)
        took = time.perf_counter() - t0
        expected = self.run_steps // self.every
        assert len(mem.reports) == expected, (len(mem.reports), mem.notices)
        assert all(r.ranges["train_step"].calls == WINDOW - 1 for r in mem.reports)
        self.windows += expected
        return took

    def sampled_drain_cpu(self) -> float:
        mod = instrument.runtime.stops
        mod.DRAIN_PAUSES_CPU_OPS = False
        try:
            return self.sampled()
        finally:
            mod.DRAIN_PAUSES_CPU_OPS = True

    def sampled_in_thread(self) -> float:
        return self.sampled(analysis_process=False)

    def _torch_profiler(self, on_trace_ready) -> float:
        """Plain torch.profiler on the plain loop, the same window as ``sampled`` every
        ``every`` steps (wait, 1 warm-up, 3 recorded): what any tool built on it pays."""
        windows = []

        def ready(prof) -> None:
            windows.append(1)
            if on_trace_ready is not None:
                on_trace_ready(prof)

        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        sched = torch.profiler.schedule(wait=self.every - WINDOW, warmup=1, active=WINDOW - 1)
        sync(self.device)
        t0 = time.perf_counter()
        with torch.profiler.profile(
            activities=activities, schedule=sched, on_trace_ready=ready
        ) as prof:

            def step(model, opt, x, y) -> None:
                plain_step(model, opt, x, y)
                prof.step()

            self._loop(step)
        sync(self.device)
        took = time.perf_counter() - t0
        assert len(windows) == self.run_steps // self.every, len(windows)
        return took

    def torch_profiler(self) -> float:
        return self._torch_profiler(None)

    def torch_profiler_export(self) -> float:
        n = [0]

        def export(prof) -> None:
            n[0] += 1
            prof.export_chrome_trace(os.path.join(self.trace_dir, f"plain{n[0] % 4}.json"))

        return self._torch_profiler(export)


VARIANTS = {
    "unprofiled": "unprofiled (plain loop)",
    "idle": "decorated, idle",
    "metrics": "decorated, idle, metrics on",
    "idle_modules": "decorated, idle + instrument_module",
    "counting": "decorated, session counting",
    "sampled": "sampled (window every N steps)",
    "sampled_drain_cpu": "  the same, CPU ops recorded during the deferred stop",
    "sampled_in_thread": "  the same, analysis on the export thread",
    "torch_profiler": "plain torch.profiler, same windows",
    "torch_profiler_export": "  the same + export_chrome_trace",
}
TARGETS = {"idle": 0.995, "metrics": 0.995, "sampled": 0.99}


def check_same_work(device: str, sizes: dict) -> None:
    """The plain loop and 06's decorated one compute the same thing."""
    losses = []
    for step in (plain_step, EX.train_step):
        model, opt, task = EX.build(device, sizes)
        losses.append([step(model, opt, *task.batch_at(i)).float() for i in range(3)])
    torch.testing.assert_close(torch.stack(losses[0]), torch.stack(losses[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, short runs")
    parser.add_argument("--rounds", type=int, help="rounds (default 7; --quick 3)")
    parser.add_argument("--every", type=int, default=100, help="sampled: a window every N steps")
    parser.add_argument(
        "--run-steps",
        type=int,
        help="steps per timed run, a multiple of --every (default 2x --every)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the runs and summary as JSON")
    parser.add_argument(
        "--max-drain",
        type=int,
        metavar="N",
        help="a CUDA window's deferred stop waits at most N steps for its "
        "kernels (instrument.runtime.stops.MAX_DRAIN_STEPS; a diagnostic)",
    )
    parser.add_argument(
        "--export-delay",
        type=float,
        metavar="S",
        help="after a deferred stop the export waits S seconds from the stop "
        "(instrument.export.builder.EXPORT_DELAY_S; a diagnostic)",
    )
    parser.add_argument(
        "--only",
        metavar="NAMES",
        help=f"comma-separated variants to run besides unprofiled "
        f"({', '.join(list(VARIANTS)[1:])})",
    )
    args = parser.parse_args(argv)
    if args.only:
        keep = {n.strip() for n in args.only.split(",")}
        unknown = keep - set(VARIANTS)
        if unknown:
            parser.error(
                f"--only: no variant {', '.join(sorted(unknown))}; there are {', '.join(VARIANTS)}"
            )
        for name in list(VARIANTS)[1:]:
            if name not in keep:
                del VARIANTS[name]
    if args.max_drain is not None:
        instrument.runtime.stops.MAX_DRAIN_STEPS = args.max_drain
    if args.export_delay is not None:
        instrument.export.builder.EXPORT_DELAY_S = args.export_delay
    if args.every <= WINDOW:
        parser.error(f"--every must be more than {WINDOW} (a window's steps), got {args.every}")
    run_steps = args.run_steps or 2 * args.every
    if run_steps % args.every:
        parser.error(f"--run-steps ({run_steps}) must be a multiple of --every ({args.every})")
    rounds = args.rounds or (3 if args.quick else 7)

    cuda = torch.cuda.is_available()
    device, sizes = ("cuda", EX.GPU) if cuda else ("cpu", EX.CPU)
    warnings.simplefilter("ignore", instrument.ProfilerWarning)
    instrument.shutdown()  # no ambient session from here on: "idle" is really idle
    check_same_work(device, sizes)
    bench = Bench(device, sizes, args.every, run_steps)

    t0 = time.perf_counter()
    first_window = bench.sampled()  # the process's first profiler start is in here
    warm = {name: getattr(bench, name)() for name in VARIANTS}
    first_start_s = first_window - warm["sampled"]
    bench.windows = 0  # count the timed rounds' windows only
    runs: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            runs[name].append(run_steps / getattr(bench, name)())
    wall = time.perf_counter() - t0
    shutil.rmtree(bench.trace_dir, ignore_errors=True)

    ratios = {
        name: [runs[name][r] / runs["unprofiled"][r] for r in range(rounds)] for name in VARIANTS
    }
    gpu = torch.cuda.get_device_name() if cuda else None
    print(
        f"torch-profiled end-to-end overhead   python bench/{os.path.basename(__file__)} "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}".rstrip()
    )
    print(
        f"  {gpu + ', ' if gpu else ''}cpu: {cpu_name()} ({os.cpu_count()} cores)  torch "
        f"{torch.__version__}  python {platform.python_version()}"
    )
    print(f"  examples/06_training_loop.py at its {device.upper()} sizes {sizes}")
    timed = rounds * (run_steps // args.every)
    print(
        f"  {rounds} rounds x {len(VARIANTS)} variants x {run_steps} steps; sampled: a window "
        f"every {args.every} steps ({timed} windows timed per sampled variant); "
        f"took {wall:.1f} s"
    )
    print(f"  first profiler start of the process (untimed warm-up): {first_start_s:+.2f} s")
    print()
    width = max(len(label) for label in VARIANTS.values())
    print(
        f"  {'variant':<{width}} {'steps/s':>9} {'min':>9} {'max':>9} {'vs plain':>9} "
        f"{'best/best':>10}"
    )
    print("  " + "-" * (width + 51))
    best = max(runs["unprofiled"])
    for name, label in VARIANTS.items():
        tp = runs[name]
        print(
            f"  {label:<{width}} {statistics.median(tp):>9.1f} {min(tp):>9.1f} {max(tp):>9.1f} "
            f"{100 * statistics.median(ratios[name]):>8.2f}% {100 * max(tp) / best:>9.2f}%"
        )
    print(
        "  (vs plain: median over rounds of the ratio to the same round's plain run; "
        "best/best: fastest run over fastest plain run, robust to bursts of load)"
    )
    per_window = None
    window_costs = {}
    if bench.windows:
        # per round, against the same round's plain run: a clock that changes between rounds
        # (seen on the H200) moves both alike
        t_plain = [run_steps / tp for tp in runs["unprofiled"]]
        print()
        for name in (
            "sampled",
            "sampled_drain_cpu",
            "sampled_in_thread",
            "torch_profiler",
            "torch_profiler_export",
        ):
            if name not in runs:
                continue
            window_costs[name] = statistics.median(
                (run_steps / runs[name][r] - t_plain[r]) / (run_steps // args.every)
                for r in range(rounds)
            )
            print(
                f"  {VARIANTS[name].strip()}: a window costs about "
                f"{window_costs[name] * 1e3:.1f} ms over the plain loop (median of rounds)"
            )
        per_window = window_costs.get("sampled")
        print(f"  ({statistics.median(t_plain) / run_steps * 1e3:.3f} ms per plain step)")
    print("\n  targets (median of per-round ratios):")
    verdicts = {}
    for name, target in TARGETS.items():
        if name not in ratios:
            continue
        got = statistics.median(ratios[name])
        verdicts[name] = got >= target
        print(
            f"  {'PASS' if got >= target else 'FAIL'}  {VARIANTS[name]}: {100 * got:.2f}% of "
            f"unprofiled throughput, target >= {100 * target:.1f}%"
        )
    if args.json:
        doc = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": gpu or "cpu",
            "cpu": cpu_name(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "sizes": sizes,
            "every": args.every,
            "run_steps": run_steps,
            "rounds": rounds,
            "first_profiler_start_s": first_start_s,
            "window_cost_s": per_window,
            "window_costs_s": window_costs,
            "steps_per_s": runs,
            "ratio_to_unprofiled": ratios,
            "best_over_best": {n: max(runs[n]) / best for n in VARIANTS},
            "targets": {
                n: {"target": t, "median": statistics.median(ratios[n]), "pass": verdicts[n]}
                for n, t in TARGETS.items()
                if n in ratios
            },
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
        print(f"\n  wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
