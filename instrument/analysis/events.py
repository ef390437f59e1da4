"""The normalised event both analyses read (``Event``), and its trace-JSON front end.

A window's events come from one of two front ends, both producing the same named tuples:
``events_from_trace`` here reads Chrome/Kineto trace JSON (a saved file, any torch.profiler
user's), and ``instrument.runtime._torch.kineto_events`` reads the profiler's raw Kineto results.
``analysis`` aggregates them into a report's numbers, ``occurrences`` into per-call spans;
both import from here, neither from the other's internals. No torch imports.
"""

from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from .peaks import dtype_name

__all__ = [
    "BOOKKEEPING_NAMES",
    "DEVICE_IN_USE",
    "DROPPED_RECORDS",
    "LAUNCH_NAMES",
    "CPU_OP_CATEGORIES",
    "DEVICE_CATEGORIES",
    "Event",
    "FILTERED_NAMES",
    "PROFILER_WORK_NAMES",
    "RUNTIME_CATEGORIES",
    "UNFINISHED",
    "USER_ANNOTATION",
    "range_annotation",
    "events_from_trace",
    "gc_paused",
    "input_bytes",
    "is_bookkeeping",
    "mm_flops",
    "flops_dtype",
    "flops_dtype_bits",
    "kineto_flops",
    "count_flops_once",
    "no_gc",
]


class Event(NamedTuple):
    """One normalised event. ``kind``: ``cpu`` (an operator, a range or a runtime call),
    ``overhead`` (profiler bookkeeping), or the device kind (``kernel``, ``memcpy``,
    ``memset``). Times are ns (relative to the trace's ``baseTimeNanoseconds`` for trace JSON,
    epoch ns from Kineto). ``ext``: an operator's own id; ``link``: the operator id a runtime
    call or device work points at. The front ends build them with ``tuple.__new__(Event,
    fields)``: ~120 ns, where a NamedTuple's own constructor (a Python function) costs ~300 ns,
    25 ms more on a 140k-event window."""

    kind: str
    name: str
    start: int
    dur: int
    thread: Any  # (pid, tid) in trace JSON; ("cpu", tid), ("os", tid), ("dev", ...) in Kineto's
    ext: int
    link: int
    flops: int
    nbytes: int
    annotation: int  # USER_ANNOTATION | UNFINISHED bits


_tuple_new = tuple.__new__

# ``annotation``'s bits: a user_annotation (a range whatever its name, ``range_annotation``), and
# an event the profiler stopped before it ended (torch's ``"finished": false``: a range still
# open at the stop)
USER_ANNOTATION = 1
UNFINISHED = 2
# bits 2-4: the dtype of an operator's FLOPs (``flops_dtype``), an index into DTYPE_NAMES
DTYPE_SHIFT = 2
DTYPE_NAMES = ("", "fp64", "fp32", "fp16", "bf16", "fp8", "int8", "")
_DTYPE_CODES = {name: i for i, name in enumerate(DTYPE_NAMES) if name}

CPU_OP_CATEGORIES = frozenset({"cpu_op", "user_annotation", "python_function"})
RUNTIME_CATEGORIES = frozenset(
    {
        "cuda_runtime",
        "cuda_driver",
        "privateuse1_runtime",
        "privateuse1_driver",
        "xpu_runtime",
        "xpu_driver",
        "mtia_runtime",
        "hpu_runtime",
    }
)
DEVICE_CATEGORIES = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "mtia_ccp_events": "kernel",
}
# Runtime (and driver) calls that put exactly one piece of device work (a kernel, memcpy or
# memset) on the device: each has its device event, linked to the same operator, unless events
# were lost (``analysis.window_health``). ``cudaGraphLaunch`` (many kernels) and synchronous
# calls that put nothing on a stream are not among them.
LAUNCH_NAMES = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cudaMemcpyAsync",
        "cudaMemcpy",
        "cudaMemcpy2DAsync",
        "cudaMemsetAsync",
        "cudaMemset",
        "cuMemcpyAsync",
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyDtoHAsync_v2",
        "cuMemsetD8Async",
        "cuMemsetD32Async",
        "hipLaunchKernel",
        "hipExtLaunchKernel",
        "hipModuleLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipMemcpyAsync",
        "hipMemcpyWithStream",
        "hipMemsetAsync",
    }
)
# What a window's trace says about the window beyond its events, carried to the analysis as a
# zero-length bookkeeping event (``trace_facts``): the profiled process had initialized CUDA
# (the trace's ``profiledWindow.device_in_use``, written when the SDK shapes it), and records
# the profiler itself said it dropped (the count in the event's ``flops`` slot).
DEVICE_IN_USE = "profiled::device_in_use"
DROPPED_RECORDS = "profiled::dropped_records"
# top-level trace keys whose numbers count records the profiler dropped (Kineto/CUPTI
# versions name them differently; any key with these words and a positive count counts)
_DROPPED_WORDS = ("dropped", "overflow")

