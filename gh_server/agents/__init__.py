"""Agents on a self-hosted control plane: what acts on an attempt's machine during its task phase.

`registry` names them (built-ins `noop` and `reference`, external commands and HTTP endpoints from
the settings), `supervisor` runs one per attempt when the runner reports the task phase and ends it
with a `task_end`, `machine_api` is the HTTP API external agents use on their machine, and
`models` calls the OpenAI-compatible chat endpoint for the rubric judge and the simulated customer.
The interface external agents implement is in docs/agents.md.
"""
