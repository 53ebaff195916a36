"""Agent ids -> agents: the built-ins, and external ones from the server settings."""

from __future__ import annotations

from collections.abc import Mapping

from gh_server.agents.base import Agent, AgentError
from gh_server.agents.builtin import NoopAgent, ReferenceAgent
from gh_server.agents.external import CommandAgent, HttpAgent
from gh_server.agents.sandbox import Sandbox
from gh_server.settings import AgentConfig, ModelAgentConfig, Settings

BUILTINS: dict[str, type] = {"noop": NoopAgent, "reference": ReferenceAgent}


class AgentRegistry:
    def __init__(self, configs: Mapping[str, AgentConfig | ModelAgentConfig] | None = None,
                 sandbox: Sandbox | None = None) -> None:
        """`sandbox` is required when any agent is a command (ValueError otherwise, at start)."""
        self._configs = dict(configs or {})
        self._sandbox = sandbox
        for cfg in self._configs.values():
            if cfg.kind in ("command", "osworld"):
                if sandbox is None:
                    raise ValueError(f"agent {cfg.id}: {cfg.kind} agents need a sandbox")
                Sandbox.check_pass_env(cfg.id, cfg.pass_env)

    @classmethod
    def from_settings(cls, settings: Settings) -> AgentRegistry:
        """The registry for `settings.agents`; the command agents' sandbox is chosen (and checked) here,
        so a host that cannot give agents their own user fails at start, not at the first attempt."""
        commands = any(c.kind in ("command", "osworld") for c in settings.agents.values())
        return cls(settings.agents, Sandbox.for_settings(settings) if commands else None)

    def names(self) -> list[str]:
        return sorted({*BUILTINS, "default", *self._configs})

    def known(self, agent_id: str) -> bool:
        return agent_id in BUILTINS or agent_id == "default" or agent_id in self._configs

    def get(self, agent_id: str) -> Agent:
        cfg = self._configs.get(agent_id)
        if cfg is None:
            if agent_id == "default":
                return NoopAgent()  # `default` means noop unless configured
            cls = BUILTINS.get(agent_id)
            if cls is None:
                raise AgentError(f"unknown agent {agent_id!r}: configure it in the server's agents "
                                 f"(known: {', '.join(self.names())})")
            agent: Agent = cls()
            return agent
        return build(agent_id, cfg, self._sandbox)


def build(agent_id: str, cfg: AgentConfig | ModelAgentConfig, sandbox: Sandbox | None = None) -> Agent:
    if isinstance(cfg, ModelAgentConfig):
        from gh_server.agents.model.loop import ModelAgent  # the SDKs load only when a model agent runs

        return ModelAgent(agent_id, cfg)
    kind = cfg.kind
    if kind == "builtin":
        cls = BUILTINS.get(cfg.builtin or agent_id)
        if cls is None:
            raise AgentError(f"agent {agent_id}: unknown builtin {cfg.builtin!r} (noop or reference)")
        built: Agent = cls()
        return built
    if kind == "command":
        if not cfg.command:
            raise AgentError(f"agent {agent_id}: kind command needs a command")
        if sandbox is None:
            raise AgentError(f"agent {agent_id}: command agents need a sandbox")
        return CommandAgent(agent_id, cfg.command, cfg.timeout, sandbox, cfg.env, cfg.pass_env)
    if kind == "osworld":
        if sandbox is None:
            raise AgentError(f"agent {agent_id}: osworld agents need a sandbox")
        from gh_server.agents.osworld.agent import OsworldAgent

        return OsworldAgent(agent_id, cfg, sandbox)
    if kind == "http":
        if not cfg.url:
            raise AgentError(f"agent {agent_id}: kind http needs a url")
        return HttpAgent(agent_id, cfg.url, cfg.timeout, cfg.headers)
    raise AgentError(f"agent {agent_id}: unknown kind {kind!r} (builtin, command, http, osworld or model)")
