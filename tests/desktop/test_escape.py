"""The check's channel broken by the agent on the real linux-desktop guest, through `gh-runner local` (docs/
server-api.md, "The check's channel, broken by the agent"): hostile command agents (tests/e2e/agents/hostile.py)
kill, stop and remove qemu-ga with sudo. systemd brings a killed one back (the image's drop-in
qemu-guest-agent.service.d/gh-restart.conf: Restart=always), so that try is checked as usual; a stopped or
removed one stays dead: `failed`, check_channel_lost_in_task. None is an error, none is retried. One run,
one slot, so the desktop's warm snapshot is paid once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agentfiles import agent_command
from e2e.test_local import _local, _runner_name
from kit.libvirt import REPO, domains
from kit.scratch import scratch_dir

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(3600)]

HOSTILE = REPO / "tests" / "e2e" / "agents" / "hostile.py"
CASE = {
    "key": "ESC-DSK", "name": "A file the agent must create", "prompt": "Please create /tmp/fixed.",
    "start_state": "linux-desktop", "setup_script": "rm -f /tmp/fixed\n",
    "success": {"check_script": "if [ -f /tmp/fixed ]; then echo True; else echo False; fi\n"},
    "limits": {"minutes": 3}, "runs_on": "vm",
}
MODES = ["kill-guest-agent", "stop-guest-agent", "remove-guest-agent"]


@pytest.fixture(scope="module")
def report(desktop_images_dir: Path) -> Iterator[dict[str, Any]]:
    with scratch_dir("gh-escape-desktop-") as work:
        agents = {m: {"id": m, "kind": "command", "command": agent_command(HOSTILE, m), "timeout": 300} for m in MODES}
        (work / "server.yaml").write_text(yaml.safe_dump({"agents": agents}))
        runner = yaml.safe_load((REPO / "examples" / "desktop-runner.yaml").read_text())
        runner.setdefault("timeouts", {}).update({"check": 60, "channel_back": 30})
        (work / "runner.yaml").write_text(yaml.safe_dump(runner))
        (work / "cases.yaml").write_text(yaml.safe_dump({"repeat": 1, "cases": [CASE]}))
        out = work / "report.json"
        proc = _local([str(work / "cases.yaml"), "--agents", ",".join(MODES), "--server-config",
                       str(work / "server.yaml"), "--config", str(work / "runner.yaml"), "--slots", "1",
                       "--report", str(out)], desktop_images_dir)
        stdout, stderr = proc.communicate(timeout=3400)
        assert out.exists(), (stdout[-3000:], stderr[-3000:])
        data: dict[str, Any] = json.loads(out.read_text())
        data["leftover"] = domains(f"gh-{_runner_name(stdout)}-")
        yield data


def test_breaking_the_channel_is_never_our_error(report: dict[str, Any]) -> None:
    by = {a["agent_id"]: a for a in report["attempts"]}
    assert sorted(by) == sorted(MODES) and report["retried_attempts"] == []
    for mode, a in by.items():
        assert a["outcome"] == "failed", (mode, a["outcome"], a.get("error"))
    assert by["kill-guest-agent"]["metrics"].get("failed_reason") is None  # systemd brought it back
    assert by["kill-guest-agent"]["check"]["after"] is not None
    for mode in ("stop-guest-agent", "remove-guest-agent"):
        assert by[mode]["metrics"]["failed_reason"] == "check_channel_lost_in_task", by[mode]
    assert report["leftover"] == []
