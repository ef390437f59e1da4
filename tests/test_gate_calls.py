"""The gate's per-window value is the window's median call (``instrument.cli.gate``, issue 30).

A late wake-up on a busy runner slows single calls, not whole windows: under load (average 6
on two cores) every baseline window of a real run had a call or two slowed by several ms, and
the windows' means (their time over their calls) carried them into the baseline's floor, so a
1.2x regression read +8% and passed at 10%. Here each window is a real ``WindowReport`` with
each of its calls' durations (``RangeCalls``, what the CLI reads from a trace), judged by
``gate.gate`` as the CLI judges traces. The same windows without their calls' durations are
judged by their means (the old rule, and the fallback): the cases are the ones it gets wrong.
The real-program side of it: ``tests/test_gate.py``.
"""

from __future__ import annotations

import pytest

from instrument.base.report import FrozenMap, RangeCalls, RangeStats, WindowReport
from instrument.cli import gate
from instrument.cli.diff import Side, Window

NAME = "train_step"
CALLS = 5
JITTER = (0.0, 0.03, 0.01, 0.05, 0.02)  # ms a call: an undisturbed window's calls


def _window(calls_ms, *, carried=True, device=False, extra_calls=0):
    """A window of ``NAME`` whose calls took ``calls_ms`` (CPU, or device with ``device``);
    ``carried``: the window carries each call's duration; ``extra_calls``: calls the report
    counts beyond the durations carried (a call nested in a call of the same name)."""
    us = sum(calls_ms) * 1000
    cpu_us, dev_us = (us, us) if device else (us, 0.0)
    stats = RangeStats(NAME, len(calls_ms) + extra_calls, cpu_us, cpu_us, dev_us, 0)
    rep = WindowReport(
        0, (1,), False, 0, 1, 0, 1, "h", 1, "cuda:0" if device else "cpu",
        ("cpu", "cuda") if device else ("cpu",), ranges=FrozenMap({NAME: stats}),
    )  # fmt: skip
    ns = tuple(round(ms * 1e6) for ms in calls_ms)
    calls = RangeCalls(ns, ns if device else tuple(0 for _ in ns))
    return Window(rep, None, FrozenMap({NAME: calls}) if carried else None)


def _side(windows, path):
    return Side(path, tuple(f"{path}/w{i}.pt.trace.json" for i in range(len(windows))), windows)


def _calls(per_call_ms, woken=()):
    """A window's calls: ``per_call_ms`` each (plus a little jitter), the calls at the indexes
    of ``woken`` (index -> ms) slowed by a late wake-up."""
    return [per_call_ms + JITTER[i] + dict(woken).get(i, 0.0) for i in range(CALLS)]


# every baseline window with one or two calls woken late (12 ms once, or 6 ms twice: +2.4 ms
# on the window's mean, what the failing run's baseline showed), at different calls
WOKEN = [
    {0: 12.0}, {2: 6.0, 3: 6.0}, {4: 12.5}, {1: 6.5, 4: 6.0},
    {3: 13.0}, {0: 6.0, 1: 7.0}, {2: 12.0}, {1: 6.0, 3: 6.5},
]  # fmt: skip


def _judge(before, after, threshold=0.10, metric="cpu"):
    g = gate.gate(
        _side(before, "before"), _side(after, "after"), gate.GateOptions(threshold, metric)
    )
    (v,) = g["verdicts"]
    return g, v


def _pair(before_ms, after_ms, woken_before, woken_after, **kw):
    before = tuple(_window(_calls(before_ms, w), **kw) for w in woken_before)
    after = tuple(_window(_calls(after_ms, w), **kw) for w in woken_after)
    return before, after


