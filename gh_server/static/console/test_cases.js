// Evals: test cases. A list filtered by key, tag and category; a case shown as YAML; an admin edits it
// as YAML, which the server parses (application/yaml) and validates: its error is shown at the field's
// line in the editor.
import { ApiError, api, isAdmin } from "./api.js";
import { errorBox, go, h, link, status, table, when } from "./dom.js";
import { evalsNav } from "./evals_nav.js";
import { lineOf, toYaml } from "./yaml.js";

// What a person may edit (the rest is the server's: ids, times, validation).
const EDITABLE = ["key", "name", "prompt", "start_state", "setup_script", "success", "customer", "operator", "limits",
  "runs_on", "category", "tags", "metadata"];
const TEMPLATE = `key: my-first-case
name: My first case
prompt: Create the file /tmp/hello containing hello.
start_state: linux-tiny
success:
  check_script: test "$(cat /tmp/hello)" = hello && echo True || echo False
limits:
  minutes: 10
tags: []
`;

export async function list(page, _args, query) {
  page.append(evalsNav("cases"), h("h1", {}, "Test cases"));
  const field = (name, label) => h("label", {}, label, h("input", { name, value: query.get(name) || "", type: "search" }));
  const form = h("form", { class: "row", role: "search", "aria-label": "Filter test cases" },
    field("q", "Key or name"), field("tag", "Tag"), field("category", "Category"),
    h("button", { type: "submit" }, "Filter"),
    isAdmin() ? link("/test_cases/new", "New test case") : null);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const params = new URLSearchParams([...new FormData(form)].filter(([, v]) => v));
    go(`/test_cases${params.size ? "?" + params : ""}`);
  });
  page.append(form);
  const params = new URLSearchParams({ limit: "100", include: "total_count" });
  for (const k of ["q", "tag", "category"]) if (query.get(k)) params.set(k, query.get(k));
  const cases = await api("GET", `/v1/test_cases?${params}`);
  page.append(table(["Key", "Name", "Start state", "Category", "Tags", "Validation", "Updated"], cases.data.map((c) => [
    link(`/test_cases/${c.test_case_id}`, c.key || c.test_case_id), c.name, c.start_state, c.category || "—",
    (c.tags || []).join(", "), status(c.validation.status), when(c.updated_at)]), `${cases.total_count} test cases`));
}

// The YAML editor with its Save button; `save(text)` sends it and returns the saved case.
function editor(text, save) {
  const area = h("textarea", { id: "case-yaml", rows: 22, spellcheck: "false", "aria-describedby": "case-error" });
  area.value = text;
  const err = h("div", { id: "case-error", role: "alert", class: "field-error" });
  const form = h("form", { "aria-label": "Test case YAML" },
    h("label", { for: "case-yaml", class: "block" }, "Test case (YAML)", area), err,
    h("div", { class: "toolbar" }, h("button", { type: "submit", class: "primary" }, "Save")));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    err.textContent = "";
    area.removeAttribute("aria-invalid");
    try {
      await save(area.value);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      const line = e.line || lineOf(area.value, e.param);
      area.setAttribute("aria-invalid", "true");
      err.textContent = (line ? `Line ${line}` : "") + (e.param && e.param !== "body" ? ` (${e.param})` : "") +
        (line || e.param ? ": " : "") + e.message;
      if (line) selectLine(area, line);
    }
  });
  return form;
}

function selectLine(area, line) {
  const lines = area.value.split("\n");
  const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
  area.focus();
  area.setSelectionRange(start, start + (lines[line - 1] || "").length);
}

export async function create(page) {
  page.append(evalsNav("cases"), h("h1", {}, "New test case"));
  if (!isAdmin()) {
    page.append(h("p", {}, "Making test cases needs an admin key."));
    return;
  }
  page.append(h("p", { class: "muted" }, "Fields as in docs/server-api.md; the server checks them when you save."),
    editor(TEMPLATE, async (text) => {
      const c = await api("POST", "/v1/test_cases", { yaml: text });
      go(`/test_cases/${c.test_case_id}`);
    }));
}

export async function show(page, [id]) {
  const c = await api("GET", `/v1/test_cases/${encodeURIComponent(id)}`);
  const fields = Object.fromEntries(EDITABLE.map((k) => [k, c[k]]));
  page.append(evalsNav("cases"), h("h1", {}, c.name),
    h("p", { class: "muted" }, `${c.test_case_id} · validation: ${c.validation.status} · updated `, when(c.updated_at)));
  if (isAdmin()) {
    page.append(editor(toYaml(fields) + "\n", async (text) => {
      await api("PATCH", `/v1/test_cases/${encodeURIComponent(c.test_case_id)}`, { yaml: text });
      go(`/test_cases/${c.test_case_id}`);
    }));
  } else {
    page.append(h("pre", { "aria-label": "Test case (YAML)" }, toYaml(fields)));
  }
  if (c.validation.reasons && c.validation.reasons.length) page.append(h("h2", {}, "Validation"),
    h("ul", {}, c.validation.reasons.map((r) => h("li", {}, typeof r === "string" ? r : JSON.stringify(r)))));
}
