/* Job page: hover over a rank's lane to read one step (compute and wait shares, whether the
 * rank was the slowest); click a lane to widen the lanes to 3x (zoom), again to go back.
 * The lanes are drawn by the server (SVG) and read without this script. */
(function () {
  "use strict";

  function pct(v) { return Math.round(v * 100) + "%"; }

  function setup(table) {
    var steps = parseInt(table.getAttribute("data-steps") || "0", 10);
    if (!steps) return;
    var tip = document.createElement("div");
    tip.className = "lane-tip";
    tip.hidden = true;
    document.body.appendChild(tip);
    var slowestByStep = [];
    var rows = table.querySelectorAll("tr.lane");
    for (var r = 0; r < rows.length; r++) {
      var values = (rows[r].getAttribute("data-compute") || "").split(",").map(Number);
      for (var i = 0; i < values.length; i++) {
        if (slowestByStep[i] === undefined || values[i] > slowestByStep[i].v) {
          slowestByStep[i] = { v: values[i], rank: rows[r].getAttribute("data-rank") };
        }
      }
    }
    function show(row, ev) {
      var svg = row.querySelector("svg");
      if (!svg) return;
      var box = svg.getBoundingClientRect();
      var i = Math.floor((ev.clientX - box.left) / box.width * steps);
      if (i < 0 || i >= steps) { tip.hidden = true; return; }
      var values = (row.getAttribute("data-compute") || "").split(",").map(Number);
      var c = values[i];
      var step = steps - i;
      var text = "rank " + row.getAttribute("data-rank") + " · " + (step === 1 ? "newest step" : step + " steps ago") +
        " · compute " + pct(c) + " | wait " + pct(1 - c);
      var top = slowestByStep[i];
      if (top && top.rank === row.getAttribute("data-rank")) text += " · slowest";
      else if (top) text += " · slowest: rank " + top.rank;
      tip.textContent = text;
      tip.style.left = (ev.pageX + 12) + "px";
      tip.style.top = (ev.pageY + 12) + "px";
      tip.hidden = false;
    }
    for (var k = 0; k < rows.length; k++) {
      (function (row) {
        var cell = row.querySelector("td.lane-bars");
        if (!cell) return;
        cell.addEventListener("mousemove", function (ev) { show(row, ev); });
        cell.addEventListener("mouseleave", function () { tip.hidden = true; });
        cell.addEventListener("click", function () { table.classList.toggle("zoomed"); });
      })(rows[k]);
    }
  }

  function setupAll() {
    var tables = document.querySelectorAll("table.job-lanes");
    for (var i = 0; i < tables.length; i++) setup(tables[i]);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setupAll);
  else setupAll();
})();
