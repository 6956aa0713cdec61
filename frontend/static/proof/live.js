/* Live console updates (docs/console.md "Live updates"): one websocket to /ws/live/, signed in
 * by the session cookie, reconnecting with backoff (1 s doubling to 30 s, with jitter; not
 * after the server's 4401/4403: not signed in, no membership). What arrives:
 *   {"type": "verdict", "incident", "job", "family", "category", "title", "revision", "kind", "url"}
 *   {"type": "job", "job", "state"}
 *   {"type": "points", "job", "t", "charts": {"job-gpu-sm": {"rank 0": 87.5, ...}, ...}}
 * Every page that includes it gets a "New verdicts" card (links to /incidents/<id>/); the
 * incidents list gets a row, the jobs list marks the job's row and its state, the job page (which
 * narrows the socket to its job) gets a row in its verdicts table, its state and its charts
 * extended. Inserted elements carry data-live-at (ms since the epoch) so tests can time them.
 * The pages stay whole without it: a reload shows the same from the server. */
(function () {
  "use strict";

  var main = document.querySelector("main[data-live]");
  var page = main ? main.getAttribute("data-live") : "";
  if (!page || !window.WebSocket) return;  // a page without live updates
  var jobCard = document.querySelector("[data-live-job]");
  var pageJob = page === "job" && jobCard ? jobCard.getAttribute("data-live-job") : null;
  var FIRST_DELAY_MS = 1000, MAX_DELAY_MS = 30000, FEED_MAX = 20;
  var delay = FIRST_DELAY_MS;
  var status = null;

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var k in attrs || {}) if (Object.prototype.hasOwnProperty.call(attrs, k)) node.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function setStatus(state, title) {
    if (!status) {
      status = el("span", { "class": "live-status muted", "data-testid": "live-status" });
      var header = document.querySelector("header.site nav:last-of-type") || document.body;
      header.insertBefore(status, header.firstChild);
    }
    status.setAttribute("data-live-status", state);
    status.textContent = state === "live" ? "● live" : state === "offline" ? "○ offline" : "○ connecting";
    status.title = title || "";
  }

  function badge(category) {
    var text = category === "job" ? "JOB" : category === "infrastructure" ? "INFRASTRUCTURE" : String(category).toUpperCase();
    return el("span", { "class": "badge " + category, "data-testid": "category-badge" }, text);
  }

  function incidentLink(m) {
    return el("a", { href: m.url, "data-incident": m.incident }, m.title || m.family);
  }

  function jobLink(job) {
    if (!job) return el("span", { "class": "muted" }, "–");
    return el("a", { href: "/jobs/" + encodeURIComponent(job).replace(/%2F/g, "/") + "/" }, job);
  }

  function stamp(node) { node.setAttribute("data-live-at", String(Date.now())); return node; }

  // --- every page: the "New verdicts" card --------------------------------------------------
  var feed = null;
  function feedList() {
    if (!feed) {
      feed = el("section", { "class": "card live-feed", "data-testid": "live-verdicts" });
      feed.appendChild(el("h2", {}, "New verdicts"));
      feed.appendChild(el("p", { "class": "help" }, "Arrived while this page was open."));
      feed.appendChild(el("ul", {}));
      main.insertBefore(feed, main.firstChild);
    }
    return feed.querySelector("ul");
  }

  function addToFeed(m) {
    var list = feedList();
    var old = list.querySelector('li[data-incident="' + m.incident + '"]');
    if (old) old.remove();
    var item = el("li", { "data-incident": m.incident });
    item.appendChild(badge(m.category));
    item.appendChild(document.createTextNode(" "));
    item.appendChild(incidentLink(m));
    item.appendChild(el("span", { "class": "muted" }, " · " + m.family + (m.job ? " · job " + m.job : "") +
      (m.kind === "changed" ? " · now " + m.category : "")));
    list.insertBefore(stamp(item), list.firstChild);
    while (list.children.length > FEED_MAX) list.removeChild(list.lastChild);
  }

  // --- /incidents/: a row at the top of the list ----------------------------------------------
  function addIncidentRow(m) {
    var body = document.querySelector("table.incident-list tbody");
    if (!body) return;
    var known = body.querySelector('a[href="' + m.url + '"]');  // the server's row, or ours
    var row = known ? known.closest("tr") : null;
    var cells = [badge(m.category), m.family, incidentLink(m), jobLink(m.job)];
    var fresh = el("tr", { "data-testid": "incident-row", "data-incident": m.incident, "class": "live" });
    cells.forEach(function (c) { var td = el("td"); td.appendChild(typeof c === "string" ? document.createTextNode(c) : c); fresh.appendChild(td); });
    // The numbers the server computes (confidence, impact, times) read on the verdict's page.
    fresh.appendChild(el("td", { "class": "muted", colspan: "7" }, m.kind === "changed" ? "revised just now" : "new, just now"));
    var state = el("td"); state.appendChild(el("span", { "class": "badge open" }, "open")); fresh.appendChild(state);
    var empty = body.querySelector("td[colspan='12']");
    if (empty) empty.parentNode.remove();
    if (row) row.remove();
    body.insertBefore(stamp(fresh), body.firstChild);
  }

  // --- /jobs/: the job's row -----------------------------------------------------------------
  function markJobRow(m) {
    var row = m.job && document.querySelector('table.jobs tr[data-job="' + CSS.escape(m.job) + '"]');
    if (!row) return;
    var cell = row.querySelector('[data-testid="open-incidents"]');
    if (cell && m.kind === "new") {
      var count = parseInt(cell.textContent, 10) || 0;
      cell.textContent = "";
      cell.appendChild(el("span", { "class": "badge open" }, count + 1));
    }
    var link = row.querySelector("a.live-verdict");
    if (link) link.remove();
    link = incidentLink(m);
    link.className = "live-verdict";
    var first = row.querySelector("td");
    first.appendChild(el("br"));
    first.appendChild(link);
    row.setAttribute("data-live-verdict", m.incident);
    stamp(row);
  }

  function setJobState(job, state) {
    var nodes = [];
    if (page === "job" && job === pageJob) nodes = document.querySelectorAll('[data-live="job-state"]');
    else {
      var row = document.querySelector('table.jobs tr[data-job="' + CSS.escape(job) + '"]');
      if (row) nodes = row.querySelectorAll('[data-live="job-state"]');
    }
    for (var i = 0; i < nodes.length; i++) { nodes[i].textContent = state; stamp(nodes[i]); }
  }

  // --- the job page: its verdicts table and charts ---------------------------------------------
  function addJobIncident(m) {
    if (m.job !== pageJob) return;
    var table = document.querySelector("table.job-incidents");
    if (!table) {
      var none = document.querySelector('[data-testid="no-verdicts"]');
      if (!none) return;
      table = el("table", { "class": "job-incidents" });
      var head = el("tr");
      ["Verdict", "Category", "State"].forEach(function (h) { head.appendChild(el("th", { scope: "col" }, h)); });
      var thead = el("thead"); thead.appendChild(head); table.appendChild(thead);
      table.appendChild(el("tbody"));
      none.parentNode.replaceChild(table, none);
    }
    var body = table.querySelector("tbody");
    var row = body.querySelector('tr[data-incident="' + m.incident + '"]');
    if (row) row.remove();
    row = el("tr", { "data-incident": m.incident, "class": "live" });
    var first = el("td"); first.appendChild(incidentLink(m)); first.appendChild(el("br"));
    first.appendChild(el("span", { "class": "muted" }, m.family)); row.appendChild(first);
    var cat = el("td"); cat.appendChild(badge(m.category)); row.appendChild(cat);
    var columns = table.querySelectorAll("thead th").length;
    for (var i = 3; i < columns; i++) row.appendChild(el("td", { "class": "muted" }, i === 3 ? "open" : ""));
    body.insertBefore(stamp(row), body.firstChild);
  }

  function median(values) {
    if (!values.length) return null;
    var s = values.slice().sort(function (a, b) { return a - b; });
    var mid = Math.floor(s.length / 2);
    return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
  }

  function extendCharts(m) {
    if (m.job !== pageJob || !window.ProofCharts) return;
    Object.keys(m.charts || {}).forEach(function (chartId) {
      var chart = window.ProofCharts.get(chartId);
      if (!chart) return;
      var lines = m.charts[chartId];
      var data = chart.data;
      var x = data[0];
      if (x.length && m.t <= x[x.length - 1]) return;  // not newer than what is drawn
      var given = Object.keys(lines).map(function (k) { return lines[k]; });
      x.push(m.t);
      chart.spec.series.forEach(function (s, i) {
        var v = lines[s.label];
        if (v === undefined) v = s.label.indexOf("median of") === 0 ? median(given) : null;
        data[i + 1].push(v === undefined ? null : v);
      });
      // Keep the span drawn: past the points the page came with, the oldest go.
      while (x.length > chart.keep) { for (var j = 0; j < data.length; j++) data[j].shift(); }
      chart.plot.setData(data);
      var host = document.querySelector('[data-chart="' + chartId + '"]');
      if (host) { host.setAttribute("data-live-points", String((parseInt(host.getAttribute("data-live-points"), 10) || 0) + 1)); stamp(host); }
    });
  }

  // --- the socket ------------------------------------------------------------------------------
  function onMessage(m) {
    if (m.type === "hello") {
      if (pageJob) socket.send(JSON.stringify({ subscribe: { job: pageJob } }));
      else setStatus("live");
    } else if (m.type === "subscribed") {
      setStatus("live");
    } else if (m.type === "verdict") {
      addToFeed(m);
      if (page === "incidents") addIncidentRow(m);
      else if (page === "jobs") markJobRow(m);
      else if (page === "job") addJobIncident(m);
    } else if (m.type === "job") {
      setJobState(m.job, m.state);
    } else if (m.type === "points") {
      extendCharts(m);
    } else if (m.type === "error") {
      setStatus("live", m.error);
    }
  }

  var socket = null;
  function connect() {
    setStatus("connecting");
    socket = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/live/");
    socket.onopen = function () { delay = FIRST_DELAY_MS; };
    socket.onmessage = function (ev) {
      var m;
      try { m = JSON.parse(ev.data); } catch (e) { return; }
      onMessage(m);
    };
    socket.onclose = function (ev) {
      if (ev.code === 4401 || ev.code === 4403) { setStatus("offline", "not signed in"); return; }
      setStatus("offline", "reconnecting");
      var wait = Math.min(MAX_DELAY_MS, delay) * (0.75 + Math.random() * 0.5);
      delay = Math.min(MAX_DELAY_MS, delay * 2);
      setTimeout(connect, wait);
    };
  }

  window.ProofLive = { onMessage: onMessage };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", connect);
  else connect();
})();
