// Writes an API object (JSON values only) as YAML for the editor. Strings that are not plainly safe are
// written as JSON strings, which are valid YAML double-quoted scalars; multi-line ones as block literals.
// The server parses what comes back (application/yaml), so the page needs no YAML parser of its own.

const PLAIN = /^[A-Za-z_][A-Za-z0-9_ ./-]*$/;
const RESERVED = /^(true|false|yes|no|on|off|null|~|y|n)$/i;

function scalar(v) {
  if (v === null || v === undefined) return "null";
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  if (PLAIN.test(v) && !RESERVED.test(v) && !v.endsWith(" ")) return v;
  return JSON.stringify(v);
}

function block(s, indent) {
  const pad = " ".repeat(indent);
  const chomp = s.endsWith("\n") ? "|" : "|-";
  return chomp + "\n" + s.replace(/\n$/, "").split("\n").map((l) => (l ? pad + l : "")).join("\n");
}

export function toYaml(value, indent = 0) {
  const pad = " ".repeat(indent);
  const out = [];
  const entries = Array.isArray(value) ? value.map((v) => [null, v]) : Object.entries(value);
  for (const [k, v] of entries) {
    const head = k === null ? `${pad}- ` : `${pad}${scalar(k)}: `;
    if (v !== null && typeof v === "object" && Object.keys(v).length) {
      out.push(head.trimEnd());
      out.push(toYaml(v, indent + 2));
    } else if (v !== null && typeof v === "object") {
      out.push(head + (Array.isArray(v) ? "[]" : "{}"));
    } else if (typeof v === "string" && v.includes("\n")) {
      out.push(head + block(v, indent + 2));
    } else {
      out.push(head + scalar(v));
    }
  }
  return out.join("\n");
}

// The 1-based line of the YAML text where a field (`param` as the API names it: "success.check_script",
// "tags[1]", "limits") is written, or null: so an error can be shown at its field.
export function lineOf(text, param) {
  if (!param) return null;
  const path = param.split(/[.[\]]+/).filter((p) => p && !/^\d+$/.test(p));
  const lines = text.split("\n");
  let want = 0, indent = -1, found = null;
  for (let i = 0; i < lines.length && want < path.length; i++) {
    const m = /^(\s*)(?:- )?["']?([^"':]+)["']?\s*:/.exec(lines[i]);
    if (!m) continue;
    const depth = m[1].length;
    if (depth <= indent) break; // left the parent's block without finding the key
    if (m[2].trim() === path[want]) {
      found = i + 1;
      indent = depth;
      want++;
    }
  }
  return found;
}
