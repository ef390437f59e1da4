"""Sessions, steps and windows, driven through real torch.profiler windows."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import warnings

import pytest
import torch

import instrument
from exporters import Exporter, ExportResult, InMemoryExporter
from instrument import Schedule, configure, profiled, session, shutdown, step
from instrument.testing import capture, process_status
from tests import _proc

X = torch.randn(32, 32)


@profiled("work")
def work() -> torch.Tensor:
    return X @ X


@profiled("train_step", step=True)
def train_step() -> torch.Tensor:
    return work() + 1


def test_default_schedule_records_steps_1_to_3_once():
    mem = InMemoryExporter()
    configure(exporters=[mem])
    for _ in range(10):
        work()
    instrument.flush()  # reports are built and exported in the background
    reports = mem.reports
    assert len(reports) == 1
    report = reports[0]
    assert report.steps == (1, 2, 3)
    assert report.partial is False
    assert report.ranges["work"].calls == 3
    # the schedule is over: decorated calls are idle again
    assert process_status().calls_idle is True


def test_repeat_gives_one_report_per_window_and_wait_steps_are_not_recorded():
    with capture(schedule=Schedule(wait=2, warmup=1, active=2, repeat=2)) as cap:
        for _ in range(12):
            work()
            cap.step()
    reports = cap.reports
    assert [r.steps for r in reports] == [(3, 4), (8, 9)]
    assert [r.window for r in reports] == [0, 1]
    assert all(r.ranges["work"].calls == 2 for r in reports)


def test_repeat_zero_is_unlimited_and_skip_first_is_honoured():
    with capture(schedule=Schedule(wait=0, warmup=1, active=1, repeat=0, skip_first=3)) as cap:
        for _ in range(11):
            work()
            cap.step()
    assert [r.steps for r in cap.reports] == [(4,), (6,), (8,), (10,)]


def test_step_function_declares_steps_root_calls_no_longer_count():
    # the ambient session, where root calls would end steps if the program had no step function
    mem = InMemoryExporter()
    configure(exporters=[mem], schedule=Schedule(wait=0, warmup=1, active=2))
    for _ in range(4):
        train_step()
        work()  # a root call, but the program has a step function: not a step
        work()
    instrument.flush()
    (report,) = mem.reports
    assert report.steps == (1, 2)
    assert report.ranges["train_step"].calls == 2
    # 2 nested in train_step + 2 roots per recorded step
    assert report.ranges["work"].calls == 6


def test_root_calls_end_steps_until_step_is_first_called():
    # only in the ambient session of a program with no step function (an explicit session
    # steps by step() alone)
    mem = InMemoryExporter()
    configure(exporters=[mem], schedule=Schedule(wait=0, warmup=1, active=2))
    work()  # ends step 0
    work()  # ends step 1 (recorded)
    with profiled("outer"):
        step()  # inside a decorated block: ends step 2 (recorded) and declares steps
    work()
    work()
    instrument.flush()
    (report,) = mem.reports
    assert report.steps == (1, 2)
    assert report.ranges["work"].calls == 1  # no root call ends a step any more
    assert report.ranges["outer"].calls == 1


@pytest.mark.parametrize("where", ["end", "start"])
def test_a_prof_step_style_loop_records_every_active_step(where):
    """``train_step(x); step()`` (torch's ``prof.step()`` at each iteration's end), or
    ``step()`` at each iteration's start but the first: the first root call's return ends step
    0 (root calls end steps until step() is called), and the first step() right after it is
    that same boundary, not an empty step 1 (the default window recorded 2 steps of 3)."""
    mem = InMemoryExporter()
    configure(exporters=[mem], activities=["cpu"])  # default schedule: warm-up 0, records 1-3
    for i in range(8):
        if where == "start" and i:
            step()
        work()
        if where == "end":
            step()
    instrument.flush()
    (report,) = mem.reports
    assert report.steps == (1, 2, 3)
    assert report.ranges["work"].calls == 3


def test_a_data_block_before_the_first_step_function_return_ends_no_step():
    """The README's loop in the ambient session: ``step=True`` declares steps when it is
    applied, so the ``data`` block (a root call) before the step function first returns does
    not end step 0; the first train step is the warm-up and the window records warm ones."""
    mem = InMemoryExporter()
    configure(exporters=[mem], activities=["cpu"])  # default schedule: warm-up 0, records 1-3
    assert Schedule() == Schedule(wait=0, warmup=1, active=3, repeat=1, skip_first=0)

    @profiled("train_step", step=True)
    def readme_train_step(batch: torch.Tensor) -> torch.Tensor:
        recording.append(torch.autograd.profiler._is_profiler_enabled)
        return work() + batch

    recording: list[bool] = []
    for _ in range(6):
        with profiled("data"):
            batch = X + 1
        readme_train_step(batch)
    instrument.flush()
    (report,) = mem.reports
    assert report.steps == (1, 2, 3)
    # one data block and one train step per step; the first (cold) train step is not recorded
    assert report.ranges["data"].calls == 3
    assert report.ranges["train_step"].calls == 3
    assert report.ranges["work"].calls == 3
    assert recording == [False, True, True, True, False, False]


def test_root_calls_in_an_explicit_session_end_no_step():
    """``with session() as s``: each s.step() ends one step, as with torch.profiler's
    ``prof.step()``; the decorated call before it (a root call) ends none of its own."""
    mem = InMemoryExporter()
    with session(schedule=Schedule(warmup=1, active=2), exporters=[mem], activities=["cpu"]) as s:
        for _ in range(3):
            work()
            s.step()
    (report,) = mem.reports
    assert report.steps == (1, 2)
    assert report.partial is False
    assert report.ranges["work"].calls == 2


def test_explicit_step_calls_define_steps():
    with capture(schedule=Schedule(wait=0, warmup=1, active=2)) as cap:
        for _ in range(5):
            cap.session.step()
            work()
            work()
    (report,) = cap.reports
    assert report.steps == (1, 2)
    assert report.ranges["work"].calls == 4


def test_module_level_step_function_reaches_the_current_session():
    mem = InMemoryExporter()
    configure(exporters=[mem], schedule=Schedule(wait=0, warmup=1, active=1))
    step()  # creates the ambient session, declares steps, ends step 0 (warm-up)
    work()
    work()
    step()  # ends step 1, the recorded one
    instrument.flush()
    (report,) = mem.reports
    assert report.steps == (1,)
    assert report.ranges["work"].calls == 2


def test_session_exit_exports_partial_window():
    with capture(schedule=Schedule(wait=0, warmup=1, active=5)) as cap:
        for _ in range(3):
            work()
            cap.step()
    (report,) = cap.reports
    assert report.partial is True
    assert report.steps == (1, 2)


def test_shutdown_exports_partial_ambient_window_then_stays_idle():
    mem = InMemoryExporter()
    configure(exporters=[mem], schedule=Schedule(wait=0, warmup=1, active=10))
    for _ in range(3):
        work()
    assert mem.reports == []
    shutdown()
    (report,) = mem.reports
    assert report.partial and report.steps == (1, 2)
    assert mem.is_shutdown
    work()
    assert not torch.autograd.profiler._is_profiler_enabled
    assert len(mem.reports) == 1


def test_no_steps_recorded_gives_one_line_why():
    with capture(schedule=Schedule(wait=0, warmup=1, active=3)) as cap:
        work()
        cap.step()  # step 0 is the warm-up step: nothing recorded
    assert cap.reports == []
    (line,) = cap.exporter.notices
    assert "no table" in line and "schedule" in line and "at least 2 steps" in line


def test_report_identity_fields():
    before = time.time_ns()
    with capture(schedule=Schedule(wait=0, warmup=1, active=2)) as cap:
        for _ in range(3):
            work()
            cap.step()
    after = time.time_ns()
    (r,) = cap.reports
    assert before <= r.start_ns < r.end_ns <= after
    assert (r.rank, r.world_size) == (0, 1)
    assert r.host == socket.gethostname()
    assert r.pid == os.getpid()
    # the GPU's name only where this process used CUDA (work() runs on the CPU; asking the
    # name would initialize CUDA)
    gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    assert r.device == (torch.cuda.get_device_name() if gpu else "cpu")
    assert r.activities[0] == "cpu"
    assert r.raw_trace_path is not None and not os.path.exists(r.raw_trace_path)


def test_rank_and_world_size_from_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with capture(schedule=Schedule(wait=0, warmup=1, active=1)) as cap:
        work()
        cap.step()
        work()
        cap.step()
    (r,) = cap.reports
    assert (r.rank, r.world_size) == (3, 8)


def test_report_numbers_are_consistent_and_exclude_bookkeeping():
    # CPU only: on a GPU the window's own device synchronisation is CPU time outside the ranges
    with capture(schedule=Schedule(wait=0, warmup=1, active=3), activities=["cpu"]) as cap:
        for _ in range(4):
            train_step()
    (r,) = cap.reports
    outer, inner = r.ranges["train_step"], r.ranges["work"]
    assert outer.calls == inner.calls == 3
    assert outer.cpu_time_us > inner.cpu_time_us > 0
    assert 0 <= outer.self_cpu_time_us < outer.cpu_time_us
    assert inner.device_time_us == 0.0 and inner.kernel_launches == 0
    op_names = [op.name for op in r.top_ops]
    assert "aten::mm" in op_names
    assert not any(n.startswith(("ProfilerStep", "profiled::")) for n in op_names)
    # the self times of everything recorded add up to the total; steps are not user time
    total_self = sum(x.self_cpu_time_us for x in r.ranges.values()) + sum(
        op.self_cpu_time_us for op in r.top_ops
    )
    assert total_self == pytest.approx(r.self_cpu_time_total_us, rel=1e-6)
    assert r.self_cpu_time_total_us <= outer.cpu_time_us + 1e-6


def test_sessions_do_not_nest():
    with session(exporters=[InMemoryExporter()]):
        with pytest.raises(RuntimeError, match="already open"):
            with session(exporters=[InMemoryExporter()]):
                pass


def test_session_rejects_bad_fields_at_once():
    with pytest.raises(TypeError, match="bogus"):
        session(bogus=1)
    with pytest.raises(ValueError, match="nope"):
        session(exporters=["nope"])
    with pytest.raises(TypeError, match="schedule"):
        session(schedule="wait=1")
    with pytest.raises(ValueError, match="active"):
        Schedule(active=0)


def test_explicit_session_takes_over_from_ambient_and_ambient_resumes():
    amb = InMemoryExporter()
    # CPU activity: the profiler starts at the first recorded step (with CUDA it starts at
    # the warm-up step, and a short window's stop waits for the device; tests/test_cuda.py)
    configure(
        exporters=[amb], schedule=Schedule(wait=0, warmup=1, active=2, repeat=0), activities=["cpu"]
    )
    work()  # ambient: step 0 (warm-up) ends; the window starts at step 1's first call
    assert not torch.autograd.profiler._is_profiler_enabled
    work()  # step 1 recorded; step 2 is the window's last
    assert torch.autograd.profiler._is_profiler_enabled
    with capture(schedule=Schedule(wait=0, warmup=1, active=1)) as cap:
        work()
        cap.step()
        work()
        cap.step()
    assert [r.steps for r in cap.reports] == [(1,)]
    instrument.flush()
    # the explicit session ended the ambient window: what it recorded is exported, as partial
    assert [(r.steps, r.partial) for r in amb.reports] == [((1,), True)]
    for _ in range(6):
        work()
    instrument.flush()
    assert len(amb.reports) >= 2


def test_user_profiler_running_means_no_window_and_a_reason():
    with capture(schedule=Schedule(wait=1, warmup=1, active=1)) as cap:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                work()
                cap.step()
        assert torch.autograd.profiler._is_profiler_enabled is False
    assert cap.reports == []
    assert "your own torch.profiler" in cap.exporter.notices[0]
    names = [e.name for e in prof.events()]
    assert names.count("work") == 5


class _Raising(Exporter):
    def export(self, report):
        raise RuntimeError("backend down")


class _Failing(Exporter):
    def export(self, report):
        return ExportResult.FAILURE


def test_raising_exporter_costs_a_warning_not_the_program():
    mem = InMemoryExporter()
    with pytest.warns(UserWarning, match="backend down"):
        with capture(
            exporters=[_Raising(), _Failing()], schedule=Schedule(wait=0, warmup=1, active=1)
        ) as cap:
            result = []
            for _ in range(3):
                result.append(work())
                cap.step()
    assert len(result) == 3
    assert len(cap.reports) == 1
    del mem


def test_disabled_session_starts_no_profiler(monkeypatch):
    monkeypatch.setenv("PROFILED_ENABLED", "0")
    mem = InMemoryExporter()
    with session(exporters=[mem], schedule=Schedule(wait=0, warmup=0, active=1)) as s:
        on = []
        for _ in range(3):
            work()
            on.append(torch.autograd.profiler._is_profiler_enabled)
            s.step()
    assert on == [False, False, False]
    assert mem.reports == []


def test_activities_validation():
    with pytest.raises(ValueError, match="activity"):
        session(activities=["gpu"])
    with capture(activities=["cpu"], schedule=Schedule(wait=0, warmup=1, active=1)) as cap:
        work()
        cap.step()
        work()
        cap.step()
    assert cap.reports[0].activities == ("cpu",)


# ---------------------------------------------------------------- real processes


PARTIAL_AT_EXIT = """
import torch
from instrument import profiled

