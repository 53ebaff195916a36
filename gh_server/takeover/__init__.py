"""A person's takeover of an attempt's machine during its task, in one room (docs/server-api.md,
"Takeovers"; docs/agents.md, "Takeover"):

- `desk.py`: the holds of this process (take, hand back, the cap and idle ends, the agents' passage).
- `link.py`: the desk's link over the runner gateway (which connection a hold belongs to, the agent's clock).
- `gate.py`: the desk in the screen relay (gh_server/live/screen_relay.py): which view drives, what its
  input becomes, a failed view undoing its hold.
- `routes.py`: `POST /v1/attempts/{id}/takeover` and `/handback`.

What is kept of a hold (counts and named keys, never what was typed) is gh_server/live/human_steps.py's;
the runner's side of a hold is gh_runner/attempt.py's.
"""
