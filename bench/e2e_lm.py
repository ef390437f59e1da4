#!/usr/bin/env python
"""End to end on a transformer LM: what a sampled window costs, and where it goes.

    python bench/e2e_lm.py --json out.json        # CUDA: both LM sizes, ~4 minutes on an H100
    python bench/e2e_lm.py --device cpu           # the CPU's scaled-down sizes (noisy box)
    python bench/e2e_lm.py --device cpu --quick   # smoke run for the tests (tiny sizes)

Method (issue 31): one process, one model and optimizer per size, blocks of ``--every`` (100)
training steps. Each profiled block is paired with a plain block, the order flipped at every
pair of a variant (plain-profiled, profiled-plain, ...); each block is timed between two device
synchronisations, and each step's CPU wall time is kept too (no synchronisation inside a block).
A variant's figure is the median over its pairs of plain block time / its block time (the
throughput ratio; IQR beside it) and of (its block - the paired plain block) per window: the
program time one window costs.

Variants, all on the same model and pool of batches:

- *plain*: ``plain_step``, no instrumentation at all.
- *sdk*: the SDK's sampled windows as a user writes them: ``@profiled("train_step")``
  around ``@profiled("forward")``, ``"backward"``, ``"optimizer"``, ``instrument.step()`` at
  each step's start (as ``prof.step()`` below: with ``step=True`` the step boundary into a
  block's first step, where its window is due, would come at the previous SDK block's last
  call, and the other variants' decorated calls in between would start that window; every
  SDK block is checked to end in the step before its next window's, ``check_aligned``), and
  the ambient session configured like ``PROFILED_EVERY=100 PROFILED_EXPORTERS=trace,json``
  (default schedule: a warm-up and 3 recorded steps; metrics on, as the json exporter turns
  them on), trace files and JSON lines to a temporary directory.
  ``PROFILED_OVERHEAD_BUDGET=0`` so every block holds one window (the budget would back off
  a dear window; the bench measures what one costs).
  The windows open at each block's first step; what the background export has not finished
  when the block ends is waited for untimed (``spill`` in the table: what the block missed).
- *torch*: the plain loop with a hand-written ``torch.profiler.profile(schedule=schedule(
  skip_first=4, wait=every-4, warmup=1, active=3, repeat=0), on_trace_ready=export_chrome_trace
  to a temporary directory)``, ``prof.step()`` at each step's start: the same windows at each
  block's first steps, what a torch.profiler user pays.
- *metrics*: the same decorated functions with the ambient session's metrics on but no window
  (no ``instrument.step()``: the session stays in the last SDK block's last step, never due).

The per-window breakdown: the SDK's own ledger (``WindowReport.cost``, read back from the
JSON lines) and timing wrappers this bench installs around the window path's functions
(``ProfilerWindow.start/stop/export_chrome_trace``, ``reporting.write_pending``/``write_raw``,
the helper's round trip, the drain, the exporters; ``gc`` callbacks), each split into wall time
on the caller's (training) thread, wall on background threads, and CPU seconds; the
hand-written profiler's ``prepare_trace``/``start_trace``/``stop_trace``/
``export_chrome_trace`` are timed the same way (a subclass). Where each block's extra time
lands is the per-step excess over the paired plain block's median step, by step of the block:
step 0 (warm-up, start), 1-3 (recorded), 4-8 (window end, stop, drain), 9 on (background export).
The helper process's work is split offline on one window's raw trace (load, shape, write,
events, analyze, and the gzip copy it writes for the trace exporter, which links it into place).

Sizes (CUDA, bf16 autocast, AdamW): see ``SIZES``; ``--device cpu`` and ``--quick`` use the
scaled-down ``CPU_SIZES`` and ``QUICK_SIZES``. The exit code is 0 whether or not the targets
(issue 31: SDK >= 98% small, >= 99% larger; SDK window cost <= torch's) are met.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import instrument  # noqa: E402
from instrument import profiled  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "bench"))
# the machine line (not from e2e_overhead: importing it loads examples/06, whose step=True
# function would declare steps for every session here, and its ledger would lose its baseline)
from machine import cpu_name  # noqa: E402

# d_model, layers, heads (head size 64 on CUDA), sequence, batch (sequences per step), vocab
SIZES = {
    # overhead-bound: ~1,300 small kernels a step, little arithmetic (~15 ms steps on an H100)
    "small": dict(d_model=256, layers=12, heads=4, seq=256, batch=16, vocab=8192),
    # more arithmetic per launch (~11 ms steps on an H100)
    "larger": dict(d_model=1024, layers=6, heads=16, seq=512, batch=8, vocab=32768),
}
CPU_SIZES = {  # the same shapes scaled down for a 2-core CPU (fp32, no autocast)
    "small": dict(d_model=64, layers=4, heads=2, seq=32, batch=4, vocab=512),
    "larger": dict(d_model=128, layers=2, heads=2, seq=64, batch=2, vocab=1024),
}
QUICK_SIZES = {  # smoke: seconds in all
    "small": dict(d_model=32, layers=2, heads=2, seq=8, batch=2, vocab=64),
    "larger": dict(d_model=48, layers=1, heads=2, seq=16, batch=2, vocab=128),
}
TARGETS = {"small": 0.98, "larger": 0.99}  # issue 31: SDK throughput vs plain
WINDOW = 4  # warm-up + active steps of the default schedule
VARIANTS = ("sdk", "torch", "metrics")
RANGE_NAMES = frozenset({"train_step", "forward", "backward", "optimizer"})

# ---------------------------------------------------------------- the model


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class LM(nn.Module):
    """A GPT-style decoder: token and position embeddings, pre-norm blocks, tied head."""

    def __init__(self, d_model: int, layers: int, heads: int, seq: int, vocab: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.register_buffer("positions", torch.arange(seq), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(self.positions[: idx.shape[1]])
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tok.weight)


def autocast(device: str) -> Any:
    if device == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with autocast(x.device.type):
        logits = model(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def plain_step(model, opt, x, y):
    loss = lm_loss(model, x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


# the same step as a user instruments it
@profiled("forward")
def forward(model, x, y):
    return lm_loss(model, x, y)


@profiled("backward")
def backward(loss):
    loss.backward()


@profiled("optimizer")
def optimizer_step(opt):
    opt.step()
    opt.zero_grad(set_to_none=True)


def _train_step(model, opt, x, y):
    loss = forward(model, x, y)
    backward(loss)
    optimizer_step(opt)
    return loss.detach()


train_step = profiled("train_step")(_train_step)  # steps: instrument.step() at each start


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------- timing wrappers (the probe)


class Probe:
    """Wall and thread-CPU time of the window path's functions, by thread, for the block in
    progress (``take`` hands them over and starts afresh). Wrappers are installed on the SDK's
    modules and classes by ``install`` (a bench's monkeypatching, never a product path)."""

    def __init__(self) -> None:
        self.caller = threading.get_ident()
        # stage, on the caller's thread, start (perf_counter_ns), wall ns, thread CPU ns
        self.records: list[tuple[str, bool, int, int, int]] = []
        self.lock = threading.Lock()
        self.keep_raw: str | None = None  # copy the next raw trace here (offline replay)
        self.raw_bytes: list[int] = []  # the size of each raw trace torch wrote for the SDK
        self._gc_start: dict[int, tuple[int, int]] = {}

    def add(self, stage: str, t0: int, c0: int | None) -> None:
        """``stage`` ran from ``t0`` (``perf_counter_ns``) to now, using this thread's CPU
        from ``c0`` (``thread_time_ns``; None: not measured)."""
        wall = time.perf_counter_ns() - t0
        cpu = 0 if c0 is None else time.thread_time_ns() - c0
        with self.lock:
            self.records.append((stage, threading.get_ident() == self.caller, t0, wall, cpu))

    def take(self) -> list[tuple[str, bool, int, int, int]]:
        with self.lock:
            out, self.records = self.records, []
        return out

    def timed(self, stage: str, fn: Any) -> Any:
        probe = self

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                probe.add(stage, t0, c0)

        wrapper.__probe_original__ = fn  # type: ignore[attr-defined]
        return wrapper

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        ident = threading.get_ident()
        if phase == "start":
            self._gc_start[ident] = (time.perf_counter_ns(), time.thread_time_ns())
        else:
            started = self._gc_start.pop(ident, None)
            if started is not None:  # wall and thread CPU: the wall of a collection also
                # holds the waits for the GIL (another thread's export_chrome_trace holds it)
                self.add(f"gc gen{info.get('generation', '?')}", *started)

    def install(self) -> None:
        from exporters.json_lines import JsonLinesExporter
        from exporters.trace_file import TraceFileExporter
        from instrument.export import builder as reporting
        from instrument.runtime import _torch, stops

        def patch(owner: Any, name: str, stage: str) -> None:
            setattr(owner, name, self.timed(stage, getattr(owner, name)))

        patch(_torch.ProfilerWindow, "start", "profiler start")
        patch(_torch.ProfilerWindow, "stop", "profiler stop")
        patch(_torch.ProfilerWindow, "export_chrome_trace", "export_chrome_trace")
        patch(_torch.ProfilerWindow, "end_marker_event", "end marker event")
        patch(reporting, "write_pending", "write_pending")
        patch(reporting, "_let_the_queue_refill", "queue refill wait")
        patch(reporting.ReportBuilder, "_in_helper", "helper round trip")
        patch(reporting.ReportBuilder, "build", "report build (worker total)")
        patch(stops.Stops, "hand_over", "hand-over")
        patch(TraceFileExporter, "export", "exporter trace")
        patch(JsonLinesExporter, "export", "exporter json")

        original_raw = reporting.write_raw
        probe = self

        def write_raw(ended: Any) -> str:  # timed, and its file kept once when asked
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            try:
                path = original_raw(ended)
            finally:
                probe.add("write_raw", t0, c0)
            try:
                probe.raw_bytes.append(os.path.getsize(path))
            except OSError:
                pass
            if probe.keep_raw is not None and path:
                keep, probe.keep_raw = probe.keep_raw, None
                shutil.copyfile(path, keep)
            return path

        reporting.write_raw = write_raw

        original_drain = stops.Stops.finish_drain

        def finish_drain(self_: Any, *, force: bool) -> None:  # timed only where it stops
            if self_.draining is None:
                return original_drain(self_, force=force)
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return original_drain(self_, force=force)
            finally:
                if self_.draining is None:
                    probe.add("drain: wait + stop", t0, c0)

        stops.Stops.finish_drain = finish_drain
        gc.callbacks.append(self._gc)


PROBE = Probe()


class TimedProfile(torch.profiler.profile):
    """torch.profiler.profile with its phases timed by the probe (its ``action_map`` holds
    these bound methods)."""

    def prepare_trace(self) -> None:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            super().prepare_trace()
        finally:
            PROBE.add("torch prepare_trace", t0, c0)

    def start_trace(self) -> None:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            super().start_trace()
        finally:
            PROBE.add("torch start_trace", t0, c0)

    def stop_trace(self) -> None:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            super().stop_trace()
        finally:
            PROBE.add("torch stop_trace", t0, c0)


# ---------------------------------------------------------------- one size


def quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(x for x in xs if x is not None and not math.isnan(x))
    if not xs:
        return {"median": math.nan, "q1": math.nan, "q3": math.nan, "n": 0}
    if len(xs) == 1:
        return {"median": xs[0], "q1": xs[0], "q3": xs[0], "n": 1}
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return {"median": statistics.median(xs), "q1": q[0], "q3": q[2], "n": len(xs)}


def median_or_nan(xs: Any) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else math.nan


SEGMENTS = (("step 0", 0, 1), ("steps 1-3", 1, 4), ("steps 4-8", 4, 9), ("steps 9+", 9, None))

# SDK variants beyond the (``--extra``): the same decorated loop and ambient session,
# one knob of the window path turned during the block, to tell which stage costs on a GPU
EXTRAS = {
    "sdk_sync": "sdk, the window's stop synchronising at its end (stops.MAX_DRAIN_STEPS=0: "
    "no deferred stop, no drained steps in the trace)",
    "sdk_nowarm": "sdk, profiler started at the first recorded step (CUDA's warm-up step "
    "not recorded, as torch's is not)",
    "sdk_lean": "sdk_sync and sdk_nowarm together: the window records what torch's does",
    "sdk_late": "sdk, its background work (trace export, helper, exporters) held until the "
    "block's timed part has ended: what the window costs the caller alone",
    "sdk_warm": "sdk, the warm-up step recorded as a CUDA window records it (on the CPU too), "
    "its CPU ops paused (window.WARMUP_PAUSES_CPU_OPS)",
    "sdk_warm_ops": "sdk_warm with the warm-up's CPU ops recorded (WARMUP_PAUSES_CPU_OPS off)",
}
SDK_FAMILY = ("sdk", *EXTRAS)


class SizeRun:
    def __init__(self, name: str, shape: dict, device: str, every: int, tmp: str) -> None:
        self.name, self.shape, self.device, self.every = name, shape, device, every
        self.tmp = os.path.join(tmp, name)
        os.makedirs(self.tmp)
        torch.manual_seed(0)
        model_shape = {k: shape[k] for k in ("d_model", "layers", "heads", "seq", "vocab")}
        self.model = LM(**model_shape).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1)
        g = torch.Generator().manual_seed(1)
        pool = torch.randint(0, shape["vocab"], (8, shape["batch"], shape["seq"] + 1), generator=g)
        self.pool = pool.to(device)
        self.i = 0
        self.torch_steps = 0
        self.sdk_steps = 0
        self.torch_windows = 0
        self.torch_bytes: list[int] = []
        self.prof: TimedProfile | None = None
        self.json_path = os.path.join(self.tmp, "reports.jsonl")
        self.trace_dir = os.path.join(self.tmp, "traces")
        self.torch_dir = os.path.join(self.tmp, "torch_traces")
        os.makedirs(self.torch_dir)
        self.costs_seen = 0
        self.drains: list[tuple[int, bool]] = []  # the last SDK block's deferred stops

    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.pool[self.i % len(self.pool)]
        self.i += 1
        return b[:, :-1], b[:, 1:]

    # ------------------------------------------------------------ setup of the variants

    def configure_sdk(self) -> None:
        """What ``PROFILED_EVERY=100 PROFILED_EXPORTERS=trace,json`` sets up (the trace
        directory and the JSON lines in the bench's temporary directory), budget off."""
        instrument.configure(
            every=self.every,
            exporters=("trace", "json"),
            trace_dir=self.trace_dir,
            json_path=self.json_path,
            overhead_budget=0.0,
        )

    def check_aligned(self) -> None:
        """After an SDK block: the session is in the block's last step (the next block's
        first ``instrument.step()`` begins the window's warm-up), no window open."""
        from instrument.runtime import state

        sess = state.current
        if sess is None:
            return
        status = sess.status()
        if status.step % self.every != self.every - 1 or status.window_open:
            raise SystemExit(
                f"e2e_lm: after an SDK block the session is at step {status.step} (expected "
                f"one less than a multiple of {self.every}) with a window "
                f"{'open' if status.window_open else 'closed'}: the SDK's windows are not "
                "aligned with the blocks, so the figures would mix windows into other blocks"
            )

    def start_torch(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)

        def ready(prof: Any) -> None:
            self.torch_windows += 1
            path = os.path.join(self.torch_dir, f"window{self.torch_windows % 2}.json")
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            prof.export_chrome_trace(path)
            PROBE.add("torch export_chrome_trace", t0, c0)
            self.torch_bytes.append(os.path.getsize(path))

        # prof.step() runs at each step's start (not its end), so a window's prepare, start,
        # stop and export all land in the block that holds it; skip_first puts the warm-up
        # at each block's step 0, as the SDK's windows are
        sched = torch.profiler.schedule(
            skip_first=WINDOW, wait=self.every - WINDOW, warmup=1, active=WINDOW - 1, repeat=0
        )
        self.prof = TimedProfile(activities=activities, schedule=sched, on_trace_ready=ready)
        self.prof.__enter__()

    def new_costs(self) -> list[dict[str, Any]]:
        """The SDK's ledgers (``WindowReport.cost``) written since the last call."""
        costs = read_costs(self.json_path)
        out, self.costs_seen = costs[self.costs_seen :], len(costs)
        return out

    def close(self) -> None:
        if self.prof is not None:
            self.prof.__exit__(None, None, None)
            self.prof = None
        instrument.shutdown()

    # ------------------------------------------------------------ blocks

    def block(self, variant: str) -> tuple[float, list[int], int]:
        """One block of ``every`` steps: seconds between two synchronisations, each step's
        CPU wall time in ns, and when the block began (``perf_counter_ns``)."""
        model, opt = self.model, self.opt
        batches = [self.batch() for _ in range(self.every)]
        stamps = [0] * (self.every + 1)
        with tweaked(variant):
            sync(self.device)
            t0 = stamps[0] = time.perf_counter_ns()
            if variant == "torch":
                prof = self.prof
                for j, (x, y) in enumerate(batches):
                    if self.torch_steps:
                        prof.step()
                    self.torch_steps += 1
                    plain_step(model, opt, x, y)
                    stamps[j + 1] = time.perf_counter_ns()
            else:
                step_fn = plain_step if variant == "plain" else train_step
                sdk = variant in SDK_FAMILY
                for j, (x, y) in enumerate(batches):
                    if sdk:
                        if self.sdk_steps:
                            instrument.step()
                        self.sdk_steps += 1
                    step_fn(model, opt, x, y)
                    stamps[j + 1] = time.perf_counter_ns()
            sync(self.device)
            took = (time.perf_counter_ns() - t0) / 1e9
            RELEASE.set()  # (sdk_late: its background work may start now)
            if variant in SDK_FAMILY:  # untimed: what the background export had left
                t1 = time.perf_counter_ns()  # (inside the tweak: its export ends under it)
                instrument.flush()
                PROBE.add("flush (untimed)", t1, None)
                self.drains = take_drain_log()
                self.check_aligned()
        return took, [b - a for a, b in zip(stamps, stamps[1:])], t0


