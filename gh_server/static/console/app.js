// The console's shell: sign-in, the tabs, and the router that maps a URL to a page module. Every page
// has a stable URL (gh_server/console_page.py serves this HTML for all of them), so a reload or a pasted
// link opens the same page. A page is a function (page element, path parts, query) -> Promise<void> that
// fills the element; it may listen for "gh:leave" on it to close what it opened.
import { ApiError, isAdmin, loadSession, session, signIn, signOut } from "./api.js";
import { errorBox, go, h } from "./dom.js";

const ROUTES = [
  // [path pattern, module, export, tab]
  [/^\/$/, "test_runs.js", "list", "evals"],
  [/^\/test_runs$/, "test_runs.js", "list", "evals"],
  [/^\/test_runs\/compare$/, "test_runs.js", "compare", "evals"],
  [/^\/test_runs\/([^/]+)$/, "test_runs.js", "show", "evals"],
  [/^\/attempts\/([^/]+)$/, "test_runs.js", "attempt", "evals"],
  [/^\/test_cases$/, "test_cases.js", "list", "evals"],
  [/^\/test_cases\/new$/, "test_cases.js", "create", "evals"],
  [/^\/test_cases\/([^/]+)$/, "test_cases.js", "show", "evals"],
  [/^\/test_sets$/, "test_sets.js", "list", "evals"],
  [/^\/test_sets\/([^/]+)$/, "test_sets.js", "show", "evals"],
  [/^\/runners$/, "runners.js", "list", "runners"],
  [/^\/start_states$/, "start_states.js", "list", "start_states"],
  [/^\/start_states\/([^/]+)$/, "start_states.js", "show", "start_states"],
];

const main = document.getElementById("main");
const nav = document.querySelector("header nav");
const who = document.getElementById("who");
const signOutButton = document.getElementById("sign-out");

async function render() {
  // The page being left may hold a connection (the live screen): it hears "gh:leave" and closes it.
  for (const old of main.querySelectorAll(":scope > .page")) old.dispatchEvent(new Event("gh:leave"));
  const page = h("div", { class: "page" });
  main.replaceChildren(page);
  if (!session()) return showSignIn(page);
  const path = location.pathname;
  const route = ROUTES.find(([re]) => re.test(path));
  for (const a of nav.querySelectorAll("a")) {
    if (route && a.dataset.tab === route[3]) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (!route) {
    page.append(h("h1", {}, "Not found"), h("p", {}, "No console page at ", h("code", {}, path), "."));
    return;
  }
  const [re, file, fn] = route;
  const args = re.exec(path).slice(1).map(decodeURIComponent);
  try {
    const mod = await import(`./${file}`);
    await mod[fn](page, args, new URLSearchParams(location.search));
  } catch (e) {
    page.append(errorBox(e));
    if (!(e instanceof ApiError)) console.error(e);
  }
}

function showSignedIn() {
  const s = session();
  nav.hidden = !s;
  signOutButton.hidden = !s;
  who.textContent = s ? `Signed in (${s.role}${isAdmin() ? "" : ", read-only"})` : "";
}

function showSignIn(page) {
  showSignedIn();
  const key = h("input", { type: "password", name: "api_key", id: "api-key", autocomplete: "off", required: true,
    placeholder: "gh_live_…", "aria-describedby": "signin-error" });
  const err = h("p", { class: "error", id: "signin-error", role: "alert" });
  const form = h("form", { class: "signin", "aria-label": "Sign in" },
    h("h1", {}, "Sign in to gh-server"),
    h("label", { for: "api-key" }, "API key", key),
    h("p", { class: "muted" }, "The key is sent once; the console keeps a session cookie, never the key."),
    err,
    h("button", { type: "submit", class: "primary" }, "Sign in"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    err.textContent = "";
    try {
      await signIn(key.value.trim());
      key.value = "";
      showSignedIn();
      render();
    } catch (e) {
      key.setAttribute("aria-invalid", "true");
      err.textContent = e.status === 401 ? "That API key is not valid (or was revoked)." : e.message;
    }
  });
  page.append(form);
  key.focus();
}

document.addEventListener("click", (ev) => {
  const a = ev.target.closest("a[href]");
  if (!a || ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey) return;
  const url = new URL(a.href, location.href);
  const inside = url.origin === location.origin && (a.hasAttribute("data-route") || a.closest("header nav") ||
    a.classList.contains("brand"));
  if (!inside) return;
  ev.preventDefault();
  go(url.pathname + url.search);
});
window.addEventListener("popstate", render);
window.addEventListener("gh:navigate", render);
window.addEventListener("gh:signed-out", () => { showSignedIn(); render(); });
signOutButton.addEventListener("click", async () => {
  await signOut().catch(() => {});
  showSignedIn();
  render();
});

await loadSession().catch((e) => main.replaceChildren(errorBox(e)));
showSignedIn();
render();
