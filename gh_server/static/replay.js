// The replay page: plays an attempt's frames on a timeline with the input event before each frame,
// its phases, the check outputs and the outcome. All data is embedded in the page (redacted by the
// server), so the same page works served by gh-server and exported to disk by `gh-runner local`.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("replay-data").textContent);
  var frames = data.frames || [];
  var $ = function (id) { return document.getElementById(id); };
  var text = function (el, s) { el.textContent = s == null ? "" : String(s); };

  function describe(ev) {
    if (!ev) return "";
    switch (ev.type) {
      case "click": case "double_click": case "mouse_down": case "mouse_up":
        return ev.type + " " + (ev.button || "left") + " at " + ev.x + "," + ev.y;
      case "move": return "move to " + ev.x + "," + ev.y;
      case "scroll": return "scroll " + (ev.dx ? "dx " + ev.dx + " " : "") + "dy " + (ev.dy || 0) + " at " + ev.x + "," + ev.y;
      case "type": return "type " + JSON.stringify(ev.text);
      case "key": return "key " + (ev.keys || []).join("+") + (ev.hold_ms ? " held " + ev.hold_ms + " ms" : "");
      case "exec": return "exec (exit " + (ev.timed_out ? "timed out" : ev.exit_code) + ") " +
        JSON.stringify((ev.script || "").split("\n")[0].slice(0, 80));
      case "screen": return (ev.note && ev.note.seen_by_model ? "the model looks (step " + ev.note.step + ")" : "screen");
      default: return ev.type || JSON.stringify(ev);
    }
  }

  text($("title"), (data.key ? data.key + " · " : "") + (data.name || data.attempt_id));
  var badge = $("outcome");
  text(badge, data.outcome || data.status || "unknown");
  badge.className = "badge " + (data.outcome || "");
  $("assisted").hidden = !data.assisted;
  text($("meta"), "attempt " + data.attempt_id + " · agent " + data.agent_id + " · try " + data["try"] +
       (data.retry_of ? " · retry of " + data.retry_of : "") +
       (data.started_at ? " · started " + data.started_at : "") + (data.finished_at ? " · finished " + data.finished_at : ""));
  // Back to the run this try belongs to: its results page (served, or report.html beside an export).
  var back = $("run-link");
  if (data.run_url) {
    back.href = data.run_url;
    text(back, "← run " + data.test_run_id);
  } else {
    text(back, "run " + data.test_run_id);
    back.removeAttribute("href");
  }
  text($("prompt"), data.prompt);
  text($("answer"), data.answer || "(none)");
  if (data.error) { $("error-box").hidden = false; text($("error"), data.error); }

  var check = data.check || {};
  var dl = $("check");
  ["before", "after", "passed"].forEach(function (k) {
    var dt = document.createElement("dt"); text(dt, k);
    var dd = document.createElement("dd");
    var v = check[k];
    var pre = document.createElement("pre");
    text(pre, v == null ? "—" : (typeof v === "object" ? JSON.stringify(v, null, 1) : v));
    dd.appendChild(pre); dl.appendChild(dt); dl.appendChild(dd);
  });

  var phases = data.phases || [];
  var made = {cold: "booted from its image", restored: "restored from a memory image",
              lazy: "restored from a memory image, read as it is touched", pooled: "taken from the hot pool"};
  text($("machine"), data.machine ? "machine: " + (made[data.machine] || data.machine) + " (" + data.machine + ")"
                                  : "machine: not recorded");
  var total = phases.reduce(function (s, p) { return Math.max(s, p.start + p.seconds); }, 0);
  frames.forEach(function (f) { total = Math.max(total, f.t || 0); });
  var holds = data.takeovers || [];
  holds.forEach(function (h) { total = Math.max(total, h.end != null ? h.end : (h.start || 0)); });
  total = total || 1;
  var tbody = $("phases").querySelector("tbody");
  phases.forEach(function (p) {
    var tr = document.createElement("tr");
    [p.name, p.start.toFixed(1), p.seconds.toFixed(1)].forEach(function (c) {
      var td = document.createElement("td"); text(td, c); tr.appendChild(td);
    });
    tbody.appendChild(tr);
    var seg = document.createElement("div");
    seg.className = "ph-" + p.name;
    seg.style.width = (100 * p.seconds / total) + "%";
    seg.title = p.name + " " + p.seconds.toFixed(1) + " s";
    text(seg, p.name);
    $("phase-bar").appendChild(seg);
  });

  // A person's holds: each a band on the timeline and a list of their steps (never the text they typed).
  function plural(n, one, many) { return n + " " + (n === 1 ? one : many); }
  function human(ev) {
    switch (ev.kind) {
      case "typed": return "typed " + plural(ev.count || 0, "character", "characters");
      case "paste": return "pasted " + plural(ev.count || 0, "character", "characters");
      case "key": return "key " + ev.keys;
      case "click": return "click " + (ev.button || "left") + " at " + ev.x + "," + ev.y;
      default: return ev.kind;
    }
  }
  var ENDED = {handed_back: "handed back", idle: "given back after no input", cap: "given back at the takeover's cap",
               attempt_ended: "ended with the attempt"};
  var secs = function (t) { return t == null ? "?" : t.toFixed(1) + " s"; };
  holds.forEach(function (h, n) {
    var c = h.counts || {};
    var said = (h.by || "someone") + " took over at " + secs(h.start) +
      (h.end != null ? ", " + (ENDED[h.ended_by] || h.ended_by || "ended") + " at " + secs(h.end) : ", still holding") +
      (h.held_seconds != null ? " (" + h.held_seconds.toFixed(1) + " s held)" : "") + ": " +
      plural(c.keys || 0, "key", "keys") + ", " + plural(c.clicks || 0, "click", "clicks") + ", " +
      plural(c.typed || 0, "character", "characters") + " typed";
    var band = document.createElement("div");
    band.className = "hold";
    band.setAttribute("data-by", h.by || "");
    band.setAttribute("role", "img");
    band.setAttribute("aria-label", "takeover " + (n + 1) + ": " + said);
    var start = h.start || 0, end = h.end != null ? h.end : total;
    band.style.left = (100 * start / total) + "%";
    band.style.width = Math.max(0.5, 100 * (end - start) / total) + "%";
    band.title = said;
    text(band, "held by " + (h.by || "someone"));
    $("holds").appendChild(band);
    var head = document.createElement("p");
    head.className = "hold-head";
    text(head, said);
    var ol = document.createElement("ol");
    ol.className = "human-steps";
    (h.events || []).forEach(function (ev) {
      var li = document.createElement("li");
      text(li, secs(ev.t) + " — " + (h.by || "a person") + ": " + human(ev));
      ol.appendChild(li);
      if (ev.t != null) {
        var m = document.createElement("span");
        m.className = "human";
        m.style.left = (100 * ev.t / total) + "%";
        m.title = secs(ev.t) + " " + (h.by || "a person") + ": " + human(ev);
        $("marks").appendChild(m);
      }
    });
    if (h.events_dropped) {
      var li = document.createElement("li");
      text(li, plural(h.events_dropped, "more step", "more steps") + " not recorded one by one (in the counts above)");
      ol.appendChild(li);
    }
    $("human").appendChild(head);
    $("human").appendChild(ol);
  });
  $("human-box").hidden = !holds.length;

  var marks = [], items = [];
  frames.forEach(function (f, i) {
    var m = document.createElement("span");
    m.className = f.event ? "input" : "";
    m.style.left = (100 * (f.t || 0) / total) + "%";
    m.title = (f.t || 0).toFixed(1) + " s " + f.label + (f.event ? ": " + describe(f.event) : "");
    m.addEventListener("click", function () { show(i); stop(); });
    $("marks").appendChild(m); marks.push(m);
    var li = document.createElement("li");
    text(li, (f.t || 0).toFixed(1) + " s — " + f.label + (f.event ? ": " + describe(f.event) : ""));
    li.addEventListener("click", function () { show(i); stop(); });
    $("events").appendChild(li); items.push(li);
  });

  // A model step's words and an exec's output go under the frame; a click is drawn where it landed.
  var detail = document.createElement("pre");
  detail.id = "step-detail";
  $("frame-info").after(detail);
  var wrap = $("screen-wrap");
  wrap.style.position = "relative";
  var marker = document.createElement("div");
  marker.id = "click-marker";
  marker.style.cssText = "position:absolute;width:18px;height:18px;margin:-9px 0 0 -9px;border:3px solid #e33;" +
    "border-radius:50%;pointer-events:none;display:none";
  wrap.appendChild(marker);
  var POINTED = {click: 1, double_click: 1, mouse_down: 1, mouse_up: 1, move: 1, scroll: 1};
  function place(ev) {
    var img = $("screen");
    if (!ev || !POINTED[ev.type] || !img.naturalWidth) { marker.style.display = "none"; return; }
    marker.style.left = (img.offsetLeft + ev.x * img.clientWidth / img.naturalWidth) + "px";
    marker.style.top = (img.offsetTop + ev.y * img.clientHeight / img.naturalHeight) + "px";
    marker.style.display = "block";
  }
  function details(ev) {
    if (!ev) return "";
    var out = [];
    if (ev.note && ev.note.step != null) out.push("step " + ev.note.step + (ev.note.action ? ": " + ev.note.action.type : ""));
    if (ev.note && ev.note.text) out.push(ev.note.text);
    if (ev.type === "exec") {
      out.push("$ " + ev.script, "exit code " + ev.exit_code + (ev.timed_out ? " (timed out)" : ""));
      if (ev.stdout_tail) out.push(ev.stdout_tail);
      if (ev.stderr_tail) out.push("stderr: " + ev.stderr_tail);
    }
    return out.join("\n");
  }

  var current = -1, timer = null;
  var scrub = $("scrub");
  scrub.max = String(Math.max(0, frames.length - 1));
  function show(i) {
    if (!frames.length) return;
    i = Math.max(0, Math.min(frames.length - 1, i));
    if (current >= 0) { marks[current].classList.remove("current"); items[current].classList.remove("current"); }
    current = i;
    var f = frames[i];
    $("screen").src = f.src;
    $("screen").onload = function () { place(f.event); };
    place(f.event);
    text(detail, details(f.event));
    marks[i].classList.add("current"); items[i].classList.add("current");
    scrub.value = String(i);
    text($("clock"), (f.t || 0).toFixed(1) + " s");
    text($("frame-info"), "frame " + (i + 1) + "/" + frames.length + " · " + f.label + (f.event ? " · after " + describe(f.event) : ""));
  }
  function stop() { if (timer) { clearTimeout(timer); timer = null; } text($("play"), "Play"); }
  function step() {
    if (current >= frames.length - 1) { stop(); return; }
    var dt = (frames[current + 1].t || 0) - (frames[current].t || 0);
    timer = setTimeout(function () { show(current + 1); step(); }, Math.min(2000, Math.max(300, dt * 1000)));
  }
  $("play").addEventListener("click", function () {
    if (timer) { stop(); return; }
    if (current >= frames.length - 1) show(0);
    text($("play"), "Pause"); step();
  });
  scrub.addEventListener("input", function () { stop(); show(parseInt(scrub.value, 10)); });
  if (frames.length) { show(0); } else { $("screen").hidden = true; $("no-frames").hidden = false; }
  document.body.setAttribute("data-ready", "1");
})();
