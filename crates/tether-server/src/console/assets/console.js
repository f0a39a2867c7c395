// Tether console: makes the `data-live` regions live from server-sent
// events (rendered fragments from the endpoint itself). Everything works
// without it: every action is a plain form post.
(function () {
  "use strict";
  if (!window.EventSource) return;
  var regions = document.querySelectorAll("[data-live]");
  if (!regions.length) return;
  var names = [];
  for (var i = 0; i < regions.length; i++) {
    var n = regions[i].getAttribute("data-live");
    if (names.indexOf(n) < 0) names.push(n);
  }
  var source = new EventSource("/console/events?live=" + names.join(","));
  function apply(name, html) {
    var list = document.querySelectorAll('[data-live="' + name + '"]');
    for (var i = 0; i < list.length; i++) {
      var el = list[i];
      // Never replace a region while someone is typing in it.
      if (el.contains(document.activeElement) && document.activeElement.tagName === "INPUT") continue;
      el.innerHTML = html;
    }
  }
  source.addEventListener("devices", function (e) { apply("devices", e.data); });
  source.addEventListener("approvals", function (e) { apply("approvals", e.data); });
  source.addEventListener("evidence", function (e) { apply("evidence", e.data); });
})();