@profiled("mm")
def mm(x):
    return x @ x

x = torch.randn(16, 16)
for _ in range(3):
    mm(x)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """The programs of the tests below (each its own process, as before), run two at a time as
    the first of them starts; a test reads its own, from its directory."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:

        def add(key, code, **env):
            ahead.add(key, "-c", code, env=_proc.sdk_env(env))

        add(
            "test_interpreter_exit_exports_partial_window",
            PARTIAL_AT_EXIT,
            PROFILED_SCHEDULE="warmup=1,active=10",
            PROFILED_EXPORTERS="console,trace",
            PROFILED_TRACE_DIR="tr",
            PROFILED_TRACE_GZIP="0",
        )
        add("test_program_too_short_prints_why", TOO_SHORT, PROFILED_EXPORTERS="console")
        add(
            "test_environment_drives_the_ambient_session",
            TWELVE_MM,
            PROFILED_SCHEDULE="wait=1,warmup=1,active=2,repeat=2",
            PROFILED_EXPORTERS="trace",
            PROFILED_TRACE_DIR="tr",
            PROFILED_TRACE_KEEP="1",
        )
        key = "test_bad_environment_warns_once_and_program_runs"
        add(key + "#0", SIX_CALLS, PROFILED_SCHEDULE="wait=x", PROFILED_EXPORTERS="memory")
        add(key + "#1", SIX_CALLS, PROFILED_SCHEDULE="wait=x", PROFILED_STRICT="1")
        add(
            "test_warnings_are_not_errors_for_unknown_exporter_names",
            TWO_CALLS,
            PROFILED_EXPORTERS="memory,nosuch",
        )
        yield ahead


def test_interpreter_exit_exports_partial_window(ahead, request):
    out, tmp_path = ahead[request.node.name]  # PARTIAL_AT_EXIT, traces into tr/
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n"  # nothing of ours on standard output
    assert "steps 1-2 (partial)" in out.stderr
    assert "mm" in out.stderr and "Self CPU time total:" in out.stderr
    (name,) = os.listdir(tmp_path / "tr")
    trace = json.load(open(tmp_path / "tr" / name))
    assert any(
        e.get("name") == "mm" and e.get("cat") == "user_annotation" for e in trace["traceEvents"]
    )


TOO_SHORT = """
from instrument import profiled

