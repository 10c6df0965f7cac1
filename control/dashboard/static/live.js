// Refreshes the page's body when the control plane says what it shows
// changed: the server sends a namespace name (or "*") on /events, and the
// page fetches itself again as a fragment. No library, no build step.
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main || !window.EventSource) { return; }
  var scope = main.getAttribute("data-scope");
  if (scope === "none") { return; }
  var pending = null;
  var busy = false;
  function refresh() {
    pending = null;
    if (busy) { schedule(); return; }
    busy = true;
    fetch(window.location.href, { headers: { "X-Fragment": "1" }, credentials: "same-origin" })
      .then(function (r) {
        if (r.status === 401) { window.location.href = "/login"; return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html !== null) {
          main.innerHTML = html;
          main.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () {})
      .then(function () { busy = false; });
  }
  function schedule() {
    if (pending === null) { pending = window.setTimeout(refresh, 200); }
  }
  var events = new EventSource("/events");
  events.onmessage = function (e) {
    if (scope === "*" || e.data === "*" || e.data === scope) { schedule(); }
  };
  // The server ends the stream of a session that expired or whose token
  // was revoked.
  events.addEventListener("logout", function () {
    events.close();
    window.location.href = "/login";
  });
})();
