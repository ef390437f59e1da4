"""The report is the contract (issue 16, item 4): exporters import neither torch nor
``instrument``'s internals, and need no trace parsed for them.

- In a process where ``import torch`` fails, every module of ``exporters`` imports, and a
  hand-built ``WindowReport`` (occurrences included) goes through the console, JSON-lines,
  trace-file, memory, OTel and HTML exporters. ``instrument`` there is what the analysis helper
  process has: the package face (lazy: it loads no torch) and the torch-free base.
- No module of ``exporters`` imports anything of ``instrument`` but its base,
  ``instrument.base`` (checked on the source, so a lazy import inside a function counts too).
"""

from __future__ import annotations

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORTERS = os.path.join(REPO, "exporters")

ALLOWED = {"instrument.base"} | {
    "instrument.base." + name[: -len(".py")]
    for name in os.listdir(os.path.join(REPO, "instrument", "base"))
    if name.endswith(".py")
}
# exporters/otel.py reads PROFILED_OTEL_DETAIL / _MAX_SPANS through instrument.runtime.config
# until the configuration refactor (issue 16) moves that reading to exporters/otel_settings.py
PENDING = {("otel.py", "instrument.runtime.config")}

WITHOUT_TORCH = r"""
import importlib, importlib.abc, io, json, os, pkgutil, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"no torch in this process ({name})")
        return None

sys.meta_path.insert(0, NoTorch())
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("torch was importable")

# 1. every module of exporters imports, and brings nothing of instrument but its base beyond
# what the package face loads (the trigger's handler and the settings it reads)
import instrument
face = {m for m in sys.modules if m.split(".")[0] == "instrument"}
import exporters
names = sorted(m.name for m in pkgutil.iter_modules(exporters.__path__))
for name in names:
    importlib.import_module("exporters." + name)
more = {m for m in sys.modules if m.split(".")[0] == "instrument"} - face
assert all(m.startswith("instrument.base.") for m in more), sorted(more)
print("imported", ",".join(names))

# 2. a report built by hand
from instrument.base.report import (FrozenMap, KernelCall, Occurrence, OccurrenceBudget,
                               Occurrences, RangeCalls, RangeStats, Verdict, WindowReport)
from exporters import (ConsoleExporter, ExportResult, InMemoryExporter, JsonLinesExporter,
                       TraceFileExporter)
from exporters.html import HtmlExporter
from exporters.otel import OTelExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

base = 1_765_000_000_000_000_000
raw = os.path.join(os.getcwd(), "raw.pt.trace.json")
with open(raw, "w") as f:
    json.dump({"baseTimeNanoseconds": base, "traceEvents": []}, f)
budget = OccurrenceBudget(max_spans=100, detail="ranges")
compute = Verdict("compute-bound", "device busy 90%")
occurrences = Occurrences(
    budget=budget,
    items=(
        Occurrence("range", "step", base + 1_000, base + 9_000, -1, 0, thread_id=7,
                   cpu_time_us=8.0),
        Occurrence("range", "matmul", base + 2_000, base + 5_000, 0, 1, thread_id=7,
                   cpu_time_us=3.0, device_time_us=2.5, device_busy_us=2.5,
                   kernel_launches=1, verdict=compute,
                   top_kernels=(KernelCall("gemm", "kernel", 1, 2.5, base + 2_500),)),
    ),
    range_count=2, first_ns=base + 1_000, last_ns=base + 9_000,
    calls=FrozenMap({"step": RangeCalls((8_000,), (2_500,)),
                     "matmul": RangeCalls((3_000,), (2_500,))}),
)
report = WindowReport(
    window=0, steps=(3,), partial=False, start_ns=base, end_ns=base + 10_000, rank=0,
    world_size=1, host="h", pid=1, device="NVIDIA H200", activities=("cpu", "cuda"),
    ranges=FrozenMap({
        "step": RangeStats("step", 1, 8.0, 5.0, 2.5, 1, 2.5, 8.0, verdict=compute),
        "matmul": RangeStats("matmul", 1, 3.0, 0.5, 2.5, 1, 2.5, 3.0, verdict=compute)}),
    self_cpu_time_total_us=8.0, self_device_time_total_us=2.5, device_busy_us=2.5,
    verdict=compute, event_count=4, raw_trace_path=raw, occurrences=occurrences,
)

spans = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
reader = InMemoryMetricReader()
text = io.StringIO()
memory = InMemoryExporter()
otel = OTelExporter(tracer_provider=tracer_provider,
                    meter_provider=MeterProvider(metric_readers=[reader]),
                    detail="ranges", max_spans=100)
assert otel.occurrence_budget == budget
trace = TraceFileExporter(os.path.join(os.getcwd(), "traces"))
page = HtmlExporter(os.path.join(os.getcwd(), "pages"))
for exporter in (ConsoleExporter(stream=text), JsonLinesExporter("reports.jsonl"), trace,
                 memory, otel, page):
    result = exporter.export(report)
    assert result is ExportResult.SUCCESS, (type(exporter).__name__, result)
    exporter.shutdown()

assert "matmul" in text.getvalue()
assert json.loads(open("reports.jsonl").readline())["ranges"]["matmul"]["calls"] == 1
assert trace.last_path and os.path.exists(trace.last_path)
assert page.last_file and "matmul" in open(page.last_file).read()
assert memory.reports == [report]
by_name = {s.name: s for s in spans.get_finished_spans()}
assert sorted(by_name) == ["matmul", "profiled.window", "step"], sorted(by_name)
assert by_name["matmul"].parent.span_id == by_name["step"].context.span_id
assert by_name["matmul"].start_time == base + 2_000
assert by_name["matmul"].attributes["profiled.verdict"] == "compute-bound"
assert [e.attributes["profiled.kernel.name"] for e in by_name["matmul"].events] == ["gemm"]
metrics = {m.name for rm in reader.get_metrics_data().resource_metrics
           for sm in rm.scope_metrics for m in sm.metrics}
assert {"profiled.range.cpu_time", "profiled.range.device_time"} <= metrics
assert "torch" not in sys.modules
print("exported without torch")
"""


