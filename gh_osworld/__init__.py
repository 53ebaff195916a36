"""OSWorld's metrics and getters, ours, run inside the guest (osworld-desktop).

OSWorld evaluates on the host and pulls the VM's state out; a gh-runner case is judged by a check script
inside the machine. `gh-runner import osworld` (gh_local/osworld/check.py) writes a check that, on a start
state carrying this package, hands the task's evaluator to it:

    python3 -m gh_osworld SPEC.json      prints the score: True (1), False (0) or a number between (exit 0);
                                         exit 1 with a message: no verdict

SPEC (written by the importer; the contract between the two sides is spec.py):
    {"conj": "and" | "or", "metrics": [{"func": NAME, "result": GETTER | null, "expected": GETTER | null,
                                         "options": {...}}]}
GETTER is OSWorld's getter object (`{"type": ..., its parameters}`), except that what OSWorld fetches from
the web (`cloud_file`, `cache_file`) arrives as `{"type": "embedded_file", "path": P}` (or `"paths": [...]`
with `multi`): fetched at import, embedded in the check, written to a temporary directory.

Written here from the meaning OSWorld documents for each metric (its task files, its README, the
behaviour its metrics' names and options promise), never copied from its code. It runs on the guest's
python3 (Debian 12: 3.11) with Debian's modules (openpyxl, docx, pandas, PIL, lxml; pptx pinned from
PyPI at build time, image-builder/imagebuilder/osworld_desktop.py), and is imported on the host only for
its names (names.py), which the importer reads to know what it may hand over.

Scores: each metric returns OSWorld's number in [0, 1] and evaluate.py combines them as OSWorld does; the
check prints that number (__main__.py). Whose fault: what the agent left (a file missing, unreadable or
wrong) is a failure (`Fail`, or a score of 0); anything else that goes wrong (our embedded expected file
unreadable, a bug) is a crash, exit 1 and no verdict: never a verdict against the agent.
"""
