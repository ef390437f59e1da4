"""The HTML timeline draws every range at every zoom (issue 30, item 5).

Found by a new user: a 0.2 ms range followed at once by a 232 ms ``train_step`` on the same
row; at the default zoom (the whole window, ~1 ms a pixel) both start in one pixel column, and
the page drew that column for the short one and skipped every other event starting in it, the
step among them (and ``forward``, whose row had the short range's child just before it). Now
a row's sub-pixel events still merge into one pixel, and each event a pixel wide or more among
them is drawn over it.

Pages are made by ``torch-profiled report`` (``html_report.main``) from hand-made traces in
Kineto's shape (exact durations: a real window's would vary) and opened in headless Chromium,
as ``tests/test_html_report.py`` does; what is checked is the canvas's own pixels: along each
long range's bar, on its row, every pixel is one opaque colour, and its name is written on it.
"""

from __future__ import annotations

import json
import os

import pytest

from instrument.cli import html_command as html_report
from tests import test_html_report as pages
from tests.test_html_report import CHROMIUM, Opened

# the page tests' fixtures: one headless Chromium per module, pages closed after each test
browser = pages.browser
opened = pages.opened

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="needs Chromium (apt-get install chromium)"
)

STEP_US = 240_000.0
STEPS = 5


def _x(name: str, cat: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": 7, "ts": ts, "dur": dur}


def _trace(step_events) -> dict:
    """``STEPS`` steps of 240 ms; ``step_events(t)`` gives each step's events from ``t`` (us)."""
    events = [{"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "main"}}]
    for k in range(STEPS):
        t = 1_000_000.0 + k * STEP_US
        events.append(_x(f"ProfilerStep#{k}", "user_annotation", t, STEP_US - 10))
        events.extend(step_events(t))
    return {"traceEvents": events, "baseTimeNanoseconds": 1_765_000_000_000_000_000}


def _user_case(t: float) -> list[dict]:
    """A 0.2 ms range (with an operator inside), at once a 232 ms step holding forward."""
    return [
        _x("load_batch", "user_annotation", t + 50, 200),
        _x("aten::copy_", "cpu_op", t + 60, 150),
        _x("train_step", "user_annotation", t + 250, 232_000),
        _x("forward", "user_annotation", t + 260, 150_000),
        _x("aten::linear", "cpu_op", t + 270, 140_000),
        _x("backward", "user_annotation", t + 150_300, 70_000),
        _x("optimizer_step", "user_annotation", t + 220_400, 11_000),
    ]


def _slivers_first(t: float) -> list[dict]:
    """25 ranges of 8 us back to back, then the step."""
    short = [_x("fetch", "user_annotation", t + 20 + 8 * i, 8) for i in range(25)]
    return short + [_x("train_step", "user_annotation", t + 220, 232_000)]


def _long_first(t: float) -> list[dict]:
    """The step first, then a 0.2 ms range, then at once a second long one."""
    return [
        _x("train_step", "user_annotation", t + 20, 232_000),
        _x("log", "user_annotation", t + 232_030, 200),
        _x("eval_step", "user_annotation", t + 232_230, 7_000),
    ]


CASES = {
    "user_case": (_user_case, ["train_step", "forward"]),
    "slivers_first": (_slivers_first, ["train_step"]),
    "long_first": (_long_first, ["train_step", "eval_step"]),
}


def _page(tmp_path, shape) -> str:
    trace = tmp_path / "w.pt.trace.json"
    trace.write_text(json.dumps(_trace(shape)))
    out = str(tmp_path / "w.html")
    assert html_report.main([str(trace), "-o", out]) == 0
    return out


def _events(o: Opened) -> list[tuple[int, int, int, int, str]]:
    """Every embedded event of window 0: (lane, row, start ns, end ns, name)."""
    data = o.js("JSON.parse(document.getElementById('profiled-data').textContent)")
    tl = data["windows"][0]
    out = []
    for li, lane in enumerate(tl["lanes"]):
        for ri, row in enumerate(lane["rows"]):
            t = 0
            for s, d, n in zip(row["s"], row["d"], row["n"]):
                t += s
                out.append((li, ri, t, t + d, tl["names"][n][0]))
    return out


# the canvas pixels (RGBA) at row (lane, row), for each time in ns: ``dy`` CSS px below the
# row's top, ``dx`` CSS px right of where the time is drawn
_PIXELS = """([lane, row, times, dxs, dy]) => {
  const c = document.querySelector('.timeline canvas'), ctx = c.getContext('2d');
  const r = c.width / c.getBoundingClientRect().width, out = [];
  for (const ns of times) {
    const [x, top] = window.__profiled.where(0, lane, row, ns);
    for (const dx of dxs) {
      const px = ctx.getImageData(Math.floor((x + dx) * r), Math.floor((top + dy) * r), 1, 1);
      out.push(Array.from(px.data));
    }
  }
  return out;
}"""


def _pixels(o: Opened, lane: int, row: int, times: list[float], dx=(0,), dy=1.5) -> list:
    """RGBA of the canvas at each time on row (lane, row), ``dx`` px right of it and ``dy``
    px below the row's top (1.5: the bar's top line, above its label)."""
    return o.page.evaluate(_PIXELS, [lane, row, times, list(dx), dy])


def _x_of(o: Opened, ns: float) -> float:
    """Where time ``ns`` is drawn on the canvas (CSS px)."""
    return float(o.js(f"window.__profiled.where(0, 0, 0, {ns})[0]"))


def _check_bar(o: Opened, ev, label: bool) -> None:
    """Range ``ev`` is drawn along its whole visible part: one opaque colour on its row's top
    line (above the label); with ``label``, its name is written on it (white pixels)."""
    lane, row, s, e, name = ev
    v0, v1 = o.view()
    a, b = max(s, v0), min(e, v1)
    xa, xb = _x_of(o, a), _x_of(o, b)
    if xb - xa < 6:  # too little of it in view to sample between its anti-aliased ends
        return
    # inside its end pixels: 2 px in from each end, and 5 points between
    times = [a + (b - a) * f for f in (0.2, 0.4, 0.5, 0.6, 0.8)]
    times += [a + (b - a) * 2.5 / (xb - xa), b - (b - a) * 2.5 / (xb - xa)]
    seen = _pixels(o, lane, row, times)
    where = (name, s, e, (v0, v1))
    assert all(p[3] == 255 for p in seen), (where, seen)  # drawn, not the cleared canvas
    assert len({tuple(p) for p in seen}) == 1, (where, seen)  # by one bar
    if label:  # the label starts 3 px into the bar, 3 px below the row's top
        spots = [
            p for dy in (6.5, 8.5, 10.5) for p in _pixels(o, lane, row, [a], dx=range(4, 40), dy=dy)
        ]
        assert any(min(p[:3]) >= 235 for p in spots), (where, sorted(spots)[-5:])


@pytest.mark.parametrize("case", list(CASES))
def test_a_long_range_in_a_slivers_pixel_column_is_drawn_at_every_zoom(case, opened, tmp_path):
    shape, longs = CASES[case]
    o = opened(_page(tmp_path, shape))
    o.clean()
    events = _events(o)
    assert o.js("window.__profiled.visibleEvents(0)") == len(events)  # each counted once
    bars = [ev for ev in events if ev[4] in longs]
    assert len(bars) == STEPS * len(longs)
    # the case is there: at the default zoom some long range starts in the pixel column of
    # the event just before it on its row (before the fix, that column hid it)
    shared = 0
    for ev in bars:
        before = [p[2] for p in events if p[:2] == ev[:2] and p[2] < ev[2]]
        shared += bool(before) and int(_x_of(o, max(before))) == int(_x_of(o, ev[2]))
    assert shared >= 2, case
    for zoom in range(7):  # the whole window, then 2x, 4x ... 64x around its middle
        for ev in bars:
            _check_bar(o, ev, label=zoom == 0 and ev[3] - ev[2] > 100_000_000)
        o.act("in")
    # the pixel columns still cost what they did: one rectangle per sliver column at most,
    # plus each long range
    o.act("reset")
    assert o.js("window.__profiled.drawnRects(0)") <= len(events)
    o.clean()