def test_every_exporter_imports_and_exports_where_torch_cannot_be_imported(run_python):
    out = run_python(WITHOUT_TORCH)
    assert out.returncode == 0, out.stdout + out.stderr
    imported = out.stdout.split("imported ", 1)[1].split()[0].split(",")
    assert {"console", "json_lines", "memory", "otel", "trace_file"} <= set(imported)
    assert "exported without torch" in out.stdout


def _instrument_imports(path: str) -> set[str]:
    """The ``instrument`` modules a source file imports, at any level (``from instrument
    import x`` names ``instrument.x`` where x is a module, else ``instrument`` itself)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "instrument")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "instrument":
                found.update(
                    f"instrument.{a.name}"
                    if os.path.exists(os.path.join(REPO, "instrument", a.name + ".py"))
                    or os.path.isdir(os.path.join(REPO, "instrument", a.name))
                    else "instrument"
                    for a in node.names
                )
            elif node.module.split(".")[0] == "instrument":
                found.add(node.module)
    return found


def _torch_imports(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {n for n in names if n.split(".")[0] == "torch"}


MODULES = sorted(name for name in os.listdir(EXPORTERS) if name.endswith(".py"))


@pytest.mark.parametrize("module", MODULES)
def test_exporters_import_only_the_base_of_instrument_and_never_torch(module):
    path = os.path.join(EXPORTERS, module)
    extra = {name for name in _instrument_imports(path) - ALLOWED if (module, name) not in PENDING}
    assert not extra, f"exporters/{module} imports {sorted(extra)} of instrument"
    assert not _torch_imports(path), f"exporters/{module} imports torch"


def test_the_import_check_sees_lazy_and_aliased_imports(tmp_path):
    source = tmp_path / "bad.py"
    source.write_text(
        "def f():\n    from instrument.analysis.kineto_json import load_trace\n"
        "    import instrument.analysis.occurrences as occ\n"
        "    from instrument import analysis, profiled\n"
    )
    assert _instrument_imports(str(source)) == {
        "instrument.analysis.kineto_json",
        "instrument.analysis.occurrences",
        "instrument.analysis",
        "instrument",
    }
