"""Fitting a window's occurrences into a span budget. Pure, torch-free, public.

The analysis fits each window's occurrences once, in the helper process, to the widest budget
the session's exporters asked for (``report.OccurrenceBudget``); an exporter whose own budget
is smaller fits the report's occurrences again with ``fit``. Exporters may import this module
and ``instrument.base.report``, nothing else of ``instrument``.

The rule (``plan_spans``), at most ``max_spans`` spans with the window's own span: range calls
come before detail (operators, device work); when the range calls alone do not fit, the names
with the most calls are folded first, each into one aggregate occurrence (``range.folded``),
until they do; when even one aggregate per name does not fit, the names that cost the least
CPU time are left out. Detail is kept shallowest first and only under a kept parent, so no
kept occurrence loses its parent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .report import DETAILS, Occurrence, OccurrenceBudget, Occurrences

__all__ = ["FOLDED", "RANGE", "SpanPlan", "assemble", "fit", "plan_spans"]

RANGE = "range"
FOLDED = "range.folded"
_LEVEL = {RANGE: 0, FOLDED: 0, "op": 1}  # anything else is device work: level 2


@dataclass
class SpanPlan:
    """Which of a sequence of occurrences become spans within ``max_spans`` (window span
    included)."""

    kept: list[bool]
    folded: dict[str, list[int]] = field(default_factory=dict)  # name -> its folded indices
    folded_occurrences: int = 0  # range calls folded (an aggregate counts its calls)
    dropped: int = 0  # detail and (past every fold) whole range names left out, in calls

    @property
    def span_count(self) -> int:
        return 1 + sum(self.kept) + len(self.folded)


def plan_spans(nodes: Sequence[Any], max_spans: int) -> SpanPlan:
    """Fit ``nodes`` (``Occurrence``-like: ``kind``, ``name``, ``parent``, ``depth``,
    ``start_ns``, ``calls``, ``cpu_time_us``; parents first) into ``max_spans`` spans (see
    the module docstring). A name that already has a ``range.folded`` aggregate stays folded."""
    budget = max_spans - 1
    ranges = [i for i, n in enumerate(nodes) if n.kind == RANGE or n.kind == FOLDED]
    by_name: dict[str, list[int]] = {}
    calls: dict[str, int] = {}
    for i in ranges:
        name = nodes[i].name
        by_name.setdefault(name, []).append(i)
        calls[name] = calls.get(name, 0) + nodes[i].calls
    folded = sorted({nodes[i].name for i in ranges if nodes[i].kind == FOLDED})
    individual = sum(len(idxs) for name, idxs in by_name.items() if name not in folded)
    if individual + len(folded) > budget:
        for name in sorted(set(by_name) - set(folded), key=lambda n: (-calls[n], n)):
            folded.append(name)
            individual -= len(by_name[name])
            if individual + len(folded) <= budget:
                break
    omitted: list[str] = []
    if individual + len(folded) > budget:  # every name folded, still more names than room
        cost = {n: sum(nodes[i].cpu_time_us for i in by_name[n]) for n in folded}
        folded.sort(key=lambda n: (-cost[n], n))
        folded, omitted = folded[:budget], folded[budget:]
    out = set(folded) | set(omitted)
    kept = [False] * len(nodes)
    for i in ranges:
        kept[i] = nodes[i].name not in out
    plan = SpanPlan(
        kept=kept,
        folded={name: by_name[name] for name in folded},
        folded_occurrences=sum(calls[name] for name in folded),
        dropped=sum(calls[name] for name in omitted),
    )
    room = budget - sum(kept) - len(folded)
    details = sorted(
        (i for i, n in enumerate(nodes) if n.kind != RANGE and n.kind != FOLDED),
        key=lambda i: (nodes[i].depth, nodes[i].start_ns),
    )
    for i in details:
        parent = nodes[i].parent
        if room > 0 and parent >= 0 and kept[parent]:
            kept[i] = True
            room -= 1
        else:
            plan.dropped += 1
    return plan


def assemble(
    nodes: Sequence[Any], plan: SpanPlan, convert: Callable[[Any, int], Occurrence]
) -> tuple[Occurrence, ...]:
    """The occurrences ``plan`` keeps: one aggregate per folded name first, then the kept
    nodes in their order, ``convert(node, parent)`` each, where ``parent`` is the index of the
    nearest kept node around it or of the aggregate it was folded into (-1: none)."""
    out: list[Occurrence] = []
    where = [-1] * len(nodes)  # the index in ``out`` that stands for each node
    for name, idxs in plan.folded.items():
        out.append(
            Occurrence(
                FOLDED,
                name,
                min(nodes[i].start_ns for i in idxs),
                max(nodes[i].end_ns for i in idxs),
                -1,
                0,
                calls=sum(nodes[i].calls for i in idxs),
                cpu_time_us=sum(nodes[i].cpu_time_us for i in idxs),
            )
        )
        for i in idxs:
            where[i] = len(out) - 1
    kept = plan.kept
    for i, node in enumerate(nodes):
        if not kept[i]:
            continue
        p = node.parent
        while p >= 0 and where[p] < 0:
            p = nodes[p].parent
        where[i] = len(out)
        out.append(convert(node, where[p] if p >= 0 else -1))
    return tuple(out)


def fit(occurrences: Occurrences, budget: OccurrenceBudget) -> Occurrences:
    """``occurrences`` fitted again to ``budget``, for an exporter whose budget is smaller
    than the one they were made for (otherwise they are returned as they are)."""
    if budget == occurrences.budget:
        return occurrences
    level = DETAILS.index(budget.detail)
    items = occurrences.items
    index = {}  # old index -> new, for the occurrences at the budget's detail
    nodes: list[Occurrence] = []
    for i, o in enumerate(items):
        if _LEVEL.get(o.kind, 2) <= level:
            index[i] = len(nodes)
            nodes.append(
                replace(
                    o,
                    parent=index.get(o.parent, -1),
                    top_kernels=o.top_kernels[: budget.top_kernels],
                )
            )
    plan = plan_spans(nodes, budget.max_spans)

    kept = assemble(nodes, plan, lambda node, parent: replace(node, parent=parent))
    return Occurrences(
        budget=budget,
        items=kept,
        range_count=occurrences.range_count,
        folded_occurrences=plan.folded_occurrences,
        dropped=occurrences.dropped + (len(items) - len(nodes)) + plan.dropped,
        first_ns=occurrences.first_ns,
        last_ns=occurrences.last_ns,
        calls=occurrences.calls,
    )
