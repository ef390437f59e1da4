// torch-profiled HTML report: the timeline. Inline in every page (exporters/html_page.py);
// reads the JSON block #profiled-data and draws one canvas per window. No network, no library.
//
// Each lane (a CPU thread, a device stream) holds rows by nesting depth; a row's events are
// sorted by start, with a running maximum of their ends, so the events in view are found by
// binary search. An event narrower than a pixel is drawn as one pixel column together with
// every other event of its row starting in that column (one search skips them), so a frame
// costs about (rows x pixels), not (events): 140k events pan as smoothly as 100. An event a
// pixel wide or more among them is drawn over that column in full: a tree of the row's
// durations finds it without visiting the slivers (a 0.2 ms range just before a 232 ms step
// used to hide the step at the default zoom).
(function () {
  "use strict";
  var ROW_H = 16, LANE_GAP = 8, LABEL_W = 190, AXIS_H = 22, MIN_SPAN_NS = 100;
  var CATEGORY_HUE = {
    user_annotation: 275, gpu_user_annotation: 275, cpu_op: 212, cuda_runtime: 30,
    cuda_driver: 20, kernel: 145, gpu_memcpy: 50, gpu_memset: 10, python_function: 190
  };

  function timeText(ns) {
    // as the tables print times (format_time_us): 23.104us, 2.314ms, 1.250s
    var us = ns / 1000, sign = us < 0 ? "-" : "";
    us = Math.abs(us);
    if (Number(us.toFixed(3)) < 1000) return sign + us.toFixed(3) + "us";
    if (Number((us / 1e3).toFixed(3)) < 1000) return sign + (us / 1e3).toFixed(3) + "ms";
    return sign + (us / 1e6).toFixed(3) + "s";
  }

  function hash(text) {
    var h = 0;
    for (var i = 0; i < text.length; i++) h = (h * 31 + text.charCodeAt(i)) | 0;
    return h;
  }

  function colorOf(name, cat) {
    var hue = CATEGORY_HUE.hasOwnProperty(cat) ? CATEGORY_HUE[cat] : 220;
    if (/^ProfilerStep#/.test(name)) return "hsl(220,8%,78%)";
    var h = hash(name), light = 52 + (Math.abs(h) % 5) * 5, shift = (Math.abs(h >> 3) % 21) - 10;
    var sat = cat === "cpu_op" || cat === "kernel" ? 55 : 62;
    return "hsl(" + (hue + shift) + "," + sat + "%," + light + "%)";
  }

  // first index in [lo, hi) whose value is >= x (arr sorted ascending)
  function lowerBound(arr, x, lo, hi) {
    while (lo < hi) {
      var mid = (lo + hi) >>> 1;
      if (arr[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  // first index whose running-maximum end is > x
  function firstEndingAfter(maxEnd, x) {
    var lo = 0, hi = maxEnd.length;
    while (lo < hi) {
      var mid = (lo + hi) >>> 1;
      if (maxEnd[mid] <= x) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  // the first index in [lo, hi) whose duration is >= w, or hi: a walk up and to the right
  // from leaf lo through subtrees holding only shorter events, then down to the first leaf
  // that is long enough (O(log n), however many short events lie between)
  function firstAtLeast(row, lo, hi, w) {
    var tree = row.longest, size = row.leaves, p = lo + size, span = 1;
    if (lo >= hi) return hi;
    for (;;) {
      if (tree[p] >= w) {
        while (p < size) {
          p <<= 1;
          if (tree[p] < w) p++;
        }
        return Math.min(p - size, hi);
      }
      while (p & 1) { p >>= 1; span <<= 1; }  // climb while p is a right child
      if (p === 0) return hi;
      p++;  // the subtree just right of those searched
      if (p * span - size >= hi) return hi;
    }
  }

  function decodeRow(row) {
    var n = row.s.length, s = new Float64Array(n), e = new Float64Array(n);
    var m = new Float64Array(n), k = new Int32Array(n), t = 0, most = -Infinity;
    var size = 1;
    while (size < n) size <<= 1;
    // a max tree of the durations: longest[size + i] is event i's, each node its children's
    // longest (float32 is plenty to compare against a pixel's width)
    var longest = new Float32Array(2 * size).fill(-1);
    for (var i = 0; i < n; i++) {
      t += row.s[i];
      s[i] = t;
      e[i] = t + row.d[i];
      k[i] = row.n[i];
      if (e[i] > most) most = e[i];
      m[i] = most;
      longest[size + i] = row.d[i];
    }
    for (var p = size - 1; p > 0; p--) longest[p] = Math.max(longest[2 * p], longest[2 * p + 1]);
    return { s: s, e: e, m: m, k: k, longest: longest, leaves: size };
  }

  function Timeline(root, tl) {
    this.root = root;
    this.tl = tl;
    this.canvas = root.querySelector("canvas");
    this.ctx = this.canvas.getContext("2d");
    this.tip = root.querySelector(".tip");
    this.spanLabel = root.querySelector(".span");
    this.names = tl.names.map(function (p) { return p[0]; });
    this.cats = tl.names.map(function (p) { return p[1]; });
    this.colors = tl.names.map(function (p) { return colorOf(p[0], p[1]); });
    this.rows = [];
    this.lanes = [];
    var y = AXIS_H;
    for (var li = 0; li < tl.lanes.length; li++) {
      var lane = tl.lanes[li], top = y;
      for (var ri = 0; ri < lane.rows.length; ri++) {
        var row = decodeRow(lane.rows[ri]);
        row.y = y;
        this.rows.push(row);
        y += ROW_H;
      }
      this.lanes.push({
        label: lane.label, device: lane.device, top: top, bottom: y,
        first: this.rows.length - lane.rows.length
      });
      y += LANE_GAP;
    }
    this.height = Math.max(y, AXIS_H + ROW_H);
    this.full = [0, Math.max(tl.end_ns, MIN_SPAN_NS)];
    this.v0 = this.full[0];
    this.v1 = this.full[1];
    this.visible = 0;
    this.rects = 0;
    this.draws = 0;
    this.pending = false;
    this.bind();
    this.resize();
  }

  Timeline.prototype.resize = function () {
    var ratio = window.devicePixelRatio || 1;
    this.width = Math.max(this.root.clientWidth - 2, LABEL_W + 100);
    this.canvas.width = Math.round(this.width * ratio);
    this.canvas.height = Math.round(this.height * ratio);
    this.canvas.style.width = this.width + "px";
    this.canvas.style.height = this.height + "px";
    this.ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    this.draw();
  };

  Timeline.prototype.schedule = function () {
    var self = this;
    if (this.pending) return;
    this.pending = true;
    window.requestAnimationFrame(function () { self.pending = false; self.draw(); });
  };

  Timeline.prototype.setView = function (v0, v1) {
    var span = Math.max(v1 - v0, MIN_SPAN_NS), whole = this.full[1] - this.full[0];
    if (span >= whole) { v0 = this.full[0]; span = whole; }
    v0 = Math.min(Math.max(v0, this.full[0]), this.full[1] - span);
    this.v0 = v0;
    this.v1 = v0 + span;
  };

  Timeline.prototype.zoom = function (factor, fraction) {
    var f = fraction === undefined ? 0.5 : fraction, span = this.v1 - this.v0;
    var at = this.v0 + span * f, next = span * factor;
    this.setView(at - next * f, at - next * f + next);
  };

  Timeline.prototype.pan = function (fraction) {
    var span = this.v1 - this.v0;
    this.setView(this.v0 + span * fraction, this.v1 + span * fraction);
  };

  Timeline.prototype.plotWidth = function () { return this.width - LABEL_W; };

  Timeline.prototype.drawAxis = function (ctx) {
    var span = this.v1 - this.v0, w = this.plotWidth(), raw = span / 8;
    var step = Math.pow(10, Math.floor(Math.log10(raw)));
    if (raw / step >= 5) step *= 5; else if (raw / step >= 2) step *= 2;
    ctx.fillStyle = "#f6f7f9";
    ctx.fillRect(0, 0, this.width, AXIS_H);
    ctx.strokeStyle = "#e3e6ec";
    ctx.fillStyle = "#667085";
    ctx.font = "11px ui-monospace, Menlo, Consolas, monospace";
    ctx.textBaseline = "middle";
    ctx.beginPath();
    for (var t = Math.ceil(this.v0 / step) * step; t <= this.v1; t += step) {
      var x = LABEL_W + ((t - this.v0) / span) * w;
      ctx.moveTo(Math.round(x) + 0.5, AXIS_H - 5);
      ctx.lineTo(Math.round(x) + 0.5, this.height);
      ctx.fillText(timeText(t).replace(/\.?0+([a-z]+)$/, "$1"), x + 3, AXIS_H / 2);
    }
    ctx.stroke();
  };

  Timeline.prototype.drawLabels = function (ctx) {
    ctx.font = "12px system-ui, sans-serif";
    ctx.textBaseline = "top";
    for (var i = 0; i < this.lanes.length; i++) {
      var lane = this.lanes[i];
      ctx.fillStyle = lane.device ? "#eef7f2" : "#eef2f9";
      ctx.fillRect(0, lane.top, LABEL_W - 4, lane.bottom - lane.top);
      ctx.fillStyle = "#1d2330";
      var label = lane.label.length > 28 ? lane.label.slice(0, 27) + "\u2026" : lane.label;
      ctx.fillText(label, 6, lane.top + 2);
      ctx.strokeStyle = "#e3e6ec";
      ctx.beginPath();
      ctx.moveTo(0, lane.bottom + LANE_GAP / 2);
      ctx.lineTo(this.width, lane.bottom + LANE_GAP / 2);
      ctx.stroke();
    }
  };

  // event i as a bar from x0 to x1 (at least a pixel), with its name where it fits
  Timeline.prototype.drawEvent = function (ctx, row, i, x0, x1) {
    ctx.fillStyle = this.colors[row.k[i]];
    ctx.fillRect(x0, row.y + 1, Math.max(x1 - x0, 1), ROW_H - 2);
    if (x1 - x0 > 28) {
      var name = this.names[row.k[i]], fit = Math.floor((x1 - x0 - 6) / 6.6);
      ctx.fillStyle = "#fff";
      ctx.fillText(name.length > fit ? name.slice(0, Math.max(fit - 1, 1)) + "\u2026" : name,
        x0 + 3, row.y + 3);
    }
  };

  Timeline.prototype.drawRow = function (ctx, row, scale) {
    var v0 = this.v0, v1 = this.v1, n = row.s.length, right = this.width, pixel = 1 / scale;
    var i = firstEndingAfter(row.m, v0), visible = 0, rects = 0;
    var wide = row.longest[1] >= pixel;  // any event of the row a pixel wide or more
    while (i < n) {
      var s = row.s[i];
      if (s >= v1) break;
      var e = row.e[i];
      if (e <= v0) { i++; continue; }
      var x0 = LABEL_W + (s - v0) * scale, x1 = LABEL_W + (e - v0) * scale;
      if (x0 < LABEL_W) x0 = LABEL_W;
      if (x1 > right) x1 = right;
      if (x1 - x0 < 1) {
        // this event and every later one of the row that starts in the same pixel column,
        // as one pixel; then, over it, each of those a pixel wide or more (a long event
        // starting just after a sliver), found through the tree, not by visiting them all
        var px = Math.floor(x0), next = v0 + (px + 1 - LABEL_W) / scale;
        var j = Math.max(lowerBound(row.s, next, i + 1, n), i + 1);
        ctx.fillStyle = this.colors[row.k[i]];
        ctx.fillRect(px, row.y + 1, 1, ROW_H - 2);
        visible += j - i;
        rects++;
        for (var l = wide ? firstAtLeast(row, i + 1, j, pixel) : j; l < j; ) {
          var l0 = LABEL_W + (row.s[l] - v0) * scale, l1 = LABEL_W + (row.e[l] - v0) * scale;
          this.drawEvent(ctx, row, l, Math.max(l0, LABEL_W), Math.min(l1, right));
          rects++;
          l = firstAtLeast(row, l + 1, j, pixel);
        }
        i = j;
        continue;
      }
      this.drawEvent(ctx, row, i, x0, x1);
      visible++;
      rects++;
      i++;
    }
    this.visible += visible;
    this.rects += rects;
  };

  Timeline.prototype.draw = function () {
    var started = performance.now(), ctx = this.ctx, scale = this.plotWidth() / (this.v1 - this.v0);
    ctx.clearRect(0, 0, this.width, this.height);
    this.drawAxis(ctx);
    this.drawLabels(ctx);
    ctx.save();
    ctx.beginPath();
    ctx.rect(LABEL_W, AXIS_H, this.plotWidth(), this.height - AXIS_H);
    ctx.clip();
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "top";
    this.visible = 0;
    this.rects = 0;
    for (var r = 0; r < this.rows.length; r++) this.drawRow(ctx, this.rows[r], scale);
    ctx.restore();
    this.draws++;
    this.drawMs = performance.now() - started;
    if (this.spanLabel) {
      this.spanLabel.textContent = timeText(this.v0) + " \u2013 " + timeText(this.v1) +
        " (" + timeText(this.v1 - this.v0) + " in view)";
    }
  };

  // the event under canvas point (x, y), or null
  Timeline.prototype.hit = function (x, y) {
    if (x < LABEL_W) return null;
    var t = this.v0 + ((x - LABEL_W) / this.plotWidth()) * (this.v1 - this.v0);
    var slack = 2 * (this.v1 - this.v0) / this.plotWidth();
    for (var r = 0; r < this.rows.length; r++) {
      var row = this.rows[r];
      if (y < row.y || y >= row.y + ROW_H) continue;
      var i = lowerBound(row.s, t + slack, 0, row.s.length) - 1;
      for (; i >= 0 && row.m[i] >= t - slack; i--) {
        if (row.s[i] <= t + slack && row.e[i] >= t - slack) {
          return { row: row, i: i };
        }
      }
    }
    return null;
  };

  Timeline.prototype.showTip = function (ev, found) {
    if (!found) { this.tip.hidden = true; return; }
    var row = found.row, i = found.i, k = row.k[i];
    this.tip.textContent = this.names[k] + "  [" + this.cats[k] + "]  " +
      timeText(row.e[i] - row.s[i]) + " at " + timeText(row.s[i]);
    var box = this.root.getBoundingClientRect();
    this.tip.style.left = Math.min(ev.clientX - box.left + 12, box.width - 300) + "px";
    this.tip.style.top = (ev.clientY - box.top + 14) + "px";
    this.tip.hidden = false;
  };

  Timeline.prototype.point = function (ev) {
    var box = this.canvas.getBoundingClientRect();
    return { x: ev.clientX - box.left, y: ev.clientY - box.top };
  };

  Timeline.prototype.bind = function () {
    var self = this, canvas = this.canvas, drag = null;
    canvas.addEventListener("wheel", function (ev) {
      var p = self.point(ev);
      if (p.x < LABEL_W) return;
      ev.preventDefault();
      self.zoom(Math.exp(ev.deltaY * 0.002), (p.x - LABEL_W) / self.plotWidth());
      self.schedule();
    }, { passive: false });
    canvas.addEventListener("pointerdown", function (ev) {
      drag = { x: ev.clientX, v0: self.v0, v1: self.v1 };
      canvas.setPointerCapture(ev.pointerId);
      canvas.classList.add("dragging");
    });
    canvas.addEventListener("pointermove", function (ev) {
      if (drag) {
        var dt = ((drag.x - ev.clientX) / self.plotWidth()) * (drag.v1 - drag.v0);
        self.setView(drag.v0 + dt, drag.v1 + dt);
        self.schedule();
        return;
      }
      var p = self.point(ev);
      self.showTip(ev, self.hit(p.x, p.y));
    });
    function end() { drag = null; canvas.classList.remove("dragging"); }
    canvas.addEventListener("pointerup", end);
    canvas.addEventListener("pointercancel", end);
    canvas.addEventListener("pointerleave", function () { self.tip.hidden = true; });
    canvas.addEventListener("dblclick", function (ev) {
      var p = self.point(ev), found = self.hit(p.x, p.y);
      if (!found) return;
      var s = found.row.s[found.i], e = found.row.e[found.i], pad = (e - s) * 0.1 + 50;
      self.setView(s - pad, e + pad);
      self.schedule();
    });
    var acts = {
      "in": function () { self.zoom(0.5); }, out: function () { self.zoom(2); },
      left: function () { self.pan(-0.25); }, right: function () { self.pan(0.25); },
      reset: function () { self.setView(self.full[0], self.full[1]); }
    };
    this.root.querySelectorAll(".toolbar button").forEach(function (button) {
      button.addEventListener("click", function () {
        acts[button.getAttribute("data-act")]();
        self.schedule();
      });
    });
  };

  var data = JSON.parse(document.getElementById("profiled-data").textContent);
  var timelines = [];
  document.querySelectorAll(".timeline").forEach(function (root) {
    var index = Number(root.getAttribute("data-window")), tl = data.windows[index];
    if (tl) timelines[index] = new Timeline(root, tl);
  });
  window.addEventListener("resize", function () {
    timelines.forEach(function (t) { if (t) t.resize(); });
  });

  function at(i) {
    var t = timelines[i || 0];
    if (!t) throw new Error("no timeline for window " + (i || 0));
    return t;
  }

  // the canvas point (CSS px) where time ns of lane `lane`'s row `row` is drawn: [x, the
  // row's top, its height]; bars fill from top + 1 to top + height - 1
  function where(i, lane, row, ns) {
    var t = at(i), r = t.rows[t.lanes[lane].first + row];
    return [LABEL_W + ((ns - t.v0) / (t.v1 - t.v0)) * t.plotWidth(), r.y, ROW_H];
  }

  // read-only hooks for tests and scripts: what the last frame drew, the view in ns from
  // the timeline's start (zoom and pan go through the page's own controls), and where a
  // lane's row and a time are on the canvas (to read back its pixels)
  window.__profiled = Object.freeze({
    where: where,
    timelines: function () { return timelines.filter(Boolean).length; },
    visibleEvents: function (i) { return at(i).visible; },
    drawnRects: function (i) { return at(i).rects; },
    draws: function (i) { return at(i).draws; },
    drawMs: function (i) { return at(i).drawMs; },
    view: function (i) { var t = at(i); return [t.v0, t.v1]; },
    full: function (i) { var t = at(i); return [t.full[0], t.full[1]]; }
  });
})();
