// Start states: the list, making one (by script, by instruction, or by hand), and a start state's page:
// Open, Save and Close for an admin, the idle close as a countdown, and when open, the live screen
// through noVNC (POST /v1/start_states/{id}/view, docs/console.md).
import { ApiError, api, isAdmin } from "./api.js";
import { definitions, errorBox, fieldError, go, h, link, poll, status, table, when } from "./dom.js";
import { liveScreen } from "./live_screen.js";

const POLL_MS = 3000;

export async function list(page) {
  page.append(h("h1", {}, "Start states"));
  if (isAdmin()) page.append(createForm());
  const all = await api("GET", "/v1/start_states?limit=100");
  page.append(table(["Name", "Kind", "From", "Method", "Status", "Version", "Updated"], all.data.map((s) => [
    s.kind === "image" ? s.name : link(`/start_states/${s.start_state_id}`, s.name), s.kind, s.from || "—",
    s.method || "—", status(s.status), s.kind === "image" ? (s.image_version || "—") : s.version, when(s.updated_at)])));
}

function createForm() {
  const method = h("select", { name: "method" },
    h("option", { value: "hand" }, "by hand"), h("option", { value: "script" }, "script"),
    h("option", { value: "instruction" }, "instruction"));
  const text = h("textarea", { name: "script", rows: 4, "aria-label": "Script or instruction", disabled: true });
  method.addEventListener("change", () => {
    text.disabled = method.value === "hand";
    text.name = method.value === "instruction" ? "instruction" : "script";
  });
  const err = h("div", { role: "alert", class: "field-error" });
  const form = h("form", { "aria-label": "New start state" }, h("h2", {}, "New start state"),
    h("div", { class: "row" },
      h("label", {}, "Name", h("input", { name: "name", required: true, maxlength: 200 })),
      h("label", {}, "From (image or start state)", h("input", { name: "from", required: true, placeholder: "linux-tiny" })),
      h("label", {}, "Made", method)),
    text, err, h("div", { class: "toolbar" }, h("button", { type: "submit", class: "primary" }, "Create")));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const body = { name: f.get("name"), from: f.get("from") };
    if (method.value !== "hand") body[method.value] = text.value;
    fieldError(form, err, null);
    try {
      const s = await api("POST", "/v1/start_states", body);
      go(`/start_states/${s.start_state_id}`);
    } catch (e) { fieldError(form, err, e); }
  });
  return form;
}

function countdown(el, iso) {
  const tick = () => {
    if (!el.isConnected) return;
    const s = Math.max(0, Math.round((new Date(iso).getTime() - Date.now()) / 1000));
    el.textContent = `closes itself in ${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s without input`;
    if (s > 0) setTimeout(tick, 1000);
  };
  tick();
}

export async function show(page, [id]) {
  const head = h("div");
  const live = h("section", { "aria-label": "Machine" });
  const versions = h("section", { "aria-label": "Versions" });
  page.append(head, live, versions);
  let shownStatus = null;
  let rfb = null;
  page.addEventListener("gh:leave", () => { if (rfb) rfb.disconnect(); rfb = null; });
  const act = async (what) => {
    try {
      await api("POST", `/v1/start_states/${encodeURIComponent(id)}/${what}`);
      await draw();
    } catch (e) {
      // Closing a hand-made state that was never saved deletes it (docs/start-states.md).
      if (e instanceof ApiError && e.status === 404) go("/start_states");
      else head.append(errorBox(e));
    }
  };
  const draw = async () => {
    const s = await api("GET", `/v1/start_states/${encodeURIComponent(id)}`);
    const idle = h("span", {});
    const open = s.status === "open";
    head.replaceChildren(h("h1", {}, s.name), s.description ? h("p", {}, s.description) : null,
      definitions([["Status", status(s.status)], ["Version", s.version], ["From", s.from], ["Image", s.image],
        ["Made", s.method || "by hand"], ["Runner", s.runner_id], ["Labels", s.labels.join(", ") || "—"],
        ["Error", s.error ? h("span", { class: "error" }, s.error) : null], ["Updated", when(s.updated_at)],
        ["Idle close", open && s.view ? idle : "—"]]),
      isAdmin() ? h("div", { class: "toolbar" },
        h("button", { type: "button", class: "primary", disabled: s.status !== "ready", onclick: () => act("open") }, "Open"),
        h("button", { type: "button", disabled: !open, onclick: () => act("save") }, "Save"),
        h("button", { type: "button", class: "danger", disabled: !open, onclick: () => act("close") }, "Close")) : null);
    if (open && s.view) countdown(idle, s.view.expires_at);
    if (s.status !== shownStatus) {
      shownStatus = s.status;
      const vs = await api("GET", `/v1/start_states/${encodeURIComponent(id)}/versions`);
      versions.replaceChildren(h("h2", {}, "Versions"), table(["Version", "Runner", "Size", "Registry", "Saved"],
        vs.data.map((v) => [v.current ? `${v.version} (current)` : v.version, v.runner_id || "—",
          v.size_bytes ? `${(v.size_bytes / 1048576).toFixed(0)} MB` : "—", v.registry_ref || "—", when(v.created_at)])));
      if (rfb) { rfb.disconnect(); rfb = null; }
      if (open) rfb = await liveScreen(live, `/v1/start_states/${encodeURIComponent(s.start_state_id)}/view`);
      else live.replaceChildren();
    }
  };
  // The state can go away between any two of draw's requests, the page's first draw included (its name
  // shown, its versions not yet read): a 404 from any of them says so on the page, which stops polling.
  const drawUnlessGone = async () => {
    try {
      await draw();
      return true;
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404)) throw e;
      if (rfb) rfb.disconnect();
      rfb = null;
      head.replaceChildren(h("h1", {}, "Deleted"), h("p", {}, "This start state no longer exists (closed before it was ever saved, or deleted). ", link("/start_states", "All start states")));
      live.replaceChildren();
      versions.replaceChildren();
      return false;
    }
  };
  if (await drawUnlessGone()) poll(page, POLL_MS, drawUnlessGone);
}