@profiled
def f():
    return 1

f()
"""


def test_program_too_short_prints_why(ahead, request):
    out, _cwd = ahead[request.node.name]  # TOO_SHORT, the console
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("torch-profiled:")]
    assert len(lines) == 1 and "no table" in lines[0], out.stderr
    assert out.stdout == ""


TWELVE_MM = """
import torch
from instrument import profiled

@profiled("mm")
def mm(x):
    return x @ x

x = torch.randn(16, 16)
for _ in range(12):
    mm(x)
"""


def test_environment_drives_the_ambient_session(ahead, request):
    out, tmp_path = ahead[request.node.name]  # TWELVE_MM, two windows, the last trace kept
    assert out.returncode == 0, out.stderr
    files = os.listdir(tmp_path / "tr")
    assert len(files) == 1 and files[0].endswith(".pt.trace.json.gz")


SIX_CALLS = """
from instrument import profiled

@profiled
def f():
    return 1

for _ in range(6):
    f()
print("ok")
"""


def test_bad_environment_warns_once_and_program_runs(ahead, request):
    out, _cwd = ahead[request.node.name + "#0"]  # SIX_CALLS, PROFILED_SCHEDULE=wait=x
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ok\n"
    assert out.stderr.count("PROFILED_SCHEDULE='wait=x' is invalid") == 1
    strict, _cwd = ahead[request.node.name + "#1"]  # and PROFILED_STRICT=1
    assert strict.returncode != 0
    assert "ValueError" in strict.stderr and "PROFILED_SCHEDULE" in strict.stderr


TWO_CALLS = """
from instrument import profiled

