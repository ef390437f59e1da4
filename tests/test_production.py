"""Production behaviour, by fault injection: exporters that raise, hang or crawl; full queues;
deadlines at exit; fork and spawn; many threads through many windows; memory over 20k steps."""

from __future__ import annotations

import json
import threading
import warnings

import pytest
import torch

from exporters import Exporter, ExporterWarning, ExportResult, InMemoryExporter
from instrument import Schedule, profiled, session
from instrument.export.pipeline import QUEUE_SIZE
from tests import _proc
from tests._records import window_records

X = torch.randn(8, 8)


@profiled("work")
def work() -> torch.Tensor:
    return X @ X


@profiled("train_step", step=True)
def train_step() -> torch.Tensor:
    return work() + 1


class Raising(Exporter):
    def export(self, report):
        raise RuntimeError("backend down")

    def notice(self, message):
        raise RuntimeError("notice broke")

    def shutdown(self):
        raise RuntimeError("shutdown broke")


class Hanging(Exporter):
    """Blocks in export until released (a backend that never answers)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.seen: list[int] = []

    def export(self, report):
        self.entered.set()
        self.release.wait()
        self.seen.append(report.window)
        return ExportResult.SUCCESS


class Slow(InMemoryExporter):
    def export(self, report):
        threading.Event().wait(0.05)
        return super().export(report)


def test_raising_hanging_and_slow_exporters_lose_only_their_own_output():
    healthy, slow, hanging = InMemoryExporter(), Slow(), Hanging()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with session(
            schedule=Schedule(warmup=0, active=1, repeat=4),
            export_timeout_s=1.0,
            exporters=[Raising(), hanging, slow, healthy],
        ):
            for _ in range(6):
                train_step()
        # the session ended although `hanging` still blocks: the program went on
        assert hanging.entered.is_set() and not hanging.release.is_set()
    assert [r.window for r in healthy.reports] == [0, 1, 2, 3]
    assert [r.window for r in slow.reports] == [0, 1, 2, 3]
    messages = [str(w.message) for w in caught if issubclass(w.category, ExporterWarning)]
    assert sum("Raising raised RuntimeError('backend down')" in m for m in messages) == 4
    assert any("shutdown broke" in m for m in messages)
    lost = [m for m in messages if "not exported within PROFILED_EXPORT_TIMEOUT_S=1s" in m]
    assert len(lost) == 1 and "Hanging: 4" in lost[0]  # one in its hands, three queued
    hanging.release.set()


def _wait_for(condition, timeout: float = 30.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("condition not reached")


def test_a_full_queue_drops_the_oldest_counts_it_and_warns_once():
    hanging, healthy = Hanging(), InMemoryExporter()
    windows = QUEUE_SIZE + 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with session(
            schedule=Schedule(warmup=0, active=1, repeat=windows), exporters=[hanging, healthy]
        ) as s:
            for n in range(windows):
                train_step()
                # the healthy lane keeps up although the hanging one is stuck
                _wait_for(lambda n=n: len(healthy.reports) == n + 1)
            assert s.flush(0.1) is False  # the hanging lane has not finished
            dropped = s.dropped
            hanging.release.set()
    assert len(healthy.reports) == windows
    # one report is in the hanging exporter's hands, QUEUE_SIZE wait, the oldest others dropped
    assert dropped["Hanging"] == windows - 1 - QUEUE_SIZE
    assert dropped["InMemoryExporter"] == 0 and dropped["analysis"] == 0
    assert hanging.seen == [0, *range(windows - QUEUE_SIZE, windows)]
    full = [w for w in caught if "queue is full" in str(w.message)]
    assert len(full) == 1 and "Hanging" in str(full[0].message)


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """The programs after the deadline test's (each its own process, as before), run two at a
    time as the first of their tests starts; a test reads its own. The deadline test's runs
    alone, before them: its exporters have 1 s at exit."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:

        def add(key, code, timeout=120, **env):
            def child_env(cwd):
                return _proc.sdk_env({"PROFILED_JSON_PATH": str(cwd / "r.jsonl"), **env})

            ahead.add(key, "-c", code, env=child_env, timeout=timeout)

        json_only = {"PROFILED_EXPORTERS": "json"}
        add(
            "test_reports_arrive_in_order_and_complete_at_exit",
            IN_ORDER,
            PROFILED_SCHEDULE="warmup=0,active=2,repeat=0",
            **json_only,
        )
        add(
            "test_forked_child_never_exports_nor_stops_the_parents_window",
            FORKED_CHILD,
            PROFILED_SCHEDULE="warmup=1,active=6",
            **json_only,
        )
        add(
            "test_multiprocessing_fork_children_export_nothing_and_leave_the_window",
            MP_FORK,
            PROFILED_SCHEDULE="warmup=1,active=3,repeat=2,wait=4",
            **json_only,
        )
        add("test_dataloader_fork_workers_run_decorated_code", LOADER_FORK, **json_only)

        def rss_env(cwd):  # the json exporter's default file, in the working directory
            return _proc.sdk_env(
                PROFILED_EVERY="500", PROFILED_EXPORTERS="json,trace", PROFILED_TRACE_KEEP="3"
            )

        ahead.add(
            "test_resident_memory_stays_flat_over_20k_steps_with_a_window_every_500",
            "-c",
            RSS,
            env=rss_env,
            timeout=600,
        )
        yield ahead


