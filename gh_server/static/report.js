// Renders the results page from the JSON embedded in it: no network, so it works from disk too.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const res = data.results;
  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined) e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  };
  const pct = (x) => (x === null || x === undefined ? "n/a" : (100 * x).toFixed(1) + "%");
  const ci = (c) => (c ? pct(c[0]) + " – " + pct(c[1]) : "n/a");
  const curve = (m) => Object.entries(m || {}).map(([k, v]) => k + ": " + pct(v)).join(", ") || "n/a";

  $("title").textContent = "Results " + (data.run.name || data.run.test_run_id);
  document.title = $("title").textContent;
  $("status").textContent = data.run.status;
  const t = res.totals;
  $("totals").textContent = t.tries + " tries: " + t.passed + " passed, " + t.failed + " failed, " + t.error +
    " error · pass rate " + pct(t.pass_rate) + " · " + (t.wall_seconds ?? "n/a") + " s";

  function bar(rate, interval) {
    const b = el("div", { class: "bar" });
    if (interval) {
      const c = el("div", { class: "ci" });
      c.style.left = 100 * interval[0] + "%";
      c.style.width = Math.max(1, 100 * (interval[1] - interval[0])) + "%";
      b.append(c);
    }
    if (rate !== null && rate !== undefined) {
      const p = el("div", { class: "pt" });
      p.style.left = "calc(" + 100 * rate + "% - 1px)";
      b.append(p);
    }
    return b;
  }

  // The matrix: cases down, agents across.
  const agents = data.run.agents;
  const head = el("tr", {}, el("th", {}, "case"));
  for (const a of agents) head.append(el("th", {}, a));
  $("matrix").tHead.append(head);
  const cases = [];
  const byKey = {};
  for (const row of res.data) {
    if (!(row.test_case_id in byKey)) { byKey[row.test_case_id] = {}; cases.push(row); }
    byKey[row.test_case_id][row.agent_id] = row;
  }
  for (const c of cases) {
    const label = el("td", {}, el("div", {}, c.key || c.test_case_id), el("div", { class: "hint" }, c.name || ""));
    const v = c.case_validation;
    if (v && v !== "valid") {
      label.append(el("span", { class: "badge " + (v === "flaky" ? "flakycase" : v), "data-validation": v },
                      v === "flaky" ? "flaky case" : v));
    } else if (v === "valid") {
      label.append(el("span", { class: "badge valid", "data-validation": v }, "valid"));
    }
    const tr = el("tr", {}, label);
    for (const a of agents) {
      const row = byKey[c.test_case_id][a];
      if (!row) { tr.append(el("td", {}, "")); continue; }
      const scored = row.passed + row.failed;
      const rate = scored ? row.passed / scored : null;
      const cell = el("td", { class: "cell", "data-case": c.key || c.test_case_id, "data-agent": a });
      cell.append(el("span", { class: "rate" }, pct(rate)), " ",
                  el("span", { class: "hint" }, row.passed + "/" + scored + (row.error ? " · " + row.error + " error" : "")));
      if (row.flaky) cell.append(" ", el("span", { class: "badge flaky" }, "flaky"));
      cell.append(bar(rate, row.ci95));
      const tries = el("div", { class: "tries" });
      for (const at of (data.attempts[c.test_case_id + "|" + a] || [])) {
        tries.append(el("a", { class: at.outcome || "", href: at.replay, title: at.attempt_id + " " + (at.outcome || at.status) },
                        "try " + at.try + (at.retry_of ? "r" : "")));
      }
      cell.append(tries);
      tr.append(cell);
    }
    $("matrix").tBodies[0].append(tr);
  }

  for (const a of agents) {
    const s = res.by_agent[a];
    if (!s) continue;
    const st = (s.axes || {}).structural || {};
    $("agents").tBodies[0].append(el("tr", { "data-agent": a },
      el("td", {}, a), el("td", { class: "pass-rate" }, pct(s.pass_rate)), el("td", {}, ci(s.ci95)),
      el("td", {}, curve(s.pass_at_k)), el("td", {}, curve(s.pass_hat_k)), el("td", {}, pct(st.rate)),
      el("td", {}, s.median_seconds ?? "n/a"), el("td", {}, s.infrastructure_errors ?? s.error)));
  }
  const inf = t.infrastructure || { errors: 0, attempts: t.attempts, by_phase: {} };
  $("infra").textContent = inf.errors + " of " + inf.attempts + " attempts (" + pct(inf.rate) + ")" +
    (Object.keys(inf.by_phase).length ? " · by phase: " +
      Object.entries(inf.by_phase).map(([k, v]) => k + " " + v).join(", ") : "");

  // Timeline: cumulative tries finished, one line per outcome.
  const tl = res.timeline || [];
  const svg = $("timeline");
  const total = Math.max(1, ...tl.map((p) => p.passed + p.failed + p.error));
  const NS = "http://www.w3.org/2000/svg";
  for (const [k, colour] of [["passed", "#2f9e44"], ["failed", "#e03131"], ["error", "#868e96"]]) {
    const pts = tl.map((p, i) => (tl.length > 1 ? (400 * i) / (tl.length - 1) : 400) + "," + (150 - (140 * p[k]) / total));
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", pts.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", colour);
    line.setAttribute("stroke-width", "2");
    line.setAttribute("data-outcome", k);
    svg.append(line);
  }

  const cmp = data.compare;
  if (cmp) {
    $("compare-base").textContent = "";
    $("compare-base").append(el("a", { href: cmp.baseline_url }, cmp.baseline), " (baseline)");
    for (const [a, p] of Object.entries(cmp.paired)) {
      $("compare").tBodies[0].append(el("tr", { "data-agent": a }, el("td", {}, a), el("td", {}, p.compared),
        el("td", {}, p.mean_difference === null ? "n/a" : (100 * p.mean_difference).toFixed(1) + " points"),
        el("td", {}, p.ci95 ? (100 * p.ci95[0]).toFixed(1) + " – " + (100 * p.ci95[1]).toFixed(1) : "n/a"),
        el("td", {}, p.mcnemar.p_value)));
    }
  } else {
    $("compare-base").textContent = "no earlier run of these cases";
  }

  for (const r of data.runs) {
    const rates = Object.entries(r.pass_rate || {}).map(([a, v]) => a + " " + pct(v)).join(", ");
    $("runs").tBodies[0].append(el("tr", { class: r.test_run_id === data.run.test_run_id ? "current" : null },
      el("td", {}, r.url ? el("a", { href: r.url }, r.test_run_id) : r.test_run_id), el("td", {}, r.name || ""),
      el("td", {}, r.status), el("td", {}, r.created_at || ""), el("td", {}, rates)));
  }
  document.body.setAttribute("data-rendered", "1");
})();
