// allocview's HTML report: draws the data embedded in the page (#report-data) with canvas
// and the DOM, nothing fetched. Each drawn area is marked `data-drawn="1"` once drawn, so a
// test in a headless browser can tell a drawn page from a broken one.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var P = D.palette;
  var app = document.getElementById("app");
  var printing = false;
  var redraws = [];

  // ---- helpers -------------------------------------------------------------------------
  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (k === "text") e.textContent = attrs[k];
        else if (k === "cls") e.className = attrs[k];
        else if (k.slice(0, 2) === "on") e.addEventListener(k.slice(2), attrs[k]);
        else e.setAttribute(k, attrs[k]);
      });
    }
    (kids || []).forEach(function (c) {
      if (c == null) return;
      e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return e;
  }
  // As allocview's `format::bytes`: binary units, three significant figures.
  function bytes(n) {
    if (n == null) return "-";
    var neg = n < 0; n = Math.abs(n);
    if (n < 1024) return (neg ? "-" : "") + Math.round(n) + " B";
    var units = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"], v = n / 1024, u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    var s = v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0);
    return (neg ? "-" : "") + s + " " + units[u];
  }
  function count(n) { return n == null ? "-" : Number(n).toLocaleString("en-US"); }
  function secs(s) {
    var a = Math.abs(s);
    if (a === 0) return "0 s";
    if (a < 1e-3) return (s * 1e6).toPrecision(3) + " µs";
    if (a < 1) return (s * 1e3).toPrecision(3) + " ms";
    return s.toPrecision(4) + " s";
  }
  function pct(f) { return (100 * f).toFixed(1) + "%"; }
  function policyColour(i) { return P.policies[(i - 1) % P.policies.length]; }
  function colours() {
    return printing
      ? { bg: "#ffffff", grid: "#dddddd", text: "#222222", live: "#555555", empty: "#ffffff", free: "#d8dce4" }
      : { bg: "#24262c", grid: "#3a3d45", text: "#b0b0b0", live: P.live, empty: "#24262c", free: P.free };
  }
  var tip = el("div", { cls: "tip" });
  document.body.appendChild(tip);
  function showTip(ev, text) {
    tip.textContent = text;
    tip.style.display = "block";
    var x = ev.clientX + 14, y = ev.clientY + 14;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    if (x + w > window.innerWidth - 4) x = ev.clientX - w - 14;
    if (y + h > window.innerHeight - 4) y = ev.clientY - h - 14;
    tip.style.left = Math.max(0, x) + "px";
    tip.style.top = Math.max(0, y) + "px";
  }
  function hideTip() { tip.style.display = "none"; }
  // A canvas `cssH` pixels high filling its container, sharp on high-density screens.
  function canvasIn(box, cssH) {
    var c = el("canvas");
    box.appendChild(c);
    function size() {
      var w = Math.max(300, box.clientWidth - 8);
      var r = window.devicePixelRatio || 1;
      c.width = Math.round(w * r); c.height = Math.round(cssH * r);
      c.style.width = w + "px"; c.style.height = cssH + "px";
      var ctx = c.getContext("2d");
      ctx.setTransform(r, 0, 0, r, 0, 0);
      return { ctx: ctx, w: w, h: cssH };
    }
    return { canvas: c, size: size };
  }
  function niceStep(range, n) {
    var raw = range / Math.max(1, n), p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var m = raw / p;
    return (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10) * p;
  }
  function byteStep(max, n) {
    // Steps that read well in binary units: 1, 2, 5 times a power of 1024.
    var raw = max / Math.max(1, n), unit = 1;
    while (raw >= 1024 * unit) unit *= 1024;
    return niceStep(raw / unit, 1) * unit;
  }
  // Index of the last element of sorted `a` at or before `x` (0 when none).
  function lastAtOrBefore(a, x) {
    var lo = 0, hi = a.length - 1;
    if (hi < 0 || x < a[0]) return 0;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (a[mid] <= x) lo = mid; else hi = mid - 1; }
    return lo;
  }
  function section(title, id) {
    var s = el("section", { id: id }, [el("h2", { text: title })]);
    app.appendChild(s);
    return s;
  }
  function sortableTable(columns, rows, opts) {
    // columns: [{title, key(row) -> sortable value, cell(row) -> node|string, num}]
    opts = opts || {};
    var table = el("table", { cls: opts.cls || "" });
    var thead = el("thead"), tbody = el("tbody"), tr = el("tr");
    var sortCol = opts.sort == null ? -1 : opts.sort, asc = false;
    columns.forEach(function (c, i) {
      var th = el("th", { cls: (c.num ? "num " : "") + (c.key ? "sortable" : ""), text: c.title });
      if (c.key) th.addEventListener("click", function () {
        asc = sortCol === i ? !asc : !!c.asc; sortCol = i; fill();
      });
      tr.appendChild(th);
    });
    thead.appendChild(tr); table.appendChild(thead); table.appendChild(tbody);
    function fill() {
      Array.prototype.forEach.call(tr.children, function (th, i) {
        th.classList.toggle("sorted", i === sortCol); th.classList.toggle("asc", i === sortCol && asc);
      });
      var sorted = rows.slice();
      if (sortCol >= 0) {
        var key = columns[sortCol].key;
        sorted.sort(function (a, b) {
          var x = key(a), y = key(b), r = x < y ? -1 : x > y ? 1 : 0;
          return asc ? r : -r;
        });
      }
      tbody.textContent = "";
      if (opts.limit && !showAll) sorted = sorted.slice(0, opts.limit);
      sorted.forEach(function (r) {
        var row = el("tr", { cls: opts.rowCls || "" });
        columns.forEach(function (c) {
          var v = c.cell(r);
          row.appendChild(el("td", { cls: c.num ? "num" : "" }, [typeof v === "string" ? v : v]));
        });
        tbody.appendChild(row);
        if (opts.expand) opts.expand(r, row, tbody);
      });
    }
    var showAll = false;
    fill();
    if (opts.limit && rows.length > opts.limit) {
      // Long tables show their first rows; the rest are a click away (and printed in full).
      var more = el("button", { cls: "btn more", text: "show all " + rows.length + " rows" });
      more.addEventListener("click", function () {
        showAll = !showAll; more.textContent = showAll ? "show the first " + opts.limit : "show all " + rows.length + " rows"; fill();
      });
      window.addEventListener("beforeprint", function () { showAll = true; fill(); });
      var wrap = el("div", {}, [table, more]);
      wrap.table = table;
      return wrap;
    }
    return table;
  }

  // ---- header and summary --------------------------------------------------------------
  function header() {
    app.appendChild(el("h1", { text: D.title }));
    app.appendChild(el("div", { cls: "sub", text: "allocview " + D.version +
      " \u2014 a self-contained page: every figure below is embedded in this file." }));
  }
  function card(k, v) { return el("div", { cls: "card" }, [el("div", { cls: "k", text: k }), el("div", { cls: "v", text: v })]); }
  function summary(run, label) {
    var box = section("Summary" + (label ? " \u2014 " + label : "") + ": " + run.file, "summary" + (label || ""));
    var cards = el("div", { cls: "cards" });
    cards.appendChild(card("format", run.format || "-"));
    if (run.timeline) {
      cards.appendChild(card("events", count(run.events)));
      cards.appendChild(card("duration", secs(run.duration_s)));
      cards.appendChild(card("peak live", bytes(run.peak_live_bytes)));
      cards.appendChild(card("peak live at", secs(run.peak_live_t_s)));
    } else {
      cards.appendChild(card("live (requested)", bytes(run.peak_live_bytes)));
    }
    box.appendChild(cards);
    if (run.rows.length) {
      var peak = run.peak_live_bytes;
      box.appendChild(sortableTable([
        { title: "policy", key: function (r) { return r.name; }, asc: true, cell: function (r) {
          return el("span", {}, [el("span", { cls: "swatch", style: "background:" +
            (r.measured ? P.recorded : policyColour(r.i + 1)) }), r.name + (r.measured ? " (measured)" : "")]);
        } },
        { title: "peak footprint", num: true, key: function (r) { return r.peak_footprint_bytes; }, cell: function (r) { return bytes(r.peak_footprint_bytes); } },
        { title: "over peak live", num: true, key: function (r) { return r.peak_footprint_bytes; }, cell: function (r) { return peak ? (r.peak_footprint_bytes / peak).toFixed(3) + "x" : "-"; } },
        { title: "final footprint", num: true, key: function (r) { return r.final_footprint_bytes; }, cell: function (r) { return bytes(r.final_footprint_bytes); } },
        { title: "fragmentation at peak", num: true, key: function (r) { return r.fragmentation_at_peak; }, cell: function (r) { return pct(r.fragmentation_at_peak); } },
        { title: "mean fragmentation", num: true, key: function (r) { return r.mean_fragmentation; }, cell: function (r) { return pct(r.mean_fragmentation); } },
        { title: "OOMs", num: true, key: function (r) { return r.ooms; }, cell: function (r) {
          return r.ooms ? el("span", { cls: "oom", text: count(r.ooms) }) : "0"; } }
      ], run.rows.map(function (r, i) { r.i = i; return r; }), { cls: "policies" }));
      var ooms = run.rows.filter(function (r) { return r.first_oom; });
      if (ooms.length) {
        box.appendChild(el("h3", { text: "Out of memory" }));
        box.appendChild(el("ul", { cls: "notes" }, ooms.map(function (r) {
          return el("li", {}, [el("b", { text: r.name + ": " }), r.first_oom]);
        })));
      }
    }
    if (run.notes && run.notes.length) {
      box.appendChild(el("h3", { text: "What the input says" }));
      box.appendChild(el("ul", { cls: "notes" }, run.notes.map(function (n) { return el("li", { text: n }); })));
    }
  }

  // ---- timeline ------------------------------------------------------------------------
  // series: [{name, colour, t, v, dash, on}]; marks: [{t, colour, label, top}]
  function timeline(box, series, marks, id) {
    var chart = el("div", { cls: "chart", id: id });
    var legend = el("div", { cls: "legend" });
    box.appendChild(legend);
    box.appendChild(chart);
    box.appendChild(el("div", { cls: "hint", text: "wheel or drag to zoom (shift+drag pans), double-click to reset; hover for values; click a legend entry to hide its line" }));
    var cv = canvasIn(chart, 360);
    var tmax = 0;
    series.forEach(function (s) { if (s.t.length) tmax = Math.max(tmax, s.t[s.t.length - 1]); });
    marks.forEach(function (m) { tmax = Math.max(tmax, m.t); });
    if (tmax <= 0) tmax = 1;
    var view = { x0: 0, x1: tmax }, hover = null, drag = null;
    var M = { l: 74, r: 14, t: 12, b: 30 };
    series.forEach(function (s) {
      var item = el("span", { cls: "item" }, [el("span", { cls: "swatch", style: "background:" + s.colour +
        (s.dash ? ";background:repeating-linear-gradient(90deg," + s.colour + " 0 4px,transparent 4px 7px)" : "") }), s.name]);
      item.addEventListener("click", function () { s.on = !s.on; item.classList.toggle("off", !s.on); draw(); });
      legend.appendChild(item);
    });
    // One legend entry per kind of vertical drawn (OOM, phase, the run's marks).
    var kinds = [];
    marks.forEach(function (m) {
      if (kinds.indexOf(m.kind) < 0) {
        kinds.push(m.kind);
        legend.appendChild(el("span", {}, [el("span", { cls: "swatch", style: "background:" + m.colour }), m.kind]));
      }
    });
    var g;
    function xOf(t) { return M.l + (t - view.x0) / (view.x1 - view.x0) * (g.w - M.l - M.r); }
    function tOf(x) { return view.x0 + (x - M.l) / (g.w - M.l - M.r) * (view.x1 - view.x0); }
    function draw() {
      g = cv.size();
      var ctx = g.ctx, C = colours(), pw = g.w - M.l - M.r, ph = g.h - M.t - M.b;
      ctx.fillStyle = C.bg; ctx.fillRect(0, 0, g.w, g.h);
      var ymax = 1;
      series.forEach(function (s) {
        if (!s.on) return;
        var i0 = Math.max(0, lastAtOrBefore(s.t, view.x0)), i1 = lastAtOrBefore(s.t, view.x1);
        for (var i = i0; i <= i1 && i < s.v.length; i++) ymax = Math.max(ymax, s.v[i]);
      });
      ymax *= 1.05;
      function yOf(v) { return M.t + ph - v / ymax * ph; }
      ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = C.text; ctx.strokeStyle = C.grid; ctx.lineWidth = 1;
      var ys = byteStep(ymax, 6);
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (var y = 0; y <= ymax; y += ys) {
        var py = Math.round(yOf(y)) + 0.5;
        ctx.beginPath(); ctx.moveTo(M.l, py); ctx.lineTo(g.w - M.r, py); ctx.stroke();
        ctx.fillText(bytes(y), M.l - 6, py);
      }
      var xs = niceStep(view.x1 - view.x0, 8);
      ctx.textAlign = "center"; ctx.textBaseline = "top";
      for (var x = Math.ceil(view.x0 / xs) * xs; x <= view.x1; x += xs) {
        var px = Math.round(xOf(x)) + 0.5;
        ctx.beginPath(); ctx.moveTo(px, M.t); ctx.lineTo(px, M.t + ph); ctx.stroke();
        ctx.fillText(secs(x), px, M.t + ph + 6);
      }
      ctx.save();
      ctx.beginPath(); ctx.rect(M.l, M.t, pw, ph); ctx.clip();
      series.forEach(function (s) {
        if (!s.on) return;
        ctx.strokeStyle = s.live ? C.live : s.colour; ctx.lineWidth = s.live ? 2 : 1.6;
        ctx.setLineDash(s.dash ? [6, 4] : []);
        ctx.beginPath();
        var i0 = Math.max(0, lastAtOrBefore(s.t, view.x0) - 1), i1 = Math.min(s.t.length - 1, lastAtOrBefore(s.t, view.x1) + 1);
        for (var i = i0; i <= i1; i++) {
          var px = xOf(s.t[i]), py = yOf(s.v[i]);
          if (i === i0) ctx.moveTo(px, py); else ctx.lineTo(px, py);
        }
        ctx.stroke();
      });
      ctx.setLineDash([]);
      marks.forEach(function (m) {
        if (m.t < view.x0 || m.t > view.x1) return;
        var px = xOf(m.t);
        ctx.fillStyle = m.colour;
        if (m.top) {
          ctx.globalAlpha = 0.5; ctx.fillRect(px, M.t, 1, ph); ctx.globalAlpha = 1;
          ctx.fillRect(px - 3, M.t, 7, 6);
        } else {
          ctx.beginPath(); ctx.moveTo(px, M.t + ph - 9); ctx.lineTo(px - 5, M.t + ph); ctx.lineTo(px + 5, M.t + ph); ctx.fill();
        }
      });
      if (hover != null) {
        ctx.strokeStyle = P.cursor; ctx.lineWidth = 1;
        ctx.beginPath(); ctx.moveTo(xOf(hover) + 0.5, M.t); ctx.lineTo(xOf(hover) + 0.5, M.t + ph); ctx.stroke();
      }
      if (drag && drag.zoom && drag.x1 != null) {
        ctx.fillStyle = "rgba(78,161,255,0.18)";
        ctx.fillRect(Math.min(drag.x, drag.x1), M.t, Math.abs(drag.x1 - drag.x), ph);
      }
      ctx.restore();
      ctx.strokeStyle = C.grid; ctx.strokeRect(M.l + 0.5, M.t + 0.5, pw, ph);
      chart.setAttribute("data-drawn", "1");
    }
    function readout(t) {
      var lines = ["t = " + secs(t)];
      series.forEach(function (s) {
        if (!s.on || !s.t.length) return;
        var i = lastAtOrBefore(s.t, t);
        lines.push(s.name + ": " + bytes(s.v[i]) + (s.frag ? "  (fragmentation " + pct(s.frag[i] || 0) + ")" : ""));
      });
      marks.forEach(function (m) {
        if (Math.abs(xOf(m.t) - xOf(t)) < 4) lines.push(m.label);
      });
      return lines.join("\n");
    }
    var c = cv.canvas;
    c.addEventListener("wheel", function (e) {
      e.preventDefault();
      var r = c.getBoundingClientRect(), t = tOf(e.clientX - r.left);
      var f = e.deltaY < 0 ? 0.8 : 1.25, w = Math.min(tmax, Math.max(tmax * 1e-6, (view.x1 - view.x0) * f));
      var a = (t - view.x0) / (view.x1 - view.x0);
      view.x0 = Math.max(0, t - a * w); view.x1 = Math.min(tmax, view.x0 + w); view.x0 = Math.max(0, view.x1 - w);
      draw();
    }, { passive: false });
    c.addEventListener("mousedown", function (e) {
      var r = c.getBoundingClientRect();
      drag = { x: e.clientX - r.left, zoom: !e.shiftKey, v0: view.x0, v1: view.x1 };
    });
    window.addEventListener("mouseup", function (e) {
      if (!drag) return;
      if (drag.zoom && drag.x1 != null && Math.abs(drag.x1 - drag.x) > 4) {
        var a = tOf(Math.min(drag.x, drag.x1)), b = tOf(Math.max(drag.x, drag.x1));
        view.x0 = Math.max(0, a); view.x1 = Math.min(tmax, b);
      }
      drag = null; draw();
    });
    c.addEventListener("mousemove", function (e) {
      var r = c.getBoundingClientRect(), x = e.clientX - r.left;
      if (drag) {
        if (drag.zoom) { drag.x1 = x; } else {
          var dt = (x - drag.x) / (g.w - M.l - M.r) * (drag.v1 - drag.v0);
          var w = drag.v1 - drag.v0;
          view.x0 = Math.min(Math.max(0, drag.v0 - dt), tmax - w); view.x1 = view.x0 + w;
        }
      }
      hover = Math.min(view.x1, Math.max(view.x0, tOf(x)));
      draw();
      showTip(e, readout(hover));
    });
    c.addEventListener("mouseleave", function () { hover = null; hideTip(); draw(); });
    c.addEventListener("dblclick", function () { view.x0 = 0; view.x1 = tmax; draw(); });
    redraws.push(draw);
    draw();
  }
  function runSeries(run, dash, prefix) {
    var tl = run.timeline, out = [];
    out.push({ name: prefix + "live bytes", colour: P.live, live: true, t: tl.t_s, v: tl.live_bytes, dash: dash, on: true });
    tl.lines.forEach(function (l) {
      out.push({ name: prefix + l.name + (l.measured ? " (measured RSS)" : " footprint"),
        colour: l.measured ? P.recorded : policyColour(l.palette), t: l.t_s || tl.t_s, v: l.footprint_bytes,
        frag: l.measured ? null : l.fragmentation, dash: dash, on: true });
    });
    if (tl.recorded) out.push({ name: prefix + tl.recorded.label, colour: P.recorded, t: tl.recorded.t_s, v: tl.recorded.bytes, dash: true, on: true });
    return out;
  }
  function runMarks(run) {
    var marks = [];
    (run.timeline.ooms || []).forEach(function (o) {
      var l = run.timeline.lines[o[0]];
      marks.push({ t: o[1], colour: P.oom, kind: "OOM", label: "OOM: " + (l ? l.name : "") });
    });
    (run.timeline.marks || []).forEach(function (m) {
      marks.push({ t: m[0], colour: P.mark, top: true, kind: "mark", label: "mark: " + m[1] });
    });
    (run.phases || []).forEach(function (p) {
      marks.push({ t: p[0], colour: P.phase, top: true, kind: "phase", label: "phase " + p[1] + ": " + p[2] });
    });
    return marks;
  }

  // ---- heap maps -----------------------------------------------------------------------
  function cellColour(code, C) {
    if (code === 0) return null;
    if (code === 1) return C.free;
    if (code === 2) return P.dead;
    if (code === 3) return P.waste;
    if (code === 4) return P.selected;
    return P.classes[Math.min(P.classes.length - 1, code - 10)];
  }
  function heapmaps(box, heaps) {
    var tabs = el("div", { cls: "tabs" });
    var figures = el("div", { cls: "mono" });
    var chart = el("div", { cls: "chart", id: "heapmap" });
    box.appendChild(el("div", { cls: "hint", text: "Blocks laid end to end in address order (gaps the allocator does not hold are left out); each cell shows what covers most of its bytes. Hover a cell for its block." }));
    box.appendChild(tabs); box.appendChild(figures); box.appendChild(chart);
    var legend = el("div", { cls: "legend" });
    [["free", P.free], ["dead (held, not reusable)", P.dead], ["internal waste", P.waste],
     ["live 16-31 B", P.classes[5]], ["2-4 KiB", P.classes[12]], ["2-4 MiB", P.classes[22]], ["64-128 MiB", P.classes[27]]]
      .forEach(function (s) { legend.appendChild(el("span", {}, [el("span", { cls: "swatch", style: "background:" + s[1] }), s[0]])); });
    box.appendChild(legend);
    var rows = Math.ceil(heaps[0].cells.length / heaps[0].cols);
    var cv = canvasIn(chart, rows * 8), cur = 0, geo = null;
    function draw() {
      var h = heaps[cur], g = cv.size(), ctx = g.ctx, C = colours();
      var n = h.cells.length, cols = h.cols, rows = Math.ceil(n / cols);
      var cw = g.w / cols, ch = g.h / rows;
      ctx.fillStyle = C.empty; ctx.fillRect(0, 0, g.w, g.h);
      for (var i = 0; i < n; i++) {
        var col = cellColour(h.cells[i], C);
        if (!col) continue;
        ctx.fillStyle = col;
        // Whole pixels, one pixel apart, so fractional cell widths leave no uneven seams.
        var c0 = i % cols, r0 = Math.floor(i / cols);
        var x0 = Math.floor(c0 * cw), y0 = Math.floor(r0 * ch);
        ctx.fillRect(x0, y0, Math.max(1, Math.floor((c0 + 1) * cw) - x0 - 1), Math.max(1, Math.floor((r0 + 1) * ch) - y0 - 1));
      }
      geo = { cw: cw, ch: ch, cols: cols };
      figures.textContent = h.policy + " at " + h.moment + (h.moment === "the dump" ? "" : " (event " + count(h.event) + ", " + secs(h.t_s) + ")") +
        ": live " + bytes(h.live_bytes) + ", allocated " + bytes(h.allocated_bytes) + ", footprint " + bytes(h.footprint_bytes) +
        ", free " + bytes(h.free_bytes) + " in " + count(h.free_blocks) + " blocks, fragmentation " + pct(h.fragmentation) +
        "; one cell = " + bytes(h.bytes_per_cell) + " of the " + bytes(h.held_bytes) + " held";
      chart.setAttribute("data-drawn", "1");
    }
    heaps.forEach(function (h, i) {
      var b = el("button", { text: h.policy + " \u2014 " + h.moment });
      b.addEventListener("click", function () {
        cur = i; Array.prototype.forEach.call(tabs.children, function (x, j) { x.classList.toggle("on", j === i); }); draw();
      });
      if (i === 0) b.classList.add("on");
      tabs.appendChild(b);
    });
    cv.canvas.addEventListener("mousemove", function (e) {
      var r = cv.canvas.getBoundingClientRect(), h = heaps[cur];
      var i = Math.floor((e.clientY - r.top) / geo.ch) * geo.cols + Math.floor((e.clientX - r.left) / geo.cw);
      if (i < 0 || i >= h.cells.length || h.cells[i] === 0) { hideTip(); return; }
      var b = h.blocks[h.cell_block[i]];
      var state = b ? ["free", "live", "dead"][b[3]] : "?";
      var text = "cell " + count(i) + ": bytes " + bytes(i * h.bytes_per_cell) + " to " + bytes((i + 1) * h.bytes_per_cell) + " of the held space";
      if (b) {
        text += "\n" + state + " block of " + bytes(b[1]) + " at offset " + count(b[0]);
        if (b[3] === 1) text += "\nrequested " + bytes(b[2]) + ", internal waste " + bytes(b[1] - b[2]);
      }
      showTip(e, text);
    });
    cv.canvas.addEventListener("mouseleave", hideTip);
    redraws.push(draw);
    draw();
  }

  // ---- sites and flame graph -----------------------------------------------------------
  function frameNode(f) {
    var where = f.file ? f.file + (f.line > 0 ? ":" + f.line : "") : "";
    return el("div", { cls: "frame" }, [f.python ? el("span", { cls: "tag", text: "py" }) : null,
      f.function || "??", where || f.module ? el("span", { cls: "where", text: "  " + (where || "") + (f.module && !f.python ? "  [" + f.module + "]" : "") }) : null]);
  }
  function sites(box, s) {
    box.appendChild(el("div", { cls: "hint", text: "Live at the peak of live bytes" + (s.at_event != null ? " (event " + count(s.at_event) + ")" : "") +
      ", by " + s.kind + ". Click a column to sort, a row for its stack (innermost frame first)." }));
    var total = s.rows.reduce(function (a, r) { return a + r.live_bytes; }, 0);
    var t = sortableTable([
      { title: "site", key: function (r) { return r.name; }, asc: true, cell: function (r) { return el("span", { cls: "mono", text: r.name }); } },
      { title: "live at peak", num: true, key: function (r) { return r.live_bytes; }, cell: function (r) { return bytes(r.live_bytes); } },
      { title: "share", num: true, key: function (r) { return r.live_bytes; }, cell: function (r) { return total ? pct(r.live_bytes / total) : "-"; } },
      { title: "live blocks", num: true, key: function (r) { return r.live_blocks; }, cell: function (r) { return count(r.live_blocks); } },
      { title: "allocations", num: true, key: function (r) { return r.alloc_count; }, cell: function (r) { return count(r.alloc_count); } },
      { title: "bytes allocated", num: true, key: function (r) { return r.alloc_bytes; }, cell: function (r) { return bytes(r.alloc_bytes); } }
    ], s.rows, { sort: 1, rowCls: "site", cls: "sites", limit: 50, expand: function (r, row, tbody) {
      row.addEventListener("click", function () {
        if (row.nextSibling && row.nextSibling.classList && row.nextSibling.classList.contains("frames")) { tbody.removeChild(row.nextSibling); return; }
        var frames = r.frames.map(function (i) { return frameNode(s.frames[i]); });
        if (!frames.length) frames.push(el("div", { cls: "dim", text: "no frames recorded" }));
        if (r.frames_left_out) frames.push(el("div", { cls: "dim", text: "\u2026 " + r.frames_left_out + " outer frames left out" }));
        var tr = el("tr", { cls: "frames" }, [el("td", { colspan: "6" }, frames)]);
        tbody.insertBefore(tr, row.nextSibling);
      });
    } });
    (t.table || t).id = "sites-table";
    box.appendChild(t);
    if (s.left_out) box.appendChild(el("div", { cls: "dim", text: count(s.left_out) + " smaller sites are left out of this table." }));
    (t.table || t).setAttribute("data-drawn", "1");
  }
  function hue(name) {
    var h = 0;
    for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return "hsl(" + (10 + h % 40) + "," + (60 + h % 25) + "%," + (52 + (h >> 8) % 12) + "%)";
  }
  function flame(box, root) {
    var bar = el("div", { cls: "toolbar" });
    var search = el("input", { type: "search", placeholder: "search frames (text or /regex/)" });
    var found = el("span", { cls: "dim" });
    var reset = el("button", { cls: "btn", text: "reset zoom" });
    bar.appendChild(search); bar.appendChild(reset); bar.appendChild(found);
    box.appendChild(el("div", { cls: "hint", text: "Live bytes at the peak by call stack, outermost frame at the top. Click a frame to zoom into it, a frame above it to zoom out." }));
    box.appendChild(bar);
    var chart = el("div", { cls: "chart", id: "flamegraph" });
    box.appendChild(chart);
    function depth(n) { var d = 0; n.c.forEach(function (k) { d = Math.max(d, depth(k)); }); return d + 1; }
    var rowH = 18, maxRows = Math.min(60, depth(root));
    var cv = canvasIn(chart, maxRows * rowH), focus = [root], rects = [], re = null;
    function draw() {
      var g = cv.size(), ctx = g.ctx, C = colours();
      ctx.fillStyle = C.bg; ctx.fillRect(0, 0, g.w, g.h);
      ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle";
      rects = [];
      var matched = 0;
      function box_(n, x, w, d) {
        if (d >= maxRows || w < 0.5) return;
        var hit = re && re.test(n.n);
        ctx.fillStyle = hit ? P.selected : hue(n.n);
        ctx.fillRect(x, d * rowH, Math.max(0.5, w - 1), rowH - 1);
        if (w > 30) {
          ctx.fillStyle = "#111"; ctx.save(); ctx.beginPath(); ctx.rect(x, d * rowH, w - 2, rowH); ctx.clip();
          ctx.fillText(n.n, x + 3, d * rowH + rowH / 2); ctx.restore();
        }
        rects.push({ x: x, y: d * rowH, w: w, n: n, d: d });
        return hit;
      }
      // The chain down to the focused node, full width, then the focused node's subtree.
      for (var i = 0; i < focus.length - 1; i++) box_(focus[i], 0, g.w, i);
      var f = focus[focus.length - 1];
      (function walk(n, x, w, d) {
        var hit = box_(n, x, w, d);
        if (hit) matched += n.v;
        var cx = x;
        n.c.forEach(function (k) {
          var kw = n.v ? w * k.v / n.v : 0;
          walk(k, cx, kw, d + 1);
          cx += kw;
        });
        // A match's bytes count once, even when frames under it match too.
        if (hit) matched -= n.c.reduce(function (a, k) { return a + (re.test(k.n) ? k.v : 0); }, 0);
      })(f, 0, g.w, focus.length - 1);
      found.textContent = re ? "matched " + bytes(Math.max(0, matched)) + " (" + pct(Math.max(0, matched) / (root.v || 1)) + " of the live bytes)" : "";
      chart.setAttribute("data-drawn", "1");
    }
    function at(e) {
      var r = cv.canvas.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
      for (var i = rects.length - 1; i >= 0; i--) {
        var q = rects[i];
        if (x >= q.x && x < q.x + q.w && y >= q.y && y < q.y + rowH) return q;
      }
      return null;
    }
    cv.canvas.addEventListener("mousemove", function (e) {
      var q = at(e);
      if (!q) { hideTip(); return; }
      showTip(e, q.n.n + "\n" + bytes(q.n.v) + " live, " + pct(q.n.v / (root.v || 1)) + " of all");
    });
    cv.canvas.addEventListener("mouseleave", hideTip);
    cv.canvas.addEventListener("click", function (e) {
      var q = at(e);
      if (!q) return;
      if (q.d < focus.length - 1) focus = focus.slice(0, q.d + 1);
      else {
        // The path from the focused node down to the clicked one.
        var path = [];
        (function find(n) {
          path.push(n);
          if (n === q.n) return true;
          for (var i = 0; i < n.c.length; i++) if (find(n.c[i])) return true;
          path.pop(); return false;
        })(focus[focus.length - 1]);
        focus = focus.concat(path.slice(1));
      }
      draw();
    });
    reset.addEventListener("click", function () { focus = [root]; draw(); });
    search.addEventListener("input", function () {
      var q = search.value;
      try {
        re = !q ? null : q.length > 2 && q[0] === "/" && q[q.length - 1] === "/" ? new RegExp(q.slice(1, -1)) :
          new RegExp(q.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "i");
      } catch (err) { re = null; }
      draw();
    });
    redraws.push(draw);
    draw();
  }

  // ---- size classes --------------------------------------------------------------------
  // A class's request sizes, in bytes where the label has no unit of its own.
  function classLabel(r) { return /^[0-9]+$/.test(r.label) ? r.label + " B" : r.label; }
  function heatColour(v) { return P.heat[Math.max(0, Math.min(16, Math.round(v * 16)))]; }
  function classes(box, c) {
    var chart = el("div", { cls: "chart", id: "classes" });
    box.appendChild(el("div", { cls: "hint", text: "The highest live bytes of each size class (by request size) in each time bucket, on a log scale; hover for values." }));
    box.appendChild(chart);
    var rows = c.rows.slice().reverse(), rowH = Math.max(8, Math.min(16, Math.floor(420 / Math.max(1, rows.length))));
    var L = 110, B = 24;
    var cv = canvasIn(chart, rows.length * rowH + B), geo = null;
    var max = 1;
    rows.forEach(function (r) { r.live_bytes.forEach(function (v) { if (v > max) max = v; }); });
    var logMax = Math.log1p(max), n = c.t_s.length;
    function draw() {
      var g = cv.size(), ctx = g.ctx, C = colours(), pw = g.w - L - 10, cw = pw / Math.max(1, n);
      ctx.fillStyle = C.bg; ctx.fillRect(0, 0, g.w, g.h);
      ctx.font = "11px system-ui, sans-serif"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
      rows.forEach(function (r, k) {
        ctx.fillStyle = C.text; ctx.fillText(classLabel(r), L - 6, k * rowH + rowH / 2);
        for (var b = 0; b < n; b++) {
          var v = r.live_bytes[b];
          ctx.fillStyle = v > 0 ? heatColour(Math.log1p(v) / logMax) : P.heat[0];
          ctx.fillRect(L + b * cw, k * rowH, Math.ceil(cw), rowH - 1);
        }
      });
      ctx.fillStyle = C.text; ctx.textAlign = "center"; ctx.textBaseline = "top";
      var tmax = n ? c.t_s[n - 1] : 1, xs = niceStep(tmax, 8);
      for (var x = 0; x <= tmax; x += xs) ctx.fillText(secs(x), L + x / (tmax || 1) * pw, rows.length * rowH + 6);
      geo = { cw: cw };
      chart.setAttribute("data-drawn", "1");
    }
    cv.canvas.addEventListener("mousemove", function (e) {
      var r = cv.canvas.getBoundingClientRect(), x = e.clientX - r.left - L, k = Math.floor((e.clientY - r.top) / rowH);
      var b = Math.floor(x / geo.cw);
      if (x < 0 || b >= n || k < 0 || k >= rows.length) { hideTip(); return; }
      showTip(e, "class " + classLabel(rows[k]) + " at " + secs(c.t_s[b]) + "\nlive " + bytes(rows[k].live_bytes[b]));
    });
    cv.canvas.addEventListener("mouseleave", hideTip);
    redraws.push(draw);
    draw();
  }

  // ---- an input's own views ------------------------------------------------------------
  function segments(box, run) {
    box.appendChild(el("div", { cls: "hint", text: "The caching allocator's segments at the snapshot's moment, largest first." }));
    box.appendChild(sortableTable([
      { title: "#", key: function (r) { return r.i; }, asc: true, cell: function (r) { return String(r.i + 1); } },
      { title: "reserved", num: true, key: function (r) { return r.s[0]; }, cell: function (r) { return bytes(r.s[0]); } },
      { title: "allocated", num: true, key: function (r) { return r.s[1]; }, cell: function (r) { return bytes(r.s[1]); } },
      { title: "requested", num: true, key: function (r) { return r.s[2]; }, cell: function (r) { return bytes(r.s[2]); } },
      { title: "free in segment", num: true, key: function (r) { return r.s[0] - r.s[1]; }, cell: function (r) { return bytes(r.s[0] - r.s[1]); } }
    ], run.segments.map(function (s, i) { return { s: s, i: i }; }), { cls: "segments", limit: 20 }));
    if (run.segments_left_out) box.appendChild(el("div", { cls: "dim", text: count(run.segments_left_out) + " smaller segments left out." }));
    if (run.phases.length) {
      box.appendChild(el("h3", { text: "Phases" }));
      box.appendChild(el("ul", { cls: "notes" }, run.phases.slice(0, 200).map(function (p) {
        return el("li", {}, [el("span", { cls: "mono", text: secs(p[0]) + "  " }), p[1] + " " + p[2]]);
      })));
    }
  }
  function bins(box, run) {
    box.appendChild(sortableTable([
      { title: "bin size", num: true, key: function (b) { return b.bin_size_bytes; }, asc: true, cell: function (b) { return bytes(b.bin_size_bytes); } },
      { title: "chunks", num: true, key: function (b) { return b.total_chunks; }, cell: function (b) { return count(b.total_chunks); } },
      { title: "in use", num: true, key: function (b) { return b.chunks_in_use; }, cell: function (b) { return count(b.chunks_in_use); } },
      { title: "bytes", num: true, key: function (b) { return b.total_bytes; }, cell: function (b) { return bytes(b.total_bytes); } },
      { title: "bytes in use", num: true, key: function (b) { return b.bytes_in_use; }, cell: function (b) { return bytes(b.bytes_in_use); } },
      { title: "requested in use", num: true, key: function (b) { return b.requested_bytes_in_use; }, cell: function (b) { return bytes(b.requested_bytes_in_use); } },
      { title: "free chunks", num: true, key: function (b) { return b.free_chunks; }, cell: function (b) { return count(b.free_chunks); } },
      { title: "largest free", num: true, key: function (b) { return b.largest_free_bytes; }, cell: function (b) { return bytes(b.largest_free_bytes); } }
    ], run.bins, { sort: 0, cls: "bins" }));
  }

  // ---- diff ----------------------------------------------------------------------------
  function sitesDiff(box, rows) {
    box.appendChild(el("div", { cls: "hint", text: "Live bytes at each run's " + (D.diff_at || "peak") + ", allocations and bytes allocated, by site; largest change first." }));
    var t = sortableTable([
      { title: "site", key: function (r) { return r.name; }, asc: true, cell: function (r) { return el("span", { cls: "mono", text: r.name }); } },
      { title: "live A", num: true, key: function (r) { return r.a[0]; }, cell: function (r) { return bytes(r.a[0]); } },
      { title: "live B", num: true, key: function (r) { return r.b[0]; }, cell: function (r) { return bytes(r.b[0]); } },
      { title: "change", num: true, key: function (r) { return Math.abs(r.b[0] - r.a[0]); }, cell: function (r) {
        var d = r.b[0] - r.a[0]; return el("span", { cls: d > 0 ? "pos" : d < 0 ? "neg" : "", text: (d > 0 ? "+" : "") + bytes(d) }); } },
      { title: "allocations A", num: true, key: function (r) { return r.a[1]; }, cell: function (r) { return count(r.a[1]); } },
      { title: "allocations B", num: true, key: function (r) { return r.b[1]; }, cell: function (r) { return count(r.b[1]); } },
      { title: "allocated A", num: true, key: function (r) { return r.a[2]; }, cell: function (r) { return bytes(r.a[2]); } },
      { title: "allocated B", num: true, key: function (r) { return r.b[2]; }, cell: function (r) { return bytes(r.b[2]); } }
    ], rows, { sort: 3, cls: "sites", limit: 50 });
    (t.table || t).id = "sites-table";
    box.appendChild(t);
    (t.table || t).setAttribute("data-drawn", "1");
  }

  // ---- the page ------------------------------------------------------------------------
  function drawRun(run) {
    summary(run);
    if (run.timeline) timeline(section("Timeline", "timeline-section"), runSeries(run, false, ""), runMarks(run), "timeline");
    if (run.heaps.length) heapmaps(section(run.timeline ? "Heap maps" : "Heap map (chunks)", "heap-section"), run.heaps);
    if (run.bins.length) bins(section("Bins", "bins-section"), run);
    if (run.sites && run.sites.rows.length) sites(section("Sites", "sites-section"), run.sites);
    if (run.flame && run.flame.v > 0) flame(section("Flame graph", "flame-section"), run.flame);
    if (run.classes && run.classes.rows.length) classes(section("Size classes", "classes-section"), run.classes);
    if (run.segments.length) segments(section("Segments and phases", "segments-section"), run);
  }
  function drawDiff() {
    var a = D.runs[0], b = D.runs[1];
    summary(a, "A"); summary(b, "B");
    var s = [], marks = [];
    if (a.timeline) { s = s.concat(runSeries(a, false, "A: ")); marks = marks.concat(runMarks(a)); }
    if (b.timeline) { s = s.concat(runSeries(b, true, "B: ")); marks = marks.concat(runMarks(b)); }
    if (s.length) timeline(section("Timelines (A solid, B dashed)", "timeline-section"), s, marks, "timeline");
    if (D.sites_diff) sitesDiff(section("Sites, A against B", "sites-section"), D.sites_diff);
  }
  header();
  if (D.kind === "diff" && D.runs.length === 2) drawDiff(); else D.runs.forEach(drawRun);
  app.appendChild(el("footer", { text: "Written by allocview " + D.version + ". Sizes in binary units (1 KiB = 1024 B); times since the trace's first event." }));
  function redrawAll() { redraws.forEach(function (f) { f(); }); }
  window.addEventListener("beforeprint", function () { printing = true; redrawAll(); });
  window.addEventListener("afterprint", function () { printing = false; redrawAll(); });
  var resizeTimer = null;
  window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(redrawAll, 100); });
  // Where each drawn area is on the page (CSS pixels), for a test that looks at its pixels.
  Array.prototype.forEach.call(document.querySelectorAll("[data-drawn]"), function (e) {
    var r = e.getBoundingClientRect();
    e.setAttribute("data-rect", [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height].map(Math.round).join(","));
  });
  // How long the page took to read its data and draw, for the size-and-speed figures.
  document.body.setAttribute("data-draw-ms", String(Math.round(performance.now())));
  document.body.setAttribute("data-ready", "1");
})();
