// Evals: test sets, each with its cases and its runs.
import { api } from "./api.js";
import { errorBox, go, h, link, status, table, when } from "./dom.js";
import { evalsNav } from "./evals_nav.js";

export async function list(page) {
  page.append(evalsNav("sets"), h("h1", {}, "Test sets"));
  const sets = await api("GET", "/v1/test_sets?limit=100");
  page.append(table(["Name", "Cases", "Repeat", "Updated"], sets.data.map((s) => [
    link(`/test_sets/${s.test_set_id}`, s.name), s.case_count, s.repeat ?? 1, when(s.updated_at)])));
}

export async function show(page, [id]) {
  const s = await api("GET", `/v1/test_sets/${encodeURIComponent(id)}`);
  const runs = await api("GET", `/v1/test_runs?test_set_id=${encodeURIComponent(s.test_set_id)}&limit=20`);
  page.append(evalsNav("sets"), h("h1", {}, s.name), s.description ? h("p", {}, s.description) : null,
    h("h2", {}, "Cases"), table(["Case", "Repeat"], s.cases.map((c) => [
      link(`/test_cases/${c.test_case_id}`, c.key || c.test_case_id), c.repeat ?? s.repeat ?? 1])),
    h("h2", {}, "Runs"), startRun(s), table(["Run", "Status", "Created"], runs.data.map((r) => [
      link(`/test_runs/${r.test_run_id}`, r.name || r.test_run_id), status(r.status), when(r.created_at)])));
}

// Any key may start a run (docs/server-api.md): the set's cases against the agents named.
function startRun(set) {
  const agents = h("input", { name: "agents", required: true, placeholder: "noop, reference" });
  const err = h("div");
  const form = h("form", { class: "row", "aria-label": "Start a run" }, h("label", {}, "Agents", agents),
    h("button", { type: "submit" }, "Start run"), err);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const run = await api("POST", "/v1/test_runs", { test_set_id: set.test_set_id,
        agents: agents.value.split(",").map((a) => a.trim()).filter(Boolean) });
      go(`/test_runs/${run.test_run_id}`);
    } catch (e) { err.replaceChildren(errorBox(e)); }
  });
  return form;
}
