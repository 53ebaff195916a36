// Watching an attempt while it runs (docs/console.md, "Watching an attempt"): its live screen (read-only)
// beside its steps as they arrive (GET /v1/attempts/{id}/steps?after=SEQ, every second), the phase, the
// time left and who holds the machine. Once a secret is typed the replay masks, and so does this page: the
// newest (masked) frame stands in for the live screen. An admin may take the machine over and hand it back
// (POST /v1/attempts/{id}/takeover, /handback); the server decides who may, this page only asks.
import { ApiError, api, isAdmin } from "./api.js";
import { errorBox, h, when } from "./dom.js";
import { liveScreen } from "./live_screen.js";

const STEPS_MS = 1000;
const MAX_SHOWN = 500; // steps kept in the list: the oldest go (the replay keeps them all)
const RECONNECT_MS = 3000; // a view that ended while the attempt runs on (its machine was still being made)
const MAX_RECONNECTS = 40;
export const LIVE = new Set(["preparing", "running", "checking"]);

const mmss = (s) => `${Math.floor(s / 60)} min ${String(Math.floor(s % 60)).padStart(2, "0")} s`;

// What a step says: the model's words, its action, an exec with its exit code, the input it was after.
function stepItem(st) {
  const ev = st.event || {};
  const note = ev.note || {};
  const words = note.text || ev.text && ev.type !== "type" && ev.text;
  const parts = [h("span", { class: "muted" }, `${(st.t ?? 0).toFixed(1)} s · ${st.label}`)];
  if (note.step !== undefined) parts.push(h("span", { class: "muted" }, ` · step ${note.step}`));
  if (words) parts.push(h("p", { class: "said" }, words));
  const action = note.action || ev.action;
  if (action) parts.push(h("div", {}, "Action: ", typeof action === "string" ? action : JSON.stringify(action)));
  if (ev.type === "exec") {
    parts.push(h("pre", {}, `$ ${(ev.script || "").split("\n")[0].slice(0, 200)}\n` +
      (ev.timed_out ? "timed out" : `exit ${ev.exit_code}`)));
  } else if (ev.type === "type") {
    parts.push(h("div", {}, `Typed ${JSON.stringify(ev.text)}`));
  } else if (ev.type === "key") {
    parts.push(h("div", {}, `Key ${(ev.keys || []).join("+")}`));
  } else if (ev.type && ev.type !== "screen" && ev.x !== undefined) {
    parts.push(h("div", {}, `${ev.type} at ${ev.x},${ev.y}`));
  }
  return h("li", { "data-seq": st.seq }, parts);
}

