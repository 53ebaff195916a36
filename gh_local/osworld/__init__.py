"""`gh-runner import osworld`: OSWorld-format tasks turned into test cases in the API's shape.

The parts, in the order a task goes through them:
- `task.py`: the task format (pydantic) and where tasks are found (a file, a directory, a test_all.json index);
- `target.py`: what the start state offers (a desktop session, python3), so a task that needs more is skipped;
- `setup.py`: the task's `config` steps as a setup script (`fetch.py` brings its downloads in at import time);
- `check.py`: the `evaluator` (getters, metrics, conj, postconfig, infeasible) as a check script run in the guest;
- `shims.py`: what OSWorld's commands assume of the guest (`python`, `pyautogui`, `sudo -S`), shipped in scripts;
- `skips.py`: why a task is not imported, as types; `report.py`: what was imported and skipped, with totals;
- `importer.py`: the command itself.
"""
