// The Evals tab's own links: runs, test cases, test sets.
import { h, link } from "./dom.js";

export function evalsNav(current) {
  const items = [["/test_runs", "Runs", "runs"], ["/test_cases", "Test cases", "cases"], ["/test_sets", "Test sets", "sets"]];
  return h("nav", { class: "subnav", "aria-label": "Evals" }, items.map(([href, text, id]) => {
    const a = link(href, text);
    if (id === current) a.setAttribute("aria-current", "page");
    return a;
  }));
}
