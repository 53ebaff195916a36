"""The simulated customer on a real guest: a password only the customer knows, typed into the machine.

A real gh-server (its customer model is a fake OpenAI-compatible endpoint in this process: the one
boundary faked here) and a real gh-runner with a linux-tiny guest. The agent
(tests/e2e/agents/wifi_helper.py) opens `cat > file` on the guest's console and asks the customer
for the Wi-Fi password; the customer's reply asks to type the secret fact, so the server types it
through the runner; the agent then writes the Wi-Fi configuration and the check verifies it
against a hash. The secret must reach the guest and nothing else: not the model, the attempt, the
replay, or a log.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from agentfiles import agent_command
from attempt.fakes import is_mosaic
from gateway.fakehttp import chat_reply, serve
from guidinghand import Eager
from kit.libvirt import domains
from kit.scratch import traversable_tmpdir
from replaypage import replay_data

from .procs import Runner, Server, tear_down

pytestmark = pytest.mark.timeout(900)

SECRET = "blue-kite-" + secrets.token_hex(3)
AGENT = Path(__file__).parent / "agents" / "wifi_helper.py"
CUSTOMER_SAYS = {"answer": "Of course, I'm typing it now.", "type_fact": "Wi-Fi password", "click_yes": False}


def _case() -> dict[str, Any]:
    digest = hashlib.sha256(f"{SECRET}\n".encode()).hexdigest()
    check = (f'if [ "$(sed -n "s/^psk=//p" /etc/wifi.conf 2>/dev/null | sha256sum | cut -c1-64)" = "{digest}" ]; '
             "then echo True; else echo False; fi")
    return {
        "key": "E2E-WIFI", "name": "Wi-Fi configuration lost", "prompt": "My Wi-Fi stopped working.",
        "start_state": "linux-tiny", "setup_script": "rm -f /etc/wifi.conf /root/typed",
        "success": {"check_script": check}, "limits": {"minutes": 4}, "tags": ["e2e"],
        "customer": {"persona": "Retired teacher, patient, not technical.",
                     "facts": {"Wi-Fi network": "HomeNet", "Wi-Fi password": {"secret": SECRET}}},
    }



@pytest.fixture(scope="module")
def outcome(images_dir: Path) -> Iterator[dict[str, Any]]:
    work = traversable_tmpdir("gh-e2e-customer-")
    state_dir = work / "runner-state"
    state_dir.mkdir(mode=0o755)
    runner_name = "e2ecust" + secrets.token_hex(3)
    runner: Runner | None = None
    client: Eager | None = None
    with serve(chat_reply(json.dumps(CUSTOMER_SAYS))) as (model_url, model_seen):
        config = work / "server.yaml"
        config.write_text(yaml.safe_dump({
            "agents": {"wifi-helper": {"id": "wifi-helper", "kind": "command",
                                       "command": agent_command(AGENT)}},
            "customer_model": {"base_url": model_url + "/v1", "model": "customer"},
        }))
        server = Server(work / "server", config, "gh_live_" + secrets.token_urlsafe(24))
        try:
            server.wait_healthy()
            client = Eager(api_key=server.api_key, base_url=server.base_url, timeout=60)
            token = client.runners.create(runner_name)["token"]
            runner = Runner(server.base_url, token, runner_name, images_dir, state_dir, slots=1)
            cases: list[Any] = [_case()]
            (case,) = client.test_cases.batch(cases)["data"]
            run = client.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["wifi-helper"], repeat=1)
            done = dict(client.test_runs.wait(run["test_run_id"], timeout=600, poll_interval=2))
            attempts = [dict(a) for a in client.test_runs.list_all_attempts(run["test_run_id"])]
            with httpx.Client(timeout=60) as http:
                pages = [http.get(str(a["replay_url"])).text for a in attempts if a.get("replay_url")]
                frames = [(f["label"], f["event"], is_mosaic(http.get(server.base_url + f["src"]).content))
                          for page in pages for f in replay_data(page)["frames"]]
            runner.stop(timeout=120)
            runner_log = Path(runner.log.name).read_text(errors="replace")
            yield {"run": done, "attempts": attempts, "pages": pages, "frames": frames,
                   "model_seen": json.dumps(model_seen),
                   "logs": runner_log + Path(server.log.name).read_text(errors="replace"),
                   "leftover": domains(f"gh-{runner_name}-")}
        finally:
            tear_down([] if runner is None else [runner], client, server, runner_name, work)


def test_the_customer_types_the_password_and_the_case_passes(outcome: dict[str, Any]) -> None:
    assert outcome["run"]["status"] == "completed"
    (a,) = outcome["attempts"]
    assert a["outcome"] == "passed", (a["outcome"], a.get("error"), a.get("check"))
    turns = [dict(t) for t in a["customer"]]
    usage = [t.pop("usage", None) for t in turns]  # the customer model's own cost: the evaluator's, apart
    assert turns == [{"question": "Could you type your Wi-Fi password now, please?",
                      "answer": CUSTOMER_SAYS["answer"],
                      "actions": [{"type": "type_fact", "fact": "Wi-Fi password"}]}]
    assert usage[0] is not None and usage[0]["calls"] == 1 and usage[0]["seconds"] >= 0
    assert a["metrics"]["questions"] == 1
    assert outcome["leftover"] == []


def test_the_secret_reaches_the_guest_and_nothing_else(outcome: dict[str, Any]) -> None:
    assert "Wi-Fi password (secret)" in outcome["model_seen"]  # the model knows the fact's name...
    assert SECRET not in outcome["model_seen"]  # ...never its value
    assert SECRET not in json.dumps(outcome["attempts"])
    assert SECRET not in outcome["logs"]
    (page,) = outcome["pages"]
    assert SECRET not in page
    # The first masked frame says so ("masked": true, gh_runner/replay.py; when that frame is a screen change,
    # the marker is its whole event): what was typed is the rest.
    typed = [{k: v for k, v in f["event"].items() if k != "masked"} for f in replay_data(page)["frames"]
             if f["event"] and f["event"].get("type") == "type"]
    assert {"type": "type", "text": "cat > /root/typed\n"} in typed  # the agent's own typing is shown
    assert {"type": "type", "text": "•••"} in typed  # the customer's is not


def test_frames_after_the_secret_show_no_text(outcome: dict[str, Any]) -> None:
    # The guest's console echoes what is typed: from the secret on, frames are mosaics. Masking starts
    # before the keys go in, so a change frame the watcher takes while they do is masked as well.
    frames = outcome["frames"]
    masked = [m for _, _, m in frames]
    at = next(i for i, (_, event, _) in enumerate(frames)
              if event and {k: v for k, v in event.items() if k != "masked"} == {"type": "type", "text": "•••"})
    since = masked.index(True)
    assert since <= at and not any(masked[:since]) and all(masked[since:]), frames
    # A screen the agent asked for is a frame of its own ({"type": "screen"}: no text of its own).
    shown = [event for _, event, m in frames if not m and event and event["type"] != "screen"]
    assert shown == [{"type": "type", "text": "cat > /root/typed\n"}]  # the console before the secret: real
    assert frames[0][0] == "first" and frames[-1][0] == "last"
