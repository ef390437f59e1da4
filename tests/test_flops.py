"""FLOPs, FLOP/s and MFU (issue 18): the seed's cases counted in real profiler windows and
checked against torch's own FLOP counter run independently on the same computation."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from exporters import TraceFileExporter
from exporters.console import format_report
from instrument import Schedule, profiled
from instrument.analysis import peaks
from instrument.analysis.analyze import analyze_events, analyze_trace
from instrument.analysis.kineto_json import load_trace
from instrument.analysis.throughput import with_peaks
from instrument.base.report import FrozenMap
from instrument.testing import capture

STEPS = 3


def _counted(fn, *args):
    """Total FLOPs of ``fn(*args)`` by torch.utils.flop_counter (forward, and backward when
    ``fn`` calls it)."""
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def _window(tmp_path, fn, *args, **fields):
    """One window of STEPS steps of ``fn(*args)`` with FLOPs counted: (report, the report read
    back from the trace file the window wrote)."""
    with capture(
        schedule=Schedule(wait=0, warmup=1, active=STEPS),
        exporters=[TraceFileExporter(tmp_path, gzip=False)],
        with_flops=True,
        **fields,
    ) as cap:
        for _ in range(STEPS + 1):
            fn(*args)
            cap.step()
    (report,) = cap.reports
    (path,) = tmp_path.glob("*.pt.trace.json")
    return report, analyze_trace(load_trace(str(path)), report.ranges.keys())


def _per_call(stats):
    return stats.flops / stats.calls


@profiled("matmul_bias")
def matmul_bias(x, w, b):
    return x @ w + b


class Attention(torch.nn.Module):
    """A transformer's attention block: fused qkv projection, SDPA, output projection."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def _split(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        return [t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v)]

    def forward(self, x):
        q, k, v = self._split(x)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(x.shape))

    def forward_by_hand(self, x):
        """The same attention written out: matrix products torch's counter knows."""
        q, k, v = self._split(x)
        scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        y = scores.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(x.shape))


@pytest.mark.parametrize("n", [64, 256])
def test_matmul_bias_flops_match_torchs_counter(tmp_path, n):
    x, w, b = torch.randn(n, n), torch.randn(n, n), torch.randn(n)
    report, from_trace = _window(tmp_path, matmul_bias, x, w, b)
    expected = _counted(lambda: x @ w + b)
    for stats in (report.ranges["matmul_bias"], from_trace.ranges["matmul_bias"]):
        assert stats.calls == STEPS
        assert _per_call(stats) == pytest.approx(expected, rel=0.01)
        assert stats.flops_dtype == "fp32"
        assert stats.bytes_moved > 0
        assert stats.arithmetic_intensity == pytest.approx(stats.flops / stats.bytes_moved)


def test_elementwise_work_is_not_counted_as_flops(tmp_path):
    """torch's ``with_flops`` gives ``aten::mul`` and ``aten::add`` one FLOP per element;
    torch.utils.flop_counter (and MFU as frameworks report it) counts matrix products only.
    A thin product followed by elementwise work: the window counts the product alone."""
    x, w = torch.randn(256, 8), torch.randn(8, 256)

    @profiled("thin_mm_then_elementwise")
    def thin(x, w):
        return ((x @ w) * 2 + 1) * 3

    expected = _counted(thin.__wrapped__, x, w)
    assert expected == 2 * 256 * 8 * 256
    # the report from the trace (the helper process) and from Kineto's events read in this
    # process (which carry torch's own counts), and the trace file read back
    for in_helper in (True, False):
        report, from_trace = _window(
            tmp_path / str(in_helper), thin, x, w, analysis_process=in_helper
        )
        for stats in (
            report.ranges["thin_mm_then_elementwise"],
            from_trace.ranges["thin_mm_then_elementwise"],
        ):
            assert _per_call(stats) == expected, in_helper


def test_linear_flops_match_torchs_counter(tmp_path):
    linear = torch.nn.Linear(256, 512).to(torch.bfloat16)
    x = torch.randn(32, 256, dtype=torch.bfloat16)
    run = profiled("linear")(linear)
    report, from_trace = _window(tmp_path, run, x)
    expected = _counted(linear, x)
    for stats in (report.ranges["linear"], from_trace.ranges["linear"]):
        assert _per_call(stats) == pytest.approx(expected, rel=0.01)
        assert stats.flops_dtype == "bf16"


def test_attention_block_flops_match_torchs_counter_forward_and_backward(tmp_path):
    """SDPA's fused operator is not in the profiler's own count: ours adds it (forward and
    backward), which torch's counter confirms on the same block written out by hand."""
    torch.manual_seed(0)
    block = Attention(128, heads=4)
    x = torch.randn(2, 64, 128, requires_grad=True)

    @profiled("attention_train")
    def train(x):
        block(x).sum().backward()

    report, from_trace = _window(tmp_path, train, x)
    expected = _counted(lambda: block.forward_by_hand(x).sum().backward())
    for stats in (report.ranges["attention_train"], from_trace.ranges["attention_train"]):
        assert _per_call(stats) == pytest.approx(expected, rel=0.01)
    # and the forward alone
    forward = profiled("attention")(block)
    report, _ = _window(tmp_path / "fwd", forward, x.detach())
    expected = _counted(block.forward_by_hand, x.detach())
    assert _per_call(report.ranges["attention"]) == pytest.approx(expected, rel=0.01)


