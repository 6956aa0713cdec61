/* Fleet, health and price pages: small enhancements over server-rendered pages that work
 * without it. The price calculator updates as its inputs change (the server computes the same
 * numbers on submit: frontend/selectors/price.py `calculate`). */
(function () {
  "use strict";

  function money(symbol, value) {
    return isFinite(value) ? symbol + value.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 }) : "–";
  }

  function pct(value) {
    return isFinite(value) ? (value * 100).toFixed(1) + "%" : "–";
  }

  function calculator(form) {
    var out = document.querySelector("[data-testid=calculator]");
    if (!out) return;
    var lostShare = parseFloat(form.getAttribute("data-lost-share")) || 0;
    var symbol = out.getAttribute("data-symbol") || "";
    function fmt(value) { return money(symbol, value); }
    function update() {
      var list = parseFloat(form.elements.list_price.value);
      var share = parseFloat(form.elements.share.value) / 100;
      if (!(list > 0) || !(share > 0) || share > 1) return;
      var lost = Math.min(Math.max(lostShare, 0), 1 - share);
      var after = Math.min(1, share / (1 - lost));
      var set = function (name, text) { out.querySelector("[data-out=" + name + "]").textContent = text; };
      set("effective", fmt(list / share));
      set("lost", pct(lost));
      set("share-after", pct(after));
      set("effective-after", fmt(list / after));
      set("saving", fmt(list / share - list / after));
    }
    form.addEventListener("input", update);
  }

  function init() {
    var forms = document.querySelectorAll("form[data-calculator]");
    for (var i = 0; i < forms.length; i++) calculator(forms[i]);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
