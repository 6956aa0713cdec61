/* Proof console charts: every element with data-chart="<id>" is drawn with uPlot from the JSON
 * in <script type="application/json" id="<id>"> (Django's json_script). Spec:
 *   { "x": [unix seconds, ...],
 *     "series": [{"label": "SM activity · rank 3", "values": [number|null, ...],
 *                 "unit": "%", "color": "#0b6e4f" (optional)}],
 *     "interval": [t0, t1] or null,   shaded: the evidence interval
 *     "baseline": number or null,     dashed line: the baseline the evidence is measured against
 *     "y_label": "..." (optional),
 *     "y_format": "exp" (optional: exponent notation, for values like a learning rate) }
 * class="chart small" draws a sparkline (no axes, no legend) for table rows.
 * Pages stay readable without JavaScript: the numbers are in the page's tables. */
(function () {
  "use strict";
  var PALETTE = ["#0b6e4f", "#1f4fa8", "#a4262c", "#8a5a00", "#6b3fa0", "#00777a",
                 "#b0451b", "#3d6b00", "#5c6773", "#c2185b"];

  function shade(interval) {
    return function (u) {
      if (!interval) return;
      var ctx = u.ctx, left = u.valToPos(interval[0], "x", true),
          right = u.valToPos(interval[1], "x", true);
      ctx.save();
      ctx.fillStyle = "rgba(164, 38, 44, 0.10)";
      ctx.fillRect(left, u.bbox.top, Math.max(right - left, 2), u.bbox.height);
      ctx.restore();
    };
  }

  function baseline(value) {
    return function (u) {
      if (value === null || value === undefined) return;
      var ctx = u.ctx, y = u.valToPos(value, "y", true);
      ctx.save();
      ctx.strokeStyle = "#5c6773";
      ctx.setLineDash([5, 4]);
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(u.bbox.left, y);
      ctx.lineTo(u.bbox.left + u.bbox.width, y);
      ctx.stroke();
      ctx.restore();
    };
  }

  function draw(el) {
    var source = document.getElementById(el.getAttribute("data-chart"));
    if (!source || typeof uPlot === "undefined") return;
    var spec = JSON.parse(source.textContent);
    var small = el.classList.contains("small");
    var width = el.clientWidth || (small ? 260 : 800);
    var height = parseInt(el.getAttribute("data-height") || (small ? "70" : "180"), 10);
    // spec.y_format "exp" (optional): values too small for fixed decimals (a learning rate
    // of 3e-4) read in exponent notation on the axis and in the legend.
    var exp = spec.y_format === "exp";
    function num(v) { return exp ? v.toExponential(2) : v.toFixed(2); }
    var yAxis = { label: spec.y_label || "" };
    if (exp) yAxis.values = function (u, vals) { return vals.map(function (v) { return v === null ? "" : v.toExponential(2); }); };
    var data = [spec.x].concat(spec.series.map(function (s) { return s.values; }));
    var series = [{}].concat(spec.series.map(function (s, i) {
      return { label: s.label, stroke: s.color || PALETTE[i % PALETTE.length], width: small ? 1 : 1.5,
               spanGaps: false, value: function (u, v) { return v === null ? "–" : num(v) + (s.unit || ""); } };
    }));
    var opts = {
      width: width, height: height, series: series,
      legend: { show: !small },
      cursor: { show: !small },
      axes: small ? [{ show: false }, { show: false }] : [{}, yAxis],
      hooks: { drawClear: [shade(spec.interval)], draw: [baseline(spec.baseline)] }
    };
    if (small) { opts.padding = [2, 2, 2, 2]; }
    el.innerHTML = "";
    el.setAttribute("data-drawn", "true");
    var plot = new uPlot(opts, data, el);
    // Kept for live.js, which extends a job page's charts with new points (plot.setData).
    drawn[el.getAttribute("data-chart")] = { plot: plot, data: data, spec: spec, keep: Math.max(60, spec.x.length) };
  }

  var drawn = {};

  function drawAll() {
    var els = document.querySelectorAll("[data-chart]");
    for (var i = 0; i < els.length; i++) draw(els[i]);
  }

  window.ProofCharts = { draw: draw, drawAll: drawAll, get: function (id) { return drawn[id] || null; } };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", drawAll);
  else drawAll();
})();