# Names torch's own table drops (torch.autograd.profiler_util._filter_name).
FILTERED_NAMES = frozenset(
    {
        "profiler::_record_function_exit",
        "profiler::_call_end_callbacks_on_jit_fut",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit._RecordFunction",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    }
)
BOOKKEEPING_NAMES = frozenset(
    {"Activity Buffer Request", "Iteration Start: PyTorch Profiler", "Record Window End"}
)
BOOKKEEPING_PREFIXES = ("ProfilerStep#", "PyTorch Profiler", "profiled::")
# bookkeeping that is the profiler's own work (not user code between operators, which is what
# the self time of ``ProfilerStep#N`` is): excluded from ranges' CPU and wall time too
PROFILER_WORK_NAMES = frozenset({"Activity Buffer Request", "Iteration Start: PyTorch Profiler"})


def range_annotation(name: str) -> bool:
    """A ``user_annotation`` that is a range: any but torch's own markers, named ``## ... ##``
    (Inductor's ``## Call CompiledFxGraph <key> ##`` around each compiled graph's call), which
    report as operators."""
    return not (name.startswith("## ") and name.endswith(" ##"))


_DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "int": 4,
    "long int": 8,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
}


def is_bookkeeping(name: str) -> bool:
    return name in BOOKKEEPING_NAMES or name.startswith(BOOKKEEPING_PREFIXES)


def dtype_bytes(dtype: str) -> int:
    return _DTYPE_BYTES.get(dtype, 4)


# Scaled-dot-product attention's fused operators, which the profiler's own FLOP count leaves
# out: name -> (index of the query in the inputs, key and value after it; whether the inputs
# are laid out (batch, sequence, heads, dim) rather than SDPA's (batch, heads, sequence, dim)).
# The composite ``aten::scaled_dot_product_attention`` is not here: its math fallback runs
# ``aten::bmm``, which is counted already. On CUDA the ``_scaled_dot_product_*`` operators run
# the kernels' own operators (``_flash_attention_forward``, ...) inside them, on transposed
# inputs: both give the same count, and ``count_flops_once`` keeps the inner one.
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": (0, False),
    "aten::_scaled_dot_product_efficient_attention": (0, False),
    "aten::_scaled_dot_product_cudnn_attention": (0, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, False),
    "aten::_flash_attention_forward": (0, True),
    "aten::_efficient_attention_forward": (0, True),
}
SDPA_BACKWARD_OPS = {
    "aten::_scaled_dot_product_flash_attention_backward": (1, False),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, False),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (1, False),
    "aten::_flash_attention_backward": (1, True),
    "aten::_efficient_attention_backward": (1, True),
}


def _sdpa_flops(dims: list[Any], at: int, seq_first: bool) -> int:
    """torch.utils.flop_counter's formula: QK^T and PV, 2*b*h*s_q*s_k*(d_q + d_v) (0 for
    the variable-length form, whose 3-d inputs do not say the sequences' lengths)."""
    q, k, v = dims[at], dims[at + 1], dims[at + 2]
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return 0
    if seq_first:
        b, s_q, h, d_q = q
        s_k = k[1]
    else:
        b, h, s_q, d_q = q
        s_k = k[2]
    return 2 * b * h * s_q * s_k * (d_q + v[3])


