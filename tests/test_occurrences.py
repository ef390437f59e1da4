"""Per-call occurrences made by the analysis and carried in the report (issue 16, item 4):
their times, nesting and device work, the span budget they are fitted to, fitting them again
to a smaller budget, and the two ways the analysis gets its events agreeing on them."""

from __future__ import annotations

import pickle
import random

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from exporters import InMemoryExporter
from exporters.otel import OTelExporter
from instrument import Schedule, profiled, session
from instrument.analysis.analyze import analyze, drop_warmup, events_from_trace
from instrument.base.report import DETAILS, Occurrence, OccurrenceBudget
from instrument.base.spans import FOLDED, fit, plan_spans

BASE = 1_765_000_000_000_000_000  # the trace's baseTimeNanoseconds


@profiled("outer")
def outer(x):
    return inner(x) + inner(x)


@profiled("inner")
def inner(x):
    return x @ x


def _sdk_exporter(**kwargs):
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return OTelExporter(tracer_provider=provider, meter_provider=meters, **kwargs), spans


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


def _occurrences(events, budget, names=()):
    trace = {"baseTimeNanoseconds": BASE, "traceEvents": events}
    return analyze(events_from_trace(trace), names, occurrences=budget, base_ns=BASE).occurrences


def test_occurrences_carry_epoch_times_nesting_threads_and_the_device_work_inside():
    events = [
        E("step", 0, 100, cat="user_annotation", external=1),
        E("matmul", 10, 40, cat="user_annotation", external=2),
        E("aten::mm", 12, 30, external=3),
        E("cudaLaunchKernel", 14, 5, cat="cuda_runtime", external=3, correlation=7),
        E("cudaLaunchKernel", 20, 5, cat="cuda_runtime", external=3, correlation=8),
        E("gemm", 1000, 40, cat="kernel", tid=7, external=3, correlation=7),
        E("gemm", 1050, 20, cat="kernel", tid=7, external=3, correlation=8),
        E("matmul", 60, 10, cat="user_annotation", external=4),
        E("other_thread", 5, 10, cat="user_annotation", tid=2, external=5),
    ]
    occ = _occurrences(events, OccurrenceBudget(max_spans=100))
    assert occ.range_count == 4 and occ.folded_occurrences == 0 and occ.dropped == 0
    by = {(o.name, o.start_ns): o for o in occ.items}
    step = by[("step", BASE)]
    first = by[("matmul", BASE + 10_000)]
    assert (step.end_ns, step.parent, step.depth, step.thread_id) == (BASE + 100_000, -1, 0, 1)
    assert occ.items[first.parent] is step and first.depth == 1
    assert first.device_time_us == pytest.approx(60.0) and first.kernel_launches == 2
    assert first.device_busy_us == pytest.approx(60.0)
    (gemm,) = first.top_kernels
    assert (gemm.name, gemm.kind, gemm.calls, gemm.first_ns) == (
        "gemm",
        "kernel",
        2,
        BASE + 1_000_000,
    )
    assert first.verdict is not None and first.verdict.kind != "cpu-only"
    assert step.device_time_us == pytest.approx(60.0)  # device work counts for every range open
    assert by[("other_thread", BASE + 5_000)].thread_id == 2
    assert (occ.first_ns, occ.last_ns) == (BASE, BASE + 100_000)
    assert occ.calls["matmul"].cpu_ns == (40_000, 10_000)
    assert occ.calls["matmul"].device_ns == (60_000, 0)
    assert pickle.loads(pickle.dumps(occ)) == occ  # it crosses from the helper process


def test_no_budget_no_occurrences_and_to_dict_leaves_them_out():
    trace = {"traceEvents": [E("step", 0, 100, cat="user_annotation")]}
    assert analyze(events_from_trace(trace), ()).occurrences is None
    mem = InMemoryExporter()
    exporter, _spans = _sdk_exporter()
    with session(exporters=[exporter, mem], schedule=Schedule(wait=0, warmup=1, active=1)) as s:
        for _ in range(2):
            outer(torch.ones(2, 2))
            s.step()
    (report,) = mem.reports
    assert report.occurrences is not None  # the otel exporter asked for them
    assert (
        report.occurrences.range_count == 3
        and report.occurrences.budget == exporter.occurrence_budget
    )
    assert "occurrences" not in report.to_dict()


def test_the_budget_folds_the_most_frequent_names_and_counts_every_call():
    events = [E("a", 10 * i, 5, cat="user_annotation") for i in range(30)]
    events += [E("b", 1000 + 10 * i, 5, cat="user_annotation") for i in range(3)]
    occ = _occurrences(events, OccurrenceBudget(max_spans=5))
    assert [o.kind for o in occ.items] == [FOLDED, "range", "range", "range"]
    folded = occ.items[0]
    assert (folded.name, folded.calls, folded.start_ns, folded.end_ns) == (
        "a",
        30,
        BASE,
        BASE + 295_000,
    )
    assert folded.cpu_time_us == pytest.approx(150.0)
    assert occ.folded_ranges == ("a",) and occ.folded_occurrences == 30
    assert len(occ.calls["a"].cpu_ns) == 30  # per-call histograms see every call


