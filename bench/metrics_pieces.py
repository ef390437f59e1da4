#!/usr/bin/env python
"""Where the metrics-only call's time goes, piece by piece, on this interpreter and CPU.

    python bench/metrics_pieces.py            # about 10 s
    python bench/metrics_pieces.py --quick    # a few seconds, noisy
    git show REV:instrument/metrics.py > /tmp/old_metrics.py
    python bench/metrics_pieces.py --fold-of /tmp/old_metrics.py   # both folds, alternating

``bench/overhead.py`` compares the metrics-on ``@profiled`` call with a flag-checking closure
(issue 17's target: at most 3x). This bench explains that ratio on a given machine: it builds
copies of the decorator's metrics-only path from one template, each with one piece taken out,
and times them side by side with ``bench/overhead.py``'s timer (rotated order, median of the
repeats). A piece's cost is the full copy's time minus the copy without it. The real
decorated call is timed in the same rounds, so the copy can be checked against it.

Pieces: ``flag`` (the metrics-only check), ``dynamo`` (the Dynamo check), ``clock`` (the two
clock reads and the difference), ``try`` (the ``try/finally`` around the call), ``append``
(the second clock read, the append and the batch-length check, and so the fold), ``fold``
(the fold every ``metrics.BATCH`` calls, amortized). With ``--fold-of``, the copy folding
with another version's fold is timed in the same rounds (``copy, other fold``), and that
fold alone beside this one's. Two other shapes are timed beside them:
durations as ints of ``time.perf_counter_ns()`` (an earlier version), and the profiler flag
checked on the path (an earlier version; now a profiler start clears ``_COUNT_ONLY``).

It also prints the fold alone, ns per duration (CPU time of this process: other processes on
a shared box move it less than wall time), on batches of five shapes: under the first bound
(one bucket, no sub-buckets to split); within 10% of 12 ms (one power of two, a few of its 32
sub-buckets: most ranges); a log-normal of sigma 0.3 (a few powers of two); two modes a
thousand times apart (a cache hit and a miss: two bands of fields); a log-normal of sigma 1.5
(a dozen powers of two). Then what one clock read costs on this host
(``time.perf_counter()`` beside a builtin call that reads no clock, ``id(None)``) and the
kernel's clock source: where that is not ``tsc`` (some virtual machines), a clock read leaves
the vDSO for the hypervisor or the kernel, and the two reads of every timed call cost several
times what they cost elsewhere.

The exit code is 0 whatever the figures: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import timeit
import warnings
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (REPO, os.path.join(REPO, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

from overhead import _calibrate, _set_up_idle, _time, plain_closure, trivial  # noqa: E402

# The decorator's metrics-only path (instrument/runtime/decorator.py, ``_wrap_sync``).
TEMPLATE = """
def make(f, pending, fold, name):
    append = pending.append
    def wrapper(*args, **kwargs):
        if _COUNT_ONLY is not None and not _is_dynamo_compiling():
            t0 = _now()
            try:
                return f(*args, **kwargs)
            finally:
                append((_now() - t0) * 1e9)
                if len(pending) >= _BATCH:
                    fold(name)
        if _IDLE:
            return f(*args, **kwargs)
        return f(*args, **kwargs)
    return wrapper
"""

_TIMED = """            try:
                return f(*args, **kwargs)
            finally:
                append((_now() - t0) * 1e9)
                if len(pending) >= _BATCH:
                    fold(name)