def mm_flops(name: str, dims: list[Any]) -> int:
    """FLOPs of an operator from its input shapes: the matrix products torch's ``with_flops``
    counts (used for traces: torch 2.13's trace JSON carries shapes but no FLOP counts), and
    scaled-dot-product attention, which torch's count leaves out (torch.utils.flop_counter's
    forward formula; the backward twice the forward, as for the same attention written out in
    matrix products: torch.utils.flop_counter's fused backward also counts recomputing the
    scores, 2.5 times the forward where the query's and value's widths are equal)."""
    try:
        if name == "aten::mm" and len(dims[0]) == 2 and len(dims[1]) == 2:
            (m, k), (_, n) = dims[0], dims[1]
            return 2 * m * k * n
        if name == "aten::addmm" and len(dims[1]) == 2 and len(dims[2]) == 2:
            (m, k), (_, n) = dims[1], dims[2]
            return 2 * m * k * n
        if name == "aten::bmm" and len(dims[0]) == 3 and len(dims[1]) == 3:
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return 2 * b * m * k * n
        if name == "aten::baddbmm" and len(dims[1]) == 3 and len(dims[2]) == 3:
            (b, m, k), (_, _, n) = dims[1], dims[2]
            return 2 * b * m * k * n
        if name in SDPA_OPS:
            return _sdpa_flops(dims, *SDPA_OPS[name])
        if name in SDPA_BACKWARD_OPS:
            return 2 * _sdpa_flops(dims, *SDPA_BACKWARD_OPS[name])
    except (TypeError, ValueError, IndexError):
        return 0
    return 0


SDPA_NAMES = frozenset(SDPA_OPS) | frozenset(SDPA_BACKWARD_OPS)

ELEMENTWISE_FLOP_OPS = frozenset({"aten::mul", "aten::add", "aten::mul_", "aten::add_"})
"""Operators torch's ``with_flops`` gives one FLOP per element. Not counted: FLOPs here are
matrix products, convolutions and attention, as torch.utils.flop_counter and MFU as the
frameworks report it count them (torch 2.13's trace JSON carries no counts, so only the
in-process analysis and older torch's traces had them)."""


def count_flops_once(events: list[Event], carrying: Iterable[int]) -> None:
    """In place: an operator that carries FLOPs and has another that does inside it, on its
    thread, carries none; the innermost ones count. torch records an operator that dispatches
    again as two, one inside the other: under autocast ``aten::addmm`` (or ``mm``, ``bmm``,
    ``conv2d``) once with the fp32 inputs and once inside with the bf16 ones, the same FLOPs
    (and the same for a ``TorchDispatchMode`` around the code); a fused attention operator runs
    its kernel's operator inside it. Counting both put a bf16 GPT's FLOPs per step 28% over
    ``measure_flops`` (FlopCounterMode sees the inner call only). The inner one is the call
    that ran, in the dtype it ran in. ``carrying``: the indices of the events with FLOPs."""
    by_thread: dict[Any, list[int]] = {}
    for i in carrying:
        by_thread.setdefault(events[i].thread, []).append(i)
    outer: set[int] = set()
    for indices in by_thread.values():
        if len(indices) < 2:
            continue
        indices.sort(key=lambda i: (events[i].start, -events[i].dur))  # parents first
        open_ends: list[tuple[int, int]] = []  # (end, index) of the enclosing ones
        for i in indices:
            ev = events[i]
            while open_ends and open_ends[-1][0] <= ev.start:
                open_ends.pop()
            if open_ends:  # begins inside another: nested (a thread's events never cross)
                outer.add(open_ends[-1][1])
            open_ends.append((ev.start + ev.dur, i))
    for i in outer:
        events[i] = events[i]._replace(flops=0, nbytes=0)