def _random_nodes(rng: random.Random, n: int) -> list[Occurrence]:
    nodes: list[Occurrence] = []
    for i in range(n):
        parent = rng.randrange(-1, i) if i and rng.random() < 0.7 else -1
        kind = (
            "range"
            if parent < 0 or rng.random() < 0.4
            else rng.choice(["op", "kernel"] if nodes[parent].kind != "kernel" else ["op"])
        )
        depth = nodes[parent].depth + 1 if parent >= 0 else 0
        nodes.append(
            Occurrence(
                kind,
                f"r{rng.randrange(8)}" if kind == "range" else kind,
                i,
                i + 1,
                parent,
                depth,
                cpu_time_us=rng.random(),
            )
        )
    return nodes


@pytest.mark.parametrize("seed", range(30))
def test_fitting_again_to_a_smaller_budget_stays_in_it_and_keeps_parents(seed):
    """What an exporter with a smaller budget than the session's widest does."""
    from instrument.base.report import Occurrences
    from instrument.base.spans import assemble

    rng = random.Random(seed)
    nodes = _random_nodes(rng, rng.randrange(0, 200))
    wide = OccurrenceBudget(max_spans=rng.choice([20, 80, 400]), detail="kernels")
    plan = plan_spans(nodes, wide.max_spans)
    ranges = sum(n.kind == "range" for n in nodes)
    occ = Occurrences(
        budget=wide,
        items=assemble(
            nodes,
            plan,
            lambda n, p: Occurrence(
                n.kind, n.name, n.start_ns, n.end_ns, p, n.depth, cpu_time_us=n.cpu_time_us
            ),
        ),
        range_count=ranges,
        folded_occurrences=plan.folded_occurrences,
        dropped=plan.dropped,
    )
    small = OccurrenceBudget(max_spans=rng.choice([1, 2, 5, 13]), detail=rng.choice(DETAILS))
    for fitted in (occ, fit(occ, small)):
        budget = fitted.budget
        assert 1 + len(fitted.items) <= budget.max_spans
        level = DETAILS.index(budget.detail)
        for i, o in enumerate(fitted.items):
            assert o.parent < i  # parents first
            if o.kind not in ("range", FOLDED):
                assert o.parent >= 0 and fitted.items[o.parent].kind != FOLDED
                assert {"op": 1}.get(o.kind, 2) <= level
        kept_ranges = sum(o.kind == "range" for o in fitted.items)
        folded_names = [o.name for o in fitted.items if o.kind == FOLDED]
        assert len(folded_names) == len(set(folded_names))
        assert sum(o.calls for o in fitted.items if o.kind == FOLDED) == fitted.folded_occurrences
        assert kept_ranges + fitted.folded_occurrences <= ranges
    assert fit(occ, wide) is occ


def test_two_otel_exporters_in_one_session_get_their_own_budget():
    narrow, narrow_spans = _sdk_exporter(max_spans=4)
    wide, wide_spans = _sdk_exporter(max_spans=1000, detail="ops")
    with session(exporters=[narrow, wide], schedule=Schedule(wait=0, warmup=1, active=1)) as s:
        s.step()
        for _ in range(5):
            outer(torch.ones(4, 4))  # 5 outer + 10 inner
        s.step()
    narrow_finished = narrow_spans.get_finished_spans()
    wide_finished = wide_spans.get_finished_spans()
    assert len(narrow_finished) <= 4
    assert {sp.attributes["profiled.kind"] for sp in narrow_finished} <= {
        "window",
        "range",
        "range.folded",
    }
    kinds = [sp.attributes["profiled.kind"] for sp in wide_finished]
    assert kinds.count("range") == 15 and "op" in kinds
    (window,) = [sp for sp in narrow_finished if sp.name == "profiled.window"]
    assert window.attributes["profiled.otel.max_spans"] == 4
    assert window.attributes["profiled.window.range_occurrences"] == 15


def test_kinetos_events_and_the_trace_json_give_the_same_occurrences(tmp_path):
    """The session analyzes Kineto's events in this process (``PROFILED_ANALYSIS_PROCESS=0``)
    or the exported trace in the helper: their occurrences (epoch times) agree."""
    from instrument import configure
    from instrument.runtime import _torch

    configure(enabled=False)  # no ambient session: this test runs its own window
    window = _torch.ProfilerWindow(
        ("cpu",), record_shapes=False, profile_memory=False, with_stack=False, with_flops=False
    )
    window.start()
    for _ in range(5):
        outer(torch.ones(8, 8))
    window.stop()
    budget = OccurrenceBudget(max_spans=1000, detail="ops")
    names = {"outer", "inner"}
    kineto = analyze(drop_warmup(window.events()), names, occurrences=budget).occurrences
    path = str(tmp_path / "w.json")
    window.export_chrome_trace(path)
    from instrument.analysis.kineto_json import load_trace

    trace = load_trace(path)
    traced = analyze(
        events_from_trace(trace),
        names,
        occurrences=budget,
        base_ns=int(trace["baseTimeNanoseconds"]),
    ).occurrences

    def shape(occ):
        return [(o.kind, o.name, o.start_ns, o.end_ns, o.parent, o.depth) for o in occ.items]

    assert shape(kineto) == shape(traced)
    assert [o.name for o in kineto.items if o.kind == "range"].count("inner") == 10