@profiled
def f():
    return 1

f(); f()
print("ok")
"""


def test_warnings_are_not_errors_for_unknown_exporter_names(ahead, request):
    out, _cwd = ahead[request.node.name]  # TWO_CALLS, exporters memory and nosuch
    assert out.returncode == 0
    assert "unknown exporter 'nosuch'" in out.stderr and "console" in out.stderr


def test_idle_flag_tracks_schedule_end():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        configure(  # CPU: a CUDA window's stop may wait for the device past its last step
            exporters=[InMemoryExporter()],
            schedule=Schedule(wait=0, warmup=1, active=1),
            activities=["cpu"],
        )
    assert process_status().calls_idle is False
    work()
    assert process_status().calls_idle is False
    work()
    assert process_status().calls_idle is True


def test_each_report_is_given_once_to_every_exporter():
    a, b = InMemoryExporter(), InMemoryExporter()
    with session(exporters=[a, b], schedule=Schedule(wait=0, warmup=1, active=1, repeat=3)) as s:
        for _ in range(8):
            work()
            s.step()
    assert len(a.reports) == len(b.reports) == 3
    assert [r.window for r in a.reports] == [0, 1, 2]
    assert all(x is y for x, y in zip(a.reports, b.reports))


@profiled("options")
def _options_work(x):
    return torch.nn.functional.linear(x, x)


def test_profiler_options_reach_torch(tmp_path):
    from exporters import TraceFileExporter

    x = torch.randn(16, 16)
    with session(
        exporters=[TraceFileExporter(tmp_path, gzip=False)],
        schedule=Schedule(wait=0, warmup=1, active=1),
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
    ) as s:
        _options_work(x)
        s.step()
        _options_work(x)
        s.step()
    (name,) = os.listdir(tmp_path)
    events = json.load(open(tmp_path / name))["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert any("Input Dims" in e.get("args", {}) for e in ops)  # record_shapes
    assert any(e.get("name") == "[memory]" for e in events)  # profile_memory
    assert any(e.get("cat") == "python_function" for e in events)  # with_stack
    # with_flops: torch 2.13's trace carries no FLOP counts, but flops need the shapes
    with session(
        exporters=[TraceFileExporter(tmp_path / "flops", gzip=False)],
        schedule=Schedule(wait=0, warmup=1, active=1),
        with_flops=True,
    ) as s:
        _options_work(x)
        s.step()
        _options_work(x)
        s.step()
    (name,) = os.listdir(tmp_path / "flops")
    events = json.load(open(tmp_path / "flops" / name))["traceEvents"]
    assert any("Input Dims" in e.get("args", {}) for e in events if e.get("name") == "aten::mm")
    with session(
        exporters=[TraceFileExporter(tmp_path / "plain", gzip=False)],
        schedule=Schedule(wait=0, warmup=1, active=1),
    ) as s:
        _options_work(x)
        s.step()
        _options_work(x)
        s.step()
    (name,) = os.listdir(tmp_path / "plain")
    events = json.load(open(tmp_path / "plain" / name))["traceEvents"]
    assert not any("Input Dims" in e.get("args", {}) for e in events)
    assert not any(e.get("cat") == "python_function" for e in events)


def test_default_activities_are_cpu_plus_the_accelerator():
    from instrument.runtime._torch import default_activities

    expected = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    assert default_activities() == expected
    with capture(schedule=Schedule(wait=0, warmup=1, active=1)) as cap:
        work()
        cap.step()
        work()
        cap.step()
    assert cap.reports[0].activities == expected


def test_user_profiler_started_during_our_warmup_keeps_its_events():
    mem = InMemoryExporter()
    configure(exporters=[mem], schedule=Schedule(wait=0, warmup=2, active=2), activities=["cpu"])
    work()  # step 0 ends: a window is due, step 1 is still warm-up
    assert torch.autograd.profiler._is_profiler_enabled is False
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            work()
        torch.ones(3) + 1
    names = [e.name for e in prof.events()]
    assert names.count("work") == 5
    assert "aten::add" in names
    assert torch.autograd.profiler._is_profiler_enabled is False
    shutdown()
    assert mem.reports == []
    assert "your own torch.profiler" in mem.notices[0]


@profiled("compiled_step", step=True)
def _compiled_step(x):
    return (x @ x).relu()


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_steps_end_when_the_whole_step_function_is_compiled(backend):
    """torch.compile(step function): the range is not recorded inside the graph, but every
    call still ends a step, so windows open and close on schedule."""
    compiled = torch.compile(_compiled_step, fullgraph=True, backend=backend)
    x = torch.randn(8, 8)
    with capture(schedule=Schedule(wait=1, warmup=1, active=2)) as cap:
        seen = []
        for _ in range(6):
            compiled(x)
            seen.append(cap.session.step_index)
    # one step per call until the schedule is over (then nothing needs counting)
    assert seen[:4] == [1, 2, 3, 4]
    (report,) = cap.reports
    assert report.steps == (2, 3)
    assert report.partial is False


def test_report_from_trace_json_where_kineto_events_lack_categories(monkeypatch):
    """torch < 2.13 (2.11 on the GPU host): Kineto events have no activity_type(); the session
    analyzes the exported trace instead, with the same numbers. (The export-thread path: the
    helper process always analyzes the trace.)"""
    from instrument.runtime import _torch

    with capture(schedule=Schedule(wait=0, warmup=1, active=2), analysis_process=False) as cap:
        for _ in range(3):
            work()
            cap.step()
    monkeypatch.setattr(_torch.ProfilerWindow, "events", lambda self: None)
    with capture(schedule=Schedule(wait=0, warmup=1, active=2), analysis_process=False) as cap_json:
        for _ in range(3):
            work()
            cap_json.step()
    a, b = cap.reports[0], cap_json.reports[0]
    assert a.ranges["work"].calls == b.ranges["work"].calls == 2
    assert {o.name: o.calls for o in a.top_ops} == {o.name: o.calls for o in b.top_ops}


def test_window_started_hook_runs_in_the_context_of_the_first_recorded_call():
    import contextvars

    request: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")

    class ContextCapturing(InMemoryExporter):
        def __init__(self) -> None:
            super().__init__()
            self.started: list[tuple[int, str]] = []

        def window_started(self, window: int) -> None:
            self.started.append((window, request.get()))

    mem = ContextCapturing()
    sched = Schedule(wait=1, warmup=1, active=2, repeat=2)
    with session(schedule=sched, exporters=[mem]):
        for i in range(10):
            ctx = contextvars.copy_context()
            ctx.run(lambda i=i: (request.set(f"request-{i}"), train_step()))
    assert [r.window for r in mem.reports] == [0, 1]
    # steps 2-3 and 6-7 record; the hook saw the request whose call opened each window
    assert [r.steps for r in mem.reports] == [(2, 3), (6, 7)]
    assert mem.started == [(0, "request-2"), (1, "request-6")]


def test_window_started_hook_that_raises_costs_a_warning_only():
    class Bad(InMemoryExporter):
        def window_started(self, window: int) -> None:
            raise RuntimeError("boom")

    mem = Bad()
    with pytest.warns(instrument.ProfilerWarning, match="boom"):
        with session(schedule=Schedule(warmup=0, active=2), exporters=[mem]):
            for _ in range(4):
                train_step()
    assert len(mem.reports) == 1


@profiled("warm_only", step=True)
def warm_only() -> torch.Tensor:
    return X @ X


@pytest.mark.parametrize("path", ["kineto", "trace-json"])
def test_recorded_warmup_is_dropped_from_the_report_and_the_trace(tmp_path, monkeypatch, path):
    """With a device the profiler records from the warm-up (its start-up costs land there);
    nothing of the warm-up may reach the report or the trace file."""
    from exporters import TraceFileExporter
    from instrument.runtime import _torch

    if path == "trace-json":
        monkeypatch.setattr(_torch.ProfilerWindow, "events", lambda self: None)
    mem = InMemoryExporter()
    s = session(
        schedule=Schedule(warmup=2, active=2),
        activities=["cpu"],
        exporters=[mem, TraceFileExporter(tmp_path, gzip=False)],
    )
    s._windows.record_warmup = True  # what a session whose activities include a device does
    with s:
        for _ in range(2):
            warm_only()
            assert torch.autograd.profiler._is_profiler_enabled  # recording the warm-up
        for _ in range(2):
            train_step()
    (report,) = mem.reports
    assert report.steps == (2, 3)
    assert "warm_only" not in report.ranges and report.ranges["work"].calls == 2
    assert sum(o.calls for o in report.top_ops if o.name == "aten::mm") == 2
    trace = json.load(open(report.trace_file))
    names = [e.get("name") for e in trace["traceEvents"]]
    assert "warm_only" not in names and names.count("work") == 2
    assert names.count("aten::mm") == 2
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == [
        "ProfilerStep#2",
        "ProfilerStep#3",
    ]


@profiled("warm_mm")
def warm_mm(a: torch.Tensor) -> torch.Tensor:
    return a @ a


@profiled("warm_raises")
def warm_raises(exc: BaseException) -> None:
    raise exc


def _recorded_names(window) -> list[str]:
    """What the window's profiler recorded, the warm-up included (the report and the trace
    cut it): only torch's own results show it."""
    return [e.name() for e in window._prof.profiler.kineto_results.events()]


