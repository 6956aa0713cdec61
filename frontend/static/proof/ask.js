// "Ask about this incident" on the verdict page (docs/investigations.md). The question goes to
// POST /api/v1/incidents/<id>/questions/ (the session's cookie and CSRF token); a Celery task
// answers it in 10-30 s, so the page polls GET .../questions/<qid>/ until it is answered or
// refused. Earlier questions are read from the same API on load, not by the page's own queries.
(function () {
  "use strict";
  var box = document.querySelector("[data-ask-url]");
  if (!box) return;
  var url = box.getAttribute("data-ask-url");
  var list = box.querySelector("[data-testid=questions]");
  var form = box.querySelector("form");
  var status = box.querySelector("[data-testid=ask-status]");
  var MAX_DELAY_MS = 5000;

  function csrf() {
    var input = box.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function text(tag, cls, value) {
    var el = document.createElement(tag);
    if (cls) el.className = cls;
    el.textContent = value;
    return el;
  }

  function render(q) {
    var item = list.querySelector('[data-question-id="' + q.id + '"]');
    if (!item) {
      item = document.createElement("li");
      item.setAttribute("data-testid", "question");
      item.setAttribute("data-question-id", q.id);
      list.insertBefore(item, list.firstChild);
    }
    item.setAttribute("data-state", q.state);
    item.textContent = "";
    item.appendChild(text("p", "question", q.question));
    var head = text("span", "badge " + (q.refused ? "open" : "resolved"), q.state);
    var meta = document.createElement("p");
    meta.className = "muted";
    meta.appendChild(head);
    if (q.state !== "pending") {
      var how = q.validated ? " every claim checked against the evidence" : " " + (q.reason || "");
      meta.appendChild(document.createTextNode(how + (q.duration_s != null ? " · " + q.duration_s + " s" : "")));
    } else {
      meta.appendChild(document.createTextNode(" the model is reading the evidence…"));
    }
    item.appendChild(meta);
    if (q.answer) {
      var answer = text("p", "answer", q.answer);
      answer.setAttribute("data-testid", "answer");
      item.appendChild(answer);
    }
    if (q.cited && q.cited.length) {
      var cited = text("p", "muted", "cites " + q.cited.join(", "));
      cited.setAttribute("data-testid", "cited");
      item.appendChild(cited);
    }
  }

  function poll(id, delay) {
    fetch(url + id + "/", { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (q) {
        if (!q) return;
        render(q);
        if (q.state === "pending") {
          setTimeout(function () { poll(id, Math.min(delay * 1.5, MAX_DELAY_MS)); }, delay);
        }
      });
  }

  function problem(body, code) {
    var err = body && body.error;
    if (!err) return "The question was not accepted (HTTP " + code + ").";
    var fields = err.fields && err.fields.question;
    return fields && fields.length ? "Question: " + fields.join(" ") : err.message;
  }

  fetch(url + "?page_size=20", { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then(function (r) { return r.ok ? r.json() : { results: [] }; })
    .then(function (body) {
      var rows = (body.results || body || []).slice().reverse();
      rows.forEach(function (q) {
        render(q);
        if (q.state === "pending") poll(q.id, 1000);
      });
    });

  if (!form) return;
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var field = form.querySelector("textarea");
    var question = field.value.trim();
    if (!question) return;
    status.textContent = "";
    fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrf() },
      body: JSON.stringify({ question: question }),
    }).then(function (r) {
      return r.json().then(function (body) { return { code: r.status, body: body }; });
    }).then(function (res) {
      if (res.code === 202) {
        field.value = "";
        render(res.body);
        poll(res.body.id, 1000);
      } else {
        status.textContent = problem(res.body, res.code);
      }
    });
  });
})();