def take_drain_log() -> list[tuple[int, bool]]:
    """The deferred stops since the last call: (steps waited, whether the window's kernels
    had run by then, else the caller waited for them)."""
    from instrument.runtime import state

    sess = state.current
    if sess is None:
        return []
    log = sess._stops.drain_log
    out = list(log)
    log.clear()
    return out


RELEASE = threading.Event()  # set when a block's timed part ends (``sdk_late``)


class tweaked:
    """During an ``EXTRAS`` variant's block, its knob of the window path turned."""

    def __init__(self, variant: str) -> None:
        self.variant = variant
        self.undo: list[Any] = []

    def __enter__(self) -> None:
        from instrument.runtime import state, stops

        if self.variant in ("sdk_sync", "sdk_lean"):
            old = stops.MAX_DRAIN_STEPS
            stops.MAX_DRAIN_STEPS = 0
            self.undo.append(lambda: setattr(stops, "MAX_DRAIN_STEPS", old))
        warm = {"sdk_nowarm": False, "sdk_lean": False, "sdk_warm": True, "sdk_warm_ops": True}
        if self.variant in warm:
            sess = state.current
            if sess is not None:
                windows = sess._windows  # (the window room keeps whether warm-ups record)
                old_warm = windows.record_warmup
                windows.record_warmup = warm[self.variant]
                self.undo.append(lambda: setattr(windows, "record_warmup", old_warm))
        if self.variant == "sdk_warm_ops":
            from instrument.runtime import window

            old_pause = window.WARMUP_PAUSES_CPU_OPS
            window.WARMUP_PAUSES_CPU_OPS = False
            self.undo.append(lambda: setattr(window, "WARMUP_PAUSES_CPU_OPS", old_pause))
        if self.variant == "sdk_late":
            from instrument.export import builder as reporting

            before_export = reporting._let_the_queue_refill
            RELEASE.clear()

            def held(ended: Any) -> None:  # the export worker's first step for a window
                RELEASE.wait(600)
                before_export(ended)

            reporting._let_the_queue_refill = held
            self.undo.append(lambda: setattr(reporting, "_let_the_queue_refill", before_export))

    def __exit__(self, *exc: Any) -> None:
        for undo in reversed(self.undo):
            undo()


