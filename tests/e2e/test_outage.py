"""Issue 27, defect 1: an attempt that enters its task while the control plane is gone is never
scored against its agent.

Real gh-server, real gh-runner, the real linux-tiny guest. The server is SIGKILLed at the moment
the attempt starts its first screen (the step just before the task: the runner's `running` status
then goes out to nobody) and started again on the same port and data dir a few seconds later. The
runner reconnects; its hello says the attempt is in its task. Then either the agent gets its turn
late (with the time lost on the attempt) or the attempt is our `error` and is retried: never a
`failed` "time_limit" because no agent ever came (what the code before issue 27 did).
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from guidinghand import Eager

from .procs import RestartableServer, Runner, domains, wait_for_log

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(1200)]

CASE: dict[str, Any] = {
    "key": "OUTAGE-01", "name": "Marker file", "prompt": "Please create /root/fixed.",
    "start_state": "linux-tiny", "setup_script": "rm -f /root/fixed",
    "success": {"check_script": "[ -f /root/fixed ] && echo True || echo False"},
    "metadata": {"reference_fix": "touch /root/fixed", "reference_answer": "done"},
    "limits": {"minutes": 2},
}


@pytest.fixture
def work() -> Iterator[Path]:
    w = Path(tempfile.mkdtemp(prefix="gh-outage-", dir="/var/tmp"))
    w.chmod(0o755)  # libvirt-qemu must traverse it to reach the overlays
    try:
        yield w
    finally:
        shutil.rmtree(w, ignore_errors=True)


def test_a_task_begun_while_the_server_is_down_is_never_scored_against_the_agent(
        images_dir: Path, work: Path) -> None:
    config = work / "server.yaml"
    config.write_text(yaml.safe_dump({"runner_grace_seconds": 120}))
    server = RestartableServer(work / "server", config, work / "gh-server.log")
    name = "outage" + secrets.token_hex(3)
    state = work / "runner-state"
    state.mkdir(mode=0o755)
    runner: Runner | None = None
    client: Eager | None = None
    try:
        server.start()
        client = Eager(api_key=server.api_key, base_url=server.base_url, timeout=60)
        token = client.runners.create(name)["token"]
        runner = Runner(server.base_url, token, name, images_dir, state, slots=1)
        runner_log = Path(runner.log.name)
        case = client.test_cases.batch([CASE])["data"][0]
        run = client.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["reference"], repeat=1,
                                      name="outage")

        # The cut: at the step just before the task, so the `running` status finds no server.
        first = wait_for_log(runner_log, lambda e: e.get("event") == "phase" and e.get("phase") == "first_screen"
                             and e.get("attempt_id", "").startswith("at_"), timeout=600)
        server.kill()
        wait_for_log(runner_log, lambda e: e.get("event") == "phase" and e.get("phase") == "task"
                     and e.get("attempt_id") == first["attempt_id"], timeout=120)
        time.sleep(3)  # the server stays down a few seconds into the task
        server.start()

        done = dict(client.test_runs.wait(run["test_run_id"], timeout=900, poll_interval=2))
        attempts = [dict(a) for a in client.test_runs.list_all_attempts(run["test_run_id"])]
    finally:
        if runner is not None:
            runner.stop(timeout=120)
        if client is not None:
            client.close()
        server.stop()
        left = domains(f"gh-{name}-")
        for d in left:
            subprocess.run(["virsh", "-c", "qemu:///system", "destroy", d], capture_output=True, timeout=60)

    assert left == [], f"machines left behind: {left}"
    assert done["status"] == "completed", done
    hit = next(a for a in attempts if a["attempt_id"] == first["attempt_id"])
    assert hit["outcome"] != "failed", f"scored against the agent: {hit}"
    if hit["outcome"] == "passed":  # the agent got its turn late, and the attempt says how late
        lost = (hit.get("metrics") or {}).get("task_seconds_lost")
        assert lost is not None and lost > 0, hit
    else:  # ours: an error, retried, and the retry got its verdict
        assert hit["outcome"] == "error", hit
        retry = [a for a in attempts if a.get("retry_of") == hit["attempt_id"]]
        assert retry and retry[0]["outcome"] == "passed", attempts
    last = [a for a in attempts if a.get("is_last", True)]
    assert [a["outcome"] for a in last] == ["passed"], attempts
