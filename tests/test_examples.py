"""Every rung of the ladder (examples/02-06) runs as a real program, at its CPU sizes.

Each example runs in a fresh interpreter from an empty working directory with no ``PROFILED_*``
variable but the ones a test sets, as a user would run it. The 06 test opens the traces in the
tools users open them in: TensorBoard's profiler plugin loads the run directory and Holistic
Trace Analysis loads each window's trace.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from contextlib import contextmanager

import pytest

from tests import _proc
from tests._proc import REPO

EXAMPLES = os.path.join(REPO, "examples")


def run_example(name, cwd, *args, env=None, timeout=300):
    """Run ``examples/<name>`` as a program in ``cwd`` (the framework examples' tests)."""
    return _proc.run(
        os.path.join(EXAMPLES, name), *args, env=_proc.sdk_env(env), cwd=cwd, timeout=timeout
    )


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """The examples whose tests only read what a run left (each its own process from an empty
    directory, as before), run two at a time as the module starts: not 05 nor 07, whose tests
    time the run or load the machine themselves."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:

        def add(key, name, *args, env=None):
            path = os.path.join(EXAMPLES, name)
            ahead.add(key, path, *args, env=_proc.sdk_env(env), timeout=300)

        add("test_02_linear_is_one_addmm_per_call", "02_linear.py")
        add("test_03_mlp_eager_against_compiled_and_the_diff", "03_mlp.py")
        add(
            "test_04_llm_per_layer_table_while_generating",
            "04_llm.py",
            env={"PROFILED_EXPORTERS": "console,trace"},
        )
        blocked = str(tmp_path_factory.mktemp("blocked"))
        os.makedirs(os.path.join(blocked, "transformers"))
        with open(os.path.join(blocked, "transformers", "__init__.py"), "w") as f:
            f.write("raise ImportError('transformers is not installed')\n")
        add(
            "test_04_llm_without_transformers_says_how_to_install_it",
            "04_llm.py",
            env={"PYTHONPATH": os.pathsep.join([blocked, REPO])},
        )
        # a window (warm-up 1 + 3 recorded steps) at steps 0, 8 and 16
        add(
            "test_06_training_loop_windows_open_in_tensorboard_and_hta",
            "06_training_loop.py",
            "--steps",
            "24",
            "--modules",
            env={"PROFILED_EVERY": "8", "PROFILED_EXPORTERS": "console,trace"},
        )
        add(
            "test_06_training_loop_disabled_runs_the_same_loop_with_no_profiler",
            "06_training_loop.py",
            "--steps",
            "6",
            env={"PROFILED_ENABLED": "0"},
        )
        yield ahead


def table_rows(text, header):
    """{first column: whole line} of the section under ``header`` in each console table."""
    sections = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header):
            rows = {}
            for row in lines[i + 1 :]:
                if row.startswith("---"):
                    break
                rows[row.split()[0] if row.split() else ""] = row
            sections.append(rows)
    return sections


def calls(row):
    return int(re.split(r"\s{2,}", row.strip())[1].split()[0])


def test_02_linear_is_one_addmm_per_call(ahead, request):
    out, tmp_path = ahead[request.node.name]  # 02_linear.py
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("linear ") == 2
    ranges = table_rows(out.stderr, "@profiled range")
    ops = table_rows(out.stderr, "top operators by self CPU time")
    assert len(ranges) == len(ops) == 2
    for r, o in zip(ranges, ops):
        assert calls(r["linear"]) == 3
        assert calls(o["aten::addmm"]) == 3  # bias fused into the GEMM: one op per call
        assert "aten::mm" not in o and "aten::add" not in o
    for kernels in table_rows(out.stderr, "top device kernels"):  # on a GPU: one kernel each
        # columns: kind, calls, device, share; at 4096 cuBLAS also clears a workspace (memset,
        # seen on the H200), which is not a compute kernel
        assert (
            sum(int(row.split()[-3]) for row in kernels.values() if row.split()[-4] == "kernel")
            == 3
        )
    assert len(os.listdir(tmp_path / "profiled_traces")) == 2


def test_03_mlp_eager_against_compiled_and_the_diff(ahead, request):
    out, tmp_path = ahead[request.node.name]  # 03_mlp.py
    assert out.returncode == 0, out.stderr + out.stdout
    eager, compiled = table_rows(out.stderr, "top operators by self CPU time")
    assert calls(eager["aten::gelu"]) == 3 and calls(eager["aten::mul"]) == 3
    assert calls(eager["aten::mm"]) == 9  # gate, up, down
    # with_flops: the FLOPs line under each table (three GEMMs of 128x256x1024 per call)
    per_call = re.findall(r"^  mlp: ([\d.]+) MFLOP per call, ", out.stderr, re.M)
    assert [float(v) for v in per_call] == pytest.approx(
        [3 * 2 * 128 * 256 * 1024 / 1e6] * 2, rel=0.01
    )
    for d in ("eager", "compiled"):
        files = os.listdir(tmp_path / "profiled_traces" / "03_mlp" / d)
        assert len(files) == 1 and files[0].endswith(".pt.trace.json.gz")
    diff = out.stdout[out.stdout.index("$ torch-profiled diff") :]
    mlp = next(line for line in diff.splitlines() if line.startswith("mlp "))
    assert mlp.split()[-1] == "3" and mlp.count("ms") + mlp.count("us") >= 3  # both sides
    if "backend='inductor'" in out.stdout:
        # the GELU and the multiply are fused into the compiled graph's kernel
        assert "aten::gelu" not in compiled and "aten::mul" not in compiled
        # Inductor's "## Call CompiledFxGraph <key> ##" marker is an operator, not a range
        rows = [line for r in table_rows(out.stderr, "@profiled range") for line in r.values()]
        assert not any(line.lstrip().startswith("##") for line in rows), rows
        assert any(line.startswith("## Call CompiledFxGraph") for line in compiled.values())
        assert not any(name.startswith("##") for r in table_rows(diff, "range (") for name in r)
        assert re.search(r"^aten::gelu +[\d.]+[mu]?s +- ", diff, flags=re.M)
    else:
        assert "no C++ compiler on the PATH" in out.stdout


def test_04_llm_per_layer_table_while_generating(ahead, request):
    out, tmp_path = ahead[request.node.name]  # 04_llm.py, exporters console and trace
    assert out.returncode == 0, out.stderr
    assert "generated 8 tokens" in out.stdout
    assert "random weights" in out.stdout
    table = out.stdout[out.stdout.index("per layer, decode steps 2-4:") :].splitlines()
    layers = {line.split()[0]: line.split() for line in table[2:4]}
    assert set(layers) == {"model.layers.0", "model.layers.1"}
    for cols in layers.values():
        assert cols[1] == "3"  # three decode steps recorded
        attn, mlp = int(cols[5].rstrip("%")), int(cols[6].rstrip("%"))
        assert 0 < attn < 100 and 0 < mlp < 100 and attn + mlp <= 100
    (ranges,) = table_rows(out.stderr, "@profiled range")
    assert calls(ranges["LlamaForCausalLM"]) == 3 and calls(ranges["model.layers.0"]) == 3
    assert len(os.listdir(tmp_path / "profiled_traces")) == 1


def test_04_llm_without_transformers_says_how_to_install_it(ahead, request):
    # 04_llm.py where importing transformers raises ImportError
    out, tmp_path = ahead[request.node.name]
    assert out.returncode == 1
    assert "needs transformers" in out.stderr
    assert "pip install -c constraints.txt -e '.[llm]'" in out.stderr
    assert "nothing was run" in out.stderr
    assert not (tmp_path / "profiled_traces").exists()


def test_05_inference_otel_without_a_collector_says_so_and_finishes_at_once(tmp_path, monkeypatch):
    """Nothing listens at the OTLP endpoint: one line says so, the spans stay in memory (each
    profiled window still under its request) and the program ends right after its last
    request, instead of retrying the dead address for ~20 s at exit."""
    import time

    from tests.otlp_receiver import closed_endpoint

    for var in list(os.environ):
        if var.startswith("OTEL_"):
            monkeypatch.delenv(var)
    endpoint = closed_endpoint()
    env = _proc.sdk_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, PYTHONUNBUFFERED="1")
    started = time.monotonic()
    proc = _proc.start(os.path.join(EXAMPLES, "05_inference_otel.py"), cwd=tmp_path, env=env)
    lines, first_line, last_request = [], None, None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if first_line is None:
            first_line = time.monotonic()
        if line.startswith("request 11:"):
            last_request = time.monotonic()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, stderr
    exit_s = time.monotonic() - last_request
    # the baseline: the program's own start in this same run (the interpreter, torch and
    # OpenTelemetry imported: 16-28 s on the busy 2-core box, a few seconds when idle)
    startup_s = first_line - started
    assert lines[0] == (
        f"no OTLP collector answers at {endpoint} (Connection refused): spans "
        "and metrics are kept in memory; start one or set "
        "OTEL_EXPORTER_OTLP_ENDPOINT (see this file's header)"
    )
    assert "kept in memory: 42 spans, 3 profiled windows" in lines
    for request in (3, 7, 11):  # one request in four is profiled
        assert (
            f"  profiled.window under request {request}: generate with 8 decode_step spans"
        ) in lines
    assert "retrying" not in stderr and "ExporterWarning" not in stderr, stderr
    # a bound, the point of the item: after the last request only the last window's
    # analysis and the interpreter's exit are left (~2.5 s on an idle 2-core box, 12.7 and
    # 15.8 s on a busy one: a fixed 12 s failed there); retrying the dead endpoint (the OTLP
    # exporters' own retries, sleeps the load does not stretch) added ~20 s. So the bound
    # follows the machine's pace, measured by the program's own start in this run
    assert exit_s < 10 + 2 * startup_s, (exit_s, startup_s, stderr)


TB_LOAD = """
import json, sys
from torch_tb_profiler import io
from torch_tb_profiler.profiler.loader import RunLoader

if __name__ == "__main__":
    run = RunLoader("06_training_loop", sys.argv[1], io.Cache()).load()
    print(json.dumps({w: [[v.name for v in run.get_profile(w, s).views]
                          for s in run.get_spans(w)] for w in run.workers}))
"""


@pytest.mark.filterwarnings("ignore:The inplace keyword")  # HTA 0.5 on pandas 3
def test_06_training_loop_windows_open_in_tensorboard_and_hta(ahead, request):
    # a window (warm-up 1 + 3 recorded steps) at steps 0, 8 and 16
    out, tmp_path = ahead[request.node.name]
    assert out.returncode == 0, out.stderr
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", out.stdout).groups())
    assert last < first  # it really trains
    ranges = table_rows(out.stderr, "@profiled range")
    assert len(ranges) == 3
    for r in ranges:
        for name in (
            "train_step",
            "forward",
            "backward",
            "optimizer",
            "model.blocks.1",
            "model.head",
        ):
            assert calls(r[name]) == 3, name
    run_dir = tmp_path / "runs" / "06_training_loop"
    files = sorted(os.listdir(run_dir))
    assert len(files) == 3 and all(f.endswith(".pt.trace.json.gz") for f in files)

    script = tmp_path / "tb_load.py"
    script.write_text(TB_LOAD)
    tb = _proc.run(str(script), str(run_dir))
    assert tb.returncode == 0, tb.stderr
    ((worker, spans),) = json.loads(tb.stdout.strip().splitlines()[-1]).items()
    assert worker.endswith("_rank0") and len(spans) == 3
    assert all({"overall", "operator", "trace"} <= set(views) for views in spans)

    from hta.trace_analysis import TraceAnalysis

    for path, steps in zip(files, ([1, 2, 3], [9, 10, 11], [17, 18, 19])):
        one = tmp_path / "hta" / path.split(".")[1]
        one.mkdir(parents=True)
        shutil.copy(run_dir / path, one)
        hta = TraceAnalysis(trace_dir=str(one), include_last_profiler_step=True)
        assert hta.t.get_ranks() == [0]
        assert [int(i) for i in hta.t.get_iterations()] == steps
        df = hta.t.get_trace(0)
        names = set(hta.t.symbol_table.get_sym_table()[i] for i in df["name"].unique())
        assert {"train_step", "forward", "model.blocks.0"} <= names
        raw = json.loads(gzip.open(run_dir / path, "rt").read())
        assert all(
            e.get("cat") == "user_annotation"
            for e in raw["traceEvents"]
            if e.get("name") == "train_step"
        )


def test_06_training_loop_disabled_runs_the_same_loop_with_no_profiler(ahead, request):
    out, tmp_path = ahead[request.node.name]  # PROFILED_ENABLED=0, six steps
    assert out.returncode == 0, out.stderr
    assert "loss " in out.stdout and "@profiled range" not in out.stderr
    assert not (tmp_path / "runs").exists()


@contextmanager
def busy_two_cores():
    """A busy 2-core machine wherever the test runs: two processes that only spin, pinned
    (where the OS allows) to the first two CPUs this process may use; yields those CPUs, for
    the program under test to be pinned to as well. Both are killed at the end."""
    pin = hasattr(os, "sched_setaffinity")
    cpus = sorted(os.sched_getaffinity(0))[:2] if pin else []
    spinners = []
    try:
        for _ in range(2):
            spinner = _proc.start(
                "-c", "while True: pass", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            spinners.append(spinner)
            if pin:
                os.sched_setaffinity(spinner.pid, cpus)
        yield cpus
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.timeout(900)  # beside two spinners: ~1-2 min; the example's own limit is 600 s
def test_07_service_metrics_counts_every_request_and_profiles_the_slow_one(tmp_path):
    """Run beside two busy processes on two cores: the slow request's window must open on a
    busy machine (with two OpenMP threads and slow_step=100 it opened in 0 of 3 runs on the
    busy 2-core box: requests' median 68-119 ms, up to 0.9 s, against a fixed 2 s wait; the
    wait is now twice what the factor needs at the pace the requests ran)."""
    env = _proc.sdk_env(
        {
            "PROFILED_JSON_PATH": str(tmp_path / "m.jsonl"),
            "PROFILED_PROMETHEUS_ADDR": "127.0.0.1:0",  # any free port: printed
        }
    )
    with busy_two_cores() as cpus:
        proc = _proc.start(os.path.join(EXAMPLES, "07_service_metrics.py"), env=env, cwd=tmp_path)
        if cpus:
            os.sched_setaffinity(proc.pid, cpus)
        try:
            stdout, stderr = proc.communicate(timeout=600)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "metrics on http://127.0.0.1:" in stdout
    # a real scrape of its /metrics while it served: every request counted
    assert 'scraped: profiled_range_duration_seconds_count{range="generate"' in stdout, stdout
    assert stdout.split("scraped: ")[1].split("\n")[0].endswith("} 300"), stdout
    # no scheduled window; the slow request opened one, and its report says so (else the
    # requests' p50 and p99, printed at the end, say how far off the factor was)
    assert re.search(r"request 200 waited \d+\.\d s on a cold cache", stdout), stdout
    assert "window 0: step 200 took " in stdout, stdout
    assert re.search(r"\(slow_step=(30|100)\)", stdout), stdout  # the CPU's, a GPU's factor
    assert "window 1:" not in stdout  # one window: at most one per 10 s
    assert "opened by slow_step: step 200 took" in stderr  # the console table's line
    for name in ("generate", "request", "tokenize"):
        assert f"{name}: 300 calls, p50 " in stdout