// Draws the watch section into `section` and keeps it current; `onOver()` once the attempt has left its
// machine (the page then shows the outcome and the replay).
export function watch(section, id, onOver) {
  const path = `/v1/attempts/${encodeURIComponent(id)}`;
  const facts = h("p");
  const holder = h("div", { class: "watch-screen" });
  const steps = h("ol", { class: "steps", "aria-label": "Steps" });
  const tools = h("div", { class: "toolbar" });
  const problem = h("div");
  section.replaceChildren(h("h2", {}, "Live"), facts, tools, problem,
    h("div", { class: "watch" }, holder, steps));

  let rfb = null;
  let gen = 0; // which live screen is the current one: an older one's end is not ours to act on
  let after = -1;
  let masked = false;
  let holding = false; // this page took the machine over (and has not handed it back)
  let viewLost = false; // holding, and its writable screen closed: Take over asks for it again
  let holds = 0; // counts this page's takeovers: a /steps answer asked for before one cannot end it
  let over = false;
  let reconnects = 0;
  let last = null; // the last /steps answer
  let shownStatus = null;
  let opening = false; // a live screen is being asked for
  let newest = null; // the newest frame's URL
  let frame = null; // the masked frame's <img> while it stands in for the screen

  const hidden = () => masked && !holding;
  const close = () => {
    gen += 1;
    if (rfb) { const r = rfb; rfb = null; r.disconnect(); }
  };
  section.closest(".page")?.addEventListener("gh:leave", () => { over = true; close(); });

  // The live screen: `view`, a live_view already got (a takeover's), else a new read-only ticket.
  const open = async (view) => {
    close();
    frame = null;
    const mine = gen;
    opening = true;
    const r = await liveScreen(holder, view || `${path}/view`, { onEnd: () => ended(mine) });
    opening = false;
    if (mine === gen) rfb = r;
    else if (r) r.disconnect();
  };
  // A view that ends while the attempt runs on (its machine was still being made, the link dropped) is
  // asked for again, a bounded number of times; a masked one is not (the frame stands in). The holder's
  // writable screen is never taken again on the page's own: the hold may have ended meanwhile (its cap,
  // idle), and only a person's press takes a machine over. Take over shows again for that press.
  const ended = (mine) => {
    if (mine !== gen) return;
    rfb = null;
    if (holding) {
      viewLost = true;
      drawTools();
      problem.replaceChildren(h("p", { class: "error", role: "alert" }, "The live screen closed. You still hold " +
        "the machine until you hand it back or it goes idle: press Take over to get the screen back."));
      return;
    }
    if (over || hidden() || reconnects >= MAX_RECONNECTS) return;
    reconnects += 1;
    setTimeout(() => {
      if (mine === gen && !over && !hidden() && !holding) open();
    }, RECONNECT_MS);
  };

  const showFrame = () => {
    if (frame === null) {
      close();
      frame = h("img", { class: "screen", alt: "The newest replay frame (masked)" });
      holder.replaceChildren(frame, h("p", { class: "muted" },
        "A secret was typed: the screen is shown as the replay shows it (masked), not live."));
    }
    if (newest && frame.getAttribute("src") !== newest) frame.src = newest;
  };

  // Made once and shown or hidden, so a click never lands on a button being replaced.
  const takeButton = h("button", { type: "button", class: "primary", hidden: true, onclick: () => takeOver() },
    "Take over");
  const backButton = h("button", { type: "button", hidden: true, onclick: () => handBack() }, "Hand back");
  if (isAdmin()) tools.append(takeButton, backButton);
  const drawTools = () => {
    takeButton.hidden = holding && !viewLost;
    takeButton.disabled = !(last && last.status === "running");
    backButton.hidden = !(holding || (last && last.takeover));
  };

  const takeOver = async () => {
    problem.replaceChildren();
    try {
      const t = await api("POST", `${path}/takeover`);
      holding = true;
      viewLost = false;
      holds += 1;
      reconnects = 0;
      drawTools();
      await open(t.view);
    } catch (e) {
      const held = e instanceof ApiError && e.status === 409 && e.detail && e.detail.held_by;
      problem.replaceChildren(held ? h("p", { class: "error", role: "alert" }, "Held by ", h("strong", {}, e.detail.held_by),
        " since ", when(e.detail.since), ": only one person holds the machine at a time.") : errorBox(e));
    }
  };

  const handBack = async () => {
    problem.replaceChildren();
    try {
      await api("POST", `${path}/handback`);
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 409)) { problem.replaceChildren(errorBox(e)); return; }
    }
    const was = holding;
    holding = false;
    viewLost = false;
    reconnects = 0;
    drawTools();
    if (!was) return; // another's hold, released: this page watches on as it was
    if (masked) showFrame();
    else await open();
  };

  const drawFacts = (s) => {
    const held = s.takeover;
    facts.replaceChildren(`Status ${s.status} · phase ${s.phase} · time left `,
      s.time_left_s === null || s.time_left_s === undefined ? "—" : mmss(s.time_left_s),
      held ? h("span", {}, " · Held by ", h("strong", {}, held.by), " since ", when(held.started_at))
        : " · the agent has the machine");
  };

  const tick = async () => {
    if (over || !section.isConnected) return;
    try {
      const asked = holds;
      const s = await api("GET", `${path}/steps?after=${after}`);
      last = s;
      for (const st of s.data) {
        steps.append(stepItem(st));
        after = Math.max(after, st.seq);
        newest = st.src;
      }
      while (steps.children.length > MAX_SHOWN) steps.firstChild.remove();
      if (s.data.length) steps.scrollTop = steps.scrollHeight; // the newest in sight, the page not scrolled
      drawFacts(s);
      if (holding && !s.takeover && asked === holds) { // the hold ended (idle, cap): the page watches again
        holding = false;
        viewLost = false;
        problem.replaceChildren();
        if (!s.masked) open();
      }
      drawTools();
      if (!LIVE.has(s.status)) {
        over = true;
        close();
        onOver();
        return;
      }
      masked = s.masked;
      if (hidden()) showFrame();
      else if (shownStatus !== null && s.status !== shownStatus && rfb === null && !opening && frame === null) {
        reconnects = 0; // a new phase (the machine made, the task begun): its screen may be there now
        open();
      }
      shownStatus = s.status;
    } catch (e) { /* the next tick tries again */ }
    setTimeout(tick, STEPS_MS);
  };

  open();
  tick();
}
