"""Agent kind `osworld` in gh-server's settings and registry (gh_server/settings.py, agents/registry.py),
and computer_13's key holds (gh_server/agents/osworld/computer13.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gh_server.agents.osworld import computer13
from gh_server.agents.osworld.agent import OsworldAgent
from gh_server.agents.registry import AgentRegistry
from gh_server.agents.sandbox import Sandbox, SandboxKind
from gh_server.settings import Settings, agent_config


def test_an_osworld_agent_is_configured_with_osworlds_defaults() -> None:
    cfg = agent_config("ow", {"id": "ow", "kind": "osworld", "agent": "pkg.mod:make"})
    assert (cfg.observation, cfg.action_space, cfg.max_steps, cfg.sleep_after_execution) == (
        "screenshot", "pyautogui", 15, 0.0)


@pytest.mark.parametrize(("raw", "where"), [
    ({"id": "ow", "kind": "osworld"}, "kind osworld needs `agent`"),
    ({"id": "ow", "kind": "osworld", "agent": "no_factory"}, "agent"),
    ({"id": "ow", "kind": "osworld", "agent": "m:f", "observation": "som"}, "observation"),
    ({"id": "ow", "kind": "osworld", "agent": "m:f", "action_space": "claude_computer_use"}, "action_space"),
    ({"id": "ow", "kind": "osworld", "agent": "m:f", "max_steps": 0}, "max_steps"),
])
def test_a_bad_osworld_agent_is_refused_naming_the_setting(raw: dict[str, object], where: str) -> None:
    with pytest.raises(ValidationError) as e:
        agent_config("ow", raw)
    assert where in str(e.value)


def test_the_registry_builds_osworld_agents_in_the_command_agents_sandbox(tmp_path: object) -> None:
    settings = Settings(data_dir=str(tmp_path), agent_sandbox="none",
                        agents={"ow": {"id": "ow", "kind": "osworld", "agent": "m:f"}})
    reg = AgentRegistry.from_settings(settings)
    assert isinstance(reg.get("ow"), OsworldAgent)
    with pytest.raises(ValueError, match="need a sandbox"):
        AgentRegistry(settings.agents)
    assert Sandbox.for_settings(settings).kind is SandboxKind.NONE


def test_a_key_held_and_released_alone_is_a_tap_and_one_pressed_with_another_is_not() -> None:
    ptr = computer13.Pointer(0, 0)
    down = {"action_type": "KEY_DOWN", "parameters": {"key": "shift"}}
    up = {"action_type": "KEY_UP", "parameters": {"key": "shift"}}
    assert computer13.events(down, ptr) == []
    assert computer13.events(up, ptr) == [{"type": "key", "keys": ["shift"]}]
    computer13.events(down, ptr)
    assert computer13.events({"action_type": "PRESS", "parameters": {"key": "a"}}, ptr) == [
        {"type": "key", "keys": ["shift", "a"]}]
    assert computer13.events(up, ptr) == [] and ptr.held_keys == []
    with pytest.raises(computer13.BadAction):
        computer13.events({"action_type": "TELEPORT"}, ptr)


def test_an_actions_note_on_the_machine_api_is_bounded_and_marked_external() -> None:
    from gh_server.agents.machine_api import ExecBody, InputBody

    body = InputBody.model_validate({"events": [{"type": "key", "keys": ["a"]}],
                                     "note": {"step": 2, "text": "I press a", "action": "PRESS a"}})
    assert body.note is not None
    assert body.note.as_note() == {"agent": "external", "step": 2, "text": "I press a", "action": "PRESS a"}
    for bad in ({"step": 1, "text": "x" * 8001}, {"step": 1, "action": "x" * 2001}, {"step": -1},
                {"step": 1, "agent": "model"}, {"step": 1, "text": "nul\x00"}):
        with pytest.raises(ValidationError):
            ExecBody.model_validate({"script": "true", "note": bad})
