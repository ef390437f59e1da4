"""analysis.analyze_events on synthetic traces (device attribution) and on real CPU windows."""

from __future__ import annotations

import json

import pytest
import torch

from instrument import Schedule, profiled
from instrument.analysis.analyze import analyze_events
from instrument.testing import capture


def E(name, ts, dur, cat="cpu_op", tid=1, external=0, correlation=None):
    args = {"External id": external}
    if correlation is not None:
        args["correlation"] = correlation
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def test_device_time_follows_the_launching_operator_not_time():
    events = [
        E("step", 0, 100, cat="user_annotation", external=1),
        E("aten::mm", 10, 20, external=2),
        E("cudaLaunchKernel", 12, 5, cat="cuda_runtime", external=2, correlation=7),
        E("aten::copy_", 45, 15, external=3),
        E("cudaMemcpyAsync", 50, 5, cat="cuda_runtime", external=3, correlation=8),
        # an operator outside the range launches too
        E("aten::add", 140, 20, external=4),
        E("cudaLaunchKernel", 150, 5, cat="cuda_runtime", external=4, correlation=9),
        # device events: their timestamps are on the device timeline and overlap nothing
        E("gemm", 1000, 40, cat="kernel", tid=7, external=2, correlation=7),
        E("Memcpy HtoD", 1100, 3, cat="gpu_memcpy", tid=7, external=3, correlation=8),
        E("other", 2000, 11, cat="kernel", tid=7, external=4, correlation=9),
        # the device-side annotation spans idle time: must not be counted
        E("step", 990, 500, cat="gpu_user_annotation", tid=7),
        E("Activity Buffer Request", 200, 30, cat="cuda_runtime"),
        E("ProfilerStep#1", 0, 170, cat="user_annotation"),
    ]
    a = analyze_events(events, {"step"})
    r = a.ranges["step"]
    assert r.calls == 1
    assert r.device_time_us == pytest.approx(43.0)
    assert r.kernel_launches == 2
    assert r.cpu_time_us == pytest.approx(100.0)
    # self time of the range: 100 - aten::mm 20 - aten::copy_ 15
    assert r.self_cpu_time_us == pytest.approx(65.0)
    # busy: 40 + 3 (disjoint); wall: range start 0 .. last kernel end 1103
    assert r.device_busy_us == pytest.approx(43.0)
    assert r.wall_time_us == pytest.approx(1103.0)
    assert a.self_device_time_total_us == pytest.approx(54.0)
    # ProfilerStep#1 nests like any span: only its self time (170 - 100 - 20) is bookkeeping
    assert a.profiler_overhead_us == pytest.approx(30.0 + 50.0)
    kernels = {(k.name, k.kind): k for k in a.top_kernels}
    assert kernels[("gemm", "kernel")].device_time_us == 40
    assert kernels[("Memcpy HtoD", "memcpy")].calls == 1
    ops = {o.name: o for o in a.top_ops}
    assert "ProfilerStep#1" not in ops and "Activity Buffer Request" not in ops
    assert ops["aten::mm"].self_cpu_time_us == pytest.approx(15.0)  # minus nested launch
    assert ops["cudaLaunchKernel"].calls == 2
    # user totals: every CPU event's self time, bookkeeping excluded
    assert a.self_cpu_time_total_us == pytest.approx(65 + 15 + 5 + 10 + 5 + 15 + 5)


def test_nested_ranges_both_get_device_time_and_recursion_counts_once():
    events = [
        E("outer", 0, 100, cat="user_annotation", external=1),
        E("outer", 10, 50, cat="user_annotation", external=2),  # recursive
        E("inner", 20, 10, cat="user_annotation", external=3),
        E("aten::mul", 21, 5, external=4),
        E("cudaLaunchKernel", 22, 2, cat="cuda_runtime", external=4, correlation=1),
        E("k", 500, 8, cat="kernel", tid=9, external=4, correlation=1),
    ]
    a = analyze_events(events, set())  # user_annotation events are ranges by themselves
    assert a.ranges["outer"].calls == 2
    assert a.ranges["outer"].cpu_time_us == pytest.approx(100.0)  # outermost only
    assert a.ranges["outer"].device_time_us == pytest.approx(8.0)  # not 16
    assert a.ranges["inner"].device_time_us == pytest.approx(8.0)
    assert a.ranges["outer"].kernel_launches == 1


