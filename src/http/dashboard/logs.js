// voodu-agent dashboard: the log tail of a resource's page (logs.rs). Follows the
// section's server-sent events; each line goes in with textContent: nothing the containers
// print is parsed as HTML. Keeps the last MAX_LINES lines.
"use strict";
(function () {
  var section = document.getElementById("logs");
  if (!section) { return; }
  var url = section.getAttribute("data-logs");
  var lines = document.getElementById("log-lines");
  var select = document.getElementById("log-replica");
  var state = document.getElementById("log-state");
  var MAX_LINES = 2000;
  var sources = {};
  var stream = null;

  function append(text, cls) {
    var line = document.createElement("div");
    line.className = cls;
    line.textContent = text;
    var atEnd = lines.scrollTop + lines.clientHeight >= lines.scrollHeight - 4;
    lines.appendChild(line);
    while (lines.childNodes.length > MAX_LINES) { lines.removeChild(lines.firstChild); }
    if (atEnd) { lines.scrollTop = lines.scrollHeight; }
  }
  function known(source) {
    if (sources[source]) { return; }
    sources[source] = true;
    var option = document.createElement("option");
    option.value = source;
    option.textContent = source;
    select.appendChild(option);
  }
  function open() {
    if (stream) { stream.close(); }
    lines.replaceChildren();
    var replica = select.value;
    stream = new EventSource(url + (replica ? "?replica=" + encodeURIComponent(replica) : ""));
    stream.addEventListener("line", function (event) {
      var doc = JSON.parse(event.data);
      known(doc.s);
      append(doc.s + " | " + doc.t, "log-line");
    });
    stream.addEventListener("note", function (event) {
      append("-- " + JSON.parse(event.data).t, "log-note");
    });
    stream.onopen = function () { state.textContent = "following"; };
    stream.onerror = function () { state.textContent = "reconnecting…"; };
  }
  select.addEventListener("change", open);
  open();
})();
