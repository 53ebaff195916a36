// Runners: who is online, how busy, what they hold; an admin registers one (its token is shown once,
// here, and never again) and revokes one.
import { api, isAdmin } from "./api.js";
import { ago, errorBox, fieldError, h, poll, status, table } from "./dom.js";

const POLL_MS = 5000;

function heldText(r) {
  return (r.held_versions || []).map((v) => `${v.start_state_id} v${v.version}`).join(", ") || "—";
}

export async function list(page) {
  page.append(h("h1", {}, "Runners"));
  const note = h("div", { "aria-live": "polite" });
  if (isAdmin()) {
    const name = h("input", { name: "name", required: true, maxlength: 200, placeholder: "lab-1" });
    const form = h("form", { class: "row", "aria-label": "Register a runner" },
      h("label", {}, "Runner name", name), h("button", { type: "submit", class: "primary" }, "Register"));
    const err = h("div", { role: "alert", class: "field-error" });
    form.append(err);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      note.replaceChildren();
      fieldError(form, err, null);
      try {
        const r = await api("POST", "/v1/runners", { name: name.value.trim() });
        name.value = "";
        note.replaceChildren(h("section", { "aria-label": "Registered runner" },
          h("p", {}, `Registered ${r.name} (${r.runner_id}). Its token, shown only this once: put it in the runner's `,
            h("code", {}, "GH_RUNNER_TOKEN"), "."),
          h("p", { class: "secret", "aria-label": "Runner token" }, r.token)));
        await draw();
      } catch (e) { fieldError(form, err, e); }
    });
    page.append(form);
  }
  const body = h("div");
  page.append(note, body);
  const revoke = async (r) => {
    if (!confirm(`Revoke ${r.name}? Its token stops working and it is disconnected.`)) return;
    try {
      await api("DELETE", `/v1/runners/${encodeURIComponent(r.runner_id)}`);
      note.replaceChildren(h("p", {}, `Revoked ${r.name}.`));
      await draw();
    } catch (e) { note.replaceChildren(errorBox(e)); }
  };
  const draw = async () => {
    const runners = await api("GET", "/v1/runners?limit=100");
    body.replaceChildren(table(
      ["Runner", "Status", "Busy / slots", "Labels", "Images", "Paused", "Held versions", "Last seen", ""],
      runners.data.map((r) => [h("span", { title: r.runner_id }, r.name), status(r.status), `${r.busy} / ${r.slots}`,
        r.labels.join(", ") || "—", r.images.join(", ") || "—", r.paused || "—", heldText(r), ago(r.last_seen_at),
        isAdmin() ? h("button", { type: "button", class: "danger", "aria-label": `Revoke ${r.name}`,
          onclick: () => revoke(r) }, "Revoke") : ""])));
  };
  await draw();
  poll(page, POLL_MS, draw);
}