def kineto_flops(
    name: str, flops: int, shapes: Callable[[], Any], dtypes: Callable[[], Any]
) -> tuple[int, int, int]:
    """(FLOPs, input bytes, dtype bits) of a Kineto operator event: the profiler's own count
    (``flops``), else ours for attention; shapes and dtypes are read only when needed."""
    if name in ELEMENTWISE_FLOP_OPS:
        flops = 0
    elif not flops and name in SDPA_NAMES:
        flops = mm_flops(name, shapes())
    if not flops:
        return 0, 0, 0
    types = dtypes()
    return flops, input_bytes(shapes(), types), flops_dtype_bits(types)


def flops_dtype_bits(dtypes: Iterable[Any]) -> int:
    """The ``annotation`` bits naming the dtype an operator's FLOPs ran in: its first
    floating (or int8) input's."""
    for dtype in dtypes:
        code = _DTYPE_CODES.get(dtype_name(str(dtype)))
        if code:
            return code << DTYPE_SHIFT
    return 0


def flops_dtype(annotation: int) -> str:
    """The dtype name ``flops_dtype_bits`` put in ``annotation`` ("" when unknown)."""
    return DTYPE_NAMES[(annotation >> DTYPE_SHIFT) & 7]


def input_bytes(dims: Iterable[Any], dtypes: Iterable[Any]) -> int:
    total = 0
    for shape, dtype in zip(dims, dtypes):
        if isinstance(shape, list) and all(isinstance(d, int) for d in shape) and shape:
            n = 1
            for d in shape:
                n *= d
            total += n * dtype_bytes(str(dtype))
    return total


# ---------------------------------------------------------------- trace JSON front end


def events_from_trace(trace: Mapping[str, Any]) -> list[Event]:
    """Normalise a Chrome/Kineto trace's events (``export_chrome_trace`` output), with the
    trace's facts about its window (``trace_facts``) as bookkeeping events after them."""
    carrying: list[int] = []
    with no_gc():
        out = _events_from_trace(trace, carrying)
        count_flops_once(out, carrying)
    out.extend(trace_facts(trace, out))
    return out


def trace_facts(trace: Mapping[str, Any], events: list[Event]) -> list[Event]:
    """The trace's facts the window's health needs (``DEVICE_IN_USE``, ``DROPPED_RECORDS``),
    as zero-length bookkeeping events at the window's first event (so they move no span)."""
    facts = []
    info = trace.get("profiledWindow")
    if isinstance(info, Mapping) and info.get("device_in_use") is True:
        facts.append(DEVICE_IN_USE)
    dropped = dropped_records(trace)
    if not facts and not dropped:
        return []
    at = min((ev.start for ev in events), default=0)
    thread = ("profiled", "facts")
    return [
        _tuple_new(
            Event,
            (
                "overhead",
                name,
                at,
                0,
                thread,
                0,
                0,
                dropped if name == DROPPED_RECORDS else 0,
                0,
                0,
            ),
        )
        for name in facts + ([DROPPED_RECORDS] if dropped else [])
    ]


def dropped_records(trace: Mapping[str, Any]) -> int:
    """Records the profiler says it dropped (0: none said): the sum of positive counts under
    top-level keys (and keys of top-level objects) named with "dropped" or "overflow", and the
    messages of Kineto's logger metadata (top-level ``WARNING`` / ``ERROR`` lists, written on
    its on-demand path, pytorch/kineto#1336) that say so, each its first number (else 1)."""
    total = 0
    for key, value in trace.items():
        if key == "traceEvents":
            continue
        if key.upper() in _LOG_KEYS and isinstance(value, (list, str)):
            total += _dropped_in_messages([value] if isinstance(value, str) else value)
            continue
        items = value.items() if isinstance(value, Mapping) else ((key, value),)
        for name, count in items:
            if not isinstance(name, str) or not any(w in name.lower() for w in _DROPPED_WORDS):
                continue
            if isinstance(count, (int, float)) and not isinstance(count, bool) and count > 0:
                total += int(count)
    return total