"""

# piece -> the edits of TEMPLATE that take it out
WITHOUT: dict[str, list[tuple[str, str]]] = {
    "flag": [("_COUNT_ONLY is not None and not ", "not ")],
    "dynamo": [(" and not _is_dynamo_compiling()", "")],
    "clock": [("            t0 = _now()\n", ""), ("(_now() - t0) * 1e9", "0.0")],
    "try": [
        (
            _TIMED,
            _TIMED.replace("            try:\n", "")
            .replace("                return f(", "            result = f(")
            .replace("            finally:\n", "")
            .replace("\n                ", "\n            ")
            .replace("                append", "            append")
            + "            return result\n",
        )
    ],
    "append": [
        (
            "                append((_now() - t0) * 1e9)\n"
            "                if len(pending) >= _BATCH:\n                    fold(name)\n",
            "                pass\n",
        )
    ],
    "fold": [("fold(name)\n", "del pending[:]\n")],
}
PIECES = tuple(WITHOUT)
# other shapes of the same path, timed beside it: what an earlier version did
OTHERS: dict[str, list[tuple[str, str]]] = {
    "int ns clock": [("(_now() - t0) * 1e9", "_now_ns() - t0"), ("t0 = _now()", "t0 = _now_ns()")],
    "+ profiler flag": [
        (
            "_COUNT_ONLY is not None and not",
            "_COUNT_ONLY is not None and not _FLAG._is_profiler_enabled and not",
        )
    ],
}


def _source(without: str | None) -> str:
    src = TEMPLATE
    for old, new in {**WITHOUT, **OTHERS}.get(without or "", []):
        assert old in src, f"the template changed: {old!r} is not in it"
        src = src.replace(old, new)
    return src


def _variant(
    without: str | None, names: dict[str, Any], range_name: str, module: Any = None
) -> Callable[..., Any]:
    """The copy without ``without``, folding into the recorder of ``module`` (another
    version's metrics module: a recorder of its own) or of this checkout."""
    from instrument.runtime import metrics

    recorder = metrics.recorder if module is None else module.Recorder()
    ns = dict(names)
    exec(compile(_source(without), f"<copy without {without}>", "exec"), ns)  # noqa: S102
    pending = recorder.pending_list(range_name)
    return ns["make"](trivial, pending, recorder.fold, range_name)


def _names() -> dict[str, Any]:
    from instrument.runtime import _torch, decorator

    return {
        "_IDLE": False,
        "_COUNT_ONLY": object(),
        "_FLAG": _torch.PROFILER_FLAG,
        "_is_dynamo_compiling": _torch.is_dynamo_compiling,
        "_now": decorator._now,
        "_now_ns": time.perf_counter_ns,
        "_BATCH": decorator._BATCH,
    }


def _clock_source() -> str:
    path = "/sys/devices/system/clocksource/clocksource0/current_clocksource"
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _clock_read_ns(repeats: int) -> dict[str, float]:
    """One ``time.perf_counter()`` call and one ``id(None)`` call, ns (best of ``repeats``)."""
    number = 200_000
    timings = {"perf_counter()": "now()", "id(None)": "ident(None)"}
    names = {"now": time.perf_counter, "ident": id}
    return {
        label: min(timeit.repeat(stmt, globals=names, number=number, repeat=repeats)) / number * 1e9
        for label, stmt in timings.items()
    }


def _fold_of(path: str) -> Any:
    """The ``instrument.runtime.metrics`` module of another version, from its file (``git show
    REV:instrument/metrics.py > FILE``), loaded beside this one to time its fold."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("instrument._metrics_of_another_version", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--fold-of {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "instrument"  # its relative imports: this checkout's modules
    spec.loader.exec_module(module)
    return module


def _fold_ns(repeats: int, other: Any = None) -> dict[str, dict[str, float]]:
    """``metrics._fold`` alone, ns per duration, on 50 batches of ``BATCH`` of each shape;
    with ``other`` (another version's module), its fold too, the two alternating."""
    import random

    from instrument.runtime import metrics

    rng = random.Random(1)
    n = metrics.BATCH * 50
    shapes = {
        "under 1 us": [rng.uniform(150, 250) for _ in range(n)],
        "within 10%": [rng.uniform(11e6, 13e6) for _ in range(n)],
        "log-normal 0.3": [rng.lognormvariate(16, 0.3) for _ in range(n)],
        "hit/miss": [rng.choice((rng.uniform(4e3, 6e3), rng.uniform(4e6, 6e6))) for _ in range(n)],
        "log-normal 1.5": [rng.lognormvariate(8, 1.5) for _ in range(n)],
    }

    def fold_all(module: Any, durations: list[float]) -> None:
        folded: dict[str, list[Any]] = {}
        for i in range(0, n, module.BATCH):
            module._fold(folded, "x", durations[i : i + module.BATCH])

    versions = {"this": metrics, **({"other": other} if other is not None else {})}
    best: dict[str, dict[str, float]] = {v: {} for v in versions}
    for _ in range(repeats):  # the versions alternate, shape by shape
        for label, durations in shapes.items():
            for version, module in versions.items():
                took = timeit.timeit(
                    lambda m=module, d=durations: fold_all(m, d), number=1, timer=time.process_time
                )
                ns = took / n * 1e9
                best[version][label] = min(best[version].get(label, ns), ns)
    return best


def run(quick: bool, fold_of: str | None = None) -> dict[str, Any]:
    for key in [k for k in os.environ if k.startswith("PROFILED_")]:
        del os.environ[key]
    import torch  # noqa: F401 - import cost outside the measurements

    import instrument
    from instrument import profiled
    from instrument.runtime import _torch, decorator
    from instrument.runtime import state as sdk_state

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the setup window's messages are not the subject
        _set_up_idle(instrument, decorator, profiled("bench.pieces.setup")(trivial))

    names = _names()
    variants: dict[str, Callable[..., Any]] = {
        "closure": plain_closure(trivial),
        "decorated": profiled("bench.pieces.decorated")(trivial),
        "copy": _variant(None, names, "bench.pieces.copy"),
    }
    for piece in PIECES:
        variants[f"without {piece}"] = _variant(piece, names, f"bench.pieces.{piece}")
    for label in OTHERS:
        variants[label] = _variant(label, names, f"bench.pieces.{label}")
    other = _fold_of(fold_of) if fold_of else None
    if other is not None:  # the same call, folding with the other version's fold
        variants["copy, other fold"] = _variant(None, names, "bench.pieces.other", other)
    for f in variants.values():
        f(1)  # each compiles and runs
    repeats, target_s = (3, 0.003) if quick else (11, 0.02)
    samples: dict[str, list[float]] = {key: [] for key in variants}
    sdk_state.set_metrics(True)
    try:
        assert decorator._COUNT_ONLY is not None, "the metrics-only path is not the one on"
        loops = {key: _calibrate(f, target_s) for key, f in variants.items()}
        keys = list(variants)
        for r in range(repeats):
            k = r % len(keys)
            for key in keys[k:] + keys[:k]:
                samples[key].append(_time(variants[key], loops[key]))
    finally:
        sdk_state.set_metrics(False)
    median = {key: statistics.median(values) for key, values in samples.items()}
    check = _torch.is_dynamo_compiling
    return {
        "python": platform.python_version(),
        "torch": _torch.TORCH_VERSION,
        "dynamo_check": f"{check.__module__}.{check.__qualname__}",
        "median_ns": median,
        "pieces_ns": {p: median["copy"] - median[f"without {p}"] for p in PIECES},
        "clock_source": _clock_source(),
        "call_ns": _clock_read_ns(3 if quick else 7),
        "fold_ns": _fold_ns(3 if quick else 11, other),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, noisy")
    parser.add_argument(
        "--fold-of",
        metavar="FILE",
        help="another version's instrument/metrics.py (git show REV:instrument/metrics.py): "
        "its fold is timed too, alternating with this one's",
    )
    args = parser.parse_args()
    result = run(args.quick, args.fold_of)
    median = result["median_ns"]
    closure = median["closure"]
    print(
        f"python {result['python']}, torch {result['torch']}, Dynamo check {result['dynamo_check']}"
    )
    print(f"{'variant':<18} {'ns/call':>8} {'x closure':>10}")
    for key, ns in median.items():
        print(f"{key:<18} {ns:8.1f} {ns / closure:10.2f}")
    if "copy, other fold" in median:
        print(f"(copy, other fold: the copy folding with {args.fold_of}'s fold)")
    print("pieces (the copy minus the copy without it), ns/call:")
    for piece, ns in result["pieces_ns"].items():
        print(f"  {piece:<8} {ns:+7.1f}")
    for version, by_shape in result["fold_ns"].items():
        folds = ", ".join(f"{label} {ns:.1f}" for label, ns in by_shape.items())
        name = "this version's" if version == "this" else f"{args.fold_of}'s"
        print(f"{name} fold alone, ns per duration (CPU time): {folds}")
    calls = result["call_ns"]
    clock = calls["perf_counter()"] - calls["id(None)"]
    print(
        f"one clock read: perf_counter() {calls['perf_counter()']:.1f} ns, id(None) "
        f"{calls['id(None)']:.1f} ns: the clock itself {clock:+.1f} ns "
        f"(clock source {result['clock_source']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
