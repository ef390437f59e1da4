"""Verdicts on synthetic traces: every kind, at and around the thresholds."""

from __future__ import annotations

import pytest

from instrument.analysis.analyze import analyze_events
from instrument.base.verdict import (
    COMPUTE_BOUND,
    COMPUTE_HEAVY_FLOP_PER_BYTE,
    CPU_ONLY,
    OVERHEAD_BOUND,
    OVERHEAD_BOUND_BELOW,
    judge,
)


def E(name, ts, dur, cat="cpu_op", tid=1, external=0, **args):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"External id": external, **args},
    }


def one_range(range_us, kernel_us, *, kernel_start=None, **op_args):
    """A range of ``range_us`` CPU time launching one kernel of ``kernel_us``."""
    start = 5 if kernel_start is None else kernel_start
    return [
        E("r", 0, range_us, cat="user_annotation", external=1),
        E("aten::mm", 1, 3, external=2, **op_args),
        E("cudaLaunchKernel", 2, 1, cat="cuda_runtime", external=2),
        E("gemm", start, kernel_us, cat="kernel", tid=99, external=2),
    ]


def test_overhead_bound_like_the_seed_at_64x64():
    # seed, 64x64: ~23 us of device work in ~2.3 ms of CPU time
    a = analyze_events(one_range(2300, 23), set())
    r = a.ranges["r"]
    assert r.verdict.kind == OVERHEAD_BOUND
    assert "idles" in r.verdict.reason and "1%" in r.verdict.reason
    assert a.verdict.kind == OVERHEAD_BOUND


def test_compute_bound_like_the_seed_at_4096():
    # the kernel runs past the range's end: wall = 0 .. 5 + 4495
    a = analyze_events(one_range(50, 4495), set())
    r = a.ranges["r"]
    assert r.wall_time_us == pytest.approx(4500)
    assert r.verdict.kind == COMPUTE_BOUND
    assert r.verdict.detail == ""  # no FLOPs known


def test_threshold_is_the_busy_share_of_wall_time():
    # busy exactly at the threshold is compute-bound; just under is overhead-bound
    wall = 1000.0
    at = judge(device_us=500, busy_us=OVERHEAD_BOUND_BELOW * wall, wall_us=wall, cpu_us=wall)
    under = judge(device_us=499, busy_us=OVERHEAD_BOUND_BELOW * wall - 1, wall_us=wall, cpu_us=wall)
    assert at.kind == COMPUTE_BOUND and under.kind == OVERHEAD_BOUND


def test_cpu_only_without_device_work():
    events = [E("r", 0, 100, cat="user_annotation", external=1), E("aten::add", 1, 50, external=2)]
    a = analyze_events(events, set())
    assert a.ranges["r"].verdict.kind == CPU_ONLY
    assert a.verdict.kind == CPU_ONLY
    assert str(a.ranges["r"].verdict) == "cpu-only"


def test_compute_heavy_and_memory_heavy_from_flops_and_shapes():
    n = 4096
    heavy = analyze_events(
        one_range(
            50, 4000, **{"Input Dims": [[n, n], [n, n]], "Input type": ["c10::BFloat16"] * 2}
        ),
        set(),
    )
    r = heavy.ranges["r"]
    assert r.flops == 2 * n**3
    assert r.verdict.kind == COMPUTE_BOUND and r.verdict.detail == "compute-heavy"
    assert r.flops_per_s == pytest.approx(2 * n**3 / 4000e-6)
    # a skinny product: 2*4096*1*4096 FLOPs over (4096*1 + 1*4096) * 4 bytes = 1024 FLOP/B...
    # ...make it memory-heavy instead: (n x 1) @ (1 x 1): 2n FLOPs over (n + 1) * 4 bytes
    light = analyze_events(
        one_range(50, 4000, **{"Input Dims": [[n, 1], [1, 1]], "Input type": ["float", "float"]}),
        set(),
    )
    r = light.ranges["r"]
    assert r.flops == 2 * n
    assert r.flops / ((n + 1) * 4) < COMPUTE_HEAVY_FLOP_PER_BYTE
    assert r.verdict.detail == "memory-heavy"
    assert r.verdict.short == "compute/mem"