def _warmup_step(a: torch.Tensor) -> None:
    """A warm-up step's decorated calls, which behave whether or not their thread records."""
    assert torch.equal(warm_mm(a), a @ a)
    err = ValueError("mine")
    with pytest.raises(ValueError) as caught:
        warm_raises(err)
    assert caught.value is err
    assert torch.autograd.profiler._is_profiler_enabled  # the profiler records the warm-up


@pytest.mark.parametrize("paused", [True, False])
def test_a_recorded_warmup_records_no_cpu_ops_of_the_stepping_thread(monkeypatch, paused):
    """With a device the profiler starts at the warm-up, but the stepping thread records its
    CPU operators and ranges only from the first recorded step (WARMUP_PAUSES_CPU_OPS)."""
    from instrument.runtime import state
    from instrument.runtime import window as window_mod

    monkeypatch.setattr(window_mod, "WARMUP_PAUSES_CPU_OPS", paused)
    mem = InMemoryExporter()
    s = session(schedule=Schedule(warmup=2, active=2), activities=["cpu"], exporters=[mem])
    s._windows.record_warmup = True  # what a session whose activities include a device does
    a = torch.randn(16, 16)
    with s:
        for _ in range(2):  # the warm-up steps
            _warmup_step(a)
            window = s._windows.window
            assert state.cpu_ops.paused == ({threading.get_ident()} if paused else set())
            s.step()
        for _ in range(2):  # the recorded steps
            assert not state.cpu_ops.paused
            work()
            s.step()
    names = _recorded_names(window)
    assert names.count("warm_mm") == (0 if paused else 2)
    assert names.count("warm_raises") == (0 if paused else 2)
    assert names.count("work") == 2
    assert names.count("aten::mm") == (2 if paused else 6)  # (the check's own a @ a too)
    (report,) = mem.reports
    assert report.steps == (2, 3) and set(report.ranges) == {"work"}
    assert report.ranges["work"].calls == 2
    assert not state.cpu_ops.paused
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(3).mul(2)  # the thread records again
    assert "aten::mul" in [e.name for e in prof.events()]


