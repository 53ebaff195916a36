"""One request of the `openai` SDK with a body we have already typed.

`client.chat.completions.create()` and `client.responses.create()` first run their params through the SDK's
request transform, which walks every message of the history against its TypedDict on every call: with a
screenshot in each turn a step's call grew from 20 ms to over 100 ms by step 30 (bench/agent_step.py). For
the params we send (no aliases, no files, no dates) the transform is the identity, so the body goes
through `client.post`, the SDK's documented way to send a body as it is, which keeps its retries, errors,
auth and response types.
"""

from __future__ import annotations

from typing import Any, TypeVar

from openai import AsyncOpenAI

T = TypeVar("T")


async def post(client: AsyncOpenAI, path: str, body: dict[str, Any], cast_to: type[T]) -> T:
    """POST `body` to `path` and parse the reply as `cast_to`, as the SDK's own `create()` would."""
    # The same security option as the SDK's create(): the bearer key only, never an admin key.
    return await client.post(path, body=body, cast_to=cast_to, options={"security": {"bearer_auth": True}})
