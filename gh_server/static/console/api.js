// The console's one door to the server: the /v1 API, with the session cookie (sent by the browser,
// unreadable here) and, on anything that changes state, the X-CSRF-Token the sign-in returned.
// The API key is sent once, to POST /v1/console/session, and never kept: not in a variable after the
// call, not in localStorage, sessionStorage or a cookie.

let current = null; // {role, csrf_token, expires_at} of the signed-in session, in memory only

export class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.type = err.type || null;
    this.param = err.param || null; // the field a 400 is about (docs/server-api.md)
    this.line = err.line || null; // a YAML body's line that did not parse
    this.detail = err; // the error's own fields (a 409's code, held_by, since, status, outcome)
  }
}

export const session = () => current;
export const isAdmin = () => current !== null && current.role === "admin";

const SAFE = new Set(["GET", "HEAD", "OPTIONS"]);

// `body`: an object (sent as JSON) or {yaml: "text"} (sent as application/yaml, parsed by the server).
export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  let payload;
  if (body !== undefined && body !== null && typeof body.yaml === "string") {
    headers["Content-Type"] = "application/yaml";
    payload = body.yaml;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  if (!SAFE.has(method) && current) headers["X-CSRF-Token"] = current.csrf_token;
  const res = await fetch(path, { method, headers, body: payload, credentials: "same-origin" });
  const data = res.headers.get("content-type")?.includes("json") ? await res.json() : null;
  if (res.status === 401 && current && !path.startsWith("/v1/console/session")) {
    current = null;
    window.dispatchEvent(new Event("gh:signed-out"));
  }
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

export async function loadSession() {
  try {
    current = await api("GET", "/v1/console/session");
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 401) throw e;
    current = null;
  }
  return current;
}

export async function signIn(apiKey) {
  current = await api("POST", "/v1/console/session", { api_key: apiKey });
  return current;
}

export async function signOut() {
  try {
    await api("DELETE", "/v1/console/session");
  } finally {
    current = null;
  }
}