def test_threads_are_nested_separately():
    events = [
        E("r", 0, 100, cat="user_annotation", tid=1),
        E("aten::add", 10, 80, tid=2),  # another thread, overlapping in time
    ]
    a = analyze_events(events, {"r"})
    assert a.ranges["r"].self_cpu_time_us == pytest.approx(100.0)
    assert a.top_ops[0].self_cpu_time_us == pytest.approx(80.0)


@profiled("mb")
def mb(x, w, b):
    return x @ w + b


def test_real_window_numbers_match_its_trace_file(tmp_path):
    """The report agrees with the events of the trace file it wrote."""
    from exporters import TraceFileExporter

    x, w, b = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64)
    with capture(
        schedule=Schedule(wait=0, warmup=1, active=3),
        exporters=[TraceFileExporter(tmp_path, gzip=False)],
    ) as cap:
        for _ in range(4):
            mb(x, w, b)
            cap.step()
    (report,) = cap.reports
    trace = json.load(open(report.trace_file))
    # replay the trace's CPU events through torch's own aggregation for comparison
    ours = {o.name: o for o in report.top_ops}
    mm = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]
    assert ours["aten::mm"].calls == len(mm) == 3
    expected_self = sum(e["dur"] for e in mm) - sum(
        e["dur"]
        for e in trace["traceEvents"]
        if e.get("ph") == "X"
        and e.get("name") in ("aten::resolve_conj",)
        and any(m["ts"] <= e["ts"] <= m["ts"] + m["dur"] and m["tid"] == e["tid"] for m in mm)
    )
    assert ours["aten::mm"].self_cpu_time_us == pytest.approx(expected_self, rel=1e-6)
    assert report.ranges["mb"].calls == 3
    assert report.ranges["mb"].cpu_time_us == pytest.approx(
        sum(e["dur"] for e in trace["traceEvents"] if e.get("name") == "mb"), rel=1e-9
    )


def test_per_operator_self_cpu_agrees_with_key_averages(tmp_path):
    """Our numbers from the trace file vs torch's key_averages() on the same profile."""
    from torch.profiler import ProfilerActivity, profile

    from instrument.analysis.kineto_json import load_trace

    x, w, b = torch.randn(128, 128), torch.randn(128, 128), torch.randn(128)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            mb(x, w, b)
    path = str(tmp_path / "t.json")
    prof.export_chrome_trace(path)
    ours = analyze_events(load_trace(path)["traceEvents"], {"mb"}, top=1000)
    theirs = {e.key: e for e in prof.key_averages()}
    for op in ours.top_ops:
        ref = theirs[op.name]
        assert op.calls == ref.count, op.name
        assert op.self_cpu_time_us == pytest.approx(ref.self_cpu_time_total, rel=0.01, abs=0.01)
    assert ours.ranges["mb"].calls == theirs["mb"].count == 20
    assert ours.ranges["mb"].cpu_time_us == pytest.approx(theirs["mb"].cpu_time_total, rel=0.01)


def _window_with(fn, activities, iterations):
    from instrument import configure
    from instrument.runtime import _torch

    configure(enabled=False)  # no ambient session: this test runs its own window
    window = _torch.ProfilerWindow(
        activities, record_shapes=False, profile_memory=False, with_stack=False, with_flops=False
    )
    window.start()
    for _ in range(iterations):
        fn()
    window.stop()
    return window


def _assert_agrees_with_key_averages(window, range_name, calls, tmp_path):
    from instrument.analysis.analyze import analyze, events_from_trace
    from instrument.analysis.kineto_json import load_trace

    events = window.events()
    if events is None:  # torch < 2.13: the session analyzes the exported trace instead
        window.export_chrome_trace(str(tmp_path / "w.json"))
        events = events_from_trace(load_trace(str(tmp_path / "w.json")))
    ours = analyze(events, {range_name}, top=10_000)
    theirs = {e.key: e for e in window._prof.key_averages()}
    assert ours.ranges[range_name].calls == theirs[range_name].count == calls
    for op in ours.top_ops:
        ref = theirs[op.name]
        assert op.calls == ref.count, op.name
        assert op.self_cpu_time_us == pytest.approx(ref.self_cpu_time_total, rel=0.01, abs=0.05)
    for k in ours.top_kernels:
        ref = theirs[k.name]
        assert k.calls == ref.count, k.name
        assert k.device_time_us == pytest.approx(ref.self_device_time_total, rel=0.01, abs=0.05)
    return ours


