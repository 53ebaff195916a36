// Evals: runs (status, progress and why attempts wait, updating while the run is live), a run's
// results (the server's report page), two runs compared, and an attempt with its replay.
import { api } from "./api.js";
import { definitions, errorBox, go, h, link, poll, status, table, when } from "./dom.js";
import { evalsNav } from "./evals_nav.js";
import { LIVE as LIVE_ATTEMPT, watch } from "./watch.js";

const LIVE = new Set(["queued", "running"]);
const POLL_MS = 2000;

function progressText(p) {
  if (!p) return "—";
  return `${p.total} attempts · ${p.queued} queued · ${p.running} running · ${p.passed} passed · ` +
    `${p.failed} failed · ${p.error} error · ${p.assisted ?? 0} assisted`;
}

// pass_rate is per agent ({agent: rate or null}).
function rate(byAgent) {
  const parts = Object.entries(byAgent || {}).filter(([, r]) => r !== null && r !== undefined)
    .map(([agent, r]) => `${agent} ${Math.round(r * 100)}%`);
  return parts.join(", ") || "—";
}

// The server writes links with its public URL (GH_SERVER_PUBLIC_URL); the page frames them from its own
// origin, whatever name the browser reached the server by.
function sameOrigin(url) {
  const u = new URL(url, location.href);
  return u.pathname + u.search;
}

export async function list(page) {
  page.append(evalsNav("runs"), h("h1", {}, "Runs"));
  const picked = new Set();
  const compare = h("button", { type: "button", disabled: true, onclick: () =>
    go(`/test_runs/compare?ids=${[...picked].join(",")}`) }, "Compare selected");
  const body = h("div");
  page.append(h("div", { class: "toolbar" }, compare), body);
  const draw = async () => {
    const runs = await api("GET", "/v1/test_runs?limit=50");
    body.replaceChildren(table(["", "Run", "Status", "Progress", "Pass rate", "Created"], runs.data.map((r) => [
      h("input", { type: "checkbox", "aria-label": `Compare ${r.name || r.test_run_id}`, checked: picked.has(r.test_run_id),
        onchange: (ev) => { ev.target.checked ? picked.add(r.test_run_id) : picked.delete(r.test_run_id);
          compare.disabled = picked.size < 2 || picked.size > 10; } }),
      link(`/test_runs/${r.test_run_id}`, r.name || r.test_run_id), status(r.status),
      h("span", { class: "progress" }, progressText(r.progress)), rate(r.pass_rate), when(r.created_at)])));
  };
  await draw();
  poll(page, POLL_MS * 2, draw);
}

// A try's score in [0, 1], passed at 1 (docs/agents.md, "Scores"): a number, not a percentage.
const score = (x) => (x === null || x === undefined ? "—" : Number(x).toFixed(3));
const scoreDiff = (x) => (x === null || x === undefined ? "—" : (x > 0 ? "+" : "") + Number(x).toFixed(3));

export async function show(page, [id]) {
  const head = h("div");
  const attempts = h("div");
  const results = h("section", { "aria-label": "Results" });
  page.append(evalsNav("runs"), head, attempts, results);
  let run;
  const draw = async () => {
    run = await api("GET", `/v1/test_runs/${encodeURIComponent(id)}`);
    const atts = await api("GET", `/v1/test_runs/${encodeURIComponent(id)}/attempts?limit=100`);
    const live = LIVE.has(run.status);
    head.replaceChildren(
      h("h1", {}, `Run ${run.name || run.test_run_id}`),
      definitions([["Status", status(run.status)], ["Progress", h("span", { class: "progress" }, progressText(run.progress))],
        ["Pass rate", rate(run.pass_rate)],
        ["Mean score", Object.entries(run.mean_score || {}).map(([a, v]) => `${a} ${score(v)}`).join(", ") || "—"],
        ["Agents", run.agents.join(", ")],
        ["Test set", run.test_set_id ? link(`/test_sets/${run.test_set_id}`, run.test_set_id) : "—"],
        ["Rerun of", run.rerun_of ? link(`/test_runs/${run.rerun_of}`, run.rerun_of) : "—"],
        ["Created", when(run.created_at)], ["Finished", when(run.finished_at)]]),
      h("div", { class: "toolbar" },
        live ? h("button", { type: "button", class: "danger", onclick: () => act("cancel") }, "Cancel run") : null,
        !live ? h("button", { type: "button", onclick: () => act("rerun") }, "Rerun") : null));
    attempts.replaceChildren(h("h2", {}, "Attempts"), table(["Attempt", "Case", "Agent", "Try", "Status", "Outcome", "Score",
      "Why queued", ""],
      atts.data.map((a) => [link(`/attempts/${a.attempt_id}`, a.attempt_id), a.key || a.test_case_id, a.agent_id, a.try,
        status(a.status), a.outcome ? status(a.outcome) : "—", score(a.score), a.queued_reason ? a.queued_reason.message : "",
        LIVE_ATTEMPT.has(a.status) ? h("a", { href: `/attempts/${a.attempt_id}`, "data-route": "",
          "aria-label": `Watch ${a.attempt_id}` }, "Watch") : ""])));
    return live;
  };
  const act = async (what) => {
    try {
      const out = await api("POST", `/v1/test_runs/${encodeURIComponent(id)}/${what}`);
      if (what === "rerun") go(`/test_runs/${out.test_run_id}`);
      else await draw();
    } catch (e) { head.append(errorBox(e)); }
  };
  await draw();
  const report = sameOrigin((await api("GET", `/v1/test_runs/${encodeURIComponent(id)}/report_url`)).url);
  results.append(h("h2", {}, "Results"), h("p", {}, h("a", { href: report, target: "_blank", rel: "noopener" },
    "Open the results page")), h("iframe", { src: report, title: "Results page" }));
  poll(page, POLL_MS, draw);
}

