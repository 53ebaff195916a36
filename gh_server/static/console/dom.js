// Small helpers every page module shares: building elements, links that stay in the page, times.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// A link to another console page: handled by app.js's router (no reload).
export const link = (href, text) => h("a", { href, "data-route": "" }, text);

export const status = (s) => h("span", { class: `status ${s || ""}` }, s || "—");

export function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return h("time", { datetime: iso, title: d.toISOString() }, d.toLocaleString());
}

export function ago(iso) {
  if (!iso) return "never";
  const s = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${Math.max(s, 0)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

export function table(headers, rows, caption) {
  return h("table", {},
    caption ? h("caption", { class: "muted" }, caption) : null,
    h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, rows.length ? rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))
      : h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "None yet."))));
}

// An error box that screen readers announce.
export const errorBox = (e) => h("p", { class: "error", role: "alert" }, e && e.message ? e.message : String(e));

export function definitions(pairs) {
  return h("dl", {}, pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "—")]));
}

// Repeats `fn` every `ms` while the page shown is still `page` (app.js's current view) and `fn` does not
// return false: polling stops by itself when the person navigates away or the thing stops changing.
export function poll(page, ms, fn) {
  const tick = async () => {
    if (!page.isConnected) return;
    let more = true;
    try { more = (await fn()) !== false; } catch (e) { /* the next tick tries again; the last good state stays */ }
    if (more && page.isConnected) setTimeout(tick, ms);
  };
  setTimeout(tick, ms);
}

// Opens another console page (app.js's router draws it).
export function go(href) {
  history.pushState(null, "", href);
  window.dispatchEvent(new Event("gh:navigate"));
}

// Shows an API error in `box` and, when it names a field of `form` (`param`), marks that field invalid,
// points it at the message and moves the focus there.
export function fieldError(form, box, e) {
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  box.textContent = e ? e.message : "";
  const field = e && e.param ? form.elements.namedItem(e.param.split(/[.[]/)[0]) : null;
  if (field && field.setAttribute) {
    if (!box.id) box.id = `err-${Math.random().toString(36).slice(2)}`;
    field.setAttribute("aria-invalid", "true");
    field.setAttribute("aria-describedby", box.id);
    field.focus();
  }
}
