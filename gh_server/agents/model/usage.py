"""A model agent's account: turns, tokens, what they cost at the configured price, seconds per call.

Kept as a plain dict on the agent's context (`AgentContext.usage`) and rewritten after every call, so a
task stopped in the middle (its time limit, an error) still reports what was spent. The evaluator's own
tokens (judge, simulated customer) are counted elsewhere (gh_server.trust) and never added here.

Beside the totals, each call's own tokens and cost (`calls`, in order: the n-th is the call of the
replay notes' `step` n), so an export can say what each step of a trajectory spent
(gh_server/trajectories.py). A call whose reply said nothing of its tokens is `None` there, never 0.
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

    def as_dict(self, price: ModelPrice | None) -> dict[str, Any]:
        """The call as an entry of the account's `calls`: its tokens, and its cost when there is a price."""
        exact = cost_cents(price, self.input, self.output, self.cached)
        return {"tokens_in": self.input, "tokens_out": self.output, "tokens_cached": self.cached,
                "cost_cents_exact": None if exact is None else round(exact, 6)}


def cost_cents(price: ModelPrice | None, tokens_in: int, tokens_out: int, tokens_cached: int) -> float | None:
    """What the tokens cost at `price` (US dollars per million tokens), in cents; None without a price."""
    if price is None:
        return None
    cached_price = price.input if price.cached_input is None else price.cached_input
    dollars = ((tokens_in - tokens_cached) * price.input + tokens_cached * cached_price
               + tokens_out * price.output) / 1_000_000
    return dollars * 100


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
    # Each call's entry (CallUsage.as_dict, or None when its reply gave no usage), made once as it is added:
    # the account is written out after every call.
    calls: list[dict[str, Any] | None] = field(default_factory=list)

    def add(self, call: CallUsage | None, seconds: float) -> None:
        """One model call: `call` is its reply's usage, None when the reply had none (counted, never as 0)."""
        self.steps += 1
        self.seconds.append(round(seconds, 3))
        self.calls.append(None if call is None else call.as_dict(self.price))
        if call is None:
            return
        self.tokens_in += call.input
        self.tokens_out += call.output
        self.tokens_cached += call.cached

    def cost_cents_exact(self) -> float | None:
        return cost_cents(self.price, self.tokens_in, self.tokens_out, self.tokens_cached)

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
            "calls": list(self.calls),  # every call's own, in order (the totals above are their sums)
        }
