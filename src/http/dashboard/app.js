// voodu-agent dashboard: follows the page's server-sent events (data-events on <body>) and
// applies each live document to the page without a reload. Text goes in with textContent
// and attributes with setAttribute: nothing from the server is parsed as HTML.
"use strict";
(function () {
  var source = document.body.getAttribute("data-events");
  if (!source) { return; }
  var live = document.getElementById("live");
  var classes = ["good", "busy", "warn", "bad", "none"];

  function setText(element, text) {
    if (!element || element.textContent === text) { return; }
    element.textContent = text;
    element.classList.remove("flash");
    void element.offsetWidth;
    element.classList.add("flash");
  }
  function setBadge(cell, text, cls) {
    if (!cell) { return; }
    var badge = cell.querySelector(".badge");
    if (!badge) { return; }
    classes.forEach(function (name) { badge.classList.remove(name); });
    badge.classList.add(classes.indexOf(cls) >= 0 ? cls : "none");
    setText(badge, text);
  }
  function show(id, visible) {
    var element = document.getElementById(id);
    if (element) { element.hidden = !visible; }
  }
  function stateClass(element, cls) {
    if (!element) { return; }
    classes.forEach(function (name) { element.classList.remove(name); });
    element.classList.add(cls);
  }

  function overview(doc) {
    var seen = {};
    var known = 0;
    doc.rows.forEach(function (row) {
      seen[row.key] = true;
      var tr = document.querySelector('tr[data-key="' + CSS.escape(row.key) + '"]');
      if (!tr) { return; }
      known += 1;
      setBadge(tr.querySelector('[data-field="phase"]'), row.phase, row.phase_class);
      setText(tr.querySelector('[data-field="ready"]'), row.ready);
      setText(tr.querySelector('[data-field="release"]'), row.release);
      setText(tr.querySelector('[data-field="pin"]'), row.pin);
      setText(tr.querySelector('[data-field="message"]'), row.message);
    });
    var rows = document.querySelectorAll("tr[data-key]");
    show("changed", known !== doc.rows.length || rows.length !== doc.rows.length);
    setText(document.getElementById("n-resources"), String(doc.rows.length));
    var counts = document.getElementById("phase-counts");
    if (counts) {
      var spans = doc.phases.map(function (count) {
        var span = document.createElement("span");
        span.className = "count";
        var badge = document.createElement("span");
        badge.className = "badge " + (classes.indexOf(count.class) >= 0 ? count.class : "none");
        badge.textContent = count.phase;
        span.appendChild(badge);
        span.appendChild(document.createTextNode(" " + count.count + " "));
        return span;
      });
      var text = spans.map(function (span) { return span.textContent; }).join("");
      if (counts.textContent.replace(/\s+/g, "") !== text.replace(/\s+/g, "")) {
        counts.replaceChildren.apply(counts, spans);
      }
    }
    setText(document.getElementById("applied"), doc.applied);
    var fetch = document.getElementById("fetch");
    setText(fetch, doc.fetch); stateClass(fetch, doc.fetch_class);
    var engine = document.getElementById("engine");
    setText(engine, doc.engine); stateClass(engine, doc.engine_class);
    rejected(doc.rejected);
    (doc.images || []).forEach(function (image) {
      var tr = document.querySelector('tr[data-image="' + CSS.escape(image.key) + '"]');
      if (!tr) { return; }
      setText(tr.querySelector('[data-field="latest"]'), image.latest);
      setText(tr.querySelector('[data-field="scan"]'), image.scan);
    });
    (doc.sources || []).forEach(function (source) {
      var tr = document.querySelector('tr[data-source="' + CSS.escape(source.name) + '"]');
      if (!tr) { return; }
      setText(tr.querySelector('[data-field="applied"]'), source.applied);
      var fetch = tr.querySelector('[data-field="fetch"]');
      setText(fetch, source.fetch);
      if (fetch) { stateClass(fetch, source.fetch_class); fetch.classList.add("state"); }
    });
  }

  function rejected(doc) {
    show("rejected", !!doc);
    if (!doc) { return; }
    setText(document.getElementById("rejected-sha"), doc.sha.slice(0, 12));
    setText(document.getElementById("rejected-note"), doc.current
      ? "Seen " + doc.seen_at + "; nothing of it was applied: the host keeps running the last applied commit. Fix these and push:"
      : "Seen " + doc.seen_at + "; a later commit was applied since. Its problems were:");
    var list = document.getElementById("rejected-problems");
    var items = [];
    doc.problems.forEach(function (problem) {
      var item = document.createElement("li");
      var location = document.createElement("code");
      location.className = "loc";
      location.textContent = problem[0];
      item.appendChild(location);
      item.appendChild(document.createTextNode(" " + problem[1]));
      items.push(item);
    });
    var same = list.children.length === items.length && items.every(function (item, i) {
      return list.children[i].textContent === item.textContent;
    });
    if (!same) { list.replaceChildren.apply(list, items); }
  }

  function resource(doc) {
    setBadge(document.getElementById("phase"), doc.phase, doc.phase_class);
    setText(document.getElementById("message"), doc.message);
    setText(document.getElementById("ready"), doc.ready);
    setText(document.getElementById("release"), doc.release);
    var ids = document.getElementById("release-ids");
    show("changed", !!ids && ids.getAttribute("data-ids") !== doc.release_ids.join(","));
    if (doc.plot) {
      setText(document.getElementById("plot-title"), doc.plot_title);
      setText(document.getElementById("plot-caption"), doc.plot.caption);
      var ready = document.getElementById("ready-line");
      var desired = document.getElementById("desired-line");
      if (ready) { ready.setAttribute("points", doc.plot.ready_points); }
      if (desired) { desired.setAttribute("points", doc.plot.desired_points); }
      setText(document.getElementById("ready-ymax"), doc.plot.y_max);
      setText(document.getElementById("ready-span"), doc.plot.span);
    }
    var body = document.getElementById("containers");
    if (body) {
      var rows = doc.containers.map(function (container) {
        var tr = document.createElement("tr");
        var name = document.createElement("code");
        name.textContent = container.name;
        var ready = document.createElement("span");
        ready.className = "badge " + (container.ready ? "good" : "bad");
        ready.textContent = container.ready ? "ready" : "not ready";
        [name, container.state, ready, container.reason, container.version].forEach(function (value) {
          var td = document.createElement("td");
          if (typeof value === "string") { td.textContent = value; } else { td.appendChild(value); }
          tr.appendChild(td);
        });
        return tr;
      });
      var text = rows.map(function (tr) { return tr.textContent; }).join("|");
      var now = Array.prototype.map.call(body.children, function (tr) { return tr.textContent; }).join("|");
      if (text !== now) { body.replaceChildren.apply(body, rows); }
    }
    rollout(doc.rollout);
  }

  function rollout(doc) {
    var section = document.getElementById("rollout");
    // A rollout that starts or ends comes with a new release: the page says to reload.
    if (!doc || !section) { return; }
    setText(document.getElementById("rollout-step-text"), doc.step || "");
    Array.prototype.forEach.call(section.querySelectorAll("[data-step]"), function (share) {
      share.classList.toggle("current", share.getAttribute("data-step") === String(doc.current));
    });
    setText(document.getElementById("rollout-share"), doc.share);
    setBadge(document.getElementById("rollout-phase"), doc.phase, doc.phase_class);
    setText(document.getElementById("rollout-pause"), doc.pause);
    setText(document.getElementById("rollout-analysis"), doc.analysis);
    setText(document.getElementById("rollout-requests"), doc.requests);
    setText(document.getElementById("rollout-since"), doc.since);
    show("rollout-no-history", doc.history.length === 0);
    var body = document.getElementById("rollout-history");
    if (!body) { return; }
    var rows = doc.history.map(function (cells) {
      var tr = document.createElement("tr");
      cells.forEach(function (text) {
        var td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      });
      return tr;
    });
    var text = rows.map(function (tr) { return tr.textContent; }).join("|");
    var now = Array.prototype.map.call(body.children, function (tr) { return tr.textContent; }).join("|");
    if (text !== now) { body.replaceChildren.apply(body, rows); }
  }

  var delay = 1000;
  function connect() {
    var events = new EventSource(source);
    events.addEventListener("update", function (message) {
      delay = 1000;
      if (live) { live.hidden = false; live.classList.remove("lost"); live.textContent = "live"; }
      var doc = JSON.parse(message.data);
      if (doc.rows) { overview(doc); } else { resource(doc); }
    });
    events.onerror = function () {
      if (events.readyState === EventSource.CLOSED) {
        // Refused (503) or gone: try again later, more slowly each time.
        if (live) { live.classList.add("lost"); live.textContent = "reconnecting"; }
        setTimeout(connect, delay);
        delay = Math.min(delay * 2, 30000);
      }
    };
  }
  connect();
})();