def test_an_all_threads_warmup_pauses_only_the_stepping_thread():
    """Another thread's CPU ops are its own to switch: an all-threads window records them in
    the warm-up (cut from the report by time), while the stepping thread's are paused."""
    from instrument.runtime import state

    mem = InMemoryExporter()
    s = session(
        schedule=Schedule(warmup=1, active=1),
        activities=["cpu"],
        exporters=[mem],
        all_threads=True,
    )
    s._windows.record_warmup = True
    a = torch.randn(16, 16)
    with s:
        _warmup_step(a)
        window = s._windows.window
        worker = threading.Thread(target=warm_mm, args=(a,))
        worker.start()
        worker.join()
        assert state.cpu_ops.paused == {threading.get_ident()}
        s.step()
        work()
        s.step()
    names = _recorded_names(window)
    assert names.count("warm_mm") == 1  # the other thread's
    assert names.count("work") == 1
    (report,) = mem.reports
    assert set(report.ranges) == {"work"}


def test_the_ambient_windows_warmup_is_paused_from_its_first_decorated_call():
    """The ambient session starts a window's profiler at the warm-up step's first decorated
    call: that call and the rest of the step record no CPU ops (the first-call hook does not
    resume the thread), the recorded steps do."""
    from instrument.runtime import state

    mem = InMemoryExporter()
    configure(exporters=[mem], activities=["cpu"], schedule=Schedule(wait=2, warmup=1, active=2))
    step()  # the ambient session; step 0 (wait) ends
    state.ambient._windows.record_warmup = True  # what a session with a device does
    step()  # step 1 (wait) ends: the warm-up's window starts at its first decorated call
    a = torch.randn(16, 16)
    for _ in range(2):
        _warmup_step(a)
    window = state.ambient._windows.window
    assert window is not None and window.recording
    assert state.cpu_ops.paused == {threading.get_ident()}
    for _ in range(2):
        step()
        work()
    step()
    assert instrument.flush(30)
    names = _recorded_names(window)
    assert names.count("warm_mm") == 0 and names.count("warm_raises") == 0
    assert names.count("work") == 2
    assert [r.steps for r in mem.reports] == [(3, 4)]
    assert not state.cpu_ops.paused


