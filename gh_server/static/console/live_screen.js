// The live screen of a machine: a live_view ticket from the server (POST .../view, or the view a takeover
// returns), then noVNC on the WebSocket it names (docs/console.md). Shared by the start-state page and the
// attempt page. A read-only view sends nothing (and the server drops a read-only viewer's input whatever
// this page sends).
import { api } from "./api.js";
import { errorBox, h } from "./dom.js";

// `view`: the path to POST for a ticket, or a live_view object already got. `onEnd()` is called once the
// connection ends (or could not be made). Resolves to the noVNC RFB object, or null.
export async function liveScreen(holder, view, { onEnd } = {}) {
  const screen = h("div", { class: "screen", role: "application", "aria-label": "Live screen", tabindex: "0" });
  const note = h("p", { class: "muted", "aria-live": "polite" }, "Connecting…");
  holder.replaceChildren(screen, note);
  const ended = () => { if (onEnd) onEnd(); };
  try {
    const v = typeof view === "string" ? await api("POST", view) : view;
    const { default: RFB } = await import("/console/novnc/core/rfb.js");
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const rfb = new RFB(screen, `${scheme}//${location.host}${v.url}`, { shared: true });
    rfb.viewOnly = v.read_only;
    rfb.scaleViewport = true;
    rfb.addEventListener("connect", () => { note.textContent = v.read_only ? "Watching (read-only)." : "Connected: click the screen to type."; });
    rfb.addEventListener("disconnect", (e) => {
      note.textContent = e.detail.clean ? "Disconnected." : "The connection was lost.";
      ended();
    });
    return rfb;
  } catch (e) {
    note.replaceChildren(errorBox(e));
    ended();
    return null;
  }
}