export async function compare(page, _args, query) {
  const ids = query.get("ids") || "";
  page.append(evalsNav("runs"), h("h1", {}, "Runs compared"));
  const cmp = await api("GET", `/v1/test_runs/compare?ids=${encodeURIComponent(ids)}`);
  const runs = cmp.runs.map((r) => r.test_run_id);
  page.append(h("p", {}, "Baseline: ", link(`/test_runs/${cmp.baseline}`, cmp.baseline)),
    table(["Run", "Status", "Compared", "Improved", "Regressed", "Unchanged"], cmp.runs.map((r) => {
      const c = cmp.changes[r.test_run_id] || {};
      return [link(`/test_runs/${r.test_run_id}`, r.name || r.test_run_id), status(r.status), c.compared ?? "—",
        c.improved ?? "—", c.regressed ?? "—", c.unchanged ?? "—"];
    }), "Each run against the baseline, case by case and agent by agent"));
  const cell = (c, rid) => {
    const per = c.results[rid] || {};
    return Object.entries(per).map(([agent, r]) => {
      const change = (c.changes[rid] || {})[agent];
      return h("div", {}, `${agent}: ${r.passed}/${r.tries} passed`, change ? h("strong", {}, ` (${change})`) : "");
    });
  };
  page.append(h("h2", {}, "Cases"), table(["Case", ...runs], cmp.cases.map((c) => [c.key || c.name,
    ...runs.map((rid) => cell(c, rid))])));
  // Each run against the baseline on the cases both scored (docs/server-api.md, "Results you can trust").
  const pct = (x) => (x === null || x === undefined ? "—" : `${(x * 100).toFixed(1)} pts`);
  const paired = Object.entries(cmp.paired || {}).flatMap(([rid, perAgent]) =>
    Object.entries(perAgent).map(([agent, p]) => [link(`/test_runs/${rid}`, rid), agent, p.compared,
      pct(p.mean_difference), p.ci95 ? `${pct(p.ci95[0])} to ${pct(p.ci95[1])}` : "—",
      `${p.mcnemar.baseline_only} / ${p.mcnemar.other_only}`, p.mcnemar.p_value,
      // The same cases on scores (docs/server-api.md, "Scores"): a difference of means in [0, 1].
      p.score ? scoreDiff(p.score.mean_difference) : "—",
      p.score && p.score.ci95 ? `${scoreDiff(p.score.ci95[0])} to ${scoreDiff(p.score.ci95[1])}` : "—"]));
  if (paired.length) {
    page.append(h("h2", {}, "Paired comparison"), table(["Run", "Agent", "Cases", "Mean difference", "95% interval",
      "Baseline only / this run only", "McNemar p", "Mean score difference", "Score 95% interval"], paired));
  }
}

export async function attempt(page, [id]) {
  const body = h("div");
  page.append(evalsNav("runs"), body);
  const draw = async () => {
    const a = await api("GET", `/v1/attempts/${encodeURIComponent(id)}`);
    body.replaceChildren(h("h1", {}, `Attempt ${a.attempt_id}`), definitions([
      ["Run", a.test_run_id ? link(`/test_runs/${a.test_run_id}`, a.test_run_id) : "—"],
      ["Case", a.key || a.test_case_id], ["Agent", a.agent_id], ["Try", a.try], ["Status", status(a.status)],
      ["Outcome", a.outcome ? status(a.outcome) : "—"], ["Score", score(a.score)],
      ["Checkpoints", a.checkpoints ? a.checkpoints.map((c) => `${c.name} ${score(c.score)} (weight ${c.weight})`).join(" · ")
        : "—"],
      ["Score before the task", a.check ? score(a.check.before_score) : "—"], ["Why queued", a.queued_reason ? a.queued_reason.message : "—"],
      ["Error", a.error ? h("span", { class: "error" }, a.error) : "—"], ["Runner", a.runner_id],
      ["Started", when(a.started_at)], ["Finished", when(a.finished_at)]]));
    if (LIVE_ATTEMPT.has(a.status)) {
      // Watched while its machine is up; once it is over, drawn again with its outcome and replay.
      const live = h("section", { "aria-label": "Live" });
      body.append(live);
      watch(live, a.attempt_id, () => { draw().catch((e) => body.append(errorBox(e))); });
    } else if (a.replay_url) {
      const replay = sameOrigin(a.replay_url);
      body.append(h("h2", {}, "Replay"), h("p", {}, h("a", { href: replay, target: "_blank", rel: "noopener" },
        "Open the replay")), h("iframe", { src: replay, title: "Replay" }));
    }
  };
  await draw();
}