def excess_by_segment(steps: list[int], base: float) -> dict[str, float]:
    """ms each segment of a block's steps took over ``base`` (ns: the paired plain block's
    median step)."""
    out = {}
    for label, lo, hi in SEGMENTS:
        part = steps[lo:hi]
        out[label] = (sum(part) - base * len(part)) / 1e6
    return out


def summarize_records(
    records: list[tuple[str, bool, int, int, int]],
) -> dict[str, dict[str, float]]:
    """Per stage: ms of wall on the caller's thread, wall on other threads, CPU, calls."""
    out: dict[str, dict[str, float]] = {}
    for stage, caller, _, wall, cpu in records:
        row = out.setdefault(
            stage, {"caller_ms": 0.0, "background_ms": 0.0, "cpu_ms": 0.0, "calls": 0}
        )
        row["caller_ms" if caller else "background_ms"] += wall / 1e6
        row["cpu_ms"] += cpu / 1e6
        row["calls"] += 1
    return out


def caller_gc_ms(records: list[tuple[str, bool, int, int, int]]) -> float:
    """ms (wall) the training thread spent in garbage collections, its waits for the GIL
    in them included."""
    return sum(w for s, c, _, w, _ in records if s.startswith("gc") and c) / 1e6


def caller_gc_cpu_ms(records: list[tuple[str, bool, int, int, int]]) -> float:
    """ms of the training thread's CPU in garbage collections (no GIL waits)."""
    return sum(cpu for s, c, _, _, cpu in records if s.startswith("gc") and c) / 1e6


