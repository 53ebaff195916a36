"""A model agent's account: turns, tokens, what they cost at the configured price, seconds per call.

Kept as a plain dict on the agent's context (`AgentContext.usage`) and rewritten after every call, so a
task stopped in the middle (its time limit, an error) still reports what was spent. The evaluator's own
tokens (judge, simulated customer) are counted elsewhere (gh_server.trust) and never added here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gh_server.settings import ModelPrice


@dataclass
class CallUsage:
    """One model call's tokens, as its API reports them."""

    input: int = 0  # all input tokens, cached ones included
    output: int = 0
    cached: int = 0  # of `input`, read from the provider's prompt cache


@dataclass
class Account:
    price: ModelPrice | None
    coordinates: str  # how the model's coordinates were read ("pixels 1280x800", "grid 0-1000")
    api: str
    model: str
    steps: int = 0  # model turns
    invalid: int = 0  # unparseable replies and invalid actions, in all
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    seconds: list[float] = field(default_factory=list)  # per model call, retries included

    def add(self, call: CallUsage, seconds: float) -> None:
        self.steps += 1
        self.tokens_in += call.input
        self.tokens_out += call.output
        self.tokens_cached += call.cached
        self.seconds.append(round(seconds, 3))

    def cost_cents_exact(self) -> float | None:
        if self.price is None:
            return None
        cached_price = self.price.input if self.price.cached_input is None else self.price.cached_input
        dollars = ((self.tokens_in - self.tokens_cached) * self.price.input + self.tokens_cached * cached_price
                   + self.tokens_out * self.price.output) / 1_000_000
        return dollars * 100

    def as_dict(self) -> dict[str, Any]:
        exact = self.cost_cents_exact()
        s = sorted(self.seconds)
        return {
            "api": self.api,
            "model": self.model,
            "coordinates": self.coordinates,
            "steps": self.steps,
            "invalid": self.invalid,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "tokens_cached": self.tokens_cached,
            # Rounded up to a whole cent, as the product's cost_cents is; the exact figure beside it.
            "cost_cents": None if exact is None else math.ceil(round(exact, 6)),
            "cost_cents_exact": None if exact is None else round(exact, 6),
            "model_seconds": self.seconds[-200:],  # per step (the last 200)
            "model_seconds_p50": s[len(s) // 2] if s else None,
        }