def test_late_wake_ups_in_every_baseline_window_never_pass_a_1_2x_regression():
    """The failure: the means (the old rule; and the fallback, without each call's duration)
    pass the 1.2x; the median call catches it, at 10% and 15%."""
    quiet = [{}] * len(WOKEN)
    for kw in ({}, {"device": True}):
        metric = "device" if kw else "cpu"
        means = _pair(20.0, 24.0, WOKEN, quiet, carried=False, **kw)
        g, v = _judge(*means, metric=metric)
        assert v["per_window"] == "mean" and v["status"] == "pass", v  # what went wrong
        assert 0.05 < v["change"] < 0.10
        for threshold in (0.10, 0.15):
            g, v = _judge(*_pair(20.0, 24.0, WOKEN, quiet, **kw), threshold, metric)
            assert v["per_window"] == "median call", v
            assert v["status"] == "regression" and g["exit_status"] == 1, v
            assert v["low"] > 0.18 and v["change"] == pytest.approx(0.2, abs=0.01)
            assert v["before"]["value"] == pytest.approx(20.01e3, abs=30)  # µs: undisturbed
            assert "each its median call" in v["reason"]


def test_late_wake_ups_on_one_side_move_no_verdict():
    """The class: wake-ups in every window of either side, in an A/A pair (a pass), a 1.2x
    regression and a 1.2x speed-up: each verdict is what it is without them."""
    quiet = [{}] * len(WOKEN)
    cases = {"pass": (20.0, 20.0), "regression": (20.0, 24.0), "faster": (24.0, 20.0)}
    for expected, (b_ms, a_ms) in cases.items():
        _, plain = _judge(*_pair(b_ms, a_ms, quiet, quiet))
        for woken_b, woken_a in ((WOKEN, quiet), (quiet, WOKEN), (WOKEN, WOKEN[::-1])):
            _, v = _judge(*_pair(b_ms, a_ms, woken_b, woken_a))
            status = "pass" if expected == "faster" else expected
            assert v["status"] == status, (expected, v)
            assert v["change"] == pytest.approx(plain["change"], abs=0.005)
    # the means fail the A/A whose candidate windows were all woken late (+12%)
    _, v = _judge(*_pair(20.0, 20.0, quiet, WOKEN, carried=False))
    assert v["status"] == "regression", v


def test_a_window_without_every_call_s_duration_makes_both_sides_means():
    """Where one window does not carry each call's duration (read without them, or a call
    nested in a call of the same name, which the report counts and the durations do not), a
    window's value is its mean on both sides, and the JSON says so: never a median on one side
    against means on the other."""
    quiet = [{}] * len(WOKEN)
    for kw in ({"carried": False}, {"extra_calls": 1}):
        before, after = _pair(20.0, 20.0, quiet, quiet)
        odd = _window(_calls(20.0), **kw)
        for b, a in ((before[:3] + (odd,) + before[4:], after), (before, (odd,) + after[1:])):
            _, v = _judge(b, a)
            assert v["per_window"] == "mean", (kw, v)
            assert "median call" not in v["reason"]
            means = [w.report.ranges[NAME].cpu_time_us / w.report.ranges[NAME].calls for w in b]
            assert v["before"]["windows"] == pytest.approx(means)


def test_flops_keeps_its_rule_and_the_pooled_figure_stays_the_mean():
    before, after = _pair(20.0, 24.0, WOKEN, [{}] * len(WOKEN))
    _, v = _judge(before, after)
    total = sum(w.report.ranges[NAME].cpu_time_us for w in before)
    assert v["before"]["pooled"] == pytest.approx(total / (CALLS * len(before)))
    assert v["before"]["calls"] == CALLS * len(before)
    # FLOP/s: the window's FLOPs over its time, whatever the calls carry
    with_flops = []
    for w in before + after:
        r = w.report.ranges[NAME]
        r = RangeStats(NAME, r.calls, r.cpu_time_us, r.cpu_time_us, 0.0, 0, flops=10**9)
        rep = WindowReport(
            0, (1,), False, 0, 1, 0, 1, "h", 1, "cpu", ("cpu",), ranges=FrozenMap({NAME: r})
        )
        with_flops.append(Window(rep, None, w.calls))
    n = len(before)
    _, v = _judge(tuple(with_flops[:n]), tuple(with_flops[n:]), metric="flops")
    assert v["per_window"] == "mean"
    assert v["before"]["windows"] == pytest.approx(
        [1e9 / (w.report.ranges[NAME].cpu_time_us * 1e-6) for w in before]
    )