def median_rows(rows: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per stage and field, the median over blocks (a block without the stage counts 0)."""
    stages = sorted({s for r in rows for s in r})
    out = {}
    for stage in stages:
        fields = {}
        for key in ("caller_ms", "background_ms", "cpu_ms", "calls"):
            fields[key] = statistics.median(r.get(stage, {}).get(key, 0.0) for r in rows)
        out[stage] = fields
    return out


def read_costs(path: str) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                if isinstance(rec.get("cost"), dict):
                    # the window's steps with its ledger: a window the SDK opened late runs on
                    # past its block, into the blocks of other variants (seen on an H100: one
                    # window's raw trace was 542 MB and its stop took 6.3 s)
                    out.append({**rec["cost"], "window_steps": rec.get("steps")})
    except OSError:
        pass
    return out


def count_events(path: str) -> int | None:
    try:
        from instrument.analysis.kineto_json import load_trace

        return len(load_trace(path).get("traceEvents", []))
    except Exception:  # noqa: BLE001 - a diagnostic
        return None


def replay_helper(raw: str, device_in_use: bool) -> dict[str, Any]:
    """The helper process's stages, timed one by one in this process on a copy of one window's
    raw trace (medians of 3; once for a trace of 10 MB or more), the gzip copy of the shaped
    trace it writes for the trace exporter included."""
    from instrument.analysis.analyze import analyze, events_from_trace
    from instrument.analysis.kineto_json import load_trace, shape_trace, write_json_atomic
    from instrument.base.files import write_atomic
    from instrument.runtime import _torch

    dist = {**_torch.distributed_info(), "device_in_use": device_in_use}
    times: dict[str, list[float]] = {}
    n_raw = n_shaped = 0
    work, gz = raw + ".work", raw + ".work.gz"

    def copy(out: Any) -> None:
        with open(work, "rb") as inp:
            shutil.copyfileobj(inp, out, 1 << 20)

    repeats = 3 if os.path.getsize(raw) < 10e6 else 1  # (a GPU window's trace: seconds)
    for _ in range(repeats):
        shutil.copyfile(raw, work)
        t = [time.perf_counter()]
        trace = load_trace(work)
        t.append(time.perf_counter())
        n_raw = len(trace.get("traceEvents", []))
        trace = shape_trace(trace, RANGE_NAMES, dist)
        t.append(time.perf_counter())
        write_json_atomic(trace, work, compress=False, durable=False)
        t.append(time.perf_counter())
        events = events_from_trace(trace)
        t.append(time.perf_counter())
        analyze(events, RANGE_NAMES, base_ns=int(trace.get("baseTimeNanoseconds") or 0))
        t.append(time.perf_counter())
        write_atomic(gz, copy, compress=True, durable=False)
        t.append(time.perf_counter())
        n_shaped = len(trace.get("traceEvents", []))
        labels = ("load", "shape", "write", "events", "analyze", "gzip (for the trace exporter)")
        for label, a, b in zip(labels, t, t[1:]):
            times.setdefault(label, []).append((b - a) * 1e3)
        os.unlink(work)
        os.unlink(gz)
    return {
        "raw_events": n_raw,
        "shaped_events": n_shaped,
        "raw_bytes": os.path.getsize(raw),
        "ms": {k: statistics.median(v) for k, v in times.items()},
    }


def run_size(
    name: str,
    shape: dict,
    device: str,
    every: int,
    pairs: int,
    deadline: float,
    tmp: str,
    variants: tuple[str, ...],
) -> dict[str, Any]:
    began = time.perf_counter()
    run = SizeRun(name, shape, device, every, tmp)
    say = functools.partial(print, file=sys.stderr, flush=True)
    say(f"[{name}] {shape} ({run.params() / 1e6:.1f}M parameters) on {device}")
    run.configure_sdk()
    run.start_torch()
    # warm-up, untimed: the process's first profiler start (seconds with CUDA), the helper
    # process's start, the first torch window (its first block has none: skip_first)
    warm: dict[str, list[float]] = {}
    for variant in ("plain", "sdk", "torch", "metrics", "sdk", "torch", "plain"):
        took, _, _ = run.block(variant)
        warm.setdefault(variant, []).append(took)
        say(f"[{name}] warm-up {variant}: {took:.2f} s")
    PROBE.take()
    run.new_costs()
    block_s = warm["plain"][-1]
    left_s = deadline - time.perf_counter()
    fit = max(1, int(left_s / (2 * len(variants) * block_s * 1.15)))
    if fit < pairs:
        say(f"[{name}] {pairs} pairs per variant do not fit in {left_s:.0f} s: {fit}")
        pairs = fit

    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(pairs):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for variant in order:
            first_plain = len(results[variant]) % 2 == 0
            got: dict[str, Any] = {}
            for which in ("plain", variant) if first_plain else (variant, "plain"):
                PROBE.take()
                PROBE.raw_bytes.clear()
                took, steps, began_ns = run.block(which)
                got[which] = (took, steps, PROBE.take(), began_ns)
                if which != "plain":  # (the variant's own block: in either order)
                    raw_bytes = sum(PROBE.raw_bytes)
            t_plain, s_plain, recs_plain, _ = got["plain"]
            t_var, s_var, recs, began_ns = got[variant]
            spill = sum(w for s, c, _, w, _ in recs if s == "flush (untimed)") / 1e6
            base = statistics.median(s_plain)
            costs = run.new_costs() if variant in SDK_FAMILY else []
            results[variant].append(
                {
                    "order": "plain-first" if first_plain else "profiled-first",
                    "plain_s": t_plain,
                    "profiled_s": t_var,
                    "ratio": t_plain / t_var,
                    "extra_ms": (t_var - t_plain) * 1e3,
                    "spill_ms": spill,
                    "excess_ms": excess_by_segment(s_var, base),
                    # the same against the block's own median step: blind to a slowdown of
                    # every step alike, deaf to a load change between the pair's blocks
                    "own_excess_ms": (sum(s_var) - len(s_var) * statistics.median(s_var)) / 1e6,
                    "stages": summarize_records(recs),
                    "caller_gc_ms": caller_gc_ms(recs),
                    "caller_gc_cpu_ms": caller_gc_cpu_ms(recs),
                    "plain_caller_gc_ms": caller_gc_ms(recs_plain),
                    "plain_step_ms": base / 1e6,
                    "windows": len(costs) if variant in SDK_FAMILY else int(variant == "torch"),
                    "cost": costs[-1] if costs else None,  # the SDK's ledger of its window
                    "drains": run.drains if variant in SDK_FAMILY else [],
                    # bytes of torch's trace export of the window (the same writer for both)
                    "trace_bytes": (run.torch_bytes[-1] if run.torch_bytes else None)
                    if variant == "torch"
                    else raw_bytes or None,
                    # the first steps one by one (ms over the plain median), and when each
                    # timed stage began (ms from the block's start) and how long it took
                    "first_steps_ms": [(d - base) / 1e6 for d in s_var[:12]],
                    "timeline": [
                        (stage, caller, (t - began_ns) / 1e6, wall / 1e6)
                        for stage, caller, t, wall, _ in recs
                        if not stage.startswith("gc")
                    ],
                }
            )
            steps_of = [c.get("window_steps") for c in costs]
            say(
                f"[{name}] pair {len(results[variant])}/{pairs} {variant:<10} "
                f"{'plain first' if first_plain else 'plain last '}: ratio "
                f"{t_plain / t_var:.3f}, {1e3 * (t_var - t_plain):+.1f} ms"
                + (
                    f", spill {spill:.0f} ms, window steps {steps_of}"
                    if variant in SDK_FAMILY
                    else ""
                )
            )

    # one more SDK window, untimed, its raw trace kept for the offline replay
    keep = os.path.join(run.tmp, "raw-kept.json")
    PROBE.keep_raw = keep
    run.block("sdk")
    PROBE.take()
    PROBE.keep_raw = None
    replay = replay_helper(keep, device == "cuda") if os.path.exists(keep) else None
    torch_trace = os.path.join(run.torch_dir, f"window{run.torch_windows % 2}.json")
    torch_events = count_events(torch_trace) if os.path.exists(torch_trace) else None
    run.close()

    plain_rows = [p for v in variants for p in results[v]]
    out: dict[str, Any] = {
        "shape": shape,
        "parameters": run.params(),
        "every": every,
        "pairs": pairs,
        "plain_step_ms": statistics.median(p["plain_step_ms"] for p in plain_rows),
        "plain_block_s": statistics.median(p["plain_s"] for p in plain_rows),
        "warmup_s": warm,
        "variants": {},
        "replay": replay,
        "torch_trace_events": torch_events,
        "seconds": time.perf_counter() - began,
    }
    for variant in variants:
        rows = results[variant]
        ledgers = [p["cost"] for p in rows if p["cost"]]
        out["variants"][variant] = {
            "ratio": quantiles([p["ratio"] for p in rows]),
            "window_cost_ms": quantiles([p["extra_ms"] for p in rows]),
            "own_excess_ms": quantiles([p["own_excess_ms"] for p in rows]),
            "spill_ms": quantiles([p["spill_ms"] for p in rows]),
            "windows_per_block": median_or_nan(p["windows"] for p in rows),
            # CUDA: the deferred stops, steps waited (median) and how many found the kernels run
            "drain_steps": median_or_nan(d[0] for p in rows for d in p["drains"]),
            "drains_done": sum(d[1] for p in rows for d in p["drains"]),
            "drains": sum(len(p["drains"]) for p in rows),
            "excess_ms": {
                label: statistics.median(p["excess_ms"][label] for p in rows)
                for label, _, _ in SEGMENTS
            },
            "stages": median_rows([p["stages"] for p in rows]),
            "caller_gc_ms": statistics.median(p["caller_gc_ms"] for p in rows),
            "caller_gc_cpu_ms": statistics.median(p["caller_gc_cpu_ms"] for p in rows),
            "ledger": {
                key: median_or_nan(c.get(key) for c in ledgers)
                for key in (
                    "start_stall_us",
                    "stop_stall_us",
                    "steps_excess_us",
                    "export_cpu_s",
                    "analysis_cpu_s",
                    "helper_cpu_s",
                    "exporters_s",
                    "bytes_written",
                    "total_us",
                )
            }
            if ledgers
            else None,
            "trace_bytes": median_or_nan(p["trace_bytes"] for p in rows),
            "pairs": rows,
        }
    return out


# ---------------------------------------------------------------- the report


STAGE_ORDER = (
    ("start", ("write_pending", "profiler start", "torch prepare_trace", "torch start_trace")),
    (
        "stop",
        (
            "end marker event",
            "drain: wait + stop",
            "profiler stop",
            "hand-over",
            "torch stop_trace",
        ),
    ),
    ("trace export", ("write_raw", "export_chrome_trace", "torch export_chrome_trace")),
    ("helper (shape+analysis)", ("queue refill wait", "helper round trip")),
    ("exporters", ("exporter trace", "exporter json")),
    ("worker", ("report build (worker total)",)),
)


def print_size(name: str, res: dict[str, Any], device: str) -> None:
    v = res["variants"]
    names = list(v)
    print(
        f"\n== {name}: {res['shape']} ({res['parameters'] / 1e6:.1f}M parameters), "
        f"{res['plain_step_ms']:.2f} ms per plain step (CPU wall), blocks of {res['every']} "
        f"steps ({res['plain_block_s']:.2f} s plain), {res['pairs']} pairs per variant"
    )
    print(
        f"  {'variant':<11} {'vs plain':>9} {'IQR':>16} {'per window ms':>14} {'IQR':>17} "
        f"{'spill ms':>9} {'trace MB':>9}"
    )
    for variant in names:
        r, c, s = v[variant]["ratio"], v[variant]["window_cost_ms"], v[variant]["spill_ms"]
        ratio_iqr = f"{100 * r['q1']:.2f}-{100 * r['q3']:.2f}%"
        cost_iqr = f"{c['q1']:.1f} to {c['q3']:.1f}"
        mb = v[variant]["trace_bytes"] / 1e6
        mb_text = "" if math.isnan(mb) else f"{mb:.2f}"
        note = "  (per block: no window)" if variant == "metrics" else ""
        print(
            f"  {variant:<11} {100 * r['median']:>8.2f}% {ratio_iqr:>16} {c['median']:>14.1f} "
            f"{cost_iqr:>17} {s['median']:>9.0f} {mb_text:>9}{note}"
        )
    print(
        "  (vs plain: median over pairs of plain block time / its block time; per window: "
        "its block - the paired\n  plain block; spill: the SDK's export still running at the "
        "block's end, waited for untimed;\n  trace MB: torch's export_chrome_trace of one window)"
    )
    target = TARGETS.get(name)
    if target is not None and device == "cuda":
        sdk, tp = v["sdk"], v["torch"]
        ok = sdk["ratio"]["median"] >= target
        a, b = sdk["window_cost_ms"], tp["window_cost_ms"]
        cheaper = a["median"] <= b["median"]
        # a median over torch's that sits inside torch's IQR (and torch's inside the SDK's)
        # is not a difference these pairs can tell: said so, not shown as a plain FAIL
        unresolved = not cheaper and a["q1"] <= b["q3"] and b["q1"] <= a["q3"]
        verdict = "PASS" if cheaper else "FAIL"
        if unresolved:
            verdict += ", within noise (IQRs overlap)"
        print(
            f"  targets: sdk >= {100 * target:.0f}% of plain: {'PASS' if ok else 'FAIL'}; "
            f"sdk's window <= torch's: {verdict}"
        )
    print(
        "\n  where the extra program time lands, ms over the paired plain block's median step"
        "\n  (the SDK's window ends inside step 3, torch's in step 4's prof.step(); 9+: the SDK's"
        "\n  background export); own median: every step over its own block's median step"
        "\n  (robust to load that changes between blocks); caller gc: the training thread's"
        "\n  garbage collections, wall (GIL waits in them included) / its CPU in them:"
    )
    print(
        f"  {'variant':<11}"
        + "".join(f"{label:>11}" for label, _, _ in SEGMENTS)
        + f"{'own median':>11}{'caller gc':>15}"
    )
    for variant in names:
        ex = v[variant]["excess_ms"]
        print(
            f"  {variant:<11}"
            + "".join(f"{ex[label]:>11.1f}" for label, _, _ in SEGMENTS)
            + f"{v[variant]['own_excess_ms']['median']:>11.1f}"
            + f"{v[variant]['caller_gc_ms']:>9.1f} /{v[variant]['caller_gc_cpu_ms']:>4.1f}"
        )
    print(
        "\n  one window's stages, median per block, ms: wall on the caller's thread | wall on"
        " background threads | thread CPU"
    )
    for variant in names:
        if variant == "metrics":
            continue
        stages = v[variant]["stages"]
        print(f"  {variant}:")
        for group, stage_names in STAGE_ORDER:
            for stage in stage_names:
                row = stages.get(stage)
                if row is None or not row["calls"]:
                    continue
                print(
                    f"    {group:<24} {stage:<28} {row['caller_ms']:>8.1f} "
                    f"{row['background_ms']:>8.1f} {row['cpu_ms']:>8.1f}"
                )
        led = v[variant]["ledger"]
        if led:
            print(
                f"    ledger (WindowReport.cost): start stall {led['start_stall_us'] / 1e3:.1f} "
                f"ms, stop stall {led['stop_stall_us'] / 1e3:.1f} ms, steps excess "
                f"{led['steps_excess_us'] / 1e3:.1f} ms, export CPU "
                f"{led['export_cpu_s'] * 1e3:.1f} ms, analysis CPU "
                f"{led['analysis_cpu_s'] * 1e3:.1f} ms, helper CPU "
                f"{led['helper_cpu_s'] * 1e3:.1f} ms, exporters {led['exporters_s'] * 1e3:.1f} "
                f"ms wall; total {led['total_us'] / 1e3:.1f} ms"
            )
        if v[variant].get("drains"):
            d = v[variant]
            print(
                f"    deferred stops: {d['drains']}, a median {d['drain_steps']:g} step(s) after "
                f"the window's end; {d['drains_done']} found its kernels run, the others waited"
            )
    rep = res["replay"]
    if rep:
        print(
            f"  the helper's stages replayed here on one sdk window's raw trace "
            f"({rep['raw_events']} events, {rep['raw_bytes'] / 1e6:.2f} MB; "
            f"{rep['shaped_events']} after shaping), ms: "
            + ", ".join(f"{k} {val:.1f}" for k, val in rep["ms"].items())
        )
    if res["torch_trace_events"] is not None:
        print(f"  torch's hand-written window trace: {res['torch_trace_events']} events")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 pair, short blocks")
    parser.add_argument("--sizes", default="small,larger", help="comma-separated: small,larger")
    parser.add_argument("--every", type=int, help="steps per block = a window every N (100)")
    parser.add_argument(
        "--pairs",
        type=int,
        help="block pairs per variant and size (default 10;"
        " fewer where --budget-s says so; --quick 1)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=220.0,
        help="seconds the sizes may take together, warm-up included (default 220: the pairs "
        "per variant are cut to fit, at least 1)",
    )
    parser.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    parser.add_argument(
        "--extra",
        default="",
        help="comma-separated SDK variants to add, each one knob of the window path: "
        + "; ".join(f"{k}: {v}" for k, v in EXTRAS.items()),
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch's CPU threads (--device cpu: default 1, leaving the SDK's background "
        "threads and helper a core, as a GPU host's spare cores do; cuda: torch's default)",
    )
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    sizes = QUICK_SIZES if args.quick else SIZES if device == "cuda" else CPU_SIZES
    names = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in names if s not in sizes]
    if unknown or not names:
        parser.error(f"--sizes: no size {', '.join(unknown) or '(none)'}; there are small,larger")
    every = args.every or (12 if args.quick else 100)
    if every <= WINDOW + 5:
        parser.error(f"--every must be more than {WINDOW + 5} (a window and its stop), got {every}")
    pairs = args.pairs or (1 if args.quick else 10)
    if pairs < 1:
        parser.error("--pairs must be >= 1")
    extra = tuple(e.strip() for e in args.extra.split(",") if e.strip())
    bad = [e for e in extra if e not in EXTRAS]
    if bad:
        parser.error(f"--extra: no variant {', '.join(bad)}; there are {', '.join(EXTRAS)}")
    variants = VARIANTS + extra
    threads = args.threads or (1 if device == "cpu" else None)
    if threads is not None:
        torch.set_num_threads(threads)

    # torch 2.11+ warns at each scheduled cycle that it clears the last one's events
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    tmp = tempfile.mkdtemp(prefix="e2e-lm-")
    PROBE.install()
    t0 = time.perf_counter()
    results = {}
    try:
        for k, name in enumerate(names):
            # this size's share of what is left (a size that took less leaves it to the next)
            left = args.budget_s - (time.perf_counter() - t0)
            deadline = time.perf_counter() + left / (len(names) - k)
            results[name] = run_size(
                name, sizes[name], device, every, pairs, deadline, tmp, variants
            )
    finally:
        instrument.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - t0

    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    cmd = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"torch-profiled end to end, transformer LM   python bench/e2e_lm.py {cmd}".rstrip())
    print(
        f"  {gpu + ', ' if gpu else ''}cpu: {cpu_name()} ({os.cpu_count()} cores)  torch "
        f"{torch.__version__}  python {platform.python_version()}  took {wall:.0f} s"
    )
    print(
        f"  {'bf16 autocast' if device == 'cuda' else 'fp32'}, AdamW; sdk: a window every "
        f"{every} steps (default schedule), exporters trace+json, budget off; torch: "
        "schedule(wait, warmup=1, active=3) + export_chrome_trace; metrics: no windows"
    )
    for name, res in results.items():
        print_size(name, res, device)
    if args.json:
        doc = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": gpu or "cpu",
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "quick": args.quick,
            "every": every,
            "seconds": wall,
            "sizes": results,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        print(f"\n  wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