def test_window_verdict_uses_all_device_work():
    events = one_range(2300, 23) + [
        E("other", 3000, 100, cat="user_annotation", external=3),
        E("aten::add", 3001, 3, external=4),
        E("k2", 3010, 90, cat="kernel", tid=99, external=4),
    ]
    a = analyze_events(events, set())
    assert a.ranges["other"].verdict.kind == COMPUTE_BOUND
    assert a.ranges["r"].verdict.kind == OVERHEAD_BOUND
    assert a.device_busy_us == pytest.approx(113)
    assert a.verdict.kind == OVERHEAD_BOUND  # 113 us busy in a 3100 us window


def test_profiler_buffer_request_inside_a_range_is_not_user_time():
    # Seen on an H200 (torch 2.11): the first launch after the profiler starts makes CUPTI
    # request a buffer (~2.6 ms) inside aten::mm; Kineto's JSON puts it on a row of its own.
    # Without taking it out, a compute-bound 4096x4096 matmul reads as overhead-bound.
    events = [
        E("r", 0, 2700, cat="user_annotation", external=1),
        E("aten::mm", 10, 2650, external=2),
        E("Activity Buffer Request", 20, 2600, cat="overhead", tid=0),
        E("cudaLaunchKernel", 2630, 10, cat="cuda_runtime", external=2),
        E("gemm", 2645, 640, cat="kernel", tid=99, external=2),
    ]
    a = analyze_events(events, set())
    r = a.ranges["r"]
    assert r.cpu_time_us == pytest.approx(100)  # 2700 - 2600
    assert r.wall_time_us == pytest.approx(2645 + 640 - 2600)  # to the kernel end, less 2600
    assert r.verdict.kind == COMPUTE_BOUND
    mm = next(o for o in a.top_ops if o.name == "aten::mm")
    assert mm.self_cpu_time_us == pytest.approx(2650 - 2600 - 10)  # as key_averages counts it
    assert a.profiler_overhead_us == pytest.approx(2600)
    assert a.self_cpu_time_total_us == pytest.approx(2700 - 2600)
    assert a.verdict.kind == COMPUTE_BOUND


def test_profiler_step_self_time_stays_in_the_range_that_encloses_it():
    # ProfilerStep#N's self time is the user's Python between operators, not profiler work:
    # it is bookkeeping in the totals but not removed from a range that encloses it
    events = [
        E("r", 0, 1000, cat="user_annotation", external=1),
        E("ProfilerStep#3", 10, 900),
        E("aten::mm", 20, 100, external=2),
    ]
    r = analyze_events(events, set()).ranges["r"]
    assert r.cpu_time_us == pytest.approx(1000)


def test_warmup_before_the_first_step_marker_is_dropped_with_its_kernels():
    events = [
        E("r", 0, 100, cat="user_annotation", external=1),  # warm-up call
        E("aten::mm", 1, 50, external=2),
        E("cudaLaunchKernel", 2, 1, cat="cuda_runtime", external=2),
        E("gemm", 150, 400, cat="kernel", tid=99, external=2),  # runs past the marker
        E("profiled::step#1", 120, 0),
        E("r", 130, 10, cat="user_annotation", external=3),
        E("aten::mm", 131, 5, external=4),
        E("cudaLaunchKernel", 132, 1, cat="cuda_runtime", external=4),
        E("gemm", 550, 400, cat="kernel", tid=99, external=4),
    ]
    from instrument.analysis.analyze import analyze, drop_warmup, events_from_trace

    a = analyze(drop_warmup(events_from_trace({"traceEvents": events})), set())
    r = a.ranges["r"]
    assert r.calls == 1 and r.kernel_launches == 1
    assert a.self_device_time_total_us == pytest.approx(400)
    assert a.device_busy_us == pytest.approx(400)
    # without a marker nothing is dropped
    assert (
        analyze(drop_warmup(events_from_trace({"traceEvents": events[:4]})), set())
        .ranges["r"]
        .calls
        == 1
    )
