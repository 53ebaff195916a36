"""Tasks whose check would print True on the untouched start, as far as the importer can know statically.

Warned (a line per task in the import's output, counted in its totals), not skipped: the judgement is
static and `gh-runner validate` is what proves it (its check before on the untouched start). Per metric:
- only-exclude rules (check_include_exclude with no include): the untouched output lacks the text as
  readily as the finished one;
- a metric that reads nothing the agent changes (every getter a rule or a file fetched at import);
- an equality metric (compare_*) of a vm_file with a cloud_file of the very URL the setup downloads to that
  path: expected equal to what the start has.
The check is suspect when every metric is (conj and) or one is (conj or).
"""

from __future__ import annotations

from gh_local.osworld.task import MetricCall, Task

_STATIC_GETTERS = {"rule", "cloud_file", "rule_relativeTime"}


def _downloads(task: Task) -> dict[str, str]:
    out = {}
    for step in task.config:
        if step.type == "download":
            for f in step.parameters.get("files", []) or []:
                if isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("url"), str):
                    out[f["path"]] = f["url"]
    return out


def _suspect(call: MetricCall, downloads: dict[str, str]) -> str | None:
    if call.func == "check_include_exclude" and call.expected is not None:
        rules = call.expected.params.get("rules")
        if isinstance(rules, dict) and not rules.get("include") and rules.get("exclude"):
            return f"{call.func} with only exclude rules"
    getters = [g for g in (call.result, call.expected) if g is not None]
    if getters and all(g.type in _STATIC_GETTERS for g in getters):
        return f"{call.func} reads nothing the agent changes"
    r, e = call.result, call.expected
    # Only a metric of equality (compare_*): others compare the result with the original on purpose (an image
    # stretched, a colour darker than the file the setup put there).
    if (call.func.startswith("compare_") and r is not None and e is not None and r.type == "vm_file"
            and e.type == "cloud_file"
            and downloads.get(str(r.params.get("path"))) == e.params.get("path")):
        return f"{call.func} compares {r.params.get('path')} with the file the setup put there"
    return None


def may_pass_untouched(task: Task) -> str | None:
    """Why the check may print True before the agent acts, or None."""
    if task.evaluator.func == "infeasible":
        return None
    downloads = _downloads(task)
    calls = task.evaluator.calls()
    why = [_suspect(c, downloads) for c in calls]
    found = [w for w in why if w]
    if task.evaluator.conj == "or" and found:
        return found[0]
    if task.evaluator.conj == "and" and len(found) == len(calls):
        return "; ".join(found)
    return None