_LOG_KEYS = frozenset({"WARNING", "WARNINGS", "ERROR", "ERRORS"})
_NUMBER = re.compile(r"\d+")


def _dropped_in_messages(messages: Iterable[Any]) -> int:
    total = 0
    for message in messages:
        if isinstance(message, str) and any(w in message.lower() for w in _DROPPED_WORDS):
            number = _NUMBER.search(message)
            total += int(number.group()) if number else 1
    return total


def _events_from_trace(trace: Mapping[str, Any], carrying: list[int]) -> list[Event]:
    """The trace's events, normalised; the indices of those with FLOPs go to ``carrying``."""
    out: list[Event] = []
    append = out.append
    new = _tuple_new
    for ev in trace.get("traceEvents", ()):
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        name = ev.get("name", "")
        try:
            start = round(float(ev.get("ts", 0.0)) * 1000.0)
            dur = round(float(ev.get("dur", 0.0)) * 1000.0)
        except (TypeError, ValueError):
            continue
        args = ev.get("args") or {}
        thread = (ev.get("pid"), ev.get("tid"))
        if cat in CPU_OP_CATEGORIES:
            if name in FILTERED_NAMES:
                continue
            if is_bookkeeping(name):
                append(new(Event, ("overhead", name, start, dur, thread, 0, 0, 0, 0, 0)))
                continue
            flops = 0 if name in ELEMENTWISE_FLOP_OPS else int(args.get("flops", 0) or 0)
            nbytes = flags = 0
            dims = args.get("Input Dims")
            if dims is not None:
                if not flops:
                    flops = mm_flops(name, dims)
                if flops:
                    types = args.get("Input type") or ()
                    nbytes = input_bytes(dims, types)
                    flags = flops_dtype_bits(types)
            ext = int(args.get("External id", 0) or 0)
            if cat == "user_annotation" and range_annotation(name):
                flags |= USER_ANNOTATION
            if args.get("finished") is False:
                flags |= UNFINISHED
            if flops:
                carrying.append(len(out))
            append(new(Event, ("cpu", name, start, dur, thread, ext, 0, flops, nbytes, flags)))
        elif cat in RUNTIME_CATEGORIES:
            if is_bookkeeping(name):
                append(new(Event, ("overhead", name, start, dur, thread, 0, 0, 0, 0, 0)))
                continue
            link = int(args.get("External id", 0) or 0)
            append(new(Event, ("cpu", name, start, dur, thread, 0, link, 0, 0, 0)))
        elif cat in DEVICE_CATEGORIES:
            link = int(args.get("External id", 0) or 0)
            kind = DEVICE_CATEGORIES[cat]
            append(new(Event, (kind, name, start, dur, thread, 0, link, 0, 0, 0)))
        elif cat == "overhead" or (cat != "Trace" and is_bookkeeping(name)):
            append(new(Event, ("overhead", name, start, dur, thread, 0, 0, 0, 0, 0)))
    return out


def _order(ev: Event) -> tuple[int, int]:
    return (ev.start, -ev.dur)  # parents (same start, longer) before their children


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    if not intervals:
        return 0
    intervals.sort()
    total = 0
    cur_s, cur_e = intervals[0]
    for s, e in intervals[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return total + cur_e - cur_s


_gc_paused = False


def gc_paused() -> bool:
    """True while ``no_gc`` has the (process-wide) collector paused: a child forked meanwhile
    must turn it back on."""
    return _gc_paused


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building 100k+ tuples and lists that hold no
    cycles: otherwise its generation-0 passes rescan them over and over (~30% of the time;
    for ``Event`` named tuples, which the collector never untracks, ~2x). Nests: an inner
    block leaves the collector (and ``gc_paused``) to the outer one."""
    global _gc_paused
    was_enabled = gc.isenabled()
    if not was_enabled:  # paused by an outer block, or by the program: not ours to change
        yield
        return
    gc.disable()
    _gc_paused = was_enabled
    try:
        yield
    finally:
        _gc_paused = False
        gc.enable()
