// Draws the page's plotly figures (JSON in <script type="application/json">) when they come
// near the viewport, so a page with hundreds of cases opens at once; filters tables and case
// sections as the user types. No network: plotly.min.js sits in ../assets.
(function () {
  "use strict";

  function draw(div) {
    if (div.getAttribute("data-drawn")) { return; }
    div.setAttribute("data-drawn", "1");
    var spec = JSON.parse(document.getElementById(div.getAttribute("data-fig")).textContent);
    Plotly.newPlot(div, spec.data, spec.layout, spec.config);
  }

  var charts = Array.prototype.slice.call(document.querySelectorAll("div.chart[data-fig]"));
  if ("IntersectionObserver" in window) {
    var observer = new IntersectionObserver(function (seen) {
      seen.forEach(function (e) {
        if (e.isIntersecting) { observer.unobserve(e.target); draw(e.target); }
      });
    }, { rootMargin: "600px" });
    charts.forEach(function (div, i) { if (i < 2) { draw(div); } else { observer.observe(div); } });
  } else {
    charts.forEach(draw);
  }

  function matches(text, query) { return text.toLowerCase().indexOf(query) >= 0; }

  document.querySelectorAll("input[data-filter]").forEach(function (input) {
    var table = document.getElementById(input.getAttribute("data-filter"));
    input.addEventListener("input", function () {
      var q = input.value.toLowerCase();
      table.querySelectorAll("tbody tr").forEach(function (tr) {
        tr.hidden = q !== "" && !matches(tr.textContent, q);
      });
    });
  });

  document.querySelectorAll("input[data-filter-sections]").forEach(function (input) {
    var box = document.getElementById(input.getAttribute("data-filter-sections"));
    var toc = document.getElementById("toc");
    input.addEventListener("input", function () {
      var q = input.value.toLowerCase();
      box.querySelectorAll("section.case").forEach(function (s) {
        s.hidden = q !== "" && !matches(s.getAttribute("data-text"), q);
      });
      toc.querySelectorAll("li").forEach(function (li) {
        li.hidden = q !== "" && !matches(li.textContent, q);
      });
    });
  });
})();
