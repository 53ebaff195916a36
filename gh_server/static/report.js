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
  // A score in [0, 1] (a try passes at 1), printed as a number: 0.957 is not a pass rate of 95.7%.
  const num = (x) => (x === null || x === undefined ? "n/a" : Number(x).toFixed(3));
  const numCi = (c) => (c ? num(c[0]) + " – " + num(c[1]) : "n/a");
  const curve = (m) => Object.entries(m || {}).map(([k, v]) => k + ": " + pct(v)).join(", ") || "n/a";

  $("title").textContent = "Results " + (data.run.name || data.run.test_run_id);
  document.title = $("title").textContent;
  $("status").textContent = data.run.status;
  const t = res.totals;
  // Counts for the run, a pass rate per agent: agents are never blended into one rate.
  // An assisted try (a person took the machine over) is counted apart, like an error: never passed or failed.
  $("totals").textContent = t.tries + " tries: " + t.passed + " passed, " + t.failed + " failed, " + t.error +
    " error, " + (t.assisted || 0) + " assisted · " + (t.wall_seconds ?? "n/a") + " s";
  for (const a of data.run.agents) {
    const s = res.by_agent[a];
    if (!s) continue;
    $("agent-rates").append(el("span", { class: "agent-rate", "data-agent": a }, a + " ",
      el("b", {}, pct(s.pass_rate)), " (" + s.passed + "/" + (s.passed + s.failed) + ")",
      el("span", { class: "mean-score" }, " · mean score " + num(s.mean_score))));
  }

  // The Wilson interval as an interval: a whisker from its low to its high end on a 0–100% scale,
  // the observed rate a dot on it. Not a bar from 0: 0 of 1 reads "somewhere in 0–79%", not "79%".
  function interval(rate, ci95) {
    const b = el("div", { class: "iv", title: ci95 ? "95% interval " + ci(ci95) : "no scored tries" });
    b.append(el("div", { class: "axis" }));
    for (const x of [0, 50, 100]) {
      const tick = el("div", { class: "tick" });
      tick.style.left = x + "%";
      b.append(tick);
    }
    if (ci95) {
      const c = el("div", { class: "ci", "data-low": ci95[0], "data-high": ci95[1] });
      c.style.left = 100 * ci95[0] + "%";
      c.style.width = 100 * (ci95[1] - ci95[0]) + "%";
      b.append(c);
    }
    if (rate !== null && rate !== undefined) {
      const p = el("div", { class: "pt" });
      p.style.left = 100 * rate + "%";
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
                  el("span", { class: "hint" }, row.passed + "/" + scored + (row.error ? " · " + row.error + " error" : "") +
                     (row.assisted ? " · " + row.assisted + " assisted" : "")));
      if (row.flaky) cell.append(" ", el("span", { class: "badge flaky" }, "flaky"));
      cell.append(el("div", { class: "hint mean-score" }, "mean score " + num(row.mean_score)));
      cell.append(interval(rate, row.ci95), el("div", { class: "hint ci-text" }, row.ci95 ? "95% CI " + ci(row.ci95) : ""));
      const tries = el("div", { class: "tries" });
      const waiting = new Set();
      for (const at of (data.attempts[c.test_case_id + "|" + a] || [])) {
        const cause = at.error_cause === "case" ? " (your case)" : at.error_cause ? " (ours)" : "";
        // Counted apart when the check scored it; an assisted try that ended in error stays an error.
        const held = at.assisted && at.outcome !== "error" ? " assisted" : "";
        tries.append(el("a", { class: (at.outcome || at.status || "") + held, href: at.replay,
                               title: at.attempt_id + " " + (at.outcome || at.status) + cause +
                                 (at.assisted ? " assisted" : "") },
                        "try " + at.try + (at.retry_of ? "r" : "") +
                          (at.score !== null && at.score !== undefined && at.outcome !== "error" ? " · " + num(at.score) : "") +
                          (at.assisted ? " (assisted)" : "")));
        if (at.queued_reason) waiting.add(at.queued_reason.message);
      }
      cell.append(tries);
      // Why what is still queued waits (which runners are online and what none of them has).
      for (const why of waiting) cell.append(el("div", { class: "hint waiting" }, "queued: " + why));
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
      el("td", { class: "mean-score" }, num(s.mean_score)), el("td", {}, numCi(s.mean_score_ci)),
      el("td", {}, curve(s.pass_at_k)), el("td", {}, curve(s.pass_hat_k)), el("td", {}, pct(st.rate)),
      el("td", {}, s.median_seconds ?? "n/a"), el("td", { class: "errors-ours" }, s.infrastructure_errors ?? s.error),
      el("td", { class: "errors-case" }, s.case_errors ?? 0), el("td", { class: "assisted" }, s.assisted ?? 0)));
  }
  // The case's own errors (its setup or check at fault) apart from ours; neither counts against the agent.
  const ce = t.case_errors || { errors: 0, attempts: t.attempts, by_phase: {} };
  if (!ce.errors) $("sec-case-errors").hidden = true;
  $("case-errors").textContent = ce.errors + " of " + ce.attempts + " attempts (" + pct(ce.rate) + ")" +
    (Object.keys(ce.by_phase).length ? " · by phase: " +
      Object.entries(ce.by_phase).map(([k, v]) => k + " " + v).join(", ") : "");
  const inf = t.infrastructure || { errors: 0, attempts: t.attempts, by_phase: {} };
  if (!inf.errors) $("sec-infra").hidden = true;
  $("infra").textContent = inf.errors + " of " + inf.attempts + " attempts (" + pct(inf.rate) + ")" +
    (Object.keys(inf.by_phase).length ? " · by phase: " +
      Object.entries(inf.by_phase).map(([k, v]) => k + " " + v).join(", ") : "");

  // Timeline: cumulative tries finished, one line per outcome, on axes (tries against time since the start).
  const tl = res.timeline || [];
  const svg = $("timeline");
  const total = Math.max(0, ...tl.map((p) => p.passed + p.failed + p.error + (p.assisted || 0)));
  if (!tl.length || !total) {
    $("sec-timeline").hidden = true;
  } else {
    const NS = "http://www.w3.org/2000/svg";
    const W = 440, H = 180, L = 40, R = 10, T = 10, B = 34;  // plot area inside the margins
    const t0 = Date.parse(tl[0].t), span = Math.max(1, (Date.parse(tl[tl.length - 1].t) - t0) / 1000);
    const x = (sec) => L + ((W - L - R) * sec) / span;
    const y = (n) => H - B - ((H - B - T) * n) / total;
    const svgEl = (tag, attrs, text) => {
      const e = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
      if (text !== undefined) e.textContent = text;
      svg.append(e);
      return e;
    };
    const secs = (v) => (span >= 120 ? (v / 60).toFixed(span >= 600 ? 0 : 1) + " min" : Math.round(v) + " s");
    svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis", "data-axis": "x" });
    svgEl("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis", "data-axis": "y" });
    for (const f of [0, 0.5, 1]) {
      svgEl("line", { x1: x(span * f), y1: H - B, x2: x(span * f), y2: H - B + 4, class: "axis" });
      svgEl("text", { x: x(span * f), y: H - B + 15, "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle",
                      class: "tick-label" }, secs(span * f));
    }
    const yTicks = [...new Set([0, Math.round(total / 2), total])];
    for (const n of yTicks) {
      svgEl("line", { x1: L - 4, y1: y(n), x2: L, y2: y(n), class: "axis" });
      svgEl("text", { x: L - 6, y: y(n) + 4, "text-anchor": "end", class: "tick-label" }, String(n));
    }
    svgEl("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "axis-label" },
          "time since the run started");
    svgEl("text", { x: 10, y: (T + H - B) / 2, "text-anchor": "middle", class: "axis-label",
                    transform: "rotate(-90 10 " + (T + H - B) / 2 + ")" }, "tries finished");
    for (const [k, colour] of [["passed", "#2f9e44"], ["failed", "#e03131"], ["error", "#868e96"],
                               ["assisted", "#9c36b5"]]) {
      const pts = tl.map((p) => x((Date.parse(p.t) - t0) / 1000) + "," + y(p[k] || 0));
      svgEl("polyline", { points: pts.join(" "), fill: "none", stroke: colour, "stroke-width": "2",
                          "data-outcome": k });
    }
  }

  const cmp = data.compare;
  const paired = cmp ? Object.keys(cmp.paired || {}) : [];
  if (!paired.length) {
    $("sec-compare").hidden = true;  // no earlier run of these cases, or no case both runs scored
  } else {
    $("compare-base").textContent = "";
    $("compare-base").append(el("a", { href: cmp.baseline_url }, cmp.baseline), " (baseline)");
    for (const [a, p] of Object.entries(cmp.paired)) {
      $("compare").tBodies[0].append(el("tr", { "data-agent": a }, el("td", {}, a), el("td", {}, p.compared),
        el("td", {}, p.mean_difference === null ? "n/a" : (100 * p.mean_difference).toFixed(1) + " points"),
        el("td", {}, p.ci95 ? (100 * p.ci95[0]).toFixed(1) + " – " + (100 * p.ci95[1]).toFixed(1) : "n/a"),
        el("td", {}, p.mcnemar.p_value)));
    }
  }

  for (const r of data.runs) {
    const rates = Object.entries(r.pass_rate || {}).map(([a, v]) => a + " " + pct(v)).join(", ");
    $("runs").tBodies[0].append(el("tr", { class: r.test_run_id === data.run.test_run_id ? "current" : null },
      el("td", {}, r.url ? el("a", { href: r.url }, r.test_run_id) : r.test_run_id), el("td", {}, r.name || ""),
      el("td", {}, r.status), el("td", {}, r.created_at || ""), el("td", {}, rates)));
  }
  document.body.setAttribute("data-rendered", "1");
})();