def test_kineto_path_agrees_with_key_averages_on_cpu(tmp_path):
    x, w, b = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64)
    window = _window_with(lambda: mb(x, w, b), ("cpu",), 50)
    ours = _assert_agrees_with_key_averages(window, "mb", 50, tmp_path)
    assert ours.verdict.kind == "cpu-only"
    assert {"aten::mm", "aten::add"} <= {o.name for o in ours.top_ops}


@pytest.mark.cuda
def test_kineto_path_agrees_with_key_averages_on_cuda(tmp_path):
    x, w, b = (
        torch.randn(256, 256, device="cuda"),
        torch.randn(256, 256, device="cuda"),
        torch.randn(256, device="cuda"),
    )
    mb(x, w, b)
    torch.cuda.synchronize()
    window = _window_with(lambda: mb(x, w, b), ("cpu", "cuda"), 50)
    ours = _assert_agrees_with_key_averages(window, "mb", 50, tmp_path)
    assert ours.ranges["mb"].kernel_launches >= 50
    assert ours.ranges["mb"].device_time_us > 0
    assert ours.top_kernels


def test_a_compiled_graphs_call_is_user_time_not_profiler_bookkeeping():
    """Inductor wraps each compiled graph's call in ``## Call CompiledFxGraph <hash> ##``; on a
    CPU its self time is the fused kernels running, so it is counted like any operator."""
    graph = "## Call CompiledFxGraph f2z4ojvdg4n2t6f3 ##"
    events = [
        E("mlp", 0, 100, cat="user_annotation", external=1),
        E("Torch-Compiled Region: 0/0", 5, 90, external=2),
        E(graph, 10, 80, external=3),
        E("aten::mm", 20, 30, external=4),
        E("ProfilerStep#2", 0, 110, cat="user_annotation"),
    ]
    a = analyze_events(events, {"mlp"})
    ops = {o.name: o for o in a.top_ops}
    assert ops[graph].self_cpu_time_us == pytest.approx(50.0)
    assert a.profiler_overhead_us == pytest.approx(10.0)  # ProfilerStep#2's own 10 us only
    assert a.self_cpu_time_total_us == pytest.approx(100.0)


def test_work_recorded_after_the_window_end_marker_is_cut(tmp_path):
    """A CUDA window whose stop is deferred records a few steps past its end marker: the
    report and the shaped trace keep the recorded steps only. Real events, on the CPU: the
    same profiler window records a warm-up call, three marked steps, the end marker, then
    two calls more."""
    from instrument.analysis.analyze import analyze, drop_warmup, events_from_trace
    from instrument.analysis.kineto_json import STEP_MARKER, WINDOW_END, load_trace, shape_trace
    from instrument.runtime import _torch

    @profiled("tail_mm")
    def tail_mm(a):
        return a @ a

    a = torch.randn(16, 16)
    win = _torch.ProfilerWindow(
        ("cpu",), record_shapes=False, profile_memory=False, with_stack=False, with_flops=False
    )
    win.start()
    tail_mm(a)  # warm-up
    for s in range(3):
        with _torch.FastRange(STEP_MARKER + str(s)):
            pass
        tail_mm(a)
    with _torch.FastRange(WINDOW_END):
        pass
    tail_mm(a)
    tail_mm(a)
    g = torch.randn(16, 16, requires_grad=True)
    (g @ g).sum().backward()  # forward -> backward flow arrows, after the end
    win.stop()
    names = frozenset({"tail_mm"})
    raw = tmp_path / "raw.json"
    win.export_chrome_trace(str(raw))
    everything = analyze_events(load_trace(str(raw))["traceEvents"], names)
    assert everything.ranges["tail_mm"].calls == 6  # the raw trace holds them all
    shaped = shape_trace(load_trace(str(raw)), names, {"rank": 0, "world_size": 1})
    assert analyze(events_from_trace(shaped), names).ranges["tail_mm"].calls == 3
    assert [
        e["name"] for e in shaped["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
    ] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    mms = [e for e in shaped["traceEvents"] if e.get("name") == "aten::mm"]
    assert len(mms) == 3
    raw_events = load_trace(str(raw))["traceEvents"]
    end = next(float(e["ts"]) for e in raw_events if e.get("name") == WINDOW_END)
    assert any(e.get("ph") in ("s", "f") and float(e["ts"]) >= end for e in raw_events)
    assert not [
        e
        for e in shaped["traceEvents"]
        if e.get("ph") in ("s", "f", "t") and float(e.get("ts", 0)) >= end
    ]
    events = win.events()
    if events is not None:  # torch with typed Kineto events (2.13): the in-thread path
        assert analyze(drop_warmup(events), names).ranges["tail_mm"].calls == 3