class Conv1D(torch.nn.Module):
    """GPT-2's projection (transformers' ``Conv1D``): ``torch.addmm`` called directly, which
    autocast wraps (``nn.Linear`` goes through ``aten::linear``, whose ``addmm`` it does not)."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(d_in, d_out) * 0.02)
        self.bias = torch.nn.Parameter(torch.zeros(d_out))

    def forward(self, x):
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return y.view(*x.shape[:-1], -1)


class TinyLM(torch.nn.Module):
    """A GPT-like block over token embeddings: qkv by ``Conv1D``, attention by ``torch.bmm``,
    an MLP of ``Conv1D``s, an ``nn.Linear`` head."""

    def __init__(self, vocab=64, dim=64, seq=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.qkv, self.proj = Conv1D(dim, 3 * dim), Conv1D(dim, dim)
        self.up, self.down = Conv1D(dim, 4 * dim), Conv1D(4 * dim, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.bmm(q, k.transpose(1, 2)) / q.shape[-1] ** 0.5
        x = x + self.proj(torch.bmm(scores.softmax(-1), v))
        x = x + self.down(F.gelu(self.up(x)))
        return self.head(x)


@pytest.mark.parametrize("in_helper", [False, True])
def test_autocast_training_step_flops_match_torchs_counter(tmp_path, in_helper):
    """bf16 autocast: torch records ``aten::addmm`` (``bmm``, ...) it wraps twice, once inside
    the other (fp32 inputs outside, bf16 inside), both with the FLOPs of one product. A whole
    training step (forward under autocast, backward, optimizer) counts what torch's counter
    (Lightning's ``measure_flops``) counts on the same step, every FLOP in bf16: in the report
    analysed in this process (Kineto's events) and in the helper process (the trace), and from
    the trace file read back."""
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 64, (4, 32))

    def step(tokens):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens)
        F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()

    step(tokens)
    expected = _counted(step, tokens)
    assert expected > 0
    report, from_trace = _window(
        tmp_path, profiled("train_step")(step), tokens, analysis_process=in_helper
    )
    for stats in (report.ranges["train_step"], from_trace.ranges["train_step"]):
        assert stats.calls == STEPS
        assert _per_call(stats) == expected
        assert stats.flops_dtype == "bf16"
    # the window's FLOPs per recorded step: what the framework integrations rate steps by
    assert len(report.steps) == STEPS
    assert report.flops / len(report.steps) == expected
    assert report.flops_dtype == "bf16"


def _op(name, ts, dur, dims, types, flops=None):
    args = {"Input Dims": dims, "Input type": types, "External id": ts}
    if flops is not None:
        args["flops"] = flops  # torch 2.11's traces carry the profiler's own count
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def test_trace_counts_an_operator_redispatched_inside_itself_once():
    """The trace (the helper process's path; torch 2.11's traces with the profiler's counts):
    autocast's ``aten::addmm`` with fp32 inputs holding the cast and the bf16 ``aten::addmm``,
    and CUDA's fused attention holding its kernel's operator on (b, s, h, d) inputs: each is
    counted once, by its inner call (bf16), as torch's counter counts them."""
    m, k, n = 64, 32, 16
    b, h, s, d = 2, 4, 128, 16
    bshd, bhsd = [b, s, h, d], [b, h, s, d]
    fp32, bf16 = ["float", "float", "float"], ["c10::BFloat16"] * 3
    addmm = 2 * m * k * n
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 1, "ts": 0,
         "dur": 100, "args": {}},
        _op("aten::addmm", 1, 20, [[n], [m, k], [k, n]], fp32, addmm),
        _op("aten::to", 2, 3, [[m, k], []], ["float", ""]),
        _op("aten::addmm", 10, 9, [[n], [m, k], [k, n]], bf16, addmm),
        _op("aten::_scaled_dot_product_flash_attention", 30, 20, [bhsd] * 3, bf16),
        _op("aten::_flash_attention_forward", 35, 10, [bshd] * 3, bf16),
    ]  # fmt: skip
    q = torch.randn(bhsd, device="meta")
    expected = addmm + _counted(lambda: F.scaled_dot_product_attention(q, q, q))
    assert expected == addmm + 4 * b * h * s * s * d
    with_counts = analyze_events(events, ["step"])
    stats = with_counts.ranges["step"]
    assert stats.flops == expected
    assert stats.flops_dtype == "bf16"
    # torch 2.13's traces: no counts, ours from the shapes
    for ev in events:
        ev["args"].pop("flops", None)
    assert analyze_events(events, ["step"]).ranges["step"].flops == expected


def _as_if_on(report, device, device_us_per_call):
    """``report`` as though its ranges had run on ``device``: each call's device time given."""
    ranges = {
        name: dataclasses.replace(
            r, device_time_us=device_us_per_call * r.calls, device_busy_us=0.0, wall_time_us=0.0
        )
        for name, r in report.ranges.items()
    }
    return dataclasses.replace(report, device=device, ranges=FrozenMap(ranges))


def test_mfu_is_achieved_flops_over_the_devices_dense_peak(tmp_path):
    x, w, b = (t.to(torch.bfloat16) for t in (torch.randn(256, 256),) * 2 + (torch.randn(256),))
    report, _ = _window(tmp_path, matmul_bias, x, w, b)
    assert report.mfu(report.ranges["matmul_bias"]) is None  # a CPU run: no device, no peak
    h200 = with_peaks(_as_if_on(report, "NVIDIA H200", 0.05))
    r = h200.ranges["matmul_bias"]
    achieved = _per_call(r) / 0.05e-6  # 671 TFLOP/s
    assert r.flops_per_s == pytest.approx(achieved)
    peak = peaks.lookup("NVIDIA H200").flops_per_s("bf16")
    assert h200.mfu(r) == pytest.approx(achieved / peak)
    assert h200.peak_source == "NVIDIA H200"
    line = " ".join(format_report(h200).split())  # (a long line wraps)
    assert f"MFU {100 * achieved / peak:.1f}% of 989.40 TFLOP/s (bf16, NVIDIA H200)" in line
    # PROFILED_PEAK_TFLOPS overrides the table for every dtype
    own = with_peaks(_as_if_on(report, "NVIDIA H200", 0.05), override_tflops=1000.0)
    assert own.mfu(own.ranges["matmul_bias"]) == pytest.approx(achieved / 1000e12)
    # a device the table does not know says so
    unknown = with_peaks(_as_if_on(report, "Some Accelerator 9", 0.05))
    assert unknown.mfu(unknown.ranges["matmul_bias"]) is None
    assert "MFU: peak unknown for Some Accelerator 9 (bf16; set PROFILED_PEAK_TFLOPS)" in (
        " ".join(format_report(unknown).split())
    )
    record = h200.to_dict()["ranges"]["matmul_bias"]
    assert record["mfu"] == pytest.approx(achieved / peak)
    assert record["flops_per_s"] == pytest.approx(achieved)
    assert record["cpu_time_per_call_us"] == pytest.approx(r.cpu_time_us / r.calls)
    assert record["device_time_per_call_us"] == pytest.approx(0.05)


def test_compute_or_memory_heavy_is_judged_against_the_devices_ridge_point():
    """The same FLOP/byte is compute-heavy on a card with little bandwidth per FLOP and
    memory-heavy on one with much (L4's bf16 ridge ~403 FLOP/byte, H200's ~206)."""
    from instrument.base.report import RangeStats, WindowReport

    stats = RangeStats(
        "r", 1, 10.0, 10.0, 100.0, 1, device_busy_us=100.0, wall_time_us=100.0,
        flops=300_000, bytes_moved=1_000, flops_dtype="bf16",
    )  # fmt: skip
    base = WindowReport(0, (1,), False, 0, 1, 0, 1, "h", 1, "x", ("cpu", "cuda"))
    judged = {}
    for device in ("NVIDIA L4", "NVIDIA H200"):
        report = with_peaks(
            dataclasses.replace(base, device=device, ranges=FrozenMap({"r": stats}))
        )
        judged[device] = report.ranges["r"].verdict
    assert judged["NVIDIA H200"].detail == "compute-heavy"
    assert judged["NVIDIA L4"].detail == "memory-heavy"
    assert "300 FLOP/byte (the device's ridge: 206)" in judged["NVIDIA H200"].reason
    # judged again for a device the table does not know: the default line, no ridge named
    again = with_peaks(dataclasses.replace(report, device="Some Accelerator 9"))
    assert again.ranges["r"].verdict.detail == "compute-heavy"  # 300 >= 100
    assert "ridge" not in again.ranges["r"].verdict.reason
    assert again.peak_tflops == {} and again.peak_source == ""


def test_peak_table_matches_model_names_not_substrings():
    assert peaks.lookup("NVIDIA A100-SXM4-80GB").name == "NVIDIA A100 80GB SXM"
    assert peaks.lookup("NVIDIA A10").name == "NVIDIA A10"
    assert peaks.lookup("NVIDIA L40S").name == "NVIDIA L40S"
    assert peaks.lookup("NVIDIA H100 80GB HBM3").name == "NVIDIA H100 SXM"
    assert peaks.lookup("NVIDIA H20").name == "NVIDIA H20"
    assert peaks.lookup("cpu") is None
    assert peaks.lookup("AMD Instinct MI300X").flops_per_s("bf16") == pytest.approx(1307.4e12)