def test_status_follows_a_windows_life_and_is_a_frozen_snapshot():
    """``Session.status()``: the step, the window (open in its warm-up, recording in its active
    steps, on this thread), the counts, and ``finished``/``closed``; each call a new snapshot
    that never changes after."""
    import dataclasses
    import threading

    from instrument.testing import process_status

    with capture(schedule=Schedule(wait=1, warmup=1, active=2), activities=["cpu"]) as cap:
        s = cap.session
        before = s.status()
        seen = []
        for _ in range(5):
            train_step()
            st = s.status()
            seen.append((st.step, st.window_open, st.window_recording, st.windows_ended))
            if st.window_open:
                assert st.window_thread == threading.get_ident()
                assert process_status().session is s
            assert process_status().windows_recording == int(st.window_recording)
        assert seen == [
            (1, True, False, 0),  # the warm-up: a CPU window records from its first active step
            (2, True, True, 0),
            (3, True, True, 0),
            (4, False, False, 1),
            (4, False, False, 1),  # the schedule is over: no step counted
        ]
        assert s.status().finished and not s.status().closed
        assert s.status().windows_opened == 1 and s.status().window_thread is None
    assert s.status().closed and [r.steps for r in cap.reports] == [(2, 3)]
    assert (before.step, before.window_open, before.finished) == (0, False, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.step = 9  # type: ignore[misc]


_WARMUP_CHILD = """
import os, signal, sys, threading
import torch
from instrument import Schedule, profiled, session
from instrument.runtime import state
from instrument.testing import InMemoryExporter

@profiled("warm")
def warm(a):
    return a @ a

def records_cpu_ops():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(3).mul(2)
    return "aten::mul" in [e.name for e in prof.events()]

mem = InMemoryExporter()
s = session(schedule=Schedule(warmup=1, active=1), activities=["cpu"], exporters=[mem])
s._windows.record_warmup = True  # what a session whose activities include a device does
a = torch.randn(8, 8)
case = sys.argv[1]
try:
    with s:
        warm(a)  # the warm-up step: the profiler records, this thread's CPU ops paused
        assert state.cpu_ops.paused == {threading.get_ident()}
        if case == "fork":
            pid = os.fork()
            if pid == 0:
                os._exit(0 if records_cpu_ops() and not state.cpu_ops.paused else 3)
            _, status = os.waitpid(pid, 0)
            print("child", os.waitstatus_to_exitcode(status))
        else:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the warm-up step
            warm(a)
        s.step()
        warm(a)  # the recorded step
        s.step()
except KeyboardInterrupt:
    print("interrupted")
print("paused", sorted(state.cpu_ops.paused), "records", records_cpu_ops(),
      "reports", [r.steps for r in mem.reports])
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")
@pytest.mark.parametrize("case", ["fork", "sigint"])
def test_a_fork_or_ctrl_c_in_a_paused_warmup_leaves_no_thread_paused(case):
    """A DataLoader worker forked in a recorded warm-up records its CPU ops (the stepping
    thread's pause is not inherited), and Ctrl-C in the warm-up ends the session with the
    thread recording again; real processes and a real signal."""
    proc = _proc.run("-W", "ignore::DeprecationWarning", "-c", _WARMUP_CHILD, case, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("paused [] records True"), proc.stdout
    if case == "fork":
        assert "child 0" in lines, proc.stdout
        assert lines[-1].endswith("reports [(1,)]"), proc.stdout
    else:
        assert "interrupted" in lines, proc.stdout