def test_exit_waits_for_queued_reports_only_until_the_deadline(run_python, tmp_path):
    code = """
import threading, torch
import instrument
from instrument import profiled
from exporters import Exporter, ExportResult

class Hanging(Exporter):
    def export(self, report):
        threading.Event().wait()  # never returns
        return ExportResult.SUCCESS

instrument.configure(exporters=[Hanging(), "json"])

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

x = torch.randn(4, 4)
for _ in range(8):
    train_step(x)
print("done", flush=True)
"""
    out = run_python(
        code,
        env={
            "PROFILED_EXPORT_TIMEOUT_S": "1",
            "PROFILED_SCHEDULE": "warmup=1,active=2,repeat=2",
            "PROFILED_JSON_PATH": str(tmp_path / "r.jsonl"),
        },
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n"
    assert "not exported within PROFILED_EXPORT_TIMEOUT_S=1s" in out.stderr
    assert "Hanging: 2" in out.stderr
    records = window_records((tmp_path / "r.jsonl").read_text())
    assert [r["window"] for r in records] == [0, 1]  # the others got both


IN_ORDER = """
import torch
import instrument
from instrument import profiled

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

x = torch.randn(4, 4)
for _ in range(12):
    train_step(x)
"""


def test_reports_arrive_in_order_and_complete_at_exit(ahead, request):
    """Windows that end right before exit are still exported (queued, then flushed)."""
    out, tmp_path = ahead[request.node.name]  # IN_ORDER
    assert out.returncode == 0, out.stderr
    records = window_records((tmp_path / "r.jsonl").read_text())
    assert [r["steps"] for r in records] == [[2 * i, 2 * i + 1] for i in range(6)]


# ------------------------------------------------------------------ processes


FORKED_CHILD = """
import os, sys, json, torch
import instrument
from instrument import profiled
from instrument.runtime import _torch

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

x = torch.randn(4, 4)
for _ in range(3):
    train_step(x)          # the window records from step 1
assert _torch.profiler_on()
pid = os.fork()
if pid == 0:               # the child: decorated calls work, nothing of ours runs
    for _ in range(20):
        train_step(x)
    instrument.shutdown()
    # as multiprocessing and DataLoader workers leave: a child of a process whose torch
    # profiler records hangs in torch's own teardown at a normal exit (plain torch too)
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert status == 0, status
assert _torch.profiler_on()  # the child did not stop the parent's profiler
for _ in range(10):
    train_step(x)
instrument.shutdown()
print(os.getpid(), flush=True)
"""


def test_forked_child_never_exports_nor_stops_the_parents_window(ahead, request):
    out, tmp_path = ahead[request.node.name]  # FORKED_CHILD
    path = tmp_path / "r.jsonl"
    assert out.returncode == 0, out.stderr
    reports = window_records(path.read_text())
    assert len(reports) == 1 and reports[0]["pid"] == int(out.stdout)
    assert reports[0]["steps"] == [1, 2, 3, 4, 5, 6]
    assert reports[0]["ranges"]["train_step"]["calls"] == 6  # the parent's calls only


MP_FORK = """
import multiprocessing as mp, torch
import instrument
from instrument import profiled

@profiled("train_step", step=True)
def train_step(x):
    return x @ x

def child(n):
    x = torch.randn(4, 4)
    for _ in range(n):
        train_step(x)

x = torch.randn(4, 4)
for _ in range(5):
    train_step(x)          # steps 0-4 ended (wait, warm-up): the window records step 5
procs = [mp.get_context("fork").Process(target=child, args=(12,)) for _ in range(2)]
for p in procs:
    p.start()
for p in procs:
    p.join()
    assert p.exitcode == 0, p.exitcode
for _ in range(10):
    train_step(x)          # steps 5-14: the rest of this window, and part of the next
"""


def test_multiprocessing_fork_children_export_nothing_and_leave_the_window(ahead, request):
    out, tmp_path = ahead[request.node.name]  # MP_FORK
    path = tmp_path / "r.jsonl"
    assert out.returncode == 0, out.stderr
    reports = window_records(path.read_text())
    assert [r["steps"] for r in reports] == [[5, 6, 7], [13, 14]]
    assert reports[0]["ranges"]["train_step"]["calls"] == 3  # none of the children's
    assert len({r["pid"] for r in reports}) == 1  # the parent's windows only


LOADER_FORK = """
import torch
from torch.utils.data import DataLoader, Dataset
import instrument
from instrument import profiled

class Squares(Dataset):
    def __len__(self):
        return 64
    @profiled("load")
    def __getitem__(self, i):
        return torch.tensor([i * i], dtype=torch.float32)

@profiled("train_step", step=True)
def train_step(batch):
    return batch.sum()

loader = DataLoader(Squares(), batch_size=8, num_workers=2,
                    multiprocessing_context="fork")
total = sum(float(train_step(b)) for b in loader)
instrument.shutdown()
print(int(total), flush=True)
"""


def test_dataloader_fork_workers_run_decorated_code(ahead, request):
    out, tmp_path = ahead[request.node.name]  # LOADER_FORK
    path = tmp_path / "r.jsonl"
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == sum(i * i for i in range(64))
    reports = window_records(path.read_text())
    assert len(reports) == 1 and reports[0]["ranges"]["train_step"]["calls"] == 3


# ------------------------------------------------------------------ load


def test_eight_threads_through_many_windows_give_exact_call_counts():
    """Steps are declared by the main thread; in each, 8 threads make 10,000 decorated calls
    between them: every recorded step holds exactly that many calls."""
    calls_per_thread_per_step = 250
    threads, steps = 8, 40  # 8 x 250 x 40 = 80,000 calls, 10,000 per thread
    mem = InMemoryExporter()

    @profiled("tiny")
    def tiny(i: int) -> int:
        return i + 1

    start = [threading.Barrier(threads + 1) for _ in range(steps)]
    done = [threading.Barrier(threads + 1) for _ in range(steps)]

    def worker() -> None:
        for n in range(steps):
            start[n].wait()
            for i in range(calls_per_thread_per_step):
                tiny(i)
            done[n].wait()

    # every thread recorded (the calls are plain Python: no operator runs in the other threads
    # while windows start and stop, which torch's all-threads profiling does not survive)
    with session(
        schedule=Schedule(wait=2, warmup=1, active=3, repeat=0),
        exporters=[mem],
        activities=["cpu"],
        all_threads=True,
    ) as s:
        s.step()  # declare steps: root calls in the threads do not end them
        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        for n in range(steps):
            start[n].wait()
            done[n].wait()
            s.step()
        for t in pool:
            t.join()
    reports = [r for r in mem.reports if not r.partial]  # the last one ends with the session
    assert len(reports) == 6
    for r in reports:
        assert len(r.steps) == 3
        assert r.ranges["tiny"].calls == 3 * threads * calls_per_thread_per_step, r.steps


# ------------------------------------------------------------------ memory


RSS = """
import json, resource, torch
import instrument
from instrument import profiled

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20

@profiled("train_step", step=True)
def train_step(x, w, b):
    return torch.relu(x @ w + b).sum()

x, w, b = torch.randn(16, 32), torch.randn(32, 32), torch.randn(32)
samples = []
for i in range(20_000):
    train_step(x, w, b)
    if i % 500 == 499:
        instrument.flush()
        samples.append(rss_mb())
instrument.shutdown()
print(json.dumps(samples))
"""


def test_resident_memory_stays_flat_over_20k_steps_with_a_window_every_500(ahead, request):
    out, tmp_path = ahead[request.node.name]  # RSS
    assert out.returncode == 0, out.stderr
    samples = json.loads(out.stdout)
    assert len(samples) == 40
    reports = window_records((tmp_path / "profiled_reports.jsonl").read_text())
    assert len(reports) == 40  # a window every 500 steps, each exported
    growth = max(samples[1:]) - samples[0]
    print("rss MB after each window:", [round(s, 1) for s in samples])
    assert growth < 50, samples
